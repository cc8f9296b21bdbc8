"""Augmentation: the multi-crop presets (the paper's table as data) and the code that draws and applies them.

- `presets.py`: the presets (`MultiCropPreset`, `resolve_preset`);
- `transforms.py`: the PIL path, lightly's DINOTransform per sample: the semantic reference;
- `tensor_aug.py`: the batched tensor path for in-memory images (`TensorMultiCrop`);
- `photometric.py`, `color.py`, `blur.py`: the batched photometric chain, with the PIL path's semantics;
- `keyed_draws.py`: per-sample draws that follow the sample, not a generator's history;
- `view_params.py`: the PIL path's random decisions, drawn without touching a pixel (for the device stage).
"""
