# scripts/tools/common.sh: sourced by the other scripts/tools/*.sh. The cache
# root, messages on stderr, and one function that installs the pinned npm
# packages of package.json/package-lock.json beside this file.
# shellcheck shell=bash

TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CI_CACHE="${COS_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci}"

say() { printf '[%s] %s\n' "${TOOL_NAME:-tools}" "$*" >&2; }
die() { say "ERROR: $*"; exit 2; }

# npm_tools: prints the directory holding node_modules/ with exactly what
# scripts/tools/package-lock.json pins (names, versions, integrity), installed
# once with `npm ci --ignore-scripts` (no package runs code at install time:
# dockerlinter's postinstall would fetch shellcheck from outside the registries;
# Debian's shellcheck is used instead). Keyed by the lockfile's hash, so a
# changed pin gets a directory of its own.
npm_tools() {
  local key dir tmp
  key="$(cat "$TOOLS_DIR/package.json" "$TOOLS_DIR/package-lock.json" | sha256sum | cut -c1-12)"
  dir="$CI_CACHE/npm-tools-$key"
  if [[ ! -f "$dir/.installed" ]]; then
    command -v npm >/dev/null || die "npm not found"
    mkdir -p "$CI_CACHE"
    tmp="$(mktemp -d "$CI_CACHE/.npm-tools.XXXXXX")"
    cp "$TOOLS_DIR/package.json" "$TOOLS_DIR/package-lock.json" "$tmp/"
    say "npm ci of scripts/tools/package-lock.json into $dir (once)"
    if ! (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
      rm -rf "$tmp"; die "npm ci of the tools failed"
    fi
    touch "$tmp/.installed"
    rm -rf "$dir"
    mv "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp" # another run got there first: keep its copy
  fi
  printf '%s\n' "$dir"
}
