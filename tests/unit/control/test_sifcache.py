"""``sifcache``: a ``.sif`` is unpacked once per content into the user's directory of the cache
(here as the test's own user: the server running as itself), the cache keeps at most ``KEEP``
trees per user and never deletes one in use, and a missing ``unsquashfs`` names its package.
Needs squashfs-tools (skipped without it, failed under CI=true)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from gpufence.control.base import sifcache
from gpufence.control.base.containers import sif_problem
from gpufence.control.base.sifcache import ImageError, evict, unpacked_root
from sif_writer import make_sif, squash


def _sif(tmp_path: Path, marker: str) -> Path:
    if shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the .sif tests: squashfs-tools is missing", pytrace=False)
        pytest.skip("squashfs-tools is not installed: apt-get install squashfs-tools")
    tree = tmp_path / f"root-{marker}"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "marker").write_text(marker)
    return make_sif(squash(tree, tmp_path / f"{marker}.sqfs"), tmp_path / f"{marker}.sif")


def test_an_image_is_unpacked_once_per_content_into_the_users_directory(tmp_path: Path) -> None:
    image = _sif(tmp_path, "one")
    cache = tmp_path / "images"
    tree = unpacked_root(image, None, cache)
    assert tree == cache / f"u{os.geteuid()}" / hashlib.sha256(image.read_bytes()).hexdigest()
    assert (tree / "etc" / "marker").read_text() == "one"
    assert (cache.stat().st_mode & 0o777, tree.parent.stat().st_mode & 0o777) == (0o711, 0o700)
    (tree / "etc" / "seen").write_text("")  # a second call finds this tree, not a new one
    copy = tmp_path / "copy.sif"
    shutil.copyfile(image, copy)  # same content, another name: the same tree
    assert unpacked_root(copy, None, cache) == tree and (tree / "etc" / "seen").exists()
    assert [p.name for p in tree.parent.iterdir()] == [tree.name]  # no work directory left


def test_the_cache_keeps_the_most_recent_trees_and_never_one_in_use(tmp_path: Path) -> None:
    mine = tmp_path / "u0"
    trees = []
    for i in range(sifcache.KEEP + 3):
        t = mine / f"{i:064x}"
        t.mkdir(parents=True)
        os.utime(t, (1000 + i, 1000 + i))  # tree 0 is the least recently used
        trees.append(t)
    gone = evict(mine, None, keep=sifcache.KEEP, in_use={trees[0]})
    assert sorted(gone) == trees[1:3]
    assert sorted(p for p in mine.iterdir()) == [trees[0], *trees[3:]]


def test_an_unpack_past_the_limit_evicts_the_oldest_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sifcache, "KEEP", 1)
    cache = tmp_path / "images"
    first = unpacked_root(_sif(tmp_path, "a"), None, cache)
    second = unpacked_root(_sif(tmp_path, "b"), None, cache)
    assert not first.exists() and (second / "etc" / "marker").read_text() == "b"
    third = unpacked_root(_sif(tmp_path, "c"), None, cache, in_use={second})
    assert second.exists() and third.exists()


def test_without_unsquashfs_the_submit_and_the_unpack_name_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _sif(tmp_path, "x")
    monkeypatch.setattr(sifcache.shutil, "which", lambda _name: None)
    assert "apt-get install squashfs-tools" in str(sif_problem(image, None))
    with pytest.raises(ImageError, match="apt-get install squashfs-tools"):
        unpacked_root(image, None, tmp_path / "images")


def test_a_corrupt_squashfs_fails_the_unpack_and_leaves_nothing(tmp_path: Path) -> None:
    good = _sif(tmp_path, "c").read_bytes()
    at = good.index(b"hsqs")
    bad = tmp_path / "corrupt.sif"
    used = int.from_bytes(good[at + 40 : at + 48], "little")  # the superblock's bytes_used
    make_sif(good[at : at + used // 2], bad)  # the tables it points to are cut off
    cache = tmp_path / "images"
    with pytest.raises(ImageError, match="unpacking the image: "):
        unpacked_root(bad, None, cache)
    assert list((cache / f"u{os.geteuid()}").iterdir()) == []
