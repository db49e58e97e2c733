import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Store, type BulkNewTask } from "../../actors/store/index.ts";
import { parseTaskSpec, shardOfTask } from "../../ops/api.ts";
import { testNamespace, testConfig, runningRun } from "../helpers.ts";

const ns = testNamespace("bulk");
const cfg = testConfig(ns);
const store = new Store({ pgUrl: cfg.pgUrl, schema: ns });
const SHARDS = 4;
const shardOf = (id: number) => shardOfTask(id, SHARDS);
const NOW = Date.UTC(2030, 0, 1);

function spec(name: string, extra: Record<string, unknown> = {}): BulkNewTask {
  const trigger = "every" in extra ? {} : { at: new Date(NOW + 60_000).toISOString() };
  return { ...parseTaskSpec({ name, executor: "ex", ...trigger, ...extra }, NOW).task, upstreams: [] };
}

const run = (id: string, taskId: number, shard: number, epoch: number) => runningRun(id, taskId, shard, epoch);

beforeAll(async () => {
  await store.migrate();
  await store.initShardCount(SHARDS);
  await store.upsertExecutor("ex", "nats", null, 1000);
  for (let s = 0; s < SHARDS; s++) await store.claimShard(s, "n1", 5, 1);
});

afterAll(async () => {
  await store.dropNamespace();
  await store.close();
});

describe("bulk task creation", () => {
  it("creates tasks, their triggers and links as createTask would, with the API's shard hash", async () => {
    const made = await store.createTasksBulk([spec("b1"), spec("b2", { payload: { tab: "a\tb\\c\nd" } }), spec("b3", { every: "10s" })], shardOf);
    expect(made.map((m) => m.name)).toEqual(["b1", "b2", "b3"]);
    for (const m of made) {
      const row = (await store.getTask(m.id))!;
      expect(row.shard).toBe(shardOf(m.id));
      expect(m.shard).toBe(row.shard);
      expect(row.triggers).toHaveLength(1);
      expect(row.nextTriggerId).toBe(row.triggers[0]!.id);
      expect(row.nextDueMs).toBe(m.nextDueMs);
      expect(row.state).toBe("pending");
      expect(row.record).toMatchObject({ value: "pending", context: { attempt: 0, inFlight: [] } });
    }
    const b2 = (await store.getTask("b2"))!;
    expect(b2.payload).toEqual({ tab: "a\tb\\c\nd" }); // COPY escaping round-trips
    expect(b2.triggers[0]!.spec).toEqual({ kind: "once", atMs: NOW + 60_000 });
    expect((await store.getTask("b3"))!.triggers[0]!.kind).toBe("fixed_rate");
    // Fetched by the shard actors' path too (coalesced, prepared).
    const byShard = await Promise.all(made.map((m) => store.fetchTasks(m.shard, [m.id])));
    expect(byShard.map((r) => r[0]?.name)).toEqual(["b1", "b2", "b3"]);
    expect(await store.fetchTasks((made[0]!.shard + 1) % SHARDS, [made[0]!.id])).toEqual([]); // another shard's task is not returned
  });

  it("is all or nothing: an existing name, a name twice or an unknown executor refuses the whole batch", async () => {
    await expect(store.createTasksBulk([spec("c1"), spec("b1")], shardOf)).rejects.toMatchObject({ code: "AX_E_CONFLICT", field: "name", value: "b1" });
    await expect(store.createTasksBulk([spec("c1"), spec("c1")], shardOf)).rejects.toMatchObject({ code: "AX_E_CONFLICT", field: "name" });
    await expect(store.createTasksBulk([spec("c1"), { ...spec("c2"), executor: "nope" }], shardOf)).rejects.toMatchObject({ code: "AX_E_NOT_FOUND", field: "executor", value: "nope" });
    expect(await store.getTask("c1")).toBeNull();
  });

  it("links upstreams in bulk", async () => {
    const up = (await store.getTask("b1"))!;
    const [d] = await store.createTasksBulk([{ ...spec("d1"), upstreams: [up.id] }], shardOf);
    expect((await store.getTask(d!.id))!.upstreams).toEqual([up.id]);
    expect((await store.downstreamsOf(up.id)).map((x) => x.name)).toEqual(["d1"]);
  });

  it("loads thousands in one call and leaves the planner statistics fresh", async () => {
    const many = Array.from({ length: 6000 }, (_, i) => spec(`m${i}`));
    const made = await store.createTasksBulk(many, shardOf);
    expect(new Set(made.map((m) => m.id)).size).toBe(6000);
    await store.settled(); // ANALYZE runs beside the caller, not in its path
    const r = await store.pool.query("select reltuples from pg_class where oid = 'tasks'::regclass");
    expect(Number(r.rows[0].reltuples)).toBeGreaterThan(5000);
    // …from a coarse sample (statistics target 10: at most 11 histogram bounds), not a full one.
    const h = await store.pool.query("select histogram_bounds::text::text[] as b from pg_stats where schemaname = current_schema() and tablename = 'tasks' and attname = 'id'");
    expect(h.rows[0].b.length).toBeGreaterThan(1);
    expect(h.rows[0].b.length).toBeLessThanOrEqual(11);
  });
});

