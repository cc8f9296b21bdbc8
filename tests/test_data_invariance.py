"""N processes = 1 process for the data (docs/design.md §3b): the ranks' batches t, concatenated, are the batch t of
one process with the global batch, bit for bit; workers, resume and epochs behave; keyed random streams."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _data_helpers import probe_images

from hypersolid_scale.data import PRESETS
from hypersolid_scale.data.augment.tensor_aug import NUM_COLUMNS, keyed_uniforms
from hypersolid_scale.data.augment.transforms import build_pil_multicrop
from hypersolid_scale.data.loading.builtin_sets import ArraySplit
from hypersolid_scale.data.loading.common import batches_per_epoch, epoch_permutation, rank_indices
from hypersolid_scale.data.loading.random_access import (
    ArrayPILDataset,
    InMemoryMultiCropLoader,
    MapStyleMultiCropLoader,
)

N, GLOBAL_BATCH, SEED = 40, 8, 11
# The keyed FFCV crop decoder reads its epoch key in numba object mode (see data/formats/ffcv/crop.py): expected.
OBJMODE = pytest.mark.filterwarnings("ignore:Code running in object mode")
# Every augmentation on, small views: crops, flips, jitter (all four, RGB), grayscale, blur, solarize.
PRESET = replace(PRESETS["default"], global_crop_size=16, local_crop_size=8, num_local_views=2,
                 blur_probs=(1.0, 0.5, 0.5), solarize_prob=0.5)


def _split(n: int = N) -> ArraySplit:
    """Probe images; label = sample index, so a batch's labels say which samples it holds."""
    return ArraySplit(probe_images(n, 24, seed=4), np.arange(n), ())


def _in_memory(rank: int, world: int, **kw: Any) -> InMemoryMultiCropLoader:
    return InMemoryMultiCropLoader(_split(), PRESET, rank=rank, world_size=world, seed=SEED,
                                   batch_size=GLOBAL_BATCH // world, **kw)


def _map_style(rank: int, world: int, workers: int = 0) -> MapStyleMultiCropLoader:
    ds = ArrayPILDataset(_split(), "RGB", build_pil_multicrop(PRESET))
    return MapStyleMultiCropLoader(ds, rank=rank, world_size=world, seed=SEED, batch_size=GLOBAL_BATCH // world,
                                   num_workers=workers)


def _epoch(loader: Any, epoch: int = 0) -> list:
    loader.set_epoch(epoch)
    return list(loader)


def assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b) > 0
    for (va, la), (vb, lb) in zip(a, b):
        assert torch.equal(la, lb), f"labels differ: {la.tolist()} vs {lb.tolist()}"
        assert len(va) == len(vb)
        for x, y in zip(va, vb):
            assert torch.equal(x, y), f"views differ by up to {(x - y).abs().max().item():.3g}"


def assert_ranks_concatenate_to(ranks: list[list], reference: list) -> None:
    """Rank r's batch t = rows [r*b, (r+1)*b) of the reference's batch t."""
    assert all(len(r) == len(reference) for r in ranks)
    glued = [([torch.cat([r[t][0][v] for r in ranks]) for v in range(len(reference[t][0]))],
              torch.cat([r[t][1] for r in ranks])) for t in range(len(reference))]
    assert_same_batches(glued, reference)


# ---------------------------------------------------------------- the order -----------------------
@pytest.mark.parametrize("world", [1, 2, 4, 3])
def test_rank_indices_are_rows_of_the_global_batches(world: int) -> None:
    b = 5
    perm = epoch_permutation(103, seed=SEED, epoch=2)
    assert sorted(perm.tolist()) == list(range(103))
    ranks = [rank_indices(103, rank=r, world_size=world, batch_size=b, seed=SEED, epoch=2) for r in range(world)]
    n_batches = 103 // (world * b)
    assert n_batches == batches_per_epoch(103, world, b)
    for t in range(n_batches):  # reference: plain slicing of the permutation
        glued = np.concatenate([ranks[r][t * b:(t + 1) * b] for r in range(world)])
        np.testing.assert_array_equal(glued, perm[t * world * b:(t + 1) * world * b])
    assert all(len(r) == n_batches * b for r in ranks)


def test_the_permutation_depends_on_seed_and_epoch_only() -> None:
    a = epoch_permutation(50, seed=1, epoch=0)
    np.testing.assert_array_equal(a, epoch_permutation(50, seed=1, epoch=0))
    assert not np.array_equal(a, epoch_permutation(50, seed=1, epoch=1))
    assert not np.array_equal(a, epoch_permutation(50, seed=2, epoch=0))
    np.testing.assert_array_equal(epoch_permutation(5, seed=1, epoch=0, shuffle=False), np.arange(5))
    with pytest.raises(ValueError, match="rank must be in"):
        rank_indices(50, rank=2, world_size=2, batch_size=4, seed=0, epoch=0)


