"""Host cost of one kernel launch, and of the pieces around it, through the ways open
to Python (GPU needed).

An empty kernel compiled by Numba, launched on a non-default stream by:
`kernels.common.launch.launch` (the whole layer), `kernels.common.cudadrv.Driver.launch` (ctypes
cuLaunchKernelEx, a config per thread and geometry, parameters packed in one buffer),
ctypes cuLaunchKernelEx with a prepared config (with and without packing), ctypes
cuLaunchKernel with a kernelParams array, cuda.bindings' cuLaunchKernel, and Numba's
own dispatch; beside them torch's and CuPy's cheapest calls, and our pool allocation.
Each figure is the host time of a window of `--window` calls (short enough that the
launch queue never fills, so the GPU's own launch rate does not show), median of
`--windows` windows, divided by the window. Prints microseconds per call.

    python benchmarks/launch_overhead.py [--window 200] [--windows 25]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import struct
import time

import numpy as np
from numba import cuda


@cuda.jit
def _empty(out, n):
    if cuda.grid(1) == n:
        out[0] = 1


def _per_call(fn, window: int, windows: int, sync) -> float:
    """Median host microseconds per call over `windows` windows of `window` calls."""
    fn()
    sync()
    times = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(window):
            fn()
        times.append(time.perf_counter() - t0)
        sync()
    return statistics.median(times) / window * 1e6


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint),
    ]  # fmt: skip


def _offsets(packer: struct.Struct) -> list[int]:
    """Byte offset of each parameter in `packer`'s native-aligned layout."""
    fmt, offsets = packer.format.lstrip("@"), []
    for i in range(len(fmt)):
        prefix = fmt[: i + 1]
        offsets.append(struct.calcsize("@" + prefix) - struct.calcsize("@" + fmt[i]))
    return offsets


def _launch_cases(results: dict, measure, drv, handle: int) -> None:
    from kernels.common.arrays import empty
    from kernels.common.launch import _compiled, launch

    out = empty((1,), np.int32, handle)
    args = (out, 1 << 30)
    launch(_empty, 1, 32, args, handle)
    compiled = next(c for (k, _), c in _compiled.items() if k is _empty)
    values = list(out.params()) + [1 << 30]
    packer, fn = compiled.packer, compiled.handle
    results["kernels.common.launch.launch (whole layer)"] = measure(
        lambda: launch(_empty, 1, 32, args, handle)
    )
    results["Driver.launch (ctypes cuLaunchKernelEx)"] = measure(
        lambda: drv.launch(fn, (1, 1, 1), (32, 1, 1), 0, handle, packer, values)
    )
    lib = drv._lib
    u, vp = ctypes.c_uint, ctypes.c_void_p
    lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    config = _LaunchConfig(1, 1, 1, 32, 1, 1, 0, handle, None, 0)
    buf = ctypes.create_string_buffer(4096)
    size = ctypes.c_size_t(packer.size)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
    config_ptr, extra_ptr = ctypes.addressof(config), ctypes.addressof(extra)
    base = ctypes.addressof(buf)
    params = (ctypes.c_void_p * len(values))(*[base + o for o in _offsets(packer)])
    params_ptr = ctypes.addressof(params)
    packer.pack_into(buf, 0, *values)
    ex = lib.cuLaunchKernelEx
    results["ctypes cuLaunchKernelEx, no packing"] = measure(
        lambda: ex(config_ptr, fn, None, extra_ptr)
    )

    def ex_packed():
        packer.pack_into(buf, 0, *values)
        ex(config_ptr, fn, None, extra_ptr)

    results["ctypes cuLaunchKernelEx, packing"] = measure(ex_packed)
    plain = lib.cuLaunchKernel
    results["ctypes cuLaunchKernel, kernelParams, no packing"] = measure(
        lambda: plain(fn, 1, 1, 1, 32, 1, 1, 0, handle, params_ptr, None)
    )
    try:
        from cuda.bindings import driver as cb

        f, s = cb.CUfunction(fn), cb.CUstream(handle)
        launch_cb = cb.cuLaunchKernel
        err, *_ = launch_cb(f, 1, 1, 1, 32, 1, 1, 0, s, params_ptr, 0)
        if int(err) != 0:
            raise RuntimeError(f"cuLaunchKernel: {err}")
        results["cuda.bindings cuLaunchKernel, kernelParams, no packing"] = measure(
            lambda: launch_cb(f, 1, 1, 1, 32, 1, 1, 0, s, params_ptr, 0)
        )
    except Exception as exc:  # noqa: BLE001 - reported
        print(f"cuda.bindings: {exc!r}")
    kp = ctypes.c_void_p
    results["ctypes cuLaunchKernelEx, kernelParams, no packing"] = measure(
        lambda: ex(config_ptr, fn, params_ptr, None)
    )
    pylib = ctypes.PyDLL(lib._name)
    pyex = pylib.cuLaunchKernelEx
    pyex.argtypes = [kp, kp, kp, kp]
    results["PyDLL cuLaunchKernelEx (GIL held), no packing"] = measure(
        lambda: pyex(config_ptr, fn, None, extra_ptr)
    )
    _runtime_cases(results, measure, fn, handle, params_ptr)
    stream = cuda.external_stream(handle)
    d_out = cuda.device_array(1, np.int32)
    configured = _empty[1, 32, stream]
    results["Numba dispatch kernel[1, 32, stream](...)"] = measure(
        lambda: configured(d_out, 1 << 30)
    )


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _RuntimeConfig(ctypes.Structure):
    """cudaLaunchConfig_t."""

    _fields_ = [
        ("gridDim", _Dim3), ("blockDim", _Dim3), ("dynamicSmemBytes", ctypes.c_size_t),
        ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint),
    ]  # fmt: skip


