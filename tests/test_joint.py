"""Joint models (NNJM): affiliation, file format, scorers, training on real parallel text
(Multi30k German-English slice with its real word alignment), perplexity against a
target-only model trained the same way, the C API and k-best rescoring."""
from __future__ import annotations

import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

import nlmfeature
from nlmfeature.core import modelfile
from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model
from nlmfeature.errors import InputError, ModelFileError
from nlmfeature.core.joint import (JointModel, affiliations, joint_sentence_logprobs, parse_alignment,
                              read_parallel, source_windows)
from nlmfeature.training.corpus import build_vocabulary
from nlmfeature.training.trainer import TrainConfig, train
from helpers import cli_in_process

HERE = os.path.dirname(os.path.abspath(__file__))
M30K = os.path.join(HERE, "data", "multi30k")
TRAIN = {k: os.path.join(M30K, f"train.3k.{k}.gz") for k in ("de", "en", "align")}
TEST = {k: os.path.join(M30K, f"test2016.200.{k}") for k in ("de", "en", "align")}
ROOT = os.path.dirname(HERE)


# -- affiliation ------------------------------------------------------------------------------
def test_affiliation_follows_devlin_2014():
    # one link; several links -> the middle one (the right one of two); </s> -> source </s>
    assert affiliations(5, 3, [(0, 0), (1, 1), (3, 1), (2, 2), (4, 2)]).tolist() == [0, 3, 4, 5]
    assert affiliations(5, 1, [(0, 0), (2, 0), (4, 0)]).tolist() == [2, 5]
    # unaligned words inherit the nearest aligned word's affiliation, the right one on ties
    assert affiliations(4, 5, [(0, 0), (3, 4)]).tolist() == [0, 0, 3, 3, 3, 4]
    assert affiliations(4, 4, [(1, 1)]).tolist() == [1, 1, 1, 1, 4]
    # no alignment point at all: the proportional position
    assert affiliations(4, 2, []).tolist() == [0, 2, 4]


def test_windows_pad_with_sentence_boundaries_and_native_agrees(tmp_path):
    model = _random_joint(tmp_path, window=5)
    sv = model.source_vocab
    src = sv.ids("ein mann mit einem orangefarbenen hut".split())
    for aff in range(-1, len(src) + 1):
        native = model.native.source_window_ids(src, aff)
        if aff < 0:
            assert native.tolist() == [sv.null] * 5
            continue
        ref = source_windows(src, np.array([aff]), 5, sv.bos, sv.eos)[0]
        assert native.tolist() == ref.tolist()
    assert source_windows(src, np.array([0]), 5, sv.bos, sv.eos)[0].tolist()[:3] == [sv.bos, sv.bos, src[0]]
    # scoring without a source (Model.score, nlm_score): the <null> window
    ctx, words = model.sentence_ngrams("ein mann", "a man with", "0-0 1-1")
    ctx[:, :5] = sv.null
    assert model.score_ngram(["<s>", "a", "man"], "with") == pytest.approx(model.score_batch(ctx[2:3], words[2:3])[0], abs=1e-5)
    from nlmfeature.decoder.pcache import CachedScorer  # target-only by design
    with pytest.raises(ValueError, match="target-only"):
        CachedScorer(model)
    assert source_windows(src, np.array([len(src)]), 5, sv.bos, sv.eos)[0].tolist()[2:] == [sv.eos] * 3


# -- format and scorers -----------------------------------------------------------------------
def _vocabs():
    srcs, tgts, _ = read_parallel(TRAIN["de"], TRAIN["en"], TRAIN["align"])
    tv, tc = build_vocabulary(tgts, 2)
    sv, sc = build_vocabulary(srcs, 2)
    return tv, tc, sv, sc


def _random_joint(tmp_path, window=7, tables=True, name="joint.nlm", **fields) -> JointModel:
    tv, tc, sv, sc = _vocabs()
    spec = dict(arch="nplm", order=4, word_width=16, hidden=24, output="class", classes=20)
    spec.update(fields)
    header, arrays = random_model(ModelSpec(source_window=window, **spec), tv, tc, seed=3, scale=0.3,
                                  source_vocab=sv, source_counts=sc)
    if tables:
        precompute_tables(header, arrays, diagonal=True)
    path = str(tmp_path / name)
    nlmfeature.save(path, header, arrays)
    return nlmfeature.load(path)