# ---------------------------------------------------------------- keyed uniforms ------------------
def test_keyed_uniforms_are_uniform_independent_and_keyed() -> None:
    u = keyed_uniforms(SEED, 3, torch.arange(20000), view=1)
    assert u.shape == (20000, NUM_COLUMNS) and u.dtype == torch.float32
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    # Mean 1/2 and variance 1/12 per column; columns uncorrelated (5 sigma bounds for 20000 draws).
    assert (u.mean(dim=0) - 0.5).abs().max() < 5 * (1 / 12 / 20000) ** 0.5
    assert (u.var(dim=0) - 1 / 12).abs().max() < 5 * (1 / 180 / 20000) ** 0.5
    corr = torch.corrcoef(u.T.double()) - torch.eye(NUM_COLUMNS, dtype=torch.float64)
    assert corr.abs().max() < 5 / 20000 ** 0.5
    # Neighbouring samples are unrelated too.
    assert torch.corrcoef(torch.stack([u[:-1, 0], u[1:, 0]]).double())[0, 1].abs() < 5 / 20000 ** 0.5
    # A row is a function of (seed, epoch, index, view) only: any subset, in any order, gives the same rows.
    pick = torch.tensor([19999, 7, 123, 7])
    assert torch.equal(keyed_uniforms(SEED, 3, pick, view=1), u[pick])
    for other in (keyed_uniforms(SEED + 1, 3, pick, 1), keyed_uniforms(SEED, 4, pick, 1),
                  keyed_uniforms(SEED, 3, pick, 2)):
        assert not torch.isclose(other, u[pick]).any()
    with pytest.raises(ValueError, match="1-D integer tensor"):
        keyed_uniforms(SEED, 0, torch.zeros(3), 0)


# ---------------------------------------------------------------- in-memory (tensor path) ---------
def test_in_memory_ranks_concatenate_to_one_process() -> None:
    reference = _epoch(_in_memory(0, 1))
    assert len(reference) == N // GLOBAL_BATCH
    assert sorted(torch.cat([lab for _, lab in reference]).tolist()) == list(range(N))
    for world in (2, 4):
        assert_ranks_concatenate_to([_epoch(_in_memory(r, world)) for r in range(world)], reference)
    # Next epoch: a different order and different views of the same samples.
    nxt = _epoch(_in_memory(0, 1), epoch=1)
    assert not torch.equal(nxt[0][1], reference[0][1])
    first = {int(i): v for i, v in zip(reference[0][1], reference[0][0][0])}
    again = [(v, first[int(i)]) for i, v in zip(torch.cat([lab for _, lab in nxt]), torch.cat([v[0] for v, _ in nxt]))
             if int(i) in first]
    assert again and not any(torch.equal(a, b) for a, b in again)


def test_in_memory_resume_mid_epoch_gives_the_same_next_batches() -> None:
    full = _epoch(_in_memory(1, 2), epoch=3)
    partial = _in_memory(1, 2)
    partial.set_epoch(3)
    it = iter(partial)
    next(it), next(it)
    resumed = _in_memory(1, 2)
    resumed.load_state_dict(partial.state_dict())
    resumed.set_epoch(3)
    assert_same_batches(list(resumed), full[2:])


# ---------------------------------------------------------------- map-style (PIL path) ------------
def test_pil_ranks_concatenate_to_one_process_and_workers_do_not_matter() -> None:
    reference = _epoch(_map_style(0, 1))
    assert len(reference) == N // GLOBAL_BATCH
    for world in (2, 4):
        assert_ranks_concatenate_to([_epoch(_map_style(r, world)) for r in range(world)], reference)
    assert_same_batches(_epoch(_map_style(0, 1, workers=2)), reference)
    # The same samples as the tensor path, in the same order.
    tensor_labels = [lab for _, lab in _epoch(_in_memory(0, 1))]
    assert all(torch.equal(a, b) for a, b in zip(tensor_labels, [lab for _, lab in reference]))
    assert not torch.equal(_epoch(_map_style(0, 1), epoch=1)[0][0][0], reference[0][0][0])


def test_pil_resume_and_the_callers_random_streams() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    full = _epoch(_map_style(0, 2), epoch=1)
    # Seeding per sample restores the process's generators: the trainer's streams are untouched.
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])
    partial = _map_style(0, 2)
    partial.set_epoch(1)
    it = iter(partial)
    next(it)
    resumed = _map_style(0, 2, workers=2)
    resumed.load_state_dict(partial.state_dict())
    resumed.set_epoch(1)
    assert_same_batches(list(resumed), full[1:])


# ---------------------------------------------------------------- FFCV ----------------------------
def _ffcv_or_skip() -> Any:
    from hypersolid_scale.data.formats.ffcv import loader as ffcv

    if ffcv.FFCV_IMPORT_ERROR is not None:
        pytest.skip(f"FFCV is not installed: {ffcv.FFCV_IMPORT_ERROR}")
    return ffcv


