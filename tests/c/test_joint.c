/* Joint models through the C API: reads lines "source TAB target TAB affiliations" (the
 * affiliations: one source position per target word, then the one of </s>), maps the words
 * with nlm_source_word_id / nlm_word_id, begins each sentence with its source and prints the
 * natural-log score of every target word and </s> (nlm_joint_score).  With the third
 * argument "null" it scores with affiliation -1 (the <null> window) through nlm_score instead.
 * With "cache=DIR" instead it scores through a persistent cache in DIR (a second run reads
 * what the first wrote) and prints its hits.  Without a third argument it also checks that
 * nlm_joint_score_span over every decoder-like span equals the sum of the per-word scores
 * (stderr: spans=N span_mismatches=K).
 * Usage: test_joint MODEL FILE [null | cache=DIR] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nlmfeature.h"

#define MAXW 512

static int split(char* s, char** out, int max) {
    int n = 0;
    char* tok = strtok(s, " ");
    while (tok && n < max) {
        out[n++] = tok;
        tok = strtok(NULL, " ");
    }
    return n;
}

int main(int argc, char** argv) {
    nlm_model* model;
    nlm_session* session;
    nlm_session_options o;
    char line[65536];
    FILE* f;
    int rc, null_window;
    const char* cache_dir = NULL;
    int64_t sid = 0;
    long spans = 0, span_bad = 0;
    if (argc < 3) {
        fprintf(stderr, "usage: test_joint MODEL FILE [null | cache=DIR]\n");
        return 2;
    }
    null_window = argc > 3 && strcmp(argv[3], "null") == 0;
    if (argc > 3 && strncmp(argv[3], "cache=", 6) == 0) cache_dir = argv[3] + 6;
    rc = nlm_model_load(argv[1], &model);
    if (rc != NLM_OK) {
        fprintf(stderr, "load failed: %s\n", nlm_last_error());
        return 1;
    }
    fprintf(stderr, "window=%d source_vocab=%d\n", nlm_model_source_window(model),
            (int)nlm_model_source_vocab_size(model));
    nlm_session_options_init(&o);
    o.persistent_cache = cache_dir;
    rc = nlm_session_new(model, &o, &session);
    if (rc != NLM_OK) {
        fprintf(stderr, "session failed: %s\n", nlm_last_error());
        return 1;
    }
    f = fopen(argv[2], "r");
    if (!f) return 1;
    while (fgets(line, sizeof line, f)) {
        char *src_s, *tgt_s, *aff_s;
        char* sw[MAXW];
        char* tw[MAXW];
        char* aw[MAXW + 1];
        int32_t src[MAXW], hist[MAXW + 1], aff[MAXW + 1], span_aff[MAXW + 1];
        double vals[MAXW + 1];
        int ns, nt, na, i;
        line[strcspn(line, "\n")] = 0;
        src_s = line;
        tgt_s = strchr(src_s, '\t');
        if (!tgt_s) return 3;
        *tgt_s++ = 0;
        aff_s = strchr(tgt_s, '\t');
        if (!aff_s) return 3;
        *aff_s++ = 0;
        ns = split(src_s, sw, MAXW);
        for (i = 0; i < ns; i++) src[i] = nlm_source_word_id(model, sw[i], strlen(sw[i]));
        nt = split(tgt_s, tw, MAXW);
        na = split(aff_s, aw, MAXW + 1);
        if (na != nt + 1) return 4;
        rc = nlm_session_begin_source(session, sid++, src, ns);
        if (rc != NLM_OK) {
            fprintf(stderr, "begin_source failed: %s\n", nlm_last_error());
            return 1;
        }
        hist[0] = NLM_BOS;
        for (i = 0; i <= nt; i++) {
            int32_t w = i < nt ? nlm_word_id(model, tw[i], strlen(tw[i])) : NLM_EOS;
            double v = null_window ? nlm_score(session, hist, i + 1, w)
                                   : nlm_joint_score(session, hist, i + 1, w, atoi(aw[i]));
            printf(i ? " %.9g" : "%.9g", v);
            vals[i] = v;
            aff[i] = atoi(aw[i]);
            hist[i + 1] = w;
        }
        printf("\n");
        /* nlm_joint_score_span over every span a decoder asks for (first >= 1: after <s>; up
           to order-1 words, with </s> when they reach the end) is exactly the sum of the
           per-word scores above, added in the same order */
        if (!null_window && !cache_dir) {
            int first, count, fin, order = nlm_model_order(model);
            for (first = 1; first <= nt + 1; first++)
                for (count = 0; count < order && first + count <= nt + 1; count++)
                    for (fin = 0; fin <= (first + count == nt + 1); fin++) {
                        double want = 0, got;
                        int j;
                        if (!count && !fin) continue;
                        for (j = 0; j < count; j++) want += vals[first - 1 + j];
                        if (fin) want += vals[nt];
                        for (j = 0; j < count; j++) span_aff[j] = aff[first - 1 + j];
                        span_aff[count] = aff[nt];
                        got = nlm_joint_score_span(session, hist, nt + 1, first, count, fin, span_aff);
                        spans++;
                        if (got != want) span_bad++;
                    }
        }
        nlm_session_end(session);
    }
    fclose(f);
    {
        nlm_stats st;
        st.struct_size = sizeof st;
        nlm_session_stats(session, &st);
        fprintf(stderr, "stats lookups=%lld context_hits=%lld persistent_hits=%lld\n",
                (long long)st.lookups, (long long)st.context_hits, (long long)st.persistent_hits);
        fprintf(stderr, "spans=%ld span_mismatches=%ld\n", spans, span_bad);
    }
    nlm_session_free(session);
    nlm_model_free(model);
    return 0;
}
