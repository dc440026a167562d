"""buckets.py TEST VALID ARPA MODEL...: linear interpolation of the neural model(s) with KenLM,
one weight vector for all tokens vs one per bucket of KenLM's history length (the n-gram
length KenLM matched for the previous word, capped at order-1: a function of the context
only, so every bucket's mixture is a distribution), weights by EM on VALID.  Prints test
perplexities and the ratio to KenLM's.  With --word-buckets it also shows the figure of the
tempting but invalid variant that buckets by the matched length *of the predicted word*
(then the weights depend on the word and the mixture does not sum to one)."""
import math
import sys

import numpy as np

import nlmfeature
from nlmfeature.io.textio import read_tokens
from nlmfeature.training.kenlm_baseline import KenLMScorer, mixture_logprob, nlm_token_scores, tune_mixture

args = [a for a in sys.argv[1:] if a != "--word-buckets"]
word_buckets = "--word-buckets" in sys.argv
test_path, valid_path, arpa = args[:3]
models = [nlmfeature.load(p) for p in args[3:]]
kenlm = KenLMScorer(arpa, models[0].vocab)


def scores(path):
    sents = read_tokens(path)
    comps = [nlm_token_scores(m, sents, exact=True).logprob for m in models]
    lp, matched = [], []
    for toks in sents:
        for p, n, _ in kenlm.model.full_scores(" ".join(kenlm.query_tokens(toks)), bos=True, eos=True):
            lp.append(p * math.log(10)); matched.append(n)
    matched = np.asarray(matched)
    hist = np.empty_like(matched)
    i = 0
    for toks in sents:                 # <s> starts every history; then the previous word's match
        n = len(toks) + 1
        hist[i] = 1
        hist[i + 1:i + n] = np.minimum(matched[i:i + n - 1], kenlm.order - 1)
        i += n
    return np.stack(comps + [np.asarray(lp)]), hist, matched


V, vh, vm = scores(valid_path)
T, th, tm = scores(test_path)
ppl = lambda x: math.exp(-x.mean())
kp = ppl(T[-1])


def bucketed(vb, tb):
    out = np.empty(T.shape[1])
    for b in np.unique(tb):
        w = tune_mixture(V[:, vb == b])
        out[tb == b] = mixture_logprob(T[:, tb == b], w)
    return out


rows = [("kenlm", T[-1]), ("linear, one weight vector", mixture_logprob(T, tune_mixture(V))),
        ("linear, weights by KenLM history length", bucketed(vh, th))]
if word_buckets:
    rows.append(("INVALID: weights by the predicted word's matched length", bucketed(vm, tm)))
for name, lp in rows:
    print(f"{name:58s} {ppl(lp):8.3f}  x KenLM {ppl(lp) / kp:.4f}")
