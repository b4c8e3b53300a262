/* sim.native._chainhash: chained block hashes in C, for the compiled build.
 *
 * Computes exactly what sim.core.kv.hashing computes in Python for blocks with no
 * extra keys: the hash of a block is BLAKE2b with an 8-byte digest (RFC 7693,
 * unkeyed, no salt or personalization) over
 *
 *     u64 parent | u64 len(content) | content            (little-endian)
 *
 * read back as a little-endian integer, and each block's hash is the next block's
 * parent. The block bytes follow sim.core.tokens' canonical encoding; three entry
 * points take the three shapes of sim.core.tokens.BlockPiece:
 *
 *   chain_bytes(hashes, parent, contents)                 one block per bytes object
 *   chain_stream(hashes, parent, head, start, count, bs)  blocks inside one stream
 *   chain_trace(hashes, parent, prefix, ids, block, length, start, count, bs)
 *                                                         blocks inside a run of trace blocks
 *
 * Each appends one int per block to the list `hashes`. Invariants the Python side
 * relies on: the same inputs give the same ints as the Python code (a test compares
 * both on random pieces), and on any error nothing is half-appended that the caller
 * would keep (the error propagates and the run stops).
 *
 * BLAKE2b is written here from RFC 7693's description; it is not a copy of any
 * implementation.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

/* The message word schedule of each of the 12 rounds (rounds 10 and 11 repeat 0 and 1). */
static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t rotr64(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64_le(const unsigned char *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
#endif
}

static inline void store64_le(unsigned char *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, 8);
#else
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
#endif
}

#define MIX(a, b, c, d, x, y)            \
    do {                                 \
        v[a] = v[a] + v[b] + (x);        \
        v[d] = rotr64(v[d] ^ v[a], 32);  \
        v[c] = v[c] + v[d];              \
        v[b] = rotr64(v[b] ^ v[c], 24);  \
        v[a] = v[a] + v[b] + (y);        \
        v[d] = rotr64(v[d] ^ v[a], 16);  \
        v[c] = v[c] + v[d];              \
        v[b] = rotr64(v[b] ^ v[c], 63);  \
    } while (0)

/* The compression function F on one 128-byte block; `counter` is the byte count so far
 * (messages here are far below 2**64 bytes, so the counter's high word is 0). */
