import { randomBytes } from "node:crypto";
import pg from "pg";
import { AxError, InvalidInputError } from "../../common/index.ts";
import { dropSchema, migrate, quoteIdent } from "./schema.ts";
import { fullRecord, storedRecord } from "./recordCodec.ts";
import { DependencyEdges } from "./edges.ts";
import { AuditTrail } from "./audit.ts";
import { TaskHistory } from "./history.ts";
import { ExecutorInstances } from "./executorInstances.ts";
import { UPDATE_DEFINITIONS, definitionUpdatesJson } from "./definitionUpdate.ts";
import { BrowseReads } from "./browseReads.ts";
import { AlertHooks } from "./alertHooks.ts";
import { LEDGER_UPSERT, ledgerJson } from "./ledgerStore.ts";
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

  async createTask(t: NewTask): Promise<TaskRow> {
    const c = await this.pool.connect();
    try {
      await c.query("begin");
      const ex = await c.query("select 1 from executors where name = $1", [t.executor]);
      if (!ex.rowCount) throw new InvalidInputError("executor", t.executor, "unknown executor (start it first, or see `ax status` for the known ones)", "AX_E_NOT_FOUND");
      if (t.upstreams.length) await this.lockGraph(c);
      const id = Number((await c.query("select nextval(pg_get_serial_sequence('tasks', 'id')) as id")).rows[0].id);
      const shard = t.shardOf(id);
      try {
        await c.query(
          `insert into tasks (name, executor, payload, timeout_ms, max_attempts, backoff_ms, backoff_max_ms, misfire, overlap,
             shard, state, record, next_due_ms, next_slot_ms, next_source, next_reason, created_ms, updated_ms, id, apply_set)
           values ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$17,$18,$19)`,
          [t.name, t.executor, JSON.stringify(t.payload ?? null), t.timeoutMs, t.maxAttempts, t.backoffMs, t.backoffMaxMs, t.misfire,
            t.overlap, shard, t.state, JSON.stringify(storedRecord(t.record)), t.nextDueMs, t.nextSlotMs, t.nextSource, t.nextReason, t.nowMs, id, t.applySet ?? null]);
      } catch (e) {
        if ((e as { code?: string }).code === "23505") throw new InvalidInputError("name", t.name, "a task with this name already exists", "AX_E_CONFLICT");
        throw e;
      }
      let firstTrigger: number | null = null;
      const set: string[] = [];
      for (const tr of t.triggers) {
        const spec = JSON.stringify(tr.spec);
        const r = await c.query("insert into triggers (kind, spec, created_ms) values ($1, $2, $3) returning id", [tr.kind, spec, t.nowMs]);
        const trId = r.rows[0].id as number;
        firstTrigger ??= trId;
        set.push(triggerSetEntry(trId, tr.kind, spec));
        await c.query("insert into task_triggers (task_id, trigger_id) values ($1, $2)", [id, trId]);
      }
      if (set.length) await c.query("update tasks set next_trigger_id = $2, trigger_set = $3 where id = $1", [id, firstTrigger, `[${set.join(",")}]`]);
      for (const up of t.upstreams) await this.insertEdge(c, id, up, t.nowMs);
      await c.query("commit");
    } catch (e) {
      await c.query("rollback").catch(() => undefined);
      throw e;
    } finally { c.release(); }
    const row = await this.getTask(t.name);
    return row!;
  }

  /**
   * Bulk registration: many tasks in one transaction, written with COPY (tasks, triggers,
   * task_triggers) and one unnest insert for dependency edges. Ids (tasks and triggers) are
   * drawn from the sequences up front, so each task's shard (`shardOf(id)`) and first trigger
   * are known before anything is written. All or nothing: an unknown executor or a name that
   * already exists refuses the whole batch, naming the field and value.
   *
   * Upstreams must be existing tasks (the caller resolves them): a new task only gains
   * in-edges, so no edge added here can close a cycle and no cycle check is needed.
   */
  async createTasksBulk(tasks: ReadonlyArray<BulkNewTask>, shardOf: (id: number) => number): Promise<BulkCreated[]> {
    if (!tasks.length) return [];
    const seen = new Set<string>();
    for (const t of tasks) {
      if (seen.has(t.name)) throw new InvalidInputError("name", t.name, "appears twice in the batch", "AX_E_CONFLICT");
      seen.add(t.name);
    }
    const c = await this.pool.connect();
    const out: BulkCreated[] = new Array(tasks.length);
    let analyze = false;
    try {
      await c.query("begin");
      const executors = [...new Set(tasks.map((t) => t.executor))];
      // FOR KEY SHARE: what the foreign key check on tasks.executor would take, for the whole batch at once.
      const known = new Set((await c.query("select name from executors where name = any($1::text[]) for key share", [executors])).rows.map((x) => x.name as string));
      for (const e of executors) if (!known.has(e)) throw new InvalidInputError("executor", e, "unknown executor (start it first, or see `ax status` for the known ones)", "AX_E_NOT_FOUND");
      // The per-row foreign-key checks (executor, and both ends of each task_triggers link) are
      // half of PostgreSQL's cost here and prove nothing new: the executors are locked above as
      // the check would lock them, and the tasks and triggers linked are the ones this very
      // transaction writes. A role allowed to (superuser) skips them for this transaction only,
      // as pg_restore --disable-triggers does; other roles keep them.
      if (await this.canSkipForeignKeyChecks(c)) await c.query("set local session_replication_role = replica");
      const nTriggers = tasks.reduce((n, t) => n + t.triggers.length, 0);
      const st = (await c.query(`select c.reltuples, coalesce(s.n_mod_since_analyze, 0) as mods from pg_class c
        left join pg_stat_user_tables s on s.relid = c.oid where c.oid = 'tasks'::regclass`)).rows[0] as { reltuples: number; mods: number } | undefined;
      analyze = !st || st.reltuples < 0 || Number(st.mods) + tasks.length > st.reltuples;
      const ids = await reserveIds(c, this.schema, "tasks", tasks.length);
      const trIds = nTriggers ? await reserveIds(c, this.schema, "triggers", nTriggers) : [];
      const T = new CopyText(); const TR = new CopyText(); const TT = new CopyText();
      const recordJson = new Map<unknown, string>(); // records are shared per (maxAttempts, overlap): stringify once
      const edges: { d: number[]; u: number[] } = { d: [], u: [] };
      let k = 0;
      for (let i = 0; i < tasks.length; i++) {
        const t = tasks[i]!;
        const id = ids[i]!;
        const shard = shardOf(id);
        let firstTrigger: number | null = null;
        const set: string[] = [];
        for (const tr of t.triggers) {
          const trId = trIds[k++]!;
          firstTrigger ??= trId;
          const spec = JSON.stringify(tr.spec);
          TR.line(`${trId}\t${cp(tr.kind)}\t${cp(spec)}\tt\t${t.nowMs}`);
          TT.line(`${id}\t${trId}`);
          set.push(triggerSetEntry(trId, tr.kind, spec));
        }
        let rec = recordJson.get(t.record);
        if (rec === undefined) { rec = cp(JSON.stringify(storedRecord(t.record))); recordJson.set(t.record, rec); }
        const payload = t.payload === null || t.payload === undefined ? "null" : cp(JSON.stringify(t.payload));
        T.line(`${id}\t${cp(t.name)}\t${cp(t.executor)}\t${payload}\t${t.timeoutMs}\t${t.maxAttempts}\t${t.backoffMs}\t${t.backoffMaxMs}\t${cp(t.misfire)}\t${
          cp(t.overlap)}\t${shard}\t${cp(t.state)}\t${rec}\t{}\t${cp(t.nextDueMs)}\t${cp(t.nextSlotMs)}\t${cp(firstTrigger)}\t${cp(t.nextSource)}\t${
          cp(t.nextReason)}\t\\N\t${t.nowMs}\t${t.nowMs}\t${cp(`[${set.join(",")}]`)}\t${t.upstreams.length ? 1 : 0}`);
        for (const up of t.upstreams) { edges.d.push(id); edges.u.push(up); }
        out[i] = { id, name: t.name, shard, nextDueMs: t.nextDueMs };
      }
      // triggers first, then tasks, then the links (foreign keys are checked per row).
      if (nTriggers) await copyIn(c, "copy triggers (id, kind, spec, enabled, created_ms) from stdin", TR.chunks());
      try {
        await copyIn(c, `copy tasks (id, name, executor, payload, timeout_ms, max_attempts, backoff_ms, backoff_max_ms, misfire, overlap,
          shard, state, record, trigger_slots, next_due_ms, next_slot_ms, next_trigger_id, next_source, next_reason, next_caused_by,
          created_ms, updated_ms, trigger_set, dep_flags) from stdin`, T.chunks());
      } catch (e) {
        const err = e as { code?: string; detail?: string };
        if (err.code === "23505") {
          const m = /\(name\)=\((.*)\) already exists/.exec(err.detail ?? "");
          throw new InvalidInputError("name", m?.[1] ?? null, "a task with this name already exists", "AX_E_CONFLICT");
        }
        throw e;
      }
      if (nTriggers) await copyIn(c, "copy task_triggers (task_id, trigger_id) from stdin", TT.chunks());
      if (edges.d.length) {
        await this.lockGraph(c);
        await c.query(
          `insert into dependencies (downstream, upstream, created_ms) select d, u, $3 from unnest($1::bigint[], $2::bigint[]) x(d, u)
           on conflict do nothing`, [edges.d, edges.u, tasks[0]!.nowMs]);
        await c.query("update tasks set dep_flags = dep_flags | 2 where id = any($1::bigint[]) and dep_flags & 2 = 0", [[...new Set(edges.u)]]);
      }
      await c.query("commit");
      // A table that doubled since its statistics were taken (or never had any) gets them soon:
      // without, the planner guesses hundreds of triggers per task and the shard actors' task
      // fetches turn into sequential scans. Doubling bounds this to a few ANALYZE runs however
      // many tasks are loaded; it runs beside the callers (one at a time), not in their path.
      if (analyze) this.analyzeSoon();
    } catch (e) {
      await c.query("rollback").catch(() => undefined);
      throw e;
    } finally { c.release(); }
    return out;
  }

  private analyzing: Promise<void> | null = null;
  private analyzeAgain = false;
  /** ANALYZE of the task tables in the background; calls while one runs fold into one more run. */
  private analyzeSoon(): void {
    if (this.analyzing) { this.analyzeAgain = true; return; }
    this.analyzing = this.pool.query("analyze tasks; analyze triggers; analyze task_triggers").then(() => undefined, () => undefined).finally(() => {
      this.analyzing = null;
      if (this.analyzeAgain) { this.analyzeAgain = false; this.analyzeSoon(); }
    });
  }
  /** Resolves when no background ANALYZE is running (tests, close). */
  async settled(): Promise<void> { while (this.analyzing) await this.analyzing; }

  private skipFk: boolean | null = null;
  private async canSkipForeignKeyChecks(c: pg.PoolClient): Promise<boolean> {
    if (this.skipFk === null) {
      const r = await c.query("select current_setting('is_superuser') = 'on' as su");
      this.skipFk = r.rows[0].su === true && process.env.AX_BULK_FK_CHECKS !== "1";
    }
    return this.skipFk;
  }

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

  /** Serializes every change to the graph cluster-wide, so two concurrent edges cannot both pass the cycle check. */
  private async lockGraph(c: pg.PoolClient): Promise<void> {
    await c.query("select pg_advisory_xact_lock(hashtext($1))", [`ax-graph:${this.schema}`]);
  }

  private async insertEdge(c: pg.PoolClient, downstream: number, upstream: number, nowMs: number): Promise<void> {
    if (downstream === upstream) throw new AxError("AX_E_CYCLE", "a task cannot depend on itself", { field: "after", value: upstream });
    const r = await c.query("select downstream, upstream from dependencies");
    const edges = r.rows.map((x) => [x.upstream as number, x.downstream as number] as const);
    edges.push([upstream, downstream]);
    const found = findCycle(edges);
    if (found) {
      // Named from the task being changed: "B → … → B" for `deps add B UPSTREAM`.
      const at = found.indexOf(downstream);
      const cycle = at > 0 ? [...found.slice(at, -1), ...found.slice(0, at), downstream] : found;
      const names = await c.query("select id, name from tasks where id = any($1::bigint[])", [cycle]);
      const byId = new Map(names.rows.map((x) => [x.id as number, x.name as string]));
      const path = cycle.map((id) => byId.get(id) ?? String(id));
      throw new AxError("AX_E_CYCLE", `dependency would close a cycle: ${path.join(" → ")}`, { field: "after", value: path });
    }
    await c.query("insert into dependencies (downstream, upstream, created_ms) values ($1, $2, $3) on conflict do nothing", [downstream, upstream, nowMs]);
    // In the edge's transaction: a fetch that sees the edge sees the flags (see migration 6).
    await c.query("update tasks set dep_flags = dep_flags | (case when id = $1 then 1 else 2 end) where id in ($1, $2)", [downstream, upstream]);
  }

  addDependency(downstream: number, upstream: number, nowMs: number): Promise<void> {
    return this.transaction(async (c) => {
      await this.lockGraph(c);
      await this.insertEdge(c, downstream, upstream, nowMs);
    });
  }

  /**
   * Removes an edge and recomputes both ends' dependency flags. Under the graph lock: a
   * recompute racing an edge added at the same time could not see that edge and would clear a
   * flag it needs (its downstream would then never be told of the upstream's outcome).
   */
  removeDependency(downstream: number, upstream: number): Promise<boolean> {
    return this.transaction(async (c) => {
      await this.lockGraph(c);
      const r = await c.query("delete from dependencies where downstream = $1 and upstream = $2", [downstream, upstream]);
      if (!r.rowCount) return false;
      await c.query(`update tasks t set dep_flags = (case when exists (select 1 from dependencies d where d.downstream = t.id) then 1 else 0 end)
        | (case when exists (select 1 from dependencies d where d.upstream = t.id) then 2 else 0 end) where t.id in ($1, $2)`, [downstream, upstream]);
      return true;
    });
  }

  async downstreamsOf(upstream: number): Promise<Array<{ id: number; name: string; shard: number }>> {
    const r = await this.pool.query("select t.id, t.name, t.shard from dependencies d join tasks t on t.id = d.downstream where d.upstream = $1 order by t.id", [upstream]);
    return r.rows.map((x) => ({ id: x.id, name: x.name, shard: x.shard }));
  }

  async allEdges(): Promise<Array<{ upstream: number; downstream: number }>> {
    const r = await this.pool.query("select upstream, downstream from dependencies");
    return r.rows.map((x) => ({ upstream: x.upstream, downstream: x.downstream }));
  }

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
   * Fenced batch write. Inputs: writes from one or many shards, each under the epoch its
   * actor believes current. Guarantee: in one transaction, each shard's `shards` row is locked
   * FOR SHARE and its epoch compared; writes of a shard whose epoch is not current change
   * nothing and the shard is returned in `stale`. Because `claimShard` needs the row lock, a
   * new owner's claim waits for this transaction, and after it no write of the old epoch lands.
   */
  async writeBatch(writes: ShardWrite[], dispatches: ReadonlyArray<DispatchRecord> = []): Promise<{ stale: number[] }> {
    if (!writes.length) return { stale: [] };
    const shards = writes.map((w) => w.shard); const epochs = writes.map((w) => w.epoch);
    // One round trip: the statements are pipelined on one connection, so the writes cannot wait
    // for the fence's answer. Each write statement therefore repeats the fence as a filter
    // (`ok`): rows of a shard whose epoch is not current are not written. The first statement
    // has locked the current shards' rows FOR SHARE, so their epochs cannot change before
    // commit, and a stale epoch never becomes current again.
    const ins = runInsertsJson(writes); const upd = runUpdatesJson(writes); const tasks = taskUpdatesJson(writes); const defs = definitionUpdatesJson(writes);
    const c = await this.writePool.connect();
    const jobs: Array<Promise<unknown>> = [];
    // Corked: the whole transaction leaves in one write (a syscall per statement cost more than
    // the statements at small batch sizes).
    const stream = (c as unknown as { connection?: { stream?: { cork?: () => void; uncork?: () => void } } }).connection?.stream;
    stream?.cork?.();
    try {
      jobs.push(c.query("begin"));
      const fence = c.query({ name: "ax_fence", text: `select s.shard from shards s join unnest($1::int[], $2::bigint[]) f(shard, epoch)
        on s.shard = f.shard and s.epoch = f.epoch for share of s`, values: [shards, epochs] });
      jobs.push(fence);
      if (ins) jobs.push(c.query({ name: "ax_insert_runs", text: INSERT_RUNS, values: [ins, shards, epochs] }));
      if (upd) jobs.push(c.query({ name: "ax_update_runs", text: UPDATE_RUNS, values: [upd, shards, epochs] }));
      if (defs) jobs.push(c.query({ name: "ax_update_definitions", text: UPDATE_DEFINITIONS, values: [defs, shards, epochs, Date.now()] }));
      if (tasks) jobs.push(c.query({ name: "ax_update_tasks", text: UPDATE_TASKS, values: [tasks, shards, epochs, Date.now()] }));
      const ledger = ledgerJson(writes);
      if (ledger) jobs.push(c.query({ name: "ax_ledger", text: LEDGER_UPSERT, values: [ledger, shards, epochs] }));
      // Not fenced: a message row names runs; only the runs that were written are ever re-published.
      if (dispatches.length) jobs.push(c.query({ name: "ax_insert_dispatches", text: INSERT_DISPATCHES, values: [JSON.stringify(dispatches)] }));
      jobs.push(c.query("commit"));
      stream?.uncork?.();
      const settled = await Promise.allSettled(jobs);
      const failed = settled.find((x): x is PromiseRejectedResult => x.status === "rejected");
      // After a failed statement the server ignores the rest and answers "commit" with a rollback.
      if (failed) throw failed.reason;
      const ok = new Set((await fence).rows.map((x) => x.shard as number));
      return { stale: writes.filter((w) => !ok.has(w.shard)).map((w) => w.shard) };
    } catch (e) {
      stream?.uncork?.();
      await c.query("rollback").catch(() => undefined);
      throw e;
    } finally { c.release(); }
  }
}

