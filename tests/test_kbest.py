"""k-best I/O (nlmfeature.mt.kbest) and the weights reader (nlmfeature.mt.weights) on real lists."""
from __future__ import annotations

import gzip
import math
import os

import pytest

from nlmfeature.errors import InputError
from nlmfeature.io.atomicfile import open_output
from nlmfeature.mt.kbest import (Hypothesis, detect_format, format_hypothesis, group_by_sentence,
                              parse_line, read_kbest)
from nlmfeature.io.textio import iter_lines
from nlmfeature.mt.weights import format_weights, read_weights, weights_for, write_weights

DATA = os.path.join(os.path.dirname(__file__), "data", "kbest")
MOSES = os.path.join(DATA, "moses-multi30k-dev10.100best.gz")
MOSES_OLD = os.path.join(DATA, "moses-old-fr-en5.nbest.gz")
CDEC = os.path.join(DATA, "cdec-lattice.kbest")
CDEC2 = os.path.join(DATA, "cdec-synparse.kbest")
INI = os.path.join(DATA, "multi30k-dev.iter2.moses.ini")
MOSES_IT2 = os.path.join(DATA, "moses-multi30k-dev3.iter2.100best.gz")


def normalise(line: str) -> str:
    """The documented normalisation: fields stripped and joined by ' ||| ', runs of white
    space in the hypothesis and feature fields collapsed."""
    f = [x.strip() for x in line.split("|||")]
    f[1] = " ".join(f[1].split())
    f[2] = " ".join(f[2].split())
    return " ||| ".join(f)


@pytest.mark.parametrize("path,fmt,n", [(MOSES, "moses", 687), (MOSES_OLD, "moses-old", 500),
                                        (CDEC, "cdec", 5), (CDEC2, "cdec", 36)])
def test_round_trip_is_exact_up_to_whitespace(path, fmt, n):
    reader = read_kbest(path)
    raw = [line for _, line in iter_lines(path)]
    hyps = list(reader)
    assert reader.format == fmt and len(hyps) == n == len(raw)
    for hyp, line in zip(hyps, raw):
        out = format_hypothesis(hyp, reader.format)
        assert out == normalise(line)
        assert parse_line(out, fmt) == hyp


def test_moses_fields_are_parsed():
    first = next(iter(read_kbest(MOSES)))
    assert first.sid == 0
    assert first.text == "a group of men loading baumwolle on a truck"
    assert [l for l, _ in first.features] == ["LexicalReordering0", "Distortion0", "LM0",
                                              "WordPenalty0", "PhrasePenalty0",
                                              "TranslationModel0"]
    assert first.features[0][1] == [-1.68227, 0, 0, -0.715608, 0, 0]
    assert first.features[2] == ("LM0", [-44.1])
    assert first.total == -103.733 and first.extra == []
    assert len(first.dense()) == 14
    assert first.dense_names()[:2] == ["LexicalReordering0_0", "LexicalReordering0_1"]
    assert "LM0" in first.dense_names()


def test_old_style_and_cdec_fields():
    old = next(iter(read_kbest(MOSES_OLD)))
    assert [(l, len(v)) for l, v in old.features] == [("d", 7), ("lm", 2), ("tm", 5), ("w", 1)]
    assert format_hypothesis(old, "moses").split(" ||| ")[2].startswith("d= 0 -7.66174")
    cd = list(read_kbest(CDEC))
    assert cd[3].features[0] == ("Glue", [1.0]) and cd[2].text == "a_b"
    assert cd[0].total == -1.09359


def test_detect_format():
    assert detect_format("0 ||| a b ||| LM0= -1 2 ||| 3") == "moses"
    assert detect_format("0||| a ||| d: 1 lm: 2 ||| 3") == "moses-old"
    assert detect_format("0 ||| a ||| LM=-1.5 WP=2 ||| 3") == "cdec"
    assert detect_format("0 ||| a |||  ||| 3") == "moses"


