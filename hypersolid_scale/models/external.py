"""Published backbones (torchvision, timm, or this package's own) with weights from a file, for evaluation.

    net, info = load_external_backbone("torchvision:resnet50", "r50.pth", data_channels=3)

``SOURCE:NAME`` picks the constructor: ``torchvision:<model>`` (a classifier with an ``fc`` or ``heads``
head, e.g. resnet18/resnet50), ``timm:<model>`` (built with ``pretrained=False, num_classes=0``; ViTs get
a dynamic input size so any crop size works), ``native:<arch>`` (this package's own
backbones, ``build_backbone`` of a ``ModelConfig``; ``hypersolid:<arch>``, its former spelling, is still read).
The classifier head is removed, so the network returns its pooled features. Nothing is downloaded.

The file is read with ``torch.load(weights_only=True)``. Its tensors are found under
``state_dict``/``model`` and common wrapper prefixes (``module.``, ``model.``, ``backbone.``, ``encoder.``,
``_orig_mod.``, and any ``strip_prefixes`` given) are stripped; the children of an ``nn.Sequential`` of the
network's children (lightly's ``nn.Sequential(*list(resnet.children())[:-1])``) are renamed back. Tensors of
other modules (the classifier, projection heads, momentum copies) are dropped and counted. Anything else
that does not fit — a backbone tensor missing, one the network does not have, a shape that differs — is a
``CheckpointError`` naming the file, the architecture, the first mismatching keys and what to try.
"""

from __future__ import annotations

import difflib
import pickle
import re
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from hypersolid_scale.models.backbones import backbone_names, build_backbone, get_backbone
from hypersolid_scale.models.config import ModelConfig
from hypersolid_scale.safety.errors import CheckpointError, ConfigError

SOURCES = ("torchvision", "timm", "native")
# The former name of "native" (it also named the method and the package): read as "native", with a note.
FORMER_SOURCES = {"hypersolid": "native"}
_NOTED: set[str] = set()  # former spellings already noted in this process
# Wrappers added by DDP, torch.compile, lightly/Lightning modules and SSL repositories.
KNOWN_PREFIXES = ("module.", "_orig_mod.", "model.", "backbone.", "encoder.")
# Containers of the tensors in training checkpoints (Lightning: state_dict; this package and DeiT: model).
CONTAINER_KEYS = ("state_dict", "model")
_SHOWN = 3  # mismatching keys named in an error message


@dataclass
class LoadInfo:
    """What loading a weights file did; ``dropped`` holds the file's names of the tensors left out."""

    loaded: int
    dropped: list[str] = field(default_factory=list)
    missing_buffers: list[str] = field(default_factory=list)  # BatchNorm step counters absent from old files
    feature_dim: int = 0
    in_channels: int = 3


def parse_backbone(spec: str) -> tuple[str, str]:
    """``"torchvision:resnet50"`` -> ``("torchvision", "resnet50")``; a ``ConfigError`` for anything else."""
    source, sep, name = spec.partition(":")
    if source in FORMER_SOURCES and sep and name:
        if spec not in _NOTED:
            _NOTED.add(spec)
            print(
                f"note: --backbone {spec} is read as {FORMER_SOURCES[source]}:{name} (the source's new name)",
                file=sys.stderr,
            )
        source = FORMER_SOURCES[source]
    if not sep or source not in SOURCES or not name:
        raise ConfigError(
            f"--backbone {spec!r} is not SOURCE:NAME with SOURCE one of {list(SOURCES)}; write e.g. "
            "--backbone torchvision:resnet50, timm:vit_tiny_patch16_224 or native:resnet18"
        )
    return source, name


def _unknown(kind: str, name: str, known: Sequence[str], example: str) -> ConfigError:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"did you mean {close}? " if close else ""
    return ConfigError(f"{kind} has no model {name!r}; {hint}choose another name, e.g. {example}")


