"""Launch geometry and arguments of `kernels.conv.blocked`, the low-rank factors (SVD)
and the measured cost model that routes kernels to separable passes; free of Numba
(see kernels.box.plan)."""

from __future__ import annotations

import numpy as np

from ..common.launch import BLOCK_X, BLOCK_Y, SMEM_LIMIT, cdiv

TX = 32  # threads along a row: one warp reads 32 consecutive tile columns
TY = 4  # threads down the tile
MAX_SIDE = 31  # larger kernels would spill registers: use the other variants


def rows_per_thread(kh: int) -> int:
    """Outputs per thread: more reuse per read, bounded by registers; fewer give more
    blocks, which small images need to fill the GPU, and less unrolled code (a
    faster first compile).

    Measured on the H100 (`benchmarks/sweep_blocked.py --ry 8,12,16,24,32`, 720p,
    2167x2495 and 4K, uint8 RGB): 12 is the best or within 1% of it up to 11 rows
    (7x7: 18.3 / 64.2 us against 25.5 / 67.5 with 32; compiles in 3 s, not 7), 16
    up to 15 (15x15: 40.6 / 166.3 / 248.8 us against 45.6 / 168.0 / 250.1), 32 up
    to 21 (21x21 at the larger sizes: 292.6 / 438.9 us; 16 gives 294.8 / 444.6), 24
    beyond (31x31: 757 us vs 805 us with 16)."""
    if kh <= 11:
        return 12
    if kh <= 15:
        return 16
    return 32 if kh <= 21 else 24


