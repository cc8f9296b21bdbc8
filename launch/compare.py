"""Compare Hypersolid with SimCLR, VICReg, Barlow Twins, BYOL, DINO and SwaV at a matched budget:
``python launch/compare.py [--quick] [--setting quickstart] [--steps 300] [--seeds 3] [key=value ...]``.

Everything lives in ``hypersolid_scale.compare.app``. A bad input is one ``error:`` line and exit 2
(``HS_DEBUG=1`` shows the traceback); exit 1 means some training or evaluation failed (named at the end).
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from hypersolid_scale.compare.app import main  # noqa: E402
from hypersolid_scale.safety.errors import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(lambda argv: main(argv, REPO), sys.argv[1:]))
