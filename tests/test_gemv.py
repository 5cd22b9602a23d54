"""kernels.linalg.gemv against float64 NumPy, and its planning, validation and autotune cache.

Error measure: |y - ref| <= rtol * (|A| @ |x|) per element (the scale of a dot
product's rounding error; a plain relative error is meaningless where the sum cancels),
rtol 1e-5 for float32 and 2e-3 for float16 (float32 accumulation, float16 output).
On the simulator (CI) shapes and blocks stay tiny; `gpu` tests run the full list.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from numba import cuda
from threaded import run_in_threads

from kernels.linalg import gemv as G
from kernels.linalg.gemv import Config, gemv, pack_bytes, plan

RTOL = {np.float32: 1e-5, np.float16: 2e-3}
METHODS = ["naive", "splitk", "vectorized", "tree"]


def random_problem(n: int, k: int, dtype, seed: int = 0):
    rng = np.random.default_rng(seed + 1009 * n + k)
    A = (rng.random((n, k)) * 2 - 1).astype(dtype)
    x = (rng.random(k) * 2 - 1).astype(dtype)
    A[A == 0] = dtype(0.5)  # never all zeros, even for 1 x 1
    x[x == 0] = dtype(0.25)
    return A, x


def check(y, A, x) -> None:
    y = np.asarray(y)
    assert y.shape == (A.shape[0],)
    a, v = A.astype(np.float64), x.astype(np.float64)
    ref, scale = a @ v, np.abs(a) @ np.abs(v)
    err = np.abs(y.astype(np.float64) - ref)
    # A float16 result in the subnormal range is rounded to a step of 2**-24 (seen on
    # the H100: -1.32e-6 stored as -1.3e-6 for a 1-column row).
    floor = 2.0**-24 if y.dtype == np.float16 else np.finfo(np.float32).tiny
    bad = err > RTOL[A.dtype.type] * scale + floor
    assert not bad.any(), f"rows {np.flatnonzero(bad)[:5]}: got {y[bad][:5]}, want {ref[bad][:5]}"


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    """Every test gets its own, empty autotune cache directory."""
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path / "cache"))
    G._TUNED.clear()
    G._PLANS.clear()
    yield tmp_path / "cache"
    G._TUNED.clear()
    G._PLANS.clear()


# ------------------------------------------------------------- planning (host logic)


def test_pack_bytes_by_alignment_stride_and_contiguity():
    assert pack_bytes(16, 2, (256, 512), 2048, True) == 16
    assert pack_bytes(16, 4, (256, 512), 4000, True) == 16  # 1000 float32 per row
    assert pack_bytes(16, 4, (256, 512), 4004, True) == 4  # 1001 float32: scalar
    assert pack_bytes(16, 2, (256, 512), 2 * 1002, True) == 4  # rows 4-byte aligned
    assert pack_bytes(16, 2, (256, 520), 2048, True) == 8  # x only 8-byte aligned
    assert pack_bytes(16, 2, (258, 512), 2048, True) == 2  # A at an odd half
    assert pack_bytes(8, 4, (256, 512), 4096, True) == 8  # capped by vec_bytes
    assert pack_bytes(16, 4, (256, 512), 4096, False) == 4  # strided columns


def test_plan_geometry_and_kernels():
    how, _ = plan(1000, 4096, np.float16, method="tree", config=Config(4, 32, 2, 16))
    assert (how.grid, how.block, how.pack) == (250, (32, 4), 16)
    how, _ = plan(7, 33, np.float32, method="tree", config=Config(4, 32, 2, 16))
    assert how.pack == 4  # 33 float32 per row: rows are only 4-byte aligned
    how, _ = plan(5, 8, np.float32, method="naive")
    assert how.block == (G.NAIVE_BLOCK, 1) and how.grid == 1
    assert plan(9, 9, np.float32, method="splitk")[0].block == (32, 4)


def test_default_config_sizes_lanes_to_k():
    m, cfg = G.default_config(4096, 4096, np.float16)
    assert m == "tree" and cfg.reduce_threads == 128 and cfg.block_n == 2
    m, cfg = G.default_config(1000, 7, np.float32)
    assert cfg.reduce_threads == 2 and cfg.block_n == 64
    m, cfg = G.default_config(1, 1, np.float32)
    assert cfg.reduce_threads == 1 and cfg.block_n == 1
    # Short rows: no idle lane (the classifier's feature matrix: autotune's H100 winner).
    m, cfg = G.default_config(3840 * 2160, 20, np.float32)
    assert (cfg.reduce_threads, cfg.block_n, cfg.unroll) == (4, 32, 1)


def test_candidates_are_valid_and_include_both_reductions():
    space = G.candidates(4096, 4096, np.float16)
    assert {m for m, _ in space} == {"tree", "vectorized"}
    for m, cfg in space:
        cfg.validate(m)
    assert any(c.vec_bytes == 8 for _, c in space)  # the 128-bit vs 64-bit comparison


# ------------------------------------------------------------------ correctness (sim)

# (n, k): 1 row, 1 column, sizes on both sides of 32, not multiples of any pack.
SHAPES = [(1, 1), (7, 1), (1, 33), (7, 31), (31, 7), (33, 32), (3, 100)]
SMALL = {  # small blocks so the simulator (a Python thread per CUDA thread) stays fast
    "naive": None,
    "splitk": Config(block_n=2, reduce_threads=4, unroll=1, vec_bytes=4),
    "vectorized": Config(block_n=2, reduce_threads=4, unroll=2, vec_bytes=16),
    "tree": Config(block_n=2, reduce_threads=4, unroll=2, vec_bytes=16),
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_every_method_small_shapes(method, dtype):
    for n, k in SHAPES:
        A, x = random_problem(n, k, dtype)
        y = gemv(A, x, method=method, config=SMALL[method])
        assert y.dtype == dtype
        check(y, A, x)


@pytest.mark.parametrize(
    "cfg",
    [Config(1, 64, 1, 16), Config(4, 1, 1, 16), Config(3, 8, 4, 16), Config(2, 16, 1, 8)],
    ids=["rt64-smem-tree", "rt1", "unroll4-bn3", "vec8"],
)
def test_tree_geometries(cfg):
    # rt 64: two warps per row, combined through shared memory; block_n 3: a row
    # count that does not divide N; unroll 4 with a main loop and a remainder.
    for dtype in (np.float32, np.float16):
        A, x = random_problem(3, 150, dtype)
        check(gemv(A, x, method="tree", config=cfg), A, x)


def test_auto_without_cache_uses_default_config():
    A, x = random_problem(5, 40, np.float32)
    check(gemv(A, x), A, x)


def test_device_in_device_out_and_out_argument():
    A, x = random_problem(9, 33, np.float32)
    dA, dx = cuda.to_device(A), cuda.to_device(x)
    dy = gemv(dA, dx, method="tree", config=SMALL["tree"])
    assert not isinstance(dy, np.ndarray) and hasattr(dy, "copy_to_host")
    check(dy.copy_to_host(), A, x)
    dout = cuda.device_array(9, np.float32)
    assert gemv(dA, dx, method="splitk", config=SMALL["splitk"], out=dout) is dout
    check(dout.copy_to_host(), A, x)
    hout = np.zeros(9, np.float32)
    assert gemv(A, x, method="naive", out=hout) is hout
    check(hout, A, x)


def test_float16_in_float32_out():
    A, x = random_problem(6, 50, np.float16)
    out = np.zeros(6, np.float32)
    gemv(A, x, method="vectorized", config=SMALL["vectorized"], out=out)
    a, v = A.astype(np.float64), x.astype(np.float64)
    err = np.abs(out - a @ v)
    assert np.all(err <= 1e-5 * (np.abs(a) @ np.abs(v)) + 1e-30)  # float32 output


@pytest.mark.parametrize("method", ["splitk", "tree"])
def test_odd_leading_dimension(method):
    """A as a view with a row stride larger than K (big[:, :K]), host and device."""
    for dtype in (np.float32, np.float16):
        big, x = random_problem(5, 45, dtype)
        A = big[:, :37]
        x = x[:37].copy()
        check(gemv(A, x, method=method, config=SMALL[method]), A, x)  # host: copied
        dA = cuda.to_device(big)[:, :37]  # device: used in place
        y = gemv(dA, cuda.to_device(x), method=method, config=SMALL[method])
        check(y.copy_to_host(), A, x)


def test_strided_x_on_device():
    A, xx = random_problem(4, 40, np.float32)
    dx = cuda.to_device(np.repeat(xx, 2))[::2]
    check(gemv(cuda.to_device(A), dx, method="tree", config=SMALL["tree"]).copy_to_host(), A, xx)


def test_empty_rows():
    assert gemv(np.zeros((0, 5), np.float32), np.ones(5, np.float32)).shape == (0,)


def test_plans_are_cached_per_shape():
    A, x = random_problem(3, 9, np.float32)
    gemv(A, x, method="tree", config=SMALL["tree"])
    gemv(A, x, method="tree", config=SMALL["tree"])
    assert len(G._PLANS) == 1
    dA, dx = cuda.to_device(A), cuda.to_device(x)
    gemv(dA, dx, method="tree", config=SMALL["tree"], out=cuda.device_array(3, np.float32))
    assert len(G._PLANS) == 1  # the output's dtype and kind do not change the plan


@pytest.mark.parametrize(
    "args,kwargs,exc,words",
    [
        ((np.zeros(5, np.float32), np.zeros(5, np.float32)), {}, ValueError, "2-D"),
        ((np.zeros((2, 3), np.float32), np.zeros((3, 1), np.float32)), {}, ValueError, "1-D"),
        ((np.zeros((2, 3), np.float32), np.zeros(4, np.float32)), {}, ValueError, "K = 3"),
        ((np.zeros((2, 3), np.float64), np.zeros(3, np.float64)), {}, TypeError, "float64"),
        ((np.zeros((2, 3), np.int32), np.zeros(3, np.int32)), {}, TypeError, "int32"),
        ((np.zeros((2, 3), np.float32), np.zeros(3, np.float16)), {}, TypeError, "same dtype"),
        (([[1.0]], np.zeros(1, np.float32)), {}, TypeError, "list"),
        ((np.ones((2, 3), np.float32), np.ones(3, np.float32)), {"method": "x"}, ValueError, "'x'"),
        (
            (np.ones((2, 3), np.float32), np.ones(3, np.float32)),
            {"out": np.zeros(3, np.float32)},
            ValueError,
            "out has shape",
        ),
        (
            (np.ones((2, 3), np.float32), np.ones(3, np.float32)),
            {"method": "tree", "config": Config(4, 48, 1, 16)},
            ValueError,
            "power of two",
        ),
        (
            (np.ones((2, 3), np.float32), np.ones(3, np.float32)),
            {"method": "tree", "config": Config(64, 32, 1, 16)},
            ValueError,
            "1024",
        ),
        (
            (np.ones((2, 3), np.float32), np.ones(3, np.float32)),
            {"method": "tree", "config": Config(4, 32, 3, 16)},
            ValueError,
            "unroll",
        ),
        (
            (np.ones((2, 3), np.float32), np.ones(3, np.float32)),
            {"method": "tree", "config": {"blockn": 4}},
            ValueError,
            "blockn",
        ),
        (
            (np.ones((2, 3), np.float32), np.ones(3, np.float32)),
            {"method": "tree", "config": (4, 32)},
            TypeError,
            "config",
        ),
    ],
)
def test_bad_input_is_named(args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        gemv(*args, **kwargs)
    assert words in str(info.value)


# ------------------------------------------------------- streams, out=, asynchrony (sim)


class CoreStream:
    """A stream by the `__cuda_stream__` protocol (cuda.core's): the legacy stream."""

    def __cuda_stream__(self):
        return (0, 0)


def test_stream_argument_is_accepted():
    """stream=: a stream object or a raw handle (the simulator runs in order); a
    non-stream is a TypeError."""
    A, x = random_problem(6, 20, np.float32)
    dA, dx = cuda.to_device(A), cuda.to_device(x)
    for stream in (CoreStream(), 0, None):
        y = gemv(dA, dx, method="tree", config=SMALL["tree"], stream=stream)
        check(y.copy_to_host(), A, x)
    check(gemv(A, x, stream=CoreStream()), A, x)  # host in, host out
    with pytest.raises(TypeError, match="stream"):
        gemv(dA, dx, stream="default")


def test_device_out_is_written_in_place_and_returned():
    A, x = random_problem(7, 30, np.float16)
    dA, dx = cuda.to_device(A), cuda.to_device(x)
    for dtype in (np.float16, np.float32):
        out = cuda.to_device(np.full(7, np.nan, dtype))
        assert gemv(dA, dx, method="tree", config=SMALL["tree"], out=out) is out
        check(out.copy_to_host(), A, x)
    # A strided device out (every other element of a buffer): the others untouched.
    buf = cuda.to_device(np.full(14, -7.0, np.float32))
    view = buf[::2]
    assert gemv(dA, dx, method="splitk", config=SMALL["splitk"], out=view) is view
    got = buf.copy_to_host()
    check(got[::2], A, x)
    assert np.all(got[1::2] == -7.0)


def test_out_overlapping_an_input_is_refused():
    A, x = random_problem(4, 6, np.float32)
    buf = cuda.to_device(np.concatenate([A.ravel(), x, np.zeros(4, np.float32)]))
    dA = buf[:24].reshape(4, 6)
    dx = buf[24:30]
    for out in (buf[20:24], buf[26:30], buf[:4]):  # inside A, inside x, A's start
        with pytest.raises(ValueError, match="overlaps"):
            gemv(dA, dx, out=out)
    out = buf[30:34]  # right after x: fine
    assert gemv(dA, dx, out=out) is out
    check(out.copy_to_host(), A, x)


@pytest.mark.parametrize(
    "out,exc,words",
    [
        (np.zeros(5, np.float32), ValueError, "out has shape"),
        (np.zeros((4, 1), np.float32), ValueError, "1-D"),
        (np.zeros(4, np.float64), TypeError, "float64"),
        (np.zeros(4, np.int32), TypeError, "int32"),
    ],
    ids=["shape", "rank", "float64", "int32"],
)
@pytest.mark.parametrize("where", ["host", "device"])
def test_out_of_wrong_shape_or_dtype_is_refused(out, exc, words, where):
    A, x = random_problem(4, 6, np.float32)
    dA, dx = cuda.to_device(A), cuda.to_device(x)
    dout = out if where == "host" else cuda.to_device(out)
    with pytest.raises(exc, match=words):
        gemv(dA, dx, out=dout)


def test_threads_share_the_autotune_file_without_losing_entries(tmp_cache):
    """Issue 28: eight threads store entries at once; each read-modify-write of the
    cache file is whole (without the lock, entries are lost)."""

    def store(i):
        for j in range(5):
            G._store(f"{i}x{j}:float32:test", {"method": "tree", "config": {}})

    assert run_in_threads(8, store) == []
    entries = json.loads(G.cache_path().read_text())["entries"]
    assert len(entries) == 40


def test_threads_plan_concurrently():
    """Plans made from many threads at once (first use included) are all cached and
    right; the simulator's kernels run one thread at a time, so only planning is
    concurrent here (the gpu tests launch from threads)."""
    got = {}

    def work(i):
        got[i] = G._plan_for(("t", i), 5 + i, 40, np.float32, "tree", None, (), 160, True)

    assert run_in_threads(8, work) == []
    assert all(G._PLANS[("t", i)] is got[i] for i in range(8))
    assert all(got[i][0] == G.plan(5 + i, 40, np.float32, method="tree")[0] for i in range(8))


# -------------------------------------------------------------------- autotune cache


def test_autotune_verifies_times_caches_and_auto_uses_it(tmp_cache):
    space = [("tree", Config(2, 4, 1, 16)), ("vectorized", Config(2, 4, 1, 16))]
    best = G.autotune(5, 40, np.float32, space=space, launches=1)
    assert best["method"] in ("tree", "vectorized") and "kernel_us" in best  # sim: no timing
    assert all(t["ok"] for t in best["tried"]) and len(best["tried"]) == 2
    data = json.loads(G.cache_path().read_text())
    assert G.cache_path().parent == tmp_cache
    entry = data["entries"][G.cache_key(5, 40, np.float32)]
    assert entry["config"] == best["config"]
    G._TUNED.clear()  # a new process: read back from disk
    method, cfg = G.cached_entry(5, 40, np.float32)
    assert method == best["method"] and cfg == Config(**best["config"])
    assert plan(5, 40, np.float32)[0].config == cfg
    A, x = random_problem(5, 40, np.float32)
    check(gemv(A, x), A, x)


def test_autotune_rejects_wrong_results(monkeypatch):
    monkeypatch.setattr(G, "within_tolerance", lambda *a: False)
    with pytest.raises(RuntimeError, match="no gemv candidate"):
        G.autotune(3, 8, np.float32, space=[("tree", Config(1, 4, 1, 16))], launches=1)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 99, "entries": {}}', ""])
