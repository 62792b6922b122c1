#!/usr/bin/env bash
# scripts/tools/get-go-tool.sh: prints the path of a release tool built from
# its Go module at a pinned version, cached under
# ${COS_CI_CACHE:-~/.cache/cos-auth-proxy-ci}/go-tools/<name>-<version>; a
# tool present there is never rebuilt. Each module is `go install`ed with the
# machine's Go from the Go module proxy (its own go.mod and go.sum, checked
# against the checksum database), CGO off, niced.
#
#   cosign      github.com/sigstore/cosign/v3/cmd/cosign        v3.1.3   (~10 min cold on 2 cores)
#   crane       github.com/google/go-containerregistry/cmd/crane v0.22.1  (~1 min; also `crane registry serve`)
#   actionlint  github.com/rhysd/actionlint/cmd/actionlint      v1.7.12  (~15 s)
#
# usage: scripts/tools/get-go-tool.sh NAME      (chatter on stderr, the path on stdout)
#        scripts/tools/get-go-tool.sh --all     (builds all three, prints nothing)
set -euo pipefail
export TOOL_NAME='get-go-tool'
# shellcheck source=scripts/tools/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[[ "${1:-}" == -h || "${1:-}" == --help || -z "${1:-}" ]] && { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0; }

module_of() { # name -> "package version ldflags"
  case $1 in
    cosign) echo "github.com/sigstore/cosign/v3/cmd/cosign v3.1.3 -X=sigs.k8s.io/release-utils/version.gitVersion=v3.1.3" ;;
    crane) echo "github.com/google/go-containerregistry/cmd/crane v0.22.1 -X=github.com/google/go-containerregistry/cmd/crane/cmd.Version=v0.22.1" ;;
    actionlint) echo "github.com/rhysd/actionlint/cmd/actionlint v1.7.12 -X=github.com/rhysd/actionlint.version=v1.7.12" ;;
    *) die "unknown tool '$1' (cosign, crane, actionlint)" ;;
  esac
}

get() {
  local name=$1 pkg version ldflags dest gobin t0
  read -r pkg version ldflags < <(module_of "$name")
  dest="$CI_CACHE/go-tools/$name-$version"
  if [[ ! -x "$dest" ]]; then
    command -v go >/dev/null || die "no go: $name $version is built from its Go module"
    mkdir -p "$CI_CACHE/go-tools"
    gobin="$(mktemp -d "$CI_CACHE/go-tools/.gobin.XXXXXX")"
    t0=$SECONDS
    say "building $name $version from the Go module proxy with $(go env GOVERSION) (nice 19; once)"
    if ! GOBIN="$gobin" GOFLAGS=-modcacherw GOMODCACHE="$CI_CACHE/go/mod" GOCACHE="$CI_CACHE/go/build" CGO_ENABLED=0 \
      nice -n 19 go install -trimpath -ldflags "-s -w $ldflags" "$pkg@$version" >&2; then
      rm -rf "$gobin"; die "go install $pkg@$version failed"
    fi
    mv -f "$gobin/$name" "$dest" && rm -rf "$gobin"
    say "$name $version built in $((SECONDS - t0)) s: $dest"
  fi
  printf '%s\n' "$dest"
}

if [[ $1 == --all ]]; then
  for t in actionlint crane cosign; do get "$t" >/dev/null; done
else
  get "$1"
fi
