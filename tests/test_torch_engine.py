"""The PyTorch training engine on real Brown-corpus slices: the torch module computes the
scorer's function of the model file, DDP ranks end identical and match a one-process run, the
held-out perplexity matches the native trainer's, direct-feature hashing matches the scorer's,
and the CLI refuses what the engine does not train."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_TRAIN, BROWN_VALID
from nlmfeature.core import modelfile
from nlmfeature.training.trainer import TrainConfig, Trainer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="the torch engine needs PyTorch: pip install 'nlmfeature[torch]'")


@pytest.fixture(scope="module", autouse=True)
def _torch_imported():
    """torch (and the engine) are imported when this file's tests run, not when they are
    collected: a pytest-xdist worker that runs none of them does not pay the ~3.5 s import."""
    global torch, TorchLM, TorchTrainer, direct_indices
    import torch
    from nlmfeature.training.torch_engine import TorchLM, TorchTrainer, direct_indices

HERE = os.path.dirname(os.path.abspath(__file__))


def config(tmp_path, name="m.nlm", **kw) -> TrainConfig:
    base = dict(train=BROWN_TRAIN, test_set=BROWN_VALID, model_out=str(tmp_path / name), order=4,
                word_width=16, output="unnormalised", noise_samples=5, iterations=1, minibatch_size=128,
                threads=1, progress=False, seed=3, direct_order=2, patience=0, evals_per_epoch=1,
                corpus_dir=str(tmp_path / "corpora"))
    base.update(kw)
    return TrainConfig(**base)


def quiet(msg: str) -> None:
    pass


def file_module(path: str) -> "tuple":
    """(loaded scorer model, TorchLM built from the same file's header and arrays)."""
    model = nlmfeature.load(path)
    h, a, _ = modelfile.read_model(path)
    est = {"unnormalised": "nce", "softmax": "softmax", "class": "class-ml", "tree": "tree-ml"}[h["output"]["type"]]
    return model, TorchLM(h, a, [], est)


@pytest.mark.parametrize("fields", [
    dict(output="unnormalised", noise_samples=5, direct_order=3),                    # NCE, direct features
    dict(output="softmax", noise_samples=0, direct_order=2, diagonal_contexts=False),  # ML softmax, full LBL
    dict(output="class", classes=12, noise_samples=5, direct_order=2),               # class NCE, class direct
    dict(output="class", classes=12, noise_samples=0, direct_order=0, arch="nplm", hidden=24,
         hidden_layers=[12]),                                                          # class ML, NPLM 2 layers
    dict(output="tree", noise_samples=0, direct_order=0, arch="lateral", hidden=16, branches=2,
         combine="max"),                                                               # tree ML, lateral
    dict(output="unnormalised", noise_samples=0, self_normalise=0.1, direct_order=2, dropout=0.2),
    dict(output="softmax", noise_samples=5, direct_order=2, arch="lateral", hidden=16, branches=3,
         combine="mul"),                                                               # NCE-trained softmax
], ids=["nce", "softmax-full", "class-nce", "class-ml-nplm", "tree-lateral", "selfnorm", "nce-softmax-lateral"])
def test_scorer_equals_torch_module(tmp_path, fields):
    cfg = config(tmp_path, max_updates=6, **fields)
    tr = TorchTrainer(cfg, quiet)
    tr.run()
    tr.write_model()
    model, mod = file_module(cfg.model_out)
    data = tr.heldout
    ctx, words = data.contexts[:400], data.words[:400]
    want = model.score_batch(ctx, words)
    got = mod.log_prob(torch.from_numpy(ctx), torch.from_numpy(words)).numpy()
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # the trained module itself computes the same (its <null> row aside, unused by contexts)
    own = tr.module.log_prob(torch.from_numpy(ctx), torch.from_numpy(words)).numpy()
    np.testing.assert_allclose(own, want, rtol=0, atol=1e-5)
    # training moved the weights away from the initial ones
    init = TorchTrainer(config(tmp_path, name="init.nlm", iterations=0, **fields), quiet)
    assert not np.allclose(init.module.export()["output.bias" if cfg.output != "tree" else "tree.bias"],
                           tr.module.export()["output.bias" if cfg.output != "tree" else "tree.bias"])


def test_direct_hashing_matches_scorer():
    from nlmfeature._scorer import direct_feature_indices

    rng = np.random.default_rng(5)
    ctx = rng.integers(0, 2 ** 31 - 1, size=(300, 6)).astype(np.int32)
    words = rng.integers(0, 2 ** 31 - 1, size=300).astype(np.int32)
    for kind, order, hs in ((0, 4, 1 << 12), (1, 3, 1000003), (0, 7, 6)):
        want = direct_feature_indices(ctx, words, kind, order, hs)
        got = direct_indices(torch.from_numpy(ctx), torch.from_numpy(words)[:, None], kind, order, hs)[:, 0]
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("extra", [dict(direct_order=3), dict(direct_order=0, shared_noise=True, noise_samples=40)],
                         ids=["nce-direct", "shared-noise"])
def test_perplexity_matches_native_trainer(tmp_path, extra):
    """Same data, settings and seed: the torch engine follows the native run (same initial
    model, minibatch order and noise), so its held-out perplexity is the native one's up to
    float rounding (measured: 3e-9 relative after 2 epochs)."""
    kw = dict(iterations=2, lambda_lbl=20.0, word_width=32, **extra)
    native = Trainer(config(tmp_path, name="native.nlm", **kw), quiet).run()
    torch_run = TorchTrainer(config(tmp_path, name="torch.nlm", **kw), quiet).run()
    assert abs(torch_run.best_perplexity / native.best_perplexity - 1) < 1e-3, (torch_run.best_perplexity,
                                                                                 native.best_perplexity)
    assert torch_run.history[-1]["perplexity"] < torch_run.history[0]["perplexity"]


def test_dense_gradients_train_as_sparse_ones(tmp_path):
    """The GPU path (dense gradients, a row updated when its gradient is not zero) trains the
    model the CPU path (sparse gradients) does."""
    kw = dict(output="class", classes=12, noise_samples=5, direct_order=2, max_updates=60, lambda_lbl=20.0)
    sparse = TorchTrainer(config(tmp_path, name="sparse.nlm", **kw), quiet, sparse=True)
    dense = TorchTrainer(config(tmp_path, name="dense.nlm", **kw), quiet, sparse=False)
    assert sparse.module.tables["embeddings"].sparse and not dense.module.tables["embeddings"].sparse
    sparse.run()
    dense.run()
    for n, a in sparse.module.export().items():
        np.testing.assert_allclose(dense.module.export()[n], a, rtol=0, atol=1e-4, err_msg=n)  # rounding


def test_native_checkpoint_resumes_under_torch(tmp_path):
    """The engines share the checkpoint format and position: a native run stopped after 30
    minibatches finishes under torch as the native run would have."""
    kw = dict(minibatch_size=256, output="class", classes=12, noise_samples=5, lambda_lbl=20.0)
    Trainer(config(tmp_path, name="mixed.nlm", max_updates=30, **kw), quiet).run()
    assert os.path.exists(tmp_path / "mixed.nlm.ckpt.npz")
    mixed = TorchTrainer(config(tmp_path, name="mixed.nlm", **kw), quiet).run()
    native = Trainer(config(tmp_path, name="native.nlm", **kw), quiet).run()
    assert mixed.resumed_from and mixed.epochs == native.epochs == 1.0
    assert mixed.best_perplexity == pytest.approx(native.best_perplexity, rel=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_two(tmp_path, *args) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           os.path.join(HERE, "torch_ddp_worker.py"), str(tmp_path), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_all_reduce_rows_two_processes(tmp_path):
    # row-sparse gradients of unequal lengths (one rank with none) reduce to the same mean on both ranks
    _launch_two(tmp_path, "--rows")
    want_a = np.array([[0, 0], [13, 24], [0, 0], [6, 8], [0, 0]], np.float32) / 2
    want_b = np.array([[1], [0], [0], [0], [2], [0]], np.float32) / 2
    for r in (0, 1):
        got = np.load(tmp_path / f"rows{r}.npz")
        np.testing.assert_array_equal(got["a"], want_a)
        np.testing.assert_array_equal(got["b"], want_b)


def test_ddp_two_processes_identical_ranks(tmp_path):
    settings = dict(train=BROWN_TRAIN, test_set=BROWN_VALID, model_out=str(tmp_path / "ddp.nlm"), order=4,
                    word_width=16, output="class", classes=12, noise_samples=5, iterations=1,
                    minibatch_size=128, threads=1, progress=False, seed=3, direct_order=2, patience=0,
                    eval_every=20, max_updates=40, corpus_dir=str(tmp_path / "corpora"))
    _launch_two(tmp_path, json.dumps(settings))
    r0, r1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    assert sorted(r0.files) == sorted(r1.files)
    for n in r0.files:
        np.testing.assert_array_equal(r0[n], r1[n], err_msg=n)
    result = json.load(open(tmp_path / "result.json"))
    assert result["world"] == 2
    # the written model is rank 0's best (held-out) parameters, scored by the scorer as torch does
    model, mod = file_module(settings["model_out"])
    one = TorchTrainer(TrainConfig(**dict(settings, model_out=str(tmp_path / "one.nlm"))), quiet)
    ctx, words = one.heldout.contexts, one.heldout.words
    s = model.score_batch(ctx, words)
    np.testing.assert_allclose(mod.log_prob(torch.from_numpy(ctx), torch.from_numpy(words)).numpy(), s,
                               rtol=0, atol=1e-5)
    ppl = float(np.exp(-s.mean()))
    assert abs(ppl / result["best_perplexity"] - 1) < 1e-4
    # one process with the same settings trains the same model (the global minibatch is split)
    res1 = one.run()
    assert abs(res1.best_perplexity / result["best_perplexity"] - 1) < 2e-3
    for n, a in one.module.export().items():
        np.testing.assert_allclose(a, r0[n], rtol=0, atol=2e-3, err_msg=n)


def test_cli_engine_torch_and_refusals(tmp_path, capsys):
    from nlmfeature.cli import main

    out = tmp_path / "cli.nlm"
    rc = main(["train", "--engine", "torch", "--train", BROWN_TRAIN, "--test-set", BROWN_VALID, "--model-out",
               str(out), "--order", "3", "--word-width", "8", "--iterations", "1", "--max-updates", "3",
               "--corpus-dir", str(tmp_path / "c"), "-q", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["estimator"] == "nce"
    rc = main(["train", "--engine", "torch", "--train", BROWN_TRAIN, "--source", BROWN_TRAIN, "--alignment",
               BROWN_VALID, "--model-out", str(tmp_path / "j.nlm"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "torch engine does not train joint models" in err and "Traceback" not in err


def test_ctrl_c_exits_130_and_resume_equals_uninterrupted(tmp_path):
    import signal
    import time

    kw = dict(iterations=1, output="class", classes=12, noise_samples=5, evals_per_epoch=2, word_width=16,
              minibatch_size=32)   # small minibatches: an epoch of several seconds, so the signal lands in it
    cfg = config(tmp_path, name="int.nlm", **kw)
    cmd = [sys.executable, "-m", "nlmfeature.cli", "train", "--engine", "torch", "--train", cfg.train, "--test-set",
           cfg.test_set, "--model-out", cfg.model_out, "--order", "4", "--word-width", "16", "--output", "class",
           "--classes", "12", "-k", "5", "--iterations", "1", "--minibatch-size", "32", "--threads", "1",
           "--seed", "3", "--direct-order", "2", "--patience", "0", "--evals-per-epoch", "2", "--corpus-dir",
           cfg.corpus_dir, "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    line = ""
    while "training class-nce" not in line:
        line = proc.stderr.readline()
        assert line, "the run ended before training"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err[-2000:]
    assert os.path.exists(cfg.model_out + ".ckpt.npz") and "Traceback" not in err
    resumed = TorchTrainer(cfg, quiet)
    res = resumed.run()
    assert res.resumed_from and res.epochs == 1.0
    whole = TorchTrainer(config(tmp_path, name="whole.nlm", **kw), quiet)
    res2 = whole.run()
    assert res.best_perplexity == pytest.approx(res2.best_perplexity, rel=1e-6)
    for n, a in whole.module.export().items():
        np.testing.assert_allclose(resumed.module.export()[n], a, rtol=0, atol=1e-6, err_msg=n)
