"""Launch softmax block or split kernels once per case on 2**26 random elements, for ncu (GPU only).

    ncu --clock-control none -k regex:softmax_block --section SpeedOfLight \\
        python benchmarks/profile_softmax.py 8192:float16:block_smem 131072:float32:block_uncached

A case is COLS:DTYPE:METHOD[:OPTION...], options an unroll (1, 2, 4), `online`
(block_smem), gN (block_uncached: at most N blocks per SM), cN / bN (split: chunks,
block size) or `packed` (split: raw packs in shared memory); each case runs twice
(the first launch compiles), so `-c` counts two launches per case.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.common import arrays  # noqa: E402
from kernels.softmax import dispatch as sm  # noqa: E402
from kernels.softmax import split as ss  # noqa: E402


def main(cases: list[str]) -> None:
    rng = np.random.default_rng(0)
    for case in cases:
        cols_s, dname, method, *rest = case.split(":")
        cols, dtype = int(cols_s), np.dtype(dname)
        rows = (1 << 26) // cols
        kw = {}
        for item in rest:
            if item in ("online", "packed"):
                kw[item] = True
            elif item.startswith("c"):
                kw["chunks"] = int(item[1:])
            elif item.startswith("b"):
                kw["block_size"] = int(item[1:])
            elif item.startswith("g"):
                kw["blocks_per_sm"] = int(item[1:])
            else:
                kw["unroll"] = int(item)
        dx = arrays.to_device(rng.standard_normal((rows, cols), dtype=np.float32).astype(dtype))
        dy = arrays.empty((rows, cols), dtype)
        if method == "split":
            pack = 16 // dtype.itemsize
            how, kernel = ss.plan_split(rows, cols, dtype, dtype, pack, False, **kw)
        else:
            how, kernel = sm.plan(rows, cols, dtype, method=method, **kw)
        for _ in range(2):
            sm.launch_plan(how, kernel, dx, dy)
        cuda.synchronize()
        print(case, how, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
