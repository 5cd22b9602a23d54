"""Where one image's blur is quicker on the CPU than on the GPU, whole command included.

`imgfilter blur --backend auto` runs a blur of one image on the CPU up to
`warmup.cpu_limit("blur")` (file and pixels). This times `imgfilter blur --k 21` of
one JPEG per size with `--backend cpu`, `--backend cuda` and `auto`, each in a fresh
process, in shuffled rounds (a slow spell of the machine falls on all alike), beside the
cv2 one-liner doing the same I/O, and prints the medians:

    python benchmarks/blur_one_image.py --workdir /tmp/w --rounds 7 --json OUT/blur.json

The JPEGs are the sample photo resized (to 2495x2167 and the other sizes), quality 95.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import cv2
from later_runs import wall

SIZES = ((2495, 2167), (3840, 2160), (6000, 4000), (7680, 4320), (12000, 8000), (16000, 12000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--machine", default="")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    photo = cv2.imread(str(Path(__file__).parents[1] / "samples" / "astronaut.jpg"))
    py = sys.executable
    cmds: dict[tuple[str, str], list[str]] = {}
    sizes = {}
    for w, h in SIZES:
        img = args.workdir / f"in-{w}x{h}.jpg"
        cv2.imwrite(str(img), cv2.resize(photo, (w, h)), [cv2.IMWRITE_JPEG_QUALITY, 95])
        size = f"{w}x{h}"
        sizes[size] = (img.stat().st_size, w * h * 3)
        out = args.workdir / f"out-{size}.jpg"
        base = [py, "-m", "imgfilter", "blur", str(img), "--k", "21", "-o", str(out), "--force"]
        for backend in ("auto", "cpu", "cuda"):
            cmds[(size, backend)] = [*base, "--backend", backend]
        cmds[(size, "cv2 one-liner")] = [
            py, "-c",
            f"import cv2; cv2.imwrite('{out}', cv2.blur(cv2.imread('{img}'), (21, 21)))",
        ]  # fmt: skip
    for argv in cmds.values():  # warm the kernel cache and the page cache
        wall(argv, args.workdir)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in cmds}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(cmds)
        rng.shuffle(order)
        for key in order:
            times[key].append(wall(cmds[key], args.workdir))
    columns = ("cv2 one-liner", "auto", "cpu", "cuda")
    head = "  ".join(f"{c:>13}" for c in columns)
    print(f"{'image':<11} {'file MB':>7} {'pixels MB':>9}  {head}")
    rows = []
    for size, (file_bytes, pixel_bytes) in sizes.items():
        med = {c: statistics.median(times[(size, c)]) for c in columns}
        cells = "  ".join(f"{med[c]:11.3f} s" for c in columns)
        print(f"{size:<11} {file_bytes / 1e6:7.1f} {pixel_bytes / 1e6:9.1f}  {cells}")
        rows.append(
            {"size": size, "file_bytes": file_bytes, "pixel_bytes": pixel_bytes,
             "median_s": med, "times_s": {c: times[(size, c)] for c in columns}}
        )  # fmt: skip
    if args.json:
        args.json.write_text(
            json.dumps({"machine": args.machine, "rounds": args.rounds, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
