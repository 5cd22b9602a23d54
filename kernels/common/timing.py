"""Keeping the GPU busy on purpose: the spin kernel behind kernel timings and the
asynchrony tests.

Kernel time is measured by queueing a spin kernel, recording a start event behind it,
queueing N launches and an end event: the launches then run back to back while
Python is still queueing them, and (end - start) / N is the time of one kernel,
free of launch overhead (`spin_window`, `kernel_us`: the one spin-kernel timer of the
package and its benchmarks). The same spin kernel shows that a call returns while the
GPU is still busy (`busy`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from numba import cuda, float32, uint32

from .arrays import SIMULATOR, empty
from .launch import launch


@cuda.jit
def spin_kernel(n, out):
    """n dependent multiply-adds in one thread: about n * 4 cycles, no memory traffic."""
    v = float32(1.0)
    for _ in range(n):
        v = v * float32(1.0000001) + float32(1e-7)
    out[0] = v


@cuda.jit
def fma_kernel(n, out):
    """About n float32 FMAs per thread, no memory traffic but one store: the probe
    of the device's FMA rate (imgfilter.bench.fma_rate_tfmas)."""
    # Eight independent chains per thread keep every FMA pipe busy; eight rounds
    # per trip make the loop's own counter and branch 2% of the instructions
    # (with one round they were a third, and the probe read 17 TFMA/s on an H100).
    # float32 throughout: a Python int or float would promote to float64.
    t = float32(cuda.grid(1)) * float32(1e-9)
    one = float32(1.0)
    a0, a1, a2, a3 = t, t + one, t - one, t * one
    a4, a5, a6, a7 = t + t, t - t, t * t, one - t
    m = float32(0.999999)
    i = uint32(0)
    trips = uint32(n // 8)
    while i < trips:
        for _ in range(8):  # a constant trip count: unrolled by LLVM
            a0 = cuda.fma(a0, m, t)
            a1 = cuda.fma(a1, m, t)
            a2 = cuda.fma(a2, m, t)
            a3 = cuda.fma(a3, m, t)
            a4 = cuda.fma(a4, m, t)
            a5 = cuda.fma(a5, m, t)
            a6 = cuda.fma(a6, m, t)
            a7 = cuda.fma(a7, m, t)
        i = uint32(i + 1)
    out[cuda.grid(1)] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7


_rate: list = []  # spin iterations per second, measured once


def _iterations_per_second() -> float:
    if not _rate:
        buf = empty((1,), np.float32)
        launch(spin_kernel, 1, 1, (1000, buf))  # compile and load
        cuda.synchronize()
        n = 2_000_000
        t0 = time.perf_counter()
        launch(spin_kernel, 1, 1, (n, buf))
        cuda.synchronize()
        _rate.append(n / max(time.perf_counter() - t0, 1e-6))
    return _rate[0]


def busy(seconds: float, stream: int = 0):
    """Queue a spin kernel that keeps `stream` busy for about `seconds`; returns its
    output buffer (keep it until the stream is idle). On the simulator: a token spin."""
    buf = empty((1,), np.float32, stream)
    n = 1 if SIMULATOR else int(seconds * _iterations_per_second())
    launch(spin_kernel, 1, 1, (n, buf), stream)
    return buf


def _events_stream(stream: int):
    """The Numba stream that events record on for the CUstream handle `stream`."""
    return 0 if stream == 0 else cuda.external_stream(stream)


def spin_window(
    fn: Callable[[], object], calls: int, spin_seconds: float, stream: int = 0
) -> tuple[float, bool, float]:
    """One timing window on `stream` (a CUstream handle; 0: the legacy default
    stream): `busy(spin_seconds)`, a start event, `calls` calls of fn (each queues its
    work on that stream), an end event; waits for the end event.

    Returns (GPU microseconds per call: (end - start) / calls, whether the spin was
    still running when the last call was queued, host microseconds per call while
    queueing). When the spin was over first, the GPU may have idled between calls
    and the figure includes those gaps. On the simulator the figures mean nothing.
    """
    events_on = _events_stream(stream)
    start, end = cuda.event(), cuda.event()
    token = busy(spin_seconds, stream)
    start.record(events_on)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host_us = (time.perf_counter() - t0) / calls * 1e6
    covered = SIMULATOR or not start.query()
    end.record(events_on)
    end.synchronize()
    del token  # the spin's output buffer lives until the stream is past it
    return start.elapsed_time(end) * 1e3 / calls, covered, host_us


# The spin of `kernel_us` lasts SPIN_COVER times the estimated time to queue the
# launches, within these bounds (seconds).
SPIN_COVER = 4.0
SPIN_BOUNDS = (0.004, 0.4)


def kernel_us(fn: Callable[[], object], launches: int = 20, repeats: int = 3) -> float:
    """Median GPU microseconds per call of fn(), which queues work on the legacy
    default stream: `repeats` spin windows of `launches` calls, the spin lasting
    SPIN_COVER times a synchronised call's wall time per launch (so it covers the
    Python time needed to queue them). fn is called once untimed first (compiling,
    loading). Synchronises: for autotuning and benchmarks, not a per-call path."""
    fn()
    cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    cuda.synchronize()
    one = time.perf_counter() - t0
    low, high = SPIN_BOUNDS
    spin = min(high, max(low, SPIN_COVER * launches * max(one, 1e-4)))
    times = [spin_window(fn, launches, spin)[0] for _ in range(repeats)]
    return float(np.median(times))
