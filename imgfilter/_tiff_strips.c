/* lzw(src, size): one TIFF LZW strip decoded; place(dst, src, width, samples, itemsize,
 * predict, swap): one decoded TIFF strip or tile into the rows of an image as OpenCV gives
 * it, in one pass. Both release the GIL.
 *
 * place's src holds the block's rows as the file stores them: `width` pixels of `samples`
 * interleaved samples of `itemsize` bytes (1, 2: unsigned integers; 4: float32), in RGB(A)
 * order, byte-swapped against this machine where `swap`, and horizontally differenced
 * (each sample minus the same sample of the pixel to its left, modulo 2**bits) where
 * `predict`. dst receives the same rows in BGR(A) order, native bytes, the differencing
 * undone: whole rows, or the first pixels of each row (an array view whose rows are
 * shorter and further apart: a tile's part of the image). imgfilter.tiff.read runs them
 * for every strip or tile on a pool of threads; NumPy's cumulative sum does what place
 * does at about half libtiff's speed. Optional: without it, OpenCV decodes every TIFF. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const int ORDER[5][4] = {{0}, {0}, {0, 1}, {2, 1, 0}, {2, 1, 0, 3}};

static uint16_t swap16(uint16_t v) { return (uint16_t)((v >> 8) | (v << 8)); }

/* Each place function: `rows` rows of `cols` pixels into dst (rows `dst_pitch` bytes
 * apart) from src (rows `src_pitch` bytes apart, cols <= the row's pixels there). */
static void place8(uint8_t *dst, Py_ssize_t dst_pitch, const uint8_t *src, Py_ssize_t src_pitch,
                   Py_ssize_t rows, Py_ssize_t cols, int samples, int predict)
{
    const int *order = ORDER[samples];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint8_t *in = src + r * src_pitch;
        uint8_t *out = dst + r * dst_pitch;
        if (!predict) { /* the channels reordered only */
            if (samples == 3)
                for (Py_ssize_t x = 0; x < cols; x++, in += 3, out += 3) {
                    out[0] = in[2];
                    out[1] = in[1];
                    out[2] = in[0];
                }
            else if (samples == 4)
                for (Py_ssize_t x = 0; x < cols; x++, in += 4, out += 4) {
                    out[0] = in[2];
                    out[1] = in[1];
                    out[2] = in[0];
                    out[3] = in[3];
                }
            else
                memcpy(out, in, (size_t)(cols * samples));
            continue;
        }
        uint8_t acc[4] = {0, 0, 0, 0};
        for (Py_ssize_t x = 0; x < cols; x++, in += samples, out += samples) {
            for (int k = 0; k < samples; k++)
                acc[k] = (uint8_t)(acc[k] + in[k]);
            for (int k = 0; k < samples; k++)
                out[k] = acc[order[k]];
        }
    }
}

static void place16(uint8_t *dst, Py_ssize_t dst_pitch, const uint8_t *src, Py_ssize_t src_pitch,
                    Py_ssize_t rows, Py_ssize_t cols, int samples, int predict, int swap)
{
    const int *order = ORDER[samples];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint16_t *in = (const uint16_t *)(src + r * src_pitch);
        uint16_t *out = (uint16_t *)(dst + r * dst_pitch);
        uint16_t acc[4] = {0, 0, 0, 0};
        for (Py_ssize_t x = 0; x < cols; x++, in += samples, out += samples) {
            for (int k = 0; k < samples; k++) {
                uint16_t v = swap ? swap16(in[k]) : in[k];
                acc[k] = predict ? (uint16_t)(acc[k] + v) : v;
            }
            for (int k = 0; k < samples; k++)
                out[k] = acc[order[k]];
        }
    }
}

static void place32(uint8_t *dst, Py_ssize_t dst_pitch, const uint8_t *src, Py_ssize_t src_pitch,
                    Py_ssize_t rows, Py_ssize_t cols, int samples, int swap)
{
    const int *order = ORDER[samples];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint32_t *in = (const uint32_t *)(src + r * src_pitch);
        uint32_t *out = (uint32_t *)(dst + r * dst_pitch);
        for (Py_ssize_t x = 0; x < cols; x++, in += samples, out += samples)
            for (int k = 0; k < samples; k++) {
                uint32_t v = in[order[k]];
                out[k] = swap ? __builtin_bswap32(v) : v;
            }
    }
}

