"""The `imgfilter` command line: results equal OpenCV's, outputs are guarded, and every
error is one line on stderr with the exit code docs/design.md gives it (2 usage, 3 input,
4 output, 5 device, 1 anything else).

Runs through `imgfilter.cli.main` under Click's test runner (in process, `--backend cpu`,
through Typer as the installed command runs them) and, for a few cases, as
`python -m imgfilter` in a subprocess.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import real_gpu_present
from typer.testing import CliRunner

import imgfilter
from imgfilter import cli
from imgfilter.backends import opencv

REPO = Path(__file__).resolve().parents[1]
SAMPLES = sorted(
    p
    for p in (REPO / "samples").glob("*")
    if p.suffix.lower() in {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp"}
)
SOBEL = "-1,0,1;-2,0,2;-1,0,1"
SOBEL_K = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float32)


runner = CliRunner()


@dataclass
class Ran:
    """What a command run under `run` did (as Click's test result gives it)."""

    exit_code: int
    stdout: str
    stderr: str
    output: str  # stdout and stderr as they were written, interleaved
    exception: BaseException | None


def run(*args: str | Path) -> Ran:
    """`imgfilter ARGS` in this process through the command's entry point,
    `cli.main`, with Typer's test runner's isolated streams."""
    exception: BaseException | None = None
    with runner.isolation() as (out, err, both):
        try:
            cli.main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            exception = e if code else None
        except Exception as e:  # noqa: BLE001 - reported as the runner would
            code, exception = 1, e
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        texts = [s.getvalue().decode(runner.charset, "replace") for s in (out, err, both)]
    return Ran(code, *texts, exception)


def assert_ok(result) -> None:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output


def assert_one_line_error(result, code: int, *words: str) -> str:
    """Exit `code`, exactly one stderr line `imgfilter: error: ...`, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("imgfilter: error: "), lines[0]
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def imwrite(path: Path, img: np.ndarray) -> Path:
    assert cv2.imwrite(str(path), img), path
    return path


def imread(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return img


def random_image(shape, dtype=np.uint8, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    hi = np.iinfo(dtype).max if np.dtype(dtype).kind == "u" else 1
    if np.dtype(dtype).kind == "u":
        return rng.integers(0, hi + 1, size=shape, dtype=dtype)
    return rng.random(shape, dtype=np.float32)


@pytest.fixture
def color_png(tmp_path) -> Path:
    return imwrite(tmp_path / "photo.png", random_image((37, 53, 3)))


@pytest.fixture
def gray_png(tmp_path) -> Path:
    return imwrite(tmp_path / "gray.png", random_image((29, 41), seed=1))


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


# ---------------------------------------------------------------------------------------
# Results equal OpenCV's, read back from disk


@pytest.mark.parametrize("k", [1, 4, 5, 21])
def test_blur_matches_cv2_blur(color_png, k):
    result = run("blur", color_png, "--k", k, "--backend", "cpu")
    assert_ok(result)
    out = color_png.with_name("photo.blur.png")
    ref = opencv.blur(imread(color_png), k)
    assert _max_diff(imread(out), ref) <= 1


@pytest.mark.parametrize(
    ("border", "extra"),
    [
        ("reflect101", []),
        ("reflect", []),
        ("replicate", []),
        ("wrap", []),
        ("constant", []),
        ("constant", ["--border-value", "200"]),
    ],
)
def test_blur_borders(gray_png, tmp_path, border, extra):
    out = tmp_path / f"blur-{border}.png"
    result = run(
        "blur", gray_png, "-k", "7", "--border", border, *extra, "--backend", "cpu", "-o", out
    )
    assert_ok(result)
    value = float(extra[1]) if extra else 0.0
    ref = opencv.blur(imread(gray_png), 7, border, value)
    assert _max_diff(imread(out), ref) <= 1


@pytest.fixture
def gpu_asked(monkeypatch):
    """What the filters asked of the GPU: warmup.start_for calls and auto resolved
    (to "cpu": no GPU here)."""
    from imgfilter.backends import warmup
    from imgfilter.cli import filtering

    asked: list = []
    monkeypatch.setattr(warmup, "start_for", lambda *args: asked.append(("start", *args)))

    def resolve(backend):
        asked.append(("resolve", backend.value))
        return "cpu"

    monkeypatch.setattr(filtering, "resolve_backend", resolve)
    return asked


def test_auto_blurs_one_small_image_on_the_cpu(color_png, tmp_path, gpu_asked):
    """--backend auto: a blur of one image no larger than warmup.cpu_limit("blur") (file
    and pixels) runs on the CPU without asking for a GPU, and says so."""
    out = tmp_path / "auto.png"
    result = run("blur", color_png, "--k", "21", "-o", out)
    assert_ok(result)
    assert gpu_asked == []
    assert "cpu: one blur, done before a GPU could start" in result.stderr
    np.testing.assert_array_equal(imread(out), opencv.blur(imread(color_png), 21))


def test_auto_blur_takes_the_gpu_past_the_size_or_when_asked(tmp_path, monkeypatch, gpu_asked):
    from imgfilter.backends import warmup

    flat = imwrite(tmp_path / "flat.png", np.full((40, 60, 3), 7, np.uint8))  # small file
    noisy = imwrite(tmp_path / "noisy.png", random_image((40, 60, 3), seed=3))
    monkeypatch.setattr(warmup, "BLUR_ON_CPU_BYTES_PER_CPU", 0)  # the limit: the constant
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", 40 * 60 * 3 - 1)
    assert flat.stat().st_size < warmup.ONE_IMAGE_ON_CPU_BYTES < noisy.stat().st_size
    assert_ok(run("blur", noisy, "--k", "3", "-o", tmp_path / "a.png"))  # a large file
    assert gpu_asked == [("start", "blur", "auto"), ("resolve", "auto")]  # opened before reading
    gpu_asked.clear()
    assert_ok(run("blur", flat, "--k", "3", "-o", tmp_path / "b.png"))  # large pixels
    assert gpu_asked == [("start", "blur", "auto"), ("resolve", "auto")]  # the header said so
    gpu_asked.clear()
    flat_webp = imwrite(tmp_path / "flat.webp", np.full((40, 60, 3), 7, np.uint8))
    assert flat_webp.stat().st_size < warmup.ONE_IMAGE_ON_CPU_BYTES
    assert_ok(run("blur", flat_webp, "--k", "3", "-o", tmp_path / "b.webp"))  # header unread
    assert gpu_asked == [("resolve", "auto")]  # known only once read
    gpu_asked.clear()
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", 1 << 27)
    assert_ok(run("blur", flat, "--k", "3", "-o", tmp_path / "c.png", "--method", "tiled"))
    assert gpu_asked == [("start", "blur", "auto"), ("resolve", "auto")]
    gpu_asked.clear()
    assert_ok(run("blur", tmp_path / "*.png", "--k", "3", "--out-dir", tmp_path / "many"))
    assert gpu_asked[0] == ("start", "blur", "auto")  # several images: the GPU, opened early
    gpu_asked.clear()
    assert_ok(run("filter", flat, "--kernel", "1,2,1", "-o", tmp_path / "d.png"))  # not filter
    assert gpu_asked == [("start", "filter", "auto"), ("resolve", "auto")]


def test_auto_contours_one_small_image_on_the_cpu(color_png, tmp_path, monkeypatch, gpu_asked):
    from imgfilter.backends import warmup

    result = run("contour", color_png, "-o", tmp_path / "c.png")
    assert_ok(result)
    assert gpu_asked == []
    assert "cpu: one contour, done before a GPU could start" in result.stderr
    np.testing.assert_array_equal(imread(tmp_path / "c.png"), opencv.contour(imread(color_png)))
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", 16)  # past it: the GPU
    assert_ok(run("contour", color_png, "-o", tmp_path / "d.png"))
    assert gpu_asked == [("start", "contour", "auto"), ("resolve", "auto")]


@pytest.mark.gpu
def test_gpu_auto_places_each_filter_where_it_is_cheapest(tmp_path):
    """One image: the CPU (no GPU start-up). A folder: cheap filters (a box blur) on the
    codec threads, as a cv2 pool does; costly ones (a 21x21 kernel) on the GPU."""
    src = tmp_path / "in"
    src.mkdir()
    images = {name: random_image((301, 403, 3), seed=i) for i, name in enumerate("ab")}
    for name, img in images.items():
        imwrite(src / f"{name}.png", img)
    one = module("blur", src / "a.png", "--k", "21", "-o", tmp_path / "one.png",
                 NUMBA_ENABLE_CUDASIM=None)  # fmt: skip
    assert one.returncode == 0 and "cpu: one blur" in one.stderr, one.stderr
    np.testing.assert_array_equal(imread(tmp_path / "one.png"), opencv.blur(images["a"], 21))
    edges = module("contour", src / "a.png", "-o", tmp_path / "edges.png",
                   NUMBA_ENABLE_CUDASIM=None)  # fmt: skip
    assert edges.returncode == 0 and "cpu: one contour" in edges.stderr, edges.stderr
    np.testing.assert_array_equal(imread(tmp_path / "edges.png"), opencv.contour(images["a"]))
    many = module("blur", src, "--k", "21", "--out-dir", tmp_path / "many",
                  NUMBA_ENABLE_CUDASIM=None)  # fmt: skip
    assert many.returncode == 0 and "(cpu, " in many.stderr, many.stderr
    kernel = np.random.default_rng(5).standard_normal((21, 21)).astype(np.float32) / 21
    np.save(tmp_path / "k.npy", kernel)
    heavy = module("filter", src, "--kernel", tmp_path / "k.npy", "--out-dir", tmp_path / "heavy",
                   NUMBA_ENABLE_CUDASIM=None)  # fmt: skip
    assert heavy.returncode == 0 and "(cuda" in heavy.stderr, heavy.stderr
    for name, img in images.items():
        got = imread(tmp_path / "many" / f"{name}.blur.png")
        np.testing.assert_array_equal(got, opencv.blur(img, 21))
        got = imread(tmp_path / "heavy" / f"{name}.filter.png")
        assert np.abs(got.astype(int) - opencv.filter2d(img, kernel)).max() <= 1


@pytest.mark.parametrize("border", ["reflect101", "reflect", "replicate", "constant", "wrap"])
def test_filter_integer_kernel_is_exact(color_png, tmp_path, border):
    out = tmp_path / "sobel.png"
    result = run(
        "filter", color_png, "--kernel", SOBEL, "--border", border, "--backend", "cpu", "-o", out
    )
    assert_ok(result)
    ref = opencv.filter2d(imread(color_png), SOBEL_K, None, border)
    np.testing.assert_array_equal(imread(out), ref)


def test_filter_kernel_file_and_normalize(color_png, tmp_path):
    kernel = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1], [0, 1, 0]], dtype=np.float64)
    spec = tmp_path / "k.npy"
    np.save(spec, kernel)
    result = run("filter", color_png, "--kernel", spec, "--normalize", "--backend", "cpu")
    assert_ok(result)
    ref = opencv.filter2d(imread(color_png), (kernel / kernel.sum()).astype(np.float32))
    assert _max_diff(imread(color_png.with_name("photo.filter.png")), ref) <= 1


def test_filter_text_kernel_file(gray_png, tmp_path):
    spec = tmp_path / "laplace.txt"
    spec.write_text("0 1 0\n1 -4 1\n0 1 0\n")
    out = tmp_path / "lap.png"
    assert_ok(run("filter", gray_png, "--kernel", spec, "--backend", "cpu", "-o", out))
    k = np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], dtype=np.float32)
    np.testing.assert_array_equal(imread(out), opencv.filter2d(imread(gray_png), k))


def test_filter_uint16_and_four_channels(tmp_path):
    src = imwrite(tmp_path / "deep.png", random_image((23, 31, 4), np.uint16, seed=5))
    out = tmp_path / "deep.out.png"
    assert_ok(run("filter", src, "--kernel", "1 2 1", "--backend", "cpu", "-o", out))
    got = imread(out)
    assert got.dtype == np.uint16 and got.shape == (23, 31, 4)
    k = np.array([[1, 2, 1]], dtype=np.float32)
    np.testing.assert_array_equal(got, opencv.filter2d(imread(src), k))


@pytest.mark.parametrize("border", ["reflect101", "replicate", "wrap"])
def test_contour_is_exact_and_single_channel(color_png, border):
    result = run("contour", color_png, "--border", border, "--backend", "cpu")
    assert_ok(result)
    got = imread(color_png.with_name("photo.contour.png"))
    assert got.ndim == 2
    np.testing.assert_array_equal(got, opencv.contour(imread(color_png), border))


def test_success_line_names_output_shape_and_engine(color_png):
    result = run("blur", color_png, "--k", "3", "--backend", "cpu")
    assert_ok(result)
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("wrote ") and "photo.blur.png" in line
    assert "53x37 px, 3 ch uint8" in line and "cpu" in line and " ms incl. kernel loading)" in line


# ---------------------------------------------------------------------------------------
# Output naming and overwriting


def test_default_output_beside_input_not_cwd(color_png, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert_ok(run("blur", color_png, "--k", "3", "--backend", "cpu"))
    assert (tmp_path / "photo.blur.png").is_file()
    assert list(elsewhere.iterdir()) == []


def test_output_format_follows_extension(color_png, tmp_path):
    out = tmp_path / "out.tiff"
    assert_ok(run("filter", color_png, "--kernel", SOBEL, "--backend", "cpu", "-o", out))
    ref = opencv.filter2d(imread(color_png), SOBEL_K)
    np.testing.assert_array_equal(imread(out), ref)


def test_existing_output_needs_force(color_png):
    out = color_png.with_name("photo.blur.png")
    out.write_bytes(b"keep me")
    result = run("blur", color_png, "--k", "3", "--backend", "cpu")
    assert_one_line_error(result, 4)
    assert out.read_bytes() == b"keep me"
    assert_ok(run("blur", color_png, "--k", "3", "--backend", "cpu", "--force"))
    assert _max_diff(imread(out), opencv.blur(imread(color_png), 3)) <= 1


def test_output_equal_to_input_refused_and_input_untouched(color_png):
    before = color_png.read_bytes()
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "-o", color_png)
    assert_one_line_error(result, 4)
    assert color_png.read_bytes() == before


def test_output_equal_to_input_with_force_overwrites(color_png):
    original = imread(color_png)
    assert_ok(run("blur", color_png, "--k", "3", "--backend", "cpu", "-o", color_png, "-f"))
    assert _max_diff(imread(color_png), opencv.blur(original, 3)) <= 1


# ---------------------------------------------------------------------------------------
# Errors: one line, right exit code, nothing written


def test_missing_input(tmp_path):
    result = run("blur", tmp_path / "nope.png", "--k", "3", "--backend", "cpu")
    assert_one_line_error(result, 3, "nope.png")


def test_input_is_a_directory(tmp_path):
    assert_one_line_error(run("contour", tmp_path, "--backend", "cpu"), 3)


def test_zero_byte_input(tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    assert_one_line_error(run("blur", empty, "--k", "3", "--backend", "cpu"), 3)
    assert not (tmp_path / "empty.blur.png").exists()


def test_non_image_input(tmp_path):
    text = tmp_path / "notes.png"
    text.write_text("this is not an image\n" * 20)
    assert_one_line_error(run("filter", text, "--kernel", SOBEL, "--backend", "cpu"), 3)


@pytest.mark.parametrize("k", ["0", "-3", "100000", "abc", "2.5"])
def test_bad_box_size_is_usage_error(color_png, k):
    result = run("blur", color_png, "--k", k, "--backend", "cpu")
    assert_one_line_error(result, 2, "--k")
    assert not color_png.with_name("photo.blur.png").exists()


def test_missing_k_is_usage_error(color_png):
    assert_one_line_error(run("blur", color_png), 2, "--k")


@pytest.mark.parametrize(
    ("args", "word"),
    [
        (["--border", "nope"], "--border"),
        (["--backend", "gpu"], "--backend"),
        (["--method", "fastest"], "--method"),
        (["--bogus"], "--bogus"),
        (["--border", "reflect", "--border-value", "5"], "--border-value"),
    ],
)
def test_bad_options_are_usage_errors(color_png, args, word):
    assert_one_line_error(run("blur", color_png, "--k", "3", *args), 2, word)


def test_unknown_command_is_usage_error():
    assert_one_line_error(run("sharpen", "x.png"), 2, "sharpen")


@pytest.mark.parametrize(
    "spec", ["1,2;3", "1,x;3,4", "", "1,nan", "missing-kernel.npy", "1;;2", "1/0"]
)
def test_malformed_kernel_spec_is_usage_error(color_png, spec):
    result = run("filter", color_png, "--kernel", spec, "--backend", "cpu")
    assert_one_line_error(result, 2, "kernel")
    assert not color_png.with_name("photo.filter.png").exists()


def test_three_d_npy_kernel_is_usage_error(color_png, tmp_path):
    spec = tmp_path / "cube.npy"
    np.save(spec, np.ones((3, 3, 3)))
    result = run("filter", color_png, "--kernel", spec, "--backend", "cpu")
    assert_one_line_error(result, 2, "3-D")


def test_normalize_zero_sum_kernel_is_usage_error(color_png):
    result = run("filter", color_png, "--kernel", SOBEL, "--normalize", "--backend", "cpu")
    assert_one_line_error(result, 2, "sums to 0")


def test_missing_output_directory(color_png, tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "out.png"
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "-o", out)
    assert_one_line_error(result, 4)
    assert not out.parent.exists()


def test_output_directory_is_a_file(color_png, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "-o", blocker / "out.png")
    assert_one_line_error(result, 4)


def test_unwritable_output_directory(color_png, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        result = run("blur", color_png, "--k", "3", "--backend", "cpu", "-o", locked / "o.png")
        assert_one_line_error(result, 4)
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_unsupported_output_extension(color_png, tmp_path):
    out = tmp_path / "out.xyz"
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "-o", out)
    assert_one_line_error(result, 4, "xyz")
    assert not out.exists()


def test_output_format_must_hold_the_result_dtype(tmp_path):
    src = imwrite(tmp_path / "deep.png", random_image((11, 13), np.uint16))
    out = tmp_path / "deep.jpg"
    result = run("blur", src, "--k", "3", "--backend", "cpu", "-o", out)
    assert_one_line_error(result, 4, "deep.jpg")
    assert not out.exists()


def test_output_channels_checked_for_the_result_not_the_input(tmp_path):
    src = imwrite(tmp_path / "rgba.png", random_image((17, 19, 4), seed=4))
    # BGRA does not fit JPEG, so blur (4 channels out) is refused before filtering...
    assert_one_line_error(
        run("blur", src, "--k", "3", "--backend", "cpu", "-o", tmp_path / "b.jpg"), 4
    )
    # ...while contour (1 channel out) may write JPEG.
    out = tmp_path / "c.png"
    assert_ok(run("contour", src, "--backend", "cpu", "-o", out))
    np.testing.assert_array_equal(imread(out), opencv.contour(imread(src)))
    assert_ok(run("contour", src, "--backend", "cpu", "-o", tmp_path / "c.jpg"))


def test_contour_of_float_image_is_usage_error(tmp_path):
    src = imwrite(tmp_path / "f.tiff", random_image((9, 8), np.float32))
    assert_one_line_error(run("contour", src, "--backend", "cpu"), 2, "integer")
    assert not (tmp_path / "f.contour.tiff").exists()
    assert_one_line_error(run("compare", src, "--contour", "--backend", "cpu"), 2, "integer")


def test_unexpected_error_is_one_line_and_debug_shows_traceback(color_png, monkeypatch):
    import imgfilter.api

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(imgfilter.api, "blur", boom)
    result = run("blur", color_png, "--k", "3", "--backend", "cpu")
    assert_one_line_error(result, 1, "RuntimeError", "boom", "--debug")
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "--debug")
    assert result.exit_code == 1
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1] == "imgfilter: error: unexpected RuntimeError: boom"


def test_debug_keeps_the_exit_code_of_known_errors(tmp_path):
    result = run("blur", tmp_path / "nope.png", "--k", "3", "--backend", "cpu", "--debug")
    assert result.exit_code == 3
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("imgfilter: error: ")


# ---------------------------------------------------------------------------------------
# compare


def test_compare_integer_kernel_identical(color_png):
    result = run("compare", color_png, "--kernel", SOBEL, "--backend", "cpu")
    assert_ok(result)
    out = result.stdout
    for words in ("max abs diff", "mean abs diff", "PSNR", "inf", "imgfilter", "OpenCV"):
        assert words in out, (words, out)
    assert "warm-up" in out
    assert "agree" in out.splitlines()[-1]
    assert result.stderr == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--k", "21"],
        ["--k", "4", "--border", "wrap"],
        ["--k", "5", "--border", "constant", "--border-value", "9"],
        ["--kernel", "1 2 1;2 4 2;1 2 1", "--normalize"],
        ["--contour"],
        ["--contour", "--border", "reflect"],
    ],
)
def test_compare_json(color_png, args):
    result = run("compare", color_png, *args, "--backend", "cpu", "--json")
    assert_ok(result)
    record = json.loads(result.stdout)
    for key in (
        "max_abs_diff",
        "mean_abs_diff",
        "psnr_db",
        "imgfilter_ms",
        "opencv_ms",
        "tolerance",
        "agree",
        "verdict",
        "backend",
        "shape",
        "dtype",
    ):
        assert key in record, key
    assert record["agree"] is True and record["verdict"] == "agree"
    assert record["backend"] == "cpu" and record["shape"] == [37, 53, 3]
    assert record["max_abs_diff"] <= record["tolerance"]
    assert record["imgfilter_ms"] >= 0 and record["opencv_ms"] >= 0
    if record["identical"]:
        assert record["psnr_db"] is None and record["max_abs_diff"] == 0
    else:
        assert math.isfinite(record["psnr_db"]) and record["psnr_db"] > 40


def test_compare_tolerance_exact_for_integer_kernel_lsb_for_box(color_png):
    exact = json.loads(run("compare", color_png, "--contour", "--backend", "cpu", "--json").stdout)
    assert exact["tolerance"] == 0 and exact["identical"] is True
    box = json.loads(run("compare", color_png, "-k", "3", "--backend", "cpu", "--json").stdout)
    assert box["tolerance"] == 1


def test_compare_float32_image(tmp_path):
    src = imwrite(tmp_path / "f.tiff", random_image((19, 27, 3), np.float32, seed=2))
    result = run("compare", src, "--kernel", "0.1 0.2 0.7;1 -2 1", "--backend", "cpu", "--json")
    assert_ok(result)
    record = json.loads(result.stdout)
    assert record["dtype"] == "float32"
    assert 0 < record["tolerance"] < 1e-3 and record["agree"] is True


def test_compare_disagreement_exits_1(color_png, monkeypatch):
    import imgfilter.api

    real_blur = imgfilter.api.blur

    def off_by_three(img, k, **kwargs):
        out = real_blur(img, k, **kwargs)
        out[0, 0, 0] = out[0, 0, 0] + 3 if out[0, 0, 0] < 200 else out[0, 0, 0] - 3
        return out

    monkeypatch.setattr(imgfilter.api, "blur", off_by_three)
    result = run("compare", color_png, "--k", "5", "--backend", "cpu")
    assert_one_line_error(result, 1, "disagree", "3")
    assert "DISAGREE" in result.stdout


@pytest.mark.parametrize(
    ("args", "word"),
    [
        ([], "exactly one"),
        (["--k", "3", "--kernel", "1"], "exactly one"),
        (["--k", "3", "--contour"], "exactly one"),
        (["--k", "3", "--normalize"], "--normalize"),
        (["--kernel", "1,2;3"], "kernel"),
    ],
)
def test_compare_usage_errors(color_png, args, word):
    assert_one_line_error(run("compare", color_png, *args, "--backend", "cpu"), 2, word)


def test_compare_missing_input(tmp_path):
    assert_one_line_error(run("compare", tmp_path / "x.png", "--k", "3", "--backend", "cpu"), 3)


@pytest.mark.skipif(not SAMPLES, reason="samples/ holds no images yet")
@pytest.mark.parametrize("sample", SAMPLES, ids=[p.name for p in SAMPLES])
@pytest.mark.parametrize("args", [["--k", "21"], ["--kernel", SOBEL], ["--contour"]])
def test_compare_samples_agree(sample, args):
    result = run("compare", sample, *args, "--backend", "cpu", "--json")
    assert_ok(result)
    assert json.loads(result.stdout)["agree"] is True


# ---------------------------------------------------------------------------------------
# Help, version, and the module as a subprocess


def test_help_lists_commands_with_examples():
    result = run("--help")
    assert_ok(result)
    for word in ("blur", "filter", "contour", "compare", "imgfilter blur photo.jpg --k 21"):
        assert word in result.stdout


@pytest.mark.parametrize("command", ["blur", "filter", "contour", "compare"])
def test_command_help_has_an_example(command):
    result = run(command, "--help")
    assert_ok(result)
    assert f"imgfilter {command} photo.jpg" in result.stdout
    assert "--border" in result.stdout and "--backend" in result.stdout


def test_version():
    result = run("--version")
    assert_ok(result)
    assert result.stdout.strip().startswith("imgfilter 0.")


def test_no_arguments_prints_the_help_once_and_exits_2():
    """As a Typer app does: the help on stdout, exit 2 (a command is missing), and
    nothing on stderr (Click added an empty line there)."""
    result = run()
    assert result.exit_code == 2
    assert result.stderr == ""
    assert result.stdout.rstrip("\n") == run("--help").stdout.rstrip("\n")
    assert result.stdout.count("Usage: imgfilter") == 1


@pytest.mark.parametrize("columns", [80, 60])
@pytest.mark.parametrize("command", ["", "blur", "filter", "contour", "compare", "train"])
def test_help_sentences_fill_their_lines(command, columns, monkeypatch):
    """Each paragraph of prose in a help is wrapped at the terminal's width, not at the
    docstring's line breaks too: no line but a paragraph's last holds a word or two."""
    monkeypatch.setenv("COLUMNS", str(columns))
    result = run(*command.split(), "--help")
    assert_ok(result)
    description = result.stdout.split("\u256d")[0]  # before the option panels
    for paragraph in re.split(r"\n\s*\n", description):
        lines = [line.strip() for line in paragraph.splitlines() if line.strip()]
        if not lines or lines[0].startswith(("Usage:", "imgfilter ")):
            continue  # examples keep their own lines
        short = [line for line in lines[:-1] if len(line) < columns // 2]
        assert not short, (short, paragraph)


def test_an_output_without_an_extension_is_named_as_such(tmp_path, color_png):
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "-o", tmp_path / "out")
    message = assert_one_line_error(result, 4, "needs an extension naming its format")
    assert "no extension is not" not in message and ".png" in message
    assert list(tmp_path.iterdir()) == [color_png]


def test_help_lists_every_command_in_order():
    result = run("--help")
    assert_ok(result)
    from imgfilter.cli.typer_app import COMMANDS

    listed = [line.split()[1] for line in result.stdout.splitlines() if line[:2] == "│ "]
    commands = [word for word in listed if word in COMMANDS]
    assert commands == list(COMMANDS)


def test_every_command_is_registered_by_its_module():
    run("--help")  # loads every command module
    from imgfilter.cli.typer_app import COMMANDS

    registered = {c.name: c.callback.__module__ for c in cli.app.registered_commands}
    assert registered == {name: f"imgfilter.cli.{mod}" for name, mod in COMMANDS.items()}


def test_unknown_command_suggests_the_close_one():
    result = run("blr", "x.png")
    assert result.exit_code == 2
    assert "No such command 'blr'" in result.output and "'blur'" in result.output
    assert result.output.count("Did you mean") == 1  # Click and old Typer both suggest


def test_a_command_imports_and_builds_only_its_own_module():
    code = (
        "import sys\n"
        "import imgfilter.cli.typer_app\n"
        "group = sys.modules['imgfilter.cli.typer_app']._Commands\n"
        "built = []\n"
        "add = group._add\n"
        "group._add = lambda self, name: (built.append(name), add(self, name))\n"
        "try:\n"
        "    imgfilter.cli.app(['contour', '--help'], prog_name='imgfilter')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "mods = sorted(m for m in sys.modules if m.startswith('imgfilter.cli.'))\n"
        "print('BUILT', built, 'MODULES', mods)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "BUILT ['contour']" in proc.stdout, proc.stdout
    for other in ("compare", "bench", "classify"):
        assert f"imgfilter.cli.{other}'" not in proc.stdout, proc.stdout
    assert "imgfilter.cli.filters'" in proc.stdout, proc.stdout


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def module(*args: str | Path, **env: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "imgfilter", *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=600,
    )


def test_help_does_not_import_numba_or_cv2():
    code = (
        "import sys\n"
        "import imgfilter.cli\n"
        "for args in (['--help'], ['blur', '--help'], ['compare', '--help']):\n"
        "    try:\n"
        "        imgfilter.cli.app(args, prog_name='imgfilter')\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in ('numba', 'cv2', 'llvmlite') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout, proc.stdout


def test_module_blur_subprocess(color_png):
    proc = module("blur", color_png, "--k", "5", "--backend", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("wrote ") and "photo.blur.png" in proc.stderr
    out = imread(color_png.with_name("photo.blur.png"))
    assert _max_diff(out, opencv.blur(imread(color_png), 5)) <= 1


def test_module_errors_subprocess(color_png, tmp_path):
    for args, code in [
        (["blur", tmp_path / "missing.png", "--k", "3"], 3),
        (["blur", color_png, "--k", "0"], 2),
        (["filter", color_png, "--kernel", "1,2;3"], 2),
        (["blur", color_png, "--k", "3", "-o", color_png], 4),
    ]:
        proc = module(*args, "--backend", "cpu")
        assert proc.returncode == code, (args, proc.returncode, proc.stderr)
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("imgfilter: error: "), proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout


def test_module_compare_json_subprocess(color_png):
    proc = module("compare", color_png, "--kernel", SOBEL, "--backend", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["identical"] is True and record["psnr_db"] is None


def test_auto_backend_errors_stay_one_line_subprocess(color_png, tmp_path):
    """Without the simulator, auto may note a CPU fallback; never beside an error line."""
    clean = {"NUMBA_ENABLE_CUDASIM": None}
    existing = color_png.with_name("photo.blur.png")
    existing.write_bytes(b"keep")
    for args, code in [
        (["blur", tmp_path / "missing.png", "--k", "3"], 3),
        (["blur", color_png, "--k", "3"], 4),
        (["contour", color_png, "-o", tmp_path / "out.xyz"], 4),
    ]:
        proc = module(*args, **clean)
        assert proc.returncode == code, (args, proc.returncode, proc.stderr)
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("imgfilter: error: "), proc.stderr
    assert existing.read_bytes() == b"keep"


def test_auto_backend_success_subprocess(gray_png):
    proc = module("contour", gray_png, NUMBA_ENABLE_CUDASIM=None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("wrote ")
    got = imread(gray_png.with_name("gray.contour.png"))
    np.testing.assert_array_equal(got, opencv.contour(imread(gray_png)))


@pytest.mark.skipif(real_gpu_present(), reason="a real GPU is present")
def test_backend_cuda_without_gpu_is_device_error(color_png):
    proc = module("blur", color_png, "--k", "3", "--backend", "cuda", NUMBA_ENABLE_CUDASIM=None)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgfilter: error: "), proc.stderr
    assert "GPU" in lines[0] and "Traceback" not in proc.stderr
    assert not color_png.with_name("photo.blur.png").exists()


def test_bench_rejects_unknown_size():
    result = runner.invoke(cli.app, ["bench", "--sizes", "seed,16k"])
    assert result.exit_code == 2
    assert "unknown size 16k" in result.output and "seed, 4k, 8k" in result.output


def test_bench_json_into_missing_directory_is_output_error(tmp_path):
    result = runner.invoke(cli.app, ["bench", "--json", str(tmp_path / "no" / "r.json")])
    assert result.exit_code == 4
    assert "does not exist" in result.output


@pytest.mark.skipif(real_gpu_present(), reason="a real GPU is present")
def test_bench_without_gpu_is_device_error():
    proc = module("bench", "--quick", NUMBA_ENABLE_CUDASIM=None)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgfilter: error: "), proc.stderr


def test_cli_messages_name_cli_options_and_api_messages_api_parameters(tmp_path):
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), np.full((6, 7, 3), 9, np.uint8))
    out = tmp_path / "out.png"
    out.write_bytes(b"keep")
    result = run("blur", src, "--k", "3", "-o", out)
    assert result.exit_code == 4 and "pass --force" in result.output
    assert "overwrite=True" not in result.output
    result = run("blur", src, "--k", "3", "-o", tmp_path)
    assert result.exit_code == 4 and "is a directory" in result.output
    import imgfilter

    with pytest.raises(imgfilter.UsageError, match="rows of equal length"):
        imgfilter.filter2d(np.ones((4, 4), np.uint8), [[1, 2], [3]])


def test_a_cuda_method_on_the_cpu_backend_is_said_to_be_unused(tmp_path):
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), np.full((6, 7, 3), 9, np.uint8))
    result = run("blur", src, "--k", "3", "--backend", "cpu", "--method", "twopass",
                 "-o", tmp_path / "o.png")  # fmt: skip
    assert result.exit_code == 0
    assert "--method twopass applies to the CUDA backend" in result.output


@pytest.mark.parametrize("op, method", [("blur", "naive"), ("filter", "twopass")])
def test_a_method_of_another_operation_is_a_usage_error(tmp_path, op, method):
    """Each operation's --method names its own kernels: blur's box kernels, filter's
    correlation kernels."""
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), np.full((6, 7, 3), 9, np.uint8))
    extra = ["--k", "3"] if op == "blur" else ["--kernel", "1,2,1"]
    result = run(op, src, *extra, "--backend", "cpu", "--method", method, "-o", tmp_path / "o.png")
    name = "blur" if op == "blur" else "filter2d"
    assert_one_line_error(result, 2, f"unknown {name} method '{method}'")


# ---------------------------------------------------------------------------------------
# Issue 25: clean help, --quiet, --quality, --keep-metadata, frames, completion, Ctrl-C

COMMANDS = ("blur", "filter", "contour", "compare", "bench", "train", "classify")


@pytest.mark.parametrize("args", [["--help"], *([c, "--help"] for c in COMMANDS)])
def test_help_shows_no_type_placeholders(args):
    result = run(*args)
    assert_ok(result)
    for placeholder in ("<bool>", "{IN", "<path>"):
        assert placeholder not in result.output, (placeholder, result.output)
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    if args[0] in ("blur", "filter", "contour", "compare", "train", "classify"):
        assert usage.split()[-1 if args[0] != "train" else -2] == "INPUT", usage


def test_help_subprocess_is_clean():
    proc = module("blur", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "imgfilter blur [OPTIONS] INPUT" in proc.stdout
    assert "<bool>" not in proc.stdout and "{" not in proc.stdout


def test_shell_completion_is_available():
    result = run("--help")
    assert "--install-completion" in result.output and "--show-completion" in result.output
    # Typer detects the shell from the process tree (a test has none to offer); its own
    # tests name the shell instead, as here.
    proc = module("--show-completion", "bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    assert proc.returncode == 0, proc.stderr
    assert "_IMGFILTER_COMPLETE" in proc.stdout
    proc = module(_IMGFILTER_COMPLETE="complete_bash", COMP_WORDS="imgfilter bl", COMP_CWORD="1")
    assert proc.returncode == 0 and proc.stdout.split() == ["blur"], (proc.stdout, proc.stderr)


def _frames(path: Path, n: int, fmt: str | None = None) -> Path:
    from PIL import Image

    ims = [Image.fromarray(np.full((9, 11, 3), 40 * i, np.uint8)) for i in range(n)]
    ims[0].save(path, format=fmt, save_all=True, append_images=ims[1:])
    return path


@pytest.mark.parametrize(("name", "word"), [("anim.gif", "frames"), ("pages.tif", "pages")])
def test_several_frames_are_noted_in_one_line(tmp_path, name, word):
    src = _frames(tmp_path / name, 3)
    out = tmp_path / "out.png"
    result = run("blur", src, "--k", "3", "--backend", "cpu", "-o", out)
    assert_ok(result)
    lines = result.stderr.splitlines()
    assert lines[0] == f"imgfilter: {src} has 3 {word}; reading the first", lines
    assert lines[-1].startswith("wrote ") and len(lines) == 2, lines
    result = run("blur", src, "--k", "3", "--backend", "cpu", "-o", out, "-f", "-q")
    assert_ok(result)
    assert result.stderr == ""


def test_one_frame_gif_gets_no_note(tmp_path):
    src = _frames(tmp_path / "one.gif", 1)
    result = run("blur", src, "--k", "3", "--backend", "cpu", "-o", tmp_path / "o.png")
    assert_ok(result)
    assert "frames" not in result.stderr


def test_quiet_leaves_only_errors(color_png, tmp_path):
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "--method", "fused", "-q")
    assert_ok(result)
    assert result.stderr == "" and color_png.with_name("photo.blur.png").exists()
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "-q")  # exists now
    assert_one_line_error(result, 4, "exists")
    result = run("compare", color_png, "--k", "3", "--backend", "cpu", "-q", "--json")
    assert_ok(result)
    assert result.stderr == "" and json.loads(result.stdout)["agree"] is True


def test_quiet_subprocess_auto_backend_note_dropped(gray_png):
    proc = module("contour", gray_png, "-q", NUMBA_ENABLE_CUDASIM=None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_quality_sets_jpeg_quality(tmp_path):
    src = imwrite(tmp_path / "in.png", random_image((64, 64, 3)))
    sizes = {}
    for q in (10, 95):
        out = tmp_path / f"q{q}.jpg"
        assert_ok(run("blur", src, "--k", "1", "--backend", "cpu", "--quality", q, "-o", out))
        sizes[q] = out.stat().st_size
    default = tmp_path / "default.jpg"
    assert_ok(run("blur", src, "--k", "1", "--backend", "cpu", "-o", default))
    assert sizes[10] < sizes[95] and default.read_bytes() == (tmp_path / "q95.jpg").read_bytes()


def test_quality_makes_webp_lossy(tmp_path):
    src = imwrite(tmp_path / "in.png", random_image((64, 64, 3)))
    lossless, lossy = tmp_path / "ll.webp", tmp_path / "q50.webp"
    assert_ok(run("blur", src, "--k", "1", "--backend", "cpu", "-o", lossless))
    assert_ok(run("blur", src, "--k", "1", "--backend", "cpu", "--quality", "50", "-o", lossy))
    assert np.array_equal(imread(lossless), imread(src))
    assert lossy.read_bytes()[12:16] == b"VP8 " and not np.array_equal(imread(lossy), imread(src))


@pytest.mark.parametrize(
    ("value", "out", "word"),
    [("101", "o.jpg", "--quality"), ("-1", "o.jpg", "--quality"), ("x", "o.jpg", "--quality"),
     ("80", "o.png", "JPEG and WebP"), ("80", "o.tif", "JPEG and WebP")],
)  # fmt: skip
def test_bad_quality_is_a_usage_error(color_png, tmp_path, value, out, word):
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "--quality", value,
                 "-o", tmp_path / out)  # fmt: skip
    assert_one_line_error(result, 2, word)
    assert not (tmp_path / out).exists()


def _photo_with_metadata(path: Path, orientation: int = 6) -> tuple[Path, bytes]:
    from PIL import Image

    icc = b"fake ICC profile " * 100
    exif = Image.Exif()
    exif[0x010F] = "imgfilter test camera"
    exif[0x0112] = orientation
    im = Image.fromarray(random_image((24, 32, 3), seed=3))
    im.save(path, exif=exif.tobytes(), icc_profile=icc, quality=95)
    return path, icc


@pytest.mark.parametrize("ext", [".jpg", ".png", ".webp"])
def test_keep_metadata_copies_exif_and_icc(tmp_path, ext):
    from PIL import Image

    src, icc = _photo_with_metadata(tmp_path / "photo.jpg")
    out = tmp_path / f"out{ext}"
    result = run("blur", src, "--k", "3", "--backend", "cpu", "--keep-metadata", "-o", out)
    assert_ok(result)
    assert len(result.stderr.splitlines()) == 1, result.stderr
    with Image.open(out) as im:
        im.load()
        assert im.info.get("icc_profile") == icc
        exif = im.getexif()
        assert exif.get(0x010F) == "imgfilter test camera"
        assert exif.get(0x0112) == 1  # the pixels are upright already
        assert im.size == (24, 32)  # EXIF orientation 6 applied to the pixels
    # Without the flag: neither.
    plain = tmp_path / f"plain{ext}"
    assert_ok(run("blur", src, "--k", "3", "--backend", "cpu", "-o", plain))
    with Image.open(plain) as im:
        assert not im.info.get("icc_profile") and 0x010F not in im.getexif()


def test_keep_metadata_notes_what_it_cannot_keep(tmp_path, color_png):
    src, _ = _photo_with_metadata(tmp_path / "photo.jpg")
    result = run("blur", src, "--k", "3", "--backend", "cpu", "--keep-metadata",
                 "-o", tmp_path / "o.tif")  # fmt: skip
    assert_ok(result)
    assert "TIFF outputs are written without EXIF or ICC" in result.stderr.splitlines()[0]
    result = run("blur", color_png, "--k", "3", "--backend", "cpu", "--keep-metadata")
    assert_ok(result)
    assert "has no EXIF or ICC profile to keep" in result.stderr.splitlines()[0]


def test_keyboard_interrupt_in_a_command_is_one_line_and_130(color_png, monkeypatch):
    from imgfilter import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "blur", interrupted)
    result = run("blur", color_png, "--k", "3", "--backend", "cpu")
    assert result.exit_code == 130, (result.exit_code, result.output)
    assert result.stderr == "imgfilter: interrupted\n"
    assert not color_png.with_name("photo.blur.png").exists()


def test_commands_run_in_a_worker_thread_and_errors_come_back(color_png, monkeypatch):
    """The command body runs outside the main thread (so Ctrl-C reaches the main
    thread at once); its errors and exit codes come back unchanged."""
    import threading

    from imgfilter import api

    seen = []

    def blur(*args, **kwargs):
        seen.append(threading.current_thread() is threading.main_thread())
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "blur", blur)
    result = run("blur", color_png, "--k", "3", "--backend", "cpu")
    assert_one_line_error(result, 1, "unexpected RuntimeError: boom")
    assert seen == [False]


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_spinner_on_a_terminal_only_for_long_work_and_not_with_quiet(tmp_path):
    """stderr a terminal, work over a second: a rich spinner naming the stage, erased
    at the end; --quiet: nothing at all."""
    import pty
    import select

    # Past the spinner's 1 s in the filter: the CPU backend's FFT tiles of a 101x101
    # kernel took 1.5 s on an idle 2-core machine (a 51x51 kernel's 0.9 s: no spinner
    # while filtering there).
    src = imwrite(tmp_path / "in.bmp", random_image((4000, 4000, 3)))
    kern = np.random.default_rng(0).random((101, 101)).astype(np.float32)
    np.save(tmp_path / "k.npy", kern / kern.sum())

    def run_on_pty(*extra: str) -> tuple[int, str]:
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "imgfilter", "filter", str(src), "--kernel",
             str(tmp_path / "k.npy"), "--backend", "cpu", "-f", "-o", str(tmp_path / "o.bmp"),
             *extra],
            stderr=slave, stdout=subprocess.DEVNULL,
            env=_env(NUMBA_NUM_THREADS="1", TERM="xterm", COLUMNS="100"),
        )  # fmt: skip
        os.close(slave)
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                data = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")

    rc, text = run_on_pty()
    assert rc == 0, text
    assert "filter on cpu" in text, text  # the stage, shown while filtering
    assert "wrote " in text
    rc, text = run_on_pty("-q")
    assert rc == 0 and text == "", text


def test_bench_takes_quiet():
    """Every command takes --quiet (bench: no "wrote" line and no notes)."""
    result = run("bench", "--help")
    assert_ok(result)
    assert "--quiet" in result.output


# ------------------------------------------------------------------ NumPy .npy images


def test_npy_in_npy_out_equals_the_api(tmp_path):
    """A float32 .npy (memory-mapped by the reader) gives INPUT_STEM.OP.npy beside it:
    the array API's result, bit for bit, for each command; a uint16 one contours."""
    img = (np.random.default_rng(3).standard_normal((41, 57, 3)) * 100).astype(np.float32)
    np.save(tmp_path / "a.npy", img)
    k = np.random.default_rng(4).standard_normal((5, 3)).astype(np.float32)
    np.save(tmp_path / "k.npy", k)
    assert_ok(run("blur", tmp_path / "a.npy", "--k", "7", "--border", "wrap", "--backend", "cpu"))
    want = imgfilter.blur(img, 7, border="wrap", backend="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "a.blur.npy"), want)
    assert_ok(run("filter", tmp_path / "a.npy", "--kernel", tmp_path / "k.npy", "--backend", "cpu"))
    want = imgfilter.filter2d(img, k, backend="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "a.filter.npy"), want)
    gray = random_image((30, 40), np.uint16, seed=5)
    np.save(tmp_path / "g.npy", gray)
    assert_ok(run("contour", tmp_path / "g.npy", "--backend", "cpu"))
    want = imgfilter.contour(gray, backend="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "g.contour.npy"), want)


@pytest.mark.parametrize("available", [4000, 10**12])
def test_npy_output_is_filtered_straight_into_the_file(tmp_path, monkeypatch, available):
    """A single .npy output whose result would take more than half the available
    memory: the filter's `out` is a memory map of the file being written (the result
    is never made in memory and then encoded); a smaller one is made in memory."""
    from imgfilter.cli import filtering

    monkeypatch.setattr(filtering, "available_memory", lambda: available)
    mapped = available < 40 * 33 * 3 * 2 * 2
    img = random_image((40, 33, 3), np.uint16, seed=7)
    np.save(tmp_path / "a.npy", img)
    outs = []
    real = imgfilter.api.filter2d

    def spy(image, kernel, **kwargs):
        outs.append(kwargs.get("out"))
        return real(image, kernel, **kwargs)

    monkeypatch.setattr(imgfilter.api, "filter2d", spy)
    if mapped:
        monkeypatch.setattr(imgfilter.io, "write_image", lambda *a, **k: pytest.fail("encoded"))
    k = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "k.npy", k)
    assert_ok(run("filter", tmp_path / "a.npy", "--kernel", tmp_path / "k.npy", "-o",
                  tmp_path / "r.npy", "--backend", "cpu"))  # fmt: skip
    assert len(outs) == 1 and isinstance(outs[0], np.memmap) == mapped
    want = real(img, k, backend="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "r.npy"), want)


def test_npy_in_a_directory_is_picked_up_and_bad_ones_are_one_line(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    np.save(src / "a.npy", random_image((20, 30, 3), seed=6))
    assert_ok(run("blur", src, "--k", "3", "--out-dir", tmp_path / "out", "--backend", "cpu"))
    assert (tmp_path / "out" / "a.blur.npy").exists()
    np.save(tmp_path / "bad.npy", np.zeros((4, 5, 6), np.uint8))
    assert_one_line_error(run("blur", tmp_path / "bad.npy", "--k", "3", "--backend", "cpu"), 3,
                          "bad.npy", "unsupported image layout")  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("available", [0, 10**13])
def test_gpu_npy_in_npy_out_equals_the_api(tmp_path, monkeypatch, available):
    """On the GPU: .npy images (memory-mapped, read-only; the uint8 one above the size
    that goes through host bands) give the CUDA array API's result, bit for bit
    (contour: integer images only), filtered into a map of the output file (no
    memory available) or in memory."""
    from imgfilter.cli import filtering

    monkeypatch.setattr(filtering, "available_memory", lambda: available)
    rng = np.random.default_rng(8)
    images = {
        "u8": rng.integers(0, 256, (3001, 4003, 3), dtype=np.uint8),
        "u16": rng.integers(0, 65536, (1001, 999), dtype=np.uint16),
        "f32": (rng.standard_normal((1999, 1001)) * 1e3).astype(np.float32),
    }
    k = (rng.standard_normal((21, 21)) / 21).astype(np.float32)
    np.save(tmp_path / "k.npy", k)
    for name, img in images.items():
        src = tmp_path / f"{name}.npy"
        np.save(src, img)
        want = {
            "blur": imgfilter.blur(img, 21, backend="cuda"),
            "filter": imgfilter.filter2d(img, k, backend="cuda"),
        }
        assert_ok(run("blur", src, "--k", "21", "--backend", "cuda"))
        assert_ok(run("filter", src, "--kernel", tmp_path / "k.npy", "--backend", "cuda"))
        if img.dtype != np.float32:
            want["contour"] = imgfilter.contour(img, backend="cuda")
            assert_ok(run("contour", src, "--backend", "cuda"))
        for op, result in want.items():
            np.testing.assert_array_equal(np.load(tmp_path / f"{name}.{op}.npy"), result)
