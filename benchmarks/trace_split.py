"""Timeline of the split softmax kernel on a GPU (a diagnostic, not a benchmark).

Patches a copy of kernels/softmax/split.py's source (text replacements that fail
loudly when the kernel changes shape) so that thread 0 of each block records
%globaltimer at four points of every item: ticket taken, chunk loaded and reduced,
row pair ready, own stores issued. Runs float16 512 x 131072 at auto's geometry and
prints per-item phase times and how many blocks are in each phase per 2 us bin.
Options pick another geometry and the kernel's build options (see --help). With
--stages 2 an item's "wait" also spans the block's load of its next item.
Result of 2026-11-25: benchmarks/results/2026-11-25i-h100-softmax-split-trace.txt.

    python benchmarks/trace_split.py      # needs an NVIDIA GPU
"""

import argparse
import sys
import types as pytypes
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels.softmax import dispatch as sm  # noqa: E402
from kernels.softmax import split as ss  # noqa: E402


@intrinsic
def globaltimer(typingctx):
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        asm = ir.InlineAsm(fnty, "mov.u64 $0, %globaltimer;", "=l", side_effect=True)
        return builder.call(asm, [])

    return types.uint64(), codegen


src = Path(ss.__file__).read_text()


def patch(old, new):
    global src
    assert src.count(old) == 1, old
    src = src.replace(old, new)


patch(
    "def softmax_split(x, y, rows, cols, counters, partials):",
    "def softmax_split(x, y, rows, cols, counters, partials, trace):",
)
patch(
    "            t = uint32(item[0])\n",
    "            t = uint32(item[0])\n"
    "            if tid == 0 and t < items:\n                trace[4 * t] = globaltimer()\n",
)
patch(
    "                    warp_sum[warp] = d\n                cuda.syncthreads()\n",
    "                    warp_sum[warp] = d\n                cuda.syncthreads()\n"
    "                if tid == 0:\n                    trace[4 * t + 1] = globaltimer()\n",
)
patch(
    "                cuda.syncthreads()\n                write_chunk(",
    "                cuda.syncthreads()\n"
    "                if tid == 0:\n                    trace[4 * due + 2] = globaltimer()\n"
    "                write_chunk(",
)
patch(
    "row_pair[0], row_pair[1], tout)\n",
    "row_pair[0], row_pair[1], tout)\n"
    "                if tid == 0:\n                    trace[4 * due + 3] = globaltimer()\n",
)
mod = pytypes.ModuleType("kernels.softmax.split_traced")
mod.__package__ = "kernels.softmax"
mod.globaltimer = globaltimer
sys.modules[mod.__name__] = mod
exec(compile(src, "softmax_split_traced.py", "exec"), mod.__dict__)

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--chunks", type=int, help="default: auto's plan")
ap.add_argument("--block", type=int)
ap.add_argument("--unroll", type=int)
ap.add_argument("--bounds", type=int, default=0, help="launch bounds' blocks per SM")
ap.add_argument("--stages", type=int, help="buffers a block (1 or 2; default: plan's)")
args = ap.parse_args()
rows, cols = 512, 131072
f16 = np.dtype(np.float16)
if args.chunks:
    bounds = (args.block, args.bounds) if args.bounds else None
    how, _ = ss.plan_split(
        rows, cols, f16, f16, 8, False, block_size=args.block, unroll=args.unroll,
        chunks=args.chunks, bounds=bounds, stages=args.stages,
    )  # fmt: skip
else:
    how, _ = sm.plan(rows, cols, f16)
    bounds = (ss.SPLIT_BLOCK, ss.SPLIT_BLOCKS_PER_SM)  # auto's
print("plan", how, "bounds", bounds)
kernel = mod.split_kernel(
    f16, f16, how.pack, how.unroll, how.chunks, False, True, bounds, how.stages
)
rng = np.random.default_rng(0)
x = cuda.to_device(rng.standard_normal((rows, cols)).astype(np.float16))
y = cuda.device_array((rows, cols), np.float16)
counters = cuda.to_device(np.zeros(1 + rows, np.int32))
partials = cuda.to_device(np.zeros(rows * how.chunks, np.int64))
items = rows * how.chunks
trace = cuda.to_device(np.zeros(4 * items, np.uint64))
from kernels.common.launch import allow_dynamic_smem  # noqa: E402

allow_dynamic_smem(
    kernel.compile(mod.signature(f16, f16) + (types.Array(types.uint64, 1, "C"),)),
    how.smem,
)
launch = kernel[how.grid, how.block, 0, how.smem]
for _ in range(3):
    launch(x, y, rows, cols, counters, partials, trace)
cuda.synchronize()
start, stop = cuda.event(), cuda.event()
start.record()
launch(x, y, rows, cols, counters, partials, trace)
stop.record()
stop.synchronize()
print(f"kernel {cuda.event_elapsed_time(start, stop) * 1000:.1f} us (one launch, event-timed)")
tr = trace.copy_to_host().reshape(items, 4).astype(np.int64)
t0 = tr[:, 0].min()
tr = (tr - t0) / 1000.0  # us
end = tr[:, 3].max()
print(f"first ticket 0, last ticket {tr[:, 0].max():.1f} us, last done {end:.1f} us")
d = np.diff(tr, axis=1)
print(
    "per item, median / 10% / 90% us: load",
    np.percentile(d[:, 0], [50, 10, 90]).round(2),
    "wait",
    np.percentile(d[:, 1], [50, 10, 90]).round(2),
    "write",
    np.percentile(d[:, 2], [50, 10, 90]).round(2),
)
first = tr[:, 0].argsort()[: how.grid]
print(
    "first round: loaded by",
    np.percentile(tr[first, 1], [10, 50, 90]).round(1),
    "go at",
    np.percentile(tr[first, 2], [10, 50, 90]).round(1),
    "done at",
    np.percentile(tr[first, 3], [10, 50, 90]).round(1),
)
bins = np.arange(0, end + 2, 2.0)
print(" t(us)  loading  waiting  writing  (blocks, of", how.grid, ")")
for b in bins:
    mid = b + 1.0
    lo = ((tr[:, 0] <= mid) & (mid < tr[:, 1])).sum()
    wa = ((tr[:, 1] <= mid) & (mid < tr[:, 2])).sum()
    wr = ((tr[:, 2] <= mid) & (mid < tr[:, 3])).sum()
    print(f"{b:6.0f} {lo:8d} {wa:8d} {wr:8d}")
