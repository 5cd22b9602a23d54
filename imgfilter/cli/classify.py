"""`imgfilter train` and `imgfilter classify`: the per-pixel classifier of
imgfilter.classify from the command line.

`train` fits a model to an image and a painted label mask and writes it as a .npz.
`classify` writes each input's label map (INPUT_STEM.labels.png by default, always a
lossless format) and, on request, its probabilities (.npy) and a colour overlay; with
several inputs --proba and --overlay are name templates (many.run_many).
"""

from __future__ import annotations

import io as _bytes_io
import math
import os
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import InputError, OutputError, UsageError
from . import many
from .options import (
    BackendOpt,
    DebugOpt,
    ForceOpt,
    GpusOpt,
    InPath,
    InPaths,
    JobsOpt,
    OutDirOpt,
    QuietOpt,
    RecursiveOpt,
    SchedulerOpt,
    SkipExistingOpt,
)
from .output import PROG, describe, info, note, shown, stage
from .typer_app import app_command, command
from .values import Backend, check_gpu_first, engine, resolve_backend

MethodClassify = Enum("MethodClassify", {n: n for n in ("auto", "gemv", "fused")}, type=str)
LABELS_TEMPLATE = "{stem}.labels.png"  # each label map's default name
LOSSY = (".jpg", ".jpeg")


# ------------------------------------------------------------------------------ train


