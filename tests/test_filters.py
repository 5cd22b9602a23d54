"""The OpenCV agreement suite, run for every backend through the array API.

Each check compares `imgfilter.filter2d / blur / contour` with OpenCV on random data
(fixed seeds; images never contain zeros, and references are checked not to be all
zero, so no comparison passes vacuously):
- filter2d vs cv2.filter2D (`imgfilter.backends.opencv.filter2d`, which extends it to
  wrap and to a constant border with a non-zero value),
- blur vs cv2.blur (wrap and constant-with-value: pad as the border says, cv2.blur,
  crop, so the reference is always cv2.blur's own arithmetic),
- contour vs cv2.cvtColor + four cv2.filter2D + cv2.bitwise_or, bit for bit.

Backends: "cpu" takes the full matrix at moderate sizes. "cuda" runs on Numba's CUDA
simulator in CI (tests/conftest.py), which costs ~0.1-1 s per call even for a 9x13
image, so its cases are a short table of tiny images chosen to reach every border,
kernel shape class and method; `sim_shape` says how big a case may be. The tests
marked `gpu` repeat the CUDA checks at full size (2167x2495x3, 517x1031) and run only
on a real GPU.

Agreement bars (docs/design.md): integer kernels on integer images bit-exact; float
kernels within 1 LSB for integer images; float32 images within `float_tolerance`.
"""

from __future__ import annotations

import zlib

import cv2
import numpy as np
import pytest
from conftest import ON_GPU

import imgfilter
from imgfilter import UsageError
from imgfilter.backends import opencv as ref
from imgfilter.border import OPENCV_BORDER
from kernels.conv.plan import auto_method

BORDERS = ("reflect101", "reflect", "replicate", "constant", "wrap")
DTYPES = (np.uint8, np.uint16, np.float32)
CUDA_METHODS = ("naive", "padded", "tiled", "window", "auto")
KSHAPES = ((1, 1), (2, 2), (3, 3), (4, 7), (1, 9), (9, 1), (6, 6), (21, 21), (31, 31))
# Image shapes for the CPU matrix: 2-D gray, 1/3/4 channels, 1xN, Nx1, smaller than
# most kernels, sides that are not multiples of 16/32.
CPU_SHAPES = ((37, 53, 3), (23, 17), (1, 41), (29, 1, 4), (5, 4, 1), (3, 2, 3))
FULL_SHAPES = ((2167, 2495, 3), (517, 1031))  # gpu-marked tests
INT_VALUE, FLOAT_VALUE = 77, -2.5  # constant-border values (non-zero on purpose)


def dt_name(dtype) -> str:
    return np.dtype(dtype).name


def sim_shape(backend: str, full: tuple, tiny: tuple) -> tuple:
    """The image shape a case may afford: `tiny` on the CUDA simulator, else `full`."""
    return tiny if backend == "cuda" and not ON_GPU else full


def border_value(border: str, dtype) -> float:
    if border != "constant":
        return 0.0
    return FLOAT_VALUE if np.dtype(dtype) == np.float32 else INT_VALUE


# ------------------------------------------------------------------------- data


def make_image(shape, dtype, seed: int, huge: bool = False) -> np.ndarray:
    """Random image without zeros: integers in [1, max]; float32 N(0, 100) or N(0, 1e30)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.float32:
        img = rng.standard_normal(shape) * (1e30 if huge else 100.0)
        img[img == 0] = 1.0
        return img.astype(np.float32)
    return rng.integers(1, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)


def int_kernel(shape, seed: int) -> np.ndarray:
    """Integer taps in [-3, 3], at most 24 non-zero (sum |k| <= 72, so every partial sum
    of a uint16 image stays below 2**24 and float32 accumulation is exact); sum > 0 so
    integer outputs are not all saturated to zero."""
    rng = np.random.default_rng(seed)
    size = shape[0] * shape[1]
    k = np.zeros(size)
    taps = rng.choice(size, min(size, 24), replace=False)
    k[taps] = rng.choice([-3, -2, -1, 1, 2, 3], taps.size)
    if k.sum() < 0:
        k = -k
    if k.sum() == 0:
        k[taps[0]] += 1
    return k.reshape(shape).astype(np.float32)


def float_kernel(shape, seed: int) -> np.ndarray:
    """Random normal taps scaled to sum |k| = 2, with a positive sum."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal(shape)
    k *= 2.0 / np.abs(k).sum()
    return (k if k.sum() > 0 else -k).astype(np.float32)