@pytest.mark.parametrize("fields", [
    dict(arch="nplm", output="class", classes=20, hidden_layers=[12]),
    dict(arch="lbl", output="softmax", diagonal_contexts=True),
    dict(arch="lbl", output="tree"),
    dict(arch="lateral", output="unnormalised", branches=2, combine="mul"),
])
def test_native_tables_and_batch_scorers_agree(tmp_path, fields):
    with_tables = _random_joint(tmp_path, name="t.nlm", **fields)
    without = _random_joint(tmp_path, tables=False, name="n.nlm", **fields)
    assert isinstance(with_tables, JointModel) and with_tables.window == 7
    with open(with_tables.path, "rb") as f:
        assert int.from_bytes(f.read(12)[8:], "little") == 2       # joint models: version 2
    src, tgt = [l.strip() for l in open(TEST["de"])][:3], [l.strip() for l in open(TEST["en"])][:3]
    al = [l.strip() for l in open(TEST["align"])][:3]
    for s, t, a in zip(src, tgt, al):
        one = with_tables.score_sentence(s, t, a)
        assert len(one) == len(t.split()) + 1
        assert np.allclose(one, without.score_sentence(s, t, a), atol=2e-5)
        ctx, words = with_tables.sentence_ngrams(s, t, a)
        assert ctx.shape == (len(words), 7 + 3)
        assert np.allclose(one, with_tables.score_batch(ctx, words), atol=2e-5)
        assert np.allclose(one, without.score_batch(ctx, words), atol=2e-5)
        # the source matters: another sentence's source changes the scores
        other = with_tables.score_sentence(src[(src.index(s) + 1) % 3], t, "")
        assert not np.allclose(one, other)


@pytest.mark.parametrize("fields, tables", [
    (dict(arch="lbl", output="unnormalised", diagonal_contexts=True), False),
    (dict(arch="nplm", output="class", classes=20, hidden_layers=[12]), True),
    (dict(arch="lateral", output="unnormalised", branches=2, combine="mul"), False),
])
def test_source_windows_kept_by_a_session_change_no_score(tmp_path, fields, tables):
    # a session keeps each source window's share of the first layer (bias + source positions)
    # across lookups and sentences, in 256 slots; more windows than slots, in shuffled order,
    # so that windows share slots and evict each other: every score has the bits of a fresh
    # session with no cache at all
    model = _random_joint(tmp_path, tables=tables, **fields)
    ctxs, words = [], []
    for s, t, a in zip(*(open(TEST[k]).read().splitlines() for k in ("de", "en", "align"))):
        c, w = model.sentence_ngrams(s, t, a)
        ctxs.append(c)
        words.append(w)
    ctx, word = np.concatenate(ctxs), np.concatenate(words)
    pick = np.random.default_rng(5).choice(len(word), 1500, replace=False)
    ctx, word = np.ascontiguousarray(ctx[pick], dtype=np.int32), np.ascontiguousarray(word[pick], dtype=np.int32)
    assert len({tuple(r) for r in ctx[:, :7].tolist()}) > 2 * 256
    kept = model.native.session()
    kept.begin_sentence(0)
    first = np.asarray(kept.score_padded(ctx, word))
    kept.begin_sentence(1)
    again = np.asarray(kept.score_padded(ctx[::-1].copy(), word[::-1].copy()))[::-1]
    fresh = np.array([np.asarray(model.native.session(cache_entries=0, ngram_entries=0)
                                 .score_padded(ctx[i:i + 1], word[i:i + 1]))[0] for i in range(len(word))])
    assert np.array_equal(first, fresh) and np.array_equal(again, fresh)


def test_target_only_models_stay_format_version_1(tmp_path):
    tv, tc, _, _ = _vocabs()
    header, arrays = random_model(ModelSpec(order=3, word_width=8), tv, tc)
    path = str(tmp_path / "lm.nlm")
    nlmfeature.save(path, header, arrays)
    with open(path, "rb") as f:
        assert int.from_bytes(f.read(12)[8:], "little") == 1
    assert type(nlmfeature.load(path)) is nlmfeature.Model


def test_version_and_header_must_match(tmp_path):
    m = _random_joint(tmp_path, tables=False)
    data = bytearray(open(m.path, "rb").read())
    data[8:12] = (1).to_bytes(4, "little")        # a joint model claiming version 1
    bad = tmp_path / "bad.nlm"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="version 1 does not match"):
        nlmfeature.load(str(bad))


