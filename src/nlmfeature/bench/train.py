"""``nlmfeature bench train``: training speed and perplexity on the Brown corpus.

For each configuration (log-bilinear D=200 diagonal with class-factored NCE, unnormalised NCE
and class-factored SGD; NPLM 150-750-150 with NCE; with and without direct n-gram features)
it trains on Brown train with Brown valid as the held-out set (the best epoch is kept),
then reports:

* training words/s with 1 and 2 threads (short separate runs, each in a fresh process with
  ``OMP_WAIT_POLICY=passive`` so the Cython kernels may use the threads, see
  :mod:`nlmfeature.training.threads`);
* epochs to the best held-out perplexity, valid and test perplexity (unnormalised models:
  raw scores and exactly renormalised scores, and the mean/spread of log Z);
* the KenLM 5-gram test perplexity (modified Kneser-Ney by ``lmplz`` on the same text with the
  same vocabulary: :mod:`nlmfeature.training.kenlm_baseline`), and the test perplexity of the linear
  interpolation of each neural model with it (weight tuned on valid);
* the model file size.

Targets: best neural test perplexity <= 0.85 x KenLM's, its interpolation
<= 0.80 x, class-factored NCE >= 50,000 words/s on 2 cores.  ``--quick`` runs small models on
slices (a smoke test of the benchmark, minutes); the full run caps each configuration with
``--minutes``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

from nlmfeature.io.jsonout import dumps_json
from nlmfeature.bench import shared_data

DEFAULT_DATA = shared_data("mono", "brown")

LBL = dict(arch="lbl", word_width=200, diagonal_contexts=True)
NPLM = dict(arch="nplm", word_width=150, hidden=750, hidden_layers=[150], activation="relu",
            minibatch_size=1000)  # dense layers want bigger minibatches (BLAS efficiency)
DIRECT = dict(direct_order=3, hash_space=1 << 22, min_ngram_freq=2)

#: name -> TrainConfig fields
CONFIGS: Dict[str, Dict[str, Any]] = {
    "lbl-d200-class-nce": dict(LBL, output="class", classes=128, noise_samples=10),
    "lbl-d200-class-nce+direct": dict(LBL, output="class", classes=128, noise_samples=10, **DIRECT),
    "lbl-d200-nce": dict(LBL, output="unnormalised", noise_samples=10),
    "lbl-d200-nce+direct": dict(LBL, output="unnormalised", noise_samples=10, **DIRECT),
    "lbl-d200-class-sgd": dict(LBL, output="class", classes=128, noise_samples=0),
    "nplm-150-750-150-nce": dict(NPLM, output="unnormalised", noise_samples=10),
    "nplm-150-750-150-nce+direct": dict(NPLM, output="unnormalised", noise_samples=10, **DIRECT),
}
COMMON = dict(order=5, min_count=4, minibatch_size=250, step_size=0.05, lambda_lbl=20.0, init_scale=0.01,
              direct_order=0)  # the "+direct" configurations set their own
#: untimed minibatches before a speed measurement
WARMUP_UPDATES = 20
#: held-out evaluations per epoch (the best one is kept)
EVALS_PER_EPOCH = 4
QUICK_SHRINK = dict(word_width=48, hidden=128, hidden_layers=[48], classes=32, hash_space=1 << 18)


# ---------------------------------------------------------------------------------------
# measurements
# ---------------------------------------------------------------------------------------

def speed_probe(fields: Dict[str, Any], threads: int, updates: int) -> float:
    """Training words/s of a configuration with ``threads`` threads, measured in a fresh
    process (BLAS and OpenMP sized before they load)."""
    env = dict(os.environ, OMP_WAIT_POLICY="passive", OPENBLAS_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads))
    code = ("import json,sys; from nlmfeature.bench.train import _probe; "
            "print(json.dumps(_probe(json.loads(sys.argv[1]))))")
    arg = json.dumps(dict(fields, threads=threads, max_updates=updates))
    proc = subprocess.run([sys.executable, "-c", code, arg], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"speed run failed: {proc.stderr[-2000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def _probe(fields: Dict[str, Any]) -> float:
    from nlmfeature.training.trainer import TrainConfig, Trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(**dict(fields, model_out=os.path.join(tmp, "probe.nlm"), test_set=None,
                                 progress=False, resume=False, iterations=1, tables=False))
        updates = cfg.max_updates
        tr = Trainer(cfg, log=lambda m: None)
        # warm-up: the first minibatches allocate buffers and fault pages in; not timed
        tr.cfg.max_updates = WARMUP_UPDATES
        tr.run()
        s0, w0 = tr.train_seconds, tr.trained_words
        tr.cfg.max_updates = updates
        tr.run()
    return (tr.trained_words - w0) / max(1e-9, tr.train_seconds - s0)


def normalised_logprob(model, data, rows: Optional[np.ndarray] = None) -> np.ndarray:
    """Exactly normalised natural-log probabilities
    (:func:`nlmfeature.core.model.exactly_normalised`) of held-out n-grams (or of the n-grams
    ``rows``) under a model."""
    from nlmfeature.core.model import exactly_normalised

    rows = np.arange(len(data)) if rows is None else rows
    return exactly_normalised(model).score_batch(np.ascontiguousarray(data.contexts[rows]),
                                                 np.ascontiguousarray(data.words[rows]))


#: with direct features the exact normaliser costs V hashed look-ups per token: sample this many
NORMALISER_SAMPLE = 10000


def _ppl(lp: np.ndarray) -> float:
    return float(math.exp(-float(np.mean(lp))))


def run_config(name: str, fields: Dict[str, Any], paths: Dict[str, str], out_dir: str, args,
               kenlm: Optional[Dict[str, np.ndarray]], log) -> Dict[str, Any]:
    """Train one configuration and measure it."""
    import nlmfeature
    from nlmfeature.training.corpusfile import heldout_ngrams
    from nlmfeature.training.trainer import TrainConfig, Trainer

    model_out = os.path.join(out_dir, name + ".nlm")
    cfg = TrainConfig(**dict(fields, train=paths["train"], test_set=paths["valid"], model_out=model_out,
                             iterations=args.iterations, patience=args.patience, max_minutes=args.minutes,
                             progress=False, resume=False, threads=args.threads, seed=1))
    t0 = time.time()
    tr = Trainer(cfg, log=lambda m: log(f"  [{name}] {m}"))
    tr.cfg.eval_every = max(1, tr.batches_per_epoch // EVALS_PER_EPOCH)
    res = tr.run()
    train_minutes = (time.time() - t0) / 60
    test, _ = heldout_ngrams(paths["test"], tr.vocab, cfg.order)
    model = nlmfeature.load(model_out)        # the best parameters, as written
    test_raw = model.score_batch(test.contexts, test.words)
    row: Dict[str, Any] = {
        "config": name, "estimator": res.estimator, "epochs_run": res.epochs, "epochs_to_best": res.best_epoch,
        "train_minutes": round(train_minutes, 2), "words_per_s_training_run": round(res.words_per_second),
        "valid_ppl": round(res.best_perplexity, 2), "test_ppl": round(_ppl(test_raw), 2),
        "model_bytes": os.path.getsize(model_out), "vocab": len(tr.vocab),
    }
    test_lp, valid_lp = test_raw, None
    if model.output_type == "unnormalised" and not model.header.get("direct"):
        test_lp = normalised_logprob(model, test)
        valid_lp = normalised_logprob(model, tr.heldout)
        lz = test_raw - test_lp
        row.update(test_ppl_normalised=round(_ppl(test_lp), 2),
                   valid_ppl_normalised=round(_ppl(valid_lp), 2),
                   log_z_mean=round(float(lz.mean()), 3), log_z_sd=round(float(lz.std()), 3))
    elif model.output_type == "unnormalised":
        # exact normalisation on evenly spaced test tokens; interpolation uses the raw scores
        rows = np.unique(np.linspace(0, len(test) - 1, min(NORMALISER_SAMPLE, len(test))).astype(np.int64))
        norm = normalised_logprob(model, test, rows)
        lz = test_raw[rows] - norm
        row.update(test_ppl_normalised_sample=round(_ppl(norm), 2), test_ppl_raw_sample=round(_ppl(test_raw[rows]), 2),
                   normaliser_sample_tokens=len(rows), interpolation_uses="raw scores",
                   log_z_mean=round(float(lz.mean()), 3), log_z_sd=round(float(lz.std()), 3))
    if kenlm is not None:
        from nlmfeature.training.kenlm_baseline import interpolate

        if valid_lp is None:
            valid_lp = model.score_batch(tr.heldout.contexts, tr.heldout.words)
        inter, w = interpolate(test_lp, kenlm["test"], valid_lp, kenlm["valid"])
        row.update(kenlm_test_ppl=round(_ppl(kenlm["test"]), 2), interpolated_test_ppl=round(_ppl(inter), 2),
                   interpolation_weight=round(w, 3))
    log(f"  [{name}] speed runs (1 and 2 threads, {args.speed_updates} minibatches each)")
    probe_fields = dict(fields, train=paths["train"])
    row["words_per_s_1_thread"] = round(speed_probe(probe_fields, 1, args.speed_updates))
    row["words_per_s_2_threads"] = round(speed_probe(probe_fields, 2, args.speed_updates))
    return row


def _slice(src: str, dst: str, n: int) -> str:
    from nlmfeature.training.corpus import read_sentences

    with open(dst, "w", encoding="utf-8") as f:
        for i, (_, toks) in enumerate(read_sentences(src)):
            if i >= n:
                break
            f.write(" ".join(toks) + "\n")
    return dst


def run(args: argparse.Namespace) -> int:
    from nlmfeature.errors import NLMFeatureError
    from nlmfeature.training.corpus import build_vocabulary, read_corpus, read_lines

    def log(msg: str) -> None:
        if not getattr(args, "quiet", False):
            print(msg, file=sys.stderr, flush=True)

    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise NLMFeatureError(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    paths = {p: os.path.join(args.data, f"{p}.txt.gz") for p in ("train", "valid", "test")}
    for p in paths.values():
        if not os.path.exists(p):
            raise NLMFeatureError(f"{p}: missing (pass --data with train/valid/test.txt.gz)")
    tmp = tempfile.TemporaryDirectory(prefix="nlm-bench-train-") if args.out is None else None
    out_dir = args.out or tmp.name
    os.makedirs(out_dir, exist_ok=True)
    if args.quick:
        paths = {"train": _slice(paths["train"], os.path.join(out_dir, "train.txt"), 5000),
                 "valid": _slice(paths["valid"], os.path.join(out_dir, "valid.txt"), 800),
                 "test": _slice(paths["test"], os.path.join(out_dir, "test.txt"), 800)}
        args.iterations = min(args.iterations, 2)
        args.speed_updates = min(args.speed_updates, 40)
    fields_of = {}
    for n in names:
        f = dict(COMMON, **CONFIGS[n])
        if args.quick:
            f.update({k: v for k, v in QUICK_SHRINK.items() if k in f or k in ("word_width", "classes")})
            f["min_count"] = 2
            if f["arch"] == "lbl":
                f.pop("hidden", None), f.pop("hidden_layers", None)
        if args.lambda_lbl is not None:
            f["lambda_lbl"] = args.lambda_lbl
        fields_of[n] = f
    kenlm = None
    if args.kenlm:
        try:
            from nlmfeature import kenlm_baseline as kb

            sents = read_corpus(paths["train"])
            vocab, _ = build_vocabulary(sents, fields_of[names[0]]["min_count"])
            arpa = os.path.join(out_dir, "kenlm5.arpa")
            log("KenLM 5-gram baseline (lmplz, same vocabulary)")
            kb.train_kenlm(paths["train"], arpa, order=5, vocab=vocab)
            scorer = kb.KenLMScorer(arpa, vocab)
            kenlm = {p: scorer.token_scores(read_lines(paths[p]))[0].logprob for p in ("valid", "test")}
        except NLMFeatureError as exc:
            log(f"KenLM baseline skipped: {exc}")
    rows: List[Dict[str, Any]] = []
    for n in names:
        log(f"{n}: training")
        rows.append(run_config(n, fields_of[n], paths, out_dir, args, kenlm, log))
    summary = summarise(rows)
    if args.json:
        print(dumps_json({"data": args.data, "quick": args.quick, "rows": rows, "summary": summary}, indent=2))
    else:
        print_table(rows, summary)
    if tmp is not None:
        tmp.cleanup()
    return 0


def summarise(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Best figures against the targets."""
    def test_of(r):
        if "test_ppl_normalised_sample" in r:  # raw test perplexity corrected by the sampled mean log Z
            return round(r["test_ppl"] * math.exp(r["log_z_mean"]), 2)
        return r.get("test_ppl_normalised", r["test_ppl"])

    best = min(rows, key=test_of)
    s: Dict[str, Any] = {"best_neural": best["config"], "best_neural_test_ppl": test_of(best)}
    if "test_ppl_normalised_sample" in best:
        s["best_neural_note"] = "normalised perplexity estimated with log Z from a token sample"
    if "kenlm_test_ppl" in best:
        k = best["kenlm_test_ppl"]
        bi = min(rows, key=lambda r: r["interpolated_test_ppl"])
        s.update(kenlm_test_ppl=k, best_neural_ratio=round(test_of(best) / k, 3),
                 best_interpolated=bi["config"], best_interpolated_test_ppl=bi["interpolated_test_ppl"],
                 best_interpolated_ratio=round(bi["interpolated_test_ppl"] / k, 3),
                 target_neural_0_85=test_of(best) <= 0.85 * k,
                 target_interpolated_0_80=bi["interpolated_test_ppl"] <= 0.80 * k)
    cn = [r for r in rows if r["estimator"] == "class-nce"]
    if cn:
        wps = max(max(r["words_per_s_1_thread"], r["words_per_s_2_threads"]) for r in cn)
        s.update(class_nce_words_per_s=wps, target_class_nce_50k=wps >= 50000)
    return s


