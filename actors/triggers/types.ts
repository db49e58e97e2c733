/** A wall time the clock jumps over: fire it shifted by the jump, not at all, or at the jump. */
export type DstGap = "shift" | "skip" | "transition";
/** A wall time that happens more than once: fire the first, the last, or every copy. */
export type DstRepeat = "first" | "second" | "both";

/**
 * A trigger as stored: plain data, so it can cross NATS and sit in PostgreSQL as JSON.
 * All instants are epoch milliseconds.
 */
export type TriggerSpec =
  /**
   * 5 fields (minute first) or 6 fields (second first), evaluated in the IANA zone `tz`.
   * dstGap/dstRepeat: the DST policy (docs/TRIGGERS.md); absent = the default.
   */
  | { kind: "cron"; expr: string; tz: string; dstGap?: DstGap; dstRepeat?: DstRepeat }
  /** Slots at anchorMs + k*everyMs for k >= 1 (the anchor is the creation instant, not a slot). */
  | { kind: "fixed_rate"; everyMs: number; anchorMs: number }
  /** next = previous run's completion + delayMs; the first slot is creation + delayMs. */
  | { kind: "fixed_delay"; delayMs: number }
  /** Exactly one slot. */
  | { kind: "once"; atMs: number };

export type TriggerKind = TriggerSpec["kind"];

export interface CompiledTrigger {
  readonly spec: TriggerSpec;
  /** The first scheduled slot strictly after `afterMs` (for fixed_delay: afterMs + delayMs). null = no more slots. */
  next(afterMs: number): number | null;
  /** Human sentence, e.g. `cron "*\/10 * * * * *" in Asia/Shanghai`. */
  describe(): string;
  /** Explains how `slotMs` was computed from `afterMs`, for lineage ("why did this run at that time"). */
  explain(afterMs: number, slotMs: number): string;
}

export type MisfirePolicy = "once" | "skip" | "all";

export interface Plan {
  /** Runs to start now; dueMs is the time they should be considered due. */
  fire: Array<{ slotMs: number; dueMs: number; catchUp: boolean }>;
  /** How many slots were in the past (for cron triggers this stops counting at CRON_MISSED_COUNT_LIMIT). */
  missed: number;
  /** The next slot to schedule after these; null = nothing to schedule (see planAfter for fixed_delay). */
  nextSlotMs: number | null;
}
