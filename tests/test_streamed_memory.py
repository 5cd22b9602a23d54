"""Host memory of the band streaming (`imgfilter.streamed`): bands capped in bytes,
page-locked buffers kept between calls, large results on huge pages."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from imgfilter import streamed


def test_band_rows_stay_within_the_band_bytes_whatever_the_budget():
    rows = streamed.band_rows(100_000, 1000, 1000, (5, 5), budget=10**12, band_bytes=64_000)
    assert rows == 64
    assert streamed.band_rows(100_000, 1000, 2000, (5, 5), 10**12, band_bytes=64_000) == 32
    # Never fewer rows than reach past the halo.
    assert streamed.band_rows(100_000, 1000, 1000, (40, 2), 10**12, band_bytes=1) == 41


def test_host_empty_gives_huge_pages_to_large_results(monkeypatch):
    small = streamed.host_empty((3, 4, 3), np.uint8)
    assert small.shape == (3, 4, 3) and small.base is None  # below HUGE_PAGE_BYTES: np.empty
    monkeypatch.setattr(streamed, "HUGE_PAGE_BYTES", 1 << 12)
    big = streamed.host_empty((300, 70, 3), np.uint16)
    assert big.shape == (300, 70, 3) and big.dtype == np.uint16
    assert big.flags.c_contiguous and big.flags.writeable
    if hasattr(streamed.mmap, "MADV_HUGEPAGE"):
        owner = big
        while isinstance(owner, np.ndarray):
            owner = owner.base
        assert isinstance(getattr(owner, "obj", owner), streamed.mmap.mmap)
    values = np.arange(big.size, dtype=np.uint16).reshape(big.shape)
    big[...] = values
    np.testing.assert_array_equal(big, values)


def test_host_empty_falls_back_to_numpy_without_madvise(monkeypatch):
    monkeypatch.setattr(streamed, "HUGE_PAGE_BYTES", 1)
    monkeypatch.delattr(streamed.mmap, "MADV_HUGEPAGE", raising=False)
    arr = streamed.host_empty((5, 6), np.float32)
    assert arr.shape == (5, 6) and arr.dtype == np.float32 and arr.base is None


class _Driver:
    """host_alloc/host_free over ctypes buffers: what the pool does with addresses."""

    def __init__(self):
        self.live: dict[int, ctypes.Array] = {}
        self.allocs = 0

    def host_alloc(self, nbytes: int) -> int:
        buf = (ctypes.c_ubyte * nbytes)()
        self.live[ctypes.addressof(buf)] = buf
        self.allocs += 1
        return ctypes.addressof(buf)

    def host_free(self, address: int) -> None:
        del self.live[address]


@pytest.fixture
def pool(monkeypatch):
    import kernels.common.cudadrv as cudadrv

    drv = _Driver()
    monkeypatch.setattr(streamed, "_PINNED", {})
    monkeypatch.setattr(streamed, "_PINNED_FREE", [])
    monkeypatch.setattr(cudadrv, "driver", lambda: drv)
    return drv


def test_pinned_buffers_are_kept_and_reused_by_later_calls(pool):
    arr, a = streamed._host_buffer((10, 20, 3), np.uint8, pool)
    assert arr.shape == (10, 20, 3) and arr.ctypes.data == a
    arr[...] = 7
    streamed._keep_pinned(a)
    again, b = streamed._host_buffer((5, 20, 3), np.uint8, pool)  # smaller: the same buffer
    assert b == a and again.shape == (5, 20, 3) and pool.allocs == 1
    other, c = streamed._host_buffer((5, 20, 3), np.uint8, pool)  # the first is in use
    assert c != a and pool.allocs == 2
    streamed._keep_pinned(b)
    streamed._keep_pinned(c)
    bigger, d = streamed._host_buffer((11, 20, 3), np.uint8, pool)  # neither is large enough
    assert d not in (a, c) and pool.allocs == 3
    assert streamed.release_pinned() == 600 + 300  # the two free ones; d is in use
    assert set(pool.live) == {d}
    streamed._keep_pinned(d)
    assert streamed.release_pinned() == 660 and not pool.live
    assert streamed.release_pinned() == 0
