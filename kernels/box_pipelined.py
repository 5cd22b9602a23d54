"""Box filter (cv2.blur semantics) for uint8 images with prefetched rows: `box_pipelined`.

Same contract as `kernels.box_fused.box_fused` for uint8 (H, W, C) device images:
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.border_index`
code with `cval` for the constant border; exact. Boxes up to 257 rows (a column sum
of 257 bytes fits 16 bits).

A block owns `tile_w` output pixels of a strip of `strip` rows and walks down it in
batches of B rows. Each thread owns one 32-bit word (4 byte lanes) of the tile's input
row (outputs plus the (kw - 1)-pixel halo) and keeps its four vertical running sums
as two 16-bit pairs (lanes 0 and 2 in one register, 1 and 3 in the other), so one add
updates two sums. What makes it differ from `kernels.box_packed`: the words of the next
batch's entering and leaving rows are loaded into registers *before* the block's
horizontal pass and write-out of the current batch, so their DRAM/L2 latency overlaps
that work instead of stalling the vertical step (box_fused and box_packed were
measured latency-bound, BENCHMARKS.md).

Per batch: the vertical step folds the prefetched rows into the sums and stores them
in shared memory (one 64-bit store per thread and row), the loads of the next batch
are issued, then each thread slides a horizontal window over RUN outputs of one
channel of one row (add the entering column sum, subtract the leaving one; the mean
by a multiply-high, `kernels.box_plan.packed_magic`), and the block writes the staged
rows out, whole aligned 32-bit words where the row allows.

Interior blocks read each row's word as two aligned loads and a funnel shift; blocks
touching a border gather their bytes one at a time through the border mapping.
Geometry: `kernels.box_plan.pipelined_plan` (Numba-free).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, uint8, uint16, uint32, uint64

from .box_fused import _lane_column
from .box_packed import words
from .box_plan import pipelined_args, pipelined_plan
from .device import border_index

PAIRS = np.uint32(0x00FF00FF)  # bytes 0 and 2 of a word, as two 16-bit lanes
LOW16 = np.uint32(0x0000FFFF)
HIGH16 = np.uint32(0xFFFF0000)
ZERO = np.uint32(0)
ONE = np.uint32(1)
TWO = np.uint32(2)
THREE = np.uint32(3)
EIGHT = np.uint32(8)
SIXTEEN = np.uint32(16)
TWENTY_FOUR = np.uint32(24)


@cuda.jit(device=True)
def _mapped_row(p, height, pitch, mode):
    """Byte offset of border-mapped row p, or -1 for the constant border."""
    yy = border_index(p, height, mode)
    if yy < 0:
        return int32(-1)
    return int32(yy * pitch)


@cuda.jit(device=True)
def _gather(src8, row_off, c0, c1, c2, c3, cval):
    """A word of four bytes gathered from mapped columns (-1: `cval`) of a mapped row."""
    if row_off < 0:
        return uint32(cval) * uint32(0x01010101)
    b0 = uint32(cval) if c0 < 0 else uint32(src8[row_off + c0])
    b1 = uint32(cval) if c1 < 0 else uint32(src8[row_off + c1])
    b2 = uint32(cval) if c2 < 0 else uint32(src8[row_off + c2])
    b3 = uint32(cval) if c3 < 0 else uint32(src8[row_off + c3])
    return b0 | (b1 << EIGHT) | (b2 << SIXTEEN) | (b3 << TWENTY_FOUR)


@cuda.jit(device=True)
def _funnel(lo, hi, shift):
    """The 32 bits starting `shift` bits into the 64-bit pair (hi:lo)."""
    return uint32(((uint64(hi) << uint64(32)) | uint64(lo)) >> uint64(shift))


@cuda.jit(device=True)
def _mean(acc, area, magic, shift_hi, even):
    """round(acc / area) half to even: floor(t / (2 area)) with t = 2 acc + area, by a
    multiply-high (`kernels.box_plan.packed_magic`); a tie goes to the even side."""
    t = uint32(2 * acc + area)
    q = uint32((uint64(t) * uint64(magic)) >> uint64(32)) >> shift_hi
    if even and uint32(t - q * uint32(2 * area)) == ZERO:
        q -= q & ONE
    return q


def _make_box_pipelined(channels: int, threads: int, batch: int, run: int, even: bool):
    """The kernel for `channels` channels, `threads` per block, `batch` rows between
    barriers, `run` outputs per horizontal slide and an even or odd box area."""
    C = channels
    B = batch
    RUN = run
    EVEN = even
    C_U = np.uint32(C)
    T_U = np.uint32(threads)
    RUN_U = np.uint32(RUN)
    # A row of column sums: 4 * threads lanes of 16 bits, plus one 64-bit word of
    # padding so that consecutive rows start in different banks.
    ROW64 = np.uint32(threads + 1)
    ROW16 = np.uint32(4 * (threads + 1))
    WARP_U = np.uint32(min(threads, 32))  # the write-out's threads per row
    WARPS_U = np.uint32(max(threads // 32, 1))

    @cuda.jit(cache=True)
    def box_pipelined(src8, src32, n_words, height, width, kh, kw, ay, ax, mode, cval,
                      area, magic, shift_hi, tile_w, strip, out8, out32):  # fmt: skip
        """src8/out8: the image as flat bytes; src32/out32: its whole 32-bit words."""
        sums64 = cuda.shared.array(0, dtype=uint64)
        sums32 = cuda.shared.array(0, dtype=uint32)
        sums16 = cuda.shared.array(0, dtype=uint16)
        stage8 = cuda.shared.array(0, dtype=uint8)
        tid = uint32(cuda.threadIdx.x)
        area32 = uint32(area)
        magic32 = uint32(magic)
        shift32 = uint32(shift_hi)
        nw = uint32(n_words)
        pitch = int32(width * C)
        x0 = int32(cuda.blockIdx.x * tile_w)
        out_w = min(int32(tile_w), int32(width) - x0)
        n_lanes = int32((out_w + kw - 1) * C)
        left = x0 - int32(ax)
        lane = int32(4 * tid)
        col = left * C + lane  # byte column of this word's first lane (unmapped)
        c0 = int32(_lane_column(lane, n_lanes, left, width, C, mode))
        c1 = int32(_lane_column(lane + 1, n_lanes, left, width, C, mode))
        c2 = int32(_lane_column(lane + 2, n_lanes, left, width, C, mode))
        c3 = int32(_lane_column(lane + 3, n_lanes, left, width, C, mode))

        y0 = int32(cuda.blockIdx.y * strip)
        y_end = min(y0 + int32(strip), int32(height))
        top = y0 - int32(ay)  # first row of the first output's window
        bottom = y_end - 1 - int32(ay) + int32(kh) - 1  # last row any window reads
        # Interior: every row and every word of the tile inside the image (the words
        # past the tile's last lane are read but never used).
        words_end = left * C + 4 * ((n_lanes + 3) // 4)
        interior = (
            top >= 0 and bottom < height and left >= 0 and words_end <= pitch
            and uint32(bottom * pitch + words_end) // uint32(4) < nw
        )  # fmt: skip

        # Rows are identified by their index; r < top - 1 never happens, r = -huge
        # marks "no row" (the strip's first output has nothing leaving).
        elo = cuda.local.array(B, uint32)
        ehi = cuda.local.array(B, uint32)
        llo = cuda.local.array(B, uint32)
        lhi = cuda.local.array(B, uint32)

        # Warm-up: the column sums of rows top .. top + kh - 2, B rows of loads at a time.
        s02 = uint32(0)
        s13 = uint32(0)
        r = int32(0)
        while r < kh - 1:
            for i in range(B):
                if r + i < kh - 1:
                    p = top + r + i
                    if interior:
                        a = uint32(p * pitch + col)
                        elo[i] = src32[a >> TWO]
                        ehi[i] = src32[(a >> TWO) + ONE]
                    else:
                        elo[i] = _gather(src8, _mapped_row(p, height, pitch, mode),
                                         c0, c1, c2, c3, cval)  # fmt: skip
            for i in range(B):
                if r + i < kh - 1:
                    w = elo[i]
                    if interior:
                        a = uint32((top + r + i) * pitch + col)
                        w = _funnel(elo[i], ehi[i], EIGHT * (a & THREE))
                    s02 = uint32(s02 + (w & PAIRS))
                    s13 = uint32(s13 + ((w >> EIGHT) & PAIRS))
            r += B

        # Prefetch a batch: for output row y the row top + kh - 1 + (y - y0) enters
        # and top - 1 + (y - y0) leaves (nothing leaves at y0).
        yb = y0
        for i in range(B):
            y = yb + i
            if y < y_end:
                pe = top + kh - 1 + (y - y0)
                pl = top - 1 + (y - y0)
                if interior:
                    a = uint32(pe * pitch + col)
                    elo[i] = src32[a >> TWO]
                    ehi[i] = src32[(a >> TWO) + ONE]
                    if y > y0:
                        b = uint32(pl * pitch + col)
                        llo[i] = src32[b >> TWO]
                        lhi[i] = src32[(b >> TWO) + ONE]
                else:
                    elo[i] = _gather(src8, _mapped_row(pe, height, pitch, mode),
                                     c0, c1, c2, c3, cval)  # fmt: skip
                    if y > y0:
                        llo[i] = _gather(src8, _mapped_row(pl, height, pitch, mode),
                                         c0, c1, c2, c3, cval)  # fmt: skip

        stage0 = uint32(B * ROW16 * 2)  # staged means follow the column sums
        stage_row = uint32(((tile_w * C + 3) // 4 + 1) * 4)  # bytes per staged row
        per_row = uint32(C * ((out_w + RUN - 1) // RUN))  # horizontal items per row
        pitch_u = uint32(pitch)
        out_w_u = uint32(out_w)
        outc = uint32(out_w * C)
        kwc = uint32(kw * C)
        x0c = uint32(x0 * C)
        wlane = tid % WARP_U
        warp = tid // WARP_U
        while yb < y_end:
            rows = uint32(min(B, y_end - yb))
            # Vertical: fold the prefetched rows into the sums, one shared row each.
            for i in range(B):
                if uint32(i) < rows:
                    y = yb + i
                    e = elo[i]
                    o = llo[i]
                    if interior:
                        a = uint32((top + kh - 1 + (y - y0)) * pitch + col)
                        e = _funnel(elo[i], ehi[i], EIGHT * (a & THREE))
                        b = uint32((top - 1 + (y - y0)) * pitch + col)
                        o = _funnel(llo[i], lhi[i], EIGHT * (b & THREE))
                    if y == y0:
                        o = uint32(0)
                    s02 = uint32(s02 + (e & PAIRS) - (o & PAIRS))
                    s13 = uint32(s13 + ((e >> EIGHT) & PAIRS) - ((o >> EIGHT) & PAIRS))
                    # uint32() first: compiled Numba widens `s13 << 16` to 64 bits (the
                    # simulator's NumPy scalars do not), which would leak lane 3 into
                    # lane 2 of the 64-bit store.
                    w01 = uint64(uint32((s02 & LOW16) | (s13 << SIXTEEN)))
                    w23 = uint64(uint32((s02 >> SIXTEEN) | (s13 & HIGH16)))
                    sums64[uint32(i) * ROW64 + tid] = w01 | (w23 << uint64(32))
            # Prefetch the next batch; its loads fly during the passes below.
            nb = yb + B
            for i in range(B):
                y = nb + i
                if y < y_end:
                    pe = top + kh - 1 + (y - y0)
                    pl = top - 1 + (y - y0)
                    if interior:
                        a = uint32(pe * pitch + col)
                        elo[i] = src32[a >> TWO]
                        ehi[i] = src32[(a >> TWO) + ONE]
                        b = uint32(pl * pitch + col)
                        llo[i] = src32[b >> TWO]
                        lhi[i] = src32[(b >> TWO) + ONE]
                    else:
                        elo[i] = _gather(src8, _mapped_row(pe, height, pitch, mode),
                                         c0, c1, c2, c3, cval)  # fmt: skip
                        llo[i] = _gather(src8, _mapped_row(pl, height, pitch, mode),
                                         c0, c1, c2, c3, cval)  # fmt: skip
            cuda.syncthreads()
            # Horizontal: each item slides over RUN outputs of one channel of one row.
            row0 = uint32(uint32(yb) * pitch_u + x0c)  # byte offset of the batch's first output
            n_items = uint32(rows * per_row)
            item = tid
            while item < n_items:
                g = uint32(item // per_row)
                rest = uint32(item - g * per_row)
                rr = uint32(rest // C_U)
                c = uint32(rest - rr * C_U)
                xs = uint32(rr * RUN_U)
                leaving = uint32(g * ROW16 + xs * C_U + c)  # the sum leaving next
                entering = uint32(leaving + kwc)  # the sum entering next
                acc = uint32(0)
                p = leaving
                while p < entering:
                    acc = uint32(acc + sums16[p])
                    p = uint32(p + C_U)
                # Staged so that a row's bytes sit at its output address modulo 4.
                phase = uint32(row0 + g * pitch_u) & THREE
                dst = uint32(stage0 + g * stage_row + phase + xs * C_U + c)
                if xs + RUN_U <= out_w_u:
                    for k in range(RUN):  # a full run: straight-line code
                        ku = uint32(k) * C_U
                        stage8[dst + ku] = _mean(acc, area32, magic32, shift32, EVEN)
                        acc = uint32(acc + sums16[entering + ku] - sums16[leaving + ku])
                else:
                    ku = uint32(0)
                    last = uint32((out_w_u - xs) * C_U)
                    while ku < last:
                        stage8[dst + ku] = _mean(acc, area32, magic32, shift32, EVEN)
                        acc = uint32(acc + sums16[entering + ku] - sums16[leaving + ku])
                        ku = uint32(ku + C_U)
                item = uint32(item + T_U)
            cuda.syncthreads()
            # Write the staged rows, a warp per row: the whole aligned words, then the
            # at most six bytes at the row's two ends.
            g = warp
            while g < rows:
                row_start = uint32(row0 + g * pitch_u)
                row_end = uint32(row_start + outc)
                staged = uint32(stage0 + g * stage_row + (row_start & THREE))
                w_first = uint32(row_start + THREE) >> TWO
                w_end = min(row_end >> TWO, nw)
                if w_end <= w_first:  # no whole word: every byte one by one
                    w_end = w_first
                    head_end = row_end
                else:
                    head_end = uint32(w_first << TWO)
                wi = uint32(w_first + wlane)
                while wi < w_end:
                    out32[wi] = sums32[uint32(staged + ((wi << TWO) - row_start)) >> TWO]
                    wi = uint32(wi + WARP_U)
                n_head = uint32(head_end - row_start)
                tail = max(w_end << TWO, head_end)
                n_tail = uint32(row_end - tail) if row_end > tail else uint32(0)
                j = wlane
                while j < n_head + n_tail:
                    a = uint32(row_start + j) if j < n_head else uint32(tail + j - n_head)
                    out8[a] = stage8[uint32(staged + (a - row_start))]
                    j = uint32(j + WARP_U)
                g = uint32(g + WARPS_U)
            yb = nb

    return box_pipelined


_KERNELS: dict = {}


def kernel_for(channels: int, threads: int, batch: int, run: int, even: bool):
    """The compiled-on-demand kernel for this specialisation (kept per process)."""
    key = (channels, threads, batch, run, bool(even))
    if key not in _KERNELS:
        _KERNELS[key] = _make_box_pipelined(*key)
    return _KERNELS[key]


def box_pipelined(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None):
    """Box filter of a uint8 (H, W, C) device image with prefetched rows (see the
    module docstring); `geometry` from `kernels.box_plan.pipelined_plan`. Raises
    ValueError when the plan says the case is not handled.
    """
    height, width, channels = img.shape
    geo = geometry or pipelined_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_pipelined handles uint8 images with boxes of at most 257 rows")
    if out is None:
        out = cuda.device_array(img.shape, dtype=img.dtype)
    n = height * width * channels
    src, dst = img.reshape(n), out.reshape(n)
    kernel = kernel_for(channels, geo["threads"], geo["batch"], geo["run"], geo["even"])
    args = pipelined_args(img.shape, ksize, anchor, mode, cval, geo)
    kernel[geo["grid"], geo["threads"], 0, geo["smem"]](
        src, words(src), n // 4, *args, dst, words(dst)
    )
    return out
