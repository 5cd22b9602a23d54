"""What a Python user feels calling GPU filters in a loop on device arrays: imgfilter
beside CV-CUDA, PyTorch and CuPy, in one run (GPU only).

    python benchmarks/pipeline.py [--quick] [--calls N] [--only SUBSTR[,SUBSTR]]
                                  [--json FILE] [--list]
    imgfilter bench --pipeline [--quick] [--json FILE]      # the same, from a checkout

BENCHMARKS.md's "In a pipeline" table and README's figures come from its JSON.

Every call runs on one non-default CuPy stream `s = cupy.cuda.Stream(non_blocking=True)`:
imgfilter and kernels get `stream=s`; CuPy peers run inside `with s:`; torch peers
inside `torch.cuda.stream(torch.cuda.ExternalStream(s.ptr))`; CV-CUDA gets
`stream=cvcuda.as_stream(s)`. Inputs are random uint8 RGB device images (CuPy arrays).

Per case and implementation:
- per-call us: wall time of `calls` calls queued back to back (after warm-up), up to
  and including one final `s.synchronize()`, divided by `calls`; the median of
  --loops such loops (a pause of the host, a garbage collection or another process,
  lands in one loop, not in the figure). host us: the same loop's wall time before
  the synchronisation, divided by `calls`, in the loop whose per-call time is the
  median.
- kernel us: a spin kernel keeps s busy (`kernels.common.timing.spin_window`, for
  1.5 * host_us * n / 1e6 + 0.01 s), a start event is recorded behind it, n calls
  are queued, then an end event; (end - start) / n. If the spin was over before the
  last call was queued and the calls ran faster than the host queued them (the GPU
  may have idled), the window is retried with a longer spin and flagged if it never
  holds. n = min(calls, --kernel-calls), because the driver's launch queue (about a
  thousand pending launches) blocks the host when it is full; median of --windows
  windows.
- byte floor us: bytes read + written by one call (imgfilter's dtypes) over the
  device-to-device copy bandwidth measured in the same run (CuPy copy of 1 GiB, bytes
  read + written / time, best of 5).
- ratio: peer per-call / imgfilter per-call (> 1: imgfilter is faster per call).

`calls` is --calls (1000; 200 with --quick), fewer (at least 10) where --loops loops of
that many would take more than --max-seconds. A peer that is not installed, or whose setup or call
fails, gives a row "skipped: <reason>" (the JSON keeps the error text). CuPy itself is
required (the stream and the events).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import inspect
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # imgfilter and kernels from this tree

SIZES = {
    "720p": (720, 1280, 3),
    "2167x2495": (2167, 2495, 3),
    "4K": (2160, 3840, 3),
    "8K": (4320, 7680, 3),
}
QUICK_SIZES = ("720p", "2167x2495")
SMALL_TARGET_US = 15.0  # issue 23 item 4: per call on small inputs, and <= torch's
GAUSS_K, GAUSS_SIGMA = 21, 3.5
BATCH, BATCH_K = 32, 5
MIXED = 16  # images of a list of mixed sizes (the list case), box BATCH_K


# ----------------------------------------------------------------------- structures


@dataclass
class Options:
    """How much to measure (from the command line)."""

    calls: int
    kernel_calls: int
    windows: int
    max_seconds: float
    loops: int = 5
    min_calls: int = 10


@dataclass
class Env:
    """Everything a case needs on the GPU: the stream, the peers, the data source."""

    cupy: Any
    stream: Any  # the non-default CuPy stream every call runs on
    ndi: Any | None  # cupyx.scipy.ndimage
    torch: Any | None
    torch_stream: Any | None  # torch.cuda.ExternalStream(stream.ptr)
    cvcuda: Any | None
    cv_stream: Any | None  # cvcuda.as_stream(stream)
    missing: dict[str, str]  # peer library -> why its rows are skipped
    rng: np.random.Generator
    bandwidth_gbs: float = 0.0


@dataclass
class Impl:
    """One implementation of a case: `call()` queues one call on the bench stream."""

    name: str
    call: Callable[[], object] | None
    context: Callable[[], Any] = contextlib.nullcontext
    note: str = ""
    skipped: str = ""  # why `call` is None
    keep: tuple = ()  # objects the call's wrappers point into


@dataclass
class Case:
    """A named workload: its byte count and a builder of [ours, *peers] (GPU)."""

    name: str
    nbytes: int  # read + written by one of imgfilter's calls
    build: Callable[[Env], list[Impl]]
    small: bool = False  # an issue-23 per-call overhead row


@dataclass
class Timing:
    """The figures of one implementation on one case."""

    calls: int
    per_call_us: float
    host_us: float
    kernel_us: float | None
    kernel_calls: int
    kernel_note: str = ""
    windows_us: list[float] = field(default_factory=list)
    loops_us: list[float] = field(default_factory=list)  # per-call us of each loop


def _err(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


# -------------------------------------------------------------------------- timing


def _warm_up(fn: Callable[[], object], stream, warmups: int = 3) -> float:
    """Run fn a few times (compiles, plans, pools), then estimate one call's seconds."""
    for _ in range(warmups):
        fn()
    stream.synchronize()
    t0 = time.perf_counter()
    fn()
    fn()
    stream.synchronize()
    return (time.perf_counter() - t0) / 2


