"""The PyTorch training engine: the native trainer's models and recipe on torch.distributed.

``nlmfeature train --engine torch`` trains the same models as the native engine
(:mod:`nlmfeature.training.trainer`), from the same compiled corpus, and writes the same
``.nlm`` file with the same writer; the difference is where the arithmetic runs: PyTorch on
the CPU or a GPU, in one process or many (DistributedDataParallel, launched with
``torchrun``; gloo on CPUs, NCCL on GPUs; one machine or several)::

    torchrun --nproc_per_node 2 -m nlmfeature.cli train --engine torch \\
        --train train.txt.gz --test-set valid.txt --model-out lm.nlm

What is shared with the native engine (reused, not copied): the setting-up of a run
(:class:`~nlmfeature.training.trainer.Trainer`'s vocabulary, n-gram stream, model builder,
direct-feature hash space and filter, noise samplers), the held-out evaluation (the scorer
itself, on rank 0), the model writer, the checkpoint format, early stopping and step-size
decay.  So a run is the native run with another engine:

* **Sharding.**  Every rank reads the same global minibatch sequence of
  ``--minibatch-size`` B n-grams (:meth:`NgramStream.batches`, seeded by the epoch) and
  draws the same noise (the native counter-based sampler, for the whole minibatch); rank r of
  W trains on rows ``[r*b//W, (r+1)*b//W)`` of each minibatch of b rows.  The loss is summed
  over the global minibatch (each rank's sum times W, which DDP's gradient averaging turns
  back into the global sum), so one AdaGrad update sees exactly the native minibatch
  gradient: the same settings give the same model at any W, up to float rounding, and the
  result depends on nothing but the seed, the settings and (through rounding) W.  More
  processes make each update cheaper, not larger; raise ``--minibatch-size`` for a larger
  one.
* **AdaGrad** is the native one, not ``torch.optim.Adagrad``: the same step
  ``theta -= lr g / (sqrt(sum g^2) + 1e-8)``, L2 ``lambda B / N`` on weights only, and rows
  of the row-indexed arrays (embeddings, output rows, biases, direct weights) updated lazily,
  only when a minibatch touches them.  On the CPU those arrays get sparse gradients (reduced
  by :func:`all_reduce_rows`, DDP the rest); on a GPU dense ones (a row is touched when its
  reduced gradient is not zero).  Measured on a CPU (Brown, LBL 200 NCE, one process): 13,000
  words/s with sparse gradients, 3,000-3,900 with dense ones (which update the whole V x D
  output matrix every step).
* **Direct n-gram features** are hashed in torch exactly as the scorer
  (``splitmix64`` keys of the last k context words and the target, int64 arithmetic with
  logical shifts), so the trained weights sit where the scorer looks them up.
* Only rank 0 evaluates, writes the model and checkpoints (atomically, plain arrays in the
  native checkpoint format: a native checkpoint resumes under torch and back); the others
  receive its parameters and position after every evaluation and on resume.
* Ctrl-C / SIGTERM on any rank stops every rank after the current minibatch (a flag reduced
  each step), writes a checkpoint and exits 130.

Supported: ``lbl`` (diagonal and full), ``nplm``, ``lateral``; outputs ``unnormalised``
(NCE, or ML with ``--self-normalise``), ``softmax`` (ML or NCE), ``class`` (class NCE and
ML), ``tree`` (ML); direct features; dropout; extra hidden layers.  Refused with a message:
joint models (``--source``).  ``class`` ML computes the whole-vocabulary logits (masked to
the target's class), costing what a softmax costs.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise ImportError("the torch training engine needs PyTorch: pip install 'nlmfeature[torch]'") from _exc

from nlmfeature.errors import NLMFeatureError
from nlmfeature.training.optim import regularised
from nlmfeature.training.trainer import TrainConfig, Trainer, TrainResult, checkpoint_path

# ---------------------------------------------------------------------------------------
# direct-feature hashing (the scorer's splitmix64 keys, in int64 arithmetic)
# ---------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1


def _signed(v: int) -> int:
    """A uint64 constant as the int64 of the same bits."""
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _lsr(x: "torch.Tensor", s: int) -> "torch.Tensor":
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: "torch.Tensor") -> "torch.Tensor":
    """The scorer's splitmix64 finaliser on int64 tensors holding uint64 bits (wrapping
    multiplication; the result's bits are the uint64 result)."""
    x = x + _GOLDEN
    x = (x ^ _lsr(x, 30)) * _MIX1
    x = (x ^ _lsr(x, 27)) * _MIX2
    return x ^ _lsr(x, 31)


def _splitmix64_int(v: int) -> int:
    """splitmix64 of one Python integer (uint64 arithmetic)."""
    v = (v + 0x9E3779B97F4A7C15) & _MASK64
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & _MASK64
    return v ^ (v >> 31)


