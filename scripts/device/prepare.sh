# Sourced by the device scripts: `source scripts/device/prepare.sh OUT_DIR HINT`. Installs the wheels carried in
# .whl/ (the GPU machine's Python lacks grain, TFDS, ml-collections, ...) into /tmp/site, puts them and the
# repository on PYTHONPATH, and writes OUT_DIR/env.txt (date, GPU, jax/flax versions). HINT is printed when .whl/
# holds no wheels (say what the calling script needs there).
mkdir -p "$1"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
else
  echo "no .whl/*.whl: $2" >&2
fi
export PYTHONPATH="/tmp/site:$PWD"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import jax, jaxlib, flax; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax",
              flax.__version__, jax.devices())'
} > "$1/env.txt" 2>&1
