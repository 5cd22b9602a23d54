"""The host side of the launch and memory layer, without a GPU: the stream-keyed pool,
DeviceArray views and their interface, stream handles, and recorded launches replayed
on other arrays. A fake driver stands in for CUDA (allocations are counters, launches
are recorded), so these run on CI exactly as on a GPU machine."""

from __future__ import annotations

import ctypes
import struct
import sys
import threading

import numpy as np
import pytest

from kernels.common import cudadrv, devarray, launch
from kernels.common.cudadrv import GpuOutOfMemory
from kernels.common.devarray import LEGACY, PER_THREAD, DeviceArray, Pool


class FakeDriver:
    def __init__(self, fail_allocs: int = 0):
        self.next = 1 << 20
        self.fail_allocs = fail_allocs
        self.freed: list = []
        self.launches: list = []
        self.synced = 0

    def alloc(self, nbytes):
        if self.fail_allocs:
            self.fail_allocs -= 1
            raise GpuOutOfMemory("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY", 2)
        ptr, self.next = self.next, self.next + nbytes + 4096
        return ptr

    def free(self, ptr):
        self.freed.append(ptr)

    def current(self):
        pass

    def call(self, name, *args):
        self.synced += name == "cuCtxSynchronize"

    def free_and_total(self):
        return 123 << 20, 80 << 30

    def launch(self, fn, grid, block, smem, stream, packer, values):
        self.launches.append((fn, grid, block, smem, stream, list(values)))

    def prepare(self, fn, grid, block, smem, packer, values, patches):
        """A prepared launch that records the values it would pack."""
        launches = self.launches

        class Prepared:
            def launch(self, stream, bases):
                got = list(values)
                for index, slot, at in patches:
                    got[index] = bases[slot] + at
                launches.append((fn, grid, block, smem, stream, got))

        return Prepared()


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(devarray, "driver", lambda: drv)
    monkeypatch.setattr(launch, "driver", lambda: drv)
    pool = Pool()
    monkeypatch.setattr(devarray, "POOL", pool)
    monkeypatch.setattr(launch, "POOL", pool)
    # A CuPy or torch imported by other tests would be asked to free blocks, which
    # the fake device does not see (release_other_pools).
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    return drv, pool


def test_a_dropped_block_is_reused_on_its_stream_only(fake):
    drv, pool = fake
    a = devarray.empty((100, 3), np.uint8, stream=7)
    first = a.ptr
    del a
    b = devarray.empty((100, 3), np.uint8, stream=9)  # another stream: a new block
    assert b.ptr != first
    c = devarray.empty((99, 3), np.uint8, stream=7)  # same rounded size, same stream
    assert c.ptr == first and c.stream == 7
    assert devarray.empty((5,), np.float32, stream=1).stream == 1  # legacy, as given


def test_legacy_handles_share_a_free_list(fake):
    _, pool = fake
    a = devarray.empty((64,), np.uint8, stream=1)
    ptr = a.ptr
    del a
    assert devarray.empty((64,), np.uint8, stream=LEGACY).ptr == ptr


def test_per_thread_default_stream_is_not_shared_between_threads(fake):
    _, pool = fake
    a = devarray.empty((64,), np.uint8, stream=PER_THREAD)
    ptr = a.ptr
    del a
    got = []
    t = threading.Thread(target=lambda: got.append(devarray.empty((64,), np.uint8, PER_THREAD)))
    t.start()
    t.join()
    assert got[0].ptr != ptr
    assert devarray.empty((64,), np.uint8, stream=PER_THREAD).ptr == ptr


def test_out_of_memory_trims_the_cache_then_says_what_was_needed(fake, monkeypatch):
    drv, pool = fake
    kept = devarray.empty((1 << 20,), np.uint8, 3)
    cached = kept.ptr
    del kept
    drv.fail_allocs = 1  # the first cuMemAlloc fails, the retry after the trim works
    devarray.empty((3 << 20,), np.uint8, 3)
    assert drv.freed == [cached] and drv.synced == 1
    drv.fail_allocs = 2
    with pytest.raises(GpuOutOfMemory, match=r"4.0 MiB needed, 123.0 MiB free") as info:
        devarray.empty((4 << 20,), np.uint8, 5)
    assert isinstance(info.value, MemoryError)


class _CachingLibrary:
    """Stands in for an imported CuPy or torch: a caching allocator whose unused
    blocks, the first time it is asked to free them, make room on the fake device."""

    def __init__(self, drv: FakeDriver):
        self.asked = 0
        lib = self

        def release():
            lib.asked += 1
            if lib.asked == 1:
                drv.fail_allocs = 0

        class Pool:
            def free_all_blocks(self):
                release()

        class Cuda:
            @staticmethod
            def is_initialized():
                return True

            @staticmethod
            def empty_cache():
                release()

        self.get_default_memory_pool = Pool
        self.cuda = Cuda


@pytest.mark.parametrize("name", ["cupy", "torch"])
def test_out_of_memory_asks_other_pools_of_the_process_to_give_back(fake, monkeypatch, name):
    """After its own trim fails, the pool asks an imported CuPy or torch to release
    their cached blocks and tries once more; without them, the error as before."""
    drv, _ = fake
    drv.fail_allocs = 2  # the first try and the one after the trim fail
    with pytest.raises(GpuOutOfMemory, match="MiB needed"):
        devarray.empty((4 << 20,), np.uint8, 5)
    lib = _CachingLibrary(drv)
    monkeypatch.setitem(sys.modules, name, lib)
    drv.fail_allocs = 2
    block = devarray.empty((4 << 20,), np.uint8, 5)  # the third try, after the release
    assert block.nbytes == 4 << 20 and lib.asked == 1
    drv.fail_allocs = 3  # nothing more to release: the one-line error
    with pytest.raises(GpuOutOfMemory, match="MiB needed"):
        devarray.empty((8 << 20,), np.uint8, 5)
    assert lib.asked == 2


