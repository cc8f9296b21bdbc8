"""``dist.precision`` (auto | bf16 | fp32 | fp64) and what it runs under. Its former spelling ``dist.bf16``
(auto | true | false) is read through the table of former keys (``config/former_keys.py``)."""

from __future__ import annotations

from hypersolid_scale.safety.errors import ConfigError

__all__ = ["PRECISIONS", "check_precision"]

PRECISIONS = ("auto", "bf16", "fp32", "fp64")


def check_precision(precision: str, engine: str) -> None:
    if precision == "fp64" and engine != "ddp":
        raise ConfigError(
            "dist.precision=fp64 runs under dist.engine=ddp only (DeepSpeed's optimizer and its flat buffers are "
            "not checked in float64); set dist.engine=ddp or another dist.precision"
        )