def make_kernel(kind: str, shape, seed: int) -> np.ndarray:
    return int_kernel(shape, seed) if kind == "int" else float_kernel(shape, seed)


# -------------------------------------------------------------------- agreement


def float_tolerance(kernel_l1: float, img: np.ndarray, value: float = 0.0) -> float:
    """DESIGN's "1e-5 relative" for float32, read as relative to the largest magnitude
    a correlation of this image can reach: 1e-5 * max(1, sum|kernel| * max|input|),
    where the input includes the constant border value. Element-wise relative error
    is meaningless where a sum cancels to near zero: the rounding error of any float32
    summation order (OpenCV's FMA SIMD body, its scalar tails, our kernels) scales
    with the magnitude of the terms, not of the result. Measured: below 1e-7 of it."""
    biggest = max(float(np.abs(img).max()), abs(value))
    return 1e-5 * max(1.0, kernel_l1 * biggest)


def assert_agrees(got, want, *, exact: bool, tol: float = 0.0, what: str = "") -> bool:
    """Same shape and dtype; integers equal (exact) or within 1 LSB; float32 within tol.

    Returns whether the reference has a non-zero value: each test asserts that some of
    its references do, so that no test passes on all-zero (saturated) outputs alone.
    """
    assert isinstance(got, np.ndarray), what
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype == np.float32:
        assert np.isfinite(got).all(), f"{what}: non-finite output"
        err = float(np.abs(got.astype(np.float64) - want).max())
        assert err <= tol, f"{what}: max abs error {err:.3g} > {tol:.3g}"
    elif exact:
        bad = np.argwhere(got != want)
        assert bad.size == 0, (
            f"{what}: {len(bad)} pixels differ, first at {tuple(bad[0])}: "
            f"{got[tuple(bad[0])]} vs OpenCV {want[tuple(bad[0])]}"
        )
    else:
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
        assert diff.max() <= 1, f"{what}: off by {diff.max()} LSB at {np.argmax(diff)}"
    return bool(np.any(want))


def check_filter2d(backend, method, img, kernel, *, kind, border, anchor=None, what=""):
    """imgfilter.filter2d against cv2.filter2D (bars as in the module docstring)."""
    value = border_value(border, img.dtype)
    got = imgfilter.filter2d(
        img,
        kernel,
        anchor=anchor,
        border=border,
        border_value=value,
        backend=backend,
        method=method,
    )
    want = ref.filter2d(img, kernel, anchor, border, value).reshape(img.shape)
    tol = float_tolerance(float(np.abs(kernel).sum()), img, value)
    return assert_agrees(got, want, exact=kind == "int", tol=tol, what=what)


def blur_reference(img, ksize, border, value) -> np.ndarray:
    """cv2.blur; for wrap and constant-with-value: pad first, blur, crop the middle."""
    kh, kw = ksize
    if border == "wrap" or (border == "constant" and value != 0):
        top, left = kh // 2, kw // 2
        bottom, right = kh - 1 - top, kw - 1 - left
        if border == "wrap":
            widths = ((top, bottom), (left, right)) + ((0, 0),) * (img.ndim - 2)
            padded = np.pad(img, widths, mode="wrap")
        else:
            padded = cv2.copyMakeBorder(
                img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(value,) * 4
            )
        full = cv2.blur(padded, (kw, kh), borderType=cv2.BORDER_REFLECT_101)
        full = full.reshape(padded.shape)
        out = full[top : top + img.shape[0], left : left + img.shape[1]]
    else:
        out = cv2.blur(img, (kw, kh), borderType=OPENCV_BORDER[border])
    return np.ascontiguousarray(out).reshape(img.shape)


def check_blur(backend, method, img, ksize, *, border, what=""):
    """imgfilter.blur against cv2.blur.

    The CPU backend reproduces cv2.blur's uint8 fixed-point scaling (boxes up to 256
    pixels), so it must be bit-exact there; otherwise integers within 1 LSB (OpenCV
    scales larger boxes in float32 in its SIMD body and in double in its scalar tail).
    """
    kh, kw = ksize
    value = border_value(border, img.dtype)
    got = imgfilter.blur(
        img, (kw, kh), border=border, border_value=value, backend=backend, method=method
    )
    want = blur_reference(img, (kh, kw), border, value)
    exact = backend == "cpu" and img.dtype == np.uint8 and kh * kw <= 256
    return assert_agrees(got, want, exact=exact, tol=float_tolerance(1.0, img, value), what=what)


