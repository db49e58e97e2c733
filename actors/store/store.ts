import { randomBytes } from "node:crypto";
import pg from "pg";
import { InvalidInputError } from "../../common/index.ts";
import { dropSchema, migrate, quoteIdent } from "./schema.ts";
import { fullRecord } from "./recordCodec.ts";
import { DependencyEdges } from "./edges.ts";
import { AuditTrail } from "./audit.ts";
import { TaskHistory } from "./history.ts";
import { ExecutorInstances } from "./executorInstances.ts";
import { BrowseReads } from "./browseReads.ts";
import { FencedWriter } from "./fencedWrite.ts";
import { DependencyGraph } from "./graph.ts";
import { TaskRegistration } from "./taskRegistration.ts";
import { AlertHooks } from "./alertHooks.ts";
import type { BulkCreated, BulkNewTask, DispatchRecord, NewTask, RunRow, ShardRow, ShardWrite, TaskRow, TriggerRow } from "./types.ts";

// bigint (int8) columns hold ids and epoch milliseconds, all well below 2^53.
pg.types.setTypeParser(20, (v: string) => Number(v));

const TASK_COLS = `t.id, t.name, t.executor, t.payload, t.timeout_ms, t.max_attempts, t.backoff_ms, t.backoff_max_ms,
  t.misfire, t.overlap, t.shard, t.state, t.record, t.trigger_slots, t.next_due_ms, t.next_slot_ms, t.next_trigger_id,
  t.next_source, t.next_reason, t.next_caused_by, t.created_ms, t.updated_ms, t.generation, t.apply_set,
  t.trigger_set as triggers,
  case when t.dep_flags & 1 <> 0 then (select array_agg(d.upstream order by d.upstream) from dependencies d where d.downstream = t.id) end as upstreams,
  case when t.dep_flags & 2 <> 0 then exists (select 1 from dependencies d where d.upstream = t.id) else false end as has_downstreams`;

type Row = Record<string, unknown>;

function toTask(r: Row): TaskRow {
  return {
    id: r.id as number, name: r.name as string, executor: r.executor as string, payload: r.payload,
    timeoutMs: r.timeout_ms as number, maxAttempts: r.max_attempts as number, backoffMs: r.backoff_ms as number,
    backoffMaxMs: r.backoff_max_ms as number, misfire: r.misfire as TaskRow["misfire"], overlap: r.overlap as TaskRow["overlap"],
    shard: r.shard as number, state: r.state as string,
    record: fullRecord(r.record, r.state as string, r.overlap as string, r.max_attempts as number), triggerSlots: (r.trigger_slots ?? {}) as Record<string, number>,
    nextDueMs: r.next_due_ms as number | null, nextSlotMs: r.next_slot_ms as number | null,
    nextTriggerId: r.next_trigger_id as number | null, nextSource: r.next_source as TaskRow["nextSource"],
    nextReason: r.next_reason as string | null, nextCausedBy: r.next_caused_by as string | null,
    createdMs: r.created_ms as number, updatedMs: r.updated_ms as number,
    triggers: (r.triggers as TriggerRow[]) ?? [], upstreams: ((r.upstreams as Array<number | string> | null) ?? []).map(Number),
    hasDownstreams: r.has_downstreams === true, generation: (r.generation as number | undefined) ?? 0, applySet: (r.apply_set as string | null | undefined) ?? null,
  };
}

function toRun(r: Row): RunRow {
  return {
    id: r.id as string, taskId: r.task_id as number, taskName: r.task_name as string, triggerId: r.trigger_id as number | null,
    source: r.source as RunRow["source"], dueMs: r.due_ms as number, slotMs: r.slot_ms as number | null,
    dueReason: r.due_reason as string | null, firedMs: r.fired_ms as number | null, node: r.node as string | null,
    shard: r.shard as number, epoch: r.epoch as number, attempt: r.attempt as number, executor: r.executor as string,
    executorInstance: r.executor_instance as string | null, startedMs: r.started_ms as number | null,
    finishedMs: r.finished_ms as number | null, state: r.state as RunRow["state"], error: r.error as string | null,
    causedBy: r.caused_by as string | null, upstreamRuns: r.upstream_runs as string[] | null,
    lateOutcome: r.late_outcome as string | null, createdMs: r.created_ms as number,
    dispatchId: (r.dispatch_id as string | null) ?? null, result: r.result ?? null,
  };
}

