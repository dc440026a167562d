"""``docs/results.md`` read as data, and the README's headline table written from it.

``docs/results.md`` holds one section per benchmark: a heading, the command that produced it
(an indented block), a paragraph that starts with the commit(s) and date of the run, and the
tables the command printed.  :func:`read_sections` parses that shape; :func:`headline_table`
builds the README's first table from the sections :data:`HEADLINES` names, so that a figure
in the README is always the one in ``docs/results.md`` (``python3 -m nlmfeature.cli --readme
README.md`` rewrites both of the README's generated blocks; a test checks they are current).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from nlmfeature.errors import NLMFeatureError

#: a commit of this repository: 7-12 hex digits with a letter among them (an all-digit one is
#: a commit only in a list after the word "commit"); "@hash" is another repository's
_COMMIT = re.compile(r"(?<![0-9a-z@])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![0-9a-z])")
_COMMIT_LIST = re.compile(r"\bcommits?\s+((?:[0-9a-f]{7,12},\s*)*[0-9a-f]{7,12})(?![0-9a-z])")
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


@dataclass
class Section:
    """One heading of ``docs/results.md`` and what follows it up to the next heading."""

    title: str                                   #: the heading's text, without the ``#``s
    commands: List[str] = field(default_factory=list)  #: indented command lines, continuations joined
    provenance: str = ""                         #: the first paragraph after the commands
    tables: List[List[List[str]]] = field(default_factory=list)  #: each table's body rows' cells

    @property
    def commits(self) -> List[str]:
        """The commit hashes the provenance paragraph names, in order."""
        p = self.provenance
        found = [(m.start(), m.group(0)) for m in _COMMIT.finditer(p)]
        for m in _COMMIT_LIST.finditer(p):
            found += [(m.start(1) + t.start(), t.group(0)) for t in re.finditer(r"[0-9a-f]+", m.group(1))]
        return list(dict.fromkeys(c for _, c in sorted(found)))

    @property
    def date(self) -> str:
        m = _DATE.search(self.provenance)
        return m.group(0) if m else ""

    def row(self, *first: str) -> List[str]:
        """The cells of the first table row whose leading cells are ``first``."""
        for table in self.tables:
            for cells in table:
                if tuple(cells[:len(first)]) == first:
                    return cells
        raise NLMFeatureError(f"docs/results.md, section {self.title!r}: no table row starting "
                              f"{' | '.join(first)}")


def read_sections(text: str) -> Dict[str, Section]:
    """The sections of a ``docs/results.md`` text, by heading."""
    out: Dict[str, Section] = {}
    sec: Optional[Section] = None
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            sec = Section(line.lstrip("#").strip())
            out[sec.title] = sec
        elif sec is not None and line.startswith("    ") and not sec.provenance and not sec.tables:
            cmd = line.strip()
            while cmd.endswith("\\") and i + 1 < len(lines) and lines[i + 1].startswith("    "):
                i += 1
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
            sec.commands.append(cmd)
        elif sec is not None and line.startswith("|"):
            table = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(set(c) <= set("-: ") for c in cells):
                    table.append(cells)
                i += 1
            sec.tables.append(table[1:])        # the body: the header row dropped
            continue
        elif sec is not None and line.strip() and sec.commands and not sec.provenance:
            para = [line.strip()]
            while i + 1 < len(lines) and lines[i + 1].strip() and not lines[i + 1].startswith(("|", "#", "    ")):
                i += 1
                para.append(lines[i].strip())
            sec.provenance = " ".join(para)
        i += 1
    return out


# -- the README's headline table -----------------------------------------------------------------
def _mean(cell: str) -> str:
    return cell.split("±")[0].strip()


def _gain(base: str, new: str, diff: str) -> str:
    """``40.60 → 42.25 (**+1.66**, p = 0.001)`` from the cells of a ``bench mt`` table."""
    m = re.fullmatch(r"([+-]?[\d.]+) \(([\d.]+)\)", diff.strip())
    if not m:
        raise NLMFeatureError(f"docs/results.md: {diff!r} is not a 'difference (p)' cell")
    return f"{_mean(base)} → {_mean(new)} (**{m.group(1)}**, p = {m.group(2)})"


def bleu_gain(part: str, *sets: str) -> Callable[[Section], str]:
    """The BLEU row(s) of a ``bench mt`` table: KenLM only → KenLM + NLM, difference, p."""
    def render(s: Section) -> str:
        out = []
        for name in sets:
            cells = s.row(part, name, "bleu")
            out.append((f"{name} " if len(sets) > 1 else "") + _gain(cells[3], cells[4], cells[5]))
        return "; ".join(out)
    return render


def demo_gain(s: Section) -> str:
    """The demo's test BLEU row: ``40.51 | 41.72 (+1.21, p = 0.002)``."""
    cells = s.row("test BLEU")
    m = re.fullmatch(r"([\d.]+) \(([+-][\d.]+), p = ([\d.]+)\)", cells[2])
    if not m:
        raise NLMFeatureError(f"docs/results.md, section {s.title!r}: {cells[2]!r} is not "
                              "'score (+diff, p = p)'")
    return f"{cells[1]} → {m.group(1)} (**{m.group(2)}**, p = {m.group(3)})"


