import type pg from "pg";

/** A filter of the task search: null fields match everything. */
export interface TaskFilter { nameLike: string | null; state: string | null; executor: string | null; tag: string | null }

/**
 * The reads behind the dashboard's listings and `ax why`'s explanations (ops/browse.ts,
 * ops/ledgerView.ts): ids and counts, by the indexes the schema has for them. The rows
 * themselves come from Store.getTask / getRuns.
 */
export class BrowseReads {
  constructor(private readonly pool: pg.Pool) {}

  async tagsOf(ids: number[]): Promise<Map<number, string[]>> {
    if (!ids.length) return new Map();
    const r = await this.pool.query("select id, tags from tasks where id = any($1::bigint[])", [ids]);
    return new Map(r.rows.map((x) => [Number(x.id), x.tags as string[]]));
  }

  async setTags(taskId: number, tags: string[]): Promise<void> {
    await this.pool.query("update tasks set tags = $2 where id = $1", [taskId, tags]);
  }

  /** Ids of the tasks matching `f`, by name, one page; and how many match in all. */
  async searchTasks(f: TaskFilter, limit: number, offset: number): Promise<{ total: number; ids: number[] }> {
    // `tags <> '{}'`: implied by the tag, said so the partial index tasks_tags applies.
    const where = "($1::text is null or t.name ilike $1) and ($2::text is null or t.state = $2) and ($3::text is null or t.executor = $3) and ($4::text is null or (t.tags @> array[$4::text] and t.tags <> '{}'))";
    const params = [f.nameLike, f.state, f.executor, f.tag];
    const [count, page] = await Promise.all([
      this.pool.query(`select count(*)::int as n from tasks t where ${where}`, params),
      this.pool.query(`select t.id from tasks t where ${where} order by t.name limit $5 offset $6`, [...params, limit, offset]),
    ]);
    return { total: count.rows[0].n as number, ids: page.rows.map((r) => Number(r.id)) };
  }

  /** Runs that failed or timed out since `fromMs` (newest first, one page), their total, and the tasks now upstream_failed. */
  async failures(fromMs: number, executor: string | null, limit: number, offset: number): Promise<{ total: number; runIds: string[]; upstreamFailed: Array<{ name: string; executor: string }> }> {
    const where = "state in ('failed','timed_out') and created_ms >= $1 and ($2::text is null or executor = $2)";
    const [count, page, uf] = await Promise.all([
      this.pool.query(`select count(*)::int as n from runs where ${where}`, [fromMs, executor]),
      this.pool.query(`select id from runs where ${where} order by created_ms desc, id desc limit $3 offset $4`, [fromMs, executor, limit, offset]),
      this.pool.query("select name, executor from tasks where state = 'upstream_failed' and ($1::text is null or executor = $1) order by name limit 200", [executor]),
    ]);
    return { total: count.rows[0].n as number, runIds: page.rows.map((r) => r.id as string), upstreamFailed: uf.rows };
  }

  /** The first run `runId` caused (a retry, a downstream run), if any; Store.firstCausedBy does this for many runs of known tasks. */
  async firstRunCausedBy(runId: string): Promise<string | null> {
    const r = await this.pool.query("select id from runs where caused_by = $1 order by created_ms limit 1", [runId]);
    return r.rowCount ? (r.rows[0].id as string) : null;
  }

  /** Runs recorded `running` per executor, cluster-wide (a scan of runs: no index on state, so status updates stay HOT). */
  async runningByExecutor(): Promise<Record<string, number>> {
    const r = await this.pool.query("select executor, count(*)::int as n from runs where state = 'running' group by executor");
    return Object.fromEntries(r.rows.map((x) => [x.executor as string, x.n as number]));
  }

  /** Ids of the task's slot runs (not retries) with a slot in [fromMs, toMs], by slot. */
  async slotRunIds(taskId: number, fromMs: number, toMs: number): Promise<string[]> {
    const r = await this.pool.query("select id from runs where task_id = $1 and slot_ms between $2 and $3 and source <> 'retry' order by slot_ms, created_ms limit 5000", [taskId, fromMs, toMs]);
    return r.rows.map((x) => x.id as string);
  }

  /** The first catch-up (misfire) run of the task recorded at or after `ms`. */
  async catchUpAfter(taskId: number, ms: number): Promise<string | null> {
    const r = await this.pool.query("select id from runs where task_id = $1 and source = 'misfire' and created_ms >= $2 order by created_ms limit 1", [taskId, ms]);
    return r.rowCount ? (r.rows[0].id as string) : null;
  }
}