/** The drained set in `meta` (read by the supervisor, the status and setDrained). */
async function drainedOn(q: pg.Pool | pg.PoolClient): Promise<string[]> {
  const r = await q.query("select value from meta where key = 'drained'");
  return (r.rows[0]?.value as string[] | undefined) ?? [];
}

export interface StoreOptions { pgUrl: string; schema: string; poolSize?: number }

/**
 * PostgreSQL access for one namespace. PostgreSQL is the truth; every write a shard actor
 * makes goes through `writeBatch`, which is fenced by the shard's epoch.
 */
/**
 * A PostgreSQL behind a network partition answers nothing (no reset): without these a query or
 * a connect waited forever, and so did the round or start that made it. The query bound is far
 * above any query ax makes (a batch write takes milliseconds, a migration seconds); it only ends
 * a wait for a server that is gone. TCP keep-alive finds dead connections in the pool.
 */
const PARTITION_TIMEOUTS = { connectionTimeoutMillis: 10_000, query_timeout: 60_000, keepAlive: true, keepAliveInitialDelayMillis: 10_000 };

export class Store {
  readonly pool: pg.Pool;
  private readonly writePool: pg.Pool;
  private readonly fenced: FencedWriter;
  readonly schema: string;
  /** The dependency graph's edges (the dependency actor's reads and writes). */
  readonly edges: DependencyEdges;
  readonly audit: AuditTrail;
  /** Definition changes of tasks (ax task update / apply). */
  readonly history: TaskHistory;
  readonly executorInstances: ExecutorInstances;
  /** Listings and explanations (ops/browse.ts, ops/ledgerView.ts). */
  readonly browse: BrowseReads;
  readonly alertHooks: AlertHooks;
  private readonly graph: DependencyGraph;
  private readonly registration: TaskRegistration;
  constructor(opts: StoreOptions) {
    this.schema = opts.schema;
    this.pool = new pg.Pool({
      connectionString: opts.pgUrl,
      max: opts.poolSize ?? 8,
      options: `-c search_path=${quoteIdent(opts.schema)}`,
      application_name: `ax:${opts.schema}`,
      ...PARTITION_TIMEOUTS,
    });
    // An idle client losing its connection must not crash the node; the next query reconnects.
    this.pool.on("error", () => undefined);
    // Fenced batch writes: pipelined (every statement of a batch on the wire at once). Every
    // statement joins a batch of keys to a table by its primary key, so only index nested loops
    // are allowed: the statements are prepared once per connection and PostgreSQL keeps the
    // generic plan it chose then, and a plan chosen while `runs` was nearly empty (a hash join on a
    // sequential scan) stayed in use as the table grew: at 835 runs/s it read ~2,000 run rows per
    // run written and cost 950 µs of PostgreSQL CPU a run.
    this.writePool = new pg.Pool({
      connectionString: opts.pgUrl, max: 2,
      options: `-c search_path=${quoteIdent(opts.schema)} -c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off`,
      application_name: `ax:${opts.schema}`, pipeline: true, ...PARTITION_TIMEOUTS,
    } as pg.PoolConfig);
    this.writePool.on("error", () => undefined);
    this.fenced = new FencedWriter(this.writePool);
    // A client checked out when its connection dies (postmaster killed, `pg_ctl stop -m fast`)
    // emits 'error' on itself, not on the pool: without a listener of its own that event ends
    // the process. Its query already fails with the same error, so the caller sees it.
    for (const p of [this.pool, this.writePool]) p.on("connect", (c) => { c.on("error", () => undefined); });
    this.edges = new DependencyEdges(this.pool, this.schema, (fn) => this.transaction(fn));
    this.audit = new AuditTrail(this.pool);
    this.history = new TaskHistory(this.pool);
    this.executorInstances = new ExecutorInstances(this.pool);
    this.browse = new BrowseReads(this.pool);
    this.alertHooks = new AlertHooks(this.pool);
    this.graph = new DependencyGraph(this.pool, this.schema, (fn) => this.transaction(fn));
    this.registration = new TaskRegistration(this.pool, this.schema, this.graph, (name) => this.getTask(name));
  }

