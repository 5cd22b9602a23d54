"""Host cost of one kernel launch through the ways open to Python (GPU needed).

An empty kernel compiled by Numba, launched N times on a non-default stream by:
`kernels.launch.launch` (the whole layer), `kernels.cudadrv.Driver.launch` (ctypes
cuLaunchKernelEx, a config per thread and geometry, parameters packed in one buffer),
ctypes cuLaunchKernel (eleven arguments), ctypes cuLaunchKernelEx with a fully
prepared config, cuda.bindings' cuLaunchKernel, and Numba's own dispatch. Prints
microseconds per launch.

    python benchmarks/launch_overhead.py [--launches 20000]
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np
from numba import cuda


@cuda.jit
def _empty(out, n):
    if cuda.grid(1) == n:
        out[0] = 1


def _per_launch(fn, launches: int) -> float:
    fn()
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        fn()
    elapsed = time.perf_counter() - t0
    cuda.synchronize()
    return elapsed / launches * 1e6


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint),
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=20000)
    n = ap.parse_args().launches

    from kernels.arrays import empty
    from kernels.cudadrv import CudaError, driver
    from kernels.launch import _compiled, launch

    try:
        drv = driver()
    except CudaError as exc:
        raise SystemExit(f"launch_overhead needs an NVIDIA GPU: {exc}") from None
    stream = cuda.stream()
    handle = int(stream.handle.value if hasattr(stream.handle, "value") else stream.handle)
    out = empty((1,), np.int32, handle)
    args = (out, 1 << 30)
    launch(_empty, 1, 32, args, handle)
    compiled = next(c for (k, _), c in _compiled.items() if k is _empty)
    values = list(out.params()) + [1 << 30]
    packer = compiled.packer
    results = {}
    results["kernels.launch.launch (whole layer)"] = _per_launch(
        lambda: launch(_empty, 1, 32, args, handle), n
    )
    results["Driver.launch (ctypes cuLaunchKernelEx)"] = _per_launch(
        lambda: drv.launch(compiled.handle, (1, 1, 1), (32, 1, 1), 0, handle, packer, values), n
    )

    lib = drv._lib
    u, vp = ctypes.c_uint, ctypes.c_void_p
    lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p] * 4
    config = _LaunchConfig(1, 1, 1, 32, 1, 1, 0, handle, None, 0)
    buf = ctypes.create_string_buffer(4096)
    size = ctypes.c_size_t(packer.size)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
    config_ptr, extra_ptr = ctypes.addressof(config), ctypes.addressof(extra)
    fn = compiled.handle

    def ex():
        packer.pack_into(buf, 0, *values)
        lib.cuLaunchKernelEx(config_ptr, fn, None, extra_ptr)

    results["ctypes cuLaunchKernelEx, prepared config"] = _per_launch(ex, n)

    def plain():
        packer.pack_into(buf, 0, *values)
        lib.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, handle, None, extra)

    results["ctypes cuLaunchKernel (eleven arguments)"] = _per_launch(plain, n)
    try:
        from cuda.bindings import driver as cb

        def bindings():
            packer.pack_into(buf, 0, *values)
            cb.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, handle, 0, extra_ptr)

        results["cuda.bindings cuLaunchKernel"] = _per_launch(bindings, n)
    except Exception as exc:  # noqa: BLE001 - reported
        print(f"cuda.bindings: {exc!r}")
    d_out = cuda.device_array(1, np.int32)
    configured = _empty[1, 32, stream]
    results["Numba dispatch kernel[1, 32, stream](...)"] = _per_launch(
        lambda: configured(d_out, 1 << 30), n // 4
    )
    for name, us in results.items():
        print(f"{name:45s} {us:6.2f} us per launch")


if __name__ == "__main__":
    main()
