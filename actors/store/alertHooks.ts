import type pg from "pg";

/** One alert hook row: where alerts about a task or an executor go, and which kinds. */
export interface AlertHookRow { scope: string; target: string; nats: string | null; webhook: string | null; on: string[] }

/** The namespace's `alert_hooks` table (`ax alerts`); the node's alert dispatcher reads it. */
export class AlertHooks {
  constructor(private readonly pool: pg.Pool) {}

  async list(): Promise<AlertHookRow[]> {
    const r = await this.pool.query("select scope, target, nats_subject, webhook_url, events from alert_hooks order by scope, target");
    return r.rows.map((x) => ({ scope: x.scope, target: x.target, nats: x.nats_subject, webhook: x.webhook_url, on: x.events }));
  }

  /** False: no hook for that scope and target. */
  async remove(scope: string, target: string): Promise<boolean> {
    const r = await this.pool.query("delete from alert_hooks where scope = $1 and target = $2", [scope, target]);
    return (r.rowCount ?? 0) > 0;
  }

  async put(h: AlertHookRow, nowMs: number): Promise<void> {
    await this.pool.query(`insert into alert_hooks (scope, target, nats_subject, webhook_url, events, created_ms) values ($1, $2, $3, $4, $5, $6)
      on conflict (scope, target) do update set nats_subject = excluded.nats_subject, webhook_url = excluded.webhook_url, events = excluded.events`,
    [h.scope, h.target, h.nats, h.webhook, h.on, nowMs]);
  }
}
