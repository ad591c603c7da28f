/* The hot loop of exporter/sources/promtext.py, in C: optional, with a pure-Python twin.
 *
 * scan(text, start, end, prefix, blocks) reads the lines of one family block
 * text[start:end] that begin with `prefix` ("name{") and returns
 * (series, unknown_blocks, duplicates) where series maps blocks[block] -> float,
 * block being the label text between the prefix and the line's last "} ".
 * It returns None, so the caller
 * takes its strict regex path, on anything that is not the plain layout: a
 * label-less sample of the name, a line without "} ", a value that is not a
 * plain number (timestamps, "\r", "Infinity"), or text that is not 1-byte
 * (latin-1/ASCII) Unicode. Blocks not yet in `blocks` are returned for the
 * caller to validate with the full label grammar; nothing here guesses.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static int plain_char(char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' ||
           c == 'N' || c == 'n' || c == 'A' || c == 'a' || c == 'I' || c == 'i' || c == 'F' || c == 'f';
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *text, *prefix, *heads;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "UnnUO!", &text, &start, &end, &prefix, &PyDict_Type, &heads)) {
        return NULL;
    }
    if (PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND || PyUnicode_KIND(prefix) != PyUnicode_1BYTE_KIND) {
        Py_RETURN_NONE;
    }
    const char *s = (const char *)PyUnicode_1BYTE_DATA(text);
    const char *p = (const char *)PyUnicode_1BYTE_DATA(prefix);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), plen = PyUnicode_GET_LENGTH(prefix);
    if (start < 0 || end > n || start > end || plen < 2 || p[plen - 1] != '{') {
        Py_RETURN_NONE;
    }
    PyObject *out = PyDict_New();
    PyObject *unknown = PyList_New(0);
    Py_ssize_t duplicates = 0;
    if (out == NULL || unknown == NULL) {
        goto error;
    }
    Py_ssize_t i = start;
    while (i < end) {
        const char *line = s + i;
        const char *nl = memchr(line, '\n', (size_t)(end - i));
        Py_ssize_t len = nl ? nl - line : end - i;
        i += len + 1;
        if (len < plen || memcmp(line, p, (size_t)(plen - 1)) != 0) {
            continue; /* another family's line, a comment, a blank line */
        }
        if (line[plen - 1] != '{') {
            if (line[plen - 1] == ' ' || line[plen - 1] == '\t') {
                goto fallback; /* a label-less sample of this name */
            }
            continue; /* a longer name sharing the prefix (name_count...) */
        }
        Py_ssize_t j = len - 1; /* find the last "} " */
        while (j > plen && !(line[j] == ' ' && line[j - 1] == '}')) {
            j--;
        }
        if (j <= plen) {
            goto fallback;
        }
        const char *v = line + j + 1;
        Py_ssize_t vlen = len - j - 1;
        if (vlen <= 0 || vlen > 63) {
            goto fallback;
        }
        char buf[64];
        for (Py_ssize_t k = 0; k < vlen; k++) {
            if (!plain_char(v[k])) {
                goto fallback;
            }
            buf[k] = v[k];
        }
        buf[vlen] = '\0';
        char *endp = NULL;
        double value = PyOS_string_to_double(buf, &endp, NULL);
        if (endp != buf + vlen || (value == -1.0 && PyErr_Occurred())) {
            PyErr_Clear();
            goto fallback;
        }
        PyObject *head = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, line + plen, j - 1 - plen);
        if (head == NULL) {
            goto error;
        }
        PyObject *key = PyDict_GetItemWithError(heads, head); /* borrowed */
        if (key == NULL) {
            if (PyErr_Occurred() || PyList_Append(unknown, head) < 0) {
                Py_DECREF(head);
                goto error;
            }
            Py_DECREF(head);
            continue;
        }
        Py_DECREF(head);
        if (key == Py_None) {
            continue; /* a series the catalog reads no value of (an unselected quantile) */
        }
        int seen = PyDict_Contains(out, key);
        PyObject *f = PyFloat_FromDouble(value);
        if (seen < 0 || f == NULL || PyDict_SetItem(out, key, f) < 0) {
            Py_XDECREF(f);
            goto error;
        }
        Py_DECREF(f);
        duplicates += seen;
    }
    return Py_BuildValue("(NNn)", out, unknown, duplicates);
