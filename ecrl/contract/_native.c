/* ecrl.contract._native: the semantics' two array kernels, compiled.
 *
 * ecrl/contract/semantics.py defines the run's data order: a Feistel network over positions with
 * cycle walking (the epoch's permutation) and the splitmix64 multiset hash of a shard. Its numpy
 * version spends about 36 passes over the IDs per permutation; a verifier that recomputes every
 * shard of a run of tens of millions of records spends a fifth of its time there. These are the
 * same functions, element by element, in one pass. The build is optional (setup.py); without it
 * semantics.py runs its numpy version, and tests/contract/test_native.py holds the two equal.
 *
 * feistel(keys, low_bits, low_mask, high_mask, limit, positions, out)
 *     keys: uint64[rounds]; positions: uint64[n]; out: int64[n] (written).
 *     out[i] = the network applied to positions[i], again while the value is >= limit.
 * row_hashes(rows, out)
 *     rows: int64[n * per]; out: uint64[n] (written): the wrapping sum of splitmix64 over each
 *     row of per = len(rows) / n IDs.
 * list_hash(ids) -> int | None
 *     The same hash of a list or tuple of Python ints, each taken mod 2^64 (as the Python
 *     definition's masks take it); None when an item is not an int (the caller's Python loop
 *     then decides). A step log hashes one batch per step with it, right after the model's step.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define MUL1 0xBF58476D1CE4E5B9ULL
#define MUL2 0x94D049BB133111EBULL

static inline uint64_t mix64(uint64_t z)
{
    z += GOLDEN;
    z = (z ^ (z >> 30)) * MUL1;
    z = (z ^ (z >> 27)) * MUL2;
    return z ^ (z >> 31);
}

static inline uint64_t network(uint64_t v, const uint64_t *key, Py_ssize_t rounds,
                               unsigned low_bits, uint64_t low_mask, uint64_t high_mask)
{
    uint64_t high = v >> low_bits, low = v & low_mask;
    for (Py_ssize_t r = 0; r + 1 < rounds; r += 2) {
        high ^= mix64(low ^ key[r]) & high_mask;
        low ^= mix64(high ^ key[r + 1]) & low_mask;
    }
    if (rounds % 2)
        high ^= mix64(low ^ key[rounds - 1]) & high_mask;
    return (high << low_bits) | low;
}

static int get(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->len % 8 != 0) {
        PyErr_Format(PyExc_ValueError, "%s must hold 8-byte items", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *feistel(PyObject *self, PyObject *args)
{
    PyObject *keys_obj, *positions_obj, *out_obj;
    unsigned long long low_bits, low_mask, high_mask, limit;
    if (!PyArg_ParseTuple(args, "OKKKKOO", &keys_obj, &low_bits, &low_mask, &high_mask, &limit,
                          &positions_obj, &out_obj))
        return NULL;
    /* The network permutes [0, 2^bits) only when the masks are the halves' widths. */
    if (low_bits >= 32 || low_mask != (1ULL << low_bits) - 1 || high_mask >= (1ULL << 32)
        || (high_mask & (high_mask + 1)) != 0 || limit == 0
        || limit - 1 > ((high_mask << low_bits) | low_mask)) {
        PyErr_SetString(PyExc_ValueError, "feistel: the masks must be the halves' widths, and "
                        "limit in [1, 2^bits]");
        return NULL;
    }
    Py_buffer keys, positions, out;
    if (get(keys_obj, &keys, 0, "keys") < 0)
        return NULL;
    if (get(positions_obj, &positions, 0, "positions") < 0) {
        PyBuffer_Release(&keys);
        return NULL;
    }
    if (get(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&keys);
        PyBuffer_Release(&positions);
        return NULL;
    }
    PyObject *result = NULL;
    const Py_ssize_t n = positions.len / 8, rounds = keys.len / 8;
    if (out.len != positions.len) {
        PyErr_SetString(PyExc_ValueError, "out must be as long as positions");
        goto done;
    }
    const uint64_t *key = keys.buf, *x = positions.buf;
    int64_t *y = out.buf;
    /* The walk ends because the network permutes [0, 2^bits) and every position's cycle holds
     * the position itself, below limit <= 2^bits; a position at or beyond limit could walk
     * forever, so none is taken. */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (x[i] >= limit) {
            PyErr_SetString(PyExc_ValueError, "positions must lie below limit");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    /* One pass without the walk first: independent elements, which the processor overlaps
     * (the walk's loop-carried test would serialise them); then the few that landed at or
     * beyond limit walk on. */
    for (Py_ssize_t i = 0; i < n; i++)
        y[i] = (int64_t)network(x[i], key, rounds, low_bits, low_mask, high_mask);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v = (uint64_t)y[i];
        while (v >= limit)
            v = network(v, key, rounds, low_bits, low_mask, high_mask);
        y[i] = (int64_t)v;
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *row_hashes(PyObject *self, PyObject *args)
{
    PyObject *rows_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OO", &rows_obj, &out_obj))
        return NULL;
    Py_buffer rows, out;
    if (get(rows_obj, &rows, 0, "rows") < 0)
        return NULL;
    if (get(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&rows);
        return NULL;
    }
    const Py_ssize_t n = out.len / 8;
    if (n == 0 ? rows.len != 0 : rows.len % (n * 8) != 0) {
        PyErr_SetString(PyExc_ValueError, "rows must hold the same number of IDs per row");
        PyBuffer_Release(&rows);
        PyBuffer_Release(&out);
        return NULL;
    }
    const Py_ssize_t per = n == 0 ? 0 : rows.len / (n * 8);
    const int64_t *ids = rows.buf;
    uint64_t *sums = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t total = 0;
        for (Py_ssize_t j = 0; j < per; j++)
            total += mix64((uint64_t)ids[i * per + j]);
        sums[i] = total;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    return Py_NewRef(Py_None);
}

static PyObject *list_hash(PyObject *self, PyObject *ids)
{
    if (!PyList_Check(ids) && !PyTuple_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "list_hash takes a list or a tuple");
        return NULL;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    PyObject **items = PySequence_Fast_ITEMS(ids);
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(items[i]))
            Py_RETURN_NONE;
        /* Any int, negative or beyond 64 bits, reduced mod 2^64: never an error. */
        const unsigned long long z = PyLong_AsUnsignedLongLongMask(items[i]);
        if (z == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        total += mix64(z);
    }
    return PyLong_FromUnsignedLongLong(total);
}

static PyMethodDef methods[] = {
    {"list_hash", list_hash, METH_O, "The multiset hash of a list or tuple of ints."},
    {"feistel", feistel, METH_VARARGS, "The epoch permutation's network with cycle walking."},
    {"row_hashes", row_hashes, METH_VARARGS, "The multiset hash of each row of IDs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ecrl.contract._native",
    "The semantics' array kernels, compiled (see ecrl/contract/semantics.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
