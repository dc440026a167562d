"""``nlmfeature score`` marks out-of-vocabulary words as KenLM's query does, counts them, and
says when the scores are an unnormalised model's raw outputs (which can be above 0)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import nlmfeature
from helpers import BROWN_VALID, make_model, read_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))


def score(*argv):
    r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "score", *argv],
                       capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


@pytest.mark.parametrize("output", ["unnormalised", "class"])
def test_oovs_are_marked_and_counted(tmp_path, output):
    model = make_model(tmp_path, output=output, **({"classes": 20} if output == "class" else {}))
    lm = nlmfeature.load(model)
    lines = read_lines(BROWN_VALID, 50) + ["the zzzzqq said <unk>"]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, err = score("-m", model, "-i", str(text), "--per-word")
    rows = out.splitlines()
    assert len(rows) == len(lines)
    n_oov = 0
    for line, row in zip(lines, rows):
        items = row.split(" ")
        toks = line.split() + ["</s>"]
        assert len(items) == len(toks)
        for tok, item in zip(toks, items):
            word, value = item.rsplit("=", 1)
            oov = tok not in lm.vocab or tok == "<unk>"
            n_oov += oov
            assert word == (tok + "<unk>" if oov else tok)
            float(value)
    assert rows[-1].startswith("the=") and " zzzzqq<unk>=" in rows[-1] and " <unk><unk>=" in rows[-1]
    n_tok = sum(len(l.split()) + 1 for l in lines)
    assert f"{len(lines)} sentences, {n_tok} tokens (with </s>), {n_oov} OOV" in err
    assert ("unnormalised" in err and "can be above 0" in err) == (output == "unnormalised")
    # the totals are the per-word sums; -q leaves standard error empty
    totals, quiet = score("-m", model, "-i", str(text), "-q")
    assert quiet == ""
    for total, row in zip(totals.splitlines(), rows):
        assert float(total) == pytest.approx(sum(float(i.rsplit("=", 1)[1]) for i in row.split()),
                                             abs=1e-4)
