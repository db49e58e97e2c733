import { InvalidInputError } from "../../common/index.ts";
import { cachedCron, cronLatestBefore } from "./cron.ts";
import type { CompiledTrigger, MisfirePolicy, Plan } from "./types.ts";

/**
 * Walking missed cron slots one by one costs 10-300 µs each; after a long outage of a dense
 * expression that would stall the scheduler. Past this many, planAfter jumps to the latest
 * slots instead and `missed` stops counting (reports this value, meaning "at least").
 */
export const CRON_MISSED_COUNT_LIMIT = 10_000;
export const MAX_CATCH_UP_LIMIT = 10_000;

const POLICIES: readonly MisfirePolicy[] = ["once", "skip", "all"];

interface MissedWindow {
  missed: number;
  /** The latest `keep` missed slots, ascending. */
  kept: number[];
  /** The latest missed slot. */
  latest: number;
}

function keepLatest(ring: number[], slot: number, keep: number): void {
  if (keep === 0) return;
  ring.push(slot);
  if (ring.length > keep) ring.shift();
}

/** Missed slots of a fixed_rate trigger, by arithmetic: an outage of any length costs O(keep). */
function fixedRateWindow(first: number, everyMs: number, cutoff: number, keep: number): MissedWindow {
  const missed = Math.ceil((cutoff - first) / everyMs);
  const latest = first + (missed - 1) * everyMs;
  const kept: number[] = [];
  for (let i = Math.max(0, missed - keep); i < missed; i++) kept.push(first + i * everyMs);
  return { missed, kept, latest };
}

/** Missed cron slots, found by walking next() from the first one; jumps once the walk gets too long. */
function cronWindow(t: CompiledTrigger, first: number, cutoff: number, keep: number): MissedWindow {
  const kept: number[] = [];
  let missed = 0;
  let latest = first;
  let s: number | null = first;
  while (s !== null && s < cutoff) {
    missed++;
    latest = s;
    keepLatest(kept, s, keep);
    const next = t.next(s);
    if (missed === CRON_MISSED_COUNT_LIMIT && next !== null && next < cutoff) {
      // Jump: the latest slots before the cutoff, found backwards with prev().
      const sp = t.spec;
      const dst = sp.kind === "cron" ? { ...(sp.dstGap ? { gap: sp.dstGap } : {}), ...(sp.dstRepeat ? { repeat: sp.dstRepeat } : {}) } : {};
      const tail = sp.kind === "cron" ? cronLatestBefore(cachedCron(sp.expr, sp.tz, dst), cutoff, s, Math.max(keep, 1)) : [];
      if (tail.length > 0) {
        for (const slot of tail) keepLatest(kept, slot, keep);
        return { missed, kept, latest: tail[tail.length - 1]! };
      }
      // prev() and next() disagree (a trigger that is not our cron): stop here rather than walk
      // without bound; the slots after `s` are planned by the next call.
      return { missed, kept, latest: s };
    }
    s = next;
  }
  return { missed, kept, latest };
}

/**
 * Decides what to do when the scheduler looks at a trigger whose last scheduled slot was
 * `lastSlotMs` (null = never) at `nowMs`.
 *
 * - Cadence follows the previous SCHEDULED slot, never now, so a late look cannot shift
 *   future slots (no drift).
 * - A slot is missed when slot < nowMs - graceMs; the first slot >= nowMs - graceMs is
 *   returned as nextSlotMs and nothing fires (the scheduler's timer does that).
 * - Missed slots: "once" fires the latest one now (dueMs = nowMs); "skip" fires none; "all"
 *   fires the latest maxCatchUp of them in order (dueMs = slotMs). All marked catchUp.
 * - nextSlotMs is then the slot after the latest missed one: cadence resumes without a pile-up.
 *
 * First slot when lastSlotMs is null: cron next(createdAtMs ?? nowMs), fixed_rate the first slot
 * after its anchor, fixed_delay createdAt + delay, once its atMs.
 *
 * Kind-specific rules:
 * - once: next(atMs) is null, so planAfter(once, atMs, ...) never fires again. A once trigger
 *   whose instant had already passed at creation (parseTrigger tolerates that) fires even under
 *   "skip": it is what the user asked for, not a misfire.
 * - fixed_delay: pass the previous run's COMPLETION time as lastSlotMs. At most one slot can be
 *   missed (later ones depend on runs that did not happen). After firing it nextSlotMs is null
 *   until that run completes; when skipped, nextSlotMs = nowMs + delayMs.
 * - cron: beyond CRON_MISSED_COUNT_LIMIT missed slots, `missed` reports the limit.
 */