def _umod(x: "torch.Tensor", m: int) -> "torch.Tensor":
    """uint64 bits ``x`` modulo ``m`` (0 < m < 2^62)."""
    if m & (m - 1) == 0:
        return x & (m - 1)
    return ((_lsr(x, 1) % m) * 2 + (x & 1)) % m


def direct_indices(ctx: "torch.Tensor", cand: "torch.Tensor", kind: int, order: int,
                   hash_space: int) -> "torch.Tensor":
    """Direct-feature buckets (N, K, order) int64 of (context ``ctx[n]``, candidate
    ``cand[n, j]``) for n-gram orders 1..``order`` -- the scorer's
    ``direct_feature_indices`` (``kind`` 0: word features, 1: class features)."""
    ctx = ctx.long()
    c = ctx.shape[1]
    t = cand.long() << 32
    state = torch.full((ctx.shape[0], 1), _signed(_splitmix64_int(kind)), dtype=torch.long, device=ctx.device)
    out = []
    for k in range(order):
        if k:
            state = splitmix64(state ^ ctx[:, c - k:c - k + 1])
        out.append(_umod(splitmix64(state ^ t), hash_space))
    return torch.stack(out, dim=-1)


# ---------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------

#: arrays indexed by row (word, class, tree node, bucket): updated lazily, row by row
ROW_ARRAYS = ("embeddings", "output.weight", "output.bias", "class.weight", "class.bias",
              "tree.weight", "tree.bias", "direct.weights")
#: 1-D row arrays, held as (n, 1) embedding tables inside the module
_COLUMNS = ("output.bias", "class.bias", "tree.bias", "direct.weights")
#: estimators that read output rows by gathering them (sparse gradients on the CPU)
_GATHERING = ("nce", "class-nce", "tree-ml")

SUPPORTED = {"arch": ("lbl", "nplm", "lateral"),
             "estimator": ("nce", "class-nce", "softmax", "class-ml", "tree-ml")}


def _key(name: str) -> str:
    return name.replace(".", "__")


def used_names(header: Dict[str, Any], estimator: str, names: Iterable[str]) -> List[str]:
    """The trainable arrays ``estimator`` actually reads (a tree output never reads the
    word output rows; a unigram model no context weights): the others keep their values."""
    out = []
    c = int(header["order"]) - 1
    for n in names:
        if estimator == "tree-ml" and n.startswith("output."):
            continue
        if c == 0 and (n == "embeddings" or n.endswith(".weights") and n.startswith("branch")):
            continue
        out.append(n)
    return out


