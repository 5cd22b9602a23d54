"""imgfilter.dask over 1, 2, 4 GPUs: dask-cuda's LocalCUDACluster, one worker per GPU.

A --size x --size x 3 uint8 image of random CuPy row bands (--rows rows each) is made
on the workers and persisted there, so each band lives on one GPU (--host: NumPy bands
in the workers' host memory, as a raster read from disk would be, so that every task
copies its band to its GPU and the result back); then blur 21 and
filter2d 21x21 (a random kernel) run as `op(x).persist()` + `wait`, one warm-up
(kernel compiles on every worker) and the median of --reps. Halo rows of neighbouring
bands on other GPUs travel over the cluster's protocol (--protocol, tcp by default).
For reference, the same ops on the whole image on one GPU without Dask (in this
process, on the first GPU).

The bands are placed in even, contiguous runs, one run per worker (--place dask: where
Dask's scheduler puts them, often unevenly). The GPUs are those of CUDA_VISIBLE_DEVICES
(else all); counts above them are skipped.
Prints a table (median ms, Mpixel/s, speedup vs 1 GPU) and writes JSON with --json.
Needs dask-cuda, distributed and CuPy (pip install "imgfilter[dask-cuda]" cupy-cuda12x).

    python benchmarks/dask_scale.py --json out.json [--gpus 1,2,4] [--size 16384]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

OPS = ("blur 21", "filter2d 21x21")


def fail(message: str) -> None:
    """One line on stderr, exit status 2."""
    print(f"dask_scale: {message}", file=sys.stderr)
    sys.exit(2)


def requirements():
    """(cupy, LocalCUDACluster, Client, wait) or a one-line exit."""
    try:
        import cupy
        from dask_cuda import LocalCUDACluster
        from distributed import Client, wait
    except ImportError as exc:
        fail(f"{exc.name or exc} is missing; pip install 'imgfilter[dask-cuda]' cupy-cuda12x")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        fail(f"no usable CUDA GPU ({type(exc).__name__}: {exc})")
    if count < 1:
        fail("no CUDA GPU is visible")
    return cupy, LocalCUDACluster, Client, wait


def visible_gpus(cupy) -> list[str]:
    """The device ids a LocalCUDACluster may use, in order."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [d.strip() for d in env.split(",") if d.strip()]
    return [str(i) for i in range(cupy.cuda.runtime.getDeviceCount())]


def random_band(seed: int, block_info=None):
    """One row band of random uint8 pixels, made on the worker's GPU."""
    import cupy

    info = block_info[None]
    start = info["array-location"][0][0]
    rng = cupy.random.RandomState(seed + start)
    return rng.randint(0, 256, size=info["chunk-shape"], dtype=cupy.uint8)


def random_host_band(seed: int, block_info=None) -> np.ndarray:
    """One row band of random uint8 pixels, made in the worker's host memory."""
    info = block_info[None]
    start = info["array-location"][0][0]
    rng = np.random.default_rng(seed + start)
    return rng.integers(0, 256, size=info["chunk-shape"], dtype=np.uint8)


