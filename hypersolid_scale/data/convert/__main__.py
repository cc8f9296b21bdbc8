"""``python -m hypersolid_scale.data.convert``: the converter's command line (convert/cli.py)."""

import sys

from hypersolid_scale.data.convert.cli import main
from hypersolid_scale.safety.errors import run_cli

sys.exit(run_cli(main, sys.argv[1:]))