/* dst's rows, pixels per row and bytes between rows: an array (rows, cols[, samples]) of
 * `itemsize`-byte items with each row's pixels together and cols <= width (all of an
 * image's rows, or a tile's part of them); a flat contiguous buffer holds whole rows of
 * `width` pixels. */
static int dst_rows(Py_buffer *dst, Py_ssize_t width, int samples, int itemsize,
                    Py_ssize_t *rows, Py_ssize_t *cols, Py_ssize_t *pitch)
{
    Py_ssize_t pixel = (Py_ssize_t)samples * itemsize;
    if (dst->ndim < 2) {
        if (!PyBuffer_IsContiguous(dst, 'C'))
            return -1;
        if (dst->len % (width * pixel))
            return -1;
        *rows = dst->len / (width * pixel);
        *cols = width;
        *pitch = width * pixel;
        return 0;
    }
    int n = dst->ndim;
    if (n > 3 || dst->itemsize != itemsize || (n == 3 && dst->shape[2] != samples) ||
        (n == 2 && samples != 1) || dst->strides[n - 1] != itemsize ||
        (n == 3 && dst->strides[1] != pixel) || dst->shape[1] > width ||
        dst->strides[0] < dst->shape[1] * pixel)
        return -1;
    *rows = dst->shape[0];
    *cols = dst->shape[1];
    *pitch = dst->strides[0];
    return 0;
}

