#!/usr/bin/env bash
# scripts/kube-node.sh — a one-node Kubernetes cluster that lives entirely inside a network
# namespace of its own (issue 34): containerd, etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, the kubelet and kube-proxy all run in it (entered with
# `nsenter --net=/run/netns/$COS_KUBE_NETNS`, never `ip netns exec`, which remounts /sys and
# the kubelet then finds no cgroups). The node's address (10.88.0.1 on the bridge cni0), the
# pod range (10.88.0.0/16), the Service range (10.96.0.0/24) and every port exist only there:
# the machine's own interfaces get no address, and nothing can be sent outside loopback and
# that namespace (it has no other link and no default route). The control plane is
# scripts/kube-control-plane.sh's, started inside the namespace, so its 127.0.0.1 ports are
# the namespace's own. Binaries share that script's cache: $COS_KUBE_CACHE/<version>/bin.
# What was learned building this: ../shared/tools/kube-node.md.
#
# `up` is a list of steps (step_namespace, step_containerd, step_control_plane, step_node):
# each appends its own inverse to RUN/journal as soon as it has succeeded, and `down`, like a
# failed or interrupted `up`, replays the journal newest first (scripts/lib/common.sh). The
# host snapshot `up` takes is only the final check `down` makes. The configs are templates in
# scripts/kube-node/, filled by common.sh's `render` (plain ${NAME}, no envsubst needed).
# Bash, not TypeScript: nearly every step is a privileged one-liner (ip, nsenter, mount, ctr,
# iptables), `build` runs on a machine with Go but before npm, and .ci/run and the tests call
# it as a command; a journal of command lines fits bash, and a TypeScript orchestrator would
# still need these one-liners in bash beside it.
#
#   scripts/kube-node.sh build   apt-get install containerd, runc, the CNI plugins, iptables,
#                                conntrack if missing; build the control plane (or wait for a
#                                build of it already running), then kubelet, kube-scheduler,
#                                kube-proxy and kubectl from the same Go module (nice 19), and
#                                the pause image (a static Go binary in a one-layer OCI archive).
#                                Does nothing when all is there.
#   scripts/kube-node.sh up [--image ARCHIVE.tar]...
#                                snapshot the host, make the namespace and its bridge, start
#                                containerd, the control plane, kubelet, kube-scheduler and
#                                kube-proxy inside it, import the pause image and each ARCHIVE
#                                (docker-archive or OCI, e.g. `podman save --format
#                                docker-archive`; pods use imagePullPolicy: Never), wait for the
#                                node to be Ready, print how to use it
#   scripts/kube-node.sh down    replay `up`'s journal: delete workloads and pods, stop exactly
#                                the PIDs `up` recorded, undo mounts, cgroups, iptables chains,
#                                log links, what `up` made under /run/containerd, the namespace;
#                                then compare the host with `up`'s snapshot and exit 1 naming
#                                anything left
#   scripts/kube-node.sh import ARCHIVE.tar...
#                                import more images into the running node's containerd
#   scripts/kube-node.sh status  the PIDs, the node, the pods
#   scripts/kube-node.sh env     export lines: KUBECONFIG, COS_KUBE_NETNS, COS_KUBE_BIN, ...
#   scripts/kube-node.sh exec CMD [ARG...]
#                                run CMD inside the namespace with KUBECONFIG set and the
#                                binaries on PATH, e.g. `scripts/kube-node.sh exec kubectl get pods -A`
#   scripts/kube-node.sh built   exit 0 if everything `build` makes is in the cache
#   scripts/kube-node.sh snapshot DIR
#                                take the host's snapshot (what `up` takes) into DIR/snapshot
#   scripts/kube-node.sh check DIR [KIND...]
#                                compare the host with DIR/snapshot as `down` does (KIND: mounts
#                                cgroups iptables netns addr links paths cni; default all, plus
#                                the run's PIDs and log links); exit 1 naming what differs
#
# Environment (all optional):
#   COS_KUBE_CACHE     build cache, shared with kube-control-plane.sh
#                      (default ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-kube)
#   COS_KUBE_VERSION   k8s.io/kubernetes version (default v1.37.2)
#   COS_KUBE_NETNS     network namespace name (default cos-kube-node); also the node's name
#   COS_KUBE_NODE_RUN  run directory: configs, certs, logs, PIDs, containerd's and the
#                      kubelet's state (default: a new mktemp -d per `up`, recorded in
#                      $COS_KUBE_CACHE/node-run so that a plain `down` finds it). When set,
#                      the pointer is left alone: give it to every command of that run)
#   COS_KUBE_NODE_TIMEOUT  seconds `up` waits for the node to be Ready (default 180)
#   COS_KUBE_NICE      nice level of the build (default 19); COS_KUBE_BUILD_JOBS go build -p (2)
#   COS_KUBE_HOST_PATHS  the host paths `down` removes when `up` made them and `check`
#                      compares (default: containerd's, the kubelet's and the CNI's; tests)
#   COS_KUBE_CP_WAIT   seconds `build` waits for a control-plane build of the same version
#                      that another process is running (default 3600)
# Needs root (network namespace, mounts, cgroups). cgroup v1 or v2; containerd 1.6 (Debian 12).
# Exit codes (scripts/lib/common.sh): 0 done; 1 failed (a failed `up` has undone its steps
# first; `down` or `check` found something left); 2 usage. 130 when `up` is interrupted.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/kubeconfig.sh
. "$ROOT/scripts/kubeconfig.sh"
LOG_TAG=kube-node
# shellcheck source=scripts/lib/common.sh
. "$ROOT/scripts/lib/common.sh"   # log, die, alive, launch, stop_daemon, wait_until, journal, undo, render
TEMPLATES=$ROOT/scripts/kube-node   # containerd's, the CNI's, the kubelet's and kube-proxy's configs; pause's source
CP_SCRIPT=$ROOT/scripts/kube-control-plane.sh
CACHE=${COS_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-kube}
K8S_VERSION=${COS_KUBE_VERSION:-v1.37.2}
NETNS=${COS_KUBE_NETNS:-cos-kube-node}
NODE=$NETNS
NICE=${COS_KUBE_NICE:-19}
JOBS=${COS_KUBE_BUILD_JOBS:-2}
VDIR=$CACHE/$K8S_VERSION
BIN=$VDIR/bin
NODE_BINARIES="kubelet kube-scheduler kube-proxy kubectl"
PAUSE_DIR=$CACHE/pause
PAUSE_TAR=$PAUSE_DIR/pause-oci.tar
PAUSE_IMAGE=localhost/cos-kube/pause:1
NETNS_PATH=/run/netns/$NETNS
BRIDGE=cni0
NODE_IP=10.88.0.1
# shellcheck disable=SC2034 # read by render, through ${!name}
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.96.0.0/24
# kube-control-plane.sh's default ports, always free inside the namespace (its loopback is its
# own, whatever the host's 127.0.0.1 has in use)
API_PORT=16443
# The daemons `up` starts itself (status and the final check look at them; the journal stops
# them, newest first; the control plane's three are kube-control-plane.sh's, in its journal).
DAEMONS="kube-proxy kube-scheduler kubelet"
T0=$SECONDS   # the start of `up` or `down`, for the timings they log
# Paths outside the run directory that containerd, the CNI plugins or the kubelet write to
# whatever they are told: step_containerd journals the removal of each that does not exist
# yet (/run/netns is step_namespace's), and the final check compares them with the snapshot.
HOST_PATHS=${COS_KUBE_HOST_PATHS:-"/run/containerd /var/lib/kubelet /var/log/containers /var/log/pods /var/lib/cni /opt/containerd /var/lib/containerd /etc/cni /run/netns"}

