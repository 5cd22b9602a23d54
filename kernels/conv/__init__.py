"""2-D correlation (cv2.filter2D semantics).

`plan` (launch geometry, low-rank factors and the choice of method, free of Numba:
the quick start plans with it), the kernels (`generic`: naive, padded and tiled;
`blocked`: register-blocked, low-rank and separable) and the entry point
`dispatch.correlate`. Nothing is imported here, so `kernels.conv.plan` stays free of
Numba.
"""