def _torchvision(name: str) -> tuple[nn.Module, int]:
    import torchvision

    if name not in torchvision.models.list_models(torchvision.models):
        raise _unknown("torchvision", name, torchvision.models.list_models(torchvision.models), "torchvision:resnet50")
    net = torchvision.models.get_model(name, weights=None)
    if isinstance(getattr(net, "fc", None), nn.Linear):  # ResNet, ResNeXt, Wide ResNet, RegNet
        dim = net.fc.in_features
        net.fc = nn.Identity()
    elif isinstance(getattr(net, "heads", None), nn.Sequential) and hasattr(net, "hidden_dim"):  # torchvision ViT
        dim = int(net.hidden_dim)
        net.heads = nn.Identity()
    else:
        raise ConfigError(
            f"torchvision:{name} has no fc or heads classifier to remove; use a torchvision ResNet "
            f"or ViT, or timm:{name} (timm returns pooled features for every model)"
        )
    return net, dim


def _timm(name: str) -> tuple[nn.Module, int]:
    import timm

    if not timm.is_model(name):
        raise _unknown("timm", name, timm.list_models(), "timm:vit_tiny_patch16_224")
    kw: dict[str, Any] = dict(pretrained=False, num_classes=0, in_chans=3)
    try:  # ViTs: interpolate the position embeddings to the eval crop size (and pad it to whole patches)
        net = timm.create_model(name, dynamic_img_size=True, dynamic_img_pad=True, **kw)
    except TypeError:  # models without a fixed input size take no such arguments
        net = timm.create_model(name, **kw)
    return net, int(cast(int, net.num_features))


def build_external(source: str, name: str, model_cfg: ModelConfig | None = None) -> tuple[nn.Module, int, int]:
    """(network without its classifier, feature dim, input channels) for ``source:name``; random weights.

    ``model_cfg`` configures ``native:`` archs (its ``arch`` is set to ``name``).
    """
    if source == "torchvision":
        return (*_torchvision(name), 3)
    if source == "timm":
        return (*_timm(name), 3)
    if name not in backbone_names():
        raise _unknown("native", name, backbone_names(), "native:resnet18")
    cfg = ModelConfig() if model_cfg is None else model_cfg
    cfg.arch = name
    net, dim = build_backbone(cfg)
    return net, dim, cfg.in_channels


class ChannelRepeat(nn.Module):
    """Feeds 1-channel images to a network built for ``channels`` (the grey value in every channel).

    Shape:
        (N, 1, H, W) -> network(N, channels, H, W)
    """

    def __init__(self, net: nn.Module, channels: int) -> None:
        super().__init__()
        self.net = net
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.expand(-1, self.channels, -1, -1))


