"""FFCV: `.beton` files (image + label), read (data.format=ffcv) and written (the converter).

- `loader.py`: the training loader (`FFCVLoader`) and the evaluation dataset of a `.beton`;
- `crop.py`: the loader's crop + flip decoder, its draws keyed per sample;
- `beton_writer.py`: writing `.beton` files (`write_beton`), what `python -m hypersolid_scale.data.convert`
  writes with `--formats ffcv`.

The format's registry entry is `hypersolid_scale/data/formats/ffcv.py`. This package imports nothing itself:
FFCV and torch are loaded only by the modules that need them.
"""
