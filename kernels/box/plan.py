"""Launch geometry and arguments of the box kernels (`kernels.box.fused`, `packed`,
`tiled`, `twopass`, `running`), `choose` among them and the stand-in while one
compiles: every choice of the box filter, free of Numba. The launches
(`kernels.box.launch`) and the kernels' factories take their geometry from here.
"""

from __future__ import annotations

import numpy as np

from ..common.launch import SMEM_LIMIT, cdiv

LANES = 4  # vertical-sum lanes per thread (v0..v3 below)
# Defaults from the H100 sweeps (`benchmarks/sweep_box.py`), 2167x2495x3 uint8: k=3 54 us,
# k=21 69 us (16-row strips), k=101 136 us (64-row strips; box_running takes 236 us). A
# run of 30 outputs spans an odd number of 32-bit words for 3 channels, which spreads a
# warp's reads over more banks than 32.
RUN = 30  # outputs per horizontal slide
STRIP = 16  # rows per block, boxes up to 32 rows
STRIP_TALL = 64  # rows per block for taller boxes
BATCH = 8  # rows between block barriers

MAGIC_BITS = 26
# box_running (`kernels.box.running`): the column pass walks RUNNING_STRIP_ROWS rows per
# thread; the row pass gives each block RUNNING_ROW_TILE pixels of a row and each
# thread RUNNING_RUN of them.
RUNNING_STRIP_ROWS = 128
RUNNING_ROW_TILE = 512
RUNNING_RUN = 16


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


# ----------------------------------------------------------------- kernels.box.packed

PACKED_RUN = 30  # outputs per horizontal slide
PACKED_STRIP = 32  # rows per block, boxes up to 32 rows
PACKED_STRIP_TALL = 64  # rows per block for taller boxes
PACKED_BATCH = 8  # rows between block barriers
PACKED_MAX_ROWS = 257  # 257 * 255 < 2**16: a column sum fits a 16-bit lane


