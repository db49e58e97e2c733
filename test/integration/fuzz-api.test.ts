import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats, names } from "../../common/index.ts";
import type { AxNode } from "../../ops/node.ts";
import type { AxClient } from "../../ops/client.ts";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";

/**
 * A seeded fuzzer (AX_FUZZ_SEED, AX_FUZZ_N) against a live node: garbage and well-formed-but-
 * wrong arguments to every API operation, over HTTP and NATS, and raw garbage bodies. The node
 * must answer every one with a refusal or a result — never a 500 / AX_E_INTERNAL — keep firing
 * its task and stay under a memory bound.
 */
const SEED = Number(process.env.AX_FUZZ_SEED ?? 20261203);
const N = Number(process.env.AX_FUZZ_N ?? 400);
function rng(seed: number) {
  let a = seed >>> 0;
  return () => { a = (a + 0x6d2b79f5) >>> 0; let t = a; t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
}
const OPS = ["executor.register", "task.create", "task.bulkCreate", "task.ls", "task.show", "task.preview", "task.pause", "task.resume", "task.rm",
  "task.deps.add", "task.deps.rm", "dag", "run", "runs", "why", "status", "shards.ls", "shards.move", "shards.unpin", "shards.rebalance", "node.undrain", "audit", "no.such.op"];
const FIELDS = ["name", "executor", "task", "every", "cron", "tz", "at", "delay", "fixedDelay", "after", "timeout", "retries", "backoff", "backoffMax", "misfire",
  "overlap", "payload", "limit", "count", "run", "shard", "node", "upstream", "tasks", "defaults", "dryRun", "force", "maxInFlight", "kind", "returnIds", "__proto__", "constructor"];

const tc = new TestCluster("fuzz");
let node: AxNode; let client: AxClient; let nc: NatsConnection; let base = "";
beforeAll(async () => {
  node = await tc.startNode("f1", { httpPort: 0 });
  await tc.waitForShards();
  base = node.httpAddress!;
  const ex = await tc.startExecutor("fx", async () => undefined);
  await ex.registered;
  client = await tc.client();
  nc = await connectNats(tc.config.nats);
  await client.call("task.create", { name: "alive", executor: "fx", every: "1s" });
  await client.call("task.create", { name: "t1", executor: "fx", every: "1h" });
});
afterAll(async () => { await nc?.close(); await tc.teardown(); });

describe(`API fuzzing (seed ${SEED}, ${N} cases)`, () => {
  it("no 500 or AX_E_INTERNAL for any input over HTTP or NATS; the node keeps firing and stays under a memory bound", async () => {
    const r = rng(SEED);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const value = (depth = 0): unknown => {
      switch (Math.floor(r() * 14)) {
        case 0: return null;
        case 1: return pick([0, -1, 1, 1e308, -1e308, 2 ** 53, 0.5, 7, 63, 64, 4096]);
        case 2: return pick(["", "t1", "alive", "fx", "f1", "1s", "0s", "-3s", "99999999999d", "* * * * *", "*/0 * * * *", "UTC", "Mars/Olympus", "2026-13-40T99:00:00Z"]);
        case 3: return "x".repeat(Math.floor(r() * 5000));
        case 4: return "a\u0000b";
        case 5: return String.fromCharCode(...Array.from({ length: 1 + Math.floor(r() * 20) }, () => Math.floor(r() * 0xd7ff)));
        case 6: return r() < 0.5;
        case 7: return depth > 3 ? [] : Array.from({ length: Math.floor(r() * 4) }, () => value(depth + 1));
        case 8: return depth > 3 ? {} : Object.fromEntries(Array.from({ length: Math.floor(r() * 4) }, () => [pick(FIELDS), value(depth + 1)]));
        case 9: return "9".repeat(30);
        case 10: return { name: `f${Math.floor(r() * 50)}`, executor: "fx", every: pick(["1h", "1s", 5, "x"]) };
        case 11: return [{ name: `b${Math.floor(r() * 1e6)}`, executor: "fx", every: "1h" }];
        case 12: return `t${Math.floor(r() * 3)}`;
        default: return Math.floor(r() * 100) - 10;
      }
    };
    const bad: string[] = [];
    let answered = 0;
    for (let i = 0; i < N; i++) {
      const op = pick(OPS);
      const args = Object.fromEntries(Array.from({ length: Math.floor(r() * 6) }, () => [pick(FIELDS), value()]));
      const mode = Math.floor(r() * 4);
      if (mode === 0) {
        const res = await fetch(`${base}/api/${op.replace(/\./g, "/")}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(args) });
        const text = await res.text();
        if (res.status >= 500 && res.status !== 503) bad.push(`HTTP ${res.status} ${op} ${JSON.stringify(args).slice(0, 200)} → ${text.slice(0, 200)}`);
        if (/\n\s+at /.test(text)) bad.push(`stack trace from ${op}`);
      } else if (mode === 1) {
        const raw = pick(["null", "[]", "\"x\"", "{", "{\"a\":", "\u0000", "1e999", `{"name":"a\\u0000"}`, "{}".repeat(1000)]);
        const res = await fetch(`${base}/api/${op.replace(/\./g, "/")}`, { method: "POST", headers: { "content-type": "application/json" }, body: raw });
        if (res.status >= 500 && res.status !== 503) bad.push(`HTTP ${res.status} ${op} raw ${raw.slice(0, 40)} → ${(await res.text()).slice(0, 200)}`);
        else await res.arrayBuffer();
      } else if (mode === 2) {
        const e = await client.call(op, args, 20_000).then(() => null, (x: unknown) => x as { code?: string; message?: string });
        if (e?.code === "AX_E_INTERNAL") bad.push(`NATS ${op} ${JSON.stringify(args).slice(0, 200)} → ${e.message}`);
      } else {
        const raw = new Uint8Array(Array.from({ length: Math.floor(r() * 64) }, () => Math.floor(r() * 256)));
        const m = await nc.request(names(tc.ns).apiSubject(op), raw, { timeout: 20_000 });
        const env = JSON.parse(new TextDecoder().decode(m.data)) as { ok: boolean; error?: { code: string; message: string } };
        if (!env.ok && env.error?.code === "AX_E_INTERNAL") bad.push(`NATS raw ${op} → ${env.error.message}`);
      }
      answered++;
    }
    expect(bad).toEqual([]);
    expect(answered).toBe(N);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    // Memory: the whole test process (node, executor, client) stays well under the bound.
    expect(process.memoryUsage().rss).toBeLessThan(1024 * 1024 * 1024);
    const since = Date.now();
    await waitFor(async () => (await client.call<Array<{ state: string; finishedAt: string | null }>>("runs", { task: "alive", limit: 5 }))
      .some((x) => x.state === "success" && x.finishedAt !== null && Date.parse(x.finishedAt) > since), 15_000, "alive still firing after the fuzzing");
  }, 600_000);
});
