"""Import (and export) models in NPLM's text format (``trainNeuralNetwork`` output).

Sections: ``\\config`` (``version 1``, ``ngram_size``, ``input_vocab_size``/``output_vocab_size``
or ``vocab_size``, ``input_embedding_dimension``, ``num_hidden``, ``output_embedding_dimension``,
``activation_function``), ``\\vocab`` or ``\\input_vocab`` + ``\\output_vocab``,
``\\input_embeddings``, ``\\hidden_weights 1``, ``\\hidden_biases 1``, ``\\hidden_weights 2``,
``\\hidden_biases 2``, ``\\output_weights``, ``\\output_biases``, ``\\end``; one matrix row per line,
sections separated by blank lines.  ``num_hidden 0`` means a single hidden layer of
``output_embedding_dimension`` units.  NPLM scores are the unnormalised output (natural log),
so imported models have an ``unnormalised`` output layer unless ``normalise=True``.
"""
from __future__ import annotations

import io
import os
from typing import Any, Dict, List, Optional, TextIO, Tuple

import numpy as np

from nlmfeature.core.architecture import precompute_tables
from nlmfeature.io.atomicfile import atomic_write_text
from nlmfeature.errors import InputError
from nlmfeature.core.vocab import SPECIALS, Vocabulary

Arrays = Dict[str, np.ndarray]

_ACTIVATIONS = {"rectifier": "relu", "identity": "identity", "tanh": "tanh", "hardtanh": "hardtanh"}


class _Reader:
    """Line reader that knows where it is (for error messages)."""

    def __init__(self, f: TextIO, path: str, size: int) -> None:
        self.f, self.path, self.line, self.size = f, path, 0, size

    def next(self) -> Optional[str]:
        try:
            raw = self.f.readline()
        except UnicodeDecodeError as exc:
            raise InputError(self.path, self.line + 1, f"not UTF-8 text ({exc.reason})") from None
        if not raw:
            return None
        self.line += 1
        return raw.rstrip("\r\n")

    def error(self, msg: str) -> InputError:
        return InputError(self.path, self.line, msg)

    def block(self) -> List[str]:
        """Lines up to the next blank line (or end of file)."""
        out = []
        while True:
            line = self.next()
            if line is None or line.strip() == "":
                return out
            out.append(line)

    def matrix(self, rows: int, cols: int, what: str) -> np.ndarray:
        start = self.line + 1
        # every number takes at least two bytes of text: refuse sizes the file cannot hold
        # before allocating anything (a corrupt header must not ask for gigabytes)
        if rows * cols * 2 > self.size + 2:
            raise self.error(f"{what}: the config announces {rows} x {cols} numbers, more than "
                             f"this {self.size}-byte file can hold")
        out = np.empty((rows, cols), dtype=np.float32)
        i = 0
        while True:
            line = self.next()
            if line is None:
                if i != rows:
                    raise self.error(f"file ends inside {what} ({i} of {rows} rows): the model is truncated")
                break
            if line.strip() == "":
                break
            if i >= rows:
                raise self.error(f"{what}: more than the {rows} rows the config announces")
            fields = line.split()
            if len(fields) != cols:
                raise self.error(f"{what}: row has {len(fields)} columns, expected {cols}")
            try:
                row = np.asarray(fields, dtype=np.float64)
            except ValueError:
                raise self.error(f"{what}: not a number in {line[:60]!r}") from None
            if not np.all(np.isfinite(row)) or np.any(np.abs(row) > 3e38):
                raise self.error(f"{what}: a value is not a finite float32 number (nan, inf or "
                                 f"beyond 3e38) in {line[:60]!r}")
            out[i] = row
            i += 1
        if i != rows:
            raise InputError(self.path, start, f"{what}: {i} rows, expected {rows}")
        return out


