"""Box filter (cv2.blur semantics) for uint8 images, strips staged through shared
memory: `box_strips`.

Same contract as `kernels.box_fused.box_fused` for uint8 (H, W, C) device images:
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.border_index`
code with `cval` for the constant border; exact. Made for large boxes, whose cost
should not grow with the box.

A block owns `tile_w` output pixels of a strip of `strip` rows. Its threads keep
vertical running sums of the tile's byte lanes plus the (kw - 1)-pixel halo, one
4-lane word per thread, two 16-bit lanes per 32-bit register (`_step`). They start
from the window of the row above the strip, then go down `chunk` rows at a time in
four phases between barriers:
1. Load: the chunk's entering and leaving input rows into shared memory, every
   thread's loads (eight at a time) issued before any is stored, so the block waits
   on memory once per chunk (box_fused and box_twopass wait once per row per thread,
   and were measured latency-bound). Inside the image each word is two aligned loads
   and a funnel shift; elsewhere bytes are gathered through the border mapping.
2. Vertical: each thread slides its word's sums down the chunk's rows and stores the
   16-bit column sums.
3. Horizontal: each item slides a window over `run` outputs of one channel of one row
   (add the entering column sum, subtract the leaving one), rounds each mean by a
   multiply-high (`kernels.box_plan.packed_magic`) and stages the byte.
4. Store: the staged rows go out coalesced, one byte per thread per store.
The costs that grow with the box are the first window of each strip (kh rows per
`strip`), of each run (kw column sums per `run` outputs) and the halo (kw - 1 pixels
per `tile_w`). The image must start on a 4-byte boundary (`kernels.box.box_choice`
sends other views to box_fused).
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda, int64, uint8, uint16, uint32, uint64

from .arrays import start_address
from .box_fused import _lane_column
from .box_packed import words
from .box_plan import packed_magic, strips_plan
from .box_tiled import _byte, _mean
from .device import border_index

SIMULATOR = bool(config.ENABLE_CUDASIM)
MASK = np.uint32(0x00FF00FF)
LOW16 = np.uint32(0xFFFF)
HIGH16 = np.uint32(0xFFFF0000)
EIGHT = np.uint32(8)
SIXTEEN = np.uint32(16)
TWENTY_FOUR = np.uint32(24)


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
    """Slide packed sums one row: lanes 0 and 2 of the word in acc_e, lanes 1 and 3 in
    acc_o, 16 bits each. A field's sum plus the entering byte stays below 2**16 (kh at
    most 256) and the leaving byte is part of the sum, so no field carries or borrows."""
    acc_e = uint32(acc_e + (enter & MASK) - (leave & MASK))
    acc_o = uint32(acc_o + ((enter >> EIGHT) & MASK) - ((leave >> EIGHT) & MASK))
    return acc_e, acc_o


@cuda.jit(device=True)
def _packed(acc_e, acc_o):
    """The four 16-bit lane sums in lane order, as one 64-bit word."""
    lo = uint32((acc_e & LOW16) | uint32(acc_o << SIXTEEN))
    hi = uint32((acc_e >> SIXTEEN) | (acc_o & HIGH16))
    return uint64(lo) | (uint64(hi) << uint64(32))


def _make_box_strips(channels: int, ksize: tuple, threads: int, run: int, tile_w: int,
                     strip: int, chunk: int):  # fmt: skip
    """The kernel for one specialisation: `channels`, the box (kh, kw) and the geometry
    of `kernels.box_plan.strips_plan`, all compile-time constants."""
    C = channels
    KH, KW = ksize
    T, RUN, TW, S, CH = threads, run, tile_w, strip, chunk
    AREA = KH * KW
    EVEN = AREA % 2 == 0
    magic, shift_hi = packed_magic(AREA)
    AREA_U, MAGIC_U, SHIFT_U = np.uint32(AREA), np.uint32(magic), np.uint32(shift_hi)
    NL = (TW + KW - 1) * C  # byte lanes of the tile and halo
    NQ = (NL + 3) // 4  # their words: one per thread of the vertical phase
    SLOTS = 2 * CH  # input rows staged per load phase
    N_LOAD = SLOTS * NQ
    LOAD_ITERS = (N_LOAD + T - 1) // T
    OUT_LANES = TW * C
    ROW_ITEMS = C * (TW // RUN)
    N_ITEMS = CH * ROW_ITEMS
    ITEM_ITERS = (N_ITEMS + T - 1) // T
    N_OUT = CH * OUT_LANES
    OUT_ITERS = (N_OUT + T - 1) // T
    # Shared memory, in bytes: SLOTS input rows of NQ words, CH rows of column sums
    # (4 NQ 16-bit lanes each), CH rows of staged output bytes.
    CS0 = 4 * N_LOAD
    OUT0 = CS0 + 8 * CH * NQ
    CS0_H, CS0_D = CS0 // 2, CS0 // 8  # the column sums' start in 16- and 64-bit units
    N_WINDOW = (KH + SLOTS - 1) // SLOTS  # load phases of the strip's first window
    bounds = {"launch_bounds": (T, 1)} if not SIMULATOR else {}

    @cuda.jit(device=True)
    def _wanted(s, na, nb):
        """Whether slot s holds a row of this load phase."""
        return s < na if s < CH else s - CH < nb

    @cuda.jit(device=True)
    def _inside_word(src32, k, a, na, b, nb, pitch, lane0):
        """Word k % NQ of the row in slot k // NQ; past the slots, or for a slot this
        phase does not fill, a word of row a (which exists)."""
        k = min(k, uint32(N_LOAD - 1))
        s = uint32(k // NQ)
        q = uint32(k - s * NQ)
        row = a
        if _wanted(s, na, nb):
            row = a + int64(s) if s < CH else b + int64(s - CH)
        return _word_at(src32, uint32(uint32(row * pitch) + lane0 + uint32(4 * q)))

    @cuda.jit(device=True)
    def _border_word(src8, k, a, na, b, nb, height, width, mode, cval, left):
        """Word k % NQ of the row in slot k // NQ, gathered byte by byte through the
        border mapping (0 past the slots and for slots this phase does not fill)."""
        s = uint32(k // NQ)
        q = uint32(k - s * NQ)
        if k >= N_LOAD or not _wanted(s, na, nb):
            return uint32(0)
        row = a + int64(s) if s < CH else b + int64(s - CH)
        yy = border_index(row, height, mode)
        ro = -1 if yy < 0 else yy * (width * C)
        lane = int64(4 * q)
        b0 = _byte(src8, ro, _lane_column(lane, NL, left, width, C, mode), cval)
        b1 = _byte(src8, ro, _lane_column(lane + 1, NL, left, width, C, mode), cval)
        b2 = _byte(src8, ro, _lane_column(lane + 2, NL, left, width, C, mode), cval)
        b3 = _byte(src8, ro, _lane_column(lane + 3, NL, left, width, C, mode), cval)
        return uint32(b0 | (b1 << EIGHT) | (b2 << SIXTEEN) | (b3 << TWENTY_FOUR))

    @cuda.jit(device=True)
    def _store8(in32, k0, na, nb, v0, v1, v2, v3, v4, v5, v6, v7):
        """Store the eight words loaded for k0, k0 + T, ... that belong to wanted slots."""
        _store1(in32, k0, na, nb, v0)
        _store1(in32, uint32(k0 + T), na, nb, v1)
        _store1(in32, uint32(k0 + 2 * T), na, nb, v2)
        _store1(in32, uint32(k0 + 3 * T), na, nb, v3)
        _store1(in32, uint32(k0 + 4 * T), na, nb, v4)
        _store1(in32, uint32(k0 + 5 * T), na, nb, v5)
        _store1(in32, uint32(k0 + 6 * T), na, nb, v6)
        _store1(in32, uint32(k0 + 7 * T), na, nb, v7)

    @cuda.jit(device=True)
    def _store1(in32, k, na, nb, v):
        if k < N_LOAD:
            s = uint32(k // NQ)
            if _wanted(s, na, nb):
                in32[k] = v

    @cuda.jit(device=True)
    def _load(in32, src8, src32, n_words, height, width, mode, cval, left, a, na, b, nb,
              inside):  # fmt: skip
        """Stage input rows a .. a + na - 1 in slots 0 .. na - 1 and rows b .. b + nb - 1
        in slots CH .. CH + nb - 1 (na, nb <= CH; with b = a + CH, 2 CH consecutive
        rows). `inside`: every row and word lies inside the image."""
        tid = uint32(cuda.threadIdx.x)
        pitch = width * C
        if inside:
            lane0 = uint32(left * C)
            for i in range(0, LOAD_ITERS, 8):
                k0 = uint32(tid + uint32(i * T))
                v0 = _inside_word(src32, k0, a, na, b, nb, pitch, lane0)
                v1 = _inside_word(src32, uint32(k0 + T), a, na, b, nb, pitch, lane0)
                v2 = _inside_word(src32, uint32(k0 + 2 * T), a, na, b, nb, pitch, lane0)
                v3 = _inside_word(src32, uint32(k0 + 3 * T), a, na, b, nb, pitch, lane0)
                v4 = _inside_word(src32, uint32(k0 + 4 * T), a, na, b, nb, pitch, lane0)
                v5 = _inside_word(src32, uint32(k0 + 5 * T), a, na, b, nb, pitch, lane0)
                v6 = _inside_word(src32, uint32(k0 + 6 * T), a, na, b, nb, pitch, lane0)
                v7 = _inside_word(src32, uint32(k0 + 7 * T), a, na, b, nb, pitch, lane0)
                _store8(in32, k0, na, nb, v0, v1, v2, v3, v4, v5, v6, v7)
        else:
            for i in range(0, LOAD_ITERS, 8):
                k0 = uint32(tid + uint32(i * T))
                v0 = _border_word(src8, k0, a, na, b, nb, height, width, mode, cval, left)
                v1 = _border_word(src8, uint32(k0 + T), a, na, b, nb, height, width, mode, cval,
                                  left)  # fmt: skip
                v2 = _border_word(src8, uint32(k0 + 2 * T), a, na, b, nb, height, width, mode,
                                  cval, left)  # fmt: skip
                v3 = _border_word(src8, uint32(k0 + 3 * T), a, na, b, nb, height, width, mode,
                                  cval, left)  # fmt: skip
                v4 = _border_word(src8, uint32(k0 + 4 * T), a, na, b, nb, height, width, mode,
                                  cval, left)  # fmt: skip
                v5 = _border_word(src8, uint32(k0 + 5 * T), a, na, b, nb, height, width, mode,
                                  cval, left)  # fmt: skip
                v6 = _border_word(src8, uint32(k0 + 6 * T), a, na, b, nb, height, width, mode,
                                  cval, left)  # fmt: skip
                v7 = _border_word(src8, uint32(k0 + 7 * T), a, na, b, nb, height, width, mode,
                                  cval, left)  # fmt: skip
                _store8(in32, k0, na, nb, v0, v1, v2, v3, v4, v5, v6, v7)

    @cuda.jit(device=True)
    def _rows_inside(a, n, height, width, n_words, left):
        """Whether rows a .. a + n - 1 (n >= 1) of the tile's words lie inside the image."""
        pitch = width * C
        last = (a + n - 1) * pitch + left * C + 4 * NQ  # one past the last byte read
        return (
            a >= 0 and a + n <= height and left >= 0 and left * C + NL <= pitch
            and last // 4 + 1 <= n_words
        )  # fmt: skip

    @cuda.jit(cache=True, **bounds)
    def box_strips(src8, src32, n_words, height, width, ay, ax, mode, cval, out8):
        """src8/out8: the image and output as flat bytes; src32: the image's whole
        32-bit words (n_words of them)."""
        in32 = cuda.shared.array(0, dtype=uint32)
        cs16 = cuda.shared.array(0, dtype=uint16)
        cs64 = cuda.shared.array(0, dtype=uint64)
        s8 = cuda.shared.array(0, dtype=uint8)
        tid = uint32(cuda.threadIdx.x)
        pitch = width * C
        x0 = cuda.blockIdx.x * TW
        left = x0 - ax
        y0 = cuda.blockIdx.y * S
        y_end = min(y0 + S, height)
        out_lanes = uint32(min(TW, width - x0) * C)

        # The window of the row above the strip: rows y0 - ay - 1 .. y0 - ay + kh - 2.
        acc_e = uint32(0)
        acc_o = uint32(0)
        first = y0 - ay - 1
        for w in range(N_WINDOW):
            a = first + w * SLOTS
            n = min(SLOTS, KH - w * SLOTS)
            na = min(n, CH)
            nb = n - na
            inside = _rows_inside(a, n, height, width, n_words, left)
            _load(in32, src8, src32, n_words, height, width, mode, cval, left, a, na,
                  a + CH, nb, inside)  # fmt: skip
            cuda.syncthreads()
            if tid < NQ:
                for s in range(SLOTS):
                    if s < n:
                        v = in32[uint32(s * NQ) + tid]
                        acc_e = uint32(acc_e + (v & MASK))
                        acc_o = uint32(acc_o + ((v >> EIGHT) & MASK))
            cuda.syncthreads()

        y = y0
        while y < y_end:
            n = min(CH, y_end - y)
            enter = y - ay + KH - 1
            leave = y - ay - 1
            inside = _rows_inside(leave, n + KH, height, width, n_words, left)
            # 1. Load the entering rows into slots 0.., the leaving rows into CH...
            _load(in32, src8, src32, n_words, height, width, mode, cval, left, enter, n,
                  leave, n, inside)  # fmt: skip
            cuda.syncthreads()
            # 2. Vertical: slide down the chunk, storing 16-bit column sums.
            if tid < NQ:
                for i in range(CH):
                    if i < n:
                        e = in32[uint32(i * NQ) + tid]
                        lv = in32[uint32((CH + i) * NQ) + tid]
                        acc_e, acc_o = _step(acc_e, acc_o, e, lv)
                        cs64[uint32(CS0_D + i * NQ) + tid] = _packed(acc_e, acc_o)
            cuda.syncthreads()
            # 3. Horizontal: item (row, run, channel) slides over `run` outputs.
            for it in range(ITEM_ITERS):
                item = uint32(tid + uint32(it * T))
                if item < N_ITEMS:
                    i = uint32(item // ROW_ITEMS)
                    rest = uint32(item - i * ROW_ITEMS)
                    r = uint32(rest // C)
                    c = uint32(rest - r * C)
                    if i < n:
                        start = uint32(CS0_H + i * (4 * NQ) + r * (RUN * C) + c)
                        acc = uint32(0)
                        for j in range(KW):
                            acc = uint32(acc + cs16[uint32(start + j * C)])
                        dst = uint32(OUT0 + i * OUT_LANES + r * (RUN * C) + c)
                        s8[dst] = _mean(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                        for j in range(1, RUN):
                            e16 = cs16[uint32(start + (j + KW - 1) * C)]
                            l16 = cs16[uint32(start + (j - 1) * C)]
                            acc = uint32(acc + e16 - l16)
                            s8[uint32(dst + j * C)] = _mean(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
            cuda.syncthreads()
            # 4. Store the chunk's rows, consecutive threads on consecutive bytes.
            for it in range(OUT_ITERS):
                k = uint32(tid + uint32(it * T))
                if k < N_OUT:
                    i = uint32(k // OUT_LANES)
                    lane = uint32(k - i * OUT_LANES)
                    if i < n and lane < out_lanes:
                        dst = uint32(uint32((y + int64(i)) * pitch) + uint32(x0 * C) + lane)
                        out8[dst] = s8[uint32(OUT0 + k)]
            y += CH

    return box_strips


_KERNELS: dict = {}


def kernel_for(channels: int, ksize: tuple, geo: dict):
    """The compiled-on-demand kernel for this specialisation (kept per process)."""
    key = (channels, tuple(ksize), geo["threads"], geo["run"], geo["tile_w"], geo["strip"],
           geo["chunk"])  # fmt: skip
    if key not in _KERNELS:
        _KERNELS[key] = _make_box_strips(*key)
    return _KERNELS[key]



def box_strips(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None):
    """Box filter of a uint8 (H, W, C) device image (see the module docstring);
    `geometry` from `kernels.box_plan.strips_plan`. Raises ValueError when the plan
    says the case is not handled or the image is not on a 4-byte boundary."""
    height, width, channels = img.shape
    geo = geometry or strips_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_strips handles uint8 images with boxes of at most 256 rows")
    if start_address(img) % 4:
        raise ValueError("box_strips reads 32-bit words: the image must start on a word")
    if out is None:
        out = cuda.device_array(img.shape, dtype=img.dtype)
    n = height * width * channels
    kernel = kernel_for(channels, tuple(ksize), geo)
    src8 = img.reshape(n)
    args = (src8, words(src8), n // 4, height, width, anchor[0], anchor[1], mode, int(cval),
            out.reshape(n))  # fmt: skip
    kernel[geo["grid"], geo["threads"], 0, geo["smem"]](*args)
    return out
