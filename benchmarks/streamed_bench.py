"""Images larger than a GPU budget (issue 27, section 2): wall time of blur 21 and
filter2d 21x21 on a large host image, by the call's default path (since host images
of 32 MiB or more go in bands by default, that is bands with 80% of the free device
memory; before, the whole image in one piece) and streamed in row bands through
`--budget` bytes (`max_gpu_bytes`), against the PCIe floor: the image's bytes in and
out at the host<->device bandwidth measured here with pinned buffers.

    python benchmarks/streamed_bench.py [--size 40000] [--budget 2G] [--json FILE]

Checks that the budgeted bands give the default path's result (bit for bit). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _pcie_gbs(nbytes: int) -> tuple[float, float]:
    """(host->device, device->host) GB/s over `nbytes` with pinned host memory."""
    from kernels.common.arrays import empty
    from kernels.common.cudadrv import driver

    drv = driver()
    host = drv.host_alloc(nbytes)
    dev = empty((nbytes,), np.uint8, 0)
    rates = []
    for copy in (lambda: drv.upload(dev.ptr, host, nbytes, 0),
                 lambda: drv.download_async(host, dev.ptr, nbytes, 0)):  # fmt: skip
        copy()
        drv.synchronize(0)
        t = time.perf_counter()
        for _ in range(3):
            copy()
        drv.synchronize(0)
        rates.append(3 * nbytes / (time.perf_counter() - t) / 1e9)
    drv.host_free(host)
    return rates[0], rates[1]


def _wall(fn, repeats: int = 3, fresh: bool = False) -> float:
    """Median seconds of fn() (its result dropped at once). fresh: the memory of
    dropped results is unmapped before each call (untimed), so each result's pages
    are new, as in a program's first large call; otherwise a result reuses the last
    one's (`imgfilter.hostmem`)."""
    from imgfilter import hostmem

    times = []
    for _ in range(repeats):
        if fresh:
            hostmem.release_results()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=40000)
    parser.add_argument("--budget", default="2G")
    parser.add_argument("--json")
    args = parser.parse_args()
    try:
        import imgfilter
        from imgfilter.cli.values import gpu_bytes
        from kernels.common.cudadrv import driver

        driver()
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        print(f"streamed_bench: needs a CUDA GPU: {exc}", file=sys.stderr)
        return 2
    budget = gpu_bytes(args.budget)
    rng = np.random.default_rng(0)
    img = np.empty((args.size, args.size, 3), np.uint8)
    for y in range(0, args.size, 4096):  # filled in slices: rng of the whole is slow
        img[y : y + 4096] = rng.integers(0, 256, img[y : y + 4096].shape, dtype=np.uint8)
    kernel = (rng.standard_normal((21, 21)) / 21).astype(np.float32)
    h2d, d2h = _pcie_gbs(1 << 30)
    floor_s = img.nbytes / (h2d * 1e9) + img.nbytes / (d2h * 1e9)
    rows = []
    for name, call in (
        ("blur 21", lambda **kw: imgfilter.blur(img, 21, **kw)),
        ("filter2d 21x21", lambda **kw: imgfilter.filter2d(img, kernel, **kw)),
    ):
        whole = call(backend="cuda")
        streamed = call(backend="cuda", max_gpu_bytes=budget)
        same = bool(np.array_equal(whole, streamed))
        del whole, streamed
        t_whole = _wall(lambda call=call: call(backend="cuda"))
        t_streamed = _wall(lambda call=call: call(backend="cuda", max_gpu_bytes=budget))
        t_fresh = _wall(lambda call=call: call(backend="cuda", max_gpu_bytes=budget), fresh=True)
        rows.append({"case": name, "whole_s": t_whole, "streamed_s": t_streamed,
                     "streamed_x_floor": t_streamed / floor_s, "fresh_s": t_fresh,
                     "fresh_x_floor": t_fresh / floor_s, "identical": same})  # fmt: skip
    print(f"{args.size}x{args.size}x3 uint8 ({img.nbytes / 1e9:.2f} GB), budget {args.budget}; "
          f"pinned H2D {h2d:.1f} GB/s, D2H {d2h:.1f} GB/s, PCIe floor {floor_s:.3f} s")  # fmt: skip
    print("default: bands with 80% of the free GPU memory; streamed: --budget; fresh: the "
          "result in new memory (the last results' unmapped first)")  # fmt: skip
    print(f"{'case':16s} {'default':>9s} {'streamed':>9s} {'x floor':>8s} {'fresh':>9s} "
          f"{'x floor':>8s} identical")  # fmt: skip
    for r in rows:
        print(f"{r['case']:16s} {r['whole_s']:8.3f}s {r['streamed_s']:8.3f}s "
              f"{r['streamed_x_floor']:8.2f} {r['fresh_s']:8.3f}s {r['fresh_x_floor']:8.2f} "
              f"{r['identical']}")  # fmt: skip
    if args.json:
        head = {"size": args.size, "budget": args.budget, "h2d_gbs": h2d, "d2h_gbs": d2h,
                "floor_s": floor_s}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"header": head, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
