#!/usr/bin/env bash
# Run the tests marked `gpu` of the given test files in N pytest processes at once, so
# that the per-shape JIT compiles (most of a softmax gpu test's ~15 s) use N CPU cores.
# usage: bash benchmarks/gpu_tests.sh N OUTDIR tests/test_a.py [tests/test_b.py ...]
# Each process writes OUTDIR/tests_part_XX.txt; the summary lines are printed at the end.
set -u
n=$1
out=$2
shift 2
ids=$(mktemp)
python3 -m pytest --collect-only -q -m gpu "$@" 2>/dev/null | grep "::" > "$ids"
echo "$(wc -l < "$ids") gpu tests in $n processes"
split -n "r/$n" "$ids" "$ids.part_"
for f in "$ids".part_*; do
  # shellcheck disable=SC2046  # one argument per test id
  python3 -m pytest -q -m gpu -p no:cacheprovider $(cat "$f") > "$out/tests_${f##*.}.txt" 2>&1 &
done
wait
tail -n 1 "$out"/tests_part_*.txt
