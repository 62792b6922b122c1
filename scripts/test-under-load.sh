#!/usr/bin/env bash
# The whole suite beside a CPU load, as on a busy laptop or a shared CI runner:
# `npm test` runs while LOAD_PROCS busy loops (default 2: two cores' worth, at
# the tests' own priority) compete for the CPU. The loops are bounded (they
# end with this script, and after LOAD_MAX_S seconds whatever happens).
#
#   bash scripts/test-under-load.sh            # npm test beside 2 busy loops
#   LOAD_PROCS=4 bash scripts/test-under-load.sh -- test/lifecycle.test.ts   # tap on some files only
#
# Prints the tap summary, the wall time and the load average seen; exits with
# the suite's status.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

procs=${LOAD_PROCS:-2}
max_s=${LOAD_MAX_S:-1800}
pids=()
stop_load() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap stop_load EXIT
trap 'exit 130' INT TERM

for ((i = 0; i < procs; i++)); do
  timeout "$max_s" sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "test-under-load: $procs busy loop(s) started (pids ${pids[*]}), bounded to ${max_s} s"

start=$SECONDS
if [[ "${1:-}" == "--" ]]; then shift; npm run build --silent && npx tap "$@"; else npm test; fi
rc=$?
echo "test-under-load: exit $rc after $((SECONDS - start)) s beside $procs busy loop(s); load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
