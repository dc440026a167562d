"""`nlmfeature bench memory --quick` end to end on the Brown test slices (needs KenLM), with
models trained by it and models of one's own."""
from __future__ import annotations

import json
import os

import pytest

from helpers import BROWN_TRAIN, BROWN_VALID, make_model


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
    # BLEU against size: every model as the only LM of the real Moses k-best lists
    assert "first 40 sentences" in res["bleu"]["note"]
    for r in rows.values():
        assert 5 < r["test_bleu"] < 80 and 5 < r["dev_bleu"] < 80 and len(r["test_bleu_runs"]) == 1
        # and beside the lists' own LM (a second LM feature)
        assert 5 < r["beside_test_bleu"] < 80 and len(r["beside_test_bleu_runs"]) == 1
    # the float16 copy ranks the lists (nearly) as the float32 model
    assert abs(rows["nlm-d16 float16"]["test_bleu"] - rows["nlm-d16"]["test_bleu"]) < 1.0
    assert 5 < res["bleu"]["system_lm"]["test_bleu"] < 80
    from nlmfeature.bench.memory import format_markdown

    table = format_markdown(res).splitlines()
    assert table[0].startswith("| model | MB |") and "BLEU" in table[0] and "beside the lists' LM" in table[0]
    assert len([l for l in table if l.startswith("| nlm-") or l.startswith("| kenlm-")]) == len(rows)
    # models of one's own, measured as they are (nothing trained): a float32 file gets its
    # float16 copy, a float16 file is one row; the same figures as when they were trained here
    out = tmp_path / "out"
    assert main(["bench", "memory", "--quick", "--train", BROWN_TRAIN, "--valid", BROWN_VALID,
                 "--test", BROWN_VALID, "--out", str(tmp_path / "own"), "--no-bleu", "--json",
                 "-m", str(out / "nlm-d16.nlm"), "--model", str(out / "nlm-d8.f16.nlm")]) == 0
    own = {r["model"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert sorted(n for n in own if n.startswith("nlm")) == ["nlm-d16", "nlm-d16 float16", "nlm-d8.f16"]
    assert own["nlm-d16"]["test_ppl"] == rows["nlm-d16"]["test_ppl"]
    assert own["nlm-d8.f16"]["test_ppl"] == rows["nlm-d8 float16"]["test_ppl"]
    assert own["kenlm-probing"]["test_ppl"] == rows["kenlm-probing"]["test_ppl"]
    assert own["nlm-d16"]["given"] == str(out / "nlm-d16.nlm") and "epochs" not in own["nlm-d16"]


def test_bench_memory_refuses_models_of_another_vocabulary(tmp_path, capsys):
    from nlmfeature.cli import main

    a = make_model(tmp_path, "a.nlm", min_count=2)
    b = make_model(tmp_path, "b.nlm", min_count=3)         # a smaller vocabulary
    rc = main(["bench", "memory", "--train", BROWN_TRAIN, "--valid", BROWN_VALID, "--test", BROWN_VALID,
               "--widths", "", "--direct-hash-spaces", "", "--no-bleu", "-m", str(a), "-m", str(b)])
    err = capsys.readouterr().err
    assert rc != 0 and f"--model {b}: its vocabulary" in err and "Traceback" not in err
    rc = main(["bench", "memory", "--no-bleu", "-m", str(tmp_path / "missing.nlm")])
    assert rc != 0 and "missing.nlm: no such file" in capsys.readouterr().err


def test_lm_swap_with_the_systems_own_lm_changes_nothing(tmp_path):
    """The decoder's own KenLM model put in place of LM0 reproduces the lists' LM0 values
    (Moses writes KenLM's log10 score in natural log), so tuning and reranking give the same
    BLEU as the unchanged lists."""
    import argparse

    from nlmfeature.bench import shared_data
    from nlmfeature.bench.memory import _SHARED, lm_swap_bleu
    from nlmfeature.mt.kbest import read_kbest

    lm = shared_data("moses", "multi30k-de-en", "lm.en.5g.arpa.gz")
    if not os.path.exists(lm) or not os.path.isdir(_SHARED):
        pytest.skip("needs ../shared/data (the Multi30k Moses system and its k-best lists)")
    pytest.importorskip("kenlm")
    args = argparse.Namespace(nbest_dir=_SHARED, dev_nbest="dev.iter4.100best.gz", quick=True,
                              tunings=1, jobs=1)
    rows = [{"model": "system LM again", "kind": "kenlm", "path": lm}]
    res = lm_swap_bleu(rows, None, args, str(tmp_path), lambda m: None)
    assert rows[0]["test_bleu"] == res["system_lm"]["test_bleu"]
    assert rows[0]["dev_bleu"] == res["system_lm"]["dev_bleu"]
    old = [dict(h.features)["LM0"][0] for h in read_kbest(str(tmp_path / "system-lm.test.nbest.gz"))]
    new = [dict(h.features)["LM0"][0] for h in read_kbest(str(tmp_path / "row0.test.nbest.gz"))]
    assert len(old) == len(new) > 1000
    assert max(abs(a - b) for a, b in zip(old, new)) < 1e-3     # Moses prints 6 digits
    # beside the lists' LM: LM0 kept as it was, the model's score a second feature after it,
    # whose tuning starts at half LM0's weight
    beside = list(read_kbest(str(tmp_path / "row0.beside.test.nbest.gz")))
    assert [dict(h.features)["LM0"][0] for h in beside] == old
    assert max(abs(dict(h.features)["LM1"][0] - a) for h, a in zip(beside, new)) < 1e-9
    assert [l for l, _ in beside[0].features].index("LM1") == [l for l, _ in beside[0].features].index("LM0") + 1
    from nlmfeature.mt.weights import read_weights

    init = read_weights(str(tmp_path / "init.beside.weights"))
    assert init["LM1"][0] == pytest.approx(init["LM0"][0] / 2)
    tuned = read_weights(next(str(p) for p in tmp_path.glob("row0.beside.mert1*.weights")))
    assert "LM1" in tuned and 0 < rows[0]["beside_test_bleu"] < 100


def test_bench_memory_refuses_a_plot_in_a_missing_folder(tmp_path, capsys):
    from nlmfeature.cli import main

    assert main(["bench", "memory", "--quick", "--train", BROWN_TRAIN, "--valid", BROWN_VALID,
                 "--test", BROWN_VALID, "--plot", str(tmp_path / "no" / "such" / "x.png")]) == 2
    assert "existing folder" in capsys.readouterr().err


MOSES_ROOT = os.environ.get("MOSES_ROOT")


@pytest.mark.decoder
@pytest.mark.skipif(not MOSES_ROOT or not os.path.exists(os.path.join(MOSES_ROOT, "moses2", "Jamfile")),
                    reason="needs MOSES_ROOT with a built moses2")
def test_bench_memory_measures_each_model_in_the_decoder(tmp_path, capsys):
    """--moses: each model as the language model of Moses2 on the real Multi30k system (its
    tables filtered to five test sentences): peak memory and load time beside the file size,
    and the decoder without a language model as the reference."""
    import gzip

    from helpers import build_moses2_with_shim
    from nlmfeature.bench import shared_data
    from nlmfeature.cli import main
    from nlmfeature.mt.moses import prepare_system

    system = shared_data("moses", "multi30k-de-en")
    if not os.path.isdir(system):
        pytest.skip("needs ../shared/data (the Multi30k Moses system)")
    moses2 = build_moses2_with_shim(MOSES_ROOT)
    src = tmp_path / "src.de"
    with gzip.open(shared_data("nbest", "moses-multi30k-de-en", "test.src.de.gz"), "rt", encoding="utf-8") as f:
        src.write_text("".join(next(f) for _ in range(5)), encoding="utf-8")
    ini = prepare_system(os.path.join(system, "moses.tuned.ini"), str(tmp_path / "sys"), [str(src)], system,
                         kenlm_bin=[os.path.join(MOSES_ROOT, "bin")]).ini
    png = tmp_path / "m.png"
    assert main(["bench", "memory", "--quick", "--no-bleu", "--out", str(tmp_path / "out"), "--moses", moses2,
                 "--decoder-config", ini, "--decoder-input", str(src), "--plot", str(png), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    dec, rows = res["decoder"], {r["model"]: r for r in res["rows"]}
    assert dec["sentences"] == 5 and dec["no_lm"]["decoder_peak_mb"] > 1
    for r in rows.values():
        assert r["decoder_peak_mb"] > dec["no_lm"]["decoder_peak_mb"] and r["decoder_load_seconds"] > 0
    # the hashed direct-feature store is memory the decoder holds
    assert rows["nlm-d16+direct-2^14"]["decoder_peak_mb"] > rows["nlm-d16"]["decoder_peak_mb"]
    # each config is the system's with its KENLM line swapped, under the same label and weight
    swapped = sorted((tmp_path / "out" / "decoder").glob("row*.moses.ini"))
    assert len(swapped) == len(rows)
    text = swapped[0].read_text()
    assert "KENLM" not in text and "NLMFeature name=LM0 path=" in text and "LM0= 0.120268" in text
    from nlmfeature.bench.memory import format_markdown

    table = format_markdown(res)
    assert "decoder peak MB" in table and "| no LM (the decoder's tables and search) |" in table
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_memory_decoder_flags_are_checked_first(tmp_path, capsys):
    from nlmfeature.cli import main

    exe = tmp_path / "moses2"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    rc = main(["bench", "memory", "--quick", "--no-bleu", "--moses", str(exe)])
    err = capsys.readouterr().err
    assert rc != 0 and "--moses needs --decoder-config" in err and "Traceback" not in err
    rc = main(["bench", "memory", "--quick", "--no-bleu", "--moses", str(exe), "--decoder-config",
               str(tmp_path / "none.ini"), "--decoder-input", str(tmp_path / "none.de")])
    err = capsys.readouterr().err
    assert rc != 0 and "none.ini: no such file" in err
    rc = main(["bench", "memory", "--quick", "--no-bleu", "--decoder-input", str(exe)])
    assert rc != 0 and "are for --moses" in capsys.readouterr().err