static PyObject *place(PyObject *self, PyObject *args)
{
    PyObject *dst_obj, *src_obj;
    Py_ssize_t width;
    int samples, itemsize, predict, swap;
    Py_buffer dst, src;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOniipp:place", &dst_obj, &src_obj, &width, &samples,
                          &itemsize, &predict, &swap))
        return NULL;
    if (samples < 1 || samples > 4 || !(itemsize == 1 || itemsize == 2 || itemsize == 4) ||
        (itemsize == 4 && predict) || width < 1)
        return PyErr_Format(PyExc_ValueError, "place: samples %d, itemsize %d, predict %d",
                            samples, itemsize, predict);
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_STRIDES) < 0)
        return NULL;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    Py_ssize_t src_pitch = width * samples * itemsize;
    Py_ssize_t rows = 0, cols = 0, dst_pitch = 0;
    if (dst_rows(&dst, width, samples, itemsize, &rows, &cols, &dst_pitch) < 0) {
        PyErr_Format(PyExc_ValueError, "place: dst of %zd bytes is not rows of at most %zd "
                     "pixels of %d samples", dst.len, width, samples);
    } else if (src.len < rows * src_pitch) {
        PyErr_Format(PyExc_ValueError, "place: src %zd bytes, %zd rows of %zd", src.len, rows,
                     src_pitch);
    } else {
        Py_BEGIN_ALLOW_THREADS
        if (itemsize == 1)
            place8(dst.buf, dst_pitch, src.buf, src_pitch, rows, cols, samples, predict);
        else if (itemsize == 2)
            place16(dst.buf, dst_pitch, src.buf, src_pitch, rows, cols, samples, predict, swap);
        else
            place32(dst.buf, dst_pitch, src.buf, src_pitch, rows, cols, samples, swap);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* TIFF's LZW (TIFF 6.0, section 13): codes of 9 to 12 bits, most significant bit first,
 * 256 clears the table, 257 ends the strip, and the code width grows one code early (when
 * the next free entry reaches 2**width - 1), as libtiff writes and reads it. Every entry
 * of the table is a string the output already holds (the string just written plus the
 * first byte written after it), so the table keeps where (`at`) and how long (`length`),
 * and a code is one copy out of the output. Decodes into out[0:size] and returns how
 * many bytes it wrote; it stops once the strip is full (codes past it are dropped, as
 * libtiff drops them); -1 with *error set for a code the table does not hold. */
enum { LZW_CLEAR = 256, LZW_END = 257, LZW_FIRST = 258, LZW_ENTRIES = 4096 };
static const char LZW_NO_MEMORY[] = "no memory for the LZW table";

static Py_ssize_t lzw_decode(const uint8_t *in, Py_ssize_t n, uint8_t *out, Py_ssize_t size,
                             const char **error)
{
    Py_ssize_t *at = PyMem_RawMalloc(LZW_ENTRIES * sizeof(Py_ssize_t));
    uint16_t *length = PyMem_RawMalloc(LZW_ENTRIES * sizeof(uint16_t));
    if (at == NULL || length == NULL) {
        PyMem_RawFree(at);
        PyMem_RawFree(length);
        *error = LZW_NO_MEMORY;
        return -1;
    }
    Py_ssize_t pos = 0, o = 0, prev_at = 0, prev_length = 0;
    uint32_t bits = 0;
    int have = 0, width = 9, next = LZW_FIRST, old = -1;
    while (o < size) {
        while (have < width && pos < n) {
            bits = (bits << 8) | in[pos++];
            have += 8;
        }
        if (have < width)
            break; /* the strip's bytes end without the end code: what came is kept */
        int code = (int)((bits >> (have - width)) & ((1u << width) - 1));
        have -= width;
        if (code == LZW_END)
            break;
        if (code == LZW_CLEAR) {
            width = 9;
            next = LZW_FIRST;
            old = -1;
            continue;
        }
        Py_ssize_t len;
        if (code < 256) {
            out[o] = (uint8_t)code;
            len = 1;
        } else if (old >= 0 && code < next) {
            len = length[code];
            memcpy(out + o, out + at[code], (size_t)(len < size - o ? len : size - o));
        } else if (old >= 0 && code == next && next < LZW_ENTRIES) {
            /* the entry being made: the last string and its own first byte */
            len = prev_length + 1;
            memcpy(out + o, out + prev_at, (size_t)(prev_length < size - o ? prev_length : size - o));
            if (o + prev_length < size)
                out[o + prev_length] = out[prev_at];
        } else {
            *error = old < 0 ? "an LZW code before any string" : "an LZW code outside the table";
            o = -1;
            break;
        }
        if (old >= 0 && next < LZW_ENTRIES) {
            at[next] = prev_at;
            length[next] = (uint16_t)(prev_length + 1);
            next++;
            if (next >= (1 << width) - 1 && width < 12)
                width++;
        }
        old = code;
        prev_at = o;
        prev_length = len;
        o += len;
    }
    PyMem_RawFree(at);
    PyMem_RawFree(length);
    return o < size ? o : size;
}

static PyObject *lzw(PyObject *self, PyObject *args)
{
    PyObject *src_obj;
    Py_ssize_t size;
    Py_buffer src;
    (void)self;
    if (!PyArg_ParseTuple(args, "On:lzw", &src_obj, &size))
        return NULL;
    if (size < 0)
        return PyErr_Format(PyExc_ValueError, "lzw: size %zd", size);
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        PyBuffer_Release(&src);
        return NULL;
    }
    const char *error = NULL;
    Py_ssize_t produced;
    Py_BEGIN_ALLOW_THREADS
    produced = lzw_decode(src.buf, src.len, (uint8_t *)PyBytes_AS_STRING(result), size, &error);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    if (produced < 0) {
        Py_DECREF(result);
        if (error == LZW_NO_MEMORY)
            return PyErr_NoMemory();
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    if (produced < size && _PyBytes_Resize(&result, produced) < 0)
        return NULL;
    return result;
}

static PyMethodDef methods[] = {
    {"lzw", lzw, METH_VARARGS,
     "lzw(src, size) -> bytes: a TIFF LZW strip decoded, at most `size` bytes (fewer where "
     "the stream ends first); ValueError for a code outside the table. The GIL released."},
    {"place", place, METH_VARARGS,
     "place(dst, src, width, samples, itemsize, predict, swap): a TIFF strip's or tile's "
     "rows into BGR(A) order and native bytes, differencing undone (dst: whole rows, or a "
     "view of shorter rows); the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tiff_strips",
    "TIFF strips into image rows (imgfilter.tiff.read).", -1, methods,
};

PyMODINIT_FUNC PyInit__tiff_strips(void) { return PyModule_Create(&module); }
