"""GEMV, y = A @ x, in Numba CUDA: the variants of the TileLang GEMV study, and autotune.

A is (N, K), row-major (a row stride larger than K is fine: A may be a view such as
big[:, :K]), float32 or float16; x is (K,) of the same dtype; accumulation is float32.

- `naive`: one thread per output row, a serial loop over K. Neighbouring threads read
  addresses a row apart, so every load is its own memory transaction: the baseline.
- `splitk`: a 2-D block, `reduce_threads` lanes over K (threadIdx.x, so a warp reads
  consecutive elements: coalesced) times `block_n` rows (threadIdx.y). Each lane sums
  every reduce_threads-th element of its row; the partial sums meet through
  `cuda.atomic.add` on a float32 slot per row in shared memory.
- `vectorized`: as splitk, but each load fetches a pack of `vec_bytes` (16 bytes: 4 x
  float32 or 8 x float16; one `ld.global.v4.b32` instruction) where the addresses are
  aligned to the pack, `unroll` packs in flight per lane; the last K % pack elements
  of each row go through a scalar tail.
- `tree`: the vectorized loads, partial sums combined by a butterfly shuffle
  all-reduce (kernels.common.reduce.warp_allreduce_sum) inside each row's lane group, plus one
  round through shared memory when a row has more than 32 lanes. No atomics.
- `autotune(N, K, dtype)`: times the tree and vectorized kernels over block_n x
  reduce_threads x unroll x vec_bytes on random data, rejects any candidate whose
  result differs from float64 NumPy, and caches the fastest per (N, K, dtype, GPU name)
  in a JSON file in the user cache directory. `method="auto"` uses that entry, or
  `default_config` when there is none (it never tunes by itself).

128-bit loads: Numba has no 128-bit scalar type, so `load_pack2` (kernels.common.packs) is a
small Numba intrinsic that emits an LLVM load of a <4 x i32> vector aligned to 16
bytes from the address of A[r, c] and splits it into 4 float32 or 8 float16 (widened
to float32); NVVM turns it into one `ld.global.v4.u32` (checked in the PTX). 8-byte
packs are one `ld.global.v2.u32`. On the CUDA simulator (no LLVM) the same name is a
plain Python function that reads the pack element by element.

Calls are asynchronous on device arrays: `gemv` queues its kernel on the call's
stream (`stream=`, else the input's, else the legacy default) through
kernels.common.launch.launch (the driver directly, no Numba dispatch) and returns a device
array from the stream-ordered pool (kernels.common.devarray), or writes `out=`. Launch
geometry (grid, block, kernel) is computed once per (method, config, shape, dtype,
strides, alignment) and kept, so repeated calls do no planning work. The plan cache
and the autotune cache (and its file) are guarded by one lock: calls from several
threads are safe. The kernels are in `kernels.linalg.gemv_kernels`; this module names
them by `kernels.common.refs.KernelRef` and imports no Numba, so shipped ones run
without it.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..common import replay
from ..common.arrays import (
    SIMULATOR,
    as_device_array,
    empty,
    is_device_array,
    overlaps,
    resolve_stream,
    to_device,
    to_host,
)
from ..common.cache import cache_dir
from ..common.cudadrv import driver
from ..common.devarray import DeviceArray, cheap_view, empty_like, peek, stream_handle
from ..common.launch import cdiv, launch, launch_or_replay
from ..common.refs import KernelRef

METHODS = ("auto", "naive", "splitk", "vectorized", "tree")
TUNED_METHODS = ("tree", "vectorized")
DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
MAX_THREADS = 1024
MAX_BLOCK_N = 64  # rows per block: gemv_kernels.MAX_BLOCK_N, its shared slots' size
PACK_BYTES = (16, 8, 4, 2)
UNROLLS = (1, 2, 4, 8)
NAIVE_BLOCK = 128
CACHE_FILE = "gemv_autotune.json"
CACHE_VERSION = 1


@dataclass(frozen=True)
class Config:
    """Launch shape of the splitk / vectorized / tree kernels.

    block_n: rows per block (threadIdx.y), 1..64. reduce_threads: lanes per row over K
    (threadIdx.x), a power of two 1..1024; block_n * reduce_threads <= 1024.
    unroll: packs in flight per lane per step (1, 2, 4, 8; vectorized/tree).
    vec_bytes: the widest pack to load (16, 8, 4 or 2 bytes; the alignment of A and
    x may force a narrower one). naive uses only block_n (threads = rows per block).
    """

    block_n: int = 4
    reduce_threads: int = 32
    unroll: int = 2
    vec_bytes: int = 16

    @classmethod
    def coerce(cls, config) -> Config:
        if config is None or isinstance(config, Config):
            return config
        if isinstance(config, dict):
            unknown = set(config) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(
                    f"unknown gemv config keys {sorted(unknown)}; "
                    f"valid: {sorted(cls.__dataclass_fields__)}"
                )
            return cls(**config)
        raise TypeError(
            f"config must be a kernels.linalg.gemv.Config or a dict, got {type(config)}"
        )

    def validate(self, method: str) -> None:
        for name in ("block_n", "reduce_threads", "unroll", "vec_bytes"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"config.{name} must be an int, got {type(v).__name__}")
        if method == "naive":
            if not 1 <= self.block_n <= MAX_THREADS:
                raise ValueError(f"config.block_n must be in 1..1024, got {self.block_n}")
            return
        rt = self.reduce_threads
        if rt < 1 or rt > MAX_THREADS or rt & (rt - 1):
            raise ValueError(f"config.reduce_threads must be a power of two in 1..1024, got {rt}")
        if not 1 <= self.block_n <= MAX_BLOCK_N:
            raise ValueError(f"config.block_n must be in 1..{MAX_BLOCK_N}, got {self.block_n}")
        if self.block_n * rt > MAX_THREADS:
            raise ValueError(
                f"config.block_n * reduce_threads = {self.block_n * rt} exceeds 1024 threads"
            )
        if self.unroll not in UNROLLS:
            raise ValueError(f"config.unroll must be one of {UNROLLS}, got {self.unroll}")
        if self.vec_bytes not in PACK_BYTES:
            raise ValueError(f"config.vec_bytes must be one of {PACK_BYTES}, got {self.vec_bytes}")


DEFAULTS = {
    "naive": Config(block_n=NAIVE_BLOCK, reduce_threads=1, unroll=1, vec_bytes=4),
    "splitk": Config(block_n=4, reduce_threads=32, unroll=1, vec_bytes=4),
    "vectorized": Config(block_n=4, reduce_threads=32, unroll=1, vec_bytes=16),
    "tree": Config(block_n=4, reduce_threads=32, unroll=2, vec_bytes=16),
}


def default_config(n: int, k: int, dtype) -> tuple[str, Config]:
    """What `auto` runs without a tuned entry: tree, lanes per row sized to K.

    A row of at least 32 16-byte packs gets the power of two of lanes at or above its
    pack count (up to 128), and rows fill a block of 256 threads. A shorter row gets
    the power of two at or below it (no idle lane; some lanes take two packs) and
    rows fill 128 threads: for the classifier's (8.3 M x 20) float32 feature matrix
    that is autotune's winner on the H100 (4 lanes, 32 rows: 683.6 us for two GEMVs
    against 1003.9 us with 8 lanes and 32 rows; `benchmarks/classify_bench.py`).
    """
    pack = 16 // np.dtype(dtype).itemsize
    packs = max(1, cdiv(k, pack))
    rt = 1
    if packs < 32:
        while 2 * rt <= packs:
            rt *= 2
        threads = 128
    else:
        while rt < packs and rt < 128:
            rt *= 2
        threads = 256
    block_n = max(1, min(MAX_BLOCK_N, threads // rt, n))
    unroll = 4 if packs >= 4 * rt else 2 if packs >= 2 * rt else 1
    return "tree", Config(block_n=block_n, reduce_threads=rt, unroll=unroll, vec_bytes=16)


# ------------------------------------------------------------------------------ kernels


_LOCK = threading.Lock()  # guards _PLANS, _TUNED and the autotune file
_KERNELS = "kernels.linalg.gemv_kernels"


gemv_naive = KernelRef(_KERNELS, "gemv_naive")
gemv_splitk = KernelRef(_KERNELS, "gemv_splitk")


@functools.cache
def packed_kernel(nbytes: int, itemsize: int, unroll: int, tree: bool) -> KernelRef:
    """The vectorized (tree=False: atomics) or tree kernel for packs of nbytes
    (`gemv_kernels.packed_kernel`), by name.

    Compile-time (closure values, so Numba's on-disk cache keys on them): pack bytes,
    unroll, reduction. Launch-time: block (reduce_threads, block_n), grid
    cdiv(N, block_n).
    """
    return KernelRef(_KERNELS, "packed_kernel", (nbytes, itemsize, unroll, tree))


# ----------------------------------------------------------------------------- planning


def pack_bytes(
    widest: int, itemsize: int, addresses: tuple[int, ...], row_stride: int, unit: bool
) -> int:
    """The widest pack (<= widest bytes) every pack load of a row can use aligned.

    addresses: device addresses of A and x (empty where unknown: trusted aligned, as
    Numba's allocations are 256-byte aligned); row_stride: A's row stride in bytes;
    unit: both A's rows and x are contiguous. Falls back to one element (itemsize).
    """
    if not unit:
        return itemsize
    for nbytes in PACK_BYTES:
        if nbytes > widest or nbytes < itemsize:
            continue
        if row_stride % nbytes == 0 and all(a % nbytes == 0 for a in addresses):
            return nbytes
    return itemsize


@dataclass(frozen=True)
class Plan:
    """How one call runs: the kernel and its launch geometry."""

    method: str
    config: Config
    pack: int  # bytes per load of A (itemsize: scalar loads)
    grid: int
    block: tuple[int, int]


def plan(
    n: int,
    k: int,
    dtype,
    *,
    method: str = "auto",
    config=None,
    addresses: tuple[int, ...] = (),
    row_stride: int | None = None,
    unit: bool = True,
) -> tuple[Plan, object]:
    """Choose kernel and launch geometry for an (n, k) GEMV; returns (plan, kernel).

    method "auto" takes the autotune cache's entry for (n, k, dtype, this GPU), else
    `default_config`. A config given with "auto" runs the tree kernel with it.
    """
    dtype = np.dtype(dtype)
    if method not in METHODS:
        raise ValueError(f"unknown gemv method {method!r}; choose one of {', '.join(METHODS)}")
    config = Config.coerce(config)
    if method == "auto":
        if config is not None:
            method = "tree"
        else:
            hit = cached_entry(n, k, dtype)
            method, config = hit if hit is not None else default_config(n, k, dtype)
    if config is None:
        config = DEFAULTS[method]
    config.validate(method)
    isz = dtype.itemsize
    if method == "naive":
        return Plan(method, config, isz, max(1, cdiv(n, config.block_n)), (config.block_n, 1)), (
            gemv_naive
        )
    block = (config.reduce_threads, config.block_n)
    grid = max(1, cdiv(n, config.block_n))
    if method == "splitk":
        return Plan(method, config, isz, grid, block), gemv_splitk
    stride = k * isz if row_stride is None else row_stride
    nbytes = pack_bytes(config.vec_bytes, isz, addresses, stride, unit)
    kernel = packed_kernel(nbytes, isz, config.unroll, method == "tree")
    return Plan(method, config, nbytes, grid, block), kernel


# ------------------------------------------------------------------------------ the API


def _check(arr, name: str, ndim: int, what: str) -> None:
    shape = getattr(arr, "shape", None)
    dtype = getattr(arr, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"{name} must be a NumPy or device array, got {type(arr).__name__}")
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {tuple(shape)}")
    if dtype not in DTYPES:
        raise TypeError(f"{name} must be float32 or float16, got {np.dtype(dtype)}")


# (method, config, N, K, dtype, row stride, unit, A and x addresses mod 16) ->
# (Plan, kernel, grid, block). Read without the lock (a dict lookup is atomic);
# written under it.
_PLANS: dict[tuple, tuple] = {}
_PLANS_KEEP = 256


def _plan_for(key: tuple, n: int, k: int, dtype, method: str, config, addresses: tuple,
              row_stride: int, unit: bool) -> tuple:  # fmt: skip
    """The cached (Plan, kernel, grid, block) of a call shape (planned on a miss)."""
    how, kernel = plan(n, k, dtype, method=method, config=config, addresses=addresses,
                       row_stride=row_stride, unit=unit)  # fmt: skip
    hit = (how, kernel, (how.grid, 1, 1), (*how.block, 1))
    with _LOCK:
        if len(_PLANS) >= _PLANS_KEEP:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = hit
    return hit


def gemv(A, x, *, method: str = "auto", config=None, out=None, stream=None):
    """y = A @ x with float32 accumulation.

    A: (N, K) float32 or float16, row-major: C-contiguous, or (device arrays) rows of
    contiguous elements with a larger row stride (a view like big[:, :K]); host views
    are copied to a contiguous array first. x: (K,), A's dtype. The result has A's
    dtype unless `out` ((N,), float32 or float16) is given; then it is written there
    and `out` is returned.

    Device arrays (kernels.common.devarray.DeviceArray, Numba, CuPy, torch: anything with
    __cuda_array_interface__) in -> device array out, asynchronously: the kernel is
    queued on the call's stream and the call returns without waiting for the GPU.
    The stream: `stream` (a CuPy, torch, Numba or cuda.core stream, or a CUstream
    handle), else the one A's interface names (torch: its current stream), else the
    legacy default stream. The result is allocated on that stream
    (kernels.common.devarray's pool) unless `out` (a device array not overlapping A or x)
    is given. NumPy in: copied to the device on that stream, and the result copied
    back (this waits for the stream); NumPy out.
    method: "auto" (tuned entry or default tree), "naive", "splitk", "vectorized",
    "tree". config: a Config (or dict of its fields) forcing the launch shape.
    """
    replay_key = None
    if out is None and config is None:
        seen_A, seen_x = peek(A), peek(x)
        if seen_A is not None and seen_x is not None:
            replay_key = ("gemv call", seen_A[0], seen_x[0], seen_A[1] & 15, seen_x[1] & 15,
                          method)  # fmt: skip
            fast = replay.TABLE.get(replay_key)
            if fast is not None:
                recipe, template = fast
                handle = seen_A[2] if stream is None else stream_handle(stream)
                dy = empty_like(template, handle)
                recipe.replay([seen_A[1], seen_x[1], dy.ptr], handle)
                return dy
            A, x = cheap_view(A), cheap_view(x)
    return _gemv(A, x, method, config, out, stream, replay_key)


def _gemv(A, x, method: str, config, out, stream, replay_key):
    """gemv's general path: checks, plans, records, replays; a recorded call is filed
    under `replay_key` (None: not filed)."""
    if method not in METHODS:
        raise ValueError(f"unknown gemv method {method!r}; choose one of {', '.join(METHODS)}")
    if type(A) is DeviceArray and type(x) is DeviceArray:  # the common case, first
        on_device, dA, dx = True, A, x
    elif (on_device := is_device_array(A)) != is_device_array(x):
        raise TypeError("A and x must both be host (NumPy) arrays or both device arrays")
    elif on_device:
        # Shapes, dtypes and strides from DeviceArray views (a torch tensor's .dtype
        # is not a NumPy dtype).
        dA, dx = as_device_array(A), as_device_array(x)
    else:
        for name, obj in (("A", A), ("x", x)):
            if not isinstance(obj, np.ndarray):
                raise TypeError(f"{name} must be a NumPy or device array, got {type(obj).__name__}")
        dA, dx = A, x
    _check(dA, "A", 2, "(N, K)")
    _check(dx, "x", 1, "(K,)")
    n, k = dA.shape
    if dx.shape[0] != k:
        raise ValueError(f"x has {int(dx.shape[0])} elements, A has K = {k} columns")
    dtype = dA.dtype
    if dx.dtype != dtype:
        raise TypeError(f"x is {np.dtype(dx.dtype)} but A is {dtype}: give both the same dtype")
    dout = None
    if out is not None:
        if is_device_array(out):
            dout = as_device_array(out)
            _check(dout, "out", 1, "(N,)")
        elif isinstance(out, np.ndarray):
            _check(out, "out", 1, "(N,)")
        else:
            raise TypeError(f"out must be a NumPy or device array, got {type(out).__name__}")
        if (out if dout is None else dout).shape[0] != n:
            raise ValueError(f"out has shape {tuple(out.shape)}, expected ({n},)")
        if on_device and dout is not None and (overlaps(dout, dA) or overlaps(dout, dx)):
            raise ValueError("out overlaps A or x: give a separate output array")
    s = resolve_stream(stream, dA, dx)
    if not on_device:
        dA, dx = to_device(A, s), to_device(x, s)
    isz = dtype.itemsize
    sA, sx = dA.strides, dx.strides
    if n > 1 and k > 0 and (sA[0] <= 0 or sA[1] <= 0):
        raise ValueError(f"A must have positive strides, got {tuple(sA)}")
    unit = (sA[1] == isz or k <= 1) and (sx[0] == isz or k <= 1)
    row_stride = sA[0] if n > 1 else k * isz
    if config is not None and type(config) is not Config:
        config = Config.coerce(config)
    if SIMULATOR:  # numpy addresses there: packs are trusted aligned, as before
        addresses, align = (), ()
    else:
        addresses = (dA.ptr, dx.ptr)
        align = (dA.ptr & 15, dx.ptr & 15)
    key = (method, config, n, k, dtype.char, row_stride, unit, align)
    hit = _PLANS.get(key)
    if hit is None:
        hit = _plan_for(key, n, k, dtype, method, config, addresses, row_stride, unit)
    if dout is not None:
        dy = dout
    else:
        dy = empty((n,), dtype if out is None else out.dtype, s)
    if n:
        recipe_key = ("gemv", key, sA[1], sx[0], dy.strides[0], dy.dtype.char)
        launch_or_replay(recipe_key, (dA, dx, dy), hit[1], hit[2], hit[3], (dA, dx, dy), s)
        recipe = replay.TABLE.get(recipe_key)
        if recipe is not None and replay_key is not None and not dy.ptr & 511:
            replay.keep_call(replay_key, dy, recipe)
    if out is None:
        return dy if on_device else to_host(dy, s)
    if dout is None:
        out[...] = to_host(dy, s)
    return out


# ----------------------------------------------------------------------------- autotune


def cache_path() -> Path:
    """The autotune cache file, in the kernel cache directory (`kernels.common.cache`)."""
    return cache_dir() / CACHE_FILE


_TUNED: dict[str, dict] = {}  # path -> entries, read once per process per file


def _read_cache(path: Path) -> dict:
    """Entries of a cache file; {} when missing, unreadable or malformed."""
    try:
        data = json.loads(path.read_text())
        if data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
            return {}
        return data["entries"]
    except (OSError, ValueError, AttributeError):
        return {}


def _entries() -> dict:
    path = str(cache_path())
    entries = _TUNED.get(path)
    if entries is None:
        with _LOCK:
            entries = _TUNED.get(path)
            if entries is None:
                entries = _TUNED[path] = _read_cache(Path(path))
    return entries


@functools.cache
def gpu_name() -> str:
    """The GPU's name, as the autotune cache keys its entries."""
    if SIMULATOR:
        return "cuda-simulator"
    return driver().name()


def cache_key(n: int, k: int, dtype, gpu: str | None = None) -> str:
    return f"{n}x{k}:{np.dtype(dtype).name}:{gpu or gpu_name()}"


def cached_entry(n: int, k: int, dtype) -> tuple[str, Config] | None:
    """The tuned (method, Config) for this shape, dtype and GPU, if the cache has one."""
    entries = _entries()
    entry = entries.get(cache_key(n, k, dtype)) if entries else None
    if not isinstance(entry, dict):
        return None
    try:
        method = entry["method"]
        cfg = Config(**entry["config"])
        if method not in TUNED_METHODS:
            return None
        cfg.validate(method)
        return method, cfg
    except (KeyError, TypeError, ValueError):
        return None


def _store(key: str, entry: dict) -> None:
    """Add an entry to the cache file (read-modify-write, atomic replace; one thread
    at a time, a temp file per process and thread)."""
    path = cache_path()
    with _LOCK:
        entries = _read_cache(path)
        entries[key] = entry
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1))
            os.replace(tmp, path)
        except OSError:
            pass  # an unwritable cache only costs re-tuning
        _TUNED[str(path)] = entries
        _PLANS.clear()


def candidates(n: int, k: int, dtype) -> list[tuple[str, Config]]:
    """The search space: tree for every shape below, vectorized (atomics) for a few.

    reduce_threads 4..256 (powers of two, not wider than K's packs need; 16 and up for
    rows of 2048+ packs), block_n so
    that blocks have 64..512 threads, unroll 1, 2, 4, vec_bytes 16 (and 8 for tree at
    its default shape, to measure what the 128-bit loads buy).
    """
    isz = np.dtype(dtype).itemsize
    packs = max(1, cdiv(k, 16 // isz))
    out = []
    for rt in (4, 8, 16, 32, 64, 128, 256):
        if rt > 4 and rt // 2 >= packs:
            break
        if rt < 16 and packs >= 2048:
            continue  # long rows: a handful of lanes per row never keeps up (H100 runs)
        for threads in (64, 128, 256, 512):
            bn = threads // rt
            if bn < 1 or bn > MAX_BLOCK_N or (bn > n and bn > 1):
                continue
            for unroll in (1, 2, 4):
                if unroll > 1 and unroll * rt > packs:
                    continue
                out.append(("tree", Config(bn, rt, unroll, 16)))
    for cfg in (Config(4, 32, 1, 16), Config(4, 32, 2, 16), Config(2, 64, 2, 16)):
        out.append(("vectorized", cfg))
    out.append(("tree", Config(4, 32, 2, 8)))
    return out


def _reference(A: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 A @ x and |A| @ |x| (the scale of a dot product's rounding error)."""
    x64 = x.astype(np.float64)
    ref = np.empty(A.shape[0])
    scale = np.empty(A.shape[0])
    for s in range(0, A.shape[0], 2048):
        a = A[s : s + 2048].astype(np.float64)
        ref[s : s + 2048] = a @ x64
        scale[s : s + 2048] = np.abs(a) @ np.abs(x64)
    return ref, scale


RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3}


def within_tolerance(y: np.ndarray, ref: np.ndarray, scale: np.ndarray, dtype) -> bool:
    """|y - ref| <= rtol * (|A| @ |x|) + floor elementwise (rtol 1e-5 float32, 2e-3
    float16 inputs). floor: one float16 subnormal step (2**-24) for a float16 result,
    whose rounding there is absolute, else float32's smallest normal."""
    tiny = 2.0**-24 if y.dtype == np.float16 else np.finfo(np.float32).tiny
    err = np.abs(y.astype(np.float64) - ref)
    return bool(np.all(err <= RTOL[np.dtype(dtype)] * scale + tiny))


def autotune(
    n: int,
    k: int,
    dtype=np.float32,
    *,
    space: list[tuple[str, Config]] | None = None,
    launches: int = 20,
    store: bool = True,
    seed: int = 0,
    data: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict:
    """Find the fastest correct (method, Config) for an (n, k) GEMV on this GPU.

    Random A and x (uniform in [-1, 1); or `data` = (A, x) host arrays). Each
    candidate of `space` (default `candidates(n, k, dtype)`) runs once and is
    rejected unless within_tolerance of float64 NumPy, then is timed
    (kernels.common.timing.kernel_us). The winner is stored in the cache file
    (cache_path(), keyed by cache_key) unless store=False. Returns a dict: method,
    config, kernel_us, key, and every candidate's result under "tried".
    """
    from ..common.timing import kernel_us

    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be float32 or float16, got {dtype}")
    if n < 1 or k < 1:
        raise ValueError(f"autotune needs N, K >= 1, got N={n}, K={k}")
    if data is None:
        rng = np.random.default_rng(seed)
        A = (rng.random((n, k), dtype=np.float32) * 2 - 1).astype(dtype)
        x = (rng.random(k, dtype=np.float32) * 2 - 1).astype(dtype)
    else:
        A, x = data
        if A.shape != (n, k) or x.shape != (k,) or A.dtype != dtype or x.dtype != dtype:
            raise ValueError(f"data must be ({n}, {k}) and ({k},) arrays of {dtype}")
    ref, scale = _reference(A, x)
    dA, dx = to_device(A), to_device(x)
    nan = np.full(n, np.nan, np.float32)
    tried = []
    best = None
    for method, cfg in space if space is not None else candidates(n, k, dtype):
        how, kernel = plan(n, k, dtype, method=method, config=cfg)
        grid, block = how.grid, how.block
        dy = to_device(nan)  # results must be this candidate's
        launch(kernel, grid, block, (dA, dx, dy))
        ok = within_tolerance(to_host(dy), ref, scale, dtype)
        row = dict(method=method, config=asdict(cfg), pack=how.pack, ok=ok)
        if ok:

            def one(kernel=kernel, grid=grid, block=block, dy=dy):
                launch(kernel, grid, block, (dA, dx, dy))

            us = kernel_us(one, launches)
            row["kernel_us"] = round(us, 3)
            if best is None or us < best["kernel_us"]:
                best = dict(method=method, config=asdict(cfg), kernel_us=round(us, 3))
        tried.append(row)
    if best is None:
        raise RuntimeError(f"no gemv candidate passed verification for {n}x{k} {dtype}")
    key = cache_key(n, k, dtype)
    best["key"] = key
    if store:
        _store(key, {**best, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    best["tried"] = tried
    return best


def effective_gbs(n: int, k: int, dtype, kernel_us: float) -> float:
    """Bytes of A over time, in GB/s (x and y are negligible next to A)."""
    return n * k * np.dtype(dtype).itemsize / (kernel_us * 1e-6) / 1e9


__all__ = [
    "Config",
    "METHODS",
    "autotune",
    "cache_path",
    "default_config",
    "effective_gbs",
    "gemv",
    "plan",
]
