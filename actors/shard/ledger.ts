import { planAfter, scheduleOptionsOf, type CompiledTrigger, type TriggerSpec } from "../triggers/index.ts";
import type { LedgerInsert, NonRunReason, TaskRow, TriggerRow } from "../store/index.ts";
import { withSlot } from "../store/index.ts";
import { compiledOf, nextPointer, type Pointer } from "./schedule.ts";

/**
 * The ledger of occurrences: every slot of every trigger is either a run or a recorded non-run.
 *
 * Pure. Given a task's trigger slots and the decision a shard just made, it produces the
 * non-run intervals to write with that decision (same fenced transaction) and the new
 * watermark. The watermark ("accounted through", per trigger) lives in the task's
 * `triggerSlots` under the key `w:<trigger id>`, so it is written in the same row as the
 * schedule it accounts for: a crash can never record one without the other.
 *
 * Rules:
 * - A slot is a **run** when a run of a scheduled source (cron, rate, delay, once) was fired for it
 *   (not skipped, not refused). Catch-up runs (source `misfire`), retries, manual and dependency
 *   runs stand for no slot of their own: the slots a catch-up stands for are non-runs that name it.
 * - Every other slot up to the watermark is in exactly one interval: (task, trigger, from, to,
 *   count, reason, details). Consecutive non-runs with the same cause extend one row (`afterMs`
 *   = the slot the previous row must end at, `mergeKey` = the cause).
 * - The watermark only moves forward and only past slots that were accounted, so completeness
 *   holds by construction; the property tests check it against a slow reference.
 * - fixed_delay triggers have no enumerable slots (each one follows a completion): only the slot
 *   each decision names is accounted.
 */
export type { NonRunReason, LedgerInsert };
export const NON_RUN_REASONS: readonly NonRunReason[] = ["paused", "overlap", "misfire-skip", "collapsed", "outage", "refused", "upstream", "excluded"];
/** Every outcome a slot can have: `run` or one of the non-run reasons (the label of ax_slots_total). */
export type SlotOutcome = "run" | NonRunReason;

/** Why the slots between the watermark and a misfire decision did not run. */
export type GapCause =
  | { kind: "paused"; pausedAtMs: number | null; resumedAtMs: number; stuck?: string }
  | { kind: "outage"; acquiredMs: number; node: string; epoch: number; lastOwner: string | null; lastEpoch: number | null; lastOwnerSinceMs: number | null }
  /** The shard's owner was alive but later slots passed before it could fire (overloaded, slow run). */
  | { kind: "behind" }
  /** Hook for calendars, start/end and max-runs (another issue): the slots are outside the schedule. */
  | { kind: "excluded"; why: string };

/** Who writes: the shard actor's identity for the rows. */
export interface LedgerContext { node: string; shard: number; epoch: number; now: number }

const WKEY = "w:";
const PAUSED_KEY = "w:paused";

export function watermark(slots: Readonly<Record<string, number>>, triggerId: number): number | null {
  return slots[WKEY + triggerId] ?? slots[String(triggerId)] ?? null;
}

/** When the task was paused (kept with its slots while it is; see notePaused). */
export function pausedAt(slots: Readonly<Record<string, number>>): number | null {
  return slots[PAUSED_KEY] ?? null;
}

export function notePaused(row: Pick<TaskRow, "triggerSlots">, now: number): void {
  if (row.triggerSlots[PAUSED_KEY] === undefined) row.triggerSlots = withSlot(row.triggerSlots, PAUSED_KEY, now);
}

/** A copy of the watermark entry, to give back when a run's slot is withdrawn (see restoreWatermark). */
export function saveWatermark(slots: Readonly<Record<string, number>>, triggerId: number): { key: string; value: number | undefined } {
  return { key: WKEY + triggerId, value: slots[WKEY + triggerId] };
}

/** Gives a withdrawn slot back: the watermark returns to where it was before (never forward; the earliest of several wins). */
export function restoreWatermark(row: Pick<TaskRow, "triggerSlots">, saved: { key: string; value: number | undefined }): void {
  const cur = row.triggerSlots[saved.key];
  if (cur !== undefined && saved.value !== undefined && saved.value > cur) return;
  row.triggerSlots = withSlot(row.triggerSlots, saved.key, saved.value);
}

export function clearPaused(row: Pick<TaskRow, "triggerSlots">): void {
  if (row.triggerSlots[PAUSED_KEY] === undefined) return;
  row.triggerSlots = withSlot(row.triggerSlots, PAUSED_KEY, undefined);
}

function setWatermark(row: Pick<TaskRow, "triggerSlots">, triggerId: number, ms: number): void {
  row.triggerSlots = withSlot(row.triggerSlots, WKEY + triggerId, ms);
}

/** The first slot of a trigger that has never fired (the same rule as planAfter). */
export function firstSlot(t: CompiledTrigger, createdMs: number): number | null {
  const sp = t.spec;
  if (sp.kind === "once") return sp.atMs;
  if (sp.kind === "fixed_rate") return t.next(sp.anchorMs);
  return t.next(createdMs);
}

export interface SlotRange { fromMs: number; toMs: number; count: number; countAtLeast: boolean }

