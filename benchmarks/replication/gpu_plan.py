"""The replication study's gpu group (plan.py's docstring says what each part is), for the lent GPU machine."""

from __future__ import annotations

from benchmarks.replication.runspec import CONFIGS, HYPERSOLID, Run

CURVE_SEEDS = {"hypersolid": 3, "simclr": 3, "swav": 2, "barlowtwins": 2}
CURVE_EPOCHS = 20
SHORT_EPOCHS = 5  # parts (b)-(e), and the curve epoch that is evaluated with the full protocol
# Default --scale of the gpu group. Full size (345 epochs, 237 evaluations) would take ~20 min on one
# H100/H200 by the estimate in run.py's docstring; 330 s fit ~80 epochs and ~80 evaluations with 12 processes
# at once. Cutting only (b)-(e) is not enough (the curves alone are 200 epochs and 200 evaluations), so the
# curves shrink too, keeping the 1 : 4 ratio that reads the short runs' numbers off the curves: 5-epoch
# curves, 1-epoch sweeps, every seed and sweep value kept. The budget check skips the tail ((e), then (d))
# if the card is slower than estimated; a second call resumes them.
GPU_SCALE = 0.25

# (b) three values around each method's quickstart default.
TUNE = {
    "hypersolid": ("method.hypersolid.alpha", (0.8, 0.9, 0.95)),
    "simclr": ("method.simclr.temperature", (0.1, 0.2, 0.5)),
    "swav": ("method.swav.temperature", (0.05, 0.1, 0.2)),
    "barlowtwins": ("optim.lr", (5e-4, 1e-3, 2e-3)),  # 1e-3 x {0.5, 1, 2}
}
ALPHAS = (0.5, 0.7, 0.8, 0.9, 0.95)
# lambda of the L2 term lambda * (mean ||z|| - 1)^2. At ||z|| ~ 13 its gradient on one row's norm is
# 2 * lambda * 12 / M, against the alignment's ~ sin(theta) / (||z|| M) ~ 0.03 / M once the views agree
# (alignment ~ 0.08). lambda = 1e-6 is 1e4 times too small to move the norm in 5 epochs; 1e-2 gives
# 0.24 / M, enough to pull the norm down within the run and comparable to alignment (0.02 / M) near ||z|| ~ 2.
LAMBDAS = (1e-6, 1e-2)
NEIGHBOR_K = 32  # candidates per row, 24 x fewer than the 768 rows of a 128-image, 6-view batch
BATCHES = (128, 512, 2048)


def _scaled(epochs: int, scale: float) -> int:
    return max(1, round(epochs * scale))


def gpu_runs(scale: float) -> list[Run]:
    long_, short = _scaled(CURVE_EPOCHS, scale), _scaled(SHORT_EPOCHS, scale)
    runs = [
        Run(f"curve-{m}-s{s}", m, CONFIGS[m], (), s, "gpu", "curve", long_, curve=True)
        for s in range(max(CURVE_SEEDS.values()))
        for m in CONFIGS
        if s < CURVE_SEEDS[m]
    ]
    for m, (key, values) in TUNE.items():
        runs += [
            Run(
                f"tune-{m}-{key.rsplit('.', 1)[1]}{v:g}",
                m,
                CONFIGS[m],
                (f"{key}={v}", "data.eval_split=holdout"),
                0,
                "gpu",
                "tune",
                short,
            )
            for v in values
        ]
    runs += [
        Run(
            f"alpha-a{a:g}-l{lam:g}",
            "hypersolid",
            HYPERSOLID,
            (f"method.hypersolid.alpha={a}", f"method.hypersolid.norm_weight={lam}"),
            0,
            "gpu",
            "alpha",
            short,
        )
        for lam in LAMBDAS
        for a in ALPHAS
    ]
    backends = {
        "dense": (),
        "neighbors": ("method.hypersolid.backend=neighbors", f"method.hypersolid.neighbors.k={NEIGHBOR_K}"),
    }
    runs += [
        Run(f"backend-{b}-s{s}", "hypersolid", HYPERSOLID, ov, s, "gpu", "backend", short)
        for s in range(2)
        for b, ov in backends.items()
    ]
    sqrt = ("optim.lr_scaling=sqrt", "optim.reference_batch_size=128")
    runs += [
        Run(f"batch-{b}", "hypersolid", HYPERSOLID, (f"data.global_batch_size={b}", *sqrt), 0, "gpu", "batch", short)
        for b in BATCHES
    ]
    return runs