def test_multi_valued_feature_in_cdec_format_and_extra_fields():
    h = Hypothesis(3, "x y", [("TM", [1.0, -2.5]), ("LM", [0.125])], 7.0, ["0-0 1-1"])
    line = format_hypothesis(h, "cdec")
    assert line == "3 ||| x y ||| TM_0=1 TM_1=-2.5 LM=0.125 ||| 7 ||| 0-0 1-1"
    assert format_hypothesis(h, "moses") == "3 ||| x y ||| TM= 1 -2.5 LM= 0.125 ||| 7 ||| 0-0 1-1"
    assert parse_line(format_hypothesis(h, "moses"), "moses") == h
    no_total = Hypothesis(1, "z", [], math.nan, [])
    assert format_hypothesis(no_total, "moses") == "1 ||| z ||| "
    assert math.isnan(parse_line("1 ||| z ||| ", "moses").total)


def test_gzip_and_plain_writing_are_atomic(tmp_path):
    hyps = list(read_kbest(MOSES))
    for name in ("out.gz", "out.txt"):
        target = tmp_path / name
        with open_output(str(target)) as f:
            for h in hyps[:50]:
                f.write(format_hypothesis(h, "moses") + "\n")
            assert not target.exists()          # only the temporary file exists until close
        assert list(read_kbest(str(target))) == hyps[:50]
    with gzip.open(tmp_path / "out.gz", "rt") as f:
        assert f.readline().startswith("0 ||| a group of men")
    with pytest.raises(RuntimeError):
        with open_output(str(tmp_path / "failed.gz")) as f:
            f.write("partial\n")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == sorted(os.listdir(tmp_path)) and \
        sorted(os.listdir(tmp_path)) == ["out.gz", "out.txt"]


def test_group_by_sentence_on_real_list():
    groups = list(group_by_sentence(read_kbest(MOSES)))
    assert [sid for sid, _ in groups] == list(range(10))
    assert [len(g) for _, g in groups] == [100, 16, 64, 100, 14, 24, 100, 100, 100, 69]


def test_group_by_sentence_rejects_reappearing_id(tmp_path):
    lines = [l for _, l in iter_lines(CDEC2)]
    p = tmp_path / "split.kbest"
    p.write_text("\n".join(lines[:3] + lines[20:22] + lines[3:5]) + "\n")
    with pytest.raises(InputError) as e:
        list(group_by_sentence(read_kbest(str(p))))
    assert f"{p}:6:" in str(e.value) and "sentence id 0 reappears" in str(e.value)


BAD_LINES = [
    ("0 ||| a b", "at least 3 '|||'-separated fields"),
    ("x ||| a b ||| LM0= 1 ||| 2", "sentence id 'x' is not an integer"),
    ("0 ||| a b ||| LM0= 1 abc ||| 2", "'abc' is not a number"),
    ("0 ||| a b ||| LM0= 1 ||| total", "total score: 'total' is not a number"),
    ("0 ||| a b ||| 1 LM0= 2 ||| 2", "comes before any label"),
    ("0 ||| a b ||| LM0= WP0= 1 ||| 2", "'LM0' has no values"),
    ("0 ||| a b ||| LM0= 1 WP0= ||| 2", "'WP0' has no values"),
    ("-1 ||| a b ||| LM0= 1 ||| 2", "negative"),
]


@pytest.mark.parametrize("bad,message", BAD_LINES)
def test_malformed_line_names_file_and_line(tmp_path, bad, message):
    good = [l for _, l in iter_lines(MOSES)][:3]
    p = tmp_path / "bad.100best"
    p.write_text("\n".join(good[:2] + [bad] + good[2:]) + "\n")
    with pytest.raises(InputError) as e:
        list(read_kbest(str(p), fmt="moses"))
    assert str(e.value).startswith(f"{p}:3: ") and message in str(e.value)
    reader = read_kbest(str(p), fmt="moses", skip_bad=True)
    assert len(list(reader)) == 3 and reader.skipped == 1


def test_cdec_malformed_token_and_empty_line(tmp_path):
    p = tmp_path / "bad.kbest"
    p.write_text("0 ||| a ||| LM=1 WP ||| 2\n")
    with pytest.raises(InputError, match=r"bad.kbest:1: feature token 'WP' is not name=value"):
        list(read_kbest(str(p)))
    p.write_text("0 ||| a ||| LM=1 ||| 2\n\n0 ||| b ||| LM=x ||| 2\n")
    with pytest.raises(InputError, match=r"bad.kbest:2: empty line"):
        list(read_kbest(str(p)))
    r = read_kbest(str(p), skip_bad=True)
    assert [h.text for h in r] == ["a"] and r.skipped == 2