/** The fence as a filter: `ok` = shards of this batch whose epoch is the current one. */
const FENCE_CTE = "with ok as (select s.shard from shards s join unnest($2::int[], $3::bigint[]) f(shard, epoch) on s.shard = f.shard and s.epoch = f.epoch)";

// Rows travel as one JSON array per statement (json_to_recordset): one native JSON.stringify
// instead of twenty escaped array parameters, and jsonb columns arrive as JSON values. Each row
// object is built once, straight from the shard's write, in the recordset's column order.

const INSERT_RUNS = `${FENCE_CTE}
  insert into runs (id, task_id, task_name, trigger_id, source, due_ms, slot_ms, due_reason, fired_ms, node, shard, epoch, attempt,
    executor, state, error, caused_by, upstream_runs, finished_ms, created_ms, dispatch_id)
  select u.id, u.task_id, u.task_name, u.trigger_id, u.source, u.due_ms, u.slot_ms, u.due_reason, u.fired_ms, u.node, u.shard, u.epoch,
    u.attempt, u.executor, u.state, u.error, u.caused_by, u.upstream_runs, u.finished_ms, u.created_ms, u.dispatch_id
  from json_to_recordset($1::json) as u(id text, task_id bigint, task_name text, trigger_id bigint, source text, due_ms bigint, slot_ms bigint,
    due_reason text, fired_ms bigint, node text, shard int, epoch bigint, attempt int, executor text, state text, error text, caused_by text,
    upstream_runs jsonb, finished_ms bigint, created_ms bigint, dispatch_id text)
  where u.shard in (select shard from ok)
  on conflict (id) do nothing`;

