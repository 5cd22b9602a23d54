"""Per-pixel classification: softmax regression on filter features (issue 6).

    from imgfilter import classify
    model, info = classify.train(img, mask)              # mask: 0 unlabelled, 1..C
    out = classify.predict(img, model)                   # out.labels (H, W) uint8
    classify.save(model, "model.npz"); model = classify.load("model.npz")

Features: `imgfilter.classify.features` (smoothed colour at several scales, edge
magnitudes, the contour map), standardised with the training pixels' mean and std.
Model: multinomial logistic regression, loss = mean cross-entropy + l2 / 2 * ||W||^2
(the biases are not penalised), minimised by L-BFGS from zero weights: deterministic.
Engines: CUDA (GEMV + softmax kernels, `imgfilter.classify.cuda`) or CPU (NumPy,
`imgfilter.classify.cpu`), picked like the filters' backends; results agree within 1e-4.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import InputError, UsageError
from . import lbfgs, pipeline
from .features import DEFAULT_SPEC, colour_channels, feature_names, normalize_spec, parse_spec
from .model import MAX_CLASSES, Model, load, save

__all__ = [
    "DEFAULT_SPEC",
    "Model",
    "Prediction",
    "TrainInfo",
    "engine",
    "extract_features",
    "feature_names",
    "labels_from_colours",
    "load",
    "load_legend",
    "overlay",
    "parse_spec",
    "predict",
    "save",
    "train",
]

DEFAULT_L2 = 1e-3
DEFAULT_MAX_ITER = 300
DEFAULT_MAX_SAMPLES = 200_000
METHODS = ("auto", "gemv", "fused")
# Class colours (BGR) for overlays: class k gets PALETTE[(k - 1) % len].
PALETTE = np.array(
    [
        [40, 39, 214],  # red
        [44, 160, 44],  # green
        [180, 119, 31],  # blue
        [14, 127, 255],  # orange
        [189, 103, 148],  # purple
        [207, 190, 23],  # cyan
        [34, 189, 188],  # olive
        [194, 119, 227],  # pink
        [75, 86, 140],  # brown
        [127, 127, 127],  # grey
    ],
    dtype=np.uint8,
)


def engine(backend: str = "auto", *, device_input: bool = False) -> ModuleType:
    """The classifier's engine module for a backend name.

    Args:
        backend: "auto", "cuda" or "cpu", picked like the filters' backends.
        device_input: The image is a device array, which needs the CUDA engine.

    Returns:
        `imgfilter.classify.cuda` (GEMV and softmax kernels) or `imgfilter.classify.cpu`
        (NumPy).

    Raises:
        UsageError: An unknown backend name, or a device image with backend "cpu".
        DeviceError: Backend "cuda" without a usable GPU.
    """
    from ..backends import compiler_problem, get_backend

    name = get_backend(backend, device_input=device_input).NAME
    # The CUDA engine runs shipped kernels without Numba and compiles the others, which
    # needs the CUDA compiler (NVVM): "auto" without it falls back to the CPU engine.
    if name == "cuda" and str(backend).lower() == "auto" and not device_input:
        problem = compiler_problem()
        if problem is not None:
            print(f"imgfilter: {problem}; using the CPU engine", file=sys.stderr)
            name = "cpu"
    if name == "cuda":
        from . import cuda

        return cuda
    from . import cpu

    return cpu


def _check_image(img: Any) -> np.ndarray:
    arr = np.asarray(img)
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 3, 4)):
        raise UsageError(f"image must be (H, W) or (H, W, 1|3|4), got shape {arr.shape}")
    if arr.dtype not in (np.uint8, np.uint16, np.float32):
        raise UsageError(f"image dtype {arr.dtype} is not supported; use uint8, uint16 or float32")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise UsageError(f"image is empty (shape {arr.shape})")
    return np.ascontiguousarray(arr)


def _device_image(img: Any):
    """A device image as a view the CUDA engine takes (no copy, no waiting), checked
    as _check_image checks host images; None for anything else."""
    if isinstance(img, np.ndarray):
        return None
    from kernels.common.arrays import as_device_array, is_device_array

    if not is_device_array(img):
        return None
    try:
        arr = as_device_array(img)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"unusable device array: {exc}") from None
    shape, dtype = tuple(arr.shape), np.dtype(arr.dtype)
    if len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 3, 4)):
        raise UsageError(f"image must be (H, W) or (H, W, 1|3|4), got shape {shape}")
    if dtype not in (np.uint8, np.uint16, np.float32):
        raise UsageError(f"image dtype {dtype} is not supported; use uint8, uint16 or float32")
    if shape[0] < 1 or shape[1] < 1:
        raise UsageError(f"image is empty (shape {shape})")
    contiguous = arr.is_c_contiguous  # a property of DeviceArray, a method of Numba's
    if not (contiguous if isinstance(contiguous, bool) else contiguous()):
        raise UsageError("device images must be C-contiguous")
    return arr


def extract_features(img: Any, spec: dict | None = None, *, backend: str = "auto") -> np.ndarray:
    """The feature matrix of an image, on the host (for inspection, tests and other
    models).

    Args:
        img: (H, W) or (H, W, 1|3|4), uint8, uint16 or float32, a NumPy array.
        spec: The feature set (`imgfilter.classify.features`); default `DEFAULT_SPEC`.
        backend: "auto", "cuda" or "cpu" (see `engine`).

    Returns:
        (H * W, F) float32, one row per pixel in row-major order, the columns in
        `feature_names` order.

    Raises:
        UsageError: An unsupported image or a malformed feature set.

    Example:
        >>> import numpy as np
        >>> from imgfilter import classify
        >>> img = np.zeros((64, 64, 3), np.uint8)
        >>> classify.extract_features(img).shape
        (4096, 19)
    """
    arr = _check_image(img)
    spec = normalize_spec(spec)
    eng = engine(backend)
    X = pipeline.compute(eng.FeatureEngine(), arr, spec)
    F = len(feature_names(spec, colour_channels(arr)))
    if eng.NAME == "cuda":
        from kernels.common.arrays import to_host

        return to_host(X)[:, :F]
    return X


def check_labels(labels: Any, shape: tuple[int, int], name: str = "label mask") -> np.ndarray:
    """The mask as (H, W) int64: 0 unlabelled, 1..255 classes; InputError if unusable."""
    lab = np.asarray(labels)
    if lab.ndim == 3 and lab.shape[2] == 1:
        lab = lab[:, :, 0]
    if lab.ndim == 3 and lab.shape[2] in (3, 4):
        same = (lab[:, :, :3] == lab[:, :, :1]).all()
        if not same:
            raise InputError(
                f"{name} is a colour image; it must be single-channel class numbers "
                "(0 unlabelled, 1..C), e.g. an 8-bit gray PNG"
            )
        lab = lab[:, :, 0]
    if lab.ndim != 2:
        raise InputError(f"{name} must be a single-channel image, got shape {lab.shape}")
    if lab.dtype.kind not in "ui":
        raise InputError(f"{name} must hold integer class numbers, got {lab.dtype}")
    if lab.shape != tuple(shape):
        raise InputError(
            f"{name} is {lab.shape[1]}x{lab.shape[0]} but the image is {shape[1]}x{shape[0]}"
        )
    lab = lab.astype(np.int64)
    if lab.min(initial=0) < 0 or lab.max(initial=0) > MAX_CLASSES:
        raise InputError(f"{name} values must be 0 (unlabelled) or class numbers 1..255")
    classes = np.unique(lab[lab > 0])
    if classes.size < 2:
        found = "no labelled pixels" if classes.size == 0 else f"only class {classes[0]}"
        raise InputError(f"{name} needs at least two classes (values 1..C), found {found}")
    return lab


def load_legend(path: Any) -> dict[int, tuple[int, int, int]]:
    """Read a legend file: JSON mapping class numbers to the mask's colours.

    For example {"1": "#d62728", "2": "#2ca02c", "3": [31, 119, 180]}: each colour RGB,
    as hex or a list; class numbers 1..255; no two classes of one colour.

    Args:
        path: The JSON file.

    Returns:
        {class: (B, G, R)}.

    Raises:
        InputError: One line, for a missing or unreadable file, invalid JSON, or anything
            malformed (not an object, a bad class number or colour, a shared colour).
    """
    import json
    from pathlib import Path

    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"legend file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read legend file {p}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"legend file {p} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"legend file {p} must be a JSON object of class number -> colour")
    legend: dict[int, tuple[int, int, int]] = {}
    for key, value in data.items():
        try:
            cls = int(key)
        except ValueError:
            raise InputError(f"legend {p}: {key!r} is not a class number") from None
        if not 1 <= cls <= MAX_CLASSES:
            raise InputError(f"legend {p}: class {cls} is outside 1..255")
        rgb = None
        if isinstance(value, str) and len(value) == 7 and value.startswith("#"):
            try:
                rgb = tuple(int(value[i : i + 2], 16) for i in (1, 3, 5))
            except ValueError:
                rgb = None
        elif (
            isinstance(value, list)
            and len(value) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in value)
        ):
            rgb = tuple(value)
        if rgb is None:
            raise InputError(
                f"legend {p}: the colour of class {cls} must be '#rrggbb' or [r, g, b], "
                f"got {value!r}"
            )
        bgr = (rgb[2], rgb[1], rgb[0])
        if bgr in legend.values():
            raise InputError(f"legend {p}: two classes share the colour {value!r}")
        legend[cls] = bgr
    return legend


def labels_from_colours(mask: Any, legend: dict[int, tuple[int, int, int]], name: str = "mask"):
    """Class numbers from a colour-coded mask.

    A pixel of a legend colour gets its class, any other pixel (and a transparent one)
    is unlabelled (0).

    Args:
        mask: An 8-bit BGR or BGRA image.
        legend: {class: (B, G, R)}, as `load_legend` returns.
        name: What to call the mask in error messages.

    Returns:
        (H, W) uint8 class numbers.

    Raises:
        InputError: A mask that is not an 8-bit colour image.
    """
    arr = np.asarray(mask)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.dtype != np.uint8:
        raise InputError(f"{name}: with a legend the mask must be an 8-bit colour image")
    out = np.zeros(arr.shape[:2], np.uint8)
    opaque = arr[:, :, 3] > 0 if arr.shape[2] == 4 else np.ones(arr.shape[:2], bool)
    packed = (arr[:, :, 0].astype(np.uint32) << 16) | (arr[:, :, 1].astype(np.uint32) << 8)
    packed |= arr[:, :, 2]
    for cls, (b, g, r) in legend.items():
        out[(packed == ((b << 16) | (g << 8) | r)) & opaque] = cls
    return out


@dataclass
class TrainInfo:
    """What `train` did.

    Attributes:
        loss: The loss (mean cross-entropy plus the L2 term) at the solution.
        accuracy: The fraction of the training pixels classified right at the solution.
        iterations: L-BFGS iterations.
        evaluations: Evaluations of the loss and its gradient.
        stop_reason: Why L-BFGS stopped.
        samples: Labelled pixels used (at most max_samples).
        labelled: Labelled pixels in the mask.
        counts: {class number: training pixels of that class}.
        seconds: Host seconds by stage ("features", "optimise").
    """

    loss: float
    accuracy: float
    iterations: int
    evaluations: int
    stop_reason: str
    samples: int
    labelled: int
    counts: dict[int, int]
    seconds: dict[str, float] = field(default_factory=dict)


def train(
    img: Any,
    labels: Any,
    *,
    spec: dict | None = None,
    l2: float = DEFAULT_L2,
    max_iter: int = DEFAULT_MAX_ITER,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    seed: int = 0,
    gtol: float = 1e-6,
    backend: str = "auto",
    progress: Callable[[int, float, float], None] | None = None,
) -> tuple[Model, TrainInfo]:
    """Fit a pixel classifier to an image and its label mask.

    Multinomial logistic regression on the image's features, standardised with the
    training pixels' mean and std, minimised by L-BFGS from zero weights: deterministic.

    Args:
        img: (H, W) or (H, W, 1|3|4), uint8, uint16 or float32, a NumPy array.
        labels: (H, W) integers, 0 = unlabelled, 1..C = classes (any subset of 1..255),
            at least two classes.
        spec: The feature set (`imgfilter.classify.features`); default `DEFAULT_SPEC`.
        l2: The L2 strength lam of loss = mean CE + lam / 2 * ||W||^2 (the biases are not
            penalised; scikit-learn's LogisticRegression with C = 1 / (lam * n) minimises
            the same function).
        max_iter: The most L-BFGS iterations.
        max_samples: At most this many labelled pixels are used (a seeded random subset).
        seed: The seed of that subset.
        gtol: L-BFGS stops when the largest gradient entry is below this.
        backend: "auto", "cuda" or "cpu" (see `engine`).
        progress: Called as progress(iteration, loss, accuracy) after each L-BFGS
            iteration.

    Returns:
        (model, info): the `Model` and a `TrainInfo`.

    Raises:
        UsageError: An unsupported image, a malformed feature set, a negative or
            non-finite l2, max_iter < 1 or max_samples < 2.
        InputError: An unusable label mask (colour, wrong size, values outside 0..255,
            fewer than two classes), or sampled pixels of fewer than two classes.
        DeviceError: Backend "cuda" without a usable GPU.

    Example:
        >>> import numpy as np
        >>> from imgfilter import classify
        >>> img = np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)
        >>> mask = np.zeros((64, 64), np.uint8)
        >>> mask[:8], mask[-8:] = 1, 2           # two labelled stripes
        >>> model, info = classify.train(img, mask, max_iter=50)
        >>> model.n_classes, info.labelled
        (2, 1024)
    """
    arr = _check_image(img)
    spec = normalize_spec(spec)
    if not (np.isfinite(l2) and l2 >= 0):
        raise UsageError(f"l2 must be a non-negative number, got {l2}")
    if max_iter < 1 or max_samples < 2:
        raise UsageError("max_iter must be >= 1 and max_samples >= 2")
    lab = check_labels(labels, arr.shape[:2])
    ch = colour_channels(arr)
    eng = engine(backend)
    times: dict[str, float] = {}

    t0 = time.perf_counter()
    flat = lab.reshape(-1)
    index = np.flatnonzero(flat)
    labelled = int(index.size)
    if index.size > max_samples:
        rng = np.random.default_rng(seed)
        index = np.sort(rng.choice(index, size=max_samples, replace=False))
    classes = np.unique(flat[index])
    if classes.size < 2:
        raise InputError("the sampled pixels hold fewer than two classes; raise max_samples")
    y = np.searchsorted(classes, flat[index])
    F = len(feature_names(spec, ch))
    X = pipeline.compute(eng.FeatureEngine(), arr, spec)
    if eng.NAME == "cuda":
        Xl = eng.gather(X, index, F)
    else:
        Xl = eng.gather(X, index)
    del X
    times["features"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    mean = Xl.mean(axis=0, dtype=np.float64)
    std = Xl.std(axis=0, dtype=np.float64)
    std[~(std > 1e-6)] = 1.0  # constant features: left unscaled (their weight stays ~0)
    width = (F + 1 + 3) // 4 * 4
    Z = np.zeros((index.size, width), np.float32)
    Z[:, :F] = (Xl - mean) / std
    Z[:, F] = 1.0
    teng = eng.TrainEngine(Z)
    n, C = index.size, classes.size
    rows = np.arange(n)
    last = {"acc": 0.0}

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        Wa = theta.reshape(C, width)
        logp = teng.log_proba(Wa.astype(np.float32)).astype(np.float64)
        W = Wa[:, :F]
        loss = -logp[rows, y].mean() + 0.5 * l2 * float(np.sum(W * W))
        R = np.exp(logp)
        last["acc"] = float(np.mean(np.argmax(R, axis=1) == y))
        R[rows, y] -= 1.0
        R /= n
        G = teng.grad(R.astype(np.float32)).astype(np.float64)
        G[:, F + 1 :] = 0.0
        G[:, :F] += l2 * W
        return float(loss), G.ravel()

    def callback(it: int, loss: float, theta: np.ndarray) -> None:
        if progress is not None:
            progress(it, loss, last["acc"])

    res = lbfgs.minimize(
        objective, np.zeros(C * width), max_iter=max_iter, gtol=gtol, callback=callback
    )
    # The accuracy at the solution (the last evaluation may have been a rejected step).
    final_loss, _ = objective(res.x)
    times["optimise"] = time.perf_counter() - t0
    Wa = res.x.reshape(C, width)
    model = Model(
        weights=Wa[:, :F].copy(),
        bias=Wa[:, F].copy(),
        mean=mean,
        std=std,
        classes=classes.astype(np.int64),
        spec=spec,
        channels=ch,
        meta={
            "l2": float(l2),
            "train": {
                "loss": final_loss,
                "accuracy": last["acc"],
                "iterations": res.iterations,
                "stop_reason": res.reason,
                "samples": int(n),
                "labelled": labelled,
                "seed": int(seed),
                "engine": eng.NAME,
            },
        },
    )
    counts = {int(c): int(np.sum(y == i)) for i, c in enumerate(classes)}
    info = TrainInfo(
        final_loss, last["acc"], res.iterations, res.evaluations, res.reason, int(n), labelled,
        counts, times,
    )  # fmt: skip
    return model, info


@dataclass
class Prediction:
    """What `predict` returns.

    Attributes:
        labels: (H, W) uint8 class numbers: NumPy, or a device array for a device image.
        proba: (H, W, C) float32 class probabilities, likewise; None when not asked for.
        seconds: Host seconds by stage ("features", "classify"); for a device image, the
            host time to queue the work.
    """

    labels: Any  # (H, W) uint8 class numbers: NumPy, or a device array for a device image
    proba: Any | None  # (H, W, C) float32, likewise
    seconds: dict[str, float] = field(default_factory=dict)


def predict(
    img: Any,
    model: Model,
    *,
    temperature: float = 1.0,
    proba: bool = True,
    backend: str = "auto",
    method: str = "auto",
    stream: Any = None,
) -> Prediction:
    """Label every pixel: the class of highest probability, and the probabilities.

    Args:
        img: A NumPy image (NumPy results; the call waits for them), or a device image
            (anything with `__cuda_array_interface__`: CuPy, torch, Numba; C-contiguous;
            CUDA engine): then labels and proba are device arrays, queued without
            waiting for the GPU. (H, W) or (H, W, 1|3|4), uint8, uint16 or float32, gray
            or colour as the model's training images.
        model: A trained or loaded `Model`.
        temperature: T divides the logits (T > 1 flattens the probabilities, T < 1
            sharpens them; the labels do not change).
        proba: Return the probabilities too.
        backend: "auto", "cuda" or "cpu" (see `engine`).
        method: CUDA: "gemv" (a GEMV per class, then the softmax kernel; "auto") or
            "fused" (one kernel per pixel row).
        stream: CUDA: where every launch and copy goes, a CuPy, torch, Numba or
            cuda.core stream or a CUstream handle; default the device image's own stream
            (its interface's), else the legacy default stream.

    Returns:
        A `Prediction` (Prediction.seconds is host time to queue the work for a device
        image).

    Raises:
        UsageError: An unsupported image, an unknown method, or a temperature that is
            not a positive number.
        InputError: A gray image for a colour model, or the other way round.
        DeviceError: Backend "cuda" without a usable GPU.

    Example:
        >>> import imgfilter
        >>> from imgfilter import classify
        >>> img = imgfilter.read_image("samples/astronaut.jpg")
        >>> model = classify.load("samples/classify/astronaut.model.npz")
        >>> out = classify.predict(img, model, temperature=2.0)
        >>> out.labels.shape, out.labels.dtype, out.proba.shape
        ((512, 512), dtype('uint8'), (512, 512, 3))
    """
    dimg = _device_image(img)
    arr = _check_image(img) if dimg is None else dimg
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    ch = colour_channels(arr)
    if ch != model.channels:
        kind = {1: "gray", 3: "colour"}
        raise InputError(
            f"the model was trained on {kind[model.channels]} images ({model.channels} "
            f"channel(s)); this image is {kind[ch]} ({ch})"
        )
    W, b = model.folded(temperature)
    eng = engine(backend, device_input=dimg is not None)
    h, w = arr.shape[:2]
    C = model.n_classes
    lut = model.classes.astype(np.uint8)
    t0 = time.perf_counter()
    if eng.NAME != "cuda":
        X = pipeline.compute(eng.FeatureEngine(), arr, model.spec)
        t1 = time.perf_counter()
        out = eng.predict(X, W, b, proba=proba, lut=lut)
        t2 = time.perf_counter()
        labels = out["index"].reshape(h, w)
        p = None if out["proba"] is None else out["proba"].reshape(h, w, C)
        return Prediction(labels, p, {"features": t1 - t0, "classify": t2 - t1})
    how = "fused" if method == "fused" else "gemv"
    fe = eng.FeatureEngine(stream)
    X = pipeline.compute(fe, arr, model.spec)
    t1 = time.perf_counter()
    if dimg is not None:
        dindex, dprobs = eng.predict_device(X, W, b, method=how, lut=lut, stream=fe.stream)
        labels = dindex.reshape(h, w)
        p = dprobs.reshape(h, w, C) if proba else None
    else:
        out = eng.predict(X, W, b, proba=proba, method=how, lut=lut, stream=fe.stream)
        labels = out["index"].reshape(h, w)
        p = None if out["proba"] is None else out["proba"].reshape(h, w, C)
    t2 = time.perf_counter()
    return Prediction(labels, p, {"features": t1 - t0, "classify": t2 - t1})


def overlay(img: Any, labels: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """A picture of the labels: the image blended with class colours.

    Args:
        img: The image (as 8-bit gray-or-colour: uint16 scaled down, float32 clipped
            to [0, 1]).
        labels: (H, W) class numbers; class k gets PALETTE[(k - 1) % len(PALETTE)].
        alpha: The weight of the class colours.

    Returns:
        (H, W, 3) BGR uint8.
    """
    arr = np.asarray(img)
    h, w = arr.shape[:2]
    base = arr.reshape(h, w, -1)
    if base.dtype == np.uint16:
        base = (base.astype(np.float32) / 257.0).round()
    elif base.dtype == np.float32:
        base = np.clip(np.nan_to_num(base), 0.0, 1.0) * 255.0
    base = base.astype(np.float32)
    if base.shape[2] == 1:
        base = np.repeat(base, 3, axis=2)
    base = base[:, :, :3]
    colours = PALETTE[(labels.astype(np.int64) - 1) % len(PALETTE)].astype(np.float32)
    out = (1.0 - alpha) * base + alpha * colours
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
