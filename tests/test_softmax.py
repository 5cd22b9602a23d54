"""kernels.softmax against float64 NumPy; the simulator shim's warp intrinsics.

On the simulator (CI) shapes stay small and block paths run with a forced small block;
tests marked `gpu` run the full shape list on a real device.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import ON_GPU
from numba import cuda, float32, int32, uint32
from threaded import run_in_threads

from kernels.common import arrays, launch
from kernels.common.reduce import (
    block_allreduce_max,
    block_allreduce_sum,
    group_mask,
    warp_allreduce_max,
    warp_allreduce_sum,
)
from kernels.softmax import dispatch as sm
from kernels.softmax import log_softmax, softmax
from kernels.softmax.dispatch import _pack_size, launch_plan, plan, warp_geometry

# Relative tolerance of probabilities; for log-softmax the same number is the absolute
# tolerance (an absolute error e in log space is a relative error ~e in probability).
# The absolute floor for probabilities covers results in the subnormal range.
RTOL = {np.float32: 1e-5, np.float16: 1e-3}
TINY = {np.float32: float(np.finfo(np.float32).tiny), np.float16: 2.0**-24}


def reference(x: np.ndarray, log: bool) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = x - m
        s = np.exp(z).sum(axis=1, keepdims=True)
        return z - np.log(s) if log else np.exp(z) / s


def check(y, x, log: bool) -> None:
    dt = x.dtype.type
    y = np.asarray(y)
    assert y.shape == x.shape
    ref = reference(x, log)
    if log:
        np.testing.assert_allclose(y.astype(np.float64), ref, rtol=RTOL[dt], atol=RTOL[dt])
    else:
        np.testing.assert_allclose(y.astype(np.float64), ref, rtol=RTOL[dt], atol=TINY[dt])


def random_rows(rows: int, cols: int, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + 7919 * cols + rows)
    return (rng.standard_normal((rows, cols)) * 3).astype(dtype)


def special_rows(cols: int, dtype) -> np.ndarray:
    """Huge values, -inf entries, and a row that is all -inf but one."""
    huge = 1e30 if dtype == np.float32 else 6e4
    x = random_rows(4, cols, dtype, seed=1)
    x[0, :: max(1, cols // 3)] = huge  # several maxima of a huge size
    x[1] += dtype(huge / 2) if cols > 1 else 0
    x[1, -1] = huge
    x[2, ::2] = -np.inf
    x[2, -1] = 0.5
    x[3, :] = -np.inf
    x[3, cols // 2] = -2.0
    return x


# --------------------------------------------------------------- the simulator shim


@cuda.jit
def _shim_probe(out):
    """64 threads (two warps): one row of `out` per intrinsic, one column per thread."""
    t = cuda.threadIdx.x
    lane = cuda.laneid
    v = int32(t + 1)
    full = uint32(0xFFFFFFFF)
    # Full-warp butterfly sum.
    s = v
    offset = 16
    while offset > 0:
        s += cuda.shfl_xor_sync(full, s, offset)
        offset //= 2
    out[0, t] = s
    # Width-8 groups with their own masks.
    s = v
    mask = group_mask(8)
    offset = 4
    while offset > 0:
        s += cuda.shfl_xor_sync(mask, s, offset)
        offset //= 2
    out[1, t] = s
    out[2, t] = cuda.shfl_down_sync(full, v, 3)
    out[3, t] = cuda.shfl_up_sync(full, v, 5)
    out[4, t] = cuda.shfl_sync(mask, v, (lane // 8) * 8 + 2)  # idx within each group
    out[5, t] = cuda.ballot_sync(full, t % 3 == 0)
    out[6, t] = int32(warp_allreduce_max(float32(t % 13), 32, full))


def test_shim_shuffles_match_hardware_semantics():
    out = np.zeros((7, 64), np.int64)
    _shim_probe[1, 64](out)
    t = np.arange(64)
    v = t + 1
    warp_base = (t // 32) * 32
    assert (out[0] == [v[b : b + 32].sum() for b in warp_base]).all()
    group = (t // 8) * 8
    assert (out[1] == [v[g : g + 8].sum() for g in group]).all()
    lane = t % 32
    assert (out[2] == np.where(lane + 3 < 32, v + 3, v)).all()  # past lane 31: own value
    assert (out[3] == np.where(lane - 5 >= 0, v - 5, v)).all()
    assert (out[4] == v[group + 2]).all()
    ballot = [sum(1 << i for i in range(32) if (b + i) % 3 == 0) for b in warp_base]
    # The ballot's bit pattern: Numba's ballot_sync gives a signed 32-bit value on
    # hardware (warp 1 of this probe reads negative there), the shim an unsigned one.
    assert (out[5] % 2**32 == ballot).all()
    assert (out[6] == [max((b + i) % 13 for i in range(32)) for b in warp_base]).all()


@cuda.jit
def _barrier_probe(x, out, fail):
    s = cuda.shared.array(64, int32)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    s[t] = x[b, t]
    cuda.syncthreads()
    out[b, 0, t] = s[63 - t]  # written by another thread before the barrier
    out[b, 1, t] = cuda.syncthreads_count(s[t] % 2)
    if t >= 48:
        return  # exited threads do not hold later barriers up
    if fail and b == 1 and t == 5:
        out[99, 0, 0] = 1  # out of bounds: the simulator raises
    cuda.syncthreads()
    s[t] += 1
    cuda.syncthreads()
    out[b, 2, t] = s[(t + 1) % 48]


@pytest.mark.skipif(ON_GPU, reason="the simulator's scheduling, as the shim replaces it")
def test_shim_blocks_barriers_shared_memory_and_errors():
    """tests/cuda_sim_shim.py runs blocks on reused threads with a counted barrier:
    shared memory is one array per block, a barrier waits for every live thread,
    a thread's exception names it and fails the launch, and the next launch runs."""
    x = np.random.default_rng(0).integers(0, 1000, (3, 64)).astype(np.int32)
    t = np.arange(64)
    for fail in (0, 1, 0):
        out = np.zeros((3, 3, 64), np.int32)
        if fail:
            with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\] ctaid=\[1, 0, 0\]"):
                _barrier_probe[3, 64](x, out, fail)
            continue
        _barrier_probe[3, 64](x, out, fail)
        for b in range(3):
            assert (out[b, 0] == x[b, 63 - t]).all()
            assert (out[b, 1] == (x[b] % 2).sum()).all()
            assert (out[b, 2, :48] == x[b, (t[:48] + 1) % 48] + 1).all()