  async migrate(): Promise<{ applied: number[] }> { return migrate(this.pool, this.schema); }
  async dropNamespace(): Promise<void> { await dropSchema(this.pool, this.schema); }
  async close(): Promise<void> { await this.settled(); await Promise.all([this.pool.end(), this.writePool.end()]); }

  // ---- cluster metadata ------------------------------------------------------------------

  /** Runs `fn` in one transaction on one connection: committed if it resolves, rolled back if it throws. */
  async transaction<T>(fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
    const c = await this.pool.connect();
    try {
      await c.query("begin");
      const out = await fn(c);
      await c.query("commit");
      return out;
    } catch (e) {
      await c.query("rollback").catch(() => undefined);
      throw e;
    } finally { c.release(); }
  }

  /** The shard count is fixed when the cluster is created; later nodes read it back. */
  initShardCount(requested: number): Promise<number> {
    return this.transaction(async (c) => {
      await c.query("select pg_advisory_xact_lock(hashtext($1))", [`ax-shards:${this.schema}`]);
      const r = await c.query("select value from meta where key = 'shard_count'");
      if (r.rowCount) return Number(r.rows[0].value);
      await c.query("insert into meta (key, value) values ('shard_count', $1::jsonb)", [JSON.stringify(requested)]);
      await c.query("insert into shards (shard) select generate_series(0, $1::int - 1) on conflict do nothing", [requested]);
      return requested;
    });
  }

  /** The cluster's dispatch secret (see runToken): made once, when the first node starts; 32 random bytes. */
  async dispatchSecret(): Promise<Buffer> {
    await this.pool.query("insert into meta (key, value) values ('dispatch_secret', to_jsonb($1::text)) on conflict (key) do nothing", [randomBytes(32).toString("hex")]);
    const r = await this.pool.query("select value from meta where key = 'dispatch_secret'");
    return Buffer.from(String(r.rows[0].value), "hex");
  }

  /** Marks a node drained (it owns no shard while drained) or not; returns the drained set. */
  setDrained(node: string, drained: boolean): Promise<string[]> {
    return this.transaction(async (c) => {
      await c.query("select pg_advisory_xact_lock(hashtext($1))", [`ax-drain:${this.schema}`]);
      const set = new Set(await drainedOn(c));
      if (drained) set.add(node); else set.delete(node);
      await c.query("insert into meta (key, value) values ('drained', $1::jsonb) on conflict (key) do update set value = excluded.value", [JSON.stringify([...set])]);
      return [...set];
    });
  }

  /** Those of these executors that are HTTP bridges (kind http). */
  async httpExecutorsAmong(names: string[]): Promise<Set<string>> {
    const r = await this.pool.query<{ name: string }>("select name from executors where kind = 'http' and name = any($1::text[])", [names]);
    return new Set(r.rows.map((x) => x.name));
  }

  /** State, error, executor and task of these runs (those still kept). */
  async runStates(ids: string[]): Promise<Map<string, { id: string; state: string; error: string | null; executor: string; taskId: number }>> {
    const r = await this.pool.query("select id, state, error, executor, task_id from runs where id = any($1::text[])", [ids]);
    return new Map(r.rows.map((x) => [x.id as string, { id: x.id, state: x.state, error: x.error ?? null, executor: x.executor, taskId: Number(x.task_id) }]));
  }

  /** The generation of each of these tasks that still exists. */
  async taskGenerations(ids: number[]): Promise<Map<number, number>> {
    const r = await this.pool.query("select id, generation from tasks where id = any($1::bigint[])", [[...new Set(ids)]]);
    return new Map(r.rows.map((x) => [Number(x.id), Number(x.generation)]));
  }

  /** For each of these runs, the first run it caused (its retry), if any. */
  async firstCausedBy(taskIds: number[], runIds: string[]): Promise<Map<string, string>> {
    const r = await this.pool.query("select id, caused_by from runs where task_id = any($1::bigint[]) and caused_by = any($2::text[]) order by created_ms",
      [[...new Set(taskIds)], runIds]);
    const out = new Map<string, string>();
    for (const x of r.rows) if (!out.has(x.caused_by)) out.set(x.caused_by, x.id);
    return out;
  }