def make_image(cupy, size: int, rows: int, host: bool = False):
    import dask.array as da

    bands = tuple([rows] * (size // rows) + ([size % rows] if size % rows else []))
    meta = np.empty((0, 0, 0), np.uint8) if host else cupy.empty((0, 0, 0), cupy.uint8)
    make = random_host_band if host else random_band
    return da.map_blocks(make, 1, dtype=np.uint8, chunks=(bands, (size,), (3,)), meta=meta)


def operations(seed: int = 0) -> dict:
    """name -> f(array, module) where module is imgfilter or imgfilter.dask."""
    kernel = np.random.default_rng(seed).standard_normal((21, 21)).astype(np.float32)
    kernel /= np.abs(kernel).sum()
    return {
        "blur 21": lambda x, m: m.blur(x, 21),
        "filter2d 21x21": lambda x, m: m.filter2d(x, kernel),
    }


def _same(band, rep: int):
    return band


def _sync_gpu() -> None:
    """Wait for everything queued on this worker's GPU."""
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def time_dask(op, x, wait, reps: int, client=None) -> list[float]:
    """Seconds of op(x).persist() until every band is done: warm-up, then reps.
    With `client`, until every worker's GPU is also done: a task on CuPy bands ends
    once its filter is queued on the GPU, not when it has run."""
    import imgfilter.dask as ifd

    times = []
    for i in range(reps + 1):
        # A new identity step per rep gives every task of the op a new key: a persist
        # of the same keys would find the last rep's results (released asynchronously).
        # Persisted first: the bands sit on their workers before the clock starts, as
        # a persisted image's do.
        fresh = x.map_blocks(_same, rep=i, dtype=x.dtype, meta=x._meta).persist()
        wait(fresh)
        t0 = time.perf_counter()
        y = op(fresh, ifd).persist()
        wait(y)
        if client is not None:
            client.run(_sync_gpu)
        if i:
            times.append(time.perf_counter() - t0)
        del y, fresh
    return times


def time_whole(cupy, op, size: int, reps: int, host: bool = False) -> list[float]:
    """Seconds of op on the whole image on this process's GPU, no Dask (host: a NumPy
    image in, a NumPy result out)."""
    import imgfilter

    if host:
        img = np.random.default_rng(1).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    else:
        # In row blocks, its scratch freed: randint makes 4 bytes a value first, and
        # CuPy's pool would keep them from imgfilter's allocations (an 80 GB GPU at 65536^2).
        img = cupy.empty((size, size, 3), cupy.uint8)
        rng = cupy.random.RandomState(1)
        for r in range(0, size, 4096):
            img[r : r + 4096] = rng.randint(0, 256, size=img[r : r + 4096].shape, dtype=cupy.uint8)
        cupy.get_default_memory_pool().free_all_blocks()
    times = []
    for i in range(reps + 1):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        op(img, imgfilter)
        cupy.cuda.runtime.deviceSynchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return times


def _release_device_memory(cupy) -> None:
    """Give the whole-image runs' cached device blocks (CuPy's and imgfilter's pools)
    back to CUDA."""
    from kernels.common.devarray import POOL

    cupy.get_default_memory_pool().free_all_blocks()
    POOL.trim()


def scheduler_config(args) -> dict:
    """Dask settings from --no-stealing."""
    return {"distributed.scheduler.work-stealing": not args.no_stealing}


def place_evenly(client, x, wait):
    """x persisted with its row bands in even, contiguous runs, one run per worker (a
    scene split over the GPUs by rows); Dask alone placed these random bands 11/5,
    3/13 and 2/6 over two workers in earlier runs, and a run takes as long as its
    busiest GPU. Returns the persisted array."""
    import dask.array as da

    workers = sorted(client.scheduler_info()["workers"])
    edges = np.linspace(0, x.numblocks[0], len(workers) + 1).astype(int)
    parts = [client.persist(x.blocks[a:b], workers=[w], allow_other_workers=False)
             for w, a, b in zip(workers, edges[:-1], edges[1:], strict=True) if b > a]  # fmt: skip
    placed = da.concatenate(parts, axis=0).persist()
    wait(placed)
    return placed


def bands_per_worker(client, x) -> list[int]:
    held = collections.Counter(w for ws in client.who_has(x).values() for w in ws)
    return sorted(held.values())


def run_cluster(n: int, gpus: list[str], args, cupy, cluster_cls, client_cls, wait) -> dict:
    """{op: median seconds} with n workers on the first n GPUs."""
    import dask

    medians = {}
    with (
        dask.config.set(scheduler_config(args)),
        cluster_cls(CUDA_VISIBLE_DEVICES=",".join(gpus[:n]), protocol=args.protocol,
                    threads_per_worker=args.threads) as cluster,
        client_cls(cluster) as client,
    ):  # fmt: skip
        x = make_image(cupy, args.size, args.rows, args.host)
        if args.place == "even":
            x = place_evenly(client, x, wait)
        else:
            x = x.persist()
            wait(x)
        medians["bands per worker"] = bands_per_worker(client, x)
        for name, op in operations().items():
            sync = None if args.host else client
            medians[name] = statistics.median(time_dask(op, x, wait, args.reps, sync))
        del x
    return medians


def table(rows: list[dict], size: int) -> str:
    mpix = size * size / 1e6
    lines = [f"{'op':<16} {'GPUs':>5} {'median ms':>10} {'Mpix/s':>9} {'speedup':>8}"]
    for r in rows:
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
        lines.append(f"{r['op']:<16} {r['gpus']:>5} {r['median_s'] * 1e3:>10.1f} "
                     f"{mpix / r['median_s']:>9.0f} {speed:>8}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--gpus", default="1,2,4", help="GPU counts to run (comma-separated)")
    parser.add_argument("--size", type=int, default=16384, help="image side (pixels)")
    parser.add_argument("--rows", type=int, default=1024, help="rows per band (chunk)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--protocol", default="tcp", help="tcp, or ucx where installed")
    parser.add_argument("--host", action="store_true", help="NumPy bands in host memory")
    parser.add_argument("--threads", type=int, default=1,
                        help="task threads per worker (dask-cuda's default: 1)")  # fmt: skip
    parser.add_argument(
        "--no-stealing",
        action="store_true",
        help="turn Dask's work stealing off (measured slower: halo rows wait)",
    )
    parser.add_argument("--place", choices=("even", "dask"), default="even",
                        help="bands in even contiguous runs per worker, or where Dask puts "
                             "them")  # fmt: skip
    parser.add_argument("--no-whole", action="store_true",
                        help="skip the whole image on one GPU (too large for it)")  # fmt: skip
    args = parser.parse_args()
    cupy, cluster_cls, client_cls, wait = requirements()
    os.environ.setdefault("IMGFILTER_BACKGROUND_COMPILE", "0")  # workers compile at once
    gpus = visible_gpus(cupy)
    counts = [n for n in (int(c) for c in args.gpus.split(",")) if 1 <= n <= len(gpus)]
    if not counts:
        fail(f"none of --gpus {args.gpus} fits the {len(gpus)} visible GPU(s)")
    rows, base = [], {}
    for name, op in () if args.no_whole else operations().items():
        whole = statistics.median(time_whole(cupy, op, args.size, args.reps, args.host))
        rows.append({"op": name, "gpus": "1*", "median_s": whole, "dask": False})
    _release_device_memory(cupy)  # the workers share this process's first GPU
    for n in counts:
        medians = run_cluster(n, gpus, args, cupy, cluster_cls, client_cls, wait)
        for name in OPS:
            base.setdefault(name, medians[name] if n == 1 else None)
            speedup = base[name] / medians[name] if base[name] else None
            rows.append({"op": name, "gpus": n, "median_s": medians[name], "dask": True,
                         "speedup": speedup,
                         "bands_per_worker": medians["bands per worker"]})  # fmt: skip
    where = "NumPy bands in host memory" if args.host else "CuPy bands on the GPUs"
    print(f"{args.size}x{args.size}x3 uint8, {where}, bands of {args.rows} rows, {args.protocol}, "
          f"{args.threads} task thread(s) per worker"
          + ("" if args.no_whole else "; 1* = whole image on one GPU without Dask"))  # fmt: skip
    print(table(rows, args.size))
    placed = [f"{r['gpus']} GPU(s) {r['bands_per_worker']}" for r in rows
              if r["dask"] and r["op"] == OPS[0]]  # fmt: skip
    print("bands per worker: " + "; ".join(placed))
    if args.json:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        result = {
            "benchmark": "dask_scale",
            "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "gpus_visible": len(gpus),
            "image": [args.size, args.size, 3],
            "dtype": "uint8",
            "rows_per_band": args.rows,
            "bands_in": "host" if args.host else "gpu",
            "reps": args.reps,
            "protocol": args.protocol,
            "threads_per_worker": args.threads,
            "placement": args.place,
            "python": platform.python_version(),
            "results": rows,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
