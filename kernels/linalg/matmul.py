"""Matrix product C = A @ B in Numba CUDA: the seed course's two kernels, made general.

- `global`: one thread per element of C, reading its row of A and column of B from
  global memory. threadIdx.x runs along C's columns, so a warp reads 32 consecutive
  elements of B's row k (coalesced) and one broadcast element of A.
- `shared`: 16 x 16 tiles of A and B staged in shared memory; each thread then does 16
  multiply-adds from shared memory per tile. Elements past the edge of A or B are
  loaded as zeros, so any M, K, N work (the seed indexes B with the wrong coordinate
  and assumes every size is a multiple of 16).

A (M, K) and B (K, N): float32 or float16, the same dtype; float32 accumulation; C
has their dtype. NumPy in -> NumPy out; device arrays in -> device array out
(kernels.common.devarray.DeviceArray on a GPU), queued on the call's stream without waiting.
Any strides (views) are fine on the device.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint32

from ..common.arrays import (
    as_device_array,
    empty,
    is_device_array,
    overlaps,
    resolve_stream,
    to_device,
    to_host,
)
from ..common.launch import cdiv, launch

METHODS = ("global", "shared")
DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
TILE = 16


@cuda.jit(cache=True)
def matmul_global(A, B, C):
    """C[i, j] = sum_k A[i, k] * B[k, j], one thread per (i, j)."""
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if i < C.shape[0] and j < C.shape[1]:
        ui, uj = uint32(i), uint32(j)
        acc = float32(0.0)
        for k in range(A.shape[1]):
            uk = uint32(k)
            acc += float32(A[ui, uk]) * float32(B[uk, uj])
        C[ui, uj] = acc


@cuda.jit(cache=True)
def matmul_shared(A, B, C):
    """16 x 16 output tile per block; A and B tiles through shared memory, zero-padded."""
    tA = cuda.shared.array((TILE, TILE), float32)
    tB = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x  # along C's columns
    ty = cuda.threadIdx.y  # along C's rows
    j = cuda.blockIdx.x * TILE + tx
    i = cuda.blockIdx.y * TILE + ty
    M, K = A.shape
    N = B.shape[1]
    acc = float32(0.0)
    for t in range(cdiv_device(K, TILE)):
        ka = t * TILE + tx  # column of A this thread stages
        kb = t * TILE + ty  # row of B this thread stages
        tA[ty, tx] = float32(A[uint32(i), uint32(ka)]) if i < M and ka < K else float32(0.0)
        tB[ty, tx] = float32(B[uint32(kb), uint32(j)]) if kb < K and j < N else float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += tA[ty, kk] * tB[kk, tx]
        cuda.syncthreads()
    if i < M and j < N:
        C[uint32(i), uint32(j)] = acc


@cuda.jit(device=True, inline="always")
def cdiv_device(a, b):
    return (a + b - 1) // b


def _check(arr, name: str) -> None:
    shape = getattr(arr, "shape", None)
    dtype = getattr(arr, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"{name} must be a NumPy or device array, got {type(arr).__name__}")
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(shape)}")
    if np.dtype(dtype) not in DTYPES:
        raise TypeError(f"{name} must be float32 or float16, got {np.dtype(dtype)}")


def matmul(A, B, *, method: str = "shared", out=None, stream=None):
    """C = A @ B for A (M, K) and B (K, N), float32 accumulation.

    method: "global" (one thread per output, global memory) or "shared" (16 x 16
    shared-memory tiles). out: optional (M, N) host or device array (float32 or
    float16) to write into; returned when given. A device `out` must not overlap A
    or B.

    Device arrays in -> device array out, asynchronously: the kernel is queued on
    `stream` (a CuPy, torch, Numba or cuda.core stream, or a CUstream handle), else
    on the stream A's interface names, else on the legacy default stream, and the
    call returns without waiting for the GPU. NumPy in: copied in on that stream,
    the result copied back (this waits); NumPy out.
    """
    if method not in METHODS:
        raise ValueError(f"unknown matmul method {method!r}; choose one of {', '.join(METHODS)}")
    on_device = is_device_array(A)
    if on_device != is_device_array(B):
        raise TypeError("A and B must both be host (NumPy) arrays or both device arrays")
    if on_device:  # shapes and dtypes from DeviceArray views (torch dtypes are not NumPy's)
        dA, dB = as_device_array(A), as_device_array(B)
    else:
        for name, arr in (("A", A), ("B", B)):
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"{name} must be a NumPy or device array, got {type(arr).__name__}")
        dA, dB = A, B
    _check(dA, "A")
    _check(dB, "B")
    m, k = (int(s) for s in dA.shape)
    k2, n = (int(s) for s in dB.shape)
    if k2 != k:
        raise ValueError(f"A is {m}x{k} but B is {k2}x{n}: inner dimensions differ")
    if np.dtype(dA.dtype) != np.dtype(dB.dtype):
        raise TypeError(f"A is {np.dtype(dA.dtype)} but B is {np.dtype(dB.dtype)}")
    dout = None
    if out is not None:
        if is_device_array(out):
            dout = as_device_array(out)
        elif not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a NumPy or device array, got {type(out).__name__}")
        view = dout if dout is not None else out
        _check(view, "out")
        if tuple(int(s) for s in view.shape) != (m, n):
            raise ValueError(f"out has shape {tuple(view.shape)}, expected {(m, n)}")
        if on_device and dout is not None and (overlaps(dout, dA) or overlaps(dout, dB)):
            raise ValueError("out overlaps A or B: give a separate output array")
    s = resolve_stream(stream, dA, dB)
    if not on_device:
        dA, dB = to_device(A, s), to_device(B, s)
    if dout is not None:
        dC = dout
    else:
        cdtype = np.dtype(dA.dtype) if out is None else np.dtype(out.dtype)
        dC = empty((m, n), cdtype, s)
    if m and n:
        grid = (cdiv(n, TILE), cdiv(m, TILE), 1)
        kernel = matmul_global if method == "global" else matmul_shared
        launch(kernel, grid, (TILE, TILE, 1), (dA, dB, dC), s)
    if out is None:
        return dC if on_device else to_host(dC, s)
    if dout is None:
        out[...] = to_host(dC, s)
    return out
