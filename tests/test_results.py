"""docs/results.md read as data: every benchmark section names its command, commit and date,
and the README's headline table is written from those sections (a figure changed in
docs/results.md changes the README when it is regenerated, and a stale README is caught)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from nlmfeature import cli
from nlmfeature.bench.results import HEADLINES, headline_table, read_sections, scale_speed
from nlmfeature.errors import NLMFeatureError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results.md")


def test_headline_sections_name_command_commit_and_date():
    sections = read_sections(open(RESULTS, encoding="utf-8").read())
    for _, title, render, command in HEADLINES:
        s = sections[title]
        assert s.commands and s.commands[-1].split()[0] in ("nlmfeature", "python3", "MOSES_ROOT=..."), title
        assert s.commits and s.date.startswith("20"), (title, s.provenance)
        assert render(s) and command(s) in s.commands
    # a bench scale section's rows show the command that measured their part
    scale = sections["Training at scale (`nlmfeature bench scale`)"]
    for title, render, command in [(t, r, c) for _, t, r, c in HEADLINES if t == scale.title]:
        m = re.search(r"--parts\s+(\S+)", command(scale))
        assert m is None or ("speed" if render is scale_speed else "quality") in m.group(1).split(",")
        e = re.search(r"--engines\s+(\S+)", command(scale))
        assert render is not scale_speed or e is None or "native" in e.group(1).split(",")
    row = sections["BLEU with the NLM inside Moses' search"].row("decoding", "test", "bleu")
    base, nlm, diff = (c.split()[0] for c in row[3:6])
    assert f"| {base} → {nlm} (**{diff}**, p = " in headline_table(open(RESULTS, encoding="utf-8").read())
    # continuation lines are joined into one command
    assert all("\\" not in c for s in sections.values() for c in s.commands)


def test_commits_of_a_provenance_paragraph():
    """Hashes with a letter anywhere; all-digit ones only in a list after "commit" (a number
    is not a commit); "@hash" names another repository's commit, not ours."""
    text = ("## X\n\n    nlmfeature bench x\n\n2026-11-30, commit 378f2a0, 5707153, 2 cores; 41152068 tokens, "
            "mosesdecoder @34452895f, then c4d3e3e.\n")
    assert read_sections(text)["X"].commits == ["378f2a0", "5707153", "c4d3e3e"]


def _copy(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copy(os.path.join(ROOT, "README.md"), tmp_path / "README.md")
    shutil.copy(RESULTS, tmp_path / "docs" / "results.md")
    return str(tmp_path / "README.md"), str(tmp_path / "docs" / "results.md")


def test_readme_headline_follows_results(tmp_path):
    readme, results = _copy(tmp_path)
    assert cli.update_readme(readme, check=True)
    text = open(results, encoding="utf-8").read()
    row = read_sections(text)["BLEU with the NLM inside Moses' search"].row("decoding", "test", "bleu")
    old = "| " + " | ".join(row) + " |"
    new = "| " + " | ".join(row[:4] + ["49.99 ± 0.10", "+9.39 (0.001)"]) + " |"
    assert old in text
    open(results, "w", encoding="utf-8").write(text.replace(old, new))
    assert not cli.update_readme(readme, check=True)            # stale now
    assert not cli.update_readme(readme)                         # rewritten
    after = open(readme, encoding="utf-8").read()
    assert f"{row[3].split()[0]} → 49.99 (**+9.39**, p = 0.001)" in after
    assert cli.update_readme(readme, check=True)
    assert after.count(cli.HEADLINE_BEGIN) == 1 and after.count(cli.README_BEGIN) == 1


def test_a_missing_section_is_a_clear_error(tmp_path):
    readme, results = _copy(tmp_path)
    text = open(results, encoding="utf-8").read()
    open(results, "w", encoding="utf-8").write(text.replace("## Lookups per second", "## Lookups"))
    with pytest.raises(NLMFeatureError, match="no section 'Lookups per second'"):
        headline_table(open(results, encoding="utf-8").read())
    p = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "--readme", readme], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "Lookups per second" in p.stderr and "Traceback" not in p.stderr
    assert open(readme, encoding="utf-8").read() == open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_moses2_ratio_reads_the_rows_of_its_configuration():
    """The Tatoeba decode-cost headline reads the KenLM + NLM configuration's rows, not the
    KenLM-only rows beside them (each at 1.00x), and a section without them is an error."""
    from nlmfeature.bench.results import moses2_ratio

    text = """## Cost

    python3 benchmarks/bench_decoder.py --decoder moses2

abc1234, 2026-11-30.

| configuration | search | threads | CPU ms per sentence | x kenlm-big (paired) | wall ms per sentence | BLEU |
|---|---|---|---|---|---|---|
| kenlm-big | normal | 1 | 16.4 | 1.00 (1.00) | 16.4 | 54.65 |
| kenlm-big+nlm | normal | 1 | 37.1 | 2.26 (2.24) | 37.0 | 57.67 |
| kenlm-big | cube | 1 | 4.4 | 1.00 (1.00) | 4.4 | 54.58 |
| kenlm-big+nlm | cube | 1 | 5.4 | 1.21 (1.30) | 5.4 | 57.68 |
"""
    s = read_sections(text)["Cost"]
    assert moses2_ratio("kenlm-big+nlm")(s) == "**1.21x** KenLM alone with cube pruning on 1 thread; normal search 2.26x"
    with pytest.raises(NLMFeatureError, match="no cube pruning row of nlm-alone"):
        moses2_ratio("nlm-alone")(s)
    # a later run of cube pruning alone (more repeats) gives the cube figure; normal stays
    more = text + """
| configuration | search | threads | CPU ms per sentence | x kenlm-big (paired) | wall ms per sentence | BLEU |
|---|---|---|---|---|---|---|
| kenlm-big | cube | 1 | 4.3 | 1.00 (1.00) | 4.3 | 54.58 |
| kenlm-big+nlm | cube | 1 | 5.0 | 1.16 (1.18) | 5.0 | 57.68 |
"""
    s = read_sections(more)["Cost"]
    assert moses2_ratio("kenlm-big+nlm")(s) == "**1.16x** KenLM alone with cube pruning on 1 thread; normal search 2.26x"


