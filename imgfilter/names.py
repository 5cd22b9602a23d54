"""The names and limits the command line offers before it imports NumPy: methods,
borders and kernel sizes (the standard library only, so `imgfilter --help` stays
cheap). `imgfilter.api` and `imgfilter.border` check values against these."""

from __future__ import annotations

# The kernels each operation can be asked to run by name (`method=`, `--method`).
FILTER_METHODS = ("auto", "naive", "padded", "tiled", "window", "blocked", "separable")
BLUR_METHODS = ("auto", "tiled", "twopass", "fused", "packed", "running", "separable")
CONTOUR_METHODS = ("auto",)
METHODS = tuple(dict.fromkeys(FILTER_METHODS + BLUR_METHODS))  # what --method accepts
BORDER_NAMES = ("reflect101", "reflect", "replicate", "constant", "wrap")
MAX_KERNEL_SIDE = 255  # general kernels: taps per output grow as side**2
MAX_BOX_SIDE = 4095  # box filters cost O(side) per output, but bigger is surely a typo
