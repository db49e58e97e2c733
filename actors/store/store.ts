import pg from "pg";
import { dropSchema, migrate, quoteIdent } from "./schema.ts";
import { DependencyEdges } from "./edges.ts";
import { AuditTrail } from "./audit.ts";
import { TaskHistory } from "./history.ts";
import { ExecutorInstances } from "./executorInstances.ts";
import { BrowseReads } from "./browseReads.ts";
import { FencedWriter } from "./fencedWrite.ts";
import { DependencyGraph } from "./graph.ts";
import { TaskRegistration } from "./taskRegistration.ts";
import { AlertHooks } from "./alertHooks.ts";
import { ClusterMeta, type ExecutorRow } from "./clusterMeta.ts";
import { TaskReads } from "./taskReads.ts";
import { RunReads } from "./runReads.ts";
import type { BulkCreated, BulkNewTask, DispatchRecord, NewTask, RunRow, ShardRow, ShardWrite, TaskRow } from "./types.ts";

// bigint (int8) columns hold ids and epoch milliseconds, all well below 2^53.
pg.types.setTypeParser(20, (v: string) => Number(v));

export interface StoreOptions { pgUrl: string; schema: string; poolSize?: number }

/**
 * A PostgreSQL behind a network partition answers nothing (no reset): without these a query or
 * a connect waited forever, and so did the round or start that made it. The query bound is far
 * above any query ax makes (a batch write takes milliseconds, a migration seconds); it only ends
 * a wait for a server that is gone. TCP keep-alive finds dead connections in the pool.
 */
const PARTITION_TIMEOUTS = { connectionTimeoutMillis: 10_000, query_timeout: 60_000, keepAlive: true, keepAliveInitialDelayMillis: 10_000 };

/**
 * The server's side of a partition: a node cut off (or frozen) inside a transaction leaves its
 * backend waiting for the next statement while holding that transaction's row locks, and
 * PostgreSQL notices the lost client only when TCP does (hours, by default). The shard's next
 * owner then waited on those locks (the `shards` row its fence shares, task rows) until the
 * partition healed. ax never waits inside a transaction for anything but PostgreSQL's answers,
 * so a transaction idle this long has lost its client: PostgreSQL ends it and its locks go.
 * Below the default lease TTL (6 s), so a frozen node's locks are gone before its shards move,
 * and about when the PostgreSQL probe gives a cut-off node's shards up (two 2 s probes).
 */
export const IDLE_IN_TRANSACTION_MS = 5_000;

