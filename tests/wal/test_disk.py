"""The real Disk reaches the kernel: every fsync the writer asks for is an fdatasync or fsync of
the right descriptor, after the write it covers. (The crash-point tests check what the writer asks
for on a simulated disk; this checks that the real one does it.)"""

import os

from queen.wal.disk import Disk


def spy_on_syncs(monkeypatch):
    calls = []
    real_fdatasync, real_fsync, real_write = os.fdatasync, os.fsync, os.write

    def fdatasync(fd):
        calls.append(("fdatasync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fdatasync(fd)

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def write(fd, data):
        calls.append(("write", os.readlink(f"/proc/self/fd/{fd}")))
        return real_write(fd, data)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "write", write)
    return calls


def test_fsync_is_an_fdatasync_of_the_file_after_its_write(tmp_path, monkeypatch):
    calls = spy_on_syncs(monkeypatch)
    disk = Disk()
    path = str(tmp_path / "segment")
    fd = disk.create(path)
    disk.write(fd, b"frame")
    disk.fsync(fd)
    disk.close(fd)
    assert calls == [("write", path), ("fdatasync", path)]


def test_an_atomic_file_is_synced_then_renamed_then_its_directory_synced(tmp_path, monkeypatch):
    calls = spy_on_syncs(monkeypatch)
    path = str(tmp_path / "snapshot")
    Disk().write_file_atomically(path, b"whole")
    assert calls == [("write", path + ".tmp"), ("fdatasync", path + ".tmp"), ("fsync", str(tmp_path))]
    with open(path, "rb") as file:
        assert file.read() == b"whole"
    assert not os.path.exists(path + ".tmp")


def test_a_truncation_is_synced(tmp_path, monkeypatch):
    path = tmp_path / "segment"
    path.write_bytes(b"keep-cut")
    calls = spy_on_syncs(monkeypatch)
    Disk().truncate(str(path), 4)
    assert calls == [("fsync", str(path))] and path.read_bytes() == b"keep"
