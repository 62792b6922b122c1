#!/usr/bin/env bash
# .github/ci-cache-listing.sh: for .github/workflows/ci.yml, one line per cache it keeps,
# "ci=<hash>" and "kube=<hash>", a hash of what the cache holds (names down to three levels:
# each tool's, Node's and Kubernetes version's directory and the binaries in it), without
# the Go caches the workflow does not keep. Equal before and after a run: nothing to save.
set -euo pipefail
cache=${XDG_CACHE_HOME:-$HOME/.cache}
listing() { # dir, excluded top-level names...
  local dir=$1; shift
  local prune=()
  for name in "$@"; do prune+=(-path "$dir/$name" -prune -o); done
  find "$dir" -maxdepth 3 "${prune[@]}" -print 2>/dev/null | sort | sha256sum | cut -c1-16
}
echo "ci=$(listing "$cache/cos-auth-proxy-ci" go)"
echo "kube=$(listing "$cache/cos-auth-proxy-kube" gocache gomod node-run)"
