"""Box filter (cv2.blur semantics) for uint8 images in two sliding passes: `box_twopass`.

Same contract as `kernels.box_fused.box_fused` for uint8 (H, W, C) device images:
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.border_index`
code with `cval` for the constant border; exact. Made for large boxes, where every
2-D tile (`kernels.box_tiled`) re-reads a halo as large as itself.

1. Columns (`box_columns`): one thread per byte lane (pixel column and channel) of a
   strip of `strip` rows sums the kh input rows of the strip's first output row, then
   slides down: add the entering row, subtract the leaving one. The sums go to a
   16-bit scratch image of the input's shape (kh * 255 < 2**16: exact). Strips whose
   rows all lie inside the image read without border logic, eight rows of loads
   issued before any is used; consecutive threads read consecutive bytes.
2. Rows (`box_rows`): a block owns `tile_w` output pixels of `rows` rows. It stages the
   column sums of its tile and (kw - 1)-pixel halo in shared memory (border-mapped
   columns at the image's left and right; a constant-border column sums to kh * cval),
   then each thread slides a window over `run` outputs of one channel of one row (add
   the entering column sum, subtract the leaving one), rounds each mean by a
   multiply-high (`kernels.box_plan.packed_magic`) and stages the byte; the block
   writes its rows out coalesced. With run = 1 (mod 32) the 32 threads of a warp read
   32 different banks.
The only costs that grow with the box are each strip's first window (kh rows per
`strip` rows), each run's first window (kw column sums per `run` outputs) and the
halo (kw - 1 pixels per `tile_w`); the price is the scratch image, written once and
read once (2 bytes per input byte each way).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint8, uint32, uint64

from .arrays import start_address
from .box_packed import words
from .box_plan import packed_magic, twopass_plan
from .box_tiled import _mean
from .device import border_index
from .launch import scratch


MASK = np.uint32(0x00FF00FF)
LOW16 = np.uint32(0xFFFF)
HIGH16 = np.uint32(0xFFFF0000)


@cuda.jit(device=True)
def _word_at(src32, a):
    """The 4 image bytes at byte offset `a` (any alignment) as a little-endian word:
    two aligned loads and a funnel shift."""
    wi = uint32(a >> 2)
    lo = uint64(src32[wi])
    hi = uint64(src32[uint32(wi + 1)])
    return uint32(((hi << uint64(32)) | lo) >> uint64(uint32(a & 3) * uint32(8)))


@cuda.jit(device=True)
def _step(acc_e, acc_o, enter, leave):
    """Slide the packed sums one row: lanes 0 and 2 of the word in acc_e, 1 and 3 in
    acc_o, 16 bits each. Each field's (sum + entering byte) stays below 2**16 (at most
    257 * 255) and the leaving byte is part of the sum, so no field carries or borrows."""
    acc_e = uint32(acc_e + (enter & MASK) - (leave & MASK))
    acc_o = uint32(acc_o + ((enter >> uint32(8)) & MASK) - ((leave >> uint32(8)) & MASK))
    return acc_e, acc_o


@cuda.jit(device=True)
def _packed(acc_e, acc_o):
    """The four 16-bit lane sums in lane order, as one 64-bit word."""
    lo = uint32((acc_e & LOW16) | uint32(acc_o << uint32(16)))
    hi = uint32((acc_e >> uint32(16)) | (acc_o & HIGH16))
    return uint64(lo) | (uint64(hi) << uint64(32))


@cuda.jit(device=True)
def _row_byte(src8, r, height, mode, pitch, lane, cval):
    """Byte `lane` of (border-mapped) row r, or cval for the constant border."""
    yy = border_index(r, height, mode)
    if yy < 0:
        return uint32(cval)
    return uint32(src8[uint32(yy * pitch + lane)])


def _make_columns(kh: int, strip: int):
    """Pass 1 for boxes of kh rows and strips of `strip` rows (compile-time constants)."""
    KH, S = kh, strip
    KH8 = KH // 8 * 8  # rows of the first window summed eight at a time

    @cuda.jit(cache=True)
    def box_columns(src8, src32, n_words, height, pitch, spitch, ay, mode, cval, sums16,
                    sums64):  # fmt: skip
        """src8: the (H, W, C) image as flat bytes, src32 its whole 32-bit words; sums16:
        (H * spitch,) uint16 with spitch = pitch rounded up to 4, sums64 the same memory
        as uint64. sums16[y * spitch + lane] = the sum of rows y - ay .. y - ay + kh - 1
        of byte lane `lane` of a row. Thread q owns lanes 4q .. 4q + 3."""
        q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if 4 * q >= pitch:
            return
        y0 = cuda.blockIdx.y * S
        y_end = min(y0 + S, height)
        top = y0 - ay
        p = uint32(pitch)
        last = y_end - ay + KH - 2  # the last row the strip reads
        fast = top >= 0 and last < height and (last * pitch + 4 * q) // 4 + 2 <= n_words
        if fast:  # every row read lies inside: whole words, eight rows at a time
            leave = uint32(uint32(top) * p + uint32(4 * q))
            enter = leave
            acc_e = uint32(0)
            acc_o = uint32(0)
            for _ in range(KH8 // 8):
                w0 = _word_at(src32, enter)
                w1 = _word_at(src32, uint32(enter + p))
                w2 = _word_at(src32, uint32(enter + 2 * p))
                w3 = _word_at(src32, uint32(enter + 3 * p))
                w4 = _word_at(src32, uint32(enter + 4 * p))
                w5 = _word_at(src32, uint32(enter + 5 * p))
                w6 = _word_at(src32, uint32(enter + 6 * p))
                w7 = _word_at(src32, uint32(enter + 7 * p))
                acc_e = uint32(acc_e + (w0 & MASK) + (w1 & MASK) + (w2 & MASK) + (w3 & MASK)
                               + (w4 & MASK) + (w5 & MASK) + (w6 & MASK) + (w7 & MASK))
                w0, w1, w2, w3 = w0 >> uint32(8), w1 >> uint32(8), w2 >> uint32(8), w3 >> uint32(8)
                w4, w5, w6, w7 = w4 >> uint32(8), w5 >> uint32(8), w6 >> uint32(8), w7 >> uint32(8)
                acc_o = uint32(acc_o + (w0 & MASK) + (w1 & MASK) + (w2 & MASK) + (w3 & MASK)
                               + (w4 & MASK) + (w5 & MASK) + (w6 & MASK) + (w7 & MASK))
                enter = uint32(enter + 8 * p)
            for _ in range(KH - KH8):
                w = _word_at(src32, enter)
                acc_e = uint32(acc_e + (w & MASK))
                acc_o = uint32(acc_o + ((w >> uint32(8)) & MASK))
                enter = uint32(enter + p)
            qs = uint32(spitch // 4)
            dst = uint32(uint32(y0) * qs + uint32(q))
            sums64[dst] = _packed(acc_e, acc_o)
            # `enter` is now the row entering at y0 + 1, `leave` the row leaving there.
            y = y0 + 1
            while y + 4 <= y_end:
                e0 = _word_at(src32, enter)
                e1 = _word_at(src32, uint32(enter + p))
                e2 = _word_at(src32, uint32(enter + 2 * p))
                e3 = _word_at(src32, uint32(enter + 3 * p))
                l0 = _word_at(src32, leave)
                l1 = _word_at(src32, uint32(leave + p))
                l2 = _word_at(src32, uint32(leave + 2 * p))
                l3 = _word_at(src32, uint32(leave + 3 * p))
                acc_e, acc_o = _step(acc_e, acc_o, e0, l0)
                sums64[uint32(dst + qs)] = _packed(acc_e, acc_o)
                acc_e, acc_o = _step(acc_e, acc_o, e1, l1)
                sums64[uint32(dst + 2 * qs)] = _packed(acc_e, acc_o)
                acc_e, acc_o = _step(acc_e, acc_o, e2, l2)
                sums64[uint32(dst + 3 * qs)] = _packed(acc_e, acc_o)
                acc_e, acc_o = _step(acc_e, acc_o, e3, l3)
                dst = uint32(dst + 4 * qs)
                sums64[dst] = _packed(acc_e, acc_o)
                enter = uint32(enter + 4 * p)
                leave = uint32(leave + 4 * p)
                y += 4
            while y < y_end:
                acc_e, acc_o = _step(acc_e, acc_o, _word_at(src32, enter), _word_at(src32, leave))
                dst = uint32(dst + qs)
                sums64[dst] = _packed(acc_e, acc_o)
                enter = uint32(enter + p)
                leave = uint32(leave + p)
                y += 1
        else:  # rows mapped through the border, or the image's last bytes: lane by lane
            for j in range(4):
                lane = 4 * q + j
                if lane < pitch:
                    acc = uint32(0)
                    for i in range(KH):
                        acc = uint32(acc + _row_byte(src8, top + i, height, mode, pitch, lane,
                                                     cval))  # fmt: skip
                    dst = uint32(uint32(y0) * uint32(spitch) + uint32(lane))
                    sums16[dst] = acc
                    for y in range(y0 + 1, y_end):
                        enter = _row_byte(src8, y - ay + KH - 1, height, mode, pitch, lane, cval)
                        leave = _row_byte(src8, y - ay - 1, height, mode, pitch, lane, cval)
                        acc = uint32(acc + enter - leave)
                        dst = uint32(dst + uint32(spitch))
                        sums16[dst] = acc

    return box_columns


def _make_rows(channels: int, ksize: tuple, threads: int, run: int, tile_w: int, rows: int):
    """Pass 2 for one specialisation: `channels`, the box (kh, kw) and the geometry of
    `kernels.box_plan.twopass_plan` (threads, run, tile_w a multiple of run, rows per
    block), all compile-time constants."""
    C = channels
    KH, KW = ksize
    T, RUN, TW, R = threads, run, tile_w, rows
    AREA = KH * KW
    EVEN = AREA % 2 == 0
    magic, shift_hi = packed_magic(AREA)
    AREA_U, MAGIC_U, SHIFT_U = np.uint32(AREA), np.uint32(magic), np.uint32(shift_hi)
    IN_LANES = (TW + KW - 1) * C  # column sums staged per row
    OUT_LANES = TW * C
    ROW_ITEMS = C * (TW // RUN)  # (run, channel) slides per row
    N_IN, N_OUT, N_ITEMS = R * IN_LANES, R * OUT_LANES, R * ROW_ITEMS
    STAGE = 4 * N_IN  # byte offset of the staged means, after the column sums
    LOAD_ITERS = -(-N_IN // T)
    ITEM_ITERS = -(-N_ITEMS // T)
    OUT_ITERS = -(-N_OUT // T)

    @cuda.jit(device=True)
    def _staged(sums, k, y0, height, spitch, left):
        """Column sum k of the block's staging order (row k // IN_LANES of the block,
        lane k % IN_LANES of its tile); k past the end reads the last one."""
        k = min(k, uint32(N_IN - 1))
        rr = uint32(k // IN_LANES)
        lane = uint32(k - rr * IN_LANES)
        row = uint32(min(y0 + rr, height - 1))
        return sums[uint32(row * uint32(spitch) + uint32(left * C) + lane)]

    @cuda.jit(device=True)
    def _stage(s32, k0, v0, v1, v2, v3, v4, v5, v6, v7):
        """Store eight staged column sums, T apart from k0, that exist."""
        if k0 < N_IN:
            s32[k0] = v0
        if k0 + T < N_IN:
            s32[uint32(k0 + T)] = v1
        if k0 + 2 * T < N_IN:
            s32[uint32(k0 + 2 * T)] = v2
        if k0 + 3 * T < N_IN:
            s32[uint32(k0 + 3 * T)] = v3
        if k0 + 4 * T < N_IN:
            s32[uint32(k0 + 4 * T)] = v4
        if k0 + 5 * T < N_IN:
            s32[uint32(k0 + 5 * T)] = v5
        if k0 + 6 * T < N_IN:
            s32[uint32(k0 + 6 * T)] = v6
        if k0 + 7 * T < N_IN:
            s32[uint32(k0 + 7 * T)] = v7

    @cuda.jit(cache=True)
    def box_rows(sums, height, width, spitch, ax, mode, col_cval, out8):
        """sums: pass 1's column sums, rows of spitch lanes; out8: the (H, W, C) output as flat bytes;
        col_cval: kh * cval, the column sum of the constant border."""
        s32 = cuda.shared.array(0, dtype=uint32)
        s8 = cuda.shared.array(0, dtype=uint8)
        tid = uint32(cuda.threadIdx.x)
        pitch = uint32(width * C)
        x0 = cuda.blockIdx.x * TW
        left = x0 - ax
        interior = left >= 0 and left + TW + KW - 1 <= width
        out_lanes = uint32(min(TW, width - x0) * C)
        first_lane = uint32(x0 * C)
        y0 = cuda.blockIdx.y * R
        while y0 < height:
            # 1. Column sums of the tile and halo, R rows (rows past the image repeat
            # its last row: computed, never stored). Inside the image, eight loads per
            # thread are issued before any is stored.
            if interior:
                for i in range(0, LOAD_ITERS, 8):
                    k0 = uint32(tid + uint32(i * T))
                    v0 = _staged(sums, k0, y0, height, spitch, left)
                    v1 = _staged(sums, uint32(k0 + T), y0, height, spitch, left)
                    v2 = _staged(sums, uint32(k0 + 2 * T), y0, height, spitch, left)
                    v3 = _staged(sums, uint32(k0 + 3 * T), y0, height, spitch, left)
                    v4 = _staged(sums, uint32(k0 + 4 * T), y0, height, spitch, left)
                    v5 = _staged(sums, uint32(k0 + 5 * T), y0, height, spitch, left)
                    v6 = _staged(sums, uint32(k0 + 6 * T), y0, height, spitch, left)
                    v7 = _staged(sums, uint32(k0 + 7 * T), y0, height, spitch, left)
                    _stage(s32, k0, v0, v1, v2, v3, v4, v5, v6, v7)
            else:
                for i in range(LOAD_ITERS):
                    k = uint32(tid + uint32(i * T))
                    if k < N_IN:
                        rr = uint32(k // IN_LANES)
                        lane = uint32(k - rr * IN_LANES)
                        base = uint32(uint32(min(y0 + rr, height - 1)) * uint32(spitch))
                        px = uint32(lane // C)
                        xx = border_index(left + int64(px), width, mode)
                        if xx < 0:
                            s32[k] = col_cval
                        else:
                            s32[k] = sums[uint32(base + uint32(xx * C) + lane - px * C)]
            cuda.syncthreads()
            # 2. Slides: item (rr, run, c) covers `run` outputs of channel c of row rr.
            for i in range(ITEM_ITERS):
                item = uint32(tid + uint32(i * T))
                if item < N_ITEMS:
                    rr = uint32(item // ROW_ITEMS)
                    rest = uint32(item - rr * ROW_ITEMS)
                    r = uint32(rest // C)
                    c = uint32(rest - r * C)
                    first = uint32(rr * IN_LANES + r * (RUN * C) + c)
                    acc = uint32(0)
                    for j in range(KW):
                        acc = uint32(acc + s32[uint32(first + j * C)])
                    dst = uint32(STAGE + rr * OUT_LANES + r * (RUN * C) + c)
                    s8[dst] = _mean(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                    for j in range(1, RUN):
                        enter = s32[uint32(first + (j + KW - 1) * C)]
                        leave = s32[uint32(first + (j - 1) * C)]
                        acc = uint32(acc + enter - leave)
                        s8[uint32(dst + j * C)] = _mean(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
            cuda.syncthreads()
            # 3. The staged rows out, consecutive threads on consecutive bytes.
            for i in range(OUT_ITERS):
                k = uint32(tid + uint32(i * T))
                if k < N_OUT:
                    rr = uint32(k // OUT_LANES)
                    lane = uint32(k - rr * OUT_LANES)
                    y = y0 + rr
                    if lane < out_lanes and y < height:
                        out8[uint32(uint32(y) * pitch + first_lane + lane)] = s8[STAGE + k]
            cuda.syncthreads()
            y0 += cuda.gridDim.y * R

    return box_rows


_COLUMNS: dict = {}
_ROWS: dict = {}


def kernels_for(channels: int, ksize: tuple, geo: dict):
    """(box_columns, box_rows) compiled on demand for this specialisation (kept per
    process)."""
    ckey = (ksize[0], geo["strip"])
    if ckey not in _COLUMNS:
        _COLUMNS[ckey] = _make_columns(*ckey)
    rkey = (channels, tuple(ksize), geo["threads"], geo["run"], geo["tile_w"], geo["rows"])
    if rkey not in _ROWS:
        _ROWS[rkey] = _make_rows(*rkey)
    return _COLUMNS[ckey], _ROWS[rkey]


def box_twopass(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None):
    """Box filter of a uint8 (H, W, C) device image by a column pass and a row pass
    (see the module docstring); `geometry` from `kernels.box_plan.twopass_plan`. Raises
    ValueError when the plan says the case is not handled."""
    height, width, channels = img.shape
    geo = geometry or twopass_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_twopass handles uint8 images with boxes of at most 257 rows")
    if start_address(img) % 4:
        raise ValueError("box_twopass reads 32-bit words: the image must start on a 4-byte boundary")
    if out is None:
        out = cuda.device_array(img.shape, dtype=img.dtype)
    n = height * width * channels
    pitch = width * channels
    spitch = -(-pitch // 4) * 4  # rows of whole 64-bit words of column sums
    sums = scratch((height * spitch,), np.uint16)
    columns, rows = kernels_for(channels, tuple(ksize), geo)
    ay, ax = anchor
    src8 = img.reshape(n)
    columns[geo["columns_grid"], geo["columns_threads"]](
        src8, words(src8), n // 4, height, pitch, spitch, ay, mode, int(cval), sums,
        sums.view(np.uint64),
    )  # fmt: skip
    rows[geo["grid"], geo["threads"], 0, geo["smem"]](
        sums, height, width, spitch, ax, mode, ksize[0] * int(cval), out.reshape(n)
    )
    return out

