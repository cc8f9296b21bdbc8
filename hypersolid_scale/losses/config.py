"""Typed configuration of the Hypersolid objective (the ``method.hypersolid`` section of the run config)."""

from __future__ import annotations

from dataclasses import dataclass

from hypersolid_scale.losses.backends import backend_names, get_backend

SECTION = "method.hypersolid"  # where these keys live in the run config, as error messages name them
POOLINGS = ("max", "mean")
REPEL_MODES = ("all", "negatives", "positives")
# flat: exact (FAISS IndexFlatIP on CPU, the torch blockwise top-k on CUDA); torch: the torch top-k on any device;
# ivf / hnsw: approximate FAISS indexes (ivf runs on the GPU when faiss-gpu is installed).
INDEXES = ("flat", "ivf", "hnsw", "torch")
EXACT_INDEXES = ("flat", "torch")
# off: columns exchanged and compared in the input's precision; bf16: exchanged and screened in bfloat16, every
# pair the proven rounding bound cannot decide recomputed in full precision (exact; docs/design.md §2, screening).
SCREENS = ("off", "bf16")
AUTO_BY = ("fraction", "time")
# The IVF quantizer's life in calls: kept for 100 calls, a search on 24,576 rows took 0.57x the time of one
# that trains it, its recall 0.919 against 0.937 (benchmarks/ivf_reuse.py, docs/design.md §2 neighbors).
IVF_RETRAIN_EVERY = 100


@dataclass
class LossConfig:
    """Hyperparameters of :class:`~hypersolid_scale.losses.HypersolidLoss`.

    Defaults are the paper's (alpha 0.9, lambda 1e-6, max-pooled targets, repulsion over all pairs).
    """

    alpha: float = 0.9  # exclusion threshold on cosine similarity
    norm_weight: float = 1e-6  # lambda of the L2 normalization term; 0 disables it
    pooling: str = "max"  # target per image: "max" (paper) | "mean" (ablation)
    repel: str = "all"  # which pairs are repelled: "all" (paper) | "negatives" | "positives"
    # a registered backend (losses/backends/): "dense" (reference) | "tiled" (exact, bounded memory) |
    # "neighbors" (candidate search) | "auto" (tiled or neighbors per step, from the previous step's
    # saturated-row fraction; docs/design.md §3c) | "ring" (tiled, rows passed round the ranks; §3f)
    backend: str = "dense"
    tile_size: int = 4096  # tiled, ring, and the torch search: rows/columns per block
    screen: str = "off"  # tiled, ring: "off" | "bf16" (columns sent and screened in bf16, decisions exact; §2)
    index: str = "flat"  # neighbors: "flat" | "torch" (exact) | "ivf" | "hnsw" (approximate)
    k: int = 64  # neighbors: candidates searched per row
    nprobe: int = 16  # neighbors/ivf: inverted lists visited per query
    ef_search: int = 64  # neighbors/hnsw: search breadth
    recall_every: int = 100  # neighbors: measure recall against exact search every N calls (0: never)
    # neighbors/ivf on the host: train the coarse quantizer every N calls and keep it between them (1: every call)
    ivf_retrain_every: int = IVF_RETRAIN_EVERY
    auto_to_neighbors: float = 0.05  # auto: switch tiled -> neighbors when the saturated fraction drops below
    auto_to_tiled: float = 0.20  # auto: switch neighbors -> tiled when the saturated fraction rises above
    # auto: "fraction" (the saturated fraction against the two thresholds above) | "time" (the side that costs less,
    # both timed at the first call and every auto_time_every calls; docs/design.md §3c)
    auto_by: str = "fraction"
    auto_time_every: int = 200  # auto_by=time: calls between two timings (each costs four extra repulsions)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field and what it accepts."""
        if not -1.0 < float(self.alpha) < 1.0:
            raise ValueError(f"{SECTION}.alpha must be in the open interval (-1, 1), got {self.alpha}")
        if self.norm_weight < 0:
            raise ValueError(f"{SECTION}.norm_weight must be >= 0, got {self.norm_weight}")
        for name, value, allowed in (
            ("pooling", self.pooling, POOLINGS),
            ("repel", self.repel, REPEL_MODES),
            ("backend", self.backend, backend_names()),
            ("index", self.index, INDEXES),
            ("screen", self.screen, SCREENS),
            ("auto_by", self.auto_by, AUTO_BY),
        ):
            if value not in allowed:
                raise ValueError(f"{SECTION}.{name}={value!r} is not valid; choose one of {', '.join(allowed)}")
        for name in ("tile_size", "k", "nprobe", "ef_search", "ivf_retrain_every", "auto_time_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{SECTION}.{name} must be a positive integer, got {getattr(self, name)}")
        if self.recall_every < 0:
            raise ValueError(f"{SECTION}.recall_every must be >= 0 (0 disables), got {self.recall_every}")
        if not 0.0 <= self.auto_to_neighbors < self.auto_to_tiled <= 1.0:
            raise ValueError(
                f"{SECTION}.auto_to_neighbors={self.auto_to_neighbors} and "
                f"{SECTION}.auto_to_tiled={self.auto_to_tiled} must satisfy 0 <= auto_to_neighbors < "
                "auto_to_tiled <= 1 (the gap between them is the hysteresis)"
            )
        if self.screen != "off" and not get_backend(self.backend).screens:
            offer = [name for name in backend_names() if get_backend(name).screens]
            raise ValueError(
                f"{SECTION}.screen={self.screen!r} needs a backend that screens its columns "
                f"({', '.join(offer)}), not {SECTION}.backend={self.backend!r}; set {SECTION}.screen=off or "
                f"{SECTION}.backend={offer[0]}"
            )
        get_backend(self.backend).check_config(self)  # what only this backend requires
