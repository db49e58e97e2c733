import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { JetStreamClient } from "@nats-io/jetstream";
import { SystemClock, names, silentLogger } from "../../common/index.ts";
import { Persister, REVOKE_MARGIN_MS, Store, type ShardDispatchRun, type ShardWrite } from "../../actors/index.ts";
import { testConfig, testNamespace, waitFor } from "../helpers.ts";

/**
 * A shard actor decides its next round while the previous one is written, so the node's round
 * (Persister) may hold two writes of one shard at once. Against PostgreSQL: writes that touch a
 * common task or run land in submission order even with two lanes, one shard's writes land in
 * submission order and none after one that failed, different shards' are written side by side,
 * and a run withdrawn while its write is queued or being written is never published. The store is the real one; only its write is gated, to hold
 * a batch open; the JetStream publish is recorded (no executor here).
 */
const ns = testNamespace("persist");
const cfg = testConfig(ns);
const store = new Store({ pgUrl: cfg.pgUrl, schema: ns, poolSize: 2 });
const NOW = Date.now();

interface Gate { shards: number[]; release: () => void; done: boolean; fail?: Error }
let gates: Gate[] = [];
let published: string[] = [];
/** Each published message: when, its `sentAt`, its runs. */
let messages: Array<{ at: number; sentAt: number; runs: string[] }> = [];
let revoked: Array<{ executor: string; runIds: string[] }> = [];

/** `holds`: executor "e" holds runs until their due time (its runs go out ahead). */
function persister(holds = false): Persister {
  const js = { publish: async (_subject: string, data: Uint8Array) => {
    const body = JSON.parse(new TextDecoder().decode(data)) as { sentAt: number; runs: Array<{ runId: string }> };
    published.push(...body.runs.map((r) => r.runId));
    messages.push({ at: Date.now(), sentAt: body.sentAt, runs: body.runs.map((r) => r.runId) });
    return { seq: 1, duplicate: false, stream: "x" };
  } } as unknown as JetStreamClient;
  return new Persister({ store, log: silentLogger, js, names: names(ns), nodeId: "n1", clock: new SystemClock(), mayRelease: () => "yes", lanes: 2,
    holdsAhead: () => holds, revoke: (executor, runIds) => { revoked.push({ executor, runIds }); } });
}

function write(shard: number, runIds: string[], extra: Partial<ShardWrite> = {}): ShardWrite {
  return {
    shard, epoch: 1, runUpdates: [], taskUpdates: [], ...extra,
    runInserts: runIds.map((id) => ({ id, taskId: 1, taskName: "t", triggerId: null, source: "once" as const, dueMs: NOW, slotMs: NOW, dueReason: "test", firedMs: NOW,
      node: "n1", shard, epoch: 1, attempt: 1, executor: "e", state: "running" as const, error: null, causedBy: null, upstreamRuns: null, createdMs: NOW })),
  };
}

/** A task row update of task 1 (the row every test write may share). */
const touchTask1 = (state: string) => ({ taskUpdates: [{ id: 1, state, record: {}, triggerSlots: {}, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null }] });

function dispatch(shard: number, runIds: string[], releaseAt: number): Map<string, ShardDispatchRun[]> {
  return new Map([["e", runIds.map((runId) => ({ runId, taskId: 1, taskName: "t", attempt: 1, source: "once" as const, payload: null, scheduledAt: releaseAt, firedAt: releaseAt, timeoutMs: 30_000, shard }))]]);
}

beforeAll(async () => {
  await store.migrate();
  await store.initShardCount(4);
  for (let s = 0; s < 4; s++) await store.claimShard(s, "n1", 1, NOW);
  await store.upsertExecutor("e", "nats", null, NOW);
  await store.pool.query(`insert into tasks (id, name, executor, timeout_ms, max_attempts, backoff_ms, backoff_max_ms, misfire, overlap, shard, state, record, created_ms, updated_ms)
    values (1, 't', 'e', 30000, 1, 1000, 60000, 'once', 'forbid', 0, 'pending', '{}'::jsonb, 0, 0)`);
  // Each batch waits for its gate before it is written (the statements themselves are the real ones).
  const real = store.writeBatch.bind(store);
  store.writeBatch = async (writes, records) => {
    const g: Gate = { shards: writes.map((w) => w.shard), release: () => undefined, done: false };
    await new Promise<void>((r) => { g.release = r; gates.push(g); });
    try {
      if (g.fail) throw g.fail;
      return await real(writes, records);
    } finally { g.done = true; }
  };
});
afterAll(async () => { await store.dropNamespace(); await store.close(); });

