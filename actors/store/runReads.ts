import type pg from "pg";
import type { RunRow } from "./types.ts";

type Row = Record<string, unknown>;

export function toRun(r: Row): RunRow {
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

/** Runs and the dispatch messages that carried them: reads, and the pruning of old ones. */
export class RunReads {
  constructor(private readonly pool: pg.Pool) {}

  /** State, error, executor and task of these runs (those still kept). */
  async runStates(ids: string[]): Promise<Map<string, { id: string; state: string; error: string | null; executor: string; taskId: number }>> {
    const r = await this.pool.query("select id, state, error, executor, task_id from runs where id = any($1::text[])", [ids]);
    return new Map(r.rows.map((x) => [x.id as string, { id: x.id, state: x.state, error: x.error ?? null, executor: x.executor, taskId: Number(x.task_id) }]));
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
  /**
   * Runs whose fire the task row does not show (a fire may leave the row to the task's next write,
   * see ShardDecisions.fire): for each task of `shard` with nothing in flight and a pointer due by
   * `dueByMs`, a `running` run among its latest 8 due at that pointer. Read when a shard is loaded,
   * beside runningRuns; the tasks are read through tasks_shard and their runs through
   * runs_task_created (a few index entries a task, however long its history).
   */
  async firesNotOnTaskRow(shard: number, dueByMs: number): Promise<RunRow[]> {
    const r = await this.pool.query(`select r.* from tasks t
      cross join lateral (select * from runs x where x.task_id = t.id order by x.created_ms desc limit 8) r
      where t.shard = $1 and t.next_due_ms <= $2 and not coalesce(t.record ? 'f', false)
        and r.state = 'running' and r.due_ms = t.next_due_ms`, [shard, dueByMs]);
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
}
