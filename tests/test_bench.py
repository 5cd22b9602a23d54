"""The benchmark harness (benchmarks/bench.py, benchmarks/pipeline.py), loaded as
`imgfilter bench` loads it: the pure-Python baseline, the table, and (on a GPU) a run."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from test_binaries import no_device_fixture  # noqa: F401 - the fixture no_device

from imgfilter.cli.bench import SIZES, harness_module
from imgfilter.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
bench = harness_module("bench", (ROOT,))
pb = harness_module("pipeline", (ROOT,))


def test_the_command_offers_the_harness_sizes():
    assert SIZES == tuple(bench.SHAPES)


def test_without_a_checkout_the_command_says_where_the_harness_is(tmp_path):
    with pytest.raises(UsageError, match=r"benchmarks/bench\.py of a source checkout"):
        harness_module("bench", (tmp_path,))


def test_pure_python_correlate_matches_opencv():
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (7, 9, 3), dtype=np.uint8)
    kernel = rng.standard_normal((5, 3)).astype(np.float32)
    want = cv2.filter2D(img.astype(np.float32), -1, kernel, borderType=cv2.BORDER_REFLECT_101)
    np.testing.assert_allclose(bench.pure_python_correlate(img, kernel), want, rtol=1e-5, atol=1e-3)


def _row(impl, kernel_us=None, call_us=None, **extra):
    return {
        "op": "blur k=21", "size": "seed", "impl": impl, "kernel_us": kernel_us,
        "call_us": call_us, "note": "", "extra": extra,
    }  # fmt: skip


def test_table_shows_ratios_to_imgfilter_and_floor():
    ours_extra = {"GB/s": 320.0, "x_floor": 8.7, "floor": "bytes", "Mpix/s": 54000.0}
    result = {
        "device": "GPU", "date": "2026-11-22", "copy_bandwidth_GBps": 2800.0,
        "fma_rate_TFMAps": 30.0, "notes": {"cupy": "not installed: skipped"},
        "rows": [
            _row("imgfilter cuda", 100.0, 150.0, **ours_extra),
            _row("cupy uniform_filter", 2500.0),
            _row("opencv cpu cv2.blur", call_us=20000.0),
        ],
    }  # fmt: skip
    lines = bench.print_table(result).splitlines()
    ours, cupy, opencv = (
        next(x for x in lines if name in x) for name in ("imgfilter", "cupy", "opencv")
    )
    assert "8.7 bytes" in ours and ours.rstrip().endswith("1.0")
    assert cupy.rstrip().endswith("25.0")
    assert opencv.rstrip().endswith("200.0")
    assert lines[-1] == "cupy: not installed: skipped"


def test_low_rank_case_runs_both_methods():
    # The timer stubbed (the simulator has no spin kernel worth timing): each method is
    # launched once and recorded with its bytes and FMA floors.
    class Timer:
        def kernel_us(self, fn, launches):
            fn()
            return 100.0

    ctx = object.__new__(bench._Context)
    ctx.timer, ctx.bandwidth, ctx.tfmas, ctx.rows, ctx.ahead = Timer(), 1000.0, 10.0, [], {}
    img = np.random.default_rng(4).integers(0, 256, (9, 12, 3), dtype=np.uint8)
    bench._bench_low_rank(ctx, "tiny", img, 5, 2)
    assert [r.impl for r in ctx.rows] == ["imgfilter cuda blocked", "imgfilter cuda separable"]
    assert {r.op for r in ctx.rows} == {"filter2d 5x5 rank 2"}
    assert all(r.extra["x_floor"] > 0 for r in ctx.rows)


@pytest.mark.gpu
def test_bench_run_measures_every_case():
    result = bench.run(("seed",), box_ks=(3,), filter_ks=(3,), quick=True, low_rank=((5, 2),))
    impls = {r["impl"] for r in result["rows"]}
    want = {"imgfilter cuda (box_tiled)", "opencv cpu cv2.blur", "cpu pure Python"}
    assert want <= impls
    assert result["copy_bandwidth_GBps"] > 100 and result["fma_rate_TFMAps"] > 1
    for r in result["rows"]:
        assert (r["kernel_us"] or r["call_us"]) > 0, r


def test_compile_ahead_starts_only_the_kernels_without_a_binary(no_device, monkeypatch):
    """One background compile per blocked kernel that has no binary, under the name the
    launch layer looks it up by; none for one that has, or with background compiles
    off; nothing launched."""
    from imgfilter.backends import background
    from imgfilter.backends import cuda as backend

    monkeypatch.setattr(backend, "_WEIGHTS", {})  # no made-up device weights kept
    started = []
    monkeypatch.setattr(background, "start", lambda name, code: started.append(code) or True)
    names = bench.compile_ahead([3, 9, 21])
    assert sorted(names) == [(3, 3), (9, 9), (21, 21)]
    assert all(n.startswith("launch-") for n in names.values()) and len(set(names.values())) == 3
    assert started == [f"import imgfilter.backends.cuda as c; c.compile_blocked({names[k, k]!r}, "
                       f"{k}, {k}, 'uint8')" for k in (3, 9, 21)]  # fmt: skip
    no_device.found[names[9, 9]] = (b"cubin", "_Zblocked")  # compiled: nothing to start
    started.clear()
    assert bench.compile_ahead([3, 9, 21]) == {(3, 3): names[3, 3], (21, 21): names[21, 21]}
    assert len(started) == 2 and no_device.driver.launched == []
    monkeypatch.setattr(background, "start", lambda name, code: False)  # off
    assert bench.compile_ahead([3]) == {}


def test_await_compile_waits_for_the_marker_and_gives_up_after_the_timeout(monkeypatch, tmp_path):
    import threading

    from kernels.common import binaries

    marker = tmp_path / "k.pending"
    monkeypatch.setattr(binaries, "pending_marker", lambda name: marker)
    assert bench.await_compile("k", timeout_s=0.0)  # no marker: nothing to wait for
    marker.write_text("1")
    assert not bench.await_compile("k", timeout_s=0.2)
    timer = threading.Timer(0.2, marker.unlink)
    timer.start()
    assert bench.await_compile("k", timeout_s=10.0)
    assert not marker.exists()
    timer.join()


def test_pipeline_per_call_is_the_median_loop_and_loops_share_the_time_cap():
    # The median loop's own (per call, host) pair, not medians taken apart.
    assert pb.median_loop([(30.0, 1.0), (10.0, 9.0), (20.0, 5.0)]) == (20.0, 5.0)
    assert pb.median_loop([(12.0, 3.0), (11.0, 4.0)]) == (11.0, 4.0)
    opts = pb.Options(calls=1000, kernel_calls=200, windows=3, max_seconds=1.5, loops=5)
    assert pb._calls_for(1e-5, opts) == 1000  # 5 x 1000 x 10 us = 50 ms: all calls
    assert pb._calls_for(1e-3, opts) == 300  # 1.5 s over 5 loops of 1 ms calls
    assert pb._calls_for(1.0, opts) == 10  # never fewer than min_calls
