"""``dense``: the reference. The full (m, M_g) similarity block, autograd through it; memory O(m · M_g).

Reads nothing on the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypersolid_scale.losses.repulsion import PairLayout, RepulsionStats

import torch

from hypersolid_scale.losses.backends import Backend, register_backend
from hypersolid_scale.losses.repulsion import dense_repulsion


@register_backend
class DenseBackend(Backend):
    name = "dense"
    order = 0

    def repulsion(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        return dense_repulsion(x_rows, x_all, layout, alpha)
