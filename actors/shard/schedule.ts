import { AxError } from "../../common/index.ts";
import {
  compileTrigger, isoUtc, planAfter, planNowOf, runsKey, runsTaken, scheduleEnded, scheduleOptionsOf, shapePointer, windowed, type CompiledTrigger, type TriggerSpec,
} from "../triggers/index.ts";
import type { RunSource, TaskRow, TriggerRow } from "../store/index.ts";
import { withSlot } from "../store/index.ts";

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

/**
 * A task whose schedule cannot be computed: one of its triggers returned a slot that is not
 * strictly after the instant it was asked about, returned something that is not a time, or
 * threw (its cause is kept). nextPointer throws it instead of looping; the shard marks that
 * task and goes on with the others.
 */
export class TriggerStuckError extends AxError {
  override name = "TriggerStuckError";
  readonly taskId: number | null;
  readonly triggerId: number;
  readonly spec: unknown;
  /** The instant the trigger was asked about, and what it answered (undefined: it threw). */
  readonly afterMs: number | null;
  readonly returned: unknown;
  constructor(info: { taskId: number | null; triggerId: number; spec: unknown; afterMs: number | null; returned?: unknown; cause?: unknown }) {
    const what = info.cause !== undefined
      ? `failed: ${info.cause instanceof Error ? info.cause.message : String(info.cause)}`
      : `did not advance: next(${info.afterMs === null ? "?" : isoUtc(info.afterMs)}) returned ${typeof info.returned === "number" && Number.isFinite(info.returned) ? isoUtc(info.returned) : String(info.returned)}`;
    super("AX_E_TRIGGER_STUCK", `task ${info.taskId ?? "?"}: trigger ${info.triggerId} ${JSON.stringify(info.spec)} ${what}`,
      { field: "trigger", value: { taskId: info.taskId, triggerId: info.triggerId, spec: info.spec, afterMs: info.afterMs }, ...(info.cause !== undefined ? { cause: info.cause } : {}) });
    this.taskId = info.taskId; this.triggerId = info.triggerId; this.spec = info.spec;
    this.afterMs = info.afterMs; this.returned = info.returned;
  }
}

export function isTriggerStuck(e: unknown): e is TriggerStuckError {
  return e instanceof TriggerStuckError;
}

/** A trigger whose next() must move forward: anything else is a TriggerStuckError. */
function advancing(t: CompiledTrigger, taskId: number | null, tr: TriggerRow): CompiledTrigger {
  const stuck = (afterMs: number, returned: unknown): TriggerStuckError =>
    new TriggerStuckError({ taskId, triggerId: tr.id, spec: tr.spec, afterMs, returned });
  return {
    spec: t.spec,
    describe: () => t.describe(),
    explain: (a, s) => t.explain(a, s),
    next(afterMs: number): number | null {
      const n: unknown = t.next(afterMs);
      if (n === null) return null;
      if (typeof n !== "number" || !Number.isFinite(n) || !(n > afterMs)) throw stuck(afterMs, n);
      return n;
    },
  };
}

/**
 * Most slots the misfire=once catch-up steps over to reach now. Those are the slots inside the
 * grace (1 s by default): two for a cron, up to a thousand for a 1 ms fixed rate.
 */
const MAX_STEPS_TO_NOW = 100_000;

/**
 * The next pointer of a task that is not running. `completedMs` is the end of the run that
 * just finished (fixed-delay triggers count from it); without it a fixed-delay trigger that
 * has fired before waits (its next time is set when its run completes).
 *
 * Never loops: every walk is bounded, and a trigger that does not advance or throws (including
 * a spec that no longer compiles) makes it throw TriggerStuckError naming the task and the
 * trigger. `compile` replaces compiledOf (tests inject broken triggers with it).
 */
export function nextPointer(task: Pick<TaskRow, "triggers" | "triggerSlots" | "misfire" | "createdMs"> & { id?: number; name?: string }, nowMs: number,
  opts: { completedMs?: number; graceMs?: number; compile?: (tr: TriggerRow) => CompiledTrigger } = {}): Pointer | null {
  let best: Pointer | null = null;
  const taskId = task.id ?? null;
  for (const tr of task.triggers) {
    if (!tr.enabled) continue;
    // A one-shot trigger whose slot is recorded has no next slot: answered without compiling and
    // planning it (every one-shot run's fire and end asked, a twentieth of the node's allocations).
    if (tr.kind === "once") {
      const last = task.triggerSlots[String(tr.id)];
      if (last !== undefined && last >= (tr.spec as { atMs: number }).atMs) continue;
    }
    let p: Pointer | null;
    try {
      // Jitter, window, max runs (docs/TRIGGERS.md): the trigger seen through its options.
      const o = scheduleOptionsOf(tr.spec);
      if (o?.maxRuns !== undefined && runsTaken(task.triggerSlots, tr.id) >= o.maxRuns) continue;
      const t = (opts.compile ?? compiledOf)(tr);
      p = triggerPointer(task, tr, advancing(o ? windowed(t, o) : t, taskId, tr), o ? planNowOf(o, nowMs, opts.graceMs ?? 1000) : nowMs, opts);
      if (p && o) p = shapePointer(p, o, task.name ?? String(taskId), nowMs);
    } catch (e) {
      if (e instanceof TriggerStuckError) throw e;
      throw new TriggerStuckError({ taskId, triggerId: tr.id, spec: tr.spec, afterMs: null, cause: e });
    }
    if (p && (!best || p.dueMs < best.dueMs)) best = p;
  }
  return best;
}

