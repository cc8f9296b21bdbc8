"""The device stage of `data.views_on=device`: each image decoded once, on the training device, and every view
cut from that decode.

- `views.py`: the host stage (decode + draws in DataLoader workers) and the device stage (`DeviceStage`);
- `batched_resize.py`: PIL's antialiased bicubic resize of one crop box per image, batched;
- `prefetch.py`: the device stage run ahead of the training step, in its own thread and CUDA stream.
"""