def check_contour(backend, img, *, border, what=""):
    value = border_value(border, img.dtype)
    got = imgfilter.contour(img, border=border, border_value=value, backend=backend)
    want = ref.contour(img, border, value)
    return assert_agrees(got, want, exact=True, what=what)


# ------------------------------------------------------------ filter2d: CPU matrix


@pytest.mark.parametrize("kind", ["int", "float"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_name)
@pytest.mark.parametrize("kshape", KSHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("border", BORDERS)
def test_filter2d_cpu_matrix(border, kshape, dtype, kind):
    seed = zlib.crc32(f"{border}{kshape}{dt_name(dtype)}{kind}".encode())
    kernel = make_kernel(kind, kshape, seed)
    nonzero = []
    for i, shape in enumerate(CPU_SHAPES):
        img = make_image(shape, dtype, seed + i)
        nonzero += [
            check_filter2d("cpu", "auto", img, kernel, kind=kind, border=border, what=f"{shape}")
        ]
    assert any(nonzero)


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_name)
@pytest.mark.parametrize("border", BORDERS)
def test_filter2d_cpu_anchors(border, dtype):
    """Non-default anchors (OpenCV's (x, y)), odd and even kernels."""
    for j, (kshape, anchor) in enumerate(
        [((4, 7), (0, 0)), ((4, 7), (6, 3)), ((4, 7), (2, 1)), ((3, 3), (2, 0)), ((6, 6), (5, 1))]
    ):
        for kind in ("int", "float"):
            kernel = make_kernel(kind, kshape, 100 + j)
            img = make_image((19, 27, 3), dtype, 200 + j)
            assert check_filter2d(
                "cpu",
                "auto",
                img,
                kernel,
                kind=kind,
                border=border,
                anchor=anchor,
                what=f"{kshape} anchor {anchor} {kind}",
            )


@pytest.mark.parametrize("kshape", [(3, 3), (21, 21)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("border", BORDERS)
def test_filter2d_cpu_huge_float32(border, kshape):
    """float32 images of magnitude ~1e30 (no overflow, no precision loss beyond 1e-5)."""
    kernel = float_kernel(kshape, 7)
    for shape in ((31, 45, 3), (6, 1)):
        img = make_image(shape, np.float32, 8, huge=True)
        assert check_filter2d(
            "cpu", "auto", img, kernel, kind="float", border=border, what=f"{shape}"
        )


# -------------------------------------------------- filter2d: CUDA on the simulator

# (id, image shape, dtype, kernel shape, kernel kind, anchor (x, y), border)
CUDA_FILTER_CASES = [
    ("u8-4x7-r101", (9, 13), np.uint8, (4, 7), "int", None, "reflect101"),
    ("u8-3x3f-reflect", (9, 13), np.uint8, (3, 3), "float", None, "reflect"),
    ("u8c3-4x7-anchor00-replicate", (9, 13, 3), np.uint8, (4, 7), "int", (0, 0), "replicate"),
    ("u8-2x2-constant", (9, 13), np.uint8, (2, 2), "int", None, "constant"),
    ("u8-4x7-anchor63-wrap", (9, 13), np.uint8, (4, 7), "int", (6, 3), "wrap"),
    ("u8-1xN-1x9f", (1, 11), np.uint8, (1, 9), "float", None, "reflect101"),
    ("u16-Nx1-9x1f", (11, 1), np.uint16, (9, 1), "float", None, "reflect"),
    ("u16c4-3x3-anchor02", (6, 9, 4), np.uint16, (3, 3), "int", (0, 2), "replicate"),
    ("f32c3-7x7f-larger-constant", (5, 5, 3), np.float32, (7, 7), "float", None, "constant"),
    ("f32-6x6f-wrap", (7, 10), np.float32, (6, 6), "float", None, "wrap"),
    ("u8c1-6x6-smaller-wrap", (2, 3, 1), np.uint8, (6, 6), "int", None, "wrap"),
    ("u8-1x1-constant", (4, 5), np.uint8, (1, 1), "int", None, "constant"),
    ("u16-31x31f-r101", (3, 4), np.uint16, (31, 31), "float", None, "reflect101"),
]


def _cuda_filter_params():
    for case_id, *case in CUDA_FILTER_CASES:
        for method in CUDA_METHODS:
            if method == "naive" and case[2] == (31, 31):
                # naive maps borders per tap, ~5 ms a tap on the simulator (50 s here)
                continue
            yield pytest.param(method, *case, id=f"{case_id}-{method}")


@pytest.mark.parametrize(
    "method, shape, dtype, kshape, kind, anchor, border", list(_cuda_filter_params())
)
def test_filter2d_cuda(method, shape, dtype, kshape, kind, anchor, border):
    kernel = make_kernel(kind, kshape, 11)
    img = make_image(shape, dtype, 12)
    assert check_filter2d("cuda", method, img, kernel, kind=kind, border=border, anchor=anchor)


@pytest.mark.parametrize("method", ["auto", "separable", "tiled"])
@pytest.mark.parametrize("border", ["reflect101", "constant"])
def test_filter2d_cuda_rank1_kernel(method, border):
    """A 17x17 outer-product kernel: "auto" takes the separable passes (over 250 taps)."""
    g = np.exp(-0.5 * (np.arange(17) - 8.0) ** 2 / 9.0)
    kernel = np.outer(g, g[::-1] * np.linspace(0.5, 1.5, 17)).astype(np.float32)
    kernel /= kernel.sum()
    assert auto_method(kernel) == "separable"
    img = make_image((8, 11, 3) if border == "constant" else (8, 11), np.uint8, 13)
    assert check_filter2d("cuda", method, img, kernel, kind="float", border=border)


# (image shape, dtype, border, rank): sums of outer products through method "separable",
# one pair of 1-D passes per term; odd sizes, off-centre anchors, a constant border with
# a value (each term's row pass sees cval * that term's row sum).
LOW_RANK_CASES = [
    ((8, 11, 3), np.uint8, "constant", 2),
    ((6, 70, 3), np.uint8, "reflect101", 2),  # three tile columns of three channels
    ((9, 13), np.uint8, "reflect101", 3),
    ((7, 10, 4), np.uint16, "wrap", 2),
    ((6, 9), np.float32, "replicate", 3),
]


@pytest.mark.parametrize("shape, dtype, border, rank", LOW_RANK_CASES, ids=str)
def test_filter2d_cuda_low_rank_kernel(shape, dtype, border, rank):
    """A 7x9 kernel of rank 2 or 3 (max_separable_rank(7, 9) == 3), off-centre anchor."""
    rng = np.random.default_rng(rank)
    kernel = sum(np.outer(rng.random(7), rng.random(9) - 0.3) for _ in range(rank))
    kernel = (kernel / np.abs(kernel).sum()).astype(np.float32)
    img = make_image(shape, dtype, 16)
    assert check_filter2d(
        "cuda", "separable", img, kernel, kind="float", border=border, anchor=(2, 5)
    )


def test_filter2d_cuda_separable_refuses_rank_above_its_limit():
    kernel = np.random.default_rng(0).random((7, 9)).astype(np.float32)  # rank 7 > 3
    with pytest.raises(imgfilter.UsageError, match="at most 3 of them; this one has rank 7"):
        imgfilter.filter2d(np.zeros((5, 5), np.uint8), kernel, backend="cuda", method="separable")


def test_filter2d_cuda_huge_float32():
    kernel = float_kernel((3, 3), 14)
    img = make_image((5, 7), np.float32, 15, huge=True)
    assert check_filter2d("cuda", "auto", img, kernel, kind="float", border="reflect101")


# ----------------------------------------------------------------------- blur


@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("k", range(1, 32))
def test_blur_cpu_square(k, border):
    for dtype in DTYPES:
        for i, shape in enumerate(((27, 41, 3), (1, 37), (35, 1, 4), (4, 6))):
            img = make_image(shape, dtype, 1000 * k + i)
            assert check_blur(
                "cpu", "auto", img, (k, k), border=border, what=f"{dt_name(dtype)}{shape}"
            )


@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize(
    "ksize",  # (kh, kw)
    [(2, 1), (1, 2), (3, 5), (16, 17), (17, 16), (1, 31), (40, 3)],
    ids=lambda s: f"{s[0]}x{s[1]}",
)
def test_blur_cpu_rectangles(ksize, border):
    for dtype in DTYPES:
        img = make_image((33, 50, 3), dtype, 31)
        if ksize[0] * ksize[1] == 2 and dtype == np.uint8:
            # cv2.blur's 2-pixel uint8 box computes (a + b + 2) >> 1 and, in its scalar
            # tail, stores 256 as 0 when a = b = 255 (an OpenCV bug): keep away from it.
            img = np.minimum(img, 254)
        assert check_blur("cpu", "auto", img, ksize, border=border, what=dt_name(dtype))


def test_blur_cpu_huge_sums():
    """uint16 boxes past OpenCV's int32 sums (area > 2**15) and a wide uint8 box."""
    img16 = make_image((40, 230, 1), np.uint16, 32)
    assert check_blur("cpu", "auto", img16, (200, 181), border="reflect101")
    img8 = make_image((9, 600), np.uint8, 33)
    assert check_blur("cpu", "auto", img8, (3, 301), border="replicate")


# (id, shape, dtype, (kh, kw), border)
CUDA_BLUR_CASES = [
    ("u8-k1", (9, 13), np.uint8, (1, 1), "reflect101"),
    ("u8-k2-wrap", (9, 13), np.uint8, (2, 2), "wrap"),
    ("u8c3-k3-r101", (6, 7, 3), np.uint8, (3, 3), "reflect101"),
    ("u8-k4-constant", (9, 13), np.uint8, (4, 4), "constant"),
    ("u16-1xN-k5-replicate", (1, 11), np.uint16, (5, 5), "replicate"),
    ("f32-Nx1-k6-reflect", (11, 1), np.float32, (6, 6), "reflect"),
    ("u8-k16-larger", (5, 6), np.uint8, (16, 16), "reflect101"),
    ("u16c4-k31-larger", (3, 4, 4), np.uint16, (31, 31), "wrap"),
    ("u8-3x5", (9, 13), np.uint8, (3, 5), "reflect"),
]


@pytest.mark.parametrize("method", ["auto", "separable"])
@pytest.mark.parametrize(
    "shape, dtype, ksize, border",
    [c[1:] for c in CUDA_BLUR_CASES],
    ids=[c[0] for c in CUDA_BLUR_CASES],
)
def test_blur_cuda(method, shape, dtype, ksize, border):
    img = make_image(shape, dtype, 40)
    assert check_blur("cuda", method, img, ksize, border=border)


@pytest.mark.parametrize("method", ["tiled", "twopass", "fused", "packed", "running"])
def test_blur_cuda_named_methods(method):
    """blur through each box kernel by name (`method=`), and a case a kernel's plan
    refuses (uint16 for the uint8-only kernels) is a UsageError naming the method."""
    img = make_image((7, 9), np.uint8, 41)
    assert check_blur("cuda", method, img, (4, 4), border="reflect101")
    if method in ("tiled", "twopass", "packed"):
        with pytest.raises(UsageError, match=f"blur method '{method}' does not take"):
            imgfilter.blur(make_image((7, 9), np.uint16, 41), 3, method=method, backend="cuda")


@pytest.mark.parametrize("op", ["blur", "filter2d"])
def test_each_operation_names_its_own_methods(op):
    img = make_image((7, 9), np.uint8, 41)
    with pytest.raises(UsageError, match=f"unknown {op} method"):
        if op == "blur":
            imgfilter.blur(img, 3, method="naive", backend="cuda")
        else:
            imgfilter.filter2d(img, np.ones((3, 3)), method="twopass", backend="cuda")


# --------------------------------------------------------------------- contour

# (full, tiny): gray 2-D and (H, W, 1), BGR, BGRA, a single row, a single column
CONTOUR_SHAPES = (
    ((41, 67), (9, 13)),
    ((41, 67, 1), (9, 13, 1)),
    ((41, 67, 3), (9, 13, 3)),
    ((40, 33, 4), (9, 13, 4)),
    ((1, 7, 3), (1, 7, 3)),
    ((6, 1), (6, 1)),
)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16], ids=dt_name)
@pytest.mark.parametrize("border", BORDERS)
def test_contour_bit_exact(border, dtype, backend):
    for i, (full, tiny) in enumerate(CONTOUR_SHAPES):
        shape = sim_shape(backend, full, tiny)
        img = make_image(shape, dtype, 50 + i)
        assert check_contour(backend, img, border=border, what=f"{shape}")


def test_contour_flat_and_saturated_uint8():
    """A flat image gives zeros except where the constant border differs; strong edges
    saturate at 255: equal to OpenCV either way."""
    for backend in ("cpu", "cuda"):
        img = np.full((6, 8, 3), 200, np.uint8)
        img[:, 4:] = 10
        for border in ("reflect101", "constant"):
            assert check_contour(backend, img, border=border, what=f"{backend} {border}")


# ----------------------------------------------------------------- API contract


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_name)
def test_output_has_input_dtype_and_shape(backend, dtype):
    shapes = ((5, 6), (5, 6, 1), (5, 6, 3), (5, 6, 4))
    if backend == "cuda" and not ON_GPU:
        shapes = shapes[:2]  # 2-D in, 2-D out; (H, W, 1) in, (H, W, 1) out
    for shape in shapes:
        img = make_image(shape, dtype, 60)
        out = imgfilter.filter2d(img, np.ones((3, 3), np.float32) / 9, backend=backend)
        assert (out.shape, out.dtype) == (img.shape, img.dtype)
        out = imgfilter.blur(img, 3, backend=backend)
        assert (out.shape, out.dtype) == (img.shape, img.dtype)
        if dtype != np.float32:
            out = imgfilter.contour(img, backend=backend)
            assert (out.shape, out.dtype) == (img.shape[:2], img.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_name)
