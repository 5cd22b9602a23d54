"""What the `imgfilter blur` command's read of its input costs, alone and beside the
command's imports, against cv2.imread: fresh processes, the seed-size JPEG.

    python benchmarks/read_overlap_probe.py IMG.jpg [--rounds 8]

Each measurement is a fresh process that imports NumPy, OpenCV and imgfilter.io (as
`imgfilter.prefetch` does before its read starts) and then reads IMG one way:
`imread` (cv2.imread in the main thread, as the one-liner does), `imdecode`
(np.fromfile + cv2.imdecode), `frames` (io.read_frames, the command's read, in the main
thread), `thread` (io.read_frames in a thread, the main thread waiting, with the
prefetch's switch interval), `thread+imports` (the same while the main thread imports
what the command imports next: imgfilter.cli.quick, .filtering, the CPU backend),
`thread+python` (the same while the main thread runs Python for 25 ms),
`thread+native` (... while the main thread hashes for 25 ms, the GIL released).
Prints medians in ms: the read, and for the last the imports.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time

WAYS = (
    "imread",
    "imdecode",
    "frames",
    "thread",
    "thread+imports",
    "thread+python",
    "thread+native",
)


def child(way: str, path: str) -> dict:
    import threading
    from pathlib import Path

    import cv2
    import numpy as np

    from imgfilter import io, prefetch

    got: dict = {}
    decode = cv2.imdecode

    def timed_decode(*args):
        t = time.perf_counter()
        try:
            return decode(*args)
        finally:
            got["imdecode"] = (time.perf_counter() - t) * 1e3

    cv2.imdecode = timed_decode
    t0 = time.perf_counter()
    if way == "imread":
        cv2.imread(path)
    elif way == "imdecode":
        cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_UNCHANGED)
    elif way == "frames":
        io.read_frames(Path(path))
    else:

        def read() -> None:
            sys.setswitchinterval(float(os.environ.get("SWITCH_S", prefetch.SWITCH_INTERVAL_S)))
            io.read_frames(Path(path))
            got["read"] = (time.perf_counter() - t0) * 1e3

        t = threading.Thread(target=read)
        t.start()
        if way == "thread+imports":
            import imgfilter.backends.cpu  # noqa: F401
            import imgfilter.cli.filtering  # noqa: F401
            import imgfilter.cli.quick  # noqa: F401

            got["imports"] = (time.perf_counter() - t0) * 1e3
        elif way == "thread+native":
            import hashlib

            block = bytes(1 << 20)
            while time.perf_counter() - t0 < 0.025:
                hashlib.sha256(block)  # releases the GIL while it hashes
        elif way == "thread+python":
            n = 0
            while time.perf_counter() - t0 < 0.025:
                n += 1
        t.join()
        return got
    return {**got, "read": (time.perf_counter() - t0) * 1e3}


def main() -> None:
    if sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
        return
    path = sys.argv[1]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    got: dict[str, list[dict]] = {w: [] for w in WAYS}
    for _ in range(rounds):
        for way in random.sample(WAYS, len(WAYS)):
            out = subprocess.run([sys.executable, __file__, "--child", way, path],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            got[way].append(json.loads(out.stdout))
            time.sleep(0.2)
    for way, runs in got.items():
        keys = runs[0].keys()
        print(f"{way:<16}" + "  ".join(
            f"{k} {statistics.median(r[k] for r in runs):6.1f}" for k in keys))  # fmt: skip


if __name__ == "__main__":
    main()
