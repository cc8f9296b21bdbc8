"""The converter: images -> WebDataset shards, FFCV .beton files and/or an image folder, with a manifest.

    python -m hypersolid_scale.data.convert --folder /data/photos --out data/photos

- `cli.py`: the command line (`main`; its docstring is the command's help);
- `converter.py`: the shared wiring, streaming a source's splits to each chosen format's writer;
- `images.py`: the per-image steps (decompression-bomb guard, colour mode, resize, encoding);
- `sources.py`: what the converter reads (an image folder, a builtin set, a torchvision root, STL-10).

Each format's writer is its `ConversionTarget`, in its folder under `formats/`.
"""

from hypersolid_scale.data.convert.cli import main

__all__ = ["main"]
