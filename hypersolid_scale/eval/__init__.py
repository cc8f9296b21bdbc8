"""Evaluation of learned representations: kNN, linear probe, clustering, latent geometry, plots.

Each part is a plain function over an (n, d) feature matrix and its labels; the evaluation application
(``hypersolid_scale.eval.app.main``, behind ``launch/eval.py``) loads a checkpoint, embeds the train and test
splits and runs the chosen suites
(``suites.run_suites``: a metric that cannot run on the data raises ``NotApplicable`` and is reported
as skipped).
The trainer's online monitor uses ``extract_embeddings`` and ``knn_accuracy``.
"""

import importlib
from typing import TYPE_CHECKING

from hypersolid_scale.safety.extras import require

require("eval", "hypersolid_scale.eval")  # a missing extra: one line naming it

# name -> the module that defines it, imported on first use (PEP 562): the config schema imports
# ``eval.config`` through this package, and a training that never clusters should not import scikit-learn,
# SciPy and HDBSCAN (~1 s of every command's start; FAISS stays: the online kNN monitor uses it).
_SOURCES = {
    "EvalConfig": "config",
    "NotApplicable": "skips",
    "cached_embeddings": "embed",
    "dbscan_sweep": "clustering",
    "extract_embeddings": "embed",
    "geometry_metrics": "geometry",
    "hdbscan_cluster": "clustering",
    "interpolation_profile": "neighborhood",
    "kmeans": "clustering",
    "knn_accuracy": "knn",
    "knn_predict": "knn",
    "linear_probe": "linear",
}

if TYPE_CHECKING:  # the names as the type checker sees them
    from hypersolid_scale.eval.clustering import dbscan_sweep, hdbscan_cluster, kmeans
    from hypersolid_scale.eval.config import EvalConfig
    from hypersolid_scale.eval.embed import cached_embeddings, extract_embeddings
    from hypersolid_scale.eval.geometry import geometry_metrics
    from hypersolid_scale.eval.knn import knn_accuracy, knn_predict
    from hypersolid_scale.eval.linear import linear_probe
    from hypersolid_scale.eval.neighborhood import interpolation_profile
    from hypersolid_scale.eval.skips import NotApplicable

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


def __getattr__(name: str) -> object:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
