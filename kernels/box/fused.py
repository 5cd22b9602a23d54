"""Box filter (cv2.blur semantics) for integer images in one pass: `box_fused`.

Same contract as `kernels.box.running.box_running`: (H, W, C) uint8 or uint16 device images,
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.common.border_index`
code with `cval` for the constant border. Exact: sums are integers.

A block owns `tile_w` output pixels of a strip of `strip` rows. Its threads keep
vertical running sums for the tile's columns plus the horizontal halo, viewed as
byte lanes of the (H, W * C) image (so consecutive threads read consecutive bytes),
LANES lanes per thread in registers. Every `batch` rows the block stores those sums
in shared memory; then each thread slides a horizontal window over `run` outputs
of one channel (add the entering column sum, subtract the leaving one) and stages
the rounded means, which the block writes out coalesced. The input is read once
from DRAM (halo re-reads and the leaving row hit the caches), there is no scratch
image, and the work per output barely depends on the box size.

Blocks whose window lies inside the image read without border logic, four rows at a
time for the first sums and two at a time while sliding, every load issued before
its use. Geometry: `kernels.box.plan` (Numba-free, shared with the quick start).

This module holds the kernel (`fused_kernel`, a `kernel_factory`) and imports Numba;
`box_fused`, the launch, is in `kernels.box.launch`, which names the kernel by
`kernels.common.refs.KernelRef` so that a shipped one runs without importing Numba.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, uint16, uint32, uint64

from ..common.device import border_index
from ..common.refs import kernel_factory
from .lanes import lane_column

_SUM_TYPES = {"uint16": uint16, "int32": int32}  # the shared-memory sums' Numba types


@cuda.jit(device=True)
def _row_offset(p, height, mode, pitch):
    """Offset of (border-mapped) row p in the flat image, or -1 for the constant border."""
    yy = border_index(p, height, mode)
    if yy < 0:
        return -1
    return yy * pitch


@cuda.jit(device=True)
def _tap(src, row_off, col, cval):
    if row_off < 0 or col < 0:
        return cval
    return cval - cval + src[uint64(row_off + col)]


@cuda.jit(device=True)
def _mean_exact(acc, area, magic, shift, even, inv_area):
    """round(acc / area) half to even, exactly, for 0 <= acc < 2**31 and a mean < 2**16."""
    q = int32(float32(acc) * inv_area)  # off by at most one: corrected below
    r = acc - q * area
    if r < 0:
        q -= 1
        r += area
    elif r >= area:
        q += 1
        r -= area
    twice = 2 * r
    if twice > area or (twice == area and (q & 1) == 1):
        q += 1
    return q


@cuda.jit(device=True)
def _mean_magic(acc, area, magic, shift, even, inv_area):
    """round(acc / area) half to even for 2 * acc + area < 2**box_plan.MAGIC_BITS, in 32-bit steps.

    round(acc / area) rounded half up is floor(t / (2 * area)) with t = 2 * acc + area;
    that floor is a multiply-high by `magic` (see `kernels.box.plan.magic`). A tie (t a multiple of
    2 * area, possible only for an even area) rounds down to the even neighbour.
    """
    t = uint32(2 * acc + area)
    q = uint32((uint64(t) * uint64(magic)) >> uint64(shift))
    if even and uint32(t - q * uint32(2 * area)) == 0:
        q -= q & 1
    return q


@cuda.jit(device=True)
def _four_rows(src, off, pitch, u0, u1, u2, u3):
    """Per lane, the sum of four consecutive rows starting at row offset `off` (inside)."""
    o1 = off + pitch
    o2 = o1 + pitch
    o3 = o2 + pitch
    a0, a1, a2, a3 = src[off + u0], src[off + u1], src[off + u2], src[off + u3]
    b0, b1, b2, b3 = src[o1 + u0], src[o1 + u1], src[o1 + u2], src[o1 + u3]
    c0, c1, c2, c3 = src[o2 + u0], src[o2 + u1], src[o2 + u2], src[o2 + u3]
    d0, d1, d2, d3 = src[o3 + u0], src[o3 + u1], src[o3 + u2], src[o3 + u3]
    return (
        int32(a0) + int32(b0) + int32(c0) + int32(d0),
        int32(a1) + int32(b1) + int32(c1) + int32(d1),
        int32(a2) + int32(b2) + int32(c2) + int32(d2),
        int32(a3) + int32(b3) + int32(c3) + int32(d3),
    )


@cuda.jit(device=True)
def _two_steps(src, enter, leave, pitch, u0, u1, u2, u3):
    """Per lane, (entering - leaving) for the next two rows of an inside strip, where
    `enter` and `leave` are the offsets of the rows that entered and leave last."""
    e1 = enter + pitch
    e2 = e1 + pitch
    l2 = leave + pitch
    p0, p1, p2, p3 = src[e1 + u0], src[e1 + u1], src[e1 + u2], src[e1 + u3]
    q0, q1, q2, q3 = src[leave + u0], src[leave + u1], src[leave + u2], src[leave + u3]
    r0, r1, r2, r3 = src[e2 + u0], src[e2 + u1], src[e2 + u2], src[e2 + u3]
    t0, t1, t2, t3 = src[l2 + u0], src[l2 + u1], src[l2 + u2], src[l2 + u3]
    return (
        int32(p0) - int32(q0), int32(p1) - int32(q1), int32(p2) - int32(q2),
        int32(p3) - int32(q3), int32(r0) - int32(t0), int32(r1) - int32(t1),
        int32(r2) - int32(t2), int32(r3) - int32(t3),
    )  # fmt: skip


@cuda.jit(device=True)
def _store(smem, row, tid, nthreads, n_lanes, v0, v1, v2, v3):
    """Store a thread's four lane sums into the shared row starting at `row`."""
    base = uint32(row + tid)
    if tid < n_lanes:
        smem[base] = v0
    if tid + nthreads < n_lanes:
        smem[base + uint32(nthreads)] = v1
    if tid + 2 * nthreads < n_lanes:
        smem[base + uint32(2 * nthreads)] = v2
    if tid + 3 * nthreads < n_lanes:
        smem[base + uint32(3 * nthreads)] = v3