# -- bad input --------------------------------------------------------------------------------
def test_parallel_text_errors_name_file_and_line(tmp_path):
    de, en, al = tmp_path / "x.de", tmp_path / "x.en", tmp_path / "x.align"
    de.write_text("ein hund\nzwei katzen\n")
    en.write_text("a dog\ntwo cats\n")
    al.write_text("0-0 1-1\n")
    with pytest.raises(InputError, match=r"x.align:2: ends here"):
        read_parallel(str(de), str(en), str(al))
    al.write_text("0-0 1-1\n0-0 2-1\n")
    with pytest.raises(InputError, match=r"x.align:2: alignment point '2-1' lies outside"):
        read_parallel(str(de), str(en), str(al))
    al.write_text("0-0 1-1\n0:0\n")
    with pytest.raises(InputError, match=r"x.align:2: alignment point '0:0' is not of the form"):
        read_parallel(str(de), str(en), str(al))
    with pytest.raises(InputError, match="outside"):
        parse_alignment("0-5", 2, 2)


# -- training on real parallel text -----------------------------------------------------------
SMALL = dict(arch="nplm", order=4, word_width=32, hidden=64, output="class", classes=30,
             noise_samples=10, iterations=3, minibatch_size=200, step_size=0.1, threads=1,
             progress=False, min_count=2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A joint model and a target-only model trained identically on the 3k-pair slice."""
    d = tmp_path_factory.mktemp("joint_train")
    joint = TrainConfig(train=TRAIN["en"], source=TRAIN["de"], alignment=TRAIN["align"],
                        test_set=TEST["en"], test_source=TEST["de"], test_alignment=TEST["align"],
                        model_out=str(d / "joint.nlm"), source_window=5, **SMALL)
    lm = TrainConfig(train=TRAIN["en"], test_set=TEST["en"], model_out=str(d / "lm.nlm"), **SMALL)
    return train(joint, log=lambda m: None), train(lm, log=lambda m: None)


def test_joint_model_beats_target_only_model_on_test2016(trained):
    rj, rl = trained
    jm, lm = nlmfeature.load(rj.model_out), nlmfeature.load(rl.model_out)
    assert jm.vocab == lm.vocab and jm.window == 5 and jm.header["metadata"]["affiliation"] == "devlin2014"
    triples = list(zip(open(TEST["de"]), open(TEST["en"]), open(TEST["align"])))
    pj = jm.perplexity((s, t, a.strip()) for s, t, a in triples)
    pl = lm.perplexity(t for _, t, _ in triples)
    assert pj.tokens == pl.tokens and pj.oovs == pl.oovs
    # the trainer's held-out figure is the scorer's
    assert pj.perplexity == pytest.approx(rj.best_perplexity, rel=1e-4)
    print(f"test2016[:200] perplexity: joint {pj.perplexity:.2f}, target-only {pl.perplexity:.2f}")
    assert pj.perplexity < 0.8 * pl.perplexity, (pj.perplexity, pl.perplexity)


def test_perplexity_command_compares_joint_and_target_only(trained, capsys):
    rj, rl = trained
    status, out, err = cli_in_process(["perplexity", "--model", rj.model_out, "--test", TEST["en"], "--source",
                                       TEST["de"], "--alignment", TEST["align"], "--compare", rl.model_out,
                                       "--json"], capsys)
    assert status == 0, err
    res = json.loads(out)
    rows = {r["model"]: r for r in res["rows"]}
    assert rows["joint"]["perplexity"] == pytest.approx(rj.best_perplexity, rel=1e-4)
    assert res["ratio"] == pytest.approx(rows["joint"]["perplexity"] / rows["target-only"]["perplexity"])
    status, _, err = cli_in_process(["perplexity", "--model", rj.model_out, "--test", TEST["en"]], capsys)
    assert status == 2 and "--source" in err
    # nlmfeature score: one total per line, as JointModel.sentence_logprob
    status, out, err = cli_in_process(["score", "--model", rj.model_out, "--input", TEST["en"], "--source",
                                       TEST["de"], "--alignment", TEST["align"]], capsys)
    assert status == 0, err
    jm = nlmfeature.load(rj.model_out)
    totals = [float(x) for x in out.split()]
    assert len(totals) == 200
    for (s, t, a), v in list(zip(zip(open(TEST["de"]), open(TEST["en"]), open(TEST["align"])), totals))[:20]:
        assert v == pytest.approx(jm.sentence_logprob(s, t, a.strip()), abs=1e-4)
    status, _, err = cli_in_process(["score", "--model", rj.model_out, "--input", TEST["en"]], capsys)
    assert status == 2 and "is a joint model" in err


# -- C API ------------------------------------------------------------------------------------
def _config(*flags):
    out = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "config", *flags], check=True,
                         capture_output=True, text=True, cwd=ROOT)
    return shlex.split(out.stdout)


def _c_joint_program(tmp_path, sentences=40):
    """tests/c/test_joint.c built against the C API, and its input: the first test2016 pairs
    as "source TAB target TAB affiliations" lines; returns (program, input, rows)."""
    exe = str(tmp_path / "test_joint")
    subprocess.run(["cc", "-O1", "-Wall", "-Werror", *_config("--cflags"), os.path.join(HERE, "c", "test_joint.c"),
                    "-o", exe, *_config("--libs")], check=True)
    rows = list(zip(open(TEST["de"]), open(TEST["en"]), open(TEST["align"])))[:sentences]
    feed = tmp_path / "feed.txt"
    with open(feed, "w") as f:
        for s, t, a in rows:
            aff = affiliations(len(s.split()), len(t.split()), parse_alignment(a, len(s.split()), len(t.split())))
            f.write(f"{s.strip()}\t{t.strip()}\t{' '.join(map(str, aff))}\n")
    return exe, feed, rows


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_api_scores_equal_python(trained, tmp_path):
    rj, _ = trained
    jm = nlmfeature.load(rj.model_out)
    exe, feed, rows = _c_joint_program(tmp_path)
    p = subprocess.run([exe, rj.model_out, str(feed)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "window=5" in p.stderr
    # nlm_joint_score_span (the Moses feature's one call per expansion) is the per-word sum
    spans = int(p.stderr.split("spans=")[1].split()[0])
    assert spans > 40 and "span_mismatches=0" in p.stderr, p.stderr
    c_scores = [[float(x) for x in line.split()] for line in p.stdout.splitlines()]
    assert len(c_scores) == len(rows)
    for (s, t, a), cs in zip(rows, c_scores):
        assert np.allclose(cs, jm.score_sentence(s, t, a.strip()), atol=1e-5)
    # through the persistent cache: the first run writes, the second reads (keys hold the
    # source window, so a second run's scores are the joint scores, not another window's)
    env = dict(os.environ, NLMFEATURE_PERSISTENT_CACHE="always")
    cache = f"cache={tmp_path / 'pcache'}"
    for run in range(2):
        p = subprocess.run([exe, rj.model_out, str(feed), cache], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        assert [[float(x) for x in line.split()] for line in p.stdout.splitlines()] == c_scores
        hits = int(p.stderr.split("persistent_hits=")[1].split()[0])
        assert (hits == 0) if run == 0 else (hits == sum(len(cs) for cs in c_scores)), p.stderr
    # nlm_score on a joint model: the <null> window (affiliation unknown)
    p = subprocess.run([exe, rj.model_out, str(feed), "null"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    s, t, a = rows[0]
    ctx, words = jm.sentence_ngrams(s, t, a.strip())
    ctx[:, :5] = jm.source_vocab.null
    expect = jm.score_batch(ctx, words)
    assert np.allclose([float(x) for x in p.stdout.splitlines()[0].split()], expect, atol=1e-5)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_persistent_cache_policy_counts_a_joint_model_as_its_target_side(trained, tmp_path):
    # the automatic policy (NLMFEATURE_PERSISTENT_CACHE unset): a class joint model's lookups
    # cost more than a probe, so its cache is used; an unnormalised diagonal LBL joint model
    # sums its source rows once per window (a session's source starts), so a lookup costs what
    # its target side's does and, like a target-only unnormalised model, it goes without the
    # cache, with a line saying so
    exe, feed, _ = _c_joint_program(tmp_path, sentences=10)
    env = {k: v for k, v in os.environ.items() if k != "NLMFEATURE_PERSISTENT_CACHE"}
    cheap = _random_joint(tmp_path, tables=False, name="lbl.nlm", arch="lbl", output="unnormalised",
                          diagonal_contexts=True, window=5)
    for path, used in ((trained[0].model_out, True), (cheap.path, False)):
        cache = tmp_path / ("pc-used" if used else "pc-off")
        for run in range(2):
            p = subprocess.run([exe, path, str(feed), f"cache={cache}"], capture_output=True, text=True, env=env)
            assert p.returncode == 0, p.stderr
            hits = int(p.stderr.split("persistent_hits=")[1].split()[0])
            assert (hits > 0) == (used and run == 1), p.stderr
        assert ("not used" in p.stderr) == (not used) and os.path.isdir(cache) == used, p.stderr


# -- rescoring --------------------------------------------------------------------------------
def test_rescoring_adds_the_joint_feature(trained, tmp_path):
    rj, rl = trained
    jm = nlmfeature.load(rj.model_out)
    rows = list(zip(open(TEST["de"]), open(TEST["en"]), open(TEST["align"])))[:10]
    kb = tmp_path / "list.nbest"
    src = tmp_path / "src.de"
    src.write_text("".join(s for s, _, _ in rows))
    lines, expect = [], []
    for sid, (s, t, a) in enumerate(rows):
        t, a = t.strip(), a.strip()
        words = t.split()
        # the reference and a variant without its last word (alignment points on it dropped)
        for hyp, al in ((t, a), (" ".join(words[:-1]), " ".join(p for p in a.split()
                                                                  if int(p.split("-")[1]) < len(words) - 1))):
            lines.append(f"{sid} ||| {hyp} ||| LM0= -1.5 ||| -1.5 ||| {al}")
            expect.append(jm.sentence_logprob(s, hyp, al))
    kb.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.nbest"
    p = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", rj.model_out, "-m", rl.model_out,
                        "--source", str(src), "-i", str(kb), "-o", str(out), "-q"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    got = []
    for line in out.read_text().splitlines():
        fields = line.split("|||")
        feats = fields[2].split()
        got.append(float(feats[feats.index("NLM0=") + 1]))
        assert fields[4].strip() in (l.split("|||")[4].strip() for l in lines)  # alignment kept
    assert np.allclose(got, expect, atol=1e-4)
    assert np.allclose(joint_sentence_logprobs(jm, [s.split() for s, _, _ in rows],
                                               [t.split() for _, t, _ in rows],
                                               [parse_alignment(a, len(s.split()), len(t.split()))
                                                for s, t, a in rows]),
                       expect[::2], atol=1e-4)
    # without the source, or without alignments: clear errors
    p = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", rj.model_out, "-i", str(kb), "-q"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "--source" in p.stderr
    kb.write_text("0 ||| a dog ||| LM0= -1 ||| -1\n")
    p = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", rj.model_out, "--source", str(src),
                        "-i", str(kb), "-q"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "list.nbest:1" in p.stderr and "print-alignment-info-in-n-best" in p.stderr


# -- the inverse (target-to-source) model, for k-best rescoring -----------------------------------
@pytest.fixture(scope="module")
def inverse(tmp_path_factory):
    """A target-to-source joint model trained on the same files as ``trained``'s joint model."""
    d = tmp_path_factory.mktemp("joint_t2s")
    cfg = TrainConfig(train=TRAIN["en"], source=TRAIN["de"], alignment=TRAIN["align"],
                      test_set=TEST["en"], test_source=TEST["de"], test_alignment=TEST["align"],
                      model_out=str(d / "t2s.nlm"), source_window=5, target_to_source=True, **SMALL)
    return train(cfg, log=lambda m: None)


def _flip(alignment: str) -> str:
    return " ".join("-".join(p.split("-")[::-1]) for p in alignment.split())


def test_inverse_model_predicts_the_source_given_the_target(inverse, trained, tmp_path):
    tm = nlmfeature.load(inverse.model_out)
    assert isinstance(tm, JointModel) and tm.target_to_source and tm.window == 5
    assert tm.describe()["source"]["target_to_source"] is True
    assert not nlmfeature.load(trained[0].model_out).target_to_source
    # its predicted side is German, its window English (the roles of --source / --train swap)
    assert "ein" in tm.vocab and "ein" not in tm.source_vocab and "the" in tm.source_vocab
    rows = [(s.strip(), t.strip(), a.strip()) for s, t, a in zip(open(TEST["de"]), open(TEST["en"]), open(TEST["align"]))]
    ppl = tm.perplexity((t, s, _flip(a)) for s, t, a in rows)
    assert ppl.tokens == sum(len(s.split()) + 1 for s, _, _ in rows)
    assert ppl.perplexity == pytest.approx(inverse.best_perplexity, rel=1e-4)
    # the perplexity and score commands take the direct model's files and swap for it
    out = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "perplexity", "--model", inverse.model_out,
                          "--test", TEST["en"], "--source", TEST["de"], "--alignment", TEST["align"], "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["rows"][0]["perplexity"] == pytest.approx(inverse.best_perplexity, rel=1e-4)
    assert any("inverse joint model" in n and TEST["de"] in n for n in res["notes"])
    out = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "score", "--model", inverse.model_out, "--input",
                          TEST["en"], "--source", TEST["de"], "--alignment", TEST["align"]],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    totals = [float(x) for x in out.stdout.split()]
    assert len(totals) == 200
    for (s, t, a), v in list(zip(rows, totals))[:20]:
        assert v == pytest.approx(tm.sentence_logprob(t, s, _flip(a)), abs=1e-4)
    # a source word's window is around its affiliated target word: the model knows the
    # translation, so dropping a target word changes the source's score
    s, t, a = rows[0]
    short = " ".join(t.split()[:-2])
    al = " ".join(p for p in a.split() if int(p.split("-")[1]) < len(t.split()) - 2)
    assert tm.sentence_logprob(t, s, _flip(a)) != pytest.approx(tm.sentence_logprob(short, s, _flip(al)), abs=1e-3)