def packed_magic(area: int, t_limit: int = 0) -> tuple[int, int]:
    """(m, sh) with (t * m >> 32) >> sh == floor(t / (2 * area)) for 0 <= t < 2**MAGIC_BITS.

    As `magic`, with the shift raised to at least 32 so that the kernel takes the high
    word of a 32 x 32-bit product; m < 2**32 still (for 2 * area <= 64 the shift is
    32 and m <= 2**31 + 1, above that m < 2**27 + 1).
    With t_limit > 0, the smallest shift exact for 0 <= t < t_limit instead: with
    d = 2 * area, m = ceil(2**s / d) and e = m * d - 2**s < d, floor(t * m / 2**s) =
    floor(t / d) whenever t * e < 2**s (the error t * e / (d * 2**s) stays below 1 / d).
    For sums of bytes (t_limit = 511 * area + 1) and areas up to 2049 that is sh = 0,
    which saves the kernel a shift per output.
    """
    d = 2 * area
    if t_limit <= 0:
        s = max(MAGIC_BITS + (d - 1).bit_length(), 32)
        return -(-(1 << s) // d), s - 32
    s = 32
    while (t_limit - 1) * (-(-(1 << s) // d) * d - (1 << s)) >= 1 << s:
        s += 1
    return -(-(1 << s) // d), s - 32


def packed_plan(shape: tuple, dtype, ksize: tuple, threads: int = 0, run: int = 0,
                strip: int = 0, batch: int = 0) -> dict | None:  # fmt: skip
    """Launch geometry of `kernels.box.packed`, or None where it does not apply.

    It applies to uint8 images of fewer than 2**31 bytes, boxes of at most 257 rows
    whose sums stay below 2**25 (2 * sum + area < 2**MAGIC_BITS), and tiles that hold
    at least one run of outputs. A block of T threads holds 8 T byte lanes: the tile's
    outputs plus the (kw - 1)-pixel halo plus one pixel of slack (the slide reads one
    column sum past its last output). threads=0 picks the fewest threads whose tile
    holds four runs with a halo of at most a quarter of it.
    """
    height, width, channels = shape
    kh, kw = ksize
    run = run or PACKED_RUN
    batch = batch or PACKED_BATCH
    strip = strip or (PACKED_STRIP if kh <= 32 else PACKED_STRIP_TALL)
    if np.dtype(dtype) != np.uint8 or kh > PACKED_MAX_ROWS:
        return None
    if height * width * channels >= 2**31 or 511 * kh * kw >= 2**MAGIC_BITS:
        return None

    def tile(t: int) -> int:
        return min((8 * t // channels - kw) // run * run, cdiv(width, run) * run)

    def smem_bytes(t: int) -> int:
        stage_row = ((tile(t) * channels + 3) // 4 + 1) * 4
        return batch * (8 * t * 2 + stage_row)

    choices = [t for t in ((threads,) if threads else (64, 128, 256, 512))
               if tile(t) >= run and smem_bytes(t) <= SMEM_LIMIT]  # fmt: skip
    if not choices:
        return None
    t = next((t for t in choices if tile(t) >= 4 * run and kw - 1 <= tile(t) // 4), 0)
    t = t or max(choices, key=tile)
    tile_w, smem = tile(t), smem_bytes(t)
    area = kh * kw
    return {
        "threads": t,
        "tile_w": tile_w,
        "run": run,
        "strip": strip,
        "batch": batch,
        "even": area % 2 == 0,
        "smem": smem,
        "grid": (cdiv(width, tile_w), cdiv(height, strip)),
    }


def _word_kernel_args(shape: tuple, ksize: tuple, anchor: tuple, mode: int, cval) -> tuple:
    """The leading scalar arguments of the word-reading uint8 kernels (box_packed,
    box_tiled): (height, width, kh, kw, ay, ax, mode, cval, area, magic, shift_hi)."""
    height, width, _ = shape
    kh, kw = ksize
    ay, ax = anchor
    area = kh * kw
    m, shift_hi = packed_magic(area)
    return (height, width, kh, kw, ay, ax, mode, int(cval), area, m, shift_hi)


def packed_args(shape: tuple, ksize: tuple, anchor: tuple, mode: int, cval, geo: dict) -> tuple:
    """box_packed's arguments between n_words and out8, typed as launched:
    (height, width, kh, kw, ay, ax, mode, cval, area, magic, shift_hi, tile_w, strip,
    batch); Python ints become int64 parameters."""
    lead = _word_kernel_args(shape, ksize, anchor, mode, cval)
    return (*lead, geo["tile_w"], geo["strip"], geo["batch"])


def choose(shape: tuple, dtype, ksize: tuple) -> tuple[str, dict | None]:
    """(method, geometry) of the box kernel `kernels.box.dispatch.box_auto` runs: "tiled" where
    `tiled_plan` applies and the box is at most TILED_MAX_BOX on a side, else "twopass"
    where `twopass_plan` applies, else "fused" where `plan` applies, else "packed"
    where `packed_plan` does, else ("running", None).

    box_tiled comes first for uint8 boxes up to TILED_MAX_BOX (faster on the H100, see
    there); box_twopass takes larger uint8 boxes (H100, seed size, k=41/61/101:
    57.5/60.1/64.7 us against box_fused's 94.3/110.9/135.4), box_fused uint16 images.
    box_fused comes before box_packed: on the H100 box_packed is slower (2167x2495x3,
    k=21: 80 us at best vs 69 us). Both measured by `benchmarks/sweep_uint8_box.py`.
    """
    if max(ksize) <= TILED_MAX_BOX:
        tiled = tiled_plan(shape, dtype, ksize)
        if tiled is not None:
            return "tiled", tiled
    twopass = twopass_plan(shape, dtype, ksize)
    if twopass is not None:
        return "twopass", twopass
    fused = plan(shape, dtype, ksize)
    if fused is not None:
        return "fused", fused
    packed = packed_plan(shape, dtype, ksize)
    return ("packed", packed) if packed is not None else ("running", None)


# The kernel that stands in, with the same results, for one of auto's kernels that is
# specialised for its box size while that is compiled in the background: box_twopass,
# which takes the box size as an argument and ships (`imgfilter.backends.cuda._box_now`).
STAND_IN = {"tiled": "twopass", "packed": "twopass"}


def stand_in_takes(method: str, shape: tuple, dtype, ksize: tuple, address: int) -> bool:
    """Whether stand-in `method` takes this image (starting at device `address`)."""
    if method == "twopass":
        return address % 4 == 0 and twopass_plan(shape, dtype, ksize) is not None
    return False


# ------------------------------------------------------------------ kernels.box.tiled

TILED_MIN_H = 8  # the shortest tile the default geometry shrinks to
# Default geometries (threads, run, tile_w, tile_h, groups, min_blocks): small tiles
# for boxes up to TILED_SMALL_BOX rows, wide tiles of 512 threads above (the switch
# between the measured 21 and 31 is a guess). H100 sweep
# (`benchmarks/sweep_uint8_box.py`), seed size, at the best geometry: k=3 27.0 us,
# k=5 27.6, k=21 33.6; 8K k=3 123.9. Six blocks per SM cost the single-image kernel
# nothing (it needs 40 registers) and cap the batched form's registers at 40 too
# (52 unbounded): 32 720p frames, box 5, 141 us against 150 (`benchmarks/sweep_batch.py`).
TILED_DEFAULTS = dict(threads=256, run=16, tile_w=64, tile_h=32, groups=2, min_blocks=6)
TILED_WIDE_DEFAULTS = dict(threads=512, run=16, tile_w=128, tile_h=32, groups=4, min_blocks=0)
TILED_SMALL_BOX = 25
# Shared memory a default geometry may use; above 48 KiB the launch opts in (an H100
# gives up to 227 KiB per block).
TILED_SMEM_LIMIT = 96 * 1024
# The largest box side `choose` gives box_tiled; box_twopass (column tiles) takes larger
# boxes. H100 (`benchmarks/sweep_uint8_box.py`, each at its best geometry), k=31/35/41:
# seed size box_tiled 48.8/57.5/67.1 us against box_twopass 56.6/56.9/57.4; 4K
# 60.6/76.4/95.0 against 76.3/76.5/76.8. box_tiled against box_fused in one run, k=31/41:
# 2167x2495x3 53.3/67.2 vs 82.6/94.2 us, 4K 74.9/95.0 vs 121.3/141.2, 8K 251.9/326.1 vs
# 393.6/394.5.
TILED_MAX_BOX = 31


def tiled_layout(channels: int, ksize: tuple, tile_w: int, tile_h: int) -> dict:
    """Shared-memory layout of `kernels.box.tiled`, in 32-bit words: the input rows
    (in_rows of in_words, nq of them loaded), later the staged output rows (os_words
    each: a row's bytes may start 3 bytes into a word), then from word vs0 the 16-bit
    column sums (tile_h rows of vs_words). Row strides are odd: rows start in
    different banks."""
    kh, kw = ksize
    nq = ((tile_w + kw - 1) * channels + 3) // 4
    in_words, in_rows = nq | 1, tile_h + kh - 1
    os_words = ((tile_w * channels + 6) // 4) | 1
    vs0 = max(in_rows * in_words, tile_h * os_words)
    return dict(nq=nq, in_words=in_words, in_rows=in_rows, os_words=os_words, vs0=vs0,
                vs_words=(2 * nq) | 1)  # fmt: skip


def tiled_smem(channels: int, ksize: tuple, tile_w: int, tile_h: int) -> int:
    """Bytes of shared memory `kernels.box.tiled` uses (`tiled_layout`)."""
    layout = tiled_layout(channels, ksize, tile_w, tile_h)
    return 4 * (layout["vs0"] + tile_h * layout["vs_words"])


def tiled_plan(shape: tuple, dtype, ksize: tuple, threads: int = 0, run: int = 0,
               tile_w: int = 0, tile_h: int = 0, groups: int = 0,
               smem_limit: int = TILED_SMEM_LIMIT,
               min_blocks: int = -1) -> dict | None:  # fmt: skip
    """Launch geometry of `kernels.box.tiled`, or None where it does not apply.

    It applies to uint8 images of fewer than 2**31 bytes and boxes of at most 257 rows
    and columns (16-bit column sums) whose sums stay below 2**25, where a tile's input
    row is at most 4 * threads bytes and its shared memory fits `smem_limit`. With
    tile_h=0, a default tile too tall for that memory is halved while it is taller
    than TILED_MIN_H rows (below that the box rows re-read per tile cost more than the
    tile). Grids taller than CUDA's 65535 blocks are declined. Above 48 KiB of shared
    memory its launch opts in to it (H100: up
    to 227 KiB per block). Defaults: TILED_DEFAULTS, or TILED_WIDE_DEFAULTS for boxes
    over TILED_SMALL_BOX rows. `min_blocks` > 0 caps the kernel's registers so that
    many blocks fit an SM (launch bounds; 0: the compiler's choice; -1: the default).
    The tile does not depend on the image: one narrower or shorter than a tile is one
    partly outside it (as the last tile of a row is), so that every image size runs one
    kernel for its channels and box (each tile size is a kernel of its own, compiled).
    """
    height, width, channels = shape
    kh, kw = ksize
    d = TILED_DEFAULTS if kh <= TILED_SMALL_BOX else TILED_WIDE_DEFAULTS
    threads = threads or d["threads"]
    run = run or d["run"]
    tile_w = tile_w or d["tile_w"]
    h = tile_h or d["tile_h"]
    if np.dtype(dtype) != np.uint8 or max(kw, kh) > PACKED_MAX_ROWS:
        return None
    if height * width * channels >= 2**31 or 511 * kh * kw >= 2**MAGIC_BITS:
        return None
    while not tile_h and h > TILED_MIN_H:
        if tiled_smem(channels, ksize, tile_w, h) <= smem_limit:
            break
        h //= 2
    tile_h = h
    n_q = cdiv((tile_w + kw - 1) * channels, 4)
    smem = tiled_smem(channels, ksize, tile_w, tile_h)
    if n_q > threads or smem > smem_limit:
        return None
    if cdiv(height, tile_h) > 65535:
        return None
    groups = max(1, min(groups or d["groups"], threads // n_q, tile_h))
    return {
        "threads": threads,
        "run": run,
        "tile_w": tile_w,
        "tile_h": tile_h,
        "groups": groups,
        "min_blocks": d["min_blocks"] if min_blocks < 0 else min_blocks,
        "even": (kh * kw) % 2 == 0,
        "smem": smem,
        "grid": (cdiv(width, tile_w), cdiv(height, tile_h)),
    }


def tiled_args(shape: tuple, ksize: tuple, anchor: tuple, mode: int, cval, geo: dict) -> tuple:
    """box_tiled's arguments between n_words and out8, typed as launched: (height,
    width, kh, kw, ay, ax, mode, cval, area, magic, shift_hi, tile_w, tile_h, groups);
    Python ints become int64 parameters."""
    lead = _word_kernel_args(shape, ksize, anchor, mode, cval)
    return (*lead, geo["tile_w"], geo["tile_h"], geo["groups"])


# ---------------------------------------------------------------- kernels.box.twopass

# Outputs per horizontal slide: four times an odd number, so that a warp's threads
# (one run of one channel each) start in different shared-memory banks for 1 to 4
# channels, in the input bytes and in the staged 16-bit sums alike.
TWOPASS_RUN = 36
TWOPASS_ROW_THREADS = 256  # at most, per block of the row pass
# Column pass: H100 sweep (`benchmarks/sweep_uint8_box.py --kernel twopass`),
# 2167x2495x3, k=41/101/151, strips of 16/32/64/128 rows: 80.0/112.7/140.6,
# 80.2/108.0/132.2, 96.2/115.7/147.5, 129.1/146.1/159.7 us (128 threads); 256 threads on
# 32-row strips 79.4/107.0/129.8.
TWOPASS_COL_THREADS = 256  # per block of the column pass without groups
TWOPASS_STRIP = 32  # output rows a thread of the column pass walks without groups
# With groups (box_column_tiles): blocks of TWOPASS_WX words x col_groups threads, each
# of those threads walking TWOPASS_GROUP_ROWS rows of a tile in shared memory. H100,
# seed size, k=101/61, whole box_twopass: 56.8 / 52.7 us. The geometry was swept on an
# earlier version of the kernel (`benchmarks/sweep_uint8_box.py --kernel twopass`):
# strips of 256 rows in 8 groups of 32 words 73.8 / 67.3 us, against 108.0 / 90.8 for
# the serial pass; strips of 64/128/384/512/640 rows, 4/12/16 groups and 16/64 words were
# all slower at k=101 (79.6-95.9 us); a window-sharing column pass took 168-219 us.
TWOPASS_COL_GROUPS = 8
TWOPASS_WX = 32
TWOPASS_GROUP_ROWS = 32


def twopass_plan(shape: tuple, dtype, ksize: tuple, run: int = 0, row_threads: int = 0,
                 col_threads: int = 0, strip: int = 0,
                 col_groups: int = -1) -> dict | None:  # fmt: skip
    """Launch geometry of `kernels.box.twopass`, or None where it does not apply.

    It applies to uint8 images of fewer than 2**31 bytes, at most 65535 * strip rows and
    65535 row segments, boxes of at most 257 columns (row sums fit 16 bits) and areas
    whose rounding constant fits 32 bits (`packed_magic(area, 511 * area + 1)`: areas
    below 5,937,910, e.g. any box of at most 4095 x 257). The row pass gives a block
    `seg_w` output pixels of one row, a thread one run of one channel. The column pass
    gives a thread one 32-bit word (two lanes) of the 16-bit scratch of row sums,
    `pitch16` lanes a row (a multiple of 4), and a strip of rows: all of them (col_groups 0,
    `box_column_means`), or strip // col_groups of them out of a (strip + kh - 1) x
    col_threads tile of words in shared memory (`box_column_tiles`, blocks of
    col_threads x col_groups, at most 1024 threads, col_threads even: the tile loads
    64-bit pairs of words; strip must be a multiple of col_groups; with strip 0,
    TWOPASS_GROUP_ROWS rows a thread). Where the tile would
    not fit TILED_SMEM_LIMIT (tall boxes) the plan falls back to col_groups 0. col_groups -1
    picks TWOPASS_COL_GROUPS.
    """
    height, width, channels = shape
    kh, kw = ksize
    run = run or TWOPASS_RUN
    row_threads = row_threads or TWOPASS_ROW_THREADS
    col_groups = TWOPASS_COL_GROUPS if col_groups < 0 else col_groups
    col_threads = col_threads or (TWOPASS_COL_THREADS if col_groups == 0 else TWOPASS_WX)
    strip = strip or (TWOPASS_STRIP if col_groups == 0 else col_groups * TWOPASS_GROUP_ROWS)
    if col_groups and (strip % col_groups or col_threads * col_groups > 1024 or col_threads % 2):
        return None
    if col_groups and 4 * (strip + kh - 1) * col_threads > TILED_SMEM_LIMIT:
        col_groups, col_threads, strip = 0, TWOPASS_COL_THREADS, TWOPASS_STRIP
    if np.dtype(dtype) != np.uint8 or kw > PACKED_MAX_ROWS or 511 * kh * kw >= 2**32:
        return None
    if packed_magic(kh * kw, 511 * kh * kw + 1)[0] >= 2**32:
        return None
    if height * width * channels >= 2**31 or cdiv(height, strip) > 65535:
        return None
    if row_threads < channels or run % 2:  # a block holds a run of every channel; even runs
        return None
    items = channels * cdiv(width, run)
    threads = min(row_threads // channels * channels, cdiv(items, 32) * 32)
    seg_w = threads // channels * run
    if cdiv(width, seg_w) > 65535:  # row segments go on grid y
        return None
    tile_w = min(seg_w, width)
    # The input bytes start up to 3 bytes in (to land the image's words aligned).
    smem = cdiv((tile_w + kw - 1) * channels + 3, 4) * 4 + 4 * cdiv(tile_w * channels, 2)
    if smem > SMEM_LIMIT:
        return None
    pitch16 = cdiv(width * channels, 4) * 4  # rows of whole 64-bit pairs
    return {
        "run": run,
        "row_threads": threads,
        "seg_w": seg_w,
        "row_smem": smem,
        "row_grid": (height, cdiv(width, seg_w)),
        "pitch16": pitch16,
        "col_threads": col_threads,
        "col_groups": col_groups,
        "col_block": (col_threads, col_groups) if col_groups else (col_threads,),
        "col_smem": 4 * (strip + kh - 1) * col_threads if col_groups else 0,
        "strip": strip,
        "col_grid": (cdiv(pitch16 // 2, col_threads), cdiv(height, strip)),
        "even": (kh * kw) % 2 == 0,
    }


def twopass_args(shape: tuple, ksize: tuple, anchor: tuple, mode: int, cval, geo: dict) -> tuple:
    """(row, column): box_twopass's kernel arguments as launched, all int64. The row
    pass's lie between src32 and sums32: (width, kw, ax, mode, cval, seg_w, pitch16)
    (the run is compiled in); the column pass's between sums32 and out: (height, lanes,
    words, kh, ay, mode, row_cval, area, magic, shift_hi, even, strip)."""
    height, width, channels = (int(n) for n in shape)
    kh, kw = (int(n) for n in ksize)
    ay, ax = (int(n) for n in anchor)
    mode = int(mode)
    area = kh * kw
    magic, shift_hi = packed_magic(area, 511 * area + 1)
    pitch16 = geo["pitch16"]
    row = (width, kw, ax, mode, int(cval), geo["seg_w"], pitch16)
    column = (height, width * channels, pitch16 // 2, kh, ay, mode, kw * int(cval), area,
              magic, shift_hi, int(area % 2 == 0), geo["strip"])  # fmt: skip
    return row, column
