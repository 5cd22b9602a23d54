"""The named filters (imgfilter.named: gaussian, sobel, scharr, laplacian,
gradient_magnitude, sharpen) against OpenCV on random images, most on the CPU backend,
a few tiny ones through the CUDA backend (Numba's simulator without a GPU), and their
commands (`imgfilter gaussian`, `edges`, `sharpen`).

Tolerances, as the docstrings state them: integer results of integer kernels with
integer scale and delta are bit-exact; 8- and 16-bit Gaussians equal OpenCV's
fixed-point results but where the exact sum is a half (OpenCV rounds up, imgfilter to
even: checked to be the only difference for 8-bit); other integer results within
1 LSB; float32 within `1e-5 * sum|kernel| * max|img|`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

import imgfilter
from imgfilter import cli
from imgfilter.border import OPENCV_BORDER, pad

BORDERS = ("reflect101", "reflect", "replicate", "constant", "wrap")
SHAPES = [(13, 17, 3), (1, 9), (9, 1), (6, 5, 4), (7, 8, 1)]
CV_DEPTH = {np.uint8: cv2.CV_8U, np.uint16: cv2.CV_16U, np.int16: cv2.CV_16S,
            np.float32: cv2.CV_32F, np.float64: cv2.CV_64F}  # fmt: skip


def _image(shape, dtype, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return (rng.random(shape) * 255).astype(dtype)
    return rng.integers(0, np.iinfo(dtype).max + 1, shape).astype(dtype)


def _correlate64(img: np.ndarray, kernel: np.ndarray, border: str) -> np.ndarray:
    """The exact (float64, integer sums exact) correlation, centre anchor, any border."""
    kh, kw = kernel.shape
    p = pad(img, kh // 2, kh // 2, kw // 2, kw // 2, border).astype(np.float64)
    h, w = img.shape[:2]
    total = np.zeros(img.shape, np.float64)
    for i in range(kh):
        for j in range(kw):
            total += float(kernel[i, j]) * p[i : i + h, j : j + w]
    return total


def _saturated(values: np.ndarray, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.rint(values), info.min, info.max).astype(dtype)


def _float_tol(kernel: np.ndarray, img: np.ndarray) -> float:
    return 1e-5 * float(np.abs(kernel).sum()) * max(1.0, float(np.abs(img).max()))


def _cv_gaussian(img, ksize, sx, sy, border) -> np.ndarray:
    """cv2.GaussianBlur in img's shape (OpenCV drops a trailing axis of 1)."""
    size = tuple(ksize) if isinstance(ksize, tuple) else (ksize, ksize)
    blurred = cv2.GaussianBlur(img, size, sx, sigmaY=sy, borderType=OPENCV_BORDER[border])
    return blurred.reshape(img.shape)


GAUSSIANS = [(3, 0, 0), (5, 0, 0), (9, 0, 0), (0, 1.5, 0), ((5, 9), 1.2, 2.3), ((1, 7), 0, 1.5)]


# ----------------------------------------------------------------------------- gaussian


@pytest.mark.parametrize("border", BORDERS)
def test_gaussian_uint8_is_opencv_but_for_exact_halves(border):
    """8-bit: imgfilter rounds the exact fixed-point sum half to even, OpenCV half up;
    nothing else differs (the sums are exact in float32)."""
    differing = 0
    for n, shape in enumerate(SHAPES):
        img = _image(shape, np.uint8, seed=n)
        for ksize, sx, sy in GAUSSIANS + [(21, 3.5, 0)]:
            ours = imgfilter.gaussian(img, ksize, sx, sy, border=border, backend="cpu")
            kernel = imgfilter.gaussian_kernel(ksize, sx, sy, np.uint8)
            sums = np.round(_correlate64(img, kernel, border) * 65536).astype(np.int64)
            even = _saturated(sums / 65536, np.uint8)  # np.rint: half to even
            np.testing.assert_array_equal(ours, even, err_msg=f"{shape} {ksize} {sx}")
            if border == "wrap":
                continue  # cv2.GaussianBlur refuses it
            theirs = _cv_gaussian(img, ksize, sx, sy, border)
            up = np.clip((sums + 32768) >> 16, 0, 255)
            np.testing.assert_array_equal(theirs, up)
            assert np.abs(ours.astype(int) - theirs).max() <= 1
            differing += int((ours != theirs).sum())
    if border != "wrap":
        assert differing > 0, "no exact halves met: the test lost its point"


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
@pytest.mark.parametrize("border", BORDERS[:4])
def test_gaussian_uint16_float32_equal_opencv(dtype, border):
    for n, shape in enumerate(SHAPES):
        img = _image(shape, dtype, seed=10 + n)
        for ksize, sx, sy in GAUSSIANS:
            ours = imgfilter.gaussian(img, ksize, sx, sy, border=border, backend="cpu")
            theirs = _cv_gaussian(img, ksize, sx, sy, border)
            diff = np.abs(ours.astype(np.float64) - theirs)
            assert ours.dtype == dtype and ours.shape == img.shape
            assert diff.max() <= (1 if dtype == np.uint16 else _float_tol(np.ones(1), img))


