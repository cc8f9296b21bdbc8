"""Evaluation of learned representations: kNN, linear probe, clustering, latent geometry, plots.

Each part is a plain function over an (n, d) feature matrix and its labels; the evaluation application
(``hypersolid_scale.eval.app.main``, behind ``launch/eval.py``) loads a checkpoint, embeds the train and test
splits and runs the chosen suites
(``suites.run_suites``: a metric that cannot run on the data raises ``NotApplicable`` and is reported
as skipped).
The trainer's online monitor uses ``extract_embeddings`` and ``knn_accuracy``.
"""

from hypersolid_scale.safety.extras import require

require("eval", "hypersolid_scale.eval")  # a missing extra: one line naming it

from hypersolid_scale.eval.clustering import dbscan_sweep, hdbscan_cluster, kmeans  # noqa: E402
from hypersolid_scale.eval.config import EvalConfig  # noqa: E402
from hypersolid_scale.eval.embed import cached_embeddings, extract_embeddings  # noqa: E402
from hypersolid_scale.eval.geometry import geometry_metrics  # noqa: E402
from hypersolid_scale.eval.knn import knn_accuracy, knn_predict  # noqa: E402
from hypersolid_scale.eval.linear import linear_probe  # noqa: E402
from hypersolid_scale.eval.neighborhood import interpolation_profile  # noqa: E402
from hypersolid_scale.eval.skips import NotApplicable  # noqa: E402

__all__ = [
    "EvalConfig",
    "NotApplicable",
    "cached_embeddings",
    "dbscan_sweep",
    "extract_embeddings",
    "geometry_metrics",
    "hdbscan_cluster",
    "interpolation_profile",
    "kmeans",
    "knn_accuracy",
    "knn_predict",
    "linear_probe",
]
