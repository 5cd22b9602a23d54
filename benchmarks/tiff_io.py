"""Large TIFF files: OpenCV's classic LZW TIFF against imgfilter's BigTIFF (imgfilter.tiff).

For a --size x --size x 3 uint8 image (a random pattern blurred with a 9x9 box, so it
compresses somewhat as a photo does, or --noise: incompressible), times writing it
with `cv2.imencode(".tif", LZW)` + write (what imgfilter did for every TIFF) and with
`imgfilter.tiff.write` (Deflate strips on every CPU), and reading each file back with
`imgfilter.read_image` and with `cv2.imread`; prints seconds, MB/s of image bytes and
file sizes, and checks that both read back equal. Files go to --dir (default: a
temporary directory).

    python benchmarks/tiff_io.py [--size 20000] [--noise] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import imgfilter  # before cv2: it raises OpenCV's pixel limit for 40000^2 images
from imgfilter import tiff

# isort: split
import cv2


def make_image(size: int, noise: bool) -> np.ndarray:
    """A size x size x 3 uint8 image, built from one 1000-row block repeated."""
    rows = min(size, 1000)
    block = np.random.default_rng(0).integers(0, 256, (rows, size, 3), dtype=np.uint8)
    if not noise:
        block = cv2.blur(block, (9, 9))
    return np.ascontiguousarray(np.resize(block, (size, size, 3)))


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def write_opencv(path: Path, img: np.ndarray) -> bool:
    ok, buf = cv2.imencode(".tif", img, [cv2.IMWRITE_TIFF_COMPRESSION, 5])
    if ok:
        with open(path, "wb") as f:
            f.write(buf)
    return bool(ok)


def write_bigtiff(path: Path, img: np.ndarray) -> bool:
    with open(path, "wb") as f:
        tiff.write(f, img)
    return True


def describe(row: dict, mb: float) -> str:
    """One table line's text: the write and the read of one writer's file."""
    if not row["written"]:
        return f"write failed after {row['write_s']:.1f} s"
    text = (f"write {row['write_s']:6.1f} s ({mb / row['write_s']:5.0f} MB/s), "
            f"file {row['file_mb']:.0f} MB; ")  # fmt: skip
    opencv = (f"; cv2.imread {row['opencv_read_s']:6.1f} s, equal {row['opencv_equal']}"
              if "opencv_read_s" in row else "")  # fmt: skip
    if "read_s" not in row:
        return text + row["read_error"] + opencv
    return text + (f"read {row['read_s']:6.1f} s ({mb / row['read_s']:5.0f} MB/s), "
                   f"equal {row['equal']}") + opencv  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=20000)
    parser.add_argument("--noise", action="store_true", help="incompressible pixels")
    parser.add_argument("--dir", help="where the files go (default: a temporary directory)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--machine", default="", help="the machine, in words, for the JSON")
    args = parser.parse_args()
    img = make_image(args.size, args.noise)
    mb = img.nbytes / 1e6
    kind = "noise" if args.noise else "blurred noise"
    print(f"{args.size}x{args.size}x3 uint8 ({mb:.0f} MB, {kind}), {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for name, write in (
            ("OpenCV LZW TIFF", write_opencv),
            ("imgfilter BigTIFF", write_bigtiff),
        ):
            path = Path(folder) / f"{name.split()[0]}.tif"
            seconds, ok = timed(lambda: write(path, img))  # noqa: B023 - called at once
            row = {"writer": name, "write_s": seconds, "written": ok}
            if ok:
                row["file_mb"] = path.stat().st_size / 1e6
                try:
                    row["read_s"], back = timed(lambda: imgfilter.read_image(path))  # noqa: B023
                    row["equal"] = bool(np.array_equal(back, img))
                    del back
                except imgfilter.InputError as e:
                    row["read_error"] = str(e)
                # The same file through OpenCV's reader (one thread), for comparison
                row["opencv_read_s"], back = timed(
                    lambda: cv2.imread(str(path), cv2.IMREAD_UNCHANGED)  # noqa: B023
                )
                row["opencv_equal"] = back is not None and bool(np.array_equal(back, img))
                del back
                path.unlink()
            rows.append(row)
            print(f"{name:<18} {describe(row, mb)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "tiff_io", "machine": args.machine, "size": args.size,
                       "noise": args.noise,
                       "cpus": os.cpu_count(), "python": platform.python_version(),
                       "opencv": cv2.__version__, "results": rows}, f, indent=2)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
