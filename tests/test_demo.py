"""The README's main job, on a slice of its bundled data."""
from __future__ import annotations

import os

from nlmfeature.cli import main


def test_demo_runs_the_whole_story(tmp_path, capsys):
    from nlmfeature.kenlm_baseline import find_tool

    find_tool("lmplz")  # the demo needs KenLM (tools/setup.sh builds it); raises if missing

    work = tmp_path / "demo"
    assert main(["demo", "--workdir", str(work), "--sentences", "40", "--iterations", "1",
                 "--max-minutes", "0.3", "--restarts", "1", "--bootstrap", "100", "--quiet"]) == 0
    out = capsys.readouterr().out
    for needle in ("held-out perplexity", "kenlm", "log-linear", "BLEU (re-ranked 1-best) before",
                   "paired bootstrap"):
        assert needle in out, needle
    for f in ("demo.nlm", "dev.nlm.100best.gz", "base.weights", "nlm.weights", "test.base.1best",
              "test.nlm.1best"):
        assert os.path.getsize(work / f) > 0, f
    assert "NLM0=" in (work / "nlm.weights").read_text()
    assert len((work / "test.nlm.1best").read_text().splitlines()) == 40