@pytest.fixture(scope="module")
def ids_beton(tmp_path_factory) -> Path:
    _ffcv_or_skip()
    from hypersolid_scale.data.formats.ffcv.beton_writer import write_beton

    path = tmp_path_factory.mktemp("ffcv_ids") / "ids.beton"
    # 120 kB images in FFCV's smallest pages (2 MiB): several pages, so that the quasi-random order has
    # something to do.
    images = probe_images(N, 200, seed=4)
    write_beton(str(path), [lambda a=a: a for a in images], list(range(N)), num_workers=1, page_size=1 << 21)
    return path


@pytest.mark.parametrize("mode", ["random", "quasi_random", "sequential"])
def test_ffcv_order_is_rows_of_the_global_batches(ids_beton: Path, mode: str) -> None:
    ffcv = _ffcv_or_skip()
    # A Loader compiles its pipelines only when iterated: building loaders to read their order is cheap.
    loaders = {(r, w): ffcv.FFCVLoader(str(ids_beton), PRESET, rank=r, world_size=w, seed=SEED,
                                       batch_size=GLOBAL_BATCH // w, device=torch.device("cpu"), num_workers=1,
                                       order=mode)
               for w in (1, 2, 4) for r in range(w)}
    for epoch in (3, 1):  # out of order on purpose: an epoch's order must not depend on earlier ones
        ref = loaders[0, 1]._order.rank_order(epoch)
        assert sorted(ref.tolist()) == list(range(N))
        for w in (2, 4):
            b = GLOBAL_BATCH // w
            ranks = [loaders[r, w]._order.rank_order(epoch) for r in range(w)]
            glued = np.concatenate([ranks[r].reshape(-1, b) for r in range(w)], axis=1).reshape(-1)
            np.testing.assert_array_equal(glued, ref)
    same = np.array_equal(loaders[0, 1]._order.rank_order(0), loaders[0, 1]._order.rank_order(1))
    assert same == (mode == "sequential")


@OBJMODE
@pytest.mark.slow
def test_ffcv_ranks_concatenate_to_one_process(ids_beton: Path) -> None:
    """Slow: every FFCV loader compiles its pipelines with numba (seconds each)."""
    ffcv = _ffcv_or_skip()

    def make(rank: int, world: int, threads: int) -> Any:
        return ffcv.FFCVLoader(str(ids_beton), PRESET, rank=rank, world_size=world, seed=SEED,
                               batch_size=GLOBAL_BATCH // world, device=torch.device("cpu"), num_workers=threads,
                               order="random")

    single = make(0, 1, threads=1)
    reference = _epoch(single)
    assert len(reference) == N // GLOBAL_BATCH
    for _, _, indices in single.raw_batches():  # labels were written as the sample index
        break
    assert torch.equal(reference[0][1], indices)
    # Two ranks, two decoding threads each: the same views, bit for bit.
    assert_ranks_concatenate_to([_epoch(make(r, 2, threads=2)) for r in range(2)], reference)
    assert_same_batches(_epoch(single), reference)  # reproducible (FFCV's own crops are not)
    nxt = _epoch(single, epoch=1)
    assert not torch.equal(nxt[0][1], reference[0][1])
    # Resume at batch 2 (FFCV starts there directly).
    single.load_state_dict({"epoch": 0, "batches_done": 2})
    single.set_epoch(0)
    assert_same_batches(list(single), reference[2:])


# ---------------------------------------------------------------- CUDA ----------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_draws_match_the_cpu_and_batch_splits_do_not_matter() -> None:
    from hypersolid_scale.data.augment.tensor_aug import TensorMultiCrop

    idx = torch.arange(0, 4000, 3)
    assert torch.equal(keyed_uniforms(SEED, 2, idx.cuda(), 1).cpu(), keyed_uniforms(SEED, 2, idx, 1))
    images = torch.from_numpy(probe_images(16, 24, seed=4)).permute(0, 3, 1, 2)
    crop = TensorMultiCrop(PRESET, "cuda", seed=SEED)
    whole_rec: dict = {}
    whole = crop(images, torch.arange(16), 5, record=whole_rec)
    halves_rec: dict = {}
    halves = [crop(images[s], torch.arange(16)[s], 5, record=halves_rec) for s in (slice(0, 8), slice(8, 16))]
    n_views = len(whole)
    for key, per_view in whole_rec.items():  # the same decisions, whatever the batch
        for v in range(n_views):
            assert torch.equal(per_view[v], torch.cat([halves_rec[key][v], halves_rec[key][n_views + v]])), key
    for v in range(n_views):
        assert torch.equal(whole[v], torch.cat([h[v] for h in halves])), \
            f"view {v} differs by {(whole[v] - torch.cat([h[v] for h in halves])).abs().max().item():.3g}"
