// Start-up time of the CLI: `ax --help` to exit and `ax node` to its "running" line (HTTP off),
// for each launcher given. Prints one JSON line per launcher with the median and range
// of wall time and the median CPU time (user + system: steadier than wall time on a shared machine).
//   node --import tsx scripts/startup.ts [--runs 9] ["node --import tsx ops/cli.ts" "node dist/ops/cli.js" ...]
// Uses its own namespace and drops it at the end.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { loadConfig, names } from "../common/index.ts";
import { dropStreams } from "../protocol/index.ts";
import { DueIndex, Store } from "../actors/index.ts";

const args = process.argv.slice(2);
let runs = 9;
const launchers: string[] = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--runs") runs = Number(args[++i]);
  else launchers.push(args[i]!);
}
if (!launchers.length) launchers.push("node --import tsx ops/cli.ts", "node bin/ax.mjs", "node dist/ops/cli.js");

const ns = `startup_${process.pid}`;
const env = { ...process.env, AX_NAMESPACE: ns, AX_LOG_LEVEL: "silent" };

interface Sample { wallMs: number; cpuMs: number }

/** Runs the command; `readyOn` ends the measurement at the first stderr match (then SIGTERM). */
function once(cmd: string[], readyOn: RegExp | null): Promise<Sample> {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const p = spawn(cmd[0]!, cmd.slice(1), { env, stdio: ["ignore", "ignore", "pipe"] });
    let wallMs = 0;
    let err = "";
    p.stderr.on("data", (d: Buffer) => {
      err += d;
      if (readyOn && !wallMs && readyOn.test(err)) { wallMs = Number(process.hrtime.bigint() - t0) / 1e6; p.kill("SIGTERM"); }
    });
    p.on("error", reject);
    p.on("exit", (code) => {
      if (!readyOn) wallMs = Number(process.hrtime.bigint() - t0) / 1e6;
      if (!wallMs || (!readyOn && code !== 0)) { reject(new Error(`${cmd.join(" ")} exited ${code}: ${err}`)); return; }
      resolve({ wallMs, cpuMs: 0 });
    });
  });
}

/** A run with its CPU time (for `ax node`: start, ready and the graceful stop after SIGTERM). */
async function measure(cmd: string[], readyOn: RegExp | null): Promise<Sample> {
  const before = childCpu();
  const s = await once(cmd, readyOn);
  return { wallMs: s.wallMs, cpuMs: childCpu() - before };
}

/** User + system CPU of this process's reaped children so far, from /proc (Linux). */
function childCpu(): number {
  const stat = readStat();
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // cutime and cstime are fields 16 and 17 of /proc/self/stat (1-based), in clock ticks (100/s).
  return (Number(fields[13]) + Number(fields[14])) * 10;
}
function readStat(): string { return readFileSync("/proc/self/stat", "utf8"); }

const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const summary = (xs: Sample[]) => ({
  wallMs: { median: Math.round(med(xs.map((x) => x.wallMs))), min: Math.round(Math.min(...xs.map((x) => x.wallMs))), max: Math.round(Math.max(...xs.map((x) => x.wallMs))) },
  cpuMs: { median: Math.round(med(xs.map((x) => x.cpuMs))) },
});

try {
  for (const launcher of launchers) {
    const cmd = launcher.split(" ");
    const help: Sample[] = [];
    const node: Sample[] = [];
    await measure([...cmd, "--help"], null); // warm the file cache
    for (let i = 0; i < runs; i++) {
      help.push(await measure([...cmd, "--help"], null));
      node.push(await measure([...cmd, "node", "--id", `probe${i}`], /running \(namespace/));
    }
    process.stdout.write(JSON.stringify({ launcher, runs, help: summary(help), nodeReady: summary(node) }) + "\n");
  }
} finally {
  const cfg = loadConfig(env);
  const store = new Store({ pgUrl: cfg.pgUrl, schema: ns, poolSize: 1 });
  await store.dropNamespace().finally(() => store.close());
  const due = new DueIndex(cfg.redis, ns);
  await due.dropNamespace().finally(() => due.close());
  const nc = await connect({ servers: cfg.natsUrl });
  try { await dropStreams(await jetstreamManager(nc), names(ns)); } finally { await nc.close(); }
}
