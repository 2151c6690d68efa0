"""Leave-one-benchmark-out for the λ rule λ = c · tr(K) / min(r, p) (issue 29, item 3), r the
number of outer products K estimates (``trak_dist.scoring.rank_bound``: n train rows, or a causal
LM Fisher's tokens, ≥ p).

    python -m benchmarks.lambda_lobo      # after benchmarks.lds_rules, lm_pipeline, lm_quality

Curves (quality against c, each on its own benchmark, p and checkpoint count) come from three
caches: ``benchmarks.lds_rules --out .lds_bench/rules`` (the digits MLP, CNN and transformer,
the tiny GPT-2 ``lm``, the BERTs where run: LDS over λ / mean eigenvalue, converted here to c
with each checkpoint's spectrum; all of them XᵀX, r = n), ``benchmarks.lm_pipeline --out
.lds_bench/lm`` (``<benchmark>/pipeline_curves.npz``, in the rule's own units) and
``benchmarks.lm_quality --out .lds_bench/lm``
(``<benchmark>/curves.npz``: the LM benchmarks' LDS and the planted facts' MRR over c, per
curvature, p and checkpoints). For a curvature family, every benchmark in turn is held out: c
is chosen to maximise the worst fraction of each curve's best over the *other* benchmarks, and
the held-out benchmark's worst fraction at that c is reported. The default's λ is judged by the
worst of these (goal ≥ 0.95).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks._table import table

C_GRID = 10.0 ** np.arange(-3, 2.01, 0.05)


def rules_curves(
    root: Path, names: list[str], models: int
) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """``(benchmark, label, c values, quality)`` per curve of ``benchmarks.lds_rules``."""
    from benchmarks import lds_rules as lr

    out = []
    for name in names:
        if name in lr.ARCHS:
            store, (masks, margins), ps = lr.featurize(name, root), lr.truth(name, root), lr.PS
        else:
            store = lr.featurize_bench(name, root)
            masks, margins = lr.truth_bench(name, root, models)
            ps = lr.BENCHES[name].proj_dims
        for (p, k), (lds, spectra) in lr.curves(store, masks, margins, ps).items():
            # λ / mean eigenvalue → c = λ / (tr / min(n, p)) = (λ / mean) · min(n, p) / p
            ratio = np.mean([min(sp.n, sp.p) / sp.p for sp in spectra])
            out.append((name, f"xtx p={p} k={k}", lr.GRID * ratio, lds))
    return out


def lm_curves(root: Path, family: str) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """Curves of ``lm_quality``'s ``<root>/*/curves.npz`` for one curvature ``family``
    (e.g. kron_tok_f)."""
    out = []
    for path in sorted(root.glob("*/curves.npz")):
        out += _family(np.load(path), family)
    return out


def _family(z: np.lib.npyio.NpzFile, family: str) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    grid = z["grid"]
    out = []
    for key in z.files:
        if key == "grid":
            continue
        bench, fam, p = key.split("|")
        if fam != family:
            continue
        last, mean = z[key]
        out.append((bench, f"{fam} p={p} k=1 (last)", grid, last))
        out.append((bench, f"{fam} p={p} k=3", grid, mean))
    return out


def pipeline_curves(root: Path, variant: str) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """Curves of ``benchmarks.lm_pipeline``'s ``<root>/*/pipeline_curves.npz`` for ``variant``
    (``before``: dense XᵀX at p = 512; ``fisher``: Kronecker + sampled-label Fisher)."""
    from benchmarks._lm_score import GRID

    out = []
    for path in sorted(root.glob("*/pipeline_curves.npz")):
        z = np.load(path)
        for key in z.files:
            bench, var, p, which = key.split("|")
            if var == variant:
                out.append((bench, f"{var} p={p} ({which})", GRID, z[key]))
    return out


def fraction(curve: tuple, c: float) -> float:
    _, _, grid, q = curve
    return float(np.interp(np.log(c), np.log(grid), q) / q.max())


def worst(curves: list, c: float) -> float:
    return min(fraction(cv, c) for cv in curves)


def with_draws(curves: list, e: float) -> list:
    """The curves under the rule λ = c · D^(-e) · tr(K) / min(r, p), D the label draws of a
    ``fisher<D>`` pipeline curve (1 for every other): its grid, in the rule's units, × D^e."""
    from benchmarks.lm_pipeline import draws_of

    return [(b, label, grid * draws_of(label.split()[0]) ** e, q) for b, label, grid, q in curves]


