"""Keeping the GPU busy on purpose: the spin kernel behind kernel timings and the
asynchrony tests.

Kernel time is measured by queueing a spin kernel, recording a start event behind it,
queueing N launches and an end event: the launches then run back to back while
Python is still queueing them, and (end - start) / N is the time of one kernel,
free of launch overhead. The same spin kernel shows that a call returns while the
GPU is still busy (`busy`).
"""

from __future__ import annotations

import time

import numpy as np
from numba import cuda, float32

from .arrays import SIMULATOR, empty
from .launch import launch


@cuda.jit
def spin_kernel(n, out):
    """n dependent multiply-adds in one thread: about n * 4 cycles, no memory traffic."""
    v = float32(1.0)
    for _ in range(n):
        v = v * float32(1.0000001) + float32(1e-7)
    out[0] = v


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
