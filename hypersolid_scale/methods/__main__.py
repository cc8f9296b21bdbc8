"""``python -m hypersolid_scale.methods [--list]``: the installed methods, one a line, with what each is."""

import sys

from hypersolid_scale.methods.registry import METHODS

sys.exit(METHODS.print_names())
