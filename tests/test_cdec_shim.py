"""The cdec shim (cdec_ff/): libcdec_ff_nlm.so built against the cdec tree at $CDEC_ROOT, loaded
as an External feature, decoding real fr->en sentences with an SCFG made from a real phrase
table (monotone phrase-based through cdec's glue grammar): every k-best entry's NLM value
equals the Python scorer's sentence log-probability of its output string.

Skipped unless CDEC_ROOT points at a built cdec tree (build/decoder/cdec, or set CDEC_BUILD).
"""
from __future__ import annotations

import gzip
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import nlmfeature
from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model
from nlmfeature.core.vocab import Vocabulary, count_words

from helpers import decode_while_model_changes, phrase_table_models, stats_totals

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data", "decoder")
CDEC_ROOT = os.environ.get("CDEC_ROOT")
CDEC_BUILD = os.environ.get("CDEC_BUILD") or (os.path.join(CDEC_ROOT, "build") if CDEC_ROOT else None)
CDEC = os.path.join(CDEC_BUILD, "decoder", "cdec") if CDEC_BUILD else None

pytestmark = pytest.mark.skipif(not CDEC or not os.path.exists(CDEC),
                                reason="set CDEC_ROOT to a built cdec tree to test the cdec shim")
pytestmark = [pytest.mark.decoder, pytestmark]   # -m decoder / -m "not decoder"; counted in the summary


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    """libcdec_ff_nlm.so built by cdec_ff/Makefile (in a scratch copy of cdec_ff/)."""
    d = tmp_path_factory.mktemp("cdec_ff")
    for name in ("nlm_ff.cc", "nlm_client.h", "Makefile", "exports.map"):
        shutil.copy(os.path.join(REPO, "cdec_ff", name), d / name)
    # flags of the package under test (the `nlmfeature` script on PATH may be another install's)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    p = subprocess.run(["make", f"CDEC_ROOT={CDEC_ROOT}", f"CDEC_BUILD={CDEC_BUILD}",
                        f"NLMFEATURE={sys.executable} -m nlmfeature.cli", "libcdec_ff_nlm.so"], cwd=d, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lib = str(d / "libcdec_ff_nlm.so")
    exported = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout
    assert [l.split()[-1] for l in exported.splitlines()] == ["create_ff"]
    return lib


@pytest.fixture(scope="module")
def grammar(tmp_path_factory) -> str:
    """SCFG rules [X] ||| fr ||| en ||| PT0..PT3 = log phrase-table scores."""
    path = tmp_path_factory.mktemp("cdec_grammar") / "grammar.scfg"
    with gzip.open(os.path.join(DATA, "phrase-table.gz"), "rt", encoding="utf-8") as f, \
            open(path, "w", encoding="utf-8") as out:
        for line in f:
            fr, en, scores = line.rstrip("\n").split(" ||| ")[:3]
            feats = " ".join(f"PT{k}={math.log(float(v)):.6g}" for k, v in enumerate(scores.split()[:4]))
            out.write(f"[X] ||| {fr} ||| {en} ||| {feats}\n")
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cdec_models")
    with gzip.open(os.path.join(DATA, "phrase-table.gz"), "rt", encoding="utf-8") as f:
        counts = count_words(line.split(" ||| ")[1] for line in f)
    vocab = Vocabulary.from_counts(counts, min_count=1)
    c = np.array([counts.get(w, 1) for w in vocab], dtype=np.float64)
    out = {}
    for name, spec in [
        ("unnormalised", ModelSpec(arch="lbl", order=5, word_width=32, diagonal_contexts=True,
                                   output="unnormalised")),
        ("class", ModelSpec(arch="nplm", order=3, word_width=16, hidden=32, activation="relu", hidden_layers=[24], output="class", classes=20)),
    ]:
        header, arrays = random_model(spec, vocab, c, seed=5)
        precompute_tables(header, arrays)
        out[name] = str(d / f"{name}.nlm")
        nlmfeature.save(out[name], header, arrays)
    # a large-corpus vocabulary (V = 100,502, class-factored): the same model as the Moses tests'
    out["large"] = phrase_table_models(d)["large"]
    return out


WEIGHTS = {"PT0": 0.2, "PT1": 0.2, "PT2": 0.2, "PT3": 0.2, "WordPenalty": -0.5, "PassThrough": -1.0,
           "Glue": 0.1, "NLM": 0.3}


