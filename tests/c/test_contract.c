/* The documented errors of nlmfeature.h, one line each: "NAME<TAB>VALUE<TAB>MESSAGE".
 * VALUE is the score ("nan", or the number) or the status a call returned; MESSAGE is
 * nlm_last_error() right after the call (a documented error sets one naming the function).
 *
 *   test_contract MODEL [OTHER-MODEL-PATHS...]
 *
 * MODEL is a target-only model of order >= 3; every further path is loaded and its status
 * printed as "load:PATH<TAB>STATUS<TAB>MESSAGE" (a FIFO must fail at once, not block).  The caller
 * sets an alarm (timeout) around the whole program. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nlmfeature.h"

static void score_line(const char* name, double v) {
    if (isnan(v)) printf("%s\tnan\t%s\n", name, nlm_last_error());
    else printf("%s\t%.17g\t%s\n", name, v, nlm_last_error());
}

static void status_line(const char* name, int rc) {
    printf("%s\t%d\t%s\n", name, rc, nlm_last_error());
}

int main(int argc, char** argv) {
    nlm_model* m = NULL;
    nlm_session* s = NULL;
    int32_t hist[4], ctx[2];
    double before, after, sum;
    int i, rc;
    if (argc < 2) {
        fprintf(stderr, "usage: test_contract MODEL [PATHS...]\n");
        return 2;
    }
    rc = nlm_model_load(argv[1], &m);
    if (rc != NLM_OK) {
        fprintf(stderr, "load %s: %s\n", argv[1], nlm_last_error());
        return 1;
    }
    rc = nlm_session_new(m, NULL, &s);
    if (rc != NLM_OK) return 1;
    hist[0] = NLM_BOS;
    hist[1] = nlm_word_id(m, "the", 3);
    hist[2] = nlm_word_id(m, "jury", 4);
    hist[3] = nlm_word_id(m, "said", 4);
    ctx[0] = hist[1];
    ctx[1] = hist[2];

    /* scoring outside a sentence is allowed and scores as inside one */
    before = nlm_score(s, ctx, 2, hist[3]);
    score_line("score_before_begin", before);
    status_line("end_without_begin", nlm_session_end(s));
    status_line("begin_null_session", nlm_session_begin(NULL, 0));
    status_line("begin", nlm_session_begin(s, 0));
    after = nlm_score(s, ctx, 2, hist[3]);
    score_line("score_in_sentence", after);
    printf("before_equals_inside\t%d\t\n", before == after);

    /* NULL session, NULL arrays with non-zero lengths, negative lengths and offsets */
    score_line("score_null_session", nlm_score(NULL, ctx, 2, hist[3]));
    score_line("score_null_context", nlm_score(s, NULL, 2, hist[3]));
    score_line("score_negative_n", nlm_score(s, ctx, -1, hist[3]));
    score_line("partial_negative_n", nlm_score_partial(s, ctx, -2, hist[3], 1));
    score_line("padded_null_context", nlm_score_padded(s, NULL, hist[3]));
    score_line("sequence_negative_nctx", nlm_score_sequence(s, ctx, -1, hist + 1, 2, NULL));
    score_line("sequence_negative_n", nlm_score_sequence(s, ctx, 2, hist + 1, -1, NULL));
    score_line("sequence_null_words", nlm_score_sequence(s, ctx, 2, NULL, 2, NULL));
    score_line("span_null_session", nlm_score_span(NULL, hist, 4, 1, 2, 1));
    score_line("span_null_hist", nlm_score_span(s, NULL, 3, 1, 2, 1));
    score_line("span_negative_nhist", nlm_score_span(s, hist, -1, 0, 0, 1));
    score_line("span_negative_first", nlm_score_span(s, hist, 4, -1, 1, 0));
    score_line("span_negative_count", nlm_score_span(s, hist, 4, 1, -1, 0));
    score_line("span_first_past_end", nlm_score_span(s, hist, 4, 5, 0, 1));
    score_line("span_count_past_end", nlm_score_span(s, hist, 4, 2, 3, 0));
    score_line("joint_span_null_session", nlm_joint_score_span(NULL, hist, 4, 1, 2, 1, NULL));
    /* valid calls: a span is the sum of its words' scores; nothing to score is 0 */
    sum = 0;
    for (i = 1; i < 4; i++) sum += nlm_score(s, hist, i, hist[i]);
    sum += nlm_score(s, hist, 4, NLM_EOS);
    printf("span_equals_sum\t%d\t\n", nlm_score_span(s, hist, 4, 1, 3, 1) == sum);
    score_line("span_empty", nlm_score_span(s, hist, 4, 4, 0, 0));
    score_line("span_empty_null_hist", nlm_score_span(s, NULL, 0, 0, 0, 0));
    status_line("end", nlm_session_end(s));

    for (i = 2; i < argc; i++) {
        nlm_model* other = NULL;
        char name[4200];
        rc = nlm_model_load(argv[i], &other);
        snprintf(name, sizeof name, "load:%s", argv[i]);
        status_line(name, rc);
        printf("load_null_out:%s\t%d\t\n", argv[i], other == NULL);
        nlm_model_free(other);
    }
    nlm_session_free(s);
    nlm_model_free(m);
    return 0;
}
