"""What the benchmark scripts share: the run's facts (command, commit, machine, card), the timing barrier,
the figure boilerplate, the usual command-line options and where results go.

Every script runs from the repository root as ``python -m benchmarks.<name>``. Results go to a run folder,
``runs/bench/<name>`` (ignored by git), unless ``--out`` names another place; the committed results under
``benchmarks/results/`` change only when ``--out`` points there.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypersolid_scale.safety import atomic

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"  # the committed results: written only when --out points here
RUNS = Path("runs") / "bench"  # the default, relative to the repository root the scripts run from


# ---- where results go ------------------------------------------------------------------------------------
def run_dir(name: str) -> Path:
    """The default output of benchmark ``name``: ``runs/bench/<name>`` (a folder, or a path stem)."""
    return RUNS / name


def add_out(p: argparse.ArgumentParser, name: str, what: str = "folder for the JSON and the PNG") -> None:
    """``--out``, by default the run folder ``runs/bench/<name>``."""
    p.add_argument(
        "--out",
        type=Path,
        default=run_dir(name),
        help=f"{what} (default %(default)s; benchmarks/results... to update the committed results)",
    )


def add_device(
    p: argparse.ArgumentParser, default: str | None = None, choices: tuple[str, ...] | None = ("cpu", "cuda")
) -> None:
    """``--device``; default None: cuda where a CUDA device is visible, else cpu."""
    if default is None:
        import torch

        default = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument("--device", default=default, choices=list(choices) if choices else None)


def check_device(name: str) -> None:
    """Exit with a message when ``--device cuda`` finds no CUDA device."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")


def add_quick(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--quick", action="store_true", help=what)


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose --help prints the script's docstring as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


# ---- the run's facts -------------------------------------------------------------------------------------
def command() -> str:
    """How this run was started, as one would type it: ``python -m benchmarks.<name> ARGS``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["-m", spec.name] if spec is not None and spec.name else sys.argv[:1]
    return " ".join(["python", *head, *sys.argv[1:]])


def commit() -> str:
    """The code's commit (``$HYPERSOLID_GIT_COMMIT`` on a copied tree), or "unknown"."""
    from hypersolid_scale.tracking.metadata import git_commit  # imported here: the suite's summary needs no package

    return git_commit(ROOT) or "unknown"


def arch() -> str:
    """The CPU's architecture: ``x86_64``, ``aarch64``."""
    return platform.machine()


def machine() -> str:
    """The CPU's name where the platform gives one, else its architecture."""
    return platform.processor() or arch()


def card(device: torch.device | str | None = None, cpu: str = "cpu") -> str:
    """The CUDA card's name when ``device`` is a CUDA device (None: the current one, if any), else ``cpu``; torch
    is imported only to name a card (seconds of start-up for a driver that runs no model itself)."""
    if device is not None and not str(device).startswith("cuda"):
        return cpu
    import torch

    if device is None:
        return torch.cuda.get_device_name() if torch.cuda.is_available() else cpu
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu


def torch_version() -> str:
    """The installed torch distribution's version (``2.14.1``: without the local ``+cu130`` of
    ``torch.__version__``), read without importing torch."""
    import importlib.metadata

    return importlib.metadata.version("torch")


def platform_name() -> str:
    """The OS, its kernel and libc: ``Linux-6.1-x86_64-with-glibc2.36``."""
    return platform.platform()


def host() -> dict[str, Any]:
    """The host's facts that move CPU timings: cores, Python, platform."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform_name()}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def metadata(device: torch.device | str = "cpu", **extra: Any) -> dict[str, Any]:
    """The facts every benchmark's JSON records as its ``meta``: what ran (command, commit), when (UTC), where
    (device, card or CPU, cores, torch's threads, Python, platform, torch) and the load as it started;
    ``extra``: the benchmark's own settings, after these (a key of both takes the benchmark's value)."""
    import datetime

    import torch

    device = torch.device(device)
    return {
        "command": command(),
        "git_commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "card": card(device),
        "cpu": machine(),
        "machine": arch(),
        "torch": torch.__version__,
        **host(),
        "torch_threads": torch.get_num_threads(),
        "load_average": load_average(),
        **extra,
    }


# ---- timing ----------------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    """Wait for the device's queued work: a timer read after this measures the work, not its launch."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timed:
    """What :func:`timed_loop` measured: ``steps`` timed steps in ``seconds``, after ``warmup_s`` of warm-up;
    ``last`` is what the last step returned (read it after the clock stopped)."""

    steps: int
    seconds: float
    warmup_s: float
    last: Any

    def rates(self, batch: int) -> dict[str, float]:
        """The numbers every timed row reports, for ``batch`` images per step."""
        return {
            "images_per_s": batch * self.steps / self.seconds,
            "step_ms": 1000 * self.seconds / self.steps,
            "timed_steps": self.steps,
            "warmup_s": self.warmup_s,
        }


def timed_loop(
    step: Callable[[int], Any],
    device: torch.device,
    *,
    warmup: int,
    steps: int | None = None,
    seconds: float = 0.0,
    max_steps: int = 0,
    sync_every: int = 0,
    on_start: Callable[[], None] | None = None,
) -> Timed:
    """``step(i)`` for ``warmup`` steps, then timed: ``steps`` steps, or (``steps`` None) steps until ``seconds``
    are spent, at least one and at most ``max_steps``. The device is synchronised before and after each phase
    (and every ``sync_every`` timed steps, so that the clock of a time-bounded loop reads finished work, not
    queued kernels); ``on_start()`` runs between the phases (reset counters there)."""
    sync(device)
    t0 = time.perf_counter()
    for i in range(warmup):
        step(i)
    sync(device)
    warm_s = time.perf_counter() - t0
    if on_start is not None:
        on_start()
    t0, done, last = time.perf_counter(), 0, None

    def more() -> bool:
        if steps is not None:
            return done < steps
        return done < 1 or (done < max_steps and time.perf_counter() - t0 < seconds)

    while more():
        last = step(warmup + done)
        done += 1
        if sync_every and done % sync_every == 0:
            sync(device)
    sync(device)
    return Timed(done, time.perf_counter() - t0, warm_s, last)


# ---- subprocesses ----------------------------------------------------------------------------------------
def module_command(module: str) -> list[str]:
    """``python -m <module>`` with this interpreter (a script that runs itself in a fresh process)."""
    return [sys.executable, "-m", module]


def module_env() -> dict[str, str]:
    """The environment with the repository root on PYTHONPATH, so that ``-m benchmarks.x`` imports anywhere."""
    old = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), old) if p)}


