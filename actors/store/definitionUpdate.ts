import type { ShardWrite } from "./types.ts";
import { FENCE_CTE, okShard } from "./fence.ts";

/**
 * The statement that writes `ax task update` changes decided by a shard actor, in the round's
 * fenced transaction (see Store.writeBatch): the task's definition columns and generation, its
 * trigger set (the row's copy and the links; replaced trigger rows are deleted, the new ones
 * were inserted by the API beforehand) and one task_history row. Rows of a shard whose epoch is
 * not current change nothing, like every other statement of the batch.
 * $1 rows (JSON), $2 shards, $3 epochs, $4 now.
 */
export const UPDATE_DEFINITIONS = `${FENCE_CTE},
  u as (select x.* from json_to_recordset($1::json) as x(id bigint, shard int, generation int, executor text, payload jsonb, timeout_ms int,
      max_attempts int, backoff_ms int, backoff_max_ms int, misfire text, overlap text, trigger_set jsonb, link jsonb, unlink jsonb,
      h_name text, h_at bigint, h_who text, h_kind text, h_change jsonb, h_prev text)
    where ${okShard("x.shard")}),
  t as (update tasks t set generation = u.generation, executor = u.executor, payload = u.payload, timeout_ms = u.timeout_ms,
      max_attempts = u.max_attempts, backoff_ms = u.backoff_ms, backoff_max_ms = u.backoff_max_ms, misfire = u.misfire, overlap = u.overlap,
      trigger_set = coalesce(u.trigger_set, t.trigger_set), updated_ms = $4
    from u where t.id = u.id returning t.id),
  dl as (delete from triggers where id in (select jsonb_array_elements_text(u.unlink)::bigint from u)),
  ln as (insert into task_triggers (task_id, trigger_id) select u.id, jsonb_array_elements_text(u.link)::bigint from u on conflict do nothing),
  h as (insert into task_history (task_id, task_name, generation, at_ms, who, kind, change, prev_run)
    select u.id, u.h_name, u.generation, u.h_at, u.h_who, u.h_kind, u.h_change, u.h_prev from u)
  select count(*) from t`;

/** The batch's definition changes as one JSON array (null: none). */
export function definitionUpdatesJson(writes: ShardWrite[]): string | null {
  const rows: unknown[] = [];
  for (const w of writes) {
    for (const d of w.defUpdates ?? []) {
      rows.push({
        id: d.id, shard: w.shard, generation: d.generation, executor: d.executor, payload: d.payload ?? null, timeout_ms: d.timeoutMs,
        max_attempts: d.maxAttempts, backoff_ms: d.backoffMs, backoff_max_ms: d.backoffMaxMs, misfire: d.misfire, overlap: d.overlap,
        trigger_set: d.triggers, link: d.link, unlink: d.unlink,
        h_name: d.history.taskName, h_at: d.history.atMs, h_who: d.history.who, h_kind: d.history.kind, h_change: d.history.change, h_prev: d.history.prevRun,
      });
    }
  }
  return rows.length ? JSON.stringify(rows) : null;
}
