"""``python -m trak_dist``: the ``trak-dist`` command, for environments without its console script
(e.g. a Ray job whose trak_dist comes only from ``ray job submit --working-dir``)."""

from trak_dist.cli import main

if __name__ == "__main__":
    main()
