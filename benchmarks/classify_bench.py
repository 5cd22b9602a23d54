"""Pixel classification on a 4K image (issue 6): each stage's time, next to torch.

A 3840x2160 BGR JPEG (samples/astronaut.jpg resized) is classified with the worked
example's model (samples/classify/astronaut.model.npz: 3 classes, the default 19
features) or, with --train, a model trained here. Stages, on the GPU:

- upload: the uint8 image, host to device (synchronised wall time);
- features: the (P, 20) float32 feature matrix from the image already on the device;
- logits: 3 GEMVs (`kernels.linalg.gemv`, one per class) into a (P, 3) matrix, and what
  `predict` runs: 2 GEMVs relative to the last class (softmax is shift-invariant) and a
  zero column, also with `kernels.linalg.gemv.autotune`'s launch shape;
- softmax: `kernels.softmax` on the logits;
- argmax: the label index per pixel;
- fused: the alternative single kernel (logits, softmax and argmax per pixel);
- download: the labels (8 MB) and, for --proba, the probabilities (100 MB);
- read / write: `imgfilter.io.read_image` of the JPEG and `write_image` of the labels
  PNG (CPU wall time);
- predict: `imgfilter.classify.predict` as the command calls it (wall, warm), and on
  the device image (device results: the synchronised call, and the host time to queue
  it, which returns before the GPU is done);
- command: read + predict + write in this process (wall, warm) against read + write.

torch, on the same feature matrix and in the same run: a 1x1 convolution (cuDNN) in
NCHW (the features as planes) and in channels-last (our (P, F) matrix viewed as NHWC),
and a matrix product (cuBLAS), each followed by torch.softmax over the classes and
torch.argmax. Skipped with a note when torch (with CUDA) is not importable.

Kernel times: launches queued behind a spin kernel, CUDA events, median of repeats
(benchmarks/bench.py's Timer); per-call times: wall time of the call plus a synchronisation.

    python benchmarks/classify_bench.py --json out/classify.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import Timer, copy_bandwidth_gbs, wall_us  # noqa: E402


def _torch():
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    return torch, None


def _gpu_name(cuda) -> str:
    name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    return name.decode() if isinstance(name, bytes) else str(name)


def make_image(width: int, height: int) -> np.ndarray:
    import cv2

    src = cv2.imread(str(REPO / "samples" / "astronaut.jpg"))
    return cv2.resize(src, (width, height), interpolation=cv2.INTER_LINEAR)


def get_model(img: np.ndarray, train: bool):
    from imgfilter import classify

    path = REPO / "samples" / "classify" / "astronaut.model.npz"
    if path.exists() and not train:
        return classify.load(path), str(path.relative_to(REPO))
    import cv2

    scribbles = REPO / "samples" / "classify" / "astronaut.scribbles.png"
    mask = cv2.imread(str(scribbles), cv2.IMREAD_UNCHANGED)
    h, w = img.shape[:2]
    mask = cv2.resize(mask, (w, h), interpolation=cv2.INTER_NEAREST)
    model, _ = classify.train(img, mask, backend="cuda")
    return model, "trained in this run"


def run(width: int, height: int, train: bool, calls: int) -> dict:
    from numba import cuda

    from imgfilter import classify, io
    from imgfilter.classify import cuda as ccuda
    from imgfilter.classify import pipeline
    from kernels import classify as kclassify
    from kernels.linalg.gemv import gemv
    from kernels.softmax import softmax

    timer = Timer(repeats=7)
    copy_gbs = copy_bandwidth_gbs(timer)
    img = make_image(width, height)
    model, model_src = get_model(img, train)
    P, C = width * height, model.n_classes
    rows: list[dict] = []
    notes: list[str] = []

    def add(stage: str, us: float, kind: str, nbytes: int | None = None, note: str = ""):
        row = {"stage": stage, "us": us, "timing": kind}
        if nbytes:
            row["GB/s"] = nbytes / (us * 1e-6) / 1e9
            row["% of copy"] = 100 * row["GB/s"] / copy_gbs
        if note:
            row["note"] = note
        rows.append(row)
        print(f"  {stage:<34} {us:10.1f} us  {kind}", flush=True)

    tmp = Path(tempfile.mkdtemp())
    jpg = tmp / "in.jpg"
    io.write_image(jpg, img)
    png = tmp / "labels.png"

    # ---- I/O (CPU)
    read_us = wall_us(lambda: io.read_image(jpg), calls)
    add("read JPEG (io.read_image)", read_us, "wall")
    # ---- upload
    dimg = cuda.to_device(img)
    add("upload uint8 image", timer.call_us(lambda: cuda.to_device(img), calls), "call")
    # ---- features, from the device image
    fe = ccuda.FeatureEngine()
    X = pipeline.compute(fe, dimg, model.spec)
    cuda.synchronize()
    F, Fa = model.n_features, X.shape[1]
    feat_bytes = P * Fa * 4
    add(
        f"features ({F} + bias -> {Fa} cols)",
        timer.kernel_us(lambda: pipeline.compute(ccuda.FeatureEngine(), dimg, model.spec), 3),
        "kernel",
        note="~25 launches (filters, scatter kernels), allocations included",
    )
    add(
        "features (per call)",
        timer.call_us(lambda: pipeline.compute(ccuda.FeatureEngine(), dimg, model.spec), 5),
        "call",
    )
    # ---- classification stages
    W, b = model.folded(1.0)
    Wrows = ccuda.weight_rows(W, b, Fa)
    dW = cuda.to_device(Wrows)
    L = cuda.device_array((P, C), np.float32)
    cols = [ccuda.column(L, c) for c in range(C)]  # O(1) views (not L[:, c]: see column)
    rowsW = [dW[c] for c in range(C)]
    Pr = cuda.device_array((P, C), np.float32)
    idx = cuda.device_array(P, np.uint8)
    dlut = cuda.to_device(model.classes.astype(np.uint8))

    def logits():
        for c in range(C):
            gemv(X, rowsW[c], out=cols[c])

    grid = ccuda._grid(P)
    logit_us = timer.kernel_us(logits)
    add(f"logits: {C} x gemv (P x {Fa})", logit_us, "kernel", C * feat_bytes + P * C * 4)
    Wrel = ccuda.relative_rows(Wrows)
    dWrel = cuda.to_device(Wrel)
    relW = [dWrel[c] for c in range(C - 1)]
    zgrid = ccuda._grid(P)

    def logits_relative():
        for c in range(C - 1):
            gemv(X, relW[c], out=cols[c])
        kclassify.zero_column[zgrid, ccuda.BLOCK](L, C - 1)

    rel_us = timer.kernel_us(logits_relative)
    add(
        f"logits: {C - 1} x gemv (rel. to last) + 0",
        rel_us,
        "kernel",
        (C - 1) * feat_bytes + P * C * 4,
        note="what predict runs",
    )
    tuned_us = None
    try:  # kernels.linalg.gemv.autotune for this shape (launch shapes, checked against NumPy)
        from kernels.linalg import gemv as gemv_mod

        best = gemv_mod.autotune(P, Fa, np.float32, store=False, data=(X.copy_to_host(), Wrows[0]))
        cfg = gemv_mod.Config(**best["config"])

        def logits_tuned():
            for c in range(C - 1):
                gemv(X, relW[c], method=best["method"], config=cfg, out=cols[c])
            kclassify.zero_column[zgrid, ccuda.BLOCK](L, C - 1)

        tuned_us = timer.kernel_us(logits_tuned)
        add(
            f"logits: {C - 1} x gemv (rel.), autotuned",
            tuned_us,
            "kernel",
            (C - 1) * feat_bytes + P * C * 4,
            note=f"{best['method']} {best['config']}",
        )
    except Exception as exc:  # the tuner is optional here
        notes.append(f"gemv autotune failed: {type(exc).__name__}: {exc}")
    sm_us = timer.kernel_us(lambda: softmax(L, out=Pr))
    add("softmax (kernels.softmax)", sm_us, "kernel", 2 * P * C * 4)
    am_us = timer.kernel_us(lambda: kclassify.argmax_rows[grid, ccuda.BLOCK](Pr, dlut, idx))
    add("argmax -> uint8 class numbers", am_us, "kernel", P * C * 4 + P)
    fused_kernel = kclassify.fused_kernel(C, Fa)
    fgrid = (P + kclassify.FUSED_ROWS - 1) // kclassify.FUSED_ROWS
    Pr2 = cuda.device_array((P, C), np.float32)
    idx2 = cuda.device_array(P, np.uint8)
    fused_us = timer.kernel_us(
        lambda: fused_kernel[fgrid, kclassify.FUSED_ROWS](X, dW, dlut, Pr2, idx2)
    )
    add("fused (logits+softmax+argmax)", fused_us, "kernel", feat_bytes + P * C * 4 + P)
    logits_relative()
    softmax(L, out=Pr)
    kclassify.argmax_rows[grid, ccuda.BLOCK](Pr, dlut, idx)
    fused_kernel[fgrid, kclassify.FUSED_ROWS](X, dW, dlut, Pr2, idx2)
    ref = Pr.copy_to_host()
    agree = {
        "fused vs gemv max |dp|": float(np.abs(Pr2.copy_to_host() - ref).max()),
        "fused vs gemv labels equal": float(np.mean(idx.copy_to_host() == idx2.copy_to_host())),
    }
    add("download labels (8-bit)", timer.call_us(lambda: idx.copy_to_host(), calls), "call")
    add("download probabilities", timer.call_us(lambda: Pr.copy_to_host(), 5), "call")
    labels = idx.copy_to_host().reshape(height, width)
    write_us = wall_us(lambda: io.write_image(png, labels, overwrite=True), calls)
    add("write labels PNG (io.write_image)", write_us, "wall")

    # ---- torch on the same features
    torch, why = _torch()
    torch_rows = {}
    if torch is None:
        notes.append(f"torch skipped: {why}")
    else:
        torch.backends.cudnn.benchmark = True
        tX = torch.as_tensor(X, device="cuda")  # (P, Fa), shares memory
        tW = torch.as_tensor(Wrows, device="cuda")  # (C, Fa), bias in the ones column
        planes = tX[:, :F].t().contiguous().view(1, F, height, width)
        w4 = torch.as_tensor(W, device="cuda").view(C, F, 1, 1)
        b1 = torch.as_tensor(b, device="cuda")
        nhwc = tX.view(1, height, width, Fa).permute(0, 3, 1, 2)  # channels-last view
        w4a = tW.view(C, Fa, 1, 1)
        F_ = torch.nn.functional

        variants = {
            "torch conv1x1 NCHW planes": lambda: F_.conv2d(planes, w4, b1),
            "torch conv1x1 channels-last": lambda: F_.conv2d(nhwc, w4a),
            "torch matmul (cuBLAS)": lambda: tX @ tW.t(),
        }
        for name, fn in variants.items():
            out = fn()
            dim = 1  # the class axis, in NCHW and in (P, C) alike
            conv_us = timer.kernel_us(fn)
            sm_t = timer.kernel_us(lambda out=out, dim=dim: torch.softmax(out, dim=dim))
            probs = torch.softmax(out, dim=dim)
            am_t = timer.kernel_us(lambda probs=probs, dim=dim: torch.argmax(probs, dim=dim))
            total = timer.kernel_us(
                lambda fn=fn, dim=dim: torch.argmax(torch.softmax(fn(), dim=dim), dim=dim)
            )
            p_t = probs.permute(0, 2, 3, 1).reshape(P, C) if probs.dim() == 4 else probs
            diff = float((p_t - torch.as_tensor(Pr, device="cuda")).abs().max())
            torch_rows[name] = {
                "linear_us": conv_us,
                "softmax_us": sm_t,
                "argmax_us": am_t,
                "total_us": total,
                "max |dp| vs ours": diff,
            }
            add(f"{name}", conv_us, "kernel")
            add("  + torch.softmax", sm_t, "kernel")
            add("  + torch.argmax", am_t, "kernel")
            add(f"  = {name} total", total, "kernel")
        del tX, nhwc, planes
    # ---- the whole thing as the command runs it (warm: kernels compiled). Last: on a
    # fresh machine its first predict compiles the host-image path, which took a
    # 230 s budget past its end (2026-11-23); torch's figures come first.
    predict_us = wall_us(lambda: classify.predict(img, model, backend="cuda", proba=False), calls)
    add("predict (gemv), host image in", predict_us, "wall")
    fpredict_us = wall_us(
        lambda: classify.predict(img, model, backend="cuda", proba=False, method="fused"), calls
    )
    add("predict (fused), host image in", fpredict_us, "wall")
    # Device image in, device labels and probabilities out (issue 23): the synchronised
    # call, and the host time to queue it (the call returns before the GPU is done).
    for how in ("gemv", "fused"):
        add(
            f"predict ({how}), device image in",
            timer.call_us(lambda h=how: classify.predict(dimg, model, method=h), calls),
            "call",
        )
        add(
            f"predict ({how}), device image in, host",
            wall_us(lambda h=how: classify.predict(dimg, model, method=h), calls),
            "wall",
            note="host time to queue the call (no synchronisation)",
        )
        cuda.synchronize()

    def command():
        im = io.read_image(jpg)
        pred = classify.predict(im, model, backend="cuda", proba=False)
        io.write_image(png, pred.labels, overwrite=True)

    def io_only():
        im = io.read_image(jpg)
        io.write_image(png, im[:, :, 0], overwrite=True)

    command_us = wall_us(command, calls)
    io_us = wall_us(io_only, calls)
    add("command: read + predict + write", command_us, "wall")
    add("read + write only", io_us, "wall")

    ours_gemv = min(logit_us, rel_us, tuned_us or rel_us) + sm_us + am_us
    result = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "gpu": _gpu_name(cuda),
        "image": f"{width}x{height}x3 uint8 (samples/astronaut.jpg resized), JPEG",
        "model": model_src,
        "classes": C,
        "features": F,
        "feature_matrix_MB": feat_bytes / 1e6,
        "copy_GBps": copy_gbs,
        "stages": rows,
        "torch": torch_rows,
        "agreement": agree,
        "notes": notes,
        "summary": {
            "ours gemv: logits + softmax + argmax us": ours_gemv,
            "ours fused us": fused_us,
            "best torch total us": min((r["total_us"] for r in torch_rows.values()), default=None),
            "command / (read + write)": command_us / io_us,
        },
    }
    best = result["summary"]["best torch total us"]
    if best is not None:
        result["summary"]["gemv path faster than torch"] = ours_gemv < best
        result["summary"]["fused path faster than torch"] = fused_us < best
    result["summary"]["command within 2x of read + write"] = command_us <= 2 * io_us
    return result


def table(result: dict) -> str:
    lines = [
        f"Pixel classification, {result['image']}, {result['classes']} classes, "
        f"{result['features']} features, on {result['gpu']} ({result['when']})",
        f"copy bandwidth {result['copy_GBps']:.0f} GB/s; feature matrix "
        f"{result['feature_matrix_MB']:.0f} MB; model: {result['model']}",
        "",
        f"{'stage':<40} {'time us':>10} {'timing':>7} {'GB/s':>7} {'% copy':>7}",
    ]
    for r in result["stages"]:
        gbs = f"{r['GB/s']:7.0f}" if "GB/s" in r else " " * 7
        pct = f"{r['% of copy']:7.0f}" if "% of copy" in r else " " * 7
        lines.append(f"{r['stage']:<40} {r['us']:10.1f} {r['timing']:>7} {gbs} {pct}")
    lines.append("")
    for k, v in result["summary"].items():
        lines.append(f"{k}: {v if not isinstance(v, float) else round(v, 3)}")
    for k, v in result["agreement"].items():
        lines.append(f"{k}: {v:.3g}")
    for n in result["notes"]:
        lines.append(f"note: {n}")
    lines.append(
        "timing: kernel = launches queued behind a spin kernel, CUDA events, median; "
        "call = wall time incl. synchronisation; wall = host wall time (median)"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="write the results here")
    ap.add_argument("--size", default="3840x2160", help="WIDTHxHEIGHT (default 4K UHD)")
    ap.add_argument("--train", action="store_true", help="train the model here instead")
    ap.add_argument("--calls", type=int, default=10, help="repeats of the wall timings")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.lower().split("x"))
    t0 = time.perf_counter()
    result = run(w, h, args.train, args.calls)
    result["bench_seconds"] = time.perf_counter() - t0
    text = table(result)
    print(text)
    args.json.write_text(json.dumps(result, indent=1))
    args.json.with_suffix(".txt").write_text(text + "\n")
    print(f"wrote {args.json} and {args.json.with_suffix('.txt')}")


if __name__ == "__main__":
    main()