class TorchLM(nn.Module):
    """A model of the model-file format as a torch module: the scorer's function of the same
    named arrays (:mod:`nlmfeature.core.forward`), with the training losses of
    :mod:`nlmfeature.training.estimators`.

    ``arrays`` holds every array of the model (trainable and fixed structure); ``names`` the
    ones to train (parameters), the rest the module reads as constants.  ``forward`` returns
    the summed loss of a minibatch; :meth:`log_prob` the scorer's natural-log scores."""

    def __init__(self, header: Dict[str, Any], arrays: Dict[str, np.ndarray], names: Sequence[str],
                 estimator: str, noise_samples: int = 0, alpha: float = 0.0,
                 logq: Optional[np.ndarray] = None, logq_class: Optional[np.ndarray] = None,
                 sparse: bool = True) -> None:
        super().__init__()
        if estimator not in SUPPORTED["estimator"]:
            raise NLMFeatureError(f"the torch engine does not train the {estimator!r} estimator")
        self.header = header
        self.estimator = estimator
        self.k = int(noise_samples)
        self.alpha = float(alpha)
        self.c = int(header["order"]) - 1
        self.names = list(names)
        d = header.get("direct")
        self.direct_order = int(d["order"]) if d else 0
        self.hash_space = int(d["hash_space"]) if d else 0
        self.tables = nn.ModuleDict()
        self.dense = nn.ParameterDict()
        self.fixed: Dict[str, str] = {}
        needed = {"embeddings", "output.weight", "output.bias", "class.weight", "class.bias", "tree.weight",
                  "tree.bias", "direct.weights"}
        needed.update(n for n in arrays if n.startswith(("branch", "layer")) and not n.endswith(".tables"))
        for n in sorted(needed & set(arrays)):
            a = np.ascontiguousarray(arrays[n], dtype=np.float32)
            if n in ROW_ARRAYS:
                t = torch.tensor(a.reshape(-1, 1) if n in _COLUMNS else a)
                gathered = n == "embeddings" or estimator in _GATHERING
                emb = nn.Embedding(t.shape[0], t.shape[1], sparse=bool(sparse and gathered), _weight=t)
                emb.weight.requires_grad_(n in self.names)
                self.tables[_key(n)] = emb
            elif n in self.names:
                self.dense[_key(n)] = nn.Parameter(torch.tensor(a))
            else:
                self.register_buffer(_key(n), torch.tensor(a))
                self.fixed[n] = _key(n)
        out = header["output"]["type"]
        if out == "class":
            self.register_buffer("class_of_word", torch.from_numpy(np.asarray(arrays["class.of_word"], np.int64)))
        if out == "tree":
            ps = np.asarray(arrays["tree.path_start"], np.int64)
            pn = np.asarray(arrays["tree.path_node"], np.int64)
            sg = np.asarray(arrays["tree.path_sign"], np.float32)
            lens = ps[1:] - ps[:-1]
            L = max(1, int(lens.max()) if len(lens) else 1)
            steps = np.arange(L)
            valid = steps[None, :] < lens[:, None]
            pos = np.where(valid, ps[:-1, None] + steps[None, :], 0)
            self.register_buffer("tree_nodes", torch.from_numpy(np.where(valid, pn[pos] if len(pn) else 0, 0)))
            self.register_buffer("tree_signs", torch.from_numpy(np.where(valid, sg[pos] if len(sg) else 0, 0)
                                                                .astype(np.float32)))
            self.register_buffer("tree_valid", torch.from_numpy(valid.astype(np.float32)))
        self.register_buffer("logq", torch.from_numpy(np.asarray(logq if logq is not None else [0.0], np.float64)))
        self.register_buffer("logq_class", torch.from_numpy(
            np.asarray(logq_class if logq_class is not None else [0.0], np.float64)))

    # -- arrays ---------------------------------------------------------------------------
    def array(self, name: str) -> "torch.Tensor":
        """The tensor of a model-file array (row arrays as (n, 1) for 1-D ones)."""
        k = _key(name)
        if k in self.tables:
            return self.tables[k].weight
        if k in self.dense:
            return self.dense[k]
        return getattr(self, k)

    def has(self, name: str) -> bool:
        k = _key(name)
        return k in self.tables or k in self.dense or name in self.fixed

    def parameters_by_name(self) -> Dict[str, "torch.Tensor"]:
        """The trained arrays, by model-file name."""
        return {n: self.array(n) for n in self.names}

    def export(self) -> Dict[str, np.ndarray]:
        """The trained arrays as float32 numpy arrays of their model-file shapes."""
        out = {}
        for n, t in self.parameters_by_name().items():
            a = t.detach().cpu().numpy()
            out[n] = np.ascontiguousarray(a.reshape(-1) if n in _COLUMNS else a, dtype=np.float32)
        return out

    @torch.no_grad()
    def load(self, arrays: Dict[str, np.ndarray]) -> None:
        """Set the trained arrays from numpy arrays of their model-file shapes."""
        for n, t in self.parameters_by_name().items():
            t.copy_(torch.tensor(np.asarray(arrays[n], dtype=np.float32)).reshape(t.shape))

    def _rows(self, name: str, idx: "torch.Tensor") -> "torch.Tensor":
        emb = self.tables[_key(name)]
        return F.embedding(idx, emb.weight, sparse=emb.sparse)

    # -- hidden layers ----------------------------------------------------------------------
    def hidden(self, ctx: "torch.Tensor") -> "torch.Tensor":
        """Final hidden vectors (N, D) of padded contexts (N, n-1) (:func:`core.forward.hidden`)."""
        h = self.header
        N = ctx.shape[0]
        X = self._rows("embeddings", ctx) if self.c else None       # (N, c, E)
        acc = None
        for k, br in enumerate(h["branches"]):
            W = self.array(f"branch{k}.weights")
            if not self.c:
                pre = torch.zeros((N, br["hidden"]), dtype=torch.float32, device=ctx.device)
            elif br["diagonal"]:
                pre = (X * W.unsqueeze(0)).sum(dim=1)
            else:
                pre = X.reshape(N, -1) @ W.permute(1, 0, 2).reshape(W.shape[1], -1).t()
            if br.get("bias"):
                pre = pre + self.array(f"branch{k}.bias")
            post = _activate(br["activation"], pre)
            if acc is None:
                acc = post
            elif h["combine"] == "max":
                acc = torch.where(post > acc, post, acc)   # the first maximum wins ties
            elif h["combine"] == "mul":
                acc = acc * (post + 1)
            else:
                acc = acc + post
        for k, ly in enumerate(h["layers"]):
            acc = _activate(ly["activation"], acc @ self.array(f"layer{k}.weight").t() + self.array(f"layer{k}.bias"))
        return acc

    # -- logits -----------------------------------------------------------------------------
    def _direct(self, ctx: "torch.Tensor", cand: "torch.Tensor", kind: int) -> "torch.Tensor":
        idx = direct_indices(ctx, cand, kind, self.direct_order, self.hash_space)
        return self._rows("direct.weights", idx).sum(dim=(-1, -2))

    def sparse_logits(self, kind: str, H: "torch.Tensor", ctx: "torch.Tensor", cand: "torch.Tensor") -> "torch.Tensor":
        """Logits (N, K) of candidate rows ``cand`` (N, K) of output ``kind``."""
        R = self._rows(f"{kind}.weight", cand)                      # (N, K, D)
        s = (R * H.unsqueeze(1)).sum(dim=2) + self._rows(f"{kind}.bias", cand)[..., 0]   # faster than bmm on CPUs
        if self.direct_order and kind != "tree":
            s = s + self._direct(ctx, cand, 0 if kind == "output" else 1)
        return s

    def dense_logits(self, kind: str, H: "torch.Tensor", ctx: "torch.Tensor") -> "torch.Tensor":
        """Logits (N, R) of every row of output ``kind``."""
        W, b = self.array(f"{kind}.weight"), self.array(f"{kind}.bias")
        z = H @ W.t() + b.t()
        if self.direct_order and kind != "tree":
            ids = torch.arange(W.shape[0], device=H.device).expand(H.shape[0], -1)
            z = z + self._direct(ctx, ids, 0 if kind == "output" else 1)
        return z

    # -- losses -----------------------------------------------------------------------------
    def _nce(self, kind: str, H, ctx, target, noise, logq) -> "torch.Tensor":
        """NCE loss with noise (N, k) per n-gram, or (k,) shared by the minibatch (--shared-noise:
        the noise logits are one matrix product; no direct features)."""
        k = noise.shape[-1]
        if noise.dim() == 1:
            xt = self.sparse_logits(kind, H, ctx, target[:, None])[:, 0].double() - logq[target] - math.log(k)
            Wn = self._rows(f"{kind}.weight", noise)                               # (k, D)
            xn = (H @ Wn.t() + self._rows(f"{kind}.bias", noise)[:, 0]).double() - logq[noise] - math.log(k)
            return -(F.logsigmoid(xt).sum() + F.logsigmoid(-xn).sum())
        cand = torch.cat([target[:, None], noise], dim=1)
        x = self.sparse_logits(kind, H, ctx, cand).double() - logq[cand] - math.log(k)
        return -(F.logsigmoid(x[:, 0]).sum() + F.logsigmoid(-x[:, 1:]).sum())

    def forward(self, ctx: "torch.Tensor", target: "torch.Tensor", noise_words: Optional["torch.Tensor"] = None,
                noise_classes: Optional["torch.Tensor"] = None, mask: Optional["torch.Tensor"] = None
                ) -> "torch.Tensor":
        """Summed loss (float64 scalar) of a minibatch: ``ctx`` (N, n-1), ``target`` (N,) long,
        noise (N, k) for the NCE estimators (or (k,) shared by the minibatch), ``mask`` (N, D) an
        inverted-dropout mask."""
        H = self.hidden(ctx)
        if mask is not None:
            H = H * mask
        est = self.estimator
        if est == "nce":
            return self._nce("output", H, ctx, target, noise_words, self.logq)
        if est == "class-nce":
            cls = self.class_of_word[target]
            return (self._nce("class", H, ctx, cls, noise_classes, self.logq_class)
                    + self._nce("output", H, ctx, target, noise_words, self.logq))
        if est == "tree-ml":
            nodes = self.tree_nodes[target]
            x = self.sparse_logits("tree", H, ctx, nodes).double() * self.tree_signs[target]
            return -(F.logsigmoid(x) * self.tree_valid[target]).sum()
        rows = torch.arange(len(target), device=target.device)
        z = self.dense_logits("output", H, ctx).double()
        if est == "softmax":
            lz = torch.logsumexp(z, dim=1)
            loss = -(z[rows, target] - lz).sum()
            return loss + self.alpha * (lz ** 2).sum() if self.alpha else loss
        # class-ml: log p(c|h) + log p(w|c,h), the latter over the target class's members
        cls = self.class_of_word[target]
        zc = self.dense_logits("class", H, ctx).double()
        loss = -(zc[rows, cls] - torch.logsumexp(zc, dim=1)).sum()
        member = self.class_of_word[None, :] == cls[:, None]
        zw = z.masked_fill(~member, -math.inf)
        return loss - (z[rows, target] - torch.logsumexp(zw, dim=1)).sum()

    @torch.no_grad()
    def log_prob(self, ctx: "torch.Tensor", words: "torch.Tensor") -> "torch.Tensor":
        """Natural-log scores (float64) of ``words`` after ``ctx``, as the scorer computes them:
        raw scores for an unnormalised output, exact log-probabilities otherwise."""
        ctx, words = ctx.long(), words.long()
        H = self.hidden(ctx)
        out = self.header["output"]["type"]
        rows = torch.arange(len(words), device=words.device)
        if out == "tree":
            x = self.sparse_logits("tree", H, ctx, self.tree_nodes[words]).double() * self.tree_signs[words]
            return (F.logsigmoid(x) * self.tree_valid[words]).sum(dim=1)
        if out == "unnormalised":
            return self.sparse_logits("output", H, ctx, words[:, None])[:, 0].double()
        z = self.dense_logits("output", H, ctx).double()
        if out == "softmax":
            return z[rows, words] - torch.logsumexp(z, dim=1)
        cls = self.class_of_word[words]
        zc = self.dense_logits("class", H, ctx).double()
        member = self.class_of_word[None, :] == cls[:, None]
        return (zc[rows, cls] - torch.logsumexp(zc, dim=1)
                + z[rows, words] - torch.logsumexp(z.masked_fill(~member, -math.inf), dim=1))


