"""``nlmfeature.mt.moses``, the one Moses module, on the shared Multi30k system: its table filter
against Moses' own ``filter-model-given-input.pl``, the prepared config, the finder, the feature
lines, and (with ``MOSES_ROOT``) real decodes with per-sentence times."""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys

import pytest

from nlmfeature.errors import DecoderError, InputError, NLMFeatureError
from nlmfeature.io.textio import read_lines
from nlmfeature.mt import moses
from nlmfeature.mt.weights import read_weights

from helpers import fake_moses

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "moses", "multi30k-de-en"))
NBEST = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "nbest", "moses-multi30k-de-en"))
ROOT = os.environ.get("MOSES_ROOT", "/nonexistent")
SCRIPT = os.path.join(ROOT, "scripts", "training", "filter-model-given-input.pl")
needs_system = pytest.mark.skipif(not os.path.isdir(SYSTEM) or not os.path.isdir(NBEST),
                                  reason="shared Multi30k Moses system not found")


def needs_moses(test):
    """A decoder test (``-m decoder``, counted in the summary): skipped without MOSES_ROOT."""
    test = pytest.mark.skipif(not os.access(os.path.join(ROOT, "bin", "moses"), os.X_OK),
                              reason="needs MOSES_ROOT with bin/moses built with NLMFeature")(test)
    return pytest.mark.decoder(test)


def _dev(tmp_path, n: int, skip: int = 0) -> str:
    path = str(tmp_path / f"dev.{skip}.{n}.de")
    lines = read_lines(os.path.join(NBEST, "dev.src.de.gz"))[skip:skip + n]
    open(path, "w", encoding="utf-8").write("".join(l + "\n" for l in lines))
    return path


@needs_system
def test_prepare_system_binarises_each_of_two_lms_into_its_own_file(tmp_path):
    """A system with two ARPA LMs (as with a big LM beside the in-domain one): the first is
    binarised into lm.bin, the second into lm.1.bin, and each line loads its own."""
    ini = os.path.join(SYSTEM, "moses.tuned.ini")
    lines = moses.read_ini(ini, SYSTEM)
    lm_line = next(l for l in lines if l.split() and l.split()[0] == "KENLM")
    two = str(tmp_path / "two.ini")
    out = []
    for line in lines:
        out.append(line)
        if line == lm_line:
            out.append(line.replace("name=LM0", "name=LM1"))
        elif line.startswith("LM0="):
            out.append(line.replace("LM0=", "LM1="))
    open(two, "w", encoding="utf-8").write("".join(l + "\n" for l in out))
    work = str(tmp_path / "work")
    sys_ = moses.prepare_system(two, work, [_dev(tmp_path, 5)], SYSTEM)
    lms = [l for l in moses.feature_lines(read_lines(sys_.ini)) if l.split()[0] == "KENLM"]
    assert len(lms) == 2
    first, second = os.path.join(work, "lm.bin"), os.path.join(work, "lm.1.bin")
    assert f"path={first} " in lms[0] and "name=LM0" in lms[0]
    assert f"path={second} " in lms[1] and "name=LM1" in lms[1]
    assert sys_.lm == first
    for path in (first, second):
        assert open(path, "rb").read(7) == b"mmap lm"        # a KenLM binary each
    assert read_weights(sys_.ini)["LM1"] == read_weights(ini)["LM0"]


