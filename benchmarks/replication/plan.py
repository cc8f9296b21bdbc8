"""The replication study's runs as data (Fashion-MNIST, the quickstart CNN): ``plan(group, scale, quick)``.

    python -m benchmarks.replication.plan --group gpu [--scale 0.5]     # list the runs and their epochs

Groups:
* ``cpu``: in the order they run (finished runs are skipped, so the order is the priority):
  (a) ``cpu``: one epoch of each method's defaults, seeds 0-4 (SwaV and Barlow Twins seeds 3-4 come after
  (e)). The same seed gives the same initialisation and batch order (the loader's permutation depends only
  on (seed, epoch)), so methods are compared pairwise by seed. (b) ``steps``: Hypersolid's seed 0 once more,
  evaluated every 100 steps: the exclusion zone and the clustering over the epoch. (c) ``random``: the
  floor, Hypersolid's initial weights (step 0) of seeds 0-4 evaluated with the same protocol (one training
  step is taken only to write a checkpoint with the run's config; its weights are replaced by the initial
  ones). (d) ``tune``: equal tuning on the held-out 10 % of the training split (``data.eval_split=holdout``;
  the test split is not read), 3 values of one knob, 2 seeds each, one epoch, the value chosen by held-out
  kNN@5: Hypersolid's alpha and SimCLR's temperature. (e) ``views``: Hypersolid on 2 views (no local
  crops), seeds 0-4: multi-crop apart from the objective. (f) ``budget``: 5 epochs, the protocol after
  epochs 1, 2 and 5, seeds 0-4: Hypersolid at the paper's alpha 0.9 and at the tuned alpha, SimCLR at the
  tuned temperature (the tuned entries join the plan once (d) is complete, read from its committed JSON).
  (g) ``long``: 20 epochs, the protocol after epochs 1, 2, 5, 10 and 20, seeds 0-2: Hypersolid at the tuned
  alpha and SimCLR at the tuned temperature (amendment 2 of docs/replication.md: the tuning grid was widened
  to bracket its optimum, and these runs wait for it). Part (d) runs before (g), and (g) before any budget
  run that a moved tuned value adds to (f). Amendment 3 adds, in this order: (h) ``l2``: Hypersolid at the
  tuned alpha with lambda 0, 20 epochs, seeds 0-2 (the L2 claim's other arm); (i) ``long`` grows SwAV and
  Barlow Twins at their defaults, 20 epochs, seeds 0-2 ((h) and (i) with the HDBSCAN diagnosis of their final
  checkpoint); ``diag``: the diagnosis of the random inits (seeds 0-4); (j) ``batch``: global batch
  64 / 128 / 256 at equal epochs (2 each) and at equal steps (~936: 1, 2 and 4 epochs), square-root
  learning-rate scaling from 128, seeds 0-2; (k) ``curve100``: Hypersolid and SimCLR at their tuned values,
  100 epochs, the protocol after epochs 20, 50 and 100, seeds 0-2, in two stages: all six to epoch 50 first;
  the HDBSCAN diagnosis of (g)'s settings at their epoch 20 (amendment 4: (g)'s checkpoints were not kept, and
  at a constant learning rate the first 20 of 100 epochs are the 20-epoch run, step for step; amendment 3
  planned them retrained as six 20-epoch ``diag`` runs). Amendment 3's runs go in this order: the random inits'
  diagnosis and (j) (short enough to finish before a machine restart, which lost the checkpoints while the
  scratch folder's default was under /tmp), (h), (i), (k).
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
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.replication.gpu_plan import GPU_SCALE, gpu_runs
from benchmarks.replication.runspec import CONFIGS, HYPERSOLID, Run, _knob

CPU_SEEDS = {"hypersolid": 5, "simclr": 5, "swav": 5, "barlowtwins": 5}
FIRST_CPU_SEEDS = {"hypersolid": 5, "simclr": 5, "swav": 3, "barlowtwins": 3}  # the group's first pass
CPU_RESULTS = "benchmarks/results/replication/cpu"  # relative to the repository root
# (d) the cpu group's equal tuning (held-out split, 2 seeds per value, chosen by held-out kNN@5) and (f) its
# 5-epoch budget, the protocol after the epochs of BUDGET_EVAL_EPOCHS.
# Amendment 2 (docs/replication.md) widened the grid to bracket both optima, which sat on its edge: alpha
# 0.95 and 0.97, temperature 0.05. The rule is unchanged; the new values run after the first ones.
CPU_TUNE = {
    "hypersolid": ("method.hypersolid.alpha", (0.5, 0.75, 0.9, 0.95, 0.97)),
    "simclr": ("method.simclr.temperature", (0.1, 0.2, 0.5, 0.05)),
}
FIRST_TUNE: dict[str, tuple[float, ...]] = {
    "hypersolid": (0.5, 0.75, 0.9),
    "simclr": (0.1, 0.2, 0.5),
}  # the grid the 5-epoch runs chose from
CPU_DEFAULTS = {"hypersolid": 0.9, "simclr": 0.2}  # the quickstart configs' values of those knobs
TUNE_SEEDS = 2
TUNE_METRIC = "protocol.backbone.raw.knn_k5_majority"
BUDGET_EPOCHS = 5
BUDGET_EVAL_EPOCHS = (1, 2, 5)
BUDGET_SEEDS = 5
LONG_EPOCHS = 20
LONG_EVAL_EPOCHS = (1, 2, 5, 10, 20)
LONG_SEEDS = 3
# Amendment 3 (docs/replication.md): the L2 claim's lambda-0 arm, the 20-epoch baselines, the batch claim's two
# arms and the 100-epoch curve.
LONG_BASELINES = ("swav", "barlowtwins")  # at their quickstart defaults (not tuned: the CPU budget)
L2_OFF = "method.hypersolid.norm_weight=0"
BATCH_SIZES = (64, 128, 256)
BATCH_EPOCHS = 2  # the equal-epochs arm; the equal-steps arm trains BATCH_EPOCHS * b / 128 epochs
BATCH_SEEDS = 3
BATCH_LR = ("optim.lr_scaling=sqrt", "optim.reference_batch_size=128")
CURVE100_EPOCHS = 100
CURVE100_EVAL_EPOCHS = (20, 50, 100)
CURVE100_SEEDS = 3
# Every seed of both methods reaches epoch 50 (and its evaluation) before any goes on to 100 (Run.pause_epochs).
CURVE100_PAUSE = (50,)
RANDOM_SEEDS = 5
VIEWS_SEEDS = 5
# The views each method trains on in the cpu group (its quickstart config's data.num_local_views; the
# table scope lines print these) and why each method keeps its own (the report states it once).
VIEWS = {"hypersolid": "2 + 4", "hypersolid2v": "2", "simclr": "2", "swav": "2 + 4", "barlowtwins": "2"}
VIEW_REASONS = {
    "hypersolid": "multi-crop, the paper's setup",
    "hypersolid2v": "no local crops: multi-crop apart from the objective",
    "simclr": "its loss pairs two views, as in the SimCLR paper",
    "swav": "multi-crop, as in the SwAV paper",
    "barlowtwins": "its loss pairs two views, as in the Barlow Twins paper",
}


def tune_runs() -> list[Run]:
    """(d): the first grid, then the values amendment 2 added; each seed-major, so that an interrupted part
    still holds every value at seed 0."""
    added = {m: tuple(v for v in values if v not in FIRST_TUNE[m]) for m, (_, values) in CPU_TUNE.items()}
    grids: list[dict[str, tuple[float, ...]]] = [FIRST_TUNE, added]
    return [
        Run(
            f"cpu-tune-{m}-{_knob(CPU_TUNE[m][0], v)}-s{s}",
            m,
            CONFIGS[m],
            (f"{CPU_TUNE[m][0]}={v}", "data.eval_split=holdout"),
            s,
            "cpu",
            "tune",
            1,
        )
        for grid in grids
        for s in range(TUNE_SEEDS)
        for m, values in grid.items()
        for v in values
    ]


def tuned(method: str, results: dict[str, dict[str, Any]], grid: tuple[float, ...] | None = None) -> float | None:
    """The tuned value of ``method``'s knob over ``grid`` (default: the whole CPU_TUNE grid): the highest
    held-out kNN@5 averaged over seeds, once every planned tuning run of those values has a result
    (``results``: run name -> its JSON); None before."""
    key, values = CPU_TUNE[method]
    values = values if grid is None else grid
    means = []
    for v in values:
        got = [results.get(r.name) for r in tune_runs() if r.method == method and r.overrides[0] == f"{key}={v}"]
        scores = [g["final"].get(TUNE_METRIC) for g in got if g is not None]
        if len(scores) < len(got) or any(x is None for x in scores):  # a run missing, or its kNN@5 skipped
            return None
        means.append(sum(float(x) for x in scores) / len(scores))
    return values[means.index(max(means))]  # ties: the first listed value


def load_results(folder: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The committed result JSON of the cpu group, by run name."""
    path = Path(folder) if folder is not None else Path(__file__).resolve().parents[2] / CPU_RESULTS
    if not path.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(path.glob("*.json")) if not p.name.startswith("_")}


