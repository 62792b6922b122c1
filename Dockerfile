# cos-auth-proxy container image.
#
#   docker build -t cos-auth-proxy .            (or: podman build --format docker …)
#   docker run --rm --read-only --cap-drop=ALL \
#     -e COS_MANAGEMENT_API_URL=https://… -e COS_OPTIMIZE_API_URL=https://… \
#     -e COS_ACCESS_KEY_FILE=/var/run/secrets/cos/access-key \
#     -e COS_ACCESS_KEY_SECRET_FILE=/var/run/secrets/cos/access-key-secret \
#     -v "$PWD/creds:/var/run/secrets/cos:ro" cos-auth-proxy
#
# Build on the full Node image (npm ci, then scripts/bundle.mjs bundles src/
# and its dependencies into one minified ES module), run on distroless Node
# (no shell, no npm, no package manager, user 65532). Only that file, its
# source map and the licence notices of the packages inside it reach the
# final image: no node_modules, no package.json. .dockerignore keeps
# everything else (.env, keys, tests, git) out of the build context altogether.
#
# Two architectures, linux/amd64 and linux/arm64, from this one file. The
# build stage always runs on the build platform ($BUILDPLATFORM): it bundles
# once, natively, and never runs npm ci under emulation (the bundle is plain
# JavaScript, the same bytes for every architecture); only the stages from
# the distroless base on differ by architecture.
#   BuildKit:  docker buildx build --platform linux/amd64,linux/arm64 -t IMAGE --push .
#   podman 4.3 / buildah 1.28 (Debian bookworm): one build per architecture, then a list:
#     for arch in amd64 arm64; do
#       podman build --platform linux/$arch --build-arg BUILDPLATFORM=linux/amd64 -t IMAGE-$arch .
#     done
#     podman manifest create IMAGE && podman manifest add IMAGE containers-storage:IMAGE-amd64 …
#   Buildah 1.28 sets TARGETPLATFORM (linux/arm64), TARGETOS and TARGETARCH (arm64) but
#   not BUILDPLATFORM (nor BUILDARCH, TARGETVARIANT): give BUILDPLATFORM as a build
#   argument, or the build stage is pulled for the target and runs under emulation.
#   Its one-command `--platform linux/amd64,linux/arm64 --manifest` gave two amd64
#   images under an arm64 label (issue 44: not used). A stage's FROM --platform stays
#   in force for the stages after it (tested: the final stage of an arm64 pass looked
#   for an amd64 base), hence
#   the explicit --platform=$TARGETPLATFORM on the stages that run the target's code.
#   scripts/tools/container-smoke.sh --platform linux/arm64 does all this on local
#   stand-ins of the bases.
#
# Pin the bases by digest in your own builds (a digest of the base's index,
# which names every architecture), e.g.
#   FROM --platform=$BUILDPLATFORM node:24-bookworm-slim@sha256:<digest> AS build
# No heredoc RUN and no COPY --link: podman 4.3 / buildah 1.28 cannot build them.

# Which compile-cache stage the image copies (amd64 or arm64, below).
ARG TARGETARCH

FROM --platform=$BUILDPLATFORM node:24-bookworm-slim AS build
# Marks the throw-away build stage, so local builds can prune old ones.
LABEL cos-auth-proxy.stage=build
WORKDIR /src
# Dependencies first: this layer is reused until package*.json change.
# --ignore-scripts: no dependency runs code at install time (esbuild's binary
# comes as the optional package of the build platform, @esbuild/linux-x64 on
# amd64, no install script needed).
# (No RUN --mount=type=cache: the npm cache stays in this throw-away stage.)
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
COPY tsconfig.json ./
COPY scripts/bundle.mjs ./scripts/
COPY src ./src
# dist/cos-auth-proxy.mjs (+ .map, + .licenses.txt): only what the program
# imports is in it, so the dependencies' test fixtures and tooling never are.
RUN node scripts/bundle.mjs

