"""The device pool's limit (`kernels.common.devarray.Pool.limit`): calls of ever
changing sizes keep the memory the pool holds within the limit plus what arrays in
use hold, and calls that repeat their sizes never trim. A fake driver stands in for
CUDA (as in tests/test_pool.py), so this runs on CI as on a GPU machine; the
`gpu` test checks the same on a real device through `imgfilter.blur`."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import ON_GPU

from kernels.common import devarray
from kernels.common.devarray import Pool, set_pool_limit


class Device:
    """Allocations are counters; `capture` marks streams being captured."""

    def __init__(self) -> None:
        self.next, self.held, self.syncs = 1 << 20, 0, 0
        self.sizes: dict[int, int] = {}
        self.capture: set = set()

    def alloc(self, nbytes):
        ptr, self.next = self.next, self.next + nbytes + 4096
        self.sizes[ptr] = nbytes
        self.held += nbytes
        return ptr

    def free(self, ptr):
        self.held -= self.sizes.pop(ptr)

    def current(self):
        pass

    def call(self, name, *args):
        self.syncs += name == "cuCtxSynchronize"

    def capturing(self, stream):
        return stream in self.capture


@pytest.fixture
def device(monkeypatch):
    dev = Device()
    monkeypatch.setattr(devarray, "driver", lambda: dev)
    pool = Pool()
    monkeypatch.setattr(devarray, "POOL", pool)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    return dev, pool


def test_changing_sizes_stay_within_the_limit(device):
    dev, pool = device
    set_pool_limit(8 << 20)
    rng = np.random.default_rng(5)
    most = 0
    for _ in range(400):  # an image in, a result out, each of a new size (512-byte steps)
        n = int(rng.integers(100_000, 1_000_000))
        a = devarray.empty((n,), np.uint8, stream=7)
        b = devarray.empty((n,), np.uint8, stream=7)
        most = max(most, dev.held)
        del a, b
    assert most <= (8 << 20) + 2 * (1 << 20)
    assert dev.syncs > 0 and pool.allocated_bytes == dev.held


def test_repeated_sizes_never_trim(device):
    dev, pool = device
    set_pool_limit(1 << 20)  # below one call's needs: still no trim once cached
    for _ in range(50):
        a = devarray.empty((3 << 20,), np.uint8, stream=7)
        del a
    assert dev.syncs == 0 and dev.held == 4 << 20


def test_no_trim_while_the_stream_is_captured(device):
    dev, pool = device
    set_pool_limit(0)
    a = devarray.empty((1 << 20,), np.uint8, stream=9)
    del a
    dev.capture.add(7)
    devarray.empty((2 << 20,), np.uint8, stream=7)  # over the limit, but capturing
    assert dev.syncs == 0
    devarray.empty((2 << 20,), np.uint8, stream=5)
    assert dev.syncs == 1


@pytest.mark.parametrize("bad", [-1, 1.5, "1G", True, None])
def test_the_limit_is_a_number_of_bytes(bad):
    with pytest.raises(ValueError, match="number of bytes"):
        set_pool_limit(bad)


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("IMGFILTER_GPU_POOL_BYTES", str(5 << 20))
    assert Pool().limit == 5 << 20
    monkeypatch.delenv("IMGFILTER_GPU_POOL_BYTES")
    assert Pool().limit == devarray.DEFAULT_POOL_LIMIT


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a real GPU")
def test_blur_of_changing_sizes_keeps_the_pool_bounded():
    """4000 device calls on images of changing sizes (up to 6.75 MB each) hold at most
    the limit plus one call's arrays."""
    import cupy

    import imgfilter

    limit = 256 << 20
    set_pool_limit(limit)
    rng = np.random.default_rng(9)
    try:
        for i in range(4000):
            h, w = int(rng.integers(200, 1500)), int(rng.integers(200, 1500))
            img = cupy.asarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            out = imgfilter.blur(img, 5)
            assert devarray.POOL.allocated_bytes <= limit + 2 * out.nbytes + (8 << 20), i
            del out
    finally:
        set_pool_limit(devarray.DEFAULT_POOL_LIMIT)


def test_the_api_sets_the_limit_and_names_bad_values():
    import imgfilter

    before = devarray.POOL.limit
    try:
        imgfilter.set_gpu_pool_limit(123 << 20)
        assert devarray.POOL.limit == 123 << 20
        with pytest.raises(imgfilter.UsageError, match="number of bytes"):
            imgfilter.set_gpu_pool_limit(-5)
    finally:
        devarray.POOL.limit = before
