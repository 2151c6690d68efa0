#!/usr/bin/env bash
# The Python environment of the Ray nodes: a venv under /opt (the nodes mount a private /tmp and
# cannot see the checkout) holding exactly the packages of the checkout's .venv (torch, Ray,
# zarr, obstore, transformers, ...: the client and the cluster must agree on Ray's and Python's
# versions, and bit-equal results want the same torch) but NOT trak_dist itself. As on a cloud
# cluster whose image has the dependencies, the code arrives with each job
# (`ray job submit --working-dir .`) and runs as `python -m trak_dist`.
#
# The packages are hard links to the .venv's files (a few seconds; a plain copy where /opt is
# another file system), not a second `pip install` (about 4 minutes here); console scripts are
# copied with their `#!` line pointing at the new venv. Built once per set of versions (the
# name holds their hash; a second caller waits on a lock). Prints the venv's path.
#   bash .ci/multinode/node-env.sh        (after `make install-test`)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
SRC=$ROOT/.venv
PY=$SRC/bin/python
[ -x "$PY" ] || die "$PY not found: run \`make install-test\` first"
BASE=${NODE_ENV_ROOT:-/opt/trak-dist-multinode}
mkdir -p "$BASE"
PINS=$("$PY" -m pip freeze --exclude-editable --disable-pip-version-check 2>/dev/null)
KEY=$(printf '%s\n%s\n' "$("$PY" -VV)" "$PINS" | sha256sum | cut -c1-12)
VENV=$BASE/venv-$KEY
exec 9>"$BASE/.lock"
flock 9
if [ ! -f "$VENV/.complete" ]; then
  t0=$SECONDS
  rm -rf "$VENV"
  "$("$PY" -c 'import sys; print(sys._base_executable)')" -m venv --without-pip "$VENV"
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  dest=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  cp -al "$site/." "$dest/" 2>/dev/null || cp -a "$site/." "$dest/"
  # trak_dist's editable install points into the checkout: the nodes get the job's copy instead
  rm -rf "$dest"/__editable__*trak_dist* "$dest"/trak_dist-*.dist-info
  for f in "$SRC"/bin/*; do
    name=${f##*/}
    [ -e "$VENV/bin/$name" ] && continue  # python, python3, ... of the new venv
    if head -c 2 "$f" | grep -q '^#!'; then
      sed "1s|^#!.*/python[0-9.]*\$|#!$VENV/bin/python|" "$f" > "$VENV/bin/$name"
      chmod 755 "$VENV/bin/$name"
    else
      cp -al "$f" "$VENV/bin/$name" 2>/dev/null || cp -a "$f" "$VENV/bin/$name"
    fi
  done
  printf '%s\n' "$PINS" > "$VENV/pins.txt"
  "$VENV/bin/python" -c 'import ray, torch, zarr, obstore, transformers' ||
    die "the nodes' environment $VENV does not import"
  touch "$VENV/.complete"
  log "nodes' environment $VENV built in $((SECONDS - t0)) s"
  # environments of earlier versions, unused for a week
  find "$BASE" -maxdepth 1 -name 'venv-*' ! -name "venv-$KEY" -mtime +7 -exec rm -rf {} + || true
fi
touch "$VENV/.complete"
echo "$VENV"
