#!/usr/bin/env bash
# Creates the project's virtual environment (.venv) if it is missing or older than setup.cfg / constraints.txt /
# this script, with hybrid_jax installed in editable mode and the test, eval, tpu and wandb extras (libtpu compiles for
# TPU topologies ahead of time on any host; the TPU compile tests need it, and the W&B sink's test runs wandb offline),
# then runs the given command inside it.
# Python comes from .python-version (3.12, through pyenv where present).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stamp="$root/.venv/.hybrid_jax-installed"
if [ ! -f "$stamp" ] || [ "$root/setup.cfg" -nt "$stamp" ] || [ "$root/constraints.txt" -nt "$stamp" ] \
    || [ "${BASH_SOURCE[0]}" -nt "$stamp" ]; then
  echo "setting up $root/.venv (first run: a few minutes)" >&2
  (cd "$root" && python3 -m venv .venv)
  "$root/.venv/bin/python" -m pip install -q --upgrade pip
  "$root/.venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[test,eval,tpu,wandb]"
  touch "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
exec "$@"
