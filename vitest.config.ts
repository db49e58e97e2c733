import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // The fault tests start their own servers and an ax node each and load them for a minute:
    // run apart (npm run test:faults, vitest.faults.config.ts) so they do not starve the
    // timing-sensitive tests on a 2-core machine.
    exclude: ["test/faults/**", "**/node_modules/**"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    maxWorkers: 3,
    fileParallelism: true,
    reporters: ["default"],
  },
});
