#!/usr/bin/env bash
# Runs every test: installs what they need from this project's own files into a venv kept
# under ~/.cache (reused between runs), then lint, cargo test and pytest.
#
#   XLA_PCACHE_VENV   venv to use (default ~/.cache/xla-pcache-venv)
#   PYTEST_ARGS       extra pytest arguments (e.g. "-k store")
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${XLA_PCACHE_VENV:-$HOME/.cache/xla-pcache-venv}
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
py=$venv/bin/python
"$py" -m pip install -q --upgrade pip "maturin>=1.7,<2"
# Builds the Rust extension with maturin and installs the package with every test extra.
"$py" -m pip install -q -e ".[test,jax,torch-xla,bench,redis]"

# --- issue 15: the remote-tier tests start their own redis-server; missing it fails them.
if ! command -v redis-server >/dev/null; then
  if [[ $(id -u) == 0 ]]; then apt-get update -qq && apt-get install -y -qq redis-server; \
  else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server; fi
fi
command -v redis-server >/dev/null || { echo "redis-server is required" >&2; exit 1; }

# The integration tests need the real frameworks: a missing one is a failure, never a skip.
"$py" - <<'PY'
import importlib.util, sys
missing = [m for m in ("jax", "torch", "torch_xla") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"test dependencies missing: {', '.join(missing)}")
PY

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

echo "== pytest"
export PATH=$venv/bin:$PATH
# shellcheck disable=SC2086
"$py" -m pytest -q -p no:cacheprovider -ra ${PYTEST_ARGS:-}