def test_cpu_constant_border_default_value_is_zero(dtype):
    """border="constant" without a value: OpenCV's own BORDER_CONSTANT (zeros)."""
    img = make_image((13, 21, 3), dtype, 61)
    kernel = float_kernel((5, 4), 62)
    got = imgfilter.filter2d(img, kernel, border="constant", backend="cpu")
    want = cv2.filter2D(img, -1, kernel, borderType=cv2.BORDER_CONSTANT)
    assert_agrees(got, want, exact=False, tol=float_tolerance(2.0, img))
    for k in (3, 20):
        got = imgfilter.blur(img, k, border="constant", backend="cpu")
        want = cv2.blur(img, (k, k), borderType=cv2.BORDER_CONSTANT)
        assert_agrees(got, want, exact=dtype == np.uint8 and k < 17, tol=float_tolerance(1, img))


_img = np.ones((8, 8, 3), np.uint8)
_k3 = np.ones((3, 3), np.float32)
BAD_CALLS = {
    "4-D image": lambda b: imgfilter.filter2d(np.ones((4, 4, 3, 1), np.uint8), _k3, backend=b),
    "2 channels": lambda b: imgfilter.blur(np.ones((4, 4, 2), np.uint8), 3, backend=b),
    "float64 image": lambda b: imgfilter.filter2d(np.ones((4, 4)), _k3, backend=b),
    "empty image": lambda b: imgfilter.blur(np.ones((0, 4), np.uint8), 3, backend=b),
    "empty kernel": lambda b: imgfilter.filter2d(_img, np.ones((0, 3)), backend=b),
    "NaN kernel": lambda b: imgfilter.filter2d(_img, np.array([[1, np.nan]]), backend=b),
    "inf kernel": lambda b: imgfilter.filter2d(_img, np.array([[np.inf]]), backend=b),
    "300x300 kernel": lambda b: imgfilter.filter2d(_img, np.ones((300, 300)), backend=b),
    "3-D kernel": lambda b: imgfilter.filter2d(_img, np.ones((3, 3, 3)), backend=b),
    "k=0": lambda b: imgfilter.blur(_img, 0, backend=b),
    "k=-3": lambda b: imgfilter.blur(_img, -3, backend=b),
    "k=2.5": lambda b: imgfilter.blur(_img, 2.5, backend=b),
    "anchor outside": lambda b: imgfilter.filter2d(_img, _k3, anchor=(3, 0), backend=b),
    "anchor negative": lambda b: imgfilter.filter2d(_img, _k3, anchor=(0, -2), backend=b),
    "blur anchor outside": lambda b: imgfilter.blur(_img, 3, anchor=(1, 5), backend=b),
    "unknown border": lambda b: imgfilter.blur(_img, 3, border="mirror", backend=b),
    "unknown method": lambda b: imgfilter.blur(_img, 3, method="fast", backend=b),
    "float32 contour": lambda b: imgfilter.contour(_img.astype(np.float32), backend=b),
}


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_usage_error(case, backend):
    with pytest.raises(UsageError):
        BAD_CALLS[case](backend)


