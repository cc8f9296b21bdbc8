"""N processes = 1 process proven in float64 (``dist.precision=fp64``, docs/design.md §3b): after 3 SGD steps,
2 processes x 64 images and 1 process x 128 agree to 1e-9 of the update (the distance between their final
states over the distance the single process moved from the initial state), for every registered method and
for views decoded on the device (``data.views_on=device``) from an ImageFolder. In float32 the same runs differ
by 1e-5 to 1e-3 of the update, as much as rounding alone moves them (tests/test_world_invariance.py): only in
float64 does a difference of that size show a bug rather than rounding.

Each process count is one torchrun job (tests/_runs_worker.py trains all the runs in one process group).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from _warm_python import run_processes
from test_device_decode import photo_folder  # noqa: F401 - a fixture

from hypersolid_scale import checkpoint as ck
from hypersolid_scale.methods import method_names

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
STEPS = 3
TOLERANCE = 1e-9  # of the update's norm; float64 rounding after 3 steps is ~1e-14 of it
COMMON = [
    "dist.precision=fp64", "optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.1", f"max_steps={STEPS}",
    "data.num_workers=0", "model.small_cnn.width=4", "method.hypersolid.num_layers=2", "method.hypersolid.hidden_dim=32",
    "method.hypersolid.out_dim=32", "eval.every_n_epochs=0", "tracking.enabled=false", "checkpoint.every_n_steps=0",
    "deterministic=true", "dist.device=cpu", "progress=false",
]
# Every method's small heads, so that 3 steps of 128 images stay quick in float64 on the CPU.
HEADS = {
    "vicreg": ["method.vicreg.hidden_dim=32", "method.vicreg.out_dim=32"],
    "barlowtwins": ["method.barlowtwins.hidden_dim=32", "method.barlowtwins.out_dim=32"],
    "simclr": ["method.simclr.hidden_dim=32", "method.simclr.out_dim=32"],
    "byol": ["method.byol.hidden_dim=32", "method.byol.out_dim=32"],
    "dino": ["method.dino.hidden_dim=32", "method.dino.bottleneck_dim=16", "method.dino.out_dim=64"],
    "swav": ["method.swav.hidden_dim=32", "method.swav.out_dim=32", "method.swav.n_prototypes=16"],
}
DEVICE_DECODE = [
    "data.format=imagefolder", "data.views_on=device", "data.preset=default", "data.global_crop_size=32",
    "data.local_crop_size=16", "data.num_local_views=2", "data.num_classes=2", "data.global_batch_size=8",
    "model.in_channels=3",
]


_QUICK = ["--config", str(REPO / "configs" / "quickstart.yaml"), *COMMON]


def method_argv(method: str) -> list[str]:
    """The trainer's argv (less run_dir) of ``method`` on Fashion-MNIST: 3 SGD steps of 128 images in float64."""
    return [*_QUICK, f"method.name={method}", *HEADS.get(method, []), "data.global_batch_size=128",
            "data.num_local_views=2", f"data.max_pretrain_samples={STEPS * 128}"]


def _runs(root: Path, photos: Path) -> dict[str, list[str]]:
    """name -> the trainer's argv: every registered method on Fashion-MNIST, and the device-decoded ImageFolder."""
    runs = {m: method_argv(m) for m in method_names()}
    runs["views_on=device"] = [*_QUICK, *DEVICE_DECODE, f"data.path={photos / 'folder'}"]
    return {name: [*argv, f"run_dir={root / name}"] for name, argv in runs.items()}


def _states(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
    """(initial, final, world size): the trained module's state, backbone and method under one naming."""
    ckpt = ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])
    assert ckpt["step"] == STEPS
    final = {**ckpt["model"], **{f"method.{k}": v for k, v in (ckpt.get("method") or {}).items()}}
    initial = torch.load(run_dir / "initial.pt", weights_only=True)
    final = {k: v for k, v in final.items() if isinstance(v, torch.Tensor)}
    return initial, final, ckpt["world_size"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, photo_folder: Path) -> dict[int, Path]:  # noqa: F811
    """Process count -> its runs' root; each process count is one launcher call for every run."""
    roots = {}
    for nproc in (1, 2):
        root = tmp_path_factory.mktemp(f"fp64_p{nproc}")
        runs = list(_runs(root, photo_folder).values())
        proc = run_processes([str(REPO / "tests" / "_runs_worker.py"), json.dumps(runs)], nproc=nproc, env=ENV,
                             timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        roots[nproc] = root
    return roots


def update_gap(one: Path, two: Path, world: int = 2) -> tuple[float, float]:
    """(|two - one| / |one - initial|, |one - initial| / |initial|) over every floating tensor, as global norms;
    ``one`` ran on 1 process, ``two`` on ``world``."""
    init, a, world_a = _states(one)
    init_b, b, world_b = _states(two)
    assert (world_a, world_b) == (1, world)
    assert a.keys() == b.keys() and set(a) <= set(init)
    diff = moved = start = 0.0
    for k, v in a.items():
        assert init[k].dtype == torch.float64 or not init[k].is_floating_point(), f"{k}: {init[k].dtype}"
        assert torch.equal(init[k], init_b[k]), f"{k}: the runs start apart"
        if not v.is_floating_point():  # num_batches_tracked: one per forward of each resolution group
            assert torch.equal(b[k], v), k
            continue
        assert v.dtype == torch.float64, f"{k} was stored as {v.dtype}"
        diff += float((b[k] - v).square().sum())
        moved += float((v - init[k]).square().sum())
        start += float(init[k].square().sum())
    return (diff / moved) ** 0.5, (moved / start) ** 0.5


@pytest.mark.parametrize("name", [*method_names(), "views_on=device"])
def test_two_processes_equal_one_process_in_float64(trained: dict[int, Path], name: str) -> None:
    gap, moved = update_gap(trained[1] / name, trained[2] / name)
    print(f"{name}: 2 x b vs 1 x 2b differ by {gap:.3g} of the update (the update is {moved:.3g} of the weights)")
    assert gap <= TOLERANCE, f"{name}: 2 processes differ from 1 by {gap:.3g} of the update"
    assert moved > 1e-4, f"{name}: the weights barely moved ({moved:.3g}): the comparison would prove nothing"