def read_nplm(path: str, normalise: bool = False, tables: bool = True) -> Tuple[Dict[str, Any], Arrays]:
    """Parse an NPLM text model into an nlmfeature (header, arrays) pair.

    The vocabulary keeps NPLM's ids.  ``<null>`` keeps its trained embedding if it has one
    (NPLM sets it with a separate script); a missing ``<null>`` or ``<s>``/``</s>``/``<unk>``
    is added with a zero output row and a very low output bias.
    """
    try:
        f = open(path, encoding="utf-8")
        size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise InputError(path, 0, f"cannot open NPLM model: {exc.strerror}") from None
    cfg: Dict[str, str] = {}
    vocab_in: Optional[List[str]] = None
    vocab_out: Optional[List[str]] = None
    mats: Dict[str, np.ndarray] = {}
    with f:
        r = _Reader(f, path, size)
        first = True
        while True:
            line = r.next()
            if line is None:
                raise r.error("file ends before \\end: the model is truncated")
            if first and line != "\\config":
                raise r.error("not an NPLM model: it must start with \\config")
            first = False
            if line == "" or line.isspace():
                continue
            if line == "\\end":
                break
            if line == "\\config":
                for entry in r.block():
                    kv = entry.split()
                    if len(kv) != 2:
                        raise r.error(f"config line {entry!r} is not 'key value'")
                    cfg[kv[0]] = kv[1]
                _check_config(cfg, r)
                continue
            if not cfg:
                raise r.error("\\config must come first")
            n, E = int(cfg["ngram_size"]), int(cfg["input_embedding_dimension"])
            H1, D = int(cfg["num_hidden"]), int(cfg["output_embedding_dimension"])
            Vi = int(cfg.get("input_vocab_size", cfg.get("vocab_size", "0")))
            Vo = int(cfg.get("output_vocab_size", cfg.get("vocab_size", "0")))
            first_out = H1 if H1 > 0 else D
            if line == "\\vocab":
                vocab_in = vocab_out = _vocab_block(r, Vi)
            elif line == "\\input_vocab":
                vocab_in = _vocab_block(r, Vi)
            elif line == "\\output_vocab":
                vocab_out = _vocab_block(r, Vo)
            elif line == "\\input_embeddings":
                mats["emb"] = r.matrix(Vi, E, "input_embeddings")
            elif line == "\\hidden_weights 1":
                mats["W1"] = r.matrix(first_out, E * (n - 1), "hidden_weights 1")
            elif line == "\\hidden_biases 1":
                mats["b1"] = r.matrix(first_out, 1, "hidden_biases 1")[:, 0]
            elif line == "\\hidden_weights 2":
                mats["W2"] = r.matrix(D if H1 > 0 else 1, H1 if H1 > 0 else 1, "hidden_weights 2")
            elif line == "\\hidden_biases 2":
                mats["b2"] = r.matrix(D if H1 > 0 else 1, 1, "hidden_biases 2")[:, 0]
            elif line == "\\output_weights":
                mats["Wout"] = r.matrix(Vo, D, "output_weights")
            elif line == "\\output_biases":
                mats["bout"] = r.matrix(Vo, 1, "output_biases")[:, 0]
            else:
                raise r.error(f"unknown section {line!r}")
    for need in ("emb", "W1", "Wout", "bout"):
        if need not in mats:
            raise InputError(path, 0, f"NPLM model lacks the section for {need}")
    if vocab_in is None:
        raise InputError(path, 0, "NPLM model has no \\vocab (or \\input_vocab) section; "
                                  "models written without a vocabulary cannot be imported")
    if vocab_out is not None and vocab_out != vocab_in:
        raise InputError(path, 0, "separate NPLM input and output vocabularies are not supported "
                                  "(nlmfeature models have one vocabulary)")
    if mats["Wout"].shape[0] != mats["emb"].shape[0]:
        raise InputError(path, 0, f"{mats['Wout'].shape[0]} output rows but {mats['emb'].shape[0]} input "
                                  "embeddings: separate input and output vocabularies are not supported")
    if len(vocab_in) != mats["emb"].shape[0]:
        raise InputError(path, 0, f"vocabulary has {len(vocab_in)} words but the embeddings "
                                  f"{mats['emb'].shape[0]} rows")
    return _to_nlmfeature(cfg, vocab_in, mats, normalise, tables)


