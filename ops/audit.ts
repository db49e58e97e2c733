import type { AuditRow, AuditTrail } from "../actors/index.ts";

/** Operations that change something: each is recorded (who, when, what, and whether it was refused). */
export const WRITE_OPS = new Set([
  "task.create", "task.bulkCreate", "task.pause", "task.resume", "task.rm", "task.deps.add", "task.deps.rm", "run", "task.update", "apply",
  "executor.register", "run.cancel", "calendar.create", "calendar.rm", "task.backfill", "task.tag", "alerts.set", "alerts.rm", "shards.move", "shards.unpin", "shards.rebalance", "node.drain", "node.undrain",
]);
export const isWriteOp = (op: string) => WRITE_OPS.has(op) || op.startsWith("executor.register.");

export type { AuditRow };

/**
 * What goes into the audit trail (the store's `audit` table). `who` is the HTTP token's name, or
 * for NATS the caller's self-declared name (`nats:<user>` / `os:<user>`): on NATS the server's
 * permissions are the control, the name says which credentials were used. Payloads are
 * recorded by size only.
 */
export class AuditLog {
  constructor(private readonly trail: AuditTrail) {}

  async record(atMs: number, who: string, op: string, args: Record<string, unknown>, error: unknown): Promise<void> {
    const what: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(args)) {
      if (k === "payload" || k === "tasks") what[k] = { bytes: Buffer.byteLength(JSON.stringify(v) ?? "") , ...(Array.isArray(v) ? { count: v.length } : {}) };
      else what[k] = typeof v === "string" && v.length > 256 ? `${v.slice(0, 256)}…` : v;
    }
    const task = typeof args.task === "string" || typeof args.task === "number" ? String(args.task) : typeof args.name === "string" && op.startsWith("task.") ? args.name : null;
    await this.trail.append({ atMs, who: who.slice(0, 128), op: op.slice(0, 128), task, args: what, ok: error === null,
      error: error === null ? null : String((error as Error)?.message ?? error).slice(0, 1024) });
  }

  list(opts: { task?: string; limit: number }): Promise<AuditRow[]> { return this.trail.list(opts); }
}