def _activate(name: str, x: "torch.Tensor") -> "torch.Tensor":
    if name == "identity":
        return x
    if name in ("relu", "rectifier"):
        return torch.relu(x)
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "tanh":
        return torch.tanh(x)
    if name == "hardtanh":
        return torch.clamp(x, -1, 1)
    raise NLMFeatureError(f"the torch engine does not know the activation {name!r}")


# ---------------------------------------------------------------------------------------
# AdaGrad, as the native one
# ---------------------------------------------------------------------------------------

class RowAdaGrad:
    """The native trainer's AdaGrad (:class:`nlmfeature.training.optim.AdaGrad`) on tensors:
    ``g' = g + l2 theta`` (weights only), ``a += g'^2``, ``theta -= lr g' / (sqrt(a) + eps)``;
    arrays named in ``rowwise`` are updated only in the rows the gradient touches (the rows of
    a sparse gradient, or the non-zero rows of a dense one), and ``row_mask[name]`` (bool per
    row) drops the rows that may not be trained (the direct-feature filter)."""

    def __init__(self, params: Dict[str, "torch.Tensor"], rowwise: Iterable[str], lr: float, eps: float = 1e-8,
                 row_mask: Optional[Dict[str, "torch.Tensor"]] = None) -> None:
        self.params = params
        self.rowwise = set(rowwise)
        self.lr = float(lr)
        self.eps = float(eps)
        self.row_mask = row_mask or {}
        self.state: Dict[str, torch.Tensor] = {n: torch.zeros_like(p) for n, p in params.items()}

    @torch.no_grad()
    def step(self, l2: float) -> None:
        """Apply and clear the gradients."""
        for n, p in self.params.items():
            g = p.grad
            if g is None:
                continue
            reg = l2 if regularised(n) else 0.0
            a = self.state[n]
            p.grad = None
            if g.is_sparse:
                g = g.coalesce()
                rows, vals = g.indices()[0], g.values()
            elif n in self.rowwise:
                rows = torch.nonzero(g.ne(0).any(dim=1))[:, 0]
                vals = g.index_select(0, rows)
            else:
                gd = g.add(p, alpha=reg) if reg else g
                a.addcmul_(gd, gd)
                p.addcdiv_(gd, a.sqrt().add_(self.eps), value=-self.lr)
                continue
            if n in self.row_mask:
                keep = self.row_mask[n].index_select(0, rows)
                rows, vals = rows[keep], vals[keep]
            pr = p.index_select(0, rows)
            gd = vals.add(pr, alpha=reg) if reg else vals
            ar = a.index_select(0, rows).addcmul_(gd, gd)
            a.index_copy_(0, rows, ar)
            p.index_copy_(0, rows, pr.addcdiv_(gd, ar.sqrt_().add_(self.eps), value=-self.lr))


