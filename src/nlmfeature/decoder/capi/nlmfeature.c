/*
 * libnlmfeature: the C ABI of nlmfeature (see nlmfeature.h for the contract).
 *
 * Loading goes through Python (nlmfeature._capi.load_model): the library starts an
 * interpreter itself when the process has none, imports the package, fetches a table of
 * nogil C functions (nlm_vtable.h) and releases the GIL.  Scoring calls those functions
 * directly, without the GIL.  Compiled with -fvisibility=hidden: only NLM_API functions
 * are exported.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nlmfeature.h"
#include "nlm_vtable.h"

#define NLM_API __attribute__((visibility("default")))

#ifndef NLM_BUILD_PYTHON
#define NLM_BUILD_PYTHON ""
#endif

struct nlm_model {
    nlm_vt_model* vm;
    uintptr_t address; /* key in nlmfeature._capi._registry */
    int sessions;      /* live sessions (under g_model_lock) */
    int freed;         /* nlm_model_free was called while sessions lived: free with the last */
};

/* Per-sentence memo of span scores (nlm_score_span): a direct-mapped cache of `capacity`
 * slots (a power of two; 64 bytes each at order 5), small enough to stay in the CPU's caches:
 * a beam search repeats an expansion soon after the first (the same hypothesis is expanded by
 * many phrases, the same phrase applied to many hypotheses), so a recent-entries cache keeps
 * most hits at a fraction of the cost of a table of every expansion (measured in Moses: a
 * growing table of all expansions missed main memory on most probes).  A slot is
 * [generation, key length, key..., score (double, 2 words)]; a new key overwrites the slot.
 * The key is everything the span's score depends on (see nlm_score_span), so a hit returns
 * exactly the double a miss computed.  Emptied in O(1) per sentence by bumping the generation. */
typedef struct memo_table {
    int32_t* slots;
    int64_t capacity;       /* slots, a power of two; 0 = memo off */
    uint32_t generation;
    int max_key;            /* key ints that fit a slot */
    int stride;             /* ints per slot: 2 + max_key + 2, rounded up to 16 (64 bytes) */
    int64_t calls, hits;
} memo_table;

struct nlm_session {
    void* cs;
    const struct nlm_model* model;
    int active;
    memo_table memo;
    int timing;        /* NLMFEATURE_TIMING=1: time the scorer's calls (nlm_stats.nlm_ns) */
    int64_t nlm_ns;    /* nanoseconds inside the scorer: scoring, sentence begin and end */
    int64_t cpu_cost;  /* nanoseconds a pair of CPU clock readings costs (subtracted per call) */
    int64_t wall_cost; /* the same for the monotonic clock */
    int64_t call_wall_ns; /* this sentence's sampled wall time in scoring calls (timing_pending) */
    int64_t sent_cpu0, sent_wall0; /* the thread's CPU and the monotonic clock at sentence begin (or creation) */
    int64_t timing_left;  /* scoring calls until the next timed one (NLM_TIMED) */
    int64_t timing_every; /* the calls the next timed one stands for */
    uint64_t timing_rng;  /* state of timing_stride */
    int32_t* src;      /* joint models: the source sentence of nlm_session_begin_source */
    int nsrc;
    int src_cap;
    /* nlm_score_spans: the spans the memo did not answer, their places and scores */
    nlm_vt_span* miss_spans;
    int* miss_index;
    double* miss_out;
    int miss_cap;
};

static __thread char g_error[2048];
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_model_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_init_state = 0;        /* 0 not tried, 1 ready, -1 failed for good */
static char g_init_error[2048];
static const nlm_vtable* g_vt = NULL;
static PyObject* g_capi = NULL;     /* the nlmfeature._capi module */

/* ---- NLMFEATURE_TIMING: the scorer's own time, beside the decoder's --------------------
   Every call into the scorer (scoring, sentence begin and end) goes through these; with
   timing on they add the call's time (the clock's own cost subtracted) to nlm_ns, so a
   benchmark sees what the neural feature costs apart from its effect on the search.
   Scoring calls are sampled: after each timed call the next is drawn 1..2*NLM_TIMING_MEAN-1
   calls ahead (a pseudo-random stride: no period of the decoder's calls aliases with it) and
   counts for the calls since the previous one.  They are timed with the monotonic clock
   (vDSO, ~25 ns a reading); the thread's CPU clock is a system call (~0.7 us on the 2-core
   VM), and reading it around every 16th call added ~3 s of system time to a 100-sentence
   Moses decode -- a fifth of the NLM's cost, in the very runs that measured it.
   So that time the thread waited for a core does not count, a sentence's sampled wall time
   is scaled by the thread's CPU time over the wall time from sentence begin to end (two CPU
   clock readings per sentence).  Sentence begin and end (the persistent cache's reads and
   writes) are always timed, with the thread's CPU clock. */
#define NLM_TIMING_MEAN 16

/* the next sampling stride of a timing session: xorshift64, 1 .. 2 * NLM_TIMING_MEAN - 1 */
static inline int64_t timing_stride(uint64_t* rng) {
    uint64_t x = *rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *rng = x;
    return 1 + (int64_t)(x % (2 * NLM_TIMING_MEAN - 1));
}

static inline int64_t clock_read(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}
static inline int64_t cpu_ns(void) { return clock_read(CLOCK_THREAD_CPUTIME_ID); }
static inline int64_t wall_ns(void) { return clock_read(CLOCK_MONOTONIC); }

