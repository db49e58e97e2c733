import { InvalidInputError } from "../common/index.ts";
import { compiledOf, type RunRow, type Store, type TaskRow } from "../actors/index.ts";
import { LedgerStore, type LedgerRow } from "../actors/store/index.ts";
import type { CompiledTrigger } from "../actors/triggers/index.ts";
import { isSlotRun, pausedAt, slotsBetween } from "../actors/shard/ledger.ts";

/**
 * "Why did nothing run at 03:00?": the ledger of occurrences read back as sentences
 * (`ax why TASK --at TIME`, `--between T1 T2`), and the timeline of runs and non-runs
 * (`ax runs TASK --all`, the `ledger` API op for the dashboard).
 */

const iso = (ms: number | null | undefined) => (ms === null || ms === undefined ? "?" : new Date(ms).toISOString());

function local(ms: number, tz: string): string {
  try {
    const f = new Intl.DateTimeFormat("en-CA", { timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
    const p = Object.fromEntries(f.formatToParts(new Date(ms)).map((x) => [x.type, x.value]));
    return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${tz}`;
  } catch { return iso(ms); }
}

function zoneOf(t: CompiledTrigger): string | null {
  return t.spec.kind === "cron" ? t.spec.tz : null;
}

/** A time argument: ISO 8601, or epoch milliseconds. */
export function parseInstant(field: string, v: unknown): number {
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return v;
  if (typeof v === "string" && /^\d{1,16}$/.test(v)) return Number(v);
  if (typeof v === "string" && v.length <= 64) {
    const ms = Date.parse(v);
    if (Number.isFinite(ms)) return ms;
  }
  throw new InvalidInputError(field, v, "not a time (ISO 8601 such as 2026-12-03T03:00:00+08:00, or epoch milliseconds)");
}

interface Audit { atMs: number; who: string; op: string }

export class LedgerView {
  private readonly ledger: LedgerStore;
  constructor(private readonly store: Store, private readonly now: () => number) { this.ledger = new LedgerStore(store.pool); }

  private async slotRuns(taskId: number, fromMs: number, toMs: number): Promise<RunRow[]> {
    return this.store.getRuns(await this.store.browse.slotRunIds(taskId, fromMs, toMs));
  }

  /** The first catch-up run of the task recorded at or after `ms` (what a misfire decision fired). */
  private async catchUpAfter(taskId: number, ms: number): Promise<RunRow | null> {
    const id = await this.store.browse.catchUpAfter(taskId, ms);
    return id === null ? null : (await this.store.getRuns([id]))[0] ?? null;
  }

  private async retryOf(runId: string): Promise<RunRow | null> {
    const id = await this.store.browse.firstRunCausedBy(runId);
    return id === null ? null : (await this.store.getRuns([id]))[0] ?? null;
  }

  private async audit(task: TaskRow): Promise<Audit[]> {
    try {
      return await this.store.audit.pausesAndResumes([task.name, String(task.id)]);
    } catch { return []; } // the audit trail unreadable: the explanation goes without it
  }

  /** Sentences about one non-run interval (the slot, when given, is the one asked about). */
  private async explainInterval(task: TaskRow, iv: LedgerRow, audit: Audit[]): Promise<string[]> {
    const d = iv.details;
    const s: string[] = [];
    const span = iv.count === 1 ? `the slot ${iso(iv.fromMs)}` : `${iv.countAtLeast ? "at least " : ""}${iv.count} slots from ${iso(iv.fromMs)} to ${iso(iv.toMs)}`;
    const were = iv.count === 1 ? "was" : "were";
    const misfire = typeof d.misfire === "string" ? d.misfire : task.misfire;
    const catchUp = async (fromMs: number): Promise<string> => {
      if (misfire === "skip") return `misfire=skip: no catch-up; the cadence resumed${typeof d.resumesAtMs === "number" ? ` at ${iso(d.resumesAtMs)}` : ""}.`;
      const r = typeof d.catchUpRunId === "string" ? (await this.store.getRuns([d.catchUpRunId]))[0] ?? null : await this.catchUpAfter(task.id, fromMs);
      if (!r) return `misfire=${misfire}: no catch-up run is recorded (yet).`;
      return `misfire=${misfire} fired ${misfire === "once" ? "one catch-up" : "catch-ups, the first"} at ${iso(r.firedMs)} (run ${r.id}, ${r.state}).`;
    };
    switch (iv.reason) {
      case "paused": {
        const p = auditNear(audit, "task.pause", d.pausedAtMs as number | null);
        const q = auditNear(audit, "task.resume", d.resumedAtMs as number);
        const pausedWhy = typeof d.stuck === "string" ? ` (its schedule could not be computed: ${d.stuck})` : p ? ` by ${p.who}` : "";
        s.push(`It did not fire because the task was paused${pausedWhy} at ${iso(d.pausedAtMs as number | null)} and resumed${q ? ` by ${q.who}` : ""} at ${iso(d.resumedAtMs as number)}; ${span} fell in the pause.`);
        s.push(await catchUp(Number(d.resumedAtMs ?? iv.createdMs)));
        break;
      }
      case "outage":
        s.push(`It did not fire because shard ${iv.shard} had no owner able to fire it: its previous owner${d.lastOwner ? ` ${String(d.lastOwner)} (epoch ${String(d.lastEpoch)}, owner since ${iso(d.lastOwnerSinceMs as number | null)})` : ""} had stopped firing it (died, or handed it over), and node ${String(d.node)} acquired it at ${iso(d.acquiredMs as number)} under epoch ${String(d.epoch)}, too late for ${span} (more than the 1 s grace).`);
        s.push(await catchUp(Number(d.acquiredMs ?? iv.createdMs)));
        break;
      case "collapsed": {
        const r = typeof d.catchUpRunId === "string" ? (await this.store.getRuns([d.catchUpRunId]))[0] ?? null : await this.catchUpAfter(task.id, iv.createdMs);
        s.push(`It was collapsed into a catch-up (misfire=${misfire}): ${span} ${iv.count === 1 ? "was" : "were"} already past when the task could next be decided (the node was behind, or a retry chain held the task)${r ? `, and catch-up run ${r.id} stood for ${iv.count === 1 ? "it" : "them"}, fired at ${iso(r.firedMs)} (${r.state})` : ""}.`);
        break;
      }
      case "misfire-skip":
        s.push(d.cause === "unrecorded"
          ? `It was not fired: ${span} ${were} already past when the task was next decided (a retry chain or a late decision held it), and no decision named another cause; misfire=${misfire}.`
          : `It was skipped by the misfire policy (misfire=skip): ${span} ${were} already past when the task could next be decided; the cadence resumed with the next slot.`);
        break;
      case "overlap": {
        s.push(`It was not fired because run ${String(d.runningRunId)} was still in flight (overlap=forbid); ${span} ${were} skipped while it ran${d.skippedRunId ? ` (last recorded as skipped run ${String(d.skippedRunId)})` : ""}.`);
        if (misfire !== "skip") s.push(await catchUp(iv.updatedMs));
        break;
      }
      case "refused": {
        const retry = typeof d.runId === "string" ? await this.retryOf(d.runId) : null;
        s.push(`It was refused by the in-flight bound: executor ${String(d.executor)} had ${String(d.inFlight)} run(s) in flight (limit ${String(d.limit)}); run ${String(d.runId)} was recorded refused${iv.count > 1 ? ` (${span} in a row)` : ""}.`);
        s.push(retry ? `It was retried as run ${retry.id} at ${iso(retry.firedMs)} (${retry.state}).` : `A retry was due ${String(d.retryInMs)} ms later.`);
        break;
      }
      case "upstream":
        s.push(`It was not fired: the task was ${String(d.state)} (${String(d.why)}); ${span}.`);
        break;
      case "excluded":
        s.push(`It is outside the task's schedule: ${String(d.why)} (${span}).`);
        break;
    }
    return s;
  }

  /** `ax why TASK --at TIME`: the nearest slot of each trigger, and what happened to it. */
  async whyAt(task: TaskRow, atMs: number): Promise<{ task: string; at: string; slots: Array<Record<string, unknown>>; sentences: string[] }> {
    const now = this.now();
    const audit = await this.audit(task);
    const sentences: string[] = [];
    const slots: Array<Record<string, unknown>> = [];
    const triggers = task.triggers.filter((t) => t.kind !== "fixed_delay");
    if (!triggers.length) sentences.push(`Task ${task.name} has no trigger with slots (it runs after its upstreams or after each completion): nothing was due at ${iso(atMs)}.`);
    for (const tr of triggers) {
      const t = compiledOf(tr);
      const upTo = slotsBetween(t, null, atMs + 1, task.createdMs);
      const next = upTo ? t.next(upTo.toMs) : (() => { const r = slotsBetween(t, null, Number.MAX_SAFE_INTEGER, task.createdMs); return r?.fromMs ?? null; })();
      let slot: number | null; let n: number; let atLeast = false;
      if (upTo && (next === null || atMs - upTo.toMs <= next - atMs)) { slot = upTo.toMs; n = upTo.count; atLeast = upTo.countAtLeast; }
      else { slot = next; n = (upTo?.count ?? 0) + 1; atLeast = upTo?.countAtLeast ?? false; }
      const tz = zoneOf(t);
      if (slot === null) { sentences.push(`${t.describe()} has no slot near ${iso(atMs)}.`); continue; }
      const when = `${iso(slot)}${tz ? ` (${local(slot, tz)})` : ""}`;
      sentences.push(`${when} was slot ${atLeast ? "≥ " : ""}${n} of ${t.describe()}${tr.enabled ? "" : " (trigger disabled)"}${slot !== atMs ? `, the nearest to ${iso(atMs)}` : ""}.`);
      const entry: Record<string, unknown> = { triggerId: tr.id, trigger: t.describe(), slot: iso(slot), slotNumber: n, ...(tz ? { zone: tz } : {}) };
      slots.push(entry);
      const runs = (await this.slotRuns(task.id, slot, slot)).filter((r) => r.triggerId === tr.id);
      const ran = runs.find((r) => isSlotRun(r));
      if (ran) {
        entry.outcome = "run"; entry.runId = ran.id;
        sentences.push(`It ran: run ${ran.id} (${ran.source}) was fired at ${iso(ran.firedMs)} by node ${ran.node} from shard ${ran.shard} under epoch ${ran.epoch}, and is ${ran.state}${ran.finishedMs ? ` (ended ${iso(ran.finishedMs)})` : ""}. \`ax why ${ran.id}\` tells more.`);
        continue;
      }
      const iv = (await this.ledger.between(task.id, slot, slot)).find((x) => x.triggerId === tr.id);
      if (iv) {
        entry.outcome = iv.reason; entry.interval = publicInterval(iv);
        sentences.push(...await this.explainInterval(task, iv, audit));
        continue;
      }
      entry.outcome = null;
      const p = pausedAt(task.triggerSlots);
      if (slot > now) sentences.push(`It is still to come (now is ${iso(now)}); the task's next due time is ${iso(task.nextDueMs)}.`);
      else if (task.state === "paused") sentences.push(`It has not fired: the task is paused${p !== null ? ` since ${iso(p)}` : ""}${auditNear(audit, "task.pause", p) ? ` by ${auditNear(audit, "task.pause", p)!.who}` : ""}; the slots of a pause are recorded when it is resumed.`);
      else if (task.nextSlotMs !== null && slot >= task.nextSlotMs) sentences.push(`It is being decided: the task's next slot is ${iso(task.nextSlotMs)}, due ${iso(task.nextDueMs)}.`);
      else sentences.push("No record of it: it came before the ledger existed, or its record passed the retention period.");
    }
    return { task: task.name, at: iso(atMs), slots, sentences };
  }

  /** `ax why TASK --between T1 T2`: every slot in the window, summed per outcome, and each non-run interval. */
  async whyBetween(task: TaskRow, fromMs: number, toMs: number): Promise<{ task: string; from: string; to: string; outcomes: Record<string, number>; sentences: string[] }> {
    if (toMs < fromMs) throw new InvalidInputError("between", [iso(fromMs), iso(toMs)], "the end is before the start");
    const audit = await this.audit(task);
    const outcomes: Record<string, number> = {};
    const sentences: string[] = [];
    const runs = await this.slotRuns(task.id, fromMs, toMs);
    const ivs = await this.ledger.between(task.id, fromMs, toMs);
    for (const tr of task.triggers.filter((x) => x.kind !== "fixed_delay")) {
      const t = compiledOf(tr);
      const all = slotsBetween(t, fromMs - 1, toMs + 1, task.createdMs);
      const ran = runs.filter((r) => r.triggerId === tr.id && isSlotRun(r));
      const mine = ivs.filter((x) => x.triggerId === tr.id);
      const parts: string[] = [];
      if (ran.length) { parts.push(`${ran.length} ran`); outcomes.run = (outcomes.run ?? 0) + ran.length; }
      let accounted = ran.length;
      for (const iv of mine) {
        const inside = slotsBetween(t, Math.max(iv.fromMs, fromMs) - 1, Math.min(iv.toMs, toMs) + 1, task.createdMs)?.count ?? 0;
        accounted += inside;
        outcomes[iv.reason] = (outcomes[iv.reason] ?? 0) + inside;
        parts.push(`${inside} ${iv.reason}`);
      }
      const total = all?.count ?? 0;
      const open = Math.max(0, total - accounted);
      if (open) { parts.push(`${open} not decided yet or not recorded`); outcomes.open = (outcomes.open ?? 0) + open; }
      sentences.push(`Between ${iso(fromMs)} and ${iso(toMs)}, ${t.describe()} had ${all?.countAtLeast ? "at least " : ""}${total} slot(s): ${parts.join(", ") || "none"}.`);
      for (const iv of mine) sentences.push(`• ${iso(iv.fromMs)} … ${iso(iv.toMs)} (${iv.count} slot(s), ${iv.reason}): ${(await this.explainInterval(task, iv, audit)).join(" ")}`);
    }
    return { task: task.name, from: iso(fromMs), to: iso(toMs), outcomes, sentences };
  }

  /** `ax runs TASK --all` and the dashboard's timeline: runs and non-run intervals, newest first. */
  async timeline(task: TaskRow, limit: number): Promise<Array<Record<string, unknown>>> {
    const runs = await this.store.listRuns(task.id, limit);
    const ivs = await this.ledger.latest(task.id, limit);
    const rows: Array<{ at: number; row: Record<string, unknown> }> = [];
    for (const r of runs) {
      rows.push({ at: r.slotMs ?? r.dueMs, row: { kind: "run", at: iso(r.slotMs ?? r.dueMs), id: r.id, source: r.source, state: r.state, slots: r.slotMs !== null && isSlotRun(r) ? 1 : 0,
        firedAt: iso(r.firedMs), node: r.node, shard: r.shard, epoch: r.epoch, error: r.error } });
    }
    for (const iv of ivs) rows.push({ at: iv.toMs, row: { kind: "non-run", ...publicInterval(iv) } });
    rows.sort((a, b) => b.at - a.at);
    return rows.slice(0, limit).map((x) => x.row);
  }
}

/** The audit entry (who) of a pause or resume the shard recorded at `ms`. */
function auditNear(audit: Audit[], op: string, ms: number | null | undefined): Audit | undefined {
  if (ms === null || ms === undefined) return undefined;
  let best: Audit | undefined;
  for (const a of audit) if (a.op === op && a.atMs <= ms + 2000 && a.atMs >= ms - 60_000) best = a;
  return best;
}

export function publicInterval(iv: LedgerRow): Record<string, unknown> {
  return {
    at: iso(iv.toMs), id: `L${iv.id}`, reason: iv.reason, triggerId: iv.triggerId, from: iso(iv.fromMs), to: iso(iv.toMs), slots: iv.count,
    ...(iv.countAtLeast ? { slotsAtLeast: true } : {}), details: iv.details, node: iv.node, shard: iv.shard, epoch: iv.epoch,
  };
}
