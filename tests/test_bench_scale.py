"""``nlmfeature bench scale`` on a real Brown slice: the corpus, speed and memory parts, the speed rows of
every recipe, the tables and the results block it writes, and an interrupted rerun of one part that
keeps the others."""
from __future__ import annotations

import json

import pytest
from helpers import BROWN_TRAIN, BROWN_VALID, run_cli
from nlmfeature.bench.scale import BEGIN, END, SPEED_RECIPES, merge_commands, torch_trains


def test_bench_scale_corpus_and_speed(tmp_path):
    results = tmp_path / "results.md"
    results.write_text("# Results\n\n## Something else\n\nkept\n", encoding="utf-8")
    p = run_cli("bench", "scale", "--train", BROWN_TRAIN, "--valid", BROWN_VALID, "--test", BROWN_VALID,
                "--workdir", tmp_path / "w", "--sizes", "10K,all", "--repeat", "", "--threads", "1",
                "--speed-updates", "30", "--parts", "corpus,speed,memory", "--memory-updates", "20",
                "--max-vocab", "5000", "--engines", "native", "--results", results, "--json", "-q", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout)
    tokens = [c["tokens"] for c in r["corpora"]]
    assert len(tokens) == 2 and 10_000 <= tokens[0] < tokens[1]
    # the memory runs evaluate on the held-out sample as a real run does (at half and at the end)
    assert [m["tokens"] for m in r["memory"]] == tokens
    assert all(m["peak_rss_mib"] > 10 and m["evaluations"] == 2 for m in r["memory"])
    native = [s for s in r["speed"] if s["engine"] == "native"]
    assert [s["recipe"] for s in native] == [name for name, _ in SPEED_RECIPES]
    assert all(s["words_per_s"] > 1000 and s["workers"] == 1 for s in r["speed"])
    text = results.read_text(encoding="utf-8")
    assert "kept" in text and text.count(BEGIN) == 1 and text.count(END) == 1
    block = text[text.index(BEGIN):text.index(END)]
    assert "nlmfeature bench scale" in block and r["commit"] in block
    for s in native:
        assert f"| native | {s['recipe']} | 1 | {s['words_per_s']:,} |" in block
    # --parts none measures nothing: the earlier run's tables, its commands, date and commit
    results.write_text("# Results\n", encoding="utf-8")
    again = run_cli("bench", "scale", "--train", BROWN_TRAIN, "--valid", BROWN_VALID, "--test", BROWN_VALID,
                    "--workdir", tmp_path / "w", "--parts", "none", "--results", results, "--json", "-q")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout) == r
    assert results.read_text(encoding="utf-8").endswith(text[text.index(BEGIN):])
    # a run of one part that stops half-way keeps the other parts of the earlier run on disk
    import nlmfeature.bench.train as bench_train
    from nlmfeature import cli

    calls = []

    def probe_then_fail(fields, threads, updates):
        calls.append(threads)
        if len(calls) > 1:
            raise RuntimeError("speed run failed: the probe process died")
        return 1234.0

    real_probe = bench_train.speed_probe
    bench_train.speed_probe = probe_then_fail
    try:
        rc = cli.main(["bench", "scale", "--train", BROWN_TRAIN, "--valid", BROWN_VALID, "--test", BROWN_VALID,
                       "--workdir", str(tmp_path / "w"), "--sizes", "10K,all", "--repeat", "", "--threads", "1",
                       "--parts", "speed", "--engines", "native", "-q"])
    except RuntimeError:
        rc = 1
    finally:
        bench_train.speed_probe = real_probe
    assert rc != 0 and len(calls) == 2
    kept = json.loads((tmp_path / "w" / "bench-scale.json").read_text(encoding="utf-8"))
    assert kept["memory"] == r["memory"] and kept["corpora"] == r["corpora"]
    assert [s["words_per_s"] for s in kept["speed"]] == [1234]
    # timing one engine keeps the other engine's rows of the earlier run
    pytest.importorskip("torch")
    import nlmfeature.training.torch_engine as torch_engine

    real_torch = torch_engine.torch_words_per_second
    torch_engine.torch_words_per_second = lambda *a, **k: 4321.0
    try:
        rc = cli.main(["bench", "scale", "--train", BROWN_TRAIN, "--valid", BROWN_VALID, "--test", BROWN_VALID,
                       "--workdir", str(tmp_path / "w"), "--sizes", "10K,all", "--repeat", "", "--threads", "1",
                       "--parts", "speed", "--engines", "torch", "-q", "--json"])
    finally:
        torch_engine.torch_words_per_second = real_torch
    assert rc == 0
    both = json.loads((tmp_path / "w" / "bench-scale.json").read_text(encoding="utf-8"))
    assert [(s["engine"].split()[0], s["words_per_s"]) for s in both["speed"]] == \
        [("native", 1234)] + [("torch", 4321)] * sum(torch_trains(extra) for _, extra in SPEED_RECIPES)
    missing = run_cli("bench", "scale", "--train", BROWN_TRAIN, "--valid", BROWN_VALID, "--test", BROWN_VALID,
                      "--workdir", tmp_path / "nothing", "--parts", "none")
    assert missing.returncode != 0 and "no earlier run" in missing.stderr and "Traceback" not in missing.stderr


