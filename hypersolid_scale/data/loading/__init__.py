"""Loading: what every training loader shares, the loaders over random-access data, evaluation datasets.

- `protocol.py`: `TrainLoader`, what the trainer, the builder and the resume ask of a training loader;
- `common.py`: the epoch order and its split by rank, keyed random streams, resume bookkeeping, manifests;
- `random_access.py`: in-memory arrays (batched tensor multi-crop) and map-style datasets of PIL images;
- `run_stream.py`: one worker pool and stage thread for the whole run;
- `builtin_sets.py`: the built-in datasets (Fashion-MNIST, digits) as in-memory uint8 arrays;
- `eval_datasets.py`: deterministic evaluation images for feature extraction.

A storage format's own reader lives in its folder under `formats/`.
"""
