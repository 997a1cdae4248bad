/* The writer's Merkle hashing in one C call per workspace and batch (hub.core.merkle).
 *
 * Why C: under the GIL, inside every commit, the Python loop around the two SHA-256 calls
 * an event needs (its leaf, and on average one node) cost more than the hashing itself
 * (docs/audit.md, "Costs"; docs/architecture.md, "The one C module"). This is that loop
 * and nothing else; the hashing is OpenSSL's libcrypto (EVP, the library Python's hashlib
 * uses), and the GIL is released while it hashes a large input (RELEASE_GIL_BYTES). hub.core.merkle.extend_canonical_py is the same function in
 * Python: the reference the tests compare this one with, and what runs where this
 * extension was not built (it is optional: pip install needs no compiler).
 *
 * extend(frontier, size, canonical, grouped) -> (hashes, new frontier)
 *   frontier   the compact range of the tree of `size` leaves (32-byte hashes, largest
 *              subtree first: one per set bit of size)
 *   canonical  each new event's canonical bytes, in seq order
 *   grouped    True: one item per event, the hashes its leaf stores concatenated (its leaf
 *              hash, then each subtree it completes); False: every stored hash on its own
 * Raises ValueError for a frontier that does not match the size, TypeError for an item
 * that is not bytes.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>
#include <string.h>

#define HASH 32
#define MAX_LEVELS 64 /* a size is a 64-bit count: at most 64 subtrees in a frontier */
/* Release the GIL only for this much input or more. A thread that releases it while another
 * is running Python waits up to the switch interval (5 ms) to get it back, so a writer's
 * batch (a few KiB: microseconds of hashing) keeps it; a tree rebuilt from a page of events
 * does not. */
#define RELEASE_GIL_BYTES (256 * 1024)

typedef struct {
    EVP_MD *sha256; /* fetched once: an implicit fetch per digest costs more than the hash */
} state;

static state *
module_state(PyObject *module)
{
    return (state *)PyModule_GetState(module);
}

/* SHA-256(prefix || a || b) into out; b may be NULL. Returns 0 on failure. */
static int
digest(EVP_MD_CTX *ctx, const EVP_MD *md, unsigned char prefix, const void *a, size_t alen,
       const void *b, size_t blen, unsigned char *out)
{
    return EVP_DigestInit_ex(ctx, md, NULL) && EVP_DigestUpdate(ctx, &prefix, 1) &&
           EVP_DigestUpdate(ctx, a, alen) && (b == NULL || EVP_DigestUpdate(ctx, b, blen)) &&
           EVP_DigestFinal_ex(ctx, out, NULL);
}

