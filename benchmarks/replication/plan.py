"""The replication study's runs as data (Fashion-MNIST, the quickstart CNN): ``plan(group, scale, quick)``.

    python benchmarks/replication/plan.py --group gpu [--scale 0.5]     # list the runs and their epochs

Groups:
* ``cpu``: one epoch of each method's defaults; Hypersolid and SimCLR seeds 0-4, SwaV and Barlow Twins
  seeds 0-2. The same seed gives the same initialisation and batch order (the loader's permutation depends
  only on (seed, epoch)), so methods are compared pairwise by seed. Last, Hypersolid's seed 0 once more,
  evaluated every 100 steps (part ``steps``): the exclusion zone and the clustering over the epoch.
* ``gpu``: (a) ``curve``: 20-epoch learning curves of the 4 methods, every epoch evaluated (the 5-epoch
  numbers are read off these curves); (b) ``tune``: equal tuning budgets, 3 values of each method's main
  knob, judged on a held-out slice of the training split, never on the test split; (c) ``alpha``: the
  exclusion threshold with the paper's lambda and with an effective L2 weight; (d) ``backend``: neighbors
  (k << batch) against the exact dense repulsion; (e) ``batch``: global batch 128 / 512 / 2048 with
  square-root learning-rate scaling from 128.

``scale`` multiplies every gpu run's epochs (at least 1), the one knob that shrinks the group to the
device budget without dropping a comparison; the seeds and sweep values stay.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

HYPERSOLID = "configs/quickstart.yaml"
CONFIGS = {
    "hypersolid": HYPERSOLID,
    "simclr": "configs/baselines/simclr_quickstart.yaml",
    "swav": "configs/baselines/swav_quickstart.yaml",
    "barlowtwins": "configs/baselines/barlowtwins_quickstart.yaml",
}
CPU_SEEDS = {"hypersolid": 5, "simclr": 5, "swav": 3, "barlowtwins": 3}
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

# Every run: no tracking server, no per-step bar, no online kNN monitor (the driver evaluates the saved
# checkpoints offline), the full epochs (the quickstart's max_steps=600 cap off).
COMMON = ("tracking.enabled=false", "progress=false", "eval.every_n_epochs=0", "max_steps=0")
# Quick: tiny data, batch and network so that a run trains and evaluates in seconds on a CPU (4 steps);
# a step checkpoint halfway through the epoch lets tests stop and resume a run mid-way.
QUICK = (
    "data.max_train_samples=128",
    "data.global_batch_size=32",
    "checkpoint.every_n_steps=2",
    "model.small_cnn_width=8",
)
QUICK_HEADS = {
    "hypersolid": ("model.proj_hidden_dim=64", "model.proj_dim=64"),
    "simclr": ("method.simclr.hidden_dim=64",),
    "swav": ("method.swav.hidden_dim=64", "method.swav.n_prototypes=30"),
    "barlowtwins": ("method.barlowtwins.hidden_dim=64", "method.barlowtwins.out_dim=64"),
}
QUICK_EVAL = ("eval.max_train_samples=256", "eval.max_test_samples=128")


@dataclass(frozen=True)
class Run:
    name: str
    method: str
    config: str
    overrides: tuple[str, ...]  # the study's own settings (what the run varies), without COMMON
    seed: int
    group: str
    part: str
    epochs: int
    curve: bool = False  # evaluate every epoch's checkpoint, not only the final one
    # > 0: evaluate (full protocol) the checkpoint at every multiple of this step and the last one: the
    # exclusion-zone diagnostic and the clustering over training within an epoch.
    eval_every_steps: int = 0

    def train_overrides(self, device: str, quick: bool) -> list[str]:
        """Everything after ``--config``: the study's settings, then what the driver needs to run it."""
        ckpt = (
            # Curves keep every epoch's checkpoint for evaluation; the gpu group's runs are short enough
            # to restart an epoch, the cpu group's (5 min/epoch here) save every 100 steps to resume.
            ["checkpoint.keep_last=0", "checkpoint.every_n_steps=0"]
            if self.curve
            else ["checkpoint.keep_last=0", f"checkpoint.every_n_steps={self.eval_every_steps}"]
            if self.eval_every_steps
            else ["checkpoint.keep_last=2", f"checkpoint.every_n_steps={100 if self.group == 'cpu' else 0}"]
        )
        return [
            *self.overrides,
            f"seed={self.seed}",
            f"epochs={self.epochs}",
            *COMMON,
            f"dist.device={device}",  # the quickstart configs say cpu
            *ckpt,
            *((*QUICK, *QUICK_HEADS[self.method]) if quick else ()),
        ]


def _scaled(epochs: int, scale: float) -> int:
    return max(1, round(epochs * scale))


def cpu_runs() -> list[Run]:
    runs = [
        Run(f"cpu-{m}-s{s}", m, CONFIGS[m], (), s, "cpu", "cpu", 1)
        for s in range(max(CPU_SEEDS.values()))
        for m in CONFIGS
        if s < CPU_SEEDS[m]  # seed-major order: an interrupted group still holds complete seed pairs
    ]
    # Last: Hypersolid's seed 0 again, evaluated every 100 steps (the exclusion zone over training; part
    # "steps", kept out of the comparison of methods).
    return [
        *runs,
        Run("cpu-hypersolid-s0-steps", "hypersolid", HYPERSOLID, (), 0, "cpu", "steps", 1, eval_every_steps=100),
    ]


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
    backends = {"dense": (), "neighbors": ("method.hypersolid.backend=neighbors", f"method.hypersolid.k={NEIGHBOR_K}")}
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


def plan(group: str, scale: float | None = None, quick: bool = False) -> list[Run]:
    """The group's runs, longest first within the gpu group (curves), so that the last to finish are short.

    ``quick``: one epoch of two runs of different methods (what tests and dry runs exercise)."""
    if group == "cpu":
        runs = cpu_runs()
    elif group == "gpu":
        runs = gpu_runs(GPU_SCALE if scale is None else scale)
    else:
        raise ValueError(f"unknown group {group!r}; choose cpu or gpu")
    if quick:
        firsts: dict[str, Run] = {}
        for r in runs:
            firsts.setdefault(r.method, r)
        runs = [quick_run(r) for r in list(firsts.values())[:2]]
    return runs


def quick_run(run: Run) -> Run:
    """One epoch of QUICK's 4 steps, a step evaluation (if any) at its checkpoint every 2 steps."""
    return replace(run, epochs=1, eval_every_steps=2 if run.eval_every_steps else 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", choices=("cpu", "gpu"), default="gpu")
    p.add_argument("--scale", type=float, default=None, help=f"gpu epochs x scale (default {GPU_SCALE})")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    runs = plan(args.group, args.scale, args.quick)
    for r in runs:
        print(f"{r.name:32s} {r.part:8s} {r.epochs:3d} ep  {' '.join(r.overrides)}")
    print(f"{len(runs)} runs, {sum(r.epochs for r in runs)} epochs")


if __name__ == "__main__":
    main()