/* the median cost of a pair of back-to-back readings of clock c (255 pairs) */
static int64_t clock_pair_cost(clockid_t c) {
    int64_t d[255], t;
    int k, j;
    for (k = 0; k < 255; k++) {
        int64_t a = clock_read(c);
        d[k] = clock_read(c) - a;
        for (j = k; j > 0 && d[j - 1] > d[j]; j--) t = d[j], d[j] = d[j - 1], d[j - 1] = t;
    }
    return d[127];
}

#define NLM_TIMED(session, type, call)                                             \
    do {                                                                           \
        if ((session)->timing && --(session)->timing_left <= 0) {                  \
            int64_t every_ = (session)->timing_every, t0_, d_;                     \
            type r_;                                                               \
            (session)->timing_every = (session)->timing_left =                     \
                timing_stride(&(session)->timing_rng);                             \
            t0_ = wall_ns();                                                       \
            r_ = (call);                                                           \
            d_ = wall_ns() - t0_ - (session)->wall_cost;                           \
            (session)->call_wall_ns += (d_ > 0 ? d_ : 0) * every_;                 \
            return r_;                                                             \
        }                                                                          \
        return (call);                                                             \
    } while (0)
#define NLM_TIMED_ALWAYS(session, type, call)                                      \
    do {                                                                           \
        if ((session)->timing) {                                                   \
            int64_t t0_ = cpu_ns(), d_;                                            \
            type r_ = (call);                                                      \
            d_ = cpu_ns() - t0_ - (session)->cpu_cost;                             \
            (session)->nlm_ns += d_ > 0 ? d_ : 0;                                  \
            return r_;                                                             \
        }                                                                          \
        return (call);                                                             \
    } while (0)

/* the sentence's sampled wall time in scoring calls so far, scaled by the thread's CPU time
   over the wall time since sentence begin (at most 1) */
static int64_t timing_pending(const nlm_session* s) {
    double cpu, wall, r = 1.0;
    if (!s->timing || s->call_wall_ns <= 0) return 0;
    cpu = (double)(cpu_ns() - s->sent_cpu0);
    wall = (double)(wall_ns() - s->sent_wall0);
    if (wall > 0 && cpu >= 0 && cpu < wall) r = cpu / wall;
    return (int64_t)((double)s->call_wall_ns * r);
}

static inline double vt_score(nlm_session* s, const int32_t* ctx, int n, int32_t w) {
    NLM_TIMED(s, double, g_vt->score(s->cs, ctx, n, w));
}

static inline double vt_score_padded(nlm_session* s, const int32_t* ctx, int32_t w) {
    NLM_TIMED(s, double, g_vt->score_padded(s->cs, ctx, w));
}

static inline double vt_joint_score(nlm_session* s, const int32_t* src, int nsrc, int aff,
                                    const int32_t* ctx, int n, int32_t w) {
    NLM_TIMED(s, double, g_vt->joint_score(s->cs, src, nsrc, aff, ctx, n, w));
}

static inline int vt_begin(nlm_session* s, int64_t id) { NLM_TIMED_ALWAYS(s, int, g_vt->begin(s->cs, id)); }

static inline int vt_end(nlm_session* s) { NLM_TIMED_ALWAYS(s, int, g_vt->end(s->cs)); }

static int fail(int status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return status;
}

NLM_API int nlm_abi_version(void) { return NLM_ABI_VERSION; }

NLM_API const char* nlm_last_error(void) { return g_error; }

NLM_API const char* nlm_status_string(int status) {
    switch (status) {
    case NLM_OK: return "ok";
    case NLM_ERR_ARGUMENT: return "invalid argument";
    case NLM_ERR_MODEL: return "bad model file";
    case NLM_ERR_PYTHON: return "Python or the nlmfeature package could not start";
    case NLM_ERR_MEMORY: return "out of memory";
    case NLM_ERR_IO: return "input/output error";
    case NLM_ERR_STATE: return "call out of order";
    case NLM_ERR_ABI: return "library and package versions do not match";
    default: return "unknown status";
    }
}

/* ---- Python --------------------------------------------------------------------------- */

