/* copy(dst, src): dst[...] = src for two C-contiguous buffers of the same size, with
 * non-temporal (streaming) stores on x86-64 CPUs with AVX2, the GIL released.
 *
 * imgfilter.streamed moves every band of a large host image through it: the caller's
 * rows into a pinned buffer, a pinned buffer into the result. Ordinary stores first
 * read each destination line into the cache (a read for ownership) and later write it
 * back; streaming stores write whole lines without reading them, a third less memory
 * traffic for a copy much larger than the caches. glibc's memcpy streams only past a
 * threshold above the bands' 4 MiB pieces. Optional: without a C compiler the package
 * installs without it and the copies are NumPy's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
static int use_avx2; /* set once at import: the CPU has AVX2 */

/* Whole 64-byte lines of dst (aligned) from src (any alignment), 32-byte streaming
 * stores, the source prefetched a few lines ahead. */
__attribute__((target("avx2"))) static void lines_avx2(char *dst, const char *src, size_t n)
{
    for (size_t i = 0; i < n; i += 64) {
        _mm_prefetch(src + i + 512, _MM_HINT_NTA);
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
        _mm256_stream_si256((__m256i *)(dst + i), a);
        _mm256_stream_si256((__m256i *)(dst + i + 32), b);
    }
}
#endif

/* memcpy, with streaming stores for the whole lines of copies of a page or more where
 * the CPU has AVX2 (elsewhere memcpy alone). */
static void stream_copy(char *dst, const char *src, size_t n)
{
#if defined(HAVE_AVX2_PATH)
    if (use_avx2 && n >= 4096) {
        size_t head = (64 - ((uintptr_t)dst & 63)) & 63; /* to dst's next line */
        memcpy(dst, src, head);
        dst += head;
        src += head;
        n -= head;
        size_t body = n & ~(size_t)63;
        lines_avx2(dst, src, body);
        _mm_sfence(); /* the streamed lines are visible to every thread after this */
        memcpy(dst + body, src + body, n - body);
        return;
    }
#endif
    memcpy(dst, src, n);
}

static PyObject *copy(PyObject *self, PyObject *args)
{
    PyObject *dst_obj, *src_obj;
    Py_buffer dst, src;
    if (!PyArg_ParseTuple(args, "OO:copy", &dst_obj, &src_obj))
        return NULL;
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "copy: dst holds %zd bytes, src %zd", dst.len, src.len);
    } else {
        Py_BEGIN_ALLOW_THREADS
        stream_copy((char *)dst.buf, (const char *)src.buf, (size_t)dst.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy", copy, METH_VARARGS,
     "copy(dst, src): dst[...] = src for C-contiguous buffers of equal size (dst "
     "writable), with streaming stores where the CPU has AVX2; the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_stream_copy",
    "Copies of large host buffers with streaming stores (imgfilter.streamed).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__stream_copy(void)
{
#if defined(HAVE_AVX2_PATH)
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
    return PyModule_Create(&module);
}
