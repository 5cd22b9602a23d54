"""kernels.matmul (global-memory and 16x16 shared-memory tiles) against float64 NumPy.

Error measure as for GEMV: |C - ref| <= rtol * (|A| @ |B|), rtol 1e-5 float32,
2e-3 float16. Shapes are not multiples of the tile; `gpu` tests run larger ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels.matmul import matmul

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
