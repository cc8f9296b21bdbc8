"""``python -m hypersolid_scale.models.backbones [--list]``: the installed backbones (model.arch),
one a line, with what each is."""

import sys

from hypersolid_scale.models.backbones import BACKBONES

sys.exit(BACKBONES.print_names())
