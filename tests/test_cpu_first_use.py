"""The CPU backend's first use (issue 57): what a command that filters one image needs
(every box, kernels below the direct limit, separable kernels, FFT tiles) runs on
OpenCV and NumPy alone, in a fresh process with empty caches: no Numba import, nothing
compiled. Its results equal those of the Numba direct sums (the direct float64
correlation) bit for bit (float32 separable outputs: within their documented bound).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from imgfilter.backends import cpu, cpu_common

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
        from imgfilter.backends import cpu, cpu_common
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
    """The CPU backend's modules import only `cpu_common` among themselves (and it none
    of them): no import circle."""
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
    allowed = set() if module == "cpu_common" else {"cpu_common"}
    assert siblings <= allowed, siblings
