"""Hypersolid pre-training entry point (thin: everything lives in hypersolid_scale.train).

    torchrun --nproc_per_node=2 launch/train.py --config configs/quickstart.yaml optim.lr=3e-4
    srun python launch/train.py --config configs/cifar100.yaml      # one task per GPU

Exit code 75 means "preempted, checkpoint written, requeue me"; 0 means finished.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hypersolid_scale.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
