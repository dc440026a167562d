/*
 * Test driver for libnlmfeature, compiled by tests/test_capi.py with
 *     cc $(nlmfeature config --cflags) test_capi.c $(nlmfeature config --libs) -lpthread
 *
 *   test_capi score MODEL TEXT [--threads N] [--pcache DIR] [--subset K/M] [--quiet]
 *       Scores every n-gram of every sentence of TEXT (each word and </s>, after <s> and the
 *       words before it) from N threads at once; every thread scores every sentence (in a
 *       different order) with its own session.  Checks that all threads got bit-identical
 *       scores, then prints one line per sentence: the scores (%.17g).  With --subset K/M only
 *       tokens whose index % M == K are scored (others print "nan").  Session counters go to
 *       stderr as "stats key=value ...".
 *   test_capi load MODEL        prints "status=<code> name=<...> message=<...>" and exits 0
 *                               whatever the outcome (a bad file must not abort).
 *   test_capi vocab MODEL       enumerates the vocabulary, checks word -> id -> word for every
 *                               entry, prints "vocab=<V> order=<n> state=<n-1> checksum=<hex>".
 *   test_capi partial MODEL     prints future-cost and sequence scores for a few cases (one
 *                               "name value" per line) for the Python test to check.
 *   test_capi contracts MODEL   exercises the documented contracts on odd input: out-of-range
 *                               ids in every scoring entry (scored as <unk>), NULL pointers,
 *                               calls out of order, the model freed before its session; prints
 *                               "name value" lines.
 *   test_capi replace MODEL     begins sentence 0 and scores, prints "ready", waits for a line on
 *                               stdin (the test overwrites the model meanwhile), begins sentence 1
 *                               and prints "begin=<status> score=<value> message=<...>".
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nlmfeature.h"

typedef struct {
    int n;         /* tokens */
    int32_t* ids;  /* n ids */
} sentence;

typedef struct {
    const nlm_model* model;
    const sentence* sents;
    int nsent;
    int thread;
    int nthreads;
    const char* pcache;
    int subset_k, subset_m;
    int quiet;
    double** out; /* out[s][i] */
    int status;
    nlm_stats stats;
} job;

static void die(const char* what, int status) {
    fprintf(stderr, "%s: status %d (%s): %s\n", what, status, nlm_status_string(status), nlm_last_error());
    exit(1);
}

static char* read_text(const char* path) {
    FILE* f = fopen(path, "rb");
    long size;
    char* buf;
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (char*)malloc((size_t)size + 1);
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) { perror(path); exit(1); }
    buf[size] = 0;
    fclose(f);
    return buf;
}

static sentence* split_sentences(const nlm_model* m, char* text, int* nsent) {
    int cap = 64, n = 0;
    sentence* s = (sentence*)malloc(sizeof(sentence) * (size_t)cap);
    char* line = text;
    while (*line) {
        char* end = strchr(line, '\n');
        char* p;
        int tcap = 16;
        if (end) *end = 0;
        if (n == cap) { cap *= 2; s = (sentence*)realloc(s, sizeof(sentence) * (size_t)cap); }
        s[n].n = 0;
        s[n].ids = (int32_t*)malloc(sizeof(int32_t) * (size_t)tcap);
        p = line;
        for (;;) {
            char* w;
            while (*p == ' ' || *p == '\t' || *p == '\r') p++;
            if (!*p) break;
            w = p;
            while (*p && *p != ' ' && *p != '\t' && *p != '\r') p++;
            if (s[n].n == tcap) { tcap *= 2; s[n].ids = (int32_t*)realloc(s[n].ids, sizeof(int32_t) * (size_t)tcap); }
            s[n].ids[s[n].n++] = nlm_word_id(m, w, (size_t)(p - w));
        }
        n++;
        if (!end) break;
        line = end + 1;
    }
    *nsent = n;
    return s;
}

