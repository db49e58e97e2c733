import { AxError, createLogger, loadConfig, redact } from "../common/index.ts";
import { Executor } from "../protocol/index.ts";
import { AxNode } from "./node.ts";
import { demoHandler } from "./demoExecutor.ts";

/**
 * The quick start: one node (dashboard on AX_DEMO_PORT, default 8080), a demo executor and
 * example tasks — a cron every 10 seconds, a fixed-delay task, one that fails then succeeds
 * on retry, and a small chain (sync → report). Re-running it reuses the tasks it made.
 */
const config = loadConfig(process.env, { AX_SHARDS: process.env.AX_SHARDS ?? "16" });
const log = createLogger({ level: process.env.AX_LOG_LEVEL ?? "warn" });
const port = Number(process.env.AX_DEMO_PORT ?? 8080);
const node = new AxNode({ config, nodeId: "demo-node", httpPort: port, logger: log });
await node.start().catch((e: unknown) => {
  // A refusal reads as one line (which setting, why), not a stack trace.
  process.stderr.write(`ax demo: ${redact(e instanceof Error ? e.message : String(e))}\n`);
  process.exit(e instanceof AxError && e.code === "AX_E_CONFIG" ? 2 : 1);
});
const ex = new Executor({ name: "demo", namespace: config.namespace, nats: config.nats, logger: log, handler: demoHandler({ sleepMs: 300, failRate: 0, log }) });
await ex.start();
await ex.registered;

const examples: Array<Record<string, unknown>> = [
  { name: "heartbeat", executor: "demo", cron: "*/10 * * * * *", tz: "UTC" },
  { name: "cleanup", executor: "demo", fixedDelay: "15s", payload: { sleepMs: 2000 } },
  { name: "flaky", executor: "demo", every: "30s", retries: 2, backoff: "2s", payload: { failAttempts: 1 } },
  { name: "sync", executor: "demo", every: "20s" },
  { name: "report", executor: "demo", after: ["sync"] },
];
for (const t of examples) {
  try { await node.api.call("task.create", t); } catch (e) { if (!(e instanceof AxError && e.code === "AX_E_CONFLICT")) throw e; }
}
const url = node.httpAddress ?? "(no http)";
process.stdout.write(`
ax demo is running (namespace "${config.namespace}"): node demo-node, executor "demo", ${examples.length} example tasks.

  dashboard        ${url}/
  in another shell try:
    node bin/ax.mjs task ls
    node bin/ax.mjs runs heartbeat
    node bin/ax.mjs why <run id from above>
    node bin/ax.mjs runs flaky            # attempt 1 fails, the retry succeeds
    node bin/ax.mjs dag report            # sync → report
    node bin/ax.mjs run report            # a manual run
    node bin/ax.mjs status
  metrics          ${url}/metrics

Ctrl-C stops the node and the executor (tasks stay in PostgreSQL for next time).
`);
const stop = () => { void ex.stop().then(() => node.stop()).then(() => process.exit(0)); };
process.once("SIGINT", stop);
process.once("SIGTERM", stop);
