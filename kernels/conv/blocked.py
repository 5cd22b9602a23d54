"""Register-blocked correlation: each thread computes RY outputs down one column.

The block stages its input tile (plus halo) and the weights in shared memory once.
Then, for each kernel column j, a thread reads the RY + kh - 1 tile values of its
column into registers and applies all kh weights of that column to its RY
accumulators: one shared-memory read feeds up to kh multiply-adds instead of one.
Registers must be scalars for that, and Numba has no unroll pragma, so the kernel
for each (kh, kw, RY) is generated as Python source with the inner loops written out,
compiled once per shape and kept. Same contract as `kernels.conv.dispatch.correlate`.

This module makes the kernels (`kernel_for`, importing Numba); they are launched by
`kernels.conv.launch` (`correlate_blocked`, `correlate_low_rank`,
`correlate_separable`), which names them by `kernels.common.refs.KernelRef` and
imports this module only where a kernel does not ship.
"""

from __future__ import annotations

import importlib.util
import os

from numba import config as _numba_config
from numba import cuda

from ..common.cache import cache_dir
from ..common.launch import cdiv
from ..common.refs import kernel_factory
from .plan import TX, TY, rows_per_thread, tile_shape

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)


# The image, the output and the running sum (accumulate) are addressed through flat
# element offsets. On the GPU,
# a[0, 0, o] of a C-contiguous 3-D array is the element at offset o (Numba computes
# C-layout addresses from the shape, without bounds checks); the simulator checks
# bounds, so there the kernel indexes 1-D views instead.
def _flat_views(accumulate: bool) -> list[str]:
    if not SIMULATOR:
        return []
    views = ["    imgf = img.reshape(img.size)", "    outf = out.reshape(out.size)"]
    return views + (["    accf = acc.reshape(acc.size)"] if accumulate else [])


def _img(offset: str) -> str:
    return f"imgf[{offset}]" if SIMULATOR else f"img[0, 0, {offset}]"


def _out(offset: str) -> str:
    return f"outf[{offset}]" if SIMULATOR else f"out[0, 0, {offset}]"


def _acc(offset: str) -> str:
    return f"accf[{offset}]" if SIMULATOR else f"acc[0, 0, {offset}]"


