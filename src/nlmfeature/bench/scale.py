"""``nlmfeature bench scale``: training at corpus scale -- compile time and size, peak memory
against corpus size, words/s by thread count and engine, time per epoch, held-out perplexity
against KenLM on the same text, model sizes.

Every measurement runs in a fresh process (``python -m nlmfeature.cli ...``), so peak RSS
(from ``wait4``) is that of the command alone:

* **corpus**: the first ``--sizes`` tokens of ``--train`` (whole sentences; ``all`` for the whole
  text) are compiled (``corpus compile``): seconds, file size, peak RSS;
* **memory**: ``train`` for ``--memory-updates`` minibatches on each compiled corpus, and on
  the largest repeated ``--repeat`` times (concatenated ids, for the memory curve only), with
  the vocabulary and hash space held fixed so that only the corpus changes, and two held-out
  evaluations on the ``--valid`` sample of the quality part (a real run evaluates, writes the
  best model and checkpoints): peak RSS;
* **speed**: words/s of the native trainer at each ``--threads`` count (after a warm-up), for
  the default recipe (more than one thread: Hogwild, a minibatch per thread), the same with the
  threads sharing each minibatch (``--no-hogwild``), the plain log-bilinear model without direct
  features and with ``--shared-noise``, and the same for the torch engine when it is installed
  (``--engines``; on the GPU when there is one, with the 500-wide shared-noise recipe of
  ``GPU_RECIPES`` too, one process per GPU; one minibatch at a time; a short run's words and
  seconds subtracted, so that start-up does not count); seconds per epoch follow;
* **quality**: a model trained for ``--train-minutes`` on the whole text (early-stopped on
  ``--valid``), its exactly normalised perplexity on ``--test`` (at most ``--test-tokens``
  tokens) beside a KenLM ``--kenlm-order``-gram model of the same text with the same
  vocabulary and their linear interpolation (``nlmfeature perplexity``); with
  ``--quality-sizes`` the same recipe and comparison on those smaller corpora too (each model
  trained for at most ``--quality-size-minutes``, KenLM on the same sample of the text): the
  perplexities against corpus size (``--parts curve``: these alone, beside the whole text's
  model of an earlier quality part, which is neither trained nor scored again);
* **size**: the model file in float32 and float16 beside KenLM's probing, trie and quantised
  trie (8-bit) binaries.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from nlmfeature.bench import rss_of
from nlmfeature.errors import NLMFeatureError
from nlmfeature.io.atomicfile import atomic_write_text


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------

def parse_count(text: str) -> Optional[int]:
    """A token count: '10M' -> 10_000_000 (K, M, B or G are powers of 1000, unlike byte sizes); 'all' -> None."""
    t = text.strip().lower()
    if t == "all":
        return None
    mult = {"k": 10 ** 3, "m": 10 ** 6, "b": 10 ** 9, "g": 10 ** 9}
    try:
        if t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except (ValueError, IndexError):
        raise NLMFeatureError(f"not a size: {text!r} (e.g. 10M, 500K, all)") from None


def _ints(text: str, flag: str) -> List[int]:
    """Comma-separated counts, each at least 1 (:func:`nlmfeature.bench.memory._ints`)."""
    from nlmfeature.bench.memory import _ints as ints

    vals = ints(text, flag)
    if not vals or min(vals) < 1:
        raise NLMFeatureError(f"{flag}: values must be >= 1")
    return vals


def nlm(*args: str) -> List[str]:
    """The command line of an nlmfeature subcommand in a fresh interpreter."""
    return [sys.executable, "-m", "nlmfeature.cli", *args]


def prefix_text(src: str, dst: str, tokens: int) -> int:
    """Write the first whole lines of ``src`` holding at least ``tokens`` tokens to ``dst``
    (atomically; kept when it exists); returns the tokens written."""
    return spread_text(src, dst, tokens, pieces=1)


def spread_text(src: str, dst: str, tokens: int, pieces: int = 100) -> int:
    """Write at least ``tokens`` tokens of ``src`` to ``dst`` (fewer only when ``src`` has
    fewer), as whole lines from the starts of ``pieces`` equal stretches of the text
    (atomically; kept when it exists), so that a smaller corpus samples the whole text (its
    authors, its vocabulary) rather than its first books; returns the tokens written.  Two
    passes: the first counts the tokens."""
    from nlmfeature.io.atomicfile import open_output
    from nlmfeature.io.textio import iter_lines

    if os.path.exists(dst):
        with open(dst, encoding="utf-8") as f:
            return sum(len(line.split()) for line in f)
    total = sum(len(line.split()) for _, line in iter_lines(src))
    stretch, take = max(1, total) / max(1, pieces), tokens / max(1, pieces)
    seen = n = here = 0
    piece = -1
    with open_output(dst) as out:
        for _, line in iter_lines(src):
            k = len(line.split())
            if int(seen / stretch) != piece:   # a new stretch: take its first lines again
                piece, here = int(seen / stretch), 0
            if k and here < take:
                out.write(line.rstrip("\n") + "\n")
                n += k
                here += k
            seen += k
    return n


def repeat_corpus(path: str, times: int, out: str) -> None:
    """A compiled corpus holding ``path``'s id stream ``times`` times over (for memory curves:
    the same vocabulary, a corpus ``times`` as long), written with the corpus format's own writer
    of sections and checked by opening it."""
    from nlmfeature.training import corpusfile as cf

    if os.path.exists(out):
        return
    cf.write_repeated(cf.CompiledCorpus(path), times, out)


def machine() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = platform.processor()
    return f"{os.cpu_count()} cores, {model}".strip(", ")


# ---------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    from nlmfeature.io.textio import check_input

    for f in (args.train, args.valid, args.test):
        check_input(f)
    sizes = [parse_count(s) for s in args.sizes.split(",") if s.strip()]
    repeats = _ints(args.repeat, "--repeat") if args.repeat.strip() else []
    threads = _ints(args.threads, "--threads")
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    if parts == {"none"}:
        return _report_earlier(args)
    unknown = parts - {"corpus", "speed", "quality", "curve", "memory"}
    if unknown or not parts:
        raise NLMFeatureError(f"--parts: unknown part(s) {', '.join(sorted(unknown)) or '(none given)'}; "
                              "choose from corpus, speed, quality, curve, memory")
    os.makedirs(args.workdir, exist_ok=True)
    w = args.workdir
    log = (lambda m: None) if args.quiet else (lambda m: print(f"bench scale: {m}", file=sys.stderr, flush=True))
    import shlex

    result: Dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "commit": _commit(),
                              "command": " ".join(shlex.quote(a) for a in ["nlmfeature"] + sys.argv[1:]),
                              "corpora": [],
                              "memory": [], "speed": [], "quality": None, "curve": [], "sizes": []}
    earlier: Dict[str, Any] = {}
    if parts != {"corpus", "speed", "quality", "memory"} and os.path.exists(os.path.join(w, "bench-scale.json")):
        with open(os.path.join(w, "bench-scale.json"), encoding="utf-8") as f:
            earlier = json.load(f)
        result["command"] = merge_commands(earlier.get("command", ""), result["command"])
        if earlier.get("commit") and result["commit"] not in earlier["commit"].split(", "):
            result["commit"] = f"{earlier['commit']}, {result['commit']}"   # the commits of the parts shown
        # the parts not measured now are the earlier run's from the start, so that a run that
        # stops half-way (its bench-scale.json is saved after every measurement) loses nothing
        for part in ("speed", "quality", "memory"):
            if part not in parts and part in earlier:
                result[part] = earlier[part]
        if not parts & {"quality", "curve"}:
            result["curve"] = earlier.get("curve", [])
    quality_sizes = [parse_count(s) for s in args.quality_sizes.split(",") if s.strip()]
    if set(quality_sizes) - set(sizes) or None in quality_sizes:
        raise NLMFeatureError("--quality-sizes: each must be one of the smaller --sizes (the whole text "
                              "is the quality part's own)")
    if "curve" in parts and not quality_sizes:
        raise NLMFeatureError("--parts curve needs --quality-sizes (the smaller corpora to train on)")
    # 1. corpora
    compiled: List[Tuple[int, str]] = []
    by_size: Dict[Optional[int], Tuple[str, str]] = {}    # size -> (text, compiled corpus)
    for size in sizes:
        name = "all" if size is None else f"{size}"
        text = args.train if size is None else os.path.join(w, f"train.{name}.spread.txt")
        if size is not None:
            spread_text(args.train, text, size)
        out = os.path.join(w, f"train.{name}.nlmcorpus")
        by_size[size] = (text, out)
        if "corpus" not in parts:
            row = next((c for c in earlier.get("corpora", []) if c.get("path") == out), None)
            if row is None or not os.path.exists(out):
                raise NLMFeatureError(f"--parts without corpus: {out} was not measured before; add corpus")
            result["corpora"].append(row)
            compiled.append((row["tokens"], out))
            continue
        if os.path.exists(out):
            os.unlink(out)
        log(f"compiling {text}")
        secs, rss, so = rss_of(nlm("corpus", "compile", "-i", text, "-o", out, "--json", "-q"))
        info = json.loads(so)
        row = {"tokens": info["tokens"], "types": info["types"], "seconds": round(secs, 1),
               "mb_per_s": round(os.path.getsize(text) / 2 ** 20 / max(secs, 1e-9), 1),
               "file_mib": round(info["bytes"] / 2 ** 20, 1), "peak_rss_mib": round(rss / 2 ** 20, 1),
               "path": out}
        result["corpora"].append(row)
        compiled.append((info["tokens"], out))
        log(f"  {row}")
    compiled.sort()
    biggest_tokens, biggest = compiled[-1]
    mem_inputs = [(t, p, "") for t, p in compiled]
    for r in repeats:
        out = os.path.join(w, f"train.all.x{r}.nlmcorpus")
        repeat_corpus(biggest, r, out)
        mem_inputs.append((biggest_tokens * r, out, f"x{r}"))
    # 2. speed (the whole text)
    from nlmfeature.bench.train import speed_probe

    all_tokens = biggest_tokens
    fields = {"train": biggest, "max_vocab": args.max_vocab}
    if args.order:
        fields["order"] = args.order
    engines = {e.strip() for e in args.engines.split(",") if e.strip()}
    if engines - {"native", "torch"}:
        raise NLMFeatureError(f"--engines: unknown engine(s) {', '.join(sorted(engines - {'native', 'torch'}))}; "
                              "choose from native, torch")
    if "speed" in parts:   # the engines not timed now keep the earlier run's rows
        result["speed"] = [r for r in earlier.get("speed", []) if r["engine"].split()[0] not in engines]
    for recipe, extra in SPEED_RECIPES if "speed" in parts and "native" in engines else []:
        for t in threads:
            log(f"speed, native trainer, {recipe}, {t} thread(s)")
            wps = speed_probe(dict(fields, **extra), t, args.speed_updates)
            result["speed"].append({"engine": "native", "recipe": recipe, "workers": t, "words_per_s": round(wps),
                                    "epoch_minutes": round(all_tokens / wps / 60, 1)})
            log(f"  {result['speed'][-1]}")
            save(w, result)
    try:
        import torch
        from nlmfeature.training.torch_engine import torch_words_per_second  # optional extra
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        engine = "torch (GPU)" if gpus else "torch (CPU)"
    except ImportError:
        torch_words_per_second, gpus = None, 0
    for recipe, extra in ((SPEED_RECIPES + (GPU_RECIPES if gpus else ())) if torch_words_per_second is not None
                          and "speed" in parts and "torch" in engines else []):
        if not torch_trains(extra):
            continue
        flags = ["--max-vocab", str(args.max_vocab)] + (["--order", str(args.order)] if args.order else [])
        flags += recipe_flags(extra)
        for t in threads:
            if gpus and t > gpus:   # one process per GPU
                log(f"speed, torch engine, {recipe}, {t} process(es): skipped, this machine has {gpus} GPU(s)")
                continue
            log(f"speed, torch engine, {recipe}, {t} process(es)")
            wps = torch_words_per_second(biggest, t, updates=args.speed_updates, extra_args=flags,
                                         warmup=max(1, args.speed_updates // 10))
            result["speed"].append({"engine": engine, "recipe": recipe, "workers": t, "words_per_s": round(wps),
                                    "epoch_minutes": round(all_tokens / wps / 60, 1)})
            log(f"  {result['speed'][-1]}")
            save(w, result)
    # 3. quality and 4. sizes
    if args.train_minutes > 0 and "quality" in parts:
        result["quality"] = quality(args, biggest, w, log)
    if args.train_minutes > 0 and parts & {"quality", "curve"}:
        result["curve"] = []
        minutes = args.quality_size_minutes or args.train_minutes
        for size in sorted(quality_sizes):
            text, corpus = by_size[size]
            q = quality(args, corpus, w, log, text=text, tag=f".{size}", minutes=minutes)
            result["curve"].append(curve_row(q, next(t for t, p in compiled if p == corpus)))
            save(w, result)
        if result["quality"]:
            result["curve"].append(curve_row(result["quality"], biggest_tokens))
    result["sizes"] = sizes_of(result.get("quality"))
    save(w, result)
    # 5. memory (last: the repeated corpora take longest)
    common = ["--max-vocab", str(args.max_vocab), "--no-progress", "--no-resume", "--iterations", "1"]
    if args.order:
        common += ["--order", str(args.order)]
    if "memory" in parts:   # held-out evaluations as in a real run: at half and at the end
        common += ["--test-set", valid_sample(args, w), "--eval-every", str(max(1, args.memory_updates // 2))]
    for tokens, path, note in mem_inputs if "memory" in parts else []:
        model = os.path.join(w, "memory.nlm")
        log(f"memory run on {path}")
        # --min-count 1: every corpus fills the --max-vocab vocabulary, so only the corpus changes
        secs, rss, so = rss_of(nlm("train", "--train", path, "-o", model, "--threads", "1", "--hash-space",
                                   str(args.hash_space), "--max-updates", str(args.memory_updates),
                                   "--min-count", "1", "--json", *common))
        for f in (model, model + ".ckpt.npz"):
            if os.path.exists(f):
                os.unlink(f)
        result["memory"].append({"tokens": tokens, "peak_rss_mib": round(rss / 2 ** 20, 1),
                                 "seconds": round(secs, 1), "note": note,
                                 "evaluations": len(json.loads(so)["history"])})
        log(f"  {result['memory'][-1]}")
        save(w, result)
    if "memory" in parts and earlier.get("memory"):   # corpora measured before and not now stay
        now = {(m["tokens"], m["note"]) for m in result["memory"]}
        result["memory"] += [m for m in earlier["memory"] if (m["tokens"], m["note"]) not in now]
        result["memory"].sort(key=lambda m: m["tokens"])
    save(w, result)
    return _report(args, result)


def _report(args: argparse.Namespace, result: Dict[str, Any]) -> int:
    """The outputs of a run: --png, --results, and the tables (or --json) on standard output."""
    if args.png:
        plot(result, args.png)
    if args.results:
        write_results(args.results, result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_markdown(result))
    return 0


def _report_earlier(args: argparse.Namespace) -> int:
    """``--parts none``: the outputs of the workdir's last run (its bench-scale.json, with its
    commands, date and commit), measuring nothing."""
    path = os.path.join(args.workdir, "bench-scale.json")
    if not os.path.exists(path):
        raise NLMFeatureError(f"--parts none: {path} does not exist (no earlier run in --workdir)")
    with open(path, encoding="utf-8") as f:
        return _report(args, json.load(f))


def save(workdir: str, result: Dict[str, Any]) -> None:
    """The result so far, as WORKDIR/bench-scale.json (atomically): a long run that stops keeps
    what it measured."""
    atomic_write_text(os.path.join(workdir, "bench-scale.json"), json.dumps(result, indent=2))


def valid_sample(args: argparse.Namespace, w: str) -> str:
    """The held-out sample: the first ``--test-tokens``/2 tokens of ``--valid`` (whole lines)."""
    valid = os.path.join(w, "valid.sample.txt")
    prefix_text(args.valid, valid, args.test_tokens // 2)
    return valid


def quality(args: argparse.Namespace, corpus: str, w: str, log, text: Optional[str] = None,
            tag: str = "", minutes: Optional[float] = None) -> Dict[str, Any]:
    """Train the quality model on the compiled ``corpus`` of ``text`` (default ``--train``),
    KenLM on the same text and vocabulary, and compare them.  ``tag`` names the files of a
    smaller corpus (``scale.TAG.nlm``, ``kenlmN.TAG.arpa``), for which only the perplexities
    are measured (no float16 copy, no KenLM binaries but the probing one)."""
    import nlmfeature
    from nlmfeature.training.kenlm_baseline import find_tool, train_kenlm

    text = text or args.train
    model = os.path.join(w, f"scale{tag}.nlm")
    f16 = os.path.join(w, f"scale{tag}.f16.nlm")
    cmd = nlm("train", "--train", corpus, "--test-set", args.valid, "-o", model, "--threads",
              str(max(_ints(args.threads, "--threads"))), "--max-vocab", str(args.max_vocab),
              "--max-minutes", str(minutes or args.train_minutes), "--no-progress")
    if args.order:
        cmd += ["--order", str(args.order)]
    cmd += shlex.split(args.train_flags or "")
    # the model (and its checkpoint) belong to the options in a marker beside it: another
    # --train-flags, --order, --max-vocab, --threads or time limit trains a new one
    recipe = shlex.join(cmd[cmd.index("--threads"):])
    marker, ckpt = model + ".recipe", model + ".ckpt.npz"
    if not (os.path.exists(marker) and open(marker, encoding="utf-8").read().strip() == recipe):
        for old in (model, f16, ckpt, marker):
            if os.path.exists(old):
                os.remove(old)
        atomic_write_text(marker, recipe + "\n")
    if not os.path.exists(model) or os.path.exists(ckpt):
        log(f"training the quality model on {corpus} for at most {minutes or args.train_minutes} minutes")
        # -q: the trainer's lines are kept back, and shown only if it fails
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE if args.quiet else None,
                              text=True)
        if proc.returncode != 0:
            raise NLMFeatureError(f"training the quality model on {corpus} failed (exit {proc.returncode})"
                                  + (":\n" + "\n".join(proc.stderr.strip().splitlines()[-10:]) if args.quiet else ""))
    lm = nlmfeature.load(model)
    test = os.path.join(w, "test.sample.txt")
    prefix_text(args.test, test, args.test_tokens)
    valid = valid_sample(args, w)
    arpa = os.path.join(w, f"kenlm{args.kenlm_order}{tag}.arpa")
    if not os.path.exists(arpa):
        log(f"training KenLM on {text} with the model's vocabulary")
        train_kenlm(text, arpa, order=args.kenlm_order, vocab=lm.vocab, memory="25%")
    bins = {}
    build = find_tool("build_binary")
    kinds = (("probing", ["probing"]), ("trie", ["trie"]), ("trie q8", ["-q", "8", "-b", "8", "trie"]))
    for kind, extra in kinds[:1] if tag else kinds:
        out = os.path.join(w, f"kenlm{args.kenlm_order}{tag}.{kind.replace(' ', '-')}.bin")
        if os.path.exists(out) and os.path.getmtime(out) < os.path.getmtime(arpa):
            os.remove(out)
        if not os.path.exists(out):
            subprocess.run([build, *extra[:-1], extra[-1], arpa, out], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bins[kind] = out
    if not tag and (not os.path.exists(f16) or os.path.getmtime(f16) < os.path.getmtime(model)):   # resumed
        subprocess.run(nlm("convert", "--float16", model, f16, "-q"), check=True, stdout=subprocess.DEVNULL)
    log("perplexities")
    _, _, so = rss_of(nlm("perplexity", "-m", model, "--exact", "--test", test, "--kenlm", bins["probing"],
                          "--valid", valid, "--no-loglinear", "--json", "-q"))
    ppl = json.loads(so)
    meta = lm.header.get("metadata", {})
    return {"model": model, "vocab": len(lm.vocab), "order": lm.order, "epochs": meta.get("epochs"),
            "train_flags": args.train_flags or "",
            "heldout_perplexity_raw": meta.get("heldout_perplexity"), "perplexity": ppl,
            "files": {"nlm float32": model, "nlm float16": f16, "kenlm arpa": arpa,
                      **{f"kenlm {k}": v for k, v in bins.items()}}}


def sizes_of(q: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    if not q:
        return []
    return [{"model": k, "mib": round(os.path.getsize(v) / 2 ** 20, 1)} for k, v in q["files"].items()]


def _ppl_rows(q: Dict[str, Any]) -> List[Tuple[str, float]]:
    rows = q["perplexity"].get("rows") or q["perplexity"].get("results") or []
    return [(r.get("name") or r.get("model"), r.get("perplexity")) for r in rows]


def curve_row(q: Dict[str, Any], tokens: int) -> Dict[str, Any]:
    """One point of the perplexities against corpus size: the training corpus's tokens, the
    model's epochs and vocabulary, and each model's test perplexity (:func:`quality`'s)."""
    return {"tokens": tokens, "epochs": q.get("epochs"), "vocab": q.get("vocab"),
            **{name: p for name, p in _ppl_rows(q) if isinstance(p, (int, float))}}


def format_markdown(r: Dict[str, Any]) -> str:
    out = [f"Machine: {r['machine']}; date {r['date']}.", "",
           "| corpus tokens | word types | compile s | MB/s | file MiB | compile peak RSS MiB |",
           "|---|---|---|---|---|---|"]
    for c in r["corpora"]:
        out.append(f"| {c['tokens']:,} | {c['types']:,} | {c['seconds']} | {c['mb_per_s']} | {c['file_mib']} "
                   f"| {c['peak_rss_mib']} |")
    out += ["", "| training corpus tokens | peak RSS of training MiB | |", "|---|---|---|"]
    for m in r["memory"]:
        out.append(f"| {m['tokens']:,} | {m['peak_rss_mib']} | {m['note'] and 'repeated ' + m['note']} |")
    out += ["", "| engine | recipe | threads/processes | words/s | minutes per epoch (whole corpus) |",
            "|---|---|---|---|---|"]
    for s in sorted(r["speed"], key=lambda s: s["engine"] != "native"):   # native rows first
        out.append(f"| {s['engine']} | {s.get('recipe', 'default')} | {s['workers']} | {s['words_per_s']:,} "
                   f"| {s['epoch_minutes']} |")
    q = r.get("quality")
    if q:
        flags = f", train flags `{q['train_flags']}`" if q.get("train_flags") else ""
        out += ["", f"Quality model: order {q['order']}, V = {q['vocab']:,}, {q['epochs']} epochs{flags}.", "",
                "| model | test perplexity | ratio to KenLM |", "|---|---|---|"]
        rows = _ppl_rows(q)
        ken = dict(rows).get("kenlm")
        for name, p in rows:
            if not isinstance(p, (int, float)):
                out.append(f"| {name} | {p} | |")
                continue
            ratio = f"{p / ken:.3f}" if isinstance(ken, (int, float)) and ken else ""
            out.append(f"| {name} | {p:.2f} | {ratio} |")
        if len(r.get("curve") or []) > 1:
            out += ["", "The same recipe and KenLM on each corpus size (the smaller ones samples of the text; the same test text):", "",
                    "| training tokens | V | epochs | NLM | KenLM | linear | NLM / KenLM | linear / KenLM |",
                    "|---|---|---|---|---|---|---|---|"]
            for c in r["curve"]:
                ken = c.get("kenlm")
                cells = [f"{c[m]:.2f}" if m in c else "" for m in ("neural", "kenlm", "linear")]
                ratios = [f"{c[m] / ken:.3f}" if m in c and ken else "" for m in ("neural", "linear")]
                out.append(f"| {c['tokens']:,} | {c.get('vocab') or 0:,} | {c.get('epochs')} | "
                           + " | ".join(cells + ratios) + " |")
        out += ["", "| model file | MiB |", "|---|---|"]
        for s in r["sizes"]:
            out.append(f"| {s['model']} | {s['mib']} |")
    return "\n".join(out)


def merge_commands(earlier: str, command: str) -> str:
    """The command lines shown above the tables (one per line, joined as the results block
    indents them): ``earlier``'s, then ``command``; a command run again moves to the end
    instead of appearing twice."""
    lines = [c for c in earlier.split("\n    ") if c and c != command]
    return "\n    ".join(lines + [command])


#: the native trainer's configurations timed by the speed part: (name, train settings)
SPEED_RECIPES = (("default", {}), ("default, threads share each minibatch", {"hogwild": False}),
                 ("no direct features", {"direct_order": 0}),
                 ("no direct features, row-wise AdaGrad", {"direct_order": 0, "row_adagrad": True}),
                 ("shared noise, no direct features", {"direct_order": 0, "shared_noise": True,
                                                       "minibatch_size": 1000}))

#: timed by the torch engine on a GPU only: the 500-wide LBL with shared-noise NCE in minibatches
#: large enough that its matrix products, not the kernel launches, set the pace
GPU_RECIPES = (("width 500, shared noise, no direct features, minibatch 16384",
                {"word_width": 500, "direct_order": 0, "shared_noise": True, "minibatch_size": 16384}),)


def recipe_flags(extra: Dict[str, Any]) -> List[str]:
    """The ``train`` flags of a speed recipe's settings (``{"direct_order": 0}`` ->
    ``--direct-order 0``; ``True`` -> the bare flag)."""
    flags: List[str] = []
    for k, v in extra.items():
        flags += [f"--{k.replace('_', '-')}"] if v is True else [f"--{k.replace('_', '-')}", str(v)]
    return flags


def torch_trains(extra: Dict[str, Any]) -> bool:
    """Whether the torch engine trains a speed recipe: it trains one minibatch at a time (no
    Hogwild switch) and keeps an AdaGrad sum per weight (no row-wise sums)."""
    return "hogwild" not in extra and "row_adagrad" not in extra


BEGIN = "<!-- bench-scale:begin: written by `nlmfeature bench scale --results`; do not edit by hand -->"
END = "<!-- bench-scale:end -->"


def _commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_results(path: str, r: Dict[str, Any]) -> None:
    """The tables of ``r`` with the command line, date, commit and machine, into ``path``."""
    from nlmfeature.io.atomicfile import replace_block

    # paths of the machine it ran on are shortened to their last two parts (gutenberg/train.txt)
    command = re.sub(r"(?<!\S)/\S+", lambda m: "/".join(m.group(0).rstrip("/").split("/")[-2:]), r["command"])
    body = (f"    {command}\n\n"
            f"{r['date']}, commit {r['commit']}, {r['machine']}.\n\n" + format_markdown(r).split("\n", 2)[2])
    replace_block(path, BEGIN, END, body, heading="## Training at scale (`nlmfeature bench scale`)")


def plot(r: Dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    mem = sorted(r["memory"], key=lambda m: m["tokens"])
    axes[0].plot([m["tokens"] / 1e6 for m in mem], [m["peak_rss_mib"] for m in mem], "o-", label="training")
    cor = sorted(r["corpora"], key=lambda c: c["tokens"])
    axes[0].plot([c["tokens"] / 1e6 for c in cor], [c["peak_rss_mib"] for c in cor], "s--", label="compiling")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("corpus tokens (millions)")
    axes[0].set_ylabel("peak RSS (MiB)")
    axes[0].set_ylim(bottom=0)
    axes[0].legend()
    axes[0].set_title("memory against corpus size")
    q = r.get("quality")
    curve = sorted(r.get("curve") or [], key=lambda c: c["tokens"])
    if len(curve) > 1:
        for name, style in (("neural", "o-"), ("kenlm", "s--"), ("linear", "^:")):
            pts = [(c["tokens"] / 1e6, c[name]) for c in curve if name in c]
            axes[1].plot([x for x, _ in pts], [y for _, y in pts], style,
                         label={"neural": "NLM", "kenlm": "KenLM 5-gram", "linear": "linear mix"}[name])
        axes[1].set_xscale("log")
        axes[1].set_xlabel("corpus tokens (millions)")
        axes[1].set_ylabel("test perplexity (held-out books)")
        axes[1].legend()
        axes[1].set_title("perplexity against corpus size")
    elif q:
        rows = [(n, p) for n, p in _ppl_rows(q) if isinstance(p, (int, float))]
        axes[1].bar(range(len(rows)), [p for _, p in rows])
        axes[1].set_xticks(range(len(rows)), [n for n, _ in rows], rotation=20, fontsize=8)
        axes[1].set_ylabel("test perplexity")
        axes[1].set_title("held-out books")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