@needs_system
def test_prepare_system_filters_as_moses_script_and_binarises_the_lm(tmp_path):
    src = _dev(tmp_path, 40)
    work = str(tmp_path / "work")
    ini = os.path.join(SYSTEM, "moses.tuned.ini")
    sys_ = moses.prepare_system(ini, work, [src], SYSTEM)
    key = moses.inputs_key([src])
    assert sys_.key == key and sys_.ini == os.path.join(work, f"base.{key}.moses.ini")
    feats = {l.split()[0]: l for l in moses.feature_lines(read_lines(sys_.ini))}
    table = os.path.join(work, f"filtered.{key}.phrase-table")
    reord = os.path.join(work, f"filtered.{key}.reordering-table.wbe-msd-bidirectional-fe")
    assert f"path={table} " in feats["PhraseDictionaryMemory"]
    assert feats["LexicalReordering"].endswith(f"path={reord}")
    assert sys_.lm == os.path.join(work, "lm.bin") and f"path={sys_.lm} " in feats["KENLM"]
    assert open(sys_.lm, "rb").read(7) == b"mmap lm"        # a KenLM binary
    assert read_weights(sys_.ini) == read_weights(ini) and sys_.filter_seconds > 0
    # every kept line's source phrase is an n-gram (<= 10 words) of the input, and every
    # phrase of the input that the table has is kept
    grams = moses.source_phrases([src])
    kept = read_lines(table)
    assert 1000 < len(kept) < 100000
    assert all(l.split(" ||| ")[0] in grams for l in kept)
    assert {l.split(" ||| ")[0] for l in kept} >= {"ein mann", "."}
    # reused: nothing filtered again, same config
    again = moses.prepare_system(ini, work, [src], SYSTEM)
    assert again.filter_seconds == 0 and again.ini == sys_.ini and again.tables == sys_.tables
    # other inputs, named by content: other tables
    other = moses.content_named_input(work, [_dev(tmp_path, 5, skip=100)], ini)
    assert moses.prepare_system(ini, work, [other], SYSTEM).key != key
    if shutil.which("perl") and os.path.exists(SCRIPT):
        # Moses' own script keeps exactly the same lines
        perl_ini = str(tmp_path / "abs.ini")
        open(perl_ini, "w").write("\n".join(moses.read_ini(ini)) + "\n")
        out = str(tmp_path / "perl")
        p = subprocess.run(["perl", SCRIPT, out, perl_ini, src], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-2000:]
        with gzip.open(os.path.join(out, "phrase-table.0-0.1.1.gz"), "rb") as f:
            assert f.read() == open(table, "rb").read()
        ours = open(reord, "rb").read()
        assert open(os.path.join(out, "reordering-table.wbe-msd-bidirectional-fe.0-0.1"), "rb").read() == ours


