"""Hostile inputs to the parsers and the native tuning loops: non-finite numbers,
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
from nlmfeature.mt.kbest import check_line, parse_line, read_kbest

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


# -- nan/inf in a k-best list -----------------------------------------------------------------
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
        from nlmfeature.cli import tune_main as main
        sys.exit(main(['optimise', '--quiet', '--nbest', {str(kb)!r}, '--ref', {REG_REF!r},
                       '--out', {str(out)!r}, '--init', {str(init)!r}, '--restarts', '2']))
    """)
    assert r.returncode == 2, r.stderr
    assert f"{kb}:4: value of feature 'lm' is 'nan'" in r.stderr
    assert not out.exists()


def real_pool_arrays():
    from nlmfeature.mt.bleu import References
    from nlmfeature.mt.tuning.data import KbestPool
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


# -- absurd sentence ids with --one-best ----------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from helpers import make_model
    return make_model(tmp_path_factory.mktemp("m"), "lbl3.nlm", order=3, word_width=8)


def rescore_cli(args, timeout=60):
    return run_python(f"""
        import sys
        from nlmfeature.cli import rescore_main as main
        sys.exit(main({list(args)!r}))
    """, timeout=timeout)


@pytest.mark.parametrize("sentences", [None, 3])
def test_one_best_refuses_an_absurd_sentence_id_without_writing(model, tmp_path, sentences):
    lines = real_lines(MOSES)[:250]                   # sentences 0, 1, 2 (and 3)
    lines = [l for l in lines if l.split("|||")[0].strip() in ("0", "1", "2")]
    bad = lines[-1].split("|||")
    bad[0] = "1000000000000 "
    lines.append("|||".join(bad))
    kb = tmp_path / "huge-id.100best"
    kb.write_text("\n".join(lines) + "\n")
    w = tmp_path / "w.ini"
    w.write_text(open(os.path.join(KBEST, "multi30k-dev.iter2.moses.ini")).read())
    out = tmp_path / "out"
    out.mkdir()
    args = ["-m", model, "-i", str(kb), "--weights", str(w), "--one-best",
            str(out / "one"), "-o", str(out / "k.gz"), "-q"]
    if sentences is not None:
        args += ["--sentences", str(sentences)]
    r = rescore_cli(args, timeout=60)                 # on main: gigabytes, then killed
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{kb}:{len(lines)}: sentence id 1000000000000" in r.stderr
    assert "Traceback" not in r.stderr
    assert os.listdir(out) == []                      # no partial output, no temporary file


def test_one_best_pads_a_plausible_gap_and_counts_it(model, tmp_path):
    from nlmfeature.mt.rescore import rescore
    lines = [l for l in real_lines(MOSES) if l.split("|||")[0].strip() in ("0", "2")]
    moved = [("7" + l[1:]) if l.startswith("2 ") else l for l in lines]
    kb = tmp_path / "gap.100best"
    kb.write_text("\n".join(moved) + "\n")
    w = tmp_path / "w.ini"
    w.write_text(open(os.path.join(KBEST, "multi30k-dev.iter2.moses.ini")).read())
    one = tmp_path / "one"
    msgs = []
    st = rescore(str(kb), None, [model], weights_path=str(w), one_best=str(one),
                 progress=False, log=msgs.append)
    assert st.missing_count == 6 and st.missing == [1, 2, 3, 4, 5, 6]
    best = one.read_text().split("\n")[:-1]
    assert len(best) == 8 and best[0] and best[7] and best[1:7] == [""] * 6


# -- corrupt and truncated compressed input ---------------------------------------------------
def corrupted(data: bytes, where: float) -> bytes:
    i = int(len(data) * where)
    return data[:i] + bytes(b ^ 0x5A for b in data[i:i + 64]) + data[i + 64:]