# ---------------------------------------------------------------------------------------
# distributed set-up
# ---------------------------------------------------------------------------------------

def all_reduce_rows(grads: Sequence[Optional["torch.Tensor"]], shapes: Sequence[Sequence[int]],
                    world: int) -> List["torch.Tensor"]:
    """The mean over the ``world`` ranks of each row-sparse gradient of ``grads`` (sparse COO
    tensors of ``shapes``; ``None`` where this rank touched no row of that table), as DDP
    averages dense gradients: the same coalesced sparse tensors on every rank.  Three dense
    ``all_gather`` calls whatever the number of tables (each rank's row counts per table, then
    all its rows, then all its values, padded to the longest rank's), because DDP's own sparse
    reduction through gloo corrupts the heap now and then (torch 2.13 on the CPU: two
    processes training sparse embeddings die of SIGSEGV or glibc's "unaligned tcache chunk"
    within a few thousand steps)."""
    rows, vals = [], []
    for g, shape in zip(grads, shapes):
        if g is None:
            rows.append(torch.zeros(0, dtype=torch.long))
            vals.append(torch.zeros(0))
            continue
        g = g.coalesce()
        rows.append(g.indices()[0])
        vals.append(g.values().reshape(-1))
    device = rows[0].device if rows else torch.device("cpu")
    widths = [math.prod(shape[1:]) for shape in shapes]

    def gather(t: "torch.Tensor", lengths: List[int]) -> List["torch.Tensor"]:
        """Every rank's ``t`` (1-D, its first ``lengths[rank]`` entries meaningful)."""
        padded = torch.zeros(max(1, max(lengths)), dtype=t.dtype, device=device)
        padded[:t.numel()] = t
        out = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(out, padded)
        return [o[:n] for o, n in zip(out, lengths)]

    counts = gather(torch.tensor([r.numel() for r in rows], dtype=torch.long, device=device),
                    [len(rows)] * world)
    counts = [[int(c) for c in rank] for rank in counts]              # [rank][table]
    all_rows = gather(torch.cat(rows).to(device), [sum(c) for c in counts])
    all_vals = gather(torch.cat(vals).to(device), [sum(n * w for n, w in zip(c, widths)) for c in counts])
    # [rank][table] pieces, then each table's pieces of every rank, in rank order
    row_parts = [r.split(c) for r, c in zip(all_rows, counts)]
    val_parts = [v.split([n * w for n, w in zip(c, widths)]) for v, c in zip(all_vals, counts)]
    out = []
    for t, shape in enumerate(shapes):
        v = torch.cat([p[t] for p in val_parts]).reshape((-1,) + tuple(shape[1:])).div_(world)
        out.append(torch.sparse_coo_tensor(torch.cat([p[t] for p in row_parts])[None], v, tuple(shape),
                                           check_invariants=False).coalesce())
    return out


