"""``python -m hypersolid_scale.export --checkpoint CK --out DIR`` (also ``launch/export.py``): bad input is one
``error:`` line and exit 2 (``HS_DEBUG=1`` shows the traceback)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from hypersolid_scale.safety.errors import run_cli

__all__ = ["cli", "main"]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hypersolid_scale.export",
        description="Export a training checkpoint's encoder (torchvision / timm layout) and projector.",
    )
    p.add_argument(
        "--checkpoint", required=True, help="a step_*.pt file (or step_*.dcp folder) written by launch/train.py"
    )
    p.add_argument("--out", required=True, help="directory to write into (created with its parents)")
    return p.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    from hypersolid_scale.export.writer import export_checkpoint

    args = parse_args(argv)
    meta = export_checkpoint(args.checkpoint, args.out)
    where = f"{meta['library']}:{meta['library_model']}" if meta["library"] else "this package's own module"
    files = ", ".join(meta["files"].values())
    print(
        f"exported {meta['arch']} (step {meta['step']}, method {meta['method']}, {meta['feature_dim']} features) "
        f"as {where} to {args.out}: {files}, export.json"
    )
    if meta.get("library_note"):
        print(f"note: {meta['library_note']}")
    if meta.get("eval"):
        print("evaluate it: python launch/eval.py " + " ".join(meta["eval"]).replace("<out>", str(args.out)))
    return 0


def cli(argv: Sequence[str]) -> int:
    return run_cli(main, argv)
