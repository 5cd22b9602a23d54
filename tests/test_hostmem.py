"""Large host results (`imgfilter.hostmem`): their own huge-page mappings, and the
mapping of a dropped result reused by the next result of the same size."""

from __future__ import annotations

import ctypes
import errno
import gc
import time

import numpy as np
import pytest

from imgfilter import hostmem

needs_madvise = pytest.mark.skipif(
    not hasattr(hostmem.mmap, "MADV_HUGEPAGE"), reason="no madvise(MADV_HUGEPAGE) here"
)


@pytest.fixture
def small_results(monkeypatch):
    """Results of 4 KiB or more get mappings (pages of 4 KiB), none kept at the start."""
    monkeypatch.setattr(hostmem, "HUGE_PAGE_BYTES", 1 << 12)
    monkeypatch.setattr(hostmem, "_PAGE", 1 << 12)
    hostmem.release_results()
    yield
    gc.collect()
    hostmem.release_results()


def _owner(arr: np.ndarray):
    """What holds an array's memory: the end of its chain of bases."""
    owner = arr
    while isinstance(owner, np.ndarray):
        owner = owner.base
    return owner


def test_small_results_are_plain_numpy():
    small = hostmem.host_empty((3, 4, 3), np.uint8)
    assert small.shape == (3, 4, 3) and small.base is None  # below HUGE_PAGE_BYTES


@needs_madvise
def test_large_results_get_their_own_mapping(small_results):
    big = hostmem.host_empty((300, 70, 3), np.uint16)
    assert big.shape == (300, 70, 3) and big.dtype == np.uint16
    assert big.flags.c_contiguous and big.flags.writeable
    assert isinstance(_owner(big), ctypes.Array)  # a view of its own mapping
    values = np.arange(big.size, dtype=np.uint16).reshape(big.shape)
    big[...] = values
    np.testing.assert_array_equal(big, values)


@needs_madvise
def test_a_dropped_result_is_reused_by_the_next_of_its_size_only(small_results):
    first = hostmem.host_empty((100, 50, 3), np.uint8)  # 15000 bytes: 4 pages
    first[...] = 7
    address = first.ctypes.data
    view = first[10:20]
    del first
    gc.collect()
    assert hostmem.kept_bytes() == 0  # a view still uses the memory
    del view
    gc.collect()
    assert hostmem.kept_bytes() == 4 << 12
    other = hostmem.host_empty((100, 80, 3), np.uint8)  # 24000 bytes: another size
    assert other.ctypes.data != address and hostmem.kept_bytes() == 4 << 12
    again = hostmem.host_empty((50, 100, 3), np.uint8)  # same 4 pages, other shape
    assert again.ctypes.data == address and again.shape == (50, 100, 3)
    assert hostmem.kept_bytes() == 0
    again[...] = 3  # the old values are overwritten like any uninitialised array's
    assert int(again.sum()) == 3 * again.size


@needs_madvise
def test_at_most_keep_results_mappings_are_kept_and_release_unmaps_them(small_results):
    arrays = [hostmem.host_empty((4096 * (i + 1),), np.uint8) for i in range(3)]
    for i in range(3):  # dropped in order: 1, 2, 3 pages
        arrays[i] = None
        gc.collect()
    assert hostmem.kept_bytes() == (2 + 3) << 12  # the oldest dropped (1 page) unmapped
    assert hostmem.release_results() == (2 + 3) << 12
    assert hostmem.kept_bytes() == 0 and hostmem.release_results() == 0


@needs_madvise
def test_kept_bytes_stay_within_their_share_of_physical_memory(small_results, monkeypatch):
    monkeypatch.setattr(hostmem, "_physical_bytes", lambda: 4 * (3 << 12))
    arrays = [hostmem.host_empty((4096 * n,), np.uint8) for n in (2, 2)]
    del arrays
    gc.collect()
    assert hostmem.kept_bytes() == 2 << 12  # both would take 4 pages: 3 allowed


def test_without_madvise_results_are_plain_numpy(monkeypatch):
    monkeypatch.setattr(hostmem, "HUGE_PAGE_BYTES", 1)
    monkeypatch.delattr(hostmem.mmap, "MADV_HUGEPAGE", raising=False)
    arr = hostmem.host_empty((5, 6), np.float32)
    assert arr.shape == (5, 6) and arr.dtype == np.float32 and arr.base is None


