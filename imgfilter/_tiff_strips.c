/* place(dst, src, width, samples, itemsize, predict, swap): one decoded TIFF strip into
 * the rows of an image as OpenCV gives it, in one pass, the GIL released.
 *
 * src holds the strip's rows as the file stores them: `width` pixels of `samples`
 * interleaved samples of `itemsize` bytes (1, 2: unsigned integers; 4: float32), in RGB(A)
 * order, byte-swapped against this machine where `swap`, and horizontally differenced
 * (each sample minus the same sample of the pixel to its left, modulo 2**bits) where
 * `predict`. dst receives the same rows in BGR(A) order, native bytes, the differencing
 * undone. imgfilter.tiff.read runs it for every strip on a pool of threads; NumPy's
 * cumulative sum does the same at about half libtiff's speed. Optional: without it,
 * OpenCV decodes every TIFF. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const int ORDER[5][4] = {{0}, {0}, {0, 1}, {2, 1, 0}, {2, 1, 0, 3}};

static uint16_t swap16(uint16_t v) { return (uint16_t)((v >> 8) | (v << 8)); }

static void place8(uint8_t *dst, const uint8_t *src, Py_ssize_t rows, Py_ssize_t width,
                   int samples, int predict)
{
    const int *order = ORDER[samples];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint8_t *in = src + r * width * samples;
        uint8_t *out = dst + r * width * samples;
        uint8_t acc[4] = {0, 0, 0, 0};
        for (Py_ssize_t x = 0; x < width; x++, in += samples, out += samples) {
            for (int k = 0; k < samples; k++)
                acc[k] = predict ? (uint8_t)(acc[k] + in[k]) : in[k];
            for (int k = 0; k < samples; k++)
                out[k] = acc[order[k]];
        }
    }
}

static void place16(uint16_t *dst, const uint16_t *src, Py_ssize_t rows, Py_ssize_t width,
                    int samples, int predict, int swap)
{
    const int *order = ORDER[samples];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint16_t *in = src + r * width * samples;
        uint16_t *out = dst + r * width * samples;
        uint16_t acc[4] = {0, 0, 0, 0};
        for (Py_ssize_t x = 0; x < width; x++, in += samples, out += samples) {
            for (int k = 0; k < samples; k++) {
                uint16_t v = swap ? swap16(in[k]) : in[k];
                acc[k] = predict ? (uint16_t)(acc[k] + v) : v;
            }
            for (int k = 0; k < samples; k++)
                out[k] = acc[order[k]];
        }
    }
}

static void place32(uint32_t *dst, const uint32_t *src, Py_ssize_t pixels, int samples, int swap)
{
    const int *order = ORDER[samples];
    for (Py_ssize_t i = 0; i < pixels; i++, src += samples, dst += samples)
        for (int k = 0; k < samples; k++) {
            uint32_t v = src[order[k]];
            dst[k] = swap ? __builtin_bswap32(v) : v;
        }
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
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    Py_ssize_t row_bytes = width * samples * itemsize;
    Py_ssize_t rows = dst.len / row_bytes;
    if (dst.len % row_bytes || src.len < dst.len) {
        PyErr_Format(PyExc_ValueError, "place: dst %zd bytes, src %zd, rows of %zd", dst.len,
                     src.len, row_bytes);
    } else {
        Py_BEGIN_ALLOW_THREADS
        if (itemsize == 1)
            place8(dst.buf, src.buf, rows, width, samples, predict);
        else if (itemsize == 2)
            place16(dst.buf, src.buf, rows, width, samples, predict, swap);
        else
            place32(dst.buf, src.buf, rows * width, samples, swap);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"place", place, METH_VARARGS,
     "place(dst, src, width, samples, itemsize, predict, swap): a TIFF strip's rows "
     "into BGR(A) order and native bytes, differencing undone; the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tiff_strips",
    "TIFF strips into image rows (imgfilter.tiff.read).", -1, methods,
};

PyMODINIT_FUNC PyInit__tiff_strips(void) { return PyModule_Create(&module); }