describe("trigger set on the task row", () => {
  it("equals the task's linked triggers, for bulk and single creation alike", async () => {
    await store.createTasksBulk([spec("ts1"), spec("ts2", { every: "5s" }), { ...parseTaskSpec({ name: "ts3", executor: "ex", cron: "*/5 * * * *", tz: "Asia/Shanghai" }, NOW).task, upstreams: [] }], shardOf);
    await store.createTask({ ...spec("ts4", { every: "7s" }), shardOf, upstreams: [] });
    const r = await store.pool.query(`select t.name, t.trigger_set as copy,
      coalesce((select jsonb_agg(jsonb_build_object('id', tr.id, 'kind', tr.kind, 'spec', tr.spec, 'enabled', tr.enabled) order by tr.id)
        from task_triggers tt join triggers tr on tr.id = tt.trigger_id where tt.task_id = t.id), '[]'::jsonb) as linked
      from tasks t where t.name like 'ts%' order by t.name`);
    expect(r.rows.map((x) => x.name)).toEqual(["ts1", "ts2", "ts3", "ts4"]);
    for (const row of r.rows) {
      expect(row.copy).toEqual(row.linked);
      expect(row.copy).toHaveLength(1);
    }
    // What the shard actors read is the copy, with the trigger's id (the slot bookkeeping keys on it).
    const t3 = (await store.getTask("ts3"))!;
    expect(t3.triggers).toEqual([{ id: t3.nextTriggerId, kind: "cron", spec: expect.objectContaining({ kind: "cron", expr: "*/5 * * * *", tz: "Asia/Shanghai" }), enabled: true }]);
  });
});

describe("dependency flags on the task row", () => {
  const flags = async (name: string) => Number((await store.pool.query("select dep_flags from tasks where name = $1", [name])).rows[0].dep_flags);
  it("are set with every edge (bulk, single, deps add) and recomputed when an edge goes", async () => {
    const [up] = await store.createTasksBulk([spec("df-up")], shardOf);
    const [down] = await store.createTasksBulk([{ ...spec("df-down"), upstreams: [up!.id] }, spec("df-none")], shardOf);
    const single = await store.createTask({ ...spec("df-single"), shardOf, upstreams: [up!.id] });
    expect([await flags("df-up"), await flags("df-down"), await flags("df-none"), await flags("df-single")]).toEqual([2, 1, 0, 1]);
    // What the shard actors read follows the edges.
    expect((await store.getTask("df-up"))!.hasDownstreams).toBe(true);
    expect((await store.getTask("df-down"))!.upstreams).toEqual([up!.id]);
    expect((await store.getTask("df-none"))!).toMatchObject({ upstreams: [], hasDownstreams: false });
    await store.addDependency(single.id, down!.id, 1);
    expect([await flags("df-down"), await flags("df-single")]).toEqual([3, 1]);
    // Removing one of two out-edges keeps the upstream flagged; removing the last clears it.
    expect(await store.removeDependency(down!.id, up!.id)).toBe(true);
    expect([await flags("df-up"), await flags("df-down")]).toEqual([2, 2]);
    expect(await store.removeDependency(single.id, up!.id)).toBe(true);
    expect(await flags("df-up")).toBe(0);
    expect((await store.getTask("df-up"))!.hasDownstreams).toBe(false);
    expect(await store.removeDependency(single.id, up!.id)).toBe(false);
  });
});

describe("pipelined fenced batch", () => {
  it("writes the current shards and refuses the stale ones of one mixed batch", async () => {
    const a = (await store.getTask("b1"))!; const b = (await store.getTask("b2"))!;
    const other = (a.shard + 1) % SHARDS;
    await store.claimShard(other, "n2", 9, 2); // `other` moved on to epoch 9: epoch 5 is stale there
    const res = await store.writeBatch([
      { shard: a.shard, epoch: 5, runInserts: [run("p1", a.id, a.shard, 5)], runUpdates: [],
        taskUpdates: [{ id: a.id, state: "running", record: { value: "running" }, triggerSlots: { "1": 2 }, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null }] },
      { shard: other, epoch: 5, runInserts: [run("p2", b.id, other, 5)], runUpdates: [{ id: "p1", startedMs: 3 }],
        taskUpdates: [{ id: b.id, state: "running", record: { value: "running" }, triggerSlots: {}, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null }] },
    ]);
    expect(res.stale).toEqual([other]);
    expect(await store.getRun("p1")).toMatchObject({ state: "running", startedMs: null });
    expect(await store.getRun("p2")).toBeNull();
    expect((await store.getTask(a.id))!).toMatchObject({ state: "running", triggerSlots: { "1": 2 } });
    expect((await store.getTask(b.id))!.state).toBe("pending");
  });

  it("a failing statement leaves nothing behind and the connection keeps working", async () => {
    const a = (await store.getTask("b1"))!;
    const bad = { ...run("p3", a.id, a.shard, 5), state: "bogus" as never }; // violates the runs.state check
    await expect(store.writeBatch([{ shard: a.shard, epoch: 5, runInserts: [run("p4", a.id, a.shard, 5), bad], runUpdates: [{ id: "p1", state: "success", finishedMs: 9 }], taskUpdates: [] }]))
      .rejects.toThrow(/check constraint|violates/);
    expect(await store.getRun("p4")).toBeNull();
    expect((await store.getRun("p1"))!.state).toBe("running");
    for (let i = 0; i < 3; i++) { // both pipelined connections are still usable
      const ok = await store.writeBatch([{ shard: a.shard, epoch: 5, runInserts: [run(`q${i}`, a.id, a.shard, 5)], runUpdates: [], taskUpdates: [] }]);
      expect(ok.stale).toEqual([]);
    }
    expect((await store.getRuns(["q0", "q1", "q2"])).length).toBe(3);
  });
});
