"""Synthetic embeddings for ``benchmarks/eval.py`` (kept apart from the measuring code): 10 overlapping classes
for the metrics' timings (``make_embeddings``), and unit-norm features shaped like a trained encoder's, with
many classes and background points, for density clustering at scale (``cluster_embeddings``)."""

from __future__ import annotations

import numpy as np


def make_embeddings(
    n_train: int, n_test: int, d: int, seed: int = 0, latent: int = 16, spread: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train/test splits of ReLU(W z + small noise), z = class centre + noise in a 16-d latent: 10 overlapping
    classes (kNN well below 100 %), ~half the activations zero as after a ResNet's last block."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((10, latent)).astype(np.float32)
    proj = rng.standard_normal((latent, d)).astype(np.float32) / np.sqrt(latent)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.permutation(np.arange(n) % 10)
        z = centres[y] + spread * rng.standard_normal((n, latent), dtype=np.float32)
        x = z @ proj + 0.1 * rng.standard_normal((n, d), dtype=np.float32)  # (n, latent) @ (latent, d)
        return np.maximum(x, 0.0, out=x), y

    return (*split(n_train), *split(n_test))


def cluster_embeddings(
    n: int, d: int, classes: int, seed: int = 0, background: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) unit-norm float32 features shaped like a trained encoder's, and labels (-1: background).

    Class centres come in superclasses of 10 (related classes lie closer, as ImageNet's dog breeds do),
    each class has its own spread, features are ReLU'd (non-negative, ~half zero, as after a ResNet's
    last block) and L2-normalised; 5 % background points belong to no class (DBSCAN/HDBSCAN noise).
    Generated in chunks, normalised in place: the (n, d) array is the only full-size copy.
    """
    rng = np.random.default_rng(seed)
    groups = rng.standard_normal((-(-classes // 10), d), dtype=np.float32)
    centres = groups[np.arange(classes) // 10] + 0.8 * rng.standard_normal((classes, d), dtype=np.float32)
    spread = rng.uniform(0.8, 1.6, classes).astype(np.float32)
    y = rng.integers(0, classes, n)
    y[rng.random(n) < background] = -1
    x = np.empty((n, d), np.float32)
    for s in range(0, n, 8192):
        yy = y[s : s + 8192]
        noise = rng.standard_normal((len(yy), d), dtype=np.float32)
        z = np.maximum(np.where(yy[:, None] >= 0, centres[yy] + spread[yy, None] * noise, 2.0 * noise), 0.0)
        x[s : s + 8192] = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    return x, y
