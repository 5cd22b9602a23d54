"""What the softmax kernels share (`kernels.softmax.kernels`' and `kernels.softmax.split`'s):
the fast float32 exponentials, the block kernels' pack loader and online normaliser.
Numba device functions, built per specialisation (how one call runs: `kernels.softmax.plan`)."""

from __future__ import annotations

import functools
import math
import sys

from numba import config as _numba_config
from numba import cuda, float32, types, uint32

from ..common.packs import load_pack2, load_words2, unpack_word

LOG2E = float32(1.4426950408889634)
NEG_INF = float32(-math.inf)
SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)


if SIMULATOR or sys.version_info < (3, 11):

    @cuda.jit(device=True, inline="always")
    def exp32(x):
        """exp(x) in float32 (the simulator, and Pythons without math.exp2)."""
        return math.exp(x)

    @cuda.jit(device=True, inline="always")
    def exp_over(v, log2_sum):
        """exp(v) / 2**log2_sum in float32 (the simulator's)."""
        return math.exp(v) / math.pow(2.0, log2_sum)

else:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _ex2_ftz(typingctx, x):
        """2**x by one `ex2.approx.ftz.f32` (float32 x)."""
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.nvvm.ex2.approx.ftz.f")
            return builder.call(fn, args)

        return types.float32(types.float32), codegen

    @cuda.jit(device=True, inline="always")
    def exp32(x):
        """exp(x) as one ex2.approx.ftz.f32 of x * log2(e), OneFlow's fast-math Exp: two
        instructions instead of libdevice expf's 13 (which made the float16 block
        paths instruction-bound). Relative error <= ~3e-6 where the result is a normal
        float32 (the rounding of x * log2(e) for |x| < 104, plus ex2's 2 ulp); results
        below 2**-126 (float32 subnormals) are flushed to 0, which saves math.exp2's
        three-instruction subnormal guard per call (softmax outputs that small are
        within the float32 tolerance of 2**-126 absolute)."""
        return _ex2_ftz(x * LOG2E)

    @cuda.jit(device=True, inline="always")
    def exp_over(v, log2_sum):
        """exp(v) / 2**log2_sum (a softmax output: v = x - max, log2_sum = log2 of the
        row's sum) as one fma and one ex2.approx.ftz, where exp32(v) * (1 / sum) takes
        a multiply, the ex2 and another multiply. log2_sum's rounding
        (|log2_sum| * 2**-24) adds < 1e-6 relative error for sums below 2**20."""
        return _ex2_ftz(cuda.fma(v, LOG2E, -log2_sum))


@functools.cache
def pack_loader(pack: int, nbytes: int, unroll: int, raw: bool = False):
    """Device function `load_packs(x, row, p, stride, packs, a) -> n` of the block
    kernels: loads packs p, p + stride, ... (up to `unroll`, those below `packs`) of
    `pack` elements (`nbytes` bytes) of x's row into a[u, 0 .. pack - 1] (float32
    values; raw: the packs' nbytes // 4 uint32 words into a[u, 0 .. nbytes // 4 - 1]),
    all issued before any is used; n is how many it loaded."""
    load = load_words2 if raw else load_pack2
    count = nbytes // 4 if raw else pack

    @cuda.jit(device=True, inline="always")
    def load_packs(x, row, p, stride, packs, a):
        n = uint32(0)
        for u in range(unroll):
            q = uint32(p + u * stride)
            if q < packs:
                pa = load(x, row, uint32(q * pack), nbytes)
                for i in range(count):
                    a[u, i] = pa[i]
                n = uint32(u + 1)
        return n

    return load_packs


@functools.cache
def online_folder(pack: int, unroll: int, raw_itemsize: int = 0):
    """Device function `fold(a, n, cm, m, d) -> (m, d)` of the online normaliser:
    with cm the max of m and the n loaded packs a[0 .. n - 1], rescale the running
    sum d of exp(x - m) to the new max and add the packs' exp(x - max). raw_itemsize
    given: a[u] holds pack u's raw uint32 words (elements of that many bytes),
    unpacked here."""
    words = max(1, pack * raw_itemsize // 4)
    per_word = pack // words

    @cuda.jit(device=True, inline="always")
    def fold(a, n, cm, m, d):
        if cm > m:
            d *= exp32(m - cm)
            m = cm
        if m > NEG_INF:
            for u in range(unroll):
                if u < n:
                    if raw_itemsize:
                        for k in range(words):
                            vals = unpack_word(a[u, k], raw_itemsize)
                            for h in range(per_word):
                                d += exp32(vals[h] - m)
                    else:
                        for i in range(pack):
                            d += exp32(a[u, i] - m)
        return m, d

    return fold