function runInsertsJson(writes: ShardWrite[]): string | null {
  const data: unknown[] = [];
  for (const w of writes) {
    for (const r of w.runInserts) {
      data.push({
        id: r.id, task_id: r.taskId, task_name: r.taskName, trigger_id: r.triggerId, source: r.source, due_ms: r.dueMs, slot_ms: r.slotMs,
        due_reason: r.dueReason, fired_ms: r.firedMs, node: r.node, shard: r.shard, epoch: r.epoch, attempt: r.attempt, executor: r.executor,
        state: r.state, error: r.error, caused_by: r.causedBy, upstream_runs: r.upstreamRuns, finished_ms: r.finishedMs ?? null, created_ms: r.createdMs,
        dispatch_id: r.dispatchId ?? null,
      });
    }
  }
  return data.length ? JSON.stringify(data) : null;
}

const INSERT_DISPATCHES = `insert into dispatches (id, executor, node, run_ids, created_ms)
  select u.id, u.executor, u.node, array(select json_array_elements_text(u."runIds")), u."createdMs"
  from json_to_recordset($1::json) as u(id text, executor text, node text, "runIds" json, "createdMs" bigint)
  on conflict (id) do nothing`;

const UPDATE_RUNS = `${FENCE_CTE}
  update runs r set state = coalesce(u.state, r.state), started_ms = coalesce(r.started_ms, u.started_ms),
    finished_ms = coalesce(u.finished_ms, r.finished_ms), executor_instance = coalesce(u.instance, r.executor_instance),
    error = coalesce(u.error, r.error),
    -- A run that has its own outcome keeps it: a completion seen again (redelivered, or re-published
    -- after a NATS restart to a shard loaded afresh) is not a late one.
    late_outcome = case when r.state in ('success', 'failed') then r.late_outcome else coalesce(u.late, r.late_outcome) end,
    result = coalesce(u.result, r.result)
  from json_to_recordset($1::json) as u(id text, shard int, state text, started_ms bigint, finished_ms bigint, instance text, error text, late text, result jsonb)
  where r.id = u.id and r.shard = u.shard and u.shard in (select shard from ok)`;

