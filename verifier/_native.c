/* verifier._native: the scan's fast path over one block, in one pass per line of compiled code.
 *
 * verifier/_scan.py proves a block of step records byte by byte against the records the
 * semantics expect, then hands what is left of each line to a parser. In numpy that proof is a
 * few dozen passes over every byte (gathers, masks, a number reader); here it is one pass per
 * line. It is an optional build (setup.py): without it, _scan.py runs its numpy version, and a
 * property test (tests/verifier/test_scan.py) holds the two to the same answers.
 *
 * prove_block(block, ends, pieces, steps, epochs, cursors, hashes, ids, out) -> (size, ids) | None
 *
 *   block    bytes of the block: block[0] is a spare byte, line i ends at block[ends[i]] ('\n')
 *   ends     int64[n], strictly increasing, each < len(block)
 *   pieces   five bytes objects: the record's prefix around its four variable fields,
 *            pieces[0] global_step pieces[1] epoch pieces[2] cursor_step pieces[3] hash pieces[4]
 *   steps, epochs, cursors   int64[n], non-negative (written as decimal)
 *   hashes   uint64[n] (written as 16 lowercase hex digits)
 *   ids      None, or int64[n * per]: the expected sample IDs of each line, row by row
 *   out      writable uint8 buffer at least len(block) long
 *
 * Returns None unless every line starts with its expected prefix and is longer than it, holds
 * exactly one '{' (its first byte) and one '}' (its last byte). Otherwise the rest of the block is
 * written to out, as the numpy version builds it: a newline, then per line its '{', its bytes
 * after the prefix and a newline; when ids is given and every line holds the key
 * "sample_ids":[ exactly once, followed by exactly its expected IDs as canonical decimals joined
 * by single commas and a ']', the bytes between those brackets are left out too (ids=True).
 * Returns (bytes written, whether the ID lists were proven and left out).
 *
 * number_columns(rest, n, segments) -> bytes | None
 *
 *   rest      a newline, then n lines each ending with a newline (what prove_block wrote)
 *   segments  the first line's bytes between its number values (at least two)
 *
 * Returns None unless every line is segments[0] number segments[1] number ... segments[-1],
 * each number a non-empty run of the bytes a JSON number may hold; otherwise the numbers of all
 * lines as one JSON array ("[n1,n2,...]") for the caller's parser, which proves each a number.
 *
 * Every index is checked against its buffer: the logs are the verifier's untrusted input.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* memmem */
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const char KEY[] = "\"sample_ids\":[";
#define KEY_LEN ((Py_ssize_t)(sizeof(KEY) - 1))
#define PIECES 5

/* Does [*at, end) start with the decimal form of v (no sign, no leading zero) followed by a byte
 * that is not a digit, or the end? Advances *at past the digits when it does. */
static int take_decimal(const char **at, const char *end, uint64_t v)
{
    const char *p = *at;
    if (p >= end || *p < '0' || *p > '9')
        return 0;
    uint64_t read = 0;
    if (*p == '0') {
        p++;
    } else {
        /* At most 19 digits: every expected value is below 2^63 < 10^19, and 19 digits cannot
         * wrap a uint64. */
        for (int digits = 0; p < end && *p >= '0' && *p <= '9'; digits++, p++) {
            if (digits == 19)
                return 0;
            read = read * 10 + (uint64_t)(*p - '0');
        }
    }
    if (read != v || (p < end && *p >= '0' && *p <= '9'))
        return 0;
    *at = p;
    return 1;
}

static int take_bytes(const char **at, const char *end, const char *text, Py_ssize_t n)
{
    if (end - *at < n || memcmp(*at, text, (size_t)n) != 0)
        return 0;
    *at += n;
    return 1;
}

static int take_hex(const char **at, const char *end, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char buf[16];
    for (int i = 15; i >= 0; i--) {
        buf[i] = digits[v & 15];
        v >>= 4;
    }
    return take_bytes(at, end, buf, 16);
}

