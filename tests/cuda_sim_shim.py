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

The simulator's block manager polls its threads in a loop that holds the GIL, so a
thread released from a barrier waited for the interpreter's switch interval before it
ran, and how long depended on what ran earlier in the process (a test took 11 s alone
and 70 s after others). `install()` makes each poll yield the GIL (`time.sleep(0)`):
the same threads and barriers, scheduled without that wait.
"""

from __future__ import annotations

import threading
import time

WARP = 32
TIMEOUT_S = 60.0
FULL = 0xFFFFFFFF


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


def install() -> None:
    """Add the warp intrinsics and device attributes to the simulator (idempotent)."""
    import functools

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
    # launch, kernels.common.launch.batched_kernel) sees the simulator's `cuda`, which lacks
    # the fake module's fma.
    if not hasattr(simulator_cuda, "fma"):
        simulator_cuda.fma = functools.partial(fake.fma, None)
    for name, value in FAKE_DEVICE_ATTRIBUTES.items():
        if not hasattr(devices.FakeCUDADevice, name):
            setattr(devices.FakeCUDADevice, name, value)
    simulator_kernel.BlockThread.is_alive = _is_alive_yielding


def _is_alive_yielding(self) -> bool:
    """threading.Thread.is_alive, after giving the GIL to any thread waiting for it (the
    block manager's poll; see the module docstring)."""
    time.sleep(0)
    return threading.Thread.is_alive(self)
