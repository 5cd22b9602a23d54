"""Do GPU JPEG codecs (NVIDIA nvImageCodec) pay for a folder of photos? (GPU only)

Issue 27 asks whether decoding and encoding on the GPU beats the CPU codecs that feed
the many-files pipeline today. On a folder of JPEGs (made here with cv2 at quality 95,
4:2:0, as a camera writes them) this times, in images/s:
- a cv2 thread pool decoding only, and decoding + encoding (quality 95);
- nvImageCodec decoding batches of --batch files (bytes read on a thread pool), on each
  of its backends (hardware JPEG engine, CUDA, CPU), and decoding + encoding on the GPU;
- decoding + encoding on a pool of T threads, each thread with its own decoder and
  encoder, in batches of B files a call (--pool-threads, --pool-batches: B = 1 is what
  a pipeline that hands one file at a time to each codec thread would do);
- whether the codec calls release the GIL: a Python thread counting in a loop, its pace
  while the main thread decodes (or encodes) one image a call, against its pace while
  the main thread sleeps;
and compares nvImageCodec's pixels with cv2.imread's (max and mean absolute
difference, share of differing values), with fancy upsampling off (its default) and
on (libjpeg-turbo's default). Prints a table and writes JSON.

    python benchmarks/gpu_codecs_probe.py --make /tmp/jpegs --count 300 [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

Q = 95


def make(directory: Path, count: int, size: tuple[int, int]) -> list[Path]:
    """`count` photo-like JPEGs: a smooth scene plus noise, each shifted, so they compress
    like photos and differ."""
    directory.mkdir(parents=True, exist_ok=True)
    h, w = size
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    scene = np.stack([np.sin(xx / (40 + 7 * c)) * np.cos(yy / (55 + 5 * c)) for c in range(3)], -1)
    scene = np.clip(128 + 90 * scene + rng.normal(0, 12, scene.shape), 0, 255).astype(np.uint8)
    paths = []
    for i in range(count):
        path = directory / f"img{i:05d}.jpg"
        img = np.roll(scene, (5 * i, 11 * i), axis=(0, 1))
        cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, Q])
        paths.append(path)
    return paths


def rate(n: int, fn) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def cv2_rates(paths: list[Path], threads: int) -> dict:
    def decode(p):
        return cv2.imread(str(p))

    def both(p):
        return cv2.imencode(".jpg", cv2.imread(str(p)), [cv2.IMWRITE_JPEG_QUALITY, Q])[1]

    with ThreadPoolExecutor(threads) as pool:
        return {
            "cv2 decode": rate(len(paths), lambda: list(pool.map(decode, paths))),
            "cv2 decode + encode": rate(len(paths), lambda: list(pool.map(both, paths))),
        }


def nv_rates(nv, paths: list[Path], threads: int, batch: int) -> tuple[dict, dict]:
    import cupy as cp

    with ThreadPoolExecutor(threads) as pool:
        data = list(pool.map(Path.read_bytes, paths))
    rates, errors = {}, {}
    kinds = {"hardware": "HW_GPU_ONLY", "cuda": "GPU_ONLY", "hybrid": "HYBRID_CPU_GPU",
             "cpu": "CPU_ONLY"}  # fmt: skip
    params = nv.EncodeParams(quality_type=nv.QualityType.QUALITY, quality_value=Q)
    encoder = nv.Encoder()
    for label, kind in kinds.items():
        try:
            dec = nv.Decoder(backends=[nv.Backend(getattr(nv.BackendKind, kind))])

            def decode(dec=dec):
                out = []
                for i in range(0, len(data), batch):
                    out += dec.decode(data[i : i + batch])
                cp.cuda.Device().synchronize()
                return out

            rates[f"nvimgcodec decode ({label})"] = rate(len(paths), decode)
            if label in ("hardware", "cuda"):

                def both(dec=dec):
                    for i in range(0, len(data), batch):
                        encoder.encode(dec.decode(data[i : i + batch]), ".jpg", params=params)

                rates[f"nvimgcodec decode + encode ({label})"] = rate(len(paths), both)
        except Exception as exc:  # noqa: BLE001 - a backend this machine lacks: reported
            errors[label] = f"{type(exc).__name__}: {exc}"[:300]
    return rates, errors


def pool_rates(nv, paths: list[Path], threads_list: list[int], batches: list[int]) -> dict:
    """Decode + encode (BGR, fancy upsampling, quality Q, 4:2:0) on pools of threads,
    each thread with its own decoder and encoder, `batch` files a call."""
    import threading

    data = [p.read_bytes() for p in paths]
    dparams = nv.DecodeParams(apply_exif_orientation=False,
                              sample_format=nv.SampleFormat.I_BGR)  # fmt: skip
    eparams = nv.EncodeParams(quality_type=nv.QualityType.QUALITY, quality_value=Q,
                              chroma_subsampling=nv.ChromaSubsampling.CSS_420)  # fmt: skip
    rates = {}
    for threads in threads_list:
        for batch in batches:
            local = threading.local()
            chunks = [data[i : i + batch] for i in range(0, len(data), batch)]

            def work(chunk, local=local):
                pair = getattr(local, "pair", None)
                if pair is None:
                    decoder = nv.Decoder(options=":fancy_upsampling=1")
                    pair = local.pair = (decoder, nv.Encoder())
                images = pair[0].decode(chunk, params=dparams)
                pair[1].encode(images, ".jpg", params=eparams)

            with ThreadPoolExecutor(threads) as pool:
                label = f"nvimgcodec decode + encode, {threads} threads x batches of {batch}"
                run = lambda pool=pool, chunks=chunks: list(pool.map(work, chunks))  # noqa: E731
                rates[label] = rate(len(paths), run)
    return rates


def gil_shares(nv, path: Path, seconds: float = 0.6) -> dict:
    """{call: (share of a counting thread's idle pace kept during it, calls/s)} for one
    image's decode, encode and cv2.imdecode on the main thread."""
    import threading

    data = path.read_bytes()
    decoder = nv.Decoder(options=":fancy_upsampling=1")
    encoder = nv.Encoder()
    params = nv.EncodeParams(quality_type=nv.QualityType.QUALITY, quality_value=Q)
    decoded = decoder.decode(data)
    count, stop = [0], [False]

    def spin():
        while not stop[0]:
            count[0] += 1

    def pace(fn) -> tuple[float, float]:
        c0, t0, n = count[0], time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            fn()
            n += 1
        dt = time.perf_counter() - t0
        return (count[0] - c0) / dt, n / dt

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        idle = pace(lambda: time.sleep(0.01))[0]
        calls = {
            "decode": lambda: decoder.decode(data),
            "encode": lambda: encoder.encode(decoded, ".jpg", params=params),
            "cv2.imdecode": lambda: cv2.imdecode(np.frombuffer(data, np.uint8), 1),
        }
        found = {}
        for name, fn in calls.items():
            spin_pace, rate_ = pace(fn)
            found[name] = (spin_pace / idle, rate_)
    finally:
        stop[0] = True
        thread.join()
    return found


def agreement(nv, paths: list[Path]) -> dict:
    """nvImageCodec's pixels against cv2.imread's, per upsampling option."""
    import cupy as cp

    found = {}
    for options in (":fancy_upsampling=0", ":fancy_upsampling=1"):
        dec = nv.Decoder(options=options)
        diffs = []
        for p in paths[:20]:
            got = cp.asnumpy(cp.asarray(dec.decode(p.read_bytes())))[:, :, ::-1]
            want = cv2.imread(str(p))
            diffs.append(np.abs(got.astype(np.int16) - want.astype(np.int16)))
        d = np.stack(diffs)
        found[options] = {"max": int(d.max()), "mean": float(d.mean()),
                          "differing": float((d > 0).mean())}  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make", type=Path, required=True, help="folder for the JPEGs")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--height", type=int, default=2167)
    ap.add_argument("--width", type=int, default=2495)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--pool-threads", default="1,8", help="comma-separated thread counts")
    ap.add_argument("--pool-batches", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)  # one codec per thread, as the pipeline runs them
    paths = make(args.make, args.count, (args.height, args.width))
    from nvidia import nvimgcodec as nv

    results = cv2_rates(paths, args.threads)
    nv_found, errors = nv_rates(nv, paths, args.threads, args.batch)
    results.update(nv_found)
    results.update(pool_rates(nv, paths, [int(t) for t in args.pool_threads.split(",")],
                              [int(b) for b in args.pool_batches.split(",")]))  # fmt: skip
    agree = agreement(nv, paths)
    gil = gil_shares(nv, paths[0])
    print(f"{args.count} JPEGs {args.height}x{args.width} q{Q}, {args.threads} threads, "
          f"batches of {args.batch}")  # fmt: skip
    for name, r in results.items():
        print(f"  {name:40s} {r:8.1f} images/s")
    for name, why in errors.items():
        print(f"  nvimgcodec {name}: not available ({why})")
    for name, (share, calls) in gil.items():
        print(f"  a counting Python thread during {name}: {100 * share:.0f}% of its idle pace "
              f"({calls:.0f} calls/s, one image a call, one thread)")  # fmt: skip
    for options, d in agree.items():
        print(f"  nvimgcodec vs cv2.imread pixels {options}: max {d['max']}, "
              f"mean {d['mean']:.3f}, {100 * d['differing']:.1f}% differ")  # fmt: skip
    if args.json:
        payload = {"rates": results, "errors": errors, "agreement": agree, "gil": gil,
                   "nvimgcodec": getattr(nv, "__version__", "?")}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
