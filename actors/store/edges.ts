import type pg from "pg";

/** One upstream edge of a downstream task, as the dependency actor reasons about it. */
export interface Edge {
  upstream: number; name: string; createdMs: number;
  satisfiedRun: string | null; satisfiedMs: number | null;
  seenRun: string | null; seenMs: number | null;
  triggerKey: string | null; triggerMs: number | null;
}
export interface Downstream { id: number; name: string; shard: number }

/** The newest chain-ending run of an upstream that some edge has not seen (see lostOutcomes). */
export interface LostOutcome { taskId: number; runId: string; state: string; error: string | null; createdMs: number; finishedMs: number | null }

/**
 * The newest chain-ending run of each upstream (success, or failure for good) that an edge has
 * not seen although it was created after the edge: its outcome message was never published (the
 * node died between recording the run and publishing).
 */
const LOST_OUTCOMES_SQL = `
select x.task_id, x.id, x.state, x.error, x.created_ms, x.finished_ms
from (select distinct upstream from dependencies) u
join tasks t on t.id = u.upstream
cross join lateral (
  select r.task_id, r.id, r.state, r.attempt, r.error, r.created_ms, r.finished_ms from runs r
  where r.task_id = u.upstream and r.state <> 'skipped' order by r.created_ms desc limit 1) x
where (x.state = 'success' or (x.state in ('failed', 'timed_out')
        and (x.attempt >= t.max_attempts or (t.state = 'failed' and t.record->>'r' = x.id))))
  and exists (select 1 from dependencies d where d.upstream = u.upstream and d.seen_run is distinct from x.id
        and (d.seen_ms is null or d.seen_ms <= x.created_ms) and d.created_ms <= x.created_ms)`;

/**
 * Reads and writes of one downstream's edges inside one transaction (see DependencyEdges.transaction):
 * the edge rows are locked first (lockEdges), so every writer of a downstream is serialised.
 */
export class EdgeTransaction {
  constructor(private readonly c: pg.PoolClient) {}

  /** D's edges, locked in upstream order (every writer locks them the same way: no deadlock). */
  async lockEdges(downstream: number): Promise<Edge[]> {
    const r = await this.c.query(
      `select d.upstream, t.name, d.created_ms, d.satisfied_run, d.satisfied_ms, d.seen_run, d.seen_ms, d.trigger_key, d.trigger_ms
       from dependencies d join tasks t on t.id = d.upstream where d.downstream = $1 order by d.upstream for update of d`, [downstream]);
    return r.rows.map((x) => ({
      upstream: x.upstream, name: x.name, createdMs: x.created_ms, satisfiedRun: x.satisfied_run, satisfiedMs: x.satisfied_ms,
      seenRun: x.seen_run, seenMs: x.seen_ms, triggerKey: x.trigger_key, triggerMs: x.trigger_ms,
    }));
  }

  /** Writes the edge's last seen outcome and its satisfaction (as the caller set them on `e`). */
  async saveSeen(downstream: number, e: Edge): Promise<void> {
    await this.c.query("update dependencies set seen_run = $3, seen_ms = $4, satisfied_run = $5, satisfied_ms = $6 where downstream = $1 and upstream = $2",
      [downstream, e.upstream, e.seenRun, e.seenMs, e.satisfiedRun, e.satisfiedMs]);
  }

  async runExists(runId: string): Promise<boolean> {
    return ((await this.c.query("select 1 from runs where id = $1", [runId])).rowCount ?? 0) > 0;
  }

  async taskState(taskId: number): Promise<string | undefined> {
    return (await this.c.query("select state from tasks where id = $1", [taskId])).rows[0]?.state as string | undefined;
  }

  /** When the task's newest run that really fired (not skipped or refused) fired, if any. */
  async lastFiredMs(taskId: number): Promise<number | undefined> {
    const r = await this.c.query(
      "select fired_ms from runs where task_id = $1 and state not in ('skipped', 'refused') and fired_ms is not null order by created_ms desc limit 1",
      [taskId]);
    return r.rows[0]?.fired_ms as number | undefined;
  }

  async clearSatisfied(downstream: number, upstreams: number[]): Promise<void> {
    await this.c.query("update dependencies set satisfied_run = null, satisfied_ms = null where downstream = $1 and upstream = any($2::bigint[])",
      [downstream, upstreams]);
  }

  /** Every edge of D: satisfactions consumed by the trigger `key`, which is now outstanding. */
  async consumeInto(downstream: number, key: string, atMs: number): Promise<void> {
    await this.c.query("update dependencies set satisfied_run = null, satisfied_ms = null, trigger_key = $2, trigger_ms = $3 where downstream = $1", [downstream, key, atMs]);
  }
}

/** The dependency graph's state in PostgreSQL, as the dependency actor uses it. */
export class DependencyEdges {
  constructor(
    private readonly pool: pg.Pool,
    private readonly schema: string,
    private readonly tx: <T>(fn: (c: pg.PoolClient) => Promise<T>) => Promise<T>,
  ) {}

  transaction<T>(fn: (t: EdgeTransaction) => Promise<T>): Promise<T> {
    return this.tx((c) => fn(new EdgeTransaction(c)));
  }

  /** What applying an outcome of `taskId`'s run needs: the upstream's name, when the run was created, its downstreams. */
  async outcomeContext(taskId: number, runId: string): Promise<{ upstreamName: string | undefined; runCreatedMs: number | undefined; downstreams: Downstream[] }> {
    const [up, run, downs] = await Promise.all([
      this.pool.query("select name from tasks where id = $1", [taskId]),
      this.pool.query("select created_ms from runs where id = $1", [runId]),
      this.pool.query("select t.id, t.name, t.shard from dependencies d join tasks t on t.id = d.downstream where d.upstream = $1 order by t.id", [taskId]),
    ]);
    return { upstreamName: up.rows[0]?.name as string | undefined, runCreatedMs: run.rows[0]?.created_ms as number | undefined, downstreams: downs.rows as Downstream[] };
  }

  /**
   * Runs `fn` while holding the namespace's reconcile lock (a session advisory lock: one node at
   * a time); false, without running it, when another node holds it.
   */
  async whileReconcileLocked(fn: () => Promise<void>): Promise<boolean> {
    const lockKey = `ax-deps-reconcile:${this.schema}`;
    const c = await this.pool.connect();
    try {
      if (!(await c.query("select pg_try_advisory_lock(hashtext($1)) as ok", [lockKey])).rows[0].ok) return false;
      try {
        await fn();
        return true;
      } finally {
        await c.query("select pg_advisory_unlock(hashtext($1))", [lockKey]).catch(() => undefined);
      }
    } finally { c.release(); }
  }

  async lostOutcomes(): Promise<LostOutcome[]> {
    const r = await this.pool.query(LOST_OUTCOMES_SQL);
    return r.rows.map((x) => ({ taskId: x.task_id, runId: x.id, state: x.state, error: x.error ?? null, createdMs: x.created_ms, finishedMs: x.finished_ms ?? null }));
  }

  /** Downstreams whose every edge is satisfied (a trigger may be due, or was lost). */
  async readyDownstreams(): Promise<Downstream[]> {
    const r = await this.pool.query(
      `select t.id, t.name, t.shard from tasks t where t.id in
         (select downstream from dependencies group by downstream having bool_and(satisfied_run is not null)) order by t.id`);
    return r.rows as Downstream[];
  }
}
