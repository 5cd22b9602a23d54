"""Many files on a Dask cluster (issue 27, section 3): `--scheduler ADDRESS` sends a
task per file to an existing cluster (here an in-process one, on the CPU backend) and
reports like the threaded run; `--gpus N` needs dask-cuda; bad combinations are one
line, exit 2."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from test_cli import assert_one_line_error, imread, run

distributed = pytest.importorskip("distributed")  # in the test extra: CI always has it


@pytest.fixture(scope="module")
def scheduler():
    with distributed.LocalCluster(
        n_workers=1, processes=False, threads_per_worker=2, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(0)
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    for i, name in enumerate(("a.png", "b.png", "sub/c.png")):
        cv2.imwrite(str(src / name), rng.integers(0, 256, (31 + i, 45, 3), dtype=np.uint8))
    return src


def test_files_on_a_cluster_equal_the_threaded_run(folder, tmp_path, scheduler):
    common = ("--k", "5", "-r", "--backend", "cpu", "--border", "wrap")
    threaded = run("blur", folder, *common, "--out-dir", tmp_path / "threads")
    assert threaded.exit_code == 0, threaded.output
    done = run("blur", folder, *common, "--out-dir", tmp_path / "dask", "--scheduler", scheduler)
    assert done.exit_code == 0, done.output
    assert "3 written, 0 skipped, 0 failed" in done.stderr
    for name in ("a.blur.png", "b.blur.png", "sub/c.blur.png"):
        np.testing.assert_array_equal(
            imread(tmp_path / "dask" / name), imread(tmp_path / "threads" / name)
        )


def test_a_bad_file_on_a_cluster_is_reported_and_the_others_go_on(folder, tmp_path, scheduler):
    (folder / "bad.png").write_bytes(b"not a png")
    done = run("contour", folder, "-r", "--backend", "cpu", "--out-dir", tmp_path / "out",
               "--scheduler", scheduler)  # fmt: skip
    assert done.exit_code == 3, done.output
    assert "bad.png" in done.stderr and "3 written, 0 skipped, 1 failed" in done.stderr
    assert (tmp_path / "out" / "sub" / "c.contour.png").exists()


def test_one_input_is_filtered_here_with_a_note(folder, tmp_path, scheduler):
    out = tmp_path / "one.png"
    kernel = "1,2,1;2,4,2;1,2,1"
    done = run("filter", folder / "a.png", "--kernel", kernel, "--normalize", "--backend", "cpu",
               "-o", out, "--scheduler", scheduler)  # fmt: skip
    assert done.exit_code == 0, done.output
    want = run("filter", folder / "a.png", "--kernel", kernel, "--normalize", "--backend", "cpu",
               "-o", tmp_path / "want.png")  # fmt: skip
    assert want.exit_code == 0
    np.testing.assert_array_equal(imread(out), imread(tmp_path / "want.png"))
    assert "one input is filtered here" in done.stderr


def test_cluster_options_are_checked(folder, tmp_path):
    both = run("blur", folder, "--k", "3", "--gpus", "1", "--scheduler", "tcp://127.0.0.1:1",
               "--out-dir", tmp_path / "x")  # fmt: skip
    assert_one_line_error(both, 2, "--gpus", "--scheduler")
    try:
        import dask_cuda  # noqa: F401
    except ImportError:
        gpus = run("blur", folder, "--k", "3", "--gpus", "2", "--out-dir", tmp_path / "y")
        assert_one_line_error(gpus, 2, "dask-cuda")
    zero = run("blur", folder, "--k", "3", "--gpus", "0", "--out-dir", tmp_path / "z")
    assert zero.exit_code == 2


def test_classify_files_on_a_cluster(folder, tmp_path, scheduler):
    from pathlib import Path

    model = Path(__file__).resolve().parents[1] / "samples" / "classify" / "astronaut.model.npz"
    common = ("-r", "-m", model, "--backend", "cpu")
    threaded = run("classify", folder, *common, "--out-dir", tmp_path / "threads")
    assert threaded.exit_code == 0, threaded.output
    done = run("classify", folder, *common, "--out-dir", tmp_path / "dask", "--scheduler",
               scheduler)  # fmt: skip
    assert done.exit_code == 0, done.output
    for name in ("a.labels.png", "b.labels.png", "sub/c.labels.png"):
        np.testing.assert_array_equal(
            imread(tmp_path / "dask" / name), imread(tmp_path / "threads" / name)
        )


def test_local_gpu_workers_share_the_cpus_out(monkeypatch):
    from imgfilter import cluster

    monkeypatch.setattr(cluster.os, "cpu_count", lambda: 32)
    assert cluster.worker_threads(1, None) == 8  # --jobs' default
    assert cluster.worker_threads(2, None) == 8
    assert cluster.worker_threads(8, None) == 4  # 32 CPUs among 8 workers
    assert cluster.worker_threads(2, 3) == 3
    assert cluster.worker_threads(2, 64) == 16
    monkeypatch.setattr(cluster.os, "cpu_count", lambda: None)
    assert cluster.worker_threads(4, None) == 1


def _trim_threshold() -> str | None:
    import os

    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def test_local_gpu_workers_keep_glibcs_own_malloc_thresholds(monkeypatch):
    """Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_ set (every image-sized
    array then a fresh mmap, its pages faulting in); `--gpus` workers start without it.
    A process LocalCluster stands in for dask-cuda's LocalCUDACluster."""
    import os
    import sys
    import types

    from imgfilter import cluster

    # Nannies set their variables (OMP_NUM_THREADS too) in the process that starts them:
    # each is restored after the test (setenv records it) and starts as it was, but for
    # MALLOC_TRIM_THRESHOLD_, unset.
    for name in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "OPENBLAS_NUM_THREADS"):  # fmt: skip
        was = os.environ.get(name)
        monkeypatch.setenv(name, was or "1")
        if was is None or name == "MALLOC_TRIM_THRESHOLD_":
            monkeypatch.delenv(name)

    def local_cluster(n_workers: int, threads_per_worker: int):
        return distributed.LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                                        processes=True, dashboard_address=None)  # fmt: skip

    fake = types.ModuleType("dask_cuda")
    fake.LocalCUDACluster = local_cluster
    monkeypatch.setitem(sys.modules, "dask_cuda", fake)
    with cluster.connect(1, None, jobs=1) as client:
        assert set(client.run(_trim_threshold).values()) == {None}
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with local_cluster(1, 1) as plain, distributed.Client(plain) as client:
        assert set(client.run(_trim_threshold).values()) == {"65536"}  # Dask's default