def long_runs(results: dict[str, dict[str, Any]]) -> list[Run]:
    """(g): Hypersolid and SimCLR at their tuned values over the widened grid, seed-major; empty until the
    tuning is complete."""
    known = [(m, tuned(m, results)) for m in ("hypersolid", "simclr")]
    if any(v is None for _, v in known):
        return []
    return [
        Run(
            f"cpu-long-{m}-{_knob(CPU_TUNE[m][0], v)}-s{s}",
            m,
            CONFIGS[m],
            (f"{CPU_TUNE[m][0]}={v}",),
            s,
            "cpu",
            "long",
            LONG_EPOCHS,
            eval_epochs=LONG_EVAL_EPOCHS,
        )
        for s in range(LONG_SEEDS)
        for m, v in known
        if v is not None
    ]


def amendment3_runs(results: dict[str, dict[str, Any]]) -> list[Run]:
    """(h)-(k), each part seed-major; the parts that train at the tuned values wait for the tuning. The runs short
    enough to finish before the machine restarts (a restart lost the checkpoints while the scratch folder's default
    was under /tmp, and a 20-epoch run beside other work takes longer than the machine stays up) come first: the
    random inits' diagnosis and the batch arms (1-4 epochs); then the 20-epoch runs, then the 100-epoch curve, whose
    epoch-20 checkpoints get the diagnosis of (g)'s settings (amendment 4)."""
    alpha, temp = tuned("hypersolid", results), tuned("simclr", results)
    l2: list[Run] = []
    if alpha is not None:
        knob = CPU_TUNE["hypersolid"][0]
        l2 += [
            Run(
                f"cpu-l2-hypersolid-{_knob(knob, alpha)}-lambda0-s{s}",
                "hypersolid",
                HYPERSOLID,
                (f"{knob}={alpha}", L2_OFF),
                s,
                "cpu",
                "l2",
                LONG_EPOCHS,
                eval_epochs=LONG_EVAL_EPOCHS,
            )
            for s in range(LONG_SEEDS)
        ]
    l2 = [replace(r, diagnose=True) for r in l2]
    baselines = [
        Run(
            f"cpu-long-{m}-default-s{s}",
            m,
            CONFIGS[m],
            (),
            s,
            "cpu",
            "long",
            LONG_EPOCHS,
            eval_epochs=LONG_EVAL_EPOCHS,
            diagnose=True,
        )
        for s in range(LONG_SEEDS)
        for m in LONG_BASELINES
    ]
    # The diagnosis of the floor: the same commands again (seeded), the grid only. What (g) trained is diagnosed at
    # the 100-epoch curve's epoch 20 (amendment 4: the same weights; the constant learning rate does not depend on
    # the number of epochs).
    diag_random = [
        Run(
            f"cpu-diag-random-s{s}",
            "hypersolid",
            HYPERSOLID,
            (),
            s,
            "cpu",
            "diag",
            1,
            random_init=True,
            diagnose_only=True,
        )
        for s in range(RANDOM_SEEDS)
    ]
    # Equal epochs: every size for BATCH_EPOCHS; equal steps: the sizes other than 128 for as many steps as 128's.
    arms = [(b, BATCH_EPOCHS, "epochs") for b in BATCH_SIZES]
    arms += [(b, BATCH_EPOCHS * b // 128, "steps") for b in BATCH_SIZES if b != 128]
    batch = [
        Run(
            f"cpu-batch-{b}-{arm}-ep{e}-s{s}",
            "hypersolid",
            HYPERSOLID,
            (f"data.global_batch_size={b}", *BATCH_LR),
            s,
            "cpu",
            "batch",
            e,
        )
        for s in range(BATCH_SEEDS)
        for b, e, arm in arms
    ]
    out = [*diag_random, *batch, *l2, *baselines]
    if alpha is not None and temp is not None:
        out += [
            Run(
                f"cpu-curve100-{m}-{_knob(CPU_TUNE[m][0], v)}-s{s}",
                m,
                CONFIGS[m],
                (f"{CPU_TUNE[m][0]}={v}",),
                s,
                "cpu",
                "curve100",
                CURVE100_EPOCHS,
                eval_epochs=CURVE100_EVAL_EPOCHS,
                pause_epochs=CURVE100_PAUSE,
                diagnose_epochs=(LONG_EPOCHS,),
            )
            for s in range(CURVE100_SEEDS)
            for m, v in (("hypersolid", alpha), ("simclr", temp))
        ]
    return out


def budget_settings(results: dict[str, dict[str, Any]]) -> list[tuple[str, float | None]]:
    """(method, knob value) of the 5-epoch part: Hypersolid at the paper's alpha and at the tuned one, SimCLR
    at the tuned temperature, tuned over the first grid (FIRST_TUNE: what the part was planned and run on;
    the widened grid's values are (g)'s, whose evaluations after epoch 5 are the same budget); None where the
    tuning has not finished (the entry waits for it)."""
    alpha = tuned("hypersolid", results, FIRST_TUNE["hypersolid"])
    settings: list[tuple[str, float | None]] = [("hypersolid", CPU_DEFAULTS["hypersolid"])]
    if alpha != CPU_DEFAULTS["hypersolid"]:
        settings.append(("hypersolid", alpha))
    return [*settings, ("simclr", tuned("simclr", results, FIRST_TUNE["simclr"]))]


def budget_runs(results: dict[str, dict[str, Any]]) -> list[Run]:
    """(f): the settings whose value is known, seed-major."""
    known = [(m, v) for m, v in budget_settings(results) if v is not None]
    return [
        Run(
            f"cpu-budget-{m}-{_knob(CPU_TUNE[m][0], v)}-s{s}",
            m,
            CONFIGS[m],
            (f"{CPU_TUNE[m][0]}={v}",),
            s,
            "cpu",
            "budget",
            BUDGET_EPOCHS,
            eval_epochs=BUDGET_EVAL_EPOCHS,
        )
        for s in range(BUDGET_SEEDS)
        for m, v in known
    ]


def cpu_runs(results: dict[str, dict[str, Any]] | None = None) -> list[Run]:
    """The cpu group in priority order; ``results`` (default: the committed JSON) decides the tuned values."""
    results = load_results() if results is None else results
    first = [
        Run(f"cpu-{m}-s{s}", m, CONFIGS[m], (), s, "cpu", "cpu", 1)
        for s in range(max(FIRST_CPU_SEEDS.values()))
        for m in CONFIGS
        if s < FIRST_CPU_SEEDS[m]  # seed-major order: an interrupted group still holds complete seed pairs
    ]
    more = [
        Run(f"cpu-{m}-s{s}", m, CONFIGS[m], (), s, "cpu", "cpu", 1)
        for s in range(max(CPU_SEEDS.values()))
        for m in CONFIGS
        if FIRST_CPU_SEEDS[m] <= s < CPU_SEEDS[m]
    ]
    return [
        *first,
        # Hypersolid's seed 0 again, evaluated every 100 steps (the exclusion zone over training; part
        # "steps", kept out of the comparison of methods).
        Run("cpu-hypersolid-s0-steps", "hypersolid", HYPERSOLID, (), 0, "cpu", "steps", 1, eval_every_steps=100),
        *(
            Run(f"cpu-random-s{s}", "hypersolid", HYPERSOLID, (), s, "cpu", "random", 1, random_init=True)
            for s in range(RANDOM_SEEDS)
        ),
        *tune_runs(),
        *(
            Run(f"cpu-hypersolid2v-s{s}", "hypersolid", HYPERSOLID, ("data.num_local_views=0",), s, "cpu", "views", 1)
            for s in range(VIEWS_SEEDS)
        ),
        *more,
        *budget_runs(results),
        *long_runs(results),
        *amendment3_runs(results),
    ]


def plan(
    group: str, scale: float | None = None, quick: bool = False, results: dict[str, dict[str, Any]] | None = None
) -> list[Run]:
    """The group's runs, longest first within the gpu group (curves), so that the last to finish are short.

    ``quick``: one epoch of two runs of different methods (what tests and dry runs exercise). ``results``:
    the cpu group's results by run name (default: the committed JSON), which fix the tuned values."""
    if group == "cpu":
        runs = cpu_runs(results)
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
    """One epoch of QUICK's 4 steps, a step evaluation (if any) at its checkpoint every 2 steps; a run with
    epoch evaluations keeps two epochs (both evaluated), a staged one pauses after the first, and a diagnosed
    epoch becomes the first."""
    if run.eval_epochs:
        return replace(
            run,
            epochs=2,
            eval_epochs=(1, 2),
            pause_epochs=(1,) if run.pause_epochs else (),
            diagnose_epochs=(1,) if run.diagnose_epochs else (),
        )
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
