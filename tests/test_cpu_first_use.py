"""The CPU backend's first use (issue 57): what a command that filters one image needs
(every box, kernels below the direct limit, separable kernels, FFT tiles) runs on
OpenCV and NumPy alone, in a fresh process with empty caches: no Numba import, nothing
compiled. Its results equal those of the Numba direct sums (the direct float64
correlation) bit for bit (float32 separable outputs: within their documented bound).
Also here: the NumPy float32 box's pieces, the cost model that counts Numba's import
and load while it is not loaded, and a contour that does not load it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_cpu_backend import full_rank, gaussian, image, value_for

from imgfilter.backends import cpu, cpu_box, cpu_common, cpu_fft
from kernels.common import border_index as bi

# Each case: (name, image, kernel or box size, anchor, border, value). Images of a
# few hundred pixels a side; kernels from the direct limit up.
CASES_CODE = textwrap.dedent(
    """
    import numpy as np
    from kernels.common import border_index as bi

    def cases():
        rng = np.random.default_rng(57)
        g = np.exp(-0.5 * ((np.arange(15) - 7) / 3.0) ** 2)
        gauss = np.outer(g / g.sum(), g[::-1] / g.sum()).astype(np.float32)
        full = rng.standard_normal((17, 17))
        full = (full / np.abs(full).sum()).astype(np.float32)
        u8 = rng.integers(0, 256, (150, 211, 3), dtype=np.uint8)
        u16 = rng.integers(0, 65536, (97, 130, 1), dtype=np.uint16)
        f32 = (rng.standard_normal((120, 141, 1)) * 100).astype(np.float32)
        out = []
        for border, value in ((bi.REFLECT101, 0.0), (bi.CONSTANT, 9.0), (bi.WRAP, 0.0)):
            for name, img in (("u8", u8), ("u16", u16), ("f32", f32)):
                out.append((f"{name} gauss {border}", img, gauss, (3, 11), border, value))
                out.append((f"{name} full {border}", img, full, (8, 8), border, value))
                out.append((f"{name} box {border}", img, (9, 5), (4, 2), border, value))
            out.append((f"u8 box2 {border}", u8, (2, 1), (0, 0), border, value))
        return out
    """
)


def _cases():
    scope: dict = {}
    exec(CASES_CODE, scope)  # the same cases in this process and in the child
    return scope["cases"]()


def _fresh_run(tmp_path) -> dict:
    """Every case through `cpu` in a new process whose caches are empty directories;
    the results (npz) and whether the process imported Numba."""
    code = CASES_CODE + textwrap.dedent(
        f"""
        import sys
        from imgfilter.backends import cpu
        res = {{}}
        paths = {{}}
        for name, img, k, anchor, border, value in cases():
            if isinstance(k, tuple):
                res[name] = cpu.box(img, k, anchor, border, value, "auto")
            else:
                paths[name] = cpu.correlate_plan(img, k, value)[0]
                res[name] = cpu.correlate(img, k, anchor, border, value, "auto")
        np.savez({str(tmp_path / "fresh.npz")!r}, **res)
        print("numba" in sys.modules, sorted(set(paths.values())))
        """
    )
    env = dict(os.environ)
    for var in ("NUMBA_CACHE_DIR", "IMGFILTER_CACHE_DIR", "XDG_CACHE_HOME"):
        env[var] = str(tmp_path / var.lower())
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {"stdout": done.stdout.strip(), "res": dict(np.load(tmp_path / "fresh.npz"))}


def direct(img, kernel, anchor, border, value):
    """The direct float64 correlation (non-zero taps in row-major order from 0, multiply
    then add), rounded as the image's dtype stores it."""
    h, w, _ = img.shape
    kh, kw = kernel.shape
    ay, ax = anchor
    rows = cpu_common.axis_map(h, ay, kh - 1 - ay, border)
    cols = cpu_common.axis_map(w, ax, kw - 1 - ax, border)
    p = img.astype(np.float64)[np.maximum(rows, 0)][:, np.maximum(cols, 0)]
    p[rows < 0] = value
    p[:, cols < 0] = value
    acc = np.zeros(img.shape)
    for i, j in zip(*np.nonzero(kernel), strict=True):
        acc = acc + np.float64(kernel[i, j]) * p[i : i + h, j : j + w]
    if img.dtype == np.float32:
        return acc.astype(np.float32)
    info = np.iinfo(img.dtype)
    return np.clip(np.rint(acc), info.min, info.max).astype(img.dtype)


def test_first_use_imports_no_numba_and_matches_the_direct_sums(tmp_path):
    fresh = _fresh_run(tmp_path)
    assert fresh["stdout"] == "False ['fft', 'separable']"
    for name, img, k, anchor, border, value in _cases():
        got = fresh["res"][name]
        if isinstance(k, tuple):  # boxes: the same code here, the same bytes
            want = cpu.box(img, k, anchor, border, value, "auto")
            np.testing.assert_array_equal(got, want, name)
            continue
        want = direct(img, k, anchor, border, value)
        if name.startswith("f32 gauss"):  # float32 separable: its documented bound
            tol = 1e-6 * float(np.abs(k).sum()) * max(abs(value), float(np.abs(img).max()))
            assert np.abs(got.astype(np.float64) - want).max() <= tol, name
        else:
            np.testing.assert_array_equal(got, want, name)


