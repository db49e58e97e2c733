import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DueIndex, SCHEMA_VERSIONS, Store, findCycle, type NewTask, type TaskUpdate } from "../../actors/store/index.ts";
import { replayParts } from "../../actors/index.ts";
import { testNamespace, testConfig, runningRun } from "../helpers.ts";

const ns = testNamespace("store");
const cfg = testConfig(ns);
const store = new Store({ pgUrl: cfg.pgUrl, schema: ns });
const due = new DueIndex(cfg.redis, ns);

function newTask(name: string, over: Partial<NewTask> = {}): NewTask {
  return {
    name, executor: "ex", payload: { n: 1 }, timeoutMs: 30_000, maxAttempts: 3, backoffMs: 1000, backoffMaxMs: 60_000,
    misfire: "once", overlap: "forbid", shardOf: () => 1, state: "pending", record: { value: "pending", context: {} },
    triggers: [{ kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: 1000, anchorMs: 0 } }], upstreams: [],
    nextDueMs: 5000, nextSlotMs: 5000, nextSource: "rate", nextReason: "first slot", nowMs: 1000, ...over,
  };
}

const run = (id: string, taskId: number, shard: number, epoch: number) => runningRun(id, taskId, shard, epoch, { taskName: "a", source: "rate" });

beforeAll(async () => {
  // Two nodes migrating at the same instant: the advisory lock serializes them, one applies.
  const other = new Store({ pgUrl: cfg.pgUrl, schema: ns });
  const [a, b] = await Promise.all([store.migrate(), other.migrate()]);
  await other.close();
  expect([...a.applied, ...b.applied]).toEqual([...SCHEMA_VERSIONS]);
  expect(await store.initShardCount(4)).toBe(4);
  expect(await store.initShardCount(64)).toBe(4); // fixed at creation
  await store.upsertExecutor("ex", "nats", null, 1000);
});

afterAll(async () => {
  await store.dropNamespace();
  await due.dropNamespace();
  await store.close();
  await due.close();
});

