"""Hypersolid pre-training from a checkout (the same as ``torchrun -m hypersolid_scale.train``):

    torchrun --nproc_per_node=2 launch/train.py --config configs/quickstart.yaml optim.lr=3e-4

Everything lives in hypersolid_scale/train.py (exit codes, signals, the launcher's death)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hypersolid_scale.safety.process_exit import exit_process  # stdlib only
from hypersolid_scale.train import main  # stdlib only until main() runs: see its docstring

if __name__ == "__main__":
    exit_process(main())