static void* run_job(void* arg) {
    job* j = (job*)arg;
    nlm_session* sess;
    nlm_session_options o;
    int32_t hist[4096];
    int k, rc;
    nlm_session_options_init(&o);
    o.persistent_cache = j->pcache;
    o.quiet = j->quiet;
    rc = nlm_session_new(j->model, &o, &sess);
    if (rc != NLM_OK) { j->status = rc; fprintf(stderr, "session: %s\n", nlm_last_error()); return NULL; }
    for (k = 0; k < j->nsent; k++) {
        /* each thread walks the sentences in a different rotation */
        int si = (k + j->thread * (j->nsent / (j->nthreads ? j->nthreads : 1) + 1)) % j->nsent;
        const sentence* s = &j->sents[si];
        int i;
        if (s->n + 2 > 4096) continue;
        nlm_session_begin(sess, si);
        hist[0] = NLM_BOS;
        for (i = 0; i < s->n; i++) hist[i + 1] = s->ids[i];
        hist[s->n + 1] = NLM_EOS;
        for (i = 0; i <= s->n; i++) {
            if (j->subset_m > 1 && i % j->subset_m != j->subset_k) { j->out[si][i] = NAN; continue; }
            j->out[si][i] = nlm_score(sess, hist, i + 1, hist[i + 1]);
        }
        rc = nlm_session_end(sess);
        if (rc != NLM_OK) { j->status = rc; fprintf(stderr, "end: %s\n", nlm_last_error()); }
    }
    j->stats.struct_size = sizeof j->stats;
    nlm_session_stats(sess, &j->stats);
    nlm_session_free(sess);
    return NULL;
}

static int cmd_score(int argc, char** argv) {
    const char *model_path = argv[2], *text_path = argv[3], *pcache = NULL;
    int nthreads = 4, subset_k = 0, subset_m = 1, quiet = 0, a, t, s, i, nsent, rc, bad = 0;
    nlm_model* m;
    sentence* sents;
    job* jobs;
    pthread_t* tids;
    for (a = 4; a < argc; a++) {
        if (!strcmp(argv[a], "--threads") && a + 1 < argc) nthreads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--pcache") && a + 1 < argc) pcache = argv[++a];
        else if (!strcmp(argv[a], "--subset") && a + 1 < argc) sscanf(argv[++a], "%d/%d", &subset_k, &subset_m);
        else if (!strcmp(argv[a], "--quiet")) quiet = 1;
        else { fprintf(stderr, "unknown option %s\n", argv[a]); return 2; }
    }
    if (nthreads < 1) nthreads = 1;
    rc = nlm_model_load(model_path, &m);
    if (rc != NLM_OK) die("load", rc);
    sents = split_sentences(m, read_text(text_path), &nsent);
    jobs = (job*)calloc((size_t)nthreads, sizeof(job));
    tids = (pthread_t*)calloc((size_t)nthreads, sizeof(pthread_t));
    for (t = 0; t < nthreads; t++) {
        jobs[t].model = m;
        jobs[t].sents = sents;
        jobs[t].nsent = nsent;
        jobs[t].thread = t;
        jobs[t].nthreads = nthreads;
        jobs[t].pcache = pcache;
        jobs[t].subset_k = subset_k;
        jobs[t].subset_m = subset_m;
        jobs[t].quiet = quiet;
        jobs[t].out = (double**)malloc(sizeof(double*) * (size_t)nsent);
        for (s = 0; s < nsent; s++) jobs[t].out[s] = (double*)malloc(sizeof(double) * (size_t)(sents[s].n + 1));
    }
    for (t = 0; t < nthreads; t++) pthread_create(&tids[t], NULL, run_job, &jobs[t]);
    for (t = 0; t < nthreads; t++) pthread_join(tids[t], NULL);
    for (t = 0; t < nthreads; t++)
        if (jobs[t].status != NLM_OK) { fprintf(stderr, "thread %d failed\n", t); return 1; }
    for (t = 1; t < nthreads; t++)
        for (s = 0; s < nsent; s++)
            for (i = 0; i <= sents[s].n; i++) {
                double x = jobs[0].out[s][i], y = jobs[t].out[s][i];
                if (!(x == y || (isnan(x) && isnan(y)))) {
                    if (bad++ < 5) fprintf(stderr, "thread %d differs at sentence %d token %d: %.17g vs %.17g\n", t, s, i, y, x);
                }
            }
    if (bad) { fprintf(stderr, "%d scores differ between threads\n", bad); return 1; }
    for (s = 0; s < nsent; s++) {
        for (i = 0; i <= sents[s].n; i++) printf(i ? " %.17g" : "%.17g", jobs[0].out[s][i]);
        printf("\n");
    }
    for (t = 0; t < nthreads; t++) {
        nlm_stats* st = &jobs[t].stats;
        fprintf(stderr, "stats thread=%d lookups=%lld ngram_hits=%lld context_hits=%lld persistent_hits=%lld "
                        "persistent_loaded=%lld persistent_written=%lld files_read=%lld files_written=%lld "
                        "files_ignored=%lld sentences=%lld nlm_ns=%lld\n", t,
                (long long)st->lookups, (long long)st->ngram_hits, (long long)st->context_hits,
                (long long)st->persistent_hits, (long long)st->persistent_loaded,
                (long long)st->persistent_written, (long long)st->files_read, (long long)st->files_written,
                (long long)st->files_ignored, (long long)st->sentences, (long long)st->nlm_ns);
    }
    nlm_model_free(m);
    return 0;
}

