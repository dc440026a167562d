"""ppl.py MODEL TEST VALID TRAIN: exactly normalised NLM perplexity on TEST (and VALID), the KenLM 5-gram of TRAIN (same vocabulary) and their linear interpolation (weight tuned on VALID); a right-to-left model: its own perplexity only."""
import sys, os, math, json, numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))
from nlmfeature.core.model import exactly_normalised, load
from nlmfeature.training.corpus import read_lines, ngrams
from nlmfeature.training.kenlm_baseline import KenLMScorer, train_kenlm, interpolate
mp, test, valid, train = sys.argv[1:5]
m = load(mp)
rev = bool(m.header.get("metadata", {}).get("reverse"))
def scores(path):
    s = read_lines(path)
    if rev: s = [x[::-1] for x in s]
    d = ngrams(s, m.vocab, m.order)
    return exactly_normalised(m).score_batch(d.contexts, d.words), s
t, ts = scores(test); v, vs = scores(valid)
ppl = lambda x: math.exp(-x.sum() / len(x))
res = {"model": os.path.basename(mp), "nlm_test": ppl(t), "nlm_valid": ppl(v)}
ka = os.path.join(os.environ.get("OUT", "/tmp/nlmfeature-recipes"), f"kenlm.{os.path.basename(train)}.{len(m.vocab)}.arpa")
if not os.path.exists(ka):
    train_kenlm(train, ka, 5, vocab=m.vocab)
k = KenLMScorer(ka, m.vocab)
if not rev:
    kt, _ = k.token_scores(ts); kv, _ = k.token_scores(vs)
    res["kenlm_test"] = ppl(kt.logprob)
    lin, w = interpolate(t, kt.logprob, v, kv.logprob)
    res["linear_test"] = ppl(lin); res["w"] = w
    res["ratio_nlm"] = res["nlm_test"] / res["kenlm_test"]; res["ratio_lin"] = res["linear_test"] / res["kenlm_test"]
print(json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in res.items()}))
