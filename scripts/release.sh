#!/usr/bin/env bash
# scripts/release.sh: builds and publishes one release of cos-auth-proxy, the
# same way by hand and in .github/workflows/release.yml:
#
#   1. checks the version: tag v<version> = package.json = the chart's version and
#      appVersion = the Dockerfile's VERSION (scripts/check-version.mjs)
#   2. bundles once, here (node scripts/bundle.mjs: the bundle and esbuild's metafile)
#   3. the image for linux/amd64 and linux/arm64 as one index, pushed to
#      REG/cos-auth-proxy:<version>: with podman, one build per architecture on this
#      machine's stand-in bases (scripts/tools/container-smoke.sh --platform), then
#      `podman manifest`; with docker, one `docker buildx build --platform …`
#   4. per platform: the bundle in the pushed image must be the bytes bundled in 2;
#      an SBOM (CycloneDX, scripts/sbom.mjs: the packages esbuild put in the bundle and
#      the Node runtime the image carries), attested to the platform's digest and to
#      the index's
#   5. signs the index digest and each platform's (cosign sign --recursive)
#   6. the chart: helm package, helm push oci://REG/charts, signed
#   7. the npm package (scripts/npm-package.mjs): packed; published with --npm-registry
#   8. release notes (CHANGELOG's section, scripts/release-notes.mjs) and SHA256SUMS in --out
#
# usage: scripts/release.sh --registry REG [--version X.Y.Z] [--sign-key FILE]
#                           [--npm-registry URL] [--builder podman|docker] [--out DIR]
#   --registry REG      HOST[:PORT][/namespace], e.g. ghcr.io/cos-auth-proxy or 127.0.0.1:5000;
#                       plain HTTP only for a loopback host (127.0.0.1, localhost, [::1])
#   --version X.Y.Z     default: package.json's
#   --sign-key FILE     a cosign private key (its password in COSIGN_PASSWORD); signed offline
#                       (no transparency log). Absent: keyless, with the ambient OIDC token
#                       of GitHub Actions (Fulcio certificate, Rekor entry)
#   --npm-registry URL  publish the npm package there (absent: packed only; the workflow
#                       publishes it with provenance)
#   --builder B         podman (default) or docker (buildx with QEMU, as in the workflow)
#   --out DIR           default dist/release
# Prints one line per artifact on stdout (everything else goes to stderr):
#   image REG/cos-auth-proxy@sha256:…
#   chart REG/charts/cos-auth-proxy@sha256:…
#   sbom  DIR/sbom-linux-<arch>.cdx.json REG/cos-auth-proxy@sha256:<platform digest>
#   npm   cos-auth-proxy@X.Y.Z
# env: COSIGN_PASSWORD (with --sign-key); COSIGN, CRANE, HELM: binaries to use (default: built
#      from their Go modules by scripts/tools/get-go-tool.sh, helm by get-helm.sh); COS_CI_CACHE
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '[release] %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

registry="" version="" sign_key="" npm_registry="" builder=podman out=dist/release
while [[ $# -gt 0 ]]; do
  case $1 in
    --registry) registry=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --sign-key) sign_key=$2; shift 2 ;;
    --npm-registry) npm_registry=$2; shift 2 ;;
    --builder) builder=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument $1 (--help)" ;;
  esac
done
[[ -n $registry ]] || die "--registry is required (--help)"
registry_re='^[][A-Za-z0-9.:-]+(/[a-z0-9._/-]+)?$'
[[ $registry =~ $registry_re ]] || die "--registry: '$registry' is not HOST[:PORT][/namespace]"
[[ $builder == podman || $builder == docker ]] || die "--builder: podman or docker"
[[ -z $version ]] && version=$(node -p 'require("./package.json").version')
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "--version: '$version' is not X.Y.Z"
if [[ -n $sign_key ]]; then
  [[ -f $sign_key ]] || die "--sign-key: no file $sign_key"
  [[ -n ${COSIGN_PASSWORD+set} ]] || die "--sign-key needs COSIGN_PASSWORD in the environment (empty for a key without one)"
fi