class _Progress:
    """Training progress on stderr: a bar redrawn in place on a terminal, else a line
    every 10 iterations."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total = total
        self.quiet = quiet
        self.tty = sys.stderr.isatty()

    def __call__(self, it: int, loss: float, acc: float) -> None:
        if self.quiet:
            return
        text = f"iteration {it:4d}  loss {loss:.5f}  training accuracy {100 * acc:6.2f}%"
        if self.tty:
            done = int(20 * it / self.total)
            print(f"\r[{'#' * done}{'.' * (20 - done)}] {text}", end="", file=sys.stderr)
        elif it % 10 == 0 or it == 1:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.tty and not self.quiet:
            print(file=sys.stderr)


LabelsOpt = Annotated[
    Path,
    typer.Argument(
        metavar="LABELS",
        help="Label mask: single-channel image, 0 = unlabelled, 1..C = class numbers.",
    ),
]
TrainOutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="MODEL.npz",
        help="Model file to write. Default: INPUT_STEM.model.npz beside INPUT.",
    ),
]
FeaturesOpt = Annotated[
    str | None,
    typer.Option(
        "--features",
        metavar="SPEC",
        help="Feature set, e.g. 'raw;gauss=1,2,4;box=15;edges=1,2,4;contour' (the default).",
    ),
]
L2Opt = Annotated[
    float,
    typer.Option(
        "--l2",
        min=0.0,
        metavar="LAMBDA",
        help="L2 strength: loss = mean cross-entropy + LAMBDA/2 * |W|^2.",
    ),
]
MaxIterOpt = Annotated[
    int, typer.Option("--max-iter", min=1, metavar="N", help="L-BFGS iterations at most.")
]
MaxSamplesOpt = Annotated[
    int,
    typer.Option(
        "--max-samples",
        min=2,
        metavar="N",
        help="Labelled pixels used at most (a random subset, see --seed).",
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", help="Seed of that subset.")]
LegendOpt = Annotated[
    Path | None,
    typer.Option(
        "--legend",
        metavar="FILE.json",
        help="LABELS is colour-coded: JSON mapping class numbers to colours, "
        'e.g. {"1": "#ff0000", "2": "#00ff00"}; other colours are unlabelled.',
    ),
]
ModelOpt = Annotated[
    Path, typer.Option("--model", "-m", metavar="MODEL.npz", help="Model from `train`.")
]
ClassifyOutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="LABELS",
        help="Label map (single channel, class numbers). Default: INPUT_STEM.labels.png. "
        "One input only.",
    ),
]
ProbaOpt = Annotated[
    Path | None,
    typer.Option(
        "--proba",
        metavar="FILE.npy",
        help="Also write the probabilities, float32 (H, W, C). With several inputs, a "
        "name template such as '{stem}.proba.npy', written beside each label map.",
    ),
]
OverlayOpt = Annotated[
    Path | None,
    typer.Option(
        "--overlay",
        metavar="FILE",
        help="Also write the image blended with class colours. With several inputs, a "
        "name template such as '{stem}.overlay.png', written beside each label map.",
    ),
]
TemperatureOpt = Annotated[
    float,
    typer.Option(
        "--temperature",
        "-t",
        metavar="T",
        help="Divide the logits by T (flatter probabilities for T > 1).",
    ),
]
ClassifyMethodOpt = Annotated[
    MethodClassify,
    typer.Option(
        "--method",
        case_sensitive=False,
        metavar="NAME",
        help="CUDA: gemv (a GEMV per class + softmax kernel; auto) or fused.",
    ),
]
ClassifyNameOpt = Annotated[
    str | None,
    typer.Option(
        "--name",
        metavar="TEMPLATE",
        help="Label map file names, a template of the fields stem, ext, name and op "
        "(labels), each in braces as in Python's str.format (docs/many-files.md). "
        "Default: INPUT_STEM.labels.png.",
    ),
]


@app_command("train")
@command
def train(
    image: InPath,
    labels: LabelsOpt,
    output: TrainOutputOpt = None,
    features: FeaturesOpt = None,
    l2: L2Opt = 1e-3,
    max_iter: MaxIterOpt = 300,
    max_samples: MaxSamplesOpt = 200_000,
    seed: SeedOpt = 0,
    legend: LegendOpt = None,
    backend: BackendOpt = Backend.auto,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Train a per-pixel classifier from an image and a painted label mask.

    LABELS has the image's size; each pixel holds 0 (unlabelled) or the number of its
    class (1..C), or, with --legend, a colour the legend names. The model (softmax
    regression on filter features: smoothed colour, edges, contours) is written as a
    .npz of plain arrays and JSON metadata.

    Example: imgfilter train photo.jpg scribbles.png -o model.npz
    """
    from .. import classify, io

    check_gpu_first(backend)
    spec = classify.parse_spec(features) if features is not None else None
    target = output if output is not None else image.with_name(f"{image.stem}.model.npz")
    _check_npy_output(target, ".npz", "a model file", inputs=(image, labels), force=force)
    colours = classify.load_legend(legend) if legend is not None else None
    img = io.read_image(image)
    mask = io.read_image(labels)
    if colours is not None:
        mask = classify.labels_from_colours(mask, colours, name=f"label mask {labels}")
    classify.check_labels(mask, img.shape[:2], name=f"label mask {labels}")
    backend_name = resolve_backend(backend)
    progress = _Progress(max_iter, quiet)
    start = time.perf_counter()
    try:
        model, fit = classify.train(
            img, mask, spec=spec, l2=l2, max_iter=max_iter, max_samples=max_samples,
            seed=seed, backend=backend_name, progress=progress,
        )  # fmt: skip
    finally:
        progress.close()
    seconds = time.perf_counter() - start
    io.atomic_write(target, model.to_bytes(), overwrite=force)
    counts = ", ".join(f"class {c}: {n}" for c, n in fit.counts.items())
    info(
        f"wrote {shown(target)} ({model.n_classes} classes, {model.n_features} features, "
        f"{backend_name}): loss {fit.loss:.5f}, training accuracy {100 * fit.accuracy:.2f}% "
        f"on {fit.samples} pixels ({counts}); {fit.iterations} iterations "
        f"({fit.stop_reason}), {seconds:.2f} s"
    )


