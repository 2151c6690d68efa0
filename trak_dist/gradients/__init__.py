"""Per-sample gradients of a model output, and the parameter layout that orders them."""

from trak_dist.gradients._computers import GradientComputer, IterativeGradientComputer
from trak_dist.gradients._layout import ParamLayout

__all__ = ["GradientComputer", "IterativeGradientComputer", "ParamLayout"]
