"""The pixel classifier's model file: plain arrays plus JSON metadata in a .npz.

Arrays: weights (C, F) float64, bias (C,) float64, mean (F,) and std (F,) float64 (the
standardisation of each feature), classes (C,) int64 (the label numbers of the training
mask), and meta: a 0-d unicode array holding JSON (format, version, feature set,
channels, feature names, L2 strength, training summary). Loaded with
`np.load(allow_pickle=False)`: a model file is untrusted input, and every field is
checked before use; anything wrong is an InputError (exit code 3) naming the problem.
"""

from __future__ import annotations

import io as _bytes_io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, OutputError, UsageError
from .features import feature_names, normalize_spec

FORMAT = "imgfilter-pixel-classifier"
VERSION = 1
ARRAYS = ("weights", "bias", "mean", "std", "classes", "meta")
MAX_CLASSES = 255


@dataclass
class Model:
    """A trained pixel classifier: what `train` returns and a model file holds.

    Attributes:
        weights: (C, F) float64, acting on standardised features.
        bias: (C,) float64.
        mean: (F,) float64, the training pixels' mean of each feature (standardisation).
        std: (F,) float64, their std of each feature.
        classes: (C,) int64 label numbers of the training mask, increasing, 1..255.
        spec: The feature set (`imgfilter.classify.features`).
        channels: The colour channels of the training images: 1 (gray) or 3 (colour).
        meta: JSON metadata: the L2 strength and the training summary; a model file's
            also holds the format, version, feature set, channels and feature names.
    """

    weights: np.ndarray  # (C, F) on standardised features
    bias: np.ndarray  # (C,)
    mean: np.ndarray  # (F,)
    std: np.ndarray  # (F,)
    classes: np.ndarray  # (C,) label numbers, increasing, 1..255
    spec: dict[str, Any]
    channels: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_classes(self) -> int:
        """The number of classes C."""
        return int(self.classes.shape[0])

    @property
    def n_features(self) -> int:
        """The number of features F."""
        return int(self.weights.shape[1])

    def folded(self, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """The weights folded with the standardisation and the temperature.

        Args:
            temperature: T, which divides the logits.

        Returns:
            (W, b) float32 acting on raw features: logits / T = W x + b.

        Raises:
            UsageError: A temperature that is not a positive number.
        """
        if not (np.isfinite(temperature) and temperature > 0):
            raise UsageError(f"temperature must be a positive number, got {temperature}")
        w = self.weights / self.std[None, :]
        b = self.bias - w @ self.mean
        return (w / temperature).astype(np.float32), (b / temperature).astype(np.float32)

    def to_bytes(self) -> bytes:
        """The model file's bytes (.npz): the arrays, and meta as JSON with the format,
        version, feature set, channels and feature names."""
        meta = dict(self.meta)
        meta.update(
            format=FORMAT,
            version=VERSION,
            features=self.spec,
            channels=self.channels,
            feature_names=feature_names(self.spec, self.channels),
        )
        buf = _bytes_io.BytesIO()
        np.savez(
            buf,
            weights=np.asarray(self.weights, np.float64),
            bias=np.asarray(self.bias, np.float64),
            mean=np.asarray(self.mean, np.float64),
            std=np.asarray(self.std, np.float64),
            classes=np.asarray(self.classes, np.int64),
            meta=np.array(json.dumps(meta, sort_keys=True)),
        )
        return buf.getvalue()


def save(model: Model, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the model to a .npz file atomically (never half a file).

    Args:
        model: The model.
        path: The file to write; its name must end in .npz.
        overwrite: Replace an existing file.

    Returns:
        The Path written.

    Raises:
        OutputError: When it cannot write: a name not ending in .npz, a missing or
            unwritable directory, a directory as target, or an existing file without
            `overwrite`.

    Example:
        >>> import imgfilter
        >>> from imgfilter import classify
        >>> img = imgfilter.read_image("samples/astronaut.jpg")
        >>> mask = imgfilter.read_image("samples/classify/astronaut.scribbles.png")
        >>> model, info = classify.train(img, mask)
        >>> classify.save(model, "model.npz", overwrite=True).name
        'model.npz'
    """
    from .. import io

    p = Path(path)
    if p.suffix.lower() != ".npz":
        raise OutputError(f"cannot write {p}: a model file must end in .npz")
    io.check_path(p, input_path=None, overwrite=overwrite)
    io.atomic_write(p, model.to_bytes(), overwrite=overwrite)
    return p


def _bad(path: Path, why: str) -> InputError:
    return InputError(f"{path} is not a valid imgfilter model: {why}")


def load(path: str | Path) -> Model:
    """Read and validate a model file.

    The file is read with `np.load(allow_pickle=False)`: a model file is untrusted
    input, and every field is checked before use.

    Args:
        path: A file written by `save`.

    Returns:
        The `Model`.

    Raises:
        InputError: One line naming the problem: a missing file, a directory, an
            unreadable file, not an .npz archive, missing arrays, bad JSON metadata, an
            unsupported format or version, or arrays of the wrong dtype, shape or values.

    Example:
        >>> from imgfilter import classify
        >>> model = classify.load("samples/classify/astronaut.model.npz")
        >>> model.n_classes, model.channels, model.classes
        (3, 3, array([1, 2, 3]))
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"model file {p} does not exist")
    if p.is_dir():
        raise InputError(f"model file {p} is a directory")
    try:
        is_zip = zipfile.is_zipfile(p)
    except OSError as e:
        raise InputError(f"cannot read model file {p}: {e.strerror or e}") from None
    if not is_zip:
        raise _bad(p, "not an .npz archive")
    try:
        with np.load(p, allow_pickle=False) as z:
            missing = [k for k in ARRAYS if k not in z.files]
            if missing:
                raise _bad(p, f"missing {', '.join(missing)}")
            arrays = {k: z[k] for k in ARRAYS}
    except InputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        # ValueError: pickled object arrays (refused), bad headers; BadZipFile: not an npz.
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise _bad(p, f"cannot read it as .npz ({reason})") from None
    meta_arr = arrays["meta"]
    if meta_arr.dtype.kind != "U" or meta_arr.shape != ():
        raise _bad(p, "meta is not a JSON string")
    try:
        meta = json.loads(str(meta_arr))
    except json.JSONDecodeError as e:
        raise _bad(p, f"meta is not valid JSON ({e.msg})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _bad(p, f"meta.format is not {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise _bad(p, f"version {meta.get('version')!r} is not supported (this is {VERSION})")
    try:
        spec = normalize_spec(meta.get("features"))
    except UsageError as e:
        raise _bad(p, str(e)) from None
    channels = meta.get("channels")
    if channels not in (1, 3):
        raise _bad(p, f"channels must be 1 or 3, got {channels!r}")
    n_feat = len(feature_names(spec, channels))
    W, b, mean, std, classes = (arrays[k] for k in ("weights", "bias", "mean", "std", "classes"))
    for name, arr in (("weights", W), ("bias", b), ("mean", mean), ("std", std)):
        if arr.dtype.kind != "f":
            raise _bad(p, f"{name} is {arr.dtype}, not floating point")
        if not np.isfinite(arr).all():
            raise _bad(p, f"{name} holds NaN or infinity")
    if classes.dtype.kind not in "iu":
        raise _bad(p, f"classes is {classes.dtype}, not integer")
    if W.ndim != 2 or W.shape[1] != n_feat:
        raise _bad(
            p,
            f"weights have shape {W.shape}, but its feature set has {n_feat} features "
            f"for {channels} channel(s)",
        )
    C = W.shape[0]
    if not 2 <= C <= MAX_CLASSES:
        raise _bad(p, f"{C} classes (2..{MAX_CLASSES} supported)")
    if b.shape != (C,) or classes.shape != (C,):
        raise _bad(p, f"bias {b.shape} / classes {classes.shape} do not match {C} classes")
    if mean.shape != (n_feat,) or std.shape != (n_feat,):
        raise _bad(p, f"mean {mean.shape} / std {std.shape} do not match {n_feat} features")
    if (std <= 0).any():
        raise _bad(p, "std has entries <= 0")
    if (classes < 1).any() or (classes > MAX_CLASSES).any() or (np.diff(classes) <= 0).any():
        raise _bad(p, "classes must be increasing label numbers in 1..255")
    return Model(
        weights=W.astype(np.float64),
        bias=b.astype(np.float64),
        mean=mean.astype(np.float64),
        std=std.astype(np.float64),
        classes=classes.astype(np.int64),
        spec=spec,
        channels=int(channels),
        meta=meta,
    )
