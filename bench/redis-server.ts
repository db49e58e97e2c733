/**
 * A redis-server of the bench's own for the BullMQ peer: a free loopback port, no persistence
 * (`--save "" --appendonly no`), `--hz` as asked (100 by default: Redis checks blocked clients'
 * timeouts hz times a second, which at its default hz 10 puts a ~95 ms floor under BullMQ's
 * delayed jobs; users who care about latency raise it). Never the shared server on 6379, which
 * is not reconfigured. Every instance is stopped at the end, on error and on SIGINT/SIGTERM.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Redis } from "ioredis";
import { procCpuS } from "./proc.ts";

export interface OwnRedis { url: string; port: number; pid: number; hz: number; /** CPU seconds used so far (utime + stime). */ cpuS(): number; stop(): Promise<void> }

const live = new Set<{ child: ChildProcess; dir: string }>();
let hooked = false;

function hookExit(): void {
  if (hooked) return;
  hooked = true;
  const killAll = () => {
    for (const r of live) { try { r.child.kill("SIGKILL"); } catch { /* gone */ } rmSync(r.dir, { recursive: true, force: true }); }
    live.clear();
  };
  process.on("exit", killAll);
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    process.once(sig, () => { process.stderr.write(`[bench] ${sig}: stopping the peer's redis-server\n`); killAll(); process.exit(130); });
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => { const a = s.address(); s.close(() => resolve(typeof a === "object" && a ? a.port : 0)); });
  });
}

export async function startRedis(hz: number): Promise<OwnRedis> {
  hookExit();
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "ax-bench-redis-"));
  const child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--hz", String(hz), "--save", "", "--appendonly", "no",
    "--daemonize", "no", "--dir", dir, "--loglevel", "warning"], { stdio: ["ignore", "ignore", "inherit"] });
  const entry = { child, dir };
  live.add(entry);
  const url = `redis://127.0.0.1:${port}`;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  const stop = async () => {
    if (!live.has(entry)) return;
    live.delete(entry);
    child.kill("SIGTERM");
    await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  };
  // Ready when it answers PING (a few ms; give up after 10 s).
  const t0 = Date.now();
  for (;;) {
    if (child.exitCode !== null) { await stop(); throw new Error(`redis-server on port ${port} exited with ${child.exitCode}`); }
    const r = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    r.on("error", () => undefined); // refused while it starts: the loop tries again
    const ok = await r.connect().then(() => r.ping()).then(() => true, () => false);
    r.disconnect();
    if (ok) break;
    if (Date.now() - t0 > 10_000) { await stop(); throw new Error(`redis-server on port ${port} did not answer within 10 s`); }
    await new Promise((res) => setTimeout(res, 50));
  }
  return { url, port, pid: child.pid!, hz, cpuS: () => procCpuS(child.pid!) ?? 0, stop };
}