# ----------------------------------------------------------------------------------------------------------
# Reading a weights file
# ----------------------------------------------------------------------------------------------------------


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file, by name (container keys unwrapped); a ``CheckpointError`` if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"weights file {str(path)!r} does not exist; pass --weights with the path of a .pt/.pth file"
        )
    try:
        obj: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError... for foreign files
        raise CheckpointError(f"weights file {str(path)!r} cannot be read: {_why_unreadable(path, err)}") from None
    for _ in range(3):  # e.g. {"model": {"state_dict": ...}}
        if not isinstance(obj, Mapping):
            break
        inner = next((obj[k] for k in CONTAINER_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None or any(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        obj = inner
    tensors = _flatten(obj) if isinstance(obj, Mapping) else {}
    if not tensors:
        what = sorted(map(str, obj))[:8] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(
            f"weights file {str(path)!r} holds no state dict (found {what}); pass a file saved "
            "with torch.save(model.state_dict(), path), or a checkpoint with a 'state_dict' or "
            "'model' entry"
        )
    return tensors


def _flatten(obj: Mapping[Any, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of nested mappings under dotted names: ``{"teacher": {"a.w": t}}`` -> ``{"teacher.a.w": t}``."""
    out: dict[str, torch.Tensor] = {}
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = v
        elif isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
    return out


def _why_unreadable(path: Path, err: Exception) -> str:
    # torch's own message suggests loosening its unpickler, which is never the fix for a foreign file.
    if path.stat().st_size == 0:
        return "the file is empty; copy it again"
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04":
                return "the file is cut short (an interrupted copy or download); copy it again"
        return (
            "it is not a PyTorch file (random bytes, text, or another format); pass a file saved with "
            "torch.save(model.state_dict(), path)"
        )
    if isinstance(err, pickle.UnpicklingError):
        return (
            "it holds Python objects besides tensors (a whole pickled model?); load it where it was made and "
            "save model.state_dict() with torch.save, then pass that file"
        )
    return f"the archive is damaged ({type(err).__name__}); copy the file again"


# ----------------------------------------------------------------------------------------------------------
# Matching names
# ----------------------------------------------------------------------------------------------------------


def _rename(key: str, targets: Mapping[str, Any], prefixes: Sequence[str], children: Sequence[str]) -> str:
    """``key`` with wrapper prefixes stripped until it names a tensor of the network (or no prefix is left)."""
    while key not in targets:
        head, _, rest = key.partition(".")
        if head.isdigit() and rest and int(head) < len(children) and children[int(head)] != head:
            key = f"{children[int(head)]}.{rest}"  # nn.Sequential(*net.children()) layout
            continue
        p = next((p for p in prefixes if key.startswith(p) and len(key) > len(p)), None)
        if p is None:
            break
        key = key[len(p) :]
    return key


def match_state_dict(
    net: nn.Module, tensors: Mapping[str, torch.Tensor], strip_prefixes: Sequence[str] = ()
) -> tuple[dict[str, torch.Tensor], LoadInfo, dict[str, list[str]]]:
    """(state dict for ``net``, what was loaded/dropped, mismatches by kind: missing/unexpected/shape)."""
    target = net.state_dict()
    prefixes = (*strip_prefixes, *KNOWN_PREFIXES)
    children = [n for n, _ in net.named_children()]
    top = {k.split(".", 1)[0] for k in target}  # the network's own modules: a tensor under one is its business
    matched: dict[str, torch.Tensor] = {}
    info = LoadInfo(loaded=0)
    bad: dict[str, list[str]] = {"missing": [], "unexpected": [], "shape": []}
    for key, value in tensors.items():
        name = _rename(key, target, prefixes, children)
        if name in target:
            if tuple(value.shape) != tuple(target[name].shape):
                bad["shape"].append(
                    f"{name} {tuple(value.shape)} in the file, {tuple(target[name].shape)} in the model"
                )
            else:
                matched[name] = value
        elif name.split(".", 1)[0] in top:
            bad["unexpected"].append(name)
        else:
            info.dropped.append(key)
    for name in target:
        if name not in matched and not any(s.startswith(f"{name} ") for s in bad["shape"]):
            # BatchNorm's step counter is unused in eval mode and absent from files written before it existed.
            (info.missing_buffers if name.endswith("num_batches_tracked") else bad["missing"]).append(name)
    info.loaded = len(matched)
    return matched, info, bad


def _suggest_prefix(net: nn.Module, tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The leading name (``teacher.``, ``student.backbone.``) under which most of the network's tensors sit."""
    target = net.state_dict()
    children = [n for n, _ in net.named_children()]
    counts: dict[str, int] = {}
    for key in tensors:
        parts = key.split(".")
        for depth in (1, 2):
            if len(parts) > depth:
                p = ".".join(parts[:depth]) + "."
                if p not in KNOWN_PREFIXES and _rename(key[len(p) :], target, KNOWN_PREFIXES, children) in target:
                    counts[p] = counts.get(p, 0) + 1
    best = max(counts, key=lambda p: counts[p], default=None)
    return best if best is not None and counts[best] >= len(target) // 2 else None


def _guess_arch(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """A ``--backbone`` the file's names and shapes look like (torchvision ResNets, timm ViTs), or None."""
    names = [re.sub(r"^(?:(?:module|_orig_mod|model|backbone|encoder)\.)+", "", k) for k in tensors]
    depth = [
        1 + max((int(m.group(1)) for n in names if (m := re.match(rf"layer{i}\.(\d+)\.", n))), default=-1)
        for i in range(1, 5)
    ]
    if all(depth):
        bottleneck = any(re.search(r"\.conv3\.weight$", n) for n in names)
        arch = {
            (2, 2, 2, 2, False): "resnet18",
            (3, 4, 6, 3, False): "resnet34",
            (3, 4, 6, 3, True): "resnet50",
            (3, 4, 23, 3, True): "resnet101",
            (3, 8, 36, 3, True): "resnet152",
        }.get((depth[0], depth[1], depth[2], depth[3], bottleneck))
        stem = next((v for k, v in zip(names, tensors.values()) if k == "conv1.weight"), None)
        if (
            arch
            and stem is not None
            and stem.shape[-1] == 3
            and arch in backbone_names()
            and get_backbone(arch).small_stem
        ):
            return f"native:{arch} model.small_stem=true"  # the 32 px (CIFAR) stem
        return f"torchvision:{arch}" if arch else None
    first = next((v for k, v in zip(names, tensors.values()) if k == "features.0.weight"), None)
    if first is not None and first.dim() == 4:  # this package's small CNN: its first conv gives width and channels
        return f"native:small_cnn model.small_cnn.width={first.shape[0]} model.in_channels={first.shape[1]}"
    patch = next((v for k, v in zip(names, tensors.values()) if k == "patch_embed.proj.weight"), None)
    if patch is not None:
        size = {192: "tiny", 384: "small", 768: "base", 1024: "large"}.get(int(patch.shape[0]))
        return f"timm:vit_{size}_patch{patch.shape[-1]}_224" if size else None
    return None


def load_into(
    net: nn.Module,
    tensors: Mapping[str, torch.Tensor],
    *,
    path: str | Path,
    backbone: str,
    strip_prefixes: Sequence[str] = (),
) -> LoadInfo:
    """Load the file's tensors into ``net``; a one-line ``CheckpointError`` when they do not fit."""
    state, info, bad = match_state_dict(net, tensors, strip_prefixes)
    if any(bad.values()):
        parts = [
            f"{len(v)} {kind} ({'; '.join(v[:_SHOWN])}{', ...' if len(v) > _SHOWN else ''})"
            for kind, v in (
                ("backbone tensors missing from the file", bad["missing"]),
                ("tensors the model does not have", bad["unexpected"]),
                ("of another shape", bad["shape"]),
            )
            if v
        ]
        tries = []
        guess = _guess_arch(tensors)
        if guess and not guess.startswith(backbone + " ") and guess != backbone:
            tries.append(f"--backbone {guess} (what the file looks like)")
        prefix = _suggest_prefix(net, tensors) if bad["missing"] else None
        if prefix and prefix not in strip_prefixes:
            tries.append(f"--strip-prefix {prefix} (the tensors of the network seem to sit under it)")
        tries.append("another --backbone (the architecture the weights were trained as)")
        raise CheckpointError(
            f"weights file {str(path)!r} does not fit --backbone {backbone}: "
            f"{', '.join(parts)}; use {' or '.join(tries)}"
        )
    net.load_state_dict(state, strict=False)  # only num_batches_tracked may be left out (checked above)
    return info


def load_external_backbone(
    backbone: str,
    weights: str | Path,
    *,
    data_channels: int,
    model_cfg: ModelConfig | None = None,
    strip_prefixes: Sequence[str] = (),
) -> tuple[nn.Module, LoadInfo]:
    """(network in eval mode returning pooled features of ``data_channels``-channel images, LoadInfo)."""
    source, name = parse_backbone(backbone)
    net, dim, channels = build_external(source, name, model_cfg)
    tensors = read_weights(weights)
    info = load_into(net, tensors, path=weights, backbone=backbone, strip_prefixes=strip_prefixes)
    info.feature_dim, info.in_channels = dim, channels
    if channels != data_channels:
        if data_channels != 1:
            raise ConfigError(
                f"--backbone {backbone} takes {channels}-channel images but the data has "
                f"{data_channels}; evaluate it on {channels}-channel data"
            )
        net = ChannelRepeat(net, channels)
    return net.eval(), info
