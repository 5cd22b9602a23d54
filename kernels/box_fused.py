"""One-pass box filter for integer images: running sums in both directions, fused.

`box_fused(img, ksize, anchor, mode, cval, out)` has cv2.blur semantics on (H, W, C)
uint8 or uint16 device arrays (see `kernels.box`): out = round(box sum / area),
half to even, exact. It reads the image once and writes the output once; nothing
goes through a scratch image in global memory.

How: a block owns a tile of TILE_PX output pixels (all channels) of a strip of rows.
It walks down the strip ROWS rows at a time:
1. vertical: each (column, channel) lane of the tile plus its horizontal halo keeps
   its kh-row running sum in shared memory; a step adds the ROWS entering rows and
   subtracts the ROWS leaving ones (loads issued together, so one memory wait per
   step) and stores each row's column sums in shared memory;
2. horizontal: each thread slides RUN outputs of one channel of one row along those
   column sums (add the entering column, subtract the leaving one), divides exactly
   and stages the result;
3. the block writes the ROWS output rows of its tile, coalesced.
Per output pixel the work is a few adds whatever k is; the k-dependent parts are the
halo (kw - 1 columns per tile) and the first kh rows of each strip.

Lanes are (x, c) pairs flattened as x * C + c, so the image is handled as (H, W * C)
and channels never need splitting.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float64, int32, uint8, uint16, uint64

from .device import border_index
from .launch import SMEM_LIMIT, cdiv

ROWS = 8  # rows per step: 2 * ROWS loads in flight per lane
THREADS = 256
TILE_PX = 128  # output pixels per tile (all channels)
RUN = 16  # outputs one thread slides along in the horizontal pass
STRIP = 64  # output rows per block


@cuda.jit(device=True, inline=True)
def _lane_value(rows, y, lane, cval):
    """rows[y, lane] as int32, or the constant border value for a mapped y or lane < 0."""
    if y < 0 or lane < 0:
        return cval
    return int32(rows[uint64(y), uint64(lane)])


@cuda.jit(device=True, inline=True)
def _round_div(acc, area, inv_area):
    """round(acc / area), half to even, exactly, for 0 <= acc < 2**31."""
    q = int32(round(float64(acc) * inv_area))
    twice_r = 2 * (acc - q * area)  # estimate off by at most one: correct it
    if twice_r > area or (twice_r == area and q % 2 == 1):
        q += 1
    elif twice_r < -area or (twice_r == -area and q % 2 == 1):
        q -= 1
    return q


def _make_box_fused(out_type):
    stage_type = uint8 if np.dtype(out_type) == np.uint8 else uint16
    per_word = 4 // np.dtype(out_type).itemsize  # staged elements per int32 word

    @cuda.jit(cache=True)
    def box_fused_kernel(rows, kh, kw, ay, ax, mode, cval, channels, area, inv_area, strip, out):
        """rows/out: the (H, W, C) input/output viewed as (H, W * C); see module docs."""
        # Dynamic shared memory, int32 words: row_map | acc | sums (ROWS x n_in) |
        # staged results (ROWS x n_out, out_type) at the end.
        words = cuda.shared.array(0, dtype=int32)
        staged = cuda.shared.array(0, dtype=stage_type)
        height = rows.shape[0]
        width = rows.shape[1] // channels
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        x0 = cuda.blockIdx.x * TILE_PX
        y0 = cuda.blockIdx.y * strip
        y_end = min(y0 + strip, height)
        n_rows = y_end - y0
        n_px = min(TILE_PX, width - x0)
        n_in = (n_px + kw - 1) * channels  # lanes of the tile plus halo
        n_out = n_px * channels
        row_words = (TILE_PX + kw - 1) * channels
        map_len = n_rows + kh + ROWS
        acc_at = map_len
        sums_at = acc_at + row_words
        staged_at = (sums_at + ROWS * row_words) * per_word

        # Row map: entry i is the mapped input row y0 - 1 - ay + i (-1 = constant).
        for i in range(tid, map_len, nt):
            words[i] = border_index(y0 - 1 - ay + i, height, mode)
        cuda.syncthreads()
        # Column sums of the kh rows ending at y0 - 1 (the state before row y0).
        for li in range(tid, n_in, nt):
            p = li // channels
            xx = border_index(x0 - ax + p, width, mode)
            lane = xx * channels + (li - p * channels) if xx >= 0 else -1
            a = int32(0)
            for i in range(kh):
                a += _lane_value(rows, words[i], lane, cval)
            words[acc_at + li] = a

        for g in range(0, n_rows, ROWS):
            # 1. vertical: row y = y0 + g + r enters map[g + r + kh], leaves map[g + r].
            for li in range(tid, n_in, nt):
                p = li // channels
                xx = border_index(x0 - ax + p, width, mode)
                lane = xx * channels + (li - p * channels) if xx >= 0 else -1
                d = cuda.local.array(ROWS, int32)
                for r in range(ROWS):
                    d[r] = _lane_value(rows, words[g + r + kh], lane, cval) - _lane_value(
                        rows, words[g + r], lane, cval
                    )
                a = words[acc_at + li]
                at = uint64(sums_at + li)
                for r in range(ROWS):
                    a += d[r]
                    words[at] = a
                    at += uint64(row_words)
                words[acc_at + li] = a
            cuda.syncthreads()
            # 2. horizontal: unit u = (row r, segment s, channel c), channel fastest.
            n_seg = cdiv_dev(n_px, RUN)
            for u in range(tid, ROWS * n_seg * channels, nt):
                c = u % channels
                s = (u // channels) % n_seg
                r = u // (channels * n_seg)
                xs = s * RUN
                xe = min(xs + RUN, n_px)
                # Unsigned indices: Numba wraps negative signed ones, at a cost.
                uch = uint64(channels)
                leave = uint64(sums_at + r * row_words + xs * channels + c)
                a = int32(0)
                enter = leave
                for _ in range(kw):
                    a += words[enter]
                    enter += uch
                dst = uint64(staged_at + r * n_out + xs * channels + c)
                for x in range(xs, xe):
                    if x > xs:
                        a += words[enter] - words[leave]
                        enter += uch
                        leave += uch
                    staged[dst] = _round_div(a, area, inv_area)
                    dst += uch
            cuda.syncthreads()
            # 3. write the tile's rows out (the next step's vertical pass may overlap).
            out_base = uint64(x0 * channels)
            for r in range(min(ROWS, n_rows - g)):
                y = uint64(y0 + g + r)
                src = uint64(staged_at + r * n_out)
                for i in range(tid, n_out, nt):
                    out[y, out_base + uint64(i)] = staged[src + uint64(i)]

    return box_fused_kernel


@cuda.jit(device=True, inline=True)
def cdiv_dev(a, b):
    return (a + b - 1) // b


_KERNELS = {np.dtype(t): _make_box_fused(t) for t in (np.uint8, np.uint16)}


def _smem_bytes(height: int, kh: int, kw: int, channels: int, strip: int, itemsize: int) -> int:
    row_words = (TILE_PX + kw - 1) * channels
    words = min(strip, height) + kh + ROWS + row_words + ROWS * row_words
    return words * 4 + ROWS * TILE_PX * channels * itemsize


def supports(dtype, ksize: tuple[int, int], height: int, channels: int) -> bool:
    """Whether box_fused handles this case exactly within its shared memory."""
    kh, kw = ksize
    dt = np.dtype(dtype)
    if dt not in _KERNELS or kh * kw * np.iinfo(dt).max >= 2**31:
        return False
    return _smem_bytes(height, kh, kw, channels, STRIP, dt.itemsize) <= SMEM_LIMIT


def box_fused(img, ksize, anchor, mode, cval, out=None):
    """Box filter of an (H, W, C) uint8/uint16 device array in one pass; see module docs.

    `cval` is the constant-border value (an int in the dtype's range). Check
    `supports` first.
    """
    height, width, channels = img.shape
    kh, kw = ksize
    ay, ax = anchor
    if out is None:
        out = cuda.device_array(img.shape, dtype=img.dtype)
    strip = STRIP
    smem = _smem_bytes(height, kh, kw, channels, strip, img.dtype.itemsize)
    area = kh * kw
    grid = (cdiv(width, TILE_PX), cdiv(height, strip))
    _KERNELS[np.dtype(img.dtype)][grid, THREADS, 0, smem](
        img.reshape(height, width * channels),
        kh,
        kw,
        ay,
        ax,
        mode,
        int(cval),
        channels,
        area,
        1.0 / area,
        strip,
        out.reshape(height, width * channels),
    )
    return out