/* The current Python exception as "Type: message" in buf; clears it.  Needs the GIL. */
static void py_error_text(char* buf, size_t n, int* is_memory) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    buf[0] = 0;
    if (is_memory) *is_memory = type && PyErr_GivenExceptionMatches(type, PyExc_MemoryError);
    if (value) {
        PyObject* s = PyObject_Str(value);
        const char* msg = s ? PyUnicode_AsUTF8(s) : NULL;
        const char* tname = type ? ((PyTypeObject*)type)->tp_name : "error";
        if (msg && *msg)
            snprintf(buf, n, "%s", msg);
        else
            snprintf(buf, n, "%s", tname);
        /* name the type when it is not one of nlmfeature's own (which name file and line) */
        if (msg && type && strstr(tname, "Error") && !strstr(tname, "ModelFileError")
            && !strstr(tname, "NLMFeatureError") && !strstr(tname, "InputError")) {
            char tmp[2048];
            snprintf(tmp, sizeof tmp, "%s: %s", tname, buf);
            snprintf(buf, n, "%s", tmp);
        }
        Py_XDECREF(s);
        PyErr_Clear();
    } else {
        snprintf(buf, n, "unknown Python error");
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* Directory holding the nlmfeature package this library belongs to:
 * <parent>/nlmfeature/lib/libnlmfeature.so -> <parent>. */
static int package_parent(char* out, size_t n) {
    Dl_info info;
    char real[PATH_MAX];
    char* slash;
    int i;
    if (!dladdr((void*)&nlm_abi_version, &info) || !info.dli_fname) return -1;
    if (!realpath(info.dli_fname, real)) return -1;
    for (i = 0; i < 3; i++) {
        slash = strrchr(real, '/');
        if (!slash) return -1;
        *slash = 0;
    }
    if (!real[0]) return -1;
    snprintf(out, n, "%s", real);
    return 0;
}

/* Import nlmfeature._capi and fetch its vtable.  Needs the GIL. */
static int import_capi(char* err, size_t n) {
    char parent[PATH_MAX];
    PyObject* cap;
    const nlm_vtable* vt;
    if (package_parent(parent, sizeof parent) == 0) {
        /* make sure this library's own package is the one imported */
        PyObject* path = PySys_GetObject("path"); /* borrowed */
        PyObject* dir = PyUnicode_DecodeFSDefault(parent);
        if (path && dir && PyList_Check(path)) {
            int present = PySequence_Contains(path, dir);
            if (present == 0) PyList_Insert(path, 0, dir);
        }
        Py_XDECREF(dir);
        PyErr_Clear();
    }
    g_capi = PyImport_ImportModule("nlmfeature._capi");
    if (!g_capi) {
        char msg[1800];
        py_error_text(msg, sizeof msg, NULL);
        snprintf(err, n, "cannot import the Python package nlmfeature (%s); install it in the Python "
                         "that built libnlmfeature (%s) or set PYTHONPATH", msg, NLM_BUILD_PYTHON);
        return NLM_ERR_PYTHON;
    }
    cap = PyObject_GetAttrString(g_capi, "VTABLE");
    vt = cap ? (const nlm_vtable*)PyCapsule_GetPointer(cap, "nlmfeature._capi.vtable") : NULL;
    Py_XDECREF(cap);
    if (!vt) {
        PyErr_Clear();
        snprintf(err, n, "the installed nlmfeature package has no C interface table; reinstall it");
        return NLM_ERR_ABI;
    }
    if (vt->version != NLM_VTABLE_VERSION || vt->stat_count != NLM_VT_STAT_COUNT) {
        snprintf(err, n, "libnlmfeature (interface %d) does not match the installed nlmfeature package "
                         "(interface %d); reinstall nlmfeature", NLM_VTABLE_VERSION, (int)vt->version);
        return NLM_ERR_ABI;
    }
    g_vt = vt;
    return NLM_OK;
}

static int start_python(char* err, size_t n) {
    PyStatus status;
    PyConfig config;
    const char* home = getenv("NLMFEATURE_PYTHONHOME");
    const char* exe = getenv("NLMFEATURE_PYTHON");
    char* argv[1] = {"nlmfeature"};
    int rc;
    PyThreadState* ts;
    if (!exe || !*exe) exe = NLM_BUILD_PYTHON;
    /* numpy's BLAS would start worker threads that spin beside the decoder's own threads
       (measured in Moses: 1.6% of a single-threaded decode); the scorer never calls BLAS.
       A user's explicit setting wins. */
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* the decoder owns its signals */
    config.parse_argv = 0;
    status = PyConfig_SetBytesArgv(&config, 1, argv);
    if (!PyStatus_Exception(status) && exe && *exe && access(exe, X_OK) == 0)
        /* locate the standard library and site-packages as that interpreter does (venvs too) */
        status = PyConfig_SetBytesString(&config, &config.program_name, exe);
    if (!PyStatus_Exception(status) && home && *home)
        status = PyConfig_SetBytesString(&config, &config.home, home);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        snprintf(err, n, "cannot start the embedded Python interpreter: %s%s%s",
                 status.func ? status.func : "", status.func ? ": " : "",
                 status.err_msg ? status.err_msg : "unknown error");
        return NLM_ERR_PYTHON;
    }
    rc = import_capi(err, n);
    ts = PyEval_SaveThread(); /* release the GIL for good: decoder threads never need it */
    (void)ts;
    return rc;
}

/* Make sure Python runs and the vtable is known.  Thread-safe. */
static int ensure_python(void) {
    int rc = NLM_OK;
    pthread_mutex_lock(&g_init_lock);
    if (g_init_state == 0) {
        if (!Py_IsInitialized()) {
            rc = start_python(g_init_error, sizeof g_init_error);
            /* an interpreter that failed to start cannot be restarted */
            g_init_state = rc == NLM_OK ? 1 : -1;
        } else {
            PyGILState_STATE st = PyGILState_Ensure();
            rc = import_capi(g_init_error, sizeof g_init_error);
            PyGILState_Release(st);
            g_init_state = rc == NLM_OK ? 1 : 0; /* a host interpreter may be fixed; retry later */
        }
        if (rc != NLM_OK) {
            pthread_mutex_unlock(&g_init_lock);
            return fail(rc, "%s", g_init_error);
        }
    } else if (g_init_state < 0) {
        pthread_mutex_unlock(&g_init_lock);
        return fail(NLM_ERR_PYTHON, "%s", g_init_error);
    }
    pthread_mutex_unlock(&g_init_lock);
    return NLM_OK;
}

/* ---- models --------------------------------------------------------------------------- */

NLM_API void nlm_load_options_init(nlm_load_options* o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->verify = 1;
    o->use_tables = 1;
}

