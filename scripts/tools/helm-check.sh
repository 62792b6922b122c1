#!/usr/bin/env bash
# scripts/tools/helm-check.sh: a Helm chart checked offline, once per values
# case: the chart's defaults, then each -f file given (by default each
# CHART/ci/*-values.yaml, chart-testing's convention). Per case:
#   helm lint --strict   (the values schema included)
#   helm template        (release cos-ci, namespace cos-ci)
#   validate-manifests.sh on what was rendered (every object has a model: the
#                        built-in kinds, prometheus-operator's and cert-manager's)
# then `helm package`. No cluster and no network: a chart with dependencies
# needs them in charts/ (helm dependency build) first.
# usage: scripts/tools/helm-check.sh [--kube-version 1.29] [-f values.yaml]... CHART_DIR
# env:   HELM   helm to use (default: scripts/tools/get-helm.sh's)
set -euo pipefail
export TOOL_NAME='helm-check'
# shellcheck source=scripts/tools/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
kube=1.29
values=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kube-version) kube="$2"; shift 2 ;;
    -f | --values) values+=("$2"); shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
[[ $# -eq 1 && -f "$1/Chart.yaml" ]] || die "usage: helm-check.sh [--kube-version X.Y] [-f values.yaml]... CHART_DIR"
chart="$1"
helm="${HELM:-$("$TOOLS_DIR/get-helm.sh")}"
if ((${#values[@]} == 0)); then
  for v in "$chart"/ci/*-values.yaml; do [[ -f "$v" ]] && values+=("$v"); done
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

failed=0 cases=0
one_case() { # title [-f values]
  local title=$1 rendered kinds; shift
  cases=$((cases + 1))
  rendered="$out/case-$cases.yaml"
  echo "== $chart: $title"
  if ! "$helm" lint --strict --quiet --kube-version "$kube" "$@" "$chart"; then echo "   FAIL: helm lint --strict"; failed=$((failed + 1)); return; fi
  if ! "$helm" template cos-ci "$chart" --namespace cos-ci --kube-version "$kube" "$@" >"$rendered"; then echo "   FAIL: helm template"; failed=$((failed + 1)); return; fi
  kinds="$(sed -n 's/^kind: //p' "$rendered" | sort | uniq -c | awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }')"
  echo "   lint ok; rendered ${kinds:-nothing}"
  "$TOOLS_DIR/validate-manifests.sh" --quiet --kube-version "$kube" "$rendered" || failed=$((failed + 1))
}
one_case "default values"
for v in "${values[@]}"; do one_case "$v" -f "$v"; done
echo "== $chart: helm package"
if pkg="$("$helm" package "$chart" --destination "$out")"; then echo "   ${pkg##*/}"; else failed=$((failed + 1)); fi
if ((failed)); then echo "helm-check: $chart: $failed of $cases case(s) (or the package) FAILED"; exit 1; fi
echo "helm-check: $chart: $cases case(s) ok, packaged"
