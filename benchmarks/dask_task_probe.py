"""Where a many-files task's time goes: a local thread pool against Dask GPU workers.

Each task reads a JPEG (cv2.imread), blurs it on the GPU (imgfilter.blur, k=21) and
encodes it (cv2.imencode, quality 95), timing the three steps. Run on a local pool of
--threads threads, then on a LocalCUDACluster of 1, then 2, ... --gpus workers of
--threads threads each (a second pass with each worker's CPU affinity reset to every
CPU, in case dask-cuda's affinity narrowed it). Prints images/s and the median
milliseconds of each step per run, and each worker's affinity, cv2 threads and
CUDA_VISIBLE_DEVICES. Needs dask-cuda and a folder of JPEGs
(benchmarks/many_files_cv2.py --make DIR).

    python benchmarks/dask_task_probe.py /tmp/mf --gpus 2 --threads 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def task(path: str) -> tuple[float, float, float]:
    """(decode, GPU blur, encode) seconds of one file."""
    import cv2

    import imgfilter

    t0 = time.perf_counter()
    img = cv2.imread(path)
    t1 = time.perf_counter()
    out = imgfilter.blur(img, 21)
    t2 = time.perf_counter()
    cv2.imencode(".jpg", out, [cv2.IMWRITE_JPEG_QUALITY, 95])
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def info() -> tuple:
    """This process's CPU affinity (first CPUs, count), cv2 threads and visible GPUs."""
    import cv2

    cpus = sorted(os.sched_getaffinity(0))
    return cpus[:3], len(cpus), cv2.getNumThreads(), os.environ.get("CUDA_VISIBLE_DEVICES")


def all_cpus() -> int:
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return len(os.sched_getaffinity(0))


def report(label: str, results: list, seconds: float) -> None:
    ms = [statistics.median(r[i] for r in results) * 1e3 for i in range(3)]
    print(f"{label}: {len(results) / seconds:.1f} img/s; median ms decode {ms[0]:.1f} "
          f"gpu {ms[1]:.1f} encode {ms[2]:.1f}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    files = sorted(str(p) for p in args.src.glob("*.jpg"))
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(task, files[:16]))  # warm-up: imports, context, kernels
        t = time.perf_counter()
        report(f"local pool {args.threads} threads", list(pool.map(task, files)),
               time.perf_counter() - t)  # fmt: skip
    print("local info", info(), flush=True)
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    for n in range(1, args.gpus + 1):
        with (
            LocalCUDACluster(n_workers=n, threads_per_worker=args.threads) as cluster,
            Client(cluster) as client,
        ):
            print(n, "workers info", client.run(info), flush=True)
            client.gather(client.map(task, files[: 16 * n], pure=False))  # warm-up
            for label in ("", " all cpus"):
                if label:
                    print("affinity reset", client.run(all_cpus), flush=True)
                t = time.perf_counter()
                results = client.gather(client.map(task, files, pure=False))
                report(f"dask {n} workers x {args.threads}{label}", results,
                       time.perf_counter() - t)  # fmt: skip


if __name__ == "__main__":
    main()
