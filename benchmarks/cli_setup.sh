# Shared setup of benchmarks/cold_start.sh and benchmarks/profile_cli.sh (sourced, with
# $out set): fresh kernel caches, bytecode for everything on the path, and $img, the
# sample photo resized to 2495x2167 (the seed size) as a JPEG in $out.
mkdir -p "$out"
export IMGFILTER_CACHE_DIR=$(mktemp -d) NUMBA_CACHE_DIR=$(mktemp -d)
# Bytecode for everything on the path, as `pip install` leaves it (a tree run from
# source, or wheels installed with --no-compile, would compile every module each run).
python3 -m compileall -q -j 0 imgfilter kernels ${PYTHONPATH//:/ } > /dev/null 2>&1
img=$out/in.jpg
python3 -c "import cv2; im = cv2.imread('samples/astronaut.jpg'); cv2.imwrite('$img', cv2.resize(im, (2495, 2167)))"
