"""The Ray executor of the pipeline: worker and reducer actors, the driver loop, its retry
policy and Ctrl-C handling, and the eval driver. Importing this package does not import Ray:
the driver and the eval driver load on first use of their names."""

from typing import TYPE_CHECKING

from trak_dist.distributed._interrupt import keep_sigterm  # Ray-free: serve's start uses it

if TYPE_CHECKING:
    from trak_dist.distributed.driver import RayExecutor, run_job
    from trak_dist.distributed.eval_driver import EvalRun, run_eval

__all__ = ["EvalRun", "RayExecutor", "keep_sigterm", "run_eval", "run_job"]
_LAZY = {"run_job": "driver", "RayExecutor": "driver", "run_eval": "eval_driver"}
_LAZY["EvalRun"] = "eval_driver"


def __getattr__(name: str) -> object:
    # the drivers import Ray: loaded only when asked for, so the plain classes stay Ray-free
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)
