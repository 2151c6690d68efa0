"""The report's picture for image tasks (as in TRAK's papers): a few targets, each beside its
top proponents and opponents, with labels and scores. Needs matplotlib (``trak_dist[plot]``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

ROWS = 4  # targets shown
PER_SIDE = 3  # proponents, and opponents, per target


def as_image(x: Any) -> np.ndarray | None:
    """A sample's first tensor as an ``[H, W]`` or ``[H, W, 3]`` array scaled to [0, 1], or None
    when it is no image: ``[H, W]``, ``[C, H, W]`` with C in (1, 3), or a flat vector of a
    square number of pixels (the digits example's 64 = 8×8)."""
    a = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=np.float64)
    if a.ndim == 1 and a.size >= 16 and math.isqrt(a.size) ** 2 == a.size:
        a = a.reshape(math.isqrt(a.size), -1)
    elif a.ndim == 3 and a.shape[0] in (1, 3):
        a = a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)
    elif a.ndim != 2:
        return None
    low, high = float(a.min()), float(a.max())
    return (a - low) / (high - low) if high > low else np.zeros_like(a)


def _sample(dataset: Any, i: int) -> tuple[Any, Any]:
    item = dataset[int(i)]
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return item[0], item[-1]
    return item, None


def _label(y: Any) -> str:
    try:
        return str(int(y))
    except (TypeError, ValueError):
        return "?"


def is_image_data(dataset: Any) -> bool:
    """True when the dataset's first sample is an image (``as_image``)."""
    try:
        x, _ = _sample(dataset, 0)
        return as_image(x) is not None
    except (TypeError, ValueError, IndexError, KeyError):
        return False


def write_figure(train: Any, targets: Any, top: Any, path: str | Path) -> Path:
    """A PNG at ``path``: per target (rows), the target, its ``PER_SIDE`` top proponents and
    its ``PER_SIDE`` strongest opponents, titled with label and score.

    Args:
        train, targets: datasets of ``(image, …, label)`` samples.
        top: the score set's top-k (``proponents_idx``/``_val``, ``opponents_idx``/``_val``,
            each ``[m, k]``).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on a cluster node
    import matplotlib.pyplot as plt

    rows = min(ROWS, len(top.proponents_idx))
    k = min(PER_SIDE, top.proponents_idx.shape[1])
    cols = 1 + 2 * k
    fig, axes = plt.subplots(rows, cols, figsize=(1.5 * cols, 1.75 * rows), squeeze=False)
    for t in range(rows):
        x, y = _sample(targets, t)
        cells = [(as_image(x), f"target {t}\nlabel {_label(y)}", "black")]
        for side, color in (("proponents", "tab:green"), ("opponents", "tab:red")):
            idx, val = getattr(top, f"{side}_idx")[t, :k], getattr(top, f"{side}_val")[t, :k]
            for i, s in zip(idx, val, strict=True):
                xi, yi = _sample(train, int(i))
                cells.append((as_image(xi), f"#{int(i)} label {_label(yi)}\n{s:+.3g}", color))
        for ax, (img, title, color) in zip(axes[t], cells, strict=True):
            ax.imshow(img, cmap="gray_r" if img is not None and img.ndim == 2 else None)
            ax.set_title(title, fontsize=7, color=color)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(
        "each row: a target, its top proponents (green) and strongest opponents (red); "
        "train index, label, score",
        fontsize=8,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