interface RunUpdateRow { id: string; shard: number; state: string | null; started_ms: number | null; finished_ms: number | null; instance: string | null; error: string | null; late: string | null; result?: unknown }

function runUpdatesJson(writes: ShardWrite[]): string | null {
  // Several updates of one run may arrive in one batch (a started event, then the end): folded
  // into one row, a later value winning over an earlier one.
  const folded = new Map<string, RunUpdateRow>();
  for (const w of writes) {
    for (const u of w.runUpdates) {
      const prev = folded.get(u.id);
      if (!prev) {
        folded.set(u.id, { id: u.id, shard: w.shard, state: u.state ?? null, started_ms: u.startedMs ?? null, finished_ms: u.finishedMs ?? null,
          instance: u.executorInstance ?? null, error: u.error ?? null, late: u.lateOutcome ?? null, ...(u.result !== undefined ? { result: u.result } : {}) });
        continue;
      }
      if (u.state !== undefined) prev.state = u.state;
      if (u.startedMs !== undefined) prev.started_ms = u.startedMs;
      if (u.finishedMs !== undefined) prev.finished_ms = u.finishedMs;
      if (u.executorInstance !== undefined) prev.instance = u.executorInstance;
      if (u.error !== undefined) prev.error = u.error;
      if (u.lateOutcome !== undefined) prev.late = u.lateOutcome;
      if (u.result !== undefined) prev.result = u.result;
    }
  }
  return folded.size ? JSON.stringify([...folded.values()]) : null;
}