NLM_API int nlm_model_load_ex(const char* path, const nlm_load_options* options, nlm_model** out) {
    nlm_load_options o;
    PyGILState_STATE st;
    PyObject* r;
    struct nlm_model* m;
    int rc;
    if (out) *out = NULL;
    if (!path || !out) return fail(NLM_ERR_ARGUMENT, "nlm_model_load: NULL path or output pointer");
    nlm_load_options_init(&o);
    if (options) {
        if (options->struct_size < sizeof o)
            return fail(NLM_ERR_ARGUMENT, "nlm_model_load: options.struct_size is too small");
        o.verify = options->verify;
        o.use_tables = options->use_tables;
    }
    if (access(path, R_OK) != 0) {
        /* the common mistake, reported without starting Python */
        return fail(NLM_ERR_MODEL, "%s: cannot open model file: %s", path, strerror(errno));
    }
    rc = ensure_python();
    if (rc != NLM_OK) return rc;
    m = (struct nlm_model*)calloc(1, sizeof *m);
    if (!m) return fail(NLM_ERR_MEMORY, "out of memory");
    st = PyGILState_Ensure();
    r = PyObject_CallMethod(g_capi, "load_model", "sii", path, o.verify ? 1 : 0, o.use_tables ? 1 : 0);
    if (!r) {
        int is_memory = 0;
        py_error_text(g_error, sizeof g_error, &is_memory);
        PyGILState_Release(st);
        free(m);
        return is_memory ? NLM_ERR_MEMORY : NLM_ERR_MODEL;
    }
    m->address = (uintptr_t)PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) {
        py_error_text(g_error, sizeof g_error, NULL);
        PyGILState_Release(st);
        free(m);
        return NLM_ERR_PYTHON;
    }
    PyGILState_Release(st);
    m->vm = (nlm_vt_model*)m->address;
    *out = m;
    return NLM_OK;
}

NLM_API int nlm_model_load(const char* path, nlm_model** out) {
    return nlm_model_load_ex(path, NULL, out);
}

/* Release the Python side of a model and the handle (no session uses it any more). */
static void model_release(nlm_model* model) {
    PyGILState_STATE st;
    PyObject* r;
    st = PyGILState_Ensure();
    r = PyObject_CallMethod(g_capi, "free_model", "K", (unsigned long long)model->address);
    if (!r) PyErr_Clear();
    Py_XDECREF(r);
    PyGILState_Release(st);
    free(model);
}

NLM_API void nlm_model_free(nlm_model* model) {
    int live;
    if (!model) return;
    pthread_mutex_lock(&g_model_lock);
    live = model->sessions;
    if (live) model->freed = 1; /* sessions still score with it: the last one frees it */
    pthread_mutex_unlock(&g_model_lock);
    if (!live) model_release(model);
}

NLM_API int nlm_model_order(const nlm_model* model) { return model ? model->vm->order : 0; }

NLM_API int nlm_model_state_size(const nlm_model* model) { return model ? model->vm->order - 1 : 0; }

NLM_API int32_t nlm_model_vocab_size(const nlm_model* model) { return model ? model->vm->vocab_size : 0; }

NLM_API int nlm_model_output_type(const nlm_model* model) { return model ? model->vm->output_type : -1; }

NLM_API const char* nlm_model_checksum(const nlm_model* model) { return model ? model->vm->checksum_hex : ""; }

NLM_API const char* nlm_model_path(const nlm_model* model) { return model ? model->vm->path : ""; }

NLM_API int32_t nlm_word_find(const nlm_model* model, const char* word, size_t len) {
    if (!model || (!word && len)) return -1;
    return g_vt->vocab_find(model->vm, word ? word : "", len);
}

NLM_API int32_t nlm_word_id(const nlm_model* model, const char* word, size_t len) {
    int32_t id = nlm_word_find(model, word, len);
    return id < 0 ? (model ? model->vm->unk : NLM_UNK) : id;
}

NLM_API const char* nlm_vocab_word(const nlm_model* model, int32_t id, size_t* len) {
    const nlm_vt_model* vm;
    if (!model || id < 0 || id >= model->vm->vocab_size) {
        if (len) *len = 0;
        return NULL;
    }
    vm = model->vm;
    if (len) *len = (size_t)(vm->vocab_offsets[id + 1] - vm->vocab_offsets[id]);
    return (const char*)vm->vocab_bytes + vm->vocab_offsets[id];
}

/* ---- sessions ------------------------------------------------------------------------- */

/* ---- span memo ------------------------------------------------------------------------ */

static inline uint64_t memo_hash(const int32_t* k, int n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    int i;
    for (i = 0; i < n; i++) {
        h ^= (uint32_t)k[i];
        h *= 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 29;
    }
    return h ^ (h >> 32);
}

static void memo_clear(memo_table* t) {
    if (!t->capacity) return;
    if (++t->generation == 0) { /* wrapped: really wipe */
        memset(t->slots, 0, (size_t)t->capacity * (size_t)t->stride * sizeof(int32_t));
        t->generation = 1;
    }
}

/* The slot of `key` (n ints): found = 1 if it holds the key, else it is the slot to overwrite. */
static inline int32_t* memo_probe(memo_table* t, const int32_t* key, int n, int* found) {
    int32_t* p = t->slots + (memo_hash(key, n) & (uint64_t)(t->capacity - 1)) * t->stride;
    *found = (uint32_t)p[0] == t->generation && p[1] == n &&
             memcmp(p + 2, key, sizeof(int32_t) * (size_t)n) == 0;
    return p;
}

NLM_API void nlm_session_options_init(nlm_session_options* o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->cache_entries = NLM_DEFAULT_CACHE_ENTRIES;
    o->ngram_cache_entries = -1;
    o->persistent_cache = NULL;
    o->persistent_max_bytes = 0;
    o->quiet = 0;
    o->context_cache = -1;
    o->span_memo_entries = -1;
}

