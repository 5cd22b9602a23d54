"""TIFFs of every size: `imgfilter.read_image` (imgfilter.tiff.read for strips) beside
`cv2.imread`, in one process, the two alternating.

For each size and compression (none, LZW, Deflate: OpenCV's own TIFFs of the sample
photo resized, 8-bit RGB), reads the file --reps times with each and prints the
medians and their ratio; checks that both give the same pixels. Below
`imgfilter.io.TIFF_THREADS_MIN_BYTES` imgfilter decodes on the calling thread, from it
on a pool of threads.

    python benchmarks/tiff_read_sizes.py [--reps 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

import imgfilter

SIZES = ((512, 512), (1000, 800), (2495, 2167), (4000, 3000), (8000, 6000))
COMPRESSIONS = {"none": 1, "LZW": 5, "Deflate": 8}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--machine", default="", help="the machine, in words, for the JSON")
    args = parser.parse_args()
    photo = cv2.imread(str(Path(__file__).parents[1] / "samples" / "astronaut.jpg"))
    rows = []
    print(f"{'image':<11} {'compression':<11} {'file MB':>8} {'imgfilter ms':>13} "
          f"{'cv2.imread ms':>14} {'ratio':>6}")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for w, h in SIZES:
            img = cv2.resize(photo, (w, h))
            for name, code in COMPRESSIONS.items():
                path = os.path.join(folder, f"{w}x{h}-{name}.tif")
                cv2.imwrite(path, img, [cv2.IMWRITE_TIFF_COMPRESSION, code])
                ours, theirs = [], []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    a = imgfilter.read_image(path)
                    t1 = time.perf_counter()
                    b = cv2.imread(path, cv2.IMREAD_UNCHANGED)
                    t2 = time.perf_counter()
                    ours.append(t1 - t0)
                    theirs.append(t2 - t1)
                if not np.array_equal(a, b):
                    raise SystemExit(f"{path}: imgfilter and OpenCV read different pixels")
                mb = os.path.getsize(path) / 1e6
                o, t = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
                print(f"{w}x{h:<6} {name:<11} {mb:8.2f} {o:13.1f} {t:14.1f} {o / t:6.2f}")
                rows.append({"size": f"{w}x{h}", "compression": name, "file_mb": mb,
                             "imgfilter_ms": o, "cv2_ms": t, "ratio": o / t})  # fmt: skip
    if args.json:
        info = {"machine": args.machine or platform.node(), "cpus": os.cpu_count(),
                "opencv": cv2.__version__, "reps": args.reps, "rows": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