# ---- gloo ranks on this machine ---------------------------------------------------------------------------
def _rank(rank: int, worker: Callable[..., list[Any]], world: int, port: int, args: Any, out_dir: str) -> None:
    """One spawned rank: the process group's environment, ``worker``'s rows written to ``rank<r>.json``, and an
    exit that skips the interpreter's teardown (gloo's threads can abort it: safety/process_exit.py)."""
    import json

    from hypersolid_scale.safety.process_exit import leave_now

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    rows = worker(rank, world, args, out_dir)
    atomic.write_text(Path(out_dir, f"rank{rank}.json"), json.dumps(rows))
    leave_now(0)


def spawn_ranks(worker: Callable[..., list[Any]], world: int, args: Any, scratch: str | None = None) -> list[Any]:
    """``worker(rank, world, args, out_dir) -> rows`` on ``world`` spawned processes that join one gloo group on
    127.0.0.1 (a free port; the environment of ``init_distributed``); each rank's rows, in rank order. ``out_dir``
    is a temporary folder (under ``scratch``), shared by the ranks and removed afterwards."""
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        mp.spawn(_rank, args=(worker, world, port, args, tmp), nprocs=world, join=True)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


# ---- figures ---------------------------------------------------------------------------------------------
def save(fig: Any, path: Path, dpi: int) -> Path:
    """Lay out, write and close ``fig``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    atomic.write_with(path, lambda f: fig.savefig(f, format=Path(path).suffix[1:] or "png", dpi=dpi))
    plt.close(fig)
    return path


@contextmanager
def figure(path: Path, dpi: int, nrows: int = 1, ncols: int = 1, **kw: Any) -> Iterator[tuple[Any, Any]]:
    """``with figure(path, dpi, ...) as (fig, axes):`` draw; on leaving, the figure is laid out, saved to
    ``path`` and closed (``kw`` goes to ``plt.subplots``: figsize, squeeze...). Matplotlib renders off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, **kw)
    try:
        yield fig, axes
        save(fig, path, dpi)
    finally:
        plt.close(fig)