def _check_npy_output(path: Path, suffix: str, what: str, *, inputs: tuple, force: bool) -> None:
    """OutputError unless `path` ends in `suffix` and may be written (io.check_path)."""
    from .. import io

    if path.suffix.lower() != suffix:
        raise OutputError(f"cannot write {path}: {what} must end in {suffix}")
    for inp in inputs:
        io.check_path(path, input_path=inp, overwrite=force)
    if not inputs:
        io.check_path(path, input_path=None, overwrite=force)


# --------------------------------------------------------------------------- classify


@app_command("classify")
@command(spinner=True)
def classify(
    images: InPaths,
    model: ModelOpt,
    output: ClassifyOutputOpt = None,
    proba: ProbaOpt = None,
    overlay: OverlayOpt = None,
    temperature: TemperatureOpt = 1.0,
    backend: BackendOpt = Backend.auto,
    method: ClassifyMethodOpt = MethodClassify.auto,
    out_dir: OutDirOpt = None,
    name: ClassifyNameOpt = None,
    recursive: RecursiveOpt = False,
    jobs: JobsOpt = None,
    gpus: GpusOpt = None,
    scheduler: SchedulerOpt = None,
    force: ForceOpt = False,
    skip_existing: SkipExistingOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Label every pixel of an image with a model from `imgfilter train`.

    Writes the label map (each pixel the class number of the training mask), and
    optionally the per-class probabilities (.npy) and a colour overlay.

    Examples:

      imgfilter classify photo.jpg --model model.npz -o labels.png --overlay over.png

      imgfilter classify photos/ -r -m model.npz --out-dir labels --overlay '{stem}.overlay.png'
    """
    from .. import classify as _classify

    cluster = (gpus, scheduler)
    if cluster == (None, None) or many.single(images):
        check_gpu_first(backend)
    if not (math.isfinite(temperature) and temperature > 0):
        raise UsageError(f"--temperature must be a positive number, got {temperature}")
    outs = many.Outputs(
        images, output, out_dir=out_dir, name=name, recursive=recursive, jobs=jobs,
        skip_existing=skip_existing, force=force,
    )  # fmt: skip
    template = name if name is not None else LABELS_TEMPLATE
    many.check_outputs(outs, lambda: _check_name(name))
    extras = _extras(proba, overlay, many.single(images))
    if out_dir is not None:
        many.make_out_dir(out_dir)
    how = _How(temperature, backend, method, proba is not None)
    if not many.single(images):
        _classify_many(outs, _classify.load(model), template, extras, how, cluster)
        return
    if cluster != (None, None):
        note("one input is classified here; --gpus and --scheduler apply to several")
    image = images[0]
    label_map, proba, overlay = _single_outputs(outs, template, proba, overlay, extras)
    if skip_existing:
        written = [p for p in (label_map, proba, overlay) if p is not None]
        if all(os.path.lexists(p) for p in written):
            info(f"{PROG}: {', '.join(map(shown, written))} exist(s); skipped (--skip-existing)")
            return
    _classify_file(image, model, label_map, proba=proba, overlay=overlay, how=how, force=force)


@dataclass(frozen=True)
class _How:
    """How to classify: --temperature, --backend, --method, and whether --proba is
    wanted."""

    temperature: float
    backend: Backend
    method: MethodClassify
    proba: bool

    def predict(self, img: Any, mdl: Any, backend_name: str) -> Any:
        """imgfilter.classify.predict of `img` on `backend_name`."""
        from .. import classify as _classify

        return _classify.predict(
            img, mdl, temperature=self.temperature, proba=self.proba, backend=backend_name,
            method=self.method.value,
        )  # fmt: skip


def _check_name(name: str | None) -> None:
    """UsageError for a --name template that is not a label map's (a lossy format)."""
    from .. import files

    if name is None:
        return
    files.check_template(name, "labels", example=LABELS_TEMPLATE)
    if Path(files.render(name, Path("photo.png"), "labels")).suffix.lower() in LOSSY:
        raise UsageError(f"--name {name!r}: a label map needs a lossless format (.png, .tif)")


def _is_template(value: Path | None) -> bool:
    return value is not None and "{" in str(value)


def _extras(proba: Path | None, overlay: Path | None, one: bool) -> tuple[Any, ...]:
    """files.Extra for --proba and --overlay when they are name templates, in that
    order; UsageError for a bad template, or a plain name with several inputs."""
    from .. import files

    extras = []
    for option, value, op in (("--proba", proba, "proba"), ("--overlay", overlay, "overlay")):
        if value is None:
            continue
        example = "{stem}." + op + (".npy" if op == "proba" else ".png")
        if _is_template(value):
            exts = (".npy",) if op == "proba" else None
            files.check_template(str(value), op, option=option, extensions=exts, example=example)
            extras.append(files.Extra(option, str(value), op))
        elif not one:
            raise UsageError(
                f"{option} {value} names one file for several inputs: give a name template "
                f"such as '{example}' (written beside each label map)"
            )
    return tuple(extras)


def _labels_beside(image: Path) -> Path:
    """A label map's default output: INPUT_STEM.labels.png beside the input (a lossless
    format whatever the input's: a JPEG would change the labels)."""
    from .. import files

    return image.with_name(files.render(LABELS_TEMPLATE, image, "labels"))


def _single_outputs(
    outs: many.Outputs, template: str, proba: Path | None, overlay: Path | None, extras: tuple
) -> tuple[Path, Path | None, Path | None]:
    """The label map, --proba and --overlay files of the one input (templates
    rendered beside the label map)."""
    from .. import files

    image, output = outs.images[0], outs.output
    entry = files.Entry(image)
    if outs.out_dir is not None or outs.name is not None:
        output = files.target_for(entry, op="labels", out_dir=outs.out_dir, template=template)
    label_map = output if output is not None else _labels_beside(image)
    if _is_template(proba):
        proba = files.extra_for(entry, label_map, extras[0])
    if _is_template(overlay):
        overlay = files.extra_for(entry, label_map, extras[-1])
    return label_map, proba, overlay


def _lossless_label_map(target: Path) -> None:
    if target.suffix.lower() in LOSSY:
        raise OutputError(f"{target}: a label map needs a lossless format (.png, .tif)")


def _npy_bytes(proba: Any) -> bytes:
    import numpy as np

    buf = _bytes_io.BytesIO()
    np.save(buf, np.ascontiguousarray(proba, dtype=np.float32))
    return buf.getvalue()


def _check_single_outputs(
    image: Path, target: Path, proba: Path | None, overlay: Path | None, force: bool
) -> Path:
    """Check the one input's outputs before reading it: the label map (returned as
    io.check_output gives it), --proba, --overlay, all different files."""
    import numpy as np

    from .. import io

    _lossless_label_map(target)
    target = io.check_output(target, input_path=image, overwrite=force, dtype=np.uint8, channels=1)
    if proba is not None:
        _check_npy_output(proba, ".npy", "--proba", inputs=(image,), force=force)
    if overlay is not None:
        io.check_output(overlay, input_path=image, overwrite=force, dtype=np.uint8, channels=3)
    outs = [p.resolve() for p in (target, proba, overlay) if p is not None]
    if len(set(outs)) != len(outs):
        raise UsageError("the label map, --proba and --overlay must be different files")
    return target


def _classify_file(
    image: Path,
    model: Path,
    target: Path,
    *,
    proba: Path | None,
    overlay: Path | None,
    how: _How,
    force: bool,
) -> None:
    """One input: check the outputs, read, classify, write, one `wrote` line."""
    import numpy as np

    from .. import classify as _classify
    from .. import io

    mdl = _classify.load(model)
    target = _check_single_outputs(image, target, proba, overlay, force)
    stage(f"reading {shown(image)}")
    img = io.read_image(image)
    backend_name = resolve_backend(how.backend)
    stage(f"classifying on {backend_name}")
    start = time.perf_counter()
    pred = how.predict(img, mdl, backend_name)
    ms = (time.perf_counter() - start) * 1e3
    stage(f"writing {shown(target)}")
    io.write_image(target, pred.labels, overwrite=force)
    written = [shown(target)]
    if proba is not None:
        io.atomic_write(proba, _npy_bytes(pred.proba), overwrite=force)
        written.append(shown(proba))
    if overlay is not None:
        io.write_image(overlay, _classify.overlay(img, pred.labels), overwrite=force)
        written.append(shown(overlay))
    counts = np.bincount(pred.labels.ravel(), minlength=256)
    share = ", ".join(f"class {c}: {100 * counts[c] / pred.labels.size:.1f}%" for c in mdl.classes)
    info(
        f"wrote {', '.join(written)} ({describe(img)}, {engine(backend_name, how.method)}, "
        f"{share}; classified in {ms:.1f} ms incl. kernel loading)"
    )


def _classify_many(outs: many.Outputs, mdl: Any, template: str, extras: tuple, how: _How,
                   cluster: tuple) -> None:  # fmt: skip
    """Several inputs: many.run_many with the model loaded once; the label map and
    the --proba/--overlay outputs of each input (extras, in that order); on a Dask
    cluster with `cluster` (--gpus, --scheduler)."""
    if cluster == (None, None):
        _classify_on(outs, mdl, template, extras, how, None)
        return
    from .. import cluster as dask_cluster

    with dask_cluster.connect(*cluster, jobs=outs.jobs) as client:
        _classify_on(outs, mdl, template, extras, how, client)


def _classify_on(outs: many.Outputs, mdl: Any, template: str, extras: tuple, how: _How,
                 client: Any) -> None:  # fmt: skip
    """`_classify_many` once the files' runner is known: threads here, or a Dask client."""
    import numpy as np

    from .. import classify as _classify
    from .. import files, io

    plan, problems = many.plan_many("labels", outs, template, extras=extras, what="label map")
    backend_name = resolve_backend(how.backend) if plan.jobs else how.backend.value
    kinds = [x.op for x in extras]

    def load(job: files.Job) -> Any:
        keep = many.refuse_existing(job.targets, force=outs.force, skip_existing=outs.skip_existing)
        _lossless_label_map(job.target)
        io.check_format(job.target, dtype=np.uint8, channels=1)
        for kind, path in zip(kinds, job.extras, strict=True):
            if kind == "overlay":
                io.check_format(path, dtype=np.uint8, channels=3)
        return io.read_image(job.source), keep

    def compute(job: files.Job, loaded: Any) -> Any:
        try:
            return many.on_device(lambda: how.predict(loaded[0], mdl, backend_name))
        except InputError as e:  # e.g. a gray image for a colour model: say which
            raise InputError(f"{shown(job.source)}: {e.cli_message or e}") from e

    synced = io.DirectorySync() if client is None else None  # as the filter commands do

    def save(job: files.Job, loaded: Any, pred: Any) -> None:
        img, keep = loaded
        many.make_parent(job.target)
        if job.target not in keep:
            io.write_image(
                job.target, np.asarray(pred.labels), overwrite=outs.force, directories=synced
            )
        for kind, path in zip(kinds, job.extras, strict=True):
            if path in keep:
                continue
            if kind == "proba":
                data = _npy_bytes(pred.proba)
                io.atomic_write(path, data, overwrite=outs.force, directories=synced)
            else:
                overlay = _classify.overlay(img, np.asarray(pred.labels))
                io.write_image(path, overlay, overwrite=outs.force, directories=synced)

    try:
        many.run_many(
            "classify", plan, problems, jobs=outs.jobs,
            engine=engine(backend_name, how.method), load=load, compute=compute, save=save,
            client=client,
        )  # fmt: skip
    finally:
        if synced is not None:
            synced.flush()