NLM_API int nlm_session_new(const nlm_model* model, const nlm_session_options* options, nlm_session** out) {
    nlm_session_options o;
    nlm_vt_session_opts vo;
    struct nlm_session* s;
    char err[NLM_VT_ERRLEN];
    if (out) *out = NULL;
    if (!model || !out) return fail(NLM_ERR_ARGUMENT, "nlm_session_new: NULL model or output pointer");
    nlm_session_options_init(&o);
    if (options) {
        /* callers built against an older header pass a shorter struct: later fields keep
           their defaults */
        if (options->struct_size < offsetof(nlm_session_options, span_memo_entries))
            return fail(NLM_ERR_ARGUMENT, "nlm_session_new: options.struct_size is too small");
        memcpy(&o, options, options->struct_size < sizeof o ? options->struct_size : sizeof o);
        o.struct_size = sizeof o;
    }
    if (o.cache_entries < 0 || o.ngram_cache_entries < -1 || o.span_memo_entries < -1)
        return fail(NLM_ERR_ARGUMENT, "nlm_session_new: negative cache size");
    /* whole cache lines: sessions of different threads never share one */
    s = (struct nlm_session*)aligned_alloc(64, (sizeof *s + 63) & ~(size_t)63);
    if (s) memset(s, 0, sizeof *s);
    if (!s) return fail(NLM_ERR_MEMORY, "out of memory");
    vo.cache_entries = o.cache_entries;
    vo.ngram_cache_entries = o.ngram_cache_entries;
    vo.persistent_dir = o.persistent_cache;
    vo.persistent_max_bytes = o.persistent_max_bytes;
    vo.quiet = o.quiet;
    vo.context_cache = o.context_cache;
    vo.persistent_policy = -1; /* NLMFEATURE_PERSISTENT_CACHE, default auto */
    err[0] = 0;
    s->cs = g_vt->session_new(model->vm, &vo, err, sizeof err);
    if (!s->cs) {
        free(s);
        if (strstr(err, "memory")) return fail(NLM_ERR_MEMORY, "%s", err);
        return fail(NLM_ERR_IO, "%s", err);
    }
    s->model = model;
    if (getenv("NLMFEATURE_TIMING") && strcmp(getenv("NLMFEATURE_TIMING"), "1") == 0) {
        /* what one timed call adds: the median of 255 back-to-back reading pairs */
        s->timing = 1;
        s->cpu_cost = clock_pair_cost(CLOCK_THREAD_CPUTIME_ID);
        s->wall_cost = clock_pair_cost(CLOCK_MONOTONIC);
        s->sent_cpu0 = cpu_ns();   /* (scoring before any nlm_session_begin: since creation) */
        s->sent_wall0 = wall_ns();
        s->timing_rng = 0x9E3779B97F4A7C15ULL;
        s->timing_every = s->timing_left = timing_stride(&s->timing_rng);
    }
    s->memo.max_key = 1 + (model->vm->order - 1) + NLM_SPAN_MAX_WORDS;
    s->memo.stride = (2 + s->memo.max_key + 2 + 15) & ~15;
    s->memo.generation = 1;
    {
        int64_t want = o.span_memo_entries < 0 ? NLM_SPAN_MEMO_DEFAULT : o.span_memo_entries, cap = 1;
        size_t bytes;
        if (want > ((int64_t)1 << 26)) want = (int64_t)1 << 26;
        while (cap < want) cap <<= 1;
        if (want > 0) {
            bytes = (size_t)cap * (size_t)s->memo.stride * sizeof(int32_t);
            s->memo.slots = (int32_t*)aligned_alloc(64, bytes);
            if (!s->memo.slots) {
                g_vt->session_free(s->cs);
                free(s);
                return fail(NLM_ERR_MEMORY, "out of memory");
            }
            memset(s->memo.slots, 0, bytes);
            s->memo.capacity = cap;
        }
    }
    pthread_mutex_lock(&g_model_lock);
    ((struct nlm_model*)model)->sessions++;
    pthread_mutex_unlock(&g_model_lock);
    *out = s;
    return NLM_OK;
}

NLM_API void nlm_session_free(nlm_session* session) {
    struct nlm_model* m;
    int release;
    if (!session) return;
    g_vt->session_free(session->cs);
    free(session->memo.slots);
    m = (struct nlm_model*)session->model;
    free(session->src);
    free(session->miss_spans);
    free(session->miss_index);
    free(session->miss_out);
    free(session);
    pthread_mutex_lock(&g_model_lock);
    release = --m->sessions == 0 && m->freed;
    pthread_mutex_unlock(&g_model_lock);
    if (release) model_release(m);
}

NLM_API int nlm_session_begin(nlm_session* session, int64_t sentence_id) {
    int rc;
    if (!session) return fail(NLM_ERR_ARGUMENT, "nlm_session_begin: NULL session");
    rc = vt_begin(session, sentence_id);
    if (rc == -2) {
        session->active = 0;
        return fail(NLM_ERR_MODEL, "%s: the model file was changed in place after it was loaded (its size "
                                   "or modification time differ); this session now scores NaN.  Replace a "
                                   "model by writing the new file next to it and renaming it over the old "
                                   "one (mv), never by copying over it; then reload it.",
                    session->model->vm->path);
    }
    memo_clear(&session->memo);
    session->nsrc = 0;  /* joint models: nlm_session_begin_source gives the source */
    if (session->timing) {
        session->nlm_ns += timing_pending(session);  /* (calls scored outside a sentence) */
        session->call_wall_ns = 0;
        session->sent_cpu0 = cpu_ns();
        session->sent_wall0 = wall_ns();
    }
    session->active = 1;
    return NLM_OK;
}

NLM_API int nlm_session_end(nlm_session* session) {
    if (!session) return fail(NLM_ERR_ARGUMENT, "nlm_session_end: NULL session");
    if (!session->active) return fail(NLM_ERR_STATE, "nlm_session_end: no sentence was begun");
    session->active = 0;
    session->nlm_ns += timing_pending(session);
    session->call_wall_ns = 0;
    if (vt_end(session) != 0)
        return fail(NLM_ERR_IO, "could not write the persistent cache file of this sentence "
                                "(see the warning on stderr)");
    return NLM_OK;
}

