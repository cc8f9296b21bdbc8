"""What the device stage costs the device beyond its arithmetic (docs/design.md §3e): the host->device copies of
a batch's decisions, the photometric chain's compilation (where, and what happens when it fails)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_device_decode import photos
from test_device_stage import host_batch
from torch._inductor.exc import InductorError, InvalidCxxCompiler
from torch.utils._python_dispatch import TorchDispatchMode

from hypersolid_scale.data import PRESETS
from hypersolid_scale.data.augment import view_params as vp
from hypersolid_scale.data.augment.photometric import compile_failure
from hypersolid_scale.data.device.batched_resize import BANDED_FROM
from hypersolid_scale.data.device.views import DeviceStage


class HostToDevice(TorchDispatchMode):
    """Records every operator that reads a CPU tensor and returns one on another device: a host->device copy."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outputs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        if any(t.device.type == "cpu" for t in inputs) and any(o.device.type != "cpu" for o in outputs):
            self.copies.append(str(func))
        return out


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "where-chain"])
def test_a_batch_sends_its_decisions_in_one_copy(compiled: bool) -> None:
    """The views of a decoded batch, on the meta device (a device other than the host, here): exactly one
    host->device copy, the batch's draws (boxes, flips and every view's photometric decisions), whichever
    chain runs. Before: one per decision tensor and row subset of each view (57 a batch on CUDA)."""
    preset = PRESETS["default"]
    images, params = DeviceStage(preset, "cpu").decode(host_batch(preset, photos(8, seed=21)))
    images = [im.to("meta") for im in images]
    stage = DeviceStage(preset, "meta")
    if compiled:  # what a compiled chain is called with (the `where` chain, traced by the compiler)
        stage.photometric._compiled = stage.photometric._chain
    stage.views_of(images, params)
    with HostToDevice() as seen:
        views = stage.views_of(images, params)
    assert [v.shape[-1] for v in views] == preset.view_sizes()
    assert len(seen.copies) == 1, seen.copies
    with HostToDevice() as seen:  # the counter sees copies: the old way, a decision sent per tensor
        stage.photometric.apply(views[0], _host_decisions(params[:, 0].float()))
    assert len(seen.copies) >= 7, seen.copies


def _host_decisions(p: torch.Tensor) -> Any:
    from hypersolid_scale.data.device.views import _decisions

    return _decisions(p)


def test_only_a_compiler_failure_falls_back_to_the_eager_chain_and_it_is_recorded() -> None:
    """A compiler that cannot run here (no C++ compiler, say) gives the eager chain, said in `chain`; a device
    error (CUDA's, even wrapped by the compiler) or any other error is raised, the compiled chain kept."""
    no_cxx = InductorError(InvalidCxxCompiler(), None)
    cuda = InductorError(RuntimeError("CUDA error: an illegal memory access was encountered"), None)
    assert compile_failure(no_cxx)
    assert not compile_failure(cuda)
    assert not compile_failure(RuntimeError("CUDA error: device-side assert triggered"))
    assert not compile_failure(torch.AcceleratorError("CUDA error: misaligned address"))

    preset = PRESETS["default"]
    x = torch.rand(4, 3, 16, 16)
    d = _host_decisions(torch.zeros(4, vp.NUM_PARAMS))
    for err, falls_back in ((no_cxx, True), (cuda, False), (ValueError("a bug"), False)):
        stage = DeviceStage(preset, "meta")  # any device but the CPU runs the `where` chain eagerly

        def failing(*args: Any, err: BaseException = err) -> torch.Tensor:
            raise err

        stage.photometric._compiled = failing
        stage.photometric.chain = "compiled"
        if falls_back:
            with pytest.warns(UserWarning, match="running it eagerly"):
                out = stage.photometric.apply(x.to("meta"), d)
            assert out.shape == x.shape and stage.photometric.chain.startswith("eager (compile failed: InductorError")
        else:
            with pytest.raises(type(err)):
                stage.photometric.apply(x.to("meta"), d)
            assert stage.photometric.chain == "compiled" and stage.photometric.compiled


def test_prepare_compiles_the_chain_for_the_loaders_shapes_on_the_calling_thread() -> None:
    """`DeviceStage.prepare` compiles once per view size, here (aot_eager: the graph inductor would compile);
    a batch of those shapes afterwards compiles nothing more."""
    import torch._dynamo.testing

    preset = PRESETS["default"]
    stage = DeviceStage(preset, "cpu")
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    stage.photometric._compiled = torch.compile(
        stage.photometric._chain, fullgraph=True, dynamic=False, backend=counter
    )
    stage.photometric.chain = "compiled"
    images, params = stage.decode(host_batch(preset, photos(4, seed=22)))
    assert stage.prepare(4) == "compiled"
    assert counter.frame_count == len(set(preset.view_sizes()))
    stage.views_of(images, params)
    assert counter.frame_count == len(set(preset.view_sizes()))
    # The stage's own thread (prefetch.staged) runs the compiled graphs as they are: no compile there.
    import threading

    got: list[list[torch.Tensor]] = []
    thread = threading.Thread(target=lambda: got.append(stage.views_of(images, params)), name="device-stage")
    thread.start()
    thread.join()
    assert len(got) == 1 and counter.frame_count == len(set(preset.view_sizes()))