const UPDATE_TASKS = `${FENCE_CTE}
  update tasks t set state = u.state, record = u.record, trigger_slots = u.slots, next_due_ms = u.due, next_slot_ms = u.slot,
    next_trigger_id = u.trig, next_source = u.source, next_reason = u.reason, next_caused_by = u.caused, updated_ms = $4
  from json_to_recordset($1::json) as u(id bigint, shard int, state text, record jsonb, slots jsonb, due bigint, slot bigint, trig bigint,
    source text, reason text, caused text)
  where t.id = u.id and u.shard in (select shard from ok)`;

function taskUpdatesJson(writes: ShardWrite[]): string | null {
  // The last decision of a batch wins: the machine already folded the history.
  const folded = new Map<number, unknown>();
  for (const w of writes) {
    for (const u of w.taskUpdates) {
      folded.set(u.id, { id: u.id, shard: w.shard, state: u.state, record: storedRecord(u.record), slots: u.triggerSlots, due: u.nextDueMs, slot: u.nextSlotMs,
        trig: u.nextTriggerId, source: u.nextSource, reason: u.nextReason, caused: u.nextCausedBy });
    }
  }
  return folded.size ? JSON.stringify([...folded.values()]) : null;
}

/**
 * One element of `tasks.trigger_set` (migration 5), in the shape the fetch returns as a TriggerRow.
 * `specJson` is the spec already serialized for the triggers row; kind is one of four fixed words.
 */
