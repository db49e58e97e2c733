import { afterEach, describe, expect, it } from "vitest";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { Store } from "../../actors/index.ts";
import { names } from "../../common/index.ts";
import { jetstreamManager } from "@nats-io/jetstream";
import { DispatchBatchSchema, decode, shardEventsConsumer, type RunContext } from "../../protocol/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

/**
 * Engine v2: runs are decided and recorded ahead of their due time (AX_LEAD), released at it in
 * one dispatch message per executor per node round (runs of many shards), and their events come
 * back through the dispatching node. Leads here are seconds long so that each window can be hit
 * deterministically on a loaded machine; the product default is 100 ms.
 */

let tc: TestCluster | null = null;
let nc: NatsConnection | null = null;
let store: Store | null = null;
afterEach(async () => {
  await nc?.close(); nc = null;
  await store?.close(); store = null;
  await tc?.teardown(); tc = null;
});

/**
 * The lease TTL of the tests whose leads are seconds long: a message is handed to the releaser
 * thread only if its shards' leases stay valid until its release time, which the tests' 2 s
 * lease does not promise a second ahead (the product default is 6 s).
 */
const LEASE_FOR_LEAD = "8s";

interface Start { runId: string; task: string; startedAt: number; scheduledAt: number }

/** A handler that notes each run's start on the clock that defines "due". */
const recordInto = (starts: Start[]) => (ctx: RunContext): void => {
  starts.push({ runId: ctx.runId, task: ctx.taskName, startedAt: Date.now(), scheduledAt: ctx.scheduledAt });
};

async function runsOf(s: Store, task: string) {
  const t = await s.getTask(task);
  return t ? s.listRuns(t.id, 50) : [];
}

/** One node with every shard, and executor `w` noting each run's start: where most tests here begin. */
async function oneNode(prefix: string, nodeId: string, env: Record<string, string> = {}, holdAhead?: boolean, maxInFlight?: number) {
  tc = new TestCluster(prefix, env);
  store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
  const starts: Start[] = [];
  const node = await tc.startNode(nodeId);
  await tc.waitForShards();
  const ex = await tc.startExecutor("w", recordInto(starts), { ...(holdAhead === undefined ? {} : { holdAhead }), ...(maxInFlight === undefined ? {} : { maxInFlight }) });
  await ex.registered;
  // Returned as well, non-null, for the test to use (afterEach closes the module's copies).
  return { tc, store, starts, node, client: await tc.client() };
}

/** A node spawned as its own process (to be killed with -9) and executor `w` noting each run's start. */
async function victimNode(prefix: string, nodeId: string, env: Record<string, string>, handler?: (ctx: RunContext) => Promise<void>) {
  tc = new TestCluster(prefix, env);
  store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
  const starts: Start[] = [];
  const ex = await tc.startExecutor("w", handler ? async (ctx) => { recordInto(starts)(ctx); await handler(ctx); } : recordInto(starts));
  const victim = tc.spawn(["node", "--id", nodeId]);
  await ex.registered;
  return { tc, store, starts, victim, client: await tc.client() };
}

