"""Reading an Apptainer/Singularity image file (``.sif``): where its root file system lies.

Written from the format's public description (Sylabs' SIF: a global header, a table of
descriptors, then the data objects they point to); standard library only. The executor reads
an image through a file descriptor that the job's user opened (``sifcache``).

Layout, little-endian, packed (no alignment padding):

- global header, 128 bytes: launch line (32), magic ``SIF_MAGIC\\0`` (10), version ``01\\0``
  (3), architecture (3), image UUID (16), then eight int64: created, modified, free
  descriptors, total descriptors, descriptors' offset, descriptors' size, data offset, data size;
- each descriptor, 585 bytes: data type (int32), used (1 byte), id, group id, linked id (uint32
  each), then seven int64: offset, size, size with padding, created, modified, and two
  deprecated owner fields; name (128) and type-specific bytes (384). For a partition (data type
  0x4004) those begin with its file system type and partition type (int32 each): squashfs is 1,
  encrypted squashfs 5; the primary system partition is 2.

The file comes from a tenant: every count and offset is checked against the file's size before
it is used, the table is read whole only once its size is known to be small, and what is wrong
is said in words (``SifError``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"SIF_MAGIC\0"
VERSION = b"01\0"
HEADER = struct.Struct("<32s10s3s3s16s8q")
DESCRIPTOR = struct.Struct("<iBIII7q128s384s")
PARTITION = struct.Struct("<ii")
DATA_PARTITION = 0x4004
FS_SQUASHFS, FS_ENCRYPTED_SQUASHFS = 1, 5
PART_PRIMARY_SYSTEM = 2
SQUASHFS_MAGIC = b"hsqs"
MAX_DESCRIPTORS = 4096
"""Sylabs' tools make 48; a table this long is 2.4 MB, read once."""
_FS_NAMES = {1: "squashfs", 2: "ext3", 3: "an archive", 4: "raw data", 5: "encrypted squashfs"}
_CHUNK = 1 << 20


class SifError(ValueError):
    """Not a SIF image this server can run; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class RootPartition:
    """Where the primary system partition's squashfs lies in the file."""

    offset: int
    size: int


def _header(f: BinaryIO, file_size: int) -> tuple[int, int]:
    """(descriptors' offset, their count) from the global header, checked."""
    raw = f.read(HEADER.size)
    if len(raw) < HEADER.size:
        raise SifError(f"too short for a SIF image ({file_size} bytes; its header is 128)")
    _launch, magic, version, _arch, _uuid, *nums = HEADER.unpack(raw)
    if magic != MAGIC:
        raise SifError("not a SIF image (no SIF_MAGIC in its header)")
    if version != VERSION:
        shown = version.rstrip(b"\0").decode("ascii", "replace")
        raise SifError(f"SIF version {shown!r} is not supported (only '01')")
    _ctime, _mtime, _free, total, d_off, d_size, _data_off, _data_size = nums
    if not 0 < total <= MAX_DESCRIPTORS:
        raise SifError(f"its header claims {total} descriptors (1 to {MAX_DESCRIPTORS} read)")
    need = total * DESCRIPTOR.size
    if d_off < HEADER.size or d_off + need > file_size:
        raise SifError(
            f"its descriptor table ({total} x {DESCRIPTOR.size} bytes at {d_off}) lies outside "
            f"the file ({file_size} bytes): truncated or corrupt"
        )
    if d_size < 0 or d_size > need:
        raise SifError(f"its header's descriptor size {d_size} exceeds its table ({need} bytes)")
    return d_off, total


def _partitions(table: bytes, count: int) -> list[tuple[int, int, int, int]]:
    """(fs type, partition type, offset, size) of each used partition descriptor."""
    found = []
    for i in range(count):
        fields = DESCRIPTOR.unpack_from(table, i * DESCRIPTOR.size)
        dtype, used, offset, size, extra = fields[0], fields[1], fields[5], fields[6], fields[-1]
        if used and dtype == DATA_PARTITION:
            fstype, parttype = PARTITION.unpack_from(extra)
            found.append((fstype, parttype, offset, size))
    return found


def root_partition(f: BinaryIO, file_size: int) -> RootPartition:
    """The primary system partition of the open SIF file ``f``, checked to be a squashfs that
    lies inside the file."""
    d_off, total = _header(f, file_size)
    f.seek(d_off)
    table = f.read(total * DESCRIPTOR.size)
    primary = [p for p in _partitions(table, total) if p[1] == PART_PRIMARY_SYSTEM]
    if not primary:
        raise SifError("it has no primary system partition (no root file system to run)")
    if len(primary) > 1:
        raise SifError(f"it has {len(primary)} primary system partitions (one expected)")
    fstype, _, offset, size = primary[0]
    if fstype == FS_ENCRYPTED_SQUASHFS:
        raise SifError("its root file system is encrypted, which is not supported here")
    if fstype != FS_SQUASHFS:
        kind = _FS_NAMES.get(fstype, f"unknown file system type {fstype}")
        raise SifError(f"its root file system is {kind}, not squashfs")
    if offset < HEADER.size or size <= 0 or offset + size > file_size:
        raise SifError(
            f"its root partition ({size} bytes at {offset}) lies outside the file "
            f"({file_size} bytes): truncated or corrupt"
        )
    f.seek(offset)
    if f.read(len(SQUASHFS_MAGIC)) != SQUASHFS_MAGIC:
        raise SifError(f"its root partition at {offset} does not begin with a squashfs superblock")
    return RootPartition(offset, size)


def _open(path: str) -> BinaryIO:
    """``path`` opened for reading: a regular file only (not a FIFO or device to block on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise SifError(f"cannot be read: {exc.strerror}") from exc
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise SifError("is not a regular file")
    return f


def inspect_header(path: str) -> RootPartition:
    """The root partition of the SIF image at ``path`` (its header and table only)."""
    with _open(path) as f:
        return root_partition(f, os.fstat(f.fileno()).st_size)


def inspect(path: str) -> tuple[RootPartition, str]:
    """(the root partition, the sha256 of the whole file) of the SIF image at ``path``."""
    with _open(path) as f:
        return inspect_file(f)


def inspect_file(f: BinaryIO) -> tuple[RootPartition, str]:
    """(the root partition, the sha256 of the whole file) of the open SIF file ``f``."""
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        raise SifError("is not a regular file")
    part = root_partition(f, st.st_size)
    f.seek(0)
    digest = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return part, digest.hexdigest()
