/* The compiled half of kernels.common.cudadrv.PreparedLaunch: one call that writes a
 * prepared launch's changing pointer parameters and stream and calls cuLaunchKernelEx.
 *
 * PreparedLaunch keeps its parameters packed in one buffer of 64-bit words and its
 * launch configuration in a CUlaunchConfig; both stay owned by the Python object.
 * `Launch(driver_fn, config, stream_field, fn, extra, words, patches)` takes their
 * addresses once; `launch(stream, bases)` then sets words[index] = bases[slot] + at
 * for each (index, slot, at) patch, the configuration's stream, and calls the driver,
 * all while holding the GIL: no other Python thread can write the same words between
 * the writes and the driver's copy of them, so no lock is needed. Returns the
 * driver's status (0: queued). Optional: without a C compiler the package uses the
 * same steps in Python (cudadrv.PreparedLaunch).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*launch_ex_fn)(void *config, void *fn, void **params, void **extra);

typedef struct {
    Py_ssize_t index; /* word of the parameter buffer */
    Py_ssize_t slot;  /* item of `bases` */
    int64_t at;       /* byte offset added to it */
} Patch;

typedef struct {
    PyObject_HEAD
    launch_ex_fn driver_fn;
    void *config;
    void **stream_field;
    void *fn;
    void **extra;
    int64_t *words;
    Py_ssize_t npatches;
    Py_ssize_t max_slot;
    Patch *patches;
} Launch;

static void *address(PyObject *value, const char *name) {
    void *p = PyLong_AsVoidPtr(value);
    if (p == NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s is a null address", name);
    }
    return p;
}

static int Launch_init(Launch *self, PyObject *args, PyObject *kwds) {
    PyObject *driver_fn, *config, *stream_field, *fn, *extra, *words, *patches;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "Launch() takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOO!", &driver_fn, &config, &stream_field, &fn, &extra,
                          &words, &PyTuple_Type, &patches)) {
        return -1;
    }
    self->driver_fn = (launch_ex_fn)address(driver_fn, "driver_fn");
    self->config = address(config, "config");
    self->stream_field = (void **)address(stream_field, "stream_field");
    self->fn = PyLong_AsVoidPtr(fn);
    if (PyErr_Occurred()) return -1;
    self->extra = (void **)address(extra, "extra");
    self->words = (int64_t *)address(words, "words");
    if (PyErr_Occurred()) return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(patches);
    PyMem_Free(self->patches);
    self->patches = PyMem_New(Patch, n > 0 ? n : 1);
    if (self->patches == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->npatches = n;
    self->max_slot = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Patch *p = &self->patches[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(patches, i), "nnL", &p->index, &p->slot,
                              &p->at)) {
            return -1;
        }
        if (p->index < 0 || p->slot < 0) {
            PyErr_SetString(PyExc_ValueError, "patch index and slot must be >= 0");
            return -1;
        }
        if (p->slot > self->max_slot) self->max_slot = p->slot;
    }
    return 0;
}

static void Launch_dealloc(Launch *self) {
    PyMem_Free(self->patches);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Launch_launch(Launch *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "launch(stream, bases) takes 2 arguments");
        return NULL;
    }
    void *stream = PyLong_AsVoidPtr(args[0]);
    if (stream == NULL && PyErr_Occurred()) return NULL;
    PyObject *bases = args[1];
    if (!PyTuple_Check(bases) && !PyList_Check(bases)) {
        PyErr_SetString(PyExc_TypeError, "bases must be a tuple or a list of addresses");
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(bases);
    Py_ssize_t count = PySequence_Fast_GET_SIZE(bases);
    if (self->max_slot >= count) {
        PyErr_Format(PyExc_IndexError, "%zd bases given, slot %zd needed", count, self->max_slot);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < self->npatches; i++) {
        const Patch *p = &self->patches[i];
        PyObject *item = items[p->slot];
        if (!PyLong_Check(item)) { /* an int: converting runs no Python code */
            PyErr_SetString(PyExc_TypeError, "bases must be ints (device addresses)");
            return NULL;
        }
        unsigned long long base = PyLong_AsUnsignedLongLong(item);
        if (base == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
        self->words[p->index] = (int64_t)(base + (unsigned long long)p->at);
    }
    *self->stream_field = stream;
    int status = self->driver_fn(self->config, self->fn, NULL, self->extra);
    return PyLong_FromLong(status);
}

static PyMethodDef Launch_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))Launch_launch, METH_FASTCALL,
     "launch(stream, bases) -> the driver's status: write the patched pointers and the "
     "stream, then cuLaunchKernelEx."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kernels.common._launch.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Launch(driver_fn, config, stream_field, fn, extra, words, patches): "
              "a prepared launch's addresses (see the module source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launch_init,
    .tp_dealloc = (destructor)Launch_dealloc,
    .tp_methods = Launch_methods,
};

static struct PyModuleDef launch_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_launch",
    .m_doc = "The compiled launch path of kernels.common.cudadrv (optional).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__launch(void) {
    if (PyType_Ready(&LaunchType) < 0) return NULL;
    PyObject *m = PyModule_Create(&launch_module);
    if (m == NULL) return NULL;
    Py_INCREF(&LaunchType);
    if (PyModule_AddObject(m, "Launch", (PyObject *)&LaunchType) < 0) {
        Py_DECREF(&LaunchType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
