"""nlmfeature-eval against sacrebleu itself on real system outputs (WMT21 de-en)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from nlmfeature.errors import InputError
from nlmfeature.mt.bleu import corpus_bleu
from nlmfeature.cli import eval_main as main
from nlmfeature.mt.evaluate import (chrf_from_stats, evaluate,
                                 paired_bootstrap, resample_indices, resampled_sums,
                                 sentence_stats)

DATA = os.path.join(os.path.dirname(__file__), "data", "kbest")
REF_A = os.path.join(DATA, "wmt21-de-en.200.ref.A.en")
REF_B = os.path.join(DATA, "wmt21-de-en.200.ref.B.en")
UEDIN = os.path.join(DATA, "wmt21-de-en.200.hyp.UEdin.en")
FAIR = os.path.join(DATA, "wmt21-de-en.200.hyp.Facebook-AI.en")
TOK_REF = os.path.join(DATA, "multi30k-dev10.ref.en")


def lines(path):
    with open(path, encoding="utf-8") as f:
        return [l.rstrip("\n") for l in f]


@pytest.mark.parametrize("refs", [[REF_A], [REF_A, REF_B]])
@pytest.mark.parametrize("tokenize,lowercase", [("13a", False), ("none", True), ("intl", False)])
def test_scores_equal_sacrebleu(refs, tokenize, lowercase):
    results, comps = evaluate([UEDIN], refs, tokenize=tokenize, lowercase=lowercase)
    assert comps == []
    ref_lines = [lines(r) for r in refs]
    expect_bleu = sacrebleu.corpus_bleu(lines(UEDIN), ref_lines, tokenize=tokenize,
                                        lowercase=lowercase)
    expect_chrf = CHRF(lowercase=lowercase).corpus_score(lines(UEDIN), ref_lines)
    assert results[0].scores["bleu"] == expect_bleu.score
    assert results[0].scores["chrf"] == expect_chrf.score
    assert f"nrefs:{len(refs)}" in results[0].signatures["bleu"]
    assert f"tok:{tokenize}" in results[0].signatures["bleu"]
    assert results[0].formatted["bleu"].startswith("BLEU|nrefs:")


def test_vectorised_scores_equal_sacrebleu_on_resamples():
    """corpus_bleu (the one BLEU) / chrf_from_stats against sacrebleu's scalar code on 300 resampled
    corpora, including tiny ones where n-gram orders have no matches or no n-grams."""
    refs = [lines(REF_A), lines(REF_B)]
    for metric, fn in ((BLEU(), lambda s, m: corpus_bleu(s)),
                       (CHRF(), lambda s, m: chrf_from_stats(s, m.beta, m.eps_smoothing))):
        st = sentence_stats(metric, lines(FAIR), refs)
        rng = np.random.default_rng(0)
        rows = [st[rng.integers(0, len(st), size=k)].sum(0) for k in (1, 1, 2, 3, 200) * 60]
        rows.append(np.zeros(st.shape[1]))
        got = fn(np.array(rows), metric)
        want = [metric._compute_score_from_stats([int(x) for x in r]).score for r in rows]
        assert np.allclose(got, want, atol=1e-9, rtol=0)


def test_paired_bootstrap_matches_sacrebleu_paired_bs():
    from sacrebleu.significance import PairedTest

    refs = [lines(REF_A), lines(REF_B)]
    results, comps = evaluate([UEDIN, FAIR], [REF_A, REF_B], tokenize="13a", bootstrap=300,
                             seed=12345)
    metrics = {"BLEU": BLEU(), "chrF": CHRF()}
    _, scores = PairedTest([("base", lines(UEDIN)), ("sys", lines(FAIR))], metrics, refs,
                           test_type="bs", n_samples=300)()
    by_name = {c.metric: c for c in comps}
    for ours, theirs in (("bleu", "BLEU"), ("chrf", "chrF2")):
        res = scores[theirs][1]
        assert by_name[ours].p_value == pytest.approx(res.p_value, abs=1e-12)
        assert by_name[ours].system == pytest.approx(res.score, abs=1e-9)
        assert by_name[ours].system_mean == pytest.approx(res.mean, abs=1e-3)
        assert by_name[ours].system_ci == pytest.approx(res.ci, abs=1e-3)
        assert by_name[ours].baseline == results[0].scores[ours]


def test_bootstrap_of_a_system_against_itself_is_not_significant():
    refs = [lines(REF_A)]
    m = BLEU()
    st = sentence_stats(m, lines(FAIR), refs)
    c = paired_bootstrap("bleu", m, st, st, samples=200, seed=1)
    assert c.difference == 0 and c.p_value == 1.0
    # a clearly worse system (every hypothesis cut to its first 3 words) is significant
    worse = [" ".join(l.split()[:3]) for l in lines(FAIR)]
    c = paired_bootstrap("bleu", m, sentence_stats(m, worse, refs), st, samples=200, seed=1)
    assert c.difference > 10 and c.p_value < 0.01 and c.system_better_fraction == 1.0


def test_resampled_sums_in_blocks_equal_direct_sums():
    st = np.arange(60, dtype=np.float64).reshape(20, 3)
    idx = resample_indices(20, 37, seed=3)
    direct = st[idx].sum(axis=1)
    assert np.array_equal(resampled_sums(st, idx, block_bytes=8 * 20 * 4), direct)
    assert np.array_equal(resampled_sums(st, idx), direct)


def test_sentence_level_scores_equal_sacrebleu():
    results, _ = evaluate([FAIR], [REF_A, REF_B], tokenize="13a", sentence_level=True)
    hyps, ra, rb = lines(FAIR), lines(REF_A), lines(REF_B)
    bleu = results[0].sentence_scores["bleu"]
    chrf = results[0].sentence_scores["chrf"]
    for k in range(0, 200, 7):
        assert bleu[k] == pytest.approx(sacrebleu.sentence_bleu(hyps[k], [ra[k], rb[k]]).score,
                                        abs=1e-9)
        assert chrf[k] == pytest.approx(sacrebleu.sentence_chrf(hyps[k], [ra[k], rb[k]]).score,
                                        abs=1e-9)


def test_cli_text_json_and_tokenised_input(tmp_path, capsys):
    # detokenised WMT text: 13a, as sacrebleu's default
    assert main(["--ref", REF_A, "--ref", REF_B, UEDIN, FAIR, "--tokenize", "13a",
                 "--bootstrap", "100"]) == 0
    out = capsys.readouterr().out
    assert "BLEU|nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:" in out
    assert "chrF2|nrefs:2" in out and "p = " in out and "paired bootstrap, 100 resamples" in out
    # a 1-best file written from a k-best list, scored with --tokenize none --json
    one = tmp_path / "one.best"
    from nlmfeature.mt.kbest import group_by_sentence, read_kbest

    one.write_text("".join(g[0].text + "\n" for _, g in
                           group_by_sentence(read_kbest(os.path.join(
                               DATA, "moses-multi30k-dev10.100best.gz")))))
    assert main(["--ref", TOK_REF, "--tokenize", "none", "--json", "--sentence-level",
                 str(one)]) == 0
    doc = json.loads(capsys.readouterr().out)
    sys0 = doc["systems"][0]
    expect = sacrebleu.corpus_bleu(lines(str(one)), [lines(TOK_REF)], tokenize="none").score
    assert sys0["scores"]["bleu"] == expect and len(sys0["sentence_scores"]["bleu"]) == 10
    assert doc["comparisons"] == []


def test_mismatched_reference_is_an_error_naming_the_file(tmp_path, capsys):
    short = tmp_path / "short.ref"
    short.write_text("".join(l + "\n" for l in lines(REF_A)[:150]))
    with pytest.raises(InputError) as e:
        evaluate([UEDIN], [REF_A, str(short)])
    assert str(e.value).startswith(f"{short}:151: the file ends after 150 lines, but {UEDIN} has 200")
    assert main(["--ref", str(short), UEDIN]) == 2
    assert f"{short}:151:" in capsys.readouterr().err
    longer = tmp_path / "long.ref"
    longer.write_text("".join(l + "\n" for l in lines(REF_A) + ["extra"]))
    assert main(["--ref", str(longer), UEDIN]) == 2
    assert f"{UEDIN}:201: the file ends after 200 lines, but {longer} has 201" in \
        capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.write_text("")
    assert main(["--ref", REF_A, str(empty)]) == 2
    assert f"{empty}: the file is empty" in capsys.readouterr().err
    assert main(["--ref", REF_A, "--tokenize", "nonsense", UEDIN]) == 2
    assert "unknown --tokenize" in capsys.readouterr().err


MULTI30K_RAW = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "parallel",
                            "multi30k", "test.en.gz")
MULTI30K_TOK = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "nbest",
                            "moses-multi30k-de-en", "test.ref.en.gz")


@pytest.mark.skipif(not os.path.exists(MULTI30K_RAW), reason="shared Multi30k data not found")
def test_detok_scores_tokenised_text_against_raw_references(tmp_path, capsys):
    """--detok: the Perl-tokenised lowercased reference, detokenised, nearly equals the raw one
    (BLEU as papers report it); scored without detokenising it is far lower."""
    hyp = tmp_path / "tok.en"
    import gzip

    with gzip.open(MULTI30K_TOK, "rt", encoding="utf-8") as f:
        hyp.write_text(f.read(), encoding="utf-8")
    (detok,), _ = evaluate([str(hyp)], [MULTI30K_RAW], tokenize="13a", lowercase=True, detok="en")
    (plain,), _ = evaluate([str(hyp)], [MULTI30K_RAW], tokenize="13a", lowercase=True)
    assert detok.scores["bleu"] > 99.5
    assert plain.scores["bleu"] < detok.scores["bleu"] - 2   # &apos; &quot; @-@ unresolved
    assert main(["--detok", "--lowercase", "--json", "-r", MULTI30K_RAW, "--tok-ref",
                 MULTI30K_TOK, str(hyp)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["detokenise"] == "en"
    assert doc["systems"][0]["scores"]["bleu"] == detok.scores["bleu"]
    assert doc["tokenised"]["systems"][0]["scores"]["bleu"] == pytest.approx(100.0)
    assert main(["--tok-ref", MULTI30K_TOK, "-r", MULTI30K_RAW, str(hyp)]) == 2
