"""Tiled TIFFs (as GeoTIFF / COG scenes are laid out): `imgfilter.read_image`, which
decodes the tiles on a pool of threads (imgfilter.tiff.read), beside `cv2.imread`
(libtiff, one thread), in one process, the two alternating.

The files are the sample photo resized, 8-bit RGB, in square tiles (512 by default, as
GDAL writes COGs), Deflate with horizontal differencing or uncompressed, written here
(OpenCV and Pillow write no tiles). Prints the medians and their ratio and checks that
both readers give the same pixels.

    python benchmarks/tiff_tiles.py [--sizes 4000x3000,8000x6000] [--tile 512] [--reps 5]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import struct
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

import imgfilter

COMPRESSIONS = {"Deflate": 8, "none": 1}


def write_tiled(path: str, img: np.ndarray, tile: int, compression: int) -> None:
    """A classic little-endian TIFF of the BGR image `img` in RGB tiles of `tile` x
    `tile` pixels (zero-padded at the right and bottom edges); Deflate tiles with
    horizontal differencing (Predictor 2), as GDAL's defaults for COGs."""
    h, w, s = img.shape
    rgb = img[:, :, ::-1]
    corners = [(y, x) for y in range(0, h, tile) for x in range(0, w, tile)]

    def encode(corner: tuple[int, int]) -> bytes:
        y, x = corner
        block = np.zeros((tile, tile, s), np.uint8)
        part = rgb[y : y + tile, x : x + tile]
        block[: part.shape[0], : part.shape[1]] = part
        if compression == 1:
            return block.tobytes()
        block[:, 1:] -= block[:, :-1].copy()
        return zlib.compress(block.tobytes(), 6)

    with ThreadPoolExecutor() as pool:
        tiles = list(pool.map(encode, corners))
    offsets, at = [], 8
    for data in tiles:
        offsets.append(at)
        at += len(data)
    arrays_at = at
    fields = {256: (4, [w]), 257: (4, [h]), 258: (3, [8] * s), 259: (3, [compression]),
              262: (3, [2]), 277: (3, [s]), 284: (3, [1]), 322: (4, [tile]),
              323: (4, [tile]), 324: (4, offsets), 325: (4, [len(t) for t in tiles])}  # fmt: skip
    if compression != 1:
        fields[317] = (3, [2])
    arrays, entries = b"", b""
    for tag, (kind, values) in sorted(fields.items()):
        packed = struct.pack("<" + {3: "H", 4: "I"}[kind] * len(values), *values)
        if len(packed) > 4:
            value = struct.pack("<I", arrays_at + len(arrays))
            arrays += packed
        else:
            value = packed.ljust(4, b"\0")
        entries += struct.pack("<HHI", tag, kind, len(values)) + value
    ifd_at = arrays_at + len(arrays)
    ifd_at += ifd_at % 2
    with open(path, "wb") as f:
        f.write(b"II" + struct.pack("<HI", 42, ifd_at))
        for data in tiles:
            f.write(data)
        f.write(arrays + b"\0" * (ifd_at - arrays_at - len(arrays)))
        f.write(struct.pack("<H", len(fields)) + entries + struct.pack("<I", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4000x3000,8000x6000", help="WxH,WxH,...")
    parser.add_argument("--tile", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--machine", default="", help="the machine, in words, for the JSON")
    args = parser.parse_args()
    photo = cv2.imread(str(Path(__file__).parents[1] / "samples" / "astronaut.jpg"))
    rows = []
    print(f"{'image':<12} {'tiles':<8} {'file MB':>8} {'imgfilter ms':>13} "
          f"{'cv2.imread ms':>14} {'ratio':>6}")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes.split(","):
            w, h = map(int, size.split("x"))
            img = cv2.resize(photo, (w, h))
            for name, code in COMPRESSIONS.items():
                path = os.path.join(folder, f"{size}-{name}.tif")
                write_tiled(path, img, args.tile, code)
                ours, theirs = [], []
                for _ in range(args.reps):
                    t = time.perf_counter()
                    a = imgfilter.read_image(path)
                    ours.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    b = cv2.imread(path, cv2.IMREAD_UNCHANGED)
                    theirs.append(time.perf_counter() - t)
                    if not np.array_equal(a, b) or not np.array_equal(a, img):
                        raise SystemExit(f"{path}: the readers disagree")
                    del a, b
                mb = os.path.getsize(path) / 1e6
                o, c = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
                print(f"{size:<12} {name:<8} {mb:8.1f} {o:13.1f} {c:14.1f} {o / c:6.2f}")
                rows.append({"image": size, "tile": args.tile, "compression": name,
                             "file_mb": mb, "imgfilter_ms": o, "cv2_imread_ms": c,
                             "ratio": o / c})  # fmt: skip
    if args.json:
        doc = {"machine": args.machine or platform.node(), "cpus": os.cpu_count(),
               "reps": args.reps, "opencv": cv2.__version__, "rows": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