def test_gaussian_size_from_sigma_follows_the_dtype():
    """OpenCV: round(sigma * 2 * r + 1) | 1, r = 3 sigma for 8-bit images, else 4."""
    assert imgfilter.gaussian_kernel(0, 2.0, dtype=np.uint8).shape == (13, 13)
    assert imgfilter.gaussian_kernel(0, 2.0, dtype=np.float32).shape == (17, 17)
    assert imgfilter.gaussian_kernel((0, 5), 1.0, 2.5, np.uint16).shape == (5, 9)
    assert imgfilter.gaussian_kernel(7, 0, dtype=np.uint8).sum() == 1.0  # fixed point


# -------------------------------------------------------------------------- derivatives

DERIVATIVES = {
    "sobel 1,0 k3": (lambda i, **o: imgfilter.sobel(i, 1, 0, 3, **o),
                     lambda i, d, **o: cv2.Sobel(i, d, 1, 0, ksize=3, **o)),
    "sobel 1,1 k5": (lambda i, **o: imgfilter.sobel(i, 1, 1, 5, **o),
                     lambda i, d, **o: cv2.Sobel(i, d, 1, 1, ksize=5, **o)),
    "sobel 0,2 k1": (lambda i, **o: imgfilter.sobel(i, 0, 2, 1, **o),
                     lambda i, d, **o: cv2.Sobel(i, d, 0, 2, ksize=1, **o)),
    "scharr 0,1": (lambda i, **o: imgfilter.scharr(i, 0, 1, **o),
                   lambda i, d, **o: cv2.Scharr(i, d, 0, 1, **o)),
    "laplacian 1": (lambda i, **o: imgfilter.laplacian(i, 1, **o),
                    lambda i, d, **o: cv2.Laplacian(i, d, ksize=1, **o)),
    "laplacian 3": (lambda i, **o: imgfilter.laplacian(i, 3, **o),
                    lambda i, d, **o: cv2.Laplacian(i, d, ksize=3, **o)),
    "laplacian 5": (lambda i, **o: imgfilter.laplacian(i, 5, **o),
                    lambda i, d, **o: cv2.Laplacian(i, d, ksize=5, **o)),
}  # fmt: skip
DDEPTHS = [None, np.uint8, np.uint16, np.int16, np.float32, np.float64]


@pytest.mark.parametrize("src", [np.uint8, np.uint16, np.float32])
@pytest.mark.parametrize("name", list(DERIVATIVES))
def test_derivatives_equal_opencv(name, src):
    """Every ddepth OpenCV takes, four borders, integral and fractional scale/delta."""
    ours_f, theirs_f = DERIVATIVES[name]
    for n, shape in enumerate(SHAPES[:3]):
        img = _image(shape, src, seed=20 + n)
        for ddepth in DDEPTHS:
            for border in BORDERS[:4]:
                for scale, delta in ((1, 0), (2, 3), (0.3, -7.5)):
                    opts = dict(scale=scale, delta=delta, borderType=OPENCV_BORDER[border])
                    try:
                        theirs = theirs_f(img, -1 if ddepth is None else CV_DEPTH[ddepth], **opts)
                    except cv2.error:
                        continue  # a combination OpenCV refuses (imgfilter takes it)
                    ours = ours_f(img, scale=scale, delta=delta, ddepth=ddepth, border=border,
                                  backend="cpu")  # fmt: skip
                    assert ours.dtype == theirs.dtype and ours.shape == img.shape
                    diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max()
                    what = (shape, ddepth, border, scale, delta, diff)
                    if theirs.dtype.kind == "f":
                        assert diff <= 1e-5 * (128 * scale * float(img.max()) + abs(delta)), what
                    elif src != np.float32 and scale == int(scale) and delta == int(delta):
                        assert diff == 0, what
                    else:
                        assert diff <= 1, what