def test_read_ini_resolves_model_paths(tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text("[feature]\nPhraseDictionaryMemory path=MODEL_DIR/pt.gz input-factor=0\n"
                   "LexicalReordering path=${MODEL_PATH}/model/rt.gz\nKENLM path=lm/lm.arpa order=5\n"
                   "# KENLM path=MODEL_DIR/commented\nOther path=/abs/x\n", encoding="utf-8")
    sysdir = str(tmp_path / "sys")
    lines = moses.read_ini(str(ini), sysdir)
    assert lines[1] == f"PhraseDictionaryMemory path={sysdir}/pt.gz input-factor=0"
    assert lines[2] == f"LexicalReordering path={sysdir}/rt.gz"
    assert lines[3] == f"KENLM path={sysdir}/lm/lm.arpa order=5"
    assert lines[4] == "# KENLM path=MODEL_DIR/commented" and lines[5] == "Other path=/abs/x"
    # without a system folder: relative to the config's own
    assert moses.read_ini(str(ini))[1] == f"PhraseDictionaryMemory path={tmp_path}/pt.gz input-factor=0"


def test_add_features_at_either_end_of_the_feature_section(tmp_path):
    src = tmp_path / "in.ini"
    src.write_text("[feature]\nWordPenalty\nKENLM name=LM0 path=x\n\n# weights\n[weight]\n"
                   "WordPenalty0= -1\nLM0= 0.5\n", encoding="utf-8")
    end = moses.add_features(str(src), str(tmp_path / "end.ini"), ["NLMFeature name=NLM0 path=m"],
                             {"NLM0": [0.25], "LM0": [0.125]})
    assert read_lines(end) == ["[feature]", "WordPenalty", "KENLM name=LM0 path=x",
                               "NLMFeature name=NLM0 path=m", "", "# weights", "[weight]",
                               "WordPenalty0= -1", "LM0= 0.125", "NLM0= 0.25"]
    first = moses.add_features(str(src), str(tmp_path / "first.ini"), ["A", "B"], {}, first=True)
    assert read_lines(first)[:5] == ["[feature]", "A", "B", "WordPenalty", "KENLM name=LM0 path=x"]
    bare = tmp_path / "bare.ini"
    bare.write_text("[weight]\nLM0= 1\n", encoding="utf-8")
    with pytest.raises(InputError, match="no \\[feature\\] section") as e:
        moses.add_features(str(bare), str(tmp_path / "x.ini"), ["A"], {})
    assert str(bare) in str(e.value)


def test_filter_table_names_a_broken_table(tmp_path):
    bad = tmp_path / "pt.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(InputError) as e:
        moses.filter_table(str(bad), str(tmp_path / "out"), {"a"})
    assert str(bad) in str(e.value) and not os.path.exists(tmp_path / "out")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty table"):
        moses.filter_table(str(empty), str(tmp_path / "out"), {"a"})


def test_find_moses_search_order(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_ROOT", raising=False)
    with pytest.raises(NLMFeatureError, match="--moses or set MOSES_ROOT"):
        moses.find_moses()
    with pytest.raises(InputError, match="not an executable Moses") as e:
        moses.find_moses(str(tmp_path / "nope"))
    assert str(tmp_path / "nope") in str(e.value)
    root = tmp_path / "mosesdecoder"
    with pytest.raises(InputError, match="no bin/moses and no moses-cmd build"):
        moses.find_moses(root=str(root))
    # a build tree without bin/: the newest moses-cmd build
    older, newer = (root / "moses-cmd" / "bin" / d / "moses" for d in ("old", "new"))
    for i, exe in enumerate((older, newer)):
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        os.utime(exe, (1e9 + i, 1e9 + i))
    monkeypatch.setenv("MOSES_ROOT", str(root))
    assert moses.find_moses() == str(newer)
    installed = root / "bin" / "moses"
    installed.parent.mkdir()
    installed.write_text("#!/bin/sh\n")
    installed.chmod(0o755)
    assert moses.find_moses() == str(installed)            # bin/moses first
    assert moses.find_moses(str(older)) == str(older)       # --moses wins
    # Moses' other programs the same way (benchmarks/bench_tuning.py's mert, kbmira, extractor)
    mert = root / "mert" / "bin" / "gcc" / "release" / "mert"
    mert.parent.mkdir(parents=True)
    mert.write_text("#!/bin/sh\n")
    mert.chmod(0o755)
    assert moses.find_program("mert") == str(mert) and moses.find_program("kbmira") is None


def test_find_moses_checks_the_features_compiled_in(tmp_path, monkeypatch):
    """A Moses without the features a run needs is refused before the run, naming the binary
    and the patch that adds them; a binary it cannot read as Moses (a wrapper script) passes."""
    monkeypatch.delenv("MOSES_ROOT", raising=False)
    plain = fake_moses(tmp_path / "plain")
    shim = fake_moses(tmp_path / "shim", "NLMFeature")
    both = fake_moses(tmp_path / "both", "NLMFeature", "NLMJointFeature")
    assert moses.missing_features(plain, ["NLMFeature"]) == ["NLMFeature"]
    assert moses.missing_features(shim, ["NLMFeature", "NLMJointFeature"]) == ["NLMJointFeature"]
    assert moses.find_moses(shim) == shim
    assert moses.find_moses(both, features=("NLMFeature", "NLMJointFeature")) == both
    with pytest.raises(InputError, match="no NLMFeature compiled in") as e:
        moses.find_moses(plain)
    assert plain in str(e.value) and "moses.patch" in str(e.value)
    with pytest.raises(InputError, match="no NLMJointFeature compiled in") as e:
        moses.find_moses(shim, features=("NLMFeature", "NLMJointFeature"))
    assert shim in str(e.value) and "moses-joint.patch" in str(e.value)
    plain2 = fake_moses(tmp_path / "moses2")     # (a Moses2 executable: its own build)
    with pytest.raises(InputError, match="no NLMFeature compiled in") as e:
        moses.find_moses(plain2)
    assert "moses2.patch" in str(e.value) and "moses2//moses2" in str(e.value)
    root = tmp_path / "tree"
    (root / "bin").mkdir(parents=True)
    fake_moses(root / "bin" / "moses")
    with pytest.raises(InputError, match="no NLMFeature"):
        moses.find_moses(root=str(root))
    script = tmp_path / "wrapper"
    script.write_text("#!/bin/sh\nexec /opt/moses \"$@\"\n")
    script.chmod(0o755)
    assert moses.find_moses(str(script), features=("NLMJointFeature",)) == str(script)


@needs_moses
def test_the_built_moses_registers_nlmfeature():
    """The real build (MOSES_ROOT) is seen to register NLMFeature, and a feature name it does
    not have is seen missing."""
    exe = moses.find_moses(root=ROOT)
    assert moses.missing_features(exe, ["NLMFeature", "NoSuchFeature"]) == ["NoSuchFeature"]


@needs_system
@needs_moses
def test_decode_and_run_with_per_sentence_times(tmp_path):
    src = _dev(tmp_path, 3)
    sys_ = moses.prepare_system(os.path.join(SYSTEM, "moses.tuned.ini"), str(tmp_path / "w"), [src], SYSTEM)
    exe = moses.find_moses(root=ROOT)
    out, kb = str(tmp_path / "out"), str(tmp_path / "kbest")
    secs = moses.decode(exe, sys_.ini, src, out, 1, kbest=5, kbest_out=kb, alignment=True)
    assert secs > 0 and len(read_lines(out)) == 3
    kbest = read_lines(kb)
    assert {l.split(" ||| ")[0] for l in kbest} == {"0", "1", "2"} and all("-" in l.split(" ||| ")[-1] for l in kbest)
    assert moses.decode(exe, sys_.ini, src, out, 1, kbest=5, kbest_out=kb) == secs   # reused
    r = moses.run(moses.command(exe, sys_.ini, src))
    assert r.output == read_lines(out) and len(r.sentence_seconds) == 3
    assert r.translation == pytest.approx(sum(r.sentence_seconds)) and r.cpu > 0 and r.wall > 0
    broken = moses.add_features(sys_.ini, str(tmp_path / "broken.ini"), ["NoSuchFeature"], {})
    with pytest.raises(DecoderError):
        moses.run(moses.command(exe, broken, src))
    with pytest.raises(DecoderError, match="see .*out2.log"):
        moses.decode(exe, broken, src, str(tmp_path / "out2"))
    assert not os.path.exists(tmp_path / "out2")


def test_tools_report_bad_input_without_a_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "src"))
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_pcache.py"), "--model",
                        "x=y.nlm", "--moses", str(tmp_path / "nomoses"), "--workdir", str(tmp_path / "w")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"bench_pcache.py: error: {tmp_path / 'nomoses'}: not an executable Moses" in p.stderr


