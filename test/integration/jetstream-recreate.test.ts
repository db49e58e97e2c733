import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { connectNats, names } from "../../common/index.ts";
import { Store } from "../../actors/index.ts";
import { EPOCH_SPAN } from "../../cluster/index.ts";
import type { AxNode } from "../../ops/node.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

/**
 * Issue 14: the JetStream assets a node relies on are deleted under it (an operator's
 * mistake, a hostile client with too broad permissions). Two real nodes fire eight
 * every-second tasks; the lease bucket is deleted. The nodes must recreate it, fence what
 * they held under the old bucket, take the shards again under epochs above every recorded
 * one (a recreated bucket restarts revisions at 1), and fire again within a bound — no slot
 * run twice, and `shards.epoch` in PostgreSQL never going back.
 */
const tc = new TestCluster("recreate");
const n = names(tc.ns);
let nodes: AxNode[] = [];
let nc: NatsConnection; let jsm: JetStreamManager; let store: Store;
/** Handler calls per `task@scheduledAt`, and the wall time of each call. */
const slots = new Map<string, number>();
const fires: Array<{ at: number; scheduledAt: number }> = [];
/** Every epoch read from PostgreSQL per shard, in order. */
const epochs = new Map<number, number[]>();
let sampler: NodeJS.Timeout | null = null;

const TASKS = 8;

beforeAll(async () => {
  nodes = [await tc.startNode("r1"), await tc.startNode("r2")];
  await tc.waitForShards();
  const ex = await tc.startExecutor("rx", (ctx) => {
    const k = `${ctx.taskName}@${ctx.scheduledAt}`;
    slots.set(k, (slots.get(k) ?? 0) + 1);
    fires.push({ at: Date.now(), scheduledAt: ctx.scheduledAt });
  });
  await ex.registered;
  const client = await tc.client();
  for (let i = 0; i < TASKS; i++) await client.call("task.create", { name: `every-${i}`, executor: "rx", every: "1s", timeout: "2s", retries: 0 });
  nc = await connectNats(tc.config.nats);
  jsm = await jetstreamManager(nc);
  store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
  // One sample at a time: two reads in flight on the pool's two connections can answer out of
  // order, and an older answer read last looked like an epoch going down (6, 2^40+6, 6, …).
  let sampling = false;
  sampler = setInterval(() => {
    if (sampling) return;
    sampling = true;
    void store.listShards().then((rows) => { for (const r of rows) { const l = epochs.get(r.shard) ?? []; if (l.at(-1) !== r.epoch) l.push(r.epoch); epochs.set(r.shard, l); } }, () => undefined)
      .finally(() => { sampling = false; });
  }, 50);
  await waitFor(() => fires.length >= 2 * TASKS, 15_000, "the tasks fire");
}, 60_000);
afterAll(async () => {
  if (sampler) clearInterval(sampler);
  await store?.close(); await nc?.close(); await tc.teardown();
});

/**
 * Milliseconds from `t0` until the first run fired under an epoch above `floor` (the new
 * bucket's): the old leases stay valid on the monotonic clock for a while, so fires right
 * after the deletion prove nothing; only a run of the new incarnation does.
 */
async function resumedAfter(t0: number, floor: number, boundMs: number): Promise<number> {
  const at = await waitFor(async () => {
    const r = await store.pool.query(`select min(fired_ms)::float8 as at from "${tc.ns}".runs where epoch > $1 and fired_ms is not null`, [floor]);
    return r.rows[0]?.at as number | null;
  }, boundMs, `a run fired under an epoch above ${floor}`);
  return at - t0;
}