def test_sobel_7_on_bright_uint16_is_exact():
    """A 7x7 Sobel of a bright 16-bit image has partial sums past float32's exact
    integers; the host image is summed per byte, so the result stays exact."""
    rng = np.random.default_rng(5)
    img = (60000 + rng.integers(0, 300, (9, 11))).astype(np.uint16)
    kx, ky = cv2.getDerivKernels(1, 0, 7, ktype=cv2.CV_64F)
    exact = _correlate64(img, np.outer(ky, kx), "reflect101")
    for ddepth in (None, np.int16, np.float32):
        ours = imgfilter.sobel(img, 1, 0, 7, ddepth=ddepth, backend="cpu")
        want = exact.astype(np.float32) if ddepth is np.float32 else _saturated(exact, ours.dtype)
        np.testing.assert_array_equal(ours, want)
    ours = imgfilter.laplacian(img, 7, ddepth=np.float64, backend="cpu")
    kd, ks = cv2.getDerivKernels(2, 0, 7, ktype=cv2.CV_64F)
    lap = np.outer(ks, kd) + np.outer(kd, ks)
    np.testing.assert_array_equal(ours, _correlate64(img, lap, "reflect101"))


def test_derivative_out_and_wrap():
    img = _image((6, 7, 3), np.uint8, seed=3)
    out = np.empty(img.shape, np.int16)
    got = imgfilter.sobel(img, 0, 1, ddepth=np.int16, border="wrap", backend="cpu", out=out)
    assert got is out
    kx, ky = cv2.getDerivKernels(0, 1, 3, ktype=cv2.CV_64F)
    np.testing.assert_array_equal(out, _correlate64(img, np.outer(ky, kx), "wrap"))


# ---------------------------------------------------------------- magnitude and sharpen


@pytest.mark.parametrize("src", [np.uint8, np.uint16, np.float32])
def test_gradient_magnitude_equals_cv2_magnitude(src):
    """The correctly rounded root of the Sobel derivatives (exact for integer images);
    cv2.magnitude approximates it within 2 ulps, its 8 bits within 1."""
    for n, shape in enumerate(SHAPES[:4]):
        img = _image(shape, src, seed=30 + n)
        if src == np.float32:
            img /= 255  # an image in [0, 1], as the uint8 scaling takes it
        for ksize, border in ((3, "reflect101"), (1, "replicate"), (5, "constant")):
            bt = OPENCV_BORDER[border]
            gx, gy = (cv2.Sobel(img, cv2.CV_64F, dx, 1 - dx, ksize=ksize, borderType=bt)
                      for dx in (1, 0))  # fmt: skip
            exact = np.sqrt(gx * gx + gy * gy).reshape(shape)
            gx, gy = (cv2.Sobel(img, cv2.CV_32F, dx, 1 - dx, ksize=ksize, borderType=bt)
                      for dx in (1, 0))  # fmt: skip
            mag = cv2.magnitude(gx.reshape(shape[0], -1), gy.reshape(shape[0], -1))
            ours = imgfilter.gradient_magnitude(img, ksize, border=border, backend="cpu")
            assert ours.dtype == np.float32 and ours.shape == img.shape
            tol = 1e-5 * 64 * ksize * ksize * float(img.max()) if src == np.float32 else 0
            assert np.abs(ours - exact.astype(np.float32)).max() <= tol
            np.testing.assert_allclose(ours, mag.reshape(shape), rtol=3e-7, atol=tol)
            alpha = {np.uint8: 1, np.uint16: 255 / 65535, np.float32: 255}[src]
            edges = imgfilter.gradient_magnitude(img, ksize, np.uint8, border=border,
                                                 backend="cpu")  # fmt: skip
            assert edges.dtype == np.uint8
            if src == np.uint8:
                np.testing.assert_array_equal(edges, _saturated(exact, np.uint8))
            want = cv2.convertScaleAbs(mag, alpha=alpha).reshape(shape)
            assert np.abs(edges.astype(int) - want).max() <= 1


