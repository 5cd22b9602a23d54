"""Kernel times: imgfilter against its peers, measured side by side in one run (GPU).

    python benchmarks/bench.py [--sizes seed,4k,8k] [--quick] [--json FILE]
    imgfilter bench [...]                       # the same, from a source checkout
    python benchmarks/bench.py --lists 1500,5000,10000 [--repeats R] [--json FILE]

BENCHMARKS.md's image-kernel tables (seed, 4K, 8K; low-rank kernels; the seed
article's comparison) come from this script's JSON (benchmarks/report.py).

Kernel time: a spin kernel keeps the GPU busy while Python queues N launches behind
a start event, so (end - start) / N is the GPU time per launch, not Numba's ~30 us
launch cost (`kernels.common.timing.kernel_us`); imgfilter's calls are the public API's on
device arrays, into a pre-allocated `out`. Per-call time: wall time of the public API
call on a device array (allocating its output), synchronised, as a user feels it.
Peers: OpenCV on the host CPU (wall time), CuPy's cupyx.scipy.ndimage and PyTorch
conv2d (CUDA events, same spin method), each skipped with a note when not installed.
The bytes floor is reading the input and writing the output once at the copy
bandwidth measured in the same run. The low-rank cases time kernels directly (a
given number of separable terms), through the same timer.

--lists: blur LIST_K of lists of N random RGB uint8 images up to LIST_MAX_SIDE^2, in
fresh processes (`list_child`): a torch list's first call (empty kernel caches, then
caches an earlier process filled) and warm calls; a NumPy list's, beside a cv2.blur
loop and the 4-D batches (host, torch) of N images of the list's mean size. Warm: the
median of --repeats synchronised calls. Every result is checked against cv2.blur.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

SEED_SHAPE = (2167, 2495, 3)  # the seed article's three-band image
SHAPES = {"seed": SEED_SHAPE, "4k": (2160, 3840, 3), "8k": (4320, 7680, 3)}


@dataclass
class Row:
    """One measured line of the table."""

    op: str
    size: str
    impl: str
    kernel_us: float | None = None  # GPU time per launch (spin-queued events)
    call_us: float | None = None  # wall time of one synchronised Python call
    note: str = ""
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------------- timing


class Timer:
    """GPU and wall timers: kernel time through `kernels.common.timing.kernel_us` (the spin
    kernel, `repeats` windows), per-call wall time with a synchronisation."""

    def __init__(self, repeats: int = 7):
        from numba import cuda

        self.cuda = cuda
        self.repeats = repeats

    def kernel_us(self, fn: Callable[[], object], launches: int = 20) -> float:
        """Median GPU microseconds per call of `fn` (which only enqueues work)."""
        from kernels.common.timing import kernel_us

        return kernel_us(fn, launches, self.repeats)

    def call_us(self, fn: Callable[[], object], calls: int = 20) -> float:
        """Median wall microseconds of fn() followed by a device synchronisation."""
        cuda = self.cuda
        fn()
        cuda.synchronize()
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return float(np.median(times) * 1e6)


def wall_us(fn: Callable[[], object], calls: int = 5) -> float:
    """Median wall microseconds of a host function (after one warm-up call)."""
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)


def copy_bandwidth_gbs(timer: Timer, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second, in GB/s."""
    cuda = timer.cuda
    a = cuda.device_array(nbytes // 4, dtype=np.uint32)
    b = cuda.device_array_like(a)
    us = timer.kernel_us(lambda: b.copy_to_device(a), launches=10)
    return 2 * nbytes / (us * 1e-6) / 1e9


def fma_rate_tfmas(timer: Timer) -> float:
    """Measured float32 FMA throughput of the device, in tera-FMAs per second."""
    cuda = timer.cuda
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    threads, blocks, n = 256, sms * 32, 4096
    out = cuda.device_array(threads * blocks, dtype=np.float32)
    from kernels.common.timing import fma_kernel

    us = timer.kernel_us(lambda: fma_kernel[blocks, threads](n, out), launches=5)
    return threads * blocks * n * 8 / (us * 1e-6) / 1e12


def pure_python_correlate(img: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """cv2.filter2D (reflect101, float32 result) in plain Python loops: the seed's
    CPU baseline. Only for tiny images."""
    from kernels.common.border_index import REFLECT101, border_index

    h, w, c = img.shape
    kh, kw = kernel.shape
    ay, ax = kh // 2, kw // 2
    rows = [[border_index(y + i - ay, h, REFLECT101) for i in range(kh)] for y in range(h)]
    cols = [[border_index(x + j - ax, w, REFLECT101) for j in range(kw)] for x in range(w)]
    src = img.tolist()
    k = kernel.tolist()
    out = np.empty((h, w, c), dtype=np.float32)
    for y in range(h):
        for x in range(w):
            for ch in range(c):
                acc = 0.0
                for i, yy in enumerate(rows[y]):
                    row = src[yy]
                    for j, xx in enumerate(cols[x]):
                        acc += k[i][j] * row[xx][ch]
                out[y, x, ch] = acc
    return out


# -------------------------------------------------------------------------- peers


def _cupy():
    try:
        import cupy
        import cupyx.scipy.ndimage as ndi

        return cupy, ndi
    except Exception:  # not installed, or no usable CUDA for it
        return None, None


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def _torch_depthwise(torch, img: np.ndarray, kernel: np.ndarray):
    """A callable running torch's depthwise conv2d (cross-correlation) in float32."""
    import torch.nn.functional as F

    h, w, c = img.shape
    x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))).cuda().float()[None]
    k = torch.from_numpy(kernel.astype(np.float32)).cuda()[None, None].repeat(c, 1, 1, 1)
    kh, kw = kernel.shape
    pad = (kw // 2, kw - 1 - kw // 2, kh // 2, kh - 1 - kh // 2)
    return lambda: F.conv2d(F.pad(x, pad, mode="reflect"), k, groups=c)


# ---------------------------------------------------------------------- the cases


def _floor_us(nbytes: int, bandwidth_gbs: float) -> float:
    return nbytes / (bandwidth_gbs * 1e9) * 1e6


class _Context:
    """What every case needs: timer, bandwidth, peers, and the rows measured so far."""

    def __init__(self, quick: bool):
        self.timer = Timer(repeats=3 if quick else 7)
        self.bandwidth = copy_bandwidth_gbs(self.timer, 1 << (26 if quick else 30))
        self.tfmas = fma_rate_tfmas(self.timer)
        self.cupy, self.ndi = _cupy()
        self.torch = _torch()
        self.quick = quick
        self.rows: list[Row] = []
        self.ahead: dict = {}  # (kh, kw) -> blocked kernel compiling ahead (`compile_ahead`)

    def blocked_ready(self, kh: int, kw: int) -> None:
        """Wait for the ahead-of-time compile of the kh x kw blocked kernel, if one
        runs (`await_compile`); its first launch here then loads it from the cache."""
        name = self.ahead.pop((kh, kw), None)
        if name is not None:
            await_compile(name)

    def add(
        self, row: Row, nbytes: int | None = None, pixels: int | None = None, fmas: int = 0
    ) -> None:
        """Record `row`; nbytes/fmas give its bytes and FLOP floors (the larger counts)."""
        if row.kernel_us and nbytes:
            row.extra["GB/s"] = nbytes / (row.kernel_us * 1e-6) / 1e9
            floor = _floor_us(nbytes, self.bandwidth)
            flop_floor = fmas / (self.tfmas * 1e6)
            row.extra["floor"] = "FMA" if flop_floor > floor else "bytes"
            row.extra["x_floor"] = row.kernel_us / max(floor, flop_floor)
        if pixels and (row.kernel_us or row.call_us):
            row.extra["Mpix/s"] = pixels / (row.kernel_us or row.call_us)
        self.rows.append(row)


def _ours(
    t: Timer, call: Callable[..., object], out: object, launches: int = 20, calls: int = 20
) -> tuple[float, float]:
    """(kernel us, per-call us) of one imgfilter API call on device arrays: `call(out=out)`
    queued behind the spin (the kernels alone, into the pre-allocated `out`), and
    `call()` synchronised (allocating its output, as a user's call does)."""
    return t.kernel_us(lambda: call(out=out), launches), t.call_us(call, calls)


def _bench_blur(ctx: _Context, size: str, img: np.ndarray, k: int) -> None:
    import cv2
    from numba import cuda

    import imgfilter
    from kernels.box.dispatch import box_method

    d_img = cuda.to_device(img)
    d_out = cuda.device_array_like(d_img)
    op, nbytes, pixels = f"blur k={k}", 2 * img.nbytes, img.shape[0] * img.shape[1]
    t = ctx.timer
    impl = f"imgfilter cuda (box_{box_method(img.shape, img.dtype, (k, k))})"
    kernel_us, call_us = _ours(t, functools.partial(imgfilter.blur, d_img, k), d_out)
    ctx.add(Row(op, size, impl, kernel_us, call_us), nbytes, pixels)
    ctx.add(Row(op, size, "opencv cpu cv2.blur", call_us=wall_us(lambda: cv2.blur(img, (k, k)))))
    if ctx.ndi is not None:
        c_img = ctx.cupy.asarray(img)
        fn = lambda: ctx.ndi.uniform_filter(c_img, size=(k, k, 1), mode="mirror")  # noqa: E731
        ctx.add(Row(op, size, "cupy uniform_filter", t.kernel_us(fn, 5)), nbytes, pixels)
    if ctx.torch is not None:
        fn = _torch_depthwise(ctx.torch, img, np.full((k, k), 1.0 / (k * k)))
        ctx.add(Row(op, size, "torch conv2d float32", t.kernel_us(fn, 5)), nbytes, pixels)


def _bench_filter(ctx: _Context, size: str, img: np.ndarray, weights: np.ndarray) -> None:
    import cv2
    from numba import cuda

    import imgfilter

    d_img = cuda.to_device(img)
    d_out = cuda.device_array_like(d_img)
    kh, kw = weights.shape
    op, nbytes, pixels = f"filter2d {kh}x{kw}", 2 * img.nbytes, img.shape[0] * img.shape[1]
    fmas = img.size * kh * kw
    t = ctx.timer
    # The seed's slow variants once, at the seed size; the fast path everywhere.
    seed_variants = kh == 21 and size == "seed"
    methods = ("blocked", "window", "tiled", "padded", "naive") if seed_variants else ("blocked",)
    ctx.blocked_ready(kh, kw)
    for method in methods:
        slow = method in ("naive", "padded", "tiled", "window")
        call = functools.partial(imgfilter.filter2d, d_img, weights, method=method)
        kernel_us, call_us = _ours(t, call, d_out, 5 if slow else 20, 5)
        row = Row(op, size, f"imgfilter cuda {method}", kernel_us, call_us)
        ctx.add(row, nbytes, pixels, fmas)
    calls = 1 if kh * kw >= 130 else 3
    ctx.add(
        Row(
            op,
            size,
            "opencv cpu cv2.filter2D",
            call_us=wall_us(lambda: cv2.filter2D(img, -1, weights), calls),
        )
    )
    if ctx.ndi is not None:
        c_f = ctx.cupy.asarray(img).astype(ctx.cupy.float32)
        c_w = ctx.cupy.asarray(weights)[:, :, None]
        fn = lambda: ctx.ndi.correlate(c_f, c_w, mode="mirror")  # noqa: E731
        ctx.add(Row(op, size, "cupy correlate float32", t.kernel_us(fn, 3)), nbytes, pixels, fmas)
    if ctx.torch is not None:
        fn = _torch_depthwise(ctx.torch, img, weights)
        ctx.add(Row(op, size, "torch conv2d float32", t.kernel_us(fn, 5)), nbytes, pixels, fmas)


def _bench_contour(ctx: _Context, size: str, gray: np.ndarray) -> None:
    from numba import cuda

    import imgfilter
    from imgfilter.backends.opencv import contour as cv_contour

    d_gray = cuda.to_device(gray.reshape(gray.shape[0], gray.shape[1], 1))
    d_edges = cuda.device_array(gray.shape, dtype=gray.dtype)
    op, pixels = "contour (gray)", gray.size
    kernel_us, call_us = _ours(ctx.timer, functools.partial(imgfilter.contour, d_gray), d_edges)
    ctx.add(Row(op, size, "imgfilter cuda fused", kernel_us, call_us), 2 * gray.nbytes, pixels)
    ctx.add(Row(op, size, "opencv cpu 4x filter2D + or", call_us=wall_us(lambda: cv_contour(gray))))


def _bench_seed_comparison(ctx: _Context, img: np.ndarray) -> None:
    """The seed article's table: one 5x5 kernel through every engine, in Mpixel/s.

    Pure Python runs on a 48x64 crop (it manages about 0.1 Mpixel/s on a 5x5 kernel);
    the others on the full image. Numba CPU is imgfilter's CPU backend.
    """
    import cv2
    from numba import cuda

    import imgfilter

    weights = (np.random.default_rng(5).standard_normal((5, 5)) / 5).astype(np.float32)
    op, pixels = "seed 5x5 filter", img.shape[0] * img.shape[1]
    tiny = np.ascontiguousarray(img[:48, :64])
    ctx.add(
        Row(
            op,
            "48x64",
            "cpu pure Python",
            call_us=wall_us(lambda: pure_python_correlate(tiny, weights), 1),
        ),
        pixels=tiny.shape[0] * tiny.shape[1],
    )
    ctx.add(
        Row(
            op,
            "seed",
            "imgfilter cpu (Numba parallel)",
            call_us=wall_us(lambda: imgfilter.filter2d(img, weights, backend="cpu"), 3),
        ),
        pixels=pixels,
    )
    d_img = cuda.to_device(img)
    d_out = cuda.device_array_like(d_img)
    ctx.blocked_ready(5, 5)
    for method, label in (
        ("naive", "global memory"),
        ("padded", "padded"),
        ("tiled", "shared memory"),
        ("blocked", "blocked"),
    ):
        call = functools.partial(imgfilter.filter2d, d_img, weights, method=method, out=d_out)
        ctx.add(
            Row(op, "seed", f"imgfilter cuda {label}", ctx.timer.kernel_us(call, 10)),
            2 * img.nbytes,
            pixels,
            img.size * 25,
        )
    ctx.add(
        Row(
            op,
            "seed",
            "opencv cpu cv2.filter2D",
            call_us=wall_us(lambda: cv2.filter2D(img, -1, weights)),
        ),
        pixels=pixels,
    )


# (k, rank) of the low-rank k x k kernels timed at the seed size, separable passes
# against one 2-D pass: either side of where `auto` takes them apart
# (`kernels.conv.plan.separable_pays`: rank 1 from 16x16, rank 2 from 27x27).
LOW_RANK_CASES = ((15, 1), (17, 1), (21, 1), (21, 2), (25, 2), (27, 2), (31, 2), (31, 3))
# --quick: fewer kernel sizes (each a compile of its own on a fresh cache), every peer.
QUICK_FILTER_KS = (3, 9, 21, 31)
QUICK_LOW_RANK = ((21, 1), (31, 2))


def low_rank_launches(img: np.ndarray, k: int, rank: int) -> list[tuple[str, Callable, int]]:
    """[(method, launch, taps)] for a random k x k kernel of this rank on device copies
    of `img`: method separable (one row pass and one column pass per term, exactly
    `rank` terms: the kernel directly, as imgfilter's separable path takes as many terms
    as the kernel's size allows) and blocked (imgfilter.filter2d, one 2-D pass); `taps`
    counts the multiply-adds per output element."""
    from numba import cuda

    import imgfilter
    from kernels.conv import launch as kconv
    from kernels.conv.plan import low_rank_factors

    rng = np.random.default_rng(k * 100 + rank)
    kernel = sum(np.outer(rng.standard_normal(k), rng.standard_normal(k)) for _ in range(rank))
    kernel = (kernel / k).astype(np.float32)
    # np.array copies: a view's stride-0 axis would not reshape on the device.
    terms = [
        (
            cuda.to_device(np.array(r[None, :])),
            cuda.to_device(np.array(c[:, None])),
            float(r.sum(dtype=np.float64)),
        )
        for c, r in low_rank_factors(kernel, rank)
    ]
    d_img = cuda.to_device(img)
    d_out = cuda.device_array_like(d_img)
    anchor = (k // 2, k // 2)
    return [
        ("blocked", lambda: imgfilter.filter2d(d_img, kernel, method="blocked", out=d_out), k * k),
        (
            "separable",
            lambda: kconv.correlate_low_rank(d_img, terms, anchor, 0, 0, d_out),
            2 * k * len(terms),
        ),
    ]


def _bench_low_rank(ctx: _Context, size: str, img: np.ndarray, k: int, rank: int) -> None:
    """A random k x k kernel of this rank through methods separable and blocked, kernel
    time only (`low_rank_launches`)."""
    op, nbytes, pixels = f"filter2d {k}x{k} rank {rank}", 2 * img.nbytes, img[..., 0].size
    ctx.blocked_ready(k, k)
    for method, fn, taps in low_rank_launches(img, k, rank):
        row = Row(op, size, f"imgfilter cuda {method}", ctx.timer.kernel_us(fn, 10))
        ctx.add(row, nbytes, pixels, img.size * taps)


def compile_ahead(sizes: list[int], dtype: str = "uint8") -> dict:
    """Start compiling the register-blocked kernels for k x k filters, k in `sizes`, on
    `dtype` images, each in a detached process (`imgfilter.backends.background`), all
    at once: the NVVM compiles (seconds each) then share the CPU's cores and overlap
    the cases measured meanwhile, where the run would otherwise compile them one after
    another as it reaches them. A kernel's launch on a small image, run under
    `kernels.common.launch.checking` (which launches nothing), names its binary where
    it has none. Returns {(k, k): binary name} of the compiles started."""
    from imgfilter.backends import background
    from imgfilter.backends import cuda as c
    from kernels.common.launch import NotCompiled, checking

    started, s = {}, c.PER_THREAD_STREAM
    img = c.empty((8, 8, 1), np.dtype(dtype), s)
    for k in sizes:
        weights = c._device_weights(np.ones((k, k), np.float32), s)
        try:
            with checking():
                c._conv.correlate(img, weights, (0, 0), 0, img.dtype.type(0), "blocked", img, s)
            continue  # it has a binary: nothing to compile
        except NotCompiled as exc:
            name = exc.name
        args = f"{name!r}, {k}, {k}, {dtype!r}"
        code = f"import imgfilter.backends.cuda as c; c.compile_blocked({args})"
        if name is not None and background.start(name, code):
            started[(k, k)] = name
    return started


def await_compile(name: str, timeout_s: float = 300.0) -> bool:
    """Wait until no process is compiling kernel `name` (its pending marker is gone)
    or `timeout_s` has passed; True if it finished in time."""
    from kernels.common import binaries

    marker = binaries.pending_marker(name)
    deadline = time.monotonic() + timeout_s
    while marker.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run(sizes=("seed",), box_ks=(3, 21, 101), filter_ks=None, quick=False, low_rank=None):
    """Measure every case; returns a dict ready for JSON (see `print_table`). filter_ks
    and low_rank default to QUICK_FILTER_KS / QUICK_LOW_RANK with `quick`, else to
    (3, 5, 9, 15, 21, 31) / LOW_RANK_CASES."""
    if filter_ks is None:
        filter_ks = QUICK_FILTER_KS if quick else (3, 5, 9, 15, 21, 31)
    if low_rank is None:
        low_rank = QUICK_LOW_RANK if quick else LOW_RANK_CASES
    started = time.perf_counter()
    from numba import cuda

    from imgfilter.backends import background

    square = {5} if "seed" in sizes else set()
    square |= set(filter_ks) | {k for k, _ in low_rank}
    ahead = compile_ahead(sorted(square))
    background.ENABLED = False  # steady state: each kernel compiled before it is timed

    ctx = _Context(quick)
    ctx.ahead = ahead
    rng = np.random.default_rng(2026)
    if "seed" in sizes:
        _bench_seed_comparison(ctx, rng.integers(1, 256, SEED_SHAPE, dtype=np.uint8))
    for size in sizes:
        img = rng.integers(1, 256, SHAPES[size], dtype=np.uint8)
        for k in box_ks:
            _bench_blur(ctx, size, img, k)
        for k in filter_ks if size == "seed" else (21,):
            _bench_filter(ctx, size, img, (rng.standard_normal((k, k)) / k).astype(np.float32))
        for k, rank in low_rank if size == "seed" else ():
            _bench_low_rank(ctx, size, img, k, rank)
        _bench_contour(ctx, size, np.ascontiguousarray(img[:, :, 1]))

    name = cuda.get_current_device().name
    return {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "copy_bandwidth_GBps": ctx.bandwidth,
        "fma_rate_TFMAps": ctx.tfmas,
        "versions": _versions(),
        "rows": [asdict(r) for r in ctx.rows],
        "elapsed_s": round(time.perf_counter() - started, 1),
        "notes": {
            "cupy": "installed" if ctx.ndi is not None else "not installed: skipped",
            "torch": "installed with CUDA" if ctx.torch is not None else "not available: skipped",
        },
    }


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("numpy", "numba", "numba_cuda", "cv2", "cupy", "torch"):
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except Exception:
            out[name] = None
    return out


def best_ours(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(op, size) -> imgfilter's fastest time (kernel, else per-call) for that case:
    what the "vs ours" ratios divide by."""
    ours: dict[tuple[str, str], float] = {}
    for r in rows:
        t = r["kernel_us"] or r["call_us"]
        key = (r["op"], r["size"])
        if r["impl"].startswith("imgfilter") and t:
            ours[key] = min(t, ours.get(key, t))
    return ours


def print_table(result: dict) -> str:
    """The human table: one line per measurement, with ratios to imgfilter."""
    lines = [
        f"device: {result['device']}   date: {result['date']}   "
        f"copy bandwidth: {result['copy_bandwidth_GBps']:.0f} GB/s   "
        f"float32 FMA rate: {result['fma_rate_TFMAps']:.1f} TFMA/s",
        f"{'operation':<16} {'size':<5} {'implementation':<30} {'kernel us':>10} "
        f"{'call us':>10} {'Mpix/s':>8} {'GB/s':>7} {'x floor':>11} {'vs ours':>8}",
    ]
    ours = best_ours(result["rows"])
    for r in result["rows"]:
        t = r["kernel_us"] or r["call_us"]
        base = ours.get((r["op"], r["size"]))
        ratio = f"{t / base:8.1f}" if base and t else " " * 8
        k = f"{r['kernel_us']:10.1f}" if r["kernel_us"] else " " * 10
        c = f"{r['call_us']:10.1f}" if r["call_us"] else " " * 10
        gbs = f"{r['extra']['GB/s']:7.0f}" if "GB/s" in r["extra"] else " " * 7
        ex = r["extra"]
        xf = f"{ex['x_floor']:5.1f} {ex['floor']:<5}" if "x_floor" in ex else " " * 11
        mp = f"{ex['Mpix/s']:8.0f}" if "Mpix/s" in ex else " " * 8
        lines.append(
            f"{r['op']:<16} {r['size']:<5} {r['impl']:<30} {k} {c} {mp} {gbs} {xf} {ratio}"
        )
    for name, note in result["notes"].items():
        lines.append(f"{name}: {note}")
    return "\n".join(lines)


# ------------------------------------------------------------ lists of many images

LIST_K = 5
LIST_MAX_SIDE = 200


def list_images(n: int) -> list[np.ndarray]:
    """n RGB uint8 images of random sizes up to LIST_MAX_SIDE on a side (seeded by n)."""
    rng = np.random.default_rng(n)
    sides = rng.integers(1, LIST_MAX_SIDE + 1, (n, 2))
    return [rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8) for h, w in sides]


def list_child(n: int, kind: str, repeats: int) -> dict:
    """This fresh process's figures for a "device" (torch) or "host" (NumPy) list of
    `list_images(n)`: imgfilter's import, the first blur_batch, the warm calls, and for
    "host" a cv2.blur loop and the 4-D batches (host, torch) of the mean size."""
    import cv2
    import torch

    host = list_images(n)
    side = round(float(np.sqrt(np.mean([i.shape[0] * i.shape[1] for i in host]))))
    t0 = time.perf_counter()
    import imgfilter

    row: dict = {"n": n, "kind": kind, "import_s": time.perf_counter() - t0}
    sync = torch.cuda.synchronize
    images = [torch.from_numpy(i).cuda() for i in host] if kind == "device" else host
    sync()
    t0 = time.perf_counter()
    got = imgfilter.blur_batch(images, LIST_K)
    sync()
    row["first_s"] = time.perf_counter() - t0
    row["numba_imported"] = "numba" in sys.modules

    def ms(fn: Callable[[], object]) -> float:  # median of synchronised calls
        return wall_us(lambda: (fn(), sync()), repeats) / 1e3

    row["warm_ms"] = ms(lambda: imgfilter.blur_batch(images, LIST_K))
    row["warm_us_per_image"] = 1e3 * row["warm_ms"] / n
    got = [g.copy_to_host() for g in got] if kind == "device" else got
    row["equal_cv2"] = all(np.array_equal(g, cv2.blur(i, (LIST_K, LIST_K)))
                           for g, i in zip(got, host, strict=True))  # fmt: skip
    if kind == "host":
        row["cv2_loop_ms"] = ms(lambda: [cv2.blur(i, (LIST_K, LIST_K)) for i in host])
        batch = np.random.default_rng(0).integers(0, 256, (n, side, side, 3), dtype=np.uint8)
        d_batch = torch.from_numpy(batch).cuda()
        row["batch_side"] = side
        row["host_4d_ms"] = ms(lambda: imgfilter.blur_batch(batch, LIST_K))
        row["device_4d_ms"] = ms(lambda: imgfilter.blur_batch(d_batch, LIST_K))
    row["gpu"] = torch.cuda.get_device_name()
    return row


def _list_child_run(n: int, kind: str, repeats: int, cache: str | None) -> dict:
    """`list_child` in a fresh process with kernel caches in `cache` (None: new, empty)."""
    cache = cache or tempfile.mkdtemp(prefix="imgfilter-lists-")
    env = {**os.environ, "IMGFILTER_CACHE_DIR": cache, "NUMBA_CACHE_DIR": f"{cache}/numba"}
    done = subprocess.run([sys.executable, __file__, "--lists-child", f"{n},{kind},{repeats}"],
                          capture_output=True, text=True, env=env)  # fmt: skip
    if done.returncode:
        return {"n": n, "kind": kind, "error": done.stderr.strip()[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_lists(counts: list[int], repeats: int) -> dict:
    """Every list case (see the module docstring); rows as `list_child` gives them, with
    "caches": "empty" or "kept" (filled by an earlier process's list of 50 images)."""
    kept = tempfile.mkdtemp(prefix="imgfilter-lists-kept-")
    rows = [{**_list_child_run(50, "device", 1, kept), "caches": "filled here"}]
    for n in counts:
        for kind, cache in (("device", None), ("device", kept), ("host", kept)):
            row = _list_child_run(n, kind, repeats, cache)
            rows.append({**row, "caches": "kept" if cache else "empty"})
            print(_list_line(rows[-1]), flush=True)
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    case = f"blur {LIST_K}, random RGB uint8 images up to {LIST_MAX_SIDE}^2"
    return {"case": case, "date": date, "cpus": os.cpu_count(), "versions": _versions(),
            "rows": rows}  # fmt: skip


def _list_line(r: dict) -> str:
    if "error" in r:
        return f"{r['n']:>6} {r['kind']:<6} failed: {r['error'].splitlines()[-1]}"
    extra = "" if r["kind"] == "device" else (
        f"  cv2 loop {r['cv2_loop_ms']:.2f} ms  4-D {r['batch_side']}^2: host "
        f"{r['host_4d_ms']:.2f} ms, torch {r['device_4d_ms']:.2f} ms")  # fmt: skip
    return (f"{r['n']:>6} {r['kind']:<6} caches {r['caches']:<5} first {r['first_s']:7.3f} s  "
            f"warm {r['warm_ms']:8.2f} ms ({r['warm_us_per_image']:6.1f} us/img)  "
            f"numba {r['numba_imported']}  equal {r['equal_cv2']}{extra}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """`python benchmarks/bench.py [--sizes seed,4k,8k] [--json FILE] [--quick]`, or
    `--lists N,N,... [--repeats R] [--json FILE]`."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="seed", help="comma-separated: seed, 4k, 8k")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lists", help="comma-separated list lengths: the lists case alone")
    parser.add_argument("--repeats", type=int, default=7, help="warm calls of the lists case")
    parser.add_argument("--lists-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.lists_child:
        n, kind, repeats = args.lists_child.split(",")
        print(json.dumps(list_child(int(n), kind, int(repeats))))
        return 0
    lengths = (args.lists or "").split(",")
    if args.lists and (not all(c.isdigit() and int(c) > 0 for c in lengths) or args.repeats < 1):
        parser.error(f"--lists {args.lists!r}: give lengths such as 1500,5000 (--repeats >= 1)")
    sizes = tuple(s.strip() for s in args.sizes.split(",") if s.strip())
    if not sizes or any(s not in SHAPES for s in sizes):
        parser.error(f"--sizes {args.sizes!r}: choose from {', '.join(SHAPES)}")
    if args.lists:
        result = run_lists([int(c) for c in lengths], args.repeats)
    else:
        result = run(sizes, quick=args.quick)
        print(print_table(result))
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
