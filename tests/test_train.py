"""Training on real Brown-corpus slices: perplexity, reproducibility, resume, normalisation,
self-normalisation, samplers, direct-feature filter, bad input and the CLI."""
from __future__ import annotations

import gzip
import json
import math
import os
from collections import Counter

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_TRAIN, BROWN_VALID, read_lines
from nlmfeature.core.architecture import ModelSpec, random_model
from nlmfeature.core.batch import BatchScorer
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.training import corpus
from nlmfeature.training.network import Network
from nlmfeature.training.sampling import AliasSampler, ClassNoise, UnigramNoise, empirical
from nlmfeature.training.trainer import TrainConfig, Trainer, checkpoint_path, heldout_logprob, train


def config(tmp_path, name="m.nlm", **kw) -> TrainConfig:
    base = dict(train=BROWN_TRAIN, test_set=BROWN_VALID, model_out=str(tmp_path / name), order=4,
                word_width=24, diagonal_contexts=True, output="class", classes=16, noise_samples=5,
                iterations=2, minibatch_size=128, threads=1, progress=False, seed=3,
                # the mechanics tests below pin these (the CLI defaults differ: see test_defaults_*)
                direct_order=0, lambda_lbl=0.0, patience=0, evals_per_epoch=1)
    base.update(kw)
    return TrainConfig(**base)


def quiet(msg: str) -> None:
    pass


def unigram_perplexity(tr: Trainer) -> float:
    """Perplexity of the training unigram distribution (same vocabulary, <unk> included)."""
    p = tr.counts / tr.counts.sum()
    return float(math.exp(-np.log(p[tr.heldout.words]).mean()))


# -- corpus ------------------------------------------------------------------------------

def test_ngrams_match_model_sentence_ngrams(tmp_path):
    cfg = config(tmp_path, iterations=0)
    tr = Trainer(cfg, quiet)
    tr.run()
    model = nlmfeature.load(cfg.model_out)
    sents = read_lines(BROWN_VALID, 40)
    data = corpus.ngrams([s.split() for s in sents], tr.vocab, cfg.order)
    ctx = np.concatenate([model.sentence_ngrams(s)[0] for s in sents])
    words = np.concatenate([model.sentence_ngrams(s)[1] for s in sents])
    np.testing.assert_array_equal(data.contexts, ctx)
    np.testing.assert_array_equal(data.words, words)


def test_non_utf8_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat sat\nthe dog \xff barked\n")
    with pytest.raises(InputError, match=r"bad.txt:2: not valid UTF-8"):
        corpus.read_corpus(str(bad))
    gz = tmp_path / "bad.txt.gz"
    with gzip.open(gz, "wb") as f:
        f.write(b"fine line\nfine\n\xc3\x28 broken\n")
    with pytest.raises(InputError, match=r"bad.txt.gz:3: not valid UTF-8"):
        corpus.read_corpus(str(gz))