static int cmd_load(const char* path) {
    nlm_model* m = (nlm_model*)1;
    int rc = nlm_model_load(path, &m);
    printf("status=%d name=%s model_null=%d message=%s\n", rc, nlm_status_string(rc), m == NULL, nlm_last_error());
    if (rc == NLM_OK) nlm_model_free(m);
    return 0;
}

static int cmd_vocab(const char* path) {
    nlm_model* m;
    int32_t v, id;
    size_t len;
    const char* w;
    int rc = nlm_model_load(path, &m), bad = 0;
    if (rc != NLM_OK) die("load", rc);
    for (v = 0; v < nlm_model_vocab_size(m); v++) {
        w = nlm_vocab_word(m, v, &len);
        id = nlm_word_find(m, w, len);
        if (!w || id != v) { if (bad++ < 5) fprintf(stderr, "word %d maps back to %d\n", v, id); }
    }
    if (nlm_vocab_word(m, -1, &len) != NULL || nlm_vocab_word(m, nlm_model_vocab_size(m), &len) != NULL) bad++;
    if (nlm_word_find(m, "no-such-word-xyzzy", 18) != -1 || nlm_word_id(m, "no-such-word-xyzzy", 18) != NLM_UNK) bad++;
    w = nlm_vocab_word(m, NLM_BOS, &len);
    if (len != 3 || strncmp(w, "<s>", 3)) bad++;
    printf("vocab=%d order=%d state=%d checksum=%s abi=%d output=%d bad=%d\n", (int)nlm_model_vocab_size(m),
           nlm_model_order(m), nlm_model_state_size(m), nlm_model_checksum(m), nlm_abi_version(),
           nlm_model_output_type(m), bad);
    nlm_model_free(m);
    return bad ? 1 : 0;
}

