#!/usr/bin/env bash
# Runs the tests that signal, kill or wait on other processes N times in a row (default 50)
# while a CPU burner keeps both cores busy: the proof that they wait on what the process
# says (the test hooks) and not on the machine's speed. Not part of CI (too long); run it
# after changing one of these tests or the hooks, with the venv scripts/test.sh made.
#
#   scripts/stress_waits.sh [N] [pytest node ids...]
#
#   STRESS_BURNERS  CPU burners (default: one per core); two loops over halves of the list
#                   side by side can take one each
#   STRESS_LOG      where a failed run's output goes (default /tmp/stress-waits), -<i>.log
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-50}
shift || true
venv=${XLA_PCACHE_VENV:-$HOME/.cache/xla-pcache-venv}
tests=("$@")
if ((${#tests[@]} == 0)); then
  tests=(
    "tests/test_scale.py::test_ctrl_c_stops_the_walk_and_leaves_a_valid_cache"
    "tests/test_hostile_text.py::test_export_interrupted_leaves_no_temporary_file"
    tests/test_claim.py
    "tests/test_eviction.py::test_lease_left_by_killed_process_is_taken_over"
    "tests/test_eviction.py::test_explicit_evict_and_older_than"
    "tests/tiers/test_objstore.py::test_single_flight_across_hosts_sharing_only_the_bucket"
    tests/reliability/test_single_flight.py
    "tests/reliability/test_two_hosts.py::test_mounts_behave_as_two_hosts"
    "tests/reliability/test_two_hosts.py::test_lease_of_killed_process_is_taken_over"
  )
fi
burners=()
for _ in $(seq "${STRESS_BURNERS:-$(nproc)}"); do
  "$venv/bin/python" -c 'while True: pass' &
  burners+=($!)
done
trap 'kill "${burners[@]}" 2>/dev/null || true' EXIT
export CI=true PATH=$venv/bin:$PATH
failed=0
log=${STRESS_LOG:-/tmp/stress-waits}
for i in $(seq "$n"); do
  if ! "$venv/bin/python" -m pytest -q -p no:cacheprovider -x "${tests[@]}" >"$log-$i.log" 2>&1; then
    failed=$((failed + 1))
    echo "run $i failed: $log-$i.log"
  else
    rm -f "$log-$i.log"
  fi
  echo "run $i of $n done, $failed failed"
done
((failed == 0))
