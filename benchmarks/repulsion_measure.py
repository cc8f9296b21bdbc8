"""One measurement of ``benchmarks/repulsion.py``, in this process: a backend's forward+backward time, peak
memory and loss at one batch size, regime and input dtype, on the embeddings it draws for them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


VIEWS = 8  # 2 global + 6 local, the paper's default
BACKENDS: list[tuple[str, dict[str, Any]]] = [
    ("dense", {}),
    ("tiled", {"tile_size": 4096}),
    ("neighbors-flat", {"neighbors": {"index": "flat", "k": 64}}),
    # The index trained at every step, as the committed results measured it (a kept quantizer: ivf_reuse.py)
    ("neighbors-ivf", {"neighbors": {"index": "ivf", "k": 64, "nprobe": 16, "ivf_retrain_every": 1}}),
    ("neighbors-hnsw", {"neighbors": {"index": "hnsw", "k": 64, "ef_search": 64}}),
]


def make_embeddings(m: int, d: int, regime: str, device: str) -> torch.Tensor:
    import torch

    # Drawn on the device: at M = 256k the CPU would take longer to draw them than the GPU to use them.
    g = torch.Generator(device=device).manual_seed(0)
    b = m // VIEWS
    if regime == "collapsed":
        base = torch.randn(1, 1, d, generator=g, device=device)
        feats = 3.0 * base + 0.05 * torch.randn(b, VIEWS, d, generator=g, device=device)
    else:  # classes -> images -> views, tuned so ~0.1–1% of pairs sit inside alpha = 0.9
        classes = torch.randn(100, d, generator=g, device=device)
        labels = torch.randint(0, 100, (b,), generator=g, device=device)
        images = classes[labels] + 0.35 * torch.randn(b, d, generator=g, device=device)
        feats = images[:, None, :] + 0.25 * torch.randn(b, VIEWS, d, generator=g, device=device)
    return feats


def _rss_peak_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def available_backends() -> list[tuple[str, dict]]:
    """BACKENDS, plus ``auto`` when this version of the loss has it (it picks a backend by batch size)."""
    from hypersolid_scale.losses import HypersolidLoss

    try:
        HypersolidLoss(backend="auto")
    except (ValueError, TypeError):
        return list(BACKENDS)
    return [*BACKENDS, ("auto", {})]


def measure(backend_name: str, m: int, regime: str, dim: int, device: str, dtype: str = "fp32") -> dict:
    """Forward+backward of one backend at one size, regime and input dtype; in this process."""
    import torch

    from hypersolid_scale.losses import HypersolidLoss

    opts = dict(dict(available_backends())[backend_name])
    backend = backend_name.split("-")[0]
    feats = make_embeddings(m, dim, regime, device).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    if backend == "neighbors":
        opts["neighbors"] = {**opts["neighbors"], "recall_every": 1}  # every call: this very step's recall
    fn = HypersolidLoss(backend=backend, **opts)
    reps = 3 if m <= 4096 else 1

    def step() -> float:
        f = feats.clone().requires_grad_(True)
        loss = fn(f)
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return float(loss.detach())

    if m <= 8192:
        step()  # warm-up (FAISS/BLAS initialisation, CUDA kernels); larger sizes run after warm smaller ones
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter to the current RSS
        base = _rss_bytes()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if device == "cuda" else _rss_peak_bytes()) - base
    out = {
        "backend": backend_name,
        "m": m,
        "dim": dim,
        "regime": regime,
        "device": device,
        "dtype": dtype,
        "seconds": sorted(times)[len(times) // 2],
        "peak_bytes": int(peak),
        "loss": loss,
        "repulsion": fn.stats["repulsion"],
        "active_fraction": fn.stats["active_fraction"],
    }
    for key in ("recall", "saturated_rows", "candidates"):
        if key in fn.stats:
            out[key] = fn.stats[key]
    return out
