#!/usr/bin/env bash
# Run the tests marked `gpu` of the given test files in N pytest processes at once, so
# that the per-shape JIT compiles (most of a softmax gpu test's ~15 s) use N CPU cores;
# then those also marked `gpu_alone` (they fill the GPU's memory) in one process.
# Keep N small for tests/test_softmax.py: its full-shape tests each hold several GiB.
# usage: bash tools/gpu_tests.sh N OUTDIR tests/test_a.py [tests/test_b.py ...]
# Writes each process's whole output as OUTDIR/part_*.txt while it runs (a run cut short
# keeps what it got) and OUTDIR/summary.txt (every failure and each process's last line).
set -u
n=$1
out=$2
shift 2
parts=$(mktemp -d)
ids="$parts/ids"
python3 -m pytest --collect-only -q -m "gpu and not gpu_alone" "$@" 2>/dev/null | grep "::" > "$ids"
echo "$(wc -l < "$ids") gpu tests in $n processes" | tee "$out/summary.txt"
if [[ ! -s "$ids" ]]; then  # a part without ids would run every gpu test of the suite
    echo "gpu_tests: no gpu tests collected from: $* (a missing file? see pytest --collect-only)" |
        tee -a "$out/summary.txt" >&2
    exit 2
fi
split -n "r/$n" "$ids" "$parts/part_"
for f in "$parts"/part_*; do
  mapfile -t tests < "$f"  # one argument per test id (ids may hold spaces)
  python3 -m pytest -q -m gpu -p no:cacheprovider "${tests[@]}" > "$out/$(basename "$f").txt" 2>&1 &
done
wait
# Tests that fill the GPU's memory, alone: beside others they would starve them.
python3 -m pytest -q -m "gpu and gpu_alone" -p no:cacheprovider "$@" > "$out/part_zz_alone.txt" 2>&1
for f in "$out"/part_*.txt; do
  grep -E "^(FAILED|ERROR)" "$f"
  tail -n 1 "$f"
done | tee -a "$out/summary.txt"
rm -rf "$parts"
