"""The interface every method implements, and what the methods share: encoding views, the EMA teacher."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
from lightly.models.utils import deactivate_requires_grad, update_momentum
from lightly.utils.scheduler import cosine_schedule
from torch import nn

from hypersolid_scale.methods.params import check_section
from hypersolid_scale.safety.errors import ConfigError

Outputs = dict[str, list[torch.Tensor]]  # what Method.embed hands Method.loss: (B, ...) tensors by name


def count_global_views(views: list[torch.Tensor]) -> int:
    """Global views are the leading views of ``views[0]``'s (C, H, W); local views (smaller crops) follow."""
    if isinstance(views, torch.Tensor) or not isinstance(views, (list, tuple)) or len(views) == 0:
        raise ValueError("a method expects a non-empty list of view tensors (B, C, H, W), global views first")
    n = 1
    while n < len(views) and views[n].shape == views[0].shape:
        n += 1
    for i, v in enumerate(views[n:], start=n):
        if v.shape[:2] != views[0].shape[:2] or v.shape == views[0].shape:
            raise ValueError(
                f"view {i} has shape {tuple(v.shape)}: views must be the global views "
                f"{tuple(views[0].shape)} first, then smaller local views with the same B and C"
            )
    return n


def group_views_by_resolution(views: list[torch.Tensor]) -> list[list[int]]:
    """Indices of views sharing a (C, H, W) shape, groups in order of first appearance.

    >>> # [224, 224, 96, 96, 96] -> [[0, 1], [2, 3, 4]]
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(tuple(v.shape[1:]), []).append(i)
    return list(groups.values())


def encode(backbone: nn.Module, views: list[torch.Tensor], *, separate: bool) -> list[torch.Tensor]:
    """Backbone features (B, F) of each view, in view order.

    ``separate``: one backbone call per view, so BatchNorm normalises each view on its own, as the official
    implementations of BYOL, Barlow Twins and VICReg do. Otherwise views of equal size go through
    ONE call (the multi-crop batching of SwaV and DINO; SimCLR concatenates its two views too).
    """
    if separate:
        return [backbone(v) for v in views]
    out: list[torch.Tensor | None] = [None] * len(views)
    for group in group_views_by_resolution(views):
        feats = backbone(torch.cat([views[i] for i in group])).chunk(len(group))
        for i, f in zip(group, feats):
            out[i] = f
    return out  # type: ignore[return-value]


def project(head: nn.Module, feats: list[torch.Tensor], *, separate: bool) -> list[torch.Tensor]:
    """Apply ``head`` to every view's features: per view, or in one call over all views (BatchNorm in the
    head then sees every view of the batch together)."""
    if separate:
        return [head(f) for f in feats]
    return list(head(torch.cat(feats)).chunk(len(feats)))


def make_teacher(module: nn.Module, fresh: nn.Module | None = None) -> nn.Module:
    """A frozen copy of ``module`` that only follows the student by EMA.

    ``fresh``: a new instance of the same architecture to load ``module``'s weights into, for modules that
    cannot be deep-copied (``torch.nn.utils.weight_norm``'s computed weight, as in DINO's head).
    """
    if fresh is None:
        teacher = copy.deepcopy(module)
    else:
        teacher = fresh
        teacher.load_state_dict(module.state_dict())
        teacher.train(module.training)
    deactivate_requires_grad(teacher)
    return teacher


class Method(nn.Module):
    """One self-supervised method: heads, loss and any state beyond the backbone (see the package docstring).

    A method is registered under ``name`` (``@register`` from :mod:`.registry`); its hyperparameters are the
    ``Config`` dataclass, the run config's ``method.<name>`` section.

    Attributes:
        name: the value of ``method.name`` that selects it.
        display_name: how reports, figures and the command line name it (its paper's spelling).
        Config: the dataclass of its ``method.<name>.*`` keys (fields may declare kinds in ``KINDS``, checked
            by :func:`~hypersolid_scale.methods.params.check_section`; a ``validate()`` method is called too).
        order: where it is listed among the methods (``method_names``).
        uses_local_views: the method consumes local (multi-crop) views; the others use the two global views.
        tells_views_by_size: a view smaller than the first is local (DINO, SwaV): local crops must be smaller.
        stats_reduced: ``forward``'s statistics already hold the global batch's values (the trainer does not
            average them over ranks again).
        projection_head: the attribute holding its projection head (backbone features (N, F) -> (N, D)): what
            ``eval.features=projector`` and the evaluation protocol's projector features read, and what
            ``export`` writes as the encoder's projector (``projector.safetensors``); empty: it has none.
        stateful: a step changes state beyond what the optimizer updates (a momentum teacher, a queue, a
            center), so a second step does not start where the first did; tests take two steps of such a method.
        epoch_terms: the epoch line's terms, ``(label, statistic, format)`` each, read from the epoch's mean
            statistics; empty: ``<name> loss``.
        steps_per_epoch: converts the papers' epoch-based schedules (DINO, SwaV) into steps.
        target_keys: the keys of :meth:`embed`'s outputs computed without gradient (a momentum teacher's).
    """

    name: ClassVar[str] = ""
    display_name: ClassVar[str] = ""
    Config: ClassVar[type]
    order: ClassVar[int] = 100
    uses_local_views: ClassVar[bool] = False
    tells_views_by_size: ClassVar[bool] = False
    stats_reduced: ClassVar[bool] = False
    projection_head: ClassVar[str] = ""
    target_keys: ClassVar[tuple[str, ...]] = ()
    stateful: ClassVar[bool] = False
    epoch_terms: ClassVar[tuple[tuple[str, str, str], ...]] = ()

    @classmethod
    def build(cls, section: Any, *, backbone: nn.Module, feature_dim: int, steps_per_epoch: int) -> Method:
        """The method from its config section; most take ``(feature_dim, section, steps_per_epoch)``."""
        return cls(feature_dim, section, steps_per_epoch)  # type: ignore[call-arg]

    @classmethod
    def validate_section(cls, section: Any) -> None:
        """Raise ConfigError naming the first bad ``method.<name>.<key>``."""
        check_section(f"method.{cls.name}", section)
        if hasattr(section, "validate"):
            try:
                section.validate()
            except ConfigError:
                raise
            except ValueError as err:
                raise ConfigError(str(err)) from None

    @classmethod
    def frozen_by_schedule(cls, section: Any) -> tuple[str, int] | None:
        """``(key, value)`` of a schedule that drops gradients of a frozen part before the optimizer step
        (DINO's last layer, SwaV's prototypes), when it is on; None otherwise."""
        return None

    @classmethod
    def per_rank_state(cls, section: Any) -> tuple[str, str] | None:
        """``(key, what)`` when the section keeps state per rank in a buffer (SwaV's queue) that DDP would overwrite
        with rank 0's at every step (config/combinations.check_per_rank_state); None otherwise."""
        return None

    @classmethod
    def compile_refusal(cls, section: Any) -> str:
        """Why ``dist.compile=true`` must not compile this method's forward with the backbone, with ``section``
        (a host read or Python state that changes the graph between steps), as one line naming the key that
        decides it; empty: the whole step's module may be compiled (:mod:`hypersolid_scale.training.compile_scope`).
        """
        return ""

    def __init__(self, steps_per_epoch: int = 1) -> None:
        super().__init__()
        if int(steps_per_epoch) < 1:
            raise ValueError(f"steps_per_epoch={steps_per_epoch} must be >= 1")
        self.steps_per_epoch = int(steps_per_epoch)
        # Optimizer steps completed so far; a host int, so schedules never read the device. It travels in
        # the state dict as extra state (get_extra_state below).
        self.step = 0

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch

    def select_views(self, views: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
        """The views this method consumes and how many of them are global."""
        n_global = count_global_views(views)
        if n_global < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 global views of the same size, got "
                f"{n_global} (view shapes {[tuple(v.shape) for v in views]})"
            )
        if self.uses_local_views:
            return list(views), n_global
        return list(views[:2]), 2

    def embed(self, views: list[torch.Tensor], backbone: nn.Module, *, replay: bool = False) -> Outputs:
        """Everything the loss needs from the networks, as lists of (B, ...) tensors, rows in batch order.

        The first half of :meth:`forward`: every parameter that is trained is used here, so that the
        accumulated step (docs/design.md §3d) can embed micro-batches apart, take :meth:`loss` over all their
        rows at once, and back-propagate its gradient through each micro-batch again. ``replay``: that second
        pass, which must reproduce the first one's differentiable outputs and may skip the rest: the
        ``target_keys`` (a teacher's outputs, computed without gradient). It changes no state of the method
        beyond what a forward pass of its modules changes (BatchNorm's running statistics): such changes belong
        to :meth:`start_step` or :meth:`loss`.
        """
        raise NotImplementedError

    def loss(self, out: Outputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss over the rows of ``out`` (and of every rank) and its statistics; trains no parameter itself
        (it may read one without gradient, e.g. SwaV's prototypes on its queue)."""
        raise NotImplementedError

    def start_step(self) -> None:
        """Once per optimizer step, before its first :meth:`embed`: a change of the method's parameters that
        every micro-batch of the step must see (SwaV re-normalises its prototypes). Default: nothing."""

    def forward(self, views: list[torch.Tensor], backbone: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, statistics)`` of one training step's batch: :meth:`loss` of :meth:`embed`."""
        self.start_step()
        return self.loss(self.embed(views, backbone))

    def before_optimizer_step(self) -> None:
        """Between backward and the optimizer step: cancel gradients a schedule keeps frozen. Default: nothing."""

    @torch.no_grad()
    def after_step(self, step: int, total_steps: int, backbone: nn.Module) -> None:
        """After the optimizer step ``step`` (0-based) of ``total_steps``: EMA updates; records the step."""
        self.step = int(step) + 1

    def get_extra_state(self) -> dict[str, Any]:
        return {"step": self.step}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class EMAMethod(Method):
    """A method with a momentum teacher (BYOL, DINO): a frozen copy of the backbone and of some heads.

    The teacher follows the student with momentum ``m = cosine_schedule(step, total_steps, base, end)`` after
    every optimizer step (BYOL and DINO papers). The teacher's parameters (``requires_grad=False``: give the
    optimizer only parameters that require grad) are in this module's state dict, so a checkpoint carries them.
    """

    stateful = True

    def __init__(self, backbone: nn.Module, momentum_base: float, momentum_end: float, steps_per_epoch: int) -> None:
        super().__init__(steps_per_epoch)
        self.teacher_backbone = make_teacher(backbone)
        self.momentum_base, self.momentum_end = float(momentum_base), float(momentum_end)

    def student_teacher_pairs(self, backbone: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
        return [(backbone, self.teacher_backbone)]

    def momentum(self, step: int, total_steps: int) -> float:
        return float(cosine_schedule(step, total_steps, self.momentum_base, self.momentum_end))

    @torch.no_grad()
    def after_step(self, step: int, total_steps: int, backbone: nn.Module) -> None:
        m = self.momentum(step, total_steps)
        for student, teacher in self.student_teacher_pairs(backbone):
            update_momentum(student, teacher, m)
        super().after_step(step, total_steps, backbone)