static void blake2b_compress(uint64_t h[8], const unsigned char block[128], uint64_t counter, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++) m[i] = load64_le(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= counter;
    if (last) v[14] = ~v[14];
    /* The 12 rounds spelled out, so every message index is a constant. */
#define ROUND(r)                                                                  \
    do {                                                                          \
        MIX(0, 4, 8, 12, m[blake2b_sigma[r][0]], m[blake2b_sigma[r][1]]);         \
        MIX(1, 5, 9, 13, m[blake2b_sigma[r][2]], m[blake2b_sigma[r][3]]);         \
        MIX(2, 6, 10, 14, m[blake2b_sigma[r][4]], m[blake2b_sigma[r][5]]);        \
        MIX(3, 7, 11, 15, m[blake2b_sigma[r][6]], m[blake2b_sigma[r][7]]);        \
        MIX(0, 5, 10, 15, m[blake2b_sigma[r][8]], m[blake2b_sigma[r][9]]);        \
        MIX(1, 6, 11, 12, m[blake2b_sigma[r][10]], m[blake2b_sigma[r][11]]);      \
        MIX(2, 7, 8, 13, m[blake2b_sigma[r][12]], m[blake2b_sigma[r][13]]);       \
        MIX(3, 4, 9, 14, m[blake2b_sigma[r][14]], m[blake2b_sigma[r][15]]);       \
    } while (0)
    ROUND(0);
    ROUND(1);
    ROUND(2);
    ROUND(3);
    ROUND(4);
    ROUND(5);
    ROUND(6);
    ROUND(7);
    ROUND(8);
    ROUND(9);
    ROUND(10);
    ROUND(11);
#undef ROUND
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* BLAKE2b-64 of data[0:len] as the integer whose little-endian bytes are the digest
 * (the digest is the first 8 bytes of the state, little-endian: the first state word). */
static uint64_t blake2b_64(const unsigned char *data, size_t len) {
    uint64_t h[8];
    memcpy(h, blake2b_iv, sizeof h);
    h[0] ^= 0x01010000ULL ^ 8ULL; /* depth 1, fanout 1, no key, 8-byte digest */
    uint64_t counter = 0;
    while (len > 128) {
        counter += 128;
        blake2b_compress(h, data, counter, 0);
        data += 128;
        len -= 128;
    }
    unsigned char last[128];
    memset(last, 0, sizeof last);
    memcpy(last, data, len);
    counter += len;
    blake2b_compress(h, last, counter, 1);
    return h[0];
}

/* A growable byte buffer whose first 16 bytes are reserved for the block header. */
typedef struct {
    unsigned char *data;
    size_t len, cap;
    unsigned char local[512];
} Buffer;

static void buffer_init(Buffer *b) {
    b->data = b->local;
    b->len = 16;
    b->cap = sizeof b->local;
}

static void buffer_free(Buffer *b) {
    if (b->data != b->local) PyMem_Free(b->data);
}

static int buffer_put(Buffer *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap * 2;
        while (cap < b->len + n) cap *= 2;
        unsigned char *grown = PyMem_Malloc(cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(grown, b->data, b->len);
        buffer_free(b);
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* `_POS.pack(start, length)`: two little-endian signed 64-bit words. */
static int buffer_put_pos(Buffer *b, int64_t start, int64_t length) {
    unsigned char pos[16];
    store64_le(pos, (uint64_t)start);
    store64_le(pos + 8, (uint64_t)length);
    return buffer_put(b, pos, 16);
}

/* Hash the buffer's content under `parent` (filling the reserved header) and append the
 * hash to `hashes`; the buffer is emptied for the next block. Returns the hash via `out`. */
static int finish_block(Buffer *b, uint64_t parent, PyObject *hashes, uint64_t *out) {
    store64_le(b->data, parent);
    store64_le(b->data + 8, (uint64_t)(b->len - 16));
    uint64_t hash = blake2b_64(b->data, b->len);
    b->len = 16;
    PyObject *value = PyLong_FromUnsignedLongLong(hash);
    if (value == NULL) return -1;
    int failed = PyList_Append(hashes, value);
    Py_DECREF(value);
    *out = hash;
    return failed;
}

static int parse_common(PyObject *const *args, PyObject **hashes, uint64_t *parent) {
    if (!PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "hashes must be a list");
        return -1;
    }
    *hashes = args[0];
    *parent = PyLong_AsUnsignedLongLong(args[1]);
    if (*parent == (uint64_t)-1 && PyErr_Occurred()) return -1;
    return 0;
}

static int as_ssize(PyObject *obj, Py_ssize_t *out) {
    *out = PyLong_AsSsize_t(obj);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *chain_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "chain_bytes(hashes, parent, contents)");
        return NULL;
    }
    PyObject *hashes;
    uint64_t parent;
    if (parse_common(args, &hashes, &parent) < 0) return NULL;
    PyObject *contents = args[2];
    if (!PyList_Check(contents)) {
        PyErr_SetString(PyExc_TypeError, "contents must be a list of bytes");
        return NULL;
    }
    Buffer b;
    buffer_init(&b);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(contents); i++) {
        PyObject *item = PyList_GET_ITEM(contents, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "contents must be a list of bytes");
            goto fail;
        }
        if (buffer_put(&b, PyBytes_AS_STRING(item), (size_t)PyBytes_GET_SIZE(item)) < 0) goto fail;
        if (finish_block(&b, parent, hashes, &parent) < 0) goto fail;
    }
    buffer_free(&b);
    Py_RETURN_NONE;
fail:
    buffer_free(&b);
    return NULL;
}

static PyObject *chain_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "chain_stream(hashes, parent, head, start, count, block_size)");
        return NULL;
    }
    PyObject *hashes;
    uint64_t parent;
    Py_ssize_t start, count, block_size;
    if (parse_common(args, &hashes, &parent) < 0) return NULL;
    if (!PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "head must be bytes");
        return NULL;
    }
    if (as_ssize(args[3], &start) < 0 || as_ssize(args[4], &count) < 0 || as_ssize(args[5], &block_size) < 0)
        return NULL;
    const char *head = PyBytes_AS_STRING(args[2]);
    size_t head_len = (size_t)PyBytes_GET_SIZE(args[2]);
    Buffer b;
    buffer_init(&b);
    for (Py_ssize_t j = 0; j < count; j++) {
        if (buffer_put(&b, head, head_len) < 0 || buffer_put_pos(&b, start + j * block_size, block_size) < 0 ||
            finish_block(&b, parent, hashes, &parent) < 0) {
            buffer_free(&b);
            return NULL;
        }
    }
    buffer_free(&b);
    Py_RETURN_NONE;
}

