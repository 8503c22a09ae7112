"""Atomic writes: a reader never sees half a file, a failed write leaves the old one."""

from __future__ import annotations

import json

import pytest

from placer.files import write_bytes_atomic, write_text_atomic


def test_write_replaces_whole_file_and_leaves_no_temporary_files(tmp_path):
    target = tmp_path / "d" / "f.json"
    write_text_atomic(target, "{}")
    write_text_atomic(target, '{"a": 1}')
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]


def test_a_failed_write_keeps_the_old_file_and_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    write_bytes_atomic(target, b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("placer.files.os.replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_bytes_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]
