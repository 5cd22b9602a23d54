"""The contour map (four 3x3 direction filters, saturated and OR-merged).

`plan` (launch geometry and arguments, free of Numba: the quick start plans with it)
and `kernel` (the fused kernel and its entry point, `contour`). Nothing is imported
here, so `kernels.contour.plan` stays free of Numba.
"""
