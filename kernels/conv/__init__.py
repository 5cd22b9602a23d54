"""2-D correlation (cv2.filter2D semantics).

`plan` (launch geometry, low-rank factors and the choice of method), the kernels
(Numba: `generic`: naive, padded and tiled; `window`; `blocked`: register-blocked,
generated per kernel size), their launches (`launch`: blocked, low-rank and separable,
naming the kernels without importing Numba) and the entry point `dispatch.correlate`.
Nothing is imported here.
"""
