"""atomic_write: complete files or none, the usual permissions, devices written in place."""

import os
import stat

import pytest

from variance_lab._atomic import atomic_write


def test_replaces_only_with_a_complete_file(tmp_path):
    """An interrupted write leaves the old file and no temporary; a complete one replaces it."""
    target = tmp_path / "out.txt"
    target.write_text("old")

    def fail(tmp):
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left
    assert atomic_write(target, lambda tmp: tmp.write_text("new")) == target
    assert target.read_text() == "new"


def test_permissions_follow_the_umask(tmp_path):
    """The written file has the mode the umask gives (0o644 under 0o022)."""
    old = os.umask(0o022)
    try:
        target = atomic_write(tmp_path / "f.csv", lambda tmp: tmp.write_text("x"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_fifo_is_written_in_place_not_replaced(tmp_path):
    """A named pipe is written through, not replaced by a regular file."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that the writer does not block
    try:
        atomic_write(fifo, lambda tmp: tmp.write_text("through the pipe"))
        assert os.read(fd, 100) == b"through the pipe"
    finally:
        os.close(fd)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