static int cmd_partial(const char* path, int argc, char** argv) {
    nlm_model* m;
    nlm_session* s;
    int32_t ids[8];
    double per[8];
    int rc = nlm_model_load(path, &m), i, n = argc;
    if (rc != NLM_OK) die("load", rc);
    rc = nlm_session_new(m, NULL, &s);
    if (rc != NLM_OK) die("session", rc);
    if (n > 8) n = 8;
    for (i = 0; i < n; i++) ids[i] = nlm_word_id(m, argv[i], strlen(argv[i]));
    nlm_session_begin(s, -1);
    /* the last word after 0..n-1 known words, unknown before them (<null>) or sentence start (<s>) */
    for (i = 0; i < n; i++) {
        printf("null%d %.17g\n", i, nlm_score_partial(s, ids + (n - 1 - i), i, ids[n - 1], 0));
        printf("bos%d %.17g\n", i, nlm_score_partial(s, ids, i, ids[i], 1));
    }
    printf("sequence %.17g\n", nlm_score_sequence(s, NULL, 0, ids, n, per));
    for (i = 0; i < n; i++) printf("seq%d %.17g\n", i, per[i]);
    nlm_session_end(s);
    nlm_session_free(s);
    nlm_model_free(m);
    return 0;
}

static int cmd_contracts(const char* path) {
    nlm_model* m;
    nlm_session* s;
    int32_t V, ctx[16], unk_ctx[16], ids[3];
    int rc = nlm_model_load(path, &m), n, i;
    double a, b;
    if (rc != NLM_OK) die("load", rc);
    rc = nlm_session_new(m, NULL, &s);
    if (rc != NLM_OK) die("session", rc);
    V = nlm_model_vocab_size(m);
    n = nlm_model_state_size(m);
    printf("end_before_begin %d\n", nlm_session_end(s));
    nlm_session_begin(s, 0);
    /* out-of-range ids in a padded context and as the word are read as <unk> */
    for (i = 0; i < n; i++) {
        ctx[i] = (i % 3 == 0) ? V + 7 : (i % 3 == 1) ? -5 : 2147483647;
        unk_ctx[i] = NLM_UNK;
    }
    a = nlm_score_padded(s, ctx, V + 100);
    b = nlm_score_padded(s, unk_ctx, NLM_UNK);
    printf("padded_bad %.17g\npadded_unk %.17g\n", a, b);
    a = nlm_score_padded(s, ctx, -2147483647 - 1);
    printf("padded_bad_min %.17g\n", a);
    ids[0] = V; ids[1] = -1; ids[2] = 1 << 30;
    printf("score_bad %.17g\n", nlm_score(s, ids, 3, V + 1));
    ids[0] = NLM_UNK; ids[1] = NLM_UNK; ids[2] = NLM_UNK;
    printf("score_unk %.17g\n", nlm_score(s, ids, 3, NLM_UNK));
    ids[0] = V; ids[1] = -1; ids[2] = 1 << 30;
    printf("sequence_bad %.17g\n", nlm_score_sequence(s, ids, 3, ids, 3, NULL));
    printf("partial_bad %.17g\n", nlm_score_partial(s, ids, 2, V * 2, 1));
    /* NULL pointers: NaN and an NLM_ERR_ARGUMENT message, never a crash */
    printf("null_session %g\n", nlm_score(NULL, ids, 1, 5));
    printf("null_session_message %s\n", nlm_last_error());
    printf("null_context %g\n", nlm_score(s, NULL, 2, 5));
    printf("null_padded_session %g\n", nlm_score_padded(NULL, ctx, 5));
    printf("null_partial %g\n", nlm_score_partial(NULL, ids, 1, 5, 1));
    printf("null_sequence_words %g\n", nlm_score_sequence(s, ids, 1, NULL, 2, NULL));
    /* spans: out-of-range ids, positions and affiliations are clamped or read as <unk>; a
       NULL history or affiliation list is an argument error */
    {
        int32_t aff[4] = {-7, 1 << 30, 5, -1};
        ids[0] = V; ids[1] = -1; ids[2] = 1 << 30;
        printf("span_bad %.17g\n", nlm_score_span(s, ids, 3, -4, 99, 1));
        printf("joint_span_bad %.17g\n", nlm_joint_score_span(s, ids, 3, -4, 99, 1, aff));
        printf("null_joint_span_session %g\n", nlm_joint_score_span(NULL, ids, 3, 1, 1, 0, aff));
        printf("null_joint_span_hist %g\n", nlm_joint_score_span(s, NULL, 3, 1, 1, 0, aff));
        printf("null_joint_span_aff %g\n", nlm_joint_score_span(s, ids, 3, 1, 1, 0, NULL));
    }
    printf("null_begin %d\n", nlm_session_begin(NULL, 0));
    printf("null_stats %d\n", nlm_session_stats(s, NULL));
    printf("null_word_id %d\n", (int)nlm_word_id(NULL, "the", 3));
    printf("null_vocab_word %d\n", nlm_vocab_word(m, V, NULL) == NULL);
    printf("null_load %d\n", nlm_model_load(NULL, NULL));
    {
        nlm_session* s2;
        printf("null_session_new %d\n", nlm_session_new(NULL, NULL, &s2) == NLM_ERR_ARGUMENT && s2 == NULL);
    }
    nlm_session_end(s);
    printf("end_twice %d\n", nlm_session_end(s));
    /* the model freed before its session: released with the last session, still usable */
    nlm_model_free(m);
    nlm_session_begin(s, 1);
    printf("after_model_free %.17g\n", nlm_score_padded(s, unk_ctx, NLM_UNK));
    nlm_session_end(s);
    nlm_session_free(s);
    printf("done 1\n");
    return 0;
}