function triggerSetEntry(id: number, kind: TriggerRow["kind"], specJson: string): string {
  return `{"id":${id},"kind":"${kind}","spec":${specJson},"enabled":true}`;
}

/** The id sequence of each table, resolved once per schema (tables never change sequence). */
const sequenceOf = new Map<string, string>();

/** `n` fresh ids from the table's id sequence (one round trip; returned as one comma-separated text, cheap to read). */
async function reserveIds(c: pg.PoolClient, schema: string, table: string, n: number): Promise<number[]> {
  const key = `${schema}.${table}`;
  let seq = sequenceOf.get(key);
  if (seq === undefined) {
    seq = String((await c.query("select pg_get_serial_sequence($1, 'id') as s", [table])).rows[0].s);
    sequenceOf.set(key, seq);
  }
  // nextval of a constant regclass: resolving the sequence per row cost 2-7 µs an id, this 0.5.
  const r = await c.query({
    text: `select string_agg(nextval('${seq.replace(/'/g, "''")}'::regclass)::text, ',') as ids from generate_series(1, $1::int)`,
    values: [n], rowMode: "array",
  });
  const text = String((r.rows[0] as unknown[])[0]);
  const out: number[] = new Array(n);
  let k = 0; let v = 0;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (ch === 44) { out[k++] = v; v = 0; } else v = v * 10 + (ch - 48);
  }
  out[k++] = v;
  if (k !== n) throw new AxError("AX_E_INTERNAL", `reserved ${k} ids of ${table}, wanted ${n}`);
  return out;
}

