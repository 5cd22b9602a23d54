"""Launch geometry and arguments of `kernels.box_fused`, free of Numba.

Both the Numba launch (`kernels.box_fused.box_fused`) and the cached-cubin path of the
CLI (`imgfilter.backends.cached`, which must not import Numba) plan with these.
"""

from __future__ import annotations

import numpy as np

from .launch import SMEM_LIMIT, cdiv

LANES = 4  # vertical-sum lanes per thread (v0..v3 below)
# Defaults from the H100 sweeps (benchmarks/results/2026-11-23-h100-sweep-box*.txt),
# 2167x2495x3 uint8: k=3 54 us, k=21 69 us (16-row strips), k=101 136 us (64-row
# strips; box_running takes 236 us). A run of 30 outputs spans an odd number of
# 32-bit words for 3 channels, which spreads a warp's reads over more banks than 32.
RUN = 30  # outputs per horizontal slide
STRIP = 16  # rows per block, boxes up to 32 rows
STRIP_TALL = 64  # rows per block for taller boxes
BATCH = 8  # rows between block barriers

MAGIC_BITS = 26


def magic(area: int) -> tuple[int, int]:
    """(m, s) with floor(t * m / 2**s) == floor(t / (2 * area)) for 0 <= t < 2**MAGIC_BITS.

    Granlund and Montgomery: with s = MAGIC_BITS + ceil(log2 d) and m = ceil(2**s / d),
    m * d - 2**s < d <= 2**(s - MAGIC_BITS), which makes the quotient exact; m < 2**27.
    """
    d = 2 * area
    s = MAGIC_BITS + (d - 1).bit_length()
    return -(-(1 << s) // d), s


def sum_type(dtype, kh: int):
    """uint16 column sums where kh rows of the image always fit, else int32."""
    return np.uint16 if kh * int(np.iinfo(dtype).max) <= 65535 else np.int32


def plan(shape: tuple, dtype, ksize: tuple, threads: int = 0, run: int = 0,
         strip: int = 0, batch: int = 0) -> dict | None:  # fmt: skip
    """Launch geometry for this image and box, or None when box_fused does not apply.

    It applies to uint8/uint16 images whose box sums fit an int32 and whose tile
    (at least one run of outputs plus the halo, LANES lanes per thread) fits.
    threads=0 picks 128 threads when that tile holds a few runs, else 256; run, strip
    and batch 0 pick the measured defaults for the box's size.
    """
    height, width, channels = shape
    kh, kw = ksize
    run = run or RUN
    batch = batch or BATCH
    strip = strip or (STRIP if kh <= 32 else STRIP_TALL)
    dt = np.dtype(dtype)
    if dt not in (np.uint8, np.uint16) or kh * kw * int(np.iinfo(dt).max) >= 2**31:
        return None
    s_type = sum_type(dt, kh)
    choices = (threads,) if threads else (128, 256)
    for t in choices:
        tile_w = (LANES * t // channels - (kw - 1)) // run * run
        if tile_w >= 4 * run or (tile_w >= run and t == choices[-1]):
            break
    else:
        return None
    if tile_w < run:
        return None
    tile_w = min(tile_w, cdiv(width, run) * run)
    itemsize = np.dtype(s_type).itemsize
    smem = batch * ((tile_w + kw - 1) * channels + tile_w * channels) * itemsize
    if smem > SMEM_LIMIT:
        return None
    return {
        "threads": t,
        "tile_w": tile_w,
        "run": run,
        "strip": strip,
        "batch": batch,
        "sum_type": s_type,
        "magic_rounding": (2 * int(np.iinfo(dt).max) + 1) * kh * kw < 2**MAGIC_BITS,
        "smem": smem,
        "grid": (cdiv(width, tile_w), cdiv(height, strip)),
    }


def scalar_args(shape: tuple, ksize: tuple, anchor: tuple, mode: int, cval, geo: dict) -> tuple:
    """The kernel's arguments between its input and output arrays, typed as launched:
    (height, width, kh, kw, ay, ax, mode, cval, area, magic, shift, even, inv_area,
    tile_w, run, strip, batch); Python ints become int64 parameters."""
    height, width, _ = shape
    kh, kw = ksize
    ay, ax = anchor
    area = kh * kw
    m, shift = magic(area)
    return (
        height, width, kh, kw, ay, ax, mode, np.int64(cval), area, m, shift,
        int(area % 2 == 0), np.float32(1.0 / area),
        geo["tile_w"], geo["run"], geo["strip"], geo["batch"],
    )  # fmt: skip


# ----------------------------------------------------------------- kernels.box_packed

PACKED_THREADS = 128  # threads per block: one 32-bit word of the input span each
PACKED_BATCH = 32  # rows between block barriers; the horizontal phase has a thread per row
PACKED_STRIP = 64  # rows per block
PACKED_MAX_ROWS = 257  # 257 * 255 < 2**16: a column sum fits a 16-bit lane
PACKED_MAX_CHANNELS = 4
PACKED_MARGIN = 16  # column sums kept left of a shared row: runs start up to 15 bytes early


def packed_pitch(threads: int) -> int:
    """uint16 column sums per shared row: the 4 * threads lanes, a margin on each side,
    and 2 more so that a row is an odd number of 32-bit words (rows in distinct banks)."""
    return 4 * threads + 2 * PACKED_MARGIN + 2


def packed_magic(area: int) -> tuple[int, int]:
    """(m, sh) with (t * m >> 32) >> sh == floor(t / area) for 0 <= t < 256 * area.

    Granlund and Montgomery: with m = ceil(2**(32 + sh) / area), e = m * area - 2**(32 + sh)
    < area, the quotient is exact while t * e < 2**(32 + sh), which 256 * area**2 <=
    2**(32 + sh) guarantees; sh = 0 up to area 4096 (boxes to 64x64). m < 2**32 for
    area >= 2.
    """
    if area < 2:
        raise ValueError("packed_magic needs an area of at least 2")
    sh = max(0, (256 * area * area - 1).bit_length() - 32)
    return -(-(1 << (32 + sh)) // area), sh


def packed_plan(shape: tuple, dtype, ksize: tuple, threads: int = 0, run: int = 0,
                strip: int = 0, batch: int = 0) -> dict | None:  # fmt: skip
    """Launch geometry of `kernels.box_packed`, or None where it does not apply.

    It applies to uint8 images of 1 to 4 channels and fewer than 2**31 bytes, boxes of
    2 to 257 rows x 257 rows (16-bit column sums) and a halo that leaves the tile room
    for outputs. A block of `threads` threads holds 4 * threads byte lanes of the
    input span: the tile's outputs plus the (kw - 1)-pixel halo. In the horizontal
    phase thread (row tid % batch, run tid // batch) slides over `run` output bytes (a
    multiple of 16) of its row, so threads // batch runs must cover a tile row plus
    the up to 15 bytes its first 16-byte aligned run starts early; run=0 picks the
    shortest such run.
    """
    height, width, channels = shape
    kh, kw = ksize
    t = threads or PACKED_THREADS
    rows = batch or PACKED_BATCH
    strip = strip or PACKED_STRIP
    if np.dtype(dtype) != np.uint8 or not 1 <= channels <= PACKED_MAX_CHANNELS:
        return None
    if kh > PACKED_MAX_ROWS or kh * kw < 2 or height * width * channels >= 2**31:
        return None
    if t % rows:
        return None
    tile_w = min(4 * t // channels - (kw - 1), width)
    if tile_w < 1:
        return None
    nruns = t // rows
    need = tile_w * channels + 15  # bytes a row's runs cover
    run = run or cdiv(cdiv(need, nruns), 16) * 16
    if run % 16 or nruns * run < need:
        return None
    smem = 2 * (rows * packed_pitch(t) + 32)
    if smem > SMEM_LIMIT:
        return None
    area = kh * kw
    _, sh = packed_magic(area)
    return {
        "threads": t,
        "tile_w": tile_w,
        "run": run,
        "strip": strip,
        "batch": rows,
        "even": area % 2 == 0,
        "shifted": sh > 0,
        "smem": smem,
        "grid": (cdiv(width, tile_w), cdiv(height, strip)),
    }


def packed_args(shape: tuple, ksize: tuple, anchor: tuple, mode: int, cval, geo: dict) -> tuple:
    """box_packed's arguments between n_words and out8, typed as launched:
    (height, width, kh, kw, ay, ax, mode, cval, area, magic, shift, bias, tile_w, run,
    strip); Python ints become int64 parameters. bias: the sum's offset that turns the
    floor division into round-to-nearest (area // 2 for an even area, whose exact
    halves the kernel then rounds to even)."""
    height, width, _ = shape
    kh, kw = ksize
    ay, ax = anchor
    area = kh * kw
    m, sh = packed_magic(area)
    return (
        height, width, kh, kw, ay, ax, mode, int(cval), area, m, sh, area // 2,
        geo["tile_w"], geo["run"], geo["strip"],
    )  # fmt: skip


def choose(shape: tuple, dtype, ksize: tuple) -> tuple[str, dict | None]:
    """(method, geometry) of the box kernel `kernels.box.box_auto` runs: "fused" where
    `plan` applies, else "packed" where `packed_plan` does, else ("running", None).

    box_fused comes first: on the H100 box_packed is slower so far (2167x2495x3, k=21:
    80 us at best vs 69 us; benchmarks/results/2026-11-23-h100-sweep-packed-32bit.txt).
    The quick start (`imgfilter.backends.cached`) asks here too, so it looks for the
    cubin of the kernel the Numba path ran and exported.
    """
    fused = plan(shape, dtype, ksize)
    if fused is not None:
        return "fused", fused
    packed = packed_plan(shape, dtype, ksize)
    return ("packed", packed) if packed is not None else ("running", None)
