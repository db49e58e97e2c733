import { appendFileSync } from "node:fs";
import type { Logger } from "../common/index.ts";
import type { RunHandler } from "../protocol/index.ts";

/**
 * The demo executor's handler: sleeps `sleepMs` (or payload.sleepMs), fails with probability
 * `failRate`, or while `attempt <= payload.failAttempts` (a task that fails then succeeds on retry).
 * With `recordFile`, appends each completed run id (the "effect" tests count).
 */
export function demoHandler(o: { sleepMs: number; failRate: number; recordFile?: string; log: Logger }): RunHandler {
  return async (ctx) => {
    const p = (ctx.payload ?? {}) as { sleepMs?: number; failAttempts?: number };
    const sleep = typeof p.sleepMs === "number" ? p.sleepMs : o.sleepMs;
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(resolve, sleep);
      ctx.signal.addEventListener("abort", () => { clearTimeout(t); reject(ctx.signal.reason instanceof Error ? ctx.signal.reason : new Error("aborted: timeout")); }, { once: true });
    });
    if (typeof p.failAttempts === "number" && ctx.attempt <= p.failAttempts) throw new Error(`demo failure on attempt ${ctx.attempt} (payload.failAttempts=${p.failAttempts})`);
    if (Math.random() < o.failRate) throw new Error("demo failure (--fail-rate)");
    if (o.recordFile) appendFileSync(o.recordFile, `${ctx.runId}\n`);
    o.log.info({ runId: ctx.runId, taskId: ctx.taskId, task: ctx.taskName, attempt: ctx.attempt, lateMs: Date.now() - ctx.scheduledAt }, "demo run done");
    return { ok: true };
  };
}
