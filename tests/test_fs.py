"""edgeinfer.util.fs: files are whole or absent, whoever writes them."""

from __future__ import annotations

import threading

import pytest

from edgeinfer.util.fs import atomic_path, atomic_write_bytes, copy_atomically, sha256_file, temp_path_for


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as temp:
        temp.write_bytes(b"half of the new")
        raise RuntimeError("power cut")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_threads_writing_one_target_each_get_their_own_temporary(tmp_path):
    target = tmp_path / "model.tflite"
    contents = [bytes([n]) * 300_000 for n in range(8)]
    start = threading.Barrier(len(contents))

    def write(data: bytes) -> None:
        start.wait()
        atomic_write_bytes(target, data)

    threads = [threading.Thread(target=write, args=(data,)) for data in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert target.read_bytes() in contents  # one writer's whole file, never a mix
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.tflite"]


def test_temporaries_keep_the_suffix_and_are_hidden_and_distinct(tmp_path):
    first, second = temp_path_for(tmp_path / "clip.avi"), temp_path_for(tmp_path / "clip.avi")
    assert first != second
    assert first.suffix == ".avi" and first.name.startswith(".clip.")


def test_copy_and_hash(tmp_path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"x" * 5000)
    copy_atomically(source, tmp_path / "sub" / "b.bin")
    assert (tmp_path / "sub" / "b.bin").read_bytes() == source.read_bytes()
    assert sha256_file(source) == "c59d3c0480cc2d71d8f646e735e92da65450311eec46e81a5db8c7e6e8a92054"
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    # IR models hash their .xml and .bin as one stream
    assert sha256_file(tmp_path / "a", tmp_path / "b") == (
        "fb8e20fc2e4c3f248c60c39bd652f3c1347298bb977b8b4d5903b85055620603")