fallback:
    Py_DECREF(out);
    Py_DECREF(unknown);
    Py_RETURN_NONE;
error:
    Py_XDECREF(out);
    Py_XDECREF(unknown);
    return NULL;
}

/* names(text) -> set of the sample names that start a line (up to '{', blank, '\r' or end of line),
 * comment and blank lines skipped; None for text that is not 1-byte Unicode. One pass over the body
 * tells which wanted names without a # TYPE line are present, instead of one search per name.
 * Lines repeat a few names (a summary cycles x_count, x_sum, x): the last RECENT names are
 * compared in place before a new string is made. */
#define RECENT 8

static int starts_with_name(const char *line, Py_ssize_t left, const char *name, Py_ssize_t len) {
    if (left <= len || memcmp(line, name, (size_t)len) != 0) {
        return 0;
    }
    char c = line[len];
    return c == '{' || c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static PyObject *names(PyObject *self, PyObject *args) {
    PyObject *text;
    if (!PyArg_ParseTuple(args, "U", &text)) {
        return NULL;
    }
    if (PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND) {
        Py_RETURN_NONE;
    }
    const char *s = (const char *)PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i = 0;
    PyObject *out = PySet_New(NULL);
    if (out == NULL) {
        return NULL;
    }
    const char *recent[RECENT];
    Py_ssize_t recent_len[RECENT];
    int nrecent = 0, next = 0, hit = 0;
    while (i < n) {
        const char *line = s + i;
        int seen = 0;
        for (int t = 0; t < nrecent && !seen; t++) { /* the last name that matched first */
            int r = (hit + t) % nrecent;
            if (starts_with_name(line, n - i, recent[r], recent_len[r])) {
                seen = 1;
                hit = r;
            }
        }
        const char *nl = memchr(line, '\n', (size_t)(n - i));
        Py_ssize_t len = nl ? nl - line : n - i;
        i += len + 1;
        if (seen || len == 0 || line[0] == '#') {
            continue;
        }
        Py_ssize_t k = 0;
        while (k < len && line[k] != '{' && line[k] != ' ' && line[k] != '\t' && line[k] != '\r') {
            k++;
        }
        if (k == 0) {
            continue;
        }
        PyObject *name = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, line, k);
        if (name == NULL || PySet_Add(out, name) < 0) {
            Py_XDECREF(name);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(name);
        recent[next] = line;
        recent_len[next] = k;
        next = (next + 1) % RECENT;
        if (nrecent < RECENT) {
            nrecent++;
        }
    }
    return out;
}


/* labels(block, strings): the pairs of a label block in the plain layout Triton writes
 * (name="value",name="value" with no blanks and no backslash or newline in a value; a trailing comma is
 * allowed), sorted by name, names and values interned through the dict `strings`, and whether the block is
 * spelt as its LabelSet key (exporter/series: its names in written order, sorted but `le` and `quantile`
 * last, and no trailing comma), so the caller can take the block as the key. None for anything else
 * (blanks, escapes, a repeated name, more than MAX_PAIRS pairs, text that is not 1-byte Unicode): the
 * caller's full grammar (promtext.parse_labels) reads those, and names the error. */
#define MAX_PAIRS 32

static int written_last(const char *name, Py_ssize_t len) {
    return (len == 2 && memcmp(name, "le", 2) == 0) || (len == 8 && memcmp(name, "quantile", 8) == 0);
}

/* Whether name a comes before name b in a key's written order. */
static int written_before(const char *a, Py_ssize_t a_len, const char *b, Py_ssize_t b_len) {
    int a_last = written_last(a, a_len), b_last = written_last(b, b_len);
    if (a_last != b_last) {
        return b_last;
    }
    Py_ssize_t m = a_len < b_len ? a_len : b_len;
    int c = memcmp(a, b, (size_t)m);
    return c < 0 || (c == 0 && a_len < b_len);
}

static int name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

static PyObject *interned(PyObject *strings, const char *data, Py_ssize_t len) {
    PyObject *made = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, data, len);
    if (made == NULL) {
        return NULL;
    }
    PyObject *kept = PyDict_SetDefault(strings, made, made); /* borrowed */
    Py_XINCREF(kept);
    Py_DECREF(made);
    return kept;
}

