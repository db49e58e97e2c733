import { defineConfig } from "vitest/config";

/** `npm run test:faults`: one file at a time (each starts PostgreSQL, Redis, NATS and an ax node). */
export default defineConfig({
  test: {
    include: ["test/faults/**/*.test.ts"],
    testTimeout: 240_000,
    hookTimeout: 120_000,
    pool: "forks",
    fileParallelism: false,
    maxWorkers: 1,
    reporters: ["default"],
  },
});
