"""Evaluation datasets: deterministic (resize, center-crop, normalise) images for feature extraction."""

from __future__ import annotations

import torch
from PIL import Image
from torch.utils.data import Dataset

from hypersolid_scale.data.augment.presets import MultiCropPreset
from hypersolid_scale.data.augment.transforms import build_eval_transform, pil_mode
from hypersolid_scale.data.loading.builtin_sets import ArraySplit
from hypersolid_scale.data.loading.random_access import array_to_tensor


class ArrayEvalDataset(Dataset):
    """(image (C, H, W) float normalised, label) from in-memory uint8 arrays.

    When the images already have the eval size (Fashion-MNIST at 28 px, digits resized once), the
    resize/crop is the identity and the whole split is normalised once as a tensor; otherwise every item
    goes through the PIL eval transform.
    """

    def __init__(self, split: ArraySplit, preset: MultiCropPreset) -> None:
        self.split, self.preset = split, preset
        self.labels = torch.from_numpy(split.labels).long()
        h, w = split.images.shape[1:3]
        self._tf = build_eval_transform(preset)
        self._mode = pil_mode(preset)
        self._tensor = None
        if h == w == preset.eval_resize == preset.global_crop_size:
            x = array_to_tensor(split.images).float().div_(255.0)
            mean = torch.tensor(preset.mean).view(1, -1, 1, 1)
            std = torch.tensor(preset.std).view(1, -1, 1, 1)
            self._tensor = (x - mean) / std

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self._tensor is not None:
            return self._tensor[i], int(self.labels[i])
        img = Image.fromarray(self.split.images[i]).convert(self._mode)
        return self._tf(img), int(self.labels[i])
