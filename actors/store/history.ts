import type pg from "pg";
import type { RunRow } from "./types.ts";

export interface HistoryRow { id: number; taskId: number; task: string; generation: number; at: string; atMs: number; who: string; kind: string; change: Record<string, unknown>; prevRun: string | null }

const toRow = (x: Record<string, unknown>): HistoryRow => ({
  id: Number(x.id), taskId: Number(x.task_id), task: String(x.task_name), generation: Number(x.generation), atMs: Number(x.at_ms), at: new Date(Number(x.at_ms)).toISOString(),
  who: String(x.who), kind: String(x.kind), change: (x.change ?? {}) as Record<string, unknown>, prevRun: (x.prev_run as string | null) ?? null,
});

/**
 * A task's history of definition changes (migration 11), written by its shard in the fenced round
 * that applies each change. Read by `ax task history` and by `ax why`, which names the change
 * for the first run after it.
 */
export class TaskHistory {
  constructor(private readonly pool: pg.Pool) {}

  async list(taskId: number, limit: number): Promise<HistoryRow[]> {
    const r = await this.pool.query("select * from task_history where task_id = $1 order by id desc limit $2", [taskId, limit]);
    return r.rows.map(toRow);
  }

  /**
   * The change this run is the first run after, if any: the latest change made before the run was
   * decided, with no other run of the task decided between them (the task's last run before the
   * change and the runs the change withdrew do not count).
   */
  async changeBefore(run: RunRow): Promise<HistoryRow | null> {
    const r = await this.pool.query("select * from task_history where task_id = $1 and at_ms <= $2 order by id desc limit 1", [run.taskId, run.createdMs]);
    if (!r.rowCount) return null;
    const h = toRow(r.rows[0]);
    if (h.prevRun === run.id) return null;
    const withdrawn = Array.isArray(h.change.withdrawn) ? (h.change.withdrawn as string[]) : [];
    const first = await this.pool.query(
      `select id from runs where task_id = $1 and created_ms >= $2 and not (id = any($3::text[])) order by created_ms, id limit 1`,
      [run.taskId, h.atMs, [...withdrawn, ...(h.prevRun ? [h.prevRun] : [])]]);
    return first.rows[0]?.id === run.id ? h : null;
  }
}
