"""``sif``: the reader of a tenant's ``.sif`` finds the squashfs root partition of a well-formed
file (written by ``tests/sif_writer.py`` from the published layout) and refuses, in words and
without reading past the file, every malformed one: wrong magic or version, absurd descriptor
counts, a table or partition outside the file, an encrypted or non-squashfs root, no primary
partition, a partition that is not a squashfs, a FIFO. Random damage gives ``SifError`` or a
partition inside the file, never another exception.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
from pathlib import Path

import pytest

from gpufence.control.base import sif
from gpufence.control.base.sif import SifError, inspect, inspect_header
from sif_writer import DATA, ENCRYPTED_SQUASHFS, EXT3, Twist, make_sif

FAKE_SQUASHFS = b"hsqs" + bytes(range(256)) * 40  # the reader checks the magic only


def test_a_good_file_gives_its_squashfs_partition_and_its_digest(tmp_path: Path) -> None:
    path = make_sif(FAKE_SQUASHFS, tmp_path / "good.sif")
    part, digest = inspect(str(path))
    data = path.read_bytes()
    assert data[part.offset : part.offset + part.size] == FAKE_SQUASHFS
    assert part.offset % 4096 == 0 and part.offset > 32768  # after the table and the deffile
    assert digest == hashlib.sha256(data).hexdigest()
    assert inspect_header(str(path)) == part


@pytest.mark.parametrize(
    ("twist", "said"),
    [
        (Twist(magic=b"NOT_MAGIC\0"), "no SIF_MAGIC"),
        (Twist(version=b"02\0"), "SIF version '02' is not supported"),
        (Twist(slots=0), "claims 0 descriptors"),
        (Twist(slots=1 << 40), f"claims {1 << 40} descriptors"),
        (Twist(slots=4096), "descriptor table (4096 x 585 bytes at 4096) lies outside"),
        (Twist(truncate_to=100), "too short for a SIF image"),
        (Twist(truncate_to=20000), "lies outside the file (20000 bytes)"),
        (Twist(fstype=ENCRYPTED_SQUASHFS), "encrypted"),
        (Twist(fstype=EXT3), "is ext3, not squashfs"),
        (Twist(fstype=77), "unknown file system type 77, not squashfs"),
        (Twist(parttype=DATA), "no primary system partition"),
        (Twist(part_offset=1 << 62), "lies outside the file"),
        (Twist(part_offset=-4096), "lies outside the file"),
        (Twist(part_size=1 << 40), "lies outside the file"),
        (Twist(part_offset=32768), "does not begin with a squashfs superblock"),
    ],
)
def test_a_malformed_file_is_refused_saying_what_is_wrong(
    tmp_path: Path, twist: Twist, said: str
) -> None:
    path = make_sif(FAKE_SQUASHFS, tmp_path / "bad.sif", twist)
    with pytest.raises(SifError) as err:
        inspect(str(path))
    assert said in str(err.value)


def test_a_fifo_or_directory_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.sif"
    os.mkfifo(fifo)
    with pytest.raises(SifError, match="is not a regular file"):
        inspect_header(str(fifo))
    with pytest.raises(SifError, match="cannot be read"):
        inspect_header(str(tmp_path / "missing.sif"))


def test_random_damage_gives_a_sif_error_or_a_partition_inside_the_file(tmp_path: Path) -> None:
    good = make_sif(FAKE_SQUASHFS, tmp_path / "good.sif").read_bytes()
    rng = random.Random(32)
    path = tmp_path / "damaged.sif"
    table = 4096
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):  # hit the header and the partition's descriptor
            at = rng.choice([rng.randrange(128), table + 585 + rng.randrange(585)])
            data[at] = rng.randrange(256)
        if rng.random() < 0.2:
            data = data[: rng.randrange(len(data))]
        path.write_bytes(bytes(data))
        try:
            part = inspect_header(str(path))
        except SifError:
            continue
        assert part.offset >= 128 and part.offset + part.size <= len(data)
        assert data[part.offset : part.offset + 4] == b"hsqs"


def test_the_layout_is_the_published_one() -> None:
    """128-byte header and 585-byte descriptors, packed (Go's encoding/binary writes no
    padding): a reader with C alignment would read every field after the first bool wrong."""
    assert sif.HEADER.size == 128
    assert sif.DESCRIPTOR.size == 585
    assert struct.calcsize("<iBIII7q128s384s") == 585
