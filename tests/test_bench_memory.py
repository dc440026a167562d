"""`nlmfeature bench memory --quick` end to end on the Brown test slices (needs KenLM)."""
from __future__ import annotations

import json
import os

import pytest

from helpers import BROWN_TRAIN, BROWN_VALID


def test_bench_memory_quick(tmp_path, capsys):
    from nlmfeature.cli import main
    from nlmfeature.training.kenlm_baseline import find_tool

    find_tool("build_binary")  # KenLM (tools/setup.sh builds it); raises if missing
    pytest.importorskip("matplotlib")
    png = tmp_path / "memory.png"
    assert main(["bench", "memory", "--quick", "--train", BROWN_TRAIN, "--valid", BROWN_VALID,
                 "--test", BROWN_VALID, "--out", str(tmp_path / "out"), "--plot", str(png), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = {r["model"]: r for r in res["rows"]}
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # float16 storage: smaller file, (nearly) the same perplexity
    for name in ("nlm-d8", "nlm-d16", "nlm-d16+direct-2^14"):
        full, half = rows[name], rows[name + " float16"]
        assert half["bytes"] < full["bytes"]
        assert half["test_ppl"] == pytest.approx(full["test_ppl"], rel=0.01)
        assert 1 < full["linear_with_kenlm_ppl"] <= min(full["test_ppl"], rows["kenlm-probing"]["test_ppl"]) + 1e-6
    # KenLM: trie < probing, quantised < trie, pruning smaller still; quantisation costs little
    k = {n: rows[n] for n in ("kenlm-probing", "kenlm-trie", "kenlm-trie-q8", "kenlm-pruned-trie-q8")}
    assert k["kenlm-pruned-trie-q8"]["bytes"] < k["kenlm-trie-q8"]["bytes"] < k["kenlm-trie"]["bytes"] \
        < k["kenlm-probing"]["bytes"]
    assert k["kenlm-trie"]["test_ppl"] == pytest.approx(k["kenlm-probing"]["test_ppl"], rel=1e-4)
    assert k["kenlm-trie-q8"]["test_ppl"] == pytest.approx(k["kenlm-probing"]["test_ppl"], rel=0.02)
    # a wider model is bigger
    assert rows["nlm-d16"]["bytes"] > rows["nlm-d8"]["bytes"]


def test_bench_memory_refuses_a_plot_in_a_missing_folder(tmp_path, capsys):
    from nlmfeature.cli import main

    assert main(["bench", "memory", "--quick", "--train", BROWN_TRAIN, "--valid", BROWN_VALID,
                 "--test", BROWN_VALID, "--plot", str(tmp_path / "no" / "such" / "x.png")]) == 2
    assert "existing folder" in capsys.readouterr().err
