"""Warp intrinsics for Numba's CUDA simulator, installed by conftest for the tests only.

The simulator runs each CUDA thread as a Python thread and has no warp shuffles,
`syncwarp` or votes, and its fake device lacks the attributes launch code reads.
`install()` adds them to the simulator's fake `cuda` module (`FakeCUDAModule` in
numba/cuda/simulator/kernelapi.py, injected into a kernel's globals while it runs)
so the very kernel source that runs on a GPU runs here.

A shuffle is an exchange through a per-warp slot table: each calling lane publishes
its value, waits at a barrier of the lanes named in the mask, reads its source
lane's slot, and waits at a second barrier before the slots can be reused. Lanes
are `thread_id % 32` of the linear thread id within the block, warps `thread_id //
32`, as on hardware. Source-lane rules follow PTX `shfl.sync` with Numba's clamp
values (idx and down/xor clamp at 31; up at 0): an out-of-range source gives the
caller's own value. Reading a lane outside the mask is undefined on hardware, so it
raises here. A barrier that waits more than TIMEOUT_S seconds (a lane named in the
mask never arrived) raises instead of hanging the test run.

Speed: a launch on the simulator cost mostly the simulator's own machinery, not the
kernel's arithmetic, so `install()` replaces four pieces of it with equivalents:
- an OS thread started per CUDA thread of each block -> parked threads reused from
  block to block (`_run_block`), each given the attributes a BlockThread gets;
- a block manager polling its threads for `syncthreads` while holding the GIL -> a
  counted barrier (`_Block`): released once every thread of the block has arrived
  or exited (the simulator's rule), the first exception raised as the simulator does;
- `cuda.shared.array` reading the whole stack's source lines to key an allocation
  -> the caller's frame gives the same key (file, line);
- per device-function call, an import and a generator context to swap the fake
  `cuda` module into the callee's globals -> a plain refcounted context manager;
  and numba's `Type.__call__` (`int32(x)` in kernels) with its import hoisted.
Kernel semantics are unchanged; `tests/test_box_tiled.py` and the band tests of
`test_tall_images.py` ran in about a third of the CPU time.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

# The one CPU that the simulated threads of this process run on (None: any), set by
# install(). The GIL lets one of them run at a time wherever they are; spread over the
# CPUs, each handoff of it crossed CPUs: the split softmax's kernels took 2.8 times the
# CPU time (and wall time) that they take on one CPU.
PIN_CPU: int | None = None
WARP = 32
TIMEOUT_S = 60.0
FULL = 0xFFFFFFFF
_simulator_shared_array = None  # the simulator's FakeCUDAShared.array, kept by install()
_sim_types = _sim_numpy_support = None  # the simulator's own type modules, kept by install()
_real_cuda = _signature = _Type = None  # kept by install()


class _Warp:
    """Slots and barriers for one warp of one block."""

    def __init__(self, n_threads: int):
        self.n_threads = n_threads  # lanes that exist (a block's last warp may be partial)
        self.slots = [None] * WARP
        self.barriers: dict[int, threading.Barrier] = {}
        self.lock = threading.Lock()

    def barrier(self, mask: int) -> threading.Barrier:
        with self.lock:
            bar = self.barriers.get(mask)
            if bar is None:
                members = bin(mask & ((1 << self.n_threads) - 1)).count("1")
                bar = threading.Barrier(members, timeout=TIMEOUT_S)
                self.barriers[mask] = bar
            return bar


_registry_lock = threading.Lock()


def _warp_of(thread) -> tuple[_Warp, int]:
    """The calling simulator thread's warp state and lane."""
    manager = thread._manager
    with _registry_lock:
        warps = getattr(manager, "_shim_warps", None)
        if warps is None:
            warps = manager._shim_warps = {}
        bx, by, bz = manager._block_dim
        n_block = bx * by * bz
        w = thread.thread_id // WARP
        state = warps.get(w)
        if state is None:
            state = warps[w] = _Warp(min(WARP, n_block - w * WARP))
    return state, thread.thread_id % WARP