NLM_API double nlm_score(nlm_session* session, const int32_t* context, int n, int32_t word) {
    static const int32_t none[1] = {0};
    if (!session) { fail(NLM_ERR_ARGUMENT, "nlm_score: NULL session"); return NAN; }
    if (n < 0) { fail(NLM_ERR_ARGUMENT, "nlm_score: negative context length n = %d", n); return NAN; }
    if (n && !context) { fail(NLM_ERR_ARGUMENT, "nlm_score: NULL context with n = %d", n); return NAN; }
    return vt_score(session, n ? context : none, n, word);
}

NLM_API double nlm_score_partial(nlm_session* session, const int32_t* context, int n, int32_t word,
                                 int sentence_start) {
    int32_t buf[NLM_VT_MAX_ORDER + 1];
    const nlm_vt_model* vm;
    int i;
    if (!session) { fail(NLM_ERR_ARGUMENT, "nlm_score_partial: NULL session"); return NAN; }
    if (n < 0) { fail(NLM_ERR_ARGUMENT, "nlm_score_partial: negative context length n = %d", n); return NAN; }
    if (n && !context) { fail(NLM_ERR_ARGUMENT, "nlm_score_partial: NULL context with n = %d", n); return NAN; }
    vm = session->model->vm;
    if (!sentence_start || n >= vm->order - 1 || (n > 0 && context[0] == vm->bos))
        return nlm_score(session, context, n, word);
    /* the context starts the sentence: put <s> before it (n < order-1 <= 15: it fits) */
    buf[0] = vm->bos;
    for (i = 0; i < n; i++) buf[i + 1] = context[i];
    return vt_score(session, buf, n + 1, word);
}

NLM_API double nlm_score_padded(nlm_session* session, const int32_t* context, int32_t word) {
    static const int32_t none[NLM_VT_MAX_ORDER] = {0};
    if (!session) { fail(NLM_ERR_ARGUMENT, "nlm_score_padded: NULL session"); return NAN; }
    /* a context holds order-1 ids and a joint model's window: only an empty one may be NULL */
    if (!context && (session->model->vm->order > 1 || session->model->vm->src_window > 0)) {
        fail(NLM_ERR_ARGUMENT, "nlm_score_padded: NULL context");
        return NAN;
    }
    return vt_score_padded(session, context ? context : none, word);
}

NLM_API double nlm_score_sequence(nlm_session* session, const int32_t* context, int nctx,
                                  const int32_t* words, int n, double* scores) {
    int32_t stack[256];
    int32_t* hist = stack;
    int i, total_len;
    double sum = 0, v;
    if (!session) { fail(NLM_ERR_ARGUMENT, "nlm_score_sequence: NULL session"); return NAN; }
    if (nctx < 0 || n < 0) {
        fail(NLM_ERR_ARGUMENT, "nlm_score_sequence: negative length (nctx = %d, n = %d)", nctx, n);
        return NAN;
    }
    if (n == 0) return 0;
    if (!words || (nctx && !context)) {
        fail(NLM_ERR_ARGUMENT, "nlm_score_sequence: NULL words or context");
        return NAN;
    }
    if (nctx > INT_MAX - n) { fail(NLM_ERR_ARGUMENT, "nlm_score_sequence: too long"); return NAN; }
    /* only the last order-1 context ids matter */
    if (nctx > session->model->vm->order - 1) {
        context += nctx - (session->model->vm->order - 1);
        nctx = session->model->vm->order - 1;
    }
    total_len = nctx + n;
    if (total_len > 256) {
        hist = (int32_t*)malloc(sizeof(int32_t) * (size_t)total_len);
        if (!hist) { fail(NLM_ERR_MEMORY, "out of memory"); return NAN; }
    }
    if (nctx) memcpy(hist, context, sizeof(int32_t) * (size_t)nctx);
    memcpy(hist + nctx, words, sizeof(int32_t) * (size_t)n);
    for (i = 0; i < n; i++) {
        v = vt_score(session, hist, nctx + i, words[i]);
        if (scores) scores[i] = v;
        sum += v;
    }
    if (hist != stack) free(hist);
    return sum;
}

static double span_compute(nlm_session* session, const int32_t* hist, int nhist, int first, int count,
                           int final) {
    NLM_TIMED(session, double, g_vt->score_span(session->cs, hist, nhist, first, count, final, NULL, 0, NULL));
}

/* The span calls' arguments checked, as nlm_score_span documents: hist may be NULL only when
 * nhist is 0, and 0 <= first <= nhist, 0 <= count <= nhist - first; final non-zero is 1.
 * Returns 1 when they are valid, else 0 with nlm_last_error set (the caller returns NaN). */
static int check_span(const char* who, const int32_t** hist, int nhist, int first, int count,
                      int* final) {
    static const int32_t none[1] = {0};
    if (nhist < 0 || first < 0 || count < 0) {
        fail(NLM_ERR_ARGUMENT, "%s: negative length or offset (nhist = %d, first = %d, count = %d)",
             who, nhist, first, count);
        return 0;
    }
    if (!*hist && nhist) {
        fail(NLM_ERR_ARGUMENT, "%s: NULL history with nhist = %d", who, nhist);
        return 0;
    }
    if (first > nhist || count > nhist - first) {
        fail(NLM_ERR_ARGUMENT, "%s: words %d..%d are outside the history of %d ids", who, first,
             first + count - 1, nhist);
        return 0;
    }
    if (!*hist) *hist = none;
    *final = *final ? 1 : 0;
    return 1;
}