def _cudart():
    """The CUDA runtime library of this environment (torch's or CuPy's wheels), or None."""
    import glob
    import sys

    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for base in sys.path:
        names += sorted(glob.glob(f"{base}/nvidia/**/libcudart.so*", recursive=True))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _runtime_cases(results: dict, measure, fn: int, handle: int, params_ptr: int) -> None:
    """The same kernel (a CUkernel, which the runtime takes as a cudaKernel_t) launched
    through the CUDA runtime, as torch launches."""
    rt = _cudart()
    if rt is None:
        print("cudart: not found")
        return
    vp = ctypes.c_void_p
    rt.cudaFree(None)  # the runtime on the primary context
    config = _RuntimeConfig(_Dim3(1, 1, 1), _Dim3(32, 1, 1), 0, handle, None, 0)
    config_ptr = ctypes.addressof(config)
    launch_ex = rt.cudaLaunchKernelExC
    launch_ex.argtypes = [vp, vp, vp]
    status = launch_ex(config_ptr, fn, params_ptr)
    if status:
        print(f"cudaLaunchKernelExC: error {status}")
        return
    results["cudart cudaLaunchKernelExC (ctypes)"] = measure(
        lambda: launch_ex(config_ptr, fn, params_ptr)
    )
    launch = rt.cudaLaunchKernel
    launch.argtypes = [vp, _Dim3, _Dim3, vp, ctypes.c_size_t, vp]
    grid, block = _Dim3(1, 1, 1), _Dim3(32, 1, 1)
    results["cudart cudaLaunchKernel (ctypes)"] = measure(
        lambda: launch(fn, grid, block, params_ptr, 0, handle)
    )
    py_launch_ex = ctypes.PyDLL(rt._name).cudaLaunchKernelExC
    py_launch_ex.argtypes = [vp, vp, vp]
    results["cudart cudaLaunchKernelExC (PyDLL, GIL held)"] = measure(
        lambda: py_launch_ex(config_ptr, fn, params_ptr)
    )