describe("store", () => {
  it("creates tasks with triggers and refuses duplicates and unknown executors by field", async () => {
    const t = await store.createTask(newTask("a"));
    expect(t.id).toBeGreaterThan(0);
    expect(t.triggers).toHaveLength(1);
    expect(t.nextTriggerId).toBe(t.triggers[0]!.id);
    await expect(store.createTask(newTask("a"))).rejects.toMatchObject({ code: "AX_E_CONFLICT", field: "name" });
    await expect(store.createTask(newTask("b", { executor: "nope" }))).rejects.toMatchObject({ code: "AX_E_NOT_FOUND", field: "executor", value: "nope" });
  });

  it("fences batch writes by epoch: a stale epoch changes nothing and is reported", async () => {
    const t = (await store.getTask("a"))!;
    expect(await store.claimShard(1, "n1", 10, 1)).toBe(true);
    const ok = await store.writeBatch([{ shard: 1, epoch: 10, runInserts: [run("r1", t.id, 1, 10)], runUpdates: [], taskUpdates: [] }]);
    expect(ok.stale).toEqual([]);
    // A new owner claims with a higher epoch; an older claim can never win back.
    expect(await store.claimShard(1, "n2", 11, 2)).toBe(true);
    expect(await store.claimShard(1, "n1", 10, 3)).toBe(false);
    const stale = await store.writeBatch([{
      shard: 1, epoch: 10, runInserts: [run("r2", t.id, 1, 10)], runUpdates: [{ id: "r1", state: "success", finishedMs: 9 }],
      taskUpdates: [{ id: t.id, state: "running", record: {}, triggerSlots: {}, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null }],
    }]);
    expect(stale.stale).toEqual([1]);
    expect(await store.getRun("r2")).toBeNull();
    expect((await store.getRun("r1"))!.state).toBe("running");
    expect((await store.getTask(t.id))!.state).toBe("pending");
    const good = await store.writeBatch([{ shard: 1, epoch: 11, runInserts: [], runUpdates: [{ id: "r1", startedMs: 7, executorInstance: "i1" }, { id: "r1", state: "success", finishedMs: 9 }], taskUpdates: [] }]);
    expect(good.stale).toEqual([]);
    // The two updates of one run in one batch fold into one row: neither loses a field.
    expect(await store.getRun("r1")).toMatchObject({ state: "success", startedMs: 7, finishedMs: 9, executorInstance: "i1" });
  });

  it("JSON values cross the fenced write unchanged: run results of every JSON kind, upstream runs, a task's record and slots", async () => {
    // The recordsets read these columns as json and cast them (see fencedWrite.ts): a string must
    // stay a JSON string (quotes, escapes, non-ASCII), not become its bare text.
    const t = (await store.getTask("a"))!;
    const results: unknown[] = ["plain", "q\"uo\\te \u00e9 \u2713 \n", 0, -1.5e10, true, false, [1, "two", { three: [null] }], { nested: { deep: ["x", 2] }, empty: {} }, [], ""];
    const ids = results.map((_, i) => `rj${i}`);
    await store.writeBatch([{ shard: 1, epoch: 11, runInserts: ids.map((id) => ({ ...run(id, t.id, 1, 11), upstreamRuns: ["up-\"1", "up-2"] })), runUpdates: [], taskUpdates: [] }]);
    const w = await store.writeBatch([{
      shard: 1, epoch: 11, runInserts: [], runUpdates: ids.map((id, i) => ({ id, state: "success", finishedMs: 9, result: results[i] })),
      taskUpdates: [{ id: t.id, state: "running", record: { value: "running", context: { attempt: 2, inFlight: ["rj0"], lastRunId: "rj\"0", lastError: "boom \\ \u00e9" } },
        triggerSlots: { "7": 123, "8": 4.5e12 }, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null }],
    }]);
    expect(w.stale).toEqual([]);
    for (const [i, id] of ids.entries()) {
      const r = (await store.getRun(id))!;
      expect(r.result, id).toEqual(results[i]);
      expect(r.upstreamRuns).toEqual(["up-\"1", "up-2"]);
    }
    const row = (await store.pool.query(`select record, trigger_slots, jsonb_typeof(record) as kind from "${ns}".tasks where id = $1`, [t.id])).rows[0];
    expect(row.kind).toBe("object");
    expect(row.record).toEqual({ a: 2, f: ["rj0"], r: "rj\"0", e: "boom \\ \u00e9" });
    expect(row.trigger_slots).toEqual({ "7": 123, "8": 4.5e12 });
  });

  it("a partly released dispatch message is noted, and its replay is split into the part sent and the rest", async () => {
    const t = await store.createTask(newTask("partial", { shardOf: () => 2 }));
    expect(await store.claimShard(2, "n1", 20, 1)).toBe(true);
    expect(await store.claimShard(0, "n1", 21, 1)).toBe(true);
    const runs = [run("pr1", t.id, 2, 20), run("pr2", t.id, 0, 21), run("pr3", t.id, 0, 21)];
    const w = await store.writeBatch([
      { shard: 2, epoch: 20, runInserts: [{ ...runs[0]!, dispatchId: "d:pr1" }], runUpdates: [], taskUpdates: [] },
      { shard: 0, epoch: 21, runInserts: [{ ...runs[1]!, dispatchId: "d:pr1" }, { ...runs[2]!, dispatchId: "d:pr1" }], runUpdates: [], taskUpdates: [] },
    ], [{ id: "d:pr1", executor: "ex", node: "n1", runIds: ["pr1", "pr2", "pr3"], createdMs: 5000 }]);
    expect(w.stale).toEqual([]);
    const [whole] = await store.dispatchReplay(["d:pr1"]);
    expect(whole!.releasedShards).toBeNull();
    expect(replayParts(whole!.id, whole!.releasedShards, whole!.runs).map((p) => [p.id, p.runs.map((r) => r.id)])).toEqual([["d:pr1", ["pr1", "pr2", "pr3"]]]);
    // Shard 0 was lost between record and release: only shard 2's run went out under the id.
    await store.markPartialRelease("d:pr1", [2]);
    const [partial] = await store.dispatchReplay(["d:pr1"]);
    expect(partial!.releasedShards).toEqual([2]);
    expect(replayParts(partial!.id, partial!.releasedShards, partial!.runs).map((p) => [p.id, p.runs.map((r) => r.id)]))
      .toEqual([["d:pr1", ["pr1"]], ["d:pr1:rest", ["pr2", "pr3"]]]);
  });

  it("records a late outcome on a timed-out run only: a run with its own outcome keeps it when its completion is seen again", async () => {
    const t = (await store.getTask("a"))!;
    await store.writeBatch([{ shard: 1, epoch: 11, runInserts: [run("late1", t.id, 1, 11), run("late2", t.id, 1, 11)], runUpdates: [], taskUpdates: [] }]);
    await store.writeBatch([{ shard: 1, epoch: 11, runInserts: [], runUpdates: [{ id: "late1", state: "timed_out", finishedMs: 9 }, { id: "late2", state: "success", finishedMs: 9 }], taskUpdates: [] }]);
    await store.writeBatch([{ shard: 1, epoch: 11, runInserts: [], runUpdates: [{ id: "late1", lateOutcome: "success" }, { id: "late2", lateOutcome: "success" }], taskUpdates: [] }]);
    expect(await store.getRun("late1")).toMatchObject({ state: "timed_out", lateOutcome: "success" });
    expect(await store.getRun("late2")).toMatchObject({ state: "success", lateOutcome: null });
  });

  it("a fenced batch and a concurrent claim serialize: the claim waits for the batch", async () => {
    const t = (await store.getTask("a"))!;
    const writes = Array.from({ length: 20 }, (_, i) => store.writeBatch([{ shard: 1, epoch: 11, runInserts: [run(`c${i}`, t.id, 1, 11)], runUpdates: [], taskUpdates: [] }]));
    const claim = store.claimShard(1, "n3", 12, 4);
    const results = await Promise.all(writes);
    expect(await claim).toBe(true);
    const landed = results.filter((r) => r.stale.length === 0).length;
    const rows = await store.getRuns(Array.from({ length: 20 }, (_, i) => `c${i}`));
    expect(rows.length).toBe(landed); // every write either landed whole or was refused whole
    expect(rows.every((r) => r.epoch === 11)).toBe(true);
  });

  it("refuses a dependency cycle naming it, direct or through three tasks", async () => {
    const x = await store.createTask(newTask("x"));
    const y = await store.createTask(newTask("y", { upstreams: [x.id] }));
    const z = await store.createTask(newTask("z", { upstreams: [y.id] }));
    await expect(store.addDependency(x.id, z.id, 1)).rejects.toMatchObject({ code: "AX_E_CYCLE" });
    await expect(store.addDependency(x.id, z.id, 1)).rejects.toThrow(/x → y → z → x|y → z → x → y|z → x → y → z/);
    await expect(store.addDependency(x.id, y.id, 1)).rejects.toThrow(/cycle/);
    await expect(store.addDependency(x.id, x.id, 1)).rejects.toMatchObject({ code: "AX_E_CYCLE" });
    // Two edges that each are fine alone but close a cycle together, added at once: one is refused.
    const p = await store.createTask(newTask("p"));
    const q = await store.createTask(newTask("q"));
    const results = await Promise.allSettled([store.addDependency(p.id, q.id, 1), store.addDependency(q.id, p.id, 1)]);
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
    expect((await store.downstreamsOf(x.id)).map((d) => d.name)).toEqual(["y"]);
  });

  it("findCycle is null on a DAG and names a closed path otherwise", () => {
    expect(findCycle([[1, 2], [2, 3], [1, 3]])).toBeNull();
    expect(findCycle([[1, 2], [2, 3], [3, 1], [3, 4]])).toHaveLength(4);
  });

  it("due index: take is atomic, rebuild restores from PostgreSQL after Redis loses it", async () => {
    await due.rebuild(2, [{ id: 1, dueMs: 100 }, { id: 2, dueMs: 200 }, { id: 3, dueMs: 300 }]);
    expect(await due.isBuilt(2)).toBe(true);
    const [a, b] = await Promise.all([due.takeDue(2, 250, 10), due.takeDue(2, 250, 10)]);
    expect([...a!.items, ...b!.items].map((x) => x.id).sort()).toEqual([1, 2]);
    expect(a!.nextDueMs).toBe(300); // the earliest left, for both takes
    expect(b!.nextDueMs).toBe(300);
    expect(await due.size(2)).toBe(1);
    expect(await due.takeDue(2, 250, 10)).toEqual({ items: [], nextDueMs: 300 });
    await due.dropNamespace(); // Redis lost everything
    expect(await due.isBuilt(2)).toBe(false);
    // The take itself says so (no marker): nothing is taken until the index is rebuilt.
    expect(await due.takeDue(2, 1e15, 10)).toBeNull();
    await due.rebuild(2, [{ id: 4, dueMs: 100 }]);
    expect(await due.takeDue(2, 1e15, 10)).toEqual({ items: [{ id: 4, dueMs: 100 }], nextDueMs: null });
    const fromPg = await store.dueOfShard(1);
    await due.rebuild(1, fromPg);
    expect(await due.size(1)).toBe(fromPg.length);
  });

  it("due index: a rebuild of an active shard puts memory's due times over PostgreSQL's, and overwrites no entry a round adds meanwhile", async () => {
    await due.rebuild(3, [{ id: 1, dueMs: 100 }, { id: 9, dueMs: 900 }]); // (before: what the rebuild empties)
    const take = async () => (await due.takeDue(3, 1e15, 100))!.items.map((x) => [x.id, x.dueMs]).sort((a, b) => a[0]! - b[0]!);
    await due.rebuildFrom(3, {
      // Task 1's next due time is in memory only (its row's write deferred); task 2 is PostgreSQL's alone.
      memory: () => [{ id: 1, dueMs: 6000 }],
      stored: async () => {
        // A round that rescheduled task 3 while the rebuild read PostgreSQL: its entry, added after
        // the index was emptied, is newer than the read and stays.
        await due.add(3, [{ id: 3, dueMs: 7000 }]);
        return [{ id: 1, dueMs: 100 }, { id: 2, dueMs: 200 }, { id: 3, dueMs: 300 }];
      },
    });
    expect(await due.isBuilt(3)).toBe(true);
    expect(await take()).toEqual([[1, 6000], [2, 200], [3, 7000]]);
  });

  it("prunes old history in batches and keeps running runs", async () => {
    const t = (await store.getTask("a"))!;
    const epoch = (await store.listShards()).find((s) => s.shard === 1)!.epoch;
    const old = Array.from({ length: 30 }, (_, i) => ({ ...run(`old${i}`, t.id, 1, epoch), state: i === 0 ? "running" as const : "success" as const, createdMs: 10 }));
    await store.writeBatch([{ shard: 1, epoch, runInserts: old, runUpdates: [], taskUpdates: [] }]);
    const removed = await store.pruneRuns(11, 7);
    expect(removed).toBe(29);
    expect(await store.getRun("old0")).not.toBeNull();
  });

  it("migration 8 rewrites a record of the older full form compactly; both forms read back as the same record", async () => {
    const full = { value: "retry", context: { attempt: 2, maxAttempts: 3, overlap: "forbid", inFlight: [], lastRunId: "r-old", lastError: "boom", pausedAfterRun: false } };
    const running = { value: "running", context: { attempt: 1, maxAttempts: 3, overlap: "allow", inFlight: ["r-a", "r-b"], lastRunId: "r-b", lastError: null, pausedAfterRun: true } };
    const a = await store.createTask(newTask("old-form-a"));
    const b = await store.createTask(newTask("old-form-b", { overlap: "allow" }));
    await store.pool.query("update tasks set record = $1::jsonb, state = 'retry' where id = $2", [JSON.stringify(full), a.id]);
    await store.pool.query("update tasks set record = $1::jsonb, state = 'running' where id = $2", [JSON.stringify(running), b.id]);
    expect((await store.getTask(a.id))!.record).toEqual(full); // read as it is before the migration
    await store.pool.query("delete from schema_migrations where version = 8");
    expect((await store.migrate()).applied).toEqual([8]);
    const raw = async (id: number) => (await store.pool.query("select record from tasks where id = $1", [id])).rows[0].record as unknown;
    expect(await raw(a.id)).toEqual({ a: 2, r: "r-old", e: "boom" });
    expect(await raw(b.id)).toEqual({ a: 1, f: ["r-a", "r-b"], r: "r-b", p: 1 });
    expect((await store.getTask(a.id))!.record).toEqual(full);
    expect((await store.getTask(b.id))!.record).toEqual(running);
  });

  it("an executor registered without an in-flight limit has none stored (the node's applies); one it registers stays; migration 20 takes a stored 5,000 as none", async () => {
    const limitOf = async (name: string) => (await store.listExecutors()).find((e) => e.name === name)!.maxInFlight;
    await store.upsertExecutor("lim-none", "nats", null, 1);
    expect(await limitOf("lim-none")).toBeNull();
    await store.upsertExecutor("lim-own", "nats", 300, 1);
    await store.upsertExecutor("lim-own", "nats", null, 2); // another instance naming none keeps it
    expect(await limitOf("lim-own")).toBe(300);
    // Rows as versions before 20 stored them: 5,000 for "none", or a limit asked for.
    await store.pool.query("insert into executors (name, kind, max_in_flight, created_ms) values ('lim-old-default', 'nats', 5000, 1), ('lim-old-own', 'nats', 4000, 1)");
    await store.pool.query("delete from schema_migrations where version = 20");
    expect((await store.migrate()).applied).toEqual([20]);
    expect(await limitOf("lim-old-default")).toBeNull();
    expect(await limitOf("lim-old-own")).toBe(4000);
    expect(await limitOf("lim-own")).toBe(300);
  });

  it("finds a shard's running runs through its tasks' in-flight lists, and only those", async () => {
    const t = await store.createTask(newTask("inflight", { shardOf: () => 3 }));
    const other = await store.createTask(newTask("idle", { shardOf: () => 3 }));
    expect(await store.claimShard(3, "n1", 5, 1)).toBe(true);
    const taskUpdate = (id: number, inFlight: string[]): TaskUpdate => ({
      id, state: inFlight.length ? "running" : "success", record: { value: inFlight.length ? "running" : "success", context: { attempt: 1, inFlight } },
      triggerSlots: {}, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null,
    });
    await store.writeBatch([{ shard: 3, epoch: 5, runInserts: [run("live1", t.id, 3, 5), run("done1", other.id, 3, 5)],
      runUpdates: [{ id: "done1", state: "success", finishedMs: 6000 }], taskUpdates: [taskUpdate(t.id, ["live1"]), taskUpdate(other.id, [])] }]);
    expect((await store.runningRuns(3)).map((r) => r.id)).toEqual(["live1"]);
    // The run completes: the task's list empties in the same transaction, and the run is no longer found.
    await store.writeBatch([{ shard: 3, epoch: 5, runInserts: [], runUpdates: [{ id: "live1", state: "success", finishedMs: 7000 }], taskUpdates: [taskUpdate(t.id, [])] }]);
    expect(await store.runningRuns(3)).toEqual([]);
    // The rebuild source for the due index reads the shard's tasks without the old partial index.
    expect((await store.dueOfShard(3)).map((d) => d.id)).toEqual([]);
  });

  it("tag search finds tagged tasks through a tags index that holds tagged tasks only", async () => {
    const tagged = await store.createTask(newTask("tagged-1"));
    await store.createTask(newTask("untagged-1"));
    await store.browse.setTags(tagged.id, ["billing", "etl"]);
    expect((await store.browse.searchTasks({ nameLike: null, state: null, executor: null, tag: "etl" }, 10, 0)).ids).toEqual([tagged.id]);
    expect((await store.browse.searchTasks({ nameLike: null, state: null, executor: null, tag: "nope" }, 10, 0)).ids).toEqual([]);
    const entries = async () => Number((await store.pool.query("select count(*)::int as n from tasks where tags <> '{}'")).rows[0].n);
    expect(await entries()).toBe(1);
    // The search's own predicate lets the planner use the partial index (seq scans priced out).
    const c = await store.pool.connect();
    try {
      await c.query("begin"); await c.query("set local enable_seqscan = off");
      const plan = JSON.stringify((await c.query("explain (format json) select t.id from tasks t where ($1::text is null or (t.tags @> array[$1::text] and t.tags <> '{}'))", ["etl"])).rows);
      expect(plan).toContain("tasks_tags");
      await c.query("rollback");
    } finally { c.release(); }
    // The index really is partial: its definition says so.
    const def = (await store.pool.query("select indexdef from pg_indexes where indexname = 'tasks_tags' and schemaname = current_schema()")).rows[0]?.indexdef as string;
    expect(def).toMatch(/WHERE \(tags <> '\{\}'::text\[\]\)/);
  });
});