/* the memo key of a span (nlm_score_span): the ids before `first` that the first word's context
 * sees (up to n-1; all of them when fewer, so the <s>/<null> padding is determined), the scored
 * words and, with `final`, every id after them (the </s> context); its length, or 0 when it is
 * longer than a slot holds */
static int span_memo_key(const nlm_session* session, const int32_t* hist, int nhist, int first, int count,
                         int final, int32_t* key) {
    int c = session->model->vm->order - 1;
    int lead = first < c ? first : c;
    int end = final ? nhist : first + count;
    int n = 1 + lead + (end - first);
    if (n > session->memo.max_key) return 0;
    key[0] = lead | (count << 8) | (final << 16);
    memcpy(key + 1, hist + first - lead, sizeof(int32_t) * (size_t)(end - first + lead));
    return n;
}

static void span_memo_store(memo_table* t, const int32_t* key, int n, double v) {
    int found;
    int32_t* slot = memo_probe(t, key, n, &found);
    slot[0] = (int32_t)t->generation;
    slot[1] = n;
    memcpy(slot + 2, key, sizeof(int32_t) * (size_t)n);
    memcpy(slot + 2 + t->max_key, &v, sizeof v);
}

NLM_API double nlm_score_span(nlm_session* session, const int32_t* hist, int nhist, int first, int count,
                              int final) {
    int32_t key[2 + NLM_VT_MAX_ORDER + NLM_SPAN_MAX_WORDS];
    int n, found;
    int32_t* slot;
    double v;
    memo_table* t;
    if (!session) { fail(NLM_ERR_ARGUMENT, "nlm_score_span: NULL session"); return NAN; }
    if (!check_span("nlm_score_span", &hist, nhist, first, count, &final)) return NAN;
    if (!count && !final) return 0;
    t = &session->memo;
    if (!t->capacity || !(n = span_memo_key(session, hist, nhist, first, count, final, key)))
        return span_compute(session, hist, nhist, first, count, final);
    t->calls++;
    slot = memo_probe(t, key, n, &found);
    if (found) {
        t->hits++;
        memcpy(&v, slot + 2 + t->max_key, sizeof v);
        return v;
    }
    v = span_compute(session, hist, nhist, first, count, final);
    span_memo_store(t, key, n, v);
    return v;
}

static int spans_compute(nlm_session* session, const nlm_vt_span* spans, int n, double* out) {
    NLM_TIMED(session, int, (g_vt->score_spans(session->cs, spans, n, out), 0));
}

NLM_API int nlm_score_spans(nlm_session* session, const nlm_span* spans, int n, double* out) {
    int32_t key[2 + NLM_VT_MAX_ORDER + NLM_SPAN_MAX_WORDS];
    int i, j, m = 0, klen, found, status = NLM_OK, first_bad = -1;
    memo_table* t;
    if (!session) return fail(NLM_ERR_ARGUMENT, "nlm_score_spans: NULL session");
    if (n < 0) return fail(NLM_ERR_ARGUMENT, "nlm_score_spans: negative count n = %d", n);
    if (n == 0) return NLM_OK;
    if (!spans || !out) return fail(NLM_ERR_ARGUMENT, "nlm_score_spans: NULL spans or out with n = %d", n);
    if (n > session->miss_cap) {
        int cap = n > 2 * session->miss_cap ? n : 2 * session->miss_cap;
        nlm_vt_span* a = (nlm_vt_span*)realloc(session->miss_spans, sizeof(nlm_vt_span) * (size_t)cap);
        int* b;
        double* c;
        if (a) session->miss_spans = a;
        b = a ? (int*)realloc(session->miss_index, sizeof(int) * (size_t)cap) : NULL;
        if (b) session->miss_index = b;
        c = b ? (double*)realloc(session->miss_out, sizeof(double) * (size_t)cap) : NULL;
        if (c) session->miss_out = c;
        if (!c) {
            for (i = 0; i < n; i++) out[i] = NAN;
            return fail(NLM_ERR_MEMORY, "nlm_score_spans: out of memory for %d spans", n);
        }
        session->miss_cap = cap;
    }
    t = &session->memo;
    for (i = 0; i < n; i++) {
        const int32_t* hist = spans[i].hist;
        int final = spans[i].final;
        if (!check_span("nlm_score_spans", &hist, spans[i].nhist, spans[i].first, spans[i].count, &final)) {
            out[i] = NAN;
            if (first_bad < 0) first_bad = i;
            continue;
        }
        if (!spans[i].count && !final) { out[i] = 0; continue; }
        if (t->capacity) {
            klen = span_memo_key(session, hist, spans[i].nhist, spans[i].first, spans[i].count, final, key);
            if (klen) {
                int32_t* slot;
                t->calls++;
                slot = memo_probe(t, key, klen, &found);
                if (found) {
                    t->hits++;
                    memcpy(&out[i], slot + 2 + t->max_key, sizeof(double));
                    continue;
                }
            }
        }
        session->miss_spans[m].hist = hist;
        session->miss_spans[m].nhist = spans[i].nhist;
        session->miss_spans[m].first = spans[i].first;
        session->miss_spans[m].count = spans[i].count;
        session->miss_spans[m].final = final;
        session->miss_index[m++] = i;
    }
    if (m) (void)spans_compute(session, session->miss_spans, m, session->miss_out);
    for (j = 0; j < m; j++) {
        const nlm_vt_span* sp = &session->miss_spans[j];
        out[session->miss_index[j]] = session->miss_out[j];
        if (t->capacity && (klen = span_memo_key(session, sp->hist, sp->nhist, sp->first, sp->count, sp->final, key)))
            span_memo_store(t, key, klen, session->miss_out[j]);
    }
    if (first_bad >= 0) {
        /* (check_span wrote the reason; name the span) */
        char reason[sizeof g_error];
        snprintf(reason, sizeof reason, "%s", g_error);
        status = fail(NLM_ERR_ARGUMENT, "span %d: %s", first_bad, reason);
    }
    return status;
}

