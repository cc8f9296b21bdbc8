"""WebDataset: tar shards of (image, class) samples, read (data.format=webdataset) and written (the converter).

- `stream.py`: the training loader (`WebDatasetLoader`): shards streamed through the webdataset library
  into multi-crop batches, split by rank and by worker, one DataLoader for the whole run;
- `rank_streams.py`: what each DataLoader worker reads and decodes, epoch after epoch (`ShardStream`);
- `index.py`: random access into shards for evaluation (`ShardIndexDataset`);
- `shards.py`: the conversion manifest, and reading one shard with its integrity checks;
- `urls.py`: the shard URLs data.path names, and opening one as a byte stream;
- `shard_writer.py`: writing shards (`ShardWriter`), what `python -m hypersolid_scale.data.convert` writes.

The format's registry entry is `hypersolid_scale/data/formats/webdataset.py`. This package imports nothing
itself, so that importing one of its modules loads only what that module needs.
"""
