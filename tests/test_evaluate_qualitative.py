"""The qualitative suite of the evaluation application: which images reach the renderer, where its PNGs
are listed (report.json, report.md, MLflow), how a skip is recorded; and once with the real renderer."""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _eval_helpers import FAST_EVAL, TINY_MODEL, make_checkpoint, run_launch_eval
from PIL import Image

from hypersolid_scale.config.schema import load_config
from hypersolid_scale.data import build_eval_datasets, resolve_preset
from hypersolid_scale.eval.app import main
from hypersolid_scale.eval.config import FEATURE_SUITES, SUITES, EvalConfig
from hypersolid_scale.eval.sampling import subsample
from hypersolid_scale.eval.skips import NotApplicable, SkipLog
from hypersolid_scale.eval.suites import run_suites

RENDERER = "hypersolid_scale.eval.qualitative"


class FakeRenderer:
    """Stands in for ``render_qualitative``: records its arguments, writes one small PNG per figure, and
    reports one analysis as not applicable (as the real one does for attention maps of a CNN)."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = fail

    def __call__(self, model: torch.nn.Module, images: torch.Tensor, labels: list[int], out_dir: Path, *,
                 skips: SkipLog, **kw: Any) -> dict[str, Path]:
        self.calls.append({"model": model, "images": images.clone(), "labels": list(labels), **kw})
        if self.fail:
            raise NotApplicable(self.fail)
        with skips.guard("attention"):
            raise NotApplicable("attention maps need a ViT backbone")
        Path(out_dir).mkdir(parents=True, exist_ok=True)  # as the renderer's contract says
        written = {}
        for name in ("hypercolumns", "inversion"):
            written[name] = Path(out_dir) / f"{name}.png"
            Image.new("RGB", (4, 4 * len(labels))).save(written[name])
        return written


@pytest.fixture
def renderer(monkeypatch: pytest.MonkeyPatch) -> FakeRenderer:
    fake = FakeRenderer()
    module = types.ModuleType(RENDERER)
    module.render_qualitative = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, RENDERER, module)
    return fake


def evaluate(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    path = make_checkpoint(tmp_path / "run")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["--checkpoint", str(path), "--no-mlflow", "--output-dir", str(out), *FAST_EVAL, *args])
    return code, json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def test_qualitative_is_a_suite_but_not_a_default() -> None:
    assert "qualitative" in SUITES and "qualitative" not in EvalConfig().suites
    assert EvalConfig().suites == list(FEATURE_SUITES)
    assert EvalConfig(suites=["qualitative"], qualitative_images=1).qualitative_images == 1
    with pytest.raises(ValueError, match="eval.qualitative_images"):
        EvalConfig(qualitative_images=0)
    with pytest.raises(ValueError, match="eval.qualitative_inversion_steps"):
        EvalConfig(qualitative_inversion_steps=0)


def test_run_suites_needs_the_model_and_images_for_the_qualitative_suite(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="qualitative suite needs the model"):
        run_suites(None, None, EvalConfig(suites=["qualitative"]), tmp_path)
    with pytest.raises(ValueError, match="need the train and test features"):
        run_suites(None, None, EvalConfig(suites=["knn"]), tmp_path)


def test_qualitative_alone_renders_seeded_test_images_without_embedding(tmp_path: Path,
                                                                       renderer: FakeRenderer) -> None:
    code, report, md = evaluate(tmp_path, "--suite", "qualitative", "eval.qualitative_images=3", "eval.seed=4")
    assert code == 0 and len(renderer.calls) == 1
    call = renderer.calls[0]
    # the reference: the test split's samples at a seeded draw of 3 indices
    cfg = load_config(None, TINY_MODEL)
    _, test_ds = build_eval_datasets(cfg.data)
    idx = subsample(len(test_ds), 3, 4)
    assert torch.equal(call["images"], torch.stack([test_ds[int(i)][0] for i in idx]))
    assert call["labels"] == [int(test_ds[int(i)][1]) for i in idx]
    preset = resolve_preset(cfg.data)
    assert call["seed"] == 4 and call["mean"] == list(preset.mean) and call["std"] == list(preset.std)
    assert "inversion_steps" not in call  # unset: the renderer's own default (the paper's)
    out = tmp_path / "out"
    assert report["qualitative"] == {n: str(out / f"{n}.png") for n in ("hypercolumns", "inversion")}
    assert report["plots"] == list(report["qualitative"].values())
    assert report["skipped"] == {"qualitative_attention": "attention maps need a ViT backbone"}
    assert "![hypercolumns](hypercolumns.png)" in md and "| qualitative_attention |" in md
    assert set(report["timings_s"]) == {"qualitative"} and report["meta"]["feature_dim"] is None
    assert not (tmp_path / "run" / "eval_cache").exists()  # nothing was embedded


def test_qualitative_with_other_suites_and_its_skip(tmp_path: Path, renderer: FakeRenderer) -> None:
    renderer.fail = "this model has no spatial feature maps"
    code, report, md = evaluate(tmp_path, "--suite", "knn,qualitative", "eval.qualitative_images=2",
                                "eval.qualitative_inversion_steps=5")
    assert code == 0 and renderer.calls[0]["inversion_steps"] == 5 and len(renderer.calls[0]["labels"]) == 2
    assert report["skipped"] == {"qualitative": "this model has no spatial feature maps"}
    assert "knn_k5_weighted" in report["metrics"] and "qualitative" not in report and report["plots"] == []
    assert "| qualitative | this model has no spatial feature maps |" in md
    # the same skip with nothing else requested: nothing was evaluated
    code, report, _ = evaluate(tmp_path / "alone", "--suite", "qualitative")
    assert code == 3 and set(report["skipped"]) == {"qualitative"}


@pytest.mark.slow
def test_qualitative_figures_are_logged_to_mlflow(tmp_path: Path, renderer: FakeRenderer) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = make_checkpoint(tmp_path / "run", tracking_uri=uri)
    assert main(["--checkpoint", str(path), "--suite", "knn,qualitative", *FAST_EVAL]) == 0
    out = tmp_path / "run" / "eval" / "step_00000007"
    report = json.loads((out / "report.json").read_text())
    logged = {a.path for a in MlflowClient(uri).list_artifacts(report["meta"]["mlflow_run_id"], "eval/step_00000007")}
    assert {"eval/step_00000007/hypercolumns.png", "eval/step_00000007/inversion.png",
            "eval/step_00000007/report.json"} <= logged


def test_qualitative_suite_through_launch_eval_with_the_real_renderer(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    out = tmp_path / "out"
    proc = run_launch_eval("--checkpoint", str(path), "--no-mlflow", "--output-dir", str(out), "--suite",
                           "qualitative", "eval.qualitative_images=2", "eval.qualitative_inversion_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["qualitative"] and set(report["plots"]) == set(report["qualitative"].values())
    md = (out / "report.md").read_text()
    for name, png in report["qualitative"].items():
        with Image.open(png) as img:
            assert img.size[0] > 8 and img.size[1] > 8  # a grid of panels, not an empty file
        assert f"[eval] qualitative {name}: {png}" in proc.stdout and f"({Path(png).name})" in md
    assert "inversion" in report["qualitative"]  # the one analysis every architecture supports
