"""nlmfeature-rescore on real k-best lists with small random models."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

import nlmfeature
from helpers import make_model
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.mt.kbest import read_kbest
from nlmfeature.io.textio import iter_lines
from nlmfeature.cli import rescore_main as main
from nlmfeature.mt.rescore import feature_names, rescore, sentence_logprobs
from nlmfeature.mt.weights import read_weights

DATA = os.path.join(os.path.dirname(__file__), "data", "kbest")
MOSES = os.path.join(DATA, "moses-multi30k-dev10.100best.gz")
MOSES_OLD = os.path.join(DATA, "moses-old-fr-en5.nbest.gz")
CDEC = os.path.join(DATA, "cdec-synparse.kbest")
MOSES_IT2 = os.path.join(DATA, "moses-multi30k-dev3.iter2.100best.gz")
INI = os.path.join(DATA, "multi30k-dev.iter2.moses.ini")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return (make_model(d, "lbl5.nlm", order=5, word_width=16, seed=1),
            make_model(d, "nplm3.nlm", arch="nplm", order=3, word_width=16, hidden=32,
                       output="softmax", seed=2))


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sentence_logprobs_equal_the_model_api(models):
    m = nlmfeature.load(models[0])
    sents = [h.text.split() for h in read_kbest(MOSES)][:300] + [[], ["<unk>", "qqqzz"]]
    fast = sentence_logprobs(m, sents, batch_size=257)
    assert np.allclose(fast, [m.sentence_logprob(s) for s in sents], atol=1e-4, rtol=0)
    assert np.allclose(fast, m.score_sentences(sents), atol=1e-9, rtol=0)


def test_appends_exactly_the_sentence_logprob(models, tmp_path, capsys):
    out = tmp_path / "out.100best.gz"
    code, _, err = run(["-m", models[0], "-i", MOSES, "-o", str(out), "-q"], capsys)
    assert code == 0, err
    lm = nlmfeature.load(models[0])
    before = list(read_kbest(MOSES))
    after = list(read_kbest(str(out)))
    assert len(after) == len(before) == 687
    for b, a in zip(before, after):
        assert a.features[:-1] == b.features and a.total == b.total and a.text == b.text
        label, (value,) = a.features[-1]
        assert label == "NLM0"
        assert value == pytest.approx(lm.sentence_logprob(b.text.split()), abs=1e-4)
    # the rest of each line is copied verbatim; the feature is appended Moses-style
    raw_in = [l for _, l in iter_lines(MOSES)]
    raw_out = [l for _, l in iter_lines(str(out))]
    for i, o in zip(raw_in, raw_out):
        head, _, tail = i.rpartition(" ||| ")
        assert o.startswith(head + " NLM0= ") and o.endswith(" ||| " + tail)


def test_old_style_labels_two_models_and_oov_counts(models, tmp_path, capsys):
    out = tmp_path / "old.out"
    code, _, err = run(["-m", models[0], "-m", models[1], "--oov-feature", "-i", MOSES_OLD,
                        "-o", str(out), "-q"], capsys)
    assert code == 0, err
    lms = [nlmfeature.load(p) for p in models]
    raw = [l for _, l in iter_lines(str(out))]
    assert " NLM0: " in raw[0] and " NLM1: " in raw[0] and " NLMOOV1: " in raw[0]
    hyps = list(read_kbest(str(out)))
    assert [l for l, _ in hyps[0].features] == ["d", "lm", "tm", "w", "NLM0", "NLM1",
                                                "NLMOOV0", "NLMOOV1"]
    for h in hyps:
        toks = h.text.split()
        f = dict(h.features)
        for i, lm in enumerate(lms):
            assert f[f"NLM{i}"][0] == pytest.approx(lm.sentence_logprob(toks), abs=1e-4)
            assert f[f"NLMOOV{i}"][0] == sum(t not in lm.vocab for t in toks)
    assert sum(dict(h.features)["NLMOOV0"][0] for h in hyps) > 0   # the test sees OOVs


def test_cdec_list_gets_name_value_features(models, tmp_path, capsys):
    out = tmp_path / "cdec.out"
    code, _, err = run(["-m", models[0], "--name", "NLMbig", "--oov-feature", "-i", CDEC,
                        "-o", str(out), "-q"], capsys)
    assert code == 0, err
    lm = nlmfeature.load(models[0])
    raw = [l for _, l in iter_lines(str(out))]
    assert "F7=1 NLMbig=" in raw[0] and " NLMbigOOV=" in raw[0]
    for h in read_kbest(str(out)):
        assert h.features[-2][0] == "NLMbig"
        assert h.features[-2][1][0] == pytest.approx(lm.sentence_logprob(h.text.split()), abs=1e-4)


def test_jobs_2_output_is_identical_to_jobs_1(models, tmp_path, capsys):
    outs = []
    for jobs in (1, 2):
        out = tmp_path / f"out{jobs}.gz"
        code, _, err = run(["-m", models[0], "--oov-feature", "-i", MOSES, "-o", str(out),
                            "--jobs", str(jobs), "--chunk-size", "50", "-q"], capsys)
        assert code == 0, err
        with gzip.open(out, "rt") as f:
            outs.append(f.read())
    assert outs[0] == outs[1] and outs[0].count("\n") == 687


def test_rerank_with_weights_writes_the_best_by_dot_product(models, tmp_path, capsys):
    weights = tmp_path / "w.ini"
    weights.write_text(open(INI).read().replace("[weight]\n", "[weight]\nNLM0= 0.3\n"))
    one = tmp_path / "one.best"
    nbest = tmp_path / "rescored.gz"
    code, _, err = run(["-m", models[0], "-i", MOSES_IT2, "-o", str(nbest), "--weights",
                        str(weights), "--one-best", str(one), "--update-total", "-q"], capsys)
    assert code == 0, err
    w = read_weights(str(weights))
    by_sid = {}
    for h in read_kbest(str(nbest)):
        score = sum(a * b for label, vals in h.features for a, b in zip(w[label], vals))
        assert h.total == pytest.approx(score, abs=1e-9)       # --update-total
        if h.sid not in by_sid or score > by_sid[h.sid][0]:
            by_sid[h.sid] = (score, h.text)
    best = one.read_text().splitlines()
    assert best == [by_sid[s][1] for s in range(3)]
    # the NLM weight matters: without it the 1-best is the decoder's (first) hypothesis
    weights.write_text(open(INI).read().replace("[weight]\n", "[weight]\nNLM0= 0\n"))
    run(["-m", models[0], "-i", MOSES_IT2, "--weights", str(weights), "--one-best", str(one),
         "-q"], capsys)
    firsts = {}
    for h in read_kbest(MOSES_IT2):
        firsts.setdefault(h.sid, h.text)
    assert one.read_text().splitlines() == [firsts[s] for s in range(3)]


def test_missing_sentence_ids_give_empty_one_best_lines(models, tmp_path, capsys):
    lines = [l for _, l in iter_lines(MOSES_IT2)]
    gap = tmp_path / "gap.100best"
    gap.write_text("\n".join(l for l in lines if not l.startswith("1 ")) + "\n")
    w = tmp_path / "w"
    w.write_text(open(INI).read())
    one = tmp_path / "one"
    code, _, err = run(["-m", models[0], "-i", str(gap), "--weights", str(w), "--one-best",
                        str(one), "--sentences", "5", "-q"], capsys)
    assert code == 0, err
    best = one.read_text().split("\n")[:-1]
    assert len(best) == 5 and best[1] == "" and best[3] == best[4] == "" and best[0] and best[2]
    assert "sentence id(s) 1 missing" in err and f"{gap}:" in err
    assert "3 sentence id(s) missing" in err and "(1, 3, 4)" in err


def test_rescore_refuses_names_with_underscore_and_clashes(models, tmp_path, capsys):
    code, _, err = run(["-m", models[0], "--name", "NLM_big", "-i", MOSES, "-q"], capsys)
    assert code == 2 and "'NLM_big' is not allowed" in err and "sparse" in err
    with pytest.raises(NLMFeatureError, match="given twice"):
        feature_names(2, ["A", "A"], False)
    assert feature_names(2, None, True) == (["NLM0", "NLM1"], ["NLMOOV0", "NLMOOV1"])
    # rescoring an already rescored list with the same name is refused, naming the line
    out = tmp_path / "once"
    assert run(["-m", models[0], "-i", CDEC, "-o", str(out), "-q"], capsys)[0] == 0
    code, _, err = run(["-m", models[0], "-i", str(out), "-o", str(tmp_path / "twice"), "-q"],
                       capsys)
    assert code == 2 and f"{out}:1: the list already has feature(s) ['NLM0']" in err
    assert not (tmp_path / "twice").exists()


@pytest.mark.parametrize("mutate,message", [
    (lambda ls: [], "the k-best list is empty"),
    (lambda ls: ls[:5] + ["0 ||| only two fields"] + ls[5:], ":6: a k-best line needs at least 3"),
    (lambda ls: ls[:7] + [ls[7].replace("LM0= ", "LM0= x")] + ls[8:], ":8: value of feature 'LM0'"),
    (lambda ls: ls[:3] + ["zero" + ls[3][1:]] + ls[4:], ":4: sentence id 'zero' is not an integer"),
    (lambda ls: ls[:150] + ls[:1], ":151: sentence id 0 reappears after sentence 2"),
])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_bad_input_is_an_error_with_file_and_line(models, tmp_path, capsys, mutate, message,
                                                  jobs):
    lines = mutate([l for _, l in iter_lines(MOSES)][:200])
    bad = tmp_path / "bad.100best"
    bad.write_text("".join(l + "\n" for l in lines))
    out = tmp_path / "out.gz"
    code, _, err = run(["-m", models[0], "-i", str(bad), "-o", str(out), "-j", jobs,
                        "--chunk-size", "20", "-q"], capsys)
    assert code == 2
    assert f"error: {bad}{message}" in err or (message.startswith("the") and
                                              f"error: {bad}: {message}" in err), err
    assert not out.exists()          # no partial output


def test_skip_bad_counts_the_skipped_lines(models, tmp_path, capsys):
    lines = [l for _, l in iter_lines(MOSES)][:120]
    lines[10] = lines[10].replace("WordPenalty0= ", "WordPenalty0= nan? ")
    lines[11] = "0 |||"
    lines.insert(50, "")
    bad = tmp_path / "bad.100best"
    bad.write_text("".join(l + "\n" for l in lines))
    out = tmp_path / "out"
    code, _, err = run(["-m", models[0], "-i", str(bad), "-o", str(out), "--skip-bad",
                        "--chunk-size", "30"], capsys)
    assert code == 0
    assert "skipped 3 malformed line(s)" in err and f"{bad}:11:" in err and f"{bad}:51:" in err
    assert len(out.read_text().splitlines()) == 118


def test_api_returns_statistics(models, tmp_path):
    st = rescore(MOSES_OLD, str(tmp_path / "o"), [models[0]], progress=False,
                 log=lambda m: None)
    assert (st.hypotheses, st.sentences, st.skipped, st.format) == (500, 5, 0, "moses-old")
    with pytest.raises(InputError, match="no such file|cannot open"):
        rescore(str(tmp_path / "absent.gz"), None, [models[0]], progress=False)


def test_unsorted_ids_are_reported_and_refused_for_the_one_best(models, tmp_path, capsys):
    lines = [l for _, l in iter_lines(MOSES_IT2)]
    by_sid = {s: [l for l in lines if l.startswith(f"{s} ")] for s in range(3)}
    unsorted = tmp_path / "unsorted.100best"
    unsorted.write_text("".join(l + "\n" for s in (0, 2, 1) for l in by_sid[s]))
    first_of_1 = len(by_sid[0]) + len(by_sid[2]) + 1
    out = tmp_path / "out"
    code, _, err = run(["-m", models[0], "-i", str(unsorted), "-o", str(out), "-q"], capsys)
    assert code == 0 and len(out.read_text().splitlines()) == len(lines)
    assert f"{unsorted}:{first_of_1}: sentence id 1 comes after 2" in err
    w = tmp_path / "w"
    w.write_text(open(INI).read())
    code, _, err = run(["-m", models[0], "-i", str(unsorted), "--weights", str(w),
                        "--one-best", str(tmp_path / "one"), "-q"], capsys)
    assert code == 2 and f"{unsorted}:{first_of_1}: sentence id 1 comes after 2" in err
    assert "1-best output needs sorted ids" in err and not (tmp_path / "one").exists()


def test_stdin_to_stdout_pipeline(models):
    import subprocess
    import sys

    data = open(os.path.join(DATA, "cdec-lattice.kbest"), "rb").read()
    proc = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", models[0], "-q"],
                          input=data, capture_output=True, check=True)
    out = proc.stdout.decode().splitlines()
    assert len(out) == 5 and all(" NLM0=" in l for l in out)
    assert out[2].startswith("0 ||| a_b ||| SourceWordPenalty=-0.868589")
