"""Hostile inputs to the parsers and the native tuning loops (issue 10): non-finite numbers,
absurd ids and sizes, non-regular files and compressed-stream errors give a clear error naming
the file (and line), in bounded memory and time, with no partial output left behind.

Inputs are real lists and references from ``tests/data`` with one line changed; every case
that can crash runs in a subprocess with a time limit.
"""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from nlmfeature import _mert
from nlmfeature.errors import InputError
from nlmfeature.kbest import check_line, parse_line, read_kbest

DATA = os.path.join(os.path.dirname(__file__), "data")
TUNING = os.path.join(DATA, "tuning")
REG = os.path.join(TUNING, "regtest.nbest.1.gz")
REG_REF = os.path.join(TUNING, "regtest.reference")
KBEST = os.path.join(DATA, "kbest")
MOSES = os.path.join(KBEST, "moses-multi30k-dev10.100best.gz")
CDEC = os.path.join(KBEST, "cdec-lattice.kbest")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def real_lines(path: str) -> list:
    with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else \
            open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def with_value(line: str, label: str, value: str) -> str:
    """``line`` with the first value after ``label`` replaced by ``value``."""
    fields = line.split("|||")
    toks = fields[2].split()
    toks[toks.index(label) + 1] = value
    fields[2] = " " + " ".join(toks) + " "
    return "|||".join(fields)


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter from the source tree (a crash cannot take the tests)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


# -- issue 10 case 11: nan/inf in a k-best list ------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "-Infinity"])
def test_non_finite_feature_value_is_an_error_with_file_and_line(tmp_path, value):
    lines = real_lines(REG)[:20]
    lines[7] = with_value(lines[7], "lm=", value)
    path = tmp_path / "bad.nbest"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"bad.nbest:8: .*{value}.*finite"):
        list(read_kbest(str(path)))
    # the fast checker used by rescoring gives the same error
    with pytest.raises(InputError, match=r":8: .*finite"):
        check_line(lines[7], "moses", str(path), 8)
    reader = read_kbest(str(path), skip_bad=True)
    assert len(list(reader)) == 19 and reader.skipped == 1


def test_non_finite_total_and_cdec_value_are_errors():
    moses = real_lines(MOSES)[0]
    fields = moses.split("|||")
    fields[3] = " nan"
    with pytest.raises(InputError, match=r"f:3: total score is ' ?nan'|f:3: total score is 'nan'"):
        parse_line("|||".join(fields), "moses", "f", 3)
    with pytest.raises(InputError, match=r"f:3: .*finite"):
        check_line("|||".join(fields), "moses", "f", 3)
    cdec = real_lines(CDEC)[0]
    name = cdec.split("|||")[2].split()[0].split("=")[0]
    bad = cdec.replace(cdec.split("|||")[2].split()[0], f"{name}=inf", 1)
    with pytest.raises(InputError, match=rf"f:2: value of feature '{name}' is 'inf'"):
        parse_line(bad, "cdec", "f", 2)


def test_tuning_on_a_list_with_nan_reports_the_line_not_a_segfault(tmp_path):
    lines = real_lines(REG)
    lines[3] = with_value(lines[3], "lm=", "nan")
    kb = tmp_path / "nan.nbest"
    kb.write_text("\n".join(lines) + "\n")
    init = tmp_path / "init"
    init.write_text("d= 0.3 0.3 0.3 0.3 0.3 0.3 0.3\nlm= 0.5\ntm= 0.2 0.2 0.2 0.2 0.2\nw= -1\n")
    out = tmp_path / "w.out"
    r = run_python(f"""
        import sys
        from nlmfeature.tuning.cli import main
        sys.exit(main(['optimise', '--quiet', '--nbest', {str(kb)!r}, '--ref', {REG_REF!r},
                       '--out', {str(out)!r}, '--init', {str(init)!r}, '--restarts', '2']))
    """)
    assert r.returncode == 2, r.stderr
    assert f"{kb}:4: value of feature 'lm' is 'nan'" in r.stderr
    assert not out.exists()


def real_pool_arrays():
    from nlmfeature.bleu import References
    from nlmfeature.tuning.data import KbestPool
    pool = KbestPool(References.from_files([REG_REF]))
    pool.add_file(REG)
    return pool.arrays()


@pytest.mark.parametrize("bad", ["nan", "inf", "mixed"])
def test_native_envelopes_stay_in_bounds_on_non_finite_lines(bad):
    """The native loops themselves: no input may make them write outside their arrays (on
    main a NaN slope made ``envelope_unsorted`` walk forever past its output buffer and the
    qsort comparator of ``slope_order`` inconsistent)."""
    r = run_python(f"""
        import numpy as np
        from nlmfeature import _mert
        import sys; sys.path.insert(0, "tests")
        from test_parsers import real_pool_arrays
        A = real_pool_arrays()
        rng = np.random.default_rng(1)
        slope = A.features @ rng.standard_normal(A.features.shape[1])
        icpt = A.features @ rng.standard_normal(A.features.shape[1])
        rows = rng.choice(len(slope), 300, replace=False)
        if {bad!r} == "nan":
            slope[rows] = np.nan
        elif {bad!r} == "inf":
            slope[rows[:150]] = np.inf; slope[rows[150:]] = -np.inf
        else:
            slope[rows[:100]] = np.nan; slope[rows[100:200]] = np.inf; icpt[rows[200:]] = np.nan
        N, S = len(slope), len(A.offsets) - 1
        for _ in range(20):
            first, xs, old, new = _mert.envelope_unsorted(slope, icpt, A.offsets)
            assert len(xs) <= N - S and len(first) == S
            order = _mert.slope_order(slope, A.offsets)
            assert sorted(order.tolist()) == list(range(N))
            first, xs, old, new = _mert.envelope(slope, icpt, A.offsets, order)
            assert len(xs) <= N - S
            rng.shuffle(slope)
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def test_native_loops_refuse_inconsistent_offsets_and_orders():
    A = real_pool_arrays()
    F, offsets = A.features, A.offsets
    N, D = F.shape
    slope = np.ascontiguousarray(F[:, 0])
    w = np.ones(D)
    for bad in (offsets + 1, offsets[::-1].copy(), np.array([0, N + 5], dtype=np.int64),
                np.array([0, 0, N], dtype=np.int64), np.array([], dtype=np.int64)):
        with pytest.raises(ValueError, match="offsets"):
            _mert.one_best(F, w, bad)
        with pytest.raises(ValueError, match="offsets"):
            _mert.slope_order(slope, bad)
        with pytest.raises(ValueError, match="offsets"):
            _mert.envelope_unsorted(slope, slope, bad)
        with pytest.raises(ValueError, match="offsets"):
            _mert.segment_argmax(slope, bad)
    order = _mert.slope_order(slope, offsets)
    wrong = order.copy()
    wrong[0] = N + 10**9
    with pytest.raises(ValueError, match="not a row of its sentence"):
        _mert.envelope(slope, slope, offsets, wrong)
    stats = np.ascontiguousarray(A.stats, dtype=np.int32)
    with pytest.raises(ValueError, match="sentence_order"):
        _mert.mira_epoch(F, stats, offsets, np.array([0, len(offsets) + 7], dtype=np.int64),
                         w.copy(), w.copy(), np.zeros(10), 0.01, 0.999, False, 0)
    with pytest.raises(ValueError, match="stats"):
        _mert.mira_epoch(F, stats[:, :4].copy(), offsets, np.arange(len(offsets) - 1),
                         w.copy(), w.copy(), np.zeros(10), 0.01, 0.999, False, 0)
