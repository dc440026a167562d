"""Small real-data models for the tests (random weights, Brown-corpus vocabulary)."""
from __future__ import annotations

import os
import shlex
import subprocess
import time
from typing import Callable, List, Optional

import numpy as np

import nlmfeature
from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model
from nlmfeature.core.vocab import Vocabulary, count_words

DATA = os.path.join(os.path.dirname(__file__), "data")

#: slow builds this process started (conftest.py, :func:`background_build`), by test module
#: name: a test module with ``start_build(directory) -> Popen`` gets its build run beside the
#: other tests, once per test run, and its fixture waits for it (:func:`background_build`)
BACKGROUND: dict = {}
BROWN_TRAIN = os.path.join(DATA, "brown", "train.2k.txt")
BROWN_VALID = os.path.join(DATA, "brown", "valid.300.txt")


def start_script(directory: str, script: str, cwd: Optional[str] = None) -> subprocess.Popen:
    """Run the shell ``script`` (in ``cwd``, default ``directory``) in the background: its
    output goes to ``directory/build.log`` and, when it ends, its exit status to
    ``directory/build.rc`` (written last)."""
    log, rc = (shlex.quote(os.path.join(directory, n)) for n in ("build.log", "build.rc"))
    wrapped = f"( {script} ) > {log} 2>&1; echo $? > {rc}.tmp && mv {rc}.tmp {rc}"
    return subprocess.Popen(["sh", "-c", wrapped], cwd=cwd or directory, start_new_session=True)


def _build_folder(config, name: str) -> str:
    """The folder of the build of test module ``name`` in this test run: in the temporary
    folder of the run, which pytest-xdist's workers share (theirs are folders of it)."""
    base = config._tmp_path_factory.getbasetemp()
    if hasattr(config, "workerinput"):
        base = base.parent
    return os.path.join(str(base), f"build-{name}")


def background_build(config, name: str, start: Callable[[str], subprocess.Popen], wait: bool = True,
                     timeout: float = 900) -> str:
    """The folder of test module ``name``'s slow build (``start(folder)``), started once per
    test run: the first process to claim the folder starts it, the others (pytest-xdist's other
    worker) use that one.  With ``wait``, waits for it to end and fails the test with its log
    when it failed."""
    folder = _build_folder(config, name)
    try:
        os.mkdir(folder)
    except FileExistsError:
        pass                    # another process of the run has started it
    else:
        BACKGROUND[name] = start(folder)
    if wait:
        rc_path = os.path.join(folder, "build.rc")
        deadline = time.time() + timeout
        while not os.path.exists(rc_path):
            if time.time() > deadline:
                raise AssertionError(f"the build in {folder} did not end within {timeout:.0f} s")
            time.sleep(0.2)
        with open(rc_path) as f:
            rc = f.read().strip()
        if rc != "0":
            with open(os.path.join(folder, "build.log"), errors="replace") as f:
                raise AssertionError(f"the build in {folder} ended with status {rc}:\n{f.read()[-3000:]}")
    return folder


def read_lines(path: str, limit: Optional[int] = None) -> List[str]:
    with open(path, encoding="utf-8") as f:
        lines = [l.strip() for l in f]
    return lines[:limit] if limit else lines


def brown_vocab(min_count: int = 2, lines: int = 2000):
    """(Vocabulary, counts per id) of the first ``lines`` Brown training sentences."""
    counts = count_words(read_lines(BROWN_TRAIN, lines))
    vocab = Vocabulary.from_counts(counts, min_count=min_count)
    return vocab, np.array([counts.get(w, 1) for w in vocab], dtype=np.float64)


def make_model(directory: str, name: str = "model.nlm", tables: bool = True, seed: int = 0,
               min_count: int = 2, **spec_fields) -> str:
    """Write a random model with the Brown vocabulary; returns its path.

    ``spec_fields`` are :class:`ModelSpec` fields (arch, order, word_width, output, ...);
    defaults are a small order-4 diagonal log-bilinear model with unnormalised output.
    """
    fields = dict(arch="lbl", order=4, word_width=16, diagonal_contexts=True, output="unnormalised")
    fields.update(spec_fields)
    vocab, counts = brown_vocab(min_count)
    header, arrays = random_model(ModelSpec(**fields), vocab, counts, seed=seed)
    if tables:
        precompute_tables(header, arrays, diagonal=True)  # exercise the table path everywhere
    path = os.path.join(str(directory), name)
    nlmfeature.save(path, header, arrays)
    return path


