"""Per-sample gradients of a model output, and the parameter layout that orders them:
``GradientComputer`` (vmap), ``HookGradientComputer`` (hooks; ``make_computer`` chooses) and
``IterativeGradientComputer`` (slow autograd loop: fallback and reference)."""

from trak_dist.gradients._computers import GradientComputer, IterativeGradientComputer
from trak_dist.gradients._engine import ENGINES, hooks_unsupported, make_computer, resolve_engine
from trak_dist.gradients._hook_computer import HookGradientComputer
from trak_dist.gradients._layout import ParamLayout
from trak_dist.gradients._plan import MIN_FACTOR_SIDE, hook_plan, kronecker_views, rule_for

__all__ = [
    "ENGINES",
    "MIN_FACTOR_SIDE",
    "GradientComputer",
    "HookGradientComputer",
    "IterativeGradientComputer",
    "ParamLayout",
    "hook_plan",
    "hooks_unsupported",
    "kronecker_views",
    "make_computer",
    "resolve_engine",
    "rule_for",
]