static int prefetch_compute(nlm_session* session, const int32_t* hist, int nhist, int first, int count,
                            int final) {
    NLM_TIMED(session, int, (g_vt->prefetch_span(session->cs, hist, nhist, first, count, final), 0));
}

NLM_API void nlm_prefetch_span(nlm_session* session, const int32_t* hist, int nhist, int first,
                               int count, int final) {
    if (!session || !check_span("nlm_prefetch_span", &hist, nhist, first, count, &final) ||
        (!count && !final)) return;
    (void)prefetch_compute(session, hist, nhist, first, count, final);
}

/* ---- joint models --------------------------------------------------------------------- */

NLM_API int nlm_model_source_window(const nlm_model* model) { return model ? model->vm->src_window : 0; }

NLM_API int32_t nlm_model_source_vocab_size(const nlm_model* model) {
    return model ? model->vm->src_vocab_size : 0;
}

NLM_API int32_t nlm_source_word_id(const nlm_model* model, const char* word, size_t len) {
    int32_t id;
    if (!model || !model->vm->src_window || (!word && len)) return NLM_UNK;
    id = g_vt->source_find(model->vm, word ? word : "", len);
    return id < 0 ? model->vm->src_unk : id;
}

NLM_API int nlm_session_begin_source(nlm_session* session, int64_t sentence_id, const int32_t* source, int n) {
    int rc;
    if (!session) return fail(NLM_ERR_ARGUMENT, "nlm_session_begin_source: NULL session");
    if (!session->model->vm->src_window)
        return fail(NLM_ERR_ARGUMENT, "nlm_session_begin_source: %s is not a joint model",
                    session->model->vm->path);
    if (n < 0 || (n > 0 && !source))
        return fail(NLM_ERR_ARGUMENT, "nlm_session_begin_source: NULL source or negative length");
    rc = nlm_session_begin(session, sentence_id);
    if (rc != NLM_OK) return rc;
    if (n > session->src_cap) {
        int32_t* p = (int32_t*)realloc(session->src, sizeof(int32_t) * (size_t)n);
        if (!p) { session->active = 0; return fail(NLM_ERR_MEMORY, "out of memory"); }
        session->src = p;
        session->src_cap = n;
    }
    if (n) memcpy(session->src, source, sizeof(int32_t) * (size_t)n);
    session->nsrc = n;
    return NLM_OK;
}

NLM_API double nlm_joint_score(nlm_session* session, const int32_t* context, int n, int32_t word,
                               int affiliation) {
    static const int32_t none[1] = {0};
    if (!session) { fail(NLM_ERR_ARGUMENT, "nlm_joint_score: NULL session"); return NAN; }
    if (n < 0) { fail(NLM_ERR_ARGUMENT, "nlm_joint_score: negative context length n = %d", n); return NAN; }
    if (n && !context) { fail(NLM_ERR_ARGUMENT, "nlm_joint_score: NULL context with n = %d", n); return NAN; }
    /* an affiliation past the sentence is its </s> (clamped where the key is built) */
    return vt_joint_score(session, session->nsrc ? session->src : none, session->nsrc,
                             affiliation, n ? context : none, n, word);
}

NLM_API double nlm_joint_score_span(nlm_session* session, const int32_t* hist, int nhist, int first,
                                    int count, int final, const int32_t* affiliations) {
    static const int32_t none[1] = {0};
    if (!session) { fail(NLM_ERR_ARGUMENT, "nlm_joint_score_span: NULL session"); return NAN; }
    if (!check_span("nlm_joint_score_span", &hist, nhist, first, count, &final)) return NAN;
    if (!count && !final) return 0;
    if (!affiliations) { fail(NLM_ERR_ARGUMENT, "nlm_joint_score_span: NULL affiliations"); return NAN; }
    /* affiliations past the sentence are its </s> (clamped by the scorer, as nlm_joint_score's) */
    NLM_TIMED(session, double, g_vt->score_span(session->cs, hist, nhist, first, count, final,
                                                session->nsrc ? session->src : none, session->nsrc,
                                                affiliations));
}

NLM_API int nlm_session_stats(nlm_session* session, nlm_stats* stats) {
    int64_t v[NLM_VT_STAT_COUNT];
    size_t avail;
    int n, i;
    int64_t* dst;
    if (!session || !stats) return fail(NLM_ERR_ARGUMENT, "nlm_session_stats: NULL argument");
    if (stats->struct_size < sizeof(size_t) + sizeof(int64_t))
        return fail(NLM_ERR_ARGUMENT, "nlm_session_stats: set stats->struct_size = sizeof(nlm_stats)");
    g_vt->stats(session->cs, v, NLM_VT_STAT_COUNT);
    avail = (stats->struct_size - offsetof(nlm_stats, lookups)) / sizeof(int64_t);
    n = avail < NLM_VT_STAT_COUNT ? (int)avail : NLM_VT_STAT_COUNT;
    dst = &stats->lookups;
    for (i = 0; i < n; i++) dst[i] = v[i];
    /* the library's own counters follow the scorer's */
    if (avail > NLM_VT_STAT_COUNT) stats->span_calls = session->memo.calls;
    if (avail > NLM_VT_STAT_COUNT + 1) stats->span_hits = session->memo.hits;
    if (avail > NLM_VT_STAT_COUNT + 2) stats->nlm_ns = session->nlm_ns + timing_pending(session);
    return NLM_OK;
}