static PyObject *labels(PyObject *self, PyObject *args) {
    PyObject *block, *strings;
    if (!PyArg_ParseTuple(args, "UO!", &block, &PyDict_Type, &strings)) {
        return NULL;
    }
    if (PyUnicode_KIND(block) != PyUnicode_1BYTE_KIND) {
        Py_RETURN_NONE;
    }
    const char *s = (const char *)PyUnicode_1BYTE_DATA(block);
    Py_ssize_t n = PyUnicode_GET_LENGTH(block), i = 0;
    Py_ssize_t name_at[MAX_PAIRS], name_len[MAX_PAIRS], value_at[MAX_PAIRS], value_len[MAX_PAIRS];
    int count = 0;
    while (i < n) {
        if (count == MAX_PAIRS || !name_start(s[i])) {
            Py_RETURN_NONE;
        }
        Py_ssize_t a = i;
        while (i < n && name_char(s[i])) {
            i++;
        }
        if (i + 1 >= n || s[i] != '=' || s[i + 1] != '"') {
            Py_RETURN_NONE;
        }
        name_at[count] = a;
        name_len[count] = i - a;
        i += 2;
        Py_ssize_t v = i;
        while (i < n && s[i] != '"' && s[i] != '\\' && s[i] != '\n') {
            i++;
        }
        if (i >= n || s[i] != '"') {
            Py_RETURN_NONE;
        }
        value_at[count] = v;
        value_len[count] = i - v;
        count++;
        i++;
        if (i < n) {
            if (s[i] != ',') {
                Py_RETURN_NONE;
            }
            i++;
        }
    }
    int spelt = n == 0 || s[n - 1] == '"';
    for (int k = 1; k < count && spelt; k++) {
        spelt = written_before(s + name_at[k - 1], name_len[k - 1], s + name_at[k], name_len[k]);
    }
    int order[MAX_PAIRS];
    for (int k = 0; k < count; k++) { /* insertion sort by name; names are ASCII, so bytes order them */
        int j = k;
        while (j > 0) {
            int o = order[j - 1];
            Py_ssize_t m = name_len[o] < name_len[k] ? name_len[o] : name_len[k];
            int c = memcmp(s + name_at[o], s + name_at[k], (size_t)m);
            if (c == 0 && name_len[o] == name_len[k]) {
                Py_RETURN_NONE; /* a repeated name */
            }
            if (c < 0 || (c == 0 && name_len[o] < name_len[k])) {
                break;
            }
            order[j] = o;
            j--;
        }
        order[j] = k;
    }
    PyObject *out = PyTuple_New(count);
    if (out == NULL) {
        return NULL;
    }
    for (int k = 0; k < count; k++) {
        int o = order[k];
        PyObject *name = interned(strings, s + name_at[o], name_len[o]);
        PyObject *value = name == NULL ? NULL : interned(strings, s + value_at[o], value_len[o]);
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, name, value);
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (pair == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, k, pair);
    }
    PyObject *result = Py_BuildValue("(NO)", out, spelt ? Py_True : Py_False);
    return result;
}

