"""The README's qualitative figures: hypercolumn PCA, Grad-CAM and feature inversion of a trained checkpoint.

    python benchmarks/qualitative_figures.py --checkpoint runs/quickstart/checkpoints/step_00000600.pt \
        [--out docs/images/qualitative] [--images 8] [--steps 400] [--seed 0] [--threads 1]

Renders ``--images`` test images, the first of each class in turn, through
``eval.qualitative.render_qualitative`` and writes one PNG per analysis to ``--out``. ``--steps`` is the
feature inversion's Adam steps per scale (the paper's 4000 on ImageNet; the 28 px Fashion-MNIST quickstart
converges far sooner). Analyses that do not apply (attention maps on a CNN) are listed as skipped. Prints the
time taken and each PNG's size.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

from hypersolid_scale.checkpoint import build_model_from_checkpoint
from hypersolid_scale.data import build_eval_datasets, resolve_preset
from hypersolid_scale.data.loading.builtin_sets import FASHION_MNIST_CLASSES
from hypersolid_scale.eval.qualitative import render_qualitative
from hypersolid_scale.eval.skips import SkipLog, SkippedWarning

MAX_PNG_BYTES = 300 * 1024  # README images stay small in the repository


def first_of_each_class(ds: torch.utils.data.Dataset, n: int, scan: int = 2000) -> tuple[torch.Tensor, list[int]]:
    """``n`` images of ``ds``: the first sample of each class in class order, then the second of each, ...
    (among the first ``scan`` samples)."""
    by_class: dict[int, list[int]] = {}
    for i in range(min(len(ds), scan)):  # type: ignore[arg-type]
        by_class.setdefault(int(ds[i][1]), []).append(i)
    order = [
        idx for rank in range(n) for y in sorted(by_class) if rank < len(by_class[y]) for idx in [by_class[y][rank]]
    ][:n]
    return torch.stack([ds[i][0] for i in order]), [int(ds[i][1]) for i in order]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", default="docs/images/qualitative")
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--steps", type=int, default=400, help="feature-inversion Adam steps per scale")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    model, cfg = build_model_from_checkpoint(args.checkpoint)
    _, test = build_eval_datasets(cfg.data)
    images, labels = first_of_each_class(test, args.images)
    fmnist = cfg.data.format == "builtin" and cfg.data.builtin_name() == "fashion_mnist"
    names = list(FASHION_MNIST_CLASSES) if fmnist else None
    preset = resolve_preset(cfg.data)
    t1 = time.perf_counter()
    skips = SkipLog()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedWarning)  # listed below instead
        paths = render_qualitative(
            model,
            images,
            labels,
            args.out,
            mean=preset.mean,
            std=preset.std,
            class_names=names,
            seed=args.seed,
            inversion_steps=args.steps,
            skips=skips,
        )
    t2 = time.perf_counter()
    print(
        f"{len(labels)} images of {args.checkpoint} ({cfg.model.arch}, {tuple(images.shape[1:])}); "
        f"load {t1 - t0:.1f} s, render {t2 - t1:.1f} s, {torch.get_num_threads()} threads"
    )
    too_big = []
    for name, path in paths.items():
        size = path.stat().st_size
        print(f"  {name:13s} {path}  {size / 1024:.0f} KiB")
        if size > MAX_PNG_BYTES:
            too_big.append(name)
    for name, why in skips.reasons.items():
        print(f"  {name:13s} skipped: {why}")
    if too_big:
        print(f"PNGs over {MAX_PNG_BYTES // 1024} KiB: {too_big}; use fewer --images", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
