"""Many files in one command (issue 27, section 1): `imgfilter blur|filter|contour` take
files, patterns and directories, write through a bounded decode/filter/encode pipeline,
report each bad file on one line and go on, and end with a summary and an exit code.

Runs through Typer's CliRunner (in process, `--backend cpu`) and, for the exit codes,
the progress bar and Ctrl-C, as `python -m imgfilter` in a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from imgfilter import cli, files
from imgfilter import io as iio

REPO = Path(__file__).resolve().parents[1]
SOBEL = "-1,0,1;-2,0,2;-1,0,1"
runner = CliRunner()

OPS = {
    "blur": ["--k", "5"],
    "filter": ["--kernel", SOBEL],
    "contour": [],
}


def run(*args: str | Path):
    return runner.invoke(cli.app, [str(a) for a in args])


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["NUMBA_NUM_THREADS"] = "2"
    env.update(extra)
    return env


def module(*args: str | Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "imgfilter", *map(str, args)],
        capture_output=True, text=True, env=_env(**env), timeout=300,
    )  # fmt: skip


def imwrite(path: Path, img: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), img), path
    return path


def imread(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return img


def random_image(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def make_tree(root: Path) -> list[Path]:
    """in/ with JPEGs and PNGs (colour and gray) and a subdirectory two levels deep."""
    paths = []
    for i in range(4):
        paths.append(imwrite(root / f"c{i}.jpg", random_image((40 + i, 50, 3), i)))
    paths.append(imwrite(root / "g.png", random_image((33, 31), 10)))
    paths.append(imwrite(root / "sub" / "s.png", random_image((30, 30, 3), 11)))
    paths.append(imwrite(root / "sub" / "deeper" / "d.jpg", random_image((20, 24, 3), 12)))
    (root / "notes.txt").write_text("not an image")  # left alone in a directory
    return paths


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def no_temp_files(root: Path) -> bool:
    return not [p for p in root.rglob("*") if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------ results


@pytest.mark.parametrize("op", sorted(OPS))
def test_tree_equals_the_single_file_command_and_mirrors_the_tree(tmp_path, op):
    src = tmp_path / "in"
    inputs = make_tree(src)
    result = run(op, src, "--recursive", *OPS[op], "--backend", "cpu", "--out-dir",
                 tmp_path / "out", "-j", "3")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert lines(result.stderr)[-1].startswith(
        f"imgfilter: {len(inputs)} written, 0 skipped, 0 failed"
    )
    written = sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*.*"))
    expected = sorted(p.relative_to(src).with_name(iio.default_output(p, op).name) for p in inputs)
    assert written == expected
    (tmp_path / "ref").mkdir()
    for p in inputs:
        ref = tmp_path / "ref" / iio.default_output(p, op).name
        one = run(op, p, *OPS[op], "--backend", "cpu", "-o", ref, "-f")
        assert one.exit_code == 0, one.output
        got = tmp_path / "out" / p.relative_to(src).with_name(ref.name)
        np.testing.assert_array_equal(imread(got), imread(ref))
    assert no_temp_files(tmp_path)


def test_without_recursive_only_the_top_directory(tmp_path):
    make_tree(tmp_path / "in")
    result = run("blur", tmp_path / "in", "--k", "3", "--backend", "cpu", "--out-dir",
                 tmp_path / "out")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "c0.blur.jpg", "c1.blur.jpg", "c2.blur.jpg", "c3.blur.jpg", "g.blur.png",
    ]  # fmt: skip


def test_a_pattern_is_expanded_here_and_written_flat(tmp_path):
    make_tree(tmp_path / "in")
    pattern = str(tmp_path / "in" / "**" / "*.png")  # as a shell without globbing passes it
    result = run("blur", pattern, "--k", "3", "--backend", "cpu", "--out-dir", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["g.blur.png", "s.blur.png"]


def test_default_outputs_beside_inputs_and_a_rerun_leaves_them_out(tmp_path):
    inputs = make_tree(tmp_path / "in")
    first = run("blur", tmp_path / "in", "-r", "--k", "3", "--backend", "cpu")
    assert first.exit_code == 0, first.output
    for p in inputs:
        assert iio.default_output(p, "blur").exists()
    again = run("blur", tmp_path / "in", "-r", "--k", "3", "--backend", "cpu",
                "--skip-existing")  # fmt: skip
    assert again.exit_code == 0, again.output
    assert f"left out {len(inputs)} file(s)" in again.stderr
    assert f"0 written, {len(inputs)} skipped, 0 failed" in again.stderr
    assert not list((tmp_path / "in").rglob("*.blur.blur.*"))


def test_name_template(tmp_path):
    inputs = make_tree(tmp_path / "in")
    result = run("contour", tmp_path / "in", "-r", "--backend", "cpu", "--out-dir",
                 tmp_path / "out", "--name", "{stem}_{op}.png")  # fmt: skip
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (tmp_path / "out").rglob("*.png"))
    assert names == sorted(f"{p.stem}_contour.png" for p in inputs)


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{stem}.{colour}{ext}", "unknown field {colour}"),
        ("{stem", "--name"),
        ("sub/{stem}{ext}", "without '/'"),
        ("{stem}", "without an image extension"),
        ("{stem}.gif", "without an image extension"),
    ],
)
def test_bad_name_template_is_one_usage_line(tmp_path, template, words):
    make_tree(tmp_path / "in")
    result = run("blur", tmp_path / "in", "--k", "3", "--backend", "cpu", "--out-dir",
                 tmp_path / "out", "--name", template)  # fmt: skip
    assert result.exit_code == 2, result.output
    (line,) = lines(result.stderr)
    assert line.startswith("imgfilter: error: --name") and words in line, line
    assert not list((tmp_path / "out").glob("*.*"))


def test_single_input_with_out_dir_and_name(tmp_path):
    src = imwrite(tmp_path / "ro" / "photo.png", random_image((20, 20, 3), 0))
    os.chmod(tmp_path / "ro", 0o555)  # a read-only input directory (issue 25, section 3)
    try:
        result = run("blur", src, "--k", "3", "--backend", "cpu", "--out-dir",
                     tmp_path / "new" / "dir", "--name", "{stem}-small{ext}")  # fmt: skip
    finally:
        os.chmod(tmp_path / "ro", 0o755)
    assert result.exit_code == 0, result.output
    out = tmp_path / "new" / "dir" / "photo-small.png"
    assert out.exists()
    (line,) = lines(result.stderr)
    assert line.startswith("wrote ") and "photo-small.png" in line  # today's message


# ----------------------------------------------------------------- never loses work


def test_bad_files_are_reported_and_skipped(tmp_path):
    src = tmp_path / "in"
    good = make_tree(src)
    (src / "empty.png").write_bytes(b"")
    (src / "cut.jpg").write_bytes((src / "c0.jpg").read_bytes()[:300])
    (src / "text.png").write_bytes(b"this is no image")
    result = run("blur", src, "-r", "--k", "3", "--backend", "cpu", "--out-dir", tmp_path / "o")
    assert result.exit_code == 3, result.output
    errors = [line for line in lines(result.stderr) if line.startswith("imgfilter: error: ")]
    assert len(errors) == 3, result.stderr
    for name in ("empty.png", "cut.jpg", "text.png"):
        assert sum(name in line for line in errors) == 1, (name, errors)
    assert lines(result.stderr)[-1].startswith(
        f"imgfilter: {len(good)} written, 0 skipped, 3 failed"
    )
    assert len(list((tmp_path / "o").rglob("*.*"))) == len(good)
    assert "Traceback" not in result.output
    assert no_temp_files(tmp_path)


def test_contour_of_a_float_image_fails_that_file_only(tmp_path):
    src = tmp_path / "in"
    imwrite(src / "ok.png", random_image((20, 20), 0))
    assert cv2.imwrite(str(src / "f.tiff"), np.random.default_rng(0).random((9, 9), np.float32))
    result = run("contour", src, "--backend", "cpu", "--out-dir", tmp_path / "o")
    assert result.exit_code == 3, result.output
    assert "contour needs an integer image" in result.stderr
    assert (tmp_path / "o" / "ok.contour.png").exists()


def test_existing_outputs_refused_then_force_then_skip_existing(tmp_path):
    src = tmp_path / "in"
    inputs = make_tree(src)
    args = ["blur", src, "-r", "--k", "3", "--backend", "cpu", "--out-dir", tmp_path / "o"]
    assert run(*args).exit_code == 0
    victim = tmp_path / "o" / "c0.blur.jpg"
    victim.write_bytes(b"sentinel")
    (tmp_path / "o" / "g.blur.png").unlink()  # as if interrupted before this one

    refused = run(*args)
    assert refused.exit_code == 4, refused.output
    exists = [line for line in lines(refused.stderr) if "exists; pass --force" in line]
    assert len(exists) == len(inputs) - 1
    assert f"1 written, 0 skipped, {len(inputs) - 1} failed" in refused.stderr
    assert victim.read_bytes() == b"sentinel"

    (tmp_path / "o" / "g.blur.png").unlink()
    resumed = run(*args, "--skip-existing")
    assert resumed.exit_code == 0, resumed.output
    assert f"1 written, {len(inputs) - 1} skipped, 0 failed" in resumed.stderr
    assert victim.read_bytes() == b"sentinel"
    assert (tmp_path / "o" / "g.blur.png").exists()

    forced = run(*args, "--force")
    assert forced.exit_code == 0, forced.output
    assert imread(victim).shape == (40, 50, 3)

    both = run(*args, "--force", "--skip-existing")
    assert both.exit_code == 2 and "exclude each other" in both.stderr


def test_input_failures_win_over_output_failures(tmp_path):
    src = tmp_path / "in"
    imwrite(src / "a.png", random_image((10, 10), 0))
    (src / "b.png").write_bytes(b"junk")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "a.blur.png").write_bytes(b"x")
    result = run("blur", src, "--k", "3", "--backend", "cpu", "--out-dir", tmp_path / "o")
    assert result.exit_code == 3, result.output
    assert "0 written, 0 skipped, 2 failed" in result.stderr


def test_arguments_that_name_nothing(tmp_path):
    imwrite(tmp_path / "a.png", random_image((10, 10), 0))
    (tmp_path / "empty").mkdir()
    result = run("blur", tmp_path / "a.png", tmp_path / "nope*.png", tmp_path / "empty",
                 tmp_path / "missing.png", "--k", "3", "--backend", "cpu")  # fmt: skip
    assert result.exit_code == 3, result.output
    err = result.stderr
    assert "no files match" in err and "no images in directory" in err
    assert "missing.png: no such file" in err
    assert "1 written, 0 skipped, 3 failed" in err
    assert (tmp_path / "a.blur.png").exists()


# ------------------------------------------------------------ found before any work


def test_two_inputs_with_one_output_is_an_error_before_any_work(tmp_path):
    a = imwrite(tmp_path / "x" / "p.png", random_image((10, 10), 0))
    b = imwrite(tmp_path / "y" / "p.png", random_image((10, 10), 1))
    c = imwrite(tmp_path / "z.png", random_image((10, 10), 2))
    result = run("blur", c, a, b, "--k", "3", "--backend", "cpu", "--out-dir", tmp_path / "o")
    assert result.exit_code == 2, result.output
    (line,) = lines(result.stderr)
    assert "would both be written to" in line and "p.blur.png" in line
    assert not list((tmp_path / "o").iterdir())  # not even z.png's output

    jpg = imwrite(tmp_path / "x" / "p.jpg", random_image((10, 10), 3))
    result = run("blur", a, jpg, "--k", "3", "--backend", "cpu", "--name", "{stem}.png",
                 "--out-dir", tmp_path / "o")  # fmt: skip
    assert result.exit_code == 2 and "would both be written to" in result.stderr


def test_an_output_that_would_overwrite_an_input_is_refused(tmp_path):
    src = tmp_path / "in"
    make_tree(src)
    result = run("blur", src, "--k", "3", "--backend", "cpu", "--name", "{name}", "--force")
    assert result.exit_code == 2, result.output
    assert "would overwrite itself" in result.stderr
    # a named file that another input's output would replace
    a = imwrite(tmp_path / "a.png", random_image((10, 10), 0))
    b = imwrite(tmp_path / "a.blur.png", random_image((10, 10), 1))
    result = run("blur", a, b, "--k", "3", "--backend", "cpu", "--force")
    assert result.exit_code == 2, result.output
    assert "would overwrite the input" in result.stderr


def test_dash_o_with_several_inputs_is_a_usage_error(tmp_path):
    make_tree(tmp_path / "in")
    result = run("blur", tmp_path / "in", "--k", "3", "-o", tmp_path / "x.png")
    assert result.exit_code == 2 and "--out-dir" in result.stderr


def test_quiet_keeps_errors_only(tmp_path):
    src = tmp_path / "in"
    make_tree(src)
    (src / "bad.png").write_bytes(b"junk")
    result = run("blur", src, "--k", "3", "--backend", "cpu", "-q", "--out-dir", tmp_path / "o")
    assert result.exit_code == 3
    (line,) = lines(result.stderr)
    assert line.startswith("imgfilter: error: cannot read") and "bad.png" in line


# --------------------------------------------------------------------- bounded memory


def test_images_in_memory_are_bounded(tmp_path, monkeypatch):
    """--jobs 1: at most default_depth(1) = 3 images read and not yet written, however
    many files; reads wait while the first write is held back."""
    src = tmp_path / "in"
    for i in range(30):
        imwrite(src / f"i{i:02d}.png", random_image((8, 8), i))
    reads = []
    real_read, real_write = iio.read_image, iio.write_image
    at_first_write = []

    def read(path):
        reads.append(path)
        return real_read(path)

    def write(path, img, **kw):
        if not at_first_write:
            time.sleep(0.3)  # room for reads to run ahead, if nothing held them back
            at_first_write.append(len(reads))
        return real_write(path, img, **kw)

    monkeypatch.setattr(iio, "read_image", read)
    monkeypatch.setattr(iio, "write_image", write)
    result = run("blur", src, "--k", "3", "--backend", "cpu", "-j", "1", "--out-dir",
                 tmp_path / "o")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(reads) == 30
    bound = files.default_depth(1)
    assert at_first_write[0] <= bound
    assert files.last_stats is not None and files.last_stats.peak_in_memory <= bound


def test_pipeline_filters_in_the_calling_thread_only(tmp_path):
    jobs = [files.Job(Path(f"{i}.png"), Path(f"{i}.out.png")) for i in range(20)]
    threads = set()
    live = [0, 0]
    lock = threading.Lock()

    def load(job):
        with lock:
            live[0] += 1
            live[1] = max(live[1], live[0])
        return job

    def compute(job, loaded):
        threads.add(threading.get_ident())
        return loaded

    def save(job, loaded, result):
        with lock:
            live[0] -= 1

    stats = files.run_pipeline(jobs, load=load, compute=compute, save=save, workers=4, depth=2)
    assert threads == {threading.get_ident()}
    assert stats.written == 20 and live[1] <= 2


# ----------------------------------------------------------------------- subprocess


def test_subprocess_summary_and_exit_code(tmp_path):
    src = tmp_path / "in"
    good = make_tree(src)
    (src / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0broken")
    proc = module("filter", str(src / "*.jpg"), str(src / "sub"), "-r", "--kernel", SOBEL,
                  "--backend", "cpu", "--out-dir", tmp_path / "o")  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    err = lines(proc.stderr)
    n = len([p for p in good if p.suffix == ".jpg" and p.parent == src]) + 2
    assert err[-1].startswith(f"imgfilter: {n} written, 0 skipped, 1 failed"), err
    assert sum(line.startswith("imgfilter: error: ") for line in err) == 1, err
    assert (tmp_path / "o" / "deeper" / "d.filter.jpg").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_progress_bar_on_a_terminal_only(tmp_path):
    import pty
    import select

    src = tmp_path / "in"
    for i in range(12):
        imwrite(src / f"i{i}.png", random_image((400, 400, 3), i))

    def run_on_pty(*extra: str) -> tuple[int, str]:
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "imgfilter", "blur", str(src), "--k", "151",
             "--backend", "cpu", "-f", "--out-dir", str(tmp_path / "o"), *extra],
            stderr=slave, stdout=subprocess.DEVNULL,
            env=_env(NUMBA_NUM_THREADS="1", TERM="xterm", COLUMNS="120"),
        )  # fmt: skip
        os.close(slave)
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                break
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace")

    rc, text = run_on_pty()
    assert rc == 0, text
    assert "img/s" in text and "/12" in text, text  # the bar: done/total, rate
    assert "12 written, 0 skipped, 0 failed" in text
    rc, text = run_on_pty("-q")
    assert rc == 0 and text == "", text


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigint_stops_many_files_leaving_whole_files_only(tmp_path):
    src = tmp_path / "in"
    for i in range(40):
        imwrite(src / f"i{i:02d}.png", random_image((500, 500, 3), i))
    kernel = np.random.default_rng(1).random((41, 41)).astype(np.float32)
    np.save(tmp_path / "k.npy", kernel / kernel.sum())
    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, "-m", "imgfilter", "filter", str(src), "--kernel",
         str(tmp_path / "k.npy"), "--backend", "cpu", "--out-dir", str(out), "-j", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if out.is_dir() and any(p.suffix == ".png" for p in out.iterdir()):
            break
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.skip("the run ended before the signal")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.decode().splitlines()[-1] == "imgfilter: interrupted"
    assert no_temp_files(tmp_path)
    done = sorted(out.glob("*.png"))
    assert 0 < len(done) < 40
    for p in done:
        assert imread(p).shape == (500, 500, 3)
    # and --skip-existing finishes the job
    proc2 = module("filter", src, "--kernel", tmp_path / "k.npy", "--backend", "cpu",
                   "--out-dir", out, "--skip-existing")  # fmt: skip
    assert proc2.returncode == 0, proc2.stderr
    assert f"{40 - len(done)} written, {len(done)} skipped, 0 failed" in proc2.stderr
