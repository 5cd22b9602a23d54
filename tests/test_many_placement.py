"""Where each of many images is filtered (issue 57): files.run_pipeline's placement of
`compute` (on the codec thread, in the calling thread, on filter threads), the CLI's
placement rule (filtering.Placement), the GPU's page-locked staging (filtering.on_gpu),
the per-stage timings (IMGFILTER_TIMINGS) and the default --jobs.

The CLI runs in process (test_cli.run); the CUDA backend on Numba's simulator.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_cli import imread, run
from test_cli_many import imwrite, lines, random_image

from imgfilter import files
from imgfilter import io as iio
from imgfilter.cli import filtering, many

BOX5 = "1,1,1,1,1;" * 4 + "1,1,1,1,1"  # 25 taps: past the codec threads' share


def _jobs(n: int) -> list[files.Job]:
    return [files.Job(Path(f"{i}.png"), Path(f"{i}.out.png")) for i in range(n)]


# ------------------------------------------------------------------------ pipeline


def test_pipeline_filters_in_the_calling_thread_only():
    threads = set()
    live = [0, 0]
    lock = threading.Lock()

    def load(job):
        with lock:
            live[0] += 1
            live[1] = max(live[1], live[0])
        return job

    def compute(job, loaded):
        threads.add(threading.get_ident())
        return loaded

    def save(job, loaded, result):
        with lock:
            live[0] -= 1

    stats = files.run_pipeline(_jobs(20), load=load, compute=compute, save=save, workers=4,
                               depth=2)  # fmt: skip
    assert threads == {threading.get_ident()}
    assert stats.written == 20 and live[1] <= 2


def test_pipeline_filters_where_here_says_on_the_thread_that_loaded():
    """Images `here` picks are filtered and saved on the codec thread that read them,
    the others on the filter threads; every stage is timed once per image."""
    loaded_on, filtered_on, saved_on = {}, {}, {}

    def load(job):
        loaded_on[job.source.name] = threading.get_ident()
        return int(job.source.stem)

    def compute(job, n):
        filtered_on[job.source.name] = threading.get_ident()
        return -n

    def save(job, n, result):
        assert result == -n
        saved_on[job.source.name] = threading.get_ident()

    stats = files.run_pipeline(_jobs(30), load=load, compute=compute, save=save, workers=3,
                               filters=2, here=lambda job, n: n % 3 == 0)  # fmt: skip
    assert stats.written == 30 and stats.failed == 0
    mine = threading.get_ident()
    for name, thread in filtered_on.items():
        if int(name.split(".")[0]) % 3 == 0:
            assert thread == loaded_on[name] == saved_on[name] != mine
        else:
            assert thread != loaded_on[name] and thread != mine
    clock = stats.timings
    assert clock.counts == {files.READ: 30, files.FILTER_HERE: 10, files.FILTER_THREAD: 20,
                            files.WRITE: 30}  # fmt: skip
    assert all(seconds >= 0 for seconds in clock.seconds.values())


def test_pipeline_here_failing_fails_that_image_only():
    def here(job, loaded):
        if job.source.name == "3.png":
            raise ValueError("cannot place it")
        return True

    written = []
    stats = files.run_pipeline(
        _jobs(8), load=lambda job: job, compute=lambda job, x: x,
        save=lambda job, x, r: written.append(job.source.name), workers=2, here=here,
    )  # fmt: skip
    assert stats.failed == 1 and stats.written == 7 and "3.png" not in written


def test_pipeline_fatal_on_a_codec_thread_stops_the_run():
    def compute(job, loaded):
        if job.source.name == "5.png":
            raise files.Fatal(RuntimeError("the GPU fell off the bus"))
        time.sleep(0.002)
        return loaded

    stats = files.run_pipeline(_jobs(200), load=lambda job: job, compute=compute,
                               save=lambda *a: None, workers=2, depth=3,
                               here=lambda job, x: True)  # fmt: skip
    assert str(stats.fatal) == "the GPU fell off the bus"
    assert stats.failed == 1 and stats.written < 199


@pytest.mark.parametrize("filters", [1, 3])
def test_pipeline_filter_threads_and_a_fatal_error(filters):
    """filters=N computes on N threads of its own (1: the calling thread); a Fatal
    stops the run (counted once), images not yet filtered are dropped."""
    threads, written = set(), []
    lock = threading.Lock()

    def compute(job, loaded):
        with lock:
            threads.add(threading.get_ident())
        if job.source.name == "30.png":
            raise files.Fatal(RuntimeError("the GPU fell off the bus"))
        if job.source.name == "7.png":
            raise ValueError("a bad image")
        time.sleep(0.002)
        return loaded

    def save(job, loaded, result):
        with lock:
            written.append(job.source.name)

    stats = files.run_pipeline(_jobs(40), load=lambda job: job, compute=compute, save=save,
                               workers=4, depth=6, filters=filters)  # fmt: skip
    assert str(stats.fatal) == "the GPU fell off the bus"
    assert "7.png" not in written and "30.png" not in written
    assert stats.failed >= 2 and stats.written == len(written) < 40
    if filters == 1:
        assert threads == {threading.get_ident()}
    else:
        assert threading.get_ident() not in threads and 1 <= len(threads) <= 3


def test_pipeline_filter_threads_write_every_image():
    out = {}
    stats = files.run_pipeline(
        _jobs(50), load=lambda job: job.source.name, compute=lambda job, loaded: loaded.upper(),
        save=lambda job, loaded, result: out.__setitem__(job.source.name, result),
        workers=3, depth=5, filters=4,
    )  # fmt: skip
    assert stats.written == 50 and stats.failed == 0 and stats.fatal is None
    assert out == {f"{i}.png": f"{i}.PNG" for i in range(50)}


@pytest.mark.parametrize("filter_args", [["blur", "--k", "3"], ["filter", "--kernel", BOX5]])
def test_images_in_memory_are_bounded(tmp_path, monkeypatch, filter_args):
    """--jobs 1: at most default_depth(1) = 3 images read and not yet written, however
    many files, whether the filter runs on the codec thread (blur) or not (a 5x5
    filter); reads wait while the first write is held back."""
    src = tmp_path / "in"
    for i in range(30):
        imwrite(src / f"i{i:02d}.png", random_image((8, 8), i))
    reads = []
    real_read, real_write = iio.read_image, iio.write_image
    at_first_write = []

    def read(path):
        reads.append(path)
        return real_read(path)

    def write(path, img, **kw):
        if not at_first_write:
            time.sleep(0.3)  # room for reads to run ahead, if nothing held them back
            at_first_write.append(len(reads))
        return real_write(path, img, **kw)

    monkeypatch.setattr(iio, "read_image", read)
    monkeypatch.setattr(iio, "write_image", write)
    result = run(*filter_args[:1], src, *filter_args[1:], "--backend", "cpu", "-j", "1",
                 "--out-dir", tmp_path / "o")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(reads) == 30
    bound = files.default_depth(1)
    assert at_first_write[0] <= bound
    assert files.last_stats is not None and files.last_stats.peak_in_memory <= bound


def test_default_jobs_is_the_cpu_count(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert files.default_workers() == 16
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert files.default_workers() == 1


# ------------------------------------------------------------------ placement rule


def test_placement_rule():
    """Cheap filters (integer boxes, contour, filter2d up to 15 taps) on the codec
    threads; filter2d from 16 taps and float32 boxes on the resolved backend; with
    --backend cuda or a --method every image on the GPU."""
    u8, u16, f32 = (np.zeros((4, 4, 3), t) for t in (np.uint8, np.uint16, np.float32))
    auto = filtering.Placement("blur", 0, "cuda", gpu_only=False)
    assert auto.here(u8) and auto.here(u16) and not auto.here(f32)
    assert auto.backend_for(u8) == "cpu" and auto.backend_for(f32) == "cuda"
    assert filtering.Placement("filter", 15, "cuda", gpu_only=False).here(u8)
    assert not filtering.Placement("filter", 16, "cuda", gpu_only=False).here(u8)
    assert not filtering.Placement("filter", 441, "cpu", gpu_only=False).here(u8)
    assert filtering.cpu_ns_per_value("filter", np.uint8, 15) <= filtering.CODEC_THREAD_NS
    assert filtering.cpu_ns_per_value("filter", np.uint8, 16) > filtering.CODEC_THREAD_NS
    forced = filtering.Placement("blur", 0, "cuda", gpu_only=True)
    assert not forced.here(u8) and forced.backend_for(u8) == "cuda"
    # --method without a GPU: the CPU backend runs, cheap filters on the codec threads
    assert filtering.Placement("blur", 0, "cpu", gpu_only=True).here(u8)


def test_contour_leaves_the_codec_threads_once_numba_is_loaded(monkeypatch):
    contour = filtering.Placement("contour", 0, "cuda", gpu_only=False)
    gray = np.zeros((4, 4), np.uint8)
    monkeypatch.setitem(sys.modules, "numba", sys.modules.get("numba", object()))
    assert not contour.here(gray)
    monkeypatch.delitem(sys.modules, "numba")
    assert contour.here(gray)


def _timings(stderr: str) -> str:
    found = [line for line in lines(stderr) if line.startswith("imgfilter: timings: ")]
    assert len(found) == 1, stderr
    return found[0]


def _tree(src: Path) -> list[Path]:
    return [imwrite(src / f"c{i}.png", random_image((20 + i, 24, 3), i)) for i in range(4)] + [
        imwrite(src / "g.png", random_image((17, 19), 9))
    ]


@pytest.mark.parametrize(
    ("filter_args", "stage"),
    [(["blur", "--k", "5"], "filter on the codec thread"),
     (["filter", "--kernel", BOX5], "filter in a filter thread")],
)  # fmt: skip
def test_timings_line_names_where_the_cpu_filtered(tmp_path, monkeypatch, filter_args, stage):
    inputs = _tree(tmp_path / "in")
    monkeypatch.setenv(many.TIMINGS_ENV, "1")
    result = run(filter_args[0], tmp_path / "in", *filter_args[1:], "--backend", "cpu",
                 "--out-dir", tmp_path / "o", "-j", "2", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    line = _timings(result.stderr)
    n = len(inputs)
    for part in ("read+decode", stage, "encode+write"):
        assert f"{part} " in line and f" ms x {n}" in line.split(part, 1)[1].split(",")[0], line
    assert "codec threads 2 busy" in line
    assert ("filter threads 1 busy" in line) == (stage == "filter in a filter thread")


def test_no_timings_line_without_the_variable(tmp_path, monkeypatch):
    _tree(tmp_path / "in")
    monkeypatch.delenv(many.TIMINGS_ENV, raising=False)
    result = run("blur", tmp_path / "in", "--k", "3", "--backend", "cpu", "--out-dir",
                 tmp_path / "o")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "timings" not in result.stderr


@pytest.mark.parametrize(
    "filter_args", [["blur", "--k", "5"], ["filter", "--kernel", BOX5], ["contour"]]
)
def test_gpu_route_writes_what_the_cpu_writes(tmp_path, monkeypatch, filter_args):
    """--backend cuda (the simulator): every image through on_gpu's staging buffers in
    the filter threads, outputs equal to the CPU backend's byte for byte."""
    inputs = _tree(tmp_path / "in")
    monkeypatch.setenv(many.TIMINGS_ENV, "1")
    args = [filter_args[0], tmp_path / "in", *filter_args[1:], "-j", "2", "--out-dir"]
    gpu = run(*args, tmp_path / "gpu", "--backend", "cuda")
    cpu = run(*args, tmp_path / "cpu", "--backend", "cpu")
    assert gpu.exit_code == 0 and cpu.exit_code == 0, (gpu.output, cpu.output)
    line = _timings(gpu.stderr)
    n = len(inputs)
    for part in ("copy in", "GPU upload+filter+download", "copy out", "filter in a filter thread"):
        assert f"{part} " in line and f" ms x {n}" in line.split(part, 1)[1].split(",")[0], line
    assert "filter on the codec thread" not in line
    assert "(cuda/auto, " in gpu.stderr and "(cpu, " in cpu.stderr
    for p in (tmp_path / "cpu").iterdir():
        assert (imread(tmp_path / "gpu" / p.name) == imread(p)).all(), p.name
    assert len(list((tmp_path / "gpu").iterdir())) == n