def _vocab_block(r: _Reader, size: int) -> List[str]:
    """A vocabulary section: one word per line, as many as the config announces."""
    start = r.line
    words = r.block()
    if len(words) != size:
        raise InputError(r.path, start, f"vocabulary section has {len(words)} words but the config "
                                        f"announces {size}")
    for i, w in enumerate(words):
        if not w or any(ch.isspace() for ch in w):
            raise InputError(r.path, start + 1 + i, f"vocabulary word {w!r} is empty or contains white space")
    if len(set(words)) != len(words):
        dup = next(w for i, w in enumerate(words) if w in words[:i])
        raise InputError(r.path, start + 1 + words.index(dup, words.index(dup) + 1),
                         f"vocabulary word {dup!r} appears twice")
    return words


#: the orders the native scorer can load (NLM_MAX_ORDER)
MAX_NGRAM_SIZE = 16


def _check_config(cfg: Dict[str, str], r: _Reader) -> None:
    if cfg.get("version", "1") != "1":
        raise r.error(f"NPLM format version {cfg['version']} (only version 1 is known)")
    limits = {"ngram_size": (2, MAX_NGRAM_SIZE), "input_embedding_dimension": (1, 1 << 20),
              "num_hidden": (0, 1 << 20), "output_embedding_dimension": (1, 1 << 20),
              "vocab_size": (1, (1 << 31) - 8), "input_vocab_size": (1, (1 << 31) - 8),
              "output_vocab_size": (1, (1 << 31) - 8)}
    for key in ("ngram_size", "input_embedding_dimension", "num_hidden", "output_embedding_dimension"):
        if key not in cfg:
            raise r.error(f"\\config lacks {key}")
    if "input_vocab_size" not in cfg and "vocab_size" not in cfg:
        raise r.error("\\config lacks input_vocab_size (or vocab_size)")
    for key, (lo, hi) in limits.items():
        if key not in cfg:
            continue
        try:
            v = int(cfg[key])
        except ValueError:
            raise r.error(f"\\config {key} is not an integer") from None
        if not lo <= v <= hi:
            why = " (the scorer loads orders 2 to 16)" if key == "ngram_size" else ""
            raise r.error(f"\\config {key} {v} is outside {lo}..{hi}{why}")
    act = cfg.get("activation_function", "rectifier")
    if act not in _ACTIVATIONS:
        raise r.error(f"unknown activation_function {act!r}")


def _to_nlmfeature(cfg: Dict[str, str], words: List[str], m: Dict[str, np.ndarray], normalise: bool,
                   tables: bool) -> Tuple[Dict[str, Any], Arrays]:
    n, E = int(cfg["ngram_size"]), int(cfg["input_embedding_dimension"])
    H1, D = int(cfg["num_hidden"]), int(cfg["output_embedding_dimension"])
    act = _ACTIVATIONS[cfg.get("activation_function", "rectifier")]
    words = list(words)
    emb, Wout, bout = m["emb"], m["Wout"], m["bout"]
    missing = [s for s in SPECIALS if s not in words]
    if missing:  # e.g. a model trained without <null>: add rows that never win
        words += missing
        emb = np.vstack([emb, np.zeros((len(missing), E), np.float32)])
        Wout = np.vstack([Wout, np.zeros((len(missing), Wout.shape[1]), np.float32)])
        bout = np.concatenate([bout, np.full(len(missing), -100.0, np.float32)])
    # every nlmfeature model (and the C API, the decoder shims) has <unk> <s> </s> <null> at
    # ids 0-3: move NPLM's rows there, the other words keep their order
    index = {w: i for i, w in enumerate(words)}
    perm = np.array([index[s] for s in SPECIALS] + [i for i, w in enumerate(words) if w not in SPECIALS],
                    dtype=np.int64)
    words = [words[i] for i in perm]
    emb, Wout, bout = emb[perm], Wout[perm], bout[perm]
    vocab = Vocabulary(words)
    first = H1 if H1 > 0 else D
    c = n - 1
    W1 = m["W1"].reshape(first, c, E).transpose(1, 0, 2).copy()  # (c, H, E): block j = position j
    header: Dict[str, Any] = {
        "arch": "nplm", "order": n, "vocab_size": len(vocab), "embed_dim": E,
        "branches": [{"hidden": first, "diagonal": False, "activation": act, "bias": True}],
        "combine": "none", "layers": [], "output": {"type": "softmax" if normalise else "unnormalised", "dim": D},
        "direct": None, "precomputed": False,
        "special": {"<unk>": vocab.unk, "<s>": vocab.bos, "</s>": vocab.eos, "<null>": vocab.null},
        "metadata": {"imported_from": "nplm", "nplm_config": cfg},
    }
    arrays: Arrays = {
        "embeddings": np.ascontiguousarray(emb), "branch0.weights": W1,
        "branch0.bias": m.get("b1", np.zeros(first, np.float32)).astype(np.float32),
        "output.weight": np.ascontiguousarray(Wout), "output.bias": bout.astype(np.float32),
        "unigram": np.full(len(vocab), 1.0 / len(vocab), np.float32),
    }
    if H1 > 0:
        header["layers"] = [{"n_in": H1, "n_out": D, "activation": act}]
        arrays["layer0.weight"] = m["W2"]
        arrays["layer0.bias"] = m.get("b2", np.zeros(D, np.float32)).astype(np.float32)
    arrays.update(vocab.to_arrays())
    if tables:
        precompute_tables(header, arrays)
    return header, arrays


