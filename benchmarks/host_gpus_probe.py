"""How far host images scale over the GPUs of one host without Dask: the ceiling for
`imgfilter.dask` on NumPy bands.

One process per GPU (CUDA_VISIBLE_DEVICES set before imgfilter is imported), each
with its own random --size/N x --size x 3 uint8 host image, all starting each rep
together (a barrier); a rep ends when the last process ends. Two ways per process:
- whole: `imgfilter.blur(img, 21)` (row bands streamed through the GPU);
- tasks: band tasks without Dask's graph, as `imgfilter.dask` ran them until its band
  tasks stopped joining: for each --rows band, join it with 10 rows of each neighbour
  (`imgfilter.streamed.join_rows`), blur, keep the band's own rows (every band result
  held until the rep ends, as Dask holds them);
- copy: no GPU, the image copied into a new host array by the copy threads the bands
  use (`imgfilter.streamed`'s), the host's share of the work alone.
--copy-threads sets those threads per process (default: streamed.COPY_THREADS).
Prints the median seconds per rep for 1, 2, ... processes on the same total image and
the speedup against one; with --steps, each process's median join/filter ms per band.

    python benchmarks/host_gpus_probe.py --gpus 1,2 --size 32768 --rows 2048
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time


def worker(gpu: int, rows_total: int, width: int, rows: int, mode: str, reps: int,
           threads: int, barrier, queue) -> None:  # fmt: skip
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    import numpy as np

    import imgfilter
    from imgfilter import streamed
    from imgfilter.streamed import join_rows

    if threads:
        streamed.COPY_THREADS = threads

    img = np.random.default_rng(gpu).integers(0, 256, (rows_total, width, 3), np.uint8)
    steps: dict[str, list[float]] = {"join": [], "filter": []}

    def tasks() -> list:
        kept = []
        for y in range(0, rows_total, rows):
            parts = [img[max(0, y - 10) : y], img[y : y + rows], img[y + rows : y + rows + 10]]
            parts = [p for p in parts if p.shape[0]]
            t0 = time.perf_counter()
            joined = join_rows(parts)
            t1 = time.perf_counter()
            result = imgfilter.blur(joined, 21)
            steps["join"].append(t1 - t0)
            steps["filter"].append(time.perf_counter() - t1)
            top = min(10, y)
            kept.append(result[top : top + min(rows, rows_total - y)])
        return kept

    def whole() -> list:
        return [imgfilter.blur(img, 21)]

    def copy() -> list:
        return [join_rows([img])]

    run = {"tasks": tasks, "whole": whole, "copy": copy}[mode]
    run()  # warm-up: kernels, pinned buffers
    steps = {"join": [], "filter": []}
    times = []
    for _ in range(reps):
        barrier.wait()
        t0 = time.perf_counter()
        kept = run()
        times.append(time.perf_counter() - t0)
        del kept
    ms = {k: 1e3 * statistics.median(v) for k, v in steps.items() if v}
    queue.put((gpu, times, ms))


def measure(n: int, size: int, rows: int, mode: str, reps: int, threads: int
            ) -> tuple[float, list]:  # fmt: skip
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    queue = ctx.Queue()
    share = size // n
    procs = [ctx.Process(target=worker, args=(g, share, size, rows, mode, reps, threads, barrier,
                                                queue))
             for g in range(n)]  # fmt: skip
    for p in procs:
        p.start()
    got = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    per_rep = [max(times[i] for _, times, _ in got) for i in range(reps)]
    return statistics.median(per_rep), sorted(got)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1,2")
    parser.add_argument("--size", type=int, default=32768)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--modes", default="whole,tasks")
    parser.add_argument("--steps", action="store_true")
    parser.add_argument("--copy-threads", type=int, default=0)
    args = parser.parse_args()
    print(
        f"{args.size}x{args.size}x3 uint8 in total, blur 21, {args.rows}-row tasks, "
        f"copy threads {args.copy_threads or 'default'}"
    )
    print(f"{'mode':<6} {'GPUs':>4} {'median ms':>10} {'speedup':>8}")
    for mode in args.modes.split(","):
        base = None
        for n in (int(c) for c in args.gpus.split(",")):
            t, got = measure(n, args.size, args.rows, mode, args.reps, args.copy_threads)
            base = base or t
            print(f"{mode:<6} {n:>4} {t * 1e3:>10.1f} {base / t:>7.2f}x", flush=True)
            if args.steps:
                for gpu, times, ms in got:
                    reps = ", ".join(f"{x * 1e3:.0f}" for x in times)
                    parts = ", ".join(f"{k} {v:.1f} ms/band" for k, v in ms.items())
                    print(f"    GPU {gpu}: reps {reps} ms; {parts}", flush=True)


if __name__ == "__main__":
    main()