static int cmd_replace(const char* path) {
    nlm_model* m;
    nlm_session* s;
    int32_t ctx[16] = {0};
    char line[64];
    int rc = nlm_model_load(path, &m);
    double v;
    if (rc != NLM_OK) die("load", rc);
    rc = nlm_session_new(m, NULL, &s);
    if (rc != NLM_OK) die("session", rc);
    nlm_session_begin(s, 0);
    v = nlm_score(s, ctx, 0, 5);
    nlm_session_end(s);
    printf("ready %.17g\n", v);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    rc = nlm_session_begin(s, 1);
    v = nlm_score(s, ctx, 0, 5);
    printf("begin=%d score=%g message=%s\n", rc, v, rc == NLM_OK ? "" : nlm_last_error());
    nlm_session_free(s);
    nlm_model_free(m);
    return 0;
}

/* Every (history length nh, first, count, final) span over n words, in a fixed order: a span
 * of count words from position first, after which a final span also scores </s> after the
 * first nh words (nh >= first + count; a span that is not final ends its history). */
typedef struct { int nh, first, count, final; } span_case;

static int span_cases(int n, span_case* out, int max) {
    int first, count, final, nh, k = 0;
    for (first = 0; first <= n; first++)
        for (count = 0; first + count <= n; count++)
            for (final = 0; final < 2; final++)
                for (nh = first + count; nh <= n; nh++) {
                    if (!final && nh != first + count) continue;
                    if (k == max) die("span_cases", NLM_ERR_ARGUMENT);
                    out[k].nh = nh; out[k].first = first; out[k].count = count; out[k].final = final;
                    k++;
                }
    return k;
}

/* nlm_score_span against the per-word calls it replaces: every (first, count, final) over
 * the given words, each asked twice (a memo miss, then a hit), with the memo off, and on a
 * third session after nlm_prefetch_span of the same span (first pass) or of another one (second
 * pass: the prefetched keys must not be used); all must equal the summed nlm_score values bit
 * for bit. */
