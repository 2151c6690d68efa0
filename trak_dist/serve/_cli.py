"""``trak-dist serve [OVERRIDE ...]``: the service in front of a featurised store."""

from __future__ import annotations

import time

USAGE = """usage: trak-dist serve [OVERRIDE ...]

Serves attribution of new targets over HTTP/JSON (Ray Serve) from the store the batch job
(`trak-dist` with the same overrides) featurised: the same store.path, model.*, task.*, data.*,
projection.*, proj_dim and lambda_reg, plus the serve.* options:

  serve.host (127.0.0.1)  serve.port (8000)  serve.token_file (required beyond loopback)
  serve.num_replicas (1)  serve.cpus_per_replica  serve.gpus_per_replica  serve.device (auto)
  serve.max_targets (64)  serve.max_k (1000)  serve.max_body_bytes (1 MiB)
  serve.max_batch_size (16)  serve.batch_wait_s (0.02)
  serve.index_dtype (float32|float16)  serve.index_mmap_dir  serve.block_rows (65536)

Routes: POST /attribute {"targets": [...], "k": 10} -> {"results": [{"proponents":
[[index, score], ...], "opponents": [...]}, ...]}; GET /health; GET /info (the target format);
GET /train/<i>; GET / (a page). Text jobs (data=text): a target may be a string or a record
of the data file ({"prompt": ..., "completion": ...}), results add "proponents_text" and
"opponents_text" (serve.text_chars); causal LMs: POST /explain {"target": ..., "train": [i, ...]}
-> per-token shares of each score (serve.max_explain). Every request needs
"Authorization: Bearer <token>" when a token is set (except GET /health).

  trak-dist && trak-dist serve                     # the digits example
  trak-dist serve serve.host=0.0.0.0 serve.token_file=token serve.num_replicas=2
"""


def main(argv: list[str]) -> int:
    """Entry point of the subcommand; returns the exit code."""
    if {"-h", "--help"} & set(argv):
        print(USAGE)
        return 0
    from trak_dist import failures
    from trak_dist._compose import compose_job  # the JobConfig `trak-dist <argv>` would run

    try:
        with failures.reported("trak-dist serve", "nothing to resume: start it again"):
            cfg = compose_job(argv)
            from trak_dist.serve._service import start, stop

            url = start(cfg)
            print(
                f"trak-dist serve: ready at {url} (POST {url}attribute; Ctrl-C stops)", flush=True
            )
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print("trak-dist serve: stopping", flush=True)
            finally:
                stop()
    except SystemExit as e:
        return int(e.code or 0)
    return 0
