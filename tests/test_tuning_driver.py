"""The decoder-in-the-loop driver's pieces: config rewriting, merging, convergence, resuming.

Without a decoder the k-best list of an iteration is put in the work directory beforehand
(real Moses lists); the driver then only merges, optimises and writes configs.  The test with a
real Moses runs only when ``MOSES_ROOT`` points at a build with ``bin/moses``.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from nlmfeature.errors import InputError
from nlmfeature.commands.base import size_bytes
from nlmfeature.bench import shared_data
from nlmfeature.cli import tune_main
from nlmfeature.mt.moses import moses_ini_lines, rewrite_moses_ini
from nlmfeature.mt.cdec import rewrite_cdec_ini, write_cdec_weights
from nlmfeature.mt.tuning.data import KbestPool
from nlmfeature.mt.tuning.driver import (DecoderError, Driver, DriverSettings, DriverState,
                                      weights_converged)
from nlmfeature.mt.weights import read_weights

DATA = os.path.join(os.path.dirname(__file__), "data", "tuning")
IT = {i: os.path.join(DATA, f"multi30k.dev.iter{i}.200x30.kbest.gz") for i in (1, 2)}
REF = os.path.join(DATA, "multi30k.dev.ref.200.en")
INI1 = os.path.join(DATA, "multi30k.dev.iter1.moses.ini")
INI2 = os.path.join(DATA, "multi30k.dev.iter2.moses.ini")


# -- config rewriting ---------------------------------------------------------------------------
def test_rewrite_moses_ini_replaces_weights_in_a_copy(tmp_path):
    new = read_weights(INI2)
    out = str(tmp_path / "tuned.ini")
    rewrite_moses_ini(INI1, out, new, {"KENLM": {"persistent-cache": "/tmp/cache"}})
    assert read_weights(out) == new
    with open(INI1, encoding="utf-8") as f:
        original = f.read().splitlines()
    with open(out, encoding="utf-8") as f:
        rewritten = f.read().splitlines()
    assert len(rewritten) == len(original)
    changed = [(a, b) for a, b in zip(original, rewritten) if a != b]
    # only weight lines and the KENLM feature line differ; comments and sections are kept
    assert all(a.split("=")[0] == b.split("=")[0] for a, b in changed if "KENLM" not in a)
    kenlm = [b for a, b in changed if a.startswith("KENLM")]
    assert kenlm == ["KENLM name=LM0 factor=0 path=MODEL_DIR/train.en.5g.binlm order=5 "
                     "persistent-cache=/tmp/cache"]
    assert read_weights(INI1)["UnknownWordPenalty0"] == read_weights(out)["UnknownWordPenalty0"]
    # rewriting again replaces the option instead of adding a second one
    again = str(tmp_path / "again.ini")
    rewrite_moses_ini(out, again, new, {"KENLM": {"persistent-cache": "/tmp/other"}})
    line = [l for l in open(again, encoding="utf-8") if l.startswith("KENLM")][0]
    assert line.count("persistent-cache=") == 1 and "persistent-cache=/tmp/other" in line


def test_rewrite_moses_ini_adds_missing_labels_and_sections(tmp_path):
    src = tmp_path / "min.ini"
    src.write_text("[feature]\nWordPenalty\nNLMFeature path=m.nlm\n\n[weight]\nWordPenalty0= -1\n",
                   encoding="utf-8")
    lines = moses_ini_lines(str(src), {"WordPenalty0": [0.5], "NLMFeature0": [0.25, 0.125]},
                            {"NLMFeature": {"persistent-cache": "/c"}})
    assert lines == ["[feature]", "WordPenalty", "NLMFeature path=m.nlm persistent-cache=/c", "",
                     "[weight]", "WordPenalty0= 0.5", "NLMFeature0= 0.25 0.125"]
    bare = tmp_path / "bare.ini"
    bare.write_text("[feature]\nWordPenalty\n", encoding="utf-8")
    assert moses_ini_lines(str(bare), {"WordPenalty0": [-2.0]})[-2:] == ["[weight]",
                                                                         "WordPenalty0= -2"]


def test_cdec_weights_and_ini(tmp_path):
    w = {"LanguageModel": [0.5], "PhraseModel": [0.1, -0.2]}
    path = str(tmp_path / "weights")
    write_cdec_weights(path, w)
    assert open(path, encoding="utf-8").read() == ("LanguageModel 0.5\nPhraseModel_0 0.1\n"
                                                   "PhraseModel_1 -0.2\n")
    assert read_weights(path) == {"LanguageModel": [0.5], "PhraseModel_0": [0.1],
                                  "PhraseModel_1": [-0.2]}
    ini = tmp_path / "cdec.ini"
    ini.write_text("formalism=scfg\nfeature_function=External /opt/libcdec_ff_nlm.so "
                   "--model m.nlm\nfeature_function=WordPenalty\n", encoding="utf-8")
    out = str(tmp_path / "run.ini")
    rewrite_cdec_ini(str(ini), out, {"libcdec_ff_nlm.so": {"persistent-cache": "/c"}})
    assert open(out, encoding="utf-8").read().splitlines() == [
        "formalism=scfg",
        "feature_function=External /opt/libcdec_ff_nlm.so --model m.nlm --persistent-cache /c",
        "feature_function=WordPenalty"]
    again = str(tmp_path / "again.ini")
    rewrite_cdec_ini(out, again, {"libcdec_ff_nlm.so": {"persistent-cache": "/d"}})
    assert open(again, encoding="utf-8").read().splitlines()[1].endswith(
        "--model m.nlm --persistent-cache /d")


def test_convergence_test_is_on_normalised_weights():
    labels = ["A", "B"]
    old = {"A": [1.0], "B": [-1.0, 2.0], "C": [5.0]}
    assert weights_converged(old, {"A": [2.0], "B": [-2.0, 4.0], "C": [0.0]}, labels)
    assert weights_converged(old, {"A": [0.25], "B": [-0.25, 0.5 + 1e-7]}, labels)
    assert not weights_converged(old, {"A": [0.25], "B": [-0.25, 0.51]}, labels)


# -- the driver without a decoder -------------------------------------------------------------
def settings_for(workdir, **kw):
    base = dict(decoder="moses", binary="/nonexistent/moses", config=INI1, source=REF,
                refs=[REF], workdir=str(workdir), algorithm="mira", max_iterations=1,
                optimiser=dict(epochs=8, seed=1))
    base.update(kw)
    return DriverSettings(**base)


def seed_lists(workdir, iterations):
    os.makedirs(workdir, exist_ok=True)
    for i in iterations:
        shutil.copyfile(IT[i], os.path.join(workdir, f"run{i}.kbest.gz"))


def test_driver_iteration_merges_optimises_and_writes_config(tmp_path):
    wd = tmp_path / "work"
    seed_lists(wd, [1, 2])
    logs = []
    state = Driver(settings_for(wd, max_iterations=2), log=logs.append).run()
    assert state.step == "done" and state.iteration == 2
    assert "max-iterations 2" in state.stop_reason
    assert [h["iteration"] for h in state.history] == [1, 2]
    for h in state.history:
        assert h["pool_bleu_after"] >= h["pool_bleu_before"]
    # the pool holds both lists, without duplicates
    pool = KbestPool.load(str(wd / "pool.npz"), Driver(settings_for(wd)).refs)
    assert len(pool.sources) == 2
    assert state.history[1]["pool_size"] == pool.num_hypotheses
    final = read_weights(str(wd / "moses.ini"))
    assert final == read_weights(str(wd / "run2.weights.out"))
    assert final["UnknownWordPenalty0"] == [1.0]
    tuned = np.array([v for l, vals in final.items() if l != "UnknownWordPenalty0" for v in vals])
    assert np.abs(tuned).sum() == pytest.approx(1.0)
    rows = open(wd / "log.tsv", encoding="utf-8").read().splitlines()
    assert rows[0].startswith("iteration\tdev_bleu") and len(rows) == 3
    # the dev BLEU logged is the decoder 1-best's (the first hypothesis of each sentence)
    assert float(rows[1].split("\t")[1]) == pytest.approx(state.history[0]["dev_bleu"], abs=1e-3)


def test_driver_tunes_on_when_the_iteration_limit_is_raised(tmp_path):
    wd = tmp_path / "work"
    seed_lists(wd, [1, 2])
    first = Driver(settings_for(wd, max_iterations=1), log=lambda m: None).run()
    assert first.iteration == 1 and "max-iterations 1" in first.stop_reason
    # the same limit: nothing to do
    logs = []
    Driver(settings_for(wd, max_iterations=1), log=logs.append).run()
    assert any("already finished" in m for m in logs)
    # a higher limit: iteration 2 decodes with iteration 1's output (its list is here already)
    # and is merged into the same pool, as an uninterrupted 2-iteration tuning would be
    logs = []
    again = Driver(settings_for(wd, max_iterations=2), log=logs.append).run()
    assert any("continuing from iteration 1" in m for m in logs)
    assert again.step == "done" and again.iteration == 2 and "max-iterations 2" in again.stop_reason
    assert [h["iteration"] for h in again.history] == [1, 2]
    straight = tmp_path / "straight"
    seed_lists(straight, [1, 2])
    ref = Driver(settings_for(straight, max_iterations=2), log=lambda m: None).run()
    assert again.weights == ref.weights
    assert read_weights(str(wd / "moses.ini")) == read_weights(str(straight / "moses.ini"))
    assert len(open(wd / "log.tsv", encoding="utf-8").read().splitlines()) == 3


@pytest.mark.parametrize("rule", ["last", "best"])
def test_final_weights_rule(tmp_path, rule):
    """'last' keeps the last optimiser output, 'best' the weights whose decode scored the best
    dev BLEU (iteration 1 decoded the config's weights, iteration 2 run1's output)."""
    wd = tmp_path / "work"
    seed_lists(wd, [1, 2])
    state = Driver(settings_for(wd, max_iterations=2, final_weights=rule), log=lambda m: None).run()
    decoded = {1: read_weights(INI1), 2: read_weights(str(wd / "run1.weights.out"))}
    dev = {h["iteration"]: h["dev_bleu"] for h in state.history}
    best_it = max(dev, key=lambda k: (dev[k], -k))
    assert read_weights(str(wd / "weights.best.txt")) == decoded[best_it]
    assert read_weights(str(wd / "weights.last.txt")) == read_weights(str(wd / "run2.weights.out"))
    expected = decoded[best_it] if rule == "best" else read_weights(str(wd / "run2.weights.out"))
    assert read_weights(str(wd / "moses.ini")) == expected
    assert read_weights(str(wd / "weights.final.txt")) == expected


def test_driver_resumes_after_interruption(tmp_path):
    wd = tmp_path / "work"
    seed_lists(wd, [1])
    first = Driver(settings_for(wd), log=lambda m: None).run()
    size = first.history[0]["pool_size"]
    # a finished run is not redone
    messages = []
    Driver(settings_for(wd), log=messages.append).run()
    assert any("already finished" in m for m in messages)
    # killed while optimising: state says "pooled", the tuned config is missing
    state = DriverState.load(str(wd / "state.json"))
    state.step, state.stop_reason = "pooled", ""
    state.weights = read_weights(INI1)
    state.save(str(wd / "state.json"))
    os.unlink(wd / "moses.ini")
    again = Driver(settings_for(wd), log=lambda m: None).run()
    assert again.step == "done" and (wd / "moses.ini").exists()
    assert KbestPool.load(str(wd / "pool.npz"),
                          Driver(settings_for(wd)).refs).num_hypotheses == size
    assert read_weights(str(wd / "moses.ini")) == read_weights(str(wd / "run1.weights.out"))
    # killed after the pool was saved but before the state said so: no double counting
    state = DriverState.load(str(wd / "state.json"))
    state.step, state.stop_reason = "decoded", ""
    state.save(str(wd / "state.json"))
    third = Driver(settings_for(wd), log=lambda m: None).run()
    assert third.history[-1]["pool_size"] == size
    json.load(open(wd / "state.json", encoding="utf-8"))        # always a complete file


def test_driver_refuses_other_settings_and_reports_decoder_failure(tmp_path):
    wd = tmp_path / "work"
    seed_lists(wd, [1])
    Driver(settings_for(wd), log=lambda m: None).run()
    with pytest.raises(InputError) as exc:
        Driver(settings_for(wd, algorithm="mert"), log=lambda m: None).run()
    assert "algorithm" in str(exc.value)
    # a decoder that fails (here /bin/false) is reported with its log file
    wd2 = tmp_path / "fail"
    with pytest.raises(DecoderError) as exc:
        Driver(settings_for(wd2, binary=shutil.which("false")), log=lambda m: None).run()
    assert "run1.decoder.log" in str(exc.value)
    assert not (wd2 / "run1.kbest.gz").exists()
    cfg = (wd2 / "run1.moses.ini").read_text(encoding="utf-8")
    assert "LM0= 0.5" in cfg
    # iteration 2 decodes with iteration 1's optimised weights (and the persistent cache)
    wd3 = tmp_path / "two"
    seed_lists(wd3, [1])
    cache = tmp_path / "cache"
    with pytest.raises(DecoderError):
        Driver(settings_for(wd3, binary=shutil.which("false"), max_iterations=3,
                            persistent_cache=str(cache), persistent_cache_max=size_bytes("2G"),
                            nlm_features=["KENLM"]),
               log=lambda m: None).run()
    assert read_weights(str(wd3 / "run2.moses.ini")) == read_weights(str(wd3 / "run1.weights.out"))
    line = [x for x in (wd3 / "run2.moses.ini").read_text(encoding="utf-8").splitlines() if x.startswith("KENLM")]
    assert f"persistent-cache={cache}" in line[0] and f"persistent-cache-max={2 << 30}" in line[0]
    assert DriverState.load(str(wd3 / "state.json")).iteration == 2


# -- the command line --------------------------------------------------------------------------
def test_cli_optimise_writes_weights_and_reports_bleu(tmp_path, capsys):
    out = tmp_path / "w.txt"
    best = tmp_path / "1best.txt"
    rc = tune_main(["optimise", "--nbest", IT[1], "--nbest", IT[2], "--ref", REF, "--init", INI1,
                    "--algorithm", "mira", "--epochs", "10", "--out", str(out),
                    "--output-1best", str(best), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "BLEU (re-ranked 1-best) before" in text
    w = read_weights(str(out))
    assert set(w) == set(read_weights(INI1))
    before, after = [float(x) for x in text.split("before ")[1].split("\n")[0].split(" after ")]
    assert after > before
    import sacrebleu

    hyps = best.read_text(encoding="utf-8").splitlines()
    refs = open(REF, encoding="utf-8").read().splitlines()
    assert sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True).score == \
        pytest.approx(after, abs=0.005)


def test_cli_bad_input_exits_with_message(tmp_path, capsys):
    bad = tmp_path / "bad.kbest"
    bad.write_text("0 ||| a b ||| LM0= x ||| 1\n", encoding="utf-8")
    rc = tune_main(["optimise", "--nbest", str(bad), "--ref", REF, "--init", INI1,
                    "--out", str(tmp_path / "w"), "--quiet"])
    assert rc == 2
    assert "bad.kbest:1" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


@pytest.mark.decoder
@pytest.mark.skipif(not os.path.exists(os.path.join(os.environ.get("MOSES_ROOT", "/nonexistent"),
                                                    "bin", "moses")),
                    reason="needs MOSES_ROOT with a built bin/moses")
def test_driver_with_real_moses(tmp_path):
    model = shared_data("moses", "lexicalized-reordering-fr-en")
    if not os.path.isdir(model):
        pytest.skip("shared Moses model not available")
    ini = tmp_path / "moses.ini"
    text = open(os.path.join(model, "moses.ini"), encoding="utf-8").read()
    ini.write_text(text.replace("${MODEL_PATH}/lexicalized-reordering", model), encoding="utf-8")
    ref = tmp_path / "ref"
    ref.write_text("".join(open(os.path.join(DATA, "scorer.reference.20"),
                                encoding="utf-8").readlines()[:5]), encoding="utf-8")
    wd = tmp_path / "work"
    s = DriverSettings(decoder="moses", binary=os.path.join(os.environ["MOSES_ROOT"], "bin", "moses"),
                       config=str(ini), source=os.path.join(model, "to-translate.txt"),
                       refs=[str(ref)], workdir=str(wd), algorithm="mert", max_iterations=2,
                       nbest_size=20, lowercase=True, optimiser=dict(restarts=2, seed=0))
    state = Driver(s, log=lambda m: None).run()
    assert state.step == "done" and (wd / "run1.kbest.gz").exists() and (wd / "moses.ini").exists()
    assert state.history[-1]["pool_bleu_after"] >= state.history[0]["pool_bleu_before"]


CDEC_BIN = os.path.join(os.environ.get("CDEC_ROOT", "/nonexistent"), "build", "decoder", "cdec")
CDEC_TEST = os.path.join(os.environ.get("CDEC_ROOT", "/nonexistent"), "tests", "system_tests",
                         "australia")


@pytest.mark.decoder
@pytest.mark.skipif(not (os.path.exists(CDEC_BIN) and os.path.isdir(CDEC_TEST)),
                    reason="needs CDEC_ROOT with build/decoder/cdec and its system tests")
def test_driver_with_real_cdec(tmp_path):
    for name in ("cdec.ini", "weights", "input.txt", "australia.scfg.gz"):
        shutil.copyfile(os.path.join(CDEC_TEST, name), tmp_path / name)
    ref = tmp_path / "ref"
    ref.write_text("australia is one of the few countries that have diplomatic relations with "
                   "north korea .\n", encoding="utf-8")
    s = DriverSettings(decoder="cdec", binary=CDEC_BIN, config=str(tmp_path / "cdec.ini"),
                       weights=str(tmp_path / "weights"), source=str(tmp_path / "input.txt"),
                       refs=[str(ref)], workdir=str(tmp_path / "work"), algorithm="mert",
                       max_iterations=2, nbest_size=20, optimiser=dict(restarts=2, seed=0))
    state = Driver(s, log=lambda m: None).run()
    assert state.step == "done"
    final = read_weights(str(tmp_path / "work" / "weights.final"))
    # untuned features of the weights file are kept; tuned ones come from the k-best lists
    assert final["LanguageModel"] == [1.0] and "PhraseModel_0" in final
    pool = KbestPool.load(str(tmp_path / "work" / "pool.npz"), Driver(s).refs)
    assert ("PhraseModel_0", 1) in pool.labels