/* The one "sample_ids":[ of [from, end), or NULL when it has none or several. */
static const char *only_key(const char *from, const char *end)
{
    const char *found = memmem(from, (size_t)(end - from), KEY, (size_t)KEY_LEN);
    if (found == NULL)
        return NULL;
    const char *after = found + KEY_LEN; /* the key cannot overlap itself */
    if (memmem(after, (size_t)(end - after), KEY, (size_t)KEY_LEN) != NULL)
        return NULL;
    return found;
}

/* The pieces' promise that pass 1 relies on: the first starts with the line's '{', and no
 * piece holds another brace or the IDs' key. */
static int check_pieces(const char *piece[PIECES], const Py_ssize_t piece_len[PIECES])
{
    if (piece_len[0] < 1 || piece[0][0] != '{')
        goto bad;
    for (int i = 0; i < PIECES; i++) {
        const char *from = piece[i] + (i == 0);
        const Py_ssize_t len = piece_len[i] - (i == 0);
        if (memchr(from, '{', (size_t)len) || memchr(from, '}', (size_t)len)
            || memmem(piece[i], (size_t)piece_len[i], KEY, (size_t)KEY_LEN))
            goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "pieces: the first starts with '{', and no piece holds "
                    "another brace or the sample IDs' key");
    return -1;
}

typedef struct {
    Py_buffer view;
    int held;
} Buffer;

