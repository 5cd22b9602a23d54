"""Packed (up to 128-bit) global loads and stores for Numba CUDA kernels.

Numba has no 128-bit scalar type, and a float32 pack through a `uint64` view stops at
64 bits. These intrinsics take the address of `arr[r, c]` (or `arr[c]`) and emit one
LLVM vector access of 32-bit words aligned to the pack size: 16 bytes become one
`ld.global.v4.u32` / `st.global.v4.u32` in the PTX (8 bytes `.v2`, 4 bytes one word,
2 bytes one `u16`). float16 halves are shifted out of (or into) the words and
converted with `cvt` (a `<8 x half>` access would be split by the backend).

- `load_pack2(arr, r, c, nbytes)` / `load_pack1(arr, c, nbytes)`: the `nbytes` at
  `&arr[r, c]` / `&arr[c]` as a tuple of float32 (`nbytes // itemsize` of them).
- `store_pack2(arr, r, c, src, nbytes)`: writes `src[0 .. nbytes // itemsize - 1]`
  (a 1-D float32 local array) to `&arr[r, c]`, converted to the array's dtype
  (round to nearest even for float16).
- `load_words2(arr, r, c, nbytes)`: the same access as load_pack2, as raw uint32
  words (nbytes >= 4); `store_words1(arr, c, src, nwords)` writes nwords such words
  (a 1-D uint32 local array) to `&arr[c]` in one access; `unpack_word(word,
  itemsize)` turns one word into its float32 values (two float16 halves, low first,
  or one float32). A piece is copied to shared memory without converting it twice.

`arr` is a float32 or float16 array; `nbytes` must be a compile-time constant (a
closure int) and the address must be aligned to it: the caller checks the alignment
of the base pointers and row strides. On the CUDA simulator (no LLVM) the same names
are plain Python functions that read and write element by element.
"""

from __future__ import annotations

import numpy as np
from numba import config as _numba_config

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)


