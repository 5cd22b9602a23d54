#!/usr/bin/env bash
# Wall time of whole CLI commands on a GPU machine: run 1 on an empty kernel cache
# (the shipped kernels only), runs 2 and 3 after it, next to OpenCV one-liners and bare
# imports; then the first call of each API function, each in a fresh process with an
# empty cache (benchmarks/first_call.py). Usage: bash benchmarks/cold_start.sh OUTDIR
# Runs `python3 -m imgfilter` from the tree; the cache goes to a fresh directory
# (NUMBA_CACHE_DIR too). IMGFILTER_NO_PREBUILT=1 measures without the shipped kernels.
set -uo pipefail
out=${1:?usage: cold_start.sh OUTDIR}
source "$(dirname "$0")/cli_setup.sh"
python3 -c "import numpy as np; np.save('$out/k21.npy', np.random.default_rng(0).standard_normal((21, 21)).astype('float32') / 21)"
wall() {  # label, command...
    local label=$1; shift
    local t0=$(date +%s.%N)
    "$@" > /dev/null 2> "$out/last.err" || echo "  ($label failed: $(tail -1 "$out/last.err"))"
    local t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v l="$label" 'BEGIN { printf "%-58s %6.2f s\n", l, b - a }'
}
for run in 1 2 3; do
    wall "imgfilter blur --k 21 (run $run)" python3 -m imgfilter blur "$img" --k 21 -o "$out/b.jpg" --force
done
for run in 1 2 3; do  # auto runs one small image's blur on the CPU: this is the GPU's
    wall "imgfilter blur --k 21 --backend cuda (run $run)" python3 -m imgfilter blur "$img" --k 21 -o "$out/b.jpg" --force --backend cuda
done
for run in 1 2 3; do
    wall "imgfilter contour (run $run)" python3 -m imgfilter contour "$img" -o "$out/c.png" --force
done
for run in 1 2 3; do
    wall "imgfilter filter --kernel k21.npy (run $run)" python3 -m imgfilter filter "$img" --kernel "$out/k21.npy" -o "$out/f.jpg" --force
done
for run in 1 2 3; do
    wall "imgfilter train 512x512 (run $run)" python3 -m imgfilter train samples/astronaut.jpg samples/classify/astronaut.scribbles.png -o "$out/m.npz" --force
done
for run in 1 2 3; do
    wall "imgfilter classify 512x512 (run $run)" python3 -m imgfilter classify samples/astronaut.jpg --model samples/classify/astronaut.model.npz -o "$out/l.png" --force
done
for run in 1 2; do
    wall "cv2 one-liner: imread + blur 21 + imwrite" python3 -c "import cv2; cv2.imwrite('$out/cb.jpg', cv2.blur(cv2.imread('$img'), (21, 21)))"
    wall "cv2 one-liner: imread + filter2D 21x21 + imwrite" python3 -c "import cv2, numpy as np; cv2.imwrite('$out/cf.jpg', cv2.filter2D(cv2.imread('$img'), -1, np.load('$out/k21.npy')))"
done
wall "python3 -c pass" python3 -c pass
wall "import numpy" python3 -c "import numpy"
wall "import cv2" python3 -c "import cv2"
wall "from numba import cuda" python3 -c "from numba import cuda"
wall "imgfilter --help" python3 -m imgfilter --help
python3 -X importtime -m imgfilter blur "$img" --k 21 -o "$out/b.jpg" --force 2> "$out/importtime.txt" > /dev/null
sort -t'|' -k2 -n -r "$out/importtime.txt" | head -12
python3 - "$img" "$out" <<'PY'
import sys, time
t = time.perf_counter(); import numpy as np; t_np = time.perf_counter() - t
t = time.perf_counter(); import cv2; t_cv = time.perf_counter() - t
t = time.perf_counter(); im = cv2.imread(sys.argv[1]); t_read = time.perf_counter() - t
t = time.perf_counter(); cv2.imwrite(sys.argv[2] + "/w.jpg", im); t_write = time.perf_counter() - t
t = time.perf_counter()
from kernels.common.cudadrv import driver
d = driver(); t_ctx = time.perf_counter() - t
print(f"numpy {t_np:.3f} s, cv2 {t_cv:.3f} s, decode {t_read:.3f} s, encode {t_write:.3f} s, driver+context {t_ctx:.3f} s")
PY
for op in blur filter2d contour softmax gemv train predict; do
    IMGFILTER_CACHE_DIR=$(mktemp -d) NUMBA_CACHE_DIR=$(mktemp -d) python3 benchmarks/first_call.py $op
done
