"""Reading the command's input while the CLI imports (`imgfilter.prefetch`): the image
read_image then gives is the file's as it is now, errors and notes are the usual ones,
and nothing is written to stderr while the background read holds descriptor 2."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from imgfilter import io, io_read, prefetch
from imgfilter.cli import output
from imgfilter.errors import InputError


@pytest.fixture(autouse=True)
def _nothing_pending():
    yield
    prefetch.settle()
    prefetch._pending.clear()


def _png(path: Path, seed: int) -> Path:
    img = np.random.default_rng(seed).integers(0, 256, (23, 31, 3), dtype=np.uint8)
    cv2.imwrite(str(path), img)
    return path


def test_the_input_is_the_word_after_a_filtering_command():
    assert prefetch.input_of(["blur", "a.jpg", "--k", "21"]) == "a.jpg"
    assert prefetch.input_of(["--debug", "filter", "a.png", "--kernel", "k.npy"]) == "a.png"
    assert prefetch.input_of(["contour", "a.png"]) == "a.png"
    assert prefetch.input_of(["blur", "--k", "21", "a.jpg"]) is None  # options first: no guess
    assert prefetch.input_of(["blur", "a.jpg", "--help"]) is None
    assert prefetch.input_of(["compare", "a.jpg", "--k", "3"]) is None
    assert prefetch.input_of(["classify", "a.jpg"]) is None
    assert prefetch.input_of(["blur"]) is None
    assert prefetch.input_of([]) is None


def test_read_image_takes_the_background_read_once(tmp_path, monkeypatch):
    path = _png(tmp_path / "a.png", 1)
    assert prefetch.start(["blur", str(path), "--k", "3"])
    prefetch.settle()
    want = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)

    def no_second_read(p):
        raise AssertionError("read again")

    monkeypatch.setattr(io, "read_frames", no_second_read)
    np.testing.assert_array_equal(io.read_image(path), want)
    monkeypatch.undo()
    assert prefetch.take(path) is None  # given once
    np.testing.assert_array_equal(io.read_image(path), want)


def test_another_file_or_a_changed_one_is_read_again(tmp_path):
    a, b = _png(tmp_path / "a.png", 1), _png(tmp_path / "b.png", 2)
    assert prefetch.start(["blur", str(a), "--k", "3"])
    assert prefetch.take(b) is None  # not the file it read: still pending for a
    prefetch.settle()
    _png(a, 3)  # rewritten since: new contents, another modification time
    st = os.stat(a)
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    np.testing.assert_array_equal(io.read_image(a), cv2.imread(str(a), cv2.IMREAD_UNCHANGED))


def test_a_file_that_cannot_be_read_gives_the_usual_error(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"junk" * 50)
    assert prefetch.start(["blur", str(bad), "--k", "3"])
    with pytest.raises(InputError) as background:
        io.read_image(bad)
    with pytest.raises(InputError) as direct:
        io.read_image(bad)
    assert str(background.value) == str(direct.value) and "bad.png" in str(direct.value)


def test_nothing_is_started_for_a_folder_a_missing_or_a_large_file(tmp_path, monkeypatch):
    path = _png(tmp_path / "a.png", 1)
    assert not prefetch.start(["blur", str(tmp_path), "--k", "3"])
    assert not prefetch.start(["blur", str(tmp_path / "missing.png"), "--k", "3"])
    monkeypatch.setattr(prefetch, "MAX_BYTES", path.stat().st_size - 1)
    assert not prefetch.start(["blur", str(path), "--k", "3"])
    assert not prefetch._pending


def test_several_frames_still_warn_in_the_reading_thread(tmp_path):
    path = tmp_path / "pages.tif"
    pages = [Image.fromarray(np.full((8, 10, 3), 50 * i, np.uint8)) for i in range(3)]
    pages[0].save(path, save_all=True, append_images=pages[1:])
    assert prefetch.start(["blur", str(path), "--k", "3"])
    with pytest.warns(io.MultiFrameWarning, match="has 3 pages"):
        io.read_image(path)


def test_an_error_line_waits_for_the_background_read(tmp_path, monkeypatch, capsys):
    """While the read runs, its decoder may hold descriptor 2: `fail` waits for it."""
    path = _png(tmp_path / "a.png", 1)
    release = threading.Event()
    read_frames = io_read.read_frames

    def slow(p):
        release.wait(10)
        return read_frames(p)

    monkeypatch.setattr(io_read, "read_frames", slow)  # what the background read calls
    assert prefetch.start(["blur", str(path), "--k", "3"])
    timer = threading.Timer(0.3, release.set)
    timer.start()
    t0 = time.monotonic()
    output.fail("bad --k")
    assert time.monotonic() - t0 >= 0.25  # printed only once the read had ended
    assert release.is_set()
    assert capsys.readouterr().err == "imgfilter: error: bad --k\n"
    timer.join()


def test_io_never_imports_prefetch():
    """prefetch hands its read to io (`io.set_pre_reader`); no io module imports it back."""
    import ast

    folder = Path(io.__file__).parent
    for module in sorted(folder.glob("io*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
                assert not any("prefetch" in n for n in names), module.name
