#!/usr/bin/env bash
# scripts/kube-control-plane.sh — a real Kubernetes control plane on 127.0.0.1 for
# `npm run test:kubernetes`: etcd + kube-apiserver + kube-controller-manager, built once
# from Go modules into a cache outside the repository. No kubelet, no scheduler, no
# kube-proxy: Pods stay Pending, which is all admission needs.
#
#   scripts/kube-control-plane.sh build    build once into the cache (reused after; ~10 min
#                                          on 2 cores the first time, more on a busy machine; nice 19)
#   scripts/kube-control-plane.sh start    build if needed, make a throwaway CA and certs,
#                                          start the three on 127.0.0.1, print the
#                                          kubeconfig's path and the PIDs
#   scripts/kube-control-plane.sh stop     stop exactly what `start` started: its undo journal
#                                          (RUN/journal) replayed newest first
#   scripts/kube-control-plane.sh status   the PIDs and whether /readyz answers
#   scripts/kube-control-plane.sh env      export lines: KUBECONFIG, COS_KUBE_BIN, ...
#   scripts/kube-control-plane.sh built    exit 0 if the binaries are in the cache
#   scripts/kube-control-plane.sh bin      print the directory of the binaries
#   scripts/kube-control-plane.sh clean    stop, then delete the run directory (keeps the build)
#
# Environment (all optional):
#   COS_KUBE_CACHE     cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-kube)
#   COS_KUBE_VERSION   k8s.io/kubernetes version (default v1.37.2); the binaries go to
#                      $COS_KUBE_CACHE/<version>/bin, so versions live side by side
#   COS_KUBE_RUN       run directory: certs, etcd data, logs, PIDs, kubeconfig
#                      (default: a new mktemp -d directory per `start`, recorded in
#                      $COS_KUBE_CACHE/current-run so that a plain `stop` finds it).
#                      When set, the pointer is left alone: every command of that run
#                      needs COS_KUBE_RUN too, and a plain `stop` still finds its own.
#   COS_KUBE_PORT      kube-apiserver port (default 16443); etcd uses COS_KUBE_ETCD_PORT
#                      (default 12379) and +1 for its peer port; KCM COS_KUBE_KCM_PORT (10257)
#   COS_KUBE_NICE      nice level of the build (default 19)
#   COS_KUBE_BUILD_JOBS  go build -p (default 2)
#
# Exit codes (scripts/lib/common.sh): 0 done, 1 failed (a failed `start` first stops what it
# started), 2 usage. `start` journals each daemon's stop as it launches it (RUN/journal);
# `stop` and a failed `start` replay the journal (scripts/lib/common.sh's `undo`).
set -euo pipefail
LOG_TAG=kube-control-plane
# shellcheck source=scripts/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"   # log, die, alive, launch, wait_until, journal, undo
# shellcheck source=scripts/kubeconfig.sh
. "$(dirname "${BASH_SOURCE[0]}")/kubeconfig.sh"