def lobo(curves: list, exponents: tuple[float, ...] = (0.0,)) -> tuple[list[list], float, float]:
    """Rows ``[held out, c (and e) chosen on the rest, held-out worst, rest worst]``, the worst
    held-out fraction, and the c chosen on all (at the first exponent). With several
    ``exponents`` (``with_draws``), c and e are chosen together on the rest: the held-out
    benchmark sees neither."""
    benches = sorted({cv[0] for cv in curves})
    shifted = {e: with_draws(curves, e) for e in exponents}
    rows, worst_held = [], 1.0
    for b in benches:
        # the best worst fraction on the rest; among ties (the binding curve is often one
        # that e does not move), the best mean fraction
        best = (-1.0, -1.0, 0.0, 0.0)
        for e in exponents:
            rest = [cv for cv in shifted[e] if cv[0] != b]
            for c in C_GRID:
                key = (round(worst(rest, c), 6), float(np.mean([fraction(cv, c) for cv in rest])))
                if key > best[:2]:
                    best = (*key, e, float(c))
        score, _, e, c = best
        held = worst([cv for cv in shifted[e] if cv[0] == b], c)
        worst_held = min(worst_held, held)
        chosen = f"{c:.3g}" if len(exponents) == 1 else f"{c:.3g}, e = {e:g}"
        rows.append([b, chosen, f"{held:.3f}", f"{score:.3f}"])
    first = shifted[exponents[0]]
    c_all = float(C_GRID[int(np.argmax([worst(first, c) for c in C_GRID]))])
    return rows, worst_held, c_all


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lambda_lobo", description=__doc__)
    ap.add_argument("--rules", type=Path, default=Path(".lds_bench/rules"))
    ap.add_argument("--rules-only", default="mlp,cnn,transformer,lm")
    ap.add_argument("--lm", type=Path, default=Path(".lds_bench/lm"))
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument(
        "--families",
        default="kron_xtx,kron_tok_f,kron_fisher,kron_tok_s,dense_xtx",
        help="lm_quality curvature families whose LM curves join the classification ones",
    )
    ap.add_argument("--current", type=float, default=1.25, help="today's auto constant")
    ap.add_argument(
        "--pipeline",
        default="fisher,before",
        help="lm_pipeline variants whose curves join the classification ones (fisher: the "
        "new default for causal LMs; before: the default before issue 29; fisher4: 4 label "
        "draws; a+b: both in one set)",
    )
    ap.add_argument(
        "--draws-exponents",
        default="0",
        help="e values for λ = c · D^(-e) · tr(K) / min(r, p) on fisher<D> curves; several: "
        "c and e are chosen together on the benchmarks not held out",
    )
    a = ap.parse_args()
    exponents = tuple(float(x) for x in a.draws_exponents.split(","))
    base = rules_curves(a.rules, [x for x in a.rules_only.split(",") if x], a.models)
    # "fisher+fisher4": both variants' curves in one set (one rule for both)
    sets = [
        (f"pipeline {v}", [cv for part in v.split("+") for cv in pipeline_curves(a.lm, part)])
        for v in a.pipeline.split(",")
        if v
    ]
    sets += [(fam, lm_curves(a.lm, fam)) for fam in a.families.split(",") if fam]
    sets = sets or [("no LM curves", [])]  # --pipeline "" --families "": classification alone
    for fam, lm in sets:
        curves = base + lm
        rows, held, c_all = lobo(curves, exponents)
        curves = with_draws(curves, exponents[0])  # the summary's rule: the first exponent
        print(
            f"\n{fam} on the LM benchmarks, XᵀX elsewhere: {len(curves)} curves over "
            f"{len(rows)} benchmarks; c chosen on all: {c_all:.3g} "
            f"(worst {worst(curves, c_all):.3f}); "
            f"today's c = {a.current:g}: worst {worst(curves, a.current):.3f}; "
            f"leave-one-benchmark-out worst: {held:.3f}"
        )
        print(
            table(["held out", "c chosen on the rest", "held-out worst / best", "rest worst"], rows)
        )
        per = [
            [b, f"{worst([cv for cv in curves if cv[0] == b], a.current):.3f}"]
            for b in sorted({cv[0] for cv in curves})
        ]
        print(table(["benchmark", f"worst / best at c = {a.current:g}"], per))


if __name__ == "__main__":
    main()
