"""Large host results (`imgfilter.hostmem`): their own huge-page mappings, and the
mapping of a dropped result reused by the next result of the same size."""

from __future__ import annotations

import gc
import mmap

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
    owner = _owner(big)  # a view of its own mapping
    assert isinstance(getattr(owner, "obj", owner), mmap.mmap)
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