  /** The retry that replaced this run, if one was fired. */
  async retryOf(taskId: number, runId: string): Promise<string | null> {
    const r = await this.pool.query("select id from runs where task_id = $1 and caused_by = $2 and source = 'retry' order by created_ms limit 1", [taskId, runId]);
    return (r.rows[0]?.id as string | undefined) ?? null;
  }

  async executorExists(name: string): Promise<boolean> {
    return ((await this.pool.query("select 1 from executors where name = $1", [name])).rowCount ?? 0) > 0;
  }

  /** A trigger row not yet linked to a task (an update links it in its shard's fenced round). */
  async insertTrigger(kind: string, spec: unknown, nowMs: number): Promise<number> {
    const r = await this.pool.query("insert into triggers (kind, spec, created_ms) values ($1, $2, $3) returning id", [kind, JSON.stringify(spec), nowMs]);
    return Number(r.rows[0].id);
  }

  /** Deletes those of these trigger rows that no task links (an update that was refused). */
  async deleteUnlinkedTriggers(ids: number[]): Promise<void> {
    await this.pool.query("delete from triggers where id = any($1::bigint[]) and not exists (select 1 from task_triggers tt where tt.trigger_id = triggers.id)", [ids]);
  }

  /** Hands a task to an apply set (`ax apply --adopt`). */
  async setApplySet(taskId: number, set: string | null): Promise<void> {
    await this.pool.query("update tasks set apply_set = $2 where id = $1", [taskId, set]);
  }

  /** Ids of the tasks of an apply set (all tasks when `set` is null), oldest first. */
  async taskIdsOfSet(set: string | null): Promise<number[]> {
    const r = await this.pool.query("select id from tasks where ($1::text is null or apply_set = $1) order by id", [set]);
    return r.rows.map((x) => Number(x.id));
  }

  /** The tasks of an apply set whose names are not in `keep` (what `ax apply --prune` removes). */
  async tasksOfSetExcept(set: string, keep: string[]): Promise<Array<{ id: number; name: string }>> {
    const r = await this.pool.query("select id, name from tasks where apply_set = $1 and not (name = any($2::text[])) order by id", [set, keep]);
    return r.rows.map((x) => ({ id: Number(x.id), name: String(x.name) }));
  }

  async taskNamesByIds(ids: number[]): Promise<Map<number, string>> {
    if (!ids.length) return new Map();
    const r = await this.pool.query("select id, name from tasks where id = any($1::bigint[])", [[...new Set(ids)]]);
    return new Map(r.rows.map((x) => [Number(x.id), String(x.name)]));
  }

  /** The nodes marked drained (`ax node drain`). */
  drainedNodes(): Promise<string[]> { return drainedOn(this.pool); }

  /** Answers when PostgreSQL does (the health probe). */
  async ping(): Promise<void> { await this.pool.query("select 1"); }

  /** Tasks in all, and how many have a run in flight. */
  async taskCounts(): Promise<{ tasks: number; running: number }> {
    const r = await this.pool.query("select count(*)::int as tasks, count(*) filter (where state = 'running')::int as running from tasks");
    return { tasks: r.rows[0].tasks as number, running: r.rows[0].running as number };
  }

  /** Per shard, the oldest due time of a task that came due before `beforeMs` and has not moved on (a shard that is behind). */
  async oldestOverdueByShard(beforeMs: number): Promise<Map<number, number>> {
    const r = await this.pool.query("select shard, min(next_due_ms) as oldest from tasks where next_due_ms < $1 group by shard", [beforeMs]);
    return new Map(r.rows.map((x) => [x.shard as number, x.oldest as number]));
  }

  async listShards(): Promise<ShardRow[]> {
    const r = await this.pool.query("select shard, owner, epoch, pinned_to, updated_ms from shards order by shard");
    return r.rows.map((x) => ({ shard: x.shard, owner: x.owner, epoch: x.epoch, pinnedTo: x.pinned_to, updatedMs: x.updated_ms }));
  }

  /**
   * Records that `owner` now holds `shard` under `epoch` (the lease revision). Epochs only move
   * forward: a claim with an epoch not greater than the recorded one changes nothing and
   * returns false. Takes the row lock, so it waits for any in-flight fenced batch of the old
   * owner to commit; afterwards every write under an older epoch is refused.
   */
  async claimShard(shard: number, owner: string, epoch: number, nowMs: number): Promise<boolean> {
    const r = await this.pool.query("update shards set owner = $2, epoch = $3, updated_ms = $4 where shard = $1 and epoch < $3",
      [shard, owner, epoch, nowMs]);
    return (r.rowCount ?? 0) > 0;
  }