def test_empty_corpus_and_unknown_only_test_set(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n\n")
    with pytest.raises(InputError, match="empty"):
        train(config(tmp_path, train=str(empty)), quiet)
    alien = tmp_path / "alien.txt"
    alien.write_text("qqxx zzyy\nwwvv\n")
    with pytest.raises(InputError, match="alien.txt: every one of the 3 test-set tokens is outside"):
        train(config(tmp_path, test_set=str(alien)), quiet)


def test_reserved_tokens_rejected(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("hello world\n<s> hello </s>\n")
    with pytest.raises(InputError, match="reserved token"):
        corpus.read_corpus(str(f))


def test_vocabulary_cutoff_maps_rare_words_to_unk():
    sents = [s.split() for s in read_lines(BROWN_TRAIN, 500)]
    vocab, counts = corpus.build_vocabulary(sents, min_count=3)
    c = Counter(w for s in sents for w in s)
    assert all(c[w] >= 3 for w in vocab.words[4:])
    rare = sum(n for w, n in c.items() if n < 3)
    assert counts[vocab.unk] == rare + c.get("<unk>", 0)
    assert counts[vocab.eos] == len(sents) and counts[vocab.bos] == 0
    vocab2, _ = corpus.build_vocabulary(sents, min_count=1, max_vocab=100)
    assert len(vocab2) == 100


# -- samplers ------------------------------------------------------------------------------

def test_alias_sampler_matches_distribution():
    w = np.array([5.0, 1.0, 0.0, 3.0, 1.0, 10.0])
    s = AliasSampler(w, np.array([0, 6]), np.arange(6))
    vals, freq = empirical(s, 0, 200_000, seed=7)
    expect = w / w.sum()
    got = np.zeros(6)
    got[vals] = freq
    assert got[2] == 0.0
    np.testing.assert_allclose(got, expect, atol=0.005)
    # same seed/step -> same draws, whatever the thread count
    a = s.sample(np.zeros(1000, dtype=np.int32), 5, seed=1, step=3, threads=1)
    b = s.sample(np.zeros(1000, dtype=np.int32), 5, seed=1, step=3, threads=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, s.sample(np.zeros(1000, dtype=np.int32), 5, seed=1, step=4))


def test_class_noise_stays_in_target_class():
    tr = Trainer(TrainConfig(train=BROWN_TRAIN, model_out="/nonexistent/x", order=3, word_width=8,
                             output="class", classes=10, noise_samples=8, progress=False), quiet)
    noise = tr.noise
    assert isinstance(noise, ClassNoise)
    targets = next(tr.data.chunks())[1][:2000]
    drawn = noise.draw(targets, seed=1, step=0)
    cw = tr.template["class.of_word"]
    assert np.all(cw[drawn.words] == cw[targets][:, None])
    # class noise follows the class unigram distribution
    freq = np.bincount(drawn.classes.ravel(), minlength=len(noise.qc)) / drawn.classes.size
    np.testing.assert_allclose(freq, noise.qc, atol=0.01)
    un = UnigramNoise(tr.counts, 4)
    assert np.all(un.q[un.draw(targets, 1, 0).words] > 0)  # <s>/<null> are never drawn


# -- the forward pass is the scorer's -----------------------------------------------------------

@pytest.mark.parametrize("fields", [
    dict(arch="lbl", word_width=8),
    dict(arch="lbl", word_width=8, diagonal_contexts=True),
    dict(arch="nplm", word_width=8, hidden=12, hidden_layers=[6]),
    dict(arch="lateral", word_width=8, hidden=12, branches=3, combine="mul", activation="tanh"),
    dict(arch="lateral", word_width=8, hidden=12, branches=2, combine="max"),
])
def test_network_forward_equals_batch_scorer(tmp_path, fields):
    from helpers import brown_vocab

    vocab, counts = brown_vocab()
    header, arrays = random_model(ModelSpec(order=4, **fields), vocab, counts, seed=2)
    path = str(tmp_path / "r.nlm")
    nlmfeature.save(path, header, arrays)
    model = nlmfeature.load(path)
    ctx = np.random.default_rng(0).integers(0, len(vocab), size=(50, 3)).astype(np.int32)
    net = Network(header, {k: np.asarray(v) for k, v in model.arrays.items()})
    np.testing.assert_allclose(net.forward(ctx).H, BatchScorer(model).hidden(ctx), rtol=1e-5, atol=1e-5)


# -- training runs ------------------------------------------------------------------------------

def test_short_run_beats_unigram_and_is_reproducible(tmp_path):
    cfg = config(tmp_path, "a.nlm")
    tr = Trainer(cfg, quiet)
    res = tr.run()
    uni = unigram_perplexity(tr)
    assert res.best_perplexity < 0.75 * uni, (res.best_perplexity, uni)
    assert res.history[-1]["perplexity"] < res.history[0]["perplexity"] or res.best_epoch < 2
    # the written model is what was evaluated (scored by the library's own scorer)
    model = nlmfeature.load(cfg.model_out)
    ppl = model.perplexity(read_lines(BROWN_VALID)).perplexity
    assert ppl == pytest.approx(res.best_perplexity, rel=1e-5)
    assert model.header["metadata"]["estimator"] == "class-nce"
    # <null> is the unigram-weighted average of the input embeddings
    p = model.arrays["unigram"].astype(np.float64).copy()
    p[[tr.vocab.null, tr.vocab.bos]] = 0
    np.testing.assert_allclose(model.arrays["embeddings"][tr.vocab.null],
                               (p / p.sum()) @ model.arrays["embeddings"].astype(np.float64), rtol=1e-4, atol=1e-6)
    # same seed -> same model
    cfg2 = config(tmp_path, "b.nlm")
    res2 = train(cfg2, quiet)
    m2 = nlmfeature.load(cfg2.model_out)
    for name in ("embeddings", "output.weight", "class.weight", "branch0.weights"):
        np.testing.assert_array_equal(model.arrays[name], m2.arrays[name])
    assert res2.history == res.history
    # another seed -> another model
    m3 = nlmfeature.load(train(config(tmp_path, "c.nlm", seed=4), quiet).model_out)
    assert not np.array_equal(model.arrays["embeddings"], m3.arrays["embeddings"])


def test_held_out_evaluations_leave_the_parameters_alone(tmp_path):
    """Each held-out evaluation builds a scorer over the run's own arrays (the direct weights,
    4 MB, on huge pages: anonymous memory) and reads the direct weights for their packed copy;
    a run evaluated every 20 updates ends with the same parameters, bit for bit, as the same
    run evaluated only at its end."""
    kw = dict(output="unnormalised", direct_order=3, hash_space=1 << 20, iterations=1, max_updates=60)
    often = train(config(tmp_path, "often.nlm", eval_every=20, **kw), quiet)
    once = train(config(tmp_path, "once.nlm", eval_every=60, **kw), quiet)
    assert len(often.history) == 3 and len(once.history) == 1
    assert often.history[-1]["perplexity"] == once.history[-1]["perplexity"]
    a, b = nlmfeature.load(often.model_out), nlmfeature.load(once.model_out)
    for k in ("embeddings", "output.weight", "output.bias", "direct.weights"):
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k], err_msg=k)