host=${registry%%/*} hostname=${host%:*}
[[ $host == \[*\]* ]] && hostname=${host%%]*}] # [::1]:5000
plain=0
case $hostname in 127.0.0.1 | localhost | '[::1]') plain=1 ;; esac
image_repo=$registry/cos-auth-proxy
chart_repo=$registry/charts
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cos-release.XXXXXX")
trap 'rm -rf "$work"' EXIT
t_all=$SECONDS

# ---- tools ----------------------------------------------------------------------------------
crane=${CRANE:-$(bash scripts/tools/get-go-tool.sh crane)}
cosign=${COSIGN:-$(bash scripts/tools/get-go-tool.sh cosign)}
helm=${HELM:-$(bash scripts/tools/get-helm.sh)}
crane_flags=() cosign_reg=() helm_reg=() podman_tls=()
if ((plain)); then
  crane_flags=(--insecure) cosign_reg=(--allow-insecure-registry --allow-http-registry) helm_reg=(--plain-http) podman_tls=(--tls-verify=false)
fi
if [[ -n $sign_key ]]; then
  # Offline, key-based: a signing configuration with no services (cosign v3 refuses
  # --tlog-upload=false) and an empty trusted root, so that cosign asks no TUF
  # repository for one (it would otherwise try tuf-repo-cdn.sigstore.dev); a check
  # then needs --insecure-ignore-tlog and the same empty root (test/e2e/release/signatures.ts).
  "$cosign" signing-config create --out "$work/signing-config.json" >/dev/null 2>&1 \
    || die "cosign signing-config create failed"
  echo '{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}' >"$work/trusted-root.json"
  cosign_sign=(--key "$sign_key" --signing-config "$work/signing-config.json" --trusted-root "$work/trusted-root.json")
else
  cosign_sign=() # keyless: Fulcio and Rekor, with the workflow's OIDC identity
fi

# ---- 1. one version -------------------------------------------------------------------------
node scripts/check-version.mjs "v$version" >&2 || die "the version does not match everywhere (above)"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)

# ---- 2. the bundle, once --------------------------------------------------------------------
node scripts/bundle.mjs >&2
bundle_sha=$(sha256sum dist/cos-auth-proxy.mjs | cut -d' ' -f1)
say "bundle sha256:$bundle_sha"

# ---- 3. the image ---------------------------------------------------------------------------
platforms=(linux/amd64 linux/arm64)
t0=$SECONDS
if [[ $builder == podman ]]; then
  for p in "${platforms[@]}"; do
    bash scripts/tools/container-smoke.sh --build-only --keep --platform "$p" -t "localhost/cos-auth-proxy:release-$version-${p#linux/}" \
      --build-arg "VERSION=$version" --build-arg "REVISION=$revision" Dockerfile . >&2 \
      || die "building $p failed"
  done
  # The list only once both images exist, and never left behind: an empty list in
  # podman 4.3's store breaks every later `podman images` ("no image found in manifest
  # list for architecture amd64").
  list=localhost/cos-auth-proxy:release-$version
  podman manifest rm "$list" >/dev/null 2>&1 || true
  trap 'podman manifest rm "$list" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
  podman manifest create "$list" >/dev/null
  for p in "${platforms[@]}"; do
    podman manifest add "$list" "containers-storage:localhost/cos-auth-proxy:release-$version-${p#linux/}" >/dev/null
  done
  podman manifest push --all "${podman_tls[@]}" --digestfile "$work/index.digest" "$list" "docker://$image_repo:$version" >&2 \
    || die "podman manifest push failed"
  podman manifest rm "$list" >/dev/null 2>&1 || true
else
  docker buildx build --platform "$(IFS=,; echo "${platforms[*]}")" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    --provenance=false --sbom=false --metadata-file "$work/buildx.json" --push -t "$image_repo:$version" . >&2 \
    || die "docker buildx build failed"
fi
index=$("$crane" digest "${crane_flags[@]}" "$image_repo:$version")
say "image index $image_repo@$index (${#platforms[@]} platforms, $((SECONDS - t0)) s)"

# ---- 4. per platform: the bundle that runs, its SBOM --------------------------------------
"$crane" manifest "${crane_flags[@]}" "$image_repo@$index" >"$work/index.json"
sbom_lines=()
for p in "${platforms[@]}"; do
  arch=${p#linux/}
  # shellcheck disable=SC2016 # JavaScript
  pdigest=$(node -e '
    const index = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))
    const [os, arch] = process.argv[2].split("/")
    const hits = (index.manifests ?? []).filter(m => m.platform?.os === os && m.platform?.architecture === arch)
    if (hits.length !== 1) { console.error(`${hits.length} entries for ${os}/${arch}`); process.exit(1) }
    console.log(hits[0].digest)' "$work/index.json" "$p") || die "the index has no single $p entry"
  root=$work/root-$arch && mkdir -p "$root"
  "$crane" export "${crane_flags[@]}" "$image_repo@$pdigest" - | tar -xf - -C "$root" nodejs/bin/node app/dist/cos-auth-proxy.mjs \
    || die "$p: cannot read /nodejs/bin/node and the bundle out of $pdigest"
  [[ $(sha256sum "$root/app/dist/cos-auth-proxy.mjs" | cut -d' ' -f1) == "$bundle_sha" ]] \
    || die "$p: the image's bundle is not the one bundled here (the SBOM would describe other bytes)"
  node_version=$(grep -aoE -m1 'nodejs\.org/download/release/v[0-9]+\.[0-9]+\.[0-9]+/' "$root/nodejs/bin/node" | head -n 1 | sed -E 's|.*/v([0-9.]+)/|\1|')
  [[ -n $node_version ]] || die "$p: no Node version found in /nodejs/bin/node"
  sbom=$out/sbom-linux-$arch.cdx.json
  node scripts/sbom.mjs --metafile dist/cos-auth-proxy.meta.json --bundle dist/cos-auth-proxy.mjs \
    --node-version "$node_version" --platform "$p" --out "$sbom" >&2
  for subject in "$pdigest" "$index"; do
    "$cosign" attest --yes "${cosign_sign[@]}" "${cosign_reg[@]}" --type cyclonedx --predicate "$sbom" "$image_repo@$subject" >&2 \
      || die "$p: cosign attest on $subject failed"
  done
  sbom_lines+=("sbom $sbom $image_repo@$pdigest")
  rm -rf "$root"
done

# ---- 5. signatures --------------------------------------------------------------------------
"$cosign" sign --yes --recursive "${cosign_sign[@]}" "${cosign_reg[@]}" "$image_repo@$index" >&2 || die "cosign sign failed"

# ---- 6. the chart ---------------------------------------------------------------------------
"$helm" package helm/cos-auth-proxy --version "$version" --app-version "$version" -d "$out" >&2
chart_tgz=$out/cos-auth-proxy-$version.tgz
"$helm" push "$chart_tgz" "oci://$chart_repo" "${helm_reg[@]}" 2>&1 | tee "$work/helm-push.out" >&2
chart_digest=$(sed -nE 's/^Digest: (sha256:[0-9a-f]{64})$/\1/p' "$work/helm-push.out")
[[ -n $chart_digest ]] || die "helm push printed no digest"
"$cosign" sign --yes "${cosign_sign[@]}" "${cosign_reg[@]}" "$chart_repo/cos-auth-proxy@$chart_digest" >&2 || die "cosign sign (chart) failed"

# ---- 7. the npm package ---------------------------------------------------------------------
npm_tgz=$(node scripts/npm-package.mjs --out "$out" | tail -n 1)
[[ -f $npm_tgz ]] || die "scripts/npm-package.mjs printed no package"
if [[ -n $npm_registry ]]; then
  npm publish "$npm_tgz" --registry "$npm_registry" >&2 || die "npm publish to $npm_registry failed"
fi

# ---- 8. notes, checksums --------------------------------------------------------------------
node scripts/release-notes.mjs "$version" >"$out/release-notes.md" || die "CHANGELOG.md has no section for $version"
(cd "$out" && sha256sum -- "$(basename "$chart_tgz")" "$(basename "$npm_tgz")" sbom-linux-*.cdx.json >SHA256SUMS)

say "released $version in $((SECONDS - t_all)) s"
echo "image $image_repo@$index"
echo "chart $chart_repo/cos-auth-proxy@$chart_digest"
printf '%s\n' "${sbom_lines[@]}"
echo "npm cos-auth-proxy@$version$([[ -n $npm_registry ]] || echo " (packed: $npm_tgz; not published)")"