def scale_headline(s: Section) -> str:
    """``bench scale``'s perplexities against KenLM, its corpus and its memory curve: ``NLM
    79.15, KenLM 79.90 (**0.991x**), interpolated **0.848x**; trained on 41M tokens; on 10M
    tokens 0.812x; training peak RSS 1.16-1.19 GiB from 10M to 988M tokens``.  The corpus table is
    the one of six columns, the memory table the one of three and the perplexity-against-size
    table the one of eight whose rows start with a token count."""
    nlm, kenlm, linear = s.row("neural"), s.row("kenlm"), s.row("linear")

    def counted(columns: int) -> List[List[str]]:
        return [r for t in s.tables if t and len(t[0]) == columns for r in t if r[0].replace(",", "").isdigit()]

    corpora = [int(r[0].replace(",", "")) for r in counted(6)]
    memory = [(int(r[0].replace(",", "")), float(r[1])) for r in counted(3)]
    if not corpora or not memory:
        raise NLMFeatureError(f"docs/results.md, section {s.title!r}: no corpus or memory table")
    tokens, rss = [t for t, _ in memory], [m for _, m in memory]
    # the perplexity-against-size table (eight columns): the NLM's ratio on the smaller corpora
    smaller = [(int(r[0].replace(",", "")), r[6]) for r in counted(8)
               if int(r[0].replace(",", "")) < max(corpora) and r[6]]
    curve = (f"; on {' and '.join(f'{t / 1e6:.0f}M' for t, _ in sorted(smaller))} tokens "
             f"{' and '.join(f'{r}x' for _, r in sorted(smaller))}" if smaller else "")
    return (f"NLM {nlm[1]}, KenLM {kenlm[1]} (**{float(nlm[2]):.3f}x**), interpolated **{float(linear[2]):.3f}x**; "
            f"trained on {max(corpora) / 1e6:.0f}M tokens{curve}; training peak RSS {min(rss) / 1024:.2f}-"
            f"{max(rss) / 1024:.2f} GiB from {min(tokens) / 1e6:.0f}M to {max(tokens) / 1e6:,.0f}M tokens")


def scale_speed(s: Section) -> str:
    """``bench scale``'s native words/s of the default recipe: ``**327,265** words/s on 2
    threads, 179,906 on 1``."""
    rows = sorted((int(r[2]), r[3]) for t in s.tables for r in t
                  if len(r) == 5 and r[:2] == ["native", "default"] and r[2].isdigit())
    if not rows:
        raise NLMFeatureError(f"docs/results.md, section {s.title!r}: no native default speed row")
    (n_most, most), rest = rows[-1], rows[:-1]
    others = ", ".join(f"{w} on {n}" for n, w in reversed(rest))
    return f"**{most}** words/s on {n_most} threads" + (f", {others}" if others else "")


