"""--gpu-codecs (issue 27): JPEGs decoded and encoded on the GPU through NVIDIA
nvImageCodec in the many-files commands; every other file through the CPU codecs.

Which files may go to the GPU, which results it may encode, and the refusals run in CI;
the codecs themselves (marked `gpu`, and skipped where nvImageCodec is not installed)
run on a GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_cli import run
from test_cli_many import imwrite, module

from imgfilter import gpu_codecs
from kernels.common.devarray import DeviceArray


def photo(shape=(67, 91, 3), seed: int = 0) -> np.ndarray:
    """A smooth field plus noise: compresses like a photo, unlike pure noise."""
    rng = np.random.default_rng(seed)
    h, w = shape[:2]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    planes = [np.sin(xx / (9 + 3 * c)) * np.cos(yy / (7 + 2 * c)) for c in range(shape[2])]
    img = 128 + 90 * np.stack(planes, -1) + rng.normal(0, 12, (h, w, shape[2]))
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg_bytes(img: np.ndarray, quality: int = 95) -> bytes:
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def rotated_jpeg(path: Path, orientation: int) -> Path:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(photo()).save(path, exif=exif.tobytes(), quality=95)
    return path


# ----------------------------------------------------------------- which files (CI)


def test_colour_and_gray_jpegs_pass_the_file_check_others_do_not(tmp_path):
    colour = jpeg_bytes(photo())
    assert gpu_codecs.gpu_decodable(colour)
    assert gpu_codecs.gpu_decodable(jpeg_bytes(photo()[:, :, 0]))  # components: at decode
    ok, png = cv2.imencode(".png", photo())
    assert not gpu_codecs.gpu_decodable(png.tobytes())
    assert not gpu_codecs.gpu_decodable(colour[: len(colour) // 2])  # truncated
    assert not gpu_codecs.gpu_decodable(b"not an image at all")


@pytest.mark.parametrize("orientation, gpu", [(1, True), (3, False), (6, False), (8, False)])
def test_a_rotated_photo_is_left_to_the_cpu_codecs(tmp_path, orientation, gpu):
    data = rotated_jpeg(tmp_path / "r.jpg", orientation).read_bytes()
    assert gpu_codecs.gpu_decodable(data) is gpu


def test_only_a_jpeg_output_of_a_uint8_bgr_device_image_is_encoded_on_the_gpu(tmp_path):
    def dev(shape, dtype=np.uint8):
        return DeviceArray(1 << 20, shape, dtype)

    jpg = tmp_path / "o.jpg"
    assert gpu_codecs.gpu_encodable(jpg, dev((5, 7, 3)))
    assert gpu_codecs.gpu_encodable(tmp_path / "o.JPEG", dev((5, 7, 3)))
    assert not gpu_codecs.gpu_encodable(tmp_path / "o.png", dev((5, 7, 3)))
    assert not gpu_codecs.gpu_encodable(jpg, dev((5, 7)))  # gray: the CPU encoder
    assert not gpu_codecs.gpu_encodable(jpg, dev((5, 7, 4)))
    assert not gpu_codecs.gpu_encodable(jpg, dev((5, 7, 3), np.uint16))
    assert not gpu_codecs.gpu_encodable(jpg, np.zeros((5, 7, 3), np.uint8))  # a host result
    strided = DeviceArray(1 << 20, (5, 7, 3), np.uint8, strides=(64, 3, 1))
    assert not gpu_codecs.gpu_encodable(jpg, strided)


def test_without_nvimagecodec_it_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import fails
    why = gpu_codecs.unavailable()
    assert why is not None and 'pip install "imgfilter[nvimgcodec]"' in why


def test_the_cpu_backend_refuses_the_flag_before_any_work(tmp_path):
    for i in range(2):
        imwrite(tmp_path / "in" / f"p{i}.jpg", photo(seed=i))
    r = run("blur", tmp_path / "in", "--k", "3", "--out-dir", tmp_path / "out",
            "--backend", "cpu", "--gpu-codecs")  # fmt: skip
    assert r.exit_code == 2
    assert "--gpu-codecs needs the CUDA backend" in r.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_one_input_notes_the_flag_and_uses_the_cpu_codecs(tmp_path):
    src = imwrite(tmp_path / "p.jpg", photo())
    out = tmp_path / "o.png"
    r = run("blur", src, "--k", "3", "-o", out, "--backend", "cpu", "--gpu-codecs")
    assert r.exit_code == 0, r.output
    assert "--gpu-codecs applies to several inputs" in r.output
    assert np.array_equal(cv2.imread(str(out)), cv2.blur(cv2.imread(str(src)), (3, 3)))


def test_requests_from_many_threads_are_run_in_batches_and_each_gets_its_own_result():
    import threading

    gate = threading.Event()
    seen: list[list[int]] = []

    def work(items):
        gate.wait(5)  # the first batch holds the codec while the others queue up
        seen.append(list(items))
        return [item * 10 for item in items]

    batcher = gpu_codecs.Batcher(work, limit=4, name="test-batcher")
    results: dict[int, int] = {}

    def ask(i):
        results[i] = batcher.submit(i)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(9)]
    threads[0].start()
    while not batcher.batches:  # the first request is being worked on
        pass
    for t in threads[1:]:
        t.start()
    while batcher._requests.qsize() < 8:
        pass
    gate.set()
    for t in threads:
        t.join(5)
    assert results == {i: i * 10 for i in range(9)}
    assert [len(b) for b in seen] == [1, 4, 4]  # at most `limit` a call
    assert sorted(sum(seen, [])) == list(range(9))


def test_a_failed_batch_raises_in_each_of_its_callers_and_the_next_batch_runs():
    calls = []

    def work(items):
        calls.append(items)
        if items == ["bad"]:
            raise RuntimeError("the codec failed")
        return [len(items)]

    batcher = gpu_codecs.Batcher(work, limit=4, name="test-batcher")
    with pytest.raises(RuntimeError, match="the codec failed"):
        batcher.submit("bad")
    assert batcher.submit("good") == 1


def test_a_codec_that_answers_too_few_results_is_an_error_not_a_hang():
    batcher = gpu_codecs.Batcher(lambda items: [], limit=4, name="test-batcher")
    with pytest.raises(RuntimeError, match="0 results for 1"):
        batcher.submit("x")


# --------------------------------------------------------------- the codecs (GPU)


def _nv():
    pytest.importorskip("nvidia.nvimgcodec")
    why = gpu_codecs.unavailable()
    if why is not None:
        pytest.skip(why)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2167, 2495, 3), (67, 91, 3), (16, 16, 3), (17, 301, 3)])
def test_gpu_decode_gives_opencvs_pixels_but_for_rounding(shape):
    _nv()
    img = photo(shape, seed=shape[0])
    data = jpeg_bytes(img)
    got = gpu_codecs.GpuJpeg().decode(data)
    assert got is not None and got.shape == shape and got.dtype == np.uint8
    want = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    diff = np.abs(got.copy_to_host().astype(np.int16) - want)
    assert diff.max() <= 1
    assert (diff > 0).mean() < 0.002


@pytest.mark.gpu
def test_gpu_decode_leaves_gray_jpegs_to_the_cpu():
    _nv()
    assert gpu_codecs.GpuJpeg().decode(jpeg_bytes(photo()[:, :, 1])) is None


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16, 1, 3), (1, 9, 3), (15, 400, 3), (400, 15, 3)])
def test_gpu_decode_leaves_images_narrower_than_a_chroma_block_to_the_cpu(shape):
    _nv()
    assert gpu_codecs.GpuJpeg().decode(jpeg_bytes(photo(shape))) is None


@pytest.mark.gpu
def test_images_decoded_and_encoded_in_shared_batches_each_get_their_own_pixels():
    """Sixteen threads at once, images of different sizes: each caller gets its own
    image back, from batches of several (the buffers reused between batches)."""
    from concurrent.futures import ThreadPoolExecutor

    _nv()
    shapes = [(40 + 13 * i, 300 - 11 * i, 3) for i in range(24)]
    datas = [jpeg_bytes(photo(shape, seed=i)) for i, shape in enumerate(shapes)]
    codecs = gpu_codecs.GpuJpeg(90)
    decoder = gpu_codecs._batcher("decode")
    before = decoder.batches

    def round_trip(data):
        dev = codecs.decode(data)
        return dev.copy_to_host(), codecs.encode(dev)

    with ThreadPoolExecutor(16) as pool:
        done = list(pool.map(round_trip, datas * 2))
    assert decoder.batches - before < len(done)  # some calls shared a batch
    for (got, coded), data in zip(done, datas * 2, strict=True):
        want = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        assert got.shape == want.shape
        assert np.abs(got.astype(np.int16) - want).max() <= 1
        back = cv2.imdecode(np.frombuffer(coded, np.uint8), cv2.IMREAD_UNCHANGED)
        assert back.shape == want.shape
        cv_back = cv2.imdecode(np.frombuffer(jpeg_bytes(want, 90), np.uint8), -1)
        cv_error = np.abs(cv_back.astype(np.float64) - want).mean()
        assert np.abs(back.astype(np.float64) - want).mean() < cv_error + 1.5


@pytest.mark.gpu
@pytest.mark.parametrize("quality", [95, 50])
def test_gpu_encode_is_a_jpeg_as_good_as_opencvs(quality):
    _nv()
    img = photo((480, 640, 3), seed=quality)
    codecs = gpu_codecs.GpuJpeg(quality)
    dev = codecs.decode(jpeg_bytes(img, 100))
    original = dev.copy_to_host()
    data = bytes(codecs.encode(dev))
    assert data[:3] == b"\xff\xd8\xff"
    back = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert back.shape == original.shape  # 3 channels, BGR order kept:
    cv_back = cv2.imdecode(np.frombuffer(jpeg_bytes(original, quality), np.uint8), -1)

    def psnr(a, b):
        mse = np.mean((a.astype(np.float64) - b) ** 2)
        return 10 * np.log10(255**2 / mse)

    assert psnr(back, original) > psnr(cv_back, original) - 1.5
    assert np.abs(back.mean((0, 1)) - original.mean((0, 1))).max() < 2  # channels in place


@pytest.mark.gpu
def test_a_folder_through_the_gpu_codecs(tmp_path):
    """Colour JPEGs on the GPU; a gray JPEG, a PNG and a rotated photo on the CPU; a
    corrupt JPEG reported as without the flag; outputs as good as the CPU codecs'."""
    _nv()
    src = tmp_path / "in"
    colour = [imwrite(src / f"c{i}.jpg", photo((301, 457, 3), seed=i)) for i in range(3)]
    imwrite(src / "gray.jpg", photo((301, 457, 3))[:, :, 0])
    imwrite(src / "flat.png", photo((40, 50, 3)))
    rotated_jpeg(src / "rot.jpg", 6)
    (src / "bad.jpg").write_bytes(jpeg_bytes(photo())[:300])
    gpu_out, cpu_out = tmp_path / "gpu", tmp_path / "cpu"
    r = module("blur", src, "--k", "5", "--out-dir", gpu_out, "--gpu-codecs")
    assert r.returncode == 3, r.stderr  # the corrupt file
    assert "bad.jpg" in r.stderr
    assert "--gpu-codecs: 3 file(s) decoded and 3 encoded on the GPU, 4 read with the CPU" in (
        r.stderr
    )
    module("blur", src, "--k", "5", "--out-dir", cpu_out)
    for name in ("gray", "flat", "rot"):  # CPU codecs both times: the same bytes
        (a,) = gpu_out.glob(f"{name}.*")
        assert a.read_bytes() == (cpu_out / a.name).read_bytes(), name
    for path in colour:
        ideal = cv2.blur(cv2.imread(str(path)), (5, 5)).astype(np.float64)
        name = f"{path.stem}.blur.jpg"
        got, cpu = (cv2.imread(str(d / name)).astype(np.float64) for d in (gpu_out, cpu_out))
        assert np.abs(got - ideal).mean() < np.abs(cpu - ideal).mean() + 1.0, name


@pytest.mark.gpu
def test_contour_through_the_gpu_decoder(tmp_path):
    """Contour reads BGR as OpenCV's decoder gives it; its 1-channel result is encoded
    on the CPU."""
    _nv()
    src = tmp_path / "in"
    for i in range(2):
        imwrite(src / f"c{i}.jpg", photo((211, 333, 3), seed=10 + i))
    r = module("contour", src, "--out-dir", tmp_path / "g", "--gpu-codecs", "--name",
               "{stem}.png")  # fmt: skip
    assert r.returncode == 0, r.stderr
    module("contour", src, "--out-dir", tmp_path / "c", "--name", "{stem}.png")
    for i in range(2):
        a = cv2.imread(str(tmp_path / "g" / f"c{i}.png"), cv2.IMREAD_UNCHANGED)
        b = cv2.imread(str(tmp_path / "c" / f"c{i}.png"), cv2.IMREAD_UNCHANGED)
        assert a.shape == b.shape and (a != b).mean() < 0.01
