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
from hypersolid_scale.data import view_params as vp
from hypersolid_scale.data.batched_resize import pad_images
from hypersolid_scale.data.device_views import DeviceStage
from hypersolid_scale.data.photometric import compile_failure


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
    padded = pad_images(images).to("meta")
    stage = DeviceStage(preset, "meta")
    if compiled:  # what a compiled chain is called with (the `where` chain, traced by the compiler)
        stage.photometric._compiled = stage.photometric._chain
    stage.views_of(padded, params)
    with HostToDevice() as seen:
        views = stage.views_of(padded, params)
    assert [v.shape[-1] for v in views] == preset.view_sizes()
    assert len(seen.copies) == 1, seen.copies
    with HostToDevice() as seen:  # the counter sees copies: the old way, a decision sent per tensor
        stage.photometric.apply(views[0], _host_decisions(params[:, 0].float()))
    assert len(seen.copies) >= 7, seen.copies


def _host_decisions(p: torch.Tensor) -> Any:
    from hypersolid_scale.data.device_views import _decisions

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
    stage.views_of(pad_images(images), params)
    assert counter.frame_count == len(set(preset.view_sizes()))
