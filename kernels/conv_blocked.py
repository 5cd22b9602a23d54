"""Register-blocked correlation: each thread computes RY outputs down one column.

The block stages its input tile (plus halo) and the weights in shared memory once.
Then, for each kernel column j, a thread reads the RY + kh - 1 tile values of its
column into registers and applies all kh weights of that column to its RY
accumulators: one shared-memory read feeds up to kh multiply-adds instead of one.
Registers must be scalars for that, and Numba has no unroll pragma, so the kernel
for each (kh, kw, RY) is generated as Python source with the inner loops written out,
compiled once per shape and kept. Same contract as `kernels.conv.correlate`.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint64

from . import border_index as _bi
from . import saturate as _sat
from .launch import SMEM_LIMIT, cdiv

border_index = cuda.jit(device=True)(_bi.border_index)
saturate_int = cuda.jit(device=True)(_sat.saturate_int)

TX = 32  # threads along a row: one warp reads 32 consecutive tile columns
TY = 4  # threads down the tile
MAX_SIDE = 31  # larger kernels would spill registers: use the other variants

_cache: dict[tuple[int, int, int], object] = {}


def rows_per_thread(kh: int) -> int:
    """Outputs per thread: more reuse per read, bounded by registers."""
    return 32 if kh <= 21 else 16


def smem_bytes(kh: int, kw: int) -> int:
    """Shared memory (bytes) the blocked kernel needs for a kh x kw kernel."""
    ry = rows_per_thread(kh)
    return 4 * ((TY * ry + kh - 1) * (TX + kw - 1) + kh * kw)


def fits(kh: int, kw: int) -> bool:
    """Whether the blocked kernel handles this kernel size."""
    return max(kh, kw) <= MAX_SIDE and smem_bytes(kh, kw) <= SMEM_LIMIT


def _source(kh: int, kw: int, ry: int) -> str:
    """Python source of the kernel for one (kh, kw, ry), inner loops unrolled."""
    tile_h, tile_w = TY * ry + kh - 1, TX + kw - 1
    ncol = ry + kh - 1
    lines = [
        # weights arrive flattened to (kh * kw,): no divisions when staging them.
        "def correlate_blocked(img, weights, ay, ax, mode, cval, lo, hi, is_int, out):",
        f"    tile = cuda.shared.array({tile_h * tile_w}, dtype=float32)",
        f"    wsh = cuda.shared.array({kh * kw}, dtype=float32)",
        "    height = img.shape[0]",
        "    width = img.shape[1]",
        "    c = cuda.blockIdx.z",
        "    tx = cuda.threadIdx.x",
        "    ty = cuda.threadIdx.y",
        f"    y0 = cuda.blockIdx.y * {TY * ry}",
        f"    x0 = cuda.blockIdx.x * {TX}",
        "    outside = float32(cval)",
        "    uc = uint64(c)",
        "    top = y0 - ay",
        "    left = x0 - ax",
        # Blocks whose tile lies inside the image skip the border mapping.
        f"    if top >= 0 and left >= 0 and top + {tile_h} <= height and left + {tile_w} <= width:",
        f"        for rr in range(ty, {tile_h}, {TY}):",
        "            src_row = uint64(top + rr)",
        f"            dst_row = uint64(rr * {tile_w})",
        f"            for qq in range(tx, {tile_w}, {TX}):",
        "                tile[dst_row + uint64(qq)] = float32(img[src_row, uint64(left + qq), uc])",
        "    else:",
        f"      for rr in range(ty, {tile_h}, {TY}):",
        "        yy = border_index(top + rr, height, mode)",
        f"        for qq in range(tx, {tile_w}, {TX}):",
        "          xx = border_index(left + qq, width, mode)",
        "          if yy < 0 or xx < 0:",
        f"              tile[uint64(rr * {tile_w} + qq)] = outside",
        "          else:",
        f"              tile[uint64(rr * {tile_w} + qq)] = "
        "float32(img[uint64(yy), uint64(xx), uc])",
        f"    for idx in range(ty * {TX} + tx, {kh * kw}, {TX * TY}):",
        "        wsh[idx] = weights[idx]",
        "    cuda.syncthreads()",
        "    x = x0 + tx",
        f"    ybase = y0 + ty * {ry}",
        "    if x >= width or ybase >= height:",
        "        return",
    ]
    lines += [f"    a{r} = float32(0.0)" for r in range(ry)]
    # Unsigned indices: Numba wraps negative signed indices, which costs ~5
    # instructions per access; these indices are never negative.
    lines += [
        f"    base = uint64(ty * {ry * tile_w} + tx)",
        f"    for j in range({kw}):",
        "        bj = base + uint64(j)",
        "        wj = uint64(j)",
    ]
    lines += [f"        p{q} = tile[bj + uint64({q * tile_w})]" for q in range(ncol)]
    for i in range(kh):
        lines.append(f"        w = wsh[wj + uint64({i * kw})]")
        lines += [f"        a{r} = cuda.fma(w, p{r + i}, a{r})" for r in range(ry)]
    for r in range(ry):
        lines += [
            f"    if ybase + {r} < height:",
            "        if is_int:",
            f"            out[ybase + {r}, x, c] = saturate_int(a{r}, lo, hi)",
            "        else:",
            f"            out[ybase + {r}, x, c] = a{r}",
        ]
    return "\n".join(lines) + "\n"


def kernel_for(kh: int, kw: int):
    """The compiled (lazily, on first launch) blocked kernel for a kh x kw kernel."""
    ry = rows_per_thread(kh)
    key = (kh, kw, ry)
    if key not in _cache:
        namespace = {
            "cuda": cuda,
            "float32": float32,
            "uint64": uint64,
            "border_index": border_index,
            "saturate_int": saturate_int,
        }
        code = compile(_source(kh, kw, ry), f"<correlate_blocked_{kh}x{kw}>", "exec")
        exec(code, namespace)  # noqa: S102 - our own generated source, no user input
        _cache[key] = cuda.jit(namespace["correlate_blocked"])
    return _cache[key]


def correlate_blocked(img, weights, anchor, mode, cval, out):
    """Launch the blocked kernel on a device image (H, W, C); `out` is filled."""
    height, width, channels = img.shape
    kh, kw = weights.shape
    ay, ax = anchor
    dt = np.dtype(img.dtype)
    if dt.kind == "u":
        lo, hi, is_int = 0, int(np.iinfo(dt).max), True
    else:
        lo, hi, is_int = 0, 0, False
    grid = (cdiv(width, TX), cdiv(height, TY * rows_per_thread(kh)), channels)
    flat = weights.reshape(kh * kw)
    kernel_for(kh, kw)[grid, (TX, TY, 1)](img, flat, ay, ax, mode, cval, lo, hi, is_int, out)
    return out
