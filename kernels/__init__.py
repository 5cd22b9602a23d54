"""Device code for imgfilter: Numba CUDA kernels and their launch functions.

Nothing here reads files, calls OpenCV or parses options: functions take and return
device arrays (or host arrays, which they copy to the device and back).
Submodules are imported on demand because importing numba.cuda is slow.
"""
