"""The one atomic writer: the file appears whole or not at all, with the mode `open()` would give it."""

from __future__ import annotations

import os
import stat

import pytest

from core.io import atomic_path, atomic_write, fingerprint, sha256_bytes, sha256_file


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_mode_follows_the_umask_not_mkstemps_0600(tmp_path, mask):
    old = os.umask(mask)
    try:
        atomic_write(tmp_path / "a.json", b"{}")
        with atomic_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"x")
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.json") == 0o666 & ~mask == _mode(tmp_path / "plain")
    assert _mode(tmp_path / "b.bin") == 0o666 & ~mask
    atomic_write(tmp_path / "run.sh", "#!/bin/sh\n", mode=0o755)
    assert _mode(tmp_path / "run.sh") == 0o755


def test_bytes_text_and_writer_function_replace_the_old_file(tmp_path):
    p = tmp_path / "sub" / "f.txt"
    atomic_write(p, "old")
    atomic_write(p, "né")
    assert p.read_text(encoding="utf-8") == "né"
    atomic_write(p, lambda f: f.write(b"streamed"))
    assert p.read_bytes() == b"streamed"
    assert sorted(x.name for x in p.parent.iterdir()) == ["f.txt"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "f.txt"
    atomic_write(p, "old")

    def boom(f):
        f.write(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(p, boom)
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["f.txt"]


def test_hashes(tmp_path):
    (tmp_path / "f").write_bytes(b"abc" * 100_000)
    assert sha256_file(tmp_path / "f", chunk=4096) == sha256_bytes(b"abc" * 100_000)
    assert sha256_bytes("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert (
        fingerprint({"b": 1, "a": [2]}) == fingerprint({"a": [2], "b": 1}) != fingerprint({"a": [3], "b": 1})
    )
    assert len(fingerprint({}, 12)) == 12


def test_product_writers_go_through_it(tmp_path):
    """Markers and stats written by the data stages were 0600 (mkstemp's mode): a shared run folder's other
    users could not read them."""
    from data_pipeline.shards import write_json_atomic, write_text_atomic

    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "stats.json", {"a": 1})
        write_text_atomic(tmp_path / "stats.txt", "a 1\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "stats.json") == _mode(tmp_path / "stats.txt") == 0o644


def test_replace_dir_never_touches_a_users_sibling_dot_old(tmp_path):
    """Issue 43 fault 1: a user's `<folder>.old` (an earlier export renamed by hand) survives the swap; nothing of
    the swap is left beside the folder."""
    from core.io import replace_dir

    folder, mine, new = tmp_path / "export", tmp_path / "export.old", tmp_path / "staged"
    for d, text in ((folder, "previous"), (mine, "the user's"), (new, "next")):
        d.mkdir()
        (d / "f.txt").write_text(text)
    replace_dir(new, folder)
    assert (folder / "f.txt").read_text() == "next"
    assert (mine / "f.txt").read_text() == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "export.old"]
