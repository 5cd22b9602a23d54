"""Kernel specs: inline matrices and .npy/.txt/.csv files, and their one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from imgfilter.errors import UsageError
from imgfilter.kernelspec import normalize_kernel, parse_kernel

SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float64)


def _usage_error(spec: str) -> str:
    with pytest.raises(UsageError) as info:
        parse_kernel(spec)
    message = str(info.value)
    assert message and "\n" not in message
    return message


@pytest.mark.parametrize(
    "spec",
    [
        "-1,0,1;-2,0,2;-1,0,1",
        "-1 0 1; -2 0 2; -1 0 1",
        " -1, 0, 1 ; -2,0,2 ;-1 ,0 ,1; ",
        "-1.0,0e0,1;-2,0,+2;-1,0,1",
    ],
)
def test_inline_sobel(spec):
    k = parse_kernel(spec)
    assert k.dtype == np.float64
    np.testing.assert_array_equal(k, SOBEL_X)


def test_inline_single_row_is_a_row_and_fractions_work():
    k = parse_kernel("1/4 1/2 1/4")
    assert k.shape == (1, 3)
    np.testing.assert_allclose(k, [[0.25, 0.5, 0.25]])


def test_inline_single_value():
    np.testing.assert_array_equal(parse_kernel("2"), [[2.0]])


def test_inline_even_and_rectangular_shapes():
    assert parse_kernel("1,2;3,4").shape == (2, 2)
    assert parse_kernel("1;2;3;4;5").shape == (5, 1)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("1,2;3", "row 2 has 1 entries but row 1 has 2"),
        ("1,2,3;4,5;6,7,8", "row 2"),
        ("1,2;;3,4", "row 2 is empty"),
        ("1,x;3,4", "'x' is not a number"),
        ("1,2;3,nan", "not finite"),
        ("inf,0;0,1", "not finite"),
        ("1,-inf", "not finite"),
        ("1/0,1", "divides by zero"),
        ("1/2/3", "not a number"),
        ("1_000,2", "not a number"),
        ("[[1,2],[3,4]]", "not a number"),
    ],
)
def test_inline_malformed(spec, words):
    assert words in _usage_error(spec)


def test_too_large_inline():
    spec = ",".join(["1"] * 256)
    assert "at most 255" in _usage_error(spec)


def test_npy_2d(tmp_path):
    path = tmp_path / "k.npy"
    np.save(path, SOBEL_X.astype(np.float32))
    np.testing.assert_array_equal(parse_kernel(str(path)), SOBEL_X)


def test_npy_integer_dtype(tmp_path):
    path = tmp_path / "k.npy"
    np.save(path, SOBEL_X.astype(np.int16))
    np.testing.assert_array_equal(parse_kernel(str(path)), SOBEL_X)


def test_npy_1d_is_a_column_as_in_opencv(tmp_path):
    path = tmp_path / "k.npy"
    np.save(path, np.array([1.0, 2.0, 1.0]))
    assert parse_kernel(str(path)).shape == (3, 1)


@pytest.mark.parametrize(
    ("array", "words"),
    [
        (np.zeros((3, 3, 3)), "3-D"),
        (np.float64(2.0), "scalar"),
        (np.zeros((0, 3)), "empty"),
        (np.array([[1.0, np.nan]]), "NaN"),
        (np.array([[1.0, np.inf]]), "NaN or infinity"),
        (np.array([["a", "b"]]), "must be real"),
        (np.array([[1 + 2j]]), "must be real"),
    ],
)
def test_npy_malformed(tmp_path, array, words):
    path = tmp_path / "k.npy"
    np.save(path, array)
    assert words in _usage_error(str(path))


def test_npy_pickled_object_array_refused(tmp_path):
    path = tmp_path / "k.npy"
    np.save(path, np.array([[1, None]], dtype=object), allow_pickle=True)
    assert "not a usable .npy array" in _usage_error(str(path))


def test_npy_corrupt(tmp_path):
    path = tmp_path / "k.npy"
    path.write_bytes(b"this is not numpy")
    assert str(path) in _usage_error(str(path))


def test_npy_zero_bytes(tmp_path):
    path = tmp_path / "k.npy"
    path.write_bytes(b"")
    assert str(path) in _usage_error(str(path))


def test_txt_whitespace_with_comments(tmp_path):
    path = tmp_path / "k.txt"
    path.write_text("# Sobel x\n-1 0 1\n-2 0 2   # middle row\n\n-1 0 1\n")
    np.testing.assert_array_equal(parse_kernel(str(path)), SOBEL_X)


def test_csv_commas(tmp_path):
    path = tmp_path / "k.csv"
    path.write_text("-1,0,1\n-2,0,2\n-1,0,1\n")
    np.testing.assert_array_equal(parse_kernel(str(path)), SOBEL_X)


def test_txt_single_line_is_a_row(tmp_path):
    path = tmp_path / "k.txt"
    path.write_text("1 2 1\n")
    assert parse_kernel(str(path)).shape == (1, 3)


def test_txt_agrees_with_numpy_loadtxt(tmp_path):
    rng = np.random.default_rng(3)
    k = rng.normal(size=(5, 7))
    path = tmp_path / "k.txt"
    np.savetxt(path, k)
    np.testing.assert_array_equal(parse_kernel(str(path)), np.loadtxt(path, ndmin=2))
    path_csv = tmp_path / "k.csv"
    np.savetxt(path_csv, k, delimiter=",")
    np.testing.assert_array_equal(parse_kernel(str(path_csv)), k)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1 2 3\n4 5\n", "line 2 has 2 entries but line 1 has 3"),
        ("1 2\n3 abc\n", "'abc' is not a number"),
        ("1 2\n3 nan\n", "not finite"),
        ("# only a comment\n\n", "holds no numbers"),
        ("", "holds no numbers"),
    ],
)
def test_txt_malformed(tmp_path, text, words):
    path = tmp_path / "k.txt"
    path.write_text(text)
    message = _usage_error(str(path))
    assert words in message
    assert str(path) in message


def test_txt_binary_content(tmp_path):
    path = tmp_path / "k.txt"
    path.write_bytes(b"\xff\xfe\x00\x01garbage")
    assert "not a text matrix" in _usage_error(str(path))


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.npy"
    assert "not found" in _usage_error(str(missing))
    assert "not found" in _usage_error(str(tmp_path / "nope.csv"))


def test_directory_with_kernel_suffix(tmp_path):
    d = tmp_path / "dir.txt"
    d.mkdir()
    assert "directory" in _usage_error(str(d))


def test_existing_file_without_suffix_is_read_as_text(tmp_path):
    path = tmp_path / "kernel"
    path.write_text("0 1 0\n1 -4 1\n0 1 0\n")
    assert parse_kernel(str(path))[1, 1] == -4


def test_normalize_divides_by_sum():
    k = normalize_kernel(parse_kernel("1,2,1;2,4,2;1,2,1"))
    assert k.sum() == pytest.approx(1.0)
    assert k[1, 1] == pytest.approx(0.25)


def test_normalize_negative_sum_keeps_signs():
    k = normalize_kernel(np.array([[-1.0, -1.0]]))
    np.testing.assert_allclose(k, [[0.5, 0.5]])


def test_normalize_zero_sum_refused():
    with pytest.raises(UsageError, match="sums to 0"):
        normalize_kernel(SOBEL_X)
    with pytest.raises(UsageError, match="sums to 0"):
        normalize_kernel(np.array([[0.1, 0.2, -0.3]]))


def test_file_name_too_long_is_usage_error():
    assert "kernel file" in _usage_error("1" * 300 + ".npy")