def test_on_gpu_stages_through_kept_buffers_and_falls_back_without_them(monkeypatch):
    from imgfilter import pinned

    taken, kept = [], []

    def take(shape, dtype, drv):
        arr = np.empty(shape, dtype)
        taken.append(id(arr))
        return arr, id(arr)

    monkeypatch.setattr(pinned, "take", take)
    monkeypatch.setattr(pinned, "keep", kept.append)
    calls = []

    def apply(img, backend_name, out=None):
        calls.append((backend_name, out is not None))
        if out is None:
            return img + 1
        out[...] = img + 1
        return out

    clock = files.Timings()
    img = random_image((6, 5, 3), 1)
    res = filtering.on_gpu(apply, img, img.shape, clock)
    np.testing.assert_array_equal(res, img + 1)
    assert calls == [("cuda", True)] and sorted(kept) == sorted(taken) and len(taken) == 2
    assert set(clock.counts) == {many.COPY_IN, many.GPU, many.COPY_OUT}
    # past the page-locked limit: the image goes as it is, nothing held
    monkeypatch.setattr(pinned, "take", lambda shape, dtype, drv: None)
    res = filtering.on_gpu(apply, img, img.shape, clock)
    np.testing.assert_array_equal(res, img + 1)
    assert calls[-1] == ("cuda", False)
    # a failing filter hands its buffers back
    monkeypatch.setattr(pinned, "take", take)
    taken.clear(), kept.clear()

    def broken(img, backend_name, out=None):
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        filtering.on_gpu(broken, img, img.shape, clock)
    assert sorted(kept) == sorted(taken) and len(taken) == 2


