"""One rank of a DDP training run for tests/test_torch_engine.py, launched by
``python -m torch.distributed.run --nproc_per_node 2 tests/torch_ddp_worker.py OUT_DIR JSON``:
trains with the torch engine (settings: the JSON object of TrainConfig fields) and saves this
rank's trained arrays to ``OUT_DIR/rank{RANK}.npz`` so the test can compare the ranks.

``... tests/torch_ddp_worker.py OUT_DIR --rows`` instead reduces row-sparse gradients of
unequal lengths (rank 1 touching no row in the second) with ``all_reduce_rows`` and saves
the dense results to ``OUT_DIR/rows{RANK}.npz``."""
import json
import os
import sys

import numpy as np

from nlmfeature.training.torch_engine import TorchTrainer
from nlmfeature.training.trainer import TrainConfig


def rows(out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from nlmfeature.training.torch_engine import all_reduce_rows, init_distributed

    rank, world, _ = init_distributed()
    a = torch.sparse_coo_tensor(torch.tensor([[3, 1, 3] if rank == 0 else [1]]),
                                torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]] if rank == 0 else [[10.0, 20.0]]),
                                (5, 2))
    b = torch.sparse_coo_tensor(torch.tensor([[0, 4]]), torch.tensor([[1.0], [2.0]]), (6, 1)) if rank == 0 else None
    ra, rb = all_reduce_rows([a, b], [(5, 2), (6, 1)], world)
    np.savez(os.path.join(out_dir, f"rows{rank}.npz"), a=ra.to_dense().numpy(), b=rb.to_dense().numpy())
    dist.destroy_process_group()


def main() -> None:
    if sys.argv[2] == "--rows":
        return rows(sys.argv[1])
    out_dir, settings = sys.argv[1], json.loads(sys.argv[2])
    trainer = TorchTrainer(TrainConfig(**settings))
    result = trainer.run()
    np.savez(os.path.join(out_dir, f"rank{trainer.rank}.npz"), **trainer.module.export())
    if trainer.rank == 0:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(dict(result.as_dict(), world=trainer.world), f)


if __name__ == "__main__":
    main()
