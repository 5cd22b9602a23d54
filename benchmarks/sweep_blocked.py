"""Sweep the register-blocked filter2d kernel (`kernels.conv.blocked`) on the GPU.

    python benchmarks/sweep_blocked.py --k 21 --ry 24,28,32,34,36 --sizes seed,4k,8k \
        [--old path/to/previous/conv_blocked.py] [--peers]

A previous version comes from git (one from before kernels/conv/ existed imports
the old flat module names and does not load):
    git show <commit>:kernels/conv/blocked.py > /tmp/conv_blocked_old.py

(a size may also be HxW: an H x W x 3 image)

For each rows-per-thread value (and, with --old, the generator of a previous version
of kernels/conv/blocked.py, loaded as a module of the kernels.conv package), the kernel is
generated and compiled outside the disk cache and timed with `imgfilter.bench.Timer`
(launches queued behind a spin kernel): kernel us and TFMA/s per image size, with the
registers and shared memory per block. At the seed size every variant's output is
checked against cv2.filter2D (at most 1 apart, as tests/test_cuda_kernels.py allows).
--peers adds torch depthwise conv2d and cupyx correlate (float32, as `imgfilter
bench` runs them) at each size and prints the ratios to the fastest variant.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import time

import numpy as np
from numba import cuda

from imgfilter import bench
from kernels.common.launch import cdiv
from kernels.conv import blocked as conv_blocked
from kernels.conv import plan as conv_plan


def _load_old(path: str):
    """A previous kernels/conv/blocked.py as the module kernels.conv._old_blocked."""
    spec = importlib.util.spec_from_file_location("kernels.conv._old_blocked", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(module, kh: int, kw: int, ry: int):
    """module's kernel for (kh, kw, ry), compiled from memory (no disk cache)."""
    source = module._HEADER + module._source(kh, kw, ry)
    namespace: dict = {}
    exec(compile(source, f"<sweep {module.__name__} r{ry}>", "exec"), namespace)  # noqa: S102
    return cuda.jit(namespace["correlate_blocked"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=21)
    parser.add_argument("--ry", default="24,28,32,34,36")
    parser.add_argument("--sizes", default="seed,4k,8k")
    parser.add_argument("--old", help="a previous kernels/conv/blocked.py to time beside")
    parser.add_argument("--peers", action="store_true", help="also torch and CuPy")
    args = parser.parse_args()
    k = args.k
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((k, k)) / k).astype(np.float32)
    d_w = cuda.to_device(weights.reshape(k * k))
    timer = bench.Timer()
    name = getattr(cuda.get_current_device(), "name", b"simulator")
    print(f"device: {name.decode() if isinstance(name, bytes) else name}, k={k}")

    variants = []
    if args.old:
        old = _load_old(args.old)
        ry = conv_plan.rows_per_thread(k)
        variants.append((f"old r{ry}", old, ry))
    for ry in (int(r) for r in args.ry.split(",")):
        variants.append((f"new r{ry}", conv_blocked, ry))

    kernels = {}
    for name, module, ry in variants:
        t0 = time.perf_counter()
        kernels[name] = _compile(module, k, k, ry)
        print(f"{name}: generated and wrapped in {time.perf_counter() - t0:.1f} s")

    args_scalar = conv_plan.scalar_args(np.uint8, (k // 2, k // 2), 0, 0.0)
    for size in args.sizes.split(","):
        shape = bench.SHAPES.get(size) or (*map(int, size.split("x")), 3)  # or HxW
        img = rng.integers(0, 256, shape, dtype=np.uint8)
        d_img = cuda.to_device(img)
        fmas = img.size * k * k
        want = None
        if size == "seed" or size not in bench.SHAPES:
            import cv2

            want = cv2.filter2D(img, -1, weights, borderType=cv2.BORDER_REFLECT_101)
        best = None
        for name, _module, ry in variants:
            kernel = kernels[name]
            d_out = cuda.device_array_like(d_img)
            h, w, c = shape
            # Since 2026-11-25 the kernel counts channels fastest in blockIdx.x; an
            # --old version from before then takes them in blockIdx.z.
            if name.startswith("old") and "blockIdx.z" in inspect.getsource(_module):
                grid = (cdiv(w, conv_plan.TX), cdiv(h, conv_plan.TY * ry), c)
            else:
                grid = (cdiv(w, conv_plan.TX) * c, cdiv(h, conv_plan.TY * ry), 1)
            block = (conv_plan.TX, conv_plan.TY, 1)

            def launch(kernel=kernel, grid=grid, block=block, d_img=d_img, d_out=d_out):
                kernel[grid, block](d_img, d_w, *args_scalar, d_out)

            t0 = time.perf_counter()
            launch()
            cuda.synchronize()
            first = time.perf_counter() - t0
            check = ""
            if want is not None:
                diff = np.abs(d_out.copy_to_host().astype(int) - want).max()
                check = f" max|diff| vs cv2 {diff}" + ("" if diff <= 1 else " WRONG")
            us = timer.kernel_us(launch, 20)
            try:
                regs, smem = kernel.get_regs_per_thread(), kernel.get_shared_mem_per_block()
            except AttributeError:  # the simulator
                regs = smem = "?"
            if isinstance(regs, dict):  # one value per compiled signature: one here
                regs, smem = next(iter(regs.values())), next(iter(smem.values()))
            blocks = grid[0] * grid[1] * grid[2]
            print(
                f"{size} {name}: {us:8.1f} us  {fmas / us / 1e6:5.2f} TFMA/s  "
                f"regs {regs} smem {smem} B  blocks {blocks}  (first call incl. compile "
                f"{first:.1f} s){check}",
                flush=True,
            )
            if name.startswith("new") and (best is None or us < best[1]):
                best = (name, us)
        if args.peers:
            print(f"{size} fastest new: {best[0]} {best[1]:.1f} us")
            torch = bench._torch()
            if torch is not None:
                us = timer.kernel_us(bench._torch_depthwise(torch, img, weights), 5)
                print(f"{size} torch conv2d float32: {us:8.1f} us  = {us / best[1]:.2f}x ours")
            cupy, ndi = bench._cupy()
            if ndi is not None:
                c_f = cupy.asarray(img).astype(cupy.float32)
                c_w = cupy.asarray(weights)[:, :, None]

                def peer(ndi=ndi, c_f=c_f, c_w=c_w):
                    return ndi.correlate(c_f, c_w, mode="mirror")

                us = timer.kernel_us(peer, 3)
                print(f"{size} cupy correlate float32: {us:8.1f} us  = {us / best[1]:.2f}x ours")


if __name__ == "__main__":
    main()
