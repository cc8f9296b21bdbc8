"""Convert images to WebDataset shards, FFCV .beton files and/or an image folder, with a manifest.

    python -m hypersolid_scale.data.convert --folder /data/photos --out data/photos
    python -m hypersolid_scale.data.convert --builtin fashion_mnist --out data/fmnist
    python -m hypersolid_scale.data.convert --torchvision CIFAR10 --root ~/cifar --out data/cifar10
    python -m hypersolid_scale.data.convert --torchvision STL10 --root ~/stl10 --out data/stl10 \\
        --split train,test,unlabeled --formats webdataset

Output: OUT/<split>/shard-000000.tar ..., OUT/<split>.beton, OUT/imagefolder/<split>/<class>/*.png,
OUT/manifest.json (classes, counts per class, shards with sha256, bad files and their counts; a split
without labels, e.g. STL-10's "unlabeled", is marked "labeled": false and its samples have label -1).
Every file is written to a temporary name and renamed when complete; OUT/.progress.json records finished
shards so that `--resume` continues an interrupted run. An existing complete output is never touched:
the command refuses (exit 2) unless --resume (then it checks and does nothing).

Bad images are listed, counted and skipped: files that do not decode, and images whose header claims a
side over --max-side pixels (checked before decoding; a small file can claim 9000 x 9000 pixels and would
decode to 243 MB); a split left without any image is an error (exit 2). Images stream one at a time from
the source to the outputs, so memory does not grow with the number of images.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from hypersolid_scale.data.convert.converter import DEFAULT_MAX_SIDE, Converter
from hypersolid_scale.data.convert.sources import Source, builtin_source, folder_source, torchvision_source
from hypersolid_scale.data.formats import conversion_formats
from hypersolid_scale.data.loading.builtin_sets import BUILTIN_DATASETS
from hypersolid_scale.safety.errors import ConfigError

__all__ = ["main"]


def _source(p: argparse.ArgumentParser, args: argparse.Namespace) -> Source:
    splits = [s.strip() for s in (args.split or "train,test").split(",") if s.strip()]
    if args.folder:
        source = folder_source(args.folder)
    elif args.builtin:
        source = builtin_source(args.builtin, args.root)
    else:
        if not args.root:
            p.error("--torchvision needs --root")
        return torchvision_source(args.torchvision, args.root, splits)
    if args.split:  # folder and builtin sources: keep the named splits
        missing = [s for s in splits if s not in source.splits]
        if missing:
            raise ConfigError(f"--split {missing} not in this source's splits {sorted(source.splits)}")
        source.splits = {s: source.splits[s] for s in splits}
    return source


def main(argv: Sequence[str] | None = None) -> int:
    known = tuple(conversion_formats())  # the formats with a converter writer, by the names data.format reads
    p = argparse.ArgumentParser(
        prog="python -m hypersolid_scale.data.convert",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--folder", help="image folder: ROOT/<class>/* or ROOT/{train,test}/<class>/*")
    src.add_argument("--builtin", choices=BUILTIN_DATASETS, help="a built-in dataset")
    src.add_argument(
        "--torchvision",
        help="torchvision.datasets class name (already downloaded to --root); "
        "STL10 is read from its binary files directly",
    )
    p.add_argument("--root", help="dataset root for --torchvision; idx directory for --builtin fashion_mnist")
    p.add_argument(
        "--split",
        default=None,
        help="comma list of splits to convert (default: train,test; "
        "STL10 also has 'unlabeled', 100,000 images without labels)",
    )
    p.add_argument("--out", required=True)
    p.add_argument("--formats", default="webdataset,ffcv", help=f"comma list of {known}")
    p.add_argument("--shard-size", type=int, default=5000, help="samples per tar shard")
    p.add_argument("--image-format", choices=("png", "jpg"), default="png")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality")
    p.add_argument("--mode", choices=("keep", "RGB", "L"), default="keep", help="color mode of stored images")
    p.add_argument("--resize", type=int, default=None, help="resize every image to N x N (e.g. 224)")
    p.add_argument(
        "--max-side",
        type=int,
        default=DEFAULT_MAX_SIDE,
        help=f"skip (and list) images whose header claims a longer side, in pixels (default {DEFAULT_MAX_SIDE})",
    )
    p.add_argument("--ffcv-mode", choices=("raw", "jpg", "smart"), default="raw", help="FFCV image storage")
    p.add_argument("--resume", action="store_true", help="continue an interrupted conversion into --out")
    p.add_argument("--limit", type=int, default=None, help="keep the first N images of each split (quick tries)")
    args = p.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in known]
    if bad or not formats:
        p.error(f"--formats: {bad or formats} not in {known}")
    if args.shard_size < 1:
        p.error("--shard-size must be >= 1")
    if args.max_side < 1:
        p.error("--max-side must be >= 1")
    conv = Converter(
        args.out,
        formats=formats,
        shard_size=args.shard_size,
        image_format=args.image_format,
        quality=args.quality,
        mode=args.mode,
        resize=args.resize,
        resume=args.resume,
        ffcv_mode=args.ffcv_mode,
        max_side=args.max_side,
    )
    source = _source(p, args)
    if conv.check_output():
        return 0
    splits = source.splits if args.limit is None else {k: v[: args.limit] for k, v in source.splits.items()}
    manifest = conv.run(source.classes, splits, source.description, source.unlabeled)
    counts = {s: e["count"] for s, e in manifest["splits"].items()}
    n_bad = manifest["bad_counts"]
    print(
        f"wrote {args.out}: {counts} samples, {sum(n_bad.values())} bad files skipped "
        f"({n_bad['too_large']} over --max-side, {n_bad['undecodable']} undecodable)"
    )
    return 0