@pytest.mark.parametrize("src", [np.uint8, np.uint16, np.float32])
def test_sharpen_is_the_unsharp_mask_formula(src):
    """Within 1 LSB of img + amount * (img - blur) in float64 (the blur unrounded), and
    with a threshold, values within it of the (rounded) blur keep the input's."""
    for n, (shape, border) in enumerate(zip(SHAPES, BORDERS, strict=True)):
        img = _image(shape, src, seed=40 + n)
        for sigma, amount in ((1.0, 1.0), (2.0, 0.6)):
            g = imgfilter.gaussian_kernel(0, sigma, sigma, src).astype(np.float64)
            want = img + amount * (img - _correlate64(img, g, border))
            ours = imgfilter.sharpen(img, sigma, amount, border=border, backend="cpu")
            assert ours.dtype == img.dtype and ours.shape == img.shape
            if src == np.float32:
                assert np.abs(ours - want).max() <= 1e-5 * (1 + 2 * amount) * 255
                continue
            assert np.abs(ours.astype(np.float64) - _saturated(want, src)).max() <= 1
            threshold = 0.05 * np.iinfo(src).max
            blurred = imgfilter.gaussian(img, 0, sigma, border=border, backend="cpu")
            keep = np.abs(img.astype(np.float64) - blurred) < threshold
            got = imgfilter.sharpen(img, sigma, amount, threshold, border=border, backend="cpu")
            np.testing.assert_array_equal(got, np.where(keep, img, ours))


# ---------------------------------------------------------- CUDA backend (simulator)


CUDA_IMG = _image((4, 5, 3), np.uint8, seed=50)
CUDA_CALLS = {  # (call, LSBs apart: sharpen's float kernel sums round in their own order)
    "gaussian": (lambda b: imgfilter.gaussian(CUDA_IMG, 3, 0, border="replicate", backend=b), 0),
    "sobel int16": (lambda b: imgfilter.sobel(CUDA_IMG, 1, 0, ddepth=np.int16, backend=b), 0),
    "laplacian delta": (lambda b: imgfilter.laplacian(CUDA_IMG[..., 0], 3, delta=10,
                                                      backend=b), 0),
    "sharpen": (lambda b: imgfilter.sharpen(CUDA_IMG, 0.8, 1.5, ksize=3, backend=b), 1),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CUDA_CALLS))
def test_cuda_backend_gives_the_cpu_backends_results(name):
    """Tiny images through backend="cuda": single filter2d calls and the float32 copy."""
    call, lsb = CUDA_CALLS[name]
    ours, cpu = call("cuda"), call("cpu")
    assert ours.dtype == cpu.dtype and np.abs(ours.astype(int) - cpu).max() <= lsb


def test_device_image_single_call_and_refusals():
    from numba import cuda

    host = _image((4, 6), np.uint8, seed=51)
    dev = cuda.to_device(host)
    got = imgfilter.gaussian(dev, 3, 0)
    assert not isinstance(got, np.ndarray)
    want = imgfilter.gaussian(host, 3, 0, backend="cpu")
    np.testing.assert_array_equal(got.copy_to_host(), want)
    with pytest.raises(imgfilter.UsageError, match="device image.*float32 first"):
        imgfilter.sobel(dev, 1, 0, ddepth=np.int16)
    with pytest.raises(imgfilter.UsageError, match="host images"):
        imgfilter.gradient_magnitude(dev)
    with pytest.raises(imgfilter.UsageError, match="threshold takes host images"):
        imgfilter.sharpen(dev, 1.0, 1.0, 2.0)


# ------------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda i: imgfilter.gaussian(i, 4, 1.0), "odd"),
        (lambda i: imgfilter.gaussian(i, 0, 0), "sigma_x, which must be > 0"),
        (lambda i: imgfilter.gaussian(i, (3, 0), 0), "sigma_y, which must be > 0"),
        (lambda i: imgfilter.gaussian(i, 0, 50.0), "301-tap kernel"),
        (lambda i: imgfilter.gaussian(i, (3, 3, 3), 1.0), "(width, height)"),
        (lambda i: imgfilter.gaussian(i, 3, float("nan")), "sigma_x must be finite"),
        (lambda i: imgfilter.sobel(i, 0, 0), "not both 0"),
        (lambda i: imgfilter.sobel(i, 3, 0, 3), "dx=3 needs a larger ksize"),
        (lambda i: imgfilter.sobel(i, 1, 0, 4), "ksize must be odd"),
        (lambda i: imgfilter.sobel(i, 1, 0, ddepth=np.int32), "ddepth must be"),
        (lambda i: imgfilter.sobel(i, 1.5, 0), "dx must be an integer"),
        (lambda i: imgfilter.scharr(i, 1, 1), "(1, 0) or (0, 1)"),
        (lambda i: imgfilter.laplacian(i, 33), "ksize must be odd, 1 to 31"),
        (lambda i: imgfilter.laplacian(i, scale="2"), "scale must be a number"),
        (lambda i: imgfilter.gradient_magnitude(i, dtype=np.int16), "np.float32 or np.uint8"),
        (lambda i: imgfilter.sharpen(i, 1.0, 1.0, -1), "threshold must be >= 0"),
        (lambda i: imgfilter.sharpen(i, 0, 1.0), "sigma_x, which must be > 0"),
        (lambda i: imgfilter.sobel(i, 1, 0, ddepth=np.int16, out=np.empty(i.shape)), "int16"),
        (lambda i: imgfilter.gaussian(i, 3, 1.0, border="mirror"), "border"),
    ],
)
def test_bad_arguments_are_usage_errors_naming_the_problem(call, words):
    with pytest.raises(imgfilter.UsageError) as info:
        call(_image((5, 5), np.uint8))
    assert words in str(info.value), str(info.value)


