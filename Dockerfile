# syntax=docker/dockerfile:1
#
# mcp-resumable-gateway image. Two stages: `build` compiles TypeScript with the dev
# dependencies; the runtime stage holds production dependencies, dist/ and the health
# probe only. The same image also runs the bundled example MCP server:
#   docker run ... node dist/examples/mcp-server.js
#
# test/packaging/dockerfile.test.ts replays the runtime stage without Docker (COPY,
# RUN npm ci, ENV, HEALTHCHECK, CMD, SIGTERM): keep its supported instructions in
# mind when changing this file.

FROM node:24-slim AS build
WORKDIR /app
# Manifests first, so the dependency layer is cached across source changes.
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY examples ./examples
RUN npm run build

# Debian slim rather than alpine: glibc, and coreutils' `sleep` for the Kubernetes
# preStop hook (helm/mcp-resumable-gateway/templates/deployment.yaml).
FROM node:24-slim AS runtime
ENV NODE_ENV=production
WORKDIR /app
# No dependency needs an install script; --ignore-scripts keeps the runtime layer
# exactly what the lockfile says.
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
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
# Node flags: the same as `npm start` (see README, Performance).
CMD ["node", "--no-memory-reducer", "--heap-growing-percent=200", "dist/src/main.js"]
