"""A repulsion backend is one class registered by name: one defined here is used exactly like a built-in one."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from loss_reference import make_feats
from torch import nn

from hypersolid_scale.losses import HypersolidLoss, LossConfig
from hypersolid_scale.losses.backends import (
    Backend,
    backend_names,
    get_backend,
    register_backend,
    unregister_backend,
)
from hypersolid_scale.losses.repulsion import dense_repulsion
from hypersolid_scale.safety.errors import ConfigError


class CountingDense(Backend):
    """The dense computation under another name, with one statistic of its own and a look at the packed ones."""

    name = "test_counting_dense"
    stat_names = ("calls",)

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.calls, self.observed = 0, None

    def repulsion(self, x_rows, x_all, layout, alpha):
        self.calls += 1
        return dense_repulsion(x_rows, x_all, layout, alpha)

    def derive(self, sums, rows, loss):
        return {"calls": torch.full_like(loss, float(self.calls))}

    def observe(self, packed):
        self.observed = packed.to_dict()


@pytest.fixture
def counting():
    register_backend(CountingDense)
    try:
        yield CountingDense.name
    finally:
        unregister_backend(CountingDense.name)  # registered for this test only


def loss_and_grad(fn, feats):
    f = feats.clone().requires_grad_(True)
    out = fn(f)
    out.backward()
    return out.detach(), f.grad


def test_the_built_in_backends_are_discovered_in_their_documented_order():
    names = backend_names()
    assert names[0] == "dense" == LossConfig().backend  # the default first
    assert list(names) == sorted(names, key=lambda n: (get_backend(n).order, n))
    package = Path(__file__).resolve().parents[1] / "hypersolid_scale" / "losses" / "backends"
    assert {get_backend(n).__module__.rsplit(".", 1)[1] for n in names} == {p.stem for p in package.glob("[!_]*.py")}
    # docs/training.md's table of backends lists them in the registry's order
    rows = re.findall(r"^\| `(\w+)` \|", (package.parents[2] / "docs" / "training.md").read_text(), re.M)
    table = [n for n in rows if n in names]
    assert table == [n for n in names if n in table] and table[0] == "dense"


@pytest.mark.parametrize("regime", ["spread", "collapsed"])
def test_a_registered_backend_is_used_by_name_and_equals_dense(counting, regime):
    assert counting in backend_names() and get_backend(counting) is CountingDense
    fn, dense = HypersolidLoss(backend=counting, alpha=0.5), HypersolidLoss(backend="dense", alpha=0.5)
    feats = make_feats(6, 3, 8, regime=regime, seed=2)
    got, got_grad = loss_and_grad(fn, feats)
    ref, ref_grad = loss_and_grad(dense, feats)
    assert torch.equal(got, ref) and torch.equal(got_grad, ref_grad)  # the same operations: bit-identical
    assert fn.stat_names == dense.stat_names + ("calls",)
    assert fn.packed_stats.names == fn.stat_names
    stats = fn.stats
    assert {k: v for k, v in stats.items() if k != "calls"} == dense.stats and stats["calls"] == 1
    assert fn.backend.observed == stats  # observe() saw this call's packed statistics
    assert fn.backend.calls == 1  # the backend instance the loss built


def test_a_registered_backend_trains_a_tiny_model_as_dense_does(counting):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8)).double()
    twin, before = copy.deepcopy(model), copy.deepcopy(model)
    inputs = torch.randn(5, 3, 12, dtype=torch.float64)  # 5 images x 3 views
    for net, backend in ((model, counting), (twin, "dense")):
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        fn = HypersolidLoss(backend=backend, alpha=0.0)
        loss = fn(net(inputs))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert fn.stats["active_pairs"] > 0  # the repulsion takes part in the step
    for p, q, p0 in zip(model.parameters(), twin.parameters(), before.parameters()):
        assert torch.equal(p, q)  # the step equals dense's
        assert not torch.equal(p, p0)  # and it moved the weights
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_an_unknown_backend_lists_the_registered_ones(counting):
    names = backend_names()
    assert names[:4] == ("dense", "tiled", "neighbors", "auto") and counting in names
    with pytest.raises(ValueError) as err:
        HypersolidLoss(backend="sparse")
    assert f"choose one of {', '.join(names)}" in str(err.value) and "backend='sparse'" in str(err.value)
    with pytest.raises(ConfigError, match=f"'sparse' is not a known backend; choose one of: {' [|] '.join(names)}"):
        get_backend("sparse")


def test_a_name_registers_once(counting):
    with pytest.raises(ValueError, match="registered twice"):
        register_backend(CountingDense)
    with pytest.raises(ValueError, match="registered twice"):
        register_backend(type("Dense2", (CountingDense,), {"name": "dense"}))


def test_the_registration_ends_with_its_test():
    assert CountingDense.name not in backend_names()
    with pytest.raises(ValueError, match="is not valid; choose one of"):
        HypersolidLoss(backend=CountingDense.name)


# In the copy's repository, one process: the copy's own key refused by its own name, then `launch/train.py`.
_CHECK_THEN_TRAIN = """
import runpy, sys
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.safety.errors import ConfigError
try:
    load_config("configs/quickstart.yaml", ["method.hypersolid.backend=neighbors_copy",
                                            "method.hypersolid.neighbors_copy.k=0"])
except ConfigError as err:
    print("REFUSED " + str(err), flush=True)
sys.argv = sys.argv[1:]
runpy.run_path("launch/train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_a_copied_backend_file_with_an_option_trains_with_its_own_section(tmp_path):
    """Copy neighbors.py under a new name, change only the name it registers: its options are the section
    `method.hypersolid.neighbors_copy.*`, validated under that name, read by the copy (not the original's), and
    `launch/train.py` trains with it (2 steps); its checkpoint stores the section. In a copy of the package, so
    that no other test running meanwhile discovers the copy."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    repo_root, repo = Path(__file__).resolve().parents[1], tmp_path / "repo"
    for part in ("hypersolid_scale", "launch", "configs"):
        shutil.copytree(repo_root / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    src = repo / "hypersolid_scale" / "losses" / "backends" / "neighbors.py"
    text = src.read_text()
    assert text.count('"neighbors"') == 1
    src.with_name("neighbors_copy.py").write_text(text.replace('"neighbors"', '"neighbors_copy"'))
    run_dir = tmp_path / "run"
    train = ["launch/train.py", "--config", "configs/quickstart.yaml", "method.hypersolid.backend=neighbors_copy",
             "method.hypersolid.neighbors_copy.k=8", "method.hypersolid.neighbors_copy.index=torch",
             "method.hypersolid.neighbors.k=0",  # the original's section: not read by the copy, so not refused
             "method.hypersolid.hidden_dim=32", "method.hypersolid.out_dim=16", "model.small_cnn.width=4",
             "data.dataset=digits", "data.batch_size_per_gpu=32", "data.num_local_views=0", "max_steps=2",
             "dist.device=cpu", "eval.every_n_epochs=0", "tracking.enabled=false", "progress=false",
             f"run_dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _CHECK_THEN_TRAIN, *train], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED method.hypersolid.neighbors_copy.k must be a positive integer, got 0" in proc.stdout
    ckpt = torch.load(sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1], map_location="cpu", weights_only=True)
    section = ckpt["config"]["method"]["hypersolid"]
    assert section["backend"] == "neighbors_copy" and section["neighbors_copy"]["k"] == 8 and ckpt["step"] == 2
    assert json.dumps(section["neighbors_copy"]) != json.dumps(section["neighbors"])
    assert "neighbors_copy" not in backend_names()  # this process never imported the copy