static int cmd_span(const char* path, int argc, char** argv) {
    nlm_model* m;
    nlm_session *s, *off, *pf;
    nlm_session_options o;
    nlm_stats st;
    int32_t ids[16];
    static span_case cases[2048];
    int rc = nlm_model_load(path, &m), i, n = argc, c, ncases, rep, checked = 0, bad = 0, prefetched = 0;
    double want, got;
    if (rc != NLM_OK) die("load", rc);
    nlm_session_options_init(&o);
    o.span_memo_entries = 16384;
    rc = nlm_session_new(m, &o, &s);
    if (rc != NLM_OK) die("session", rc);
    o.span_memo_entries = 0;
    rc = nlm_session_new(m, &o, &off);
    if (rc != NLM_OK) die("session", rc);
    rc = nlm_session_new(m, &o, &pf);
    if (rc != NLM_OK) die("session", rc);
    if (n > 16) n = 16;
    for (i = 0; i < n; i++) ids[i] = nlm_word_id(m, argv[i], strlen(argv[i]));
    ids[0] = NLM_BOS;
    nlm_session_begin(s, 0);
    nlm_session_begin(off, 0);
    nlm_session_begin(pf, 0);
    ncases = span_cases(n, cases, 2048);
    for (rep = 0; rep < 2; rep++)
        for (c = 0; c < ncases; c++) {
            int nh = cases[c].nh, first = cases[c].first, count = cases[c].count, final = cases[c].final;
            want = 0;
            for (i = 0; i < count; i++) want += nlm_score(off, ids, first + i, ids[first + i]);
            if (final) want += nlm_score(off, ids, nh, NLM_EOS);
            got = nlm_score_span(s, ids, nh, first, count, final);
            if (got != want) { if (bad++ < 5) fprintf(stderr, "span %d %d %d %d: %.17g != %.17g\n", nh, first, count, final, got, want); }
            if (nlm_score_span(off, ids, nh, first, count, final) != want) bad++;
            if (rep == 0)
                nlm_prefetch_span(pf, ids, nh, first, count, final);
            else  /* another span: its keys must not be taken for this one */
                nlm_prefetch_span(pf, ids, nh, first, count, !final);
            prefetched++;
            got = nlm_score_span(pf, ids, nh, first, count, final);
            if (got != want) { if (bad++ < 5) fprintf(stderr, "prefetched span %d %d %d %d (pass %d): %.17g != %.17g\n", nh, first, count, final, rep, got, want); }
            checked++;
        }
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    nlm_session_stats(s, &st);
    printf("checked=%d bad=%d prefetched=%d span_calls=%lld span_hits=%lld\n", checked, bad, prefetched,
           (long long)st.span_calls, (long long)st.span_hits);
    /* a new sentence empties the memo: the first pass misses again */
    nlm_session_begin(s, 1);
    nlm_session_stats(s, &st);
    want = st.span_hits;
    nlm_score_span(s, ids, n, 1, 1, 1);
    nlm_session_stats(s, &st);
    printf("hits_after_begin=%lld\n", (long long)(st.span_hits - (int64_t)want));
    nlm_session_end(s);
    nlm_session_end(off);
    nlm_session_end(pf);
    nlm_session_free(s);
    nlm_session_free(off);
    nlm_session_free(pf);
    nlm_model_free(m);
    return bad ? 1 : 0;
}

/* nlm_score_spans (a batch of expansions in one call) against the per-word calls: every
 * (first, count, final) span over the given words in one batch, twice over (the second copy
 * hits the memo of the first when it is on), with the memo on and off, plus three invalid spans
 * among them that must come back NaN with NLM_ERR_ARGUMENT while the others are scored. */
