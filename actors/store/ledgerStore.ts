import type { Pool } from "pg";
import { FENCE_CTE, okShard } from "./fence.ts";

/**
 * The ledger of non-runs in PostgreSQL (migration 13): one row per interval of consecutive
 * slots of one trigger that did not run for one cause. Written in the shard's fenced round
 * (see Store.writeBatch), read by `ax why TASK --at` and `ax runs TASK --all`.
 */
export type NonRunReason = "paused" | "overlap" | "misfire-skip" | "collapsed" | "outage" | "refused" | "upstream" | "excluded";

export interface LedgerInsert {
  taskId: number;
  taskName: string;
  triggerId: number;
  /** The slot right before `fromMs` (the watermark before): a stored row ending there with the same cause is extended. */
  afterMs: number | null;
  fromMs: number;
  toMs: number;
  count: number;
  /** Beyond the count limit of a cron walk, `count` is a lower bound. */
  countAtLeast?: boolean;
  reason: NonRunReason;
  mergeKey: string;
  details: Record<string, unknown>;
  node: string;
  shard: number;
  epoch: number;
  createdMs: number;
}

export interface LedgerRow {
  id: number;
  taskId: number;
  taskName: string;
  triggerId: number;
  fromMs: number;
  toMs: number;
  count: number;
  countAtLeast: boolean;
  reason: NonRunReason;
  details: Record<string, unknown>;
  node: string | null;
  shard: number;
  epoch: number;
  createdMs: number;
  updatedMs: number;
}

export const LEDGER_MIGRATION_SQL = `
create table ledger (
  id bigserial primary key,
  task_id bigint not null,
  task_name text not null,
  trigger_id bigint not null,
  from_ms bigint not null,
  to_ms bigint not null,
  count bigint not null check (count > 0),
  count_at_least boolean not null default false,
  reason text not null check (reason in ('paused','overlap','misfire-skip','collapsed','outage','refused','upstream','excluded')),
  merge_key text not null,
  details jsonb not null,
  node text,
  shard int not null,
  epoch bigint not null,
  created_ms bigint not null,
  updated_ms bigint not null
);
create index ledger_task_to on ledger (task_id, trigger_id, to_ms);
create index ledger_updated on ledger (updated_ms);
alter table shards add column prev_owner text, add column prev_epoch bigint, add column prev_since_ms bigint;
create function ax_shard_prev_owner() returns trigger language plpgsql as $f$
begin
  if new.epoch is distinct from old.epoch then
    new.prev_owner := old.owner; new.prev_epoch := old.epoch; new.prev_since_ms := old.updated_ms;
  end if;
  return new;
end $f$;
create trigger shards_prev_owner before update on shards for each row execute function ax_shard_prev_owner();
`;

/**
 * Fenced like the other statements of the round ($2/$3 = shards/epochs, `ok` = shards whose epoch
 * is current). A row whose `after_ms` is the end of a stored row of the same task, trigger, reason
 * and cause extends that row (to, count) instead of adding one.
 */
export const LEDGER_UPSERT = `${FENCE_CTE},
  u as (select * from json_to_recordset($1::json) as u(ord int, task_id bigint, task_name text, trigger_id bigint, after_ms bigint, from_ms bigint,
    to_ms bigint, count bigint, at_least boolean, reason text, merge_key text, details jsonb, node text, shard int, epoch bigint, created_ms bigint)
    where ${okShard("u.shard")}),
  ext as (update ledger l set to_ms = u.to_ms, count = l.count + u.count, count_at_least = l.count_at_least or u.at_least, updated_ms = u.created_ms
    from u where u.after_ms is not null and l.task_id = u.task_id and l.trigger_id = u.trigger_id and l.to_ms = u.after_ms
      and l.reason = u.reason and l.merge_key = u.merge_key
    returning u.ord)
  insert into ledger (task_id, task_name, trigger_id, from_ms, to_ms, count, count_at_least, reason, merge_key, details, node, shard, epoch, created_ms, updated_ms)
  select u.task_id, u.task_name, u.trigger_id, u.from_ms, u.to_ms, u.count, u.at_least, u.reason, u.merge_key, u.details, u.node, u.shard, u.epoch, u.created_ms, u.created_ms
  from u where u.ord not in (select ord from ext)`;