def test_unknown_backend_raises_usage_error():
    with pytest.raises(UsageError):
        imgfilter.blur(_img, 3, backend="tpu")


# ------------------------------------------------------- full size, real GPU only

FULL_IDS = ["2167x2495x3", "517x1031"]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", FULL_SHAPES, ids=FULL_IDS)
@pytest.mark.parametrize("method", (*CUDA_METHODS, "blocked"))
@pytest.mark.parametrize(
    "kshape, kind, border",
    [
        ((3, 3), "int", "reflect101"),
        ((4, 7), "int", "wrap"),
        ((6, 6), "float", "constant"),
        ((21, 21), "float", "reflect"),
        ((31, 31), "float", "replicate"),
    ],
    ids=["3x3-int-r101", "4x7-int-wrap", "6x6-constant", "21x21-reflect", "31x31-replicate"],
)
def test_filter2d_full_size(kshape, kind, border, method, shape):
    for dtype in (np.uint8, np.uint16, np.float32) if len(shape) == 2 else (np.uint8,):
        img = make_image(shape, dtype, 70)
        kernel = make_kernel(kind, kshape, 71)
        assert check_filter2d(
            "cuda", method, img, kernel, kind=kind, border=border, what=dt_name(dtype)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("shape", FULL_SHAPES, ids=FULL_IDS)
@pytest.mark.parametrize("method", ["auto", "window", "tiled", "padded"])
@pytest.mark.parametrize(
    "k, border", [(41, "reflect101"), (61, "constant")], ids=["41x41-r101", "61x61-constant"]
)
def test_filter2d_larger_than_the_blocked_kernel_full_size(k, border, method, shape):
    """Past blocked's 31x31 auto runs window (up to 61x61): the size-generic kernels."""
    for dtype in (np.uint8, np.uint16, np.float32) if len(shape) == 2 else (np.uint8,):
        img = make_image(shape, dtype, 74)
        kernel = make_kernel("float", (k, k), 75)
        assert check_filter2d(
            "cuda", method, img, kernel, kind="float", border=border, what=dt_name(dtype)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("shape", FULL_SHAPES, ids=FULL_IDS)
@pytest.mark.parametrize(
    "k, rank", [(21, 3), (31, 2), (5, 2)], ids=["21x21-r3", "31x31-r2", "5x5-r2"]
)
@pytest.mark.parametrize("border", ["reflect101", "constant"])
def test_filter2d_low_rank_full_size(k, rank, border, shape):
    rng = np.random.default_rng(k + rank)
    kernel = sum(np.outer(rng.standard_normal(k), rng.standard_normal(k)) for _ in range(rank))
    kernel = (kernel / np.abs(kernel).sum()).astype(np.float32)
    for dtype in (np.uint8, np.float32) if len(shape) == 2 else (np.uint8,):
        img = make_image(shape, dtype, 73)
        assert check_filter2d(
            "cuda", "separable", img, kernel, kind="float", border=border, what=dt_name(dtype)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("shape", FULL_SHAPES, ids=FULL_IDS)
@pytest.mark.parametrize(
    "method, k",  # the box kernels by name at a small and a large box
    [(m, k) for m in ("auto", "separable") for k in (2, 3, 21, 31)]
    + [(m, k) for m in ("tiled", "twopass", "fused", "packed", "running") for k in (3, 21)],
)
@pytest.mark.parametrize("border", BORDERS)
def test_blur_full_size(border, method, k, shape):
    from kernels.box import plan

    plans = {"tiled": plan.tiled_plan, "twopass": plan.twopass_plan, "fused": plan.plan,
             "packed": plan.packed_plan}  # fmt: skip
    for dtype in (np.uint8, np.uint16, np.float32) if len(shape) == 2 else (np.uint8,):
        shape3 = shape if len(shape) == 3 else (*shape, 1)
        if method in plans and plans[method](shape3, np.dtype(dtype), (k, k)) is None:
            continue  # the kernel does not take this case (test_blur_cuda_named_methods)
        img = make_image(shape, dtype, 72)
        assert check_blur("cuda", method, img, (k, k), border=border, what=dt_name(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2167, 2495, 3), (517, 1031, 4), (517, 1031)])
@pytest.mark.parametrize("border", BORDERS)
def test_contour_full_size(border, shape):
    for dtype in (np.uint8, np.uint16):
        img = make_image(shape, dtype, 73)
        assert check_contour("cuda", img, border=border, what=dt_name(dtype))
