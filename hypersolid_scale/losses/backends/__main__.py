"""``python -m hypersolid_scale.losses.backends [--list]``: the installed repulsion backends
(method.hypersolid.backend), one a line, with what each is."""

import sys

from hypersolid_scale.losses.backends import BACKENDS

sys.exit(BACKENDS.print_names())