def _checkpoint_params(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k].copy() for k in z.files if k != "meta"}, json.loads(bytes(z["meta"]))


def test_resume_mid_epoch_equals_uninterrupted_run(tmp_path):
    full = config(tmp_path, "full.nlm", iterations=2, eval_every=100)
    r_full = train(full, quiet)
    part = config(tmp_path, "part.nlm", iterations=2, eval_every=100, max_updates=137)
    train(part, quiet)
    _, meta = _checkpoint_params(checkpoint_path(part.model_out))
    assert meta["step"] == 137 and meta["epoch"] == 0
    part.max_updates = 0
    res = Trainer(part, quiet)
    out = res.run()
    assert out.resumed_from == checkpoint_path(part.model_out)
    # a finished run removes its checkpoint; the models are the same
    assert not os.path.exists(checkpoint_path(full.model_out))
    assert not os.path.exists(checkpoint_path(part.model_out))
    assert out.history == r_full.history
    a, b = nlmfeature.load(full.model_out), nlmfeature.load(part.model_out)
    for k in ("embeddings", "output.weight", "class.weight", "branch0.weights"):
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k], err_msg=k)
    # a checkpoint of other settings is refused with advice
    train(config(tmp_path, "part.nlm", iterations=2, eval_every=100, max_updates=5), quiet)
    other = config(tmp_path, "part.nlm", iterations=2, word_width=16)
    with pytest.raises(NLMFeatureError, match="other settings"):
        train(other, quiet)