@cuda.jit
def _block_reduce_probe(x, out):
    t = cuda.threadIdx.x
    out[0, t] = block_allreduce_sum(x[t])
    out[1, t] = block_allreduce_max(x[t])
    out[2, t] = warp_allreduce_sum(x[t], 4, group_mask(4))


def test_block_and_group_allreduce():
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    out = np.zeros((3, 64), np.float32)
    _block_reduce_probe[1, 64](x, out)
    np.testing.assert_allclose(out[0], x.astype(np.float64).sum(), rtol=1e-5)
    assert (out[1] == x.max()).all()
    np.testing.assert_allclose(out[2], np.repeat(x.reshape(16, 4).sum(1), 4), rtol=1e-5)


# ------------------------------------------------------------- planning (host logic)


def test_warp_geometry_follows_oneflow():
    assert warp_geometry(3, 1, 1) == (1, 1, 1)
    assert warp_geometry(4, 2, 2) == (1, 2, 2)  # even rows: two rows per access
    assert warp_geometry(3, 31, 1) == (32, 1, 1)
    assert warp_geometry(2, 33, 1) == (32, 2, 1)
    assert warp_geometry(2, 64, 2) == (32, 2, 2)
    assert warp_geometry(1, 1000, 2) == (32, 32, 1)
    assert warp_geometry(1, 1024, 4) == (32, 32, 1)


def test_pack_size_by_divisibility_word_size_and_alignment():
    f32, f16 = np.float32, np.float16
    assert _pack_size(1000, (f32, f32), (), 8) == 2  # at most 64 bits
    assert _pack_size(1001, (f32, f32)) == 1
    assert _pack_size(1000, (f16, f16), (), 8) == 4
    assert _pack_size(1002, (f16, f16)) == 2
    assert _pack_size(1000, (f16, f32), (), 8) == 2
    assert _pack_size(1000, (f32, f32), (256, 260)) == 1  # misaligned output
    # Loads and stores go up to 16 bytes (kernels.common.packs).
    assert _pack_size(1000, (f32, f32), (), 16) == 4
    assert _pack_size(1000, (f16, f16), (), 16) == 8
    assert _pack_size(1000, (f16, f32), (), 16) == 4
    assert _pack_size(1004, (f16, f16), (), 16) == 4
    assert _pack_size(1000, (f16, f16), (256, 264), 16) == 4  # output 8-byte aligned