describe("the lease bucket is deleted under running nodes", () => {
  it("is recreated with the same TTL, firing resumes within 5 s, no slot runs twice, and epochs in PostgreSQL only increase", async () => {
    const bucket = `KV_${n.leaseBucket}`;
    const before = await jsm.streams.info(bucket);
    const maxBefore = Math.max(...[...epochs.values()].map((l) => l.at(-1)!));
    expect(maxBefore).toBeGreaterThan(0);
    expect(maxBefore).toBeLessThan(EPOCH_SPAN);

    const t0 = Date.now();
    await jsm.streams.delete(bucket);
    const firesAt0 = fires.length;
    const resumeMs = await resumedAfter(t0, EPOCH_SPAN, 5_000);
    console.log(`lease bucket deleted: first run under the new epoch floor fired ${resumeMs} ms later`);

    const after = await jsm.streams.info(bucket);
    expect(after.created).not.toBe(before.created);
    expect(after.config.max_age).toBe(before.config.max_age);
    expect(after.config.max_msgs_per_subject).toBe(before.config.max_msgs_per_subject);
    expect(after.config.description).toMatch(new RegExp(`epoch floor ${EPOCH_SPAN}$`));
    await tc.waitForShards(nodes);
    // Every shard was claimed again in the new incarnation, above every epoch of the old one.
    await waitFor(async () => (await store.listShards()).every((s) => s.epoch > EPOCH_SPAN), 15_000, "every shard claimed under the new floor");
    expect(nodes.reduce((k, x) => k + x.supervisor.stats.lost, 0)).toBeGreaterThan(0);

    // Firing goes on at the full rate.
    await waitFor(() => fires.length >= firesAt0 + TASKS, 3_000, "the executor runs the new incarnation's slots");
    const from = fires.length;
    await sleep(3000);
    expect(fires.length - from).toBeGreaterThanOrEqual(2 * TASKS);

    // A second deletion: the floor moves again, above the first recreation's epochs.
    await jsm.streams.delete(bucket);
    const t1 = Date.now();
    const resume2 = await resumedAfter(t1, 2 * EPOCH_SPAN, 5_000);
    console.log(`second deletion: first run under the next floor fired ${resume2} ms later`);
    expect((await jsm.streams.info(bucket)).config.description).toMatch(new RegExp(`epoch floor ${2 * EPOCH_SPAN}$`));
    await waitFor(async () => (await store.listShards()).every((s) => s.epoch > 2 * EPOCH_SPAN), 15_000, "every shard claimed under the second floor");
    await sleep(1500);

    noSlotTwiceEpochsUp();
  }, 60_000);
});

function noSlotTwiceEpochsUp(): void {
  const twice = [...slots].filter(([, c]) => c > 1);
  expect(twice).toEqual([]);
  for (const [shard, l] of epochs) {
    for (let i = 1; i < l.length; i++) expect(l[i], `shard ${shard} epochs ${l.join(",")}`).toBeGreaterThan(l[i - 1]!);
  }
}

async function recreated(asset: string): Promise<number> {
  let k = 0;
  for (const node of nodes) k += (await node.metrics.recreated.get()).values.find((v) => v.labels.asset === asset)?.value ?? 0;
  return k;
}

/**
 * Completions that were in a deleted events stream are gone: those runs stay `running` until
 * their timeout (2 s here, retries 0 so a lost completion is not run again as a retry), and
 * overlap=forbid holds the task's next slot until then.
 */
/** Milliseconds from `t0` until the executor ran a slot due at least `afterMs` after `t0`, and that run succeeded in PostgreSQL. */
async function executorResumed(t0: number, afterMs: number, boundMs: number): Promise<number> {
  const f = await waitFor(() => fires.find((x) => x.scheduledAt > t0 + afterMs), boundMs, `the executor to run a slot due after ${afterMs} ms`);
  await waitFor(async () => {
    const r = await store.pool.query(`select count(*)::int as n from "${tc.ns}".runs where due_ms > $1 and state = 'success'`, [t0 + afterMs]);
    return r.rows[0].n > 0;
  }, boundMs, "a run due after the deletion recorded as success (its completion event came through)");
  return f.at - t0;
}

describe("a stream is deleted under running nodes", () => {
  it.each([
    ["dispatch", () => n.dispatchStream],
    ["events", () => n.eventsStream],
  ])("the %s stream is created again with its consumers; the executor runs and completes new slots within 10 s; no slot runs twice", async (asset, stream) => {
    const before = await jsm.streams.info(stream());
    const t0 = Date.now();
    await jsm.streams.delete(stream());
    // Slots due more than a second after the deletion can only run through the new stream.
    const ms = await executorResumed(t0, 1000, 10_000);
    console.log(`${asset} stream deleted: the executor ran a slot due after it ${ms} ms later`);
    const after = await jsm.streams.info(stream());
    expect(after.created).not.toBe(before.created);
    expect(after.config.subjects).toEqual(before.config.subjects);
    expect(after.config.retention).toBe(before.config.retention);
    expect(await recreated(asset)).toBeGreaterThanOrEqual(1);
    const from = fires.length;
    await sleep(3000);
    expect(fires.length - from).toBeGreaterThanOrEqual(2 * TASKS);
    noSlotTwiceEpochsUp();
  }, 45_000);
});