def decode(tmp_path, grammar, ff_line=None, k=20, tag="run"):
    ini = tmp_path / f"{tag}.ini"
    lines = ["formalism=scfg", f"grammar={grammar}", "add_pass_through_rules=true",
             "feature_function=WordPenalty"]
    if ff_line:
        lines.append(f"feature_function={ff_line}")
    ini.write_text("\n".join(lines) + "\n")
    w = tmp_path / "weights"
    w.write_text("".join(f"{k_} {v}\n" for k_, v in WEIGHTS.items()))
    p = subprocess.run([CDEC, "-c", str(ini), "-w", str(w), "-i", os.path.join(DATA, "fr.txt"), "-k", str(k),
                        "-r"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    entries = []
    for line in p.stdout.splitlines():
        sid, words, feats, _ = line.split(" ||| ")
        entries.append((int(sid), words.strip(), dict(kv.split("=", 1) for kv in feats.split())))
    return entries, p.stderr


def check_kbest(entries, model_path):
    m = nlmfeature.load(model_path)
    for sid, words, feats in entries:
        v = float(feats["NLM"])
        want = m.sentence_logprob(words.split())
        assert abs(v - want) <= 1e-3 + 1e-5 * abs(want), (sid, words, v, want)


@pytest.mark.parametrize("kind", ["unnormalised", "class", "large"])
def test_kbest_feature_equals_python_sentence_score(shim, grammar, models, tmp_path, kind):
    entries, _ = decode(tmp_path, grammar, f"External {shim} --model {models[kind]} --name NLM")
    assert len({sid for sid, _, _ in entries}) == 10
    assert len(entries) > 50
    check_kbest(entries, models[kind])


def test_decodes_without_the_feature_and_oov_feature(shim, grammar, models, tmp_path):
    base, _ = decode(tmp_path, grammar, tag="base")
    assert len({sid for sid, _, _ in base}) == 10 and all("NLM" not in f for _, _, f in base)
    entries, _ = decode(tmp_path, grammar, f"External {shim} --model {models['unnormalised']} --oov-feature",
                        tag="oov")
    m = nlmfeature.load(models["unnormalised"])
    for sid, words, feats in entries:
        oov = sum(1 for w in words.split() if w not in m.vocab)
        assert float(feats.get("NLM_OOV", 0)) == oov


def test_persistent_cache_second_run(shim, grammar, models, tmp_path):
    d = tmp_path / "pc"
    line = f"External {shim} --model {models['class']} --persistent-cache {d} --stats"
    e1, err1 = decode(tmp_path, grammar, line, tag="p1")
    e2, err2 = decode(tmp_path, grammar, line, tag="p2")
    assert e1 == e2


    t1, t2 = stats_totals(err1, "NLMFeature sentence"), stats_totals(err2, "NLMFeature sentence")
    assert t1["persistent_hits"] == 0 and t1["persistent_written"] > 0
    assert t2["persistent_loaded"] > 0 and t2["persistent_hits"] == t2["lookups"] > 0
    check_kbest(e2, models["class"])


def test_bad_arguments_fail_cleanly(shim, grammar, tmp_path):
    ini = tmp_path / "bad.ini"
    ini.write_text(f"formalism=scfg\ngrammar={grammar}\nfeature_function=External {shim} --model "
                   f"{tmp_path}/missing.nlm\n")
    p = subprocess.run([CDEC, "-c", str(ini), "-i", os.path.join(DATA, "fr.txt")], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1
    assert "missing.nlm: cannot open model file" in p.stderr


def test_model_overwritten_in_place_stops_cdec_with_the_reason(shim, grammar, models, tmp_path):
    # as for Moses: the next sentence start notices `cp new.nlm live.nlm`; cdec stops with
    # exit status 2 and a message naming the file
    live = str(tmp_path / "live.nlm")
    shutil.copyfile(models["unnormalised"], live)
    ini = tmp_path / "live.ini"
    ini.write_text(f"formalism=scfg\ngrammar={grammar}\nadd_pass_through_rules=true\n"
                   f"feature_function=External {shim} --model {live}\n")
    w = tmp_path / "weights"
    w.write_text("".join(f"{k} {v}\n" for k, v in WEIGHTS.items()))
    sentences = open(os.path.join(DATA, "fr.txt"), encoding="utf-8").read().splitlines()
    status, out, err = decode_while_model_changes([CDEC, "-c", str(ini), "-w", str(w)], sentences, live,
                                                  models["class"])
    assert status == 2, err[-2000:]
    assert len(out) == 1
    assert f"{live}: the model file was changed in place" in err
