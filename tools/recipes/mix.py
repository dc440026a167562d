"""pplmix.py TEST VALID KENLM_ARPA MODEL...: token-level linear mixture of L2R NLMs (weights tuned on valid by EM), alone and with KenLM"""
import os, sys, math, numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))
from nlmfeature.bench.memory import neural_scores
from nlmfeature.training.corpus import read_lines
from nlmfeature.training.kenlm_baseline import KenLMScorer
from nlmfeature.core.model import load
test, valid, arpa = sys.argv[1:4]; models = sys.argv[4:]
T, V = read_lines(test), read_lines(valid)
vocab = load(models[0]).vocab
k = KenLMScorer(arpa, vocab)
def cols(S): return np.stack([neural_scores(m, S) for m in models])
tn, vn = cols(T), cols(V)
kt, kv = k.token_scores(T)[0].logprob, k.token_scores(V)[0].logprob
def em(L, it=50):
    w = np.full(len(L), 1/len(L))
    for _ in range(it):
        a = np.log(w)[:, None] + L; a -= np.logaddexp.reduce(a, 0); w = np.exp(a).mean(1)
    return w
def mix(L, w): return np.logaddexp.reduce(np.log(w)[:, None] + L, 0)
ppl = lambda x: math.exp(-x.mean())
kp = ppl(kt)
for i, m in enumerate(models): print(m, round(ppl(tn[i]), 3), round(ppl(tn[i]) / kp, 4))
w = em(vn); mt = mix(tn, w)
print("nlm mixture", np.round(w, 3), round(ppl(mt), 3), "x", round(ppl(mt) / kp, 4))
w2 = em(np.vstack([vn, kv])); mt2 = mix(np.vstack([tn, kt]), w2)
print("with kenlm", np.round(w2, 3), round(ppl(mt2), 3), "x", round(ppl(mt2) / kp, 4), "kenlm", round(kp, 3))
