"""Settings of the evaluation suite (offline ``launch/eval.py`` and the trainer's online kNN monitor).

The defaults follow the paper's protocol ("Evaluation Metrics", "Clustering"): cosine kNN with K per
dataset (5 for CIFAR/STL-10, 20 for ImageNet-100, 200 for ImageNet-1k), a logistic-regression probe on
frozen backbone features, and clustering of the whole evaluation split: K-Means with k = number of
classes, DBSCAN with the cosine metric swept over eps in [0, 0.5], and HDBSCAN (cosine distance; the
paper does not state its parameters: min_cluster_size=10, min_samples = min_cluster_size, the ``hdbscan``
package's default when unset, excess-of-mass selection).

The ``qualitative`` suite renders the paper's "Qualitative Analysis" figures for a few evaluation images;
its feature inversion optimises images through the network, so it is slow and runs only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypersolid_scale.safety.errors import ConfigError

# Suites computed on the cached embeddings of the train and test splits.
FEATURE_SUITES: tuple[str, ...] = ("knn", "linear", "cluster", "geometry", "plots")
# Diagnostics on the same features, run only when named (eval/hdbscan_grid.py: HDBSCAN over its settings).
DIAGNOSTIC_SUITES: tuple[str, ...] = ("hdbscan_grid",)
# Suites that run the model itself on a few images.
IMAGE_SUITES: tuple[str, ...] = ("qualitative",)
SUITES: tuple[str, ...] = FEATURE_SUITES + DIAGNOSTIC_SUITES + IMAGE_SUITES
# The suites that need the train and test features.
EMBEDDING_SUITES: tuple[str, ...] = FEATURE_SUITES + DIAGNOSTIC_SUITES
# What runs without --suite / eval.suites: every feature suite (the image suites are slow).
DEFAULT_SUITES: tuple[str, ...] = FEATURE_SUITES
FEATURES: tuple[str, ...] = ("backbone", "projector")
LINEAR_OPTIMIZERS: tuple[str, ...] = ("lbfgs", "adam")
EPS_MODES: tuple[str, ...] = ("fixed", "adaptive")


def _default_eps() -> list[float]:
    # The paper's figure: eps from 0 to 0.5; its step is not stated (marks every 20 rows at 0.1 spacing
    # suggest 0.005). 101 values cost little: the whole sweep reads one spanning forest (eval/density.py).
    return [round(0.005 * i, 6) for i in range(101)]


def _default_quantiles() -> list[float]:
    # Fractions of core points from 5 % to 95 %: from mostly noise to (nearly) everything clustered.
    return [round(0.05 * i, 2) for i in range(1, 20)]


@dataclass
class EvalConfig:
    """Evaluation settings; every field can be overridden as ``eval.<field>=<value>``.

    Pair-based geometry metrics run on at most ``max_pairs`` pairs drawn with ``seed``. Clustering runs
    on the whole test split (the paper's protocol) without an (n, n) matrix; ``cluster_max_samples`` /
    ``hdbscan_max_samples`` can still cap it for quick looks.
    """

    suites: list[str] = field(default_factory=lambda: list(DEFAULT_SUITES))
    features: str = "backbone"  # the paper's metrics are on backbone features
    batch_size: int = 256  # images per forward pass during extraction
    num_workers: int = 2
    cache_dir: str | None = None  # default: <run_dir>/eval_cache
    seed: int = 0
    # Offline evaluation on a seeded random subset of each split (quick looks, CI); None = the whole split.
    max_train_samples: int | None = None
    max_test_samples: int | None = None
    # kNN (also used by the trainer's online monitor)
    knn_k: list[int] = field(default_factory=lambda: [5, 20])  # paper: 200 for ImageNet-1k/Food-101
    knn_temperature: float = 0.07  # weighted vote: exp(cos / T)
    every_n_epochs: int = 1  # online kNN monitor period; 0 disables it
    monitor_max_samples: int = 10000  # per split (train, test) the online monitor embeds; was monitor_max_train
    # linear probe
    linear_optimizer: str = "lbfgs"
    linear_weight_decays: list[float] = field(default_factory=lambda: [1e-6, 1e-5, 1e-4, 1e-3, 1e-2])
    linear_val_fraction: float = 0.1  # held out of train to pick the weight decay
    linear_max_iter: int = 200  # L-BFGS iterations, or Adam epochs
    # clustering
    kmeans_k: int | None = None  # default: number of classes
    kmeans_niter: int = 50
    # "fixed": the eps values of dbscan_eps (default: the paper's grid). "adaptive": the eps at which the
    # fractions dbscan_eps_quantiles of the points are core points (quantiles of the distance to the
    # (dbscan_min_samples - 1)-th neighbour), informative for any checkpoint's distance scale.
    dbscan_eps_mode: str = "fixed"
    dbscan_eps: list[float] = field(default_factory=_default_eps)
    dbscan_eps_quantiles: list[float] = field(default_factory=_default_quantiles)
    dbscan_min_samples: int = 5  # scikit-learn's convention: the point itself counts
    # Budget of the symmetric eps-neighbourhood matrix that DBSCAN and HDBSCAN share (12 bytes an entry while
    # built); eps values past it are skipped with a warning. Near-collapsed embeddings put every pair within
    # eps=0.5: 10k samples would be 100M entries.
    dbscan_max_edges: int = 20_000_000
    hdbscan_min_cluster_size: int = 10
    hdbscan_min_samples: int | None = None  # None: hdbscan_min_cluster_size (the hdbscan package's default)
    hdbscan_max_samples: int | None = None  # None: the whole split
    cluster_max_samples: int | None = None  # None: the whole split (the paper's protocol)
    # The hdbscan_grid suite: min_cluster_size values and class-balanced subsample sizes (images per class; 50:
    # the paper's ImageNet-1k validation split)
    hdbscan_grid_sizes: list[int] = field(default_factory=lambda: [5, 10, 25, 50, 100])
    hdbscan_grid_per_class: list[int] = field(default_factory=lambda: [50, 200])
    # geometry and plots
    max_pairs: int = 2_000_000
    selectivity_z: float = 1.0
    interp_pairs: int = 200
    interp_steps: int = 21
    # qualitative suite: how many test images (a seeded random draw) and the feature-inversion steps per
    # image (None: the renderer's default)
    qualitative_images: int = 8
    qualitative_inversion_steps: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ConfigError`` (a ``ValueError``) naming the bad field and what it accepts."""
        bad = [s for s in self.suites if s not in SUITES]
        if bad:
            raise ConfigError(f"eval.suites has unknown entries {bad}; choose among {list(SUITES)}")
        if self.features not in FEATURES:
            raise ConfigError(f"eval.features={self.features!r} is unknown; choose one of {list(FEATURES)}")
        if self.linear_optimizer not in LINEAR_OPTIMIZERS:
            raise ConfigError(
                f"eval.linear_optimizer={self.linear_optimizer!r} is unknown; choose one of {list(LINEAR_OPTIMIZERS)}"
            )
        if not self.knn_k or any(int(k) < 1 for k in self.knn_k):
            raise ConfigError(f"eval.knn_k={list(self.knn_k)} must be a non-empty list of integers >= 1")
        if self.knn_temperature <= 0:
            raise ConfigError(f"eval.knn_temperature={self.knn_temperature} must be > 0")
        if not self.linear_weight_decays or any(w < 0 for w in self.linear_weight_decays):
            raise ConfigError("eval.linear_weight_decays must be a non-empty list of values >= 0")
        if not 0.0 < self.linear_val_fraction < 1.0:
            raise ConfigError(f"eval.linear_val_fraction={self.linear_val_fraction} must be in (0, 1)")
        if not self.dbscan_eps or any(not 0.0 <= e <= 2.0 for e in self.dbscan_eps):
            raise ConfigError("eval.dbscan_eps must be a non-empty list of cosine distances in [0, 2]")
        if self.dbscan_eps_mode not in EPS_MODES:
            raise ConfigError(
                f"eval.dbscan_eps_mode={self.dbscan_eps_mode!r} is unknown; choose one of {list(EPS_MODES)}"
            )
        if not self.dbscan_eps_quantiles or any(not 0.0 < q < 1.0 for q in self.dbscan_eps_quantiles):
            raise ConfigError("eval.dbscan_eps_quantiles must be a non-empty list of fractions in (0, 1)")
        for name in ("hdbscan_grid_sizes", "hdbscan_grid_per_class"):
            values = getattr(self, name)
            if not values or any(int(v) < 2 for v in values):
                raise ConfigError(f"eval.{name}={list(values)} must be a non-empty list of integers >= 2")
        if self.kmeans_k is not None and self.kmeans_k < 2:
            raise ConfigError(f"eval.kmeans_k={self.kmeans_k} must be >= 2 (or null for #classes)")
        for name in (
            "batch_size",
            "dbscan_min_samples",
            "hdbscan_min_cluster_size",
            "max_pairs",
            "interp_pairs",
            "kmeans_niter",
            "linear_max_iter",
            "monitor_max_samples",
            "dbscan_max_edges",
            "qualitative_images",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"eval.{name}={getattr(self, name)} must be >= 1")
        if self.hdbscan_min_samples is not None and self.hdbscan_min_samples < 1:
            raise ConfigError(f"eval.hdbscan_min_samples={self.hdbscan_min_samples} must be >= 1 (or null)")
        for name in ("max_train_samples", "max_test_samples", "cluster_max_samples", "hdbscan_max_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"eval.{name}={getattr(self, name)} must be >= 1 (or null for the whole split)")
        if self.qualitative_inversion_steps is not None and self.qualitative_inversion_steps < 1:
            raise ConfigError(
                f"eval.qualitative_inversion_steps={self.qualitative_inversion_steps} must be >= 1 "
                "(or null for the renderer's default)"
            )
        if self.interp_steps < 3:
            raise ConfigError(f"eval.interp_steps={self.interp_steps} must be >= 3")
        if self.every_n_epochs < 0 or self.num_workers < 0:
            raise ConfigError("eval.every_n_epochs and eval.num_workers must be >= 0")
