"""Where each of many images is filtered (issue 57): files.run_pipeline's placement of
`compute` (on the codec thread, in the calling thread, on filter threads), the placement
rule (imgfilter.placement) as the folder pipeline applies it, the per-stage timings
(IMGFILTER_TIMINGS) and the default --jobs.

The CLI runs in process (test_cli.run); the CUDA backend on Numba's simulator.
"""

from __future__ import annotations

import os
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
    real_read, real_stage = iio.read_image, iio.stage_image
    at_first_write = []

    def read(path):
        reads.append(path)
        return real_read(path)

    def stage(path, img, **kw):
        if not at_first_write:
            time.sleep(0.3)  # room for reads to run ahead, if nothing held them back
            at_first_write.append(len(reads))
        return real_stage(path, img, **kw)

    monkeypatch.setattr(iio, "read_image", read)
    monkeypatch.setattr(iio, "stage_image", stage)
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


def test_placement_rule(monkeypatch):
    """Under backend and method auto, cheap filters (integer boxes, contour, filter2d up
    to 15 taps) of images up to the size limit on the CPU; filter2d from 16 taps and
    float32 boxes not; backend cpu: every image; backend cuda or a method: none."""
    from imgfilter import placement
    from imgfilter.backends import warmup

    u8, u16, f32 = (np.zeros((4, 4, 3), t) for t in (np.uint8, np.uint16, np.float32))
    on_cpu = placement.on_cpu
    assert on_cpu("blur", u8) and on_cpu("blur", u16) and not on_cpu("blur", f32)
    assert on_cpu("contour", u16) and on_cpu("filter", u8, taps=15)
    assert not on_cpu("filter", u8, taps=16)
    assert placement.cpu_ns_per_value("filter", u8.dtype, 15) <= placement.CHEAP_NS
    assert placement.cpu_ns_per_value("filter", u8.dtype, 16) > placement.CHEAP_NS
    assert on_cpu("filter", f32, "CPU", taps=441) and on_cpu("blur", f32, "cpu", "tiled")
    assert not on_cpu("blur", u8, "cuda") and not on_cpu("blur", u8, "auto", "tiled")
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", u8.nbytes)
    monkeypatch.setattr(warmup, "BLUR_ON_CPU_BYTES_PER_CPU", 0)
    assert on_cpu("contour", u8) and not on_cpu("contour", u16)  # past the size limit
    assert placement.cpu_bytes("blur", u8.dtype) == u8.nbytes
    assert placement.cpu_bytes("blur", f32.dtype) == 0


def test_the_command_lines_first_image_goes_by_size_alone(monkeypatch):
    """Before a GPU is started, one image within the size limit stays on the CPU even
    where its filter is costly (a float32 box: the CPU is done before a CUDA context
    would be open); past the limit it does not."""
    from imgfilter import placement
    from imgfilter.backends import warmup

    f32 = np.zeros((4, 4, 3), np.float32)
    assert placement.first_image_on_cpu("blur", f32) and not placement.on_cpu("blur", f32)
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", f32.nbytes - 1)
    monkeypatch.setattr(warmup, "BLUR_ON_CPU_BYTES_PER_CPU", 0)
    assert not placement.first_image_on_cpu("blur", f32)


def test_cpu_contour_enters_numbas_pass_from_one_thread_at_a_time(monkeypatch):
    """Contours on several codec threads at once, Numba loaded: a call that finds
    another in Numba's parallel pass goes through OpenCV (the same result)."""
    from imgfilter.backends import cpu

    img = random_image((9, 7, 3), 4)
    monkeypatch.setattr(cpu, "_numba_loaded", lambda: True)
    opencv = []
    real = cpu._contour_opencv
    monkeypatch.setattr(cpu, "_contour_opencv", lambda *a: opencv.append(1) or real(*a))
    with cpu._numba_pass:  # another thread is in the pass
        taken = cpu.contour(img, 0, 0, "auto")
    assert opencv == [1]
    alone = cpu.contour(img, 0, 0, "auto")  # the pass is free: Numba's
    assert opencv == [1] and not cpu._numba_pass.locked()
    np.testing.assert_array_equal(taken, alone)


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
    """--backend cuda (the simulator): every image on the GPU in the filter threads,
    outputs equal to the CPU backend's byte for byte."""
    inputs = _tree(tmp_path / "in")
    monkeypatch.setenv(many.TIMINGS_ENV, "1")
    args = [filter_args[0], tmp_path / "in", *filter_args[1:], "-j", "2", "--out-dir"]
    gpu = run(*args, tmp_path / "gpu", "--backend", "cuda")
    cpu = run(*args, tmp_path / "cpu", "--backend", "cpu")
    assert gpu.exit_code == 0 and cpu.exit_code == 0, (gpu.output, cpu.output)
    line = _timings(gpu.stderr)
    n = len(inputs)
    for part in ("read+decode", "filter in a filter thread", "encode+write"):
        assert f"{part} " in line and f" ms x {n}" in line.split(part, 1)[1].split(",")[0], line
    assert "filter on the codec thread" not in line
    assert "(cuda/auto, " in gpu.stderr and "(cpu, " in cpu.stderr
    for p in (tmp_path / "cpu").iterdir():
        assert (imread(tmp_path / "gpu" / p.name) == imread(p)).all(), p.name
    assert len(list((tmp_path / "gpu").iterdir())) == n


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
    for stage, n in (("filter on the codec thread", 5), ("filter in a filter thread", 1)):
        assert line.split(f"{stage} ", 1)[1].split(",")[0].endswith(f" ms x {n}"), line
    for p in (tmp_path / "cpu").iterdir():
        assert (iio.read_image(tmp_path / "both" / p.name) == iio.read_image(p)).all(), p.name


def test_codec_threads_filter_without_row_bands(tmp_path, monkeypatch):
    """A blur on a codec thread runs as one cv2 call, not in row bands (its CPUs are busy
    with the other images); the same blur outside the pipeline bands; outputs equal."""
    import cv2

    from imgfilter.backends import cpu

    banded = []
    real = cpu._in_row_bands

    def counted(*args):
        done = real(*args)
        banded.append((threading.current_thread().name, done))
        return done

    monkeypatch.setattr(cpu, "_in_row_bands", counted)
    monkeypatch.setattr(cpu, "BAND_BYTES", 1)
    monkeypatch.setattr(cpu, "band_threads", lambda: 3)
    img = random_image((64, 48, 3), 7)
    got = cpu.box(img, (5, 5), (2, 2), 0, 0, "auto")  # border 0: reflect101, cv2's default
    assert np.array_equal(got, cv2.blur(img, (5, 5)))
    assert banded == [(threading.current_thread().name, True)]
    banded.clear()
    src = tmp_path / "in"
    for i in range(3):
        imwrite(src / f"i{i}.png", random_image((64, 48, 3), i))
    out = tmp_path / "o"
    result = run("blur", src, "--k", "5", "--backend", "cpu", "-j", "2", "--out-dir", out)
    assert result.exit_code == 0, result.output
    assert len(banded) == 3 and not any(done for _, done in banded)
    for i in range(3):
        got = imread(tmp_path / "o" / f"i{i}.blur.png")
        assert np.array_equal(got, cv2.blur(random_image((64, 48, 3), i), (5, 5)))
