import type { Pool } from "pg";

/** Operations that change something: each is recorded (who, when, what, and whether it was refused). */
export const WRITE_OPS = new Set([
  "task.create", "task.bulkCreate", "task.pause", "task.resume", "task.rm", "task.deps.add", "task.deps.rm", "run",
  "executor.register", "task.tag", "alerts.set", "alerts.rm", "shards.move", "shards.unpin", "shards.rebalance", "node.drain", "node.undrain",
]);
export const isWriteOp = (op: string) => WRITE_OPS.has(op) || op.startsWith("executor.register.");

export interface AuditRow { id: number; at: string; who: string; op: string; task: string | null; args: unknown; ok: boolean; error: string | null }

/**
 * The audit trail, a table of the namespace's schema (made here, idempotently, so it needs no
 * migration number). `who` is the HTTP token's name, or for NATS the caller's self-declared
 * name (`nats:<user>` / `os:<user>`): on NATS the server's permissions are the control, the
 * name says which credentials were used. Payloads are recorded by size only.
 */
export class AuditLog {
  private ready: Promise<void> | null = null;
  constructor(private readonly pool: Pool) {}

  private ensure(): Promise<void> {
    this.ready ??= this.pool.query(`create table if not exists audit (
      id bigserial primary key, at_ms bigint not null, who text not null, op text not null, task text,
      args jsonb not null, ok boolean not null, error text)`).then(() => this.pool.query("create index if not exists audit_task on audit (task, id)")).then(() => undefined, (e: unknown) => { this.ready = null; throw e; });
    return this.ready;
  }

  async record(atMs: number, who: string, op: string, args: Record<string, unknown>, error: unknown): Promise<void> {
    await this.ensure();
    const what: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(args)) {
      if (k === "payload" || k === "tasks") what[k] = { bytes: Buffer.byteLength(JSON.stringify(v) ?? "") , ...(Array.isArray(v) ? { count: v.length } : {}) };
      else what[k] = typeof v === "string" && v.length > 256 ? `${v.slice(0, 256)}…` : v;
    }
    const task = typeof args.task === "string" || typeof args.task === "number" ? String(args.task) : typeof args.name === "string" && op.startsWith("task.") ? args.name : null;
    await this.pool.query("insert into audit (at_ms, who, op, task, args, ok, error) values ($1, $2, $3, $4, $5, $6, $7)",
      [atMs, who.slice(0, 128), op.slice(0, 128), task, JSON.stringify(what), error === null, error === null ? null : String((error as Error)?.message ?? error).slice(0, 1024)]);
  }

  async list(opts: { task?: string; limit: number }): Promise<AuditRow[]> {
    await this.ensure();
    const r = await this.pool.query("select * from audit where ($1::text is null or task = $1) order by id desc limit $2", [opts.task ?? null, opts.limit]);
    return r.rows.map((x) => ({ id: Number(x.id), at: new Date(Number(x.at_ms)).toISOString(), who: x.who, op: x.op, task: x.task, args: x.args, ok: x.ok, error: x.error }));
  }
}