def _resident_pages(arr: np.ndarray) -> np.ndarray:
    """mincore(2) of the pages under `arr` (page-aligned, as a mapping's start is):
    one bool per page, True where the page is mapped in."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = -(-arr.nbytes // hostmem.mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(arr.nbytes), vec) == 0
    return np.frombuffer(vec, np.uint8) & 1 == 1


def _populate_supported() -> bool:
    """Whether this kernel takes MADV_POPULATE_WRITE (Linux 5.14 or later)."""
    region = hostmem.mmap.mmap(-1, hostmem.mmap.PAGESIZE)
    try:
        return region.madvise(hostmem._MADV_POPULATE_WRITE) is None
    except OSError:
        return False
    finally:
        region.close()


@pytest.mark.skipif(
    not (hasattr(hostmem.mmap, "MADV_HUGEPAGE") and _populate_supported()),
    reason="no madvise(MADV_POPULATE_WRITE) here",
)
def test_populated_ahead_maps_the_spans_pages_and_leaves_their_values(small_results):
    big = hostmem.host_empty((64, 4096), np.uint8)  # 64 pages of 4 KiB, one a row
    assert not _resident_pages(big).any()  # new memory: no page faulted in yet
    rng = np.random.default_rng(5)
    values = rng.integers(1, 256, big.shape, dtype=np.uint8)
    big[:3] = values[:3]  # written before the block
    with hostmem.populated_ahead(big, [(0, 16), (16, 40), (40, 50)]):
        big[20:22] = values[20:22]  # and while the threads fault pages in
    assert _resident_pages(big)[:50].all()
    assert not _resident_pages(big)[50:].any()  # rows past the spans left alone
    np.testing.assert_array_equal(big[:3], values[:3])
    np.testing.assert_array_equal(big[20:22], values[20:22])
    assert not big[3:20].any() and not big[22:50].any()  # faulted in, still zero


def test_populated_ahead_goes_through_the_spans_in_order(monkeypatch):
    calls = []
    monkeypatch.setattr(hostmem, "_populate_works", True)
    monkeypatch.setattr(hostmem, "POPULATE_THREADS", 1)  # one thread: the order of submission
    monkeypatch.setattr(hostmem, "_populate", lambda address, n: calls.append((address, n)))
    arr = np.zeros((30, 5, 3), np.uint16)  # rows of 30 bytes
    with hostmem.populated_ahead(arr, [(0, 7), (7, 20), (20, 30)]):
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:  # spans not started by
            time.sleep(0.001)  # the block's end are dropped
    base = arr.ctypes.data
    assert calls == [(base, 7 * 30), (base + 7 * 30, 13 * 30), (base + 20 * 30, 10 * 30)]
    calls.clear()
    with hostmem.populated_ahead(arr[:, ::2], [(0, 30)]):  # not contiguous: nothing done
        pass
    assert calls == []


def test_a_kernel_without_the_advice_turns_populating_off(monkeypatch):
    class _OldKernel:
        calls = 0

        def madvise(self, *args):
            _OldKernel.calls += 1
            ctypes.set_errno(errno.EINVAL)
            return -1

    monkeypatch.setattr(hostmem, "_populate_works", True)
    monkeypatch.setattr(hostmem, "_libc", _OldKernel())
    monkeypatch.setattr(hostmem, "POPULATE_THREADS", 1)
    arr = np.zeros((8, 4096), np.uint8)
    with hostmem.populated_ahead(arr, [(0, 4), (4, 8)]):
        arr[:] = 9
    assert hostmem._populate_works is False and _OldKernel.calls == 1  # the second span skipped
    with hostmem.populated_ahead(arr, [(0, 8)]):
        pass
    assert _OldKernel.calls == 1 and (arr == 9).all()


def test_spans_not_started_by_the_blocks_end_are_dropped(monkeypatch):
    started = []
    monkeypatch.setattr(hostmem, "_populate_works", True)
    monkeypatch.setattr(hostmem, "POPULATE_THREADS", 1)

    def slow(address, n):
        started.append(address)
        time.sleep(0.01)

    monkeypatch.setattr(hostmem, "_populate", slow)
    arr = np.zeros((1000, 64), np.uint8)
    with hostmem.populated_ahead(arr, [(y, y + 1) for y in range(1000)]):
        pass
    assert len(started) < 10  # the span under way finished, the others never started
    assert started == [arr.ctypes.data + 64 * y for y in range(len(started))]
