"""Test support: writes SIF files (Apptainer/Singularity's image format) from a squashfs image,
following the format's published layout (Sylabs' SIF description), independently of the
server's reader (``gpufence.control.base.sif``): its own struct formats and constants, so a
reader that drifted from the layout would fail against it.

No Apptainer-built image is available on this machine (no apptainer/singularity package in
Debian bookworm, none in the package lists here), so the tests use these files. ``make_sif``
can also write wrong ones (``Twist``) to exercise the reader's refusals.
"""

from __future__ import annotations

import struct
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

_LAUNCH = b"#!/usr/bin/env run-singularity\n"
_HEADER_FMT = "<32s10s3s3s16s" + "q" * 8  # launch, magic, version, arch, uuid, 8 x int64
_DESCR_FMT = "<i?III" + "q" * 7 + "128s384s"
_TABLE_AT = 4096
_SLOTS = 48
_DATA_AT = 32768
_ALIGN = 4096
_DEFFILE, _PARTITION = 0x4001, 0x4004
_GROUP = 0xF0000000 | 1
SQUASHFS, ENCRYPTED_SQUASHFS, EXT3 = 1, 5, 2
PRIMARY_SYSTEM, DATA = 2, 3


@dataclass(frozen=True)
class Twist:
    """What to get wrong in the written file (the defaults write a good one)."""

    magic: bytes = b"SIF_MAGIC\0"
    version: bytes = b"01\0"
    slots: int = _SLOTS
    fstype: int = SQUASHFS
    parttype: int = PRIMARY_SYSTEM
    part_offset: int | None = None
    """Claimed offset of the partition (None: where it is)."""
    part_size: int | None = None
    truncate_to: int | None = None


def squash(tree: Path, out: Path, pseudo: tuple[str, ...] = ()) -> bytes:
    """``mksquashfs`` of ``tree`` (owners kept as they are), plus the
    ``pseudo`` entries (mksquashfs's ``-p`` definitions: device nodes, root-owned files)."""
    extra = [arg for p in pseudo for arg in ("-p", p)]
    subprocess.run(
        ["mksquashfs", str(tree), str(out), "-noappend", "-quiet", "-no-progress", *extra],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out.read_bytes()


def _descriptor(dtype: int, ident: int, offset: int, size: int, name: str, extra: bytes) -> bytes:
    padded = (size + _ALIGN - 1) // _ALIGN * _ALIGN
    return struct.pack(
        _DESCR_FMT,
        dtype,
        True,
        ident,
        _GROUP,
        0,
        offset,
        size,
        padded,
        1_700_000_000,
        1_700_000_000,
        0,
        0,
        name.encode(),
        extra,
    )


def make_sif(squashfs: bytes, out: Path, twist: Twist = Twist()) -> Path:
    """Write ``out``: a definition file object, then the squashfs as the primary system
    partition (amd64), each at a 4 KiB boundary after the descriptor table."""
    deffile = b"Bootstrap: scratch\n"
    def_at = _DATA_AT
    part_at = (def_at + len(deffile) + _ALIGN - 1) // _ALIGN * _ALIGN
    part_extra = struct.pack("<ii3s", twist.fstype, twist.parttype, b"02\0")
    descrs = [
        _descriptor(_DEFFILE, 1, def_at, len(deffile), "", b""),
        _descriptor(
            _PARTITION,
            2,
            part_at if twist.part_offset is None else twist.part_offset,
            len(squashfs) if twist.part_size is None else twist.part_size,
            "rootfs",
            part_extra,
        ),
    ]
    table = b"".join(descrs).ljust(_SLOTS * struct.calcsize(_DESCR_FMT), b"\0")
    header = struct.pack(
        _HEADER_FMT,
        _LAUNCH,
        twist.magic,
        twist.version,
        b"02\0",
        uuid.uuid4().bytes,
        1_700_000_000,
        1_700_000_000,
        twist.slots - len(descrs),
        twist.slots,
        _TABLE_AT,
        len(b"".join(descrs)),
        _DATA_AT,
        part_at + len(squashfs) - _DATA_AT,
    )
    body = bytearray(header.ljust(_TABLE_AT, b"\0") + table)
    body = body.ljust(def_at, b"\0") + deffile
    body = body.ljust(part_at, b"\0") + squashfs
    if twist.truncate_to is not None:
        body = body[: twist.truncate_to]
    out.write_bytes(bytes(body))
    return out