static PyObject *
extend(PyObject *module, PyObject *args)
{
    PyObject *frontier_arg, *canonical_arg;
    Py_ssize_t signed_size;
    int grouped;
    if (!PyArg_ParseTuple(args, "OnOp", &frontier_arg, &signed_size, &canonical_arg, &grouped))
        return NULL;
    if (signed_size < 0) {
        PyErr_SetString(PyExc_ValueError, "a tree size is not negative");
        return NULL;
    }
    unsigned long long size = (unsigned long long)signed_size;
    const EVP_MD *md = module_state(module)->sha256;

    unsigned char stack[MAX_LEVELS + 1][HASH];
    PyObject *frontier = PySequence_Fast(frontier_arg, "frontier must be a sequence");
    if (frontier == NULL)
        return NULL;
    Py_ssize_t depth = PySequence_Fast_GET_SIZE(frontier);
    if (depth != __builtin_popcountll(size)) {
        Py_DECREF(frontier);
        PyErr_SetString(PyExc_ValueError, "the frontier does not match the size");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < depth; i++) {
        PyObject *h = PySequence_Fast_GET_ITEM(frontier, i);
        if (!PyBytes_Check(h) || PyBytes_GET_SIZE(h) != HASH) {
            Py_DECREF(frontier);
            PyErr_SetString(PyExc_ValueError, "a frontier hash is not 32 bytes");
            return NULL;
        }
        memcpy(stack[i], PyBytes_AS_STRING(h), HASH);
    }
    Py_DECREF(frontier);

    /* A tuple owns its items: none can go away while the GIL is released. */
    PyObject *canonical = PySequence_Tuple(canonical_arg);
    if (canonical == NULL)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(canonical);
    size_t input = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(canonical, i);
        if (!PyBytes_Check(item)) {
            Py_DECREF(canonical);
            PyErr_SetString(PyExc_TypeError, "canonical bytes must be bytes");
            return NULL;
        }
        input += (size_t)PyBytes_GET_SIZE(item);
    }
    if (size > (unsigned long long)PY_SSIZE_T_MAX - (unsigned long long)count) {
        Py_DECREF(canonical);
        PyErr_SetString(PyExc_OverflowError, "the tree would be too large");
        return NULL;
    }

    /* Appending leaf n stores 1 + trailing-ones(n) hashes: in all, 2*end - popcount(end)
     * minus the same of size (hub.core.merkle.stored_hash_count). */
    unsigned long long end = size + (unsigned long long)count;
    size_t total = (size_t)(2 * end - (unsigned long long)__builtin_popcountll(end)) -
                   (size_t)(2 * size - (unsigned long long)__builtin_popcountll(size));
    unsigned char *hashes = PyMem_Malloc(total ? total * HASH : 1);
    unsigned char *groups = PyMem_Malloc(count ? (size_t)count : 1); /* hashes per event */
    if (hashes == NULL || groups == NULL) {
        PyMem_Free(hashes);
        PyMem_Free(groups);
        Py_DECREF(canonical);
        return PyErr_NoMemory();
    }

    int ok = 1;
    Py_ssize_t top = depth;
    PyThreadState *released = input >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    ok = ctx != NULL;
    unsigned char *out = hashes;
    unsigned long long n = size;
    for (Py_ssize_t i = 0; ok && i < count; i++, n++) {
        PyObject *item = PyTuple_GET_ITEM(canonical, i);
        unsigned char *current = out;
        ok = digest(ctx, md, 0x00, PyBytes_AS_STRING(item), (size_t)PyBytes_GET_SIZE(item),
                    NULL, 0, out);
        out += HASH;
        unsigned char stored = 1;
        for (unsigned long long m = n; ok && (m & 1); m >>= 1) {
            top--;
            ok = digest(ctx, md, 0x01, stack[top], HASH, current, HASH, out);
            current = out;
            out += HASH;
            stored++;
        }
        memcpy(stack[top], current, HASH);
        top++;
        groups[i] = stored;
    }
    EVP_MD_CTX_free(ctx);
    if (released != NULL)
        PyEval_RestoreThread(released);
    Py_DECREF(canonical);

    PyObject *items = NULL, *next = NULL, *result = NULL;
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-256 failed in libcrypto");
        goto done;
    }
    items = PyList_New(grouped ? count : (Py_ssize_t)total);
    next = PyTuple_New(top);
    if (items == NULL || next == NULL)
        goto done;
    const unsigned char *at = hashes;
    Py_ssize_t slot = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int parts = grouped ? 1 : groups[i];
        Py_ssize_t length = grouped ? (Py_ssize_t)groups[i] * HASH : HASH;
        for (int p = 0; p < parts; p++) {
            PyObject *b = PyBytes_FromStringAndSize((const char *)at, length);
            if (b == NULL)
                goto done;
            PyList_SET_ITEM(items, slot++, b);
            at += length;
        }
    }
    for (Py_ssize_t i = 0; i < top; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)stack[i], HASH);
        if (b == NULL)
            goto done;
        PyTuple_SET_ITEM(next, i, b);
    }
    result = PyTuple_Pack(2, items, next);
done:
    Py_XDECREF(items);
    Py_XDECREF(next);
    PyMem_Free(hashes);
    PyMem_Free(groups);
    return result;
}

static PyMethodDef methods[] = {
    {"extend", extend, METH_VARARGS,
     "extend(frontier, size, canonical, grouped) -> (hashes, frontier): see the source."},
    {NULL, NULL, 0, NULL},
};

static int
exec_module(PyObject *module)
{
    state *st = module_state(module);
    st->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (st->sha256 == NULL) {
        PyErr_SetString(PyExc_ImportError, "libcrypto has no SHA256");
        return -1;
    }
    return 0;
}

static void
free_module(void *module)
{
    state *st = module_state((PyObject *)module);
    if (st != NULL && st->sha256 != NULL) {
        EVP_MD_free(st->sha256);
        st->sha256 = NULL;
    }
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hub.core._treehash",
    .m_doc = "The writer's Merkle hashing in C (see hub/core/_treehash.c).",
    .m_size = sizeof(state),
    .m_methods = methods,
    .m_slots = slots,
    .m_free = free_module,
};

PyMODINIT_FUNC
PyInit__treehash(void)
{
    return PyModuleDef_Init(&definition);
}
