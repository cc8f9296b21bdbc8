"""One run of the replication study as data (``Run``), the configs its methods start from, and the
settings every run, and every quick (test) run, adds: what plan.py (the cpu group) and gpu_plan.py build on.
"""

from __future__ import annotations

from dataclasses import dataclass

HYPERSOLID = "configs/quickstart.yaml"
CONFIGS = {
    "hypersolid": HYPERSOLID,
    "simclr": "configs/baselines/simclr_quickstart.yaml",
    "swav": "configs/baselines/swav_quickstart.yaml",
    "barlowtwins": "configs/baselines/barlowtwins_quickstart.yaml",
}
# Every run: no tracking server, no per-step bar, no online kNN monitor (the driver evaluates the saved
# checkpoints offline), the full epochs (the quickstart's max_steps=600 cap off).
COMMON = ("tracking.enabled=false", "progress=false", "eval.every_n_epochs=0", "max_steps=0")
# Quick: tiny data, batch and network so that a run trains and evaluates in seconds on a CPU (4 steps);
# a step checkpoint halfway through the epoch lets tests stop and resume a run mid-way.
QUICK = (
    "data.max_pretrain_samples=128",
    "data.global_batch_size=32",
    "checkpoint.every_n_steps=2",
    "model.small_cnn.width=8",
)
QUICK_HEADS = {
    "hypersolid": ("method.hypersolid.hidden_dim=64", "method.hypersolid.out_dim=64"),
    "simclr": ("method.simclr.hidden_dim=64",),
    "swav": ("method.swav.hidden_dim=64", "method.swav.n_prototypes=30"),
    "barlowtwins": ("method.barlowtwins.hidden_dim=64", "method.barlowtwins.out_dim=64"),
}
QUICK_EVAL = ("eval.max_train_samples=256", "eval.max_test_samples=128")


@dataclass(frozen=True)
class Run:
    name: str
    method: str
    config: str
    overrides: tuple[str, ...]  # the study's own settings (what the run varies), without COMMON
    seed: int
    group: str
    part: str
    epochs: int
    curve: bool = False  # evaluate every epoch's checkpoint, not only the final one
    # > 0: evaluate (full protocol) the checkpoint at every multiple of this step and the last one: the
    # exclusion-zone diagnostic and the clustering over training within an epoch.
    eval_every_steps: int = 0
    # Evaluate (full protocol) the checkpoints at the end of these epochs, not only the last.
    eval_epochs: tuple[int, ...] = ()
    # Evaluate the run's initial weights (step 0) instead of trained ones: one step is trained only to write
    # a checkpoint with the run's config, then replaced by the initial weights (random_init.py).
    random_init: bool = False
    # Amendment 3's HDBSCAN diagnosis: the final checkpoint also gets the hdbscan_grid suite on the backbone and
    # the projector features (DIAG_EVAL_ARGS); ``diagnose_only``: that and nothing else (the random inits).
    diagnose: bool = False
    diagnose_only: bool = False
    # The HDBSCAN diagnosis of the checkpoints at the end of these epochs too (amendment 4: the 100-epoch curve's
    # epoch 20, the same weights as a 20-epoch run of its settings and seed under the constant learning rate).
    diagnose_epochs: tuple[int, ...] = ()
    # Train in stages: stop (SIGTERM, a checkpoint) at the end of each of these epochs, evaluate the eval_epochs
    # reached, write the result so far ("complete": false), and resume after every other run has reached the same
    # stage (the 100-epoch curve: every seed at 50 epochs before any goes on to 100).
    pause_epochs: tuple[int, ...] = ()

    def train_overrides(self, device: str, quick: bool) -> list[str]:
        """Everything after ``--config``: the study's settings, then what the driver needs to run it."""
        every = 100 if self.group == "cpu" else 0
        ckpt = (
            # Curves keep every epoch's checkpoint for evaluation; the gpu group's runs are short enough
            # to restart an epoch, the cpu group's (5 min/epoch here) save every 100 steps to resume.
            ["checkpoint.keep_last=0", "checkpoint.every_n_steps=0"]
            if self.curve or self.random_init or self.diagnose_only
            else ["checkpoint.keep_last=0", f"checkpoint.every_n_steps={self.eval_every_steps}"]
            if self.eval_every_steps
            else ["checkpoint.keep_last=0", f"checkpoint.every_n_steps={every}"]
            if self.eval_epochs
            else ["checkpoint.keep_last=2", f"checkpoint.every_n_steps={every}"]
        )
        return [
            *self.overrides,
            f"seed={self.seed}",
            f"epochs={self.epochs}",
            *COMMON,
            *(("max_steps=1",) if self.random_init else ()),  # after COMMON's max_steps=0
            f"dist.device={device}",  # the quickstart configs say cpu
            *ckpt,
            *((*QUICK, *QUICK_HEADS[self.method]) if quick else ()),
        ]


def _knob(key: str, v: float) -> str:
    return f"{key.rsplit('.', 1)[1]}{v:g}"
