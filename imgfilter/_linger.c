/* hold(fds, max_fd): start a process that keeps the open files `fds` until this process
 * has ended, then exits; returns its pid.
 *
 * Ending a process that holds a CUDA context costs 85-110 ms on an H100 machine: the
 * kernel driver destroys the context when the last descriptor of /dev/nvidia* closes,
 * inside the process's exit, and whoever waits for the process (a shell, a script
 * timing the command) waits for that too. A command line that has written its outputs
 * hands those descriptors to a process made here and exits at once; the context is
 * destroyed when that process exits, right after this one.
 *
 * The child is made with the raw clone system call, not fork(): fork runs the
 * libraries' atfork handlers (the CUDA driver's among them) in this multi-threaded
 * process. The child makes system calls only (no allocation, no lock, no Python):
 * it closes every descriptor from 0 to max_fd except `fds` and its end of a pipe, and
 * reads that pipe until it sees end-of-file, which comes when this process's end is
 * closed: at its exit, however it exits (no other process has it). Linux only. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_KEEP 256

static int kept(int fd, const int *keep, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (keep[i] == fd)
            return 1;
    return 0;
}

static void linger(const int *keep, Py_ssize_t n, int max_fd, int pipe_read)
{
    char byte;
    for (int fd = 0; fd <= max_fd; fd++)
        if (fd != pipe_read && !kept(fd, keep, n))
            syscall(SYS_close, fd);
    while (syscall(SYS_read, pipe_read, &byte, 1) > 0) {
    }
    syscall(SYS_exit_group, 0);
}

static PyObject *hold(PyObject *self, PyObject *args)
{
    PyObject *seq;
    int max_fd;
    if (!PyArg_ParseTuple(args, "Oi:hold", &seq, &max_fd))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "hold: fds must be a sequence of ints");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int keep[MAX_KEEP];
    if (n > MAX_KEEP) {
        Py_DECREF(fast);
        return PyErr_Format(PyExc_ValueError, "hold: at most %d descriptors", MAX_KEEP);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return NULL;
        }
        keep[i] = (int)fd;
    }
    Py_DECREF(fast);
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    /* The arguments after the flags differ in order between architectures; all zero
     * (no new stack, no thread ids, no TLS) they mean the same: a fork. */
    long pid = syscall(SYS_clone, (unsigned long)SIGCHLD, 0, 0, 0, 0);
    if (pid == 0)
        linger(keep, n, max_fd > ends[1] ? max_fd : ends[1], ends[0]);
    int saved = errno;
    close(ends[0]);
    if (pid < 0) {
        close(ends[1]);
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    /* ends[1] stays open until this process exits (close-on-exec: no program it may
     * still start keeps it). */
    return PyLong_FromLong(pid);
}

static PyMethodDef methods[] = {
    {"hold", hold, METH_VARARGS,
     "hold(fds, max_fd) -> pid: a process that keeps the descriptors `fds` open until "
     "this process has ended (every other descriptor up to max_fd closed in it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_linger",
    "A process that keeps descriptors open past this process's exit "
    "(imgfilter.backends.handoff).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__linger(void) { return PyModule_Create(&module); }
