#!/usr/bin/env bash
# scripts/compose-engine.sh — a real compose engine for `npm run test:compose` (issue 36) that lives
# inside a network namespace of its own: Debian's docker-compose (1.29) talking to podman's
# Docker-compatible API (`podman system service`), with a podman store, run root, lock files,
# events and network configs of its own under the run directory. The service runs in the
# namespace (entered with `nsenter --net`, not `ip netns exec`, which remounts /sys: runc then
# finds no cgroup mount and no container starts), so the CNI plugins it calls make the compose
# networks' bridges, addresses, iptables rules and dnsmasq there, and a port published on
# 127.0.0.1 is the namespace's loopback. The machine's own interfaces get no address; the
# namespace has no link out and no route out. The host's podman store is only read (the image
# is copied from it); nothing is tagged, created or removed there.
#
#   scripts/compose-engine.sh missing    print what is missing (commands, CNI plugins), one a
#                                        line; exit 2 if anything is
#   scripts/compose-engine.sh install    apt-get install what is missing
#   scripts/compose-engine.sh up [--image SOURCE=NAME]... [--curl-standin NAME]...
#                                        snapshot the host, make the namespace, start the service,
#                                        copy each SOURCE image from the host's podman store into
#                                        the run's store as NAME, build a stand-in with sh, curl
#                                        and sleep (from this machine's Debian binaries, no
#                                        registry) for each curl image NAME; print the env
#   scripts/compose-engine.sh exec CMD [ARG...]
#                                        CMD inside the namespace with DOCKER_HOST and podman's
#                                        configuration set: `exec docker-compose ...`, `exec podman ps`
#   scripts/compose-engine.sh down       remove what is left in the run's store, stop the service
#                                        and every process left in the namespace, delete the
#                                        store, the CNI plugins' files of this run's project and
#                                        the namespace; compare the host with up's snapshot and
#                                        exit 1 naming anything left
#
# Podman leaves healthchecks to systemd timers; with no systemd running, nothing runs them and
# `depends_on: condition: service_healthy` waits for ever: run `exec podman healthcheck run NAME`
# (test/e2e/compose/engine.ts's healthTicker does it at each check's interval).
#
# Environment: COS_COMPOSE_RUN, the run directory `up` made and printed (exec and down need it).
# Needs root (network namespace, rootful podman).
set -euo pipefail

LOG_TAG=compose-engine
# shellcheck source=scripts/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"   # log, die (exit 1)

# command:package, and the CNI plugins podman's networks use (dnsname: the service names)
TOOLS="docker-compose:docker-compose podman:podman runc:runc conmon:conmon nsenter:util-linux ip:iproute2 curl:curl iptables:iptables dnsmasq:dnsmasq-base ldd:libc-bin"
PLUGINS="bridge:containernetworking-plugins host-local:containernetworking-plugins portmap:containernetworking-plugins firewall:containernetworking-plugins tuning:containernetworking-plugins dnsname:golang-github-containernetworking-plugin-dnsname"
CNI_DIR=/usr/lib/cni
# What the CNI plugins write outside the run directory, whatever they are told: host-local's
# leases, libcni's result cache, dnsname's dnsmasq configuration (each under the network's name).
CNI_PATHS="/var/lib/cni /var/lib/cni/networks /var/lib/cni/results /run/containers/cni /run/containers/cni/dnsname"

missing() { # prints "what package" lines
  local c
  for c in $TOOLS; do command -v "${c%%:*}" >/dev/null || [ -x "/usr/sbin/${c%%:*}" ] || echo "${c%%:*} ${c#*:}"; done
  for c in $PLUGINS; do [ -x "$CNI_DIR/${c%%:*}" ] || echo "$CNI_DIR/${c%%:*} ${c#*:}"; done
}

need_run() {
  RUN=${COS_COMPOSE_RUN:-}
  if [ -z "$RUN" ] || [ ! -f "$RUN/engine.env" ]; then die "COS_COMPOSE_RUN must name a run directory made by 'up'"; fi
  # shellcheck source=/dev/null
  . "$RUN/engine.env"
}

# podman on the run's store, always with explicit paths (never the host's store), in the namespace
pm() { nsenter --net="/run/netns/$NETNS" env CONTAINERS_CONF="$RUN/containers.conf" podman --root "$RUN/storage" --runroot "$RUN/runroot" "$@"; }

snapshot() { # the host as this script could change it
  echo "== addresses"; ip -o addr | sed -E 's/ +(valid|preferred)_lft [^ ]+//g'
  echo "== links"; ip -o link | awk -F': ' '{print $2}'
  echo "== netns"; ip netns list
  echo "== iptables"; { iptables-save; ip6tables-save; } 2>/dev/null | sed -E '/^#/d; s/\[[0-9]+:[0-9]+\]//' || true
  echo "== cni configs"; ls /etc/cni/net.d 2>/dev/null || true
  echo "== cni state"; for p in $CNI_PATHS; do [ -d "$p" ] && echo "$p"; done; true
}

