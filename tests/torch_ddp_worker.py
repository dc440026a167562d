"""One rank of a DDP training run for tests/test_torch_engine.py, launched by
``python -m torch.distributed.run --nproc_per_node 2 tests/torch_ddp_worker.py OUT_DIR JSON``:
trains with the torch engine (settings: the JSON object of TrainConfig fields) and saves this
rank's trained arrays to ``OUT_DIR/rank{RANK}.npz`` so the test can compare the ranks."""
import json
import os
import sys

import numpy as np

from nlmfeature.training.torch_engine import TorchTrainer
from nlmfeature.training.trainer import TrainConfig


def main() -> None:
    out_dir, settings = sys.argv[1], json.loads(sys.argv[2])
    trainer = TorchTrainer(TrainConfig(**settings))
    result = trainer.run()
    np.savez(os.path.join(out_dir, f"rank{trainer.rank}.npz"), **trainer.module.export())
    if trainer.rank == 0:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(dict(result.as_dict(), world=trainer.world), f)


if __name__ == "__main__":
    main()
