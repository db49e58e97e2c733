import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ChildProcess } from "node:child_process";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats, names } from "../../common/index.ts";
import type { AxClient } from "../../ops/client.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

/**
 * A seeded fuzzer (AX_FUZZ_SEED, AX_FUZZ_N) of every NATS subject a node and an executor
 * listen to: the API, membership (heartbeat, hand-over, plan, kick), the shards' command
 * subjects, the JetStream subjects of events (per shard and per node), outcomes, dependency
 * triggers and dispatches, and the executor's cancel subject. Payloads: random bytes,
 * truncated valid messages, valid messages with a field of the wrong type, NUL bytes in
 * strings, ~900 KB messages, empty and deeply nested ones — interleaved with valid traffic
 * (eight every-second tasks, API reads). The node is a real `ax node` process.
 * Asserted: the process stays alive and answers, the tasks keep firing (fires/s above a bound),
 * no slot is run twice, and refusals and dead letters are counted.
 */
const SEED = Number(process.env.AX_FUZZ_SEED ?? 20261204);
const N = Number(process.env.AX_FUZZ_N ?? 1500);
const TASKS = 8;
const FUZZ_MS = 10_000;
function rng(seed: number) {
  let a = seed >>> 0;
  return () => { a = (a + 0x6d2b79f5) >>> 0; let t = a; t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
}

const tc = new TestCluster("fuzzsub");
const n = names(tc.ns);
const NODE = "fz1";
let child: ChildProcess; let nc: NatsConnection; let client: AxClient; let metricsUrl = "";
const slots = new Map<string, number>();
const fireTimes: number[] = [];

async function metric(name: string): Promise<number> {
  const text = await (await fetch(metricsUrl)).text();
  let sum = 0;
  for (const line of text.split("\n")) if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  return sum;
}

beforeAll(async () => {
  child = tc.spawn(["node", "--id", NODE, "--http", "0"]);
  client = await tc.client();
  const http = await waitFor(async () => {
    const s = await client.call<{ nodes: Array<{ id: string; http: string | null; shards: number[] }> }>("status", {}, 2000).catch(() => null);
    const me = s?.nodes.find((x) => x.id === NODE);
    return me && me.shards.length === tc.config.shardCount ? me.http : null;
  }, 60_000, "the node process to own every shard");
  metricsUrl = `${http}/metrics`;
  const ex = await tc.startExecutor("fz", (ctx) => {
    const k = `${ctx.taskName}@${ctx.scheduledAt}`;
    slots.set(k, (slots.get(k) ?? 0) + 1);
    fireTimes.push(Date.now());
  });
  await ex.registered;
  for (let i = 0; i < TASKS; i++) await client.call("task.create", { name: `tick-${i}`, executor: "fz", every: "1s" });
  nc = await connectNats(tc.config.nats);
  await waitFor(() => fireTimes.length >= 2 * TASKS, 20_000, "the tasks fire");
}, 120_000);
afterAll(async () => { await nc?.close(); await tc.teardown(); });

describe(`NATS subject fuzzing (seed ${SEED}, ${N} cases)`, () => {
  it("the node process stays alive, every-second tasks keep firing, no slot runs twice, refusals are counted", async () => {
    const r = rng(SEED);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const now = Date.now();
    const ev = { type: "completed", runId: "r_0000000000000000", taskId: 1, at: now, token: "t" };
    // One valid-shaped sample per subject kind: the mutations start from these.
    const samples: Record<string, unknown> = {
      heartbeat: { v: 1, id: "fzghost", http: null, startedAt: now, shards: [0], load: { firedPerSec: 0, inFlight: 0, lagMs: 0 }, stopping: false, ready: true },
      handover: { v: 1, shard: 0, from: NODE, to: "nobody" },
      plan: { v: 1, id: "p", ttlMs: 1000, moves: [{ shard: 0, to: "nobody" }] },
      kick: {},
      api: { name: "tick-0", limit: 5 },
      cmd: { type: "pause", taskId: 99_999 },
      eventsV1: { v: 1, executor: "fz", instance: "i", shard: 0, events: [ev] },
      eventsV2: { v: 2, executor: "fz", instance: "i", node: NODE, events: [{ ...ev, shard: 0 }] },
      outcome: { v: 1, outcomes: [{ runId: "r_0000000000000000", taskId: 99_999, state: "success", at: now }] },
      trigger: { v: 1, kind: "due", taskId: 99_999, key: "k", upstreamRuns: [], reason: "", at: now },
      dispatch: { v: 1, shard: 0, epoch: 1, runs: [{ runId: "r_0000000000000000", taskId: 99_999, payload: null }] },
      cancel: { runId: "r_0000000000000000", who: "fuzz" },
    };
    const shard = () => pick([0, 1, 2, 3, 4, 5, 6, 7, 8, 999, -1]);
    const subjects: Array<[string, () => string]> = [
      ["heartbeat", () => n.heartbeatSubject], ["handover", () => `${n.heartbeatSubject}.handover`], ["plan", () => `${n.heartbeatSubject}.plan`],
      ["kick", () => `${n.heartbeatSubject}.kick`],
      ["api", () => n.apiSubject(pick(["task.ls", "task.show", "status", "runs", "why", "shards.ls", "dead.ls", "executor.heartbeat.fz", "run.check.fz", "executor.register.fz", "no.such"]))],
      ["cmd", () => n.shardSubject(shard(), "cmd")],
      ["eventsV1", () => n.eventsSubject(Math.abs(shard()) % 8)], ["eventsV2", () => n.nodeEventsSubject(NODE)],
      ["outcome", () => n.outcomeSubject(Math.abs(shard()) % 8)], ["trigger", () => n.triggerSubject(Math.abs(shard()) % 8)],
      ["dispatch", () => n.dispatchSubject("fz")], ["cancel", () => n.executorCancelSubject("fz")],
    ];
    const wrong = (): unknown => pick([null, "", "x", -1, 1e308, 2 ** 63, 0.5, true, [], {}, [1, "a", null], { a: { b: [] } }, "a\u0000b", "9".repeat(40)]);
    /** A copy of `v` with one field (at any depth) replaced by a value of another type. */
    const mutate = (v: unknown, depth = 0): unknown => {
      if (v === null || typeof v !== "object" || depth > 4) return wrong();
      const copy: Record<string, unknown> | unknown[] = Array.isArray(v) ? [...v] : { ...(v as Record<string, unknown>) };
      const keys = Object.keys(copy);
      if (!keys.length) return wrong();
      const k = pick(keys);
      (copy as Record<string, unknown>)[k] = r() < 0.5 ? wrong() : mutate((copy as Record<string, unknown>)[k], depth + 1);
      return copy;
    };
    const withNul = (v: unknown): unknown => JSON.parse(JSON.stringify(v).replace(/"([^"]{1,12})"/, "\"$1\\u0000\""));
    const enc = (s: string) => new TextEncoder().encode(s);
    const kinds = { random: 0, truncated: 0, wrongType: 0, nul: 0, oversized: 0, empty: 0, nested: 0 };
    const payload = (kind: string): Uint8Array => {
      const sample = samples[kind];
      const x = r();
      if (x < 0.2) { kinds.random++; return new Uint8Array(Array.from({ length: Math.floor(r() * 300) }, () => Math.floor(r() * 256))); }
      if (x < 0.4) { kinds.truncated++; const s = JSON.stringify(sample); return enc(s.slice(0, Math.floor(r() * s.length))); }
      if (x < 0.75) { kinds.wrongType++; return enc(JSON.stringify(mutate(sample))); }
      if (x < 0.9) { kinds.nul++; return r() < 0.5 ? enc(JSON.stringify(withNul(sample))) : enc(`${JSON.stringify(sample).slice(0, 10)}\u0000${JSON.stringify(sample).slice(10)}`); }
      if (x < 0.91) { kinds.oversized++; return enc(JSON.stringify({ ...(sample as object), pad: "p".repeat(900_000) })); }
      if (x < 0.97) { kinds.empty++; return new Uint8Array(0); }
      kinds.nested++; const d = 500 + Math.floor(r() * 3000); return enc(`${"[".repeat(d)}1${"]".repeat(d)}`);
    };

    const refusedBefore = await metric("ax_refused_total");
    const firesBefore = fireTimes.length;
    const t0 = Date.now();
    const perSubject = new Map<string, number>();
    const apiSlow: number[] = [];
    for (let i = 0; i < N; i++) {
      const [kind, subject] = pick(subjects);
      const s = subject();
      perSubject.set(kind, (perSubject.get(kind) ?? 0) + 1);
      nc.publish(s, payload(kind));
      // Valid traffic in between: an API read must still be answered promptly.
      if (i % 50 === 0) {
        const a = Date.now();
        await client.call("task.ls", {}, 10_000);
        apiSlow.push(Date.now() - a);
        await nc.flush();
      }
      // Spread over FUZZ_MS (about 150 hostile messages a second): the tasks fire ten rounds meanwhile.
      if (i % 10 === 0) await sleep(Math.max(0, t0 + (i / N) * FUZZ_MS - Date.now()));
    }
    await nc.flush();
    const fuzzMs = Date.now() - t0;
    await sleep(2000);
    const elapsedS = (Date.now() - t0) / 1000;
    const firedPerSec = (fireTimes.length - firesBefore) / elapsedS;
    const refused = (await metric("ax_refused_total")) - refusedBefore;
    const dead = await metric("ax_dead_letters_total");
    console.log(`[fuzz-subjects] ${N} cases in ${fuzzMs} ms ${JSON.stringify(kinds)}; per subject ${JSON.stringify(Object.fromEntries(perSubject))}; ` +
      `fires/s ${firedPerSec.toFixed(2)} (${TASKS} tasks); refused +${refused}, dead letters ${dead}; slowest API read ${Math.max(...apiSlow)} ms`);

    expect(child.exitCode).toBeNull();
    expect(child.signalCode).toBeNull();
    expect((await fetch(metricsUrl.replace("/metrics", "/healthz"))).status).toBe(200);
    // The bound leaves room for the other test files running beside this one on two cores.
    expect(firedPerSec).toBeGreaterThanOrEqual(0.5 * TASKS);
    expect([...slots].filter(([, c]) => c > 1)).toEqual([]);
    expect(refused).toBeGreaterThan(50);
    expect(dead).toBeGreaterThan(10);
    // Every shard is still this node's (forged heartbeats, hints and plans moved nothing for good).
    await waitFor(async () => (await client.call<{ nodes: Array<{ id: string; shards: number[] }> }>("status")).nodes.find((x) => x.id === NODE)?.shards.length === tc.config.shardCount, 15_000, "every shard owned by the node");
  }, 120_000);
});
