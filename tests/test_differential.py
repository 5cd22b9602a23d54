"""Seeded differential test: random calls of the array API against OpenCV.

Each case draws, from its own seed, an operation (filter2d, blur, contour), an image
shape (1x1 up to tall and wide strips), dtype, channel count, border (and constant
value), anchor, kernel size and rank (full, rank 1, rank 2; integer or float taps), a
method, a backend, the input's kind (host, or a device array: Numba's, CuPy's or
torch's where present), the call's form (one image, a 4-D batch, a list of images of
different sizes) and, for host images on the GPU, a `max_gpu_bytes` that forces row
bands. Every case is compared with OpenCV (`tests/test_filters.py`'s references and
agreement bars). Mismatches are collected, so one run reports them all with the
seeds that reproduce them (`case(seed)`).

On Numba's simulator (CI) a few dozen small cases run; on a real GPU the `gpu` test
runs IMGFILTER_DIFF_CASES cases at full range: 300 by default (about two minutes on an
H200, most of it compiles of the kernels asked for by name); 10,000 before and after a
change to the runtime, from IMGFILTER_DIFF_SEED on, split over up to 4 processes with
different seeds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import cv2
import numpy as np
import pytest
from conftest import ON_GPU
from test_filters import (
    BORDERS,
    DTYPES,
    assert_agrees,
    blur_reference,
    border_value,
    float_tolerance,
    make_image,
    make_kernel,
)

import imgfilter
from imgfilter.backends import opencv as ref

FILTER_METHODS = ("auto", "naive", "padded", "tiled", "window", "blocked", "separable")
BLUR_METHODS = ("auto", "tiled", "twopass", "fused", "packed", "running", "separable")
# The box kernels that take only what their plan accepts, and whether they read 32-bit
# words (the image must start on a 4-byte boundary).
PLANNED_BOXES = {"tiled": ("tiled_plan", True), "twopass": ("twopass_plan", True),
                 "fused": ("plan", False), "packed": ("packed_plan", True)}  # fmt: skip
MAX_SIDE = 31  # the largest kernel side methods blocked and separable take
SEED0 = 20_000


@dataclass
class Case:
    """One call and what it is compared with."""

    seed: int
    op: str
    shape: tuple
    dtype: type
    border: str
    backend: str
    method: str
    source: str  # "host", "numba", "cupy", "torch"
    form: str  # "one", "batch", "list"
    ksize: tuple = (1, 1)
    rank: str = "full"
    kind: str = "float"
    anchor: tuple | None = None
    huge: bool = False
    budget: int | None = None
    extra_shapes: list = field(default_factory=list)

    def __str__(self) -> str:
        parts = [f"seed={self.seed}", self.op, f"{self.shape}", np.dtype(self.dtype).name,
                 self.border, self.backend, self.method, self.source, self.form]  # fmt: skip
        if self.op != "contour":
            parts += [f"k={self.ksize}", self.rank, self.kind, f"anchor={self.anchor}"]
        if self.huge:
            parts.append("huge")
        if self.budget:
            parts.append(f"max_gpu_bytes={self.budget}")
        return " ".join(parts)


def _side(rng: np.random.Generator, full: bool) -> int:
    """An image side: mostly small, sometimes 1, on a GPU sometimes long."""
    if not full:
        return int(rng.choice([1, 2, 3, 5, 7, 9, 12]))
    roll = rng.random()
    if roll < 0.08:
        return 1
    if roll < 0.5:
        return int(rng.integers(2, 40))
    if roll < 0.92:
        return int(rng.integers(40, 400))
    return int(rng.integers(400, 3000))


# Kernel shapes on a GPU: every class (1xN, Nx1, even, odd, past blocked's 31x31) from
# a fixed set, so that the kernels specialised by size compile a bounded number of times.
GPU_KSHAPES = ((1, 1), (1, 3), (3, 1), (2, 2), (3, 3), (4, 7), (5, 5), (7, 7), (1, 9), (9, 1),
               (6, 6), (8, 3), (11, 11), (15, 15), (21, 21), (3, 21), (21, 3), (31, 31),
               (41, 41), (41, 21))  # fmt: skip


def _kernel_shape(rng: np.random.Generator, full: bool) -> tuple[int, int]:
    if not full:
        return int(rng.choice([1, 2, 3, 4, 5])), int(rng.choice([1, 2, 3, 4, 5]))
    kh, kw = GPU_KSHAPES[int(rng.integers(len(GPU_KSHAPES)))]
    return int(kh), int(kw)


def _sources(backend: str) -> list[str]:
    if backend == "cpu":
        return ["host"]
    found = ["host", "numba"]
    if ON_GPU:
        for name in ("cupy", "torch"):
            try:
                __import__(name)
                found.append(name)
            except ImportError:
                pass
    return found


def case(seed: int, full: bool, backend: str | None = None) -> Case:
    """The case of this seed (`full`: the GPU's range of sizes, else the simulator's)."""
    rng = np.random.default_rng(seed)
    op = str(rng.choice(["filter2d", "filter2d", "blur", "blur", "contour"]))
    backend = backend or str(rng.choice(["cuda", "cuda", "cuda", "cpu"]))
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    if op == "contour" and dtype == np.float32:  # contour takes integer images only
        dtype = np.uint8
    h, w = _side(rng, full), _side(rng, full)
    if h * w > 400_000:  # a long strip, not a huge image
        w = max(1, 400_000 // h)
    channels = rng.choice([0, 1, 3, 4])
    shape = (h, w) if channels == 0 else (h, w, int(channels))
    border = str(rng.choice(BORDERS))
    source = str(rng.choice(_sources(backend)))
    form = str(rng.choice(["one", "one", "one", "batch", "list"]))
    c = Case(seed, op, shape, dtype, border, backend, "auto", source, form)
    c.huge = dtype == np.float32 and rng.random() < 0.1
    if op != "contour":
        c.ksize = _kernel_shape(rng, full)
        c.kind = str(rng.choice(["int", "float"]))
        if rng.random() < 0.3:
            c.anchor = (int(rng.integers(c.ksize[1])), int(rng.integers(c.ksize[0])))
    if op == "filter2d":
        c.rank = str(rng.choice(["full", "full", "rank1", "rank2"]))
        c.method = str(rng.choice(FILTER_METHODS))
        if c.method == "separable":
            c.rank = "rank1"
        if c.method in ("blocked", "separable") and max(c.ksize) > MAX_SIDE:
            c.method = "auto"
    elif op == "blur":
        c.method = str(rng.choice(BLUR_METHODS))
    if form == "list":
        c.extra_shapes = [(_side(rng, full), _side(rng, full)) + shape[2:] for _ in range(2)]
    elif form == "batch":
        c.extra_shapes = [shape] * int(rng.integers(1, 3))
    if op == "blur" and not _box_method_takes(c):
        c.method = "auto"
    if backend == "cuda" and source == "host" and form == "one" and rng.random() < 0.3:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        c.budget = max(1, nbytes // int(rng.integers(2, 6)))
    return c


def _box_method_takes(c: Case) -> bool:
    """Whether blur method c.method takes every image of the case: its plan accepts
    the shape, dtype and box, and a kernel reading words gets 4-byte aligned images
    (a device batch's images follow one another at their size)."""
    if c.method not in PLANNED_BOXES:
        return True
    from kernels.box import plan

    name, words = PLANNED_BOXES[c.method]
    for shape in [c.shape, *c.extra_shapes]:
        shape3 = shape if len(shape) == 3 else (*shape, 1)
        if getattr(plan, name)(shape3, np.dtype(c.dtype), c.ksize) is None:
            return False
        nbytes = int(np.prod(shape3)) * np.dtype(c.dtype).itemsize
        if words and c.form == "batch" and c.source != "host" and nbytes % 4:
            return False
    return True


def _rank_kernel(c: Case) -> np.ndarray:
    """The case's kernel: taps as tests/test_filters.py makes them, of the case's rank
    (a sum of outer products; integer factors in {-1, 1} keep integer sums exact)."""
    kh, kw = c.ksize
    if c.rank == "full":
        return make_kernel(c.kind, (kh, kw), c.seed + 1)
    rng = np.random.default_rng(c.seed + 1)
    terms = 1 if c.rank == "rank1" else 2
    k = np.zeros((kh, kw))
    for _ in range(terms):
        if c.kind == "int":
            u = rng.choice([-1.0, 1.0], kh) * (rng.random(kh) < 0.6)
            v = rng.choice([-1.0, 1.0], kw) * (rng.random(kw) < 0.6)
            u[kh // 2], v[kw // 2] = 1.0, 1.0
        else:
            u, v = rng.standard_normal(kh), rng.standard_normal(kw)
        k += np.outer(u, v)
    if c.kind == "float":
        k *= 2.0 / max(np.abs(k).sum(), 1e-6)
    if k.sum() < 0:
        k = -k
    return k.astype(np.float32)


def _to_device(img: np.ndarray, source: str):
    if source == "cupy":
        import cupy

        return cupy.asarray(img)
    if source == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(img)).cuda()
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(img))