/** A value for one column of a COPY text row: `\N` for null, backslash escapes. */
function cp(v: string | number | null | undefined): string {
  if (v === null || v === undefined) return "\\N";
  if (typeof v === "number") return String(v);
  return COPY_SPECIAL.test(v) ? v.replace(COPY_SPECIAL_G, escapeCopyChar) : v;
}

/** Rows in PostgreSQL's COPY text format, collected into chunks of about 256 KB. */
class CopyText {
  private parts: string[] = [];
  private done: string[] = [];
  private size = 0;
  /** One row, already formatted (tab-separated values from `cp`, no newline). */
  line(text: string): void {
    this.parts.push(text);
    this.size += text.length + 1;
    if (this.size >= 262_144) this.flush();
  }
  private flush(): void {
    if (this.parts.length) { this.parts.push(""); this.done.push(this.parts.join("\n")); }
    this.parts = []; this.size = 0;
  }
  chunks(): string[] { this.flush(); return this.done; }
}
const COPY_SPECIAL = /[\\\n\r\t]/;
const COPY_SPECIAL_G = /[\\\n\r\t]/g;
const escapeCopyChar = (ch: string): string => (ch === "\\" ? "\\\\" : ch === "\n" ? "\\n" : ch === "\r" ? "\\r" : "\\t");