static int get_buffer(PyObject *obj, Buffer *b, int writable, Py_ssize_t itemsize,
                      const char *name)
{
    if (PyObject_GetBuffer(obj, &b->view,
                           PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    b->held = 1;
    if (b->view.len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items",
                     name, b->view.len, itemsize);
        return -1;
    }
    return 0;
}

static void release(Buffer *b)
{
    if (b->held) {
        PyBuffer_Release(&b->view);
        b->held = 0;
    }
}

static PyObject *prove_block(PyObject *self, PyObject *args)
{
    PyObject *block_obj, *ends_obj, *pieces_obj, *steps_obj, *epochs_obj, *cursors_obj;
    PyObject *hashes_obj, *ids_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &block_obj, &ends_obj, &pieces_obj, &steps_obj,
                          &epochs_obj, &cursors_obj, &hashes_obj, &ids_obj, &out_obj))
        return NULL;
    if (!PyTuple_Check(pieces_obj) || PyTuple_GET_SIZE(pieces_obj) != PIECES) {
        PyErr_SetString(PyExc_TypeError, "pieces must be a tuple of five bytes objects");
        return NULL;
    }
    const char *piece[PIECES];
    Py_ssize_t piece_len[PIECES];
    for (int i = 0; i < PIECES; i++) {
        PyObject *p = PyTuple_GET_ITEM(pieces_obj, i);
        if (!PyBytes_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "pieces must be a tuple of five bytes objects");
            return NULL;
        }
        piece[i] = PyBytes_AS_STRING(p);
        piece_len[i] = PyBytes_GET_SIZE(p);
    }

    Buffer block = {0}, ends = {0}, steps = {0}, epochs = {0}, cursors = {0}, hashes = {0};
    Buffer ids = {0}, out = {0};
    PyObject *result = NULL;
    Py_ssize_t *marks = NULL;
    if (check_pieces(piece, piece_len) < 0)
        return NULL;
    if (get_buffer(block_obj, &block, 0, 1, "block") < 0
        || get_buffer(ends_obj, &ends, 0, 8, "ends") < 0
        || get_buffer(steps_obj, &steps, 0, 8, "steps") < 0
        || get_buffer(epochs_obj, &epochs, 0, 8, "epochs") < 0
        || get_buffer(cursors_obj, &cursors, 0, 8, "cursors") < 0
        || get_buffer(hashes_obj, &hashes, 0, 8, "hashes") < 0
        || (ids_obj != Py_None && get_buffer(ids_obj, &ids, 0, 8, "ids") < 0)
        || get_buffer(out_obj, &out, 1, 1, "out") < 0)
        goto done;

    const Py_ssize_t n = ends.view.len / 8;
    const Py_ssize_t size = block.view.len;
    if (steps.view.len != n * 8 || epochs.view.len != n * 8 || cursors.view.len != n * 8
        || hashes.view.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "steps, epochs, cursors and hashes need one per line");
        goto done;
    }
    if (out.view.len < size) {
        PyErr_SetString(PyExc_ValueError, "out is shorter than the block");
        goto done;
    }
    Py_ssize_t per = 0;
    if (ids.held) {
        if (n == 0 || ids.view.len % (n * 8) != 0) {
            PyErr_SetString(PyExc_ValueError, "ids must hold the same number of IDs per line");
            goto done;
        }
        per = ids.view.len / (n * 8);
    }
    const char *text = (const char *)block.view.buf;
    const int64_t *end_at = (const int64_t *)ends.view.buf;
    const int64_t *step = (const int64_t *)steps.view.buf;
    const int64_t *epoch = (const int64_t *)epochs.view.buf;
    const int64_t *cursor = (const int64_t *)cursors.view.buf;
    const uint64_t *hash = (const uint64_t *)hashes.view.buf;
    const int64_t *expected = ids.held ? (const int64_t *)ids.view.buf : NULL;
    char *dest = (char *)out.view.buf;
    if (n == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }

    /* Pass 1: every line's prefix, braces and (when asked) its one ID list; where each line's
     * rest starts, and its list's brackets. */
    marks = PyMem_Malloc((size_t)n * 3 * sizeof(Py_ssize_t));
    if (marks == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int ids_proven = per > 0;
    Py_ssize_t start = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Py_ssize_t stop = (Py_ssize_t)end_at[i];
        if (stop < start || stop >= size || text[stop] != '\n') {
            PyErr_SetString(PyExc_ValueError, "ends must be the block's newlines, in order");
            goto done;
        }
        const char *line_end = text + stop;
        const char *at = text + start;
        /* The prefix holds the line's one '{' (pieces[0] starts with it); no piece holds '}'. */
        if (step[i] < 0 || epoch[i] < 0 || cursor[i] < 0
            || !take_bytes(&at, line_end, piece[0], piece_len[0])
            || !take_decimal(&at, line_end, (uint64_t)step[i])
            || !take_bytes(&at, line_end, piece[1], piece_len[1])
            || !take_decimal(&at, line_end, (uint64_t)epoch[i])
            || !take_bytes(&at, line_end, piece[2], piece_len[2])
            || !take_decimal(&at, line_end, (uint64_t)cursor[i])
            || !take_bytes(&at, line_end, piece[3], piece_len[3])
            || !take_hex(&at, line_end, hash[i])
            || !take_bytes(&at, line_end, piece[4], piece_len[4])
            || at >= line_end  /* a line that is only its prefix */
            || line_end[-1] != '}'
            || memchr(at, '{', (size_t)(line_end - at)) != NULL
            || memchr(at, '}', (size_t)(line_end - 1 - at)) != NULL) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        marks[3 * i] = at - text;
        if (ids_proven) {
            /* No piece holds the key: it is in the rest or nowhere. */
            const char *key = only_key(at, line_end);
            const char *list = key == NULL ? NULL : key + KEY_LEN;
            if (list != NULL)
                marks[3 * i + 1] = list - text;
            for (Py_ssize_t j = 0; list != NULL && j < per; j++) {
                const int64_t v = expected[i * per + j];
                if (v < 0 || (j > 0 && !take_bytes(&list, line_end, ",", 1))
                    || !take_decimal(&list, line_end, (uint64_t)v))
                    list = NULL;
            }
            if (list == NULL || list >= line_end || *list != ']')
                ids_proven = 0;
            else
                marks[3 * i + 2] = list - text;
        }
        start = stop + 1;
    }

    /* Pass 2: what is left of each line for the parser. */
    Py_ssize_t written = 0;
    dest[written++] = '\n';
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *from = text + marks[3 * i];
        const char *line_end = text + end_at[i];
        dest[written++] = '{';
        if (ids_proven) {
            const char *open = text + marks[3 * i + 1];  /* past the list's '[' */
            memcpy(dest + written, from, (size_t)(open - from));
            written += open - from;
            from = text + marks[3 * i + 2];  /* its ']' */
        }
        memcpy(dest + written, from, (size_t)(line_end - from));
        written += line_end - from;
        dest[written++] = '\n';
    }
    result = Py_BuildValue("(nO)", written, ids_proven ? Py_True : Py_False);