def _to_host(arr) -> np.ndarray:
    if isinstance(arr, np.ndarray):
        return arr
    if hasattr(arr, "copy_to_host"):
        return arr.copy_to_host()
    if hasattr(arr, "get"):
        return arr.get()
    return arr.cpu().numpy()


def _reference(c: Case, img: np.ndarray, kernel: np.ndarray | None) -> np.ndarray:
    value = border_value(c.border, c.dtype)
    if c.op == "filter2d":
        return ref.filter2d(img, kernel, c.anchor, c.border, value).reshape(img.shape)
    if c.op == "blur":
        return _blur_reference(c, img, value)
    return ref.contour(img, c.border, value)


def _blur_reference(c: Case, img: np.ndarray, value: float) -> np.ndarray:
    """cv2.blur with the case's anchor: the box is an all-ones kernel over its area,
    so cv2.filter2D of the same box (anchor as given) is the reference when an anchor is
    set; without one, tests/test_filters.py's cv2.blur reference."""
    kh, kw = c.ksize
    if c.anchor is None:
        return blur_reference(img, (kh, kw), c.border, value)
    box = np.full((kh, kw), 1.0 / (kh * kw), np.float64)
    return ref.filter2d(img, box, c.anchor, c.border, value).reshape(img.shape)


def _call(c: Case, images, kernel):
    value = border_value(c.border, c.dtype)
    common = dict(border=c.border, border_value=value, backend=c.backend, method=c.method)
    batch = c.form != "one"
    if c.op == "filter2d":
        fn = imgfilter.filter2d_batch if batch else imgfilter.filter2d
        common.update(anchor=c.anchor)
        args = (images, kernel)
    elif c.op == "blur":
        fn = imgfilter.blur_batch if batch else imgfilter.blur
        common.update(anchor=c.anchor)
        args = (images, (c.ksize[1], c.ksize[0]))
    else:
        fn = imgfilter.contour_batch if batch else imgfilter.contour
        args = (images,)
    if c.budget is not None:
        common.update(max_gpu_bytes=c.budget)
    return fn(*args, **common)