def test_cheap_and_costly_images_of_one_run_go_both_ways(tmp_path, monkeypatch):
    """--backend auto with a GPU (made to resolve so on the simulator): the uint8 images'
    blur on the codec threads, the float32 image's on the GPU; one summary names both,
    and the outputs equal the CPU backend's."""
    src = tmp_path / "in"
    _tree(src)
    iio.write_image(src / "f.tif", np.random.default_rng(3).random((12, 10, 3), np.float32))
    monkeypatch.setenv(many.TIMINGS_ENV, "1")
    cpu = run("blur", src, "--k", "3", "--backend", "cpu", "--out-dir", tmp_path / "cpu")
    monkeypatch.setattr(filtering, "resolve_backend", lambda backend: "cuda")
    both = run("blur", src, "--k", "3", "--out-dir", tmp_path / "both", "-j", "2")
    assert cpu.exit_code == 0 and both.exit_code == 0, (cpu.output, both.output)
    assert "(cpu + cuda/auto, " in both.stderr, both.stderr
    line = _timings(both.stderr)
    for stage, n in (("filter on the codec thread", 5), ("filter in a filter thread", 1),
                     ("GPU upload+filter+download", 1)):  # fmt: skip
        assert line.split(f"{stage} ", 1)[1].split(",")[0].endswith(f" ms x {n}"), line
    for p in (tmp_path / "cpu").iterdir():
        assert (iio.read_image(tmp_path / "both" / p.name) == iio.read_image(p)).all(), p.name