/**
 * PostgreSQL access for one namespace: the connections, and one module per concern behind one
 * facade. PostgreSQL is the truth; every write a shard actor makes goes through `writeBatch`
 * (fencedWrite.ts), fenced by the shard's epoch. Task registration (taskRegistration.ts), the
 * dependency graph (graph.ts, edges.ts), task reads (taskReads.ts), runs and dispatch records
 * (runReads.ts), the cluster's own rows (clusterMeta.ts), listings (browseReads.ts), the audit
 * trail, definition history, executor instances and alert hooks each hold their own SQL.
 */
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
  private readonly meta: ClusterMeta;
  private readonly tasks: TaskReads;
  private readonly runs: RunReads;
  constructor(opts: StoreOptions) {
    this.schema = opts.schema;
    this.pool = new pg.Pool({
      connectionString: opts.pgUrl,
      max: opts.poolSize ?? 8,
      options: `-c search_path=${quoteIdent(opts.schema)} -c idle_in_transaction_session_timeout=${IDLE_IN_TRANSACTION_MS}`,
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
      options: `-c search_path=${quoteIdent(opts.schema)} -c idle_in_transaction_session_timeout=${IDLE_IN_TRANSACTION_MS} -c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off`,
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
    this.meta = new ClusterMeta(this.pool, this.schema, (fn) => this.transaction(fn));
    this.tasks = new TaskReads(this.pool);
    this.runs = new RunReads(this.pool);
    this.registration = new TaskRegistration(this.pool, this.schema, this.graph, (name) => this.getTask(name), (fn) => this.transaction(fn));
  }

  async migrate(): Promise<{ applied: number[] }> { return migrate(this.pool, this.schema); }
  async dropNamespace(): Promise<void> { await dropSchema(this.pool, this.schema); }
  async close(): Promise<void> { await this.settled(); await Promise.all([this.pool.end(), this.writePool.end()]); }

  // ---- connections ---------------------------------------------------------------------------

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

  /** Answers when PostgreSQL does (the health probe). */
  async ping(): Promise<void> { await this.pool.query("select 1"); }

  // ---- task registration (taskRegistration.ts) -----------------------------------------------

  /** One task, its triggers and its upstream edges, in one transaction (taskRegistration.ts). */
  createTask(t: NewTask): Promise<TaskRow> { return this.registration.create(t); }
  /** Many tasks in one transaction, written with COPY; all or nothing (taskRegistration.ts). */
  createTasksBulk(tasks: ReadonlyArray<BulkNewTask>, shardOf: (id: number) => number): Promise<BulkCreated[]> { return this.registration.bulk(tasks, shardOf); }
  /** Resolves when no background ANALYZE is running (tests, close). */
  settled(): Promise<void> { return this.registration.settled(); }

  // ---- dependencies -------------------------------------------------------------------------

  addDependency(downstream: number, upstream: number, nowMs: number): Promise<void> { return this.graph.add(downstream, upstream, nowMs); }
  removeDependency(downstream: number, upstream: number): Promise<boolean> { return this.graph.remove(downstream, upstream); }
  downstreamsOf(upstream: number): Promise<Array<{ id: number; name: string; shard: number }>> { return this.graph.downstreamsOf(upstream); }
  allEdges(): Promise<Array<{ upstream: number; downstream: number }>> { return this.graph.allEdges(); }

  // ---- reads and small writes, one module per concern (the facade the rest of ax calls) -----

  // cluster metadata and executors (clusterMeta.ts)
  /** The shard count is fixed when the cluster is created; later nodes read it back. */
  initShardCount(requested: number): Promise<number> { return this.meta.initShardCount(requested); }
  /** The cluster's dispatch secret (see runToken): made once, when the first node starts; 32 random bytes. */
  dispatchSecret(): Promise<Buffer> { return this.meta.dispatchSecret(); }
  /** Marks a node drained (it owns no shard while drained) or not; returns the drained set. */
  setDrained(node: string, drained: boolean): Promise<string[]> { return this.meta.setDrained(node, drained); }
  /** Those of these executors that are HTTP bridges (kind http). */
  httpExecutorsAmong(names: string[]): Promise<Set<string>> { return this.meta.httpExecutorsAmong(names); }
  executorExists(name: string): Promise<boolean> { return this.meta.executorExists(name); }
  /** The nodes marked drained (`ax node drain`). */
  drainedNodes(): Promise<string[]> { return this.meta.drainedNodes(); }
  listShards(): Promise<ShardRow[]> { return this.meta.listShards(); }
  claimShard(shard: number, owner: string, epoch: number, nowMs: number): Promise<boolean> { return this.meta.claimShard(shard, owner, epoch, nowMs); }
  setPin(shard: number, node: string | null): Promise<void> { return this.meta.setPin(shard, node); }
  upsertExecutor(name: string, kind: "nats" | "http", maxInFlight: number | null, nowMs: number, holds = false): Promise<void> { return this.meta.upsertExecutor(name, kind, maxInFlight, nowMs, holds); }
  listExecutors(): Promise<ExecutorRow[]> { return this.meta.listExecutors(); }

  // tasks outside the fenced write (taskReads.ts)
  /** The generation of each of these tasks that still exists. */
  taskGenerations(ids: number[]): Promise<Map<number, number>> { return this.tasks.taskGenerations(ids); }
  /** A trigger row not yet linked to a task (an update links it in its shard's fenced round). */
  insertTrigger(kind: string, spec: unknown, nowMs: number): Promise<number> { return this.tasks.insertTrigger(kind, spec, nowMs); }
  /** Deletes those of these trigger rows that no task links (an update that was refused). */
  deleteUnlinkedTriggers(ids: number[]): Promise<void> { return this.tasks.deleteUnlinkedTriggers(ids); }
  /** Hands a task to an apply set (`ax apply --adopt`). */
  setApplySet(taskId: number, set: string | null): Promise<void> { return this.tasks.setApplySet(taskId, set); }
  /** Ids of the tasks of an apply set (all tasks when `set` is null), oldest first. */
  taskIdsOfSet(set: string | null): Promise<number[]> { return this.tasks.taskIdsOfSet(set); }
  /** The tasks of an apply set whose names are not in `keep` (what `ax apply --prune` removes). */
  tasksOfSetExcept(set: string, keep: string[]): Promise<Array<{ id: number; name: string }>> { return this.tasks.tasksOfSetExcept(set, keep); }
  taskNamesByIds(ids: number[]): Promise<Map<number, string>> { return this.tasks.taskNamesByIds(ids); }
  /** Tasks in all, and how many have a run in flight. */
  taskCounts(): Promise<{ tasks: number; running: number }> { return this.tasks.taskCounts(); }
  /** Per shard, the oldest due time of a task that came due before `beforeMs` and has not moved on (a shard that is behind). */
  oldestOverdueByShard(beforeMs: number): Promise<Map<number, number>> { return this.tasks.oldestOverdueByShard(beforeMs); }
  /** Ids of the tasks with these names (names not found are absent). */
  taskIdsByName(names: string[]): Promise<Map<string, number>> { return this.tasks.taskIdsByName(names); }
  /** By numeric id or by name. */
  getTask(ref: string | number): Promise<TaskRow | null> { return this.tasks.getTask(ref); }
  requireTask(ref: string | number): Promise<TaskRow> { return this.tasks.requireTask(ref); }
  /** `state`, `executor`: equal; `namePrefix`: the name starts with it (operator filters of `ax task ls`). */
  listTasks(opts: { limit?: number; shard?: number; afterId?: number; state?: string; executor?: string; namePrefix?: string } = {}): Promise<TaskRow[]> { return this.tasks.listTasks(opts); }
  fetchTasks(shard: number, ids: number[]): Promise<TaskRow[]> { return this.tasks.fetchTasks(shard, ids); }
  deleteTask(id: number): Promise<void> { return this.tasks.deleteTask(id); }
  countTasksByShard(): Promise<Map<number, { tasks: number; dueSoon: number }>> { return this.tasks.countTasksByShard(); }
  dueOfShard(shard: number): Promise<Array<{ id: number; dueMs: number }>> { return this.tasks.dueOfShard(shard); }

  // runs and dispatch records (runReads.ts)
  /** State, error, executor and task of these runs (those still kept). */
  runStates(ids: string[]): Promise<Map<string, { id: string; state: string; error: string | null; executor: string; taskId: number }>> { return this.runs.runStates(ids); }
  /** For each of these runs, the first run it caused (its retry), if any. */
  firstCausedBy(taskIds: number[], runIds: string[]): Promise<Map<string, string>> { return this.runs.firstCausedBy(taskIds, runIds); }
  /** The retry that replaced this run, if one was fired. */
  retryOf(taskId: number, runId: string): Promise<string | null> { return this.runs.retryOf(taskId, runId); }
  /** `states`: only runs in one of these; `sinceMs`: only runs created at or after it (`ax runs --outcome --since`). */
  listRuns(taskId: number, limit: number, f: { states?: string[]; sinceMs?: number } = {}): Promise<RunRow[]> { return this.runs.listRuns(taskId, limit, f); }
  getRun(id: string): Promise<RunRow | null> { return this.runs.getRun(id); }
  getRuns(ids: string[]): Promise<RunRow[]> { return this.runs.getRuns(ids); }
  runningRuns(shard: number): Promise<RunRow[]> { return this.runs.runningRuns(shard); }
  /** Runs `running` whose fire the task row does not show yet (see RunReads.firesNotOnTaskRow). */
  firesNotOnTaskRow(shard: number, dueByMs: number): Promise<RunRow[]> { return this.runs.firesNotOnTaskRow(shard, dueByMs); }
  lastRunOf(taskId: number): Promise<RunRow | null> { return this.runs.lastRunOf(taskId); }
  dispatchReplay(ids: string[]): Promise<Array<{ id: string; executor: string; node: string; releasedShards: number[] | null; runs: Array<RunRow & { payload: unknown; timeoutMs: number }> }>> { return this.runs.dispatchReplay(ids); }
  /** Notes that a recorded message goes out with the runs of these shards only (see replayParts). */
  markPartialRelease(id: string, shards: number[]): Promise<void> { return this.runs.markPartialRelease(id, shards); }
  /** Dispatch message records older than `beforeMs` (past JetStream's duplicate window, no use any more). */
  pruneDispatches(beforeMs: number): Promise<number> { return this.runs.pruneDispatches(beforeMs); }
  /** Deletes history older than `beforeMs` in small batches so firing never waits on a long lock. */
  pruneRuns(beforeMs: number, batch = 5000, maxBatches = 100): Promise<number> { return this.runs.pruneRuns(beforeMs, batch, maxBatches); }

  /**
   * Fenced batch write (fencedWrite.ts): writes from one or many shards in one transaction,
   * each under the epoch its actor believes current; the shards whose epoch is not current
   * change nothing and are returned in `stale`.
   */
  writeBatch(writes: ShardWrite[], dispatches: ReadonlyArray<DispatchRecord> = []): Promise<{ stale: number[] }> {
    return this.fenced.write(writes, dispatches);
  }
}

