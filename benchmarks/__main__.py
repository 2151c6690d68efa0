"""``python -m benchmarks`` (``make bench``): every CPU benchmark, one table each.

The GPU projection benchmark runs on its own: ``python benchmarks/gpu_projection.py``; so do
GPT-2 featurisation, tens of minutes: ``python -m benchmarks.gpt2_featurize``; the LDS ones,
which train hundreds of subset models: ``python -m benchmarks.lds`` (λ rule, ~40 min) and
``python -m benchmarks.lm_pipeline`` (causal LMs); scoring at scale (n up to 1M, minutes to
tens of minutes): ``python -m benchmarks.scoring_scale``.
"""

from __future__ import annotations

import sys

from benchmarks import dense_cnn, pipeline, reducer_memory, store_codecs, sweep


def main() -> None:
    for name, module in [
        ("pipeline", pipeline),
        ("store_codecs", store_codecs),
        ("reducer_memory", reducer_memory),
        ("sweep", sweep),
        ("dense_cnn", dense_cnn),
    ]:
        print(f"\n## benchmarks.{name}", flush=True)
        sys.argv = [f"benchmarks.{name}"]
        module.main()


if __name__ == "__main__":  # importing it (an import check, a doc tool) runs nothing
    main()
