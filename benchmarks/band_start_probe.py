"""How a fresh process's first banded CPU blur spends its time: thread starts, new memory.

    python benchmarks/band_start_probe.py --rounds 6 [--bands N] [--json OUT.json]

Each measurement is a fresh process that imports NumPy, OpenCV and the CPU backend,
makes a random uint8 image, sleeps 40 ms (as the command's read would take), and then
times its first, second and five more calls (median: "warm") of the 21x21 box filter
(reflect101) of the image in one of these ways:
- `one`: cv2.blur, one call, into a new array;
- `one_pre`: cv2.blur, one call, into an array allocated and written before the sleep;
- `cpu`: `imgfilter.backends.cpu.box` as it is;
- `<start>_<mem>`: the image in bands of rows (as `cpu._run_bands` cuts them), the
  calling thread filtering the first, each other band on a thread started by <start>:
  `thread` (a `threading.Thread` each, started one after the other: `start()` waits
  for the new thread to run), `nowait` (`_thread.start_new_thread`, which does not
  wait), `pool` (threads started before the sleep, parked on a lock each, released
  together); each band's cv2.blur result made in <mem>: `new` (a new array, copied into
  the result, a new array too) or `pre` (arrays allocated and written before the sleep).
Variants and processes alternate in shuffled rounds; prints the medians (ms). Every
result is checked against cv2.blur.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

VARIANTS = ("one", "one_pre", "cpu", "thread_new", "thread_pre", "nowait_new",
            "nowait_pre", "pool_new", "pool_pre")  # fmt: skip
SIZES = ((2167, 2495), (4320, 7680))
K = 21


def child(variant: str, h: int, w: int, nbands: int) -> dict:
    import _thread
    import threading

    import cv2
    import numpy as np

    from imgfilter.backends import cpu

    img = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    ref = cv2.blur(img, (K, K))
    r = K // 2
    if nbands <= 0:
        nbands = max(1, min(cpu.band_threads(), img.nbytes // cpu.BAND_BYTES, h // K))
    edges = [h * i // nbands for i in range(nbands + 1)]
    spans = [(max(0, edges[i] - r), min(h, edges[i + 1] + r)) for i in range(nbands)]
    start, _, mem = variant.partition("_")

    def fresh_or_kept(shape):
        a = np.empty(shape, np.uint8)
        a.fill(1)
        return a

    kept_out = fresh_or_kept(img.shape) if mem == "pre" else None
    kept = [fresh_or_kept((b - a, w, 3)) for a, b in spans] if mem == "pre" else None

    work: list = [None] * nbands
    parked: list = []

    def worker(i: int, go) -> None:
        while True:
            go.acquire()
            work[i]()

    if start == "pool":
        for i in range(1, nbands):
            go = threading.Lock()
            go.acquire()
            parked.append(go)
            _thread.start_new_thread(worker, (i, go))

    def banded() -> np.ndarray:
        out = kept_out if kept_out is not None else np.empty_like(img)
        left = [nbands - 1]
        lock = threading.Lock()
        finished = threading.Lock()
        finished.acquire()

        def band(i: int) -> None:
            a, b = spans[i]
            dst = kept[i] if kept is not None else None
            res = cv2.blur(img[a:b], (K, K), dst=dst)
            out[edges[i] : edges[i + 1]] = res[edges[i] - a : edges[i + 1] - a]
            if i:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        finished.release()

        if start == "thread":
            ts = [threading.Thread(target=band, args=(i,)) for i in range(1, nbands)]
            for t in ts:
                t.start()
        elif start == "nowait":
            for i in range(1, nbands):
                _thread.start_new_thread(band, (i,))
        else:
            for i in range(1, nbands):
                work[i] = lambda i=i: band(i)
                parked[i - 1].release()
        band(0)
        if nbands > 1:
            finished.acquire()
        return out

    time.sleep(0.04)
    times = []
    out = None
    for _ in range(7):
        t = time.perf_counter()
        if variant == "one":
            out = cv2.blur(img, (K, K))
        elif variant == "one_pre":
            out = cv2.blur(img, (K, K), dst=kept_out if kept_out is not None else None)
        elif variant == "cpu":
            out = cpu.box(img, (K, K), (r, r), 0, 0.0, "auto")
        else:
            out = banded()
        times.append((time.perf_counter() - t) * 1e3)
    if not np.array_equal(out, ref):
        raise SystemExit(f"{variant}: result differs from cv2.blur")
    return {"first": times[0], "second": times[1], "warm": statistics.median(times[2:]),
            "bands": nbands}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--bands", type=int, default=0, help="0: as cpu.box would")
    parser.add_argument("--json")
    parser.add_argument("--child", nargs=4)
    args = parser.parse_args()
    if args.child:
        v, h, w, nb = args.child
        print(json.dumps(child(v, int(h), int(w), int(nb))))
        return
    got: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        jobs = [(v, h, w) for v in VARIANTS for h, w in SIZES]
        random.shuffle(jobs)
        for v, h, w in jobs:
            cmd = [sys.executable, __file__, "--child", v, str(h), str(w), str(args.bands)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            got.setdefault(f"{h}x{w} {v}", []).append(json.loads(res.stdout))
            time.sleep(0.2)
    print(f"{'case':<24} {'bands':>5} {'first':>7} {'second':>7} {'warm':>7}   (ms, medians)")
    table = {}
    for key in sorted(got, key=lambda k: (k.split()[0], VARIANTS.index(k.split()[1]))):
        runs = got[key]
        row = {k: statistics.median(r[k] for r in runs) for k in ("first", "second", "warm")}
        table[key] = {**row, "runs": runs}
        print(f"{key:<24} {runs[0]['bands']:>5} {row['first']:>7.1f} {row['second']:>7.1f}"
              f" {row['warm']:>7.1f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
