"""A cdec hiero system, in one place: find the decoder, its grammar extractor and nlmfeature's
cdec feature, extract per-sentence grammars, write configs and weights, and run the decoder
with timing and per-sentence times.

The hiero system is made from a Moses system folder's training pairs and word alignment
(``train.tok.lc.{SRC,TGT}.gz``, ``train.align.grow-diag-final-and.gz``: the shared Multi30k
system's) and its KenLM LM, as :mod:`nlmfeature.mt.moses` does for Moses.  Every caller that
touches cdec uses this module: ``nlmfeature bench mt --decoder cdec``, the tuning driver
(``nlmfeature-tune cdec``) and ``benchmarks/bench_decoder.py --decoder cdec``.

- :func:`find_cdec`, :func:`find_extractor`: ``cdec`` and ``run_extractor`` of a built cdec
  tree (``--cdec-root`` / ``$CDEC_ROOT``; CMake's ``build/`` or an in-tree build), and
  :func:`find_shim` the feature library ``cdec_ff/libcdec_ff_nlm.so`` of this repository
  (``make -C cdec_ff CDEC_ROOT=...``, ``cdec_ff/README.md``); :class:`DecoderError` saying
  what to build when one is missing;
- :func:`training_pairs`: the extractor's ``SRC ||| TGT`` bitext and alignment, written once
  into a work folder;
- :func:`extract_grammars`: cdec's suffix-array extractor (``run_extractor``) writes one
  grammar per input sentence and the ``<seg grammar=...>`` input that points at them, both
  named by the content of the input (a work folder reused with other inputs extracts again,
  the same input reuses them);
- :func:`system_lm`: the KenLM LM of a Moses system config, binarised as
  :func:`nlmfeature.mt.moses.prepare_system` does (the same ``lm.bin`` in a shared work folder);
- :func:`write_ini` (``formalism=scfg`` with pass-through rules, word penalty, KenLM and added
  feature lines), :func:`nlm_feature_line` (an NLM as ``feature_function=External``),
  :func:`rewrite_cdec_ini` (options set on feature lines, e.g. the persistent cache) and
  :func:`write_cdec_weights`; :data:`BASE_WEIGHTS`, hand-set starting weights;
- :func:`command`, :func:`run` (timed: wall, CPU, cdec's per-sentence "Translation: N secs")
  and :func:`decode` (1-best written atomically, reused when present).

Every file is written with the package's atomic writer.  Malformed input raises
:class:`~nlmfeature.errors.InputError` naming the file (and line); a missing or failing
decoder or extractor :class:`~nlmfeature.errors.DecoderError`.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from nlmfeature.errors import DecoderError, InputError
from nlmfeature.io.atomicfile import atomic_write_text_if_changed, open_output
from nlmfeature.io.textio import iter_lines, read_lines
from nlmfeature.mt import moses

Weights = Dict[str, List[float]]

#: the repository holding ``cdec_ff/`` (this file is ``src/nlmfeature/mt/cdec.py``)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
#: the cdec feature library of this repository
SHIM = os.path.join(REPO, "cdec_ff", "libcdec_ff_nlm.so")
JOINT_SHIM_NAME = "libcdec_ff_nlmjoint.so"
#: the extractor's settings (its defaults; one thread)
EXTRACTOR_ARGS = ("-t", "1")

#: hand-set starting weights of the hiero system (the features of ``run_extractor``'s grammars,
#: cdec's glue and pass-through rules, KenLM and the word penalty): what tuning starts from,
#: and a speed benchmark's weights (``benchmarks/bench_decoder.py``)
BASE_WEIGHTS: Weights = {
    "EgivenFCoherent": [-0.5], "SampleCountF": [0.1], "CountEF": [0.1],
    "MaxLexFgivenE": [-0.2], "MaxLexEgivenF": [-0.2], "IsSingletonF": [-0.1],
    "IsSingletonFE": [-0.1], "Glue": [-0.1], "PassThrough": [-1.0], "LanguageModel": [0.5],
    "LanguageModel_OOV": [-1.0], "WordPenalty": [-0.5]}

_TOOK = re.compile(r"^Translation: ([0-9.eE+-]+) secs", re.M)


# -- finding the programs ------------------------------------------------------------------------
def cdec_root(root: Optional[str] = None) -> Optional[str]:
    """``root`` if given, else ``$CDEC_ROOT`` (None when neither is set)."""
    return root or os.environ.get("CDEC_ROOT") or None


def _program(rel: Sequence[str], root: Optional[str], what: str) -> str:
    r = cdec_root(root)
    if not r:
        raise DecoderError(f"no cdec tree for {what}: set CDEC_ROOT (or --cdec-root) to a built "
                           "cdec (cdec_ff/README.md)")
    cands = [os.path.join(r, *p.split("/")) for p in rel]
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise DecoderError(f"{r}: no {what} ({' or '.join(cands)}): build cdec (CMake, build/) first")


def find_cdec(cdec: Optional[str] = None, root: Optional[str] = None) -> str:
    """The cdec executable: ``cdec`` if given (it must be executable), else
    ``ROOT/build/decoder/cdec`` or ``ROOT/decoder/cdec`` (``ROOT``: ``root`` or ``$CDEC_ROOT``)."""
    if cdec:
        path = os.path.abspath(cdec)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise DecoderError(f"{path}: not an executable cdec (--cdec)")
        return path
    return _program(("build/decoder/cdec", "decoder/cdec"), root, "cdec executable")


def find_extractor(root: Optional[str] = None) -> str:
    """cdec's suffix-array grammar extractor: ``ROOT/build/extractor/run_extractor`` or
    ``ROOT/extractor/run_extractor``."""
    return _program(("build/extractor/run_extractor", "extractor/run_extractor"), root,
                    "grammar extractor run_extractor")


def find_shim(shim: Optional[str] = None) -> str:
    """nlmfeature's cdec feature library: ``shim`` if given, else this repository's
    ``cdec_ff/libcdec_ff_nlm.so``."""
    path = os.path.abspath(shim or SHIM)
    if not os.path.isfile(path):
        raise DecoderError(f"{path}: no nlmfeature cdec feature library: build it with "
                           "make -C cdec_ff CDEC_ROOT=/path/to/cdec (cdec_ff/README.md)")
    return path


# -- grammars ------------------------------------------------------------------------------------
def training_pairs(system: str, work: str, src_lang: str = "de", tgt_lang: str = "en",
                   alignment: str = "train.align.grow-diag-final-and.gz") -> Tuple[str, str]:
    """(bitext, alignment) for the extractor from the Moses system folder ``system``'s
    ``train.tok.lc.{src_lang,tgt_lang}.gz`` and ``alignment``, written once into ``work``
    (``bitext.KEY.SRC-TGT``: ``source ||| target`` per line; ``align.KEY``), KEY naming the
    system folder."""
    key = hashlib.sha1(os.path.abspath(system).encode("utf-8")).hexdigest()[:8]
    bitext = os.path.join(work, f"bitext.{key}.{src_lang}-{tgt_lang}")
    align = os.path.join(work, f"align.{key}")
    os.makedirs(work, exist_ok=True)
    paths = [os.path.join(system, f"train.tok.lc.{l}.gz") for l in (src_lang, tgt_lang)]
    paths.append(os.path.join(system, alignment))
    for p in paths:
        if not os.path.exists(p):
            raise InputError(p, 0, "missing: the hiero system is extracted from the Moses "
                             "system's training pairs and word alignment (--system)")
    if not os.path.exists(bitext):
        src, tgt = read_lines(paths[0]), read_lines(paths[1])
        if len(src) != len(tgt):
            raise InputError(paths[1], len(tgt), f"{len(tgt)} lines for {len(src)} in {paths[0]}")
        with open_output(bitext) as f:
            for i, (a, b) in enumerate(zip(src, tgt)):
                if "|||" in a or "|||" in b:
                    raise InputError(paths[0] if "|||" in a else paths[1], i + 1,
                                     "a sentence with '|||' cannot go into the bitext")
                f.write(f"{a} ||| {b}\n")
    if not os.path.exists(align):
        lines = read_lines(paths[2])
        n = len(read_lines(bitext))
        if len(lines) != n:
            raise InputError(paths[2], len(lines), f"{len(lines)} alignments for {n} pairs")
        with open_output(align) as f:
            f.write("".join(l + "\n" for l in lines))
    return bitext, align


@dataclass
class Grammars:
    """What :func:`extract_grammars` made."""

    sgm: str                          #: the input: ``<seg grammar="..." id="N"> words </seg>``
    folder: str                       #: the per-sentence grammars (``grammar.N``)
    sentences: int                    #: input sentences
    seconds: float                    #: the extractor's wall seconds (0: reused)


def extract_grammars(src: str, work: str, bitext: str, align: str,
                     extractor: Optional[str] = None, root: Optional[str] = None) -> Grammars:
    """Per-sentence hiero grammars of the sentences of ``src`` extracted by cdec's
    ``run_extractor`` (``extractor``, else :func:`find_extractor`) from ``bitext`` and
    ``align`` (:func:`training_pairs`): ``work/grammars.DIGEST/grammar.N`` and the decoder's
    input ``work/input.DIGEST.sgm`` (absolute grammar paths; the extractor's log beside it),
    DIGEST naming the input's content and the training files.  Reused when present."""
    lines = read_lines(src)
    if not lines:
        raise InputError(src, 0, "no sentences to extract grammars for")
    for i, l in enumerate(lines):
        if not l.strip() or "<" in l or ">" in l:
            raise InputError(src, i + 1, "an empty line or one with '<' / '>' (the extractor's "
                             "input is one tokenised sentence per line)")
    h = hashlib.blake2b(digest_size=6)
    h.update("\n".join([os.path.abspath(bitext), os.path.abspath(align)] + list(EXTRACTOR_ARGS)
                       + lines).encode("utf-8"))
    digest = h.hexdigest()
    os.makedirs(work, exist_ok=True)
    folder = os.path.abspath(os.path.join(work, f"grammars.{digest}"))
    sgm = os.path.abspath(os.path.join(work, f"input.{digest}.sgm"))
    reused = os.path.exists(sgm)
    exe = None if reused else (extractor or find_extractor(root))
    seconds = moses.decode_to_files(
        lambda _: [exe, "-a", os.path.abspath(align), "-b", os.path.abspath(bitext), "-g",
                   folder] + list(EXTRACTOR_ARGS), sgm, stdin=src)
    out = read_lines(sgm)
    if len(out) != len(lines) or not all(f"{folder}/grammar." in l for l in out):
        os.unlink(sgm)
        raise DecoderError(f"{exe or 'run_extractor'} wrote {len(out)} input lines for "
                           f"{len(lines)} sentences of {src}; see {sgm}.log")
    return Grammars(sgm, folder, len(lines), 0.0 if reused else seconds)


# -- configs -------------------------------------------------------------------------------------
def system_lm(ini: str, work: str, system: Optional[str] = None,
              kenlm_bin: Sequence[Optional[str]] = ()) -> str:
    """The LM of the first KenLM feature line of the Moses config ``ini`` (paths relative to
    ``system``), an ARPA file binarised into ``work/lm.bin`` (where
    :func:`~nlmfeature.mt.moses.prepare_system` puts it: shared with the Moses side)."""
    from nlmfeature.training.kenlm_baseline import is_arpa

    for line in moses.feature_lines(moses.read_ini(ini, system)):
        toks = line.split()
        if toks[0].upper() in moses.LM_FEATURES:
            path = next((t[5:] for t in toks if t.startswith("path=")), None)
            if not path:
                break
            if not os.path.exists(path):
                raise InputError(ini, 0, f"the LM {path} does not exist")
            if not is_arpa(path):
                return path
            dst = os.path.join(work, "lm.bin")
            moses.binarise_lm(path, dst, *kenlm_bin)
            return os.path.abspath(dst)
    raise InputError(ini, 0, "no KenLM feature line with a path= (cdec's KLanguageModel needs it)")


def nlm_feature_line(model: str, name: str = "NLM", shim: Optional[str] = None,
                     options: str = "", joint: bool = False) -> str:
    """The ``feature_function=External SHIM --model MODEL --name NAME [options]`` line of an
    NLM (``shim``: :func:`find_shim`'s), or with ``joint`` of a joint model (the joint shim
    library ``libcdec_ff_nlmjoint.so``: ``shim`` itself, or the one beside it)."""
    if joint and os.path.basename(shim or SHIM) != JOINT_SHIM_NAME:
        shim = os.path.join(os.path.dirname(os.path.abspath(shim or SHIM)), JOINT_SHIM_NAME)
    lib = find_shim(shim)
    return (f"feature_function=External {lib} --model {os.path.abspath(model)} "
            f"--name {name} {options}").rstrip()


def write_ini(path: str, lm: str, features: Sequence[str] = ()) -> str:
    """A cdec.ini for per-sentence grammars (``formalism=scfg``, pass-through rules for unknown
    words, cdec's hiero glue grammar by default) with the word penalty, KenLM on ``lm``
    (feature ``LanguageModel``, log10) and the feature lines ``features``; returns ``path``."""
    lines = ["formalism=scfg", "add_pass_through_rules=true", "feature_function=WordPenalty",
             f"feature_function=KLanguageModel {os.path.abspath(lm)}"] + list(features)
    with open_output(path) as f:
        f.write("\n".join(lines) + "\n")
    return path


def _set_flag(line: str, key: str, value: str) -> str:
    """``line`` with ``--key value`` replaced or appended (cdec External feature syntax)."""
    toks = line.rstrip("\n").split()
    flag = "--" + key.lstrip("-")
    for i, tok in enumerate(toks[:-1]):
        if tok == flag:
            toks[i + 1] = value
            break
    else:
        toks += [flag, value]
    return " ".join(toks)


def rewrite_cdec_ini(src: str, dst: str,
                     feature_options: Optional[Dict[str, Dict[str, str]]] = None) -> None:
    """Copy cdec.ini ``src`` to ``dst`` setting options on ``feature_function=NAME ...`` lines.

    ``feature_options`` maps a feature name (``External`` or a library path's basename, e.g.
    ``libcdec_ff_nlm.so``) to options set as ``--key value`` in the line's arguments (the
    syntax of nlmfeature's cdec feature).
    """
    feature_options = feature_options or {}
    out: List[str] = []
    for _, line in iter_lines(src):
        key, eq, rest = line.partition("=")
        if eq and key.strip() in ("feature_function", "ff"):
            toks = rest.split()
            names = set()
            if toks:
                names.add(toks[0])
                if len(toks) > 1:
                    names.add(toks[1].rsplit("/", 1)[-1])
            for name in names & set(feature_options):
                for k, v in feature_options[name].items():
                    line = _set_flag(line, k, v)
        out.append(line)
    atomic_write_text_if_changed(dst, "\n".join(out) + "\n")


def write_cdec_weights(path: str, weights: Weights) -> str:
    """Write a cdec weights file: ``name value`` per line (``Label_i`` for multi-valued);
    returns ``path``."""
    from nlmfeature.mt.kbest import format_number

    lines = []
    for label, vals in weights.items():
        if len(vals) == 1:
            lines.append(f"{label} {format_number(vals[0])}\n")
        else:
            lines.extend(f"{label}_{i} {format_number(v)}\n" for i, v in enumerate(vals))
    # unchanged weights keep the file's time: decodes made with them stay valid
    atomic_write_text_if_changed(path, "".join(lines))
    return path


# -- running the decoder -------------------------------------------------------------------------
def command(cdec: str, ini: str, weights: str, src: Optional[str] = None, kbest: int = 0,
            distinct: bool = False, extra: Sequence[str] = ()) -> List[str]:
    """The cdec command line: translate ``src`` (standard input when None) with ``ini`` and the
    weights file ``weights``; with ``kbest`` the ``kbest``-best list on standard output instead
    of the 1-best (``distinct``: distinct strings, ``-r``); ``extra`` arguments last."""
    cmd = [cdec, "-c", ini, "-w", weights]
    if src is not None:
        cmd += ["-i", src]
    if kbest:
        cmd += ["-k", str(kbest)] + (["-r"] if distinct else [])
    return cmd + list(extra)


def sentence_seconds(stderr: str) -> List[float]:
    """cdec's per-sentence "Translation: N secs" figures, in order."""
    return [float(m.group(1)) for m in _TOOK.finditer(stderr)]


def run(cmd: List[str], stdin: Optional[str] = None,
        env: Optional[Dict[str, str]] = None) -> moses.Run:
    """Run a cdec command capturing its output, timed (:func:`nlmfeature.mt.moses.run` with
    cdec's per-sentence seconds)."""
    return moses.run(cmd, stdin, env, per_sentence=sentence_seconds)


def decode(cdec: str, ini: str, weights: str, src: str, out: str) -> float:
    """Translate ``src`` (a :func:`extract_grammars` input) into ``out`` (1-best; cdec's log,
    with its per-sentence seconds (:func:`sentence_seconds`), in ``out.log``); the output appears whole
    or not at all and an existing one is reused.  Returns the wall seconds (those of the run
    that wrote ``out``, kept in ``out.seconds``)."""
    seconds = moses.decode_to_files(lambda _: command(cdec, ini, weights, src), out,
                                    inputs=(ini, weights, src))
    n, got = len(read_lines(src)), len(read_lines(out))
    if got != n:
        os.unlink(out)
        raise DecoderError(f"{cdec} wrote {got} translations for {n} sentences; see {out}.log")
    return seconds

