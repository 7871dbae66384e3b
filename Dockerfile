# syntax=docker/dockerfile:1
#
# mcp-resumable-gateway image. Stages:
#   build    compiles TypeScript with the dev dependencies;
#   example  the bundled example MCP server (docker build --target example), for
#            trying the gateway out: it runs from the build stage, whose dev
#            dependencies hold the MCP SDK and zod the gateway itself never loads;
#   runtime  (the default target) production dependencies, dist/ and the health
#            probe only.
#
# The base image is a tag, not a digest: pin one for reproducible builds with
#   docker build --build-arg NODE_IMAGE=node:24-slim@sha256:<digest> .
# (the digest of the tag as your registry serves it: `docker buildx imagetools
# inspect node:24-slim`). Node 24 is the LTS line the project supports in production
# next to Node 22 (docs/kubernetes.md, "Node.js versions").
#
# test/packaging/dockerfile.test.ts replays the runtime stage without Docker (COPY,
# RUN npm ci, ENV, HEALTHCHECK, CMD, SIGTERM): keep its supported instructions in
# mind when changing this file.

ARG NODE_IMAGE=node:24-slim

FROM ${NODE_IMAGE} AS build
WORKDIR /app
# Manifests first, so the dependency layer is cached across source changes.
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY examples ./examples
RUN npm run build

FROM build AS example
ENV NODE_ENV=production
COPY scripts/healthcheck.mjs ./scripts/healthcheck.mjs
USER 1000:1000
ENV PORT=3000
EXPOSE 3000
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["node", "scripts/healthcheck.mjs", "http://127.0.0.1:3000/healthz"]
CMD ["node", "dist/examples/mcp-server.js"]

# Debian slim rather than alpine: glibc, and coreutils' `sleep` for the Kubernetes
# preStop hook (helm/mcp-resumable-gateway/templates/deployment.yaml).
FROM ${NODE_IMAGE} AS runtime
ARG NODE_IMAGE
LABEL org.opencontainers.image.title="mcp-resumable-gateway" \
      org.opencontainers.image.description="Resumable SSE gateway for MCP servers: records every server-to-client event and replays it on reconnect" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="${NODE_IMAGE}"
ENV NODE_ENV=production
WORKDIR /app
# No dependency needs an install script; --ignore-scripts keeps the runtime layer
# exactly what the lockfile says.
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm cache clean --force
# The gateway only: dist/examples needs the MCP SDK, a dev dependency.
COPY --from=build /app/dist/src ./dist/src
COPY scripts/healthcheck.mjs ./scripts/healthcheck.mjs
# Files stay owned by root and read-only to the process; it writes nothing (the
# Helm chart mounts the root filesystem read-only, with an emptyDir at /tmp).
# 1000 is the image's `node` user: numeric so Kubernetes runAsNonRoot can verify it.
USER 1000:1000
# 8080: MCP traffic (PORT). 9090: /healthz, /readyz, /metrics (ADMIN_PORT).
EXPOSE 8080 9090
# Liveness only: a draining or store-less gateway is alive but not ready, and
# restarting it would not help. Orchestrators use /readyz for routing.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["node", "scripts/healthcheck.mjs"]
# SIGTERM starts the drain (readiness false, client streams closed with a retry
# hint); give the container more than SHUTDOWN_GRACE_SECONDS (25) to stop.
STOPSIGNAL SIGTERM
# glibc's allocator keeps freed memory for reuse instead of handing it back to the
# kernel and faulting it in again (the batch and page buffers of a busy gateway):
# the same setting as `npm start` (see docs/performance.md).
ENV GLIBC_TUNABLES=glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432
# Node flags: the same as `npm start` (see README, Performance).
CMD ["node", "--no-memory-reducer", "--heap-growing-percent=200", "--max-semi-space-size=16", "dist/src/main.js"]
