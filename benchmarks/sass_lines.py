"""sm_90 SASS of a box kernel, counted per source line, on a machine without a GPU.

Numba asks the current device for its compute capability while typing calls to
device functions; this script answers (9, 0) instead, so `numba.cuda.compile_ptx`
works without a driver. It then assembles the PTX with ptxas and disassembles it with
nvdisasm (line info on) and prints, per source line of the kernel's module, the number
of static SASS instructions and the first opcodes, plus per-phase totals where the
module marks phases with comments "# 1.", "# 2.", ...

Needs, besides the project's venv: NVVM and ptxas (a CUDA toolkit, e.g. CUDA_HOME=
/usr/local/cuda-13.0), libnvrtc on LD_LIBRARY_PATH (`pip download
"nvidia-cuda-nvrtc==13.0.*"`, unzip, nvidia/cu13/lib) and nvdisasm (`pip download
"nvidia-cuda-nvdisasm==13.2.*"`, unzip, nvidia/cu13/bin):

    LD_LIBRARY_PATH=.../nvidia/cu13/lib CUDA_HOME=/usr/local/cuda-13.0 \\
        python benchmarks/sass_lines.py --kernel tiled --nvdisasm .../bin/nvdisasm

Static counts say where the code is, not how often it runs: weigh them by trip counts.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _fake_device() -> None:
    import numba.cuda.dispatcher as dispatcher

    class _Device:
        compute_capability = (9, 0)

    dispatcher.get_current_device = lambda: _Device()


def _kernel(name: str, channels: int, box: int = 21, geometry: dict | None = None):
    """(python function, signature, source file) of a box kernel specialisation."""
    from numba import types

    u8 = types.Array(types.uint8, 1, "C")
    u32 = types.Array(types.uint32, 1, "C")
    i64 = types.int64
    if name == "tiled":
        from kernels.box import tiled as mod
        from kernels.box.plan import tiled_plan

        ksize = (box, box)
        geo = tiled_plan((2167, 2495, channels), "uint8", ksize, **(geometry or {}))
        k = mod.kernel_for(channels, ksize, geo)
        return k.py_func, (u8, u32, i64) + (i64,) * 14 + (u8, u32), mod.__file__
    if name == "packed":
        from kernels.box import packed as mod

        k = mod.kernel_for(channels, 128, 30, False)
        return k.py_func, (u8, u32, i64) + (i64,) * 14 + (u8, u32), mod.__file__
    if name in ("twopass-row", "twopass-col", "twopass-col-tiles"):
        from kernels.box import twopass as mod

        if name == "twopass-row":
            sig = (u8, u32) + (i64,) * 7 + (u32,)
            return mod.row_kernel_for(channels, 36).py_func, sig, mod.__file__
        sig = (u32,) + (i64,) * 12 + (u8,)
        if name == "twopass-col-tiles":
            return (
                mod.column_kernel_for({"col_groups": 8, "col_threads": 32}).py_func,
                sig,
                mod.__file__,
            )
        return mod.box_column_means.py_func, sig, mod.__file__
    import numpy as np

    from kernels.box import fused as mod

    k = mod.kernel_for(np.uint16, channels, True)
    sig = (u8,) + (i64,) * 12 + (types.float32,) + (i64,) * 4 + (u8,)
    return k.py_func, sig, mod.__file__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--kernel",
        choices=("tiled", "fused", "packed", "twopass-row", "twopass-col", "twopass-col-tiles"),
        default="tiled",
    )
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--box", type=int, default=21, help="box side (tiled: a constant)")
    ap.add_argument("--geometry", default="", help="tiled: e.g. tile_h=64,threads=512")
    ap.add_argument("--nvdisasm", default="nvdisasm", help="path of nvdisasm")
    ap.add_argument("--ptxas", default="ptxas", help="path of ptxas")
    args = ap.parse_args(argv)
    _fake_device()
    from numba import cuda

    geometry = {k: int(v) for k, v in (kv.split("=") for kv in args.geometry.split(",") if kv)}
    func, sig, source = _kernel(args.kernel, args.channels, args.box, geometry)
    ptx, _ = cuda.compile_ptx(func, sig, cc=(9, 0), lineinfo=True)
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        ptx_path.write_text(ptx)
        info = subprocess.run(
            [args.ptxas, "-arch=sm_90", "-v", "-lineinfo", str(ptx_path), "-o", str(cubin)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        sass = subprocess.run(
            [args.nvdisasm, "-g", "-c", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
    print(info.stderr.strip())
    name = Path(source).name
    counts: collections.Counter = collections.Counter()
    opcodes: dict[int, list[str]] = collections.defaultdict(list)
    calls: collections.Counter = collections.Counter()
    line = None
    for text in sass.splitlines():
        m = re.search(rf'{re.escape(name)}", line (\d+)', text)
        if m:
            line = int(m.group(1))
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
        if m and line is not None:
            counts[line] += 1
            opcodes[line].append(m.group(2))
        call = re.search(r"CALL\.\S+\s+`\((\S+)\)", text)
        if call:
            calls[call.group(1)] += 1
    src = Path(source).read_text().splitlines()
    phase, per_phase = "preamble", collections.Counter()
    for no in range(1, len(src) + 1):
        mark = re.match(r"\s*# (\d)\. (\w+)", src[no - 1])
        if mark:
            phase = f"{mark.group(1)}. {mark.group(2)}"
        per_phase[phase] += counts.get(no, 0)
        if counts.get(no, 0) >= 3:
            ops = " ".join(opcodes[no][:8])
            print(f"{no:4d} {counts[no]:4d}  {src[no - 1].strip()[:60]:60s} {ops}")
    print("per phase:", dict(per_phase), "total", sum(counts.values()))
    print("subroutine calls:", dict(calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
