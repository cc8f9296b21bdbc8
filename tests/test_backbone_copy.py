"""A backbone is one file: copied under a new name with nothing else edited, it trains, is exported in its
library's layout and loads back (docs/design.md §7)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

# In the copy's repository, one process: `python launch/train.py ARGS...` as its own __main__, then the export of
# its last checkpoint and the exported backbone loaded back, against the checkpoint's own backbone.
_TRAIN_EXPORT_LOAD = """
import json, runpy, sys
from pathlib import Path
import torch
out, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
sys.argv = sys.argv[3:]
try:
    runpy.run_path("launch/train.py", run_name="__main__")
except SystemExit as stop:  # the launcher exits with the trainer's status
    if stop.code not in (0, None):
        raise
from hypersolid_scale.checkpoint import build_model_from_checkpoint
from hypersolid_scale.export import export_checkpoint, load_backbone
ckpt = sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1]
meta = export_checkpoint(ckpt, out)
model, cfg = build_model_from_checkpoint(ckpt)
net = load_backbone(out)
x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    same = torch.equal(net(x), model.backbone(x))
print("RESULT " + json.dumps({"arch": cfg.model.arch, "meta_arch": meta["arch"], "same": same,
                              "type": type(net).__module__}), flush=True)
"""


def test_a_copied_backbone_file_trains_exports_and_loads_with_no_other_change(tmp_path):
    """Copy small_cnn.py under a new name, change only the name it registers: `model.arch=small_cnn_copy` with
    its own option `model.small_cnn_copy.width=4` trains (2 steps), `export_checkpoint` writes it with the export layout the file declares, and
    `load_backbone` rebuilds it with the same outputs as the checkpoint's backbone. In a copy of the package, so
    that no other test running meanwhile discovers the copy."""
    repo = tmp_path / "repo"
    for part in ("hypersolid_scale", "launch", "configs"):
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    src = repo / "hypersolid_scale" / "models" / "backbones" / "small_cnn.py"
    text = src.read_text()
    assert text.count('"small_cnn"') >= 1
    src.with_name("small_cnn_copy.py").write_text(text.replace('"small_cnn"', '"small_cnn_copy"'))
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    run_dir, out = tmp_path / "run", tmp_path / "export"
    train = ["launch/train.py", "--config", "configs/quickstart.yaml", "model.arch=small_cnn_copy",
             "model.small_cnn_copy.width=4", "data.max_pretrain_samples=64", "data.global_batch_size=32",
             "data.num_local_views=0", "max_steps=2", "dist.device=cpu", "eval.every_n_epochs=0",
             "tracking.enabled=false", "progress=false", f"run_dir={run_dir}"]
    proc = subprocess.run([sys.executable, "-c", _TRAIN_EXPORT_LOAD, str(out), str(run_dir), *train], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert got == {"arch": "small_cnn_copy", "meta_arch": "small_cnn_copy", "same": True,
                   "type": "hypersolid_scale.models.backbones.small_cnn_copy"}
    meta = json.loads((out / "export.json").read_text())
    assert meta["library"] is None and "SmallCNN" in meta["constructor"] and (out / "backbone.safetensors").exists()
    # Its own option, a section of its own: the width it was given, and the checkpoint stores that section only.
    assert meta["small_cnn_width"] == 4 and "width=4" in meta["constructor"]
    ckpt = torch.load(sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1], map_location="cpu", weights_only=True)
    model = ckpt["config"]["model"]
    assert model["small_cnn_copy"] == {"width": 4} and "small_cnn" not in model and "vit_tiny" not in model