  async setPin(shard: number, node: string | null): Promise<void> {
    const r = await this.pool.query("update shards set pinned_to = $2 where shard = $1", [shard, node]);
    if (!r.rowCount) throw new InvalidInputError("shard", shard, "no such shard");
  }

  // ---- executors ---------------------------------------------------------------------------

  async upsertExecutor(name: string, kind: "nats" | "http", maxInFlight: number | null, nowMs: number): Promise<void> {
    await this.pool.query(
      `insert into executors (name, kind, max_in_flight, created_ms, last_seen_ms) values ($1, $2, coalesce($3, 5000), $4, $4)
       on conflict (name) do update set last_seen_ms = $4, max_in_flight = coalesce($3, executors.max_in_flight), kind = $2`,
      [name, kind, maxInFlight, nowMs]);
  }
  async listExecutors(): Promise<Array<{ name: string; kind: string; maxInFlight: number; lastSeenMs: number | null }>> {
    const r = await this.pool.query("select name, kind, max_in_flight, last_seen_ms from executors order by name");
    return r.rows.map((x) => ({ name: x.name, kind: x.kind, maxInFlight: x.max_in_flight, lastSeenMs: x.last_seen_ms }));
  }

  // ---- tasks (API side) -------------------------------------------------------------------

  /** One task, its triggers and its upstream edges, in one transaction (taskRegistration.ts). */
  createTask(t: NewTask): Promise<TaskRow> { return this.registration.create(t); }
  /** Many tasks in one transaction, written with COPY; all or nothing (taskRegistration.ts). */
  createTasksBulk(tasks: ReadonlyArray<BulkNewTask>, shardOf: (id: number) => number): Promise<BulkCreated[]> { return this.registration.bulk(tasks, shardOf); }
  /** Resolves when no background ANALYZE is running (tests, close). */
  settled(): Promise<void> { return this.registration.settled(); }

  /** Ids of the tasks with these names (names not found are absent). */
  async taskIdsByName(names: string[]): Promise<Map<string, number>> {
    const r = await this.pool.query("select id, name from tasks where name = any($1::text[])", [names]);
    return new Map(r.rows.map((x) => [x.name as string, x.id as number]));
  }

  /** By numeric id or by name. */
  async getTask(ref: string | number): Promise<TaskRow | null> {
    const byId = typeof ref === "number" || /^\d+$/.test(ref);
    const r = await this.pool.query(`select ${TASK_COLS} from tasks t where ${byId ? "t.id = $1::bigint" : "t.name = $1"}`, [String(ref)]);
    if (r.rowCount) return toTask(r.rows[0]);
    if (byId) { // a task may be named with digits only
      const r2 = await this.pool.query(`select ${TASK_COLS} from tasks t where t.name = $1`, [String(ref)]);
      if (r2.rowCount) return toTask(r2.rows[0]);
    }
    return null;
  }

  async requireTask(ref: string | number): Promise<TaskRow> {
    const t = await this.getTask(ref);
    if (!t) throw new InvalidInputError("task", ref, "no such task", "AX_E_NOT_FOUND");
    return t;
  }

  /** `afterId`: the next page of a listing, in id order. */
  /** `state`, `executor`: equal; `namePrefix`: the name starts with it (operator filters of `ax task ls`). */
  async listTasks(opts: { limit?: number; shard?: number; afterId?: number; state?: string; executor?: string; namePrefix?: string } = {}): Promise<TaskRow[]> {
    const r = await this.pool.query(`select ${TASK_COLS} from tasks t where ($2::int is null or t.shard = $2) and ($3::bigint is null or t.id > $3)
      and ($4::text is null or t.state = $4) and ($5::text is null or t.executor = $5) and ($6::text is null or starts_with(t.name, $6)) order by t.id limit $1`,
      [opts.limit ?? 1000, opts.shard ?? null, opts.afterId ?? null, opts.state ?? null, opts.executor ?? null, opts.namePrefix ?? null]);
    return r.rows.map(toTask);
  }

