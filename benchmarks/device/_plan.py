"""What the GPU check runs, with what time, and the goals its report checks."""

# (name, title, budget on a GPU machine in s, budget in the dry run in s). The dry run proves the
# code paths, not the timings: its budgets are wide, as a shared 2-core machine under load can be
# 3× slower than when idle (~2.5 min in all then).
SECTIONS = (
    ("env", "Machine, versions, and the dense bf16 peak", 20, 60),
    ("kernel", "Kernel correctness against the torch reference", 35, 60),
    ("pytest", "`pytest -m gpu`: the kernel's tests and the in-process pipeline on cuda", 90, 180),
    ("pipeline", "The in-process pipeline on the GPU against the same job on the CPU", 35, 180),
    ("projection", "Projection throughput: our kernel vs torch dense vs fast_jl", 100, 60),
    ("featurize", "Featurising a GPT-2-small-size LM (124M, bf16) vs a training step", 90, 200),
    ("scoring", "Scoring n = 1M × m = 10k at p = 4096 vs a plain torch.mm", 90, 90),
)
SETUP_BUDGET = {"gpu": 45, "dry": 240}
TOTAL_S = {"gpu": 480, "dry": 1020}
# goals of issues 28 and 29, read from the numbers: (section, key, what, comparison, bound)
GOALS = (
    ("kernel", "all_match", "kernel matches the reference (signs bit for bit, products)", "==", 1),
    ("projection", "vs_fast_jl_min_b128", "kernel ÷ fast_jl throughput, min at B = 128", ">=", 3),
    (
        "projection",
        "peak_frac_min_b128",
        "kernel's share of the measured bf16 peak, min at B = 128",
        ">=",
        0.5,
    ),
    ("featurize", "kronecker_x_train", "Kronecker featurisation ÷ one training step", "<=", 3),
    (
        "featurize",
        "lm_default_x_old",
        "LM default (Kronecker p = 2048 + Fisher) ÷ old LM default (dense p = 512), featurising",
        "<=",
        2,
    ),
    ("scoring", "score_vs_mm", "scoring rate ÷ torch.mm rate of the same shapes", "", None),
)