function triggerPointer(task: Pick<TaskRow, "triggerSlots" | "misfire" | "createdMs">, tr: TriggerRow, t: CompiledTrigger, nowMs: number,
  opts: { completedMs?: number; graceMs?: number }): Pointer | null {
  const last = task.triggerSlots[String(tr.id)] ?? null;
  let p: Pointer | null = null;
  if (tr.kind === "fixed_delay") {
    const delayMs = (tr.spec as { delayMs: number }).delayMs;
    if (opts.completedMs !== undefined) {
      p = { dueMs: opts.completedMs + delayMs, slotMs: opts.completedMs + delayMs, triggerId: tr.id, source: "delay", causedBy: null,
        reason: `${t.describe()}: previous run finished at ${isoUtc(opts.completedMs)}, + ${delayMs}ms` };
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
      if (task.misfire === "once") {
        let steps = 0;
        for (let n = t.next(slot); n !== null && n <= nowMs; n = t.next(slot)) {
          if (++steps > MAX_STEPS_TO_NOW) throw new Error(`more than ${MAX_STEPS_TO_NOW} slots between ${isoUtc(first.slotMs)} and now (${isoUtc(nowMs)})`);
          slot = n;
        }
      }
      p = { dueMs: nowMs, slotMs: slot, triggerId: tr.id, source: "misfire", causedBy: null,
        reason: `catch-up (misfire=${task.misfire}) for the slot ${isoUtc(slot)} of ${t.describe()}; ${plan.missed} slot(s) were missed` };
    } else if (plan.nextSlotMs !== null) {
      const from = last ?? task.createdMs;
      p = { dueMs: plan.nextSlotMs, slotMs: plan.nextSlotMs, triggerId: tr.id, source: sourceOfKind(tr.kind), causedBy: null,
        reason: last === null ? `first slot of ${t.describe()}`
          : plan.missed > 0 ? `next slot of ${t.describe()} at ${isoUtc(plan.nextSlotMs)}; ${plan.missed} missed slot(s) before it not run (misfire=${task.misfire})`
          : t.explain(from, plan.nextSlotMs) };
    }
  }
  return p;
}

/**
 * Why a task has no next slot because of its options (--max-runs reached, --end passed), for its
 * next reason; null when that is not why.
 */
export function endedReason(task: Pick<TaskRow, "triggers" | "triggerSlots">, nowMs: number): string | null {
  for (const tr of task.triggers) {
    const o = tr.enabled ? scheduleOptionsOf(tr.spec) : null;
    if (!o) continue;
    const why = scheduleEnded(o, task.triggerSlots, tr.id, nowMs);
    if (why) return why;
    if (o.endMs !== undefined && tr.kind !== "fixed_delay") {
      // The end is ahead, but the trigger has no slot left before it.
      let n: number | null = null;
      try { n = windowed(compiledOf(tr), o).next(Math.max(task.triggerSlots[String(tr.id)] ?? nowMs, nowMs)); } catch { continue; }
      if (n === null || n > o.endMs) return `completed: no slot left before its window ends at ${new Date(o.endMs).toISOString()} (--end)`;
    }
  }
  return null;
}

/**
 * The trigger-slot map after a scheduled slot of trigger `triggerId` was taken (fired, or refused
 * and retried): the count --max-runs reads goes up by one. Unchanged (the same object) when the
 * trigger has no run limit, so ordinary tasks write nothing more.
 */
export function countTaken(task: Pick<TaskRow, "triggers" | "triggerSlots">, triggerId: number | null): Record<string, number> {
  const tr = triggerId === null ? undefined : task.triggers.find((t) => t.id === triggerId);
  if (!tr || scheduleOptionsOf(tr.spec)?.maxRuns === undefined) return task.triggerSlots;
  const key = runsKey(tr.id);
  return withSlot(task.triggerSlots, key, (task.triggerSlots[key] ?? 0) + 1);
}

/** Exponential backoff from `baseMs`, capped, with equal jitter (half fixed, half random). */
export function backoffMs(attempt: number, baseMs: number, maxMs: number, random: () => number = Math.random): number {
  if (baseMs <= 0) return 0;
  const exp = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt - 1));
  return Math.round(exp / 2 + random() * (exp / 2));
}
