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

import importlib.util
import os
from pathlib import Path

import numpy as np
from numba import cuda

from .launch import SMEM_LIMIT, cdiv, scratch

TX = 32  # threads along a row: one warp reads 32 consecutive tile columns
TY = 4  # threads down the tile
MAX_SIDE = 31  # larger kernels would spill registers: use the other variants

_cache: dict[tuple[int, int, int], object] = {}


def rows_per_thread(kh: int) -> int:
    """Outputs per thread: more reuse per read, bounded by registers.

    Measured on the H100 (benchmarks/results/2026-11-23-h100-sweep-blocked.txt): 32 is
    best up to 21 rows, 24 beyond (31x31: 757 us vs 805 us with 16)."""
    return 32 if kh <= 21 else 24


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


_HEADER = (
    "# Generated by kernels.conv_blocked; safe to delete (it is rebuilt on demand).\n"
    "from numba import cuda, float32, uint64\n"
    "from kernels.device import border_index, saturate_int\n\n\n"
)


def cache_dir() -> Path:
    """Where generated kernel sources (and Numba's compiled cache of them) live."""
    env = os.environ.get("IMGFILTER_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "imgfilter" / "kernels"


def _load_from_file(name: str, source: str):
    """Write the source as a module in the cache dir and import it (Numba can then
    cache its compiled code on disk); None if the directory is not writable."""
    try:
        path = cache_dir() / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"imgfilter_generated.{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.correlate_blocked
    except OSError:
        return None


def kernel_for(kh: int, kw: int):
    """The blocked kernel for a kh x kw kernel: generated once, compiled on first launch.

    The compiled code is cached on disk (see `cache_dir`), so later processes skip
    the several seconds NVVM spends on the unrolled body.
    """
    ry = rows_per_thread(kh)
    key = (kh, kw, ry)
    if key not in _cache:
        name = f"correlate_blocked_{kh}x{kw}_r{ry}"
        source = _HEADER + _source(kh, kw, ry)
        pyfunc = _load_from_file(name, source)
        if pyfunc is None:  # read-only home: compile from memory, no disk cache
            namespace: dict = {}
            exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - our source
            pyfunc = namespace["correlate_blocked"]
            _cache[key] = cuda.jit(pyfunc)
        else:
            _cache[key] = cuda.jit(pyfunc, cache=True)
    return _cache[key]


def correlate_blocked(img, weights, anchor, mode, cval, out):
    """Launch the blocked kernel on a device image (H, W, C); `out` is filled.

    `out` may differ in dtype from `img` (a float32 intermediate, say): rounding and
    saturation follow out's dtype.
    """
    height, width, channels = img.shape
    kh, kw = weights.shape
    ay, ax = anchor
    dt = np.dtype(out.dtype)
    if dt.kind == "u":
        lo, hi, is_int = 0, int(np.iinfo(dt).max), True
    else:
        lo, hi, is_int = 0, 0, False
    grid = (cdiv(width, TX), cdiv(height, TY * rows_per_thread(kh)), channels)
    flat = weights.reshape(kh * kw)
    kernel_for(kh, kw)[grid, (TX, TY, 1)](img, flat, ay, ax, mode, cval, lo, hi, is_int, out)
    return out


def correlate_separable(img, row, col, anchor, mode, cval, row_sum, out):
    """Correlate with the rank-1 kernel outer(col, row): a row pass, then a column pass.

    row (1, kw) and col (kh, 1) are float32 device arrays, row_sum the sum of row.
    The row pass writes a float32 scratch image (no rounding in between); borders are
    separable, except that a constant border seen by the column pass is a row of
    cval, whose row-pass value is cval * row_sum.
    """
    ay, ax = anchor
    tmp = scratch(img.shape, np.float32)
    correlate_blocked(img, row, (0, ax), mode, float(cval), tmp)
    correlate_blocked(tmp, col, (ay, 0), mode, float(cval) * row_sum, out)
    return out
