"""``dense``: the reference. The full (m, M_g) similarity block, autograd through it; memory O(m · M_g).

Reads nothing on the host.
"""

from __future__ import annotations

from hypersolid_scale.losses.backends import Backend, register_backend
from hypersolid_scale.losses.repulsion import dense_repulsion


@register_backend
class DenseBackend(Backend):
    name = "dense"
    order = 0

    def repulsion(self, x_rows, x_all, layout, alpha):
        return dense_repulsion(x_rows, x_all, layout, alpha)
