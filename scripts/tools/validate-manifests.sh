#!/usr/bin/env bash
# scripts/tools/validate-manifests.sh: rendered Kubernetes objects checked
# offline against the models of kubernetes-models, and of the prometheus-operator
# and cert-manager kinds: schema, unknown fields at any depth, removed APIs,
# duplicates, YAML as Kubernetes reads it. The checker is scripts/validate-manifests.mjs
# (its header says what it checks; it sits in scripts/, where the linter looks).
# The npm packages are those scripts/tools/package-lock.json pins, installed once
# into ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci/npm-tools-<hash>.
#
# usage: scripts/tools/validate-manifests.sh [--kube-version 1.29] [--quiet] FILE|- ...
#        helm template x CHART | scripts/tools/validate-manifests.sh -
# exit:  0 valid, 1 problems found, 2 setup or usage error
set -euo pipefail
export TOOL_NAME='validate-manifests'
# shellcheck source=scripts/tools/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0; }
modules="$(npm_tools)"
COS_TOOLS_MODULES="$modules" exec node "$TOOLS_DIR/../validate-manifests.mjs" "$@"