def _calls_for(est_s: float, opts: Options) -> int:
    """Calls per loop: opts.calls, or fewer where opts.loops loops of that many calls
    would exceed opts.max_seconds."""
    budget = opts.max_seconds / max(opts.loops, 1)
    if est_s * opts.calls <= budget:
        return opts.calls
    return max(min(opts.min_calls, opts.calls), int(budget / max(est_s, 1e-9)))


def per_call_us(fn: Callable[[], object], stream, calls: int) -> tuple[float, float]:
    """(per-call us, host us): `calls` calls queued back to back, then one sync."""
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    stream.synchronize()
    t2 = time.perf_counter()
    return (t2 - t0) / calls * 1e6, (t1 - t0) / calls * 1e6


def median_loop(loops: list[tuple[float, float]]) -> tuple[float, float]:
    """The (per-call us, host us) of the loop whose per-call time is the median
    (the lower middle one of an even count)."""
    ranked = sorted(loops)
    return ranked[(len(ranked) - 1) // 2]


def kernel_window(env: Env, fn: Callable[[], object], calls: int, spin_s: float):
    """One spin-covered window on the bench stream (`kernels.common.timing.spin_window`):
    (kernel us per call, spin still running when the last call was queued, host us
    per call while queueing)."""
    from kernels.common.timing import spin_window

    return spin_window(fn, calls, spin_s, env.stream.ptr)


def kernel_us(env: Env, fn, calls: int, host_us: float, windows: int) -> tuple:
    """Median kernel us over `windows` windows of `calls` calls, a note if any window
    may have let the GPU idle, and the per-window figures."""
    figures, doubtful = [], 0
    for _ in range(windows):
        spin = 1.5 * host_us * calls / 1e6 + 0.01
        for _attempt in range(3):
            us, covered, loop_host_us = kernel_window(env, fn, calls, min(spin, 5.0))
            valid = covered or us >= loop_host_us  # GPU-bound: never idle anyway
            if valid:
                break
            spin *= 3
        doubtful += not valid
        figures.append(us)
    note = ""
    if doubtful:
        note = f"{doubtful}/{windows} kernel windows outran the spin: may include host gaps"
    return statistics.median(figures), note, figures


def time_calls(env: Env, fn: Callable[[], object], opts: Options) -> Timing:
    """Per-call, host and kernel time of fn (which queues one call on env.stream)."""
    est = _warm_up(fn, env.stream)
    calls = _calls_for(est, opts)
    loops = [per_call_us(fn, env.stream, calls) for _ in range(max(opts.loops, 1))]
    per_call, host = median_loop(loops)
    kcalls = min(calls, opts.kernel_calls)
    kern, note, windows = kernel_us(env, fn, kcalls, host, opts.windows)
    return Timing(calls, per_call, host, kern, kcalls, note, windows, [p for p, _ in loops])


def measure(env: Env, impl: Impl, opts: Options) -> dict:
    """Timing of one implementation as a dict, or {"skipped": reason}."""
    if impl.call is None:
        return {"skipped": impl.skipped}
    try:
        with impl.context():
            return asdict(time_calls(env, impl.call, opts))
    except Exception as exc:
        with contextlib.suppress(Exception):
            env.cupy.cuda.Device().synchronize()
        return {"skipped": f"call failed: {_err(exc)}"}


def copy_bandwidth_gbs(env: Env, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Device-to-device copy of nbytes with CuPy on env.stream: bytes read + written
    per second, best of `repeats`, in GB/s."""
    cp, s = env.cupy, env.stream
    a = cp.ones(nbytes, dtype=cp.uint8)
    b = cp.empty_like(a)
    kind = cp.cuda.runtime.memcpyDeviceToDevice
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(s)
        cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, kind, s.ptr)
        end.record(s)
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    del a, b
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / best / 1e9


# ------------------------------------------------------------------ the environment


def _load_torch(stream) -> tuple[Any, Any, str]:
    try:
        import torch
    except Exception as exc:
        return None, None, f"torch not importable: {_err(exc)}"
    if not torch.cuda.is_available():
        return None, None, "torch has no usable CUDA"
    return torch, torch.cuda.ExternalStream(stream.ptr), ""


def _load_cvcuda(stream) -> tuple[Any, Any, str]:
    """cvcuda and its wrapper of `stream` (0.19: cvcuda.as_stream takes a CuPy stream
    or an int handle; older releases: nvcv.cuda.as_stream)."""
    try:
        import cvcuda
    except Exception as exc:
        return None, None, f"cvcuda not importable: {_err(exc)}"
    errors = []
    for wrap in (
        lambda: cvcuda.as_stream(stream),
        lambda: cvcuda.as_stream(stream.ptr),
        lambda: __import__("nvcv").cuda.as_stream(stream.ptr),
    ):
        try:
            return cvcuda, wrap(), ""
        except Exception as exc:
            errors.append(_err(exc))
    return None, None, "cvcuda.as_stream failed: " + " | ".join(errors)


def make_env() -> Env:
    """The bench stream, the peers that load (and why the others don't), the RNG."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    missing: dict[str, str] = {}
    try:
        import cupyx.scipy.ndimage as ndi
    except Exception as exc:
        ndi, missing["cupy"] = None, f"cupyx.scipy.ndimage not importable: {_err(exc)}"
    torch, torch_stream, why = _load_torch(stream)
    if why:
        missing["torch"] = why
    cvcuda, cv_stream, why = _load_cvcuda(stream)
    if why:
        missing["cvcuda"] = why
    rng = np.random.default_rng(20261126)
    return Env(cupy, stream, ndi, torch, torch_stream, cvcuda, cv_stream, missing, rng)


def _context(env: Env, lib: str) -> Callable[[], Any]:
    """Makes env.stream the library's current stream (CV-CUDA gets it per call)."""
    if lib == "cupy":
        return lambda: env.stream
    if lib == "torch":
        return lambda: env.torch.cuda.stream(env.torch_stream)
    return contextlib.nullcontext


def peer(env: Env, lib: str, name: str, make: Callable[[], tuple], note: str = "") -> Impl:
    """An Impl of a peer library; `make()` returns (call, objects to keep alive).
    Skipped with the reason when the library is missing or make() fails."""
    why = env.missing.get(lib)
    if why:
        return Impl(name, None, skipped=why)
    try:
        call, keep = make()
    except Exception as exc:
        return Impl(name, None, skipped=f"setup failed: {_err(exc)}")
    return Impl(name, call, _context(env, lib), note, keep=keep)


# ----------------------------------------------------------------------- the data


def device_image(env: Env, shape: tuple) -> Any:
    """A random uint8 image (never all zeros) as a CuPy array."""
    return env.cupy.asarray(env.rng.integers(0, 256, shape, dtype=np.uint8))


def random_kernel(env: Env, k: int) -> np.ndarray:
    """A random positive k x k float32 kernel summing to 1 (full rank: no separable path)."""
    w = env.rng.uniform(0.1, 1.0, (k, k))
    return (w / w.sum()).astype(np.float32)


def gaussian_kernel() -> np.ndarray:
    """OpenCV's 21-tap Gaussian of sigma 3.5, as the 21x21 outer product (rank 1)."""
    import cv2

    g = cv2.getGaussianKernel(GAUSS_K, GAUSS_SIGMA).astype(np.float32)[:, 0]
    return np.outer(g, g)


# ------------------------------------------------------------------ imgfilter calls


def ours(name: str, call: Callable[[], object], note: str = "", keep: tuple = ()) -> Impl:
    return Impl(name, call, note=note, keep=keep)


def ours_blur(env: Env, d, k: int) -> Impl:
    import imgfilter

    s = env.stream
    return ours("imgfilter.blur", lambda: imgfilter.blur(d, k, stream=s), keep=(d,))


def ours_filter2d(env: Env, d, kernel: np.ndarray) -> Impl:
    import imgfilter

    s = env.stream
    return ours("imgfilter.filter2d", lambda: imgfilter.filter2d(d, kernel, stream=s), keep=(d,))


def ours_batch_blur(env: Env, d4, k: int) -> Impl:
    """imgfilter's batch API if it has one (blur_batch, or blur(..., batch=True)), else
    one blur call per frame (slices of the 4-D CuPy array, made once)."""
    import imgfilter

    s = env.stream
    frames = [d4[i] for i in range(d4.shape[0])]

    def per_frame():
        return [imgfilter.blur(f, k, stream=s) for f in frames]

    fallback = ours(f"{len(frames)} calls of imgfilter.blur", per_frame, keep=(d4, frames))
    fallback.note = f"no batch API: {len(frames)} imgfilter.blur calls per batch (one per frame)"
    if hasattr(imgfilter, "blur_batch"):
        name = "imgfilter.blur_batch"

        def call():
            return imgfilter.blur_batch(d4, k, stream=s)

    elif "batch" in inspect.signature(imgfilter.blur).parameters:
        name = "imgfilter.blur(batch=True)"

        def call():
            return imgfilter.blur(d4, k, batch=True, stream=s)

    else:
        return fallback
    try:
        call()
        s.synchronize()
    except Exception as exc:
        fallback.note = f"{name} failed ({_err(exc)}): one imgfilter.blur call per frame"
        return fallback
    return ours(name, call, note=f"one {name} call per batch", keep=(d4,))


# ------------------------------------------------------------------- peer builders


def cvcuda_averageblur(env: Env, d, k: int) -> Impl:
    """cvcuda.averageblur, reflect101, on an NHWC tensor (a batch of 1 for an image)."""

    def make():
        cv = env.cvcuda
        src = cv.as_tensor(d if d.ndim == 4 else d.reshape(1, *d.shape), "NHWC")
        border, cs = cv.Border.REFLECT101, env.cv_stream
        return (lambda: cv.averageblur(src, (k, k), (-1, -1), border, stream=cs)), (d, src)

    return peer(env, "cvcuda", "cvcuda averageblur", make)


def cvcuda_conv2d(env: Env, d, kernel: np.ndarray) -> Impl:
    """cvcuda.conv2d: var-shape batch of the image, of the kernel as an F32 image, and
    an (N, 2) int32 "NC" anchor tensor ((-1, -1): the centre)."""

    def make():
        cv, cp = env.cvcuda, env.cupy
        k = cp.asarray(np.ascontiguousarray(kernel[:, :, None]))
        anchor = cp.asarray(np.array([[-1, -1]], dtype=np.int32))
        src, kern = cv.as_images([d]), cv.as_images([k])
        anc = cv.as_tensor(anchor, "NC")
        border, cs = cv.Border.REFLECT101, env.cv_stream
        call = lambda: cv.conv2d(src, kern, anc, border, stream=cs)  # noqa: E731
        return call, (d, k, anchor, src, kern, anc)

    return peer(env, "cvcuda", "cvcuda conv2d (var-shape)", make)


def cvcuda_gaussian(env: Env, d) -> Impl:
    def make():
        cv = env.cvcuda
        src = cv.as_tensor(d.reshape(1, *d.shape), "NHWC")
        border, cs = cv.Border.REFLECT101, env.cv_stream
        ksize, sigma = (GAUSS_K, GAUSS_K), (GAUSS_SIGMA, GAUSS_SIGMA)
        return (lambda: cv.gaussian(src, ksize, sigma, border, stream=cs)), (d, src)

    return peer(env, "cvcuda", "cvcuda gaussian", make)


def cupy_uniform(env: Env, d, k: int) -> Impl:
    def make():
        ndi = env.ndi
        return (lambda: ndi.uniform_filter(d, size=(k, k, 1), mode="mirror")), (d,)

    return peer(env, "cupy", "cupy uniform_filter", make)


def cupy_correlate(env: Env, d, kernel: np.ndarray) -> Impl:
    def make():
        cp, ndi = env.cupy, env.ndi
        f = d.astype(cp.float32)
        w = cp.asarray(np.ascontiguousarray(kernel[:, :, None]))
        return (lambda: ndi.correlate(f, w, mode="mirror")), (f, w)

    return peer(env, "cupy", "cupy correlate f32", make, "float32 input (no uint8 conversion)")


def cupy_gaussian(env: Env, d) -> Impl:
    truncate = (GAUSS_K // 2) / GAUSS_SIGMA  # radius 10: 21 taps, as OpenCV's kernel

    def make():
        ndi, sigma = env.ndi, (GAUSS_SIGMA, GAUSS_SIGMA, 0)
        call = lambda: ndi.gaussian_filter(d, sigma, mode="mirror", truncate=truncate)  # noqa: E731
        return call, (d,)

    note = "truncate=10/3.5 (21 taps; its weights are SciPy's, not OpenCV's)"
    return peer(env, "cupy", "cupy gaussian_filter", make, note)


def torch_depthwise(env: Env, d, kernel: np.ndarray) -> Impl:
    """F.conv2d depthwise (groups=3) on float32 NCHW after a reflect pad (= reflect101)."""

    def make():
        torch = env.torch
        F = torch.nn.functional
        x = torch.as_tensor(d, device="cuda").permute(2, 0, 1)[None].float().contiguous()
        w = torch.as_tensor(kernel, device="cuda")[None, None].repeat(3, 1, 1, 1).contiguous()
        kh, kw = kernel.shape
        pad = (kw // 2, kw - 1 - kw // 2, kh // 2, kh - 1 - kh // 2)
        return (lambda: F.conv2d(F.pad(x, pad, mode="reflect"), w, groups=3)), (x, w)

    note = "float32 NCHW input (no uint8 conversion), reflect pad included"
    return peer(env, "torch", "torch conv2d depthwise f32", make, note)


def torch_op(env: Env, name: str, arrays: tuple, **kwargs) -> Impl:
    """torch.<name>(*arrays, **kwargs), the CuPy arrays viewed as torch tensors (no copy)."""

    def make():
        torch = env.torch
        tensors = tuple(torch.as_tensor(a, device="cuda") for a in arrays)
        return partial(getattr(torch, name), *tensors, **kwargs), tensors

    return peer(env, "torch", f"torch.{name}", make)


# ----------------------------------------------------------------- case builders


def box_case(env: Env, shape: tuple, k: int) -> list[Impl]:
    d = device_image(env, shape)
    return [ours_blur(env, d, k), cvcuda_averageblur(env, d, k), cupy_uniform(env, d, k)]


def filter_case(env: Env, shape: tuple, k: int) -> list[Impl]:
    d, kernel = device_image(env, shape), random_kernel(env, k)
    return [
        ours_filter2d(env, d, kernel),
        cvcuda_conv2d(env, d, kernel),
        torch_depthwise(env, d, kernel),
        cupy_correlate(env, d, kernel),
    ]


def gaussian_case(env: Env, shape: tuple) -> list[Impl]:
    d = device_image(env, shape)
    mine = ours_filter2d(env, d, gaussian_kernel())
    mine.note = "filter2d of the 21x21 outer product (rank 1: separable passes)"
    return [mine, cvcuda_gaussian(env, d), cupy_gaussian(env, d)]


def contour_case(env: Env, shape: tuple) -> list[Impl]:
    import imgfilter

    d, s = device_image(env, shape), env.stream
    return [ours("imgfilter.contour", lambda: imgfilter.contour(d, stream=s), keep=(d,))]


def batch_case(env: Env, shape: tuple) -> list[Impl]:
    d4 = device_image(env, (BATCH, *shape))
    return [ours_batch_blur(env, d4, BATCH_K), cvcuda_averageblur(env, d4, BATCH_K)]


def mixed_sizes(count: int) -> list[tuple]:
    """`count` image shapes between 64x64 and 1080p, the same in every run."""
    rng = np.random.default_rng(16)
    return [(int(rng.integers(64, 1081)), int(rng.integers(64, 1921)), 3) for _ in range(count)]


def list_case(env: Env, count: int) -> list[Impl]:
    """One blur_batch call on a list of images of mixed sizes (each its own borders)."""
    import imgfilter

    images, s = [device_image(env, shape) for shape in mixed_sizes(count)], env.stream
    name = f"imgfilter.blur_batch (list of {count})"
    return [ours(name, lambda: imgfilter.blur_batch(images, BATCH_K, stream=s), keep=tuple(images))]


def softmax_case(env: Env, rows: int, cols: int) -> list[Impl]:
    from kernels.softmax import softmax

    x = env.cupy.asarray(env.rng.standard_normal((rows, cols)).astype(np.float32))
    s = env.stream
    return [
        ours("kernels.softmax.softmax", lambda: softmax(x, stream=s), keep=(x,)),
        torch_op(env, "softmax", (x,), dim=1),
    ]


def gemv_case(env: Env, n: int, k: int) -> list[Impl]:
    from kernels.linalg.gemv import gemv

    cp, s = env.cupy, env.stream
    a = cp.asarray((env.rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16))
    x = cp.asarray(env.rng.standard_normal(k).astype(np.float16))
    return [
        ours("kernels.linalg.gemv.gemv", lambda: gemv(a, x, stream=s), keep=(a, x)),
        torch_op(env, "mv", (a, x)),
    ]


def build_cases(quick: bool) -> list[Case]:
    """The case list (names and byte counts need no GPU)."""
    cases = []
    for size in QUICK_SIZES if quick else tuple(SIZES):
        shape = SIZES[size]
        h, w, c = shape
        img = h * w * c
        for k in (3, 21) if quick else (3, 5, 21):
            cases.append(Case(f"box {k} {size}", 2 * img, partial(box_case, shape=shape, k=k)))
        for k in (7,) if quick else (7, 21):
            build = partial(filter_case, shape=shape, k=k)
            cases.append(Case(f"filter2d {k}x{k} {size}", 2 * img, build))
        build = partial(gaussian_case, shape=shape)
        cases.append(Case(f"gaussian {GAUSS_K} s{GAUSS_SIGMA} {size}", 2 * img, build))
        cases.append(Case(f"contour {size}", img + h * w, partial(contour_case, shape=shape)))
    frame = SIZES["720p"]
    nbatch = 2 * BATCH * int(np.prod(frame))
    batch = partial(batch_case, shape=frame)
    cases.append(Case(f"batch {BATCH}x720p box {BATCH_K}", nbatch, batch))
    mixed = 2 * sum(int(np.prod(shape)) for shape in mixed_sizes(MIXED))
    cases.append(
        Case(f"list {MIXED} mixed sizes box {BATCH_K}", mixed, partial(list_case, count=MIXED))
    )
    cases += [softmax_row(4096, 1024), gemv_row(4096, 4096)]
    small = (64, 64, 3)
    box = partial(box_case, shape=small, k=3)
    cases += [
        Case("small box 3 64x64", 2 * 64 * 64 * 3, box, small=True),
        softmax_row(1, 1024, small=True),
        gemv_row(1024, 1024, small=True),
    ]
    return cases


def softmax_row(rows: int, cols: int, small: bool = False) -> Case:
    name = f"{'small ' if small else ''}softmax {rows}x{cols} f32"
    return Case(name, 2 * rows * cols * 4, partial(softmax_case, rows=rows, cols=cols), small)


def gemv_row(n: int, k: int, small: bool = False) -> Case:
    name = f"{'small ' if small else ''}gemv {n}x{k} f16"
    return Case(name, 2 * (n * k + k + n), partial(gemv_case, n=n, k=k), small)


def select(cases: list[Case], only: str | None) -> list[Case]:
    """Cases whose name contains any of the comma-separated substrings (case-insensitive)."""
    if not only:
        return cases
    keys = [k.strip().lower() for k in only.split(",") if k.strip()]
    return [c for c in cases if any(k in c.name.lower() for k in keys)]


# ------------------------------------------------------------------------ rows


def _prefixed(prefix: str, timing: dict) -> dict:
    keys = ("per_call_us", "host_us", "kernel_us", "calls", "kernel_calls", "kernel_note",
            "windows_us", "skipped")  # fmt: skip
    return {f"{prefix}_{k}": timing.get(k) for k in keys}


def small_target(case: Case, mine: dict, other: dict | None, peer_name: str) -> dict:
    """Issue 23 item 4 on the small rows: per call <= 15 us, and <= torch's."""
    ours_us = mine.get("per_call_us")
    if not case.small or ours_us is None:
        return {}
    out = {"target_15us_met": ours_us <= SMALL_TARGET_US}
    if peer_name.startswith("torch") and other and other.get("per_call_us") is not None:
        out["target_le_torch_met"] = ours_us <= other["per_call_us"]
    return out


def case_rows(case: Case, impls: list[Impl], timings: list[dict], bandwidth: float) -> list[dict]:
    """One row per peer (one row when there is none), imgfilter's figures on each."""
    mine, mine_t = impls[0], timings[0]
    base = {
        "case": case.name,
        "bytes": case.nbytes,
        "byte_floor_us": case.nbytes / (bandwidth * 1e9) * 1e6 if bandwidth else None,
        "ours": mine.name,
        "ours_note": mine.note,
        **_prefixed("ours", mine_t),
    }
    rows = []
    for impl, t in zip(impls[1:], timings[1:], strict=True):
        ratio = None
        if t.get("per_call_us") and mine_t.get("per_call_us"):
            ratio = t["per_call_us"] / mine_t["per_call_us"]
        row = {**base, "peer": impl.name, "peer_note": impl.note, **_prefixed("peer", t)}
        row["ratio"] = ratio
        row.update(small_target(case, mine_t, t, impl.name))
        rows.append(row)
    if not rows:
        rows.append({**base, "peer": None, **small_target(case, mine_t, None, "")})
    return rows


def run_case(env: Env, case: Case, opts: Options) -> list[dict]:
    """Build the case's data and implementations, time each, free the data."""
    try:
        impls = case.build(env)
    except Exception as exc:
        impls = [Impl("imgfilter", None, skipped=f"setup failed: {_err(exc)}")]
    env.cupy.cuda.Device().synchronize()  # data made on other streams is ready
    timings = []
    for impl in impls:
        print(f"  {case.name}: {impl.name}", file=sys.stderr, flush=True)
        timings.append(measure(env, impl, opts))
    rows = case_rows(case, impls, timings, env.bandwidth_gbs)
    del impls
    env.cupy.cuda.Device().synchronize()
    env.cupy.get_default_memory_pool().free_all_blocks()
    if env.torch is not None:
        env.torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------- header


def git_commit() -> tuple[str, bool | None]:
    """(short commit, working tree dirty) of this checkout, or ("unknown", None)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, timeout=10)  # fmt: skip
        if head.returncode:
            return "unknown", None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=REPO, capture_output=True, text=True, timeout=10)  # fmt: skip
        return head.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return "unknown", None


def versions(env: Env) -> dict:
    """Versions of imgfilter's dependencies and of the peers (None: not available)."""
    from importlib import metadata

    out: dict[str, Any] = {"python": platform.python_version()}
    for dist in ("numpy", "numba", "numba-cuda", "cuda-bindings", "cuda-core"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    for mod in ("cv2", "imgfilter"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = None
    cp = env.cupy
    out["cupy"] = cp.__version__
    out["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
    out["cuda_runtime_cupy"] = cp.cuda.runtime.runtimeGetVersion()
    out["torch"] = env.torch.__version__ if env.torch else None
    out["cvcuda"] = getattr(env.cvcuda, "__version__", "?") if env.cvcuda else None
    return out


def header(env: Env, opts: Options, quick: bool) -> dict:
    import imgfilter

    name = env.cupy.cuda.runtime.getDeviceProperties(0)["name"]
    commit, dirty = git_commit()
    params = inspect.signature(imgfilter.blur).parameters
    return {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "git_commit": commit,
        "git_dirty": dirty,
        "versions": versions(env),
        "copy_bandwidth_gbs": env.bandwidth_gbs,
        "peers_skipped": env.missing,
        "imgfilter_batch_api": hasattr(imgfilter, "blur_batch") or "batch" in params,
        "quick": quick,
        "options": asdict(opts),
        "stream": "one non-default CuPy stream (non_blocking=True) for every call",
    }


# ------------------------------------------------------------------------ output


def header_lines(head: dict) -> list[str]:
    """Device, date, commit, versions, bandwidth and options, as text lines."""
    vers = ", ".join(f"{k} {v}" for k, v in head["versions"].items() if v is not None)
    skipped = "; ".join(f"{lib}: {why}" for lib, why in head["peers_skipped"].items())
    opts = head["options"]
    commit = head["git_commit"] + (" (uncommitted changes)" if head["git_dirty"] else "")
    return [
        f"device: {head['device']}   date: {head['date_utc']}   commit: {commit}",
        f"versions: {vers}",
        f"peers skipped: {skipped or 'none'}",
        f"copy bandwidth: {head['copy_bandwidth_gbs']:.0f} GB/s (read + write); up to "
        f"{opts['calls']} calls per loop, per call: median of {opts.get('loops', 1)} loops "
        f"({opts['max_seconds']} s cap), kernel time: median of "
        f"{opts['windows']} windows of <= {opts['kernel_calls']} calls; times in us",
    ]


class Notes:
    """Numbered footnotes; the same text always gets the same number."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, text: str | None) -> str:
        if not text:
            return ""
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def lines(self) -> list[str]:
        return [f"[{i}] {t}" for i, t in enumerate(self.texts, 1)]


def row_marks(r: dict, first: bool, notes: Notes) -> str:
    """The footnote marks of one table row: imgfilter's (on a case's first row), the
    peer's, and the issue-23 targets of the small rows."""
    case, marks = r["case"], ""
    if first:
        if r.get("ours_skipped"):
            marks += notes.mark(f"{r['ours']}: {r['ours_skipped']}")
        marks += notes.mark(r.get("ours_note") and f"{case}: {r['ours_note']}")
        marks += notes.mark(r.get("ours_kernel_note") and f"{case}, ours: {r['ours_kernel_note']}")
        if "target_15us_met" in r:
            met = "met" if r["target_15us_met"] else "NOT met"
            marks += notes.mark(f"{case}: target per call <= {SMALL_TARGET_US:.0f} us {met}")
    if r.get("peer"):
        if "target_le_torch_met" in r:
            met = "met" if r["target_le_torch_met"] else "NOT met"
            marks += notes.mark(f"{case}: target per call <= {r['peer']}'s {met}")
        marks += notes.mark(r.get("peer_skipped") and f"{r['peer']}: {r['peer_skipped']}")
        marks += notes.mark(r.get("peer_note") and f"{r['peer']}: {r['peer_note']}")
        kernel_note = r.get("peer_kernel_note")
        marks += notes.mark(kernel_note and f"{case}, {r['peer']}: {kernel_note}")
    return marks


def _cell(value: float | None, skipped: str | None) -> str:
    if value is not None:
        return f"{value:.1f}"
    return "skipped" if skipped else "-"


def format_table(head: dict, rows: list[dict]) -> str:
    """Header lines, the table (imgfilter's columns on a case's first row only), and
    the numbered notes (skips, caveats, targets)."""
    cols = ("case", "ours/call", "ours host", "ours kern", "peer", "peer/call", "peer kern",
            "ratio", "floor", "notes")  # fmt: skip
    widths = (26, 9, 9, 9, 27, 9, 9, 6, 7, 0)
    fmt = " | ".join(f"{{:{'<' if i in (0, 4, 9) else '>'}{w}}}" for i, w in enumerate(widths))
    lines = [*header_lines(head), "", fmt.format(*cols).rstrip()]
    lines.append("-+-".join("-" * w for w in widths[:-1]) + "-+-" + "-" * 5)
    notes, last = Notes(), None
    for r in rows:
        first, last = r["case"] != last, r["case"]
        ours_cols = ("", "", "", "")
        if first:
            ours_cols = (
                r["case"],
                _cell(r["ours_per_call_us"], r.get("ours_skipped")),
                _cell(r["ours_host_us"], None),
                _cell(r["ours_kernel_us"], None),
            )
        ratio = r.get("ratio")
        lines.append(fmt.format(
            *ours_cols,
            (r.get("peer") or "-")[:27],
            _cell(r.get("peer_per_call_us"), r.get("peer_skipped")),
            _cell(r.get("peer_kernel_us"), None),
            "-" if ratio is None else f"{ratio:.3g}",
            _cell(r["byte_floor_us"], None) if first else "",
            row_marks(r, first, notes),
        ).rstrip())  # fmt: skip
    lines += [
        "",
        "ratio: peer per call / imgfilter per call.  floor: bytes read + written by imgfilter's "
        "call at the copy bandwidth (uint8 images; float32 peers move 4x that).",
        "",
        "notes:",
        *notes.lines(),
    ]
    return "\n".join(lines)


def write_json(path: str | None, head: dict, rows: list[dict]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"header": head, "rows": rows}, indent=1) + "\n")


# -------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] + " " + __doc__.splitlines()[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    add = ap.add_argument
    add("--quick", action="store_true", help="fewer sizes, kernels and calls (< 2 min, H100)")
    add("--calls", type=int, help="calls per per-call loop (default 1000; --quick: 200)")
    add("--only", metavar="SUBSTR", help="cases whose name has one of these (comma-separated)")
    add("--json", metavar="FILE", help="write the header and the rows as JSON")
    add("--kernel-calls", type=int, default=200, help="calls per kernel-time window (200)")
    add("--windows", type=int, help="kernel-time windows, median (default 3; --quick: 2)")
    add(
        "--max-seconds",
        type=float,
        help="cap on one implementation's per-call loops together (1.5 s; --quick: 0.25 s)",
    )
    add("--loops", type=int, help="per-call loops, median (default 5; --quick: 3)")
    add("--list", action="store_true", help="list the cases and exit (no GPU needed)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = select(build_cases(args.quick), args.only)
    if args.list:
        print("\n".join(f"{c.name}  ({c.nbytes} bytes)" for c in cases))
        return 0
    if not cases:
        print(f"no case matches --only {args.only!r} (see --list)", file=sys.stderr)
        return 2
    opts = Options(
        calls=args.calls or (200 if args.quick else 1000),
        kernel_calls=args.kernel_calls,
        windows=args.windows or (2 if args.quick else 3),
        max_seconds=args.max_seconds or (0.25 if args.quick else 1.5),
        loops=args.loops or (3 if args.quick else 5),
    )
    try:
        env = make_env()
    except Exception as exc:
        print(f"needs CuPy and a CUDA GPU: {_err(exc)}", file=sys.stderr)
        return 2
    from imgfilter.backends import background

    background.ENABLED = False  # steady state: each kernel compiled before it is timed
    env.bandwidth_gbs = copy_bandwidth_gbs(env)
    head = header(env, opts, args.quick)
    print(f"{head['device']}, {head['date_utc']}, {len(cases)} cases", file=sys.stderr)
    rows: list[dict] = []
    for case in cases:
        rows += run_case(env, case, opts)
        write_json(args.json, head, rows)  # kept up to date if the run is cut short
    print(format_table(head, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