static int cmd_spans(const char* path, int argc, char** argv) {
    nlm_model* m;
    nlm_session *on, *off, *ref;
    nlm_session_options o;
    nlm_span spans[4096];
    double want[4096], got[4096];
    int32_t ids[16];
    static span_case cases[2040];
    nlm_stats st;
    long long ref_hits;
    int rc = nlm_model_load(path, &m), i, n = argc, c, ncases, k = 0, bad = 0, rep, nan_ok = 0;
    if (rc != NLM_OK) die("load", rc);
    nlm_session_options_init(&o);
    o.span_memo_entries = 16384;
    if ((rc = nlm_session_new(m, &o, &on)) != NLM_OK) die("session", rc);
    o.span_memo_entries = 0;
    if ((rc = nlm_session_new(m, &o, &off)) != NLM_OK) die("session", rc);
    if ((rc = nlm_session_new(m, &o, &ref)) != NLM_OK) die("session", rc);
    if (n > 16) n = 16;
    for (i = 0; i < n; i++) ids[i] = nlm_word_id(m, argv[i], strlen(argv[i]));
    ids[0] = NLM_BOS;
    nlm_session_begin(on, 0);
    nlm_session_begin(off, 0);
    nlm_session_begin(ref, 0);
    ncases = span_cases(n, cases, 2040);
    for (rep = 0; rep < 2; rep++)
        for (c = 0; c < ncases; c++) {
            int nh = cases[c].nh, first = cases[c].first, count = cases[c].count, final = cases[c].final;
            if (k == 5 || k == 50 || k == 500) {  /* invalid: words past the history */
                spans[k].hist = ids; spans[k].nhist = 2; spans[k].first = 1;
                spans[k].count = 5; spans[k].final = 0; want[k++] = NAN;
            }
            want[k] = 0;
            for (i = 0; i < count; i++) want[k] += nlm_score(ref, ids, first + i, ids[first + i]);
            if (final) want[k] += nlm_score(ref, ids, nh, NLM_EOS);
            spans[k].hist = ids; spans[k].nhist = nh; spans[k].first = first;
            spans[k].count = count; spans[k].final = final;
            k++;
        }
    for (rep = 0; rep < 2; rep++) {
        nlm_session* s = rep ? off : on;
        rc = nlm_score_spans(s, spans, k, got);
        if (rc != NLM_ERR_ARGUMENT) { bad++; fprintf(stderr, "status %d\n", rc); }
        for (i = 0; i < k; i++) {
            if (isnan(want[i])) { nan_ok += isnan(got[i]) ? 1 : 0; continue; }
            if (got[i] != want[i]) { if (bad++ < 5) fprintf(stderr, "batch span %d: %.17g != %.17g\n", i, got[i], want[i]); }
        }
    }
    /* the same spans one by one on the memo session: the very doubles of the batch */
    for (i = 0; i < k; i++)
        if (!isnan(want[i]) && nlm_score_span(on, spans[i].hist, spans[i].nhist, spans[i].first,
                                              spans[i].count, spans[i].final) != want[i]) bad++;
    /* exact repeats answered by the n-gram cache: word by word (ref) and in batches (off) */
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    nlm_session_stats(ref, &st);
    ref_hits = st.ngram_hits;
    nlm_session_stats(off, &st);
    printf("checked=%d bad=%d nan=%d empty=%d null=%d ref_ngram_hits=%lld batch_ngram_hits=%lld\n", k, bad,
           nan_ok, nlm_score_spans(on, spans, 0, got), nlm_score_spans(NULL, spans, 1, got), ref_hits,
           (long long)st.ngram_hits);
    nlm_session_free(on);
    nlm_session_free(off);
    nlm_session_free(ref);
    nlm_model_free(m);
    return bad ? 1 : 0;
}

int main(int argc, char** argv) {
    if (argc >= 4 && !strcmp(argv[1], "score")) return cmd_score(argc, argv);
    if (argc == 3 && !strcmp(argv[1], "load")) return cmd_load(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "vocab")) return cmd_vocab(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "partial")) return cmd_partial(argv[2], argc - 3, argv + 3);
    if (argc == 3 && !strcmp(argv[1], "contracts")) return cmd_contracts(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "replace")) return cmd_replace(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "span")) return cmd_span(argv[2], argc - 3, argv + 3);
    if (argc >= 4 && !strcmp(argv[1], "spans")) return cmd_spans(argv[2], argc - 3, argv + 3);
    fprintf(stderr, "usage: test_capi score|load|vocab|partial|contracts|replace|span|spans MODEL ...\n");
    return 2;
}