def test_evaluations_and_writes_use_the_parameters_without_copying_or_changing_them(tmp_path):
    """The arrays a held-out evaluation scores and a write stores are the trained embeddings
    themselves, their <null> row the unigram-weighted average inside the block only: the
    parameters after it are what they were, and the written model is the copied export's."""
    tr = Trainer(config(tmp_path, "x.nlm", output="unnormalised", noise_samples=10, iterations=1, classes=0), quiet)
    tr.run()
    before = tr.params["embeddings"].copy()
    h1, a1 = tr.model_arrays()
    assert not np.shares_memory(a1["embeddings"], tr.params["embeddings"])
    with tr.exported() as (h, a):
        assert a["embeddings"] is tr.params["embeddings"]
        np.testing.assert_array_equal(a["embeddings"], a1["embeddings"])
        assert not np.array_equal(a["embeddings"][tr.vocab.null], before[tr.vocab.null])
    np.testing.assert_array_equal(tr.params["embeddings"], before)
    tr.write_model()
    np.testing.assert_array_equal(tr.params["embeddings"], before)
    written = nlmfeature.load(tr.cfg.model_out)
    np.testing.assert_array_equal(written.arrays["embeddings"], a1["embeddings"])
    assert tr.perplexity() == pytest.approx(math.exp(-heldout_logprob(h1, a1, tr.heldout).mean()))
    np.testing.assert_array_equal(tr.params["embeddings"], before)


def test_nce_unnormalised_is_approximately_self_normalised(tmp_path):
    cfg = config(tmp_path, output="unnormalised", noise_samples=10, iterations=3, classes=0)
    tr = Trainer(cfg, quiet)
    tr.run()
    h, a = tr.model_arrays()
    raw = heldout_logprob(h, a, tr.heldout)
    exact = heldout_logprob(h, a, tr.heldout, exact=True)
    logz = raw - exact
    print(f"NCE log Z on held-out contexts: mean {logz.mean():.3f} sd {logz.std():.3f}")
    assert abs(logz.mean()) < 0.3 and logz.std() < 0.6
    # the normalised model is a good LM too
    assert math.exp(-exact.mean()) < 0.75 * unigram_perplexity(tr)


def test_self_normalisation_penalty_pulls_log_z_to_zero(tmp_path):
    common = dict(output="unnormalised", noise_samples=0, iterations=2, max_vocab=800, word_width=16)
    spreads = {}
    for alpha in (0.0, 1.0):
        cfg = config(tmp_path, f"sn{alpha}.nlm", self_normalise=alpha, **common) if alpha else \
            config(tmp_path, "sn0.nlm", **dict(common, output="softmax"))
        tr = Trainer(cfg, quiet)
        tr.run()
        h, a = tr.model_arrays()
        h["output"]["type"] = "unnormalised"
        logz = heldout_logprob(h, a, tr.heldout) - heldout_logprob(h, a, tr.heldout, exact=True)
        spreads[alpha] = (abs(logz.mean()), logz.std())
    print("log Z |mean|, sd without / with the penalty:", spreads)
    assert spreads[1.0][0] < 0.2 and spreads[1.0][0] < spreads[0.0][0] / 3


@pytest.mark.parametrize("output,k", [("class", 0), ("class", 5), ("tree", 0)])
def test_factored_models_sum_to_one(tmp_path, output, k):
    cfg = config(tmp_path, output=output, noise_samples=k, iterations=1, direct_order=2 if output == "class" else 0,
                 hash_space=4093)
    train(cfg, quiet)
    model = nlmfeature.load(cfg.model_out)
    V = len(model.vocab)
    rng = np.random.default_rng(1)
    for _ in range(3):
        ctx = rng.integers(0, V, size=(1, cfg.order - 1)).astype(np.int32)
        scores = model.score_batch(np.repeat(ctx, V, axis=0), np.arange(V, dtype=np.int32))
        assert np.exp(scores).sum() == pytest.approx(1.0, abs=1e-4)


def test_tree_and_softmax_ml_learn(tmp_path):
    for out in ("tree", "softmax"):
        tr = Trainer(config(tmp_path, f"{out}.nlm", output=out, noise_samples=0, max_vocab=1000,
                            iterations=2), quiet)
        res = tr.run()
        assert res.best_perplexity < 0.8 * unigram_perplexity(tr), out