def _inputs(c: Case) -> list[np.ndarray]:
    shapes = [c.shape] + list(c.extra_shapes)
    return [make_image(s, c.dtype, c.seed + 2 + i, huge=c.huge) for i, s in enumerate(shapes)]


# Cases where OpenCV's own result was wrong and the float64 reference was taken.
OPENCV_WRONG: list[str] = []
CV_BORDER = {"reflect101": cv2.BORDER_REFLECT_101, "reflect": cv2.BORDER_REFLECT,
             "replicate": cv2.BORDER_REPLICATE, "constant": cv2.BORDER_CONSTANT,
             "wrap": cv2.BORDER_WRAP}  # fmt: skip


def exact_reference(c: Case, img: np.ndarray, kernel: np.ndarray | None) -> np.ndarray:
    """The filter in float64 (filter2d: the correlation; blur: the box sum over its
    area), rounded half to even and saturated for integer images: the reference where
    OpenCV itself is wrong. Found so: cv2.filter2D of a float32 image by a 21x31
    kernel anchored at (0, 12) (its DFT path) off by thousands in the last 10 columns,
    and cv2.blur of a 2x1 box of two 255s giving 0 in a 1-channel uint8 image's last
    column (opencv-python-headless 5.0)."""
    value = border_value(c.border, c.dtype)
    weights = np.ones(c.ksize) if c.op == "blur" else kernel.astype(np.float64)
    kh, kw = weights.shape
    ax, ay = c.anchor if c.anchor is not None else (kw // 2, kh // 2)
    src = img.reshape(img.shape[0], img.shape[1], -1).astype(np.float64)
    pad = cv2.copyMakeBorder(
        src, ay, kh - 1 - ay, ax, kw - 1 - ax, CV_BORDER[c.border], value=(value,) * 4
    ).reshape(src.shape[0] + kh - 1, -1, src.shape[2])
    h, w = src.shape[:2]
    out = np.zeros(src.shape)
    for i in range(kh):
        for j in range(kw):
            if weights[i, j]:
                out += weights[i, j] * pad[i : i + h, j : j + w]
    if c.op == "blur":
        out /= kh * kw
    if np.dtype(c.dtype) == np.float32:
        return out.astype(np.float32).reshape(img.shape)
    info = np.iinfo(c.dtype)
    return np.clip(np.rint(out), info.min, info.max).astype(c.dtype).reshape(img.shape)


def run_case(c: Case) -> bool:
    """Run case `c` and assert agreement with OpenCV, or, where OpenCV disagrees, with
    `exact_reference` (noted in OPENCV_WRONG); returns whether some reference value is
    non-zero."""
    hosts = _inputs(c)
    kernel = _rank_kernel(c) if c.op == "filter2d" else None
    if c.form == "batch":
        given = np.stack(hosts)
        if c.source != "host":
            given = _to_device(given, c.source)
    elif c.source == "host":
        given = hosts if c.form == "list" else hosts[0]
    else:
        devices = [_to_device(h, c.source) for h in hosts]
        given = devices if c.form == "list" else devices[0]
    got = _call(c, given, kernel)
    results = [_to_host(r) for r in got] if c.form != "one" else [_to_host(got)]
    nonzero = False
    for img, result in zip(hosts, results, strict=True):
        want = _reference(c, img, kernel)
        l1 = float(np.abs(kernel).sum()) if kernel is not None else 1.0
        exact = c.op == "contour" or (c.op == "filter2d" and c.kind == "int")
        if c.op == "blur":  # as tests/test_filters.py's check_blur
            exact = (c.backend == "cpu" and c.dtype == np.uint8 and c.anchor is None
                     and c.ksize[0] * c.ksize[1] <= 256)  # fmt: skip
        tol = float_tolerance(l1, img, border_value(c.border, c.dtype))
        result = np.asarray(result).reshape(want.shape)
        try:
            nonzero |= assert_agrees(result, want, exact=exact, tol=tol, what=str(c))
        except AssertionError:
            if c.op == "contour":  # integer arithmetic throughout: OpenCV is exact
                raise
            exact = exact and c.op == "filter2d"
            what = f"{c} (OpenCV disagreed; float64 too)"
            want = exact_reference(c, img, kernel)
            nonzero |= assert_agrees(result, want, exact=exact, tol=tol, what=what)
            OPENCV_WRONG.append(str(c))
    return nonzero


def _run_many(seeds, full: bool, backend: str | None = None) -> None:
    failures, nonzero = [], 0
    for seed in seeds:
        c = case(seed, full, backend)
        try:
            nonzero += run_case(c)
        except Exception as exc:  # noqa: BLE001 - every mismatch is collected and reported
            failures.append(f"{c}: {type(exc).__name__}: {str(exc)[:300]}")
    assert not failures, f"{len(failures)} of {len(seeds)} cases failed:\n" + "\n".join(
        failures[:20]
    )
    assert nonzero > len(seeds) // 2, "most references were all zero: the test is vacuous"


def test_differential_cpu_backend():
    """The CPU backend over the full range of sizes (it is fast here)."""
    _run_many(range(SEED0, SEED0 + 60), full=True, backend="cpu")


def test_differential_cuda_simulator():
    """Small cases through the CUDA backend (the simulator in CI, the GPU elsewhere)."""
    _run_many(range(SEED0 + 1000, SEED0 + 1024), full=False, backend="cuda")


@pytest.mark.gpu
def test_differential_gpu_full():
    """IMGFILTER_DIFF_CASES cases at full range on the real GPU: 0 mismatches."""
    n = int(os.environ.get("IMGFILTER_DIFF_CASES", "300"))
    first = int(os.environ.get("IMGFILTER_DIFF_SEED", str(SEED0 + 100_000)))
    _run_many(range(first, first + n), full=True)


def test_case_draws_every_dimension():
    """The generator reaches every operation, form, border, dtype and method."""
    seen = [case(s, True) for s in range(SEED0, SEED0 + 2000)]
    assert {c.op for c in seen} == {"filter2d", "blur", "contour"}
    assert {c.form for c in seen} == {"one", "batch", "list"}
    assert {c.border for c in seen} == set(BORDERS)
    assert {np.dtype(c.dtype) for c in seen} == {np.dtype(d) for d in DTYPES}
    assert {c.method for c in seen if c.op == "filter2d"} == set(FILTER_METHODS)
    assert {c.method for c in seen if c.op == "blur"} == set(BLUR_METHODS)
    assert {c.rank for c in seen} >= {"full", "rank1", "rank2"}
    assert any(c.budget for c in seen) and any(1 in c.shape[:2] for c in seen)
    assert any(max(c.shape[:2]) >= 400 for c in seen)


@pytest.mark.parametrize("op", ["blur", "filter2d", "contour"])
@pytest.mark.parametrize("shape", [(9, 6), (9, 6, 1), (9, 6, 3)])
def test_row_bands_of_gray_and_colour_images(op, shape):
    """Host images forced into row bands (max_gpu_bytes) on the CUDA backend equal
    OpenCV for 2-D images too (their bands were once 2-D where the kernels take
    (H, W, C): an IndexError on the simulator, a TypeError on the GPU)."""
    c = Case(0, op, shape, np.uint8, "reflect101", "cuda", "auto", "host", "one")
    c.ksize, c.kind = (3, 5), "int"
    c.budget = int(np.prod(shape)) // 3
    assert run_case(c)


HOST = ("host", "one")


@pytest.mark.parametrize("which", ["filter2d-dft-anchor", "blur-uint8-last-column"])
def test_where_opencv_is_wrong_the_cpu_backend_equals_float64(which):
    """The two cases where OpenCV's result is wrong (see `exact_reference`): the CPU
    backend gives the float64 result."""
    if which == "filter2d-dft-anchor":
        c = Case(121145, "filter2d", (23, 247), np.float32, "reflect101", "cpu", "auto", *HOST)
        c.ksize, c.rank, c.kind, c.anchor = (21, 31), "rank2", "int", (0, 12)
    else:
        c = Case(125610, "blur", (1682, 233, 1), np.uint8, "wrap", "cpu", "auto", *HOST)
        c.ksize = (2, 1)
    img = _inputs(c)[0]
    kernel = _rank_kernel(c) if c.op == "filter2d" else None
    got = _call(c, img, kernel)
    want = exact_reference(c, img, kernel)
    tol = float_tolerance(float(np.abs(kernel).sum()) if kernel is not None else 1.0, img)
    assert assert_agrees(got.reshape(want.shape), want, exact=False, tol=tol)