def kbest_vocab_model(directory, kbest: str) -> str:
    """A model (random weights) whose vocabulary is the words of a k-best list's hypotheses;
    returns its path in ``directory``."""
    import gzip

    with gzip.open(kbest, "rt", encoding="utf-8") as f:
        texts = [l.split(" ||| ")[1] for l in f]
    counts = count_words(texts)
    vocab = Vocabulary.from_counts(counts, min_count=1)
    header, arrays = random_model(ModelSpec(arch="lbl", order=3, word_width=8, diagonal_contexts=True,
                                            output="unnormalised"), vocab,
                                  np.array([counts.get(w, 1) for w in vocab], dtype=np.float64), seed=0)
    path = os.path.join(str(directory), "own.nlm")
    nlmfeature.save(path, header, arrays)
    return path


def stats_totals(stderr: str, prefix: str) -> dict:
    """Sum the ``key=value`` counters of the decoder shims' per-sentence statistics lines
    (``stats=true`` / ``--stats``) that start with ``prefix`` (e.g. "NLMFeature NLM0 sentence")."""
    totals: dict = {}
    for line in stderr.splitlines():
        if line.startswith(prefix):
            for kv in line[len(prefix):].split():
                if "=" in kv:
                    k, v = kv.split("=")
                    totals[k] = totals.get(k, 0) + int(v)
    return totals