/**
 * `COPY … FROM STDIN` on a pg client without an extra dependency: a submittable query that
 * answers the server's CopyInResponse with the data and resolves on ReadyForQuery.
 */
function copyIn(c: pg.PoolClient, sql: string, chunks: string[]): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    let settled = false;
    let rows = 0;
    const q = {
      callback: undefined as unknown,
      submit(con: { query(text: string): void }) { con.query(sql); },
      handleCopyInResponse(con: { sendCopyFromChunk(b: Buffer): void; endCopyFrom(): void }) {
        for (const ch of chunks) con.sendCopyFromChunk(Buffer.from(ch, "utf8"));
        con.endCopyFrom();
      },
      handleCommandComplete(msg: { text?: string }) { rows = Number(/(\d+)$/.exec(msg.text ?? "")?.[1] ?? 0); },
      // pg drops the active query on an error (no ReadyForQuery reaches it): settle here.
      handleError(e: unknown) { if (!settled) { settled = true; reject(e); } },
      handleReadyForQuery() { if (!settled) { settled = true; resolve(rows); } },
      handleRowDescription() { /* none for COPY FROM */ },
      handleDataRow() { /* none */ },
      handleEmptyQuery() { /* none */ },
      handlePortalSuspended() { /* none */ },
      handleCopyData() { /* only for COPY TO */ },
    };
    (c as unknown as { query(q: unknown): void }).query(q);
  });
}

/**
 * Kahn's topological sort over edges [upstream, downstream]; when nodes remain, walks the
 * remaining subgraph to name one cycle as a closed path (A, B, C, A).
 */
export function findCycle(edges: ReadonlyArray<readonly [number, number]>): number[] | null {
  const out = new Map<number, number[]>();
  const indeg = new Map<number, number>();
  for (const [a, b] of edges) {
    if (!out.has(a)) out.set(a, []);
    if (!out.has(b)) out.set(b, []);
    out.get(a)!.push(b);
    indeg.set(b, (indeg.get(b) ?? 0) + 1);
    if (!indeg.has(a)) indeg.set(a, 0);
  }
  const queue = [...indeg].filter(([, d]) => d === 0).map(([n]) => n);
  while (queue.length) {
    const n = queue.pop()!;
    for (const m of out.get(n)!) {
      const d = indeg.get(m)! - 1;
      indeg.set(m, d);
      if (d === 0) queue.push(m);
    }
  }
  const left = new Set([...indeg].filter(([, d]) => d > 0).map(([n]) => n));
  if (!left.size) return null;
  // Every remaining node has an in-edge from a remaining node; follow successors until one repeats.
  const start = left.values().next().value as number;
  const path: number[] = [start];
  const seen = new Map<number, number>([[start, 0]]);
  let cur = start;
  for (;;) {
    const next = out.get(cur)!.find((m) => left.has(m) && canReach(out, left, m, cur));
    if (next === undefined) return null;
    if (seen.has(next)) return [...path.slice(seen.get(next)!), next];
    seen.set(next, path.length);
    path.push(next);
    cur = next;
  }
}

function canReach(out: Map<number, number[]>, within: Set<number>, from: number, to: number): boolean {
  const stack = [from]; const seen = new Set<number>();
  while (stack.length) {
    const n = stack.pop()!;
    if (n === to) return true;
    if (seen.has(n)) continue;
    seen.add(n);
    for (const m of out.get(n) ?? []) if (within.has(m)) stack.push(m);
  }
  return false;
}
