# ax: one image for nodes, executors and the CLI. TypeScript runs through tsx (a runtime
# dependency), so there is no build step.
#   docker build -t ax .
#   docker run --rm ax --help
FROM node:20

WORKDIR /app
ENV NODE_ENV=production

# Dependencies first (cached while only the source changes).
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force

COPY . .
RUN chown -R node:node /app
USER node

# A node serves /healthz on --http; the compose file passes the port.
EXPOSE 8080
ENTRYPOINT ["node", "bin/ax.mjs"]
CMD ["node", "--http", "8080"]
