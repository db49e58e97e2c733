import type pg from "pg";

export interface AuditEntry { atMs: number; who: string; op: string; task: string | null; args: unknown; ok: boolean; error: string | null }
export interface AuditRow { id: number; at: string; who: string; op: string; task: string | null; args: unknown; ok: boolean; error: string | null }

/**
 * The audit trail, a table of the namespace's schema (made here, idempotently, so it needs no
 * migration number; namespaces made before it existed get it on first use).
 */
export class AuditTrail {
  private ready: Promise<void> | null = null;
  constructor(private readonly pool: pg.Pool) {}

  private ensure(): Promise<void> {
    this.ready ??= this.pool.query(`create table if not exists audit (
      id bigserial primary key, at_ms bigint not null, who text not null, op text not null, task text,
      args jsonb not null, ok boolean not null, error text)`).then(() => this.pool.query("create index if not exists audit_task on audit (task, id)")).then(() => undefined, (e: unknown) => { this.ready = null; throw e; });
    return this.ready;
  }

  async append(e: AuditEntry): Promise<void> {
    await this.ensure();
    await this.pool.query("insert into audit (at_ms, who, op, task, args, ok, error) values ($1, $2, $3, $4, $5, $6, $7)",
      [e.atMs, e.who, e.op, e.task, JSON.stringify(e.args), e.ok, e.error]);
  }

  /** Successful pauses and resumes of a task (by any of its names), oldest first; none before the table exists. */
  async pausesAndResumes(names: string[]): Promise<Array<{ atMs: number; who: string; op: string }>> {
    await this.ensure();
    const r = await this.pool.query("select at_ms, who, op from audit where task = any($1::text[]) and op in ('task.pause', 'task.resume') and ok order by at_ms", [names]);
    return r.rows.map((x) => ({ atMs: Number(x.at_ms), who: x.who as string, op: x.op as string }));
  }

  async list(opts: { task?: string; limit: number }): Promise<AuditRow[]> {
    await this.ensure();
    const r = await this.pool.query("select * from audit where ($1::text is null or task = $1) order by id desc limit $2", [opts.task ?? null, opts.limit]);
    return r.rows.map((x) => ({ id: Number(x.id), at: new Date(Number(x.at_ms)).toISOString(), who: x.who, op: x.op, task: x.task, args: x.args, ok: x.ok, error: x.error }));
  }
}
