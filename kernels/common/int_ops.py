"""Integer intrinsics for device code that Numba does not expose directly.

- `byte_perm(x, y, s)`: CUDA's __byte_perm, one PTX `prmt.b32`: byte n of the result
  is byte ((s >> 4 n) & 7) of the 8 bytes y:x (x's bytes are 0-3, y's 4-7).
- `umulhi(x, y)`: the high 32 bits of the 64-bit product of two uint32, one
  `mul.hi.u32` (Numba's `(uint64(x) * y) >> 32` costs a wide multiply and a move).
- `round_div(acc, area, magic, shift_hi, even)`: round(acc / area) half to even by
  one multiply-high, for the box kernels' means.
- `pair_bits(lo, hi)` / `pair_of(bits)`: two float32 as the low and high words of
  one int64 and back, bit for bit (a pair published by one 64-bit atomic).

All but round_div come from libdevice. On the CUDA simulator, which has none, they are the
same operations in Python, so kernels that use them run unchanged in CI.
"""

from __future__ import annotations

from numba import config as _numba_config
from numba import cuda as _cuda
from numba import uint32 as _uint32

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

if SIMULATOR:
    import numpy as np

    def byte_perm(x, y, s):
        both = (int(y) & 0xFFFFFFFF) << 32 | (int(x) & 0xFFFFFFFF)
        sel = int(s)
        out = 0
        for n in range(4):
            out |= ((both >> (8 * ((sel >> (4 * n)) & 7))) & 0xFF) << (8 * n)
        return np.uint32(out)

    def umulhi(x, y):
        return np.uint32(((int(x) & 0xFFFFFFFF) * (int(y) & 0xFFFFFFFF)) >> 32)

    def pair_bits(lo, hi):
        return np.array([lo, hi], np.float32).view(np.int64)[0]

    def pair_of(bits):
        lo, hi = np.array([bits], np.int64).view(np.float32)
        return np.float32(lo), np.float32(hi)

else:
    from numba import cuda, int32, int64, uint32
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline="always")
    def byte_perm(x, y, s):
        return uint32(libdevice.byte_perm(int32(x), int32(y), int32(s)))

    @cuda.jit(device=True, inline="always")
    def umulhi(x, y):
        return uint32(libdevice.umulhi(int32(x), int32(y)))

    @cuda.jit(device=True, inline="always")
    def pair_bits(lo, hi):
        """lo's float32 bits in the low word of an int64, hi's in the high word."""
        low = int64(libdevice.float_as_int(lo)) & int64(0xFFFFFFFF)
        return (int64(libdevice.float_as_int(hi)) << int64(32)) | low

    @cuda.jit(device=True, inline="always")
    def pair_of(bits):
        """The (lo, hi) float32 pair of pair_bits(lo, hi)."""
        lo = libdevice.int_as_float(int32(bits & int64(0xFFFFFFFF)))
        return lo, libdevice.int_as_float(int32(bits >> int64(32)))


@_cuda.jit(device=True)
def round_div(acc, area, magic, shift_hi, even):
    """round(acc / area) half to even for 0 <= 2 * acc + area < t_limit, where
    (magic, shift_hi) = `kernels.box.plan.packed_magic(area, t_limit)`: a multiply-high,
    and a tie (possible only for an even area) goes down to the even neighbour."""
    t = _uint32(2 * acc + area)
    q = _uint32(umulhi(t, magic) >> shift_hi)
    if even and _uint32(t - _uint32(q * _uint32(2 * area))) == _uint32(0):
        q = _uint32(q - (q & _uint32(1)))
    return q
