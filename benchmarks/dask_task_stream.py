"""Where the workers' time goes in `imgfilter.dask` over two GPUs: Dask's task stream
of a few runs of filter2d 21x21 on CuPy bands (made on the workers, as
`benchmarks/dask_scale.py` makes them), summed per worker, per action (compute, or
transfer: fetching a task's inputs from another worker) and per kind of task.

    python benchmarks/dask_task_stream.py [--size 65536] [--rows 4096] [--reps 3]
        [--no-stealing] [--place even|dask]

Prints how many bands each worker holds, then per run: the time until the tasks are
done, until both GPUs are done, and the summed task-stream times in ms. Needs two
GPUs, dask-cuda, distributed and CuPy.
"""

from __future__ import annotations

import argparse
import collections
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


def away(client, bands, result) -> int:
    """How many row bands' results are on none of the workers holding the band."""

    def holders(arr) -> dict:
        return {key[1]: set(ws) for key, ws in client.who_has(arr).items()}

    source, done = holders(bands), holders(result)
    return sum(1 for i, ws in done.items() if not ws & source.get(i, set()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-stealing", action="store_true", help="Dask's work stealing off")
    parser.add_argument("--place", choices=("even", "dask"), default="even",
                        help="bands in even contiguous runs per worker (dask_scale.place_evenly)"
                             ", or where Dask puts them")  # fmt: skip
    args = parser.parse_args()
    cupy, cluster_cls, client_cls, wait = dask_scale.requirements()
    import dask
    from distributed import get_task_stream

    import imgfilter.dask as ifd

    op = dask_scale.operations()["filter2d 21x21"]
    config = dask_scale.scheduler_config(args)
    with dask.config.set(config), cluster_cls(CUDA_VISIBLE_DEVICES="0,1") as cluster, \
            client_cls(cluster) as client:  # fmt: skip
        x = dask_scale.make_image(cupy, args.size, args.rows)
        if args.place == "even":
            x = dask_scale.place_evenly(client, x, wait)
        else:
            x = x.persist()
            wait(x)
        held = collections.Counter(w for ws in client.who_has(x).values() for w in ws)
        print(f"{args.size}x{args.size}x3 uint8, bands of {args.rows} rows; bands per worker: "
              f"{dict(held)}")  # fmt: skip
        for rep in range(args.reps):
            fresh = x.map_blocks(dask_scale._same, rep=rep, dtype=x.dtype, meta=x._meta)
            fresh = fresh.persist()
            wait(fresh)
            with get_task_stream() as stream:
                t0 = time.perf_counter()
                y = op(fresh, ifd).persist()
                wait(y)
                t1 = time.perf_counter()
                client.run(dask_scale._sync_gpu)
                t2 = time.perf_counter()
            print(f"run {rep}: tasks done {(t1 - t0) * 1e3:.0f} ms, GPUs done "
                  f"{(t2 - t0) * 1e3:.0f} ms, {len(stream.data)} tasks, results away from "
                  f"their bands: {away(client, fresh, y)} of {len(fresh.chunks[0])}")  # fmt: skip
            print("\n".join(summary(stream.data)))
            del y, fresh
    return 0


if __name__ == "__main__":
    sys.exit(main())