/* read_ascii(readinto, size): a body of `size` bytes read straight into a new str, which it returns when
 * the body came whole and is ASCII (Triton's /metrics is). Otherwise the bytes read, for the caller to
 * decode (a short read returns fewer than `size`). The usual way, bytes then decode, holds the body twice:
 * 10 MB at 1000 LLM models, the sidecar's peak.
 *
 * `readinto` writes into a memoryview of a Window over the str's memory. The Window counts the views of
 * it and refuses new ones between calls, so the str is returned (or freed) only when no view of its
 * memory is left: a view kept past a call is an error, and the str is then never freed. */
typedef struct {
    PyObject_HEAD
    char *data; /* NULL between calls of readinto */
    Py_ssize_t len;
    Py_ssize_t exports;
} Window;

static int window_getbuffer(PyObject *obj, Py_buffer *view, int flags) {
    Window *self = (Window *)obj;
    if (self->data == NULL) {
        PyErr_SetString(PyExc_BufferError, "read_ascii: the window is closed");
        return -1;
    }
    if (PyBuffer_FillInfo(view, obj, self->data, self->len, 0, flags) < 0) {
        return -1;
    }
    self->exports++;
    return 0;
}

static void window_releasebuffer(PyObject *obj, Py_buffer *view) {
    (void)view;
    ((Window *)obj)->exports--;
}

static PyBufferProcs window_buffer = {window_getbuffer, window_releasebuffer};

static PyTypeObject WindowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exporter.sources._scan.Window",
    .tp_basicsize = sizeof(Window),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer = &window_buffer,
};

static int all_ascii(const char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    unsigned long long acc = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned long long w;
        memcpy(&w, s + i, 8);
        acc |= w;
    }
    for (; i < n; i++) {
        acc |= (unsigned char)s[i];
    }
    return (acc & 0x8080808080808080ULL) == 0;
}

static PyObject *read_ascii(PyObject *self, PyObject *args) {
    PyObject *readinto;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "On", &readinto, &size)) {
        return NULL;
    }
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "read_ascii: negative size");
        return NULL;
    }
    PyObject *text = PyUnicode_New(size, 127);
    if (text == NULL) {
        return NULL;
    }
    char *data = (char *)PyUnicode_1BYTE_DATA(text);
    Window *window = PyObject_New(Window, &WindowType);
    if (window == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    window->data = NULL;
    window->len = 0;
    window->exports = 0;
    Py_ssize_t got = 0;
    while (got < size) {
        window->data = data + got;
        window->len = size - got;
        PyObject *view = PyMemoryView_FromObject((PyObject *)window);
        PyObject *n = view == NULL ? NULL : PyObject_CallOneArg(readinto, view);
        Py_XDECREF(view);
        window->data = NULL;
        if (window->exports != 0) {
            /* A view of the str's memory outlived the call: the str is left allocated, never handed out. */
            Py_XDECREF(n);
            Py_DECREF(window);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_BufferError, "read_ascii: readinto kept a view of its buffer");
            }
            return NULL;
        }
        Py_ssize_t k = n == NULL ? -1 : (n == Py_None ? 0 : PyLong_AsSsize_t(n));
        Py_XDECREF(n);
        if (k < 0 || k > size - got) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "read_ascii: readinto returned an impossible count");
            }
            Py_DECREF(window);
            Py_DECREF(text);
            return NULL;
        }
        if (k == 0) {
            break; /* the end of the stream, early */
        }
        got += k;
    }
    Py_DECREF(window);
    if (got == size && all_ascii(data, size)) {
        return text;
    }
    PyObject *raw = PyBytes_FromStringAndSize(data, got);
    Py_DECREF(text);
    return raw;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Read one family block's plain lines (see exporter/sources/promtext.py)."},
    {"names", names, METH_VARARGS, "The sample names that start a line (see exporter/sources/promtext.py)."},
    {"labels", labels, METH_VARARGS,
     "A plain label block's sorted, interned pairs, and whether it is spelt as its key (see exporter/sources/promtext.py)."},
    {"read_ascii", read_ascii, METH_VARARGS, "A sized body read straight into a str when it is ASCII, else its bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "exporter.sources._scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&WindowType) < 0) {
        return NULL;
    }
    return PyModule_Create(&module);
}
