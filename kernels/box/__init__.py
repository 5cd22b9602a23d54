"""Normalized box filters (cv2.blur semantics).

`plan` (launch geometry and the choice among the kernels, free of Numba: the quick
start plans with it), the kernels (`tiled`, `twopass`, `fused`, `packed`, and
`running` for `box_separable` and `box_running`; `lanes` and `tile_load` hold what
several of them share) and the entry point `dispatch.box_auto`. Nothing is imported
here, so `kernels.box.plan` stays free of Numba.
"""
