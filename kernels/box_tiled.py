"""Box filter (cv2.blur semantics) for uint8 images, one tile at a time: `box_tiled`.

Same contract as `kernels.box_fused.box_fused` for uint8 (H, W, C) device images:
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.border_index`
code with `cval` for the constant border; exact.

A block owns an output tile of `tile_h` rows and `tile_w` pixels and works in three
phases separated by barriers, with no state carried between tiles:
1. Load: the tile's input (tile_h + kh - 1 rows of (tile_w + kw - 1) * C byte lanes)
   into shared memory as 32-bit words, every load of a thread issued before any is
   used (box_fused and box_packed walk down strips one row of loads at a time and were
   measured latency-bound, BENCHMARKS.md). Interior tiles read each word as two
   aligned loads and a funnel shift; tiles touching a border gather bytes through
   the border mapping.
2. Horizontal: each item slides a window over `run` outputs of one channel of one
   input row (add the entering byte, subtract the leaving one) and stores the row
   sums as 16 bits (kw * 255 < 2**16).
3. Vertical: each thread owns a 4-lane word of the output row and one of `groups`
   runs of rows; it sums kh row sums, then slides down, rounding each mean by a
   multiply-high (`kernels.box_plan.packed_magic`) and storing the bytes to global
   memory, one byte per store, so a warp's store covers up to 128 consecutive bytes
   of a row.
The image must start on a 4-byte boundary (the words are read aligned);
`kernels.box.box_choice` sends other views to box_fused.
Many small blocks are resident per SM, so one block's loads overlap another's
arithmetic. The halo is re-read per tile (from L2), so the tile must be large next to
the box: `kernels.box_plan.tiled_plan` declines boxes too big for its tiles.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, uint8, uint16, uint32, uint64

from .box_fused import _lane_column
from .box_packed import flat_images, words
from .box_plan import tiled_args, tiled_plan
from .device import border_index

LOW16 = np.uint32(0xFFFF)
ZERO = np.uint32(0)
ONE = np.uint32(1)
TWO = np.uint32(2)
THREE = np.uint32(3)
EIGHT = np.uint32(8)
SIXTEEN = np.uint32(16)
TWENTY_FOUR = np.uint32(24)


@cuda.jit(device=True)
def _byte(src8, row_off, col, cval):
    """The byte at mapped column `col` of the row at `row_off` (-1 either: `cval`)."""
    if row_off < 0 or col < 0:
        return uint32(cval)
    return uint32(src8[row_off + col])


@cuda.jit(device=True)
def _mean(acc, area, magic, shift_hi, even):
    """round(acc / area) half to even: floor(t / (2 area)) with t = 2 acc + area, by a
    multiply-high (`kernels.box_plan.packed_magic`); a tie goes to the even side."""
    t = uint32(2 * acc + area)
    q = uint32(uint32((uint64(t) * uint64(magic)) >> uint64(32)) >> shift_hi)
    if even and uint32(t - uint32(q * uint32(2 * area))) == ZERO:
        q = uint32(q - (q & ONE))
    return q


def _make_box_tiled(channels: int, threads: int, run: int, even: bool):
    """The kernel for `channels` channels, `threads` per block, `run` outputs per
    horizontal slide and an even (ties possible) or odd box area."""
    C = channels
    RUN = run
    EVEN = even
    C_U = np.uint32(C)
    T_U = np.uint32(threads)
    RUN_U = np.uint32(RUN)

    @cuda.jit(cache=True)
    def box_tiled(src8, src32, n_words, height, width, kh, kw, ay, ax, mode, cval, area,
                  magic, shift_hi, tile_w, tile_h, groups, out8):  # fmt: skip
        """src8/out8: the image as flat bytes; src32: its whole 32-bit words."""
        in32 = cuda.shared.array(0, dtype=uint32)
        in8 = cuda.shared.array(0, dtype=uint8)
        hs16 = cuda.shared.array(0, dtype=uint16)
        hs32 = cuda.shared.array(0, dtype=uint32)
        tid = uint32(cuda.threadIdx.x)
        pitch = int32(width * C)
        kw_u = uint32(kw)
        kh_u = uint32(kh)
        x0 = int32(cuda.blockIdx.x * tile_w)
        y0 = int32(cuda.blockIdx.y * tile_h)
        out_w = uint32(min(int32(tile_w), int32(width) - x0))
        out_h = uint32(min(int32(tile_h), int32(height) - y0))
        left = x0 - int32(ax)
        top = y0 - int32(ay)
        n_in_lanes = uint32((out_w + kw_u - ONE) * C_U)
        n_in_rows = uint32(out_h + kh_u - ONE)
        n_out_lanes = uint32(out_w * C_U)
        # Shared layout: input rows of in_pitch bytes (a whole, odd number of words:
        # rows start in different banks), then the row sums, rows of hs_pitch 16-bit
        # lanes: every word a thread reads in phase 3 plus one, an odd number of words,
        # so that phase 2's threads, on consecutive rows, store to different banks (an
        # even row stride put a warp's stores in one bank: ncu saw shared memory 82%
        # busy and half the stalls on it).
        in_words = uint32(((tile_w + kw - 1) * C + 3) // 4)
        in_words = uint32(in_words | ONE)
        in_pitch = uint32(4 * in_words)
        hs_pitch = uint32((tile_w * C + 3) // 4 * 4 + 2)
        hs0 = uint32((tile_h + kh - 1) * in_pitch // 2)  # first row sum, in 16-bit lanes
        hs0 = uint32((hs0 + THREE) & ~THREE)

        # 1. Load. Thread (r0, q) loads word q of rows r0, r0 + row_step, ...
        n_q = uint32((n_in_lanes + THREE) >> TWO)
        row_step = uint32(T_U // n_q)
        r = uint32(tid // n_q)
        q = uint32(tid - r * n_q)
        if r >= row_step:  # a partial group of rows would load words twice
            r = n_in_rows
        bottom = top + int32(n_in_rows) - 1
        word_end = left * C + int32(4 * n_q)
        interior = (
            top >= 0 and bottom < height and left >= 0 and word_end <= pitch
            and uint32(bottom * pitch + word_end) // uint32(4) < uint32(n_words)
        )  # fmt: skip
        lane = int32(4 * q)
        if interior:
            col = uint32(left * C + lane)
            while r < n_in_rows:
                a = uint32(uint32(top + int32(r)) * uint32(pitch) + col)
                wi = uint32(a >> TWO)
                lo = uint64(src32[wi])
                hi = uint64(src32[wi + ONE])
                shift = uint64(EIGHT * (a & THREE))
                in32[r * in_words + q] = uint32(((hi << uint64(32)) | lo) >> shift)
                r = uint32(r + row_step)
        elif r < n_in_rows:
            c0 = int32(_lane_column(lane, n_in_lanes, left, width, C, mode))
            c1 = int32(_lane_column(lane + 1, n_in_lanes, left, width, C, mode))
            c2 = int32(_lane_column(lane + 2, n_in_lanes, left, width, C, mode))
            c3 = int32(_lane_column(lane + 3, n_in_lanes, left, width, C, mode))
            while r < n_in_rows:
                yy = border_index(top + int32(r), height, mode)
                ro = int32(-1) if yy < 0 else int32(yy * pitch)
                b0 = _byte(src8, ro, c0, cval)
                b1 = _byte(src8, ro, c1, cval)
                b2 = _byte(src8, ro, c2, cval)
                b3 = _byte(src8, ro, c3, cval)
                word = uint32(b0 | (b1 << EIGHT) | (b2 << SIXTEEN) | (b3 << TWENTY_FOUR))
                in32[r * in_words + q] = word
                r = uint32(r + row_step)
        cuda.syncthreads()

        # 2. Horizontal: item (rr, c, run) slides over RUN outputs of channel c of input
        # row rr; consecutive threads take consecutive rows (rows start in different banks).
        n_runs = uint32((out_w + RUN_U - ONE) // RUN_U)
        n_items = uint32(n_in_rows * C_U * n_runs)
        kwc = uint32(kw_u * C_U)
        item = tid
        while item < n_items:
            rest = uint32(item // n_in_rows)
            rr = uint32(item - rest * n_in_rows)
            ri = uint32(rest // C_U)
            c = uint32(rest - ri * C_U)
            xs = uint32(ri * RUN_U)
            leaving = uint32(rr * in_pitch + xs * C_U + c)
            entering = uint32(leaving + kwc)
            acc = uint32(0)
            p = leaving
            while p < entering:
                acc = uint32(acc + in8[p])
                p = uint32(p + C_U)
            dst = uint32(hs0 + rr * hs_pitch + xs * C_U + c)
            hs16[dst] = acc
            if xs + RUN_U <= out_w:  # a full run: straight-line code, constant offsets
                for k in range(1, RUN):
                    j = uint32((k - 1) * C)
                    acc = uint32(acc + in8[entering + j] - in8[leaving + j])
                    hs16[dst + uint32(k * C)] = acc
            else:
                last = uint32((out_w - xs) * C_U)
                k = C_U
                while k < last:
                    acc = uint32(acc + in8[entering] - in8[leaving])
                    hs16[dst + k] = acc
                    entering = uint32(entering + C_U)
                    leaving = uint32(leaving + C_U)
                    k = uint32(k + C_U)
            item = uint32(item + T_U)
        cuda.syncthreads()

        # 3. Vertical: thread (g, q) sums lanes 4q..4q+3 over the rows of group g.
        n_o = uint32((n_out_lanes + THREE) >> TWO)
        g = uint32(tid // n_o)
        q = uint32(tid - g * n_o)
        per_group = uint32((out_h + uint32(groups) - ONE) // uint32(groups))
        first = uint32(g * per_group)
        if g < uint32(groups) and first < out_h:
            end = uint32(min(first + per_group, out_h))
            area32 = uint32(area)
            magic32 = uint32(magic)
            shift32 = uint32(shift_hi)
            hs_words = uint32(hs_pitch >> ONE)
            base = uint32((hs0 >> ONE) + first * hs_words + 2 * q)  # in 32-bit words
            s0 = uint32(0)
            s1 = uint32(0)
            s2 = uint32(0)
            s3 = uint32(0)
            i = uint32(0)
            while i < kh_u:
                a = hs32[base + i * hs_words]
                b = hs32[base + i * hs_words + ONE]
                s0 = uint32(s0 + (a & LOW16))
                s1 = uint32(s1 + (a >> SIXTEEN))
                s2 = uint32(s2 + (b & LOW16))
                s3 = uint32(s3 + (b >> SIXTEEN))
                i = uint32(i + ONE)
            lane_u = uint32(4 * q)
            n_valid = uint32(min(n_out_lanes - lane_u, uint32(4)))
            out_row = uint32(uint32(y0) + first) * uint32(pitch) + uint32(x0 * C) + lane_u
            leave = base
            enter = uint32(base + kh_u * hs_words)
            y = first
            while True:
                out8[out_row] = _mean(s0, area32, magic32, shift32, EVEN)
                if n_valid == uint32(4):
                    out8[out_row + ONE] = _mean(s1, area32, magic32, shift32, EVEN)
                    out8[out_row + TWO] = _mean(s2, area32, magic32, shift32, EVEN)
                    out8[out_row + THREE] = _mean(s3, area32, magic32, shift32, EVEN)
                else:
                    if n_valid > ONE:
                        out8[out_row + ONE] = _mean(s1, area32, magic32, shift32, EVEN)
                    if n_valid > TWO:
                        out8[out_row + TWO] = _mean(s2, area32, magic32, shift32, EVEN)
                y = uint32(y + ONE)
                if y >= end:
                    break
                a = hs32[enter]
                b = hs32[enter + ONE]
                d = hs32[leave]
                e = hs32[leave + ONE]
                s0 = uint32(s0 + (a & LOW16) - (d & LOW16))
                s1 = uint32(s1 + (a >> SIXTEEN) - (d >> SIXTEEN))
                s2 = uint32(s2 + (b & LOW16) - (e & LOW16))
                s3 = uint32(s3 + (b >> SIXTEEN) - (e >> SIXTEEN))
                enter = uint32(enter + hs_words)
                leave = uint32(leave + hs_words)
                out_row = uint32(out_row + uint32(pitch))

    return box_tiled


_KERNELS: dict = {}


def kernel_for(channels: int, threads: int, run: int, even: bool):
    """The compiled-on-demand kernel for this specialisation (kept per process)."""
    key = (channels, threads, run, bool(even))
    if key not in _KERNELS:
        _KERNELS[key] = _make_box_tiled(*key)
    return _KERNELS[key]


def box_tiled(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None):
    """Box filter of a uint8 (H, W, C) device image, one shared-memory tile per block
    (see the module docstring); `geometry` from `kernels.box_plan.tiled_plan`. Raises
    ValueError when the plan says the case is not handled.
    """
    geo = geometry or tiled_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_tiled handles uint8 images with boxes small next to its tiles")
    out, src, dst, n = flat_images(img, out, "box_tiled")
    kernel = kernel_for(img.shape[2], geo["threads"], geo["run"], geo["even"])
    args = tiled_args(img.shape, ksize, anchor, mode, cval, geo)
    kernel[geo["grid"], geo["threads"], 0, geo["smem"]](src, words(src), n // 4, *args, dst)
    return out