/* The run head of trace block `k`: b"S" + prefix + str(ids[k]) + b"\0" (ids are ints). */
static int put_trace_head(Buffer *b, const char *prefix, size_t prefix_len, PyObject *ids, Py_ssize_t k) {
    PyObject *id = PyTuple_GET_ITEM(ids, k);
    if (!PyLong_CheckExact(id)) {
        PyErr_SetString(PyExc_TypeError, "trace block ids must be ints");
        return -1;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(id, &overflow);
    if (value == -1 && PyErr_Occurred()) return -1;
    char digits[64];
    int n;
    if (overflow) {
        /* Beyond 64 bits: Python's own decimal form (str(id) is what the Python side uses). */
        PyObject *text = PyObject_Str(id);
        if (text == NULL) return -1;
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(text, &size);
        int failed = utf8 == NULL || buffer_put(b, "S", 1) < 0 || buffer_put(b, prefix, prefix_len) < 0 ||
                     buffer_put(b, utf8, (size_t)size) < 0 || buffer_put(b, "", 1) < 0;
        Py_DECREF(text);
        return failed ? -1 : 0;
    }
    n = snprintf(digits, sizeof digits, "%lld", value);
    if (buffer_put(b, "S", 1) < 0 || buffer_put(b, prefix, prefix_len) < 0 || buffer_put(b, digits, (size_t)n) < 0 ||
        buffer_put(b, "", 1) < 0)
        return -1;
    return 0;
}

static PyObject *chain_trace(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "chain_trace(hashes, parent, prefix, ids, block, length, start, count, block_size)");
        return NULL;
    }
    PyObject *hashes;
    uint64_t parent;
    Py_ssize_t block, length, start, count, block_size;
    if (parse_common(args, &hashes, &parent) < 0) return NULL;
    if (!PyBytes_Check(args[2]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "prefix must be bytes and ids a tuple");
        return NULL;
    }
    if (as_ssize(args[4], &block) < 0 || as_ssize(args[5], &length) < 0 || as_ssize(args[6], &start) < 0 ||
        as_ssize(args[7], &count) < 0 || as_ssize(args[8], &block_size) < 0)
        return NULL;
    const char *prefix = PyBytes_AS_STRING(args[2]);
    size_t prefix_len = (size_t)PyBytes_GET_SIZE(args[2]);
    PyObject *ids = args[3];
    Py_ssize_t num_ids = PyTuple_GET_SIZE(ids);
    if (block < 1 || block_size < 1 || start < 0 || count < 0 || start + count * block_size > length ||
        length > num_ids * block) {
        PyErr_SetString(PyExc_ValueError, "chain_trace: blocks outside the run of trace blocks");
        return NULL;
    }
    if (count == 0) Py_RETURN_NONE;
    /* The walk of sim.core.tokens._blocks_of_run: each block is the runs of the trace blocks it
     * touches, each run `head(k) + pack(offset in trace block k, tokens)`. */
    Buffer b, head;
    buffer_init(&b);
    buffer_init(&head);
    head.len = 0;
    Py_ssize_t pos = start;
    Py_ssize_t k_end = (start / block + 1) * block; /* where the trace block holding `pos` ends */
    if (put_trace_head(&head, prefix, prefix_len, ids, start / block) < 0) goto fail;
    for (Py_ssize_t j = 0; j < count; j++) {
        Py_ssize_t end = pos + block_size;
        while (k_end <= end) {
            if (buffer_put(&b, head.data, head.len) < 0 || buffer_put_pos(&b, pos - k_end + block, k_end - pos) < 0)
                goto fail;
            pos = k_end;
            if (pos < length) {
                head.len = 0;
                if (put_trace_head(&head, prefix, prefix_len, ids, pos / block) < 0) goto fail;
                k_end += block;
            }
            if (pos == end) break;
        }
        if (pos < end) {
            if (buffer_put(&b, head.data, head.len) < 0 || buffer_put_pos(&b, pos - k_end + block, end - pos) < 0)
                goto fail;
            pos = end;
        }
        if (finish_block(&b, parent, hashes, &parent) < 0) goto fail;
    }
    buffer_free(&b);
    buffer_free(&head);
    Py_RETURN_NONE;
fail:
    buffer_free(&b);
    buffer_free(&head);
    return NULL;
}

static PyObject *digest(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "digest(data: bytes)");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(
        blake2b_64((const unsigned char *)PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg)));
}

static PyMethodDef methods[] = {
    {"chain_bytes", (PyCFunction)(void (*)(void))chain_bytes, METH_FASTCALL,
     "Append the chained hashes of blocks with these bytes."},
    {"chain_stream", (PyCFunction)(void (*)(void))chain_stream, METH_FASTCALL,
     "Append the chained hashes of consecutive blocks inside one stream."},
    {"chain_trace", (PyCFunction)(void (*)(void))chain_trace, METH_FASTCALL,
     "Append the chained hashes of consecutive blocks inside a run of trace blocks."},
    {"digest", digest, METH_O, "BLAKE2b-64 of bytes, as a little-endian int."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chainhash", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__chainhash(void) { return PyModule_Create(&module); }