def decode_while_model_changes(cmd: List[str], sentences: List[str], live: str, replacement: str,
                               timeout: float = 300, ended: Optional[str] = None):
    """Run a decoder ``cmd`` reading sentences from its standard input: feed the first
    sentence, wait for its translation on standard output (and, with ``ended``, for a line of
    standard error containing ``ended``: what the decoder prints once the first sentence has
    ended, e.g. the feature's per-sentence stats line), overwrite the model file ``live`` in
    place (``cp replacement live``: the unsafe way a user might replace it), then feed the
    rest.  Returns (exit status, the translations printed, standard error).

    ``ended`` matters where the decoder ends a sentence after printing it (Moses: its manager
    ends the features' sentence after the output): overwriting the mapped file while the
    sentence still runs is a different case (the library checks the file between sentences)."""
    import shutil
    import subprocess
    import threading

    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    err: List[str] = []
    seen = threading.Event()

    def read_err() -> None:
        for line in p.stderr:
            err.append(line)
            if ended is not None and ended in line:
                seen.set()
        seen.set()                            # end of stream: nothing more to wait for

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    p.stdin.write(sentences[0] + "\n")
    p.stdin.flush()
    got = []
    first = [None]
    t = threading.Thread(target=lambda: first.__setitem__(0, p.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if first[0] is None:
        p.kill()
        raise AssertionError("the decoder printed no translation of the first sentence")
    got.append(first[0].rstrip("\n"))
    if ended is not None and not seen.wait(timeout):
        p.kill()
        raise AssertionError(f"the decoder printed no {ended!r} after the first sentence")
    shutil.copyfile(replacement, live)        # in place: same inode, other size
    try:
        p.stdin.write("\n".join(sentences[1:]) + "\n")
        p.stdin.close()
    except BrokenPipeError:
        pass
    try:
        p.wait(timeout=timeout)           # a few translations: they fit in the pipe
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("the decoder did not stop after its input ended")
    rest = p.stdout.read()
    reader.join(timeout)
    got.extend(l for l in rest.splitlines() if l)
    return p.returncode, got, "".join(err)


#: bjam arguments of the decoder tests when $MOSES_BJAM_ARGS is not set
DEFAULT_BJAM_ARGS = "-j2 --without-tcmalloc --notrace --no-xmlrpc-c --without-libsegfault link=static"


def moses_binaries(root: str) -> List[str]:
    """The moses-cmd executables bjam built in the mosesdecoder tree ``root``."""
    import glob

    return [p for p in glob.glob(os.path.join(root, "moses-cmd", "bin", "*", "*", "*", "*", "moses"))
            + glob.glob(os.path.join(root, "moses-cmd", "bin", "*", "*", "*", "moses"))
            if os.path.isfile(p) and os.access(p, os.X_OK)]


def moses_bjam_args(root: str) -> str:
    """bjam options to relink the tree ``root`` with: $MOSES_BJAM_ARGS, else the ``.bjam-args``
    that ``../shared/tools/build-decoders.sh`` writes beside the tree it built (relinking a tree
    built ``--with-nplm`` without that option rebuilds ``libmoses.a`` without NPLM's objects and
    the link fails), else :data:`DEFAULT_BJAM_ARGS`."""
    if os.environ.get("MOSES_BJAM_ARGS"):
        return os.environ["MOSES_BJAM_ARGS"]
    saved = os.path.join(root, ".bjam-args")
    if os.path.exists(saved):
        return open(saved, encoding="utf-8").read().strip()
    return DEFAULT_BJAM_ARGS


def build_moses_with_shim(root: str, joint: bool = False) -> str:
    """Copy ``moses_ff/`` into the built mosesdecoder tree ``root`` (patching Factory.cpp once),
    relink moses-cmd with bjam ($MOSES_BJAM_ARGS) against the installed package's library and
    return the newest moses binary, checked to have NLMFeature (and with ``joint``,
    NLMJointFeature) compiled in.  Without ``joint`` the joint feature's files are refreshed
    only where the tree already has them (it builds against NLMFeature.h: an old copy beside a
    new NLMFeature.h would not compile).  Skips the test when the tree was never built."""
    import filecmp
    import shutil
    import subprocess

    import pytest

    if not moses_binaries(root):
        pytest.skip(f"{root} has no built moses-cmd binary; build Moses first")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lm_dir = os.path.join(root, "moses", "LM")
    for name in ("NLMFeature.h", "NLMFeature.cpp", "NLMJointFeature.h", "NLMJointFeature.cpp"):
        src, dst = os.path.join(repo, "moses_ff", name), os.path.join(lm_dir, name)
        if not joint and name.startswith("NLMJoint") and not os.path.exists(dst):
            continue
        if not os.path.exists(dst) or not filecmp.cmp(src, dst, shallow=False):
            shutil.copy(src, dst)
    factory = os.path.join(root, "moses", "FF", "Factory.cpp")
    patches = [("LM_NLMFEATURE", "moses.patch")] + ([("NLMJointFeature", "moses-joint.patch")] if joint else [])
    for marker, patch in patches:
        if marker not in open(factory, encoding="utf-8").read():
            subprocess.run(["patch", "-p1", "--forward", "-i", os.path.join(repo, "moses_ff", patch)],
                           cwd=root, check=True, capture_output=True)
    return _relink(root, "moses-cmd//moses", moses_binaries, ["NLMFeature"] + (["NLMJointFeature"] if joint else []))


def _relink(root: str, target: str, binaries, features: List[str]) -> str:
    """bjam ``target`` in the tree ``root`` (:func:`moses_bjam_args` and --with-nlmfeature =
    the installed package) and return the newest of ``binaries(root)``, checked to register
    ``features``."""
    import shlex
    import subprocess

    from nlmfeature.commands import config as nlmconfig
    from nlmfeature.mt.moses import missing_features

    import fcntl

    pkg = os.path.dirname(nlmconfig.paths()["libdir"])
    args = shlex.split(moses_bjam_args(root))
    # one bjam at a time in a tree: two test processes relinking Moses and Moses2 at once run
    # bjam's configuration checks over each other, and a failed check drops libraries
    # (bzip2, lzma) from the link
    with open(os.path.join(root, ".nlmfeature-bjam.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        p = subprocess.run([os.path.join(root, "bjam"), *args, f"--with-nlmfeature={pkg}", target],
                           cwd=root, capture_output=True, text=True)
    assert p.returncode == 0, "bjam failed:\n" + p.stdout[-5000:] + p.stderr[-2000:]
    exe = max(binaries(root), key=os.path.getmtime)
    missing = missing_features(exe, features)
    assert not missing, f"{exe} was built without {' and '.join(missing)}"
    return exe


def moses2_binaries(root: str) -> List[str]:
    """The moses2 executables bjam built in the mosesdecoder tree ``root``."""
    import glob

    return [p for p in glob.glob(os.path.join(root, "moses2", "bin", "*", "*", "*", "*", "moses2"))
            + glob.glob(os.path.join(root, "moses2", "bin", "*", "*", "*", "moses2"))
            if os.path.isfile(p) and os.access(p, os.X_OK)]


def build_moses2_with_shim(root: str) -> str:
    """Copy ``moses_ff/moses2/NLMFeature.{h,cpp}`` into the mosesdecoder tree ``root``'s
    ``moses2/LM`` (applying ``moses_ff/moses2.patch`` once), relink Moses2 with bjam
    (:func:`moses_bjam_args`) against the installed package's library and return the newest
    moses2 binary, checked to register NLMFeature.  Skips the test when the tree has no
    built Moses2."""
    import filecmp
    import shutil
    import subprocess

    import pytest

    if not moses2_binaries(root):
        pytest.skip(f"{root} has no built moses2 binary; build Moses first")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("NLMFeature.h", "NLMFeature.cpp"):
        src, dst = os.path.join(repo, "moses_ff", "moses2", name), os.path.join(root, "moses2", "LM", name)
        if not os.path.exists(dst) or not filecmp.cmp(src, dst, shallow=False):
            shutil.copy(src, dst)
    # a line of each file the patch changes last (a tree patched by an older version of the
    # patch gets the rest: --forward skips the hunks already applied)
    marks = {os.path.join("moses2", "FF", "FeatureRegistry.cpp"): "LM_NLMFEATURE",
             os.path.join("moses2", "PhraseBased", "TrellisPath.cpp"): "include_alignment_info"}

    def unpatched():
        return [f for f, m in marks.items() if m not in open(os.path.join(root, f), encoding="utf-8").read()]

    if unpatched():
        subprocess.run(["patch", "-p1", "--forward", "-i", os.path.join(repo, "moses_ff", "moses2.patch")],
                       cwd=root, capture_output=True)
        assert not unpatched(), f"moses_ff/moses2.patch did not apply to {root}: {unpatched()}"
    return _relink(root, "moses2//moses2", moses2_binaries, ["NLMFeature", "NLMJointFeature"])


#: the fr->en phrase-based system of the decoder tests (phrase table, reordering table, input)
DECODER_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "decoder")


def phrase_table_models(directory) -> dict:
    """Random-weight models over the target side of the decoder tests' phrase table: an
    order-5 unnormalised and an order-4 class-factored LBL, and ("large") an order-5
    class-factored LBL whose vocabulary has 100,000 more words (V = 100,502, 316 classes: the
    vocabulary size of large-corpus models); {kind: path}."""
    import gzip

    with gzip.open(os.path.join(DECODER_DATA, "phrase-table.gz"), "rt", encoding="utf-8") as f:
        counts = count_words([line.split(" ||| ")[1] for line in f])
    vocab = Vocabulary.from_counts(counts, min_count=1)
    c = np.array([counts.get(w, 1) for w in vocab], dtype=np.float64)
    big_counts = dict(counts, **{f"x{i:06d}": 1 for i in range(100000)})
    big = Vocabulary.from_counts(big_counts, min_count=1)
    big_c = np.array([big_counts.get(w, 1) for w in big], dtype=np.float64)
    out = {}
    for name, spec, v, vc in [
        ("unnormalised", ModelSpec(arch="lbl", order=5, word_width=32, diagonal_contexts=True,
                                   output="unnormalised"), vocab, c),
        ("class", ModelSpec(arch="lbl", order=4, word_width=32, diagonal_contexts=True, output="class",
                            classes=25), vocab, c),
        ("large", ModelSpec(arch="lbl", order=5, word_width=32, diagonal_contexts=True, output="class",
                            classes=316), big, big_c),
    ]:
        header, arrays = random_model(spec, v, vc, seed=11)
        precompute_tables(header, arrays)
        out[name] = os.path.join(str(directory), f"{name}.nlm")
        nlmfeature.save(out[name], header, arrays)
    return out


def joint_slice_vocabs() -> dict:
    """{0: source, 1: target} (vocabulary, counts) of the two sides of the Multi30k
    phrase-table slice of the decoder tests (``multi30k/``), words seen twice or more."""
    import gzip

    with gzip.open(os.path.join(DECODER_DATA, "multi30k", "phrase-table.gz"), "rt", encoding="utf-8") as f:
        entries = [line.split(" ||| ") for line in f]
    sides = {}
    for side in (0, 1):
        counts = count_words(e[side] for e in entries)
        vocab = Vocabulary.from_counts(counts, min_count=2)
        sides[side] = (vocab, np.array([counts.get(w, 1) for w in vocab], dtype=np.float64))
    return sides


def joint_slice_model(path: str, spec: Optional[ModelSpec] = None) -> str:
    """A random-weight joint model over :func:`joint_slice_vocabs` (default: order 4, a 5-word
    source window, an NPLM with class output), written to ``path``."""
    sides = joint_slice_vocabs()
    spec = spec or ModelSpec(arch="nplm", order=4, word_width=24, hidden=32, output="class", classes=20,
                             source_window=5)
    header, arrays = random_model(spec, sides[1][0], sides[1][1], seed=5, scale=0.5,
                                  source_vocab=sides[0][0], source_counts=sides[0][1])
    precompute_tables(header, arrays)
    nlmfeature.save(path, header, arrays)
    return path


def write_ini(path, nlm_line=None, weight=0.2, extra=()):
    """A moses.ini (Moses and Moses2 read the same) for the decoder tests' system, with the
    feature line ``nlm_line`` (labelled NLM0) at ``weight`` if given; ``extra``: more lines
    at the top (e.g. ``[search-algorithm]``, ``4``)."""
    data = DECODER_DATA
    lines = list(extra) + [
        "[input-factors]", "0", "[mapping]", "T 0", "[distortion-limit]", "6", "[feature]",
        "Distortion",
        "LexicalReordering type=msd-bidirectional-fe input-factor=0 output-factor=0 num-features=6 "
        f"path={data}/reordering-table.gz",
        "WordPenalty", "UnknownWordPenalty",
        "PhraseDictionaryMemory input-factor=0 output-factor=0 "
        f"path={data}/phrase-table.gz num-features=5 table-limit=20",
    ]
    if nlm_line:
        lines.append(nlm_line)
    lines += ["[weight]", "WordPenalty0= -1", "Distortion0= 0.5", "LexicalReordering0= 0.3 0.3 0.3 0.3 0.3 0.3",
              "PhraseDictionaryMemory0= 0.2 0.2 0.2 0.2 0.2", "UnknownWordPenalty0= 1"]
    if nlm_line:
        lines.append(f"NLM0= {weight}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def feature(feats: str, label: str) -> float:
    """The value of the dense feature ``label`` in an n-best line's feature field."""
    import re

    m = re.search(rf"(?:^| ){re.escape(label)}= (\S+)", feats)
    assert m, f"{label} not in {feats}"
    return float(m.group(1))


def check_nbest(entries, model_path):
    """Every (sid, words, feats) n-best entry's NLM0 value equals the Python scorer's sentence
    log-probability of its words."""
    m = nlmfeature.load(model_path)
    assert entries
    for sid, words, feats in entries:
        v = feature(feats, "NLM0")
        want = m.sentence_logprob(words.split())
        # the n-best list prints 6 significant digits; the decoder sums floats
        assert abs(v - want) <= 1e-3 + 1e-5 * abs(want), (sid, words, v, want)


def fake_moses(path, *features: str) -> str:
    """An executable whose bytes look like a Moses build registering ``features`` (for
    :func:`nlmfeature.mt.moses.missing_features`); returns its path."""
    body = b"\x7fELF" + b"\0" * 64 + b"Feature name \0 is not registered.\0" + b"\0".join(
        f.encode() for f in ("KENLM", "Distortion") + features) + b"\0"
    path.write_bytes(body)
    path.chmod(0o755)
    return str(path)


def in_threads(work, n=4):
    """Run ``work(k)`` for k < n in n threads at once; the exceptions they raised."""
    import threading

    errors = []

    def run(k):
        try:
            work(k)
        except Exception as exc:  # pragma: no cover - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the environment of a command run by the tests: this checkout's package, not an installed one
CLI_ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))


def run_cli(*args, timeout=300, **kw):
    """``nlmfeature ARGS`` of this checkout in a subprocess (text output captured)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "nlmfeature.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, env=CLI_ENV, timeout=timeout,
                          **kw)


def cli_in_process(argv, capsys):
    """(exit status, standard output, standard error) of ``nlmfeature ARGV`` run in this
    process (``capsys``: pytest's fixture), as the console script would exit."""
    from nlmfeature.cli import main

    capsys.readouterr()
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exc:
        status = exc.code
    out = capsys.readouterr()
    return status, out.out, out.err


def run_clis(*argvs, timeout=300):
    """``nlmfeature ARGV`` for each of ``argvs``, side by side (one process per core); the
    finished processes in the order given."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        return list(pool.map(lambda argv: run_cli(*argv, timeout=timeout), argvs))


def one_line_error(p, needle: str = "") -> str:
    """Assert that the finished command ``p`` made a user error: exit 2, one line on standard
    error (containing ``needle``), no traceback.  Returns the line."""
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and ": error: " in lines[0], p.stderr
    assert needle in lines[0], (needle, lines[0])
    return lines[0]