describe("engine v2", () => {
  // To an executor that does not hold runs (registered holdAhead: false). The default releases on
  // the node's main thread; AX_RELEASER=thread adds the backstop thread (actors/releaser).
  it.each(["inline", "thread"])("records runs ahead of their due time, releases them at it (never early) in messages carrying several shards (AX_RELEASER=%s)", async (releaser) => {
    const { tc, store, starts, client, node } = await oneNode(`eng${releaser[0]}`, "e1", { AX_LEAD: "1500ms", AX_RELEASER: releaser, AX_LEASE_TTL: LEASE_FOR_LEAD }, false);
    nc = await connect({ servers: tc.config.natsUrl });
    const messages: Array<{ v: number; shards: number[]; at: number }> = [];
    nc.subscribe(names(tc.ns).dispatchSubject("w"), {
      callback: (_e, m) => {
        const d = decode(DispatchBatchSchema, m.data);
        if (d.ok) messages.push({ v: d.value.v, shards: d.value.v === 2 ? d.value.runs.map((r) => r.shard) : [d.value.shard], at: Date.now() });
      },
    });
    const due = Date.now() + 4000;
    const at = new Date(due).toISOString();
    const tasks = Array.from({ length: 24 }, (_, i) => ({ name: `a${i}`, executor: "w", at }));
    await client.call("task.bulkCreate", { tasks });
    await waitFor(() => starts.length === tasks.length, 15_000, "every task ran");
    for (const s of starts) expect(s.startedAt, `${s.task} started before its due time`).toBeGreaterThanOrEqual(due);
    expect(new Set(starts.map((s) => s.runId)).size).toBe(tasks.length);
    // One node round carried runs of several shards in one message, sent at (not before) the due time.
    expect(messages.every((m) => m.v === 2)).toBe(true);
    expect(Math.max(...messages.map((m) => new Set(m.shards).size))).toBeGreaterThan(1);
    expect(messages.length).toBeLessThan(tasks.length);
    for (const m of messages) expect(m.at).toBeGreaterThanOrEqual(due);
    // The thread is in use only where asked for: it had every message handed over.
    const rel = ((await node.status()) as { releaser: { held: number } | null }).releaser;
    if (releaser === "thread") expect(rel?.held, "messages handed to the releaser thread").toBeGreaterThanOrEqual(messages.length);
    else expect(rel).toBeNull();
    // Recorded before the due time: the write is not on the fire path.
    await waitFor(async () => { for (const t of tasks) if ((await runsOf(store!, t.name))[0]?.state !== "success") return false; return true; }, 10_000, "every completion recorded");
    for (const t of tasks) {
      const runs = await runsOf(store, t.name);
      expect(runs).toHaveLength(1);
      expect(runs[0]!.createdMs, `${t.name} was recorded at its due time, not ahead of it`).toBeLessThan(due);
      expect(runs[0]!.firedMs).toBe(due);
      expect(runs[0]!.state).toBe("success");
    }
  });

  it("to an executor that holds runs (the SDK's default) the runs go out as they are recorded, ahead of their due time, and start at it, never early", async () => {
    const { tc, store, starts, client, node } = await oneNode("enga", "a1", { AX_LEAD: "1500ms" });
    nc = await connect({ servers: tc.config.natsUrl });
    const messages: Array<{ at: number; sentAt: number | undefined; runs: number }> = [];
    nc.subscribe(names(tc.ns).dispatchSubject("w"), {
      callback: (_e, m) => {
        const d = decode(DispatchBatchSchema, m.data);
        if (d.ok && d.value.v === 2) messages.push({ at: Date.now(), sentAt: d.value.sentAt, runs: d.value.runs.length });
      },
    });
    const due = Date.now() + 4000;
    const tasks = Array.from({ length: 24 }, (_, i) => ({ name: `h${i}`, executor: "w", at: new Date(due + (i % 3) * 100).toISOString() }));
    await client.call("task.bulkCreate", { tasks });
    await waitFor(() => starts.length === tasks.length, 15_000, "every task ran");
    for (const s of starts) {
      expect(s.startedAt, `${s.task} started before its due time`).toBeGreaterThanOrEqual(s.scheduledAt);
      // Held until the due time, not for the whole lead again after it.
      expect(s.startedAt - s.scheduledAt, `${s.task} held past its due time`).toBeLessThan(1000);
    }
    expect(new Set(starts.map((s) => s.runId)).size).toBe(tasks.length);
    expect(messages.reduce((n, m) => n + m.runs, 0)).toBe(tasks.length);
    for (const m of messages) {
      expect(m.at, "published ahead of the due time").toBeLessThan(due);
      expect(m.sentAt).toBeDefined();
      expect(m.sentAt!).toBeLessThanOrEqual(m.at);
    }
    const persister = ((await node.status()) as { persister: { ahead: number; held: number } }).persister;
    expect(persister.ahead).toBe(tasks.length);
    expect(persister.held).toBe(0);
    await waitFor(async () => { for (const t of tasks) if ((await runsOf(store!, t.name))[0]?.state !== "success") return false; return true; }, 10_000, "every completion recorded");
  });

  // A burst known ahead (600 runs due at one instant) with AX_SPREAD_RATE=160: two due times per
  // shard and 100 ms step (8 shards), so it is decided over the ~4 s before its instant. The
  // executor's in-flight limit is 50: runs spread ahead to an executor that holds them are
  // outside it; to one that does not, they are decided in the lead, as without spreading.
  it.each([
    { holds: true, name: "to an executor that holds runs: recorded and sent over the seconds before it, outside the in-flight limit, each started at its due time" },
    { holds: false, name: "to an executor that does not hold runs: not spread, decided in the lead and within the limit as before" },
  ])("a burst due at one instant is spread $name", async ({ holds }) => {
    const { store, starts, client, node } = await oneNode(`engs${holds ? "h" : "n"}`, "s1", { AX_SPREAD_RATE: "160" }, holds, 50);
    const due = Date.now() + 8000;
    const at = new Date(due).toISOString();
    const tasks = Array.from({ length: 600 }, (_, i) => ({ name: `b${i}`, executor: "w", at }));
    for (let i = 0; i < tasks.length; i += 200) await client.call("task.bulkCreate", { tasks: tasks.slice(i, i + 200) });
    let aheadSeen = 0;
    await waitFor(async () => {
      if (Date.now() < due) aheadSeen = Math.max(aheadSeen, ((await node.status()) as { limiter: { ahead: number } }).limiter.ahead);
      return starts.length >= tasks.length;
    }, 30_000, "every task ran");
    await sleep(300);
    expect(new Set(starts.map((s) => s.runId)).size).toBe(tasks.length);
    expect(starts).toHaveLength(tasks.length);
    for (const s of starts) expect(s.startedAt, `${s.task} started before its due time`).toBeGreaterThanOrEqual(due);
    await waitFor(async () => { for (const t of tasks) if ((await runsOf(store!, t.name))[0]?.state !== "success") return false; return true; }, 20_000, "every completion recorded");
    const created: number[] = [];
    for (const t of tasks) {
      const runs = await runsOf(store, t.name);
      expect(runs, t.name).toHaveLength(1);
      // Not ahead, the runs wait for places under the limit of 50: fired as places free, after the instant.
      if (holds) expect(runs[0]!.firedMs).toBe(due); else expect(runs[0]!.firedMs).toBeGreaterThanOrEqual(due);
      created.push(runs[0]!.createdMs);
    }
    const early = created.filter((c) => c < due - 1000).length;
    if (holds) {
      expect(early, "runs recorded more than a second before the instant").toBeGreaterThan(tasks.length / 3);
      expect(aheadSeen, "runs placed ahead, past the executor's limit of 50").toBeGreaterThan(50);
      for (const s of starts) expect(s.startedAt - due, `${s.task} held past its due time`).toBeLessThan(3000);
    } else {
      expect(early).toBe(0);
      expect(aheadSeen).toBe(0);
    }
    const st = (await node.status()) as { limiter: { ahead: number; inFlight: number } };
    expect([st.limiter.ahead, st.limiter.inFlight]).toEqual([0, 0]);
  });

  it("at the default lead, runs are decided on the 100 ms grid: runs due within one step are decided together, between the lead and the lead + 100 ms ahead", async () => {
    const { tc, store, starts, client } = await oneNode("engg", "g1");
    const lead = tc.config.leadMs;
    expect(lead).toBe(500); // the default (common/config.ts)
    const t0 = Date.now() + 2000;
    // Due times spread over 2 s at odd offsets, so that without the grid the decision instants
    // (due - lead) would fall anywhere within their step.
    const tasks = Array.from({ length: 40 }, (_, i) => ({ name: `g${i}`, executor: "w", at: new Date(t0 + i * 50 + ((i * 37) % 50)).toISOString() }));
    await client.call("task.bulkCreate", { tasks });
    await waitFor(async () => { for (const t of tasks) if ((await runsOf(store!, t.name))[0]?.state !== "success") return false; return true; }, 20_000, "every run recorded as done");
    let onGrid = 0;
    for (const t of tasks) {
      const [run] = await runsOf(store, t.name);
      const due = Date.parse(t.at);
      const boundary = Math.floor((due - lead) / 100) * 100;
      expect(run!.firedMs).toBe(due);
      expect(run!.createdMs, `${t.name} decided before its step`).toBeGreaterThanOrEqual(boundary);
      expect(run!.createdMs, `${t.name} decided less than the lead ahead`).toBeLessThanOrEqual(due);
      if (run!.createdMs - boundary < 60) onGrid++;
    }
    // Without the grid about half are decided 60 ms or more after their step's boundary (one run without it: 19 of 40 within 50 ms).
    expect(onGrid).toBeGreaterThanOrEqual(32);
    for (const s of starts) expect(s.startedAt, `${s.task} started before its due time`).toBeGreaterThanOrEqual(s.scheduledAt);
  });

  // "ahead": the executor holds runs (the SDK's default), so the run went out when it was recorded and the pause revokes it there.
  it.each(["inline", "thread", "ahead"])("a pause before the due time withdraws the recorded run; resume catches the slot up once (%s)", async (mode) => {
    const releaser = mode === "thread" ? "thread" : "inline";
    const { store, starts, client, node } = await oneNode(`engp${mode[0]}`, "p1", { AX_LEAD: "2s", AX_RELEASER: releaser, AX_LEASE_TTL: LEASE_FOR_LEAD }, mode === "ahead");
    const due = Date.now() + 5000;
    await client.call("task.create", { name: "held", executor: "w", at: new Date(due).toISOString() });
    const recorded = await waitFor(async () => (await runsOf(store!, "held")).find((r) => r.state === "running"), 6000, "run recorded ahead of its due time");
    expect(Date.now()).toBeLessThan(due - 300);
    await client.call("task.pause", { task: "held" });
    await sleep(Math.max(0, due - Date.now()) + 1500);
    expect(starts).toEqual([]);
    const withdrawn = (await runsOf(store, "held")).find((r) => r.id === recorded.id)!;
    expect(withdrawn.state).toBe("refused");
    expect(withdrawn.error).toMatch(mode === "ahead" ? /^withdrawn before its start \(its dispatch had gone out ahead to its executor, which dropped it\): the task was paused/ : /^withdrawn before dispatch: the task was paused/);
    if (mode === "ahead") expect(((await node.status()) as { persister: { revoked: number } }).persister.revoked).toBe(1);
    // With the releaser thread the recorded message was handed over, and the pause claimed it back.
    const rel = ((await node.status()) as { releaser: { held: number; claimed: number; taken: number } | null }).releaser;
    if (releaser === "thread") expect(rel && rel.held > 0 && rel.claimed === rel.held && rel.taken === 0, JSON.stringify(rel)).toBe(true);
    await client.call("task.resume", { task: "held" });
    await waitFor(() => starts.length === 1, 10_000, "the catch-up after resume");
    await sleep(1000);
    expect(starts).toHaveLength(1);
    const runs = await runsOf(store, "held");
    expect(runs.filter((r) => r.state === "success").map((r) => r.source)).toEqual(["misfire"]);
  });

  it("kill -9 between record and release: the next owner publishes the recorded messages at their due time, each run once", async () => {
    const { tc, store, starts, victim, client } = await victimNode("engk", "k1", { AX_LEAD: "3s" });
    const due = Date.now() + 9000;
    const tasks = Array.from({ length: 16 }, (_, i) => ({ name: `k${i}`, executor: "w", at: new Date(due).toISOString() }));
    await waitFor(async () => { try { await client.call("task.bulkCreate", { tasks }); return true; } catch { return false; } }, 10_000, "bulk create through k1");
    // Every run recorded (running, unstarted) by k1 ahead of its due time, none released yet.
    await waitFor(async () => {
      const r = await store!.pool.query("select count(*)::int as n from runs where state = 'running' and started_ms is null");
      return r.rows[0].n === tasks.length;
    }, 8000, "runs recorded ahead");
    expect(Date.now()).toBeLessThan(due - 500);
    victim.kill("SIGKILL");
    await tc.startNode("k2");
    await waitFor(() => starts.length >= tasks.length, 30_000, "every recorded run dispatched by the next owner");
    await sleep(2000);
    expect(starts).toHaveLength(tasks.length);
    expect(new Set(starts.map((s) => s.task)).size).toBe(tasks.length);
    for (const s of starts) expect(s.startedAt, `${s.task} started before its due time`).toBeGreaterThanOrEqual(due);
    const r = await store.pool.query("select count(*)::int as n from runs");
    expect(r.rows[0].n).toBe(tasks.length); // the recorded runs themselves, not retries
  });

  it("kill -9 while fires' task rows wait to be written: the next owner redoes those fires from their runs and fires no slot twice", async () => {
    // A minute of AX_TASK_WRITE_DEFER: no row is written before the kill but by a run's end.
    const { tc, store, starts, victim, client } = await victimNode("engw", "w1", { AX_LEAD: "3s", AX_TASK_WRITE_DEFER: "60s" });
    const due = Date.now() + 9000;
    const once = Array.from({ length: 12 }, (_, i) => ({ name: `o${i}`, executor: "w", at: new Date(due).toISOString() }));
    const every = Array.from({ length: 4 }, (_, i) => ({ name: `r${i}`, executor: "w", every: "2s" }));
    await waitFor(async () => { try { await client.call("task.bulkCreate", { tasks: [...once, ...every] }); return true; } catch { return false; } }, 10_000, "bulk create through w1");
    await waitFor(async () => {
      const r = await store!.pool.query("select count(*)::int as n from runs where state = 'running' and started_ms is null and source = 'once'");
      return r.rows[0].n === once.length;
    }, 8000, "the one-shots' runs recorded ahead");
    expect(Date.now()).toBeLessThan(due - 500);
    // The fires are recorded on the runs; their task rows still point at the slots.
    for (const t of once) {
      const row = (await store.getTask(t.name))!;
      expect([row.state, row.nextDueMs], `${t.name} as PostgreSQL holds it`).toEqual(["pending", due]);
    }
    victim.kill("SIGKILL");
    const next = await tc.startNode("w2");
    await waitFor(() => once.every((t) => starts.some((s) => s.task === t.name)), 30_000, "every recorded one-shot run dispatched by the next owner");
    await sleep(4000); // rate slots keep coming meanwhile
    for (const t of once) expect(starts.filter((s) => s.task === t.name), `${t.name} ran once`).toHaveLength(1);
    for (const s of starts.filter((x) => x.task.startsWith("o"))) expect(s.startedAt, `${s.task} started before its due time`).toBeGreaterThanOrEqual(due);
    // No slot of any task ran twice: one run row per (task, slot), and one start per run.
    const slots = await store.pool.query("select task_name, slot_ms, count(*)::int as n from runs where state <> 'skipped' group by 1, 2 having count(*) > 1");
    expect(slots.rows).toEqual([]);
    expect(new Set(starts.map((s) => s.runId)).size).toBe(starts.length);
    // The redone rows went on from the runs: the one-shots ended, nothing left pointing at their slot.
    await waitFor(async () => { for (const t of once) if ((await store!.getTask(t.name))!.state !== "success") return false; return true; }, 10_000, "one-shot rows brought forward and ended");
    for (const t of once) expect((await store.getTask(t.name))!.nextDueMs).toBeNull();
    const totals = (await next.status()) as { shardTotals?: { replayedFires?: number } };
    expect(totals.shardTotals?.replayedFires ?? 0, "fires redone by w2").toBeGreaterThanOrEqual(once.length);
  });

  it("kill -9 while runs wait for a place at a full executor: the next owner fires each missed slot once, as a catch-up", async () => {
    let open!: () => void;
    const gate = new Promise<void>((r) => { open = r; });
    const { tc, store, starts, victim, client } = await victimNode("engq", "q1", { AX_MAX_IN_FLIGHT: "3" }, () => gate);
    const due = Date.now() + 5000;
    const once = Array.from({ length: 12 }, (_, i) => ({ name: `q${i}`, executor: "w", at: new Date(due + i * 10).toISOString() }));
    await waitFor(async () => { try { await client.call("task.bulkCreate", { tasks: once }); return true; } catch { return false; } }, 10_000, "bulk create through q1");
    // Three runs start and hold their places; the other nine wait in q1's limiter.
    await waitFor(() => starts.length === 3, 15_000, "three runs started");
    await sleep(500);
    expect(starts).toHaveLength(3);
    const waiting = once.filter((t) => !starts.some((x) => x.task === t.name));
    // Waiting changed nothing of a row: PostgreSQL still holds each as created, due at its slot.
    for (const t of waiting) {
      const row = (await store.getTask(t.name))!;
      expect([row.state, row.nextDueMs, row.updatedMs === row.createdMs], `${t.name} as PostgreSQL holds it`).toEqual(["pending", Date.parse(t.at), true]);
    }
    victim.kill("SIGKILL");
    await tc.startNode("q2");
    await sleep(1000);
    open();
    // The slots came due while nobody owned them: q2 fires each as one catch-up (misfire=once),
    // three at a time, once the three adopted runs' ends reach it (drained from q1's consumer).
    await waitFor(() => once.every((t) => starts.some((s) => s.task === t.name)), 45_000, "every task ran");
    await sleep(1500);
    for (const t of once) expect(starts.filter((s) => s.task === t.name), `${t.name} ran once`).toHaveLength(1);
    expect(new Set(starts.map((s) => s.runId)).size).toBe(starts.length);
    const doubled = await store.pool.query("select task_name, count(*)::int as n from runs where state not in ('skipped') group by 1 having count(*) > 1");
    expect(doubled.rows).toEqual([]);
    await waitFor(async () => { for (const t of once) if ((await store!.getTask(t.name))!.state !== "success") return false; return true; }, 15_000, "every row ended");
    const sources = await store.pool.query("select source, count(*)::int as n from runs group by 1 order by 1");
    expect(sources.rows).toEqual([{ source: "misfire", n: waiting.length }, { source: "once", n: 3 }]);
  }, 120_000);

  it("a fire's task row waits for the run's end at most AX_TASK_WRITE_DEFER: a long run shows `running` on its row while it runs", async () => {
    tc = new TestCluster("engl", { AX_TASK_WRITE_DEFER: "300ms" });
    store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
    let release!: () => void;
    const gate = new Promise<void>((r) => { release = r; });
    const starts: Start[] = [];
    await tc.startNode("l1");
    await tc.waitForShards();
    const ex = await tc.startExecutor("w", async (ctx: RunContext) => { recordInto(starts)(ctx); await gate; });
    await ex.registered;
    const client = await tc.client();
    await client.call("task.create", { name: "long", executor: "w", delay: "200ms", timeout: "60s" });
    await waitFor(() => starts.length === 1, 10_000, "the run started");
    try {
      // Still running (the handler waits): only the flush can have written the fire to the row.
      const row = await waitFor(async () => { const t = await store!.getTask("long"); return t?.state === "running" ? t : null; }, 3000, "the row shows the fire");
      expect((row.record as { context: { inFlight: string[] } }).context.inFlight).toEqual([starts[0]!.runId]);
      expect((await runsOf(store, "long"))[0]!.state).toBe("running");
    } finally {
      release();
    }
    await waitFor(async () => (await runsOf(store!, "long"))[0]?.state === "success", 10_000, "the run's end written");
  });

  it("a completion sent to a node that died reaches the shard's next owner through the drain of its consumer", async () => {
    tc = new TestCluster("engd", { AX_LEAD: "100ms" });
    store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
    let release!: () => void;
    const gate = new Promise<void>((r) => { release = r; });
    const starts: Start[] = [];
    const ex = await tc.startExecutor("w", async (ctx: RunContext) => {
      recordInto(starts)(ctx);
      await gate;
    });
    const victim = tc.spawn(["node", "--id", "d1"]);
    await ex.registered;
    const client = await tc.client();
    await waitFor(async () => { try { await client.call("task.create", { name: "long", executor: "w", delay: "500ms", timeout: "60s" }); return true; } catch { return false; } }, 10_000, "create through d1");
    await waitFor(() => starts.length === 1, 10_000, "run started from d1");
    victim.kill("SIGKILL");
    await tc.startNode("d2");
    await tc.waitForShards(undefined, undefined, 20_000);
    release(); // the completion goes to d1's subject: only d2's drain of d1's consumer brings it to the shard
    const done = await waitFor(async () => (await runsOf(store!, "long")).find((r) => r.state !== "running"), 40_000, "the run's completion applied");
    expect(done.state).toBe("success");
    expect(done.id).toBe(starts[0]!.runId);
  });

  it("a forged completion of a run in flight, on the node's subject or the shard's, is refused; the real one is applied", async () => {
    tc = new TestCluster("engf");
    store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
    let release!: () => void;
    const gate = new Promise<void>((r) => { release = r; });
    await tc.startNode("f1");
    await tc.waitForShards();
    const ex = await tc.startExecutor("w", async () => { await gate; });
    await ex.registered;
    const client = await tc.client();
    await client.call("task.create", { name: "victim", executor: "w", delay: "200ms", timeout: "30s" });
    const run = await waitFor(async () => (await runsOf(store!, "victim")).find((r) => r.startedMs !== null), 10_000, "run started");
    nc = await connect({ servers: tc.config.natsUrl });
    const n = names(tc.ns);
    const forged = { type: "completed", runId: run.id, taskId: run.taskId, at: Date.now(), token: "forgedforgedforgedforg" };
    nc.publish(n.nodeEventsSubject("f1"), JSON.stringify({ v: 2, executor: "w", instance: "forger", node: "f1", events: [{ ...forged, shard: run.shard }] }));
    nc.publish(n.eventsSubject(run.shard), JSON.stringify({ v: 1, executor: "w", instance: "forger", shard: run.shard, events: [{ type: "completed", runId: run.id, taskId: run.taskId, at: Date.now() }] }));
    await nc.flush();
    await sleep(1500);
    const still = (await runsOf(store, "victim"))[0]!;
    expect(still.state).toBe("running");
    release();
    const done = await waitFor(async () => (await runsOf(store!, "victim")).find((r) => r.state !== "running"), 10_000, "real completion applied");
    expect(done.state).toBe("success");
    expect(done.executorInstance).toBe(ex.instance);
    expect(done.lateOutcome).toBeNull();
  });

  it("a node that is behind (busy past a slot) fires the slot as itself: no re-dating as a misfire, and misfire=skip does not drop it", async () => {
    const { store, starts, client } = await oneNode("engb", "b1", { AX_LEASE_TTL: "10s" }); // the busy spell stays well inside the lease: behind, not gone
    const due = Date.now() + 3000;
    await client.call("task.create", { name: "behind", executor: "w", at: new Date(due).toISOString(), misfire: "skip" });
    await sleep(Math.max(0, due - 500 - Date.now()));
    // The node runs in this process: block its event loop across the due time, as an overload would.
    const until = Date.now() + 2200;
    while (Date.now() < until) { /* busy */ }
    await waitFor(() => starts.length === 1, 10_000, "the late slot fired");
    // The handler has started; its completion is written a round later (CI once read `running`).
    const runs = await waitFor(async () => { const rs = await runsOf(store!, "behind"); return rs.every((r) => r.state !== "running") ? rs : null; }, 10_000, "the run's outcome written");
    expect(runs.map((r) => [r.source, r.dueMs, r.state])).toEqual([["once", due, "success"]]);
    expect(starts[0]!.scheduledAt).toBe(due);
  });

  it("a shard whose event consumer is deleted restarts with a new one instead of staying owned and deaf", async () => {
    tc = new TestCluster("engc");
    store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
    const node = await tc.startNode("c1");
    await tc.waitForShards();
    nc = await connect({ servers: tc.config.natsUrl });
    const jsm = await jetstreamManager(nc);
    const n = names(tc.ns);
    const epochOf = async (s: number) => (await store!.listShards()).find((x) => x.shard === s)!.epoch;
    const before = await epochOf(3);
    await jsm.consumers.delete(n.eventsStream, shardEventsConsumer(3));
    await waitFor(async () => (await epochOf(3)) > before && node.ownedShards().includes(3), 20_000, "shard 3 loaded again");
    await waitFor(async () => { try { await jsm.consumers.info(n.eventsStream, shardEventsConsumer(3)); return true; } catch { return false; } }, 10_000, "its consumer re-created");
    // And it reads it: a forwarded (v1) event for one of its runs is applied.
    const ex = await tc.startExecutor("w", () => undefined);
    await ex.registered;
    const client = await tc.client();
    const created = await client.call<{ id: number; shard: number }>("task.create", { name: "after", executor: "w", delay: "100ms" });
    await waitFor(async () => (await runsOf(store!, "after")).some((r) => r.state === "success"), 10_000, `task on shard ${created.shard} ran`);
  });

  it("a task whose schedule cannot be computed is paused with the reason; the shard keeps firing its other tasks", async () => {
    tc = new TestCluster("engs", { AX_SHARDS: "1" });
    store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
    const seen = new Map<string, number>();
    const node = await tc.startNode("s1");
    await tc.waitForShards();
    const ex = await tc.startExecutor("w", (ctx: RunContext) => { seen.set(ctx.taskName, (seen.get(ctx.taskName) ?? 0) + 1); });
    await ex.registered;
    const client = await tc.client();
    await client.call("task.create", { name: "healthy", executor: "w", every: "1s" });
    await client.call("task.create", { name: "poisoned", executor: "w", every: "1s" });
    await waitFor(() => (seen.get("poisoned") ?? 0) >= 1 && (seen.get("healthy") ?? 0) >= 1, 10_000, "both firing");
    // A stored trigger that no longer compiles (as after a bad hand edit or an older version's spec).
    await store.pool.query(`update tasks set trigger_set = jsonb_set(trigger_set, '{0,spec}', '{"kind":"cron","expr":"61 * * * *"}') where name = 'poisoned'`);
    const shown = await waitFor(async () => {
      const t = await client.call<{ state: string; lastError: string | null; nextReason: string | null }>("task.show", { task: "poisoned" });
      return t.state === "paused" ? t : null;
    }, 10_000, "poisoned marked");
    expect(shown.lastError, JSON.stringify(shown)).toMatch(/schedule stuck/);
    expect(shown.nextReason).toMatch(/not scheduled/);
    const epoch = (await store.listShards())[0]!.epoch;
    const before = seen.get("healthy")!;
    await waitFor(() => seen.get("healthy")! >= before + 3, 10_000, "healthy keeps firing");
    expect((await store.listShards())[0]!.epoch).toBe(epoch); // the shard never restarted
    expect(await node.metrics.registry.getSingleMetricAsString("ax_tasks_stuck_total")).toMatch(/ax_tasks_stuck_total 1/);
  });
});
