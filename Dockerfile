# ax: one image for nodes, executors and the CLI, running the compiled JavaScript (dist/).
#   docker build -t ax .
#   docker run --rm ax --help
#   docker run --rm -p 127.0.0.1:8080:8080 -e AX_NATS_URL=... -e AX_PG_URL=... -e AX_REDIS_URL=... ax
# Install scripts are skipped: the optional native msgpack addon falls back to JavaScript, and
# nothing else the image needs builds anything at install time.

# ---- build: every dependency, tsc -> dist/ ----
FROM node:20 AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts
COPY tsconfig.json tsconfig.build.json ./
COPY scripts/build.sh scripts/
COPY common common
COPY cluster cluster
COPY actors actors
COPY protocol protocol
COPY ops ops
RUN npm run build

# ---- runtime: production dependencies and the compiled CLI only (no tsx, no sources) ----
FROM node:20-slim
WORKDIR /app
ENV NODE_ENV=production
# The V8 flag of bin/ax.mjs's launcher line (see there): the node's young generation.
ENV NODE_OPTIONS=--max-semi-space-size=64
# The HTTP server listens on loopback unless told otherwise; in a container the published port
# must reach it. Publish it on the host's loopback (-p 127.0.0.1:8080:8080) or behind a proxy.
ENV AX_HTTP_HOST=0.0.0.0
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund --ignore-scripts && npm cache clean --force
COPY --from=build /src/dist dist
COPY bin bin
USER node

# A node serves /healthz, /metrics, /api and the dashboard on --http.
EXPOSE 8080
ENTRYPOINT ["node", "dist/ops/cli.js"]
CMD ["node", "--http", "8080"]
