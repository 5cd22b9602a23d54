"""Per-pixel classification (issue 6): `imgfilter train` / `imgfilter classify`.

- probabilities sum to 1; the temperature flattens them and keeps the labels;
- the same optimum as scikit-learn's LogisticRegression (multinomial, lbfgs) on the same
  standardised features, with C = 1 / (l2 * n): labels on >= 99% of the pixels, and
  probabilities within 1e-3;
- a synthetic image whose classes are separable is classified 100% right;
- model files: round trip, and every kind of bad file is a one-line InputError;
- the CLI: outputs, and each error case with its exit code and one line on stderr;
- CUDA (the simulator, tiny images: every simulated kernel launch costs ~0.5-1 s) agrees
  with the CPU within 1e-4; full-size images and CUDA training run as `gpu` tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import ON_GPU
from typer.testing import CliRunner

from imgfilter import classify, cli
from imgfilter.classify import cpu, pipeline
from imgfilter.classify.features import feature_names, normalize_spec, parse_spec
from imgfilter.errors import InputError, UsageError

REPO = Path(__file__).resolve().parents[1]
SMALL_SPEC = {"raw": True, "gauss": [1.0], "box": [3], "edges": [1.0], "contour": True}
runner = CliRunner()


def synthetic(h: int = 48, w: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A BGR image of three noisy colour regions (a disc, a rectangle, the rest) and its
    ground truth (classes 1, 2, 3)."""
    rng = np.random.default_rng(seed)
    truth = np.ones((h, w), np.uint8)
    yy, xx = np.mgrid[:h, :w]
    truth[(yy - h * 0.5) ** 2 + (xx - w * 0.3) ** 2 < (h * 0.3) ** 2] = 2
    truth[(xx > w * 0.65) & (yy > h * 0.2)] = 3
    colours = np.array([[0, 0, 0], [40, 60, 200], [60, 190, 70], [200, 120, 40]], np.float32)
    img = colours[truth] + rng.normal(0, 12, (h, w, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), truth


def scribbles(truth: np.ndarray, fraction: float = 0.2, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mask = np.zeros_like(truth)
    sel = rng.random(truth.shape) < fraction
    mask[sel] = truth[sel]
    return mask


@pytest.fixture(scope="module")
def astro_small():
    img = cv2.imread(str(REPO / "samples" / "astronaut.jpg"))[::8, ::8].copy()  # 64x64
    mask = np.zeros(img.shape[:2], np.uint8)
    mask[2:8, 2:25] = 1  # background
    mask[37:43, 18:31] = 2  # suit
    mask[12:18, 27:35] = 3  # face
    return img, mask


@pytest.fixture(scope="module")
def astro_model(astro_small):
    img, mask = astro_small
    return classify.train(img, mask, l2=1e-2, backend="cpu")


# ------------------------------------------------------------------------------ features


def test_feature_spec_parse_and_names():
    spec = parse_spec("raw;gauss=1,2;box=5;edges=1;contour")
    assert spec == {"raw": True, "gauss": [1.0, 2.0], "box": [5], "edges": [1.0], "contour": True}
    names = feature_names(spec, 3)
    assert len(names) == 3 + 6 + 3 + 1 + 1
    assert len(feature_names(spec, 1)) == 1 + 2 + 1 + 1 + 1
    assert normalize_spec(None) == normalize_spec(classify.DEFAULT_SPEC)
    for bad in ("gauss=0", "gauss=x", "box=2.5", "blur=3", "raw=4", ""):
        with pytest.raises(UsageError):
            parse_spec(bad)


def test_features_cpu_values():
    img, _ = synthetic(10, 12)
    X = classify.extract_features(img, SMALL_SPEC, backend="cpu")
    assert X.shape == (120, 3 + 3 + 3 + 1 + 1) and X.dtype == np.float32
    np.testing.assert_array_equal(X[:, :3], img.reshape(-1, 3) * np.float32(1 / 255))
    box = cv2.blur(img.astype(np.float32) / 255, (3, 3), borderType=cv2.BORDER_REFLECT_101)
    np.testing.assert_allclose(X[:, 6:9], box.reshape(-1, 3), atol=1e-6)
    assert (X[:, 9] >= 0).all() and (X[:, 10] >= 0).all() and X[:, 10].max() <= 1


# ------------------------------------------------------------------------------ the model


def test_probabilities_sum_to_one(astro_small, astro_model):
    img, _ = astro_small
    model, info = astro_model
    assert info.accuracy > 0.9
    pred = classify.predict(img, model, backend="cpu")
    assert pred.proba.shape == (64, 64, 3) and pred.proba.dtype == np.float32
    np.testing.assert_allclose(pred.proba.sum(axis=2), 1.0, atol=1e-5)
    assert (pred.proba >= 0).all()
    assert set(np.unique(pred.labels)) <= {1, 2, 3}
    np.testing.assert_array_equal(pred.labels, pred.proba.argmax(axis=2) + 1)


def test_matches_scikit_learn(astro_small, astro_model):
    sklearn = pytest.importorskip("sklearn.linear_model")
    img, mask = astro_small
    model, info = astro_model
    lam = model.meta["l2"]
    X = classify.extract_features(img, backend="cpu").astype(np.float64)
    index = np.flatnonzero(mask.reshape(-1))
    y = mask.reshape(-1)[index]
    Z = (X - model.mean) / model.std
    n = index.size
    assert info.samples == n
    # sklearn minimises C * sum CE + ||W||^2 / 2 (intercept unpenalised): divided by C * n,
    # that is mean CE + ||W||^2 / (2 C n), so l2 = 1 / (C n).
    ref = sklearn.LogisticRegression(C=1.0 / (lam * n), tol=1e-10, max_iter=10_000)
    ref.fit(Z[index], y)
    p_ref = ref.predict_proba(Z)
    pred = classify.predict(img, model, backend="cpu")
    p = pred.proba.reshape(-1, 3)
    assert np.abs(p - p_ref).max() < 1e-3
    same = np.mean(ref.classes_[p_ref.argmax(axis=1)] == pred.labels.reshape(-1))
    assert same >= 0.99


def test_separable_synthetic_image_is_classified_perfectly():
    img, truth = synthetic()
    model, info = classify.train(img, scribbles(truth), l2=1e-4, backend="cpu")
    assert info.accuracy == 1.0
    pred = classify.predict(img, model, backend="cpu")
    assert np.array_equal(pred.labels, truth)


def test_training_is_deterministic_and_subsampling_uses_the_seed():
    img, truth = synthetic(24, 32)
    mask = scribbles(truth, 0.5)
    a, _ = classify.train(img, mask, spec=SMALL_SPEC, backend="cpu", max_samples=60, seed=3)
    b, _ = classify.train(img, mask, spec=SMALL_SPEC, backend="cpu", max_samples=60, seed=3)
    c, info = classify.train(img, mask, spec=SMALL_SPEC, backend="cpu", max_samples=60, seed=4)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert info.samples == 60 and info.labelled == int((mask > 0).sum())
    assert not np.array_equal(a.mean, c.mean)


def test_temperature_flattens_probabilities_keeps_labels(astro_small, astro_model):
    img, _ = astro_small
    model, _ = astro_model
    p1 = classify.predict(img, model, backend="cpu")
    p4 = classify.predict(img, model, backend="cpu", temperature=4.0)
    np.testing.assert_array_equal(p1.labels, p4.labels)
    assert p4.proba.max(axis=2).mean() < p1.proba.max(axis=2).mean()
    # softmax(z / T) = softmax(z)^(1/T) renormalised
    q = p1.proba.astype(np.float64) ** 0.25
    np.testing.assert_allclose(p4.proba, q / q.sum(axis=2, keepdims=True), atol=1e-5)
    with pytest.raises(UsageError):
        classify.predict(img, model, backend="cpu", temperature=0.0)


def test_gray_and_uint16_images():
    img, truth = synthetic(24, 32)
    gray16 = (cv2.cvtColor(img, cv2.COLOR_BGR2GRAY).astype(np.uint16) * 257)[:, :, None]
    model, info = classify.train(gray16, scribbles(truth, 0.5), spec=SMALL_SPEC, backend="cpu")
    assert model.channels == 1 and model.n_features == len(feature_names(SMALL_SPEC, 1))
    pred = classify.predict(gray16[:, :, 0], model, backend="cpu")
    assert pred.labels.shape == truth.shape
    with pytest.raises(InputError, match="trained on gray"):
        classify.predict(img, model, backend="cpu")


def test_label_mask_checks():
    img, truth = synthetic(8, 10)
    with pytest.raises(InputError, match="at least two classes"):
        classify.check_labels(np.zeros((8, 10), np.uint8), (8, 10))
    with pytest.raises(InputError, match="at least two classes"):
        classify.check_labels((truth > 0).astype(np.uint8), (8, 10))
    with pytest.raises(InputError, match="image is 10x8"):
        classify.check_labels(truth[:, :9], (8, 10))
    with pytest.raises(InputError, match="colour image"):
        classify.check_labels(img, (8, 10))
    with pytest.raises(InputError, match="integer"):
        classify.check_labels(truth.astype(np.float32), (8, 10))
    with pytest.raises(InputError, match="1..255"):
        classify.check_labels(truth.astype(np.uint16) * 200, (8, 10))
    grey3 = np.repeat(truth[:, :, None], 3, axis=2)  # a gray mask saved as RGB is fine
    np.testing.assert_array_equal(classify.check_labels(grey3, (8, 10)), truth)


# ------------------------------------------------------------------------------ model files


def test_model_round_trip(tmp_path, astro_model):
    model, _ = astro_model
    path = classify.save(model, tmp_path / "m.npz")
    with np.load(path, allow_pickle=False) as z:
        assert set(z.files) == {"weights", "bias", "mean", "std", "classes", "meta"}
        meta = json.loads(str(z["meta"]))
    assert meta["format"] == "imgfilter-pixel-classifier" and meta["channels"] == 3
    assert len(meta["feature_names"]) == model.n_features
    back = classify.load(path)
    for name in ("weights", "bias", "mean", "std", "classes"):
        np.testing.assert_array_equal(getattr(back, name), getattr(model, name))
    assert back.spec == model.spec
    with pytest.raises(Exception, match="exists"):
        classify.save(model, path)


def _rewrite(src: Path, dst: Path, **changes) -> Path:
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    np.savez(dst, **arrays)
    return dst


def test_bad_model_files(tmp_path, astro_model):
    model, _ = astro_model
    good = classify.save(model, tmp_path / "good.npz")
    meta = json.loads(str(np.load(good)["meta"]))
    cases = {
        "missing": (tmp_path / "nope.npz", "does not exist"),
        "text": (tmp_path / "text.npz", "not an .npz"),
        "no weights": (_rewrite(good, tmp_path / "a.npz", weights=None), "missing weights"),
        "feature count": (
            _rewrite(good, tmp_path / "b.npz", weights=np.zeros((3, 5))),
            "features",
        ),
        "nan": (_rewrite(good, tmp_path / "c.npz", bias=np.array([0, np.nan, 0])), "NaN"),
        "pickle": (
            _rewrite(good, tmp_path / "d.npz", classes=np.array([1, "x", None], dtype=object)),
            "cannot read",
        ),
        "meta": (_rewrite(good, tmp_path / "e.npz", meta=np.array("{not json")), "JSON"),
        "format": (
            _rewrite(good, tmp_path / "f.npz", meta=np.array(json.dumps({**meta, "format": "x"}))),
            "format",
        ),
        "classes": (
            _rewrite(good, tmp_path / "g.npz", classes=np.array([1, 1, 2])),
            "increasing",
        ),
        "channels": (
            _rewrite(good, tmp_path / "h.npz", meta=np.array(json.dumps({**meta, "channels": 1}))),
            "features",
        ),
    }
    (tmp_path / "text.npz").write_text("not a model")
    zipfile.ZipFile(tmp_path / "empty.npz", "w").close()
    cases["empty zip"] = (tmp_path / "empty.npz", "missing")
    for name, (path, words) in cases.items():
        with pytest.raises(InputError, match=words) as e:
            classify.load(path)
        assert "\n" not in str(e.value), name


# ------------------------------------------------------------------------------ the CLI


def invoke(*args):
    return runner.invoke(cli.app, [str(a) for a in args])


def assert_one_line_error(result, code: int, *words: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgfilter: error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    img, truth = synthetic(30, 40)
    cv2.imwrite(str(d / "img.png"), img)
    cv2.imwrite(str(d / "mask.png"), scribbles(truth))
    cv2.imwrite(str(d / "gray.png"), cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
    r = invoke("train", d / "img.png", d / "mask.png", "-o", d / "model.npz", "--backend", "cpu")
    assert r.exit_code == 0, r.output
    return d, truth


def test_cli_train_and_classify(cli_files, tmp_path):
    d, truth = cli_files
    r = invoke("train", d / "img.png", d / "mask.png", "-o", tmp_path / "m.npz",
               "--backend", "cpu", "--features", "raw;gauss=1;contour", "--l2", "1e-3")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "training accuracy" in r.stderr and "wrote" in r.stderr
    assert classify.load(tmp_path / "m.npz").n_features == 3 + 3 + 1
    r = invoke("classify", d / "img.png", "--model", d / "model.npz", "-o", tmp_path / "l.png",
               "--proba", tmp_path / "p.npy", "--overlay", tmp_path / "o.png",
               "--backend", "cpu")  # fmt: skip
    assert r.exit_code == 0, r.output
    labels = cv2.imread(str(tmp_path / "l.png"), cv2.IMREAD_UNCHANGED)
    assert labels.dtype == np.uint8 and labels.shape == truth.shape
    assert np.array_equal(labels, truth)
    p = np.load(tmp_path / "p.npy", allow_pickle=False)
    assert p.shape == (30, 40, 3) and p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=2), 1.0, atol=1e-5)
    overlay = cv2.imread(str(tmp_path / "o.png"), cv2.IMREAD_UNCHANGED)
    assert overlay.shape == (30, 40, 3)
    r = invoke("classify", d / "img.png", "-m", d / "model.npz", "-o", tmp_path / "l.png",
               "--backend", "cpu")  # fmt: skip
    assert_one_line_error(r, 4, "exists")
    r = invoke("classify", d / "img.png", "-m", d / "model.npz", "-o", tmp_path / "l.png",
               "--backend", "cpu", "--force", "--temperature", "2")  # fmt: skip
    assert r.exit_code == 0, r.output


def test_cli_errors(cli_files, tmp_path):
    d, _ = cli_files
    img, model, out = d / "img.png", d / "model.npz", tmp_path / "out.png"
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 truncated")
    one = tmp_path / "one.png"
    cv2.imwrite(str(one), np.ones((30, 40), np.uint8))
    cases = [
        (("classify", img, "-m", tmp_path / "none.npz", "-o", out), 3, "does not exist"),
        (("classify", img, "-m", tmp_path / "bad.npz", "-o", out), 3, "not"),
        (("classify", d / "gray.png", "-m", model, "-o", out), 3, "trained on colour"),
        (("classify", img, "-m", model, "-o", out, "-t", "0"), 2, "temperature"),
        (("classify", img, "-m", model, "-o", tmp_path / "l.jpg"), 4, "lossless"),
        (("classify", img, "-m", model, "-o", out, "--proba", tmp_path / "p.txt"), 4, ".npy"),
        (("classify", img, "-m", model, "-o", out, "--overlay", out), 2, "different"),
        (("train", img, one, "-o", tmp_path / "m.npz"), 3, "two classes"),
        (("train", img, img, "-o", tmp_path / "m.npz"), 3, "colour image"),
        (("train", img, d / "mask.png", "-o", tmp_path / "m.txt"), 4, ".npz"),
        (("train", img, d / "mask.png", "-o", model), 4, "exists"),
        (("train", img, d / "mask.png", "-o", tmp_path / "m.npz", "--features", "x=1"), 2, "x"),
        (("train", img, tmp_path / "nomask.png", "-o", tmp_path / "m.npz"), 3, "nomask"),
    ]
    small = tmp_path / "small.png"
    cv2.imwrite(str(small), np.ones((5, 5), np.uint8))
    cases.append((("train", img, small, "-o", tmp_path / "m.npz"), 3, "5x5"))
    for args, code, word in cases:
        assert_one_line_error(invoke(*args, "--backend", "cpu"), code, word)
    assert not (tmp_path / "m.npz").exists() and not out.exists()


def test_cli_colour_mask_with_legend(cli_files, tmp_path):
    d, truth = cli_files
    mask = cv2.imread(str(d / "mask.png"), cv2.IMREAD_UNCHANGED)
    rgb = {1: (214, 39, 40), 2: (44, 160, 44), 3: (31, 119, 180)}
    painted = np.full(mask.shape + (3,), 255, np.uint8)  # white: not in the legend
    for c, (r, g, b) in rgb.items():
        painted[mask == c] = (b, g, r)
    cv2.imwrite(str(tmp_path / "painted.png"), painted)
    legend = tmp_path / "legend.json"
    legend.write_text(json.dumps({"1": "#d62728", "2": [44, 160, 44], "3": "#1f77b4"}))
    r = invoke("train", d / "img.png", tmp_path / "painted.png", "--legend", legend,
               "-o", tmp_path / "m.npz", "--backend", "cpu")  # fmt: skip
    assert r.exit_code == 0, r.output
    a, b = classify.load(tmp_path / "m.npz"), classify.load(d / "model.npz")
    np.testing.assert_array_equal(a.weights, b.weights)  # same labels, same model
    bad = {
        "missing.json": None,
        "notjson.json": "{",
        "colour.json": json.dumps({"1": "red", "2": "#00ff00"}),
        "same.json": json.dumps({"1": "#00ff00", "2": "#00ff00"}),
        "class.json": json.dumps({"0": "#00ff00", "2": "#ff0000"}),
    }
    for name, text in bad.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        r = invoke("train", d / "img.png", tmp_path / "painted.png", "--legend",
                   tmp_path / name, "-o", tmp_path / "m2.npz", "--backend", "cpu")  # fmt: skip
        assert_one_line_error(r, 3, "legend")
    r = invoke("train", d / "img.png", d / "mask.png", "--legend", legend,
               "-o", tmp_path / "m2.npz", "--backend", "cpu")  # fmt: skip
    assert_one_line_error(r, 3, "colour image")


def test_help_does_not_import_numba():
    code = (
        "import sys\nfrom imgfilter.cli import app\n"
        "try:\n    app(['classify', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('numba' in sys.modules, 'cv2' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip().splitlines()[-1] == "False False", out.stdout + out.stderr


# ------------------------------------------------------------------------------ CUDA


def _cuda_matrix(img, spec):
    from imgfilter.classify import cuda as ccuda

    return pipeline.compute(ccuda.FeatureEngine(), img, spec)


def test_cuda_features_and_predict_match_cpu():
    """Simulator: every feature kind once on a 6x7 image; GEMV and fused paths."""
    from imgfilter.classify import cuda as ccuda

    img, truth = synthetic(6, 7, seed=5)
    mask = truth.copy()
    model, _ = classify.train(img, mask, spec=SMALL_SPEC, l2=1e-2, backend="cpu")
    F = model.n_features
    dX = _cuda_matrix(img, SMALL_SPEC)
    X = dX.copy_to_host()
    Xc = classify.extract_features(img, SMALL_SPEC, backend="cpu")
    assert X.shape == (42, ccuda.padded_width(F))
    np.testing.assert_allclose(X[:, :F], Xc, atol=1e-5)
    np.testing.assert_array_equal(X[:, F], 1.0)
    np.testing.assert_array_equal(X[:, F + 1 :], 0.0)
    W, b = model.folded(1.5)
    ref = cpu.predict(Xc, W, b, proba=True)
    for method in ("gemv", "fused"):
        out = ccuda.predict(dX, W, b, proba=True, method=method)
        np.testing.assert_allclose(out["proba"], ref["proba"], atol=1e-4)
        np.testing.assert_allclose(out["proba"].sum(axis=1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(out["index"], ref["index"])
    index = np.array([0, 5, 41, 7])
    np.testing.assert_array_equal(ccuda.gather(dX, index, F), X[index, :F])


def test_cuda_features_gray_uint16_and_float32_match_cpu():
    """Simulator: the one-channel and float32 inputs (raw and contour only: few launches)."""
    img, _ = synthetic(5, 6, seed=2)
    gray16 = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY).astype(np.uint16) * 257
    spec = normalize_spec({"raw": True, "contour": True})
    for im in (gray16, img.astype(np.float32) / 255):
        X = _cuda_matrix(im, spec).copy_to_host()
        Xc = classify.extract_features(im, spec, backend="cpu")
        np.testing.assert_allclose(X[:, : Xc.shape[1]], Xc, atol=1e-6)


def test_cuda_training_pieces_match_cpu():
    """Simulator: one loss evaluation (C GEMVs, log-softmax, C GEMVs of Z^T)."""
    from imgfilter.classify import cuda as ccuda

    rng = np.random.default_rng(0)
    Z = rng.standard_normal((16, 8)).astype(np.float32)
    Wa = rng.standard_normal((3, 8)).astype(np.float32)
    R = rng.standard_normal((16, 3)).astype(np.float32)
    g, c = ccuda.TrainEngine(Z), cpu.TrainEngine(Z)
    np.testing.assert_allclose(g.log_proba(Wa), c.log_proba(Wa), atol=1e-5)
    np.testing.assert_allclose(g.grad(R), c.grad(R), atol=1e-5)


def _small_features(rng, pixels: int = 64, features: int = 16) -> np.ndarray:
    """(pixels, 20) float32 as the device matrix is laid out: features, ones, zeros."""
    from imgfilter.classify import cuda as ccuda

    X = np.zeros((pixels, ccuda.padded_width(features)), np.float32)
    X[:, :features] = rng.standard_normal((pixels, features))
    X[:, features] = 1.0
    return X


def test_cuda_logits_take_no_strided_views_through_getitem(monkeypatch):
    """Simulator: predict (gemv) and the training logits on a (64, 20) matrix write each
    class's logits into a column of the (P, C) matrix without asking the device array's
    __getitem__ for a non-contiguous view. On a GPU that call is numba-cuda's
    DeviceNDArray.__getitem__, which loops in Python over every element of such a view
    (~13 s per column of a 4K image: predict took 26 s). Results still match the CPU."""
    if ON_GPU:
        pytest.skip("spies on the simulator's device arrays")
    from numba import cuda
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    from imgfilter.classify import cuda as ccuda

    strided = []
    getitem = FakeCUDAArray.__getitem__

    def spy(self, idx):
        got = getitem(self, idx)
        if isinstance(got, FakeCUDAArray) and not got._ary.flags.c_contiguous:
            strided.append((self._ary.shape, idx))
        return got

    monkeypatch.setattr(FakeCUDAArray, "__getitem__", spy)
    rng = np.random.default_rng(3)
    X = _small_features(rng)
    W = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    ref = cpu.predict(X[:, :16], W, b, proba=True)
    out = ccuda.predict(cuda.to_device(X), W, b, proba=True, method="gemv")
    np.testing.assert_allclose(out["proba"], ref["proba"], atol=1e-5)
    np.testing.assert_array_equal(out["index"], ref["index"])
    Wa = ccuda.weight_rows(W, b, X.shape[1])
    np.testing.assert_allclose(
        ccuda.TrainEngine(X).log_proba(Wa), cpu.TrainEngine(X).log_proba(Wa), atol=1e-5
    )
    assert strided == []
    # The spy does see such a view (what logits() used to take, out[:, c]).
    cuda.device_array((4, 3), np.float32)[:, 1]
    assert strided == [((4, 3), (slice(None), 1))]


def test_cuda_column_is_a_view_of_the_column():
    """`cuda.column(a, c)` is a[:, c]: shape, stride, values, and a view (on a GPU, the
    DeviceNDArray it builds; see test_gpu_4k_predict_gemv_under_a_second too)."""
    from numba import cuda

    from imgfilter.classify import cuda as ccuda

    host = np.arange(15, dtype=np.float32).reshape(5, 3)
    a = cuda.to_device(host)
    for c in range(3):
        col = ccuda.column(a, c)
        assert col.shape == (5,) and col.strides == (12,)
        np.testing.assert_array_equal(col.copy_to_host(), host[:, c])
    col = ccuda.column(a, 2)
    a.copy_to_device(-host)  # a view of a's memory, not a copy
    np.testing.assert_array_equal(col.copy_to_host(), -host[:, 2])
    with pytest.raises(IndexError):
        ccuda.column(a, 3)


def test_cuda_predict_device_image_gives_device_results():
    """Simulator: a device image in -> device labels and probabilities (no copy back),
    identical to the host image's; stream= accepted; float32 images take the contour
    source from a device kernel (kernels.classify.quantize_u8) equal to the host's."""
    from numba import cuda

    img, truth = synthetic(6, 7, seed=5)
    model, _ = classify.train(img, truth, spec=SMALL_SPEC, l2=1e-2, backend="cpu")
    for method in ("gemv", "fused"):
        ref = classify.predict(img, model, backend="cuda", method=method)
        got = classify.predict(cuda.to_device(img), model, method=method, stream=0)
        assert not isinstance(got.labels, np.ndarray) and hasattr(got.labels, "copy_to_host")
        np.testing.assert_array_equal(got.labels.copy_to_host(), ref.labels)
        np.testing.assert_array_equal(got.proba.copy_to_host(), ref.proba)
    assert classify.predict(cuda.to_device(img), model, proba=False).proba is None
    spec = normalize_spec({"raw": True, "contour": True})
    imf = img.astype(np.float32) / 255
    imf[0, 0, 0] = np.nan
    imf[1, 1, 1] = 1.5
    imf[2, 2, 2] = 0.5 / 255  # a tie: half to even, as np.rint
    model, _ = classify.train(imf, truth, spec=spec, l2=1e-2, backend="cpu")
    ref = classify.predict(imf, model, backend="cuda")
    got = classify.predict(cuda.to_device(imf), model)
    np.testing.assert_array_equal(got.labels.copy_to_host(), ref.labels)
    np.testing.assert_array_equal(got.proba.copy_to_host(), ref.proba)


def test_cuda_predict_device_image_checks():
    from numba import cuda

    img, truth = synthetic(6, 7, seed=5)
    model, _ = classify.train(img, truth, spec=SMALL_SPEC, l2=1e-2, backend="cpu")
    with pytest.raises(UsageError, match="cuda backend"):
        classify.predict(cuda.to_device(img), model, backend="cpu")
    with pytest.raises(UsageError, match="dtype"):
        classify.predict(cuda.to_device(img.astype(np.int16)), model)
    with pytest.raises(UsageError, match="C-contiguous"):
        classify.predict(cuda.to_device(np.concatenate([img, img], axis=1))[:, ::2], model)
    with pytest.raises(InputError, match="gray"):
        classify.predict(cuda.to_device(img[:, :, 0].copy()), model)


@pytest.mark.gpu
def test_gpu_4k_predict_gemv_under_a_second():
    """A warm predict (gemv) on a 3840*2160 x 20 matrix: ~1 ms of kernels, 26 s before
    the column views were made O(1) (`cuda.column`)."""
    import time

    from numba import cuda

    from imgfilter.classify import cuda as ccuda

    rng = np.random.default_rng(0)
    block = _small_features(rng, 2160)
    X = cuda.to_device(np.tile(block, (3840, 1)))  # 8.3 M x 20 float32, 663 MB
    W = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    ccuda.predict(X, W, b, proba=True, method="gemv")  # compiles
    t0 = time.perf_counter()
    out = ccuda.predict(X, W, b, proba=True, method="gemv")
    wall = time.perf_counter() - t0
    print(f"warm 4K predict (gemv): {wall * 1e3:.1f} ms")
    assert wall < 1.0
    assert out["index"].shape == (3840 * 2160,) and out["proba"].shape == (3840 * 2160, 3)
    ref = cpu.predict(block[:, :16], W, b, proba=True)
    np.testing.assert_allclose(out["proba"][-2160:], ref["proba"], atol=1e-5)
    assert np.mean(out["index"][-2160:] == ref["index"]) > 0.999


@pytest.mark.gpu
def test_gpu_default_features_and_training_match_cpu(astro_small):
    img = cv2.imread(str(REPO / "samples" / "astronaut.jpg"))
    mask = np.zeros(img.shape[:2], np.uint8)
    mask[20:60, 20:200] = 1
    mask[300:340, 150:250] = 2
    mask[100:140, 220:280] = 3
    Xg = classify.extract_features(img, backend="cuda")
    Xc = classify.extract_features(img, backend="cpu")
    np.testing.assert_allclose(Xg, Xc, atol=1e-5)
    model, info = classify.train(img, mask, backend="cpu")
    pc = classify.predict(img, model, backend="cpu")
    for method in ("gemv", "fused"):
        pg = classify.predict(img, model, backend="cuda", method=method)
        np.testing.assert_allclose(pg.proba, pc.proba, atol=1e-4)
        assert np.mean(pg.labels == pc.labels) > 0.9999
    model_g, info_g = classify.train(img, mask, backend="cuda")
    assert abs(info_g.loss - info.loss) < 1e-5
    pg = classify.predict(img, model_g, backend="cuda")
    diff = np.abs(pg.proba - pc.proba).max()
    print(f"CUDA-trained vs CPU-trained model: max probability difference {diff:.2e}")
    assert diff < 1e-3
    assert np.mean(pg.labels == pc.labels) > 0.999


@pytest.mark.gpu
def test_gpu_4k_gemv_and_fused_agree():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (2160, 3840, 3), dtype=np.uint8)
    truth = np.ones(img.shape[:2], np.uint8)
    truth[:, 1280:] = 2
    truth[:, 2560:] = 3
    img[truth == 2, 1] //= 2
    img[truth == 3, 2] //= 3
    model, _ = classify.train(img, scribbles(truth, 0.002), backend="cuda", max_iter=50)
    a = classify.predict(img, model, backend="cuda", method="gemv")
    b = classify.predict(img, model, backend="cuda", method="fused")
    np.testing.assert_allclose(a.proba, b.proba, atol=1e-5)
    assert np.mean(a.labels == b.labels) > 0.99999
    np.testing.assert_allclose(a.proba.sum(axis=2), 1.0, atol=1e-5)


@pytest.mark.gpu
def test_gpu_predict_device_image_returns_while_the_stream_is_busy(astro_small, astro_model):
    """Issue 23: classify.predict on a device image queues features, GEMVs, softmax and
    argmax behind 0.3 s of spin on the caller's stream and returns at once; the results
    equal the host image's. Then on a torch side stream whose image is written behind
    a spin kernel, with no caller-side sync."""
    from kernels.common import cudadrv, timing
    from kernels.common.arrays import to_device, to_host
    from kernels.common.devarray import stream_handle

    img, _ = astro_small
    model, _ = astro_model
    drv = cudadrv.driver()
    h = stream_handle(cuda_stream())
    for method in ("gemv", "fused"):
        ref = classify.predict(img, model, backend="cuda", method=method)
        dimg = to_device(img, h)
        classify.predict(dimg, model, method=method)  # compile first
        drv.synchronize(h)
        buf = timing.busy(0.3, stream=h)
        t0 = time.perf_counter()
        got = classify.predict(dimg, model, method=method, stream=h)
        took = time.perf_counter() - t0
        assert not drv.idle(h), "predict waited for the stream"
        assert took < 0.25
        np.testing.assert_array_equal(to_host(got.labels, h), ref.labels)
        np.testing.assert_allclose(to_host(got.proba, h), ref.proba, atol=1e-6)
        del buf
    torch = pytest.importorskip("torch")
    ref = classify.predict(img, model, backend="cuda")
    timg = torch.from_numpy(img).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.zeros_like(timg)
        buf = timing.busy(0.2, stream=side.cuda_stream)
        t.copy_(timg)  # behind the spin: a call on another stream sees zeros
        got = classify.predict(t, model)
        labels = torch.as_tensor(got.labels, device="cuda").cpu().numpy()
        proba = torch.as_tensor(got.proba, device="cuda").cpu().numpy()
        del buf
    np.testing.assert_array_equal(labels, ref.labels)
    np.testing.assert_allclose(proba, ref.proba, atol=1e-6)


def cuda_stream():
    from numba import cuda

    return cuda.stream()


def test_auto_engine_needs_a_compiler(monkeypatch, capsys):
    """The CUDA engine compiles what does not ship: backend "auto" on a GPU without the
    CUDA compiler falls back to the CPU engine, saying why; "cuda" and a GPU with the
    compiler take the CUDA engine."""
    from imgfilter import backends
    from imgfilter.classify import cuda as cuda_engine

    monkeypatch.setattr(backends, "get_backend", lambda name, *, device_input=False:
                        type("B", (), {"NAME": "cuda"}))  # fmt: skip
    monkeypatch.setattr(backends, "compiler_problem", lambda: "no NVVM here")
    assert classify.engine("auto") is not cuda_engine
    assert "no NVVM here; using the CPU engine" in capsys.readouterr().err
    assert classify.engine("cuda") is cuda_engine
    monkeypatch.setattr(backends, "compiler_problem", lambda: None)
    assert classify.engine("auto") is cuda_engine


@pytest.mark.parametrize("channels, k", [(3, 15), (1, 4), (3, 1), (1, 41)])
def test_cpu_engine_box_feature_is_the_cpu_backends_blur(channels, k):
    """The CPU engine boxes its float32 planes with cv2.blur (no Numba loop to compile):
    the CPU backend's exact float32 box, on [0, 1] planes as the features have them."""
    from imgfilter import api

    rng = np.random.default_rng(channels * 100 + k)
    planes = rng.random((37, 53, channels), dtype=np.float32)
    got = cpu.FeatureEngine().blur(planes, k)
    assert got.shape == planes.shape and got.dtype == np.float32
    want = api.blur(planes, k, backend="cpu")
    np.testing.assert_allclose(got, want.reshape(planes.shape), rtol=2e-7, atol=0)
