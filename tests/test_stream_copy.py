"""The streaming-store copy (`imgfilter/_stream_copy.c`) behind the band copies of
`imgfilter.streamed`: byte for byte np.copyto at every length and alignment, refusing
buffers of other sizes or layouts.

`pip install` builds it into the installed package; the tests import the tree's
`imgfilter`, so where no built copy sits in the tree they build one into a temporary
folder (skipped without a C compiler)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import extensions
import numpy as np
import pytest

from imgfilter import streamed

SOURCE = Path(streamed.__file__).with_name("_stream_copy.c")


@pytest.fixture(scope="module")
def stream_copy(tmp_path_factory):
    """The built module (built here if need be)."""
    if streamed._stream_copy is not None:
        return streamed._stream_copy
    return extensions.build("_stream_copy", SOURCE, tmp_path_factory.mktemp("stream_copy"))


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 63, 64, 65, 127, 1000, 4099, 70001])
def test_copies_every_byte_at_every_alignment(stream_copy, n):
    rng = np.random.default_rng(n)
    for src_at in (0, 1, 8, 15):
        for dst_at in (0, 3, 16, 31):
            src = rng.integers(0, 256, n + 64, dtype=np.uint8)[src_at : src_at + n]
            space = np.full(n + 64, 0xA5, np.uint8)
            stream_copy.copy(space[dst_at : dst_at + n], src)
            np.testing.assert_array_equal(space[dst_at : dst_at + n], src)
            assert (space[:dst_at] == 0xA5).all() and (space[dst_at + n :] == 0xA5).all()


def test_copies_any_dtype_and_shape_by_bytes(stream_copy):
    src = np.random.default_rng(1).standard_normal((37, 29, 3)).astype(np.float32)
    src[0, 0] = [np.inf, -np.inf, np.nan]
    dst = np.empty_like(src)
    stream_copy.copy(dst, src)
    assert dst.tobytes() == src.tobytes()


def test_refuses_other_sizes_strided_and_read_only_buffers(stream_copy):
    a = np.arange(100, dtype=np.uint8)
    with pytest.raises(ValueError, match="holds 10 bytes, src 11"):
        stream_copy.copy(np.empty(10, np.uint8), a[:11])
    with pytest.raises(ValueError, match="contiguous"):
        stream_copy.copy(np.empty(50, np.uint8), a[::2])
    ro = np.empty(100, np.uint8)
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError), match="writ|read-only"):
        stream_copy.copy(ro, a)


def test_band_copies_go_through_it_where_built(stream_copy, monkeypatch):
    """streamed._copy_rows splits a large copy over threads, each piece by the C copy
    (a strided source falls back to NumPy's); the result is the source."""
    calls = []

    class Spy:
        @staticmethod
        def copy(dst, src):
            calls.append(dst.nbytes)
            stream_copy.copy(dst, src)

    monkeypatch.setattr(streamed, "_stream_copy", Spy)
    monkeypatch.setattr(streamed, "COPY_THREADS", 4)
    src = np.random.default_rng(2).integers(0, 256, (2000, 4100, 3), dtype=np.uint8)  # 24.6 MB
    dst = np.empty_like(src)
    with ThreadPoolExecutor(4) as pool:
        streamed._wait(streamed._copy_rows(dst, src, pool))
        np.testing.assert_array_equal(dst, src)
        assert len(calls) == 4 and sum(calls) == src.nbytes
        calls.clear()
        streamed._wait(streamed._copy_rows(dst[:, ::2], src[:, ::2], pool))
        assert not calls
        np.testing.assert_array_equal(dst, src)