def _exchange(mask: int, value, source):
    """Publish `value`; return the value of lane `source(lane)` (None: own value)."""
    mask = int(mask) & FULL
    warp, lane = _warp_of(threading.current_thread())
    if not (mask >> lane) & 1:
        raise RuntimeError(f"lane {lane} calls a warp intrinsic with mask {mask:#x} excluding it")
    bar = warp.barrier(mask)
    warp.slots[lane] = value
    bar.wait()
    src = source(lane)
    if src is None:
        result = value
    else:
        if not (mask >> src) & 1 or src >= warp.n_threads:
            raise RuntimeError(f"lane {lane} reads lane {src}, outside mask {mask:#x}")
        result = warp.slots[src]
    bar.wait()
    return result


def shfl_sync(self, mask, value, src_lane):
    return _exchange(mask, value, lambda lane: int(src_lane) & (WARP - 1))


def shfl_up_sync(self, mask, value, delta):
    return _exchange(mask, value, lambda lane: lane - delta if lane - delta >= 0 else None)


def shfl_down_sync(self, mask, value, delta):
    return _exchange(mask, value, lambda lane: lane + delta if lane + delta < WARP else None)


def shfl_xor_sync(self, mask, value, lane_mask):
    return _exchange(
        mask, value, lambda lane: lane ^ lane_mask if lane ^ lane_mask < WARP else None
    )


def syncwarp(self, mask=FULL):
    _exchange(mask, 0, lambda lane: None)


def _vote(mask, predicate):
    """(ballot bits of the masked lanes' predicates) after a warp exchange."""
    mask = int(mask) & FULL
    warp, lane = _warp_of(threading.current_thread())
    bar = warp.barrier(mask)
    warp.slots[lane] = bool(predicate)
    bar.wait()
    bits = 0
    for i in range(WARP):
        if (mask >> i) & 1 and i < warp.n_threads and warp.slots[i]:
            bits |= 1 << i
    bar.wait()
    return bits


def ballot_sync(self, mask, predicate):
    return _vote(mask, predicate)


def any_sync(self, mask, predicate):
    return _vote(mask, predicate) != 0


def all_sync(self, mask, predicate):
    mask = int(mask) & FULL
    warp, _ = _warp_of(threading.current_thread())
    live = mask & ((1 << warp.n_threads) - 1)
    return _vote(mask, predicate) == live


# The fake device's attributes read by kernels.common.launch (a small, H100-like shape).
FAKE_DEVICE_ATTRIBUTES = {"MULTIPROCESSOR_COUNT": 2, "MAX_THREADS_PER_MULTIPROCESSOR": 2048}


def install(pin_cpu: int | None = None) -> None:
    """Add the warp intrinsics and device attributes to the simulator (idempotent);
    the simulated threads started from now on run on CPU `pin_cpu` (None: any)."""
    import functools

    global PIN_CPU
    PIN_CPU = pin_cpu

    from numba import cuda as simulator_cuda
    from numba.cuda.simulator import kernel as simulator_kernel
    from numba.cuda.simulator import kernelapi
    from numba.cuda.simulator.cudadrv import devices

    fake = kernelapi.FakeCUDAModule
    for fn in (
        shfl_sync,
        shfl_up_sync,
        shfl_down_sync,
        shfl_xor_sync,
        syncwarp,
        ballot_sync,
        any_sync,
        all_sync,
    ):
        setattr(fake, fn.__name__, fn)
        # Older simulators (numba-cuda 0.21) swap in the fake module only in the kernel's
        # own globals; device functions of other modules see the simulator's `cuda`.
        if not hasattr(simulator_cuda, fn.__name__):
            setattr(simulator_cuda, fn.__name__, functools.partial(fn, None))
    # Old simulators: a kernel's body compiled as a device function (a batch in one
    # launch, kernels.common.batching.batched_kernel) sees the simulator's `cuda`, which lacks
    # the fake module's fma.
    if not hasattr(simulator_cuda, "fma"):
        simulator_cuda.fma = functools.partial(fake.fma, None)
    for name, value in FAKE_DEVICE_ATTRIBUTES.items():
        if not hasattr(devices.FakeCUDADevice, name):
            setattr(devices.FakeCUDADevice, name, value)
    global _simulator_shared_array, _sim_types, _sim_numpy_support
    _sim_types, _sim_numpy_support = kernelapi.types, kernelapi.numpy_support
    if kernelapi.FakeCUDAShared.array is not _shared_array:
        _simulator_shared_array = kernelapi.FakeCUDAShared.array
    kernelapi.FakeCUDAShared.array = _shared_array
    simulator_kernel.BlockManager.run = _run_block
    simulator_kernel.BlockThread.syncthreads = _syncthreads
    simulator_kernel.swapped_cuda_module = _SwappedCuda
    global _real_cuda, _signature, _Type
    _real_cuda = simulator_cuda
    from numba.core.types import abstract
    from numba.core.typing import signature as _signature

    _Type = abstract.Type
    abstract.Type.__call__ = _type_call