describe("persister: one shard's writes in flight together", () => {
  it("a second lane leaves a write queued while a row it touches is being written, and takes writes of other rows meanwhile", async () => {
    gates = []; published = [];
    const p = persister();
    const a1 = p.submit(write(1, ["a1"]));
    await waitFor(() => gates.length === 1, 2000, "the first batch to start");
    // Shard 1's next round (the completion of a1) and shard 2's round arrive while a1 is written.
    const a2 = p.submit(write(1, [], { runUpdates: [{ id: "a1", state: "success", finishedMs: NOW + 1 }] }));
    const b1 = p.submit(write(2, ["b1"]));
    await waitFor(() => gates.length === 2, 2000, "the second lane to start");
    expect(gates[1]!.shards).toEqual([2]); // not shard 1's second write: the insert of a1 is not committed yet
    gates[1]!.release();
    await b1;
    expect(gates.length).toBe(2); // a2 still waits for a1
    gates[0]!.release();
    await a1;
    await waitFor(() => gates.length === 3, 2000, "shard 1's second write");
    expect(gates[2]!.shards).toEqual([1]);
    gates[2]!.release();
    await a2;
    // Applied in order: the update found the row the insert wrote.
    const r = await store.pool.query("select state, finished_ms from runs where id = 'a1'");
    expect(r.rows[0]).toMatchObject({ state: "success", finished_ms: NOW + 1 });
  });

  it("a run withdrawn while its batch is written, or while its write is still queued, is never published", async () => {
    gates = []; published = [];
    const p = persister();
    const due = Date.now() + 300;
    const w1 = p.submit(write(3, ["w1", "k1"], touchTask1("running")), dispatch(3, ["w1", "k1"], due));
    await waitFor(() => gates.length === 1, 2000, "the batch to start");
    const w2 = p.submit(write(3, ["w2"], touchTask1("running")), dispatch(3, ["w2"], due)); // queued behind w1 (task 1)
    expect(p.withdraw("w1")).toBe(true); // in the batch being written
    expect(p.withdraw("w2")).toBe(true); // still queued
    gates[0]!.release();
    await (await w1).published;
    await waitFor(() => gates.length === 2, 2000, "the queued write");
    gates[1]!.release();
    await (await w2).published;
    expect(published).toEqual(["k1"]);
    expect(p.withdraw("k1")).toBe(false); // published already
  });

  it("one shard's next round waits for its first, even with no row in common, and is not written once the first failed; other shards' go beside", async () => {
    gates = []; published = [];
    const p = persister();
    const c1 = p.submit(write(0, ["c1"], touchTask1("running")));
    await waitFor(() => gates.length === 1, 2000, "the first batch to start");
    // Shard 0's next round touches no row of c1 (a fire whose task row waits, say), but it was
    // decided on top of c1: written alone after c1 failed, it would leave a run no owner finds.
    const c2 = p.submit(write(0, ["c2"]));
    const d1 = p.submit(write(2, ["d1"]));
    await waitFor(() => gates.length === 2, 2000, "the second lane to start");
    expect(gates[1]!.shards).toEqual([2]);
    gates[1]!.release();
    await d1;
    await new Promise((r) => setTimeout(r, 50));
    expect(gates.length).toBe(2); // c2 still waits for c1
    // c1 is refused for its data (not retried): c2 is refused too, without a write.
    gates[0]!.fail = Object.assign(new Error("refused"), { code: "23514" });
    gates[0]!.release();
    await expect(c1).rejects.toThrow("refused");
    await expect(c2).rejects.toThrow(/earlier round of epoch 1 was not written/);
    expect(gates.length).toBe(2);
    expect((await store.pool.query("select count(*)::int as n from runs where id in ('c1', 'c2')")).rows[0].n).toBe(0);
    // The shard's next epoch writes again.
    await store.claimShard(0, "n1", 2, NOW);
    const c3 = p.submit({ ...write(0, ["c3"]), epoch: 2, runInserts: write(0, ["c3"]).runInserts.map((r) => ({ ...r, epoch: 2 })) });
    await waitFor(() => gates.length === 3, 2000, "the next epoch's write");
    gates[2]!.release();
    expect((await c3).stale).toBe(false);
    expect((await store.pool.query("select count(*)::int as n from runs where id = 'c3'")).rows[0].n).toBe(1);
  });

  it("a later write of a row waits behind an earlier queued write of it, and one shard's rounds land in order", async () => {
    gates = []; published = [];
    const p = persister();
    const e1 = p.submit(write(1, ["e1"], touchTask1("running")));
    await waitFor(() => gates.length === 1, 2000, "the first batch to start");
    const e2 = p.submit(write(1, ["e2"], touchTask1("idle")));
    const e3 = p.submit(write(1, [], { runUpdates: [{ id: "e2", state: "success", finishedMs: NOW + 2 }] }));
    await new Promise((r) => setTimeout(r, 50));
    expect(gates.length).toBe(1);
    gates[0]!.release();
    await e1;
    await waitFor(() => gates.length === 2, 2000, "e2 and e3");
    expect(gates[1]!.shards).toEqual([1, 1]); // one batch, in submission order
    gates[1]!.release();
    await Promise.all([e2, e3]);
    expect((await store.pool.query("select state from tasks where id = 1")).rows[0].state).toBe("idle");
    expect((await store.pool.query("select state, finished_ms from runs where id = 'e2'")).rows[0]).toMatchObject({ state: "success", finished_ms: NOW + 2 });
  });
});

