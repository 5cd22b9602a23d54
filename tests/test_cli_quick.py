"""`imgfilter.cli.quick`: the common blur/filter/contour command lines parsed without
Typer give the command exactly what Typer gives it, and anything else goes to Typer.

For thousands of generated command lines (options in any order, long, short and `=`
forms, good and bad values, repeats, help, unknown options), `quick.parse` returns
either None or the very options Typer passes `filtering.run`; where Typer refuses a
command line, `parse` returns None (Typer then reports it). The README's command lines
are taken by `parse`. A command run through `quick` does not import Typer and ends as
the Typer command does: same output bytes, same lines, same exit status.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_cli import REPO, SOBEL, run

from imgfilter.api import METHODS
from imgfilter.cli import filtering, quick

OWN = {
    "blur": [["--k", "21"], ["-k", "3"], ["--k=5"], ["--k", "0"], ["--k", "4095"],
             ["--k", "4096"], ["--k", "abc"], ["-k21"], ["-k=5"], ["--k", "+3"],
             ["--k", " 7"], ["--k", "1_1"], ["--k", "\u0663"], ["--k", "007"], ["--k"]],
    "filter": [["--kernel", SOBEL], ["--kernel=1,1;1,1"], ["--kernel", "--force"],
               ["--kernel", "k.npy"], ["--kernel", ""], ["--normalize"], ["--normalize=1"],
               ["--kernel"]],
    "contour": [],
}  # fmt: skip
COMMON = [
    ["-o", "out.png"], ["--output", "o.jpg"], ["--output=o.jpg"], ["-o", "-x.png"],
    ["-o", ""], ["--border", "WRAP"], ["--border=constant"], ["--border", "nope"],
    ["--border", "Reflect101"], ["--border-value", "1.5"], ["--border-value", "nan"],
    ["--border-value", "x"], ["--border-value", "-3"], ["--border-value=1e3"],
    ["--border-value", " 2 "], ["--backend", "CPU"], ["--backend", "cuda"],
    ["--backend", "gpu"], ["--method", "auto"], ["--method", METHODS[-1]],
    ["--method", "bogus"], ["--max-gpu-memory", "2G"], ["--max-gpu-memory=x"],
    ["--out-dir", "d"], ["--out-dir=d/e"], ["--name", "{stem}.x{ext}"], ["-r"],
    ["--recursive"], ["--recursive=1"], ["-j", "4"], ["--jobs", "0"], ["--jobs", "300"],
    ["-j", "+3"], ["-j4"], ["--jobs=256"], ["--quality", "90"], ["--quality", "101"],
    ["--quality", "007"], ["--quality", "1_0"], ["--quality", "0"], ["--keep-metadata"],
    ["-f"], ["--force"], ["--skip-existing"], ["-q"], ["--quiet"], ["--debug"], ["-fq"],
    ["--gpus", "2"], ["--scheduler", "tcp://x:1"], ["--help"], ["-h"], ["--"], ["-"],
    ["--unknown"], ["-z"], ["--force=yes"],
]  # fmt: skip
INPUTS = ["a.png", "dir/b.jpg", "photos/*.jpg", "-5", "", "x y.tif"]


def typer_options(argv: list[str], monkeypatch) -> dict | None:
    """What Typer passes `filtering.run` for `argv` (op and options), or None where it
    refuses the command line."""
    from imgfilter.cli.typer_app import app

    got: list = []
    monkeypatch.setattr(filtering, "run", lambda op, options: got.append((op, options)))
    try:
        app(args=argv, prog_name="imgfilter")
    except SystemExit:
        pass
    return got[0] if got else None


def _comparable(parsed: tuple[str, dict] | None):
    """`parsed` with NaN values (--border-value nan) as a string, which compares equal."""
    if parsed is None:
        return None
    op, options = parsed
    return op, {k: "nan" if isinstance(v, float) and v != v else v for k, v in options.items()}


def command_lines(op: str, count: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    own, lines = OWN[op], []
    for _ in range(count):
        pieces = [[w] for w in rng.sample(INPUTS, rng.choice([0, 1, 1, 1, 2]))]
        pieces += rng.sample(COMMON, rng.choice([0, 1, 2, 3, 4]))
        if own and rng.random() < 0.9:
            pieces += [own[0]] if rng.random() < 0.6 else rng.sample(own, rng.choice([1, 2]))
        if rng.random() < 0.1 and pieces:
            pieces.append(rng.choice(pieces))  # an option (or input) given twice
        rng.shuffle(pieces)
        lines.append([op, *(w for piece in pieces for w in piece)])
    return lines


@pytest.mark.parametrize("op", ["blur", "filter", "contour"])
def test_parse_gives_what_typer_gives_or_nothing(op, monkeypatch, capsys):
    taken = refused = 0
    for argv in command_lines(op, 700, seed=len(op)):
        mine = quick.parse(argv)
        theirs = typer_options(argv, monkeypatch)
        if mine is not None:
            assert theirs is not None, ("quick takes what Typer refuses", argv)
            assert _comparable(mine) == _comparable(theirs), argv
            taken += 1
        refused += theirs is None
    capsys.readouterr()
    # The corpus has both kinds in numbers, so the comparison means something.
    assert taken >= 100 and refused >= 100, (taken, refused)


README_LINES = [
    ["blur", "photo.jpg", "--k", "21"],
    ["blur", "samples/astronaut.jpg", "--k", "21", "-o", "astronaut.blur.jpg", "--force"],
    ["filter", "photo.jpg", "--kernel", SOBEL, "-o", "edges.png"],
    ["filter", "photo.jpg", "--kernel", "1 2 1; 2 4 2; 1 2 1", "--normalize"],
    ["contour", "photo.jpg", "--backend", "cpu"],
    ["blur", "photos/", "--recursive", "--k", "5", "--out-dir", "blurred"],
    ["contour", "scans/*.png", "--out-dir", "edges", "-j", "4"],
    ["blur", "scene.tif", "--k", "21", "--max-gpu-memory", "2G", "-o", "out.tif"],
]


@pytest.mark.parametrize("argv", README_LINES, ids=lambda a: " ".join(a)[:40])
def test_the_usual_command_lines_are_taken_as_typer_takes_them(argv, monkeypatch):
    assert quick.parse(argv) is not None
    assert quick.parse(argv) == typer_options(argv, monkeypatch)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--help"],
        ["--version"],
        ["compare", "a.png", "--k", "3"],
        ["blur", "a.png"],  # --k missing
        ["filter", "a.png"],  # --kernel missing
        ["blur", "--k", "3"],  # no input
        ["blur", "a.png", "--k", "3", "--help"],
        ["blur", "a.png", "--k", "3", "--gpus", "2"],
        ["blur", "a.png", "--k", "3", "--k", "5"],
        ["blur", "a.png", "--kernel", "1"],  # another command's option
        ["contour", "a.png", "--k", "3"],
    ],
)
def test_other_command_lines_go_to_typer(argv):
    assert quick.parse(argv) is None


def test_the_completion_environment_goes_to_typer(monkeypatch):
    monkeypatch.setenv("_IMGFILTER_COMPLETE", "bash_complete")
    assert quick.parse(["blur", "a.png", "--k", "3"]) is None


def _typer_run(*args) -> tuple[int, str]:
    """`imgfilter ARGS` through Typer alone: exit status, stderr."""
    from typer.testing import CliRunner

    from imgfilter.cli.typer_app import app

    result = CliRunner().invoke(app, [str(a) for a in args], prog_name="imgfilter")
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    "extra",
    [
        ["blur", "--k", "7"],
        ["filter", "--kernel", SOBEL, "--border", "wrap"],
        ["contour", "--quiet"],
        ["blur", "--k", "3", "--border-value", "2"],  # a usage error of the command
        ["blur", "--k", "3", "--quality", "50", "-o", "{out}.png"],  # quality for a PNG
    ],
)
def test_a_quick_run_ends_as_the_typer_run(extra, tmp_path):
    """The same command line through quick (cli.main) and through Typer: the same
    output bytes, the same stderr lines (the timings aside) and exit status."""
    img = np.random.default_rng(5).integers(0, 256, (37, 29, 3), dtype=np.uint8)
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), img)
    results = []
    for way, name in (("quick", "one"), ("typer", "two")):
        out = tmp_path / f"{name}.png"
        args = [extra[0], src, *[w.replace("{out}", str(tmp_path / name)) for w in extra[1:]]]
        if "-o" not in extra:
            args += ["-o", out]
        args += ["--backend", "cpu"]
        if way == "quick":
            assert quick.parse([str(a) for a in args]) is not None
            ran = run(*args)
            code, err = ran.exit_code, ran.stderr
        else:
            code, err = _typer_run(*args)
        lines = [line.split(", filtered in")[0].replace(name, "OUT") for line in err.splitlines()]
        data = out.read_bytes() if out.exists() else None
        results.append((code, lines, data))
    assert results[0] == results[1]
    assert results[0][0] != 0 or results[0][2] is not None


def test_a_quick_command_does_not_import_typer(tmp_path):
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), np.full((9, 11, 3), 7, np.uint8))
    code = (
        "import sys\n"
        "from imgfilter import cli\n"
        "try:\n"
        f"    cli.main(['blur', {str(src)!r}, '--k', '3', '--backend', 'cpu', '-q'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('TYPER', sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'click')))\n"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "TYPER []" in proc.stdout, proc.stdout
    assert Path(tmp_path / "in.blur.png").exists()
