"""Which modules the hook engine hooks, and each parameter's matrix view for the Kronecker
projection. Both depend on the model's structure and ``grad_wrt`` only, never on the engine, so
the vmap and hook engines project with the same matrix."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torch import nn

from trak_dist.errors import ConfigError
from trak_dist.gradients._layout import ParamLayout
from trak_dist.gradients._norms import norm_rule
from trak_dist.gradients._rules import Rule, matrix_rule
from trak_dist.projection import ParamView, balanced_cols

# A module's natural view [rows, cols] is used for the Kronecker factors only when both sides
# have at least this many entries; a narrower parameter (a 2-class head [2, 768], a first conv
# [16, 27]) is cheap to form and keeps more of its gradient in a near-square view. A constant,
# not a function of p, so that the prefix property holds.
MIN_FACTOR_SIDE = 64


def rule_for(module: nn.Module) -> Rule | None:
    """The hook rule of ``module``'s type, or None."""
    return matrix_rule(module) or norm_rule(module)


@dataclass(frozen=True)
class HookedModule:
    """A module the hook engine hooks: its rule and its selected parameters' global offsets."""

    name: str
    module: nn.Module
    rule: Rule
    offsets: dict[str, int]


def _owners(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, int]]:
    """``(module name, module, local name, id(parameter))`` for every use of a parameter as a
    module's own parameter (a tied weight appears once per module holding it)."""
    for name, module in model.named_modules():
        for local, param in module.named_parameters(recurse=False):
            yield name, module, local, id(param)


def _selected(model: nn.Module, layout: ParamLayout) -> dict[int, tuple[str, int]]:
    params = dict(model.named_parameters())
    return {id(params[n]): (n, o) for n, o in zip(layout.names, layout.offsets, strict=True)}


def hook_problems(model: nn.Module, layout: ParamLayout) -> list[str]:
    """Why the hook engine cannot handle the selected parameters (empty: it can)."""
    selected = _selected(model, layout)
    problems = []
    for mname, module, local, pid in _owners(model):
        if pid not in selected:
            continue
        pname = selected[pid][0]
        where = (
            f"{pname!r} (parameter {local!r} of {mname or 'the model'}, a {type(module).__name__})"
        )
        rule = rule_for(module)
        if rule is None:
            problems.append(f"{where}: no hook rule for {type(module).__name__}")
        elif local not in rule.params:
            problems.append(f"{where}: the {type(module).__name__} rule covers only {rule.params}")
        elif (why := rule.unsupported(module)) is not None:
            problems.append(f"{where}: {why}")
    return problems


def hook_plan(model: nn.Module, layout: ParamLayout) -> list[HookedModule]:
    """The modules to hook, in ``named_modules`` order (ConfigError naming a selected parameter
    without a rule, and the fixes)."""
    problems = hook_problems(model, layout)
    if problems:
        shown = "\n  - ".join(problems[:10])
        more = f"\n  (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise ConfigError(
            "gradient_engine=hooks cannot compute the per-sample gradients of these selected "
            f"parameters:\n  - {shown}{more}\nLeave them out with grad_wrt, or use "
            "gradient_engine=vmap (or auto, which picks vmap for this model)."
        )
    selected = _selected(model, layout)
    plan: dict[int, HookedModule] = {}
    for mname, module, local, pid in _owners(model):
        if pid in selected:
            rule = rule_for(module)
            assert rule is not None  # hook_problems found none missing
            entry = plan.setdefault(id(module), HookedModule(mname, module, rule, {}))
            entry.offsets[local] = selected[pid][1]
    return list(plan.values())


def kronecker_views(model: nn.Module, layout: ParamLayout) -> tuple[ParamView, ...]:
    """Each selected parameter's matrix view, in layout order: the natural ``[rows, cols]`` of
    the first module holding it (Linear ``[out, in]``, Conv1D ``[in, out]``, conv
    ``[out, in·k]``, embedding ``[V, D]``) when both sides are ≥ ``MIN_FACTOR_SIDE``, else a
    near-square reshaping of its flat gradient."""
    first: dict[int, tuple[nn.Module, str]] = {}
    for _, module, local, pid in _owners(model):
        first.setdefault(pid, (module, local))
    params = dict(model.named_parameters())
    views = []
    for name, offset, numel in zip(layout.names, layout.offsets, layout.numels, strict=True):
        module, local = first[id(params[name])]
        rule = rule_for(module)
        cols = rule.view_cols(module, local) if rule is not None else None
        natural = cols is not None and min(cols, numel // cols) >= MIN_FACTOR_SIDE
        views.append(ParamView(offset, numel, cols if natural and cols else balanced_cols(numel)))
    return tuple(views)
