"""Many files in one command (issue 27, section 1): `imgfilter blur|filter|contour` take
files, patterns and directories, write through a bounded decode/filter/encode pipeline,
report each bad file on one line and go on, and end with a summary and an exit code.

Runs through `imgfilter.cli.main` (test_cli.run: in process, `--backend cpu`) and, for
the exit codes, the progress bar and Ctrl-C, as `python -m imgfilter` in a subprocess.
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
from test_cli import REPO, SOBEL, imread, run
from test_cli_signals import sigint_as_in_a_terminal

from imgfilter import io as iio

OPS = {
    "blur": ["--k", "5"],
    "filter": ["--kernel", SOBEL],
    "contour": [],
}


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


def test_each_output_folder_is_synced_once_after_its_files(tmp_path, monkeypatch):
    """Many files: every file's bytes are fsynced before its rename, but each output
    folder's entries once, after the last file (not once per file)."""
    events = []
    real_fsync = os.fsync
    monkeypatch.setattr(iio, "_fsync_directory", lambda d: events.append(("dir", Path(d))))
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("file", fd)) or real_fsync(fd))
    inputs = make_tree(tmp_path / "in")
    result = run("blur", tmp_path / "in", "--recursive", "--k", "3", "--backend", "cpu",
                 "--out-dir", tmp_path / "out", "-j", "3")  # fmt: skip
    assert result.exit_code == 0, result.output
    dirs = [d for kind, d in events if kind == "dir"]
    out = tmp_path / "out"
    assert sorted(dirs) == sorted([out, out / "sub", out / "sub" / "deeper"])
    first_dir = next(i for i, (kind, _) in enumerate(events) if kind == "dir")
    assert sum(kind == "file" for kind, _ in events[:first_dir]) == len(inputs)


