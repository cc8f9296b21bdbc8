"""``python -m hypersolid_scale.data.formats [--list]``: the installed storage formats (data.format),
one a line, with what each is."""

import sys

from hypersolid_scale.data.formats import FORMATS

sys.exit(FORMATS.print_names())
