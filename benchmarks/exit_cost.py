"""What ending a process that holds a CUDA context costs, and what `backends.handoff`
leaves of it (GPU machine; the tree's `imgfilter._linger` built).

    python benchmarks/exit_cost.py [--rounds 7]

Each case is a fresh process, timed by this one: start (until the interpreter runs the
case), work (the case itself), exit (from the case's end to this process seeing the
child gone). Cases: `pass`; `context` (open the driver, os._exit); `context+release`
(release and reset the primary context first, inside the work); `context+handoff`
(`handoff.hand_off()` before os._exit); `blur`, `blur+handoff` (one 2167x2495x3 uint8
box blur k=21 first). Medians in ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = ("pass", "context", "context+release", "context+handoff", "blur", "blur+handoff")


def child(case: str) -> None:
    t_ready = time.monotonic()
    if case != "pass":
        from kernels.common.cudadrv import driver

        drv = driver()
        if case.startswith("blur"):
            import numpy as np

            import imgfilter

            rng = np.random.default_rng(0)
            imgfilter.blur(rng.integers(0, 256, (2167, 2495, 3), dtype=np.uint8), 21)
        if case.endswith("+release"):
            drv._lib.cuDevicePrimaryCtxRelease(drv.device)
            drv._lib.cuDevicePrimaryCtxReset(drv.device)
        if case.endswith("+handoff"):
            from imgfilter.backends import handoff

            if handoff.hand_off() is None:
                raise SystemExit("nothing was handed off (is imgfilter._linger built?)")
    print(t_ready, time.monotonic(), flush=True)
    os._exit(0)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, ...]]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, __file__, "--child", case],
                                  capture_output=True, text=True)  # fmt: skip
            t1 = time.monotonic()
            if done.returncode:
                raise SystemExit(f"{case} failed: {done.stderr.strip()[-300:]}")
            ready, end = map(float, done.stdout.split())
            rows[case].append(((ready - t0) * 1e3, (end - ready) * 1e3, (t1 - end) * 1e3,
                               (t1 - t0) * 1e3))  # fmt: skip
    print(f"{'case':<18} {'start':>7} {'work':>7} {'exit':>7} {'wall':>7}  "
          f"(ms, medians of {args.rounds})")  # fmt: skip
    for case, times in rows.items():
        cols = [statistics.median(t[i] for t in times) for i in range(4)]
        print(f"{case:<18} " + " ".join(f"{v:7.1f}" for v in cols))


if __name__ == "__main__":
    main()