def test_truncated_gzip_is_an_error_with_the_line(tmp_path):
    data = open(MOSES, "rb").read()
    p = tmp_path / "cut.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut.gz:\d+: cannot read further"):
        list(read_kbest(str(p)))


# -- weights ----------------------------------------------------------------------------------
def test_read_moses_ini_weight_section():
    w = read_weights(INI)
    assert list(w) == ["LexicalReordering0", "Distortion0", "LM0", "WordPenalty0",
                       "PhrasePenalty0", "TranslationModel0", "UnknownWordPenalty0"]
    assert w["LexicalReordering0"][:2] == [0.0282755, 0.137834] and w["LM0"] == [0.114912]
    # the list was decoded with these weights: each total is the weighted feature sum plus
    # -100 per unknown word (UnknownWordPenalty0 is in the total but not printed)
    n = 0
    for hyp in read_kbest(MOSES_IT2):
        flat, missing = weights_for([(l, len(v)) for l, v in hyp.features], w)
        assert missing == [] and len(flat) == 14
        unknown = (hyp.total - sum(a * b for a, b in zip(flat, hyp.dense()))) / -100
        assert unknown == pytest.approx(round(unknown), abs=1e-3) and round(unknown) >= 0
        n += 1
    assert n == 208


def test_read_cdec_and_plain_weights_and_round_trip(tmp_path):
    w = read_weights(os.path.join(DATA, "cdec-lattice.weights"))
    assert w == {"WordPenalty": [1.0], "SourceWordPenalty": [1.0], "Glue": [0.0],
                 "Cost": [-1.0], "LatticeCost": [-1.0]}
    p = tmp_path / "w.txt"
    p.write_text("# tuned\nTM= 0.1 0.2\nLM: 0.5\nWP=-1\nNLM0 0.25  # the neural LM\n\n")
    w2 = read_weights(str(p))
    assert w2 == {"TM": [0.1, 0.2], "LM": [0.5], "WP": [-1.0], "NLM0": [0.25]}
    write_weights(str(tmp_path / "out.weights"), w2)
    assert read_weights(str(tmp_path / "out.weights")) == w2
    assert format_weights(w2).splitlines()[0] == "TM= 0.1 0.2"


def test_old_style_moses_ini(tmp_path):
    p = tmp_path / "old.ini"
    p.write_text("[ttable-file]\n0 0 5 /x/phrase-table\n\n[weight-d]\n0.3\n0.1\n0.1\n0.1\n0.1\n"
                 "0.1\n0.1\n[weight-l]\n0.5\n0.25\n[weight-t]\n0.2\n0.2\n0.2\n0.2\n0.2\n"
                 "[weight-w]\n-1\n")
    w = read_weights(str(p))
    assert {k: len(v) for k, v in w.items()} == {"d": 7, "lm": 2, "tm": 5, "w": 1}
    old = next(iter(read_kbest(MOSES_OLD)))
    flat, missing = weights_for([(l, len(v)) for l, v in old.features], w)
    assert not missing and len(flat) == 15


@pytest.mark.parametrize("text,message", [
    ("LM0= 0.5\nLM0= 1\n", ":2: feature 'LM0' is given twice (first on line 1)"),
    ("LM0= abc\n", ":1: weight 'abc' of 'LM0' is not a number"),
    ("LM0=\n", ":1: feature 'LM0' has no weight values"),
    ("# nothing\n", ": no weights found"),
    ("[feature]\nKENLM name=LM0\n", ": no [weight] section found"),
])
def test_bad_weights_files(tmp_path, text, message):
    p = tmp_path / "w.txt"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        read_weights(str(p))
    assert str(e.value).startswith(str(p)) and message in str(e.value)


def test_weight_count_mismatch_is_reported():
    with pytest.raises(InputError, match="'TM' has 2 weight"):
        weights_for([("TM", 4)], {"TM": [1.0, 2.0]}, "w.txt")
