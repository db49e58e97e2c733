import type { RunEvent } from "../../protocol/index.ts";
import type { TaskEvent } from "../machine/index.ts";
import type { RunUpdate } from "../store/index.ts";

/** What the shard knows of an event's run when the event arrives. */
export interface EventContext {
  /** The run is in flight on this shard. */
  inFlight: boolean;
  /** The event carries the run's token (only the holder of its dispatch knows it). */
  tokenOk: boolean;
  /** This shard already applied an end of the run (the event came again: redelivered, re-published). */
  endApplied: boolean;
  /** The executor instance that sent it. */
  instance: string;
}

/**
 * What to do with one event: the pure part of the shard's event handling (the actor applies it).
 * - `refuse`: not from the dispatch's holder; nothing changes (counted, logged).
 * - `runUpdate`: a change to the run's row (a start, a late outcome).
 * - `extend`: the run in flight gets its whole timeout again from now.
 * - `startedMs`: the run in flight started then (duration metrics).
 * - `finish`: the run in flight ends: its row update and the task machine's event. The actor
 *   notes the end as applied, so the same end arriving again changes nothing.
 */
export type EventDecision =
  | { refuse: true }
  | { refuse?: false; runUpdate?: Omit<RunUpdate, "id">; extend?: boolean; startedMs?: number; finish?: { event: TaskEvent; update: Omit<RunUpdate, "id"> } };

const NOTHING: EventDecision = {};

export function decideEvent(ev: RunEvent, c: EventContext): EventDecision {
  if (!c.tokenOk) return { refuse: true };
  switch (ev.type) {
    case "started":
      // Recorded even for a run no longer in flight (its start, late, is still its start).
      return { runUpdate: { startedMs: ev.at, executorInstance: c.instance }, ...(c.inFlight ? { extend: true, startedMs: ev.at } : {}) };
    case "progress":
      return c.inFlight ? { extend: true } : NOTHING;
    case "stale": {
      const reason = ev.reason ?? "stale";
      if (!c.inFlight) return c.endApplied ? NOTHING : { runUpdate: { lateOutcome: `stale: ${reason}` } };
      // Not started by the executor: recorded as such, and the task goes on as after a timeout.
      return { finish: { event: { type: "TIMED_OUT", runId: ev.runId }, update: { finishedMs: ev.at, state: "stale", error: `not run by executor ${c.instance}: ${reason}` } } };
    }
    case "completed":
    case "failed": {
      const ok = ev.type === "completed";
      const message = ev.error?.message ?? "failed";
      const result = ev.result !== undefined ? { result: ev.result } : {};
      // A short run's end may carry its start instead of a separate `started` event.
      const start = ev.startedAt !== undefined ? { startedMs: ev.startedAt, executorInstance: c.instance } : {};
      if (!c.inFlight) {
        if (c.endApplied) return NOTHING;
        // Late: the run was already timed out (and retried). Recorded on the run; the task does not move.
        return { runUpdate: { lateOutcome: ok ? "success" : `failed: ${ev.error?.message ?? "error"}`, executorInstance: c.instance, ...start, ...result } };
      }
      const event: TaskEvent = ok ? { type: "SUCCEEDED", runId: ev.runId }
        : { type: "FAILED", runId: ev.runId, error: message, ...(ev.error?.nonRetryable ? { retryable: false } : {}) };
      return { finish: { event, update: { finishedMs: ev.at, state: ok ? "success" : "failed", ...(ok ? {} : { error: message }), ...start, ...result } } };
    }
  }
}
