#!/bin/bash
# CPU per request of one server under autocannon -c 32 (small GET, 2 s warm-up,
# 5 s measured), the server pinned alone to core 1, load and upstream on core 0;
# CPU from /proc/<pid>/stat. Run the servers interleaved, several times:
#
#   for i in 1 2 3; do for s in bench/floor.mjs bench/lean-forwarder.mjs proxy; do
#     NODE=./package/bin/node bash bench/forwarding-cost.sh $s; done; done
#
# usage: bench/forwarding-cost.sh <server.mjs | proxy>   (proxy: dist/cos-auth-proxy.mjs
#        as the image runs it; LEVEL=warn for warn-level logs). NODE: the node binary.
set -uo pipefail
N=${NODE:-node}
N=$(command -v "$N" || realpath "$N")
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SERVER=$1
[[ $SERVER == proxy ]] || SERVER=$(realpath "$SERVER")
cd "$ROOT/bench" || exit 2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
taskset -c 0 "$N" upstream.mjs < <(sleep 60) > "$TMP/up.port" & up=$!; sleep 0.5
UP=http://127.0.0.1:$(sed -nE 's/.*"port":([0-9]+).*/\1/p' "$TMP/up.port")
if [[ $SERVER == proxy ]]; then
  COS_API_URL=$UP COS_ACCESS_KEY=bench-access-key COS_ACCESS_KEY_SECRET=c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0 COS_LISTEN_PORT=18080 COS_ADMIN_PORT=18090 \
  NODE_OPTIONS=--max-old-space-size-percentage=50 MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=32768 COS_LOG_LEVEL=${LEVEL:-info} \
    taskset -c 1 "$N" --max-semi-space-size=16 ${NODE_FLAGS:-} "$ROOT/dist/cos-auth-proxy.mjs" serve < <(sleep 60) > >(cat > /dev/null) & srv=$!; sleep 1.5; PORT=18080
else
  BENCH_UPSTREAM=$UP taskset -c 1 "$N" --max-semi-space-size=16 ${NODE_FLAGS:-} "$SERVER" > "$TMP/srv.port" < <(sleep 60) & srv=$!; sleep 1
  PORT=$(sed -nE 's/.*"port":([0-9]+).*/\1/p' "$TMP/srv.port")
fi
taskset -c 0 npx autocannon -c 32 -d 2 "http://127.0.0.1:$PORT/api/v1/clusters" > /dev/null 2>&1
t0=$(awk '{print $14+$15}' "/proc/$srv/stat")
out=$(taskset -c 0 npx autocannon -j -c 32 -d 5 "http://127.0.0.1:$PORT/api/v1/clusters" 2>/dev/null)
t1=$(awk '{print $14+$15}' "/proc/$srv/stat")
read -r total non2xx < <(echo "$out" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);console.log(j.requests.total, j.non2xx)})')
echo "$(basename "$SERVER") requests=$total non2xx=$non2xx cpu_ms_per_1k=$(node -e "console.log(((($t1-$t0)*10)/($total/1000)).toFixed(1))")"
kill "$srv" "$up"; sleep 0.5
# A profile (--cpu-prof) is written as the server exits: give it time.
[[ -z ${NODE_FLAGS:-} ]] || sleep 3