def test_rescoring_adds_the_inverse_feature(inverse, trained, tmp_path):
    tm = nlmfeature.load(inverse.model_out)
    rows = [(s.strip(), t.strip(), a.strip()) for s, t, a in list(zip(open(TEST["de"]), open(TEST["en"]), open(TEST["align"])))[:10]]
    src = tmp_path / "src.de"
    src.write_text("".join(s + "\n" for s, _, _ in rows))
    lines, expect = [], []
    for sid, (s, t, a) in enumerate(rows):
        words = t.split()
        for hyp, al in ((t, a), (" ".join(words[:-1]), " ".join(p for p in a.split()
                                                                  if int(p.split("-")[1]) < len(words) - 1))):
            lines.append(f"{sid} ||| {hyp} ||| LM0= -1.5 ||| -1.5 ||| {al}")
            expect.append(tm.sentence_logprob(hyp, s, _flip(al)))    # log p(source | hypothesis)
    kb = tmp_path / "list.nbest"
    kb.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.nbest"
    p = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", trained[0].model_out, "-m",
                        inverse.model_out, "--name", "S2T", "--name", "T2S", "--source", str(src),
                        "-i", str(kb), "-o", str(out), "-q"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    got = []
    for line in out.read_text().splitlines():
        feats = line.split("|||")[2].split()
        got.append(float(feats[feats.index("T2S=") + 1]))
    assert np.allclose(got, expect, atol=1e-4)
    assert len(set(np.round(got, 3))) == len(got)    # every hypothesis its own value


def test_decoders_refuse_the_inverse_model(inverse, tmp_path):
    with pytest.raises(Exception, match="target-to-source"):
        from nlmfeature import _capi
        _capi.load_model(inverse.model_out)
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    exe, feed, _ = _c_joint_program(tmp_path, sentences=2)
    p = subprocess.run([exe, inverse.model_out, str(feed)], capture_output=True, text=True)
    assert p.returncode != 0 and "load failed" in p.stderr and "target-to-source" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_target_to_source_needs_a_parallel_text(tmp_path):
    cfg = TrainConfig(train=TRAIN["en"], model_out=str(tmp_path / "x.nlm"), target_to_source=True, **SMALL)
    with pytest.raises(nlmfeature.NLMFeatureError, match="--target-to-source belong to a joint model"):
        train(cfg, log=lambda m: None)


def test_joint_models_refuse_kenlms_one_sentence_calls(tmp_path):
    """A joint model scores (source, target, alignment): KenLM's one-sentence names say so
    instead of reading the sentence as a source."""
    m = _random_joint(tmp_path)
    for call in (m.score, m.logprob, lambda s: list(m.full_scores(s))):
        with pytest.raises(TypeError, match="is a joint model"):
            call("a man rides a horse")