def _source(kh: int, kw: int, ry: int, wide: bool = False, accumulate: bool = False) -> str:
    """Python source of the kernel for one (kh, kw, ry), inner loops unrolled; element
    offsets into the image are uint32 (uint64 if `wide`: images of 2**32 elements or more).
    `accumulate`: the kernel takes one more argument, `acc` (float32, out's shape), and
    writes acc + the correlation to out (rounded and saturated once, for integer
    outputs); acc may be out itself.

    Shared memory is column-major: the tile as tile[column * pitch + row] and the
    weights as wsh[j * kpitch + i], so the ry + kh - 1 values of a thread's column
    and the kh weights of kernel column j are consecutive and 16-byte aligned: the
    compiler reads them four at a time (LDS.128). Integer arithmetic is written so
    that it stays 32-bit after Numba's widening (results cast back to int32/uint32);
    indices are unsigned (no wraparound code). The image and the output are
    addressed through flat element offsets that step by one add per element.
    """
    tile_h, tile_w, pitch, kpitch = tile_shape(kh, kw, ry)
    ncol = ry + kh - 1
    steps = cdiv(tile_h, TY)  # tile rows each thread stages
    cols = cdiv(tile_w, TX)  # tile columns each thread stages (1 or 2)
    nw = kh * kw
    u = "uint64" if wide else "uint32"  # element offsets
    align = "" if SIMULATOR else ", alignment=16"
    lines = [
        # weights arrive flattened to (kh * kw,), row-major.
        "def correlate_blocked(img, weights, ay, ax, mode, cval, lo, hi, is_int, out"
        + (", acc):" if accumulate else "):"),
        f"    tile = cuda.shared.array({tile_w * pitch}, dtype=float32{align})",
        f"    wsh = cuda.shared.array({kw * kpitch}, dtype=float32{align})",
        *_flat_views(accumulate),
        "    height = int32(img.shape[0])",
        "    width = int32(img.shape[1])",
        "    nch = uint32(img.shape[2])",
        f"    rowlen = {u}({u}(width) * nch)",  # elements per image row
        # Blocks of one tile's channels are neighbours in launch order, so they run
        # together and each one's strided stores fill the others' sectors in L2
        # (channel-major launch order cost 3-5x the DRAM bytes on float32 scratch).
        "    bx = uint32(cuda.blockIdx.x)",
        "    c = uint32(bx % nch)",
        "    tx = uint32(cuda.threadIdx.x)",
        "    ty = uint32(cuda.threadIdx.y)",
        f"    y0 = int32(int32(cuda.blockIdx.y) * int32({TY * ry}))",
        f"    x0 = int32(int32(bx // nch) * int32({TX}))",
        "    top = int32(y0 - int32(ay))",
        "    left = int32(x0 - int32(ax))",
        f"    dst = uint32(tx * uint32({pitch}) + ty)",
        # Blocks whose tile lies inside the image skip the border mapping: thread
        # (tx, ty) stages tile rows ty, ty + TY, ... of tile columns tx, tx + TX, ...
        # (a warp reads 32 consecutive pixels of a row), its source offset stepping
        # by TY image rows; fully unrolled.
        f"    if top >= 0 and left >= 0 and top + {tile_h} <= height and left + {tile_w} <= width:",
        f"        src = {u}(({u}(top) + ty) * rowlen + ({u}(left) + tx) * nch + c)",
        f"        step = {u}(rowlen * uint32({TY}))",
        f"        side = {u}(nch * uint32({TX}))",
    ]
    for s in range(steps):
        ind = "        "
        if TY * s + TY > tile_h:  # only some ty have this row
            lines.append(f"        if ty < uint32({tile_h - TY * s}):")
            ind += "    "
        for m in range(cols):
            off = "src" if m == 0 else f"{u}(src + side * uint32({m}))"
            at = TY * s + TX * m * pitch
            store = f"tile[uint32(dst + uint32({at}))] = float32({_img(off)})"
            if TX * m + TX > tile_w:  # only some tx have this column
                lines.append(f"{ind}if tx < uint32({tile_w - TX * m}):")
                lines.append(f"{ind}    {store}")
            else:
                lines.append(f"{ind}{store}")
        if s + 1 < steps:
            lines.append(f"        src = {u}(src + step)")
    # Border blocks (~13% of them at the seed size): the border map is separable,
    # so each thread maps its columns once and each of its rows once, in a loop.
    lines += [
        "    else:",
        "        imode = int32(mode)",
        "        outside = float32(cval)",
    ]
    for m in range(cols):
        lines.append(
            f"        xx{m} = border_index(left + int32(tx + uint32({TX * m})), width, imode)"
        )
    lines += [
        "        rr = ty",
        f"        while rr < uint32({tile_h}):",
        "            yy = border_index(top + int32(rr), height, imode)",
        f"            row = {u}({u}(yy if yy >= 0 else 0) * rowlen + c)",
        "            at = uint32(dst + (rr - ty))",
    ]
    for m in range(cols):
        ind = "            "
        if TX * m + TX > tile_w:
            lines.append(f"            if tx < uint32({tile_w - TX * m}):")
            ind += "    "
        load = _img(f"{u}(row + {u}(xx{m}) * nch)")
        lines += [
            f"{ind}v = outside",
            f"{ind}if yy >= 0 and xx{m} >= 0:",
            f"{ind}    v = float32({load})",
            f"{ind}tile[uint32(at + uint32({TX * m * pitch}))] = v",
        ]
    lines.append(f"            rr = uint32(rr + uint32({TY}))")
    # Weights, transposed on the way: thread t stages flat indices t, t + 128, ...
    lines.append(f"    t = uint32(ty * uint32({TX}) + tx)")
    for m in range(cdiv(nw, TX * TY)):
        idx = f"uint32(t + uint32({TX * TY * m}))"
        stmt = (
            f"wsh[uint32((k % uint32({kw})) * uint32({kpitch}) + k // uint32({kw}))] = weights[k]"
        )
        ind = "    "
        if TX * TY * (m + 1) > nw:
            lines.append(f"    if t < uint32({nw - TX * TY * m}):")
            ind += "    "
        lines += [f"{ind}k = {idx}", f"{ind}{stmt}"]
    lines += [
        "    cuda.syncthreads()",
        "    x = int32(x0 + int32(tx))",
        f"    ybase = int32(y0 + int32(ty * uint32({ry})))",
        "    if x >= width or ybase >= height:",
        "        return",
    ]
    lines += [f"    a{r} = float32(0.0)" for r in range(ry)]
    lines += [
        # 64-bit indices here: constant offsets then fold into the loads' addresses
        f"    base = uint64(tx * uint32({pitch}) + ty * uint32({ry}))",
        f"    for j in range({kw}):",
        f"        bj = base + uint64(j * {pitch})",
        f"        wj = uint64(j * {kpitch})",
    ]
    lines += [f"        p{q} = tile[bj + uint64({q})]" for q in range(ncol)]
    for i in range(kh):
        lines.append(f"        w = wsh[wj + uint64({i})]")
        lines += [f"        a{r} = cuda.fma(w, p{r + i}, a{r})" for r in range(ry)]
    # Write-out: one flat offset stepping down the column; full columns (all but
    # the image's last block row) without per-row checks.
    lines += [
        f"    o = {u}({u}(ybase) * rowlen + {u}(x) * nch + c)",
        "    nrows = int32(height - ybase)",
        "    if is_int:",
        "        ilo = int32(lo)",
        "        ihi = int32(hi)",
    ]

    def writes(value: str, checked: bool) -> list[str]:
        ind = "            "
        body = []
        for r in range(ry):
            at = f"{u}(o + rowlen * uint32({r}))"
            total = f"(a{r} + {_acc(at)})" if accumulate else f"a{r}"
            store = f"{_out(at)} = {value.format(total)}"
            if checked and r > 0:
                body += [f"{ind}if nrows > {r}:", f"{ind}    {store}"]
            else:
                body.append(f"{ind}{store}")
        return body

    for value in ("saturate_f32({}, ilo, ihi)", "{}"):
        if value == "{}":
            lines.append("    else:")
        lines.append(f"        if nrows >= {ry}:")
        lines += writes(value, False)
        lines.append("        else:")
        lines += writes(value, True)
    return "\n".join(lines) + "\n"


