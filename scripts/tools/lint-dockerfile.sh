#!/usr/bin/env bash
# scripts/tools/lint-dockerfile.sh: lints Dockerfiles without hadolint (a
# Haskell program: on none of the registries this project's machines reach).
# Three passes, each must be clean (warnings count):
#   1. dockerfile-utils lint   the parser and validator of VS Code's Docker
#                              language server: unknown instructions, bad flags
#                              and arguments, deprecated forms
#   2. dockerlinter            rules in the spirit of hadolint's (apt-get hygiene,
#                              WORKDIR over cd, ...) and Debian's shellcheck on
#                              every RUN line
#   3. what this project's builder cannot build: podman 4.3 / buildah 1.28
#      (Debian bookworm) refuse heredoc RUN (`RUN <<EOF`) and `COPY --link`
# The npm packages are those scripts/tools/package-lock.json pins; shellcheck
# comes from Debian (apt-get install shellcheck), and without it this fails.
# usage: scripts/tools/lint-dockerfile.sh [-i RULE,RULE] Dockerfile...   (-i: dockerlinter rules to skip)
set -euo pipefail
export TOOL_NAME='lint-dockerfile'
# shellcheck source=scripts/tools/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ignore=()
case "${1:-}" in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
  -i) ignore=(-i "$2"); shift 2 ;;
esac
[[ $# -ge 1 ]] || die "usage: lint-dockerfile.sh [-i RULES] Dockerfile..."
command -v shellcheck >/dev/null || die "no shellcheck: RUN lines cannot be checked (apt-get install shellcheck)"
modules="$(npm_tools)/node_modules"
rc=0
for file in "$@"; do
  echo "== $file"
  echo "-- dockerfile-utils lint"
  node "$modules/dockerfile-utils/bin/dockerfile-utils" lint "$file" || rc=1
  echo "-- dockerlinter (shellcheck $(shellcheck --version | sed -n 's/^version: //p') on RUN lines)"
  node "$modules/dockerlinter/bin/dockerfilelinter.js" -f "$file" -s sh -e warning "${ignore[@]}" || rc=1
  echo "-- what podman 4.3 / buildah 1.28 cannot build"
  if grep -nE '^[[:space:]]*RUN[[:space:]].*<<-?[[:space:]]*["'\'']?[A-Za-z_]+' "$file"; then echo "   heredoc RUN above: write the script in the RUN line"; rc=1; fi
  if grep -niE '^[[:space:]]*(COPY|ADD)[[:space:]]+(--[a-z-]+(=[^[:space:]]+)?[[:space:]]+)*--link' "$file"; then echo "   COPY --link above"; rc=1; fi
done
if ((rc)); then echo "lint-dockerfile: problems found"; else echo "lint-dockerfile: clean"; fi
exit $rc