describe("persister: runs sent ahead to an executor that holds them", () => {
  it("a message goes out once its write is committed, ahead of its runs' due time; a withdrawal revokes a run while its due time is at least REVOKE_MARGIN_MS off, and not closer", async () => {
    gates = []; published = []; messages = []; revoked = [];
    const p = persister(true);
    const due = Date.now() + 3000;
    const near = Date.now() + REVOKE_MARGIN_MS + 400;
    const s1 = p.submit(write(3, ["h1", "h2"]), dispatch(3, ["h1", "h2"], due));
    const s2 = p.submit(write(3, ["h3"]), dispatch(3, ["h3"], near));
    await waitFor(() => gates.length >= 1, 2000, "the batch to start");
    // Still being written: withdrawn from the message itself, never published.
    expect(p.withdraw("h2")).toBe(true);
    for (const g of gates) g.release();
    await waitFor(() => gates.length === 2 || published.length === 2, 2000, "the second write or both published");
    for (const g of gates) g.release();
    await (await s1).published; await (await s2).published;
    expect(published.sort()).toEqual(["h1", "h3"]);
    for (const m of messages) expect(m.sentAt).toBeLessThanOrEqual(m.at);
    expect(Math.max(...messages.map((m) => m.at))).toBeLessThan(near - REVOKE_MARGIN_MS);
    expect(p.stats.ahead).toBe(2);
    // Published: now a withdrawal is a revoke at the executor, one message for the turn's runs.
    expect(p.withdraw("h1")).toBe("revoked");
    expect(p.withdraw("h1")).toBe(false);
    await Promise.resolve();
    expect(revoked).toEqual([{ executor: "e", runIds: ["h1"] }]);
    // Inside the margin the run goes ahead (as one released at its due time).
    await new Promise((r) => setTimeout(r, Math.max(0, near - REVOKE_MARGIN_MS + 5 - Date.now())));
    expect(p.withdraw("h3")).toBe(false);
    await Promise.resolve();
    expect(revoked).toHaveLength(1);
    expect(p.stats.revoked).toBe(1);
  });

  it("to an executor that does not hold runs, the message waits for its due time", async () => {
    gates = []; published = []; messages = []; revoked = [];
    const p = persister(false);
    const due = Date.now() + 600;
    const s = p.submit(write(3, ["k1"]), dispatch(3, ["k1"], due));
    await waitFor(() => gates.length >= 1, 2000, "the batch to start");
    gates[0]!.release();
    await (await s).published;
    expect(messages).toHaveLength(1);
    expect(messages[0]!.at).toBeGreaterThanOrEqual(due);
    expect(p.stats.ahead).toBe(0);
  });
});
