"""Sweep files for Slurm job arrays: one array index = one run = one MLflow run in a shared experiment.

A sweep file (configs/sweeps/*.yaml) names a base config and lists one override list per run::

    description: CIFAR-100, repulsion threshold   # optional
    base: configs/cifar100.yaml
    runs:
      - ["method.hypersolid.alpha=0.85"]
      - ["method.hypersolid.alpha=0.9", "optim.lr=2e-3"]

Commands (used by sweep.sbatch, handy by hand)::

    python launch/slurm/sweep.py count  SWEEP            # number of runs
    python launch/slurm/sweep.py args   SWEEP INDEX [--no-validate]
                                                          # trainer arguments of run INDEX, one per line
    python launch/slurm/sweep.py submit SWEEP [SBATCH_OPTION ...] [-- OVERRIDE ...]
                                                          # sbatch --array=0-(count-1) ... sweep.sbatch SWEEP
    python launch/slurm/sweep.py init-tracking URI EXPERIMENT ARTIFACT_DIR
                                                          # create the experiment once, before the array's
                                                          # runs race to create it (sweep.sbatch holds a lock)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def load(path: str) -> tuple[str, list[list[str]]]:
    from hypersolid_scale.config.sweep import load_sweep  # the format's single definition (validates every run)

    base, runs = load_sweep(path)
    if not runs:
        raise ValueError(f"sweep file {path!r} has an empty 'runs' list; add at least one list of overrides")
    for i, run in enumerate(runs):
        bad = [o for o in run if "\n" in o]
        if bad:
            raise ValueError(f"sweep file {path!r}, runs[{i}]: overrides must be single-line strings, got {bad!r}")
    return base, runs


def load_light(path: str) -> tuple[str, list[list[str]]]:
    """Base and runs without validating the overrides against the config schema.

    Used inside every array element, where importing the whole config stack would cost each element many
    seconds for checks that `submit` already made and that the trainer repeats before any work.
    """
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"cannot read sweep file {path!r}: {err}") from None
    runs = data.get("runs") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or "base" not in data
        or not isinstance(runs, list)
        or not all(isinstance(r, list) and all(isinstance(o, str) and "\n" not in o for o in r) for r in runs)
    ):
        return load(path)  # let the full loader explain what is wrong
    return str(data["base"]), [list(r) for r in runs]


def run_args(path: str, index: int, validate: bool = True) -> list[str]:
    base, runs = load(path) if validate else load_light(path)
    if not 0 <= index < len(runs):
        raise ValueError(
            f"array index {index} is out of range for {path!r}, which has {len(runs)} runs; "
            f"submit with --array=0-{len(runs) - 1}"
        )
    return ["--config", base, *runs[index]]


def init_tracking(uri: str, experiment: str, artifact_dir: str) -> str:
    """Create the experiment (and a SQLite store's schema) once; returns its id."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    # A local store keeps artifacts next to it; a tracking server uses its own artifact root.
    local = uri.startswith(("sqlite:", "file:")) or "://" not in uri
    location = Path(artifact_dir).resolve().as_uri() if local and "://" not in artifact_dir else None
    try:
        return client.create_experiment(experiment, artifact_location=location)
    except MlflowException:  # created meanwhile by a process that did not take the lock (a server's clients)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise
        return found.experiment_id


def submit(path: str, rest: list[str]) -> int:
    sbatch_opts, overrides = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    _, runs = load(path)
    cmd = [
        "sbatch",
        f"--array=0-{len(runs) - 1}",
        *sbatch_opts,
        str(REPO / "launch/slurm/sweep.sbatch"),
        path,
        *overrides,
    ]
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=os.getcwd())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("count").add_argument("sweep")
    p = sub.add_parser("args")
    p.add_argument("sweep")
    p.add_argument("index", type=int)
    p.add_argument("--no-validate", action="store_true", help="skip checking the overrides (sweep.sbatch)")
    p = sub.add_parser("submit")
    p.add_argument("sweep")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("init-tracking")
    p.add_argument("uri")
    p.add_argument("experiment")
    p.add_argument("artifact_dir")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "count":
            print(len(load(args.sweep)[1]))
        elif args.cmd == "args":
            print("\n".join(run_args(args.sweep, args.index, validate=not args.no_validate)))
        elif args.cmd == "submit":
            return submit(args.sweep, args.rest)
        else:
            print(init_tracking(args.uri, args.experiment, args.artifact_dir))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
