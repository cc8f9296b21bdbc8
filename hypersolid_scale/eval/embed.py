"""Embedding extraction: backbone (the paper's metrics) or projector features of a whole dataset.

Distributed: rank r embeds the contiguous slice [n·r/W, n·(r+1)/W) of the dataset, and one all_gather
(``hypersolid_scale.distributed``) puts the slices back in dataset order on every rank, so the result
is identical to a single-process pass. Extraction is deterministic: the datasets carry the preset's
eval transform, the model runs in eval mode (BatchNorm uses running statistics) and in fp32.

``cached_embeddings`` keys a file on disk by a fingerprint of the checkpoint bytes, the data settings,
the split and the feature type, so a second evaluation of the same checkpoint skips the forward passes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm

from hypersolid_scale.distributed import all_gather_detached, all_reduce_sum, barrier, get_rank, get_world_size
from hypersolid_scale.safety import atomic

WHICH = ("backbone", "projector")


def _encoder(model: nn.Module, which: str) -> Any:
    net: Any = getattr(model, "module", model)  # unwrap DDP / DeepSpeed engines: no collectives needed here
    if which == "backbone":
        return net.backbone
    if which == "projector":
        # refused earlier by the config's checks (combinations.check_features_have_a_head, eval's --features)
        if net.projector is None:
            raise ValueError("projector features of a model without a projection head; use which='backbone'")
        return lambda x: net.projector(net.backbone(x))
    raise ValueError(f"which={which!r}; allowed: {list(WHICH)}")


@torch.no_grad()
def extract_embeddings(
    model: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int,
    device: torch.device | str,
    which: str = "backbone",
    num_workers: int = 0,
    progress: bool = True,
    desc: str = "embed",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels of every sample of ``dataset``, in dataset order, on every rank.

    Shape:
        returns feats (n, F) float32 on CPU (F = backbone feature_dim or projector dim), labels (n,) int64.
    """
    encode = _encoder(model, which)
    device = torch.device(device)
    rank, world = get_rank(), get_world_size()
    n = len(dataset)  # type: ignore[arg-type]
    if n < world:
        raise ValueError(f"the dataset has {n} samples, fewer than the {world} ranks; use fewer processes")
    start, stop = n * rank // world, n * (rank + 1) // world
    loader = DataLoader(
        Subset(dataset, range(start, stop)),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
    )
    was_training = model.training
    model.eval()
    feats, labels = [], []
    # The images in the weights' dtype: float64 for a model trained with dist.precision=fp64 (the online monitor).
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    try:
        for images, y in tqdm(loader, desc=desc, disable=not progress or rank != 0, leave=False):
            feats.append(encode(images.to(device, dtype, non_blocking=True)).float())
            labels.append(torch.as_tensor(y, dtype=torch.long).to(device))
    finally:
        model.train(was_training)
    # Gather on the compute device (NCCL needs CUDA tensors), return on CPU.
    all_feats, _ = all_gather_detached(torch.cat(feats))
    all_labels, _ = all_gather_detached(torch.cat(labels))
    return all_feats.cpu(), all_labels.cpu()


def file_fingerprint(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes (a retrained checkpoint at the same path gets a new fingerprint); of a folder (a
    sharded checkpoint), of its files' names and bytes in name order."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
    for file in files:
        if file != Path(path):
            h.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    return h.hexdigest()


def embedding_fingerprint(checkpoint_fp: str, data: dict[str, Any], split: str, which: str, n: int) -> str:
    """Key of one cached embedding matrix: checkpoint + data settings + split + feature type + size."""
    key = {"checkpoint": checkpoint_fp, "data": data, "split": split, "which": which, "n": n}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]


def cached_embeddings(
    model: nn.Module,
    dataset: Dataset,
    *,
    cache_dir: str | os.PathLike,
    fingerprint: str,
    batch_size: int,
    device: torch.device | str,
    which: str = "backbone",
    num_workers: int = 0,
    desc: str = "embed",
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``extract_embeddings`` behind an on-disk cache ``<cache_dir>/emb_<fingerprint>.pt``.

    Every rank decides together (all ranks hit, or all extract), so a cache file visible to only some
    ranks never splits the collective. Rank 0 writes the file atomically. Returns (feats, labels, hit).
    """
    path = Path(cache_dir) / f"emb_{fingerprint}.pt"
    seen = all_reduce_sum(torch.tensor([float(path.is_file())]))
    if int(seen.item()) == get_world_size():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if blob.get("fingerprint") == fingerprint:
            return blob["feats"], blob["labels"], True
    feats, labels = extract_embeddings(
        model, dataset, batch_size=batch_size, device=device, which=which, num_workers=num_workers, desc=desc
    )
    if get_rank() == 0:
        blob = {"feats": feats, "labels": labels, "fingerprint": fingerprint}
        atomic.write_with(path, lambda f: torch.save(blob, f))
    barrier()
    return feats, labels, False