def write_nplm(path: str, header: Dict[str, Any], arrays: Arrays, words: List[str]) -> None:
    """Write an nlmfeature NPLM-architecture model in NPLM's text format (atomically).

    Only models NPLM can express are accepted: one ReLU/tanh/hardtanh/identity branch with
    bias, at most one extra layer with the same activation, unnormalised or softmax output.
    """
    if header["arch"] != "nplm" or len(header["branches"]) != 1 or len(header["layers"]) > 1 \
            or header["output"]["type"] not in ("unnormalised", "softmax") or header.get("direct"):
        raise ValueError("this model cannot be expressed in NPLM's format")
    br = header["branches"][0]
    act = {v: k for k, v in _ACTIVATIONS.items()}[br["activation"]]
    n, E, c = header["order"], header["embed_dim"], header["order"] - 1
    W1 = np.asarray(arrays["branch0.weights"]).transpose(1, 0, 2).reshape(br["hidden"], c * E)
    layers = header["layers"]
    D = header["output"]["dim"]
    out = io.StringIO()

    def mat(name: str, a: np.ndarray) -> None:
        out.write(f"\\{name}\n")
        a = np.asarray(a, dtype=np.float64)
        a = a.reshape(-1, 1) if a.ndim == 1 else a
        for row in a:
            out.write("\t".join(repr(float(x)) for x in row) + "\n")
        out.write("\n")

    out.write("\\config\nversion 1\n")
    out.write(f"ngram_size {n}\ninput_vocab_size {len(words)}\noutput_vocab_size {len(words)}\n")
    out.write(f"input_embedding_dimension {E}\nnum_hidden {br['hidden'] if layers else 0}\n")
    out.write(f"output_embedding_dimension {D}\nactivation_function {act}\n\n")
    out.write("\\input_vocab\n" + "\n".join(words) + "\n\n")
    out.write("\\output_vocab\n" + "\n".join(words) + "\n\n")
    mat("input_embeddings", arrays["embeddings"])
    mat("hidden_weights 1", W1)
    mat("hidden_biases 1", arrays["branch0.bias"])
    if layers:
        mat("hidden_weights 2", arrays["layer0.weight"])
        mat("hidden_biases 2", arrays["layer0.bias"])
    else:
        mat("hidden_weights 2", np.zeros((1, 1)))
        mat("hidden_biases 2", np.zeros(1))
    mat("output_weights", arrays["output.weight"])
    mat("output_biases", arrays["output.bias"])
    out.write("\\end\n")
    atomic_write_text(path, out.getvalue())