_HEADER = (
    "# Generated by kernels.conv.blocked; safe to delete (it is rebuilt on demand).\n"
    "from numba import cuda, float32, int32, uint32, uint64\n"
    "from kernels.common.device import border_index, saturate_f32\n\n\n"
)


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


@kernel_factory
def kernel_for(kh: int, kw: int, wide: bool, accumulate: bool):
    """The blocked kernel for a kh x kw kernel: generated once, compiled on first launch.
    `wide`: the variant with 64-bit element offsets, for images of 2**32 elements or
    more (`kernels.conv.plan.offsets_fit`); `accumulate`: the variant that adds a
    float32 array to the correlation before the store (see `_source`). All four
    arguments are given, positionally, as plain ints and bools: a `kernel_factory`
    makes one kernel per distinct arguments and names it by them
    (`kernels.conv.launch.blocked_kernel` is its `KernelRef`).

    The compiled code is cached on disk (see `cache_dir`), so later processes skip
    the several seconds NVVM spends on the unrolled body.
    """
    ry = rows_per_thread(kh)
    name = f"correlate_blocked_{kh}x{kw}_r{ry}" + ("_w64" if wide else "")
    name += "_acc" if accumulate else ""
    if SIMULATOR:  # its source differs (see _flat_views): keep both files apart
        name += "_sim"
    source = _HEADER + _source(kh, kw, ry, wide, accumulate)
    pyfunc = _load_from_file(name, source)
    if pyfunc is None:  # read-only home: compile from memory, no disk cache
        namespace: dict = {}
        exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - our source
        return cuda.jit(namespace["correlate_blocked"])
    return cuda.jit(pyfunc, cache=True)
