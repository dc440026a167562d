"""``nlmfeature bench mt``'s pieces on real data; the whole benchmark runs with a real Moses
(``MOSES_ROOT`` with ``bin/moses`` built with NLMFeature) on a few sentences."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from nlmfeature.bench import mt as bench_mt
from nlmfeature.bench import shared_data
from nlmfeature.cli import main as cli_main
from nlmfeature.mt import moses
from nlmfeature.mt.tuning.driver import first_hypotheses
from nlmfeature.mt.weights import read_weights

from helpers import build_moses2_with_shim, build_moses_with_shim, fake_moses, make_model

TUNING = os.path.join(os.path.dirname(__file__), "data", "tuning")
KBEST = os.path.join(TUNING, "multi30k.dev.iter1.200x30.kbest.gz")
INI = os.path.join(TUNING, "multi30k.dev.iter1.moses.ini")
REF = os.path.join(TUNING, "multi30k.dev.ref.200.en")
SYSTEM = shared_data("moses", "multi30k-de-en")
DATA = shared_data("parallel", "multi30k")


def test_kbest_matrix_reranks_like_the_decoder():
    """Reranked with the weights the list was decoded with, the 1-best is the decoder's."""
    m = bench_mt.KbestMatrix(KBEST)
    decoder = first_hypotheses(KBEST)
    ours = m.one_best(read_weights(INI))
    assert len(ours) == len(decoder) == 200
    assert sum(a == b for a, b in zip(ours, decoder)) >= 198
    # with all weight on the word penalty (negative: fewer words) the shortest one wins
    short = m.one_best({"WordPenalty0": [1.0]})
    assert all(len(a.split()) <= len(b.split()) for a, b in zip(short, decoder))
    assert sum(len(a.split()) < len(b.split()) for a, b in zip(short, decoder)) > 50


def test_mean_pair_bootstrap(tmp_path):
    refs = [l.rstrip("\n") for l in open(REF, encoding="utf-8")]
    ref = tmp_path / "ref"
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    scorer = bench_mt.Scorer(str(ref), str(ref), "en")
    best = tmp_path / "best"
    best.write_text("\n".join(first_hypotheses(KBEST)) + "\n", encoding="utf-8")
    short = tmp_path / "short"
    short.write_text("\n".join(bench_mt.KbestMatrix(KBEST).one_best({"WordPenalty0": [1.0]}))
                     + "\n", encoding="utf-8")
    a, b = scorer.stats(str(best)), scorer.stats(str(short))
    assert bench_mt.score(scorer, "bleu", a["bleu"]) > bench_mt.score(scorer, "bleu", b["bleu"]) + 3
    # a group against itself: p = 1; against clearly worse output: p small
    assert bench_mt.mean_pair_bootstrap(scorer, "bleu", [a["bleu"]] * 2, [a["bleu"]] * 2, 200) == 1.0
    assert bench_mt.mean_pair_bootstrap(scorer, "bleu", [a["bleu"], a["bleu"]],
                                        [b["bleu"], b["bleu"]], 200) < 0.05
    s = bench_mt.summarise([40.0, 41.0, 42.0])
    assert s["mean"] == 41.0 and s["sd"] == 1.0 and (s["min"], s["max"]) == (40.0, 42.0)


@pytest.mark.skipif(not os.path.isdir(SYSTEM), reason="shared Multi30k Moses system not found")
def test_filter_table_keeps_exactly_the_input_phrases(tmp_path):
    src = tmp_path / "in.de"
    src.write_text("ein mann mit einem hut .\nzwei hunde spielen im schnee .\n", encoding="utf-8")
    grams = moses.source_phrases([str(src)])
    table = os.path.join(SYSTEM, "reordering-table.wbe-msd-bidirectional-fe.gz")
    kept, total = moses.filter_table(table, str(tmp_path / "out"), grams)
    assert total == 797291 and 0 < kept < 5000
    with gzip.open(table, "rt", encoding="utf-8") as f:
        expected = [l for l in f if l.split(" ||| ", 1)[0].strip() in grams]
    assert open(tmp_path / "out", encoding="utf-8").readlines() == expected
    assert {l.split(" ||| ")[0] for l in expected} >= {"ein mann", "im schnee", "."}


MOSES = os.path.join(os.environ.get("MOSES_ROOT", "/nonexistent"), "bin", "moses")


@pytest.mark.skipif(not os.access(MOSES, os.X_OK) or not os.path.isdir(DATA),
                    reason="needs MOSES_ROOT with bin/moses (built with NLMFeature) and the shared data")
