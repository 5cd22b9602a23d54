"""Test setup: run CUDA kernels on Numba's simulator unless a real GPU is present.

This must run before anything imports numba, which is why it sits in conftest.
`ON_GPU` is True when a real CUDA device is usable; tests marked `gpu` (full-size
images, real-hardware behaviour) are skipped without one. Set
IMGFILTER_TEST_SIMULATOR=1 to force the simulator even on a GPU machine. On the
simulator, tests/cuda_sim_shim.py adds warp shuffles and votes to it.
"""

from __future__ import annotations

import ctypes
import os
import zlib

import pytest


def real_gpu_present() -> bool:
    """Ask the CUDA driver directly (no numba import) whether a device exists."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0:
            return False
        return lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    return False


if os.environ.get("IMGFILTER_TEST_SIMULATOR") == "1" or not real_gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

ON_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM") != "1"


def simulator_cpu() -> int | None:
    """The CPU that this process's simulated CUDA threads run on: xdist worker gwN
    takes the N-th CPU it may use (modulo their count), a process outside xdist one
    by its pid; None where only one CPU is usable. Only those threads are pinned (the
    tests' own threads, and the CPU backend's thread counts, see every CPU)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker[:2] == "gw" and worker[2:].isdigit() else os.getpid()
    return cpus[index % len(cpus)]


if not ON_GPU:
    # The simulator lacks warp shuffles, votes and some device attributes; the shim
    # adds them so kernels that use them run unchanged, and runs a block's threads on
    # one CPU (see tests/cuda_sim_shim.py).
    from cuda_sim_shim import install as _install_sim_shim

    _install_sim_shim(pin_cpu=simulator_cpu())


def pytest_addoption(parser):
    parser.addoption(
        "--sample",
        type=int,
        default=1,
        metavar="N",
        help="run every N-th parameter set of each parametrized test, at least one each "
        "(a fixed choice per test), and leave out the tests marked covered_elsewhere "
        "(CI's lowest-versions stage runs --sample 6)",
    )


def pytest_collection_modifyitems(config, items):
    every = config.getoption("sample")
    if every > 1:
        _sample(config, items, every)
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (running on the simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _sample(config, items, every: int) -> None:
    """Keep every `every`-th parameter set of each test function, starting at an offset
    fixed by the function's id (the same in every xdist worker), and at least one; but
    none of a test marked `covered_elsewhere` (it re-checks, through another entry point
    or on more cases, kernel paths that tests kept here check)."""
    groups: dict[str, list] = {}
    for item in items:
        if "covered_elsewhere" in item.keywords:
            continue
        groups.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    kept = set()
    for name, group in groups.items():
        start = zlib.crc32(name.encode()) % every
        kept.update(id(item) for item in (group[start::every] or group[:1]))
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
    items[:] = [item for item in items if id(item) in kept]


def pytest_report_header(config):
    return "CUDA: real GPU" if ON_GPU else "CUDA: Numba simulator (NUMBA_ENABLE_CUDASIM=1)"