def moses2_ratio(config: str = "") -> Callable[[Section], str]:
    """Moses2's decode CPU time with the NLM against KenLM alone from ``bench_decoder.py
    --markdown``'s table (configuration | search | threads | CPU ms | ratio (paired) | ...):
    ``**1.84x** KenLM alone with cube pruning on 1 thread, 1.84x on 2; normal search 2.86x``.
    The rows of ``config``, or (without it) of every configuration but ``kenlm``; a later table's
    row of the same search and threads (a run of one search with more repeats) replaces an
    earlier one's."""
    def render(s: Section) -> str:
        ratio: Dict[Tuple[str, str], str] = {}
        for r in (r for t in s.tables for r in t if len(r) == 7 and r[2].isdigit()
                  and (r[0] == config if config else r[0] != "kenlm")):
            ratio[(r[1], r[2])] = r[4].split()[0]
        cube = [(t, x) for (search, t), x in ratio.items() if search == "cube"]
        normal = [x for (search, t), x in ratio.items() if search == "normal" and t == "1"]
        if not cube:
            raise NLMFeatureError(f"docs/results.md, section {s.title!r}: no cube pruning row"
                                  + (f" of {config}" if config else ""))
        (t0, first), rest = cube[0], cube[1:]
        out = f"**{first}x** KenLM alone with cube pruning on {t0} thread{'s' if t0 != '1' else ''}"
        out += "".join(f", {r}x on {t}" for t, r in rest)
        return out + (f"; normal search {normal[0]}x" if normal else "")
    return render


def memory_headline(nlm: str, kenlm: str = "kenlm-probing", small: str = "kenlm-trie-q8") -> Callable[[Section], str]:
    """``bench memory --moses``'s row of the neural model ``nlm`` against the KenLM rows
    ``kenlm`` and ``small``: perplexity ratio, the decoder's peak memory and BLEU as the only
    LM (``**0.944x** KenLM's perplexity; decoder peak **316 MB** against 1,794 (probing) and
    586 (trie-q8); as the only LM of the 100-best lists 51.23 against 55.53 BLEU``)."""
    def render(s: Section) -> str:
        n, k, q = s.row(nlm), s.row(kenlm), s.row(small)
        if len(n) < 11:
            raise NLMFeatureError(f"docs/results.md, section {s.title!r}: no decoder columns in the row of {nlm}")
        return (f"**{n[3]}x** KenLM's perplexity; decoder peak **{int(n[9]):,} MB** against {int(k[9]):,} "
                f"({kenlm.replace('kenlm-', '')}) and {int(q[9]):,} ({small.replace('kenlm-', '')}); as the only "
                f"LM of the 100-best lists {_mean(n[5].split('(')[0])} against {_mean(k[5].split('(')[0])} BLEU")
    return render


def last_command(s: Section) -> str:
    """The section's last command (the one that printed its tables)."""
    return s.commands[-1]


def command_with_part(part: str, engine: str = "") -> Callable[[Section], str]:
    """The last of a ``bench scale`` section's commands that measured ``part`` (its
    ``--parts`` names it, or it has none: all parts), and with ``engine`` that engine (its
    ``--engines`` names it, or it has none: all engines)."""
    def names(command: str, flag: str, item: str) -> bool:
        m = re.search(rf"{flag}\s+(\S+)", command)
        return m is None or item in m.group(1).split(",")

    def choose(s: Section) -> str:
        for c in reversed(s.commands):
            if names(c, "--parts", part) and (not engine or names(c, "--engines", engine)):
                return c
        raise NLMFeatureError(f"docs/results.md, section {s.title!r}: no command measured {part}")
    return choose


def cell(first: str, column: int, fmt: str) -> Callable[[Section], str]:
    """One cell of the row starting ``first``, written into ``fmt`` (``{}``)."""
    return lambda s: fmt.format(s.row(first)[column])


