"""kernels.linalg.matmul (global-memory and 16x16 shared-memory tiles) against float64 NumPy.

Error measure as for GEMV: |C - ref| <= rtol * (|A| @ |B|), rtol 1e-5 float32,
2e-3 float16. Shapes are not multiples of the tile; `gpu` tests run larger ones.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from numba import cuda

from kernels.linalg.matmul import matmul

RTOL = {np.float32: 1e-5, np.float16: 2e-3}


def random_pair(m: int, k: int, n: int, dtype, seed: int = 0):
    rng = np.random.default_rng(seed + 31 * m + 7 * k + n)
    A = (rng.random((m, k)) * 2 - 1).astype(dtype)
    B = (rng.random((k, n)) * 2 - 1).astype(dtype)
    return A, B


def check(C, A, B) -> None:
    C = np.asarray(C)
    a, b = A.astype(np.float64), B.astype(np.float64)
    assert C.shape == (A.shape[0], B.shape[1])
    err = np.abs(C.astype(np.float64) - a @ b)
    assert np.all(err <= RTOL[A.dtype.type] * (np.abs(a) @ np.abs(b)) + 1e-30)


SHAPES = [(1, 1, 1), (7, 5, 9), (17, 33, 16), (3, 1, 20), (20, 18, 1)]


@pytest.mark.parametrize("method", ["global", "shared"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_shapes_not_multiples_of_the_tile(method, dtype):
    for m, k, n in SHAPES:
        A, B = random_pair(m, k, n, dtype)
        C = matmul(A, B, method=method)
        assert C.dtype == dtype
        check(C, A, B)


def test_device_arrays_views_and_out():
    A, B = random_pair(9, 21, 30, np.float32)
    dB = cuda.to_device(B)[:, 3:27]  # a strided view
    dC = matmul(cuda.to_device(A), dB)
    assert hasattr(dC, "copy_to_host")
    check(dC.copy_to_host(), A, B[:, 3:27])
    out = np.zeros((9, 30), np.float32)
    assert matmul(A.astype(np.float16), B.astype(np.float16), out=out) is out
    check(out, A.astype(np.float16), B.astype(np.float16))


class CoreStream:
    """A stream by the `__cuda_stream__` protocol (cuda.core's): the legacy stream."""

    def __cuda_stream__(self):
        return (0, 0)


def test_stream_out_in_place_and_overlap():
    A, B = random_pair(9, 21, 30, np.float32)
    dA, dB = cuda.to_device(A), cuda.to_device(B)
    for stream in (CoreStream(), 0):
        check(matmul(dA, dB, stream=stream).copy_to_host(), A, B)
    check(matmul(A, B, method="global", stream=CoreStream()), A, B)
    with pytest.raises(TypeError, match="stream"):
        matmul(dA, dB, stream=1.5)
    for dtype in (np.float32, np.float16):
        out = cuda.to_device(np.full((9, 30), np.nan, dtype))
        assert matmul(dA, dB, out=out) is out
        C = out.copy_to_host()
        assert not np.isnan(C).any()
        if dtype == np.float32:
            check(C, A, B)
    buf = cuda.to_device(np.zeros(9 * 21 + 9 * 30, np.float32))
    dA2 = buf[: 9 * 21].reshape(9, 21)
    dA2.copy_to_device(A)
    with pytest.raises(ValueError, match="overlaps"):
        matmul(dA2, dB, out=buf[9 * 20 : 9 * 20 + 270].reshape(9, 30))
    out = buf[9 * 21 :].reshape(9, 30)
    assert matmul(dA2, dB, out=out) is out
    check(out.copy_to_host(), A, B)


@pytest.mark.parametrize(
    "out,exc,words",
    [
        (np.zeros((3, 5), np.float32), ValueError, "out has shape"),
        (np.zeros(15, np.float32), ValueError, "2-D"),
        (np.zeros((3, 4), np.float64), TypeError, "float64"),
    ],
    ids=["shape", "rank", "dtype"],
)
@pytest.mark.parametrize("where", ["host", "device"])
def test_out_of_wrong_shape_or_dtype_is_refused(out, exc, words, where):
    A, B = random_pair(3, 2, 4, np.float32)
    dA, dB = cuda.to_device(A), cuda.to_device(B)
    with pytest.raises(exc, match=words):
        matmul(dA, dB, out=out if where == "host" else cuda.to_device(out))


@pytest.mark.parametrize(
    "args,kwargs,exc,words",
    [
        ((np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)), {}, ValueError, "inner"),
        ((np.ones(3, np.float32), np.ones((3, 2), np.float32)), {}, ValueError, "2-D"),
        ((np.ones((2, 3), np.float64), np.ones((3, 2), np.float64)), {}, TypeError, "float64"),
        ((np.ones((2, 3), np.float32), np.ones((3, 2), np.float16)), {}, TypeError, "float16"),
        (
            (np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)),
            {"method": "x"},
            ValueError,
            "'x'",
        ),
        (
            (np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)),
            {"out": np.zeros((2, 3), np.float32)},
            ValueError,
            "out has shape",
        ),
        (([[1.0]], np.ones((1, 1), np.float32)), {}, TypeError, "list"),
    ],
)
def test_bad_input_is_named(args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        matmul(*args, **kwargs)
    assert words in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["global", "shared"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_larger_shapes(method, dtype):
    for m, k, n in [(700, 500, 700), (1000, 1024, 33), (1, 4097, 31), (257, 255, 129)]:
        A, B = random_pair(m, k, n, dtype)
        check(matmul(cuda.to_device(A), cuda.to_device(B), method=method).copy_to_host(), A, B)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["global", "shared"])
def test_gpu_call_returns_while_the_stream_is_busy(method):
    """Issue 23: queued behind 0.3 s of spin on the caller's stream, matmul returns at
    once; the result is right once the stream is done. Also out= on the device."""
    from kernels.common import cudadrv, timing
    from kernels.common.arrays import empty, to_device, to_host
    from kernels.common.devarray import stream_handle

    drv = cudadrv.driver()
    h = stream_handle(cuda.stream())
    A, B = random_pair(300, 200, 100, np.float32)
    dA, dB = to_device(A, h), to_device(B, h)
    matmul(dA, dB, method=method, stream=h)  # compile first
    drv.synchronize(h)
    out = empty((300, 100), np.float32, h)
    for kwargs in ({"stream": h}, {}, {"out": out}):
        buf = timing.busy(0.3, stream=h)
        t0 = time.perf_counter()
        C = matmul(dA, dB, method=method, **kwargs)
        took = time.perf_counter() - t0
        assert not drv.idle(h), "matmul waited for the stream"
        assert took < 0.1
        if "out" in kwargs:
            assert C is out
        drv.synchronize(h)
        check(to_host(C, h), A, B)
        del buf


@pytest.mark.gpu
def test_gpu_cupy_and_torch_non_default_streams():
    """Inputs changed on a non-blocking stream behind a spin kernel; matmul on that
    stream (named, or the one the inputs' interface names): no caller-side sync."""
    from kernels.common import timing

    A, B = random_pair(256, 128, 64, np.float32)
    cp = None
    try:
        import cupy as cp
    except ImportError:
        pass
    if cp is not None:
        st = cp.cuda.Stream(non_blocking=True)
        with st:
            for kwargs in ({"stream": st}, {}):
                dA, dB = cp.asarray(A), cp.asarray(B)
                buf = timing.busy(0.2, stream=st.ptr)
                dA *= 2
                got = cp.asnumpy(cp.asarray(matmul(dA, dB, **kwargs)) * 1, stream=st)
                st.synchronize()
                check(got, 2 * A, B)
                del buf
    torch = pytest.importorskip("torch")
    tA, tB = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for kwargs in ({"stream": side}, {}):
            a = tA.clone()
            buf = timing.busy(0.2, stream=side.cuda_stream)
            a.mul_(2)
            C = torch.as_tensor(matmul(a, tB, **kwargs), device="cuda") * 1
            check(C.cpu().numpy(), 2 * A, B)
            del buf
