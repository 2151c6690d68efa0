"""Checks run by hand, not in CI (each costs minutes, over CI's 40-minute budget on a 2-core
machine): ``python -m pytest benchmarks/long_checks`` (as root for the container check).

- ``test_container.py``: the image built with podman and run (``.ci/container-smoke.sh``);
  CI keeps ``tests/docker/test_docker_files.py`` (the build steps run here, the files' checks).
- ``test_driver_kill.py``: SIGKILL of the driver while its Ray workers score, then the rerun
  reuses exactly the committed blocks; CI keeps the driver killed while featurising
  (``tests/distributed/test_driver.py``) and a SLURM score task cancelled mid-way
  (``tests/launch/test_slurm.py``).

The multi-node checks by hand are in ``benchmarks/remote_checks/``.
"""
