"""Several trainings one after another in one process group, through the trainer's own ``main``.

    torchrun --standalone --nproc_per_node=2 tests/_runs_worker.py '[["--config", "c.yaml", "a=b", ...], ...]'

Each run writes the trained module's initial state (after the engine is built, before the first step) to
``<run_dir>/initial.pt``, so that a test can measure the update (final - initial). The process group lives
across the runs (the trainer's ``cleanup`` is left to the end): one torchrun start pays the imports and the
rendezvous once for all of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from hypersolid_scale.distributed import cleanup
from hypersolid_scale.training import trainer


def _saving_initial_state(train_loop: Any) -> Any:
    def train_loop_after_saving(run: Any, tracker: Any, step: int, epoch: int, *, resumed: bool) -> int:
        if run.info.rank == 0:
            state = run.engine.model.state_dict()
            initial = {k: v.detach().cpu().clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
            torch.save(initial, Path(run.cfg.run_dir) / "initial.pt")
        return train_loop(run, tracker, step, epoch, resumed=resumed)

    return train_loop_after_saving


def main(runs: list[list[str]]) -> int:
    trainer.train_loop = _saving_initial_state(trainer.train_loop)
    trainer.cleanup = lambda: None  # type: ignore[attr-defined]  # one process group for every run
    try:
        for argv in runs:
            code = trainer.main(argv)
            if code != 0:
                return code
    finally:
        cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