def test_commands_of_the_parts_shown_appear_once_each():
    first, speed, quality = ("nlmfeature bench scale --parts corpus", "nlmfeature bench scale --parts speed",
                             "nlmfeature bench scale --parts quality")
    shown = merge_commands(merge_commands(first, speed), quality)
    assert shown.split("\n    ") == [first, speed, quality]
    # the speed part timed again: its command moves to the end, once
    assert merge_commands(shown, speed).split("\n    ") == [first, quality, speed]
    assert merge_commands("", first) == first


def test_bench_scale_quality_model_belongs_to_its_flags(tmp_path):
    """The quality part trains its model once per set of options: the same command reuses it,
    other --train-flags train a new one (not the earlier model under the new flags' name)."""
    import nlmfeature

    base = ["bench", "scale", "--train", BROWN_TRAIN, "--valid", BROWN_VALID, "--test", BROWN_VALID,
            "--workdir", tmp_path / "w", "--sizes", "all", "--repeat", "", "--threads", "1", "--parts", "corpus,quality",
            "--max-vocab", "2000", "--test-tokens", "2000", "--json", "-q"]
    model = tmp_path / "w" / "scale.nlm"

    def run(flags):
        p = run_cli(*base, "--train-flags", flags, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        q = json.loads(p.stdout)["quality"]
        assert q["train_flags"] == flags and q["perplexity"]
        return model.stat().st_mtime_ns, nlmfeature.load(str(model)).header["embed_dim"]

    first = run("--iterations 1 --word-width 16")
    assert first[1] == 16
    assert run("--iterations 1 --word-width 16") == first      # reused
    # a model newer than its float16 copy (a run resumed from its checkpoint) gets a new copy
    import os

    f16 = tmp_path / "w" / "scale.f16.nlm"
    before = f16.stat().st_mtime_ns
    os.utime(model, ns=(before + 10 ** 9, before + 10 ** 9))
    run("--iterations 1 --word-width 16")
    assert f16.stat().st_mtime_ns > before
    second = run("--iterations 1 --word-width 24")
    assert second[1] == 24 and second[0] != first[0]


def test_spread_text_samples_the_whole_text(tmp_path):
    """A smaller corpus of bench scale takes whole lines from stretches across the text, not
    its first lines: at least the tokens asked for (about as many), in the text's order, from
    its start to its end."""
    from nlmfeature.bench.scale import spread_text
    from nlmfeature.io.textio import iter_lines

    lines = [line.rstrip("\n") for _, line in iter_lines(BROWN_TRAIN) if line.split()]
    total = sum(len(line.split()) for line in lines)
    out = tmp_path / "spread.txt"
    n = spread_text(BROWN_TRAIN, str(out), total // 10, pieces=20)
    got = out.read_text(encoding="utf-8").splitlines()
    assert n == sum(len(line.split()) for line in got)
    longest = max(len(line.split()) for line in lines)
    assert total // 10 <= n <= total // 10 + 20 * longest
    where, i = [], 0
    for line in got:                                   # a subsequence of the text: its order
        i = lines.index(line, i)
        where.append(i)
        i += 1
    assert where[0] == 0 and where[-1] > 0.9 * len(lines)   # from its start to its end
    assert spread_text(BROWN_TRAIN, str(out), 5) == n  # an existing sample is kept


def test_gpu_recipe_trains_under_torch():
    """The recipe timed on a GPU is one the torch engine trains (here on the CPU, in small
    minibatches), and the speed probe subtracts its warm-up run: positive words/s."""
    pytest.importorskip("torch")
    from nlmfeature.bench.scale import GPU_RECIPES, recipe_flags
    from nlmfeature.training.torch_engine import torch_words_per_second

    (name, extra), = GPU_RECIPES
    assert extra["word_width"] == 500 and extra["shared_noise"] and torch_trains(extra)
    assert recipe_flags({"direct_order": 0, "shared_noise": True}) == ["--direct-order", "0", "--shared-noise"]
    small = recipe_flags(dict(extra, minibatch_size=200)) + ["--max-vocab", "3000"]
    wps = torch_words_per_second(BROWN_TRAIN, 1, updates=6, extra_args=small, warmup=2)
    assert 100 < wps < 1e8


def test_bench_scale_perplexity_against_corpus_size(tmp_path):
    """--quality-sizes trains the quality recipe and KenLM on a smaller sample too: one row per
    corpus size (the smaller one first) with both models' perplexities on the same test text,
    in the markdown table and the plot; a size that is not one of --sizes is refused."""
    base = ["bench", "scale", "--train", BROWN_TRAIN, "--valid", BROWN_VALID, "--test", BROWN_VALID,
            "--workdir", tmp_path / "w", "--sizes", "30K,all", "--repeat", "", "--threads", "1",
            "--parts", "corpus,quality", "--max-vocab", "2000", "--test-tokens", "2000",
            "--train-flags", "--iterations 1 --word-width 16", "-q"]
    p = run_cli(*base, "--quality-sizes", "30K", "--json", "--png", tmp_path / "scale.png", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    # -q: nothing of the trainers' progress (they print epochs and perplexities otherwise)
    assert "epoch" not in p.stderr and "perplexity" not in p.stderr, p.stderr[-2000:]
    r = json.loads(p.stdout)
    small, whole = r["curve"]
    assert small["tokens"] == r["corpora"][0]["tokens"] and whole["tokens"] == r["corpora"][1]["tokens"]
    assert 30_000 <= small["tokens"] < whole["tokens"]
    for row in (small, whole):
        assert row["neural"] > 1 and row["kenlm"] > 1 and row["linear"] < max(row["neural"], row["kenlm"])
    assert whole["neural"] == dict((n, v) for n, v in
                                   ((x["model"], x["perplexity"]) for x in r["quality"]["perplexity"]["rows"]))["neural"]
    assert (tmp_path / "w" / "scale.30000.nlm").exists() and (tmp_path / "w" / "kenlm5.30000.arpa").exists()
    assert (tmp_path / "scale.png").stat().st_size > 1000
    md = run_cli(*base[:-1], "--parts", "none", "--markdown")
    assert md.returncode == 0, md.stderr[-3000:]
    assert f"| {small['tokens']:,} |" in md.stdout and "| training tokens | V | epochs | NLM | KenLM |" in md.stdout
    bad = run_cli(*base, "--quality-sizes", "5K")
    assert bad.returncode != 0 and "--quality-sizes" in bad.stderr and "Traceback" not in bad.stderr
    # --parts curve: the smaller corpora alone, beside the whole text's model, which stays as
    # it is even with a checkpoint beside it (a quality part would train it on)
    whole_model = tmp_path / "w" / "scale.nlm"
    (tmp_path / "w" / "scale.nlm.ckpt.npz").write_bytes(b"")
    before = whole_model.stat().st_mtime_ns
    (tmp_path / "w" / "scale.30000.nlm").unlink()
    curve = run_cli(*base[:-1], "--parts", "curve", "--quality-sizes", "30K", "--json", timeout=600)
    assert curve.returncode == 0, curve.stderr[-3000:]
    again = json.loads(curve.stdout)
    assert whole_model.stat().st_mtime_ns == before and again["quality"] == r["quality"]
    assert [c["tokens"] for c in again["curve"]] == [small["tokens"], whole["tokens"]]
    assert again["curve"][1] == whole and (tmp_path / "w" / "scale.30000.nlm").exists()
    none = run_cli(*base[:-1], "--parts", "curve")
    assert none.returncode != 0 and "--quality-sizes" in none.stderr and "Traceback" not in none.stderr