def tile_shape(kh: int, kw: int, ry: int) -> tuple[int, int, int, int]:
    """(tile_h, tile_w, pitch, kpitch): the input tile's rows and columns, and the
    float32 strides of its columns and of the weights' columns in shared memory
    (both column-major). Both strides are multiples of 4 (16-byte aligned columns,
    read four floats at a time); pitch / 4 is odd, so eight threads reading
    neighbouring columns 16 bytes each hit distinct banks."""
    tile_h, tile_w = TY * ry + kh - 1, TX + kw - 1
    pitch = -(-tile_h // 4) * 4
    if pitch // 4 % 2 == 0:
        pitch += 4
    return tile_h, tile_w, pitch, -(-kh // 4) * 4


def smem_bytes(kh: int, kw: int) -> int:
    """Shared memory (bytes) the blocked kernel needs for a kh x kw kernel."""
    _, tile_w, pitch, kpitch = tile_shape(kh, kw, rows_per_thread(kh))
    return 4 * (tile_w * pitch + kw * kpitch)


def fits(kh: int, kw: int) -> bool:
    """Whether the blocked kernel handles this kernel size."""
    return max(kh, kw) <= MAX_SIDE and smem_bytes(kh, kw) <= SMEM_LIMIT


def offsets_fit(shape: tuple) -> bool:
    """Whether an (H, W, C) image's element offsets fit the kernel's uint32 offsets;
    larger images need the blocked kernel's wide variant (`launch.blocked_kernel`)."""
    height, width, channels = shape
    return height * width * channels < 2**32


def grid(shape: tuple, kh: int) -> tuple[int, int, int]:
    """The blocked kernel's grid for an (H, W, C) image; its block is (TX, TY).
    blockIdx.x counts channels fastest: block x covers channel x % C of tile column
    x // C."""
    height, width, channels = shape
    return cdiv(width, TX) * channels, cdiv(height, TY * rows_per_thread(kh)), 1


def scalar_args(out_dtype, anchor: tuple, mode: int, cval) -> tuple:
    """(ay, ax, mode, cval, lo, hi, is_int) as the kernel takes them: integer outputs
    are rounded and saturated to [lo, hi]; cval is the constant-border value."""
    dt = np.dtype(out_dtype)
    if dt.kind == "u":
        lo, hi, is_int = 0, int(np.iinfo(dt).max), 1
    else:
        lo, hi, is_int = 0, 0, 0
    return anchor[0], anchor[1], mode, np.float32(cval), lo, hi, is_int


def low_rank_factors(
    kernel: np.ndarray, max_rank: int
) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """[(col_k, row_k)] with kernel == sum_k outer(col_k, row_k) to float32 precision,
    at most `max_rank` terms, or None when the kernel's rank is higher.

    Found by SVD: the rank counts the singular values above 1e-7 of the largest (an
    all-zero kernel has rank 0 and one term of zero factors).
    """
    u, s, vt = np.linalg.svd(kernel.astype(np.float64))
    if s[0] == 0:
        return [(np.zeros(kernel.shape[0], np.float32), np.zeros(kernel.shape[1], np.float32))]
    rank = int(np.count_nonzero(s > 1e-7 * s[0]))
    if rank > max_rank:
        return None
    scale = np.sqrt(s[:rank])
    return [
        ((u[:, k] * scale[k]).astype(np.float32), (vt[k] * scale[k]).astype(np.float32))
        for k in range(rank)
    ]


def kernel_rank(kernel: np.ndarray) -> int:
    """The rank `low_rank_factors` sees (0 for an all-zero kernel)."""
    s = np.linalg.svd(kernel.astype(np.float64), compute_uv=False)
    return 0 if s[0] == 0 else int(np.count_nonzero(s > 1e-7 * s[0]))


def rank1_factors(kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(col, row) with kernel == outer(col, row) to float32 precision, or None
    (`low_rank_factors` with one term)."""
    terms = low_rank_factors(kernel, 1)
    return None if terms is None else terms[0]


def max_separable_rank(kh: int, kw: int) -> int:
    """The highest rank method "separable" takes for a kh x kw kernel: r pairs of 1-D
    passes do r * (kh + kw) multiply-adds per output against kh * kw for one 2-D pass,
    so past this rank they cannot be cheaper (they also move r times the bytes)."""
    return max(1, (kh * kw - 1) // (kh + kw))


# Where auto takes a kernel of rank r apart, from the H100 sweep of seed-size uint8 images
# (`benchmarks/sweep_low_rank.py`): one 2-D pass (blocked) costs 0.62-0.75 us per tap
# there (15x15 169 us, 21x21 293 us), the first pair of 1-D passes about 165 us whatever
# k (5x5 to 21x21), each further term about 283 us (its float32 running sum is read and
# written once more). In taps:
SEPARABLE_FIRST_TAPS = 250  # a 2-D pass of more taps than this is slower than one pair
SEPARABLE_TERM_TAPS = 430  # ... and each further term costs this many taps more


def separable_pays(kh: int, kw: int, rank: int) -> bool:
    """Whether `rank` pairs of 1-D passes beat one 2-D pass on a kh x kw kernel (the
    measured model above; rank 0, an all-zero kernel, counts as rank 1)."""
    taps = SEPARABLE_FIRST_TAPS + SEPARABLE_TERM_TAPS * (max(rank, 1) - 1)
    return kh * kw > taps and rank <= max_separable_rank(kh, kw) and max(kh, kw) <= MAX_SIDE


def auto_method(kernel: np.ndarray) -> str | None:
    """ "separable" or "blocked" where method auto takes them for this kernel, else None
    (then `generic_method`).

    Separable where `separable_pays` for the kernel's rank: rank 1 above 250 taps (16x16
    and up, or 9x31), rank 2 above 680 (27x27, 23x31); rank 3 would need 1110 taps,
    more than the 31x31 the passes take."""
    kh, kw = kernel.shape
    # The tap count first: kernels too small for any rank to pay skip the SVD.
    if kh * kw > SEPARABLE_FIRST_TAPS and separable_pays(kh, kw, kernel_rank(kernel)):
        return "separable"
    return "blocked" if fits(kh, kw) else None


def tiled_smem_bytes(kh: int, kw: int) -> int:
    """Dynamic shared memory `kernels.conv.generic.correlate_tiled` needs for a kh x kw kernel."""
    return 4 * ((BLOCK_Y + kh - 1) * (BLOCK_X + kw - 1) + kh * kw)


def tiled_fits(kh: int, kw: int) -> bool:
    """Whether the tiled kernel can launch for this kernel size."""
    return tiled_smem_bytes(kh, kw) <= SMEM_LIMIT


# The register-window kernel (`kernels.conv.window`): blocks of WINDOW_TX x WINDOW_TY
# threads, each thread WINDOW_RY outputs down one column (its body writes out 8).
WINDOW_TX = 32  # threads along a row: a warp reads 32 consecutive columns
WINDOW_TY = 4  # threads down the tile
WINDOW_RY = 8
WINDOW_ROWS = WINDOW_TY * WINDOW_RY  # output rows per block


def window_tile_shape(kh: int, kw: int) -> tuple[int, int, int]:
    """(tile_h, tile_w, pitch) of the window kernel's input tile; pitch, the float32
    stride of a tile column in shared memory, is odd: the 32 threads of a warp read 32
    columns at one row, 32 distinct banks."""
    tile_h, tile_w = WINDOW_ROWS + kh - 1, WINDOW_TX + kw - 1
    return tile_h, tile_w, tile_h | 1


def window_smem_bytes(kh: int, kw: int) -> int:
    """Dynamic shared memory (bytes) the window kernel needs: its tile and the weights."""
    _, tile_w, pitch = window_tile_shape(kh, kw)
    return 4 * (tile_w * pitch + kh * kw)


def window_fits(kh: int, kw: int) -> bool:
    """Whether the window kernel can launch for this kernel size."""
    return window_smem_bytes(kh, kw) <= SMEM_LIMIT


def window_grid(shape: tuple) -> tuple[int, int, int]:
    """The window kernel's grid for an (H, W, C) image, block (WINDOW_TX, WINDOW_TY, 1).
    blockIdx.x counts channels fastest (block x is channel x % C of tile column x // C),
    so a tile's channels run together and share the L2 sectors of their pixels."""
    height, width, channels = shape
    return cdiv(width, WINDOW_TX) * channels, cdiv(height, WINDOW_ROWS), 1


def generic_method(kh: int, kw: int) -> str:
    """The method auto runs for a kernel that `auto_method` gives to neither the
    blocked kernel nor separable passes (larger than 31x31): the register-window
    kernel where its tile fits shared memory (up to 61x61), else the one-output-per-
    thread tiled kernel (up to 68x68), else padded (any size)."""
    if window_fits(kh, kw):
        return "window"
    return "tiled" if tiled_fits(kh, kw) else "padded"
