"""Many threads calling the API at once, first use included (issue 28).

Each thread runs a mix of filters over several dtypes and channel counts, on host
arrays and (where there is one) on device arrays, and every result is compared with
OpenCV. On CI this runs on the CPU backend and on Numba's CUDA simulator; on a real
GPU a fresh process with empty kernel caches does it with 16 threads (first use:
compilation, cubin loading and the launch caches all under contention).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from threaded import run_in_threads

import imgfilter
from imgfilter.backends import opencv as ref

KERNEL = np.array([[1, -2, 0], [3, 1, -1], [0, 2, 1]], dtype=np.float32)


def _jobs(seed: int, count: int, small: bool):
    """(name, image, ours(img) -> result, theirs(img) -> result) for one thread."""
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(count):
        dtype = [np.uint8, np.uint16, np.float32][i % 3]
        channels = [1, 3, 4][(i // 3) % 3]
        h, w = (int(rng.integers(5, 19)), int(rng.integers(5, 23))) if small else (
            int(rng.integers(64, 700)), int(rng.integers(64, 900)))  # fmt: skip
        hi = 1000 if dtype == np.float32 else np.iinfo(dtype).max
        img = rng.integers(1, hi, (h, w, channels)).astype(dtype)
        k = int(rng.integers(1, 8))
        op = i % 3 if dtype != np.float32 else i % 2
        if op == 0:
            jobs.append(("blur", img, lambda a, k=k, **kw: imgfilter.blur(a, k, **kw),
                         lambda a, k=k: ref.blur(a, k)))  # fmt: skip
        elif op == 1:
            jobs.append(("filter2d", img, lambda a, **kw: imgfilter.filter2d(a, KERNEL, **kw),
                         lambda a: ref.filter2d(a, KERNEL)))  # fmt: skip
        else:
            jobs.append(("contour", img, lambda a, **kw: imgfilter.contour(a, **kw), ref.contour))
    return jobs


def _check(name, got, want):
    assert got.size == want.size, name
    got = got.reshape(want.shape)  # OpenCV drops a single channel's axis
    if want.dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3, err_msg=name)
    elif name == "blur":  # cv2.blur's 8-bit fixed point rounds some ties the other way
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
        assert diff.max() <= 1, name
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_threads_on_the_cpu_backend():
    def run(t):
        for name, img, ours, theirs in _jobs(t, 6, small=True):
            _check(name, ours(img, backend="cpu"), theirs(img))

    assert run_in_threads(8, run) == []


def test_threads_with_device_arrays_on_the_cuda_backend():
    from numba import cuda

    def run(t):
        for name, img, ours, theirs in _jobs(100 + t, 3, small=True):
            got = ours(cuda.to_device(img))
            _check(name, got.copy_to_host(), theirs(img))

    assert run_in_threads(4, run) == []


_GPU_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import cupy as cp
    from test_threads import _jobs, _check
    from threaded import run_in_threads

    def run(t):
        for i, (name, img, ours, theirs) in enumerate(_jobs(1000 + t, {calls}, small=False)):
            want = theirs(img)
            if i % 2:
                _check(name, ours(img), want)
            else:
                stream = cp.cuda.Stream(non_blocking=True)
                with stream:
                    got = ours(cp.asarray(img), stream=stream).get()
                _check(name, got, want)

    errors = run_in_threads({threads}, run)
    print("\\n".join(errors) or "ok")
    sys.exit(1 if errors else 0)
    """
)


@pytest.mark.gpu
def test_sixteen_threads_first_use_in_a_fresh_process(tmp_path):
    pytest.importorskip("cupy")
    env = dict(os.environ, IMGFILTER_CACHE_DIR=str(tmp_path / "k"),
               NUMBA_CACHE_DIR=str(tmp_path / "n"))  # fmt: skip
    script = _GPU_SCRIPT.format(tests=str(Path(__file__).parent), calls=50, threads=16)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


# ------------------------------------------------ many processes on one empty cache


def _processes(count: int, tmp_path, backend: str, round_: int = 0) -> list:
    """`count` CLI blurs started together on one kernel cache (empty in round 0);
    their results."""
    import cv2

    img = np.random.default_rng(5).integers(0, 255, (64, 80, 3), dtype=np.uint8)
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), img)
    env = dict(os.environ, IMGFILTER_CACHE_DIR=str(tmp_path / "k"),
               NUMBA_CACHE_DIR=str(tmp_path / "n"))  # fmt: skip
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "imgfilter",
                "blur",
                str(src),
                "--k",
                "5",
                "--backend",
                backend,
                "-o",
                str(tmp_path / f"out{round_}-{i}.png"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(count)
    ]
    results = []
    for i, proc in enumerate(procs):
        _, err = proc.communicate(timeout=600)
        results.append((proc.returncode, err, cv2.imread(str(tmp_path / f"out{round_}-{i}.png"))))
    return results, img


def _check_processes(results, img):
    want = ref.blur(img, 5)
    for code, err, got in results:
        assert code == 0, err[-2000:]
        assert got is not None and np.abs(got.astype(int) - want).max() <= 1


def test_concurrent_processes_share_an_empty_cache_cpu(tmp_path):
    """Numba's on-disk cache written by several processes at once (CPU backend)."""
    _check_processes(*_processes(3, tmp_path, "cpu"))


@pytest.mark.gpu
def test_sixteen_processes_on_one_empty_cache(tmp_path):
    """Numba's cache and the exported cubins written by 16 processes at once, twice
    (the second round loads what the first wrote)."""
    for round_ in range(2):
        _check_processes(*_processes(16, tmp_path, "cuda", round_))
