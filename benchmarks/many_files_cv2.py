"""Many files: `imgfilter blur DIR --out-dir OUT` next to a plain cv2 thread-pool script.

The baseline is what a user would write: a ThreadPoolExecutor of --jobs threads, each
doing cv2.imread -> cv2.blur(k) -> cv2.imwrite (JPEG quality 95, as imgfilter writes)
for one file. imgfilter runs as the command a user types, in a subprocess:
`imgfilter blur DIR --k K --backend B --out-dir OUT -j N -f -q`. Both are timed warm
(each run once first; the files are in the page cache); images/s is files / wall
seconds, the median of --reps runs. imgfilter's figure includes starting Python and
importing its modules (about a second); its own summary line, printed too, gives the
pipeline's rate without them.

    PYTHONPATH=$PWD python benchmarks/many_files_cv2.py --make /tmp/mf --count 200 --size 512
    PYTHONPATH=$PWD python benchmarks/many_files_cv2.py /tmp/mf --k 5 --backend cpu
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np


def make(directory: Path, count: int, size: int, height: int | None = None) -> None:
    """`count` JPEGs of `height` x `size` pixels (height defaults to size; quality 95):
    a smooth random field with noise, so they compress like photos rather than like
    white noise."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    height = height or size
    for i in range(count):
        small = rng.integers(0, 256, (height // 16, size // 16, 3), dtype=np.uint8)
        img = cv2.resize(small, (size, height), interpolation=cv2.INTER_CUBIC)
        img = cv2.add(img, rng.integers(0, 12, img.shape, dtype=np.uint8))
        cv2.imwrite(str(directory / f"img{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 95])


def cv2_pool(files: list[Path], out: Path, k: int, jobs: int, kernel: np.ndarray | None = None,
             codec_only: bool = False) -> float:  # fmt: skip
    """Seconds for a ThreadPoolExecutor of `jobs` threads to read, filter (cv2.blur k,
    or cv2.filter2D of `kernel`; nothing with codec_only) and write every file."""

    def one(p: Path) -> None:
        img = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
        if codec_only:
            res = img
        elif kernel is None:
            res = cv2.blur(img, (k, k))
        else:
            res = cv2.filter2D(img, -1, kernel, borderType=cv2.BORDER_REFLECT_101)
        cv2.imwrite(str(out / f"{p.stem}.out.jpg"), res, [cv2.IMWRITE_JPEG_QUALITY, 95])

    start = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, files))
    return time.perf_counter() - start


def imgfilter_cli(src: Path, out: Path, k: int, jobs: int, backend: str,
                  kernel_file: Path | None = None) -> tuple[float, str]:  # fmt: skip
    """(wall seconds, summary line) of `imgfilter blur` (or `filter --kernel`) on src."""
    op = ["blur", str(src), "--k", str(k)]
    if kernel_file is not None:
        op = ["filter", str(src), "--kernel", str(kernel_file)]
    cmd = [sys.executable, "-m", "imgfilter", *op, "--backend", backend, "--out-dir", str(out),
           "-j", str(jobs), "-f"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"imgfilter failed ({proc.returncode}): {proc.stderr.strip()}")
    return seconds, proc.stderr.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", nargs="?", type=Path, help="directory of images")
    ap.add_argument("--make", type=Path, metavar="DIR", help="write test JPEGs here and exit")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--size", type=int, default=512, help="width (and height) of --make's")
    ap.add_argument("--height", type=int, help="height of --make's images (default: --size)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--filter", action="store_true",
                    help="a random k x k filter2D instead of a k x k blur")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    if args.make is not None:
        make(args.make, args.count, args.size, args.height)
        print(f"wrote {args.count} {args.height or args.size}x{args.size} JPEGs to {args.make}")
        return 0
    if args.src is None or not args.src.is_dir():
        ap.error("give a directory of images (or --make DIR to write some)")
    files = sorted(p for p in args.src.iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        ap.error(f"no JPEGs in {args.src}")
    n = len(files)
    work = Path(tempfile.mkdtemp(prefix="many_files_"))
    kernel = kernel_file = None
    if args.filter:
        kernel = np.random.default_rng(1).standard_normal((args.k, args.k)).astype(np.float32)
        kernel /= args.k * args.k
        kernel_file = work / "kernel.npy"
        np.save(kernel_file, kernel)
    try:
        cv2_pool(files, work, args.k, args.jobs, kernel)  # warm
        ours_warm = imgfilter_cli(args.src, work / "ours", args.k, args.jobs, args.backend,
                                  kernel_file)  # fmt: skip
        cv_times, codec_times, our_times, summaries = [], [], [], [ours_warm[1]]
        for _ in range(args.reps):
            cv_times.append(cv2_pool(files, work, args.k, args.jobs, kernel))
            codec_times.append(cv2_pool(files, work, args.k, args.jobs, codec_only=True))
            seconds, summary = imgfilter_cli(args.src, work / "ours", args.k, args.jobs,
                                             args.backend, kernel_file)  # fmt: skip
            our_times.append(seconds)
            summaries.append(summary)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cv_s, codec_s = statistics.median(cv_times), statistics.median(codec_times)
    our_s = statistics.median(our_times)
    what = f"random {args.k}x{args.k} filter2D" if args.filter else f"blur k={args.k}"
    print(f"{n} files, {what}, --jobs {args.jobs}, cv2 threads {cv2.getNumThreads()}, "
          f"{os.cpu_count()} CPUs, median of {args.reps}")  # fmt: skip
    print(f"  cv2 thread pool, decode + encode only {n / codec_s:8.1f} images/s  ({codec_s:.2f} s)")
    print(f"  cv2 thread pool          {n / cv_s:8.1f} images/s  ({cv_s:.2f} s)")
    print(f"  imgfilter ({args.backend}, command) {n / our_s:8.1f} images/s  ({our_s:.2f} s, "
          "incl. Python start and imports)")  # fmt: skip
    print(f"  imgfilter's own summary: {summaries[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
