"""``dist.precision`` (auto | bf16 | fp32 | fp64) and its former spelling ``dist.bf16`` (auto | true | false).

``dist.bf16`` is still read, in a YAML file, an override or a stored config (a checkpoint's): auto -> auto,
true -> bf16, false -> fp32. A later layer wins in either spelling, as for any key; both keys in the same layer
saying different things is an error, and ``config.yaml`` holds ``dist.precision`` only.
"""

from __future__ import annotations

from typing import Any

from hypersolid_scale.safety.errors import ConfigError

__all__ = ["PRECISIONS", "bf16_as_precision", "check_precision"]

PRECISIONS = ("auto", "bf16", "fp32", "fp64")

_BF16_AS_PRECISION = {"auto": "auto", "true": "bf16", "false": "fp32"}  # dist.bf16, dist.precision's former spelling


def bf16_as_precision(d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` (one file, one override or a stored config) with ``dist.bf16`` written as ``dist.precision``:
    auto -> auto, true -> bf16, false -> fp32 (YAML's booleans accepted). Later layers win as for any key;
    both keys in the same layer saying different things is a ConfigError."""
    dist = d.get("dist")
    if not isinstance(dist, dict) or "bf16" not in dist:
        return d
    said = str(dist["bf16"]).lower()
    if said not in _BF16_AS_PRECISION:
        raise ConfigError(
            f"config key 'dist.bf16' = {dist['bf16']!r} ({where}) is not allowed; choose one of: auto | true | false "
            "(or its successor dist.precision: auto | bf16 | fp32 | fp64)"
        )
    precision = _BF16_AS_PRECISION[said]
    if "precision" in dist and str(dist["precision"]).lower() != precision:
        raise ConfigError(
            f"config keys 'dist.bf16' = {said} (dist.precision={precision}) and 'dist.precision' = "
            f"{dist['precision']!r} ({where}) disagree; keep dist.precision only (dist.bf16 is its former spelling)"
        )
    return {**d, "dist": {**{k: v for k, v in dist.items() if k != "bf16"}, "precision": precision}}


def check_precision(precision: str, engine: str) -> None:
    if precision == "fp64" and engine != "ddp":
        raise ConfigError(
            "dist.precision=fp64 runs under dist.engine=ddp only (DeepSpeed's optimizer and its flat buffers are "
            "not checked in float64); set dist.engine=ddp or another dist.precision"
        )