export function planAfter(
  t: CompiledTrigger,
  lastSlotMs: number | null,
  nowMs: number,
  misfire: MisfirePolicy,
  opts: { graceMs?: number; maxCatchUp?: number; createdAtMs?: number } = {},
): Plan {
  const graceMs = opts.graceMs ?? 1000;
  const maxCatchUp = opts.maxCatchUp ?? 100;
  const createdAtMs = opts.createdAtMs ?? nowMs;
  if (!POLICIES.includes(misfire)) throw new InvalidInputError("misfire", misfire, "must be once, skip or all", "AX_E_INVALID");
  if (lastSlotMs !== null && !Number.isFinite(lastSlotMs)) throw new InvalidInputError("lastSlotMs", lastSlotMs, "must be epoch milliseconds or null", "AX_E_INVALID");
  if (!Number.isFinite(nowMs)) throw new InvalidInputError("nowMs", nowMs, "must be epoch milliseconds", "AX_E_INVALID");
  if (!Number.isFinite(createdAtMs)) throw new InvalidInputError("createdAtMs", createdAtMs, "must be epoch milliseconds", "AX_E_INVALID");
  if (!Number.isFinite(graceMs) || graceMs < 0) throw new InvalidInputError("graceMs", graceMs, "must be >= 0", "AX_E_INVALID");
  if (!Number.isSafeInteger(maxCatchUp) || maxCatchUp < 0 || maxCatchUp > MAX_CATCH_UP_LIMIT) {
    throw new InvalidInputError("maxCatchUp", maxCatchUp, `must be a whole number between 0 and ${MAX_CATCH_UP_LIMIT}`, "AX_E_INVALID");
  }

  const spec = t.spec;
  let first: number | null;
  if (lastSlotMs !== null) first = t.next(lastSlotMs);
  else if (spec.kind === "once") first = spec.atMs;
  else if (spec.kind === "fixed_rate") first = t.next(spec.anchorMs);
  else first = t.next(createdAtMs);

  const cutoff = nowMs - graceMs;
  if (first === null || first >= cutoff) return { fire: [], missed: 0, nextSlotMs: first };

  let policy = misfire;
  if (spec.kind === "once" && lastSlotMs === null && first <= createdAtMs && policy === "skip") policy = "once";
  const keep = policy === "all" ? maxCatchUp : policy === "once" ? 1 : 0;

  const w: MissedWindow = spec.kind === "fixed_rate"
    ? fixedRateWindow(first, spec.everyMs, cutoff, keep)
    : spec.kind === "cron"
      ? cronWindow(t, first, cutoff, keep)
      // once and fixed_delay have exactly one pending slot.
      : { missed: 1, kept: keep > 0 ? [first] : [], latest: first };

  const fire: Plan["fire"] = policy === "once"
    ? [{ slotMs: w.latest, dueMs: nowMs, catchUp: true }]
    : w.kept.map((slotMs) => ({ slotMs, dueMs: slotMs, catchUp: true }));

  let nextSlotMs: number | null;
  if (spec.kind === "fixed_delay") nextSlotMs = fire.length > 0 ? null : nowMs + spec.delayMs;
  else nextSlotMs = t.next(w.latest);
  return { fire, missed: w.missed, nextSlotMs };
}