def test_direct_features_min_ngram_freq(tmp_path):
    cfg = config(tmp_path, output="unnormalised", noise_samples=5, classes=0, direct_order=3,
                 hash_space=1 << 16, min_ngram_freq=3, iterations=1)
    tr = Trainer(cfg, quiet)
    allowed = tr.objective.out.s.allowed
    assert allowed is not None and 0 < allowed.sum() < len(allowed)
    res = tr.run()
    w = nlmfeature.load(cfg.model_out).arrays["direct.weights"]
    assert np.all(w[allowed == 0] == 0)          # never-trained buckets stay 0
    assert np.count_nonzero(w[allowed == 1]) > 0.5 * allowed.sum()
    assert res.best_perplexity < unigram_perplexity(tr)


def test_class_file_fallbacks(tmp_path):
    sents = [s.split() for s in read_lines(BROWN_TRAIN)]
    vocab, counts = corpus.build_vocabulary(sents, 2)
    # a wcluster paths file that covers only the 300 most frequent words
    paths = tmp_path / "paths"
    with open(paths, "w", encoding="utf-8") as f:
        for i, w in enumerate(vocab.words[4:304]):
            f.write(f"{format(i % 8, '03b')}\t{w}\t{int(counts[i + 4])}\n")
    cfg = config(tmp_path, class_file=str(paths), iterations=1)
    tr = Trainer(cfg, quiet)
    assert tr.header["output"]["classes"] == 8
    res = tr.run()
    assert res.best_perplexity < unigram_perplexity(tr)
    own = Trainer(config(tmp_path, "own.nlm", class_file=str(paths), class_fallback="own"), quiet)
    assert own.header["output"]["classes"] == 9
    with pytest.raises(NLMFeatureError, match="have no class"):
        Trainer(config(tmp_path, class_file=str(paths), class_fallback="error"), quiet)


def test_bad_settings_are_explained(tmp_path):
    with pytest.raises(NLMFeatureError, match="unnormalised output needs NCE"):
        Trainer(config(tmp_path, output="unnormalised", noise_samples=0), quiet)
    with pytest.raises(NLMFeatureError, match="tree output is trained by maximum likelihood"):
        Trainer(config(tmp_path, output="tree", noise_samples=5), quiet)
    with pytest.raises(NLMFeatureError, match="--classes 100000 exceeds"):
        Trainer(config(tmp_path, classes=100000), quiet)


