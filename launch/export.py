"""Export a checkpoint's encoder for torchvision / timm: ``python launch/export.py --checkpoint CK --out DIR``.

Everything lives in ``hypersolid_scale.export`` (the same as ``python -m hypersolid_scale.export``). A bad input
is one ``error:`` line and exit 2 (``HS_DEBUG=1`` shows the traceback).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hypersolid_scale.export.cli import cli

if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