def test_one_write_syncs_its_folder_at_once(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(iio, "_fsync_directory", synced.append)
    iio.write_image(tmp_path / "a.png", random_image((5, 6, 3), 1))
    assert synced == [tmp_path]
    batch = iio.DirectorySync()
    for name in ("b.png", "c.png"):
        iio.write_image(tmp_path / name, random_image((5, 6), 2), directories=batch)
    assert synced == [tmp_path]
    batch.flush()
    batch.flush()  # nothing new
    assert synced == [tmp_path, tmp_path]


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
        preexec_fn=sigint_as_in_a_terminal,
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


# ----------------------------------------------------------------------- classify


def classes_image(h: int, w: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A BGR image of three noisy colour regions and its classes (1, 2, 3)."""
    rng = np.random.default_rng(seed)
    truth = np.ones((h, w), np.uint8)
    truth[:, w // 2 :] = 2
    truth[(2 * h) // 3 :, : w // 3] = 3
    colours = np.array([[0, 0, 0], [40, 60, 200], [60, 190, 70], [200, 120, 40]], np.float32)
    img = colours[truth] + rng.normal(0, 12, (h, w, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), truth


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    from imgfilter import classify

    img, truth = classes_image(30, 40, 0)
    spec = {"raw": True, "gauss": [1.0], "box": [3], "edges": [1.0], "contour": True}
    model, _ = classify.train(img, truth, spec=spec, l2=1e-2, backend="cpu")
    return classify.save(model, tmp_path_factory.mktemp("model") / "model.npz")


def classify_tree(root: Path) -> list[Path]:
    paths = [imwrite(root / f"c{i}.png", classes_image(30 + i, 40, i + 1)[0]) for i in range(3)]
    paths.append(imwrite(root / "sub" / "s.jpg", classes_image(24, 36, 9)[0]))
    return paths


def test_classify_many_equals_single_input_classify(tmp_path, model_file):
    src = tmp_path / "in"
    inputs = classify_tree(src)
    out = tmp_path / "out"
    result = run("classify", src, "-r", "-m", model_file, "--backend", "cpu", "--out-dir",
                 out, "--proba", "{stem}.proba.npy", "--overlay", "{stem}.{op}{ext}",
                 "-j", "2")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert lines(result.stderr)[-1].startswith(
        f"imgfilter: {len(inputs)} written, 0 skipped, 0 failed (cpu, "
    )
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*.*"))
    assert written == sorted(
        [f"c{i}.{kind}" for i in range(3) for kind in ("labels.png", "proba.npy", "overlay.png")]
        + ["sub/s.labels.png", "sub/s.proba.npy", "sub/s.overlay.jpg"]
    )
    for p in inputs:
        rel = p.relative_to(src).parent
        ref = tmp_path / "ref" / rel
        ref.mkdir(parents=True, exist_ok=True)
        one = run("classify", p, "-m", model_file, "--backend", "cpu", "-o",
                  ref / f"{p.stem}.labels.png", "--proba", ref / f"{p.stem}.proba.npy",
                  "--overlay", ref / f"{p.stem}.overlay{p.suffix}")  # fmt: skip
        assert one.exit_code == 0, one.output
        for name in (f"{p.stem}.labels.png", f"{p.stem}.overlay{p.suffix}"):
            np.testing.assert_array_equal(imread(out / rel / name), imread(ref / name))
        np.testing.assert_array_equal(
            np.load(out / rel / f"{p.stem}.proba.npy"), np.load(ref / f"{p.stem}.proba.npy")
        )
    assert no_temp_files(tmp_path)


def test_classify_many_loads_the_model_once_and_classifies_in_one_thread(
    tmp_path, model_file, monkeypatch
):
    from imgfilter import classify

    loads, threads = [], set()
    real_load, real_predict = classify.load, classify.predict

    def load(path):
        loads.append(path)
        return real_load(path)

    def predict(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return real_predict(*args, **kwargs)

    monkeypatch.setattr(classify, "load", load)
    monkeypatch.setattr(classify, "predict", predict)
    classify_tree(tmp_path / "in")
    result = run("classify", tmp_path / "in", "-r", "-m", model_file, "--backend", "cpu",
                 "-j", "3")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(loads) == 1
    assert len(threads) == 1 and not threads.pop().startswith("imgfilter-io")


def test_classify_many_default_names_beside_inputs_and_rerun(tmp_path, model_file):
    src = tmp_path / "in"
    inputs = classify_tree(src)
    args = ["classify", src, "-r", "-m", model_file, "--backend", "cpu",
            "--overlay", "{stem}.overlay.png"]  # fmt: skip
    first = run(*args)
    assert first.exit_code == 0, first.output
    for p in inputs:
        assert p.with_name(f"{p.stem}.labels.png").exists()  # .png for a .jpg input too
        assert p.with_name(f"{p.stem}.overlay.png").exists()
    again = run(*args, "--skip-existing")
    assert again.exit_code == 0, again.output
    assert f"left out {2 * len(inputs)} file(s)" in again.stderr  # no a.labels.labels.png
    assert f"0 written, {len(inputs)} skipped, 0 failed" in again.stderr


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--proba", "p.npy"], "--proba p.npy names one file for several inputs"),
        (["--overlay", "over.png"], "--overlay over.png names one file"),
        (["--proba", "{stem}.png"], "without the extension .npy"),
        (["--overlay", "{stem}.txt"], "without an image extension"),
        (["--name", "{stem}.jpg"], "lossless"),
        (["--name", "{stem}.png", "--overlay", "{stem}.png"], "the label map and the --overlay"),
        (["--proba", "{stem}.npy", "--overlay", "{stem}.{op}.png", "--name", "{name}"], "itself"),
        (["-o", "x.png"], "-o names one output file"),
        (["--force", "--skip-existing"], "exclude each other"),
    ],
)
def test_classify_many_refuses_ambiguous_outputs(tmp_path, model_file, extra, words):
    """One usage line (exit 2) before anything is read or written."""
    classify_tree(tmp_path / "in")
    before = sorted(tmp_path.rglob("*"))
    result = run("classify", tmp_path / "in", "-r", "-m", model_file, "--backend", "cpu", *extra)
    assert result.exit_code == 2, result.output
    (line,) = lines(result.stderr)
    assert line.startswith("imgfilter: error: ") and words in line, line
    assert sorted(tmp_path.rglob("*")) == before


def test_classify_many_two_inputs_one_output_refused_before_any_work(tmp_path, model_file):
    a = imwrite(tmp_path / "x" / "p.png", classes_image(20, 20, 1)[0])
    b = imwrite(tmp_path / "y" / "p.png", classes_image(20, 20, 2)[0])
    c = imwrite(tmp_path / "z.png", classes_image(20, 20, 3)[0])
    result = run("classify", c, a, b, "-m", model_file, "--backend", "cpu",
                 "--out-dir", tmp_path / "o", "--proba", "{stem}.npy")  # fmt: skip
    assert result.exit_code == 2, result.output
    (line,) = lines(result.stderr)
    assert "would both be written to" in line and "p.labels.png" in line
    assert not list((tmp_path / "o").iterdir())


def test_classify_many_bad_files_reported_and_skipped(tmp_path, model_file):
    src = tmp_path / "in"
    good = classify_tree(src)
    (src / "junk.png").write_bytes(b"this is no image")
    imwrite(src / "gray.png", classes_image(20, 20, 4)[0][:, :, 0])  # the model wants colour
    result = run("classify", src, "-r", "-m", model_file, "--backend", "cpu",
                 "--out-dir", tmp_path / "o", "--proba", "{stem}.npy")  # fmt: skip
    assert result.exit_code == 3, result.output
    errors = [line for line in lines(result.stderr) if line.startswith("imgfilter: error: ")]
    assert len(errors) == 2, result.stderr
    assert any("junk.png" in e and "cannot read" in e for e in errors), errors
    assert any("gray.png" in e and "trained on colour" in e for e in errors), errors
    assert lines(result.stderr)[-1].startswith(
        f"imgfilter: {len(good)} written, 0 skipped, 2 failed"
    )
    assert len(list((tmp_path / "o").rglob("*.labels.png"))) == len(good)
    assert len(list((tmp_path / "o").rglob("*.npy"))) == len(good)
    assert "Traceback" not in result.output and no_temp_files(tmp_path)


def test_classify_many_existing_outputs_force_and_resume(tmp_path, model_file):
    src = tmp_path / "in"
    inputs = classify_tree(src)
    out = tmp_path / "o"
    args = ["classify", src, "-r", "-m", model_file, "--backend", "cpu", "--out-dir", out,
            "--overlay", "{stem}.overlay.png"]  # fmt: skip
    assert run(*args).exit_code == 0
    reference = imread(out / "c1.overlay.png")
    (out / "c1.overlay.png").unlink()  # as if stopped between c1's two writes
    (out / "c1.labels.png").write_bytes(b"sentinel")

    refused = run(*args)
    assert refused.exit_code == 4, refused.output
    assert sum("exists; pass --force" in line for line in lines(refused.stderr)) == len(inputs)
    assert not (out / "c1.overlay.png").exists()

    resumed = run(*args, "--skip-existing")
    assert resumed.exit_code == 0, resumed.output
    assert f"1 written, {len(inputs) - 1} skipped, 0 failed" in resumed.stderr
    assert (out / "c1.labels.png").read_bytes() == b"sentinel"  # kept as it was
    np.testing.assert_array_equal(imread(out / "c1.overlay.png"), reference)

    forced = run(*args, "--force")
    assert forced.exit_code == 0, forced.output
    assert imread(out / "c1.labels.png").shape == (31, 40)


def test_classify_single_input_with_out_dir_and_templates(tmp_path, model_file):
    src = classify_tree(tmp_path / "in")[0]
    result = run("classify", src, "-m", model_file, "--backend", "cpu", "--out-dir",
                 tmp_path / "o", "--proba", "{stem}.p.npy", "--overlay",
                 "{stem}.o.png")  # fmt: skip
    assert result.exit_code == 0, result.output
    (line,) = lines(result.stderr)
    assert line.startswith("wrote ") and "c0.labels.png" in line  # the one-file line
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "c0.labels.png", "c0.o.png", "c0.p.npy",
    ]  # fmt: skip
    again = run("classify", src, "-m", model_file, "--backend", "cpu", "--out-dir",
                tmp_path / "o", "--proba", "{stem}.p.npy", "--skip-existing")  # fmt: skip
    assert again.exit_code == 0 and "skipped (--skip-existing)" in again.stderr


def test_classify_many_subprocess_exit_code(tmp_path, model_file):
    src = tmp_path / "in"
    good = classify_tree(src)
    (src / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0broken")
    proc = module("classify", str(src / "*.png"), src / "sub", src / "bad.jpg", "-m", model_file,
                  "--backend", "cpu", "--out-dir", tmp_path / "o", "-q")  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    (line,) = lines(proc.stderr)
    assert line.startswith("imgfilter: error: cannot read") and "bad.jpg" in line
    assert len(list((tmp_path / "o").glob("*.labels.png"))) == len(good)


def test_one_classify_without_output_writes_a_png_label_map(tmp_path):
    """The default label map is INPUT_STEM.labels.png (lossless) beside a JPEG input,
    as --help says, not a .jpg (which would be refused as lossy)."""
    import shutil

    samples = Path(__file__).resolve().parent.parent / "samples"
    photo = tmp_path / "photo.jpg"
    shutil.copy(samples / "astronaut.jpg", photo)
    model = samples / "classify" / "astronaut.model.npz"
    result = run("classify", str(photo), "--model", str(model))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "photo.labels.png").exists()
    assert not (tmp_path / "photo.labels.jpg").exists()