class _Block:
    """One block's run: its barrier releases the waiting threads once every thread has
    arrived or exited (the simulator's rule: all live threads blocked), counted under a
    lock instead of polled; `done` wakes the launching thread when all have exited or
    one has raised."""

    def __init__(self, size: int):
        self.size = size
        lock = threading.Lock()
        self.barrier = threading.Condition(lock)
        self.done = threading.Condition(lock)
        self.arrived = self.exited = self.generation = 0
        self.failed = None  # (exception, traceback) of the first thread that raised
        self.aborted = False

    def release_if_complete(self) -> None:  # holding the lock
        if self.arrived and self.arrived + self.exited == self.size:
            self.arrived = 0
            self.generation += 1
            self.barrier.notify_all()

    def exit(self, exception) -> None:
        with self.done:
            self.exited += 1
            if exception is not None and self.failed is None:
                self.failed = exception
            self.release_if_complete()
            if self.exited == self.size or self.failed is not None:
                self.done.notify()


_idle: list = []  # parked simulator threads, reused from block to block
_idle_lock = threading.Lock()
_worker_class = None


def _workers(count: int) -> list:
    """`count` parked threads: idle ones first, new ones for the rest."""
    global _worker_class
    if _worker_class is None:
        _worker_class = _make_worker_class()
    with _idle_lock:
        taken = _idle[len(_idle) - min(count, len(_idle)) :]
        del _idle[len(_idle) - len(taken) :]
    return taken + [_worker_class() for _ in range(count - len(taken))]


def _make_worker_class():
    from numba.cuda.simulator.kernel import BlockThread
    from numba.cuda.simulator.kernelapi import Dim3

    class Worker(BlockThread):
        """A BlockThread that runs one CUDA thread of a block, then parks to run one of
        a later block: the simulator started an OS thread per CUDA thread, the most of
        a launch's time on small images. Its attributes are the ones BlockThread sets."""

        def __init__(self):
            threading.Thread.__init__(self, daemon=True)
            self._go = threading.Semaphore(0)
            self.start()

        def assign(self, target, manager, block_idx, thread_idx, block: _Block) -> None:
            self._target, self._args, self._kwargs = target, (), {}
            self._manager, self._block, self.debug = manager, block, manager._debug
            self.blockIdx, self.threadIdx = Dim3(*block_idx), Dim3(*thread_idx)
            bx, by, _ = manager._block_dim
            self.thread_id = thread_idx[0] + bx * (thread_idx[1] + by * thread_idx[2])
            self.exception, self.abort, self.syncthreads_blocked = None, False, False
            self._go.release()

        def run(self) -> None:
            if PIN_CPU is not None:
                try:
                    os.sched_setaffinity(0, {PIN_CPU})  # this thread only (Linux)
                except OSError:
                    pass  # runs unpinned: slower, the same results
            while True:
                self._go.acquire()
                block = self._block
                BlockThread.run(self)  # the target; an exception is kept in .exception
                exception = self.exception
                with _idle_lock:
                    _idle.append(self)
                block.exit(exception)  # last: this thread may be reassigned from here

    return Worker


# GIL time slice while blocks run: a simulated thread then runs until it waits (at a
# barrier, a shuffle, its exit) instead of being preempted every 5 ms for one of
# hundreds of others that will only run to the same barrier. The CPU time of a box
# launch on a small image: 4.9 s -> 2.7 s wall, a sixth of its system time.
BLOCK_SWITCH_INTERVAL_S = 0.1
_slices = [0, 0.0]  # blocks running (any thread), the interval before the first
_slices_lock = threading.Lock()