def jpeg(height: int, width: int, seed: int) -> bytes:
    """A smooth photo-like JPEG of the given size (random colours, bilinearly enlarged)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_window_groups_give_the_padded_batchs_pixels() -> None:
    """Small photos with a 1,600 x 1,200 one among them: the views of `views_of` (packed images, a window per
    group of box sizes, the banded pass for boxes over 4 x the view) against the stage as it was (padded
    images, the batch's largest box as every crop's window): the same views, up to a level on a rounding tie
    of the banded pass (measured: none on these photos). A box read at the wrong place is far off."""
    from benchmarks.aug_reference import padded_views

    preset = PRESETS["default"]
    data = photos(11, seed=23)
    data.insert(4, jpeg(1200, 1600, seed=1))
    stage = DeviceStage(preset, "cpu")
    images, params = stage.decode(host_batch(preset, data))
    assert params[4, :, vp.WIDTH].max() > BANDED_FROM * max(preset.view_sizes())  # the banded pass runs
    got, ref = stage.views_of(images, params), padded_views(stage, images, params)
    level = max(preset.std) / 255  # one 8-bit level in the normalised views, at most
    for a, b in zip(got, ref):
        assert float((a - b).abs().max()) <= level + 1e-5
        assert float(((a - b).abs() > 1e-5).float().mean()) < 1e-3
    params[4, :, vp.LEFT] = 0  # the large photo's boxes moved to its left edge
    moved = stage.views_of(images, params)
    assert float((moved[0][4] - ref[0][4]).abs().mean()) > 0.05


_COST = """
import resource, sys, time
sys.path.insert(0, "tests")
import torch
from test_stage_cost import jpeg
from test_device_stage import host_batch
from hypersolid_scale.data import PRESETS
from hypersolid_scale.data.device.views import DeviceStage
import numpy as np
rng = np.random.default_rng(0)
data = [jpeg(int(rng.integers(160, 301)), int(rng.integers(160, 301)), i) for i in range(32)]
if sys.argv[1] == "large":
    data[5] = jpeg(3000, 4000, 99)
stage = DeviceStage(PRESETS["default"], "cpu")
batch = host_batch(PRESETS["default"], data)
stage(batch)
times = []
for _ in range(2):  # the stage's own CPU time (its thread's): what a shared machine's load leaves alone
    t0 = stage.cpu_seconds
    stage(batch)
    times.append(stage.cpu_seconds - t0)
print(min(times), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_one_large_photo_costs_its_own_crops_not_the_batchs() -> None:
    """The issue's case, measured in two processes: a batch of 32 photos of 160-300 px through the stage
    (decode and views, the default preset's 2 x 224 + 6 x 96, on the CPU), then the same with one of them a
    4,000 x 3,000 JPEG. Before, every crop read the batch's largest box of images padded to the largest (the
    issue's training run: 4.2 GiB peak, 8.7 with the large photo); now the large photo adds < 1 GiB of peak
    memory (measured: +0.16 GiB) and its own decode and crops' time: < 2 x the stage's CPU time without it
    (measured: 1.62 x; the stage's thread time, a ratio of one run, not a timing)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    got = {}
    for case in ("small", "large"):
        proc = subprocess.run(
            [sys.executable, "-c", _COST, case], cwd=root, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        seconds, peak = proc.stdout.split()[-2:]
        got[case] = (float(seconds), int(peak))
    extra_gib = (got["large"][1] - got["small"][1]) / 2**30
    assert extra_gib < 1.0, got
    assert got["large"][0] < 2.0 * got["small"][0], got


def test_a_bf16_step_gets_bf16_channels_last_views_from_one_cast() -> None:
    """`prepare(bf16=True)`: the views in bfloat16, channels-last, exactly the float32 views rounded once (what
    the step's autocast would have made of them), cast in the copy that makes them channels-last: no copy
    more than the float32 views take."""
    preset = PRESETS["default"]
    stage = DeviceStage(preset, "cpu")
    images, params = stage.decode(host_batch(preset, photos(6, seed=24)))
    copies = {}
    for bf16 in (False, True):
        stage.prepare(6, bf16=bf16)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            views = stage.views_of(images, params)
        copies[bf16] = sum(e.name == "aten::_to_copy" for e in prof.events())
        if not bf16:
            full = views
    for a, b in zip(views, full):
        assert a.dtype == torch.bfloat16 and a.is_contiguous(memory_format=torch.channels_last)
        assert b.dtype == torch.float32 and torch.equal(a, b.to(torch.bfloat16))
    assert copies[True] == copies[False] >= len(preset.view_sizes()), copies


@pytest.mark.slow
def test_the_stage_alone_benchmark_runs_on_the_cpu(tmp_path: Any) -> None:
    """benchmarks.stage_alone --quick (the GPU suite's first speed command, on the CPU): every phase timed, blur
    on and off, card / torch / commit named."""
    import json

    from benchmarks import stage_alone

    assert stage_alone.main(["--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "stage_alone.json").read_text())
    assert {"card", "torch", "git_commit"} <= set(res) and res["card"] == "cpu" and res["batch"] == 8
    for row in res["rows"].values():
        assert set(row["device_ms_per_phase"]) == {"draws and packing", "crops", "photometric", "cast"}
        assert row["device_ms_per_batch"] > 0 and row["host_ms_per_batch"] > 0 and row["operator_calls_per_batch"] > 0
        assert row["photometric_chain"] == "eager (compile off)"
