"""Self-supervised methods on a shared backbone: Hypersolid and the baselines (SimCLR, VICReg, Barlow Twins,
BYOL, DINO and SwaV, built on lightly's heads and losses). Each is one module here that registers itself
(:mod:`.registry`); ``method.name`` picks one and ``method.<name>.*`` configures it.

Interface (:class:`Method`, an ``nn.Module``):

* ``forward(views, backbone) -> (loss, stats)``: ``views`` is the list of view tensors (B, C, H, W), the
  global views first (all of ``views[0]``'s size), then the smaller local views. Methods with
  ``uses_local_views`` (Hypersolid, DINO, SwaV) use them all; the others use the first two global views.
  The student runs on its views (one backbone call per view, or per resolution); a momentum teacher (BYOL,
  DINO) runs on the global views under ``no_grad``. ``stats`` maps names to detached 0-dim tensors (no
  host read).
* ``before_optimizer_step()``: between backward and the optimizer step; drops gradients of parts a schedule
  keeps frozen (DINO's last layer in the first epoch, SwaV's prototypes in the first steps).
* ``after_step(step, total_steps, backbone)``: after optimizer step ``step`` (0-based) of ``total_steps``:
  the teacher's EMA update (momentum on a cosine from base to 1) and the step count that drives the
  epoch-based schedules (``step // steps_per_epoch``).
* ``state_dict()``/``load_state_dict()``: everything beyond the backbone: heads, teacher weights, DINO's
  center, SwaV's queue and the step count (extra state), so a resume continues bitwise.

How the trainer drives it, per step (the one training step, for every method)::

    loss, stats = method(views, backbone)          # inside the DDP-wrapped module holding both
    loss.backward()
    method.before_optimizer_step()
    optimizer.step()                                # parameters with requires_grad only (not the teacher)
    method.after_step(step, total_steps, backbone)

Across ranks each rank's ``loss`` is its share: its gradient is P x the gradient of the global-batch loss
with respect to this rank's rows (losses that need the whole batch gather it), so DDP's average over the P
ranks is the single-process gradient of the concatenated batch. BatchNorm in the heads must then be
global too (the engine's BatchNorm conversion, applied to the module holding the method).
"""

from hypersolid_scale.methods.base import EMAMethod, Method, Outputs, count_global_views
from hypersolid_scale.methods.config import MethodConfig
from hypersolid_scale.methods.model import MethodModel, build_method_model, projection_head
from hypersolid_scale.methods.registry import build_method, get_method, method_names, register

__all__ = [
    "EMAMethod",
    "Method",
    "Outputs",
    "MethodConfig",
    "MethodModel",
    "build_method",
    "build_method_model",
    "count_global_views",
    "get_method",
    "method_names",
    "projection_head",
    "register",
]
