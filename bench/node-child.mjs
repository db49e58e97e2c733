/**
 * An ax node in its own process for the benchmarks, driven over IPC by bench/harness.ts:
 * - sends { t: "ready" } once every shard is owned;
 * - answers { t: "usage" } with CPU seconds (process.cpuUsage), RSS and heap;
 * - { t: "gc" } runs a full GC first when started with --expose-gc;
 * - { t: "stop" } stops the node gracefully and exits (a --cpu-prof profile is written then).
 * Configuration comes from the AX_* environment, as for `ax node`.
 *
 * Plain JavaScript running the compiled node (dist/, `npm run build`), as `ax node` runs once
 * built or installed: through tsx, esbuild's keepNames wrapper around every closure it creates
 * was 3–4 % of the node's profile, which is not what users run. The harness builds dist/ first
 * when it is older than the sources.
 */
import process from "node:process";
import { setTimeout } from "node:timers";
import { Session } from "node:inspector/promises";
import { writeFileSync } from "node:fs";
import { AxNode } from "../dist/ops/node.js";
import { createLogger, loadConfig } from "../dist/common/index.js";

/** @typedef {{ t: "usage"|"gc"|"stop"|"stats"|"profStart"; id: number } | { t: "profStop"; id: number; path: string }} Msg */

const config = loadConfig(process.env);
const log = createLogger({ level: config.logLevel });
const node = new AxNode({ config, nodeId: process.env.AX_BENCH_NODE_ID ?? "bench-node", httpPort: null, logger: log });
const send = (m) => process.send?.(m);
/** @type {Session | null} */
let session = null;

function usage() {
  const cpu = process.cpuUsage();
  const mem = process.memoryUsage();
  return { cpuS: (cpu.user + cpu.system) / 1e6, sysS: cpu.system / 1e6, rssMb: mem.rss / 1048576, heapUsedMb: mem.heapUsed / 1048576, maxRssMb: process.resourceUsage().maxRSS / 1024 };
}

process.on("message", (/** @type {Msg} */ m) => {
  void (async () => {
    switch (m.t) {
      case "usage": send({ t: "reply", id: m.id, value: usage() }); break;
      case "gc": {
        const gc = globalThis.gc;
        if (gc) for (let i = 0; i < 3; i++) { gc(); await new Promise((r) => setTimeout(r, 50)); }
        send({ t: "reply", id: m.id, value: usage() });
        break;
      }
      case "profStart": {
        // A CPU profile of exactly the measured window (bench --prof DIR).
        session ??= new Session();
        session.connect();
        await session.post("Profiler.enable");
        await session.post("Profiler.setSamplingInterval", { interval: 500 });
        await session.post("Profiler.start");
        send({ t: "reply", id: m.id, value: true });
        break;
      }
      case "profStop": {
        const { profile } = await session.post("Profiler.stop");
        writeFileSync(m.path, JSON.stringify(profile));
        session.disconnect();
        send({ t: "reply", id: m.id, value: m.path });
        break;
      }
      case "stats": send({ t: "reply", id: m.id, value: await node.status().catch((e) => String(e)) }); break;
      case "stop":
        await node.stop().catch(() => undefined);
        send({ t: "reply", id: m.id, value: usage() });
        setTimeout(() => process.exit(0), 50);
        break;
    }
  })();
});
process.on("disconnect", () => { void node.stop().finally(() => process.exit(0)); });

await node.start();
const t0 = Date.now();
while (node.ownedShards().length < config.shardCount) {
  if (Date.now() - t0 > 60_000) { send({ t: "error", error: `only ${node.ownedShards().length}/${config.shardCount} shards owned after 60s` }); break; }
  await new Promise((r) => setTimeout(r, 50));
}
send({ t: "ready", pid: process.pid, value: usage() });