/**
 * The slots s with afterMs < s < untilMs (afterMs null: from the trigger's first slot). Fixed
 * rates by arithmetic; crons by walking, and past 10,000 slots by a jump to the last ones (the
 * count is then a lower bound). null when there are none.
 */
export function slotsBetween(t: CompiledTrigger, afterMs: number | null, untilMs: number, createdMs: number): SlotRange | null {
  if (t.spec.kind === "fixed_delay") return null;
  const first = afterMs === null ? firstSlot(t, createdMs) : t.next(afterMs);
  if (first === null || first >= untilMs) return null;
  const plan = planAfter(t, afterMs, untilMs, "once", { graceMs: 0, createdAtMs: createdMs });
  const last = plan.fire[0]?.slotMs ?? first;
  return { fromMs: first, toMs: last, count: plan.missed, countAtLeast: t.spec.kind === "cron" && plan.missed >= 10_000 };
}

type Task = Pick<TaskRow, "id" | "name" | "triggers" | "triggerSlots" | "misfire" | "createdMs">;

function triggerOf(task: Task, triggerId: number): TriggerRow | undefined {
  return task.triggers.find((t) => t.id === triggerId);
}

function push(out: LedgerInsert[], iv: LedgerInsert): void {
  // Consecutive non-runs of one cause in one write are one row.
  for (let i = out.length - 1; i >= 0; i--) {
    const p = out[i]!;
    if (p.taskId !== iv.taskId || p.triggerId !== iv.triggerId) continue;
    if (p.reason === iv.reason && p.mergeKey === iv.mergeKey && iv.afterMs === p.toMs) {
      out[i] = { ...p, toMs: iv.toMs, count: p.count + iv.count, ...(p.countAtLeast || iv.countAtLeast ? { countAtLeast: true } : {}) };
      return;
    }
    break;
  }
  out.push(iv);
}

function interval(task: Task, triggerId: number, afterMs: number | null, r: SlotRange, reason: NonRunReason, mergeKey: string,
  details: Record<string, unknown>, ctx: LedgerContext): LedgerInsert {
  return {
    taskId: task.id, taskName: task.name, triggerId, afterMs, fromMs: r.fromMs, toMs: r.toMs, count: r.count,
    ...(r.countAtLeast ? { countAtLeast: true } : {}), reason, mergeKey, details, node: ctx.node, shard: ctx.shard, epoch: ctx.epoch, createdMs: ctx.now,
  };
}

function causeOf(cause: GapCause, misfire: TaskRow["misfire"]): { reason: NonRunReason; mergeKey: string; details: Record<string, unknown> } {
  switch (cause.kind) {
    case "paused": return { reason: "paused", mergeKey: `p:${cause.pausedAtMs ?? "?"}`, details: { ...cause, misfire } };
    case "outage": return { reason: "outage", mergeKey: `o:${cause.epoch}`, details: { ...cause, misfire } };
    case "excluded": return { reason: "excluded", mergeKey: `x:${cause.why}`, details: { why: cause.why } };
    case "behind": return misfire === "skip"
      ? { reason: "misfire-skip", mergeKey: "s", details: { misfire } }
      : { reason: "collapsed", mergeKey: "c", details: { misfire } };
  }
}

/**
 * A misfire decision (resume, a slot found too late, a run that ended after slots passed): for
 * each enabled trigger, every slot after the watermark that the decision steps over is recorded
 * with the cause. What the task's pointer does next (one catch-up, none, all) is in `details`;
 * the catch-up run itself is found by `ax why` (the next `misfire` run of the task).
 *
 * The slots stepped over are those the misfire policy treats as missed: before `now - grace`, and
 * for misfire=once also every slot up to the catch-up's (it stands for all of them).
 */
export function recordMisfireGap(out: LedgerInsert[], task: Task, cause: GapCause, ctx: LedgerContext,
  opts: { graceMs?: number; compile?: (tr: TriggerRow) => CompiledTrigger; /** Tests: never take the shortcut (noSlotToStepOver). */ alwaysWalk?: boolean } = {}): void {
  const grace = opts.graceMs ?? 1000;
  const compile = opts.compile ?? compiledOf;
  for (const tr of task.triggers) {
    if (!tr.enabled || tr.kind === "fixed_delay") continue;
    const w = watermark(task.triggerSlots, tr.id);
    if (w !== null && !opts.alwaysWalk && noSlotToStepOver(tr, w, ctx.now, compile)) continue;
    let p: Pointer | null;
    try { p = nextPointer({ ...task, triggers: [tr] }, ctx.now, { graceMs: grace, compile }); } catch { continue; }
    const cutoff = ctx.now - grace;
    const until = p === null ? cutoff : p.source === "misfire" ? Math.max(cutoff, (p.slotMs ?? cutoff) + 1) : Math.min(cutoff, p.slotMs ?? cutoff);
    const r = slotsBetween(compile(tr), w, until, task.createdMs);
    if (!r) continue;
    const c = causeOf(cause, task.misfire);
    const details = { ...c.details, ...(p?.source === "misfire" ? { catchUpSlotMs: p.slotMs } : p ? { resumesAtMs: p.slotMs } : {}) };
    push(out, interval(task, tr.id, w, r, c.reason, c.mergeKey, details, ctx));
    setWatermark(task, tr.id, r.toMs);
  }
}

