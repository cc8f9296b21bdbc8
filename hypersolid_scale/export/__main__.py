"""``python -m hypersolid_scale.export --checkpoint CK --out DIR``: see :mod:`hypersolid_scale.export.cli`."""

import sys

from hypersolid_scale.export.cli import cli

sys.exit(cli(sys.argv[1:]))
