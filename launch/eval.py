"""Evaluate a checkpoint: ``python launch/eval.py --checkpoint PATH [--suite ...] [data.key=value ...]``.

Under ``torchrun --nproc_per_node=N`` the embedding extraction is sharded over the N processes.
Everything else lives in ``hypersolid_scale.eval.cli``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hypersolid_scale.eval.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