def test_views_and_their_interface():
    a = DeviceArray(4096, (4, 6, 3), np.uint8, stream=5)
    assert a.is_c_contiguous and a.size == 72 and a.nbytes == 72 and a.strides == (18, 3, 1)
    flat = a.reshape(-1)
    assert flat.shape == (72,) and flat.ptr == 4096
    words = flat[:72].view(np.uint32)
    assert words.shape == (18,) and words.dtype == np.uint32
    row = a[2]
    assert row.shape == (6, 3) and row.ptr == 4096 + 36 and row.stream == 5
    assert a[-1].ptr == 4096 + 54
    tail = a[1:3]
    assert tail.shape == (2, 6, 3) and tail.ptr == 4096 + 18
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (4, 6, 3) and cai["typestr"] == "|u1" and cai["data"] == (4096, False)
    assert cai["strides"] is None and cai["version"] == 3 and cai["stream"] == 5
    assert DeviceArray(1, (2,), np.uint8).__cuda_array_interface__["stream"] == 1  # legacy
    strided = DeviceArray(4096, (4, 3), np.uint8, strides=(6, 1))
    assert not strided.is_c_contiguous and strided.__cuda_array_interface__["strides"] == (6, 1)
    with pytest.raises(ValueError, match="C-contiguous"):
        strided.reshape(12)
    with pytest.raises(IndexError):
        a[4]
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(5, 5)


def test_foreign_arrays_are_viewed_through_their_interface():
    class Foreign:
        __cuda_array_interface__ = {
            "shape": (3, 4), "typestr": "<f4", "data": (8192, False), "strides": None,
            "version": 3, "stream": 42,
        }  # fmt: skip

    view = devarray.as_device_array(Foreign())
    assert (view.ptr, view.shape, view.dtype, view.stream) == (8192, (3, 4), np.float32, 42)
    assert devarray.resolve_stream(None, view) == 42
    assert devarray.resolve_stream(7, view) == 7


def test_stream_handles_of_every_library():
    class CuPy:
        ptr = 11

    class Torch:
        cuda_stream = 12

    class Numba:
        handle = ctypes.c_void_p(13)

    class Protocol:
        def __cuda_stream__(self):
            return (0, 14)

    got = [
        devarray.stream_handle(s) for s in (None, 1, 2, 10, CuPy(), Torch(), Numba(), Protocol())
    ]
    assert got == [LEGACY, LEGACY, PER_THREAD, 10, 11, 12, 13, 14]
    with pytest.raises(TypeError, match="stream must be"):
        devarray.stream_handle("fast")


def test_a_recording_replays_on_other_arrays(fake):
    drv, pool = fake
    img = DeviceArray(1 << 30, (8, 8, 3), np.uint8)
    out = devarray.empty((8, 8, 3), np.uint8, 0)
    weights = DeviceArray(5 << 30, (3, 3), np.float32)  # a constant: passed as it is
    compiled = launch._Compiled(77, struct.Struct("@qqqqqqqqqqqqqqqqqqqqqqqqqqqq"))
    with launch.Recording((img, out)) as rec:
        scratch = devarray.empty((8, 24), np.uint16, 0)
        for args in [(img.reshape(-1), scratch, 5), (scratch, weights, out[2:], 9)]:
            values = launch._flatten(args, [])
            drv.launch(77, (1, 1, 1), (32, 1, 1), 0, 0, compiled.packer, values)
            rec.launched(compiled, (1, 1, 1), (32, 1, 1), 0, args, values)
    recipe = rec.recipe()
    assert recipe is not None and recipe.scratch == (512,) and recipe.constants == (weights,)
    drv.launches.clear()
    recipe.replay([2 << 30, 3 << 30], stream=4)
    (_, _, _, _, s1, first), (_, _, _, _, s2, second) = drv.launches
    assert s1 == s2 == 4
    assert first[4] == 2 << 30  # the new image
    new_scratch = first[5 + 2 + 4]
    assert second[4] == new_scratch  # the same fresh scratch in both launches
    assert second[9 + 4] == 5 << 30  # the constant weights
    assert second[9 + 9 + 4] == (3 << 30) + 2 * 24  # out[2:] of the new output
    assert first[-1] == 5 and second[-1] == 9


def test_an_upload_while_recording_is_not_replayable(fake, monkeypatch):
    drv, pool = fake
    monkeypatch.setattr(drv, "upload", lambda *a: None, raising=False)
    img = DeviceArray(1 << 30, (4,), np.uint8)
    with launch.Recording((img,)) as rec:
        devarray.to_device(np.arange(4, dtype=np.uint8))
        rec.launched(launch._Compiled(1, struct.Struct("@q")), (1, 1, 1), (1, 1, 1), 0, (3,), [3])
    assert rec.recipe() is None


def test_no_driver_is_one_clear_error(monkeypatch):
    """Without libcuda: one CudaError that says what is missing and what needs it, not
    chained to the pool's empty free list."""
    from kernels.common.cudadrv import CudaError, Driver

    class NoLibcuda:
        def cuInit(self, flags):
            raise RuntimeError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(cudadrv, "_bindings", NoLibcuda)
    with pytest.raises(CudaError, match="no NVIDIA driver found") as info:
        Driver()
    assert "kernels.softmax" in str(info.value)

    def no_driver():
        raise CudaError("no NVIDIA driver found (libcuda)")

    monkeypatch.setattr(devarray, "driver", no_driver)
    with pytest.raises(CudaError) as info:
        Pool().allocate(64, 0)
    assert info.value.__context__ is None