def print_table(rows: List[Dict[str, Any]], summary: Dict[str, Any]) -> None:
    cols = [("config", "config"), ("w/s 1t", "words_per_s_1_thread"), ("w/s 2t", "words_per_s_2_threads"),
            ("ep→best", "epochs_to_best"), ("valid", "valid_ppl"), ("test", "test_ppl"),
            ("test norm", None), ("logZ m/sd", None), ("KenLM", "kenlm_test_ppl"),
            ("interp", "interpolated_test_ppl"), ("MB", None)]
    table = []
    for r in rows:
        line = []
        for title, key in cols:
            if title == "test norm":
                line.append(str(r["test_ppl_normalised"]) if "test_ppl_normalised" in r else
                            f"~{r['test_ppl_normalised_sample']} ({r['normaliser_sample_tokens']} tok)"
                            if "test_ppl_normalised_sample" in r else "-")
            elif title == "logZ m/sd":
                line.append(f"{r['log_z_mean']:+.2f}/{r['log_z_sd']:.2f}" if "log_z_mean" in r else "-")
            elif title == "MB":
                line.append(f"{r['model_bytes'] / 2**20:.1f}")
            else:
                v = r.get(key, "-")
                line.append(str(v))
        table.append(line)
    widths = [max(len(t), *(len(l[i]) for l in table)) for i, (t, _) in enumerate(cols)]
    print("  ".join(t.ljust(w) for (t, _), w in zip(cols, widths)))
    for l in table:
        print("  ".join(v.ljust(w) for v, w in zip(l, widths)))
    print()
    for k, v in summary.items():
        print(f"{k:28s} {v}")
