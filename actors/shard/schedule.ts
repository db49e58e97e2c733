import { compileTrigger, planAfter, type CompiledTrigger, type TriggerSpec } from "../triggers/index.ts";
import type { RunSource, TaskRow, TriggerRow } from "../store/index.ts";

/**
 * Pure scheduling decisions. A task has one "next due" pointer (time, slot, trigger, source,
 * reason); these functions compute it from the task's triggers and the last slot each trigger
 * fired, so cadence always follows the previous *scheduled* slot and never "now".
 */
export interface Pointer {
  dueMs: number;
  slotMs: number | null;
  triggerId: number | null;
  source: RunSource;
  reason: string;
  causedBy: string | null;
}

/**
 * Trigger rows are immutable (a change is a new trigger), and compileTrigger shares parsed cron
 * expressions per (expr, tz), so compiling is an allocation: cheaper than any cache key that
 * would have to prove the spec unchanged (a JSON key cost more than the compile it saved).
 */
export function compiledOf(tr: TriggerRow): CompiledTrigger {
  return compileTrigger(tr.spec as TriggerSpec);
}

export function sourceOfKind(kind: TriggerRow["kind"]): RunSource {
  switch (kind) {
    case "cron": return "cron";
    case "fixed_rate": return "rate";
    case "fixed_delay": return "delay";
    case "once": return "once";
  }
}

const iso = (ms: number) => new Date(ms).toISOString();

/**
 * The next pointer of a task that is not running. `completedMs` is the end of the run that
 * just finished (fixed-delay triggers count from it); without it a fixed-delay trigger that
 * has fired before waits (its next time is set when its run completes).
 */
export function nextPointer(task: Pick<TaskRow, "triggers" | "triggerSlots" | "misfire" | "createdMs">, nowMs: number,
  opts: { completedMs?: number; graceMs?: number } = {}): Pointer | null {
  let best: Pointer | null = null;
  for (const tr of task.triggers) {
    if (!tr.enabled) continue;
    const t = compiledOf(tr);
    const last = task.triggerSlots[String(tr.id)] ?? null;
    let p: Pointer | null = null;
    if (tr.kind === "fixed_delay") {
      const delayMs = (tr.spec as { delayMs: number }).delayMs;
      if (opts.completedMs !== undefined) {
        p = { dueMs: opts.completedMs + delayMs, slotMs: opts.completedMs + delayMs, triggerId: tr.id, source: "delay", causedBy: null,
          reason: `${t.describe()}: previous run finished at ${iso(opts.completedMs)}, + ${delayMs}ms` };
      } else if (last === null) {
        const at = task.createdMs + delayMs;
        p = { dueMs: at, slotMs: at, triggerId: tr.id, source: "delay", causedBy: null, reason: `${t.describe()}: first run ${delayMs}ms after the task was created` };
      }
    } else {
      const plan = planAfter(t, last, nowMs, task.misfire, { createdAtMs: task.createdMs, ...(opts.graceMs !== undefined ? { graceMs: opts.graceMs } : {}) });
      const first = plan.fire[0];
      if (first) {
        // One catch-up stands for every slot up to now (within the grace too), so the cadence
        // resumes strictly after now instead of firing the slots just inside the grace again.
        let slot = first.slotMs;
        if (task.misfire === "once") for (let n = t.next(slot); n !== null && n <= nowMs; n = t.next(slot)) slot = n;
        p = { dueMs: nowMs, slotMs: slot, triggerId: tr.id, source: "misfire", causedBy: null,
          reason: `catch-up (misfire=${task.misfire}) for the slot ${iso(slot)} of ${t.describe()}; ${plan.missed} slot(s) were missed` };
      } else if (plan.nextSlotMs !== null) {
        const from = last ?? task.createdMs;
        p = { dueMs: plan.nextSlotMs, slotMs: plan.nextSlotMs, triggerId: tr.id, source: sourceOfKind(tr.kind), causedBy: null,
          reason: last === null ? `first slot of ${t.describe()}`
            : plan.missed > 0 ? `next slot of ${t.describe()} at ${iso(plan.nextSlotMs)}; ${plan.missed} missed slot(s) before it not run (misfire=${task.misfire})`
            : t.explain(from, plan.nextSlotMs) };
      }
    }
    if (p && (!best || p.dueMs < best.dueMs)) best = p;
  }
  return best;
}

/** Exponential backoff from `baseMs`, capped, with equal jitter (half fixed, half random). */
export function backoffMs(attempt: number, baseMs: number, maxMs: number, random: () => number = Math.random): number {
  if (baseMs <= 0) return 0;
  const exp = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt - 1));
  return Math.round(exp / 2 + random() * (exp / 2));
}