def test_pcache_decode_bound_keeps_the_cost_outside_the_scorer():
    """bench_pcache's decode bound: the NLM cost outside the scorer stays, the scorer's own time
    shrinks to the share of n-grams not on disk (a measured MIRA iteration 2: 0.54x)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from bench_pcache import decode_bound
    finally:
        sys.path.remove(os.path.join(REPO, "benchmarks"))
    assert decode_bound(13.17, 9.25, 0.339) == pytest.approx((13.17 - 9.25 + 0.339 * 9.25) / 13.17)
    assert decode_bound(10.0, 10.0, 0.0) == 0.0          # all on disk, no cost outside the scorer
    assert decode_bound(10.0, 12.0, 0.5) == 0.5          # a scorer time above the cost (noise) is capped
    assert decode_bound(0.0, 1.0, 0.5) != decode_bound(0.0, 1.0, 0.5)  # no cost: NaN, not a ratio


def test_run_reports_output_times_and_the_childs_peak_memory(tmp_path):
    """``moses.run`` on a stand-in decoder: its output, per-sentence times, CPU time and peak
    resident memory (its own 300 MiB buffer, not the memory of the process that started it);
    a failure is one DecoderError with the end of its standard error."""
    ballast = bytearray(700 * 2**20)            # this process is larger than the decoder
    ballast[::4096] = b"x" * len(ballast[::4096])
    src = tmp_path / "in.txt"
    src.write_text("a b\nc\n")
    code = ("import sys, time\nx = bytearray(300 * 2**20)\nx[::4096] = b'x' * len(x[::4096])\n"
            "for i, line in enumerate(sys.stdin):\n"
            "    sys.stderr.write(f'Translation took 0.{i + 1}00 seconds total\\n')\n"
            "    print(line.strip().upper())\n"
            "time.sleep(0.3)\n")
    r = moses.run([sys.executable, "-c", code], stdin=str(src))
    assert r.output == ["A B", "C"] and r.sentence_seconds == [0.1, 0.2]
    assert r.max_rss >= 300 * 2**20 and r.max_rss < 2 * 300 * 2**20
    assert r.cpu > 0 and r.wall > 0
    with pytest.raises(DecoderError, match="bad input"):
        moses.run([sys.executable, "-c", "import sys; sys.stderr.write('bad input'); sys.exit(3)"])
    del ballast


def test_decoder_outputs_are_reused_until_their_config_changes(tmp_path):
    """A finished decode is reused; rewriting its config with the same content keeps it, a
    config that changed (a tuning run on to more iterations) makes it again."""
    from nlmfeature.io.atomicfile import atomic_write_text_if_changed

    ini, out, kb = tmp_path / "final.moses.ini", tmp_path / "test.1best", tmp_path / "test.kbest"
    ini.write_text("[weight]\nLM0= 0.5\n", encoding="utf-8")
    runs = []

    def cmd(ktmp):
        runs.append(ktmp)
        code = f"open({ktmp!r}, 'w').write('k\\n'); print('run {len(runs)}')"
        return [sys.executable, "-c", code]

    def decode():
        moses.decode_to_files(cmd, str(out), str(kb), inputs=(str(ini),))
        return out.read_text(encoding="utf-8")

    assert decode() == "run 1\n" and kb.exists()
    assert decode() == "run 1\n" and len(runs) == 1
    assert not atomic_write_text_if_changed(str(ini), "[weight]\nLM0= 0.5\n")
    assert decode() == "run 1\n" and len(runs) == 1
    old = os.path.getmtime(out) - 10
    for p in (out, kb):
        os.utime(p, (old, old))
    assert atomic_write_text_if_changed(str(ini), "[weight]\nLM0= 0.4\n")
    assert decode() == "run 2\n" and len(runs) == 2 and kb.read_text(encoding="utf-8") == "k\n"
    # the same through moses.rewrite_moses_ini: the same weights leave the config's time alone
    t = os.path.getmtime(ini)
    moses.rewrite_moses_ini(str(ini), str(tmp_path / "copy.ini"), {"LM0": [0.4]})
    t_copy = os.path.getmtime(tmp_path / "copy.ini")
    moses.rewrite_moses_ini(str(ini), str(tmp_path / "copy.ini"), {"LM0": [0.4]})
    assert os.path.getmtime(tmp_path / "copy.ini") == t_copy and os.path.getmtime(ini) == t