  /**
   * The rows of `ids` that belong to `shard` (the shard actors' hot path). Calls made in the same
   * turn of the event loop — every shard's round of one tick — share one query, run as a prepared
   * statement (TASK_COLS takes ~1 ms to plan, far more than the lookup itself).
   */
  fetchTasks(shard: number, ids: number[]): Promise<TaskRow[]> {
    if (!ids.length) return Promise.resolve([]);
    return new Promise((resolve, reject) => {
      this.fetchQueue.push({ shard, ids, resolve, reject });
      if (this.fetchQueue.length === 1) setImmediate(() => this.runFetches());
    });
  }
  private fetchQueue: Array<{ shard: number; ids: number[]; resolve: (rows: TaskRow[]) => void; reject: (e: unknown) => void }> = [];
  private runFetches(): void {
    const batch = this.fetchQueue;
    this.fetchQueue = [];
    const all: number[] = [];
    for (const f of batch) for (const id of f.ids) all.push(id);
    // Plain columns: row_to_json saved the node ~4.6 µs a row and cost PostgreSQL ~6.
    this.pool.query({ name: "ax_fetch_tasks", text: `select ${TASK_COLS} from tasks t where t.id = any($1::bigint[])`, values: [all] }).then((r) => {
      const byId = new Map<number, Row>();
      for (const row of r.rows as Row[]) byId.set(row.id as number, row);
      for (const f of batch) {
        const out: TaskRow[] = [];
        for (const id of f.ids) { const row = byId.get(id); if (row && row.shard === f.shard) out.push(toTask(row)); }
        f.resolve(out);
      }
    }, (e) => { for (const f of batch) f.reject(e); });
  }

  async deleteTask(id: number): Promise<void> {
    await this.pool.query("delete from triggers where id in (select trigger_id from task_triggers where task_id = $1)", [id]);
    await this.pool.query("delete from tasks where id = $1", [id]);
  }

  async countTasksByShard(): Promise<Map<number, { tasks: number; dueSoon: number }>> {
    const r = await this.pool.query(
      "select shard, count(*)::int as n, count(*) filter (where next_due_ms < $1)::int as soon from tasks group by shard", [Date.now() + 60_000]);
    return new Map(r.rows.map((x) => [x.shard as number, { tasks: x.n as number, dueSoon: x.soon as number }]));
  }

  // ---- dependencies -------------------------------------------------------------------------

  addDependency(downstream: number, upstream: number, nowMs: number): Promise<void> { return this.graph.add(downstream, upstream, nowMs); }
  removeDependency(downstream: number, upstream: number): Promise<boolean> { return this.graph.remove(downstream, upstream); }
  downstreamsOf(upstream: number): Promise<Array<{ id: number; name: string; shard: number }>> { return this.graph.downstreamsOf(upstream); }
  allEdges(): Promise<Array<{ upstream: number; downstream: number }>> { return this.graph.allEdges(); }

  // ---- runs ------------------------------------------------------------------------------------

  /** `states`: only runs in one of these; `sinceMs`: only runs created at or after it (`ax runs --outcome --since`). */
  async listRuns(taskId: number, limit: number, f: { states?: string[]; sinceMs?: number } = {}): Promise<RunRow[]> {
    const r = await this.pool.query(`select * from runs where task_id = $1 and ($3::text[] is null or state = any($3)) and ($4::bigint is null or created_ms >= $4)
      order by created_ms desc, id desc limit $2`, [taskId, limit, f.states ?? null, f.sinceMs ?? null]);
    return r.rows.map(toRun);
  }
  async getRun(id: string): Promise<RunRow | null> {
    const r = await this.pool.query("select * from runs where id = $1", [id]);
    return r.rowCount ? toRun(r.rows[0]) : null;
  }
  async getRuns(ids: string[]): Promise<RunRow[]> {
    if (!ids.length) return [];
    const r = await this.pool.query("select * from runs where id = any($1::text[])", [ids]);
    return r.rows.map(toRun);
  }
  /**
   * Runs recorded `running` for tasks of `shard`, found through the tasks' in-flight lists: a run
   * row and its task's record are written in one fenced transaction, so the two always agree.
   * (Read when a shard is loaded; no index on runs.state, so status updates stay HOT.)
   */
  async runningRuns(shard: number): Promise<RunRow[]> {
    const r = await this.pool.query(`select r.* from tasks t
      cross join lateral jsonb_array_elements_text(t.record->'f') f(id)
      join runs r on r.id = f.id
      where t.shard = $1 and t.record ? 'f' and r.state = 'running'`, [shard]);
    return r.rows.map(toRun);
  }
  async lastRunOf(taskId: number): Promise<RunRow | null> {
    const r = await this.pool.query("select * from runs where task_id = $1 and state <> 'skipped' order by created_ms desc limit 1", [taskId]);
    return r.rowCount ? toRun(r.rows[0]) : null;
  }