need_root() { [ "$(id -u)" = 0 ] || die "needs root (network namespace, mounts, cgroups)"; }
minor() { local m=${K8S_VERSION#v1.}; echo "${m%%.*}"; }

# ---------------------------------------------------------------- build
node_built() {
  local b
  for b in $NODE_BINARIES; do [ -x "$BIN/$b" ] || return 1; done
}
built() { bash "$CP_SCRIPT" built && node_built && [ -s "$PAUSE_TAR" ]; }

install_debian() {
  local need=() c
  for c in containerd:containerd runc:runc ctr:containerd iptables:iptables conntrack:conntrack nsenter:util-linux openssl:openssl curl:curl; do
    command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
  done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
  [ ${#need[@]} -eq 0 ] && return 0
  log "apt-get install ${need[*]}"
  local t0=$SECONDS
  apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian's package starts containerd as a service where there is an init to do it: this
  # script runs its own, with its own paths, and wants no other.
  if command -v systemctl >/dev/null && systemctl is-active --quiet containerd 2>/dev/null; then
    systemctl disable --now containerd >/dev/null 2>&1 || true
  fi
  log "installed in $((SECONDS - t0)) s"
}

# A `kube-control-plane.sh build` of this version run by another process (its environ names
# the version, or none for the default): building the same module at once would race on go.mod.
cp_build_running() {
  local p cmd ver
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    case $cmd in *kube-control-plane.sh\ build*) ;; *) continue ;; esac
    ver=$(tr '\0' '\n' 2>/dev/null <"$p/environ" | sed -n 's/^COS_KUBE_VERSION=//p')
    [ "${ver:-v1.37.2}" = "$K8S_VERSION" ] && return 0
  done
  return 1
}

build_control_plane() {
  bash "$CP_SCRIPT" built && return 0
  if cp_build_running; then
    local limit=${COS_KUBE_CP_WAIT:-3600} t0=$SECONDS
    log "another process is building the control plane $K8S_VERSION: waiting for it (up to ${limit} s)"
    while ! bash "$CP_SCRIPT" built; do
      cp_build_running || { bash "$CP_SCRIPT" built && break; die "that control-plane build ended without binaries in $BIN"; }
      ((SECONDS - t0 < limit)) || die "the control plane $K8S_VERSION was not built after ${limit} s"
      sleep 15
    done
    log "control plane $K8S_VERSION built by the other process (waited $((SECONDS - t0)) s)"
    return 0
  fi
  COS_KUBE_VERSION=$K8S_VERSION bash "$CP_SCRIPT" build
}

# kubelet, kube-scheduler, kube-proxy and kubectl in kube-control-plane.sh's module: `go get`
# only adds require lines (no version moves), so the control plane's packages are cache hits.
build_node_binaries() {
  node_built && return 0
  command -v go >/dev/null || die "go is not installed"
  local work=$VDIR/mod
  [ -f "$work/go.mod" ] || die "no $work/go.mod: build the control plane first"
  export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-modcacherw GOMAXPROCS=$JOBS CGO_ENABLED=0
  local pkgs=() b
  for b in $NODE_BINARIES; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  local t0=$SECONDS
  (cd "$work" && go get "${pkgs[@]/%/@$K8S_VERSION}") >"$VDIR/node-get.log" 2>&1 \
    || { tail -30 "$VDIR/node-get.log" >&2; die "go get failed, see $VDIR/node-get.log"; }
  log "modules resolved in $((SECONDS - t0)) s; building $NODE_BINARIES $K8S_VERSION, nice $NICE, -p $JOBS"
  local ld m
  m=$(minor)
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$m -X k8s.io/component-base/version.gitTreeState=archive -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  t0=$SECONDS
  (cd "$work" && nice -n "$NICE" go build -p "$JOBS" -trimpath -ldflags "$ld" -o "$BIN/" "${pkgs[@]}") >"$VDIR/node-build.log" 2>&1 \
    || { tail -30 "$VDIR/node-build.log" >&2; die "go build failed, see $VDIR/node-build.log"; }
  node_built || die "missing binaries in $BIN after the build"
  log "node binaries built in $((SECONDS - t0)) s: $NODE_BINARIES"
}

# The pod sandbox's image: a static binary that waits for SIGTERM or SIGINT (reaping children
# meanwhile), as the only file of a one-layer OCI image; the archive's index names it with
# io.containerd.image.name, which `ctr images import` uses.
build_pause() {
  [ -s "$PAUSE_TAR" ] && return 0
  command -v go >/dev/null || die "go is not installed"
  local t0=$SECONDS src=$PAUSE_DIR/src oci=$PAUSE_DIR/oci
  rm -rf "$src" "$oci"
  mkdir -p "$src" "$oci/blobs/sha256" "$PAUSE_DIR/rootfs"
  cp "$TEMPLATES/pause/go.mod" "$TEMPLATES/pause/main.go" "$src/"
  (cd "$src" && GOCACHE=$CACHE/gocache GOMODCACHE=$CACHE/gomod CGO_ENABLED=0 GOFLAGS='' \
    go build -trimpath -ldflags "-s -w" -o "$PAUSE_DIR/rootfs/pause" .) || die "building pause failed"
  local layer config manifest ldig cdig mdig
  layer=$PAUSE_DIR/layer.tar
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$PAUSE_DIR/rootfs" -cf "$layer" pause
  ldig=$(sha256sum "$layer" | cut -d' ' -f1)
  mv "$layer" "$oci/blobs/sha256/$ldig"
  config='{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:'$ldig'"]},"history":[{"created_by":"scripts/kube-node.sh build_pause"}]}'
  cdig=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
  printf '%s' "$config" >"$oci/blobs/sha256/$cdig"
  manifest='{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:'$cdig'","size":'${#config}'},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:'$ldig'","size":'$(stat -c %s "$oci/blobs/sha256/$ldig")'}]}'
  mdig=$(printf '%s' "$manifest" | sha256sum | cut -d' ' -f1)
  printf '%s' "$manifest" >"$oci/blobs/sha256/$mdig"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$mdig" "${#manifest}" "$PAUSE_IMAGE" "${PAUSE_IMAGE##*:}" >"$oci/index.json"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$oci" -cf "$PAUSE_TAR.tmp" oci-layout index.json blobs
  mv "$PAUSE_TAR.tmp" "$PAUSE_TAR"
  rm -rf "$src" "$oci" "$PAUSE_DIR/rootfs"
  log "pause image $PAUSE_IMAGE built in $((SECONDS - t0)) s: $PAUSE_TAR"
}

build() {
  install_debian
  if built; then log "already built: $BIN ($NODE_BINARIES), $PAUSE_TAR"; return 0; fi
  mkdir -p "$VDIR"
  # one node build of a version at a time (a second waits, then finds it done)
  exec 9>"$VDIR/.node-build.lock"
  flock 9
  build_control_plane
  build_node_binaries
  build_pause
  exec 9>&-
}

# ---------------------------------------------------------------- run directory
run_dir() {
  if [ -n "${COS_KUBE_NODE_RUN:-}" ]; then echo "$COS_KUBE_NODE_RUN"; return; fi
  [ -f "$CACHE/node-run" ] && cat "$CACHE/node-run"
}

in_ns() { nsenter --net="$NETNS_PATH" "$@"; }
# A daemon inside the namespace: nsenter execs it in place, so launch's PID is the daemon's own.
launch_ns() { launch "$1" "$2" nsenter --net="$NETNS_PATH" "${@:3}"; } # dir name cmd...

kubectl_ns() { # dir args...
  local dir=$1; shift
  in_ns "$BIN/kubectl" --kubeconfig "$dir/cp/admin.kubeconfig" "$@"
}

# ---------------------------------------------------------------- the host's snapshot
# What `down` compares with. Mount points and cgroups that other work on the machine makes
# and removes meanwhile (podman's storage, the project's benchmark cgroups) are not compared.
# Mounts where the node makes them (its run directory $SNAP_DIR, /run, the kubelet's and
# containerd's default roots, cgroups); not elsewhere, where other root work on the machine (a
# container build's chroot) may mount and unmount meanwhile; not podman's own storage.
snap_mounts() {
  awk -v run="${SNAP_DIR:?}/" -v own="/run/netns/$NETNS" '$5 !~ /^\/(var\/lib|run)\/containers\/storage/ &&
    ($5 !~ /^\/run\/netns\/./ || $5 == own || $5 ~ /^\/run\/netns\/cni-/) &&
    ($5 ~ /^\/(run|var\/run|var\/lib\/kubelet|var\/lib\/containerd|sys\/fs\/cgroup)(\/|$)/ || index($5, run) == 1) {print $5}' /proc/self/mountinfo | sort
}
snap_cgroups() { { find /sys/fs/cgroup -maxdepth 8 -type d -path '*kubepods*' 2>/dev/null || true; } | sort; }
snap_iptables() { # rules and chains, without counters and the dated comment lines
  { iptables-save 2>/dev/null || true; ip6tables-save 2>/dev/null || true; } | sed -e '/^#/d' -e 's/ \[[0-9]*:[0-9]*\]$//' | sort
}
# Network namespaces (and their /run/netns mounts) of the node's own names only: the node's and the
# pods' (cni-*). Others come and go with other work on the machine (test:compose's, the suite's).
snap_netns() { { ip netns list 2>/dev/null || true; } | awk -v own="$NETNS" '$1 == own || $1 ~ /^cni-/ {print $1}' | sort; }
snap_addr() { ip -o addr show | awk '{print $2, $3, $4}' | sort; }
snap_links() { ip -o link show | awk -F': ' '{print $2}' | sort; }
snap_paths() { local p; for p in $HOST_PATHS; do if [ -e "$p" ]; then echo "$p"; fi; done | sort; }
snap_logs() { { find /var/log/containers -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null || true; } | sort; }
# libcni's result cache (containerd 1.6 does not let it be moved): podman may use it too
snap_cni() { { find /var/lib/cni -type f 2>/dev/null || true; } | sort; }
take_snapshot() { # dir
  local s=$1/snapshot
  mkdir -p "$s"
  SNAP_DIR=$1
  snap_mounts >"$s/mounts"; snap_cgroups >"$s/cgroups"; snap_iptables >"$s/iptables"
  snap_netns >"$s/netns"; snap_addr >"$s/addr"; snap_links >"$s/links"
  snap_paths >"$s/paths"; snap_logs >"$s/logs"; snap_cni >"$s/cni"
  if mountpoint -q /run/netns 2>/dev/null; then touch "$s/run-netns-was-mounted"; fi
}

# ---------------------------------------------------------------- certificates and configs
sign_client() { # dir file CN O
  local d=$1/pki
  (
    cd "$d"
    umask 077
    openssl req -newkey rsa:2048 -nodes -subj "/O=$4/CN=$3" -keyout "$2.key" -out "$2.csr" 2>/dev/null
    openssl x509 -req -in "$2.csr" -CA "$1/cp/pki/ca.crt" -CAkey "$1/cp/pki/ca.key" -CAcreateserial \
      -days 2 -extfile "$1/cp/pki/client.ext" -out "$2.crt" 2>/dev/null
  )
}

node_kubeconfig() { # dir name
  write_kubeconfig "$1/$2.kubeconfig" cos-kube-node "https://127.0.0.1:$API_PORT" "$1/cp/pki/ca.crt" "$2" "$1/pki/$2.crt" "$1/pki/$2.key"
}

node_pki() { # dir
  local dir=$1
  mkdir -p "$dir/pki"
  sign_client "$dir" kubelet "system:node:$NODE" system:nodes
  sign_client "$dir" kube-scheduler system:kube-scheduler system:kube-scheduler
  sign_client "$dir" kube-proxy system:kube-proxy system:node-proxier
  # The kubelet's serving certificate, for the API server's --kubelet-certificate-authority
  (
    cd "$dir/pki"
    umask 077
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:%s,DNS:%s\n' "$NODE_IP" "$NODE" >kubelet-serving.ext
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$NODE" -keyout kubelet-serving.key -out kubelet-serving.csr 2>/dev/null
    openssl x509 -req -in kubelet-serving.csr -CA "$dir/cp/pki/ca.crt" -CAkey "$dir/cp/pki/ca.key" -CAcreateserial \
      -days 2 -extfile kubelet-serving.ext -out kubelet-serving.crt 2>/dev/null
  )
  local n
  for n in kubelet kube-scheduler kube-proxy; do node_kubeconfig "$dir" "$n"; done
}

write_containerd_config() { # dir
  local DIR=$1 C=$1/containerd
  mkdir -p "$C/root" "$C/state" "$C/opt" "$DIR/cni/net.d" "$DIR/cni/ipam"
  render "$TEMPLATES/containerd.toml" C DIR PAUSE_IMAGE >"$C/config.toml"
  # The bridge exists already (up makes it with the node's address); the plugin reuses it.
  render "$TEMPLATES/10-cos-kube-node.conflist" DIR BRIDGE POD_CIDR NODE_IP >"$DIR/cni/net.d/10-cos-kube-node.conflist"
}

write_node_configs() { # dir
  local DIR=$1 FAIL_CGROUP_V1=""
  # shellcheck disable=SC2034 # read by render, through ${!name}
  (($(minor) >= 31)) && FAIL_CGROUP_V1="failCgroupV1: false  # this machine kind has cgroup v1; the field is new in 1.31 (decoded strictly before)"
  mkdir -p "$DIR/kubelet" "$DIR/pod-logs"
  render "$TEMPLATES/kubelet-config.yaml" DIR NODE_IP FAIL_CGROUP_V1 >"$DIR/kubelet-config.yaml"
  render "$TEMPLATES/kube-proxy-config.yaml" DIR NODE NODE_IP POD_CIDR >"$DIR/kube-proxy-config.yaml"
}

# ---------------------------------------------------------------- up: steps, each journaling its inverse
# `up` is a list of steps; each appends its own inverse to $dir/journal as soon as it has
# succeeded (scripts/lib/common.sh's `journal`), and `down` (also the error path of `up`)
# replays the journal newest first. What a daemon may make on the host later (cgroups, pod
# network namespaces, log links, libcni's results, host paths) is recorded by the step that
# starts it, before it starts: the inverse removes only what was not there then ($dir/undo/*).
import_images() { # dir archive...
  local dir=$1 img; shift
  for img in "$@"; do
    ctr --address "$dir/containerd/containerd.sock" -n k8s.io images import --snapshotter overlayfs "$img" >>"$dir/images.log" 2>&1 \
      || { tail -5 "$dir/images.log" >&2; die "importing $img failed"; }
  done
}

node_ready() { # dir
  [ "$(kubectl_ns "$1" get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# The namespace, its loopback and its bridge with the node's address. `ip netns add` makes
# /run/netns and mounts it on itself the first time: the inverse undoes that only if it did.
step_namespace() { # dir
  local made=0 mounted=0
  [ -d /run/netns ] || made=1
  mountpoint -q /run/netns 2>/dev/null || mounted=1
  ip netns add "$NETNS"
  journal undo_run_netns "$made" "$mounted"
  journal netns_del "$NETNS"
  echo "$NETNS" >"$1/netns"
  # the links and addresses inside go with the namespace
  in_ns ip link set lo up
  in_ns ip link add "$BRIDGE" type bridge
  in_ns ip addr add "$NODE_IP/16" dev "$BRIDGE"
  in_ns ip link set "$BRIDGE" up
  in_ns ip route add "$SERVICE_CIDR" dev "$BRIDGE"
  in_ns sysctl -qw net.ipv4.ip_forward=1
}

# containerd, and what it, runc, the CNI plugins and the kubelet write outside the run
# directory whatever they are told: each such path that does not exist yet is removed by the
# inverse (one that existed is left, and so is whatever else is in it: /run/containerd made
# by another containerd keeps all but this run's runc/k8s.io and s).
step_containerd() { # dir
  local dir=$1 p u=$1/undo
  mkdir -p "$u"
  for p in $HOST_PATHS /run/containerd/runc /run/containerd/runc/k8s.io /run/containerd/s; do
    [ "$p" = /run/netns ] && continue   # step_namespace's
    [ -e "$p" ] || journal remove_made_path "$p"
  done
  snap_cni >"$u/cni"; journal remove_new_cni_results "$u/cni"
  snap_netns >"$u/netns"; journal remove_new_pod_netns "$u/netns"
  journal rm -rf "$dir/containerd/root" "$dir/containerd/state" "$dir/kubelet" # image layers, volumes
  journal unmount_under "$dir"
  snap_cgroups >"$u/cgroups"; journal remove_new_kubepods_cgroups "$u/cgroups"
  write_containerd_config "$dir"
  launch_ns "$dir" containerd containerd --config "$dir/containerd/config.toml"
  journal stop_containerd "$dir"
  wait_until 30 containerd -s 0.5 -a "$dir:containerd" ctr --address "$dir/containerd/containerd.sock" version
  log "containerd $(containerd --version | awk '{print $3}') up ($((SECONDS - T0)) s)"
}

# kube-control-plane.sh's, inside the namespace, its run directory under ours (given by
# COS_KUBE_RUN, so it leaves its current-run pointer alone). It journals its own daemons
# ($dir/cp/journal) and stops them itself when its start fails: this step's inverse, recorded
# before it starts, replays that journal (only what its start did), then drops etcd's data.
step_control_plane() { # dir
  local dir=$1
  journal rm -rf "$dir/cp/etcd"
  journal cp_stop "$dir"
  COS_KUBE_VERSION=$K8S_VERSION COS_KUBE_RUN=$dir/cp COS_KUBE_PORT=$API_PORT COS_KUBE_ETCD_PORT=12379 COS_KUBE_KCM_PORT=10257 \
    COS_KUBE_APISERVER_ARGS="--kubelet-preferred-address-types=InternalIP --kubelet-certificate-authority=$dir/cp/pki/ca.crt --kubelet-client-certificate=$dir/cp/pki/admin.crt --kubelet-client-key=$dir/cp/pki/admin.key" \
    in_ns bash "$CP_SCRIPT" start >"$dir/control-plane.out" 2>&1 \
    || { cat "$dir/control-plane.out" >&2; false; }
  log "$(grep -m1 ' ready on ' "$dir/control-plane.out" || true) ($((SECONDS - T0)) s)"
}

# kubelet, kube-scheduler, kube-proxy; then the drain of their workloads, replayed first
step_node() { # dir
  local dir=$1 u=$1/undo
  node_pki "$dir"
  write_node_configs "$dir"
  snap_iptables >"$u/iptables"; journal remove_new_host_kube_chains "$u/iptables"
  journal remove_log_links "$dir"
  launch_ns "$dir" kubelet "$BIN/kubelet" --config="$dir/kubelet-config.yaml" --kubeconfig="$dir/kubelet.kubeconfig" \
    --root-dir="$dir/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP" --v=2
  journal stop_daemon "$dir" kubelet
  launch_ns "$dir" kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$dir/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$dir/kube-scheduler.kubeconfig" --authorization-kubeconfig="$dir/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --cert-dir="$dir/kube-scheduler-certs" --leader-elect=false
  journal stop_daemon "$dir" kube-scheduler
  launch_ns "$dir" kube-proxy "$BIN/kube-proxy" --config="$dir/kube-proxy-config.yaml"
  journal stop_daemon "$dir" kube-proxy
  journal drain "$dir"
}

up() {
  need_root
  local images=()
  while [ $# -gt 0 ]; do
    case $1 in
      --image) [ -f "${2:-}" ] || die "--image needs an archive file (got '${2:-}')"; images+=("$(realpath "$2")"); shift 2 ;;
      *) die "up: unknown argument $1" ;;
    esac
  done
  built || die "not built: run 'COS_KUBE_VERSION=$K8S_VERSION bash $0 build' first (control plane ~10 min, then ~1.5 min for the node on 2 cores)"
  [ -e "$NETNS_PATH" ] && die "network namespace $NETNS exists already: '$0 down' first"
  local old; old=$(run_dir || true)
  if [ -n "$old" ] && [ -d "$old" ] && alive "$old" kubelet; then die "already up from $old: '$0 down' first"; fi
  local dir=${COS_KUBE_NODE_RUN:-}
  [ -n "$dir" ] || dir=$(mktemp -d "${TMPDIR:-/tmp}/cos-kube-node.XXXXXX")
  mkdir -p "$dir"
  dir=$(realpath "$dir")
  JOURNAL=$dir/journal
  [ -s "$JOURNAL" ] && die "$dir holds the journal of a run not taken down: 'COS_KUBE_NODE_RUN=$dir $0 down' first"
  # the pointer is for plain runs only: one given by COS_KUBE_NODE_RUN leaves another's alone
  if [ -z "${COS_KUBE_NODE_RUN:-}" ]; then mkdir -p "$CACHE" && echo "$dir" >"$CACHE/node-run"; fi
  echo "$K8S_VERSION" >"$dir/version"
  T0=$SECONDS
  take_snapshot "$dir"   # for the final check only: down undoes from the journal
  # from here on, a failure (or ^C) undoes what was done: `down` with this run directory
  COS_KUBE_NODE_RUN=$dir
  on_failure up_failed

  step_namespace "$dir"
  step_containerd "$dir"
  # images, while the control plane starts: pods use imagePullPolicy: Never (no registry
  # is reachable, and none is wanted)
  import_images "$dir" "$PAUSE_TAR" "${images[@]}" &
  local import_pid=$!
  step_control_plane "$dir"
  wait "$import_pid" || die "importing the images failed, see $dir/images.log"
  log "images imported ($((SECONDS - T0)) s): $(ctr --address "$dir/containerd/containerd.sock" -n k8s.io images ls -q | sed '/^sha256:/d' | tr '\n' ' ')"
  step_node "$dir"
  local limit=${COS_KUBE_NODE_TIMEOUT:-180}
  wait_until "$limit" "node $NODE to be Ready" -s 0.5 -a "$dir:containerd" -a "$dir:kubelet" -a "$dir:kube-scheduler" -a "$dir:kube-proxy" \
    node_ready "$dir" || { tail -30 "$dir/kubelet.log" >&2; log "node $NODE not Ready after ${limit} s"; false; }
  on_failure -
  echo "node $NODE Ready ($("$BIN/kubelet" --version | awk '{print $2}'), inside network namespace $NETNS) in $((SECONDS - T0)) s"
  echo "run directory $dir (logs: *.log; PIDs: *.pid, cp/*.pid)"
  print_env "$dir"
}
up_failed() { log "up failed; cleaning up (logs stay in $COS_KUBE_NODE_RUN)"; down; }

# ---------------------------------------------------------------- the inverses
# The lines of `snap_WHAT` now that are not in FILE (what a step recorded before it ran)
new_since() { # file what
  LC_ALL=C comm -13 <(LC_ALL=C sort -u "$1") <("snap_$2" | LC_ALL=C sort -u)
}

undo_run_netns() { # made mounted: what `ip netns add` did to /run/netns, if anything
  [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ] || return 0
  if [ "$2" = 1 ] && mountpoint -q /run/netns; then umount /run/netns 2>/dev/null || umount -l /run/netns || true; fi
  if [ "$1" = 1 ]; then rmdir /run/netns 2>/dev/null || true; fi
}
netns_del() { [ ! -e "/run/netns/$1" ] || ip netns del "$1"; }

# A host path this run made (removed only when it did not exist before the step)
remove_made_path() { # path
  [ -e "$1" ] || return 0
  unmount_under "$1"
  case $1 in
    /var/lib/cni | /etc/cni) find "$1" -depth -type d -empty -delete 2>/dev/null || true ;; # podman's too
    *) rm -rf "$1" ;;
  esac
}

# libcni's results of this run's sandboxes (files named after the network, cos-kube-node or
# cni-loopback, and the sandbox), not whatever else shares /var/lib/cni
remove_new_cni_results() { # before-list
  local f
  for f in $(new_since "$1" cni); do
    case ${f##*/} in "$NETNS"-* | cni-loopback-*) rm -f "$f" ;; esac
  done
}

remove_new_pod_netns() { # before-list
  local ns
  for ns in $(new_since "$1" netns); do
    case $ns in cni-*) ip netns del "$ns" 2>/dev/null && log "removed pod network namespace $ns" ;; esac
  done
  return 0
}

# The kubelet's links in /var/log/containers point at its pod logs, in the run directory
remove_log_links() { # dir
  [ -d /var/log/containers ] || return 0
  find /var/log/containers -mindepth 1 -maxdepth 1 -type l -lname "$1/*" -delete 2>/dev/null || true
}

# Processes started by this run's containerd that outlive it: the shims, named by its socket.
shim_pids() { # dir
  local p
  for p in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF -- "-address $1/containerd/containerd.sock " && echo "${p#/proc/}"
  done
  return 0
}

# any task still running (a sandbox the kubelet did not stop) killed through containerd, then
# containerd, then its shims
stop_containerd() { # dir
  local dir=$1 sock=$1/containerd/containerd.sock id p
  if alive "$dir" containerd; then
    for id in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
      ctr --address "$sock" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
      log "killed leftover task $id"
    done
  fi
  stop_daemon "$dir" containerd
  for p in $(shim_pids "$dir"); do stop_pid containerd-shim "$p"; done
  log "containerd and its shims stopped ($((SECONDS - T0)) s)"
}

cp_stop() { # dir
  [ -d "$1/cp" ] || return 0
  COS_KUBE_VERSION=$K8S_VERSION COS_KUBE_RUN=$1/cp bash "$CP_SCRIPT" stop 2>&1 | sed 's/^/  /' >&2 || true
  log "control plane stopped ($((SECONDS - T0)) s)"
}

# Workloads, then pods, through the API server: the kubelet stops their containers and
# tears down their sandboxes (network namespaces, IPs) itself
drain() { # dir
  local dir=$1 i n
  [ -e "$NETNS_PATH" ] && alive "$dir/cp" kube-apiserver && alive "$dir" kubelet \
    && in_ns curl -fsS -o /dev/null --max-time 5 http://127.0.0.1:10248/healthz 2>/dev/null || return 0
  kubectl_ns "$dir" delete deployments,replicasets,statefulsets,daemonsets,jobs,cronjobs --all -A --wait=false >/dev/null 2>&1 || true
  if ! kubectl_ns "$dir" delete pods --all -A --timeout=90s >/dev/null 2>&1; then
    log "pods not gone after 90 s: deleting them with --grace-period=0 --force"
    kubectl_ns "$dir" delete pods --all -A --grace-period=0 --force >/dev/null 2>&1 || true
  fi
  # the kubelet stops the sandboxes after the pods are gone
  for ((i = 0; i < 120; i++)); do
    alive "$dir" kubelet || break
    n=$(ctr --address "$dir/containerd/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null | wc -l)
    [ "$n" = 0 ] && break
    sleep 0.5
  done
  log "workloads and pods deleted, sandboxes stopped ($((SECONDS - T0)) s)"
}

# Everything in kubepods cgroups made since (pod containers left by a killed shim), then the cgroups.
remove_new_kubepods_cgroups() { # before-list
  local d pid
  while read -r d; do
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < <(cat "$d/cgroup.procs" 2>/dev/null || true)
  done < <(new_since "$1" cgroups)
  sleep 0.5
  while read -r d; do
    rmdir "$d" 2>/dev/null || log "could not remove cgroup $d"
  done < <(new_since "$1" cgroups | LC_ALL=C sort -r)
}

unmount_under() { # prefix
  local m
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done < <(awk -v p="$1" '$5 == p || index($5, p "/") == 1 {print $5}' /proc/self/mountinfo | sort -r)
}

# KUBE-* chains in the host's tables made since (there should be none: the kubelet and
# kube-proxy run inside the namespace, where theirs go with it).
remove_new_host_kube_chains() { # before (iptables-save lines)
  local tool t chain rule
  for tool in iptables ip6tables; do
    command -v "$tool" >/dev/null || continue
    for t in filter nat mangle; do
      for chain in $("$tool" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[A-Z0-9-]*\)$/\1/p'); do
        grep -q "^:$chain " "$1" && continue
        "$tool" -t "$t" -S | grep -E -- "-j $chain( |\$)" | while read -r rule; do
          eval "$tool -t $t ${rule/-A/-D}" 2>/dev/null || true   # the rule as -S quotes it
        done || true
        "$tool" -t "$t" -F "$chain" 2>/dev/null || true
        if "$tool" -t "$t" -X "$chain" 2>/dev/null; then log "removed $tool -t $t chain $chain from the host"; fi
      done
    done
  done
}

# ---------------------------------------------------------------- down
# The journal replayed (what `up` did, undone newest first), then the host compared with the
# snapshot `up` took: a final check that names anything left, never what decides the undoing.
down() {
  need_root
  local dir; dir=$(run_dir || true)
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then
    [ -e "$NETNS_PATH" ] && die "namespace $NETNS exists but no run directory is recorded (set COS_KUBE_NODE_RUN)"
    log "nothing is up"; return 0
  fi
  [ -f "$dir/version" ] && K8S_VERSION=$(cat "$dir/version") && VDIR=$CACHE/$K8S_VERSION && BIN=$VDIR/bin
  T0=$SECONDS
  if [ -f "$dir/journal" ]; then
    undo "$dir/journal" || log "some steps could not be undone (above)"
    log "stopped and cleaned in $((SECONDS - T0)) s (journal replayed: $dir/journal.undone)"
  else
    log "nothing to undo in $dir (no journal)"
  fi
  [ -f "$dir/snapshot/paths" ] && check_clean "$dir"
  if [ "$(cat "$CACHE/node-run" 2>/dev/null)" = "$dir" ]; then rm -f "$CACHE/node-run"; fi
}

# Every snapshot is compared like with like: both sides sorted the same way (a snapshot
# written before a snap_* function sorted its output, or one that lists in another order,
# must not make `down` fail when it left nothing: issue 43, /run/containerd before /etc/cni).
snapshot_differs() { # file what
  diff <(LC_ALL=C sort "$1") <("snap_$2" | LC_ALL=C sort) | grep '^[<>]' || true
}

check_clean() { # dir [what...]: the host against the snapshot; with whats, only those (no PIDs)
  local s=$1/snapshot bad=0 what d kinds="mounts cgroups iptables netns addr links paths cni"
  SNAP_DIR=$1
  if [ $# -gt 1 ]; then shift; kinds=$*; fi
  for what in $kinds; do
    d=$(snapshot_differs "$s/$what" "$what")
    if [ -n "$d" ]; then
      log "left on the host ($what differs from before up; > is new, < is gone):"
      printf '%s\n' "$d" | sed 's/^/    /' >&2
      bad=1
    fi
  done
  if [ "$kinds" != "mounts cgroups iptables netns addr links paths cni" ]; then
    [ "$bad" = 0 ] || { log "check: the host is not as in the snapshot ($SNAP_DIR)"; return 1; }
    log "host checked: $kinds as in the snapshot"
    return 0
  fi
  d=$(comm -13 "$s/logs" <(snap_logs) || true)
  [ -z "$d" ] || { log "left in /var/log/containers: $d"; bad=1; }
  local p
  for p in $(shim_pids "$1"); do log "left: containerd-shim pid $p"; bad=1; done
  for p in containerd $DAEMONS; do
    alive "$1" "$p" && { log "left: $p pid $(cat "$1/$p.pid")"; bad=1; }
  done
  [ "$bad" = 0 ] || { log "down: the host is not as before up (run directory $1)"; return 1; }
  log "host checked: mounts, cgroups, iptables, network namespaces, addresses, links and paths as before up"
}

# ---------------------------------------------------------------- status / env / exec
status() {
  local dir; dir=$(run_dir || true)
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then echo "not up"; return 1; fi
  [ -f "$dir/version" ] && K8S_VERSION=$(cat "$dir/version") && BIN=$CACHE/$K8S_VERSION/bin
  echo "run directory $dir, Kubernetes $K8S_VERSION, namespace $NETNS $([ -e "$NETNS_PATH" ] && echo exists || echo missing)"
  local n rc=0
  for n in containerd $DAEMONS; do
    if alive "$dir" "$n"; then echo "$n running pid $(cat "$dir/$n.pid")"; else echo "$n not running"; rc=1; fi
  done
  for n in etcd kube-apiserver kube-controller-manager; do
    if alive "$dir/cp" "$n"; then echo "$n running pid $(cat "$dir/cp/$n.pid")"; else echo "$n not running"; rc=1; fi
  done
  [ -e "$NETNS_PATH" ] || return 1
  kubectl_ns "$dir" get nodes -o wide 2>&1 || rc=1
  kubectl_ns "$dir" get pods -A -o wide 2>&1 || rc=1
  return $rc
}

print_env() { # [dir]
  local dir=${1:-}
  [ -n "$dir" ] || dir=$(run_dir || true)
  [ -n "$dir" ] || die "not up"
  [ -f "$dir/version" ] && K8S_VERSION=$(cat "$dir/version") && BIN=$CACHE/$K8S_VERSION/bin
  echo "export KUBECONFIG=$dir/cp/admin.kubeconfig"
  echo "export COS_KUBE_NETNS=$NETNS"
  echo "export COS_KUBE_BIN=$BIN"
  echo "export COS_KUBE_NODE_RUN=$dir"
  echo "export COS_KUBE_NODE_IP=$NODE_IP"
  echo "# the API server listens on 127.0.0.1:$API_PORT inside the namespace only: run clients in it,"
  echo "#   nsenter --net=$NETNS_PATH \$COS_KUBE_BIN/kubectl get pods -A"
  echo "#   bash $0 exec kubectl get pods -A     (KUBECONFIG and PATH set for you)"
}

exec_in() {
  [ $# -gt 0 ] || die "exec: which command?"
  local dir; dir=$(run_dir || true)
  if [ -z "$dir" ] || [ ! -e "$NETNS_PATH" ]; then die "not up"; fi
  [ -f "$dir/version" ] && BIN=$CACHE/$(cat "$dir/version")/bin
  KUBECONFIG=$dir/cp/admin.kubeconfig PATH=$BIN:$PATH exec nsenter --net="$NETNS_PATH" "$@"
}

case ${1:-} in
  build) build ;;
  built) built ;;
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  env) print_env ;;
  exec) shift; exec_in "$@" ;;
  snapshot) [ -n "${2:-}" ] || die "snapshot: which directory?"; take_snapshot "$2" ;;
  check) [ -n "${2:-}" ] || die "check: which directory?"; shift; check_clean "$@" ;;
  import)
    shift
    [ $# -gt 0 ] || die "import: which archive?"
    d=$(run_dir || true)
    if [ -z "$d" ] || ! alive "$d" containerd; then die "not up"; fi
    import_images "$d" "$@"
    ctr --address "$d/containerd/containerd.sock" -n k8s.io images ls -q | sed '/^sha256:/d'
    ;;
  *) usage ;;
esac
