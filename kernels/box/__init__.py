"""Normalized box filters (cv2.blur semantics).

`plan` (launch geometry, the choice among the kernels and the stand-in while one
compiles), the kernels (Numba: `tiled`, `twopass`, `fused`, `packed`,
`running_kernels`; `lanes` and `tile_load` hold what several of them share), their
launches by name without Numba (`launch`, and `running` for `box_separable` and
`box_running`) and the entry point `dispatch.box_auto`. Nothing is imported here.
"""
