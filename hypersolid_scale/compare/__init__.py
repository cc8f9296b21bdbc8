"""Every method through the same trainer at a matched budget, several seeds each, the same evaluation; one
table and two figures (``launch/compare.py``, ``hypersolid_scale.compare.app``).

- ``plan``: which trainings (method x seed), their configs, and the matched budget (same images seen).
- ``study``: each training and evaluation as the user's own commands, run by the study engine
  (``hypersolid_scale.study``) in child processes; resumable.
- ``table``: mean ± std over seeds of the evaluation's metrics, as JSON and Markdown.
- ``figures``: DBSCAN NMI against eps per method; a bar chart of the main metrics.
"""

from hypersolid_scale.safety.extras import require

require("train", "hypersolid_scale.compare")  # a missing extra: one line naming it