def _long_slices(step: int) -> None:
    """Count a block in (+1) or out (-1): the first in sets BLOCK_SWITCH_INTERVAL_S,
    the last out restores the interval it found."""
    with _slices_lock:
        if step > 0 and _slices[0] == 0:
            _slices[1] = sys.getswitchinterval()
            sys.setswitchinterval(BLOCK_SWITCH_INTERVAL_S)
        _slices[0] += step
        if _slices[0] == 0:
            sys.setswitchinterval(_slices[1])


def _run_block(self, grid_point, *args) -> None:
    """BlockManager.run: run the block's threads on parked threads and wait, without
    polling, until all have exited. The first exception of a thread is raised, as the
    simulator does, after the others are aborted and released from the barrier."""
    if self._debug:

        def target():
            saved = np.seterr(divide="raise")
            try:
                self._f(*args)
            finally:
                np.seterr(**saved)
    else:

        def target():
            self._f(*args)

    points = list(np.ndindex(*self._block_dim))
    block = _Block(len(points))
    _long_slices(+1)
    try:
        for worker, point in zip(_workers(len(points)), points, strict=True):
            worker.assign(target, self, grid_point, point, block)
        with block.done:
            while block.exited < block.size and block.failed is None:
                block.done.wait()
            failed = block.failed
            if failed is not None:
                block.aborted = True
                block.generation += 1
                block.barrier.notify_all()
    finally:
        _long_slices(-1)
    if failed is not None:
        raise failed[0].with_traceback(failed[1])


def _syncthreads(self) -> None:
    """BlockThread.syncthreads on the block's counted barrier (same abort checks)."""
    block = self._block
    if self.abort or block.aborted:
        raise RuntimeError("abort flag set on syncthreads call")
    with block.barrier:
        generation = block.generation
        block.arrived += 1
        block.release_if_complete()
        while block.generation == generation:
            block.barrier.wait()
    if self.abort or block.aborted:
        raise RuntimeError("abort flag set on syncthreads clear")


def _shared_array(self, shape, dtype, alignment=None):
    """FakeCUDAShared.array, keyed as the simulator keys it (the caller's file and line)
    but read from the caller's frame: the simulator's `traceback.extract_stack` read
    every frame's source line, a stat per file, on each call of each thread."""
    if alignment is not None or shape == 0:  # an error, or dynamic shared memory
        return _simulator_shared_array(self, shape, dtype, alignment)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    res = self._allocations.get(caller)
    if res is None:  # the block's threads may race here: the first array stays
        if isinstance(dtype, _sim_types.Type):
            dtype = _sim_numpy_support.as_dtype(dtype)
        res = self._allocations.setdefault(caller, np.empty(shape, dtype))
    return res


def _type_call(self, *args):
    """numba's Type.__call__ (`int32(x)` casts, `int32(int32)` makes a signature) with
    its import hoisted out: kernels on the simulator make such casts by the million."""
    if len(args) == 1 and (type(args[0]) in _SCALARS or not isinstance(args[0], _Type)):
        return self.cast_python_value(args[0])
    return _signature(self, *args)


_SCALARS = {int, float, bool, *(np.dtype(c).type for c in "?bBhHiIlLqQefd")}
_swap_lock = threading.Lock()
_swaps: dict = {}  # id(module globals) -> [users, the names' real values]


class _SwappedCuda:
    """The simulator's swapped_cuda_module (a function's module sees the fake `cuda`
    while any simulated thread runs in it; the last to leave puts the real one back),
    as a plain context manager: the simulator's generator version, entered on every
    device-function call, imported and took a per-module lock each time."""

    __slots__ = ("globs", "fake")

    def __init__(self, fn, fake_cuda_module):
        self.globs = fn.__globals__
        self.fake = fake_cuda_module

    def __enter__(self) -> None:
        globs = self.globs
        with _swap_lock:
            entry = _swaps.get(id(globs))
            if entry is None:
                real = {k: v for k, v in globs.items() if v is _real_cuda}
                for k in real:
                    globs[k] = self.fake
                _swaps[id(globs)] = [1, real]
            else:
                entry[0] += 1

    def __exit__(self, *exc) -> None:
        globs = self.globs
        with _swap_lock:
            entry = _swaps[id(globs)]
            entry[0] -= 1
            if entry[0] == 0:
                globs.update(entry[1])
                del _swaps[id(globs)]