export function ledgerJson(writes: ReadonlyArray<{ ledger?: LedgerInsert[] }>): string | null {
  const data: unknown[] = [];
  for (const w of writes) {
    for (const r of w.ledger ?? []) {
      data.push({
        ord: data.length, task_id: r.taskId, task_name: r.taskName, trigger_id: r.triggerId, after_ms: r.afterMs, from_ms: r.fromMs, to_ms: r.toMs,
        count: r.count, at_least: r.countAtLeast === true, reason: r.reason, merge_key: r.mergeKey, details: r.details, node: r.node, shard: r.shard,
        epoch: r.epoch, created_ms: r.createdMs,
      });
    }
  }
  return data.length ? JSON.stringify(data) : null;
}

type Row = Record<string, unknown>;
const toLedger = (r: Row): LedgerRow => ({
  id: Number(r.id), taskId: Number(r.task_id), taskName: r.task_name as string, triggerId: Number(r.trigger_id), fromMs: Number(r.from_ms), toMs: Number(r.to_ms),
  count: Number(r.count), countAtLeast: r.count_at_least === true, reason: r.reason as NonRunReason, details: (r.details ?? {}) as Record<string, unknown>,
  node: (r.node as string | null) ?? null, shard: Number(r.shard), epoch: Number(r.epoch), createdMs: Number(r.created_ms), updatedMs: Number(r.updated_ms),
});

/** Reads of the ledger (the namespace's pool, or one of its clients inside a transaction: the search_path is the namespace's schema). */
export class LedgerStore {
  constructor(private readonly pool: Pick<Pool, "query">) {}

  /** Intervals of a task that overlap [fromMs, toMs], oldest first. */
  async between(taskId: number, fromMs: number, toMs: number, limit = 1000): Promise<LedgerRow[]> {
    const r = await this.pool.query("select * from ledger where task_id = $1 and to_ms >= $2 and from_ms <= $3 order by from_ms, id limit $4", [taskId, fromMs, toMs, limit]);
    return r.rows.map(toLedger);
  }

  /** The latest intervals of a task, newest first. */
  async latest(taskId: number, limit: number): Promise<LedgerRow[]> {
    const r = await this.pool.query("select * from ledger where task_id = $1 order by to_ms desc, id desc limit $2", [taskId, limit]);
    return r.rows.map(toLedger);
  }

  async all(taskId: number): Promise<LedgerRow[]> {
    const r = await this.pool.query("select * from ledger where task_id = $1 order by from_ms, id", [taskId]);
    return r.rows.map(toLedger);
  }

  /** Who owned a shard before its current owner (kept by the trigger of migration 13). */
  async previousOwner(shard: number): Promise<{ owner: string | null; epoch: number | null; sinceMs: number | null }> {
    const r = await this.pool.query("select prev_owner, prev_epoch, prev_since_ms from shards where shard = $1", [shard]);
    const x = r.rows[0] as Row | undefined;
    return { owner: (x?.prev_owner as string | null) ?? null, epoch: x?.prev_epoch == null ? null : Number(x.prev_epoch), sinceMs: x?.prev_since_ms == null ? null : Number(x.prev_since_ms) };
  }

  /** Retention: the same as for runs (rows last extended before `beforeMs`). */
  async prune(beforeMs: number, batch = 5000, maxBatches = 100): Promise<number> {
    let total = 0;
    for (let i = 0; i < maxBatches; i++) {
      const r = await this.pool.query("delete from ledger where id in (select id from ledger where updated_ms < $1 limit $2)", [beforeMs, batch]);
      total += r.rowCount ?? 0;
      if ((r.rowCount ?? 0) < batch) break;
    }
    return total;
  }
}
