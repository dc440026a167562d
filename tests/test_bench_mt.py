"""``nlmfeature bench mt``'s pieces on real data; the whole benchmark runs with a real Moses
(``MOSES_ROOT`` with ``bin/moses`` built with NLMFeature) on a few sentences."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from nlmfeature.bench import mt as bench_mt
from nlmfeature.cli import main as cli_main
from nlmfeature.mt.tuning.driver import first_hypotheses
from nlmfeature.mt.weights import read_weights

from helpers import make_model

TUNING = os.path.join(os.path.dirname(__file__), "data", "tuning")
KBEST = os.path.join(TUNING, "multi30k.dev.iter1.200x30.kbest.gz")
INI = os.path.join(TUNING, "multi30k.dev.iter1.moses.ini")
REF = os.path.join(TUNING, "multi30k.dev.ref.200.en")
SYSTEM = os.path.normpath(os.path.join(bench_mt.REPO, bench_mt.DEFAULT_SYSTEM))
DATA = os.path.normpath(os.path.join(bench_mt.REPO, bench_mt.DEFAULT_DATA))


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
    grams = bench_mt._source_ngrams([str(src)])
    table = os.path.join(SYSTEM, "reordering-table.wbe-msd-bidirectional-fe.gz")
    kept, total = bench_mt.filter_table(table, str(tmp_path / "out"), grams)
    assert total == 797291 and 0 < kept < 5000
    with gzip.open(table, "rt", encoding="utf-8") as f:
        expected = [l for l in f if l.split(" ||| ", 1)[0].strip() in grams]
    assert open(tmp_path / "out", encoding="utf-8").readlines() == expected
    assert {l.split(" ||| ")[0] for l in expected} >= {"ein mann", "im schnee", "."}


MOSES = os.path.join(os.environ.get("MOSES_ROOT", "/nonexistent"), "bin", "moses")


@pytest.mark.skipif(not os.access(MOSES, os.X_OK) or not os.path.isdir(DATA),
                    reason="needs MOSES_ROOT with bin/moses (built with NLMFeature) and the shared data")
def test_bench_mt_end_to_end_with_moses(tmp_path, capsys):
    """A tiny run (10 dev and 10 test sentences, one tuning iteration, 20-best rescoring)."""
    model = make_model(tmp_path, order=5)
    work = tmp_path / "bench"
    argv = ["bench", "mt", "--quick", "--quick-sentences", "10", "--test-sentences", "10",
            "--tunings", "2", "--max-iterations", "1", "--kbest", "20", "--model", model,
            "--workdir", str(work), "--threads", "1", "--bootstrap", "100"]
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
    rows = doc["decoding"]["final_weights_rule"]
    assert len(rows) == 4 and all(r["iterations"] == 1 for r in rows)
    assert os.path.getsize(work / "bench-mt.png") > 1000
    # rerunning reuses every finished step and reports the same scores
    assert cli_main(argv + ["--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["decoding"]["scores"] == doc["decoding"]["scores"]
    assert np.isclose(again["rescoring"]["scores"]["test"]["bleu"]["nlm"]["mean"],
                      doc["rescoring"]["scores"]["test"]["bleu"]["nlm"]["mean"])