/**
 * True when the walk of recordMisfireGap provably records nothing for this trigger: its first
 * slot after the watermark is none, or lies beyond `now` (every `until` the walk can reach is at
 * most a slot at or before now, plus one). Every completed chain asks; the answer is nearly always
 * yes, and the walk it spares computed the task's next pointer for nothing (a cron trigger's
 * took about 15 µs, a one-shot's ended in nothing every time). Triggers with schedule options
 * (windows, jitter, run limits, calendars) shape their pointer: they take the walk. Any error
 * also does (the walk handles a trigger that no longer compiles).
 */
function noSlotToStepOver(tr: TriggerRow, w: number, nowMs: number, compile: (tr: TriggerRow) => CompiledTrigger): boolean {
  try {
    const first = compile(tr).next(w);
    if (first === null) return true; // the walk starts at this very slot: none, nothing to record
    if (scheduleOptionsOf(tr.spec as TriggerSpec)) return false;
    return first > nowMs + 1;
  } catch {
    return false;
  }
}

/** What a decision did with the one slot it was about. */
export type SlotFate =
  | { outcome: "run"; runId: string }
  /** A catch-up run: the slots up to and including its own stand for it (collapsed into it). */
  | { outcome: "catch-up"; runId: string }
  | { outcome: "overlap"; runId: string; runningRunId: string }
  | { outcome: "refused"; runId: string; executor: string; inFlight: number; limit: number; retryInMs: number }
  | { outcome: "upstream"; state: string; why: string };

/**
 * A decision about one slot (`slotMs` of `triggerId`). Slots between the watermark and it that no
 * decision recorded (there should be none) are recorded `misfire-skip` with cause "unrecorded",
 * so the ledger never has a hole. A slot at or before the watermark was accounted already and
 * changes nothing (a catch-up for slots already recorded, a withdrawn slot fired again).
 * Returns false when the slot was accounted already.
 */
export function recordSlot(out: LedgerInsert[], task: Task, triggerId: number, slotMs: number, fate: SlotFate, ctx: LedgerContext,
  opts: { compile?: (tr: TriggerRow) => CompiledTrigger } = {}): boolean {
  const tr = triggerOf(task, triggerId);
  if (!tr) return false;
  const w = watermark(task.triggerSlots, triggerId);
  if (w !== null && slotMs <= w) return false;
  const t = (opts.compile ?? compiledOf)(tr);
  let after = w;
  if (fate.outcome === "catch-up") {
    const r = slotsBetween(t, w, slotMs + 1, task.createdMs);
    if (r) push(out, interval(task, triggerId, w, r, "collapsed", `c:${fate.runId}`, { catchUpRunId: fate.runId, misfire: task.misfire }, ctx));
    setWatermark(task, triggerId, Math.max(slotMs, r?.toMs ?? slotMs));
    return true;
  }
  const gap = slotsBetween(t, w, slotMs, task.createdMs);
  if (gap) { push(out, interval(task, triggerId, w, gap, "misfire-skip", "u", { cause: "unrecorded", misfire: task.misfire }, ctx)); after = gap.toMs; }
  const one: SlotRange = { fromMs: slotMs, toMs: slotMs, count: 1, countAtLeast: false };
  switch (fate.outcome) {
    case "run": break;
    case "overlap": push(out, interval(task, triggerId, after, one, "overlap", `r:${fate.runningRunId}`, { runningRunId: fate.runningRunId, skippedRunId: fate.runId }, ctx)); break;
    case "refused": push(out, interval(task, triggerId, after, one, "refused", `e:${fate.executor}`,
      { runId: fate.runId, executor: fate.executor, inFlight: fate.inFlight, limit: fate.limit, retryInMs: fate.retryInMs }, ctx)); break;
    case "upstream": push(out, interval(task, triggerId, after, one, "upstream", `u:${fate.state}`, { state: fate.state, why: fate.why }, ctx)); break;
  }
  setWatermark(task, triggerId, slotMs);
  return true;
}

/** Slots per outcome in a write: runs (scheduled sources, fired) and the intervals' counts. For ax_slots_total. */
export function slotOutcomes(ledger: ReadonlyArray<LedgerInsert>, runs: ReadonlyArray<{ source: string; state: string; slotMs: number | null }>): Map<SlotOutcome, number> {
  const m = new Map<SlotOutcome, number>();
  for (const r of runs) if (isSlotRun(r)) m.set("run", (m.get("run") ?? 0) + 1);
  for (const iv of ledger) m.set(iv.reason, (m.get(iv.reason) ?? 0) + iv.count);
  return m;
}

/** A run that accounts for its slot: a scheduled source, fired (not skipped, not refused). */
export function isSlotRun(r: { source: string; state: string; slotMs: number | null }): boolean {
  return r.slotMs !== null && (r.source === "cron" || r.source === "rate" || r.source === "once" || r.source === "delay") && r.state !== "skipped" && r.state !== "refused";
}