# ----------------------------------------------------------------------------- commands

runner = CliRunner()


def _run(*args) -> tuple[int, str]:
    """`imgfilter ARGS` in this process (`cli.main`): (exit code, stderr)."""
    with runner.isolation() as (_, err, _both):
        try:
            cli.main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0
        sys.stderr.flush()
        return code, err.getvalue().decode()


def test_commands_write_what_the_api_gives(tmp_path):
    img = _image((15, 19, 3), np.uint8, seed=60)
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), img)
    code, err = _run("gaussian", src, "--k", 5, "--sigma", 1.5, "--backend", "cpu")
    assert code == 0, err
    want = imgfilter.gaussian(img, 5, 1.5, backend="cpu")
    np.testing.assert_array_equal(cv2.imread(str(tmp_path / "in.gaussian.png")), want)
    out = tmp_path / "s.png"
    code, err = _run("sharpen", src, "--sigma", 1, "--amount", 2, "--threshold", 3,
                     "--border", "replicate", "--backend", "cpu", "-o", out)  # fmt: skip
    assert code == 0, err
    want = imgfilter.sharpen(img, 1.0, 2.0, 3.0, border="replicate", backend="cpu")
    np.testing.assert_array_equal(cv2.imread(str(out)), want)


def test_edges_writes_8_bits_of_a_16_bit_image_and_folders(tmp_path):
    """edges' result is uint8 whatever the input: a 16-bit PNG may go to JPEG."""
    folder = tmp_path / "in"
    folder.mkdir()
    imgs = [_image((9, 12), np.uint16, seed=61), _image((8, 7, 3), np.uint16, seed=62)]
    for n, img in enumerate(imgs):
        cv2.imwrite(str(folder / f"{n}.png"), img)
    code, err = _run("edges", folder, "--out-dir", tmp_path / "out", "--backend", "cpu")
    assert code == 0, err
    for n, img in enumerate(imgs):
        got = cv2.imread(str(tmp_path / "out" / f"{n}.edges.png"), cv2.IMREAD_UNCHANGED)
        want = imgfilter.gradient_magnitude(img, 3, np.uint8, backend="cpu")
        np.testing.assert_array_equal(got, want)
    code, err = _run("edges", folder / "1.png", "--k", 5, "-o", tmp_path / "e.jpg")
    assert code == 0 and Path(tmp_path / "e.jpg").exists(), err


@pytest.mark.parametrize(
    "args, words",
    [
        (("gaussian",), "give --k K (odd), --sigma S (> 0), or both"),
        (("gaussian", "--k", "4"), "--k must be odd"),
        (("gaussian", "--sigma", "50"), "301-tap kernel"),
        (("edges", "--k", "2"), "--k must be odd"),
        (("sharpen", "--sigma", "0"), "--sigma must be > 0"),
        (("sharpen", "--sigma", "1", "--method", "twopass"), "unknown filter2d method"),
    ],
)
def test_command_usage_errors(tmp_path, args, words):
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), _image((4, 4), np.uint8))
    code, err = _run(args[0], src, *args[1:], "--backend", "cpu")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0], err


def test_docstring_examples_hold():
    import doctest

    from imgfilter import named

    result = doctest.testmod(named, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 6 and result.failed == 0


def test_edges_into_a_memory_mapped_npy_is_uint8(tmp_path, monkeypatch):
    """A result too large for memory is written through a map of the output .npy: of
    the result's dtype (uint8 for edges), not the input's."""
    from imgfilter.cli import filtering

    monkeypatch.setattr(filtering, "available_memory", lambda: 0)
    img = _image((10, 13, 3), np.uint16, seed=63)
    np.save(tmp_path / "in.npy", img)
    code, err = _run("edges", tmp_path / "in.npy", "--backend", "cpu")
    assert code == 0, err
    got = np.load(tmp_path / "in.edges.npy")
    np.testing.assert_array_equal(got, imgfilter.gradient_magnitude(img, 3, np.uint8))
