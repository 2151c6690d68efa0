"""How close TRAK scores from projected gradients come to the exact ones (identity projection):
dense Rademacher vs Kronecker with one summed p-space vs Kronecker with per-parameter blocks.

    python -m benchmarks.kronecker_quality [--proj-dims 256,1024,4096] [--seeds 3]

Two small models, trained here on data that ships with the packages: a byte-level GPT-2
(vocab 256, 2 layers, d ≈ 120k, 64-byte windows of the stdlib's source; task ``causal_lm``: the
sum of next-token margins) and the digits MLP 64-128-10 (d ≈ 9.6k). Exact features are the
per-sample gradients (hook engine, identity projection); every projection is applied to the
same gradients. Scores are X (XᵀX + λI)⁻¹ X_tᵀ in float64 with λ = 0.1 × the mean non-zero
eigenvalue of XᵀX (the same relative damping for every variant; the exact, d > n case uses the
dual form). Quality: Spearman correlation, per target, of a variant's scores over the train rows
with the exact ones; mean over targets, then mean ± sd over ``--seeds`` projection seeds
(model_id 0, 1, …). Q is left out (it multiplies every variant's rows alike).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import Tensor

from benchmarks._gpt2 import byte_sequences, lm_loss, tiny_gpt2
from benchmarks._table import table
from trak_dist.examples import digits
from trak_dist.featurize import Featurizer
from trak_dist.gradients import HookGradientComputer, kronecker_views
from trak_dist.projection import IdentityProjector, KroneckerProjector, TorchProjector
from trak_dist.tasks import CausalLM, ImageClassification

DAMPING = 0.1


def trained_gpt2(n_train: int, steps: int) -> tuple[torch.nn.Module, Tensor, Tensor]:
    """The byte GPT-2 after ``steps`` AdamW steps on windows that include the train rows;
    returns it with the train windows and held-out target windows."""
    model = tiny_gpt2()
    corpus = byte_sequences(3000, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        ids = corpus[torch.randint(0, len(corpus), (16,), generator=gen)]
        opt.zero_grad()
        lm_loss(model, ids, torch.ones_like(ids)).backward()
        opt.step()
    model.eval()
    return model, corpus[:n_train], byte_sequences(100, 64, offset=3000)


def exact_features(model: torch.nn.Module, task: object, batch: tuple[Tensor, ...]) -> Tensor:
    computer = HookGradientComputer(model, task)
    d = computer.layout.grad_dim
    return Featurizer(computer, IdentityProjector(d), micro_batch=32).project(batch, 0)


def scores(x: Tensor, xt: Tensor) -> Tensor:
    """``[n, m]`` float64 TRAK scores (no Q) with relative damping (primal or dual form)."""
    x, xt = x.double(), xt.double()
    n, dim = x.shape
    if dim <= n:
        k = x.T @ x
        lam = DAMPING * torch.trace(k) / dim
        return x @ torch.linalg.solve(k + lam * torch.eye(dim, dtype=k.dtype), xt.T)
    k = x @ x.T  # X (XᵀX + λI)⁻¹ = (XXᵀ + λI)⁻¹ X
    lam = DAMPING * torch.trace(k) / n
    return torch.linalg.solve(k + lam * torch.eye(n, dtype=k.dtype), x @ xt.T)


def spearman(a: Tensor, b: Tensor) -> float:
    """Mean over columns (targets) of the rank correlation of ``a`` and ``b`` over rows."""
    ra = a.argsort(0).argsort(0).double()
    rb = b.argsort(0).argsort(0).double()
    ra, rb = ra - ra.mean(0), rb - rb.mean(0)
    return float(((ra * rb).sum(0) / (ra.norm(dim=0) * rb.norm(dim=0))).mean())


def evaluate(name: str, model: torch.nn.Module, task: object, train, targets, dims, seeds):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    n = len(train[0])
    g = exact_features(
        model, task, tuple(torch.cat([a, b]) for a, b in zip(train, targets, strict=True))
    )
    d = g.shape[1]
    exact = scores(g[:n], g[n:])
    views = kronecker_views(model, HookGradientComputer(model, task).layout)
    rows = []
    for p in dims:
        variants = {
            "dense Rademacher": TorchProjector(d, p, seed=1),
            "Kronecker, summed": KroneckerProjector(d, p, 1, views),
            "Kronecker, per-parameter blocks": KroneckerProjector(d, p, 1, views, share="concat"),
        }
        row: list[object] = [name, d, p]
        for projector in variants.values():
            rho = []
            for mid in range(seeds):
                x = projector.project(g, mid)
                rho.append(spearman(scores(x[:n], x[n:]), exact))
            row.append(f"{np.mean(rho):.3f} ± {np.std(rho):.3f}")
        rows.append(row)
        print(f"  {name} p={p} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows, list(variants)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--proj-dims", default="256,1024,4096")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--n-train", type=int, default=600)
    ap.add_argument("--n-targets", type=int, default=60)
    ap.add_argument("--steps", type=int, default=200, help="GPT-2 training steps")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steady on a shared CPU)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dims = [int(p) for p in args.proj_dims.split(",")]
    torch.manual_seed(0)

    model, train_ids, target_ids = trained_gpt2(args.n_train, args.steps)
    mask = torch.ones_like(train_ids)
    lm = evaluate(
        "byte GPT-2 (next-token margins)",
        model,
        CausalLM(),
        (train_ids, mask),
        (target_ids[: args.n_targets], torch.ones_like(target_ids[: args.n_targets])),
        dims,
        args.seeds,
    )
    mlp = digits.make_model(128)
    (path,) = digits.checkpoints(num=1, hidden=128)
    mlp.load_state_dict(torch.load(path, weights_only=True))
    x, y = digits.train_set().tensors
    xt, yt = digits.target_set().tensors
    clf = evaluate(
        "digits MLP 64-128-10",
        mlp,
        ImageClassification(),
        (x[: args.n_train], y[: args.n_train]),
        (xt[: args.n_targets], yt[: args.n_targets]),
        [p for p in dims if p < 9610],
        args.seeds,
    )
    headers = ["model", "d", "p", *lm[1]]
    print(
        f"\nPer-target Spearman of projected vs exact TRAK scores (n={args.n_train}, "
        f"m={args.n_targets}, λ = {DAMPING} × mean eigenvalue, {args.seeds} seeds)\n"
    )
    print(table(headers, lm[0] + clf[0]))


if __name__ == "__main__":
    main()