def test_bench_mt_end_to_end_with_moses(tmp_path, capsys):
    """A tiny run (10 dev and 10 test sentences, one tuning iteration, 20-best rescoring).
    Moses is this checkout's shims with the joint feature (a tree built by
    ../shared/tools/build-decoders.sh has a bin/moses without it)."""
    import nlmfeature
    from nlmfeature.mt.kbest import read_kbest

    moses_bin = build_moses_with_shim(os.environ["MOSES_ROOT"], joint=True)
    model = make_model(tmp_path, order=5)
    second = make_model(tmp_path, name="second.nlm", order=3, seed=1)
    joint = _joint_model(tmp_path)
    inverse = _joint_model(tmp_path, inverse=True)
    work = tmp_path / "bench"
    argv = ["bench", "mt", "--quick", "--quick-sentences", "10", "--test-sentences", "10",
            "--tunings", "2", "--max-iterations", "1", "--kbest", "20", "--model", model,
            "--joint", joint, "--joint", inverse, "--rescore-model", second, "--second-pass", "--workdir",
            str(work), "--threads", "1", "--bootstrap", "100", "--moses", moses_bin, "--nlm-alone"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "QUICK" in out and "== Moses decoding" in out and "rescoring" in out
    doc = json.load(open(work / "bench-mt.json", encoding="utf-8"))
    for part in ("decoding", "rescoring"):
        for name in ("dev", "test"):
            e = doc[part]["scores"][name]["bleu"]
            assert len(e["base"]["runs"]) == 2 and len(e["nlm"]["runs"]) == 2
            assert 0 < e["base"]["mean"] <= 100 and 0 < e["p_value"] <= 1
    assert doc["decoding"]["scores"]["test"]["seconds_per_sentence"]["ratio"] > 0
    # the joint side: decoded with NLMJointFeature, compared with both others
    assert doc["joint"] == [joint, inverse] and "KenLM + NLM + joint" in out
    for name in ("dev", "test"):
        e = doc["decoding"]["scores"][name]["bleu"]
        assert len(e["joint"]["runs"]) == 2 and 0 < e["joint_p_value"] <= 1
        assert 0 < e["joint_vs_nlm_p_value"] <= 1
    assert doc["decoding"]["scores"]["test"]["seconds_per_sentence"]["joint_ratio"] > 0
    # the NLM-only side: decoded without KenLM, compared with KenLM only
    assert "NLM only (no KenLM)" in out
    for name in ("dev", "test"):
        e = doc["decoding"]["scores"][name]["bleu"]
        assert len(e["alone"]["runs"]) == 2 and 0 < e["alone_p_value"] <= 1
    alone = list(work.glob("tuning.*/alone*/run1.moses.ini"))
    assert len(alone) == 2 and all("KENLM" not in t.read_text() and "\nLM0=" not in t.read_text()
                                   and "NLMFeature name=NLM0" in t.read_text() for t in alone)
    # the inverse model is not in the decoder: only the direct one is
    tuned = list(work.glob("tuning.*/joint*/run1.moses.ini"))
    assert len(tuned) == 2 and all(f"NLMJointFeature name=NNJM0 path={joint}" in t.read_text()
                                   and "t2s.nlm" not in t.read_text() for t in tuned)
    assert all("NNJM0=" in t.read_text() for t in tuned)
    # the rescoring part has the joint side too (test_bench_mt_joint_rescoring_with_moses)
    assert doc["rescoring"]["features"]["joint"] == ["NLM0", "NLM1", "NNJM0", "NNJM1"]
    assert len(doc["rescoring"]["scores"]["test"]["bleu"]["joint"]["runs"]) == 2
    # the second pass: each KenLM + NLM tuning's 20-best lists (Moses' NLM0 in them) get the
    # --rescore-model as NLM1; each KenLM + NLM + joint tuning's (NLM0, NNJM0 in them) NLM1 and
    # the inverse model's NNJM1; both retuned from the tuning's weights; against KenLM-only
    # decoding and against each other
    sp = doc["second_pass"]
    assert sp["features"] == {"nlm": ["NLM1"], "joint": ["NLM1", "NNJM1"]}
    assert sp["models"] == [second] and sp["joint"] == [inverse] and "decoding + rescoring" in out
    for name in ("dev", "test"):
        e, d = sp["scores"][name]["bleu"], doc["decoding"]["scores"][name]["bleu"]
        assert e["base"] == d["base"] and len(e["nlm"]["runs"]) == 2 and 0 < e["p_value"] <= 1
        assert len(e["joint"]["runs"]) == 2 and 0 < e["joint_vs_nlm_p_value"] <= 1
    src = [l.split() for l in open(next(work.glob("test.10.src.de")), encoding="utf-8")]
    tm = nlmfeature.load(inverse)
    for seed in (1, 2):
        for side, feats in (("nlm", ["NLM1"]), ("joint", ["NLM1", "NNJM1"])):
            [sdir] = list(work.glob(f"tuning.*/{side}*.mert{seed}/second-pass"))
            [scored] = list(sdir.glob("test.20best.wa.*.gz"))
            hyps = list(read_kbest(str(scored)))
            assert {h.sid for h in hyps} == set(range(10))
            decoder = ["NLM0"] + (["NNJM0"] if side == "joint" else [])
            assert all([l for l, _ in h.features][-len(feats):] == feats
                       and set(decoder) <= {l for l, _ in h.features} for h in hyps)
            if side == "joint":     # the inverse model's value from the hypothesis' alignment
                for h in hyps:
                    flipped = [(j, i) for i, j in (map(int, p.split("-")) for p in h.extra[-1].split())]
                    assert dict(h.features)["NNJM1"][0] == pytest.approx(
                        tm.sentence_logprob(h.text.split(), src[h.sid], flipped), abs=1e-3)
            [w] = list(sdir.glob(f"rescored*.mert{seed}.weights"))
            assert {"NLM0", "LM0", *feats} <= set(read_weights(str(w)))
            [one] = list(sdir.glob(f"test.rescored*.mert{seed}.1best"))
            assert len(open(one).read().splitlines()) == 10
    rows = doc["decoding"]["final_weights_rule"]
    assert len(rows) == 8 and all(r["iterations"] == 1 for r in rows)
    assert os.path.getsize(work / "bench-mt.png") > 1000
    # rerunning reuses every finished step and reports the same scores
    assert cli_main(argv + ["--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["decoding"]["scores"] == doc["decoding"]["scores"]
    assert again["second_pass"]["scores"] == sp["scores"]
    assert np.isclose(again["rescoring"]["scores"]["test"]["bleu"]["nlm"]["mean"],
                      doc["rescoring"]["scores"]["test"]["bleu"]["nlm"]["mean"])


@pytest.mark.decoder
@pytest.mark.skipif(not os.path.exists(os.path.join(os.environ.get("MOSES_ROOT", "/nonexistent"), "moses2", "Jamfile"))
                    or not os.path.isdir(DATA), reason="needs MOSES_ROOT with moses2 and the shared data")
def test_bench_mt_cube_pruning_in_moses2(tmp_path, capsys):
    """``--search cube``: both sides tuned and decoded by Moses2 with cube pruning, kept apart
    from the normal search's work (its own config, tunings and key)."""
    moses2 = build_moses2_with_shim(os.environ["MOSES_ROOT"])
    model = make_model(tmp_path, order=5)
    work = tmp_path / "bench"
    argv = ["bench", "mt", "--decoder", "moses2", "--search", "cube", "--quick", "--quick-sentences", "10",
            "--test-sentences", "10", "--tunings", "1", "--max-iterations", "1", "--no-rescoring",
            "--model", model, "--workdir", str(work), "--threads", "1", "--bootstrap", "100",
            "--moses", moses2, "--json"]
    assert cli_main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "(cube search)" in doc["label"]
    for side in ("base", "nlm"):
        assert len(doc["decoding"]["scores"]["test"]["bleu"][side]["runs"]) == 1
    [base] = list(work.glob("base.*-cube.moses.ini"))
    tuned = list(work.glob("tuning.*-cube/*/run1.moses.ini"))
    assert len(tuned) == 2 and all(d.name.endswith("-cube") for d in work.glob("tuning.*"))
    for ini in [base, *tuned]:
        text = ini.read_text()
        assert text.count("[search-algorithm]") == 1 and "[search-algorithm]\n1\n" in text


@pytest.mark.skipif(not os.access(MOSES, os.X_OK) or not os.path.isdir(DATA),
                    reason="needs MOSES_ROOT with bin/moses and the shared data")
def test_bench_mt_joint_rescoring_with_moses(tmp_path, capsys):
    """The rescoring part alone (--no-decoding; 10 dev and 10 test sentences, 20-best lists):
    Moses' word alignments in the lists, a target-only --model, a rescoring-only
    --rescore-model and a --joint model, three sides tuned twice each."""
    model = make_model(tmp_path, order=5)
    second = make_model(tmp_path, name="second.nlm", order=3, seed=1)
    joint = _joint_model(tmp_path)
    inverse = _joint_model(tmp_path, inverse=True)
    work = tmp_path / "bench"
    argv = ["bench", "mt", "--no-decoding", "--quick", "--quick-sentences", "10",
            "--test-sentences", "10", "--tunings", "2", "--kbest", "20", "--model", model,
            "--rescore-model", second, "--joint", joint, "--joint", inverse, "--workdir", str(work),
            "--threads", "1", "--bootstrap", "100", "--rescore-restarts", "2"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    doc = json.load(open(work / "bench-mt.json", encoding="utf-8"))
    assert "decoding" not in doc
    resc = doc["rescoring"]
    # the joint side adds NNJM0 (and the inverse model's NNJM1) to the NLM side's features
    # (--model, then --rescore-model)
    assert resc["features"] == {"base": [], "nlm": ["NLM0", "NLM1"],
                                "joint": ["NLM0", "NLM1", "NNJM0", "NNJM1"]}
    assert resc["models"] == [model, second] and resc["joint"] == [joint, inverse]
    for name in ("dev", "test"):
        e = resc["scores"][name]["bleu"]
        for side in ("base", "nlm", "joint"):
            assert len(e[side]["runs"]) == 2 and 0 < e[side]["mean"] <= 100
        assert 0 < e["joint_p_value"] <= 1 and 0 < e["joint_vs_nlm_p_value"] <= 1
    assert "KenLM + NLM + joint NLM0 NLM1 NNJM0 NNJM1" in out
    _check_joint_list(work, joint, model, inverse)
    # the joint side's tuned weights name the new features
    [w] = list(work.glob("rescoring.*/joint*.mert1.r2.weights"))
    assert {"NLM0", "NLM1", "NNJM0", "NNJM1", "LM0"} <= set(read_weights(str(w)))
    # the markdown table of the docs: one row per set and metric, three sides each
    assert cli_main(argv + ["--markdown"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 + 2 * 3 and all(r.count("|") == 10 for r in rows)
    e = resc["scores"]["test"]["bleu"]
    [row] = [r for r in rows if r.startswith("| 20-best rescoring | test | bleu |")]
    assert f"{e['joint']['mean']:.2f} ± {e['joint']['sd']:.2f}" in row
    assert f"{e['joint_vs_nlm_difference']:+.2f} ({e['joint_vs_nlm_p_value']:.3f})" in row


def _check_joint_list(work, joint: str, model: str, inverse: str) -> None:
    """Every hypothesis of the rescored joint test list: NNJM0 is the joint model's
    log-probability given the test source and the hypothesis' own Moses word alignment,
    NNJM1 the inverse model's log-probability of the source given the hypothesis, NLM0 the
    target-only model's (the KenLM-only features unchanged)."""
    import nlmfeature
    from nlmfeature.mt.kbest import read_kbest

    [rdir] = list(work.glob("rescoring.*"))
    [plain] = list(rdir.glob("test.20best.wa"))
    [scored] = list(rdir.glob("test.20best.wa.joint*.gz"))
    src = [l.split() for l in open(next(work.glob("test.10.src.de")), encoding="utf-8")]
    jm, lm, tm = nlmfeature.load(joint), nlmfeature.load(model), nlmfeature.load(inverse)
    hyps, base = list(read_kbest(str(scored))), list(read_kbest(str(plain)))
    assert len(hyps) == len(base) > 10 * 10 and {h.sid for h in hyps} == set(range(10))
    aligned = 0
    for h, b in zip(hyps, base):
        feats = dict(h.features)
        assert [l for l, _ in h.features] == [l for l, _ in b.features] + ["NLM0", "NLM1", "NNJM0", "NNJM1"]
        alignment = h.extra[-1]
        assert alignment == b.extra[-1] and "-" in alignment
        aligned += len(alignment.split())
        assert feats["NNJM0"][0] == pytest.approx(
            jm.sentence_logprob(src[h.sid], h.text.split(), alignment), abs=1e-3)
        flipped = [(j, i) for i, j in (map(int, p.split("-")) for p in alignment.split())]
        assert feats["NNJM1"][0] == pytest.approx(
            tm.sentence_logprob(h.text.split(), src[h.sid], flipped), abs=1e-3)
        assert feats["NLM0"][0] == pytest.approx(lm.sentence_logprob(h.text.split()), abs=1e-3)
    assert aligned > len(hyps) * 3


# -- the joint side (--joint) ------------------------------------------------------------------
M30K = os.path.join(os.path.dirname(__file__), "data", "multi30k")


def _joint_model(tmp_path, output="unnormalised", inverse=False) -> str:
    """A small random joint model (window 5) with the vocabularies of the real 3k-pair slice;
    with ``inverse`` an inverse one (train --target-to-source: German words predicted from a
    window of English ones)."""
    import nlmfeature
    from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model
    from nlmfeature.core.joint import read_parallel
    from nlmfeature.training.corpus import build_vocabulary

    srcs, tgts, _ = read_parallel(*(os.path.join(M30K, f"train.3k.{k}.gz") for k in ("de", "en", "align")),
                                  target_to_source=inverse)
    tv, tc = build_vocabulary(tgts, 2)
    sv, sc = build_vocabulary(srcs, 2)
    spec = dict(arch="lbl", order=4, word_width=16, diagonal_contexts=True, output=output)
    if output == "class":
        spec["classes"] = 20
    header, arrays = random_model(ModelSpec(source_window=5, **spec), tv, tc, seed=4 if inverse else 3,
                                  scale=0.3, source_vocab=sv, source_counts=sc)
    precompute_tables(header, arrays, diagonal=True)
    if inverse:
        header["metadata"] = {"target_to_source": True}
    path = str(tmp_path / ("t2s.nlm" if inverse else f"joint-{output}.nlm"))
    nlmfeature.save(path, header, arrays)
    assert nlmfeature.load(path).target_to_source == inverse
    return path


def test_joint_ini_adds_the_joint_feature_to_the_nlm_system(tmp_path):
    from nlmfeature.errors import InputError

    lm, joint = make_model(tmp_path, order=5), _joint_model(tmp_path)
    base = read_weights(INI)
    nlm_path, joint_path = str(tmp_path / "nlm.ini"), str(tmp_path / "joint.ini")
    nlm_w = bench_mt.nlm_ini(INI, nlm_path, [lm], base)
    w = bench_mt.joint_ini(nlm_path, joint_path, joint, nlm_w)
    assert w["NNJM0"] == [base["LM0"][0] / 2] and w["NLM0"] == nlm_w["NLM0"]
    assert read_weights(joint_path) == w
    lines = open(joint_path, encoding="utf-8").read().splitlines()
    feats = lines[lines.index("[feature]") + 1:]
    assert [l for l in feats if l.startswith("NLMJointFeature")] == \
        [f"NLMJointFeature name=NNJM0 path={os.path.abspath(joint)}"]
    # every feature line of the KenLM+NLM system is kept
    nlm_lines = open(nlm_path, encoding="utf-8").read().splitlines()
    nlm_feats = nlm_lines[nlm_lines.index("[feature]") + 1:]
    kept = lambda ls: [l for l in ls if "=" in l and not l.startswith(("NNJM0", "["))]  # noqa: E731
    assert [l for l in kept(feats) if "NLMJointFeature" not in l][:len(kept(nlm_feats)) - len(w) + 1] \
        == kept(nlm_feats)[:len(kept(nlm_feats)) - len(w) + 1]
    # a target-only model is refused, naming the file
    with pytest.raises(InputError, match="not a joint model") as e:
        bench_mt.joint_ini(nlm_path, str(tmp_path / "x.ini"), lm, nlm_w)
    assert lm in str(e.value)


def test_drop_features_removes_the_lm_and_its_weight(tmp_path):
    from nlmfeature.errors import InputError

    dst = str(tmp_path / "alone.ini")
    assert moses.drop_features(INI, dst, ("KENLM",)) == ["LM0"]
    src, out = open(INI, encoding="utf-8").read().splitlines(), open(dst, encoding="utf-8").read().splitlines()
    assert [l for l in src if not l.startswith(("KENLM", "LM0="))] == out
    assert "LM0" not in read_weights(dst) and set(read_weights(dst)) == set(read_weights(INI)) - {"LM0"}
    # a class the file lacks: an error naming the file, nothing written
    with pytest.raises(InputError, match="no NLMFeature feature line") as e:
        moses.drop_features(INI, str(tmp_path / "x.ini"), ("NLMFeature",))
    assert INI in str(e.value) and not (tmp_path / "x.ini").exists()
    # a feature line without name= gets Moses' default label (class and index)
    nameless = tmp_path / "nameless.ini"
    nameless.write_text("[feature]\nKENLM factor=0 path=a.bin order=5\nKENLM factor=0 path=b.bin order=5\n"
                        "WordPenalty\n[weight]\nKENLM0= 0.5\nKENLM1= 0.25\nWordPenalty0= -1\n", encoding="utf-8")
    assert moses.drop_features(str(nameless), dst, ("KENLM",)) == ["KENLM0", "KENLM1"]
    assert open(dst, encoding="utf-8").read() == "[feature]\nWordPenalty\n[weight]\nWordPenalty0= -1\n"


def test_collect_compares_the_joint_side_with_both_others(tmp_path):
    refs = [l.rstrip("\n") for l in open(REF, encoding="utf-8")]
    ref = tmp_path / "ref"
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    scorer = bench_mt.Scorer(str(ref), str(ref), "en")
    m = bench_mt.KbestMatrix(KBEST)
    outs = {}
    for name, hyps in (("best", first_hypotheses(KBEST)), ("short", m.one_best({"WordPenalty0": [1.0]})),
                       ("long", m.one_best({"WordPenalty0": [-1.0]}))):
        outs[name] = str(tmp_path / name)
        open(outs[name], "w", encoding="utf-8").write("\n".join(hyps) + "\n")
    runs = {"base": [{"dev": outs["best"]}] * 2, "nlm": [{"dev": outs["short"]}] * 2,
            "joint": [{"dev": outs["best"]}, {"dev": outs["long"]}]}
    same = dict(runs, joint=runs["base"])
    seconds = {"dev": {"base": [2.0, 2.0], "nlm": [3.0, 3.0], "joint": [4.0, 5.0]}}
    res = bench_mt.collect({"dev": scorer}, runs, 200, seconds, {"dev": 200})["dev"]
    b = res["bleu"]
    s = {k: bench_mt.score(scorer, "bleu", scorer.stats(p)["bleu"]) for k, p in outs.items()}
    assert b["joint"]["runs"] == pytest.approx([s["best"], s["long"]])
    assert b["joint_difference"] == pytest.approx((s["best"] + s["long"]) / 2 - s["best"])
    assert b["joint_vs_nlm_difference"] == pytest.approx((s["best"] + s["long"]) / 2 - s["short"])
    assert b["difference"] == pytest.approx(s["short"] - s["best"])
    assert b["p_value"] < 0.05 and 0 < b["joint_p_value"] <= 1
    # the joint side identical to the base side: p = 1 against it, p small against the worse nlm
    b2 = bench_mt.collect({"dev": scorer}, same, 200)["dev"]["bleu"]
    assert b2["joint_difference"] == 0 and b2["joint_p_value"] == 1.0
    assert b2["joint_vs_nlm_difference"] == pytest.approx(s["best"] - s["short"])
    assert b2["joint_vs_nlm_p_value"] < 0.05
    sp = res["seconds_per_sentence"]
    assert sp["ratio"] == pytest.approx(1.5) and sp["joint_ratio"] == pytest.approx(2.25)
    table = bench_mt.format_table("t", {"dev": res})
    assert "KenLM + NLM + joint" in table and f"{b['joint_difference']:+7.2f}" in table and "x2.25" in table
    # the NLM-only side: compared with KenLM only, in both tables
    three = dict(runs, alone=[{"dev": outs["long"]}] * 2)
    seconds["dev"]["alone"] = [1.0, 1.0]
    ra = bench_mt.collect({"dev": scorer}, three, 200, seconds, {"dev": 200})["dev"]
    assert ra["bleu"]["alone_difference"] == pytest.approx(s["long"] - s["best"])
    assert 0 < ra["bleu"]["alone_p_value"] <= 1 and ra["seconds_per_sentence"]["alone_ratio"] == pytest.approx(0.5)
    table = bench_mt.format_table("t", {"dev": ra})
    assert "NLM only (no KenLM)" in table and f"{ra['bleu']['alone_difference']:+7.2f}" in table
    md = bench_mt.format_markdown({"decoding": {"scores": {"dev": ra}}})
    head = md.splitlines()[0]
    assert "NLM only (no KenLM) | diff (p) | KenLM + NLM + joint" in head
    assert all(l.count("|") == head.count("|") for l in md.splitlines())
    # two sides: no joint entries, the table as before
    two = bench_mt.collect({"dev": scorer}, {k: runs[k] for k in ("base", "nlm")}, 50)["dev"]
    assert "joint" not in two["bleu"] and "joint_p_value" not in two["bleu"]
    assert "joint" not in bench_mt.format_table("t", {"dev": two})


def test_exact_perplexity_of_unnormalised_joint_models(tmp_path):
    """`nlmfeature perplexity --exact` on a joint model: every token's raw score minus log Z
    of its context over the whole target vocabulary (checked against the scorer over every
    word), the raw perplexity and log Z's mean and spread beside it; a class-factored joint
    model is already normalised."""
    import subprocess
    import sys

    import nlmfeature
    from nlmfeature.core.joint import read_parallel

    test = {k: os.path.join(M30K, f"test2016.200.{k}") for k in ("de", "en", "align")}
    unnorm, cls = _joint_model(tmp_path), _joint_model(tmp_path, "class")

    def ppl(model):
        p = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "perplexity", "-m", model, "--exact",
                            "--test", test["en"], "--source", test["de"], "--alignment", test["align"],
                            "--json"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["rows"][0]

    row, crow = ppl(unnorm), ppl(cls)
    tokens = sum(len(l.split()) + 1 for l in open(test["en"], encoding="utf-8"))
    assert row["tokens"] == crow["tokens"] == tokens
    # the exact log-probabilities: raw scores minus log Z over every word, by the scorer
    jm = nlmfeature.load(unnorm)
    srcs, tgts, affs = read_parallel(test["de"], test["en"], test["align"], keep_empty=True)
    from nlmfeature.core.joint import joint_ngrams
    d = joint_ngrams(srcs, tgts, affs, jm.vocab, jm.source_vocab, jm.order, jm.window)
    V = len(jm.vocab)
    raw = np.asarray(jm.score_batch(d.contexts, d.words), dtype=np.float64)
    logz = np.empty(len(d.words))
    for a in range(0, len(d.words), 64):
        c = d.contexts[a:a + 64]
        every = jm.score_batch(np.repeat(c, V, axis=0), np.tile(np.arange(V, dtype=np.int32), len(c)))
        logz[a:a + 64] = np.logaddexp.reduce(np.asarray(every, dtype=np.float64).reshape(len(c), V), axis=1)
    assert row["perplexity"] == pytest.approx(float(np.exp(-(raw - logz).mean())), rel=1e-4)
    assert row["raw_perplexity"] == pytest.approx(float(np.exp(-raw.mean())), rel=1e-4)
    assert row["log_z_mean"] == pytest.approx(float(logz.mean()), abs=1e-3) and abs(row["log_z_mean"]) > 0.1
    # a class-factored model is already normalised: --exact changes nothing
    assert "raw_perplexity" not in crow




# -- the cdec side (--decoder cdec) --------------------------------------------------------------
from test_cdec_shim import CDEC, shim  # noqa: E402,F401  (the shim fixture: cdec_ff built for this tree)


@pytest.mark.decoder
@pytest.mark.skipif(not CDEC or not os.path.exists(CDEC) or not os.path.isdir(DATA)
                    or not os.path.isdir(SYSTEM),
                    reason="needs CDEC_ROOT (a built cdec tree with build/decoder/cdec and "
                           "build/extractor/run_extractor) and the shared Multi30k data")
def test_bench_mt_cdec_end_to_end(tmp_path, capsys, shim):  # noqa: F811
    """cdec's hiero system on 8 dev and 8 test sentences, one tuning of 2 iterations per side:
    grammars extracted by run_extractor, both sides tuned by nlmfeature-tune cdec and decoded,
    scored by the Moses part's code, rows labelled cdec; a rerun reuses everything."""
    from nlmfeature.mt.kbest import read_kbest

    model = make_model(tmp_path, order=5)
    work = tmp_path / "bench"
    argv = ["bench", "mt", "--decoder", "cdec", "--quick", "--quick-sentences", "8",
            "--test-sentences", "8", "--tunings", "1", "--max-iterations", "2", "--model", model,
            "--cdec", CDEC, "--cdec-ff", shim, "--workdir", str(work), "--bootstrap", "100"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "== cdec decoding" in out and "QUICK" in out and "== Moses decoding" not in out
    doc = json.load(open(work / "bench-mt.json", encoding="utf-8"))
    assert doc["decoder"] == "cdec" and "decoding" not in doc and "rescoring" not in doc
    part = doc["cdec"]
    for name in ("dev", "test"):
        entry = part["scores"][name]
        for metric in ("bleu", "detok_bleu", "chrf"):
            for side in ("base", "nlm"):
                assert len(entry[metric][side]["runs"]) == 1
                assert 0 < entry[metric][side]["mean"] <= 100
            assert 0 < entry[metric]["p_value"] <= 1
        assert entry["seconds_per_sentence"]["base"] > 0 and entry["seconds_per_sentence"]["ratio"] > 0
    # the grammars: one per sentence, named in the decoder's input
    sgm = read_lines_of(part["inputs"]["test"])
    assert len(sgm) == 8 and all(l.startswith('<seg grammar="/') for l in sgm)
    assert os.path.getsize(sgm[0].split('"')[1]) > 0
    # the NLM side's config has the NLM line; its k-best lists carry NLM0, the base side's do not
    nlm_ini = open(part["configs"]["nlm"], encoding="utf-8").read().splitlines()
    assert f"feature_function=External {shim} --model {model} --name NLM0" in nlm_ini
    assert not any("External" in l for l in open(part["configs"]["base"], encoding="utf-8"))
    [tuning] = part["tunings"]["nlm"]
    assert len(tuning["iterations"]) == 2
    assert all(0 <= i["dev_bleu"] <= 100 for i in tuning["iterations"])
    [ndir] = list(work.glob("cdec/tuning.*/nlm*.mert1"))
    [bdir] = list(work.glob("cdec/tuning.*/base.mert1"))
    hyps = list(read_kbest(str(ndir / "run1.kbest.gz")))
    assert {h.sid for h in hyps} == set(range(8)) and all("NLM0" in dict(h.features) for h in hyps)
    assert not any("NLM0" in dict(h.features) for h in read_kbest(str(bdir / "run1.kbest.gz")))
    assert "NLM0" in read_weights(str(ndir / "weights.final.txt"))
    # the translations exist, one per test sentence, and are the ones scored
    for d, side in ((bdir, "base"), (ndir, "nlm")):
        hyp = read_lines_of(str(d / "test.last.1best"))
        assert len(hyp) == 8 and sum(len(h.split()) for h in hyp) > 40
        scorer = bench_mt.Scorer(*(str(next(work.glob(f"test.8.{k}.en"))) for k in ("ref", "raw")), "en")
        assert bench_mt.score(scorer, "bleu", scorer.stats(str(d / "test.last.1best"))["bleu"]) == \
            pytest.approx(part["scores"]["test"]["bleu"][side]["mean"])
    # rerunning reuses every finished step and reports the same scores
    assert cli_main(argv + ["--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["cdec"]["scores"] == part["scores"]


def read_lines_of(path: str):
    return open(path, encoding="utf-8").read().splitlines()


def test_bench_mt_cdec_names_what_is_missing(tmp_path, capsys, monkeypatch):
    """Without a cdec tree, or without the feature library, the cdec side stops before any
    work with a message saying what to build (no traceback)."""
    monkeypatch.delenv("CDEC_ROOT", raising=False)
    argv = ["bench", "mt", "--decoder", "cdec", "--workdir", str(tmp_path / "w"),
            "--system", str(tmp_path)]
    assert cli_main(argv) != 0
    err = capsys.readouterr().err
    assert "CDEC_ROOT" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()
    fake = tmp_path / "cdec"
    for rel in ("build/decoder/cdec", "build/extractor/run_extractor"):
        (fake / rel).parent.mkdir(parents=True)
        (fake / rel).write_text("#!/bin/sh\nexit 1\n")
        (fake / rel).chmod(0o755)
    assert cli_main(argv + ["--cdec-root", str(fake), "--cdec-ff", str(tmp_path / "no.so")]) != 0
    err = capsys.readouterr().err
    assert "make -C cdec_ff" in err and str(tmp_path / "no.so") in err


def test_an_inverse_joint_model_is_for_the_rescoring_parts_only(tmp_path, capsys):
    """An inverse joint model (train --target-to-source) cannot go into a decoder: with the
    decoding part and no --second-pass it stops before any work, naming the file,
    --second-pass and --no-decoding."""
    inverse = _joint_model(tmp_path, inverse=True)
    argv = ["bench", "mt", "--joint", inverse, "--workdir", str(tmp_path / "w"), "--system", str(tmp_path)]
    assert cli_main(argv) != 0
    err = capsys.readouterr().err
    assert "t2s.nlm" in err and "--target-to-source" in err and "--no-decoding" in err
    assert "--second-pass" in err
    assert "Traceback" not in err and not (tmp_path / "w").exists()


def test_a_moses_without_the_joint_feature_is_refused_before_any_work(tmp_path, capsys):
    """With a direct --joint model the decoding part needs NLMJointFeature in Moses: a Moses
    with NLMFeature only stops the run before any tuning, naming the binary and the patch."""
    exe = fake_moses(tmp_path / "moses", "NLMFeature")
    joint = _joint_model(tmp_path)
    argv = ["bench", "mt", "--moses", str(exe), "--joint", joint, "--workdir",
            str(tmp_path / "w"), "--system", str(tmp_path)]
    assert cli_main(argv) != 0
    err = capsys.readouterr().err
    assert str(exe) in err and "NLMJointFeature" in err and "moses-joint.patch" in err
    assert "Traceback" not in err and not (tmp_path / "w").exists()


def test_second_pass_needs_the_decoding_part_and_rescoring_models(tmp_path, capsys):
    """--second-pass rescores the decoding part's k-best lists with --rescore-model NLMs: without
    either it stops before any work, saying what is missing."""
    base = ["bench", "mt", "--second-pass", "--workdir", str(tmp_path / "w"), "--system",
            str(tmp_path)]
    for extra in ([], ["--rescore-model", "r2l.nlm", "--no-decoding"],
                  ["--rescore-model", "r2l.nlm", "--decoder", "cdec"]):
        assert cli_main(base + extra) != 0
        err = capsys.readouterr().err
        assert "--second-pass" in err and "--rescore-model" in err and "Traceback" not in err
        assert not (tmp_path / "w").exists()


@pytest.mark.skipif(not os.path.isdir(SYSTEM), reason="shared Multi30k Moses system not found")
def test_several_recipes_train_one_ensemble_model(tmp_path):
    """Without --model, each --recipe trains one model on the system's English side and
    several become one ensemble model file (the default: NCE + self-normalised ML); finished
    models are reused."""
    import argparse

    import nlmfeature

    tiny = "--order 3 --word-width 4 --direct-order 0 --iterations 1 --threads 1"
    system = tmp_path / "system"           # the system's English side, its first 3,000 sentences
    system.mkdir()
    with gzip.open(os.path.join(SYSTEM, "train.tok.lc.en.gz"), "rt", encoding="utf-8") as f, \
            gzip.open(system / "train.tok.lc.en.gz", "wt", encoding="utf-8") as g:
        g.writelines(line for _, line in zip(range(3000), f))
    args = argparse.Namespace(system=str(system), recipe=[tiny, tiny + " --output unnormalised "
                                                          "--noise-samples 0 --self-normalise 0.1"])
    path = bench_mt.train_model(args, str(tmp_path), REF)
    assert path == str(tmp_path / "nlm.ensemble.nlm")
    ens = nlmfeature.load(path)
    members = ens.header["metadata"]["ensemble"]
    assert [m["path"] for m in members] == [str(tmp_path / "nlm0.nlm"), str(tmp_path / "nlm1.nlm")]
    assert members[1]["metadata"]["self_normalise"] == 0.1
    a, b = (nlmfeature.load(m["path"]) for m in members)
    s = "a man is riding a bike".split()
    assert np.allclose(ens.score_sentence(s), (a.score_sentence(s) + b.score_sentence(s)) / 2,
                       atol=1e-5)
    mtime = os.path.getmtime(path)
    assert bench_mt.train_model(args, str(tmp_path), REF) == path
    assert os.path.getmtime(path) == mtime
    assert list(bench_mt.DEFAULT_RECIPES)[1].startswith("--output unnormalised --noise-samples 0")
