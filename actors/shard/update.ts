import type { MisfirePolicy, OverlapPolicy, TaskRow, TriggerRow } from "../store/index.ts";
import { editSlots } from "../store/index.ts";
import type { TaskRecord } from "../machine/index.ts";

/**
 * `ax task update` as a message to the task's shard: the new values of the fields that change
 * (absent = unchanged; `payload` changes when the key is present, even to null) and the
 * generation the caller read (a concurrent update in between is refused, not overwritten).
 * `triggers` is the whole new trigger set, its rows already inserted by the API.
 */
export interface DefinitionChange {
  expectGeneration: number;
  who: string;
  fields: {
    executor?: string;
    payload?: unknown;
    timeoutMs?: number;
    maxAttempts?: number;
    backoffMs?: number;
    backoffMaxMs?: number;
    misfire?: MisfirePolicy;
    overlap?: OverlapPolicy;
    triggers?: TriggerRow[];
  };
  /** field → { from, to } in words, for the history row and `ax why`. */
  summary: Record<string, { from: unknown; to: unknown }>;
}

/**
 * Applies a definition change to a task row in place (pure: no I/O). A trigger set that changes
 * starts afresh: the old triggers' slots are forgotten, and a cron or fixed-rate trigger counts
 * from the update instant (its first slot is the first one after it; a pause until later then
 * misses the slots in between as usual). Fixed-delay and once triggers start from their spec.
 * Returns the ids of the replaced triggers.
 */
export function applyDefinitionChange(row: TaskRow, change: DefinitionChange, nowMs: number): { unlinked: number[] } {
  const f = change.fields;
  let unlinked: number[] = [];
  if (f.triggers) {
    unlinked = row.triggers.map((t) => t.id);
    const added = f.triggers;
    row.triggerSlots = editSlots(row.triggerSlots, (slots) => {
      for (const id of unlinked) delete slots[String(id)];
      for (const tr of added) if (tr.kind === "cron" || tr.kind === "fixed_rate") slots[String(tr.id)] = nowMs;
    });
    row.triggers = f.triggers;
  }
  if (f.executor !== undefined) row.executor = f.executor;
  if ("payload" in f) row.payload = f.payload ?? null;
  if (f.timeoutMs !== undefined) row.timeoutMs = f.timeoutMs;
  if (f.backoffMs !== undefined) row.backoffMs = f.backoffMs;
  if (f.backoffMaxMs !== undefined) row.backoffMaxMs = f.backoffMaxMs;
  if (f.misfire !== undefined) row.misfire = f.misfire;
  if (f.maxAttempts !== undefined || f.overlap !== undefined) {
    if (f.maxAttempts !== undefined) row.maxAttempts = f.maxAttempts;
    if (f.overlap !== undefined) row.overlap = f.overlap;
    // The machine's context carries both (the row's columns restore them on every load).
    const rec = row.record as TaskRecord;
    row.record = { ...rec, context: { ...rec.context, maxAttempts: row.maxAttempts, overlap: row.overlap } };
  }
  row.generation += 1;
  return { unlinked };
}