def test_scale_headline_reads_the_perplexity_against_size_table():
    """The scale headline gives the whole corpus's perplexities and the NLM's ratio on each
    smaller corpus of the eight-column table (not the whole corpus's row of it again)."""
    from nlmfeature.bench.results import scale_headline

    text = """## Scale

    nlmfeature bench scale --parts quality

2026-11-30, commit abc1234, 2 cores.

| corpus tokens | word types | compile s | MB/s | file MiB | compile peak RSS MiB |
|---|---|---|---|---|---|
| 10,001,792 | 119,666 | 2.4 | 19.8 | 41.8 | 122.4 |
| 235,573,736 | 791,975 | 54.9 | 20.3 | 952.3 | 268.5 |

| training corpus tokens | peak RSS of training MiB | |
|---|---|---|
| 10,001,792 | 743.6 |  |
| 235,573,736 | 797.3 |  |

| model | test perplexity | ratio to KenLM |
|---|---|---|
| neural | 65.66 | 1.005 |
| kenlm | 65.34 | 1.000 |
| linear | 55.77 | 0.853 |

| training tokens | V | epochs | NLM | KenLM | linear | NLM / KenLM | linear / KenLM |
|---|---|---|---|---|---|---|---|
| 10,001,792 | 61,938 | 1.25 | 88.84 | 109.28 | 79.02 | 0.813 | 0.723 |
| 235,573,736 | 100,000 | 2.0 | 65.66 | 65.34 | 55.77 | 1.005 | 0.853 |
"""
    s = read_sections(text)["Scale"]
    assert scale_headline(s) == ("NLM 65.66, KenLM 65.34 (**1.005x**), interpolated **0.853x**; trained on 236M "
                                 "tokens; on 10M tokens 0.813x; training peak RSS 0.73-0.78 GiB from 10M to 236M tokens")


def test_memory_headline_reads_the_decoder_columns():
    """The memory headline takes the NLM's perplexity ratio, the decoder's peak memory of it
    and of two KenLM rows, and BLEU as the only LM; a table without decoder columns is an
    error."""
    from nlmfeature.bench.results import memory_headline

    text = """## Memory

    nlmfeature bench memory --moses MOSES_ROOT/bin/moses2 --markdown

2026-11-30, abc1234, 2 cores.

| model | MB | test ppl | x KenLM probing | linear with KenLM probing (weight) | test BLEU as the only LM (sd) | dev BLEU | test BLEU beside the lists' LM (sd) | dev BLEU | decoder peak MB | decoder load s |
|---|---|---|---|---|---|---|---|---|---|---|
| adapted | 230.54 | 23.71 | 0.944 | 19.30 (0.69) | 51.79 (0.78) | 54.03 | 57.14 (0.02) | 57.48 | 437 | 2.49 |
| kenlm-probing | 1629.45 | 25.13 | 1.000 |  | 55.53 (0.25) | 56.91 | 56.65 (0.83) | 57.48 | 1794 | 1.73 |
| kenlm-trie-q8 | 421.79 | 25.13 | 1.000 |  | 55.49 (0.14) | 56.78 | 57.13 (0.02) | 57.48 | 586 | 1.62 |

## Without the decoder

    nlmfeature bench memory --markdown

2026-11-30, abc1234, 2 cores.

| model | MB | test ppl | x KenLM probing | linear with KenLM probing (weight) | test BLEU as the only LM (sd) | dev BLEU |
|---|---|---|---|---|---|---|
| adapted | 230.54 | 23.71 | 0.944 | 19.30 (0.69) | 51.79 (0.78) | 54.03 |
| kenlm-probing | 1629.45 | 25.13 | 1.000 |  | 55.53 (0.25) | 56.91 |
| kenlm-trie-q8 | 421.79 | 25.13 | 1.000 |  | 55.49 (0.14) | 56.78 |
"""
    sections = read_sections(text)
    assert memory_headline("adapted")(sections["Memory"]) == (
        "**0.944x** KenLM's perplexity; decoder peak **437 MB** against 1,794 (probing) and 586 (trie-q8); "
        "as the only LM of the 100-best lists 51.79 against 55.53 BLEU")
    with pytest.raises(NLMFeatureError, match="no decoder columns"):
        memory_headline("adapted")(sections["Without the decoder"])