def _jobs(tmp_path, n):
    from imgfilter.files import Job

    jobs = []
    for i in range(n):
        source = tmp_path / f"{i}.raw"
        source.write_bytes(bytes(i + 1))
        jobs.append(Job(source, tmp_path / f"{i}.out"))
    return jobs


def test_a_gpu_failure_on_a_worker_stops_the_run(tmp_path, scheduler):
    import time

    from imgfilter import cluster, files

    jobs = _jobs(tmp_path, 40)

    def compute(job, loaded):
        if job.source.name == "0.raw":
            raise files.Fatal(RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS"))
        time.sleep(0.05)  # the other files last long after the first one stops
        return loaded

    def save(job, loaded, result):
        job.target.write_bytes(result)

    failed = []
    with distributed.Client(scheduler) as client:
        stats = cluster.run_on_cluster(
            client, jobs, load=lambda job: job.source.read_bytes(), compute=compute,
            save=save,
            on_event=lambda kind, job, error, s: failed.append(str(error)) if error else None,
        )  # fmt: skip
    assert str(stats.fatal) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert failed == ["CUDA_ERROR_ILLEGAL_ADDRESS"]
    # The files queued after it are not started (two at a time here).
    assert stats.failed == 1 and stats.done <= 3
    assert not (tmp_path / "0.out").exists()


def test_a_gpu_failure_on_a_cluster_ends_the_command_as_a_local_one(folder, tmp_path, scheduler,
                                                                      monkeypatch):  # fmt: skip
    from imgfilter import api
    from imgfilter.errors import DeviceError

    def failing(*args, **kwargs):
        raise DeviceError("the GPU fell off the bus")

    monkeypatch.setattr(api, "blur", failing)  # the in-process workers call it too
    done = run("blur", folder, "--k", "5", "-r", "--backend", "cpu", "--out-dir",
               tmp_path / "out", "--scheduler", scheduler)  # fmt: skip
    assert done.exit_code == 5, done.output
    assert "the GPU failed: the GPU fell off the bus; stopped" in done.stderr
    assert "unexpected" not in done.stderr and "Traceback" not in done.output
    assert "0 written, 0 skipped, 1 failed" in done.stderr
