"""``nlmfeature bench train`` on a small real corpus (Brown slices): the held-out text is read
through its compiled corpus, and the exactly normalised perplexities it reports are the
package's one exact path (:func:`nlmfeature.core.model.exactly_normalised`)."""
from __future__ import annotations

import gzip
import json
import math
import os

import pytest

from nlmfeature.bench.memory import neural_scores
from nlmfeature.cli import main

from helpers import BROWN_TRAIN, BROWN_VALID, read_lines


@pytest.fixture(scope="module")
def brown(tmp_path_factory):
    d = tmp_path_factory.mktemp("brown")
    valid = read_lines(BROWN_VALID)
    for name, lines in (("train", read_lines(BROWN_TRAIN)), ("valid", valid[:150]), ("test", valid[150:])):
        with gzip.open(d / f"{name}.txt.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return d


def test_bench_train_reports_exact_perplexities(brown, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["bench", "train", "--data", str(brown), "--quick", "--configs",
                 "lbl-d200-nce,lbl-d200-nce+direct", "--iterations", "1", "--speed-updates", "5",
                 "--no-kenlm", "--json", "-o", str(out), "-q"]) == 0
    rows = {r["config"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    test = [l.split() for l in read_lines(BROWN_VALID)[150:]]
    row = rows["lbl-d200-nce"]
    exact = math.exp(-neural_scores(str(out / "lbl-d200-nce.nlm"), test).mean())
    assert row["test_ppl_normalised"] == pytest.approx(exact, abs=0.01)
    assert row["test_ppl"] != row["test_ppl_normalised"] and 1 < exact < row["vocab"]
    direct = rows["lbl-d200-nce+direct"]            # direct features: a sample of test tokens
    assert 0 < direct["normaliser_sample_tokens"] <= 10000 and direct["test_ppl_normalised_sample"] > 1
    assert os.path.getsize(out / "lbl-d200-nce+direct.nlm") == direct["model_bytes"]