@cuda.jit(device=True)
def _cdiv(a, b):
    return (a + b - 1) // b


@kernel_factory
def fused_kernel(sum_dtype, channels: int, magic_rounding: bool):
    """The kernel for `channels` channels, shared-memory sums of `sum_dtype` (a NumPy
    dtype, or its name: uint16 where exact, else int32; ValueError for any other),
    rounding by multiply-high where the sums are small enough (`magic_rounding`).
    One kernel per distinct arguments (`kernel_factory`)."""
    sum_type = _SUM_TYPES.get(np.dtype(sum_dtype).name)
    if sum_type is None:
        raise ValueError(f"box_fused sums in uint16 or int32, not {np.dtype(sum_dtype).name}")
    C = channels  # a compile-time constant: divisions by it become multiplies
    mean = _mean_magic if magic_rounding else _mean_exact

    @cuda.jit(cache=True)
    def box_fused(src, height, width, kh, kw, ay, ax, mode, cval, area, magic, shift, even,
                  inv_area, tile_w, run, strip, batch, out):  # fmt: skip
        """src, out: the (H, W, C) images flattened to (H * W * C,)."""
        smem = cuda.shared.array(0, dtype=sum_type)
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        pitch = width * C
        x0 = cuda.blockIdx.x * tile_w
        out_w = min(tile_w, width - x0)
        n_lanes = (out_w + kw - 1) * C
        out_lanes = out_w * C
        stage0 = batch * (tile_w + kw - 1) * C  # staged means follow the sums
        left = x0 - ax
        col0 = lane_column(tid, n_lanes, left, width, C, mode)
        col1 = lane_column(tid + nthreads, n_lanes, left, width, C, mode)
        col2 = lane_column(tid + 2 * nthreads, n_lanes, left, width, C, mode)
        col3 = lane_column(tid + 3 * nthreads, n_lanes, left, width, C, mode)

        y0 = cuda.blockIdx.y * strip
        y_end = min(y0 + strip, height)
        # Blocks whose window lies inside the image read without any border logic;
        # their unused lanes (col -1) read column 0 and never store it.
        inside = (
            y0 - ay >= 0 and y_end + kh - 1 - ay <= height and left >= 0 and left + (
                n_lanes // C) <= width
        )  # fmt: skip
        u0 = uint64(max(col0, 0))
        u1 = uint64(max(col1, 0))
        u2 = uint64(max(col2, 0))
        u3 = uint64(max(col3, 0))
        zero = cval - cval
        v0, v1, v2, v3 = zero, zero, zero, zero
        i = 0
        if inside:  # four rows at a time, all sixteen loads issued first
            off = uint64((y0 - ay) * pitch)
            while i + 3 < kh:
                s0, s1, s2, s3 = _four_rows(src, off, uint64(pitch), u0, u1, u2, u3)
                v0 += s0
                v1 += s1
                v2 += s2
                v3 += s3
                off += uint64(4 * pitch)
                i += 4
        for r in range(i, kh):
            off = _row_offset(y0 - ay + r, height, mode, pitch)
            v0 += _tap(src, off, col0, cval)
            v1 += _tap(src, off, col1, cval)
            v2 += _tap(src, off, col2, cval)
            v3 += _tap(src, off, col3, cval)
        enter = uint64(max(y0 - ay + kh - 1, 0) * pitch)  # the row entering at y0 + 1
        leave = uint64(max(y0 - ay, 0) * pitch)  # the row leaving at y0 + 1

        nruns = _cdiv(out_w, run)
        per_row = uint32(C * nruns)
        yb = y0
        while yb < y_end:
            rows = min(batch, y_end - yb)
            # Vertical: column sums of rows yb .. yb + rows - 1 into shared memory.
            g = 0
            if yb == y0:  # the strip's first row: sums already complete
                _store(smem, g * n_lanes, tid, nthreads, n_lanes, v0, v1, v2, v3)
                g = 1
            if inside:  # two rows at a time, all sixteen loads issued first
                while g + 1 < rows:
                    a0, a1, a2, a3, b0, b1, b2, b3 = _two_steps(
                        src, enter, leave, uint64(pitch), u0, u1, u2, u3
                    )
                    v0, v1, v2, v3 = v0 + a0, v1 + a1, v2 + a2, v3 + a3
                    _store(smem, g * n_lanes, tid, nthreads, n_lanes, v0, v1, v2, v3)
                    v0, v1, v2, v3 = v0 + b0, v1 + b1, v2 + b2, v3 + b3
                    _store(smem, (g + 1) * n_lanes, tid, nthreads, n_lanes, v0, v1, v2, v3)
                    enter += uint64(2 * pitch)
                    leave += uint64(2 * pitch)
                    g += 2
            for h in range(g, rows):
                y = yb + h
                if inside:
                    enter += uint64(pitch)
                    v0 += src[enter + u0]
                    v0 -= src[leave + u0]
                    v1 += src[enter + u1]
                    v1 -= src[leave + u1]
                    v2 += src[enter + u2]
                    v2 -= src[leave + u2]
                    v3 += src[enter + u3]
                    v3 -= src[leave + u3]
                    leave += uint64(pitch)
                else:
                    e = _row_offset(y - ay + kh - 1, height, mode, pitch)
                    o = _row_offset(y - ay - 1, height, mode, pitch)
                    v0 += _tap(src, e, col0, cval) - _tap(src, o, col0, cval)
                    v1 += _tap(src, e, col1, cval) - _tap(src, o, col1, cval)
                    v2 += _tap(src, e, col2, cval) - _tap(src, o, col2, cval)
                    v3 += _tap(src, e, col3, cval) - _tap(src, o, col3, cval)
                _store(smem, h * n_lanes, tid, nthreads, n_lanes, v0, v1, v2, v3)
            cuda.syncthreads()
            # Horizontal: each item slides over `run` outputs of one channel of one row.
            # Hot loops are `while` loops over uint32 counters: Numba's range() with a
            # runtime step costs a dozen 64-bit instructions per iteration.
            item = uint32(tid)
            n_items = uint32(rows * per_row)
            step = uint32(nthreads)
            kwc = uint32(kw * C)
            while item < n_items:
                g = item // per_row
                rest = uint32(item - g * per_row)
                r = uint32(rest // C)
                c = uint32(rest - r * C)
                xs = uint32(r * run)
                n_out = uint32(min(xs + run, out_w) - xs)
                first = uint32(g * n_lanes + xs * C + c)  # column sum leaving next
                entering = uint32(first + kwc)  # column sum entering next
                acc = uint32(0)
                p = first
                while p < entering:
                    acc = uint32(acc + smem[p])
                    p = uint32(p + C)
                dst = uint32(stage0 + g * out_lanes + xs * C + c)
                smem[dst] = mean(acc, area, magic, shift, even, inv_area)
                last = uint32(dst + n_out * C)
                dst = uint32(dst + C)
                while dst < last:
                    acc = uint32(acc + smem[entering] - smem[first])
                    smem[dst] = mean(acc, area, magic, shift, even, inv_area)
                    entering = uint32(entering + C)
                    first = uint32(first + C)
                    dst = uint32(dst + C)
                item = uint32(item + step)
            cuda.syncthreads()
            # Write the staged rows out, consecutive threads on consecutive bytes.
            n_out_lanes = uint32(out_lanes)
            for g in range(rows):
                row = uint64((yb + g) * pitch + x0 * C)
                staged = uint32(stage0 + g * out_lanes)
                i = uint32(tid)
                while i < n_out_lanes:
                    out[row + uint64(i)] = smem[uint32(staged + i)]
                    i = uint32(i + step)
            yb += rows

    return box_fused