# V8's compile cache, filled once here so that every pod starts warm (Node
# >= 22.1 reads NODE_COMPILE_CACHE; parsing and compiling the 2.2 MB bundle
# is ~65 ms of each start otherwise: 157 ms against 91 ms for --version). A cache entry belongs to one Node
# binary and architecture, one file path and one user id (the directory is
# named after them, e.g. v24.22.3-x64-<hash>-65532), so it is made by the
# runtime image's own node, on the path and as the user the image runs; a
# pod run under another uid just starts cold. `help` parses the whole file;
# nothing else is run.
# Per architecture (the stage named compile-cache-$TARGETARCH is used):
#   amd64  filled as above (natively on an amd64 builder).
#   arm64  an empty directory: the arm64 image starts cold (~65 ms more per
#          start, measured on amd64; 272 KB less image). Filling it means
#          running the arm64 node at build time, i.e. under emulation, which
#          podman here cannot do (no binfmt handler; BuildKit with QEMU could,
#          but the two builders must give the same image, and a cache made
#          under QEMU cannot be checked against real arm64 hardware here).
#          Node says nothing and runs normally when it cannot write there
#          (the directory is read-only to the runtime user).
FROM --platform=$TARGETPLATFORM gcr.io/distroless/nodejs24-debian12:nonroot AS compile-cache-amd64
LABEL cos-auth-proxy.stage=build
COPY --from=build /src/dist/cos-auth-proxy.mjs /app/dist/
USER 65532:65532
ENV NODE_COMPILE_CACHE=/tmp/compile-cache
RUN ["/nodejs/bin/node", "--max-semi-space-size=8", "/app/dist/cos-auth-proxy.mjs", "help"]

# Runs on the build platform, like the build stage it starts from.
FROM build AS compile-cache-arm64
RUN mkdir -p /tmp/compile-cache

# One of the two stages above, not an image (the linter reads it as an untagged image):
# linter ignore=EF0004
FROM compile-cache-${TARGETARCH} AS compile-cache

FROM --platform=$TARGETPLATFORM gcr.io/distroless/nodejs24-debian12:nonroot
# The default is package.json's version (test/version.test.ts keeps them equal;
# a Dockerfile cannot read it from a file); --build-arg VERSION=… overrides it.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="cos-auth-proxy" \
      org.opencontainers.image.description="Credential-injecting sidecar for the Cluster Optimization Service APIs: signs every request with a fresh Bearer token." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="gcr.io/distroless/nodejs24-debian12:nonroot"
# The admin listener (/healthz, /readyz, /metrics) must be reachable by the
# kubelet or the container engine; the proxy port keeps its loopback default
# (COS_LISTEN_HOST=127.0.0.1): set COS_LISTEN_HOST=0.0.0.0 and COS_ALLOW_FROM
# to serve other hosts.
# MALLOC_ARENA_MAX=2: glibc keeps two malloc arenas instead of up to 8 per
# core, which holds native memory down; `npm start` cannot set it (no
# wrapper), so README.md and docs/development.md tell you to export it to match the image.
# NODE_OPTIONS=--max-old-space-size=64: the old space is capped at 64 MiB
# whatever the memory limit (the sidecar's own load, not its pod's, sets
# what it needs: ~15 MB live after a full collection). With the 8 MB
# semi-spaces of the ENTRYPOINT, V8's heap limit is 88 MiB, which with the
# ~100 MB the rest of the process may take fits the chart's 192Mi limit:
# V8 collects before the container is OOM-killed (docs/performance.md,
# "Settings that move together"). Sized from the limit instead
# (--max-old-space-size-percentage), the heap kept garbage up to its cap.
# Setting NODE_OPTIONS in the pod replaces it: keep it in what you set.
ENV NODE_ENV=production \
    NODE_OPTIONS=--max-old-space-size=64 \
    MALLOC_ARENA_MAX=2 \
    MALLOC_MMAP_THRESHOLD_=32768 \
    NODE_COMPILE_CACHE=/app/compile-cache \
    COS_ADMIN_HOST=0.0.0.0
WORKDIR /app
# Owned by root and not writable by the runtime user: the process cannot
# change its own code. The root filesystem can be mounted read-only.
COPY --from=build /src/dist/cos-auth-proxy.mjs /src/dist/cos-auth-proxy.mjs.map /src/dist/cos-auth-proxy.licenses.txt ./dist/
# The compile cache (empty on arm64, see the compile-cache stages).
# Readable, not writable, by the runtime user: a hit is only read (the
# root filesystem can stay read-only), and the process cannot alter the
# code a later start will run.
COPY --from=compile-cache --chown=0:0 --chmod=0555 /tmp/compile-cache ./compile-cache/
USER 65532:65532
EXPOSE 8080 9090
# No shell and no curl here: the CLI's own `wait` polls the admin /readyz.
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
  CMD ["/nodejs/bin/node", "/app/dist/cos-auth-proxy.mjs", "wait", "--timeout", "3"]
# node is PID 1 and handles SIGTERM itself: drain, then exit 0.
# The same file and Node flags as `npm start` (package.json); a test keeps
# the two equal. Heap flags: the young generation capped at 8 MB per
# semi-space; the old space capped by NODE_OPTIONS above
# (docs/performance.md, "Settings that move together").
ENTRYPOINT ["/nodejs/bin/node", "--max-semi-space-size=8", "/app/dist/cos-auth-proxy.mjs"]
CMD ["serve"]
