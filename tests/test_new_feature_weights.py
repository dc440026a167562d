"""Adding a neural feature to a tuned system: ``tune optimise --init moses.tuned.ini`` starts
the new k-best features at half the language model's weight (with a note) instead of failing,
and ``rescore`` reranks a list by its weights without any model."""
from __future__ import annotations

import gzip
import os

import pytest

from helpers import DATA, make_model
from nlmfeature import cli
from nlmfeature.mt.weights import new_feature_weight, read_weights, with_new_features

TUNING = os.path.join(DATA, "tuning")
KBEST = os.path.join(TUNING, "multi30k.dev.iter2.200x30.kbest.gz")
INI = os.path.join(TUNING, "multi30k.dev.iter2.moses.ini")
REF = os.path.join(TUNING, "multi30k.dev.ref.200.en")
ITER2_LIST = os.path.join(DATA, "kbest", "moses-multi30k-dev3.iter2.100best.gz")
ITER2_INI = os.path.join(DATA, "kbest", "multi30k-dev.iter2.moses.ini")


def test_new_features_start_at_half_the_lm_weight():
    w = read_weights(INI)
    assert new_feature_weight(w) == pytest.approx(w["LM0"][0] / 2)
    filled, added = with_new_features([("LM0", 1), ("NLM0", 1), ("NLMOOV0", 1)], w)
    assert added == ["NLM0", "NLMOOV0"] and filled["NLM0"] == [w["LM0"][0] / 2]
    assert filled["LM0"] == w["LM0"] and "NLM0" not in w


def test_tune_optimise_from_a_tuned_ini_with_a_new_feature(tmp_path, capsys):
    model = make_model(tmp_path)
    rescored = tmp_path / "nlm.kbest.gz"
    assert cli.main(["rescore", "-m", model, "-i", KBEST, "-o", str(rescored), "-q"]) == 0
    out = tmp_path / "weights.txt"
    capsys.readouterr()
    assert cli.main(["tune", "optimise", "--nbest", str(rescored), "--init", INI, "-r", REF,
                     "-o", str(out), "--restarts", "2"]) == 0
    err = capsys.readouterr().err
    half = read_weights(INI)["LM0"][0] / 2
    assert f"has no weight for the k-best feature(s) NLM0: they start at {half:g}" in err
    tuned = read_weights(str(out))
    assert set(read_weights(INI)) <= set(tuned) and len(tuned["NLM0"]) == 1


def test_rescore_reranks_without_a_model(tmp_path):
    """The weights the list was decoded with pick the decoder's own 1-best: the first
    hypothesis of each sentence."""
    one_best = tmp_path / "1best.txt"
    assert cli.main(["rescore", "-i", ITER2_LIST, "--weights", ITER2_INI, "--one-best",
                     str(one_best), "-q"]) == 0
    firsts = {}
    with gzip.open(ITER2_LIST, "rt", encoding="utf-8") as f:
        for line in f:
            sid, text = line.split(" ||| ")[:2]
            firsts.setdefault(int(sid), text.strip())
    assert one_best.read_text(encoding="utf-8").splitlines() == [firsts[i] for i in sorted(firsts)]
    assert cli.main(["rescore", "-i", ITER2_LIST, "-q"]) == 2      # neither model nor weights
