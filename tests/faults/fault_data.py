"""The user's data module of the fault cases, as source text written next to each run."""

# The user's data module: digits, with faults listed in files next to it ("nan:17" poisons a
# pixel of row 17, "-1:17" sets its label), read by every worker.
FAULT_DATA = """
from pathlib import Path

from torch.utils.data import TensorDataset

from trak_dist.examples import digits

HERE = Path(__file__).parent


def _faulty(ds, name):
    x, y = (t.clone() for t in ds.tensors)
    path = HERE / name
    for fault in path.read_text().split() if path.exists() else []:
        what, row = fault.split(":")
        if what == "nan":
            x[int(row), 5] = float("nan")
        else:
            y[int(row)] = int(what)
    return TensorDataset(x, y)


def train_set():
    return _faulty(digits.train_set(), "train_faults")


def target_set():
    return _faulty(digits.target_set(), "target_faults")
"""