@pytest.mark.parametrize("module", ["cpu_common", "cpu_box", "cpu_fft", "cpu_loops"])
def test_cpu_modules_import_no_circle(module):
    """Among the CPU backend's modules, `cpu_box` imports only `cpu_common`, `cpu_fft`
    only `cpu_common` and `cpu_loops`, and these two none: no import circle."""
    import ast
    import pathlib

    import imgfilter.backends as pkg

    tree = ast.parse(pathlib.Path(pkg.__path__[0], f"{module}.py").read_text())
    siblings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            siblings.add(node.module or "")
            if node.module is None:
                siblings.update(a.name for a in node.names)
    allowed = {"cpu_box": {"cpu_common"}, "cpu_fft": {"cpu_common", "cpu_loops"}}
    assert siblings <= allowed.get(module, set()), siblings


def test_float32_box_pieces_equal_one_piece(monkeypatch):
    """Bands cut into pieces of whole blocks of kh rows (on several threads) give the
    sums of one piece a band, bit for bit: every sum's order depends on the band
    layout alone."""
    img = image((157, 45, 3), np.float32, 140)
    cases = [((5, 5), (2, 2)), ((23, 11), (4, 10)), ((1, 9), (0, 4)), ((9, 1), (8, 0))]
    for border in (bi.REFLECT101, bi.CONSTANT, bi.WRAP):
        value = value_for(border, np.float32)
        for ksize, anchor in cases:
            monkeypatch.setattr(cpu_box, "_BLOCK_VALUES", 1 << 40)  # a piece a band
            want = cpu.box(img, ksize, anchor, border, value, "auto")
            monkeypatch.setattr(cpu_box, "_BLOCK_VALUES", 1)  # a block of kh rows a piece
            got = cpu.box(img, ksize, anchor, border, value, "auto")
            np.testing.assert_array_equal(got, want, f"{ksize} {border}")


def test_fft_plan_by_cost(monkeypatch):
    """The cost model sends large full-rank kernels on large uint8 images to FFT tiles,
    and small images and low-rank kernels to the others; float32 images with inf or
    NaN take the direct sums. While Numba is not loaded, the direct paths' cost
    includes its import and load: small images then take FFT tiles too."""
    monkeypatch.setattr(cpu, "_numba_loaded", lambda: True)
    big = np.zeros((2000, 2000, 1), np.uint8)
    assert cpu.correlate_plan(big, full_rank(21, 0), 0.0)[0] == "fft"
    assert cpu.correlate_plan(big, gaussian(21, 3.0).astype(np.float32), 0.0)[0] == "separable"
    small = np.zeros((5, 3, 1), np.uint8)
    assert cpu.correlate_plan(small, full_rank(21, 0), 0.0)[0] == "direct32"
    f32 = np.ones((2000, 2000, 1), np.float32)
    assert cpu.correlate_plan(f32, full_rank(21, 0), 0.0)[0] == "fft"
    assert cpu.correlate_plan(f32[:9, :9], full_rank(21, 0), 0.0)[0] == "direct64"
    assert cpu.correlate_plan(f32[:9, :9], full_rank(21, 0), 0.0, fft=True)[0] == "fft"
    monkeypatch.setattr(cpu, "_numba_loaded", lambda: False)
    assert cpu.correlate_plan(small, full_rank(21, 0), 0.0)[0] == "fft"
    assert cpu.correlate_plan(f32, full_rank(21, 0), 0.0)[0] == "fft"
    assert cpu.correlate_plan(f32[:9, :9], full_rank(21, 0), 0.0)[0] == "fft"
    f32[5, 5] = np.inf
    assert cpu.correlate_plan(f32, full_rank(21, 0), 0.0)[0] == "direct64"
    assert cpu.correlate_plan(f32, full_rank(21, 0), 0.0, fft=True)[0] == "direct64"


def test_contour_does_not_import_numba():
    """In a process without Numba, contour does not load it (a process of its own)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from imgfilter.backends import cpu\n"
        "img = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)\n"
        "cpu.contour(img, 0, 0, 'auto')\n"
        "print('numba' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", [np.uint16, np.float32], ids=lambda d: d.__name__)
def test_fft_recompute_in_numpy_equals_the_compiled_one(dtype, monkeypatch):
    """The FFT tiles' direct recompute: NumPy's (`cpu_common.direct_sums`, Numba not
    loaded) and Numba's (`cpu_loops.direct_dense`) store the same bytes, at exact
    ties of integer outputs and float32 outputs near zero."""
    import numba  # noqa: F401 - loaded: the compiled recompute

    img = image((70, 83, 3), dtype, 57)
    signs = np.random.default_rng(5).choice([-1.0, 1.0], (17, 17))
    kernel = (signs * 0.5).astype(np.float32)  # sums of halves: exact ties, open
    opened = []

    def counted(*args):
        opened.append(args[1].size)
        return cpu_common.direct_sums(*args)

    for border in (bi.REFLECT101, bi.CONSTANT, bi.WRAP):
        value = value_for(border, dtype)
        compiled = cpu.correlate(img, kernel, (8, 3), border, value, "auto", fft=True)
        with monkeypatch.context() as m:
            m.delitem(sys.modules, "numba")  # as in a process that never loaded it
            m.setattr(cpu_fft, "direct_sums", counted)
            numpy = cpu.correlate(img, kernel, (8, 3), border, value, "auto", fft=True)
        np.testing.assert_array_equal(numpy, compiled)
    assert sum(opened) > 0
