"""The layer every operation package of `kernels` uses, and which uses none of them.

Host side: `launch` (launching compiled kernels through the driver, launch geometry,
recordings, batches), `cudadrv` (the CUDA driver through cuda.bindings), `devarray` (device
arrays and the stream-ordered pool), `arrays` (host/device array helpers), `cache`
(where compiled kernels are kept), `shipped` (the kernel binaries in kernels/prebuilt),
`timing`. Device side: `packs` (vector loads and stores), `reduce` (warp and block
reductions), `int_ops` (integer intrinsics), and the plain-Python `border_index`,
`saturate` and `gray`, which `device` compiles into device functions (the CPU backend
runs the same sources). Only modules under kernels/common may be imported from here.
"""