def test_cli_train(tmp_path, capsys):
    from nlmfeature.cli import main

    out = tmp_path / "cli.nlm"
    rc = main(["train", "--train", BROWN_TRAIN, "--test-set", BROWN_VALID, "--model-out", str(out),
               "--order", "3", "--word-width", "16", "--diagonal-contexts", "--output", "class", "--classes", "12",
               "--noise-samples", "4", "--iterations", "1", "--threads", "1", "--no-progress", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert os.path.exists(out) and res["estimator"] == "class-nce" and res["best_perplexity"] > 1
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xfe\n")
    assert main(["train", "--train", str(bad), "--model-out", str(tmp_path / "x.nlm")]) == 2
    assert "bad.txt:2" in capsys.readouterr().err


def test_bench_train_quick_runs(tmp_path, capsys):
    """`nlmfeature bench train --quick` end to end on the test slices (no KenLM): the held-out
    text is read through its compiled corpus, and the exactly normalised perplexities it reports
    are the package's one exact path (nlmfeature.core.model.exactly_normalised)."""
    from nlmfeature.bench.memory import neural_scores
    from nlmfeature.cli import main

    data = tmp_path / "data"
    data.mkdir()
    valid = read_lines(BROWN_VALID)
    for name, lines in (("train", read_lines(BROWN_TRAIN)), ("valid", valid[:150]), ("test", valid[150:])):
        with gzip.open(data / f"{name}.txt.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    out = tmp_path / "out"
    rc = main(["bench", "train", "--quick", "--data", str(data), "--configs",
               "lbl-d200-class-nce,lbl-d200-nce,lbl-d200-nce+direct", "--no-kenlm", "--json",
               "--speed-updates", "5", "--out", str(out)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    rows = {r["config"]: r for r in res["rows"]}
    assert rows["lbl-d200-class-nce"]["estimator"] == "class-nce"
    row = rows["lbl-d200-nce"]
    assert row["test_ppl_normalised"] > 1 and "log_z_sd" in row
    exact = math.exp(-neural_scores(str(out / "lbl-d200-nce.nlm"), [l.split() for l in valid[150:]]).mean())
    assert row["test_ppl_normalised"] == pytest.approx(exact, abs=0.01) and row["test_ppl"] != exact
    direct = rows["lbl-d200-nce+direct"]            # direct features: a sample of test tokens
    assert 0 < direct["normaliser_sample_tokens"] <= 10000 and direct["test_ppl_normalised_sample"] > 1
    assert all(r["words_per_s_1_thread"] > 0 and r["words_per_s_2_threads"] > 0 for r in rows.values())
    assert res["summary"]["best_neural"] in rows


def test_lr_decay_acts_only_when_stalled_and_never_ends_worse(tmp_path):
    """--lr-decay F: after --patience evaluations without improvement, back to the best
    parameters with the step size x F (at most --max-decays times), instead of stopping."""
    common = dict(step_size=1.0, eval_every=20, iterations=3, patience=2)
    plain = Trainer(config(tmp_path, "plain.nlm", **common), quiet)
    r_plain = plain.run()
    dec = Trainer(config(tmp_path, "decay.nlm", lr_decay=0.5, max_decays=2, **common), quiet)
    r_dec = dec.run()
    ppl = [h["perplexity"] for h in dec.history]
    # a single noisy evaluation does not cut the step: a cut needs 2 bad evaluations in a row
    bad = 0
    cuts = 0
    for i in range(1, len(ppl)):
        bad = 0 if ppl[i] < min(ppl[:i]) else bad + 1
        if bad == 2:
            cuts += 1
            bad = 0
    assert dec.decays >= 1 and dec.decays == min(cuts, 2) and dec.opt.lr == pytest.approx(0.5 ** dec.decays)
    # it only goes on from where early stopping would have stopped with the best parameters
    assert r_dec.best_perplexity <= r_plain.best_perplexity + 1e-9
    assert dec.history[:len(plain.history)] == plain.history
    model = nlmfeature.load(dec.cfg.model_out)
    assert model.perplexity(read_lines(BROWN_VALID)).perplexity == pytest.approx(min(ppl), rel=1e-5)
    with pytest.raises(NLMFeatureError, match="--lr-decay acts when --patience"):
        Trainer(config(tmp_path, lr_decay=0.5, patience=0), quiet)


def test_ctrl_c_leaves_a_checkpoint_and_the_run_resumes(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "int.nlm"
    cmd = [sys.executable, "-m", "nlmfeature.cli", "train", "--train", BROWN_TRAIN, "--test-set", BROWN_VALID,
           "--model-out", str(out), "--order", "3", "--word-width", "16", "--output", "class", "--classes", "10", "--direct-order", "0",
           "--noise-samples", "3", "--iterations", "50", "--minibatch-size", "8", "--threads", "1",
           "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ck = checkpoint_path(str(out))
    deadline = time.time() + 60
    while not os.path.exists(str(out)) and time.time() < deadline:  # first evaluation done
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    out_text, err = _, err
    assert proc.returncode == 130, err          # Ctrl-C: interrupted, not a success
    assert "interrupted" in err and "run the same command again to resume" in err
    assert "model:" not in out_text             # no success line
    _, meta = _checkpoint_params(ck)
    assert meta["step"] > 0
    again = subprocess.run(cmd + ["--max-updates", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"resuming from {ck}" in again.stderr
    _, meta2 = _checkpoint_params(ck)
    assert meta2["step"] == meta["step"] + 3


def test_defaults_are_the_measured_recipe_with_early_stopping(tmp_path, capsys):
    """`nlmfeature train` with only the data flags: NCE log-bilinear (diagonal contexts, 200
    wide, direct features of orders 1-3), four evaluations per epoch, early stopping, and no
    checkpoint left behind by the finished run."""
    from nlmfeature.cli import main

    out = tmp_path / "default.nlm"
    assert main(["train", "--train", BROWN_TRAIN, "--test-set", BROWN_VALID, "--model-out", str(out),
                 "--threads", "1", "--no-progress", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    d = TrainConfig()
    assert res["estimator"] == "nce"
    # the perplexity recipe: --output softmax is trained by maximum likelihood (no noise samples)
    assert TrainConfig(output="softmax").noise_samples == 0 and TrainConfig(output="softmax").estimator() == "softmax"
    model = nlmfeature.load(str(out))
    h = model.header
    assert h["arch"] == "lbl" and h["embed_dim"] == d.word_width == 200 and h["branches"][0]["diagonal"]
    assert h["output"]["type"] == "unnormalised" and h["direct"]["order"] == 3
    # four held-out evaluations per epoch; stopped early, after 4 without improvement
    ppl = [e["perplexity"] for e in res["history"]]
    assert [e["epoch"] for e in res["history"][:4]] == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=0.01)
    assert res["epochs"] < d.iterations
    assert min(ppl[-4:]) >= min(ppl[:-4]) and res["best_perplexity"] == pytest.approx(min(ppl))
    assert not os.path.exists(checkpoint_path(str(out)))
    # what --model-out holds is the best evaluation's model (raw unnormalised scores)
    assert model.perplexity(read_lines(BROWN_VALID)).perplexity == pytest.approx(min(ppl), rel=1e-5)


def test_right_to_left_model_reads_sentences_backwards(tmp_path):
    from nlmfeature.mt.rescore import sentence_logprobs

    cfg = config(tmp_path, "r2l.nlm", reverse=True, iterations=1)
    res = train(cfg, quiet)
    model = nlmfeature.load(cfg.model_out)
    assert model.reverse and model.header["metadata"]["reverse"] is True
    lines = read_lines(BROWN_VALID)
    # the held-out perplexity of training (reversed text) is what the library reports
    assert model.perplexity(lines).perplexity == pytest.approx(res.best_perplexity, rel=1e-5)
    sents = [l.split() for l in lines[:50]]
    got = sentence_logprobs(model, sents)
    assert got == pytest.approx([model.sentence_logprob(s) for s in sents], rel=1e-5, abs=1e-4)
    # ... which is the left-to-right scoring of the reversed words
    model.header["metadata"]["reverse"] = False
    assert got == pytest.approx([model.sentence_logprob(s[::-1]) for s in sents], rel=1e-5, abs=1e-4)
    assert got != pytest.approx([model.sentence_logprob(s) for s in sents], rel=1e-3)


def test_unigram_model_trains_writes_and_scores(tmp_path):
    """Order 1 (no context: its context weights are an empty array, which the writer once
    refused with a traceback): the model is written, loads, validates and scores as a
    unigram distribution, the same for every history."""
    cfg = config(tmp_path, "uni.nlm", order=1, output="unnormalised", iterations=1)
    res = train(cfg, quiet)
    model = nlmfeature.load(res.model_out)
    assert model.order == 1
    assert model.arrays["branch0.weights"].size == 0
    a = model.score_sentence(["the", "jury", "said"])
    b = model.score_sentence(["a", "jury", "said"])
    assert a[1] == b[1] and a[2] == b[2] and np.all(np.isfinite(a))


@pytest.mark.parametrize("output, raw", [("unnormalised", True), ("class", False)])
def test_training_log_says_when_its_perplexity_is_of_raw_scores(tmp_path, output, raw):
    """An unnormalised model's held-out perplexity during training is of its raw scores (not
    renormalised); the log line says so, and only for such models."""
    lines = []
    train(TrainConfig(train=BROWN_TRAIN, test_set=BROWN_VALID, model_out=str(tmp_path / "m.nlm"), order=3,
                      word_width=8, output=output, classes=10, iterations=1, evals_per_epoch=1,
                      progress=False, corpus_dir=str(tmp_path)), lines.append)
    evals = [l for l in lines if "held-out perplexity" in l]
    assert evals and all(("(raw scores: unnormalised)" in l) == raw for l in evals)


def test_continued_training_starts_from_the_model_and_adapts_it(tmp_path):
    """--init-model: a model of one text (Brown) trained on, with its vocabulary and
    architecture, on a text of another domain (Multi30k captions) with a held-out set of that
    domain.  With no update the continued model scores exactly as the initial one (its weights,
    direct features included, are loaded as they are); trained, it fits the new domain far
    better; its settings come from the model file, and a flag that disagrees is refused."""
    with gzip.open(os.path.join(os.path.dirname(BROWN_TRAIN), "..", "multi30k", "train.3k.en.gz"), "rt",
                   encoding="utf-8") as f:
        captions = f.read().splitlines()
    (tmp_path / "cap.train").write_text("\n".join(captions[:2500]) + "\n", encoding="utf-8")
    (tmp_path / "cap.valid").write_text("\n".join(captions[2500:]) + "\n", encoding="utf-8")
    base = config(tmp_path, "base.nlm", output="unnormalised", classes=0, noise_samples=5, direct_order=2,
                  hash_space=1 << 14, iterations=1, corpus_dir=str(tmp_path))
    train(base, quiet)
    held_out = read_lines(str(tmp_path / "cap.valid"))
    before = nlmfeature.load(base.model_out)

    def continued(name, **kw):
        return TrainConfig(**dict(dict(train=str(tmp_path / "cap.train"), test_set=str(tmp_path / "cap.valid"),
                                       model_out=str(tmp_path / name), init_model=base.model_out, threads=1,
                                       minibatch_size=128, evals_per_epoch=1, progress=False,
                                       corpus_dir=str(tmp_path)), **kw))

    tr = Trainer(continued("same.nlm", iterations=0), quiet)
    # the model's architecture and estimator, not the defaults (order 8, 10 noise samples)
    assert (tr.cfg.order, tr.cfg.word_width, tr.cfg.noise_samples, tr.cfg.hash_space) == (4, 24, 5, 1 << 14)
    assert tr.vocab.words == before.vocab.words
    # buckets the initial model trained keep training, whatever the new text's n-grams
    allowed = tr.objective.out.s.allowed
    assert allowed is None or np.all(allowed[before.arrays["direct.weights"] != 0] == 1)
    tr.run()
    same = nlmfeature.load(str(tmp_path / "same.nlm"))
    sents = [l.split() for l in held_out[:50]]
    assert [same.sentence_logprob(s) for s in sents] == pytest.approx(
        [before.sentence_logprob(s) for s in sents], rel=1e-6, abs=1e-5)

    res = train(continued("adapted.nlm", iterations=2), quiet)
    adapted = nlmfeature.load(res.model_out)
    assert adapted.vocab.words == before.vocab.words
    assert adapted.header["metadata"]["init_model"] == "base.nlm"
    ppl_before = before.perplexity(held_out).perplexity
    assert adapted.perplexity(held_out).perplexity == pytest.approx(res.best_perplexity, rel=1e-5)
    assert res.best_perplexity < 0.7 * ppl_before, (res.best_perplexity, ppl_before)

    with pytest.raises(NLMFeatureError, match="--order 5 disagrees with .*base.nlm"):
        Trainer(continued("x.nlm", order=5), quiet)
    with pytest.raises(NLMFeatureError, match="the vocabulary is .*base.nlm"):
        Trainer(continued("x.nlm", max_vocab=1000), quiet)
    with pytest.raises(NLMFeatureError, match="joint model is not supported"):
        continued("x.nlm").for_model(dict(before.header, source={"window": 3}))
    from nlmfeature.cli import main

    assert main(["train", "-i", str(tmp_path / "cap.train"), "-o", str(tmp_path / "x.nlm"),
                 "--init-model", str(tmp_path / "missing.nlm")]) == 2
