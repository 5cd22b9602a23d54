"""Host memory of the band streaming (`imgfilter.streamed`): bands capped in bytes,
page-locked buffers kept between calls (large results: tests/test_hostmem.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from imgfilter import pinned, streamed


def test_band_rows_stay_within_the_band_bytes_whatever_the_budget():
    rows = streamed.band_rows(100_000, 1000, 1000, (5, 5), budget=10**12, band_bytes=64_000)
    assert rows == 64
    assert streamed.band_rows(100_000, 1000, 2000, (5, 5), 10**12, band_bytes=64_000) == 32
    # Never fewer rows than reach past the halo.
    assert streamed.band_rows(100_000, 1000, 1000, (40, 2), 10**12, band_bytes=1) == 41


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
    monkeypatch.setattr(pinned, "_SIZES", {})
    monkeypatch.setattr(pinned, "_FREE", [])
    monkeypatch.setattr(pinned, "_MAKING", [0])
    monkeypatch.setattr(cudadrv, "driver", lambda: drv)
    return drv


def test_pinned_buffers_are_kept_and_reused_by_later_calls(pool):
    arr, a = pinned.take((10, 20, 3), np.uint8, pool)
    assert arr.shape == (10, 20, 3) and arr.ctypes.data == a
    arr[...] = 7
    pinned.keep(a)
    again, b = pinned.take((5, 20, 3), np.uint8, pool)  # smaller: the same buffer
    assert b == a and again.shape == (5, 20, 3) and pool.allocs == 1
    other, c = pinned.take((5, 20, 3), np.uint8, pool)  # the first is in use
    assert c != a and pool.allocs == 2
    pinned.keep(b)
    pinned.keep(c)
    bigger, d = pinned.take((11, 20, 3), np.uint8, pool)  # neither is large enough
    assert d not in (a, c) and pool.allocs == 3
    assert streamed.release_pinned() == 600 + 300  # the two free ones; d is in use
    assert set(pool.live) == {d}
    pinned.keep(d)
    assert streamed.release_pinned() == 660 and not pool.live
    assert streamed.release_pinned() == 0


def test_pinned_buffers_made_at_once_by_several_threads_stay_under_the_limit(pool, monkeypatch):
    """Buffers being made (page-locking is slow, done outside the lock) count against
    LIMIT, so threads asking together cannot pass it between them."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(pinned, "LIMIT", 1000)
    alloc = pool.host_alloc

    def slow_alloc(nbytes):
        time.sleep(0.05)  # every thread has checked the limit before any buffer exists
        return alloc(nbytes)

    monkeypatch.setattr(pool, "host_alloc", slow_alloc)
    with ThreadPoolExecutor(8) as threads:
        got = list(threads.map(lambda _: pinned.take((300,), np.uint8, pool), range(8)))
    made = [g for g in got if g is not None]
    assert len(made) == 3 and sum(pinned._SIZES.values()) == 900 and pinned._MAKING == [0]

    def failing_alloc(nbytes):
        raise MemoryError("no page-locked memory")

    monkeypatch.setattr(pool, "host_alloc", failing_alloc)
    with pytest.raises(MemoryError):
        pinned.take((50,), np.uint8, pool)
    assert pinned._MAKING == [0]


def test_pinned_buffers_stop_at_the_limit_and_slots_use_plain_memory_past_it(pool, monkeypatch):
    monkeypatch.setattr(pinned, "LIMIT", 1000)
    arr, a = pinned.take((10, 60), np.uint8, pool)
    assert pinned.take((10, 41), np.uint8, pool) is None  # 600 + 410 > 1000
    pinned.keep(a)
    again, b = pinned.take((10, 41), np.uint8, pool)  # a kept one that fits: no new bytes
    assert b == a and pool.allocs == 1
    plain, address = streamed._host_buffer((10, 41), np.uint8, pool)
    assert address not in pool.live and plain.shape == (10, 41)
    pinned.keep(address)  # not a pinned buffer: ignored
    pinned.keep(b)
    pinned.keep(b)  # twice: kept once
    assert pinned.release() == 600 and not pool.live
