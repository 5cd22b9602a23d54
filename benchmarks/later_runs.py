"""Wall time of later (warm-cache) CLI runs beside the cv2 one-liners doing the same I/O.

Each round runs every command once in a fresh process, in a shuffled order, so that a
slow spell of the machine falls on all of them alike; the table gives each command's
median and minimum over the rounds and its median's ratio to the one-liner it is
compared with. The kernel cache is warmed first (two runs of each imgfilter command).

    python benchmarks/later_runs.py --rounds 15 --json OUT/later.json --machine "H100 host"

`--gap S` waits S seconds before each command (a GPU command's context is torn down in
the background after it exits, see `imgfilter.backends.handoff`: with no gap the next
command meets that teardown). `--variant NAME=PYTHONPATH` (repeatable) adds every
imgfilter command once more, run with that PYTHONPATH and labelled [NAME]: an A/B of
two trees in the same rounds. `--only LABEL` (repeatable) runs only those commands and
the one-liners they are compared with: more rounds in the same time.

Needs the seed-size JPEG that `benchmarks/cli_setup.sh` makes (`--workdir`); the 21x21
kernel is made there if missing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def commands(work: Path) -> dict[str, tuple[list[str], str | None]]:
    """label -> (argv, label of the one-liner it is compared with)."""
    img, py = str(work / "in.jpg"), sys.executable
    cli = [py, "-m", "imgfilter"]
    blur_cv2 = f"import cv2; cv2.imwrite('{work}/cb.jpg', cv2.blur(cv2.imread('{img}'), (21, 21)))"
    filt_cv2 = (
        "import cv2, numpy as np; cv2.imwrite("
        f"'{work}/cf.jpg', cv2.filter2D(cv2.imread('{img}'), -1, np.load('{work}/k21.npy')))"
    )
    # contour: the gray image, four 3x3 edge filters, OR (imgfilter.backends.opencv.contour)
    edge_cv2 = (
        "import cv2, numpy as np; g = cv2.cvtColor(cv2.imread("
        f"'{img}'), cv2.COLOR_BGR2GRAY); k = np.array([[-1, 0, 1]] * 3, np.float32); "
        "e = [cv2.filter2D(g, -1, m) for m in (k, -k, k.T, -k.T)]; "
        f"cv2.imwrite('{work}/cc.png', e[0] | e[1] | e[2] | e[3])"
    )
    return {
        "cv2 blur one-liner": ([py, "-c", blur_cv2], None),
        "cv2 filter2D one-liner": ([py, "-c", filt_cv2], None),
        "cv2 contour one-liner": ([py, "-c", edge_cv2], None),
        "imgfilter blur --k 21": (
            [*cli, "blur", img, "--k", "21", "-o", f"{work}/b.jpg", "--force"],
            "cv2 blur one-liner",
        ),
        "imgfilter blur --k 21 --backend cuda": (
            [*cli, "blur", img, "--k", "21", "-o", f"{work}/b.jpg", "--force", "--backend", "cuda"],
            "cv2 blur one-liner",
        ),
        "imgfilter blur --k 21 --backend cpu": (
            [*cli, "blur", img, "--k", "21", "-o", f"{work}/b.jpg", "--force", "--backend", "cpu"],
            "cv2 blur one-liner",
        ),
        "imgfilter filter --kernel k21.npy": (
            [*cli, "filter", img, "--kernel", f"{work}/k21.npy", "-o", f"{work}/f.jpg", "--force"],
            "cv2 filter2D one-liner",
        ),
        "imgfilter contour": (
            [*cli, "contour", img, "-o", f"{work}/c.png", "--force"],
            "cv2 contour one-liner",
        ),
        "python -c pass": ([py, "-c", "pass"], None),
    }


def with_variants(
    cmds: dict[str, tuple[list[str], str | None]], variants: list[str]
) -> dict[str, tuple[list[str], str | None, dict[str, str] | None]]:
    """Every command with the default environment, and each imgfilter command again
    per variant NAME=PYTHONPATH with that PYTHONPATH."""
    out = {label: (argv, peer, None) for label, (argv, peer) in cmds.items()}
    for variant in variants:
        name, _, path = variant.partition("=")
        env = dict(os.environ, PYTHONPATH=path)
        for label, (argv, peer) in cmds.items():
            if label.startswith("imgfilter"):
                out[f"{label} [{name}]"] = (argv, peer, env)
    return out


def wall(argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    # From the work folder: `python -m` puts the current folder first on sys.path, which
    # in the tree would import the tree's imgfilter whatever PYTHONPATH a variant sets.
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=workdir)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="where cli_setup.sh put in.jpg")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, help="write the medians and every time here")
    parser.add_argument("--machine", default="", help="named in the JSON")
    parser.add_argument("--variant", action="append", default=[], help="NAME=PYTHONPATH")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only this command (a label of the table; repeatable) and its one-liner",
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds between commands (the previous one's CUDA context "
        "torn down before the next starts)",
    )
    args = parser.parse_args()
    kernel = args.workdir / "k21.npy"
    if not kernel.exists():
        rng = np.random.default_rng(0)
        np.save(kernel, rng.standard_normal((21, 21)).astype(np.float32) / 21)
    base = commands(args.workdir)
    if args.only:
        unknown = [label for label in args.only if label not in base]
        if unknown:
            parser.error(f"--only: no command labelled {unknown[0]!r} (see the table's labels)")
        keep = set(args.only) | {base[label][1] for label in args.only} - {None}
        base = {label: cmd for label, cmd in base.items() if label in keep}
    cmds = with_variants(base, args.variant)
    for label, (argv, _, env) in cmds.items():
        if label.startswith("imgfilter"):
            wall(argv, args.workdir, env), wall(argv, args.workdir, env)
    times: dict[str, list[float]] = {label: [] for label in cmds}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(cmds)
        rng.shuffle(order)
        for label in order:
            argv, _, env = cmds[label]
            time.sleep(args.gap)
            times[label].append(wall(argv, args.workdir, env))
    print(f"{'command':<46} {'median s':>9} {'min s':>7}  vs one-liner (medians)")
    rows = []
    for label, (_, peer, _) in cmds.items():
        med = statistics.median(times[label])
        ratio = med / statistics.median(times[peer]) if peer else None
        note = f"{ratio:.2f}x {peer}" if ratio else ""
        print(f"{label:<46} {med:9.3f} {min(times[label]):7.3f}  {note}")
        rows.append(
            {
                "command": label,
                "median_s": med,
                "min_s": min(times[label]),
                "ratio_to": peer,
                "ratio": ratio,
                "times_s": times[label],
            }
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": args.machine,
                    "rounds": args.rounds,
                    "gap_s": args.gap,
                    "variants": args.variant,
                    "rows": rows,
                },
                indent=1,
            )  # fmt: skip
        )


if __name__ == "__main__":
    main()