def broken_gzip(damage: str) -> bytes:
    """The real list as two gzip members (as rescoring writes them) with the second damaged:
    an invalid deflate block type (zlib.error) or cut in the middle (EOFError)."""
    raw = gzip.decompress(open(MOSES, "rb").read())
    half = raw.index(b"\n", len(raw) // 2) + 1
    first, second = gzip.compress(raw[:half]), bytearray(gzip.compress(raw[half:]))
    if damage == "corrupt":
        second[10] |= 0b110                           # BTYPE 11: invalid block type
    else:
        second = second[:len(second) // 2]
    return first + bytes(second)


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_broken_gzip_gives_file_and_line_not_a_zlib_traceback(tmp_path, damage):
    bad = tmp_path / "broken.100best.gz"
    bad.write_bytes(broken_gzip(damage))
    with pytest.raises(InputError) as err:
        list(read_kbest(str(bad)))
    msg = str(err.value)
    want = "corrupt compressed data" if damage == "corrupt" else "ends early"
    assert msg.startswith(f"{bad}:") and "cannot read further" in msg and want in msg, msg
    line = int(msg.split(":")[1])
    assert 300 < line <= 687                          # where the damage was met, not line 0
    # the same through the rescoring CLI: exit status 2, one line, no traceback
    r = rescore_cli(["-m", os.path.join(ROOT, "tests", "data", "nonexistent.nlm"), "-i",
                     str(bad), "-q"])
    assert r.returncode == 2 and "Traceback" not in r.stderr


@pytest.mark.parametrize("ext", [".bz2", ".xz"])
def test_other_compressions_read_like_plain_and_fail_cleanly(tmp_path, ext):
    import bz2
    import lzma
    mod = bz2 if ext == ".bz2" else lzma
    raw = gzip.decompress(open(MOSES, "rb").read())
    good = tmp_path / ("list" + ext)
    good.write_bytes(mod.compress(raw))
    assert [h for h in read_kbest(str(good))] == [h for h in read_kbest(MOSES)]
    from nlmfeature.io.textio import iter_lines
    packed = mod.compress(raw)
    for name, data in (("corrupt", corrupted(packed, 0.6)), ("cut", packed[:len(packed) // 2])):
        bad = tmp_path / (name + ext)
        bad.write_bytes(data)
        # xz decodes some damage to junk bytes before its check fails: either error names the line
        with pytest.raises(InputError, match=rf"{name}{ext}:\d+: (cannot read further|not valid "
                                             "UTF-8)"):
            list(iter_lines(str(bad)))


def test_broken_gzip_references_and_weights(tmp_path):
    from nlmfeature.mt.bleu import References
    from nlmfeature.mt.weights import read_weights
    ref = tmp_path / "ref.gz"
    ref.write_bytes(gzip.compress(open(REG_REF, "rb").read())[:-30])
    with pytest.raises(InputError, match=r"ref.gz:\d+: cannot read further"):
        References.from_files([str(ref)])
    w = tmp_path / "w.ini.gz"
    w.write_bytes(corrupted(gzip.compress(open(os.path.join(KBEST,
                                                            "multi30k-dev.iter2.moses.ini"),
                                                "rb").read()), 0.3))
    with pytest.raises(InputError, match=r"w.ini.gz:\d+: cannot read further"):
        read_weights(str(w))


# -- non-regular files ---------------------------------------------------------------------------
READERS = {
    "kbest": "from nlmfeature.mt.kbest import read_kbest; list(read_kbest(P))",
    "references": "from nlmfeature.mt.bleu import References; References.from_files([P])",
    "weights": "from nlmfeature.mt.weights import read_weights; read_weights(P)",
    "clusters": "from nlmfeature.training.clusters import read_paths; read_paths(P)",
    "corpus": "from nlmfeature.training.corpus import read_lines; read_lines(P)",
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("kind", ["dev-zero", "directory", "fifo"])
def test_non_regular_inputs_are_refused_at_once(tmp_path, reader, kind):
    """On main, /dev/zero was read without end (one endless line) and a FIFO without a
    writer blocked in open(): each reader gets 20 s here before the case counts as a hang."""
    if kind == "dev-zero":
        path = "/dev/zero"
    elif kind == "directory":
        path = str(tmp_path)
    else:
        path = str(tmp_path / "pipe")
        os.mkfifo(path)
    expected = {"dev-zero": "is a character device", "directory": "is a directory",
                "fifo": "is a named pipe"}[kind]
    if kind == "fifo" and reader == "kbest":
        pytest.skip("a k-best list may be streamed through a FIFO (see the next test)")
    code = f"""
        from nlmfeature.errors import InputError
        P = {path!r}
        try:
            {READERS[reader]}
        except InputError as exc:
            print(exc)
    """
    try:
        r = run_python(code, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{reader} on {kind} did not return within 20 s")
    assert r.returncode == 0 and r.stdout.startswith(f"{path}: {expected}"), (r.stdout,
                                                                              r.stderr[-500:])


def test_a_kbest_list_streams_through_a_fifo(tmp_path):
    import threading
    fifo = str(tmp_path / "kbest.fifo")
    os.mkfifo(fifo)
    data = gzip.decompress(open(MOSES, "rb").read())

    def writer():
        with open(fifo, "wb") as f:
            f.write(data)

    t = threading.Thread(target=writer)
    t.start()
    got = list(read_kbest(fifo))
    t.join(10)
    assert got == list(read_kbest(MOSES))


def test_line_length_is_bounded(tmp_path, monkeypatch):
    from nlmfeature.io import textio
    monkeypatch.setattr(textio, "MAX_LINE", 1 << 16)
    monkeypatch.setattr(textio, "CHUNK", 1 << 12)
    lines = real_lines(MOSES)[:5]
    lines[3] = lines[3] + " " + "x" * 200_000          # no newline for 200 KB
    path = tmp_path / "long.100best"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"long.100best:4: line longer than"):
        list(read_kbest(str(path)))


# -- outputs: checked before the work, atomic, nothing left behind ---------------------------
@pytest.mark.parametrize("where", ["directory", "missing-dir", "read-only-dir"])
def test_rescore_checks_its_outputs_before_any_work(model, tmp_path, where):
    if where == "read-only-dir" and os.geteuid() == 0:
        pytest.skip("root can write into a read-only directory")
    target = {"directory": tmp_path, "missing-dir": tmp_path / "nope" / "out.gz",
              "read-only-dir": tmp_path / "ro" / "out.gz"}[where]
    if where == "read-only-dir":
        (tmp_path / "ro").mkdir(mode=0o500)
    from nlmfeature.io.atomicfile import OutputError
    from nlmfeature.mt.rescore import rescore
    # the model does not exist: an output error first proves the check comes before loading
    with pytest.raises(OutputError, match=str(target)):
        rescore(MOSES, str(target), [str(tmp_path / "no-such-model.nlm")], progress=False)
    with pytest.raises(OutputError, match="--one-best"):
        rescore(MOSES, None, [str(tmp_path / "no-such-model.nlm")], weights_path=None,
                one_best=str(target), progress=False)


def test_atomic_writer_leaves_nothing_on_interrupt(tmp_path):
    from nlmfeature.io.atomicfile import atomic_open, open_output
    target = tmp_path / "kept.txt"
    target.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(str(target)) as f:
            f.write(b"new, half written")
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        with open_output(str(tmp_path / "kept.txt")) as f:
            f.write("new, half written")
            raise KeyboardInterrupt
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["kept.txt"]
    with open_output(str(target)) as f:
        f.write("new\n")
    assert target.read_text() == "new\n" and os.listdir(tmp_path) == ["kept.txt"]
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


# -- query logs: forged headers, bombs, non-regular files ------------------------------------
def _packed(header: dict, body: bytes = b"") -> bytes:
    import json
    import lzma
    import struct
    head = json.dumps(header).encode()
    return lzma.compress(struct.pack("<Q", len(head)) + head + body)


def test_query_log_forgeries_are_clear_errors_in_bounded_memory(tmp_path):
    import lzma
    import resource
    import struct
    from nlmfeature.decoder import querylog
    from nlmfeature.errors import NLMFeatureError
    full = querylog.read_packed(querylog.BUNDLED_MOSES_STREAM)
    # a small real log: the first 500 recorded lookups as two sentences
    header = {"format": querylog.PACKED_FORMAT, "version": querylog.PACKED_VERSION,
              "order": full.order, "words": full.words, "sentence_ids": [0, 1],
              "sentence_lookups": [200, 300], "recording_model_checksum": full.checksum,
              "note": ""}
    body = np.ascontiguousarray(full.ids[:500], dtype="<i4").tobytes()
    real = querylog.QueryLog(full.order, full.words, full.ids[:500], np.array([0, 1]),
                             np.array([0, 200]))
    small = tmp_path / "small.qlog.xz"
    small.write_bytes(_packed(header, body))
    cases = {
        # a small file whose header claims 10^12 lookups of zeros (a decompression bomb)
        "bomb": _packed(dict(header, sentence_ids=[0], sentence_lookups=[10**12]), b"\0" * 4096),
        "order-zero": _packed(dict(header, order=0), body),
        "order-text": _packed(dict(header, order="5"), body),
        "lengths-negative": _packed(dict(header, sentence_lookups=[-1] * len(header["sentence_ids"])), body),
        "lengths-short": _packed(dict(header, sentence_lookups=header["sentence_lookups"][:-1]), body),
        "words-not-list": _packed(dict(header, words={"a": 1}), body),
        "header-huge": lzma.compress(struct.pack("<Q", 1 << 60) + b"{}"),
        "header-not-object": lzma.compress(struct.pack("<Q", 2) + b"[]"),
        "more-body": _packed(header, body + b"\0" * 40),
        "truncated": small.read_bytes()[:len(small.read_bytes()) // 2],
    }
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for name, data in cases.items():
        path = tmp_path / f"{name}.qlog.xz"
        path.write_bytes(data)
        with pytest.raises(NLMFeatureError, match=str(path)):
            querylog.read_packed(str(path))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000   # KiB
    for special in ("/dev/zero", str(tmp_path)):
        with pytest.raises(NLMFeatureError, match="cannot read the query log"):
            querylog.read_packed(special)
        with pytest.raises(NLMFeatureError, match="cannot read the query log"):
            querylog.read_raw(special, real.words)
    good = tmp_path / "good.qlog.xz"
    good.write_bytes(_packed(header, body))
    again = querylog.read_packed(str(good))
    assert np.array_equal(again.ids, real.ids) and again.words == real.words


@pytest.mark.parametrize("command", ["train", "cluster", "convert", "querylog-pack", "tune",
                                     "perplexity-kenlm"])
@pytest.mark.parametrize("where", ["directory", "missing-dir"])
def test_every_writing_command_checks_its_output_first(tmp_path, capsys, command, where):
    """The input named here does not exist: only a check made before the work can report the
    output (on main, train ran a whole epoch first and left hidden temporary files)."""
    from nlmfeature.cli import main as nlm_main
    from nlmfeature.cli import tune_main
    out = str(tmp_path) if where == "directory" else str(tmp_path / "no" / "such" / "out")
    missing = str(tmp_path / "missing-input")
    argv = {
        "train": ["train", "--train", missing, "--model-out", out],
        "cluster": ["cluster", "--text", missing, "--out", out, "--quiet"],
        "convert": ["convert", missing, out],
        "querylog-pack": ["querylog", "pack", missing, "--model", missing, "--out", out],
        "perplexity-kenlm": ["perplexity", "--model", missing, "--test", missing,
                             "--kenlm-train", missing, "--kenlm", out],
        "tune": ["optimise", "--nbest", missing, "--ref", missing, "--out", out,
                 "--init", missing, "--quiet"],
    }[command]
    before = set(os.listdir(tmp_path))
    code = (tune_main if command == "tune" else nlm_main)(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    want = "is a directory" if where == "directory" else "does not exist"
    assert out in err and want in err and "missing-input" not in err, err
    assert set(os.listdir(tmp_path)) == before


# -- saved k-best pools (tuning state) ------------------------------------------------------------
def test_damaged_pool_files_are_input_errors(tmp_path):
    from nlmfeature.mt.bleu import References
    from nlmfeature.mt.tuning.data import KbestPool
    refs = References.from_files([REG_REF])
    pool = KbestPool(refs)
    pool.add_file(REG)
    good = tmp_path / "pool.npz"
    pool.save(str(good))
    z = dict(np.load(good, allow_pickle=False))
    damaged = {
        "offsets-past-end": dict(z, offsets=z["offsets"] + 5),
        "offsets-falling": dict(z, offsets=z["offsets"][::-1].copy()),
        "nan-features": dict(z, features=np.where(np.arange(z["features"].size).reshape(
            z["features"].shape) == 7, np.nan, z["features"])),
        "stats-short": dict(z, stats=z["stats"][:, :4]),
        "text-offsets": dict(z, text_offsets=z["text_offsets"] * 2),
        "no-features": {k: v for k, v in z.items() if k != "features"},
    }
    for name, arrays in damaged.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        with pytest.raises(InputError, match=rf"{name}.npz: .*(damaged|cannot read)"):
            KbestPool.load(str(path), refs)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[:1000])
    for path in (cut, tmp_path):
        with pytest.raises(InputError, match=str(path)):
            KbestPool.load(str(path), refs)
    again = KbestPool.load(str(good), refs)
    assert np.array_equal(again.arrays().features, pool.arrays().features)


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_block_reader_gives_the_same_lines_at_any_block_size(tmp_path, monkeypatch, chunk):
    """Lines split across read blocks, CRLF endings, a last line without newline and a bad
    byte are handled alike whatever the block size."""
    from nlmfeature.io import textio
    monkeypatch.setattr(textio, "CHUNK", chunk)
    lines = real_lines(MOSES)[:40]
    path = tmp_path / "crlf.txt"
    path.write_bytes(("\r\n".join(lines[:20]) + "\n" + "\n".join(lines[20:])).encode())
    assert [l for _, l in textio.iter_lines(str(path))] == lines
    bad = tmp_path / "bad.txt"
    bad.write_bytes(("\n".join(lines[:30]) + "\n").encode() + b"caf\xe9\n" + b"tail")
    with pytest.raises(InputError, match=r"bad.txt:31: not valid UTF-8"):
        list(textio.iter_lines(str(bad)))


def test_standard_input_streams_a_compressed_list_through_rescore(model, tmp_path):
    """``-i -``: standard input is read in blocks as they arrive (a decoder's pipe)."""
    out = tmp_path / "out.100best"
    r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", model, "-i", "-",
                        "-o", str(out), "-q"], cwd=ROOT, input=gzip.decompress(
                            open(MOSES, "rb").read()), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
    got = list(read_kbest(str(out)))
    assert [h.text for h in got] == [h.text for h in read_kbest(MOSES)]
    assert all(h.features[-1][0] == "NLM0" for h in got)


def test_rescore_writes_into_a_pipe_without_replacing_it(model, tmp_path):
    """``-o /dev/null`` or a named pipe: written directly (on main the atomic writer renamed
    a regular file over it: as root, ``-o /dev/null`` replaced the device)."""
    import stat
    import threading
    fifo = str(tmp_path / "out.fifo")
    os.mkfifo(fifo)
    got = []
    t = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    t.start()
    r = rescore_cli(["-m", model, "-i", MOSES, "-o", fifo, "-q"], timeout=60)
    t.join(20)
    assert r.returncode == 0, r.stderr[-1000:]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["out.fifo"]
    assert got and got[0].count(b"\n") == 687 and b"NLM0=" in got[0]
    from nlmfeature.io.atomicfile import OutputError, atomic_write_bytes
    with pytest.raises(OutputError, match="not a regular file"):
        atomic_write_bytes(fifo, b"a model must not go into a pipe")
