#!/usr/bin/env bash
# Where a later (warm-cache) CLI run's wall time goes, on a GPU machine: `blur` and
# `classify` each run twice to warm the caches, then once under `python -X importtime`
# (imports, microseconds) and once under cProfile (cumulative, top 40), beside the cv2
# one-liner. Usage: bash benchmarks/profile_cli.sh OUTDIR
set -uo pipefail
out=${1:?usage: profile_cli.sh OUTDIR}
source "$(dirname "$0")/cli_setup.sh"
blur=(-m imgfilter blur "$img" --k 21 -o "$out/b.jpg" --force)
classify=(-m imgfilter classify samples/astronaut.jpg --model samples/classify/astronaut.model.npz -o "$out/l.png" --force)
wall() {  # label, command...
    local label=$1; shift
    local t0=$(date +%s.%N)
    "$@" > /dev/null 2>&1
    local t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v l="$label" 'BEGIN { printf "%-24s %6.2f s\n", l, b - a }' >> "$out/walls.txt"
}
for name in blur classify; do
    declare -n cmd=$name
    python3 "${cmd[@]}" > /dev/null 2>&1
    python3 "${cmd[@]}" > /dev/null 2>&1
    python3 -X importtime "${cmd[@]}" 2> "$out/$name-importtime.txt" > /dev/null
    sort -t'|' -k2 -n -r "$out/$name-importtime.txt" | head -40 > "$out/$name-imports-top.txt"
    python3 -m cProfile -s cumulative "${cmd[@]}" 2>&1 | head -80 > "$out/$name-profile.txt"
    for run in 1 2 3; do
        wall "$name" python3 "${cmd[@]}"
    done
done
for run in 1 2 3; do
    wall "cv2 blur one-liner" python3 -c "import cv2; cv2.imwrite('$out/cv.jpg', cv2.blur(cv2.imread('$img'), (21, 21)))"
done
cat "$out/walls.txt"