CACHE=${COS_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-kube}
K8S_VERSION=${COS_KUBE_VERSION:-v1.37.2}
PORT=${COS_KUBE_PORT:-16443}
ETCD_PORT=${COS_KUBE_ETCD_PORT:-12379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
KCM_PORT=${COS_KUBE_KCM_PORT:-10257}
NICE=${COS_KUBE_NICE:-19}
JOBS=${COS_KUBE_BUILD_JOBS:-2}
VDIR=$CACHE/$K8S_VERSION
BIN=$VDIR/bin
BINARIES="etcd kube-apiserver kube-controller-manager"

built() {
  local b
  for b in $BINARIES; do [ -x "$BIN/$b" ] || return 1; done
}

# ---------------------------------------------------------------- build
# One Go module that requires k8s.io/kubernetes. As a dependency, k8s.io/kubernetes needs a
# `replace` for every k8s.io/* staging module its own go.mod points at ./staging (they are
# published as k8s.io/X v0.<minor>.<patch>). etcd is go.etcd.io/etcd/server/v3's etcdmain
# behind a three-line main, at the version k8s.io/kubernetes itself requires.
build() {
  if built; then log "already built: $BIN"; return 0; fi
  command -v go >/dev/null || die "go is not installed (Go >= 1.26 is needed to build Kubernetes ${K8S_VERSION})"
  local work=$VDIR/mod
  mkdir -p "$work/etcd" "$BIN"
  export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-modcacherw GOMAXPROCS=$JOBS CGO_ENABLED=0
  cd "$work"
  local kmod staging minor
  kmod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  [ -f "$kmod" ] || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed"
  staging=v0.${K8S_VERSION#v1.}
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  {
    echo "module cos-auth-proxy-kube-build"
    echo
    sed -n 's/^go \([0-9.]*\)$/go \1/p' "$kmod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*#\t\1 => \1 '"$staging"'#p' "$kmod"
    echo ")"
  } >go.mod
  cat >etcd/main.go <<'GO'
// etcd, as go.etcd.io/etcd/v3's own main runs it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "resolving modules for Kubernetes $K8S_VERSION (staging $staging) in $work"
  local t0=$SECONDS
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" >"$VDIR/get.log" 2>&1 \
    || { tail -30 "$VDIR/get.log" >&2; die "go get failed, see $VDIR/get.log"; }
  # etcd at the version k8s.io/kubernetes requires (no `go mod tidy`: nothing in this
  # module imports the two commands, so tidy would drop k8s.io/kubernetes)
  local etcdv; etcdv=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
  go get "go.etcd.io/etcd/server/v3/etcdmain@$etcdv" >>"$VDIR/get.log" 2>&1 \
    || { tail -30 "$VDIR/get.log" >&2; die "go get etcdmain failed, see $VDIR/get.log"; }
  log "modules resolved in $((SECONDS - t0)) s; building etcd $etcdv, kube-apiserver and kube-controller-manager $K8S_VERSION with $(go env GOVERSION), nice $NICE, -p $JOBS (~10 min on 2 cores the first time)"
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=archive -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  t0=$SECONDS
  nice -n "$NICE" go build -p "$JOBS" -trimpath -ldflags "$ld" -o "$BIN/" \
    ./etcd "k8s.io/kubernetes/cmd/kube-apiserver" "k8s.io/kubernetes/cmd/kube-controller-manager" >"$VDIR/build.log" 2>&1 \
    || { tail -30 "$VDIR/build.log" >&2; die "go build failed, see $VDIR/build.log"; }
  [ -x "$BIN/etcd" ] || die "no etcd binary in $BIN"
  log "built in $((SECONDS - t0)) s: $(cd "$BIN" && ls | tr '\n' ' ')"
}

# ---------------------------------------------------------------- run directory
# `start` makes a new directory and records it in $CACHE/current-run; every other
# command reads it from there. A run given by COS_KUBE_RUN (test/e2e/kubernetes/kubernetes.e2e.ts,
# kube-node.sh's control plane) is never recorded there, nor is the pointer removed by
# its `clean`: the pointer belongs to the plain runs, whose `stop` must not reach
# another cluster (issue 37); `clean` removes it only when it names the run cleaned.
run_dir() {
  if [ -n "${COS_KUBE_RUN:-}" ]; then echo "$COS_KUBE_RUN"; return; fi
  [ -f "$CACHE/current-run" ] && cat "$CACHE/current-run"
}

# ---------------------------------------------------------------- certificates
# A throwaway CA for this run only: the serving certificate (127.0.0.1), the admin
# client (system:masters), the controller manager's client, the service-account key.
pki() {
  local d=$1/pki
  mkdir -p "$d"
  (
    cd "$d"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=cos-auth-proxy-test-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >serving.ext
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile serving.ext -out apiserver.crt 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >client.ext
    client() { # file CN O
      openssl req -newkey rsa:2048 -nodes -subj "/O=$3/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
        -extfile client.ext -out "$1.crt" 2>/dev/null
    }
    client admin cos-test-admin system:masters
    client kcm system:kube-controller-manager system:kube-controller-manager
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 644 ca.crt
  )
}

kubeconfig() { # dir user
  write_kubeconfig "$1/$2.kubeconfig" cos-test "https://127.0.0.1:$PORT" "$1/pki/ca.crt" "$2" "$1/pki/$2.crt" "$1/pki/$2.key"
}

# ---------------------------------------------------------------- start / stop
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  build
  local dir=${COS_KUBE_RUN:-}
  if [ -f "$CACHE/current-run" ] && [ -z "$dir" ]; then
    local old; old=$(cat "$CACHE/current-run")
    alive "$old" kube-apiserver && die "already running from $old: '$0 stop' first"
  fi
  local p
  for p in "$PORT" "$ETCD_PORT" "$ETCD_PEER_PORT" "$KCM_PORT"; do
    port_free "$p" || die "127.0.0.1:$p is in use (set COS_KUBE_PORT, COS_KUBE_ETCD_PORT, COS_KUBE_KCM_PORT)"
  done
  [ -n "$dir" ] || dir=$(mktemp -d "${TMPDIR:-/tmp}/cos-kube.XXXXXX")
  mkdir -p "$dir"
  if [ -z "${COS_KUBE_RUN:-}" ]; then mkdir -p "$CACHE" && echo "$dir" >"$CACHE/current-run"; fi
  local t0=$SECONDS
  pki "$dir"
  kubeconfig "$dir" admin
  kubeconfig "$dir" kcm
  # from here on, a failure (or ^C) stops what was started: each launch journals its stop
  JOURNAL=$dir/journal
  on_failure stop
  launch "$dir" etcd "$BIN/etcd" --name cos-test --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "cos-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --quota-backend-bytes 1073741824
  journal stop_daemon "$dir" etcd
  wait_until 30 etcd -a "$dir:etcd" curl -fsS -o /dev/null "http://127.0.0.1:$ETCD_PORT/health"
  # --endpoint-reconciler-type=none: no `kubernetes` Endpoints for 127.0.0.1 (loopback is
  # refused there). No kube-proxy, no scheduler, no kubelet: Pods stay Pending.
  launch "$dir" kube-apiserver "$BIN/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --cert-dir="$dir/apiserver-certs" \
    --tls-cert-file="$dir/pki/apiserver.crt" --tls-private-key-file="$dir/pki/apiserver.key" \
    --client-ca-file="$dir/pki/ca.crt" \
    --service-account-key-file="$dir/pki/sa.pub" --service-account-signing-key-file="$dir/pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range=10.96.0.0/24 --endpoint-reconciler-type=none \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota \
    --profiling=false ${COS_KUBE_APISERVER_ARGS:-}
  journal stop_daemon "$dir" kube-apiserver
  wait_until 120 "kube-apiserver (https://127.0.0.1:$PORT/readyz)" -a "$dir:kube-apiserver" \
    curl -fsS -o /dev/null --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" \
    "https://127.0.0.1:$PORT/readyz"
  launch "$dir" kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$dir/kcm.kubeconfig" --authentication-kubeconfig="$dir/kcm.kubeconfig" \
    --authorization-kubeconfig="$dir/kcm.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --cert-dir="$dir/kcm-certs" \
    --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$dir/pki/sa.key" --root-ca-file="$dir/pki/ca.crt" \
    --cluster-signing-cert-file="$dir/pki/ca.crt" --cluster-signing-key-file="$dir/pki/ca.key" \
    ${COS_KUBE_KCM_ARGS:-}
  journal stop_daemon "$dir" kube-controller-manager
  # The "default" ServiceAccount in "default" shows the controllers are working
  # (without it the ServiceAccount admission plugin refuses every Pod).
  wait_until 60 "the default ServiceAccount (kube-controller-manager)" -a "$dir:kube-controller-manager" \
    curl -fsS -o /dev/null --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" \
    "https://127.0.0.1:$PORT/api/v1/namespaces/default/serviceaccounts/default" \
    || { tail -20 "$dir/kube-controller-manager.log" >&2; false; }
  on_failure -
  echo "kube-apiserver $("$BIN/kube-apiserver" --version | awk '{print $2}') ready on https://127.0.0.1:$PORT in $((SECONDS - t0)) s"
  echo "KUBECONFIG=$dir/admin.kubeconfig"
  local n
  for n in etcd kube-apiserver kube-controller-manager; do echo "$n pid $(cat "$dir/$n.pid") log $dir/$n.log"; done
}

# Stops what `start` started, and only that (TERM, then KILL after 15 s): its journal replayed
# newest first; then any PID file left (a run directory from before the journal).
stop() {
  local dir; dir=$(run_dir)
  [ -n "$dir" ] && [ -d "$dir" ] || return 0
  undo "$dir/journal" || true
  local n
  for n in kube-controller-manager kube-apiserver etcd; do stop_daemon "$dir" "$n"; done
}

status() {
  local dir; dir=$(run_dir)
  [ -n "$dir" ] || { echo "never started"; return 1; }
  local n
  for n in etcd kube-apiserver kube-controller-manager; do
    if alive "$dir" "$n"; then echo "$n running pid $(cat "$dir/$n.pid")"; else echo "$n not running"; fi
  done
  curl -fsS -o /dev/null --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" \
    "https://127.0.0.1:$PORT/readyz" 2>/dev/null && echo "readyz ok https://127.0.0.1:$PORT" || { echo "readyz not answering"; return 1; }
}

print_env() {
  local dir; dir=$(run_dir)
  echo "export KUBECONFIG=$dir/admin.kubeconfig"
  echo "export COS_KUBE_BIN=$BIN"
  echo "export COS_KUBE_URL=https://127.0.0.1:$PORT"
  echo "export COS_KUBE_RUN=$dir"
}

clean() {
  local dir; dir=$(run_dir)
  stop
  if [ -n "$dir" ] && [ -d "$dir" ]; then rm -rf "$dir"; fi
  # the pointer only when it names this run: another cluster's stays
  if [ -n "$dir" ] && [ "$(cat "$CACHE/current-run" 2>/dev/null)" = "$dir" ]; then rm -f "$CACHE/current-run"; fi
}

case ${1:-} in
  build) build ;;
  built) built ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) print_env ;;
  clean) clean ;;
  bin) echo "$BIN" ;;
  *) usage ;;
esac