  /**
   * What a new owner needs to publish recorded dispatch messages again: for each message id, the
   * runs it carried that are still `running` and not started, with what the executor needs
   * (payload and timeout from the task). Runs of every shard of the message are included, so the
   * message goes out complete whoever publishes it.
   */
  async dispatchReplay(ids: string[]): Promise<Array<{ id: string; executor: string; node: string; releasedShards: number[] | null; runs: Array<RunRow & { payload: unknown; timeoutMs: number }> }>> {
    if (!ids.length) return [];
    const r = await this.pool.query(`select d.id as d_id, d.executor as d_executor, d.node as d_node, d.released_shards as d_released, x.ord, r.*, t.payload as t_payload, t.timeout_ms as t_timeout
      from dispatches d cross join lateral unnest(d.run_ids) with ordinality x(run_id, ord)
      join runs r on r.id = x.run_id join tasks t on t.id = r.task_id
      where d.id = any($1::text[]) and r.state = 'running' and r.started_ms is null order by d.id, x.ord`, [ids]);
    const out = new Map<string, { id: string; executor: string; node: string; releasedShards: number[] | null; runs: Array<RunRow & { payload: unknown; timeoutMs: number }> }>();
    for (const row of r.rows as Row[]) {
      const id = row.d_id as string;
      let m = out.get(id);
      if (!m) { m = { id, executor: row.d_executor as string, node: row.d_node as string, releasedShards: (row.d_released as number[] | null) ?? null, runs: [] }; out.set(id, m); }
      m.runs.push({ ...toRun(row), payload: row.t_payload, timeoutMs: row.t_timeout as number });
    }
    return [...out.values()];
  }

  /** Notes that a recorded message goes out with the runs of these shards only (see replayParts). */
  async markPartialRelease(id: string, shards: number[]): Promise<void> {
    await this.pool.query("update dispatches set released_shards = $2 where id = $1", [id, shards]);
  }

  /** Dispatch message records older than `beforeMs` (past JetStream's duplicate window, no use any more). */
  async pruneDispatches(beforeMs: number): Promise<number> {
    const r = await this.pool.query("delete from dispatches where created_ms < $1", [beforeMs]);
    return r.rowCount ?? 0;
  }

  /** Deletes history older than `beforeMs` in small batches so firing never waits on a long lock. */
  async pruneRuns(beforeMs: number, batch = 5000, maxBatches = 100): Promise<number> {
    let total = 0;
    for (let i = 0; i < maxBatches; i++) {
      const r = await this.pool.query(
        "delete from runs where id in (select id from runs where created_ms < $1 and state <> 'running' limit $2)", [beforeMs, batch]);
      total += r.rowCount ?? 0;
      if ((r.rowCount ?? 0) < batch) break;
    }
    return total;
  }

  // ---- shard actor side: rebuild and fenced batches ----------------------------------------

  async dueOfShard(shard: number): Promise<Array<{ id: number; dueMs: number }>> {
    const r = await this.pool.query("select id, next_due_ms from tasks where shard = $1 and next_due_ms is not null", [shard]);
    return r.rows.map((x) => ({ id: x.id, dueMs: x.next_due_ms }));
  }

  /**
   * Fenced batch write (fencedWrite.ts): writes from one or many shards in one transaction,
   * each under the epoch its actor believes current; the shards whose epoch is not current
   * change nothing and are returned in `stale`.
   */
  writeBatch(writes: ShardWrite[], dispatches: ReadonlyArray<DispatchRecord> = []): Promise<{ stale: number[] }> {
    return this.fenced.write(writes, dispatches);
  }
}

