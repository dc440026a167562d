"""The cdec joint-model feature (cdec_ff/nlm_joint_ff.cc): libcdec_ff_nlmjoint.so built against
the cdec tree at $CDEC_ROOT, decoding real Multi30k German sentences with an SCFG made from the
real phrase table's one-word phrases (aligned 0-0) and pass-through rules, through cdec's
monotone glue grammar: target word i comes from source word i, so every k-best entry's NNJM
value must equal the Python joint scorer's log-probability of its output with alignment i-i.
A second grammar with all phrases (their alignment fields) checks that longer rules decode.

Skipped unless CDEC_ROOT points at a built cdec tree (build/decoder/cdec, or set CDEC_BUILD).
"""
from __future__ import annotations

import gzip
import math
import os
import shutil
import subprocess

import numpy as np
import pytest

import nlmfeature
from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model
from nlmfeature.core.vocab import Vocabulary, count_words
from nlmfeature.mt import cdec as cd

from test_cdec_shim import CDEC, CDEC_BUILD, CDEC_ROOT, pytestmark  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data", "decoder", "multi30k")


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("cdec_ff_joint")
    for name in ("nlm_joint_ff.cc", "nlm_client.h", "Makefile", "exports.map"):
        shutil.copy(os.path.join(REPO, "cdec_ff", name), d / name)
    p = subprocess.run(["make", f"CDEC_ROOT={CDEC_ROOT}", f"CDEC_BUILD={CDEC_BUILD}", "libcdec_ff_nlmjoint.so"],
                       cwd=d, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return str(d / "libcdec_ff_nlmjoint.so")


def _entries():
    with gzip.open(os.path.join(DATA, "phrase-table.gz"), "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").split(" ||| ") for line in f]


def _grammar(path, keep):
    with open(path, "w", encoding="utf-8") as out:
        for e in _entries():
            if keep(e):
                feats = " ".join(f"PT{k}={math.log(float(v)):.6g}" for k, v in enumerate(e[2].split()[:4]))
                out.write(f"[X] ||| {e[0]} ||| {e[1]} ||| {feats} ||| {e[3].strip()}\n")
    return str(path)


@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    d = tmp_path_factory.mktemp("cdec_joint_grammar")
    one = _grammar(d / "words.scfg", lambda e: len(e[0].split()) == 1 and len(e[1].split()) == 1
                   and e[3].strip() == "0-0")
    full = _grammar(d / "all.scfg", lambda e: True)
    return one, full


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    entries = _entries()
    sides = []
    for side in (0, 1):
        counts = count_words(e[side] for e in entries)
        vocab = Vocabulary.from_counts(counts, min_count=2)
        sides.append((vocab, np.array([counts.get(w, 1) for w in vocab], dtype=np.float64)))
    spec = ModelSpec(arch="lbl", order=4, word_width=24, diagonal_contexts=True, output="unnormalised",
                     source_window=5)
    header, arrays = random_model(spec, sides[1][0], sides[1][1], seed=9, scale=0.5,
                                  source_vocab=sides[0][0], source_counts=sides[0][1])
    precompute_tables(header, arrays, diagonal=True)
    path = str(tmp_path_factory.mktemp("cdec_joint_model") / "joint.nlm")
    nlmfeature.save(path, header, arrays)
    return path


def decode(tmp_path, grammar, ff_line, tag, k=20):
    ini = tmp_path / f"{tag}.ini"
    ini.write_text("\n".join(["formalism=scfg", f"grammar={grammar}", "add_pass_through_rules=true",
                              "feature_function=WordPenalty", ff_line]) + "\n")
    w = tmp_path / "weights"
    w.write_text("PT0 0.2\nPT1 0.2\nPT2 0.2\nPT3 0.2\nWordPenalty -0.5\nPassThrough -1\nGlue 0.1\nNNJM 0.3\n")
    p = subprocess.run([CDEC, "-c", str(ini), "-w", str(w), "-i", os.path.join(DATA, "de.txt"), "-k", str(k),
                        "-r"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = []
    for line in p.stdout.splitlines():
        sid, words, feats, _ = line.split(" ||| ")
        out.append((int(sid), words.strip(), dict(kv.split("=", 1) for kv in feats.split())))
    return out


def test_word_rules_give_the_python_joint_score(shim, grammars, model, tmp_path):
    jm = nlmfeature.load(model)
    sources = [l.split() for l in open(os.path.join(DATA, "de.txt"), encoding="utf-8")]
    # the feature line of nlmfeature.mt.cdec, as benchmarks/bench_decoder.py writes it
    entries = decode(tmp_path, grammars[0], cd.nlm_feature_line(model, "NNJM", shim, joint=True), "words")
    assert len({sid for sid, _, _ in entries}) == 5
    for sid, words, feats in entries:
        n = len(words.split())
        assert n == len(sources[sid])
        want = jm.sentence_logprob(sources[sid], words, " ".join(f"{i}-{i}" for i in range(n)))
        v = float(feats["NNJM"])
        assert abs(v - want) <= 1e-3 + 1e-5 * abs(want), (sid, words, v, want)


def test_phrase_rules_decode(shim, grammars, model, tmp_path):
    entries = decode(tmp_path, grammars[1], cd.nlm_feature_line(model, "NNJM", shim, joint=True), "all")
    assert len({sid for sid, _, _ in entries}) == 5
    assert all(math.isfinite(float(f["NNJM"])) and float(f["NNJM"]) < 0 for _, _, f in entries)