def _piece_cases(results: dict, measure, handle: int) -> None:
    from kernels.common.devarray import POOL, as_device_array, empty

    results["POOL.allocate + release (1 KiB)"] = measure(lambda: POOL.allocate(1024, handle))
    results["devarray.empty((1, 1024), float32)"] = measure(
        lambda: empty((1, 1024), np.float32, handle)
    )
    try:
        import cupy as cp
    except ImportError:
        print("cupy: not installed")
        return
    with cp.cuda.Stream(non_blocking=True):
        x = cp.random.rand(1, 1024, dtype=cp.float32)
        results["as_device_array(cupy array)"] = measure(lambda: as_device_array(x))
        results["cupy.cuda.get_current_stream()"] = measure(cp.cuda.get_current_stream)
        results["cupy.empty((1, 1024), float32)"] = measure(lambda: cp.empty((1, 1024), cp.float32))
        results["cupy x * 2 (1x1024)"] = measure(lambda: x * 2)
        from kernels.softmax import softmax

        results["kernels.softmax.softmax(cupy 1x1024)"] = measure(lambda: softmax(x))
        dx = as_device_array(x)
        results["kernels.softmax.softmax(DeviceArray 1x1024)"] = measure(lambda: softmax(dx))
        _softmax_pieces(results, measure, cp, x, dx)


def _softmax_pieces(results: dict, measure, cp, x, dx) -> None:
    """The pieces of softmax's replay path on a CuPy input with a CuPy stream object
    (the pipeline benchmark's call), each alone."""
    from kernels.common.devarray import cheap_view, empty_like, peek, stream_handle
    from kernels.softmax import dispatch as sm

    s = cp.cuda.get_current_stream()
    results["softmax(cupy 1x1024, stream=cupy stream)"] = measure(lambda: sm.softmax(x, stream=s))
    results["  stream_handle(cupy stream)"] = measure(lambda: stream_handle(s))
    results["  cheap_view(cupy array)"] = measure(lambda: cheap_view(x))
    results["  peek(cupy array)"] = measure(lambda: peek(x))
    layout, ptr, _ = peek(x)
    key = (layout, ptr & 15, False, "auto", None)
    results["  replay key + dict lookup"] = measure(
        lambda: sm._REPLAYS.get((layout, ptr & 15, False, "auto", None))
    )
    recipe, template = sm._REPLAYS[key]
    handle = s.ptr
    results["  empty_like(template)"] = measure(lambda: empty_like(template, handle))
    dy = empty_like(template, handle)
    pointers = [dx.ptr, dy.ptr]
    results["  recipe.replay (one PreparedLaunch)"] = measure(
        lambda: recipe.replay(pointers, handle)
    )
    step = recipe._prepared[0]
    results["  PreparedLaunch.launch"] = measure(lambda: step.launch(handle, pointers))
    raw, args = step._call, step._args
    results["  its cuLaunchKernelEx call alone"] = measure(lambda: raw(*args))


def _torch_cases(results: dict, measure) -> None:
    try:
        import torch
    except ImportError:
        print("torch: not installed")
        return
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.rand(1, 1024, device="cuda")
        results["torch.softmax (1x1024)"] = measure(lambda: torch.softmax(x, -1))
        results["torch.empty((1, 1024))"] = measure(lambda: torch.empty((1, 1024), device="cuda"))
        results["torch x * 2 (1x1024)"] = measure(lambda: x * 2)
        results["torch.softmax(x, dim=1) (1x1024)"] = measure(lambda: torch.softmax(x, dim=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--windows", type=int, default=25)
    opts = ap.parse_args()

    from kernels.common.cudadrv import CudaError, driver

    try:
        drv = driver()
    except CudaError as exc:
        raise SystemExit(f"launch_overhead needs an NVIDIA GPU: {exc}") from None
    handle = drv.stream_create()

    def sync():
        drv.synchronize(handle)
        cuda.synchronize()

    def measure(fn):
        return _per_call(fn, opts.window, opts.windows, sync)

    results: dict[str, float] = {}
    _launch_cases(results, measure, drv, handle)
    _piece_cases(results, measure, handle)
    _torch_cases(results, measure)
    print(f"host us per call: median of {opts.windows} windows of {opts.window} calls")
    for name, us in results.items():
        print(f"{name:55s} {us:6.2f}")


if __name__ == "__main__":
    main()
