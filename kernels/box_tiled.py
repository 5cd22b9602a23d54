"""Box filter (cv2.blur semantics) for uint8 images, one tile at a time: `box_tiled`.

Same contract as `kernels.box_fused.box_fused` for uint8 (H, W, C) device images:
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.border_index`
code with `cval` for the constant border; exact.

A block owns an output tile of `tile_h` rows and `tile_w` pixels. Two kernels share
the tiles and the load: rows first (this module's own, below) and columns first
(`kernels.box_tiled_vh`, which the geometry's `vertical_first` picks; by default
boxes up to `kernels.box_plan.VH_MAX_BOX` rows). Rows first works in three phases
separated by barriers, with no state carried between tiles:
1. Load (`kernels.tile_load`): the tile's input (tile_h + kh - 1 rows of
   (tile_w + kw - 1) * C byte lanes) into shared memory as 32-bit words, every load
   of a thread issued before any is used (box_fused and box_packed walk down strips
   one row of loads at a time and were measured latency-bound, BENCHMARKS.md).
   Interior tiles read each word as two aligned loads and a funnel shift; tiles
   touching a border gather bytes through the border mapping.
2. Horizontal: each item slides a window over `run` outputs of one channel of one
   input row (add the entering byte, subtract the leaving one) and stores the row
   sums as 16 bits (kw * 255 < 2**16).
3. Vertical: each thread owns a 4-lane word of the output row and one of `groups`
   runs of rows; it sums kh row sums, then slides down, rounding each mean by a
   multiply-high (`kernels.box_plan.packed_magic`) and storing the bytes to global
   memory, one byte per store, so a warp's store covers up to 128 consecutive bytes
   of a row.
The image (and for columns first, which stores words, the output) must start on a
4-byte boundary; `kernels.box.box_choice` sends other views to box_fused.
Many small blocks are resident per SM, so one block's loads overlap another's
arithmetic. The halo is re-read per tile (from L2), so the tile must be large next to
the box: `kernels.box_plan.tiled_plan` declines boxes too big for its tiles.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda, int64, uint8, uint16, uint32, uint64

from . import box_tiled_vh
from .arrays import start_address
from .box_packed import flat_images, words
from .box_plan import packed_magic, tiled_args, tiled_plan
from .launch import launch
from .tile_load import div, make_loader, reciprocal

SIMULATOR = bool(config.ENABLE_CUDASIM)
LOW16 = np.uint32(0xFFFF)
ZERO = np.uint32(0)
ONE = np.uint32(1)
SIXTEEN = np.uint32(16)


@cuda.jit(device=True)
def _mean(acc, area, magic, shift_hi, even):
    """round(acc / area) half to even: floor(t / (2 area)) with t = 2 acc + area, by a
    multiply-high (`kernels.box_plan.packed_magic`); a tie goes to the even side."""
    t = uint32(2 * acc + area)
    q = uint32(uint32((uint64(t) * uint64(magic)) >> uint64(32)) >> shift_hi)
    if even and uint32(t - uint32(q * uint32(2 * area))) == ZERO:
        q = uint32(q - (q & ONE))
    return q


def _make_box_tiled(channels: int, ksize: tuple, threads: int, run: int, tile_w: int,
                    tile_h: int, groups: int, min_blocks: int):  # fmt: skip
    """The kernel for one specialisation: `channels`, the box `ksize` = (kh, kw), and
    the geometry of `kernels.box_plan.tiled_plan` (threads per block, outputs per
    horizontal slide, tile_w x tile_h output pixels per tile, row groups of the
    vertical phase, and min_blocks > 0 to ask the compiler for registers enough for
    that many resident blocks per SM: CUDA launch bounds). Every size is a
    compile-time constant, so divisions become multiplies, the box loops unroll and
    shared-memory offsets fold into the loads.
    Tiles past the image's right or bottom edge compute their whole area from
    border-mapped input and store only what lies inside."""
    C = channels
    KH, KW = ksize
    T, RUN, TW, TH, G = threads, run, tile_w, tile_h, groups
    AREA = KH * KW
    EVEN = AREA % 2 == 0
    magic, shift_hi = packed_magic(AREA)
    AREA_U, MAGIC_U, SHIFT_U = np.uint32(AREA), np.uint32(magic), np.uint32(shift_hi)
    IN_LANES = (TW + KW - 1) * C  # byte lanes of one input row of the tile
    NQ = (IN_LANES + 3) // 4  # words loaded per input row
    IN_WORDS = NQ | 1  # row stride in words, odd: rows start in different banks
    IN_PITCH = 4 * IN_WORDS
    IN_ROWS = TH + KH - 1
    OUT_LANES = TW * C
    # Row sums: rows of HS_PITCH 16-bit lanes (an odd number of words, so phase 2's
    # threads, on consecutive rows, store to different banks: an even stride put a
    # warp's stores in one bank, ncu saw shared memory 82% busy), from lane HS0 on.
    HS_PITCH = (OUT_LANES + 3) // 4 * 4 + 2
    HS_WORDS = HS_PITCH // 2
    HS0 = (IN_ROWS * IN_PITCH // 2 + 3) // 4 * 4
    FULL_RUNS = TW // RUN
    LAST_RUN = TW - FULL_RUNS * RUN  # outputs of the partial run at the tile's end
    N_ITEMS = IN_ROWS * C * ((TW + RUN - 1) // RUN)
    ITEM_ITERS = (N_ITEMS + T - 1) // T
    NO = (OUT_LANES + 3) // 4  # output words per row
    PER_GROUP = (TH + G - 1) // G
    # Index arithmetic is unsigned 64-bit: Numba adds a negative-index wraparound to
    # every signed index, and 32-bit wrapping keeps constant offsets out of the loads.
    U = np.uint64
    IN_ROWS_U, IN_PITCH_U = U(IN_ROWS), U(IN_PITCH)
    C_U, RUN_U, FULL_RUNS_U, N_ITEMS_U = U(C), U(RUN), U(FULL_RUNS), U(N_ITEMS)
    HS0_U, HS0W_U, HS_PITCH_U, HS_WORDS_U = U(HS0), U(HS0 // 2), U(HS_PITCH), U(HS_WORDS)
    NO_U, G_U, PER_GROUP_U = U(NO), U(G), U(PER_GROUP)
    ONE_U, TWO_U, THREE_U, FOUR_U = U(1), U(2), U(3), U(4)
    BY_IN_ROWS, BY_C, BY_NO = (reciprocal(d) for d in (IN_ROWS, C, NO))
    load = make_loader(C, ksize, TW, TH, T)
    # Launch bounds are a compile option; the simulator's jit takes none.
    bounds = {"launch_bounds": (T, min_blocks)} if min_blocks and not SIMULATOR else {}

    @cuda.jit(cache=True, **bounds)
    def box_tiled(src8, src32, n_words, height, width, kh, kw, ay, ax, mode, cval, area,
                  magic, shift_hi, tile_w, tile_h, groups, out8):  # fmt: skip
        """src8/out8: the image as flat bytes; src32: its whole 32-bit words. kh, kw,
        area, magic, shift_hi, tile_w, tile_h and groups are the specialisation's own
        constants (kept in the signature the launchers share)."""
        in32 = cuda.shared.array(0, dtype=uint32)
        in8 = cuda.shared.array(0, dtype=uint8)
        hs16 = cuda.shared.array(0, dtype=uint16)
        hs32 = cuda.shared.array(0, dtype=uint32)
        tid = uint64(cuda.threadIdx.x)
        pitch = width * C
        upitch = uint64(pitch)
        x0 = cuda.blockIdx.x * TW
        y0 = cuda.blockIdx.y * TH
        left = x0 - ax
        top = y0 - ay

        # 1. Load (kernels.tile_load).
        load(in32, src8, src32, n_words, height, width, left, top, mode, cval, tid)
        cuda.syncthreads()

        # 2. Horizontal: item (rr, c, run) slides over the outputs of one run of channel
        # c of input row rr; consecutive threads take consecutive rows (rows start in
        # different banks).
        for it in range(ITEM_ITERS):
            item = tid + U(it * T)
            if item < N_ITEMS_U:
                rest = div(item, BY_IN_ROWS)
                rr = item - rest * IN_ROWS_U
                ri = div(rest, BY_C)
                c = rest - ri * C_U
                xs = ri * RUN_U
                leaving = rr * IN_PITCH_U + xs * C_U + c
                acc = uint32(0)
                for j in range(KW):
                    acc = uint32(acc + in8[leaving + U(j * C)])
                dst = HS0_U + rr * HS_PITCH_U + xs * C_U + c
                hs16[dst] = acc
                if ri < FULL_RUNS_U:
                    for k in range(1, RUN):
                        enter = in8[leaving + U((k - 1 + KW) * C)]
                        acc = uint32(acc + enter - in8[leaving + U((k - 1) * C)])
                        hs16[dst + U(k * C)] = acc
                else:
                    for k in range(1, LAST_RUN):
                        enter = in8[leaving + U((k - 1 + KW) * C)]
                        acc = uint32(acc + enter - in8[leaving + U((k - 1) * C)])
                        hs16[dst + U(k * C)] = acc
        cuda.syncthreads()

        # 3. Vertical: thread (g, q) sums lanes 4q..4q+3 over the rows of group g and
        # stores the rounded means of the rows inside the image.
        g = div(tid, BY_NO)
        q = tid - g * NO_U
        first = int64(g * PER_GROUP_U)
        out_h = min(TH, height - y0)
        lane = FOUR_U * q
        n_valid = min(TW, width - x0) * C - int64(lane)  # lanes of this word in the image
        if g < G_U and first < out_h and n_valid > 0:
            base = HS0W_U + g * (PER_GROUP_U * HS_WORDS_U) + TWO_U * q  # in 32-bit words
            s0 = uint32(0)
            s1 = uint32(0)
            s2 = uint32(0)
            s3 = uint32(0)
            for i in range(KH):
                a = hs32[base + U(i * HS_WORDS)]
                b = hs32[base + U(i * HS_WORDS + 1)]
                s0 = uint32(s0 + (a & LOW16))
                s1 = uint32(s1 + (a >> SIXTEEN))
                s2 = uint32(s2 + (b & LOW16))
                s3 = uint32(s3 + (b >> SIXTEEN))
            o = uint64((y0 + first) * pitch + x0 * C) + lane
            leave = base
            enter = base + U(KH * HS_WORDS)
            end = min(first + PER_GROUP, out_h)
            y = first
            while True:
                out8[o] = _mean(s0, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                if n_valid >= 4:
                    out8[o + ONE_U] = _mean(s1, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                    out8[o + TWO_U] = _mean(s2, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                    out8[o + THREE_U] = _mean(s3, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                else:
                    if n_valid > 1:
                        out8[o + ONE_U] = _mean(s1, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                    if n_valid > 2:
                        out8[o + TWO_U] = _mean(s2, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                y += 1
                if y >= end:
                    break
                a = hs32[enter]
                b = hs32[enter + ONE_U]
                d = hs32[leave]
                e = hs32[leave + ONE_U]
                s0 = uint32(s0 + (a & LOW16) - (d & LOW16))
                s1 = uint32(s1 + (a >> SIXTEEN) - (d >> SIXTEEN))
                s2 = uint32(s2 + (b & LOW16) - (e & LOW16))
                s3 = uint32(s3 + (b >> SIXTEEN) - (e >> SIXTEEN))
                enter += HS_WORDS_U
                leave += HS_WORDS_U
                o += upitch

    return box_tiled


_KERNELS: dict = {}


def kernel_for(channels: int, ksize: tuple, geometry: dict):
    """The compiled-on-demand kernel for this image's channels, box and
    `kernels.box_plan.tiled_plan` geometry (kept per process)."""
    g = geometry
    key = (channels, tuple(ksize), g["threads"], g["run"], g["tile_w"], g["tile_h"], g["groups"],
           g.get("min_blocks", 0))  # fmt: skip
    vertical_first = g.get("vertical_first", False)
    if (key, vertical_first) not in _KERNELS:
        make = box_tiled_vh.make_kernel if vertical_first else _make_box_tiled
        _KERNELS[key, vertical_first] = make(*key)
    return _KERNELS[key, vertical_first]


def box_tiled(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None,
              stream: int = 0):  # fmt: skip
    """Box filter of a uint8 (H, W, C) device image, one shared-memory tile per block
    (see the module docstring); `geometry` from `kernels.box_plan.tiled_plan`. Queued
    on `stream`. Raises ValueError when the plan says the case is not handled.
    """
    geo = geometry or tiled_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_tiled handles uint8 images with boxes small next to its tiles")
    if out is not None and tuple(out.shape) != tuple(img.shape):
        raise ValueError(
            f"box_tiled: out has shape {tuple(out.shape)}, the image {tuple(img.shape)}"
        )
    kernel = kernel_for(img.shape[2], ksize, geo)
    scalars = tiled_args(img.shape, ksize, anchor, mode, cval, geo)
    out, src, dst, n = flat_images(img, out, "box_tiled", stream)
    args = (src, words(src), n // 4, *scalars, dst)
    if geo.get("vertical_first"):
        if start_address(out) % 4:
            raise ValueError("box_tiled writes 32-bit words: out must start on a 4-byte boundary")
        args += (words(dst),)
    launch(kernel, geo["grid"], geo["threads"], args, stream, geo["smem"])
    return out