def _simulated():
    def load_pack2(arr, r, c, nbytes):
        # The simulator's arrays are NumPy arrays underneath: read element by element.
        return tuple(np.float32(arr[r, c + i]) for i in range(nbytes // arr.dtype.itemsize))

    def load_pack1(arr, c, nbytes):
        return tuple(np.float32(arr[c + i]) for i in range(nbytes // arr.dtype.itemsize))

    def store_pack2(arr, r, c, src, nbytes):
        for i in range(nbytes // arr.dtype.itemsize):
            arr[r, c + i] = src[i]

    def load_words2(arr, r, c, nbytes):
        n = nbytes // arr.dtype.itemsize
        return tuple(int(w) for w in np.ascontiguousarray(arr[r, c : c + n]).view(np.uint32))

    def store_words1(arr, c, src, nwords):
        raw = np.array(src[:nwords], dtype=np.uint32).view(arr.dtype)
        for i in range(raw.size):
            arr[c + i] = raw[i]

    def unpack_word(word, itemsize):
        vals = np.array([word], dtype=np.uint32).view(np.float16 if itemsize == 2 else np.float32)
        return tuple(np.float32(v) for v in vals)

    return (load_pack2, load_pack1, store_pack2, load_words2, store_words1,
            unpack_word)  # fmt: skip


def _compiled():
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    i16, i32 = ir.IntType(16), ir.IntType(32)

    def count_of(arr, index, nbytes):
        # nbytes must be a compile-time constant (a closure int): returning None for
        # a plain int makes Numba retry with the literal type.
        if not isinstance(nbytes, types.IntegerLiteral):
            return None
        if not isinstance(arr, types.Array) or arr.dtype not in (types.float32, types.float16):
            return None
        if len(index) != arr.ndim or not all(isinstance(i, types.Integer) for i in index):
            return None
        count = nbytes.literal_value // (arr.dtype.bitwidth // 8)
        return count if count >= 1 else None

    def pointer(context, builder, aryty, arr, index_vals, index_tys):
        ary = context.make_array(aryty)(context, builder, value=arr)
        inds = [
            context.cast(builder, v, t, types.intp)
            for v, t in zip(index_vals, index_tys, strict=True)
        ]
        return cgutils.get_item_pointer(context, builder, aryty, ary, inds)

    def load_codegen(context, builder, sig, args):
        aryty = sig.args[0]
        count = sig.return_type.count
        nbytes = count * (aryty.dtype.bitwidth // 8)
        ptr = pointer(context, builder, aryty, args[0], args[1:-1], sig.args[1:-1])
        if nbytes < 4:
            raw = builder.load(ptr)
            raw.align = nbytes
            halves = [raw]
        else:
            nwords = nbytes // 4
            raw = builder.load(builder.bitcast(ptr, ir.VectorType(i32, nwords).as_pointer()))
            raw.align = nbytes
            words = [builder.extract_element(raw, ir.Constant(i32, w)) for w in range(nwords)]
            if aryty.dtype == types.float32:
                vals = [builder.bitcast(w, ir.FloatType()) for w in words]
                return context.make_tuple(builder, sig.return_type, vals)
            halves = []
            for w in words:
                halves.append(builder.trunc(w, i16))
                halves.append(builder.trunc(builder.lshr(w, ir.Constant(i32, 16)), i16))
        vals = [builder.fpext(builder.bitcast(h, ir.HalfType()), ir.FloatType()) for h in halves]
        return context.make_tuple(builder, sig.return_type, vals)

    @intrinsic
    def load_pack2(typingctx, arr, r, c, nbytes):
        """The nbytes at &arr[r, c] (aligned to nbytes) as a tuple of float32."""
        count = count_of(arr, (r, c), nbytes)
        if count is None:
            return None
        return types.UniTuple(types.float32, count)(arr, r, c, nbytes), load_codegen

    @intrinsic
    def load_pack1(typingctx, arr, c, nbytes):
        """The nbytes at &arr[c] (aligned to nbytes) as a tuple of float32."""
        count = count_of(arr, (c,), nbytes)
        if count is None:
            return None
        return types.UniTuple(types.float32, count)(arr, c, nbytes), load_codegen

    def store_codegen(context, builder, sig, args):
        aryty, srcty = sig.args[0], sig.args[-2]
        isz = aryty.dtype.bitwidth // 8
        nbytes = sig.args[-1].literal_value
        count = nbytes // isz
        nd = aryty.ndim
        ptr = pointer(context, builder, aryty, args[0], args[1 : 1 + nd], sig.args[1 : 1 + nd])
        src = context.make_array(srcty)(context, builder, value=args[1 + nd])
        vals = []
        for i in range(count):
            sptr = cgutils.get_item_pointer(
                context, builder, srcty, src, [ir.Constant(ir.IntType(64), i)]
            )
            vals.append(builder.load(sptr))
        if aryty.dtype == types.float32:
            words = [builder.bitcast(v, i32) for v in vals]
        else:
            halves = [builder.bitcast(builder.fptrunc(v, ir.HalfType()), i16) for v in vals]
            if nbytes < 4:
                st = builder.store(halves[0], ptr)
                st.align = nbytes
                return context.get_dummy_value()
            words = []
            for lo, hi in zip(halves[::2], halves[1::2], strict=True):
                word = builder.or_(
                    builder.zext(lo, i32), builder.shl(builder.zext(hi, i32), ir.Constant(i32, 16))
                )
                words.append(word)
        vec = ir.Constant(ir.VectorType(i32, len(words)), ir.Undefined)
        for w, word in enumerate(words):
            vec = builder.insert_element(vec, word, ir.Constant(i32, w))
        st = builder.store(vec, builder.bitcast(ptr, ir.VectorType(i32, len(words)).as_pointer()))
        st.align = nbytes
        return context.get_dummy_value()

    @intrinsic
    def store_pack2(typingctx, arr, r, c, src, nbytes):
        """Write src[0 .. nbytes / itemsize) (float32) to &arr[r, c], aligned to nbytes."""
        count = count_of(arr, (r, c), nbytes)
        if count is None:
            return None
        if not isinstance(src, types.Array) or src.ndim != 1 or src.dtype != types.float32:
            return None
        return types.none(arr, r, c, src, nbytes), store_codegen

    @intrinsic
    def load_words2(typingctx, arr, r, c, nbytes):
        """The nbytes (4, 8 or 16) at &arr[r, c], aligned to nbytes, as raw uint32 words."""
        count = count_of(arr, (r, c), nbytes)
        if count is None or nbytes.literal_value < 4:
            return None
        nwords = nbytes.literal_value // 4

        def codegen(context, builder, sig, args):
            ptr = pointer(context, builder, sig.args[0], args[0], args[1:3], sig.args[1:3])
            raw = builder.load(builder.bitcast(ptr, ir.VectorType(i32, nwords).as_pointer()))
            raw.align = 4 * nwords
            words = [builder.extract_element(raw, ir.Constant(i32, w)) for w in range(nwords)]
            return context.make_tuple(builder, sig.return_type, words)

        return types.UniTuple(types.uint32, nwords)(arr, r, c, nbytes), codegen

    @intrinsic
    def store_words1(typingctx, arr, c, src, nwords):
        """Write src[0 .. nwords) (a 1-D uint32 array; nwords 1, 2 or 4, a compile-time
        int) to &arr[c] as one access aligned to 4 * nwords bytes."""
        if not isinstance(nwords, types.IntegerLiteral) or nwords.literal_value not in (1, 2, 4):
            return None
        if not isinstance(src, types.Array) or src.ndim != 1 or src.dtype != types.uint32:
            return None
        if not isinstance(arr, types.Array) or arr.ndim != 1:
            return None
        n = nwords.literal_value

        def codegen(context, builder, sig, args):
            ptr = pointer(context, builder, sig.args[0], args[0], args[1:2], sig.args[1:2])
            srcty = sig.args[2]
            srcarr = context.make_array(srcty)(context, builder, value=args[2])
            vec = ir.Constant(ir.VectorType(i32, n), ir.Undefined)
            for w in range(n):
                wptr = cgutils.get_item_pointer(
                    context, builder, srcty, srcarr, [ir.Constant(ir.IntType(64), w)]
                )
                vec = builder.insert_element(vec, builder.load(wptr), ir.Constant(i32, w))
            st = builder.store(vec, builder.bitcast(ptr, ir.VectorType(i32, n).as_pointer()))
            st.align = 4 * n
            return context.get_dummy_value()

        return types.none(arr, c, src, nwords), codegen

    @intrinsic
    def unpack_word(typingctx, word, itemsize):
        """A raw uint32 word as float32 values: two float16 halves (low first) when
        itemsize is 2, the word's own float32 when 4 (itemsize a compile-time int)."""
        if word != types.uint32 or not isinstance(itemsize, types.IntegerLiteral):
            return None
        two = itemsize.literal_value == 2

        def codegen(context, builder, sig, args):
            w = args[0]
            if not two:
                return context.make_tuple(
                    builder, sig.return_type, [builder.bitcast(w, ir.FloatType())]
                )
            hi = builder.lshr(w, ir.Constant(i32, 16))
            halves = [builder.trunc(w, i16), builder.trunc(hi, i16)]
            f32 = ir.FloatType()
            vals = [builder.fpext(builder.bitcast(h, ir.HalfType()), f32) for h in halves]
            return context.make_tuple(builder, sig.return_type, vals)

        return types.UniTuple(types.float32, 2 if two else 1)(word, itemsize), codegen

    return (load_pack2, load_pack1, store_pack2, load_words2, store_words1,
            unpack_word)  # fmt: skip


(load_pack2, load_pack1, store_pack2, load_words2, store_words1, unpack_word) = (
    _simulated() if SIMULATOR else _compiled()
)


__all__ = [
    "load_pack1",
    "load_pack2",
    "load_words2",
    "store_pack2",
    "store_words1",
    "unpack_word",
]