# cgroupfs: podman puts each container in libpod_parent/libpod-<id> and conmon in
# libpod_parent/conmon, in every hierarchy; the last two stay when the containers are gone.
podman_cgroups() { find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*/libpod_parent*' 2>/dev/null | sort; }

processes_in_netns() { # PIDs whose network namespace is the run's
  local ns p
  ns="net:[$(stat -L -c %i "/run/netns/$NETNS")]"
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$ns" ] && echo "${p#/proc/}"
  done
  true
}

build_curl_standin() { # NAME: sh (dash), curl and sleep with their libraries, from this machine
  local name=$1 r="$RUN/standin" f b d
  rm -rf "$r"; mkdir -p "$r/usr/bin" "$r/usr/lib" "$r/etc" "$r/tmp"
  chmod 1777 "$r/tmp"
  for d in bin lib lib64; do ln -s "usr/$d" "$r/$d"; done
  for b in /usr/bin/curl /usr/bin/dash /usr/bin/sleep; do
    for f in "$b" $(ldd "$b" | awk '/=> \//{print $3} /^\t\//{print $1}'); do
      d="$r$(dirname "$f" | sed -E 's#^/(lib|lib64)(/|$)#/usr/\1\2#')"
      mkdir -p "$d"; cp -L "$f" "$d/$(basename "$f")"
    done
  done
  ln -s dash "$r/usr/bin/sh"
  printf 'root:x:0:0:root:/root:/bin/sh\ncurl_user:x:100:101:curl_user:/home/curl_user:/bin/sh\n' >"$r/etc/passwd"
  printf 'root:x:0:\ncurl_group:x:101:\n' >"$r/etc/group"
  printf 'hosts: files dns\n' >"$r/etc/nsswitch.conf"
  # As the image it stands in for: user curl_user, curl as the command.
  tar --numeric-owner -C "$r" -c . | pm import -q --change 'CMD ["curl"]' --change 'USER 100:101' \
    --change "LABEL cos.standin.of=$name" --change "LABEL cos.standin.curl=$(curl --version | head -n 1 | cut -d' ' -f2)" - "$name" >/dev/null
  rm -rf "$r"
  log "stand-in $name: Debian's curl $(curl --version | head -n 1 | cut -d' ' -f2), dash, sleep"
}

up() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespace, rootful podman)"
  [ -z "$(missing)" ] || die "missing: $(missing | tr '\n' ' ')(scripts/compose-engine.sh install)"
  local images=() standins=() id src name spec t0=$SECONDS i
  while [ $# -gt 0 ]; do
    case $1 in
      --image) images+=("$2"); shift 2 ;;
      --curl-standin) standins+=("$2"); shift 2 ;;
      *) die "unknown argument $1" ;;
    esac
  done
  id=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
  RUN=/var/tmp/cos-compose-$id NETNS=cos-compose-$id
  mkdir -m 0700 "$RUN"
  # A failed or interrupted `up` undoes itself.
  trap 'COS_COMPOSE_RUN=$RUN down >&2 || true' EXIT
  trap 'exit 130' INT TERM HUP
  printf 'NETNS=%s\nPROJECT=%s\n' "$NETNS" "cos-compose-$id" >"$RUN/engine.env"
  snapshot >"$RUN/host.before"
  for i in $CNI_PATHS; do [ -d "$i" ] || echo "$i"; done >"$RUN/cni-paths.new"
  podman_cgroups >"$RUN/cgroups.before"
  ip netns add "$NETNS"
  ip netns exec "$NETNS" ip link set lo up
  mkdir -p "$RUN/tmp" "$RUN/networks"
  # podman's defaults that this kind of machine refuses (as container-smoke.sh sets them): rlimits
  # above the hard limits, crun on hybrid cgroups, systemd. File locks: the host's podman keeps
  # its lock numbers in shared memory, which a second store must not share.
  local nofile nproc
  nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
  nproc=$(ulimit -Hu); { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
  cat >"$RUN/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
lock_type = "file"
tmp_dir = "$RUN/tmp"
[network]
network_backend = "cni"
network_config_dir = "$RUN/networks"
EOF
  printf '[storage]\ndriver = "overlay"\ngraphroot = "%s/storage"\nrunroot = "%s/runroot"\n' "$RUN" "$RUN" >"$RUN/storage.conf"
  # shellcheck disable=SC2016 # expanded by the inner sh
  # setsid: a Ctrl-C meant for the runner must not stop the service before `down` has used it.
  setsid sh -c 'echo $$ >"$1/service.pid"; exec nsenter --net="/run/netns/$2" env CONTAINERS_CONF="$1/containers.conf" \
    podman --root "$1/storage" --runroot "$1/runroot" system service --time=0 "unix://$1/podman.sock"' \
    sh "$RUN" "$NETNS" </dev/null >"$RUN/service.log" 2>&1 &
  for i in $(seq 1 120); do
    [ "$(curl -s -m 2 --unix-socket "$RUN/podman.sock" http://d/_ping 2>/dev/null)" = OK ] && break
    [ "$i" = 120 ] && { cat "$RUN/service.log" >&2; die "podman system service did not answer in 60 s"; }
    sleep 0.5
  done
  spec=$(podman info --format '{{.Store.GraphDriverName}}@{{.Store.GraphRoot}}+{{.Store.RunRoot}}')
  for i in "${images[@]}"; do
    src=${i%%=*} name=${i#*=}
    pm pull -q "containers-storage:[$spec]$src" >/dev/null || die "could not copy $src from the host's podman store"
    pm tag "$src" "$name"
    pm untag "$src" "$src" 2>/dev/null || true
    log "image $src -> $name (copied from the host's store)"
  done
  for name in "${standins[@]}"; do build_curl_standin "$name"; done
  trap - EXIT INT TERM HUP
  log "up in $((SECONDS - t0)) s: namespace $NETNS, service pid $(cat "$RUN/service.pid")"
  echo "export COS_COMPOSE_RUN=$RUN"
  echo "export COS_COMPOSE_NETNS=$NETNS COS_COMPOSE_PROJECT=cos-compose-$id"
  echo "export DOCKER_HOST=unix://$RUN/podman.sock"
}

down() {
  need_run
  local left=() pid pids="" i ids="" p
  if [ -e "/run/netns/$NETNS" ]; then
    # Normally empty: `docker-compose down` removed the project's containers and networks.
    if [ -n "$(pm ps -aq 2>/dev/null)" ]; then left+=("containers still there at down: $(pm ps -a --format '{{.Names}}' | tr '\n' ' ')"); pm rm -af -t 0 >/dev/null 2>&1 || true; fi
    for i in $(pm network ls -q 2>/dev/null | grep -v '^podman$'); do left+=("network $i still there at down"); pm network rm -f "$i" >/dev/null 2>&1 || true; done
    ids=$(grep -oE '"ID":"[0-9a-f]{64}"' "$RUN/tmp/events/events.log" 2>/dev/null | cut -d'"' -f4 | sort -u || true)
    pm rmi -af >/dev/null 2>&1 || true
  fi
  if [ -s "$RUN/service.pid" ]; then
    pid=$(cat "$RUN/service.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  if [ -e "/run/netns/$NETNS" ]; then
    # dnsmasq outlives its network by a moment; anything else here is a leak.
    for i in $(seq 1 40); do pids=$(processes_in_netns); [ -z "$pids" ] && break; sleep 0.25; done
    if [ -n "$pids" ]; then
      for p in $pids; do left+=("process $p in the namespace: $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-120)"); done
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
    fi
  fi
  { grep -F "$RUN" /proc/mounts || true; } | awk '{print $2}' | sort -r | while read -r p; do umount -l "$p" || true; done
  for p in /var/lib/cni/networks /var/lib/cni/results /run/containers/cni/dnsname; do
    [ -d "$p" ] && find "$p" -maxdepth 1 -name "${PROJECT}_*" -exec rm -rf {} +
  done
  tac "$RUN/cni-paths.new" 2>/dev/null | while read -r p; do rmdir "$p" 2>/dev/null || true; done
  [ -e "/run/netns/$NETNS" ] && ip netns delete "$NETNS"
  for i in $ids; do
    for p in /sys/fs/cgroup/*/libpod_parent/libpod-"$i" /sys/fs/cgroup/*/libpod_parent/libpod-conmon-"$i"; do
      [ -d "$p" ] && { left+=("cgroup $p"); rmdir "$p" 2>/dev/null || true; }
    done
  done
  # The ones this run made: its containers' (none, normally) and the two parents, if new.
  { comm -13 "$RUN/cgroups.before" <(podman_cgroups) | grep -E "/libpod_parent(/conmon)?\$|$(echo "${ids:-none}" | tr '\n' '|')none" || true; } |
    sort -r | while read -r p; do rmdir "$p" 2>/dev/null || true; done
  snapshot >"$RUN/host.after"
  if ! diff -u "$RUN/host.before" "$RUN/host.after" >"$RUN/host.diff"; then left+=("the host differs from before up: $(grep -E '^[-+][^-+]' "$RUN/host.diff" | tr '\n' ' ')"); fi
  [ -z "$(grep -F "$RUN" /proc/mounts || true)" ] || left+=("mounts under $RUN")
  rm -rf "$RUN"
  if [ ${#left[@]} -gt 0 ]; then
    for i in "${left[@]}"; do log "LEFT: $i"; done
    exit 1
  fi
  log "down: nothing left; the host's addresses, links, namespaces, iptables and CNI state as before up"
}

case ${1:-} in
  missing) m=$(missing); [ -z "$m" ] || { echo "$m"; exit 2; } ;;
  install)
    pkgs=$(missing | awk '{print $2}' | sort -u | tr '\n' ' ')
    [ -z "$pkgs" ] && exit 0
    log "apt-get install $pkgs"
    apt-get update -qq >/dev/null || true
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null ;;
  up) shift; up "$@" ;;
  exec)
    shift; need_run
    exec nsenter --net="/run/netns/$NETNS" env CONTAINERS_CONF="$RUN/containers.conf" CONTAINERS_STORAGE_CONF="$RUN/storage.conf" \
      DOCKER_HOST="unix://$RUN/podman.sock" "$@" ;;
  down) down ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 64 ;;
esac
