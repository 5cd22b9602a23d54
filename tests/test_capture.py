"""Calls captured into a CUDA graph (`torch.cuda.graph`) replay correctly: imgfilter's
launches on torch tensors go to torch's current stream, allocate nothing from CUDA
once warm on that stream, and wait for nothing, so a graph records them and each
replay filters the static input's new contents. As with torch's own modules, the
calls are warmed on the stream the graph is captured on, with the kernel named
(method auto may switch filter2d's kernel to the register-blocked one once a detached
compile finishes, which a capture in progress cannot take). Needs a real GPU and
PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ON_GPU

import imgfilter
from imgfilter.backends import opencv as ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a real GPU")]


def test_blur_and_filter2d_replay_from_a_captured_graph():
    torch = pytest.importorskip("torch")
    from kernels.common.devarray import DeviceArray

    rng = np.random.default_rng(4)
    kernel = rng.standard_normal((7, 7)).astype(np.float32)
    kernel /= np.abs(kernel).sum()
    static = torch.empty((720, 1280, 3), dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: plans, kernels and pool blocks made here,
        # results held as the captured calls hold them (a capture may allocate nothing)
        held = [(imgfilter.blur(static, 5), imgfilter.filter2d(static, kernel, method="blocked"))
                for _ in range(2)]  # fmt: skip
        del held
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # Captured on the warmed stream: a first call on a stream uploads the filter's
    # weights and takes its pool blocks, which a capture may not do.
    with torch.cuda.graph(graph, stream=side):
        blurred = imgfilter.blur(static, 5)
        filtered = imgfilter.filter2d(static, kernel, method="blocked")
    views = [torch.as_tensor(r, device="cuda") if isinstance(r, DeviceArray) else r
             for r in (blurred, filtered)]  # fmt: skip
    for seed in range(3):
        host = np.random.default_rng(seed).integers(1, 256, (720, 1280, 3), dtype=np.uint8)
        static.copy_(torch.from_numpy(host))
        graph.replay()
        torch.cuda.synchronize()
        got_blur, got_filter = (v.cpu().numpy() for v in views)
        want_blur = ref.blur(host, 5)
        assert np.abs(got_blur.astype(int) - want_blur.astype(int)).max() <= 1
        want_filter = ref.filter2d(host, kernel, None, "reflect101", 0.0).reshape(host.shape)
        assert np.abs(got_filter.astype(int) - want_filter.astype(int)).max() <= 1
