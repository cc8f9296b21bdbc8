"""What a training run reports besides its per-step statistics: the online kNN monitor, the loader's
counters over all ranks, peak memory, and the loss curve.
"""

from __future__ import annotations

import resource
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Subset
from tqdm import tqdm

from hypersolid_scale.data import build_eval_datasets
from hypersolid_scale.distributed import all_reduce_max_flag, all_reduce_sum
from hypersolid_scale.eval import extract_embeddings, knn_accuracy
from hypersolid_scale.safety import atomic
from hypersolid_scale.tracking import Tracker
from hypersolid_scale.training.run_builder import Run


def knn_monitor(run: Run) -> dict[str, float]:
    """kNN accuracy of backbone features (eval transform) on a subsample; collective, result on rank 0."""
    ev = run.cfg.eval
    train_ds, test_ds = build_eval_datasets(run.cfg.data)
    gen = np.random.default_rng(ev.seed)

    def cap(ds: Any, n: int) -> Any:
        return ds if len(ds) <= n else Subset(ds, sorted(gen.choice(len(ds), n, replace=False).tolist()))

    model = run.engine.model
    model.eval()
    try:
        tr_f, tr_y = extract_embeddings(
            model,
            cap(train_ds, ev.monitor_max_samples),
            batch_size=ev.batch_size,
            device=run.device,
            which=ev.features,
            progress=False,
        )
        te_f, te_y = extract_embeddings(
            model,
            cap(test_ds, ev.monitor_max_samples),
            batch_size=ev.batch_size,
            device=run.device,
            which=ev.features,
            progress=False,
        )
    finally:
        model.train()
    if run.info.rank != 0:
        return {}
    acc = knn_accuracy(tr_f, tr_y, te_f, te_y, ks=tuple(ev.knn_k), temperature=ev.knn_temperature)
    return {f"monitor/{k}": v for k, v in acc.items()}


def log_monitor(run: Run, tracker: Tracker, bar: tqdm, epoch: int, step: int) -> bool:
    """Run and log the kNN monitor; False when the data cannot support it (then it stays off)."""
    error: ValueError | None = None
    try:
        acc = knn_monitor(run)
    except ValueError as err:  # e.g. a dataset without labels, or K larger than the monitor's sample
        error, acc = err, {}
    # Only rank 0 scores the kNN, so only it can fail there: every rank must still take the same decision,
    # or the next epoch's embedding all-gather would meet a rank that is training.
    if all_reduce_max_flag(error is not None):
        warnings.warn(f"online kNN monitor disabled: {error or 'it failed on rank 0'}", stacklevel=1)
        return False
    if acc:
        tracker.log_metrics(acc, step=step)
        bar.write(f"epoch {epoch:3d} | step {step:7d} | " + " | ".join(f"{k} {v:.2f}" for k, v in acc.items()))
    return True


def summed_loader_stats(run: Run) -> dict[str, float]:
    """The loader's counters (corrupt samples skipped, samples lost, short or truncated shards, ...) summed
    over ranks: each rank reads its own shards, so rank 0's own counts would hide the others' losses.
    Collective. Every loader reports the same keys on every rank."""
    keys = sorted(run.loader.stats)
    if not keys:
        return {}
    values = torch.tensor([float(run.loader.stats[k]) for k in keys], dtype=torch.float64, device=run.device)
    return dict(zip(keys, all_reduce_sum(values).tolist()))


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def plot_loss(history: list[tuple[int, float]], path: Path) -> Path:
    # matplotlib is imported here, at the end of a run on rank 0, rather than by every rank at start-up.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps, losses = zip(*history)
    ax.plot(steps, losses)
    ax.set(xlabel="step", ylabel="loss", title="training loss")
    fig.tight_layout()
    atomic.write_with(path, lambda f: fig.savefig(f, format=path.suffix[1:] or "png", dpi=100))
    plt.close(fig)
    return path