#: (README label, docs/results.md heading, how the figure is written from that section, which
#: of the section's commands the README shows: by default the last, the one that printed it)
HEADLINES: Sequence[Tuple[str, str, Callable[[Section], str], Callable[[Section], str]]] = (
    ("BLEU, the NLM inside Moses' search (3 tunings per side)",
     "BLEU with the NLM inside Moses' search", bleu_gain("decoding", "test"), last_command),
    ("BLEU, rescoring Moses 1000-best lists (3 tunings)",
     "BLEU rescoring Moses 1000-best lists", bleu_gain("1000-best rescoring", "test"), last_command),
    ("BLEU, Tatoeba de→en (166k pairs) with a 42M-word KenLM, the NLM trained on the same text "
     "and continued on the in-domain side (`train --init-model`; float16, 1/11 of KenLM's size), "
     "in Moses2 with cube pruning (3 tunings per side)",
     "The adapted NLM with cube pruning (`--search cube`), in Moses2",
     bleu_gain("decoding", "test", "newstest2013", "newstest2014"), last_command),
    ("BLEU, the same Tatoeba system and NLM with the 5-gram of the in-domain side alone (1.3M "
     "words, which holds a third of the test sentences) instead of the 42M-word KenLM",
     "Beside the in-domain 5-gram (KenLM-small) instead of KenLM-big",
     bleu_gain("decoding", "test", "newstest2013", "newstest2014"), last_command),
    ("BLEU, the same Tatoeba system and NLM with both n-gram LMs as two features (the 42M-word "
     "KenLM and the in-domain 5-gram), as Moses systems are usually built",
     "Beside both LMs (KenLM-big and KenLM-small as two features)",
     bleu_gain("decoding", "test", "newstest2013", "newstest2014"), last_command),
    ("BLEU, the demo (bundled 100-best lists)", "The demo", demo_gain, last_command),
    ("test perplexity on Project Gutenberg books never trained on, V = 100k: the NLM against a "
     "KenLM 5-gram of the same text",
     "Training at scale (`nlmfeature bench scale`)", scale_headline, command_with_part("quality")),
    ("training speed of the default recipe (LBL 200, NCE, direct features), V = 100k, Gutenberg",
     "Training at scale (`nlmfeature bench scale`)", scale_speed, command_with_part("speed", "native")),
    ("Moses decode CPU time with the NLM (LBL 200)", "Decode time in Moses",
     cell("KenLM + NLM (unnormalised)", 1, "**{}** KenLM alone"), last_command),
    ("Moses2 decode CPU time with the NLM (order-8 LBL 200, unnormalised)",
     "Decode time in Moses2 (beside Moses)", moses2_ratio(), last_command),
    ("Moses2 decode CPU time on the Tatoeba system, the adapted NLM beside the 1.6 GB KenLM",
     "Decode cost side by side on the Tatoeba system (Moses2)",
     moses2_ratio("kenlm-big+nlm"), last_command),
    ("memory against quality on the Tatoeba system: the adapted NLM (LBL 200, float16) against KenLM "
     "5-gram models of the same 42M-word text, each as Moses2's LM",
     "On the Tatoeba system: the big text's models", memory_headline("adapted float16"), last_command),
    ("lookups per second, one thread, a real Moses query stream", "Lookups per second",
     cell("unnormalised LBL 200", 1, "**{}**"), last_command),
)

_MARKS = ("¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹", "¹⁰", "¹¹", "¹²", "¹³")


def _shown(command: str) -> str:
    """A command as the README shows it: without the output-format flag and the decoder path."""
    command = re.sub(r"\s--markdown\b", "", command)
    command = re.sub(r"\s--moses MOSES_ROOT/\S+", "", command)
    return re.sub(r"^MOSES_ROOT=\S+ ", "", command)


def headline_table(results_text: str) -> str:
    """The README's headline table (markdown, with its footnote of commits and dates)."""
    sections = read_sections(results_text)
    machine = re.search(r"The machine: (.+?)\.(?:\s|$)", " ".join(results_text.split()))
    rows = ["| measured on Multi30k de→en (test2016) unless said | result | command that regenerates it |",
            "|---|---|---|"]
    notes = []
    for i, (label, title, render, command) in enumerate(HEADLINES):
        if title not in sections:
            raise NLMFeatureError(f"docs/results.md has no section {title!r} (the README's "
                                  "headline table reads it)")
        s = sections[title]
        if not s.commands:
            raise NLMFeatureError(f"docs/results.md, section {title!r}: no command block")
        mark = _MARKS[i]
        rows.append(f"| {label} | {render(s)} | `{_shown(command(s))}` {mark} |")
        notes.append(f"{mark} {', '.join(s.commits) or 'commit not stated'} ({s.date or 'date not stated'})")
    where = f"; all on {machine.group(1)}" if machine else ""
    return ("\n".join(rows) + "\n\n" + "; ".join(notes) + where + ".  The models, data and full "
            "tables: [docs/results.md](docs/results.md), one section per benchmark.\n")
