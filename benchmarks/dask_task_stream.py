"""Where the time of a run of `imgfilter.dask` goes on one or more GPUs: Dask's task
stream of a few runs of an operation on CuPy bands (or --host NumPy bands; made on the
workers, as `benchmarks/dask_scale.py` makes them).

    python benchmarks/dask_task_stream.py [--gpus 2] [--size 65536] [--rows 4096]
        [--reps 3] [--op "filter2d 21x21"] [--host] [--threads 1] [--no-stealing]
        [--place even|dask]

Prints how many bands each worker holds, then per run (run 0 compiles the kernels):
the time until the tasks are done and until the GPUs are done; the run's timeline
(from persist() to the first task's start, to the last task's end, to wait()
returning) and per worker its first start, last end, and the summed compute,
transfer (fetching a task's inputs from another worker) and idle time between them;
then the summed task-stream times per worker, action and kind of task, in ms.
Needs dask-cuda, distributed and CuPy.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import dask_scale  # noqa: E402 - the same image, operations and GPU wait


def _kind(key) -> str:
    name = key[0] if isinstance(key, tuple) else key
    return str(name).rsplit("-", 1)[0][:40]


def summary(records: list) -> list[str]:
    """Per (worker, action): the summed seconds of each kind of task, largest first."""
    by: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    for rec in records:
        for part in rec["startstops"]:
            by[(rec["worker"], part["action"])][_kind(rec["key"])] += part["stop"] - part["start"]
    lines = []
    for (worker, action), kinds in sorted(by.items()):
        top = sorted(kinds.items(), key=lambda kv: -kv[1])[:6]
        lines.append(f"  {worker} {action}: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in top))
    return lines


def timeline(records: list, t0: float, t1: float) -> list[str]:
    """The run's phases and each worker's busy and idle time, ms from t0 (time.time()
    when persist() was called; t1 when wait() returned)."""
    parts = [(rec["worker"], p) for rec in records for p in rec["startstops"]]
    if not parts:
        return ["  no tasks"]
    first = min(p["start"] for _, p in parts)
    last = max(p["stop"] for _, p in parts)
    lines = [f"  persist -> first task {(first - t0) * 1e3:.1f}, -> last task done "
             f"{(last - t0) * 1e3:.1f}, -> wait returned {(t1 - t0) * 1e3:.1f}"]  # fmt: skip
    for worker in sorted({w for w, _ in parts}):
        mine = [p for w, p in parts if w == worker]
        start = min(p["start"] for p in mine)
        stop = max(p["stop"] for p in mine)
        busy = collections.Counter()
        for p in mine:
            busy[p["action"]] += p["stop"] - p["start"]
        idle = (stop - start) - sum(busy.values())
        sums = ", ".join(f"{a} {v * 1e3:.1f}" for a, v in sorted(busy.items()))
        lines.append(f"  {worker}: {len(mine)} parts, {(start - t0) * 1e3:.1f} .. "
                     f"{(stop - t0) * 1e3:.1f}: {sums}, idle {idle * 1e3:.1f}")  # fmt: skip
    return lines


def away(client, bands, result) -> int:
    """How many row bands' results are on none of the workers holding the band."""

    def holders(arr) -> dict:
        return {key[1]: set(ws) for key, ws in client.who_has(arr).items()}

    source, done = holders(bands), holders(result)
    return sum(1 for i, ws in done.items() if not ws & source.get(i, set()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2, help="workers, one per GPU")
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--op", choices=dask_scale.OPS, default="filter2d 21x21")
    parser.add_argument("--host", action="store_true", help="NumPy bands in host memory")
    parser.add_argument("--threads", type=int, default=1, help="task threads per worker")
    parser.add_argument("--no-stealing", action="store_true", help="Dask's work stealing off")
    parser.add_argument("--place", choices=("even", "dask"), default="even",
                        help="bands in even contiguous runs per worker (dask_scale.place_evenly)"
                             ", or where Dask puts them")  # fmt: skip
    args = parser.parse_args()
    cupy, cluster_cls, client_cls, wait = dask_scale.requirements()
    import dask
    from distributed import get_task_stream

    import imgfilter.dask as ifd

    os.environ.setdefault("IMGFILTER_BACKGROUND_COMPILE", "0")  # workers compile at once
    op = dask_scale.operations()[args.op]
    gpus = ",".join(dask_scale.visible_gpus(cupy)[: args.gpus])
    config = dask_scale.scheduler_config(args)
    with dask.config.set(config), cluster_cls(CUDA_VISIBLE_DEVICES=gpus,
                                                  threads_per_worker=args.threads) as cluster, \
            client_cls(cluster) as client:  # fmt: skip
        x = dask_scale.make_image(cupy, args.size, args.rows, args.host)
        if args.place == "even":
            x = dask_scale.place_evenly(client, x, wait)
        else:
            x = x.persist()
            wait(x)
        held = collections.Counter(w for ws in client.who_has(x).values() for w in ws)
        where = "NumPy bands in host memory" if args.host else "CuPy bands"
        print(f"{args.op}, {args.size}x{args.size}x3 uint8, {where} of {args.rows} rows, "
              f"{args.threads} task thread(s) per worker; bands per worker: "
              f"{dict(held)}")  # fmt: skip
        for rep in range(args.reps):
            fresh = x.map_blocks(dask_scale._same, rep=rep, dtype=x.dtype, meta=x._meta)
            fresh = fresh.persist()
            wait(fresh)
            with get_task_stream() as stream:
                t0, wall0 = time.perf_counter(), time.time()
                y = op(fresh, ifd).persist()
                wait(y)
                t1, wall1 = time.perf_counter(), time.time()
                client.run(dask_scale._sync_gpu)
                t2 = time.perf_counter()
            print(f"run {rep}: tasks done {(t1 - t0) * 1e3:.0f} ms, GPUs done "
                  f"{(t2 - t0) * 1e3:.0f} ms, {len(stream.data)} tasks, results away from "
                  f"their bands: {away(client, fresh, y)} of {len(fresh.chunks[0])}")  # fmt: skip
            print("\n".join(timeline(stream.data, wall0, wall1)))
            print("\n".join(summary(stream.data)))
            del y, fresh
    return 0


if __name__ == "__main__":
    sys.exit(main())