def test_block_size_choice_keeps_most_resident_blocks():
    pick = launch.largest_block_keeping_occupancy
    assert pick({128: 8, 256: 8, 512: 4, 1024: 2}.get) == 256
    assert pick({128: 1, 256: 1, 512: 1, 1024: 1}.get) == 1024
    assert pick({128: 0, 256: 0, 512: 0, 1024: 0}.get) == 0


def test_wave_blocks_capped_by_work_and_waves():
    sms, tpm = launch.device_limits()
    assert launch.wave_blocks(128, 3) == 3
    assert launch.wave_blocks(128, 10**9) == sms * (tpm // 128) * launch.WAVES
    assert launch.wave_blocks(1024, 0) == 1


def test_auto_picks_warp_up_to_1024_columns():
    for cols in (1, 33, 1024):
        assert plan(3, cols, np.float32)[0].method == "warp"
    assert plan(3, 200, np.float16, block_size=64, method="block_uncached")[0].block == (64, 1)


# ------------------------------------------------------------------ correctness (sim)

WARP_CASES = [  # (rows, cols, dtype, log)
    (1, 1, np.float32, False),
    (2, 1, np.float16, True),
    (3, 2, np.float32, True),
    (2, 2, np.float16, False),
    (3, 31, np.float32, False),
    (1, 31, np.float16, True),
    (2, 32, np.float32, True),
    (3, 32, np.float16, False),
    (3, 33, np.float32, False),
    (2, 33, np.float16, True),
    (2, 127, np.float32, True),
    (3, 127, np.float16, False),
    (2, 130, np.float32, False),
]


@pytest.mark.parametrize(
    "rows,cols,dtype,log", WARP_CASES, ids=lambda v: getattr(v, "__name__", str(v))
)
def test_warp_path(rows, cols, dtype, log):
    x = random_rows(rows, cols, dtype)
    check(softmax(x, log=log, method="warp"), x, log)


BLOCK_CASES = [  # (method, rows, cols, dtype, log): block of 32 threads on the simulator
    ("block_smem", 2, 70, np.float32, False),
    ("block_smem", 1, 33, np.float16, True),
    ("block_smem", 3, 8, np.float16, False),
    ("block_uncached", 2, 70, np.float32, True),
    ("block_uncached", 1, 37, np.float16, False),
    ("block_uncached", 3, 5, np.float32, False),
]


@pytest.mark.parametrize(
    "method,rows,cols,dtype,log", BLOCK_CASES, ids=lambda v: getattr(v, "__name__", str(v))
)
def test_block_paths(method, rows, cols, dtype, log):
    x = random_rows(rows, cols, dtype)
    check(softmax(x, log=log, method=method, block_size=32), x, log)


def _run_plan(x, method, log, **kw):
    """Launch a block path with plan() overrides (unroll, online), as softmax() does."""
    rows, cols = x.shape
    dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
    how, kernel = plan(rows, cols, x.dtype, log=log, method=method, block_size=32, **kw)
    for name, value in kw.items():
        assert getattr(how, name) == value
    launch_plan(how, kernel, dx, dy)
    return dy.copy_to_host()


VARIANT_CASES = [  # 35 packs over 32 threads: the unrolled loads' tail is partial
    ("block_smem", np.float32, False, dict(unroll=4, online=False)),
    ("block_smem", np.float16, True, dict(unroll=1, online=True)),
    ("block_smem", np.float32, False, dict(unroll=2, online=True)),
    ("block_uncached", np.float16, False, dict(unroll=4)),
]


@pytest.mark.parametrize(
    "method,dtype,log,kw", VARIANT_CASES, ids=lambda v: getattr(v, "__name__", str(v))
)
def test_block_variants(method, dtype, log, kw):
    x = random_rows(2, 70, dtype)
    x[1, 3] = -np.inf
    check(_run_plan(x, method, log, **kw), x, log)


@pytest.mark.parametrize("method", ["warp", "block_smem", "block_uncached"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_huge_and_infinite_values(method, dtype):
    x = special_rows(40, dtype)
    block = None if method == "warp" else 32
    # Block paths are slow on the simulator: one of softmax / log-softmax per dtype there.
    for log in (False, True) if method == "warp" else (dtype == np.float16,):
        check(softmax(x, log=log, method=method, block_size=block), x, log)


def test_device_in_device_out_and_out_argument():
    x = random_rows(3, 33, np.float32)
    dx = cuda.to_device(x)
    dy = softmax(dx)
    assert not isinstance(dy, np.ndarray) and hasattr(dy, "copy_to_host")
    check(dy.copy_to_host(), x, False)
    dout = cuda.device_array((3, 33), np.float32)
    assert softmax(dx, out=dout) is dout
    check(dout.copy_to_host(), x, False)
    hout = np.zeros((3, 33), np.float32)
    assert softmax(x, out=hout, log=True) is hout
    check(hout, x, True)


def test_device_in_gives_a_device_array_on_the_call_stream():
    x = random_rows(2, 40, np.float16)
    dy = softmax(cuda.to_device(x))
    assert not isinstance(dy, np.ndarray) and dy.shape == x.shape and dy.dtype == x.dtype
    if not arrays.SIMULATOR:
        from kernels.common.devarray import DeviceArray

        assert type(dy) is DeviceArray and dy.stream == 0
    check(dy.copy_to_host(), x, False)


def test_stream_argument():
    x = random_rows(3, 33, np.float32)
    dx = cuda.to_device(x)
    check(softmax(dx, stream=0).copy_to_host(), x, False)
    check(log_softmax(dx, stream=0).copy_to_host(), x, True)
    check(softmax(x, stream=0), x, False)
    hout = np.zeros_like(x)
    assert log_softmax(x, stream=0, out=hout) is hout
    check(hout, x, True)
    if arrays.SIMULATOR:  # one queue there: any handle is taken
        check(softmax(dx, stream=12345).copy_to_host(), x, False)


def test_device_out_written_in_place_and_returned():
    x = random_rows(3, 70, np.float16)
    dx = cuda.to_device(x)
    dout = cuda.device_array((3, 70), np.float32)  # float16 in, float32 out
    assert softmax(dx, out=dout, stream=0) is dout
    np.testing.assert_allclose(dout.copy_to_host(), reference(x, False), rtol=1e-5, atol=1e-38)
    assert log_softmax(x, out=dout) is dout  # host in, device out
    np.testing.assert_allclose(dout.copy_to_host(), reference(x, True), rtol=1e-5, atol=1e-5)


def test_out_overlapping_x_is_refused():
    full = random_rows(6, 33, np.float32)
    buf = cuda.to_device(full)
    dx = buf[0:3]
    for out in (dx, buf[1:4], buf[2:5]):  # the same array, partly overlapping views
        with pytest.raises(ValueError, match="overlaps x"):
            softmax(dx, out=out)
    assert softmax(dx, out=buf[3:6]) is not None  # the neighbouring rows are fine
    check(buf.copy_to_host()[3:6], full[0:3], False)
    host = full.copy()
    for out in (host[0:3], host[1:4]):
        with pytest.raises(ValueError, match="overlaps x"):
            softmax(host[0:3], out=out)
    np.testing.assert_array_equal(host, full)  # refused before anything was written


def test_device_out_of_wrong_shape_dtype_or_layout_is_refused():
    x = random_rows(3, 33, np.float32)
    dx = cuda.to_device(x)
    with pytest.raises(ValueError, match=r"\(3, 32\)"):
        softmax(dx, out=cuda.device_array((3, 32), np.float32))
    with pytest.raises(TypeError, match="out must be float32 or float16, got float64"):
        softmax(dx, out=cuda.device_array((3, 33), np.float64))
    with pytest.raises(ValueError, match="out must be 2-D"):
        softmax(dx, out=cuda.device_array(99, np.float32))
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        softmax(dx, out=cuda.device_array((3, 66), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        softmax(cuda.device_array((3, 66), np.float32)[:, ::2])
    with pytest.raises(TypeError, match="out must be a NumPy or device array"):
        softmax(dx, out=[[0.0] * 33] * 3)


def test_calls_from_threads_at_once(monkeypatch):
    """First calls of several shapes from 6 threads at once (the plan cache filled
    concurrently), host and device inputs. The simulator runs a kernel by swapping
    its module's `cuda` for a fake one, which breaks a kernel built or run in another
    thread meanwhile: there the launches (not the calls) take turns with planning."""
    if arrays.SIMULATOR:
        real = sm.launch

        def one_at_a_time(*args, **kwargs):
            with sm._COMPILE_LOCK:
                real(*args, **kwargs)

        monkeypatch.setattr(sm, "launch", one_at_a_time)
    sm._PLANS.clear()
    shapes = [(2, 8, np.float32), (3, 16, np.float16), (2, 33, np.float32), (4, 5, np.float16)]
    inputs = [random_rows(r, c, d, seed=i) for i, (r, c, d) in enumerate(shapes)]

    def work(t: int) -> None:
        for i in range(len(inputs)):
            x = inputs[(i + t) % len(inputs)]
            log = bool(t % 2)
            y = softmax(x, log=log) if t % 3 else softmax(cuda.to_device(x), log=log)
            check(y if isinstance(y, np.ndarray) else y.copy_to_host(), x, log)

    errors = run_in_threads(6, work)
    assert not errors, errors[0]
    assert len(sm._PLANS) == 2 * len(shapes)  # softmax and log-softmax per shape


def test_plan_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(sm, "_PLANS_KEEP", 3)
    sm._PLANS.clear()
    for cols in range(1, 8):
        x = random_rows(1, cols, np.float32)
        check(softmax(x), x, False)
        assert len(sm._PLANS) <= 3
    sm._PLANS.clear()


def test_plan_kept_per_call_shape():
    sm._PLANS.clear()
    x = random_rows(2, 33, np.float32)
    dx, dy = cuda.to_device(x), cuda.device_array((2, 33), np.float32)
    for _ in range(3):
        softmax(dx, out=dy)
    assert len(sm._PLANS) == 1
    check(dy.copy_to_host(), x, False)
    softmax(dx, out=dy, log=True)
    assert len(sm._PLANS) == 2
    check(dy.copy_to_host(), x, True)


def test_float16_in_float32_out():
    x = random_rows(2, 40, np.float16)
    out = np.zeros((2, 40), np.float32)
    softmax(x, out=out)
    np.testing.assert_allclose(out, reference(x, False), rtol=1e-5, atol=1e-38)


def test_empty_rows():
    assert softmax(np.zeros((0, 5), np.float32)).shape == (0, 5)


@pytest.mark.parametrize(
    "kwargs,args,exc,words",
    [
        ({}, (np.zeros(5, np.float32),), ValueError, "2-D"),
        ({}, (np.zeros((2, 2, 2), np.float32),), ValueError, "2-D"),
        ({}, (np.zeros((2, 3), np.float64),), TypeError, "float64"),
        ({}, (np.zeros((2, 3), np.int32),), TypeError, "int32"),
        ({}, ([[1.0, 2.0]],), TypeError, "list"),
        ({"method": "fast"}, (np.ones((2, 3), np.float32),), ValueError, "'fast'"),
        (
            {"out": np.zeros((3, 2), np.float32)},
            (np.ones((2, 3), np.float32),),
            ValueError,
            "(3, 2)",
        ),
        ({"out": np.zeros((2, 3), np.float64)}, (np.ones((2, 3), np.float32),), TypeError, "out"),
        ({"method": "warp"}, (np.ones((1, 1025), np.float32),), ValueError, "1024"),
        ({"block_size": 100}, (np.ones((1, 9), np.float32),), ValueError, "block_size"),
    ],
)
def test_bad_input_is_named(kwargs, args, exc, words):
    with pytest.raises(exc, match=None) as info:
        softmax(*args, **kwargs)
    assert words in str(info.value)


# ------------------------------------------------------------------- full size (GPU)

GPU_COLS = [1, 2, 31, 32, 33, 127, 1000, 1024, 1025, 4096, 4097, 12345, 65536, 2**20]


def _gpu_rows(cols: int) -> list[int]:
    large = max(4, min(20000, (1 << 24) // cols))
    return sorted({1, 2, 3, 37, large})


def _methods_for(cols: int) -> list[str]:
    return (
        ["auto", "warp", "block_smem", "block_uncached"]
        if cols <= 1024
        else [
            "auto",
            "block_smem",
            "block_uncached",
        ]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("cols", GPU_COLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_full_shape_list(cols, dtype):
    for rows in _gpu_rows(cols):
        x = random_rows(rows, cols, dtype)
        dx = cuda.to_device(x)
        for method in _methods_for(cols):
            if method == "block_smem" and cols * 4 > 200 * 1024:
                continue  # more than an H100 block's shared memory
            for log in (False, True):
                y = softmax(dx, log=log, method=method).copy_to_host()
                check(y, x, log)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [1, 33, 1000, 1025, 4097, 65536, 2**20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_special_values(cols, dtype):
    x = special_rows(cols, dtype)
    for method in _methods_for(cols):
        if method == "block_smem" and cols * 4 > 200 * 1024:
            continue
        for log in (False, True):
            check(softmax(x, log=log, method=method), x, log)


@pytest.mark.gpu
def test_gpu_auto_dispatch():
    assert plan(1000, 1024, np.float32)[0].method == "warp"
    assert plan(1000, 4096, np.float32)[0].method == "block_smem"
    # Rows wider than one block's shared memory: split across blocks (tests/test_softmax_split.py).
    assert plan(100, 2**20, np.float32)[0].method == "split"
    p = plan(1000, 4096, np.float32)[0]
    assert p.block[0] in (128, 256, 512, 1024)


@pytest.mark.gpu
def test_gpu_torch_device_arrays():
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 1000, device="cuda")
    y = softmax(x)
    got = np.asarray(y.copy_to_host())
    np.testing.assert_allclose(got, torch.softmax(x.double(), 1).cpu().numpy(), rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [2056, 65536])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_block_variants(cols, dtype):
    """Every unroll of both block paths and block_smem's online variant (auto runs
    one of them per width), default block sizes, with -inf entries."""
    for rows in (3, 37):
        x = random_rows(rows, cols, dtype)
        x[1, ::7] = -np.inf
        dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
        variants = [("block_uncached", dict(unroll=u)) for u in (1, 4)]
        variants += [("block_smem", dict(unroll=u, online=o)) for u in (1, 4) for o in (0, 1)]
        for i, (method, kw) in enumerate(variants):
            for log in (i % 2 == 1,):  # one of softmax / log-softmax each: compile time
                try:
                    how, kernel = plan(rows, cols, dtype, log=log, method=method, **kw)
                except ValueError:
                    assert method == "block_smem" and cols * 4 > 200 * 1024
                    continue
                launch_plan(how, kernel, dx, dy)
                check(dy.copy_to_host(), x, log)


# ------------------------------------------- streams, asynchrony and out= (GPU)


def _new_stream() -> int:
    """A new non-blocking CUstream handle (destroy it with _destroy_stream)."""
    from kernels.common.cudadrv import driver

    return driver().stream_create()


def _destroy_stream(handle: int) -> None:
    from kernels.common.cudadrv import driver

    driver().synchronize(handle)
    driver().stream_destroy(handle)


ASYNC_CASES = [  # (rows, cols, dtype, method): one per path
    (512, 1000, np.float32, "warp"),
    (256, 4096, np.float16, "block_smem"),
    (256, 4096, np.float32, "block_uncached"),
    (16, 131072, np.float32, "split"),
    (16, 131072, np.float16, "auto"),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "rows,cols,dtype,method", ASYNC_CASES, ids=lambda v: getattr(v, "__name__", str(v))
)
def test_gpu_call_returns_while_the_stream_is_busy(rows, cols, dtype, method):
    """A call on device inputs queues its work behind 0.3 s of spinning on the stream
    and returns while the GPU is still busy; the results are right afterwards. The
    stream is new to the call (its output memory and the split path's scratch are
    made on it then)."""
    from kernels.common import timing
    from kernels.common.cudadrv import driver
    from kernels.common.devarray import DeviceArray

    drv = driver()
    x = random_rows(rows, cols, dtype)
    softmax(x, method=method)  # plan and compile first (on the default stream)
    log_softmax(x, method=method, out=np.empty(x.shape, np.float32))
    h = _new_stream()
    try:
        dx = arrays.to_device(x, h)
        dlog = arrays.empty(x.shape, np.float32, h)
        drv.synchronize(h)
        busy = timing.busy(0.3, stream=h)
        t0 = time.perf_counter()
        dy = softmax(dx, method=method, stream=h)
        assert log_softmax(dx, method=method, out=dlog, stream=h) is dlog
        took = time.perf_counter() - t0
        still_busy = not drv.idle(h)
        assert still_busy, "the call waited for the device"
        assert took < 0.1, took
        assert type(dy) is DeviceArray and dy.stream == h
        drv.synchronize(h)
        check(dy.copy_to_host(), x, False)
        np.testing.assert_allclose(dlog.copy_to_host(), reference(x, True), rtol=1e-3, atol=1e-3)
        del busy
    finally:
        _destroy_stream(h)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [1000, 4096, 131072])
def test_gpu_cupy_stream(cols):
    """On a non-blocking CuPy stream: the input written there behind a spin kernel,
    softmax by stream=s and by the array's own (interface) stream, the result used
    there; no synchronisation by the caller before that."""
    cupy = pytest.importorskip("cupy")
    from kernels.common import timing

    rows = max(8, (1 << 20) // cols)
    x = random_rows(rows, cols, np.float32)
    src = cupy.asarray(x)
    cx = cupy.zeros_like(src)
    softmax(cx)  # plan and compile
    softmax(cx, out=cupy.empty_like(cx), log=True)
    cupy.cuda.Device().synchronize()
    with cupy.cuda.Stream(non_blocking=True) as s:
        busy = timing.busy(1.0, stream=s.ptr)
        cx[...] = src  # queued on s behind the spin: a call on another stream sees zeros
        y1 = softmax(cx, stream=s)
        y2 = softmax(cx)  # cx's interface names s (the current stream)
        out = cupy.empty_like(cx)
        assert softmax(cx, out=out, log=True) is out
        assert not s.done, "the calls waited for the device"
        z1 = cupy.asarray(y1) * 2
        z2 = cupy.asarray(y2) + 0
        lz = out + 0
    s.synchronize()
    check(cupy.asnumpy(z1) / 2, x, False)
    check(cupy.asnumpy(z2), x, False)
    check(cupy.asnumpy(lz), x, True)
    with pytest.raises(ValueError, match="overlaps x"):
        softmax(cx, out=cx)
    del busy


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [1000, 4096, 131072])
def test_gpu_torch_stream(cols):
    """The same on a torch side stream: softmax follows torch's current stream."""
    torch = pytest.importorskip("torch")
    from kernels.common import timing

    rows = max(8, (1 << 20) // cols)
    x = random_rows(rows, cols, np.float32)
    src = torch.from_numpy(x).cuda()
    tx = torch.zeros_like(src)
    softmax(tx)  # plan and compile
    softmax(tx, out=torch.empty_like(tx), log=True)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        busy = timing.busy(1.0, stream=s.cuda_stream)
        tx.copy_(src)
        y = softmax(tx)
        out = torch.empty_like(tx)
        assert softmax(tx, out=out, log=True, stream=s) is out
        assert not s.query(), "the calls waited for the device"
        ty = torch.as_tensor(y, device="cuda") * 1
        lt = out + 0
    s.synchronize()
    check(ty.cpu().numpy(), x, False)
    check(lt.cpu().numpy(), x, True)
    del busy


@pytest.mark.gpu
def test_gpu_out_on_device():
    """out= as our DeviceArray, Numba, CuPy and torch arrays: written, returned, no
    new allocation needed; overlaps refused."""
    x = random_rows(64, 4096, np.float32)
    dx = arrays.to_device(x, 0)
    outs = [arrays.empty(x.shape, np.float32, 0), cuda.device_array(x.shape, np.float32)]
    cupy = None
    try:
        import cupy
    except ImportError:
        pass
    if cupy is not None:
        outs.append(cupy.empty(x.shape, cupy.float32))
    try:
        import torch

        outs.append(torch.empty(x.shape, dtype=torch.float32, device="cuda"))
    except ImportError:
        pass
    for out in outs:
        assert softmax(dx, out=out) is out
        got = np.asarray(arrays.as_device_array(out).copy_to_host())
        check(got, x, False)
    with pytest.raises(ValueError, match="overlaps x"):
        softmax(dx, out=dx)
    with pytest.raises(ValueError, match="overlaps x"):
        softmax(dx[0:32], out=dx[16:48])