def init_distributed() -> Tuple[int, int, "torch.device"]:
    """(rank, world size, device) of this process: joins the process group when launched by
    ``torchrun`` (``WORLD_SIZE`` > 1 in the environment; NCCL when CUDA is available, else
    gloo) and picks ``cuda:LOCAL_RANK`` or the CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda and local >= torch.cuda.device_count():
        raise NLMFeatureError(f"process {local} of this machine has no GPU of its own (the machine has "
                              f"{torch.cuda.device_count()}): start one process per GPU (--nproc_per_node)")
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        import datetime

        # rank 0 evaluates while the others wait in a collective: allow long held-out sets
        dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(hours=2))
    rank = dist.get_rank() if dist.is_initialized() else 0
    return rank, (dist.get_world_size() if dist.is_initialized() else 1), device


def _check_supported(cfg: TrainConfig) -> None:
    """Refuse, with a message, what the torch engine does not train."""
    if cfg.source or cfg.alignment or cfg.test_source or cfg.test_alignment or cfg.target_to_source:
        raise NLMFeatureError("the torch engine does not train joint models (--source, --alignment, "
                              "--test-source, --test-alignment, --target-to-source): use --engine native")
    if cfg.row_adagrad:
        raise NLMFeatureError("the torch engine keeps an AdaGrad sum per weight: --row-adagrad is for "
                              "--engine native")


# ---------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------

class TorchTrainer(Trainer):
    """A training run on PyTorch (see the module docstring): the native
    :class:`~nlmfeature.training.trainer.Trainer`'s set-up, evaluation, writer and
    checkpoints, with the minibatch arithmetic in a :class:`TorchLM` under DDP."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = None, sparse: Optional[bool] = None) -> None:
        """``sparse``: sparse gradients for the row arrays (default: on the CPU, not on a GPU)."""
        _check_supported(cfg)
        self.rank, self.world, self.device = init_distributed()
        if self.world > 1:
            error: Optional[Exception] = None
            if int(os.environ.get("LOCAL_RANK", "0")) == 0:   # one compile per machine, then the rest read it
                from nlmfeature.training.corpusfile import open_corpus

                try:
                    for path in (cfg.train, cfg.test_set):
                        if path:
                            open_corpus(path, cfg.corpus_dir or None)
                except (NLMFeatureError, OSError) as exc:
                    error = exc
            failed = torch.tensor([float(error is not None)], device=self.device)
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            if error is not None:
                raise error
            if failed.item():
                raise NLMFeatureError("stopped: another process could not read the training or held-out "
                                      "text (its message says why)")
        super().__init__(cfg, log if self.rank == 0 else _quiet)
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(max(1, cfg.threads))
        allowed = self.objective.out.s.allowed     # the direct-feature filter
        self.grads = None            # the native buffers are not needed
        self.objective = None
        names = used_names(self.header, self.estimator, list(self.params))
        live = {n: a for n, a in self.template.items() if n not in self.params}
        live.update(self.params)
        logq = logq_class = None
        if self.noise is not None:
            logq = getattr(self.noise, "logq_word", None)
            logq = self.noise.logq if logq is None else logq
            logq_class = getattr(self.noise, "logq_class", None)
        self.module = TorchLM(self.header, live, names, self.estimator, cfg.noise_samples, cfg.self_normalise,
                              logq, logq_class, sparse=self.device.type == "cpu" if sparse is None else sparse
                              ).to(self.device)
        self.ddp = self.module
        #: parameters with sparse gradients, reduced by :func:`all_reduce_rows` (not by DDP)
        self.sparse_params: List["torch.nn.Parameter"] = []
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            sparse_names = {f"tables.{k}.weight": e.weight for k, e in self.module.tables.items()
                            if e.sparse and e.weight.requires_grad}
            self.sparse_params = list(sparse_names.values())
            with torch.no_grad():
                for p in self.sparse_params:        # DDP broadcasts only the parameters it reduces
                    dist.broadcast(p.data, 0)
            if any(p.requires_grad for n, p in self.module.named_parameters() if n not in sparse_names):
                DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self.module, list(sparse_names))
                self.ddp = DistributedDataParallel(self.module, device_ids=[self.device] if self.device.type == "cuda"
                                                   else None, forward_sync_buffers=False)
        row_mask = {}
        if allowed is not None and "direct.weights" in names:
            row_mask["direct.weights"] = torch.from_numpy(allowed.astype(bool)).to(self.device)
        self.topt = RowAdaGrad(self.module.parameters_by_name(), [n for n in names if n in ROW_ARRAYS],
                               cfg.step_size, row_mask=row_mask)

    # -- numpy <-> torch --------------------------------------------------------------------
    def _pull(self) -> None:
        """Copy the torch parameters and AdaGrad sums into the native arrays (for the scorer,
        the writer and checkpoints)."""
        for n, a in self.module.export().items():
            self.params[n][...] = a
            self.opt.state[n][...] = self.topt.state[n].detach().cpu().numpy().reshape(a.shape)

    def _push(self) -> None:
        """Copy the native arrays (after resuming or going back to the best) into torch."""
        self.module.load(self.params)
        with torch.no_grad():
            for n, t in self.topt.state.items():
                t.copy_(torch.from_numpy(np.asarray(self.opt.state[n], np.float32)).reshape(t.shape))

    def _interrupt(self, signum, frame) -> None:  # pragma: no cover - signal path
        # under torchrun a Ctrl-C reaches every rank twice (the terminal's, then the launcher
        # passing it on): only a second signal outside torchrun aborts without a checkpoint
        if self._stop and not os.environ.get("TORCHELASTIC_RUN_ID"):
            raise KeyboardInterrupt
        if not self._stop:
            self.log("interrupted: finishing this minibatch and writing a checkpoint")
        self._stop = True

    def _restore_best(self) -> None:
        super()._restore_best()
        self._push()

    def _broadcast(self) -> None:
        """Rank 0's parameters, AdaGrad sums and position to every rank."""
        if self.world == 1:
            return
        for t in list(self.module.parameters_by_name().values()) + list(self.topt.state.values()):
            with torch.no_grad():
                dist.broadcast(t.data, 0)
        pos = torch.tensor([self.epoch, self.batch, self.step, self.best, self.best_epoch, self.bad_evals,
                            self.decays, self.opt.lr], dtype=torch.float64, device=self.device)
        dist.broadcast(pos, 0)
        v = pos.tolist()
        self.epoch, self.batch, self.step = int(v[0]), int(v[1]), int(v[2])
        self.best, self.best_epoch, self.bad_evals, self.decays, self.opt.lr = v[3], v[4], int(v[5]), int(v[6]), v[7]
        self.topt.lr = self.opt.lr

    @property
    def hogwild_threads(self) -> int:
        """One minibatch at a time (the processes share it)."""
        return 1

    @property
    def writes(self) -> bool:
        """Rank 0 writes the model and checkpoints."""
        return self.rank == 0

    @property
    def engine_note(self) -> str:
        return f" with the torch engine: {self.world} process(es) on {self.device.type}"

    def load_checkpoint(self, path: str) -> bool:
        resumed = super().load_checkpoint(path)
        self._push()
        return resumed

    def _synchronise(self) -> None:
        self._broadcast()
        self.topt.lr = self.opt.lr

    def _barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def _evaluate(self, tag: str) -> float:
        if self.rank == 0:
            self._pull()
            ppl = super()._evaluate(tag)
        else:
            ppl = math.nan
        self._synchronise()
        return ppl

    def save_checkpoint(self) -> None:
        if self.rank == 0:
            self._pull()
            super().save_checkpoint()

    def write_model(self) -> str:
        self._pull()
        return super().write_model()

    # -- the loop -------------------------------------------------------------------------
    def _tensor(self, a: np.ndarray, dtype=None) -> "torch.Tensor":
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, dtype=dtype or torch.long)

    def train_step(self, ctx: np.ndarray, targets: np.ndarray, l2: float) -> float:
        """One update on a global minibatch (this rank trains on its share); returns the
        minibatch's summed loss as this rank estimates it (its share's times W)."""
        noise, mask = self.noise_and_mask(targets)
        b = len(targets)
        lo, hi = b * self.rank // self.world, b * (self.rank + 1) // self.world
        args = [self._tensor(ctx[lo:hi]), self._tensor(targets[lo:hi]),
                (self._tensor(noise.words if self.cfg.shared_noise else noise.words[lo:hi])
                 if noise is not None and noise.words is not None else None),
                self._tensor(noise.classes[lo:hi]) if noise is not None and noise.classes is not None else None,
                self._tensor(mask[lo:hi], torch.float32) if mask is not None else None]
        loss = self.ddp(*args) * self.world
        loss.backward()
        if self.sparse_params:
            reduced = all_reduce_rows([p.grad for p in self.sparse_params], [p.shape for p in self.sparse_params],
                                      self.world)
            for p, g in zip(self.sparse_params, reduced):
                p.grad = g
        self.topt.step(l2)
        return float(loss.detach())

    def _agree(self, flags: List[float]) -> List[float]:
        """The maximum of each flag over all ranks."""
        if self.world == 1:
            return flags
        t = torch.tensor(flags, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

def _quiet(msg: str) -> None:
    pass


def train(cfg: TrainConfig, log: Callable[[str], None] = None) -> TrainResult:
    """Train a model as ``cfg`` says with the torch engine (in this process, or as one rank
    of a ``torchrun`` launch); the outputs are checked before the corpus is read."""
    from nlmfeature.io.atomicfile import check_output

    _check_supported(cfg)
    if cfg.model_out:
        check_output(cfg.model_out, "--model-out")
        check_output(checkpoint_path(cfg.model_out), "checkpoint")
    try:
        return TorchTrainer(cfg, log).run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def torch_words_per_second(corpus_path: str, processes: int = 1, updates: int = 200, threads: int = 1,
                           corpus_dir: str = "", extra_args: Sequence[str] = (), timeout: float = 3600.0,
                           warmup: int = 0) -> float:
    """Training words per second of the torch engine (all processes together) on
    ``corpus_path``, launched as ``torchrun --nproc_per_node processes`` for ``updates``
    minibatches with the ``train`` defaults (LBL 200, NCE, direct features) plus
    ``extra_args`` (``train`` flags); ``threads`` torch threads per process.  The corpus is
    compiled (or reused) before the timed part, which is the minibatch loop only.  With
    ``warmup`` > 0 a second run of ``warmup`` minibatches is timed too and subtracted (words
    and seconds), so that what the first minibatches pay once (on a GPU: CUDA's and the
    libraries' start, memory pools) does not count."""
    import json
    import socket
    import subprocess
    import tempfile

    def timed(n: int) -> Tuple[float, float]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(int(processes)),
                   "--nnodes", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                   "-m", "nlmfeature.cli", "train", "--engine", "torch", "--train", corpus_path,
                   "--model-out", os.path.join(tmp, "bench.nlm"), "--iterations", "1", "--max-updates", str(int(n)),
                   "--threads", str(int(threads)), "--no-resume", "-q", "--json", *extra_args]
            if corpus_dir:
                cmd += ["--corpus-dir", corpus_dir]
            env = dict(os.environ, OMP_NUM_THREADS=str(int(threads)))
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(k, None)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                raise NLMFeatureError(f"torch training benchmark failed ({proc.returncode}): {proc.stderr[-2000:]}")
            r = json.loads(proc.stdout[proc.stdout.index("{"):])
            return float(r["trained_words"]), float(r["train_seconds"])

    words, seconds = timed(updates)
    if 0 < warmup < updates:
        w0, s0 = timed(warmup)
        if seconds > s0:
            words, seconds = words - w0, seconds - s0
    return words / max(1e-9, seconds)


__all__ = ["all_reduce_rows", "torch_words_per_second", "TorchLM", "TorchTrainer", "RowAdaGrad", "direct_indices", "splitmix64", "init_distributed", "train",
           "used_names", "SUPPORTED"]