done:
    PyMem_Free(marks);
    release(&block);
    release(&ends);
    release(&steps);
    release(&epochs);
    release(&cursors);
    release(&hashes);
    release(&ids);
    release(&out);
    return result;
}

/* A byte a JSON number may hold. */
static inline int number_byte(char c)
{
    return (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E';
}

static PyObject *number_columns(PyObject *self, PyObject *args)
{
    PyObject *rest_obj, *segments_obj;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OnO", &rest_obj, &n, &segments_obj))
        return NULL;
    if (!PyTuple_Check(segments_obj) || PyTuple_GET_SIZE(segments_obj) < 2) {
        PyErr_SetString(PyExc_TypeError, "segments must be a tuple of at least two bytes");
        return NULL;
    }
    const Py_ssize_t k = PyTuple_GET_SIZE(segments_obj);
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *seg = PyTuple_GET_ITEM(segments_obj, j);
        /* A segment that ended in a number byte would let the value before it end early. */
        if (!PyBytes_Check(seg) || PyBytes_GET_SIZE(seg) == 0
            || number_byte(PyBytes_AS_STRING(seg)[0])) {
            PyErr_SetString(PyExc_ValueError, "segments must be non-empty bytes, each starting "
                            "with a byte no number holds");
            return NULL;
        }
    }
    Buffer rest = {0};
    if (get_buffer(rest_obj, &rest, 0, 1, "rest") < 0)
        return NULL;
    PyObject *result = NULL;
    const char *at = rest.view.buf, *end = at + rest.view.len;
    /* The numbers back to back, each followed by a comma (the last one's becomes ']'). */
    PyObject *out = PyBytes_FromStringAndSize(NULL, rest.view.len + 1);
    if (out == NULL)
        goto done;
    char *dest = PyBytes_AS_STRING(out);
    Py_ssize_t written = 0;
    dest[written++] = '[';
    if (!take_bytes(&at, end, "\n", 1))
        goto refused;
    for (Py_ssize_t i = 0; i < n; i++) {
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *seg = PyTuple_GET_ITEM(segments_obj, j);
            if (!take_bytes(&at, end, PyBytes_AS_STRING(seg), PyBytes_GET_SIZE(seg)))
                goto refused;
            if (j == k - 1)
                break;
            const char *number = at;
            while (at < end && number_byte(*at))
                at++;
            if (at == number)
                goto refused;
            memcpy(dest + written, number, (size_t)(at - number));
            written += at - number;
            dest[written++] = ',';
        }
        if (!take_bytes(&at, end, "\n", 1))
            goto refused;
    }
    if (at != end || written == 1)
        goto refused;
    dest[written - 1] = ']';
    if (_PyBytes_Resize(&out, written) == 0)
        result = out;
    out = NULL;
    goto done;
refused:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(out);
    release(&rest);
    return result;
}

static PyMethodDef methods[] = {
    {"number_columns", number_columns, METH_VARARGS,
     "The numbers of n lines of one shape, as the bytes of one JSON array; or None."},
    {"prove_block", prove_block, METH_VARARGS,
     "Prove a block's prefixes and ID lists; return (rest size, ids proven) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "verifier._native",
    "The scan's fast path over one block, compiled (see verifier/_scan.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