def test_corrupt_cache_is_ignored(tmp_cache, text):
    tmp_cache.mkdir(parents=True, exist_ok=True)
    G.cache_path().write_text(text)
    assert G.cached_entry(5, 40, np.float32) is None
    A, x = random_problem(5, 40, np.float32)
    check(gemv(A, x), A, x)


def test_bad_cache_entry_is_ignored(tmp_cache):
    tmp_cache.mkdir(parents=True, exist_ok=True)
    key = G.cache_key(5, 40, np.float32)
    bad = {"method": "tree", "config": {"block_n": 4, "reduce_threads": 48}}
    G.cache_path().write_text(json.dumps({"version": 1, "entries": {key: bad}}))
    assert G.cached_entry(5, 40, np.float32) is None


def test_xdg_cache_home_is_honoured(monkeypatch, tmp_path):
    monkeypatch.delenv("IMGFILTER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert G.cache_path() == tmp_path / "xdg" / "imgfilter" / "kernels" / G.CACHE_FILE


def test_autotune_bad_arguments():
    with pytest.raises(TypeError, match="float64"):
        G.autotune(4, 4, np.float64)
    with pytest.raises(ValueError, match="N, K >= 1"):
        G.autotune(0, 4, np.float32)


# ------------------------------------------------------------------- full size (GPU)

GPU_SIZES = [1, 7, 31, 32, 33, 1000, 1024, 4097]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("method", ["auto", *METHODS])
def test_gpu_full_shape_list(method, dtype):
    for n in GPU_SIZES:
        for k in GPU_SIZES:
            A, x = random_problem(n, k, dtype)
            y = gemv(cuda.to_device(A), cuda.to_device(x), method=method)
            check(y.copy_to_host(), A, x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_tree_configs_and_odd_leading_dimension(dtype):
    cfgs = [Config(1, 256, 4, 16), Config(8, 32, 2, 16), Config(16, 16, 1, 8), Config(64, 4, 1, 4)]
    for n, k in [(1000, 4097), (4097, 1000), (33, 1024), (1024, 33)]:
        big, xx = random_problem(n, k + 5, dtype)
        A = cuda.to_device(big)[:, :k]  # row stride K + 5: rows misaligned for packs
        x = cuda.to_device(xx[:k].copy())
        for cfg in cfgs:
            for method in ("tree", "vectorized"):
                check(gemv(A, x, method=method, config=cfg).copy_to_host(), big[:, :k], xx[:k])
        big, xx = random_problem(n, k + 8, dtype)  # row stride K + 8: aligned when K is
        A = cuda.to_device(big)[:, :k]
        check(gemv(A, cuda.to_device(xx[:k].copy())).copy_to_host(), big[:, :k], xx[:k])


@pytest.mark.gpu
def test_gpu_autotune_small_and_torch_input():
    best = G.autotune(1024, 1024, np.float16)
    assert G.cached_entry(1024, 1024, np.float16) == (best["method"], Config(**best["config"]))
    torch = pytest.importorskip("torch")
    A = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    x = torch.randn(1024, device="cuda", dtype=torch.float16)
    y = np.asarray(gemv(A, x).copy_to_host())
    check(y, A.cpu().numpy(), x.cpu().numpy())


def _stream_and_handle():
    from kernels.common.devarray import stream_handle

    st = cuda.stream()
    return st, stream_handle(st)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_repeated_calls_and_outputs(dtype):
    """Repeated calls: new outputs, views, out= of the other dtype and a strided out."""
    from kernels.common.arrays import empty

    n, k = 1000, 4097
    A, x = random_problem(n, k, dtype)
    big, _ = random_problem(n, k + 8, dtype)
    dA, dx = cuda.to_device(A), cuda.to_device(x)
    for i in range(4):
        y = gemv(dA, dx)  # new output each call
        check(y.copy_to_host(), A, x)
        x2 = (x * dtype(i + 1)).astype(dtype)
        out = cuda.device_array(n, dtype)
        assert gemv(dA, cuda.to_device(x2), out=out) is out
        check(out.copy_to_host(), A, x2)
        out32 = empty((n,), np.float32)
        assert gemv(dA, cuda.to_device(x2), out=out32) is out32
        check(out32.copy_to_host(), A, x2)
        strided = cuda.device_array(2 * n, dtype)[::2]
        gemv(dA, dx, out=strided)
        check(strided.copy_to_host(), A, x)
        dbig = cuda.to_device(big)[:, :k]  # row stride K + 8: another plan
        check(gemv(dbig, dx).copy_to_host(), big[:, :k], x)


@pytest.mark.gpu
def test_gpu_call_returns_while_the_stream_is_busy():
    """Issue 23: on device inputs gemv queues its kernel behind 0.3 s of spin on the
    caller's stream and returns at once (the stream still busy); then the result is
    right. With no stream=, the inputs' own stream (DeviceArray.stream) is used."""
    from kernels.common import cudadrv, timing
    from kernels.common.arrays import to_device, to_host

    drv = cudadrv.driver()
    st, h = _stream_and_handle()
    A, x = random_problem(1024, 1024, np.float32)
    dA, dx = to_device(A, h), to_device(x, h)
    gemv(dA, dx, stream=h)  # compile and plan first
    drv.synchronize(h)
    for kwargs in ({"stream": h}, {"stream": st}, {}):
        buf = timing.busy(0.3, stream=h)
        t0 = time.perf_counter()
        y = gemv(dA, dx, **kwargs)
        took = time.perf_counter() - t0
        assert not drv.idle(h), "gemv waited for the stream"
        assert took < 0.1
        drv.synchronize(h)
        check(to_host(y, h), A, x)
        del buf


@pytest.mark.gpu
def test_gpu_threads_call_at_once():
    """Issue 28: 8 threads x 10 calls of new shapes (first use included), each on its
    own stream."""
    from kernels.common.arrays import to_device, to_host

    def work(i):
        st, h = _stream_and_handle()
        for j in range(10):
            A, x = random_problem(100 + 7 * i + j, 333 + i, np.float16)
            y = gemv(to_device(A, h), to_device(x, h), stream=h)
            check(to_host(y, h), A, x)

    errors = run_in_threads(8, work)
    assert not errors, errors[0]


@pytest.mark.gpu
def test_gpu_cupy_non_default_stream():
    """Inputs written on a non-blocking CuPy stream behind a spin kernel, then gemv with
    and without stream=, and the result used on that stream: no caller-side sync."""
    cp = pytest.importorskip("cupy")
    from kernels.common import timing

    A, x = random_problem(2048, 1024, np.float32)
    st = cp.cuda.Stream(non_blocking=True)
    with st:
        for kwargs in ({"stream": st}, {}):  # {}: the stream CuPy's interface names
            dA, dx = cp.asarray(A), cp.asarray(x)
            buf = timing.busy(0.2, stream=st.ptr)
            dA *= 2  # queued behind the spin: a call on another stream reads A unscaled
            y = cp.asarray(gemv(dA, dx, **kwargs)) * 1
            got = cp.asnumpy(y, stream=st)
            st.synchronize()
            check(got, 2 * A, x)
            del buf


@pytest.mark.gpu
def test_gpu_torch_non_default_stream():
    """As the CuPy test, on a torch side stream (torch's current stream is what a
    tensor's interface names), and out= a torch tensor."""
    torch = pytest.importorskip("torch")
    from kernels.common import timing

    A, x = random_problem(2048, 1024, np.float16)
    tA = torch.from_numpy(A).cuda()
    tx = torch.from_numpy(x).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for kwargs in ({"stream": side}, {}):
            a = tA.clone()
            buf = timing.busy(0.2, stream=side.cuda_stream)
            a.mul_(2)
            y = torch.as_tensor(gemv(a, tx, **kwargs), device="cuda") * 1
            check(y.cpu().numpy(), 2 * A, x)
            del buf
        out = torch.empty(2048, dtype=torch.float32, device="cuda")
        a = tA.clone()
        buf = timing.busy(0.2, stream=side.cuda_stream)
        a.mul_(2)
        assert gemv(a, tx, out=out) is out
        check(out.cpu().numpy(), 2 * A, x)
        del buf


@pytest.mark.gpu
def test_gpu_per_call_host_time():
    """Issue 23: host time per call of gemv 1024 x 1024 on device inputs (1000 calls
    queued, no sync). Printed; a loose bound guards against regressions."""
    from kernels.common.arrays import to_device

    A, x = random_problem(1024, 1024, np.float32)
    dA, dx = to_device(A), to_device(x)
    gemv(dA, dx)
    cuda.synchronize()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(1000):
            gemv(dA, dx)
        runs.append((time.perf_counter() - t0) / 1000 * 1e6)
        cuda.synchronize()
    print(f"gemv 1024x1024 per call: {min(runs):.1f} us (median {np.median(runs):.1f})")
    assert min(runs) < 30.0
