/**
 * The task lifecycle machine: the single place task transitions are decided.
 *
 * Idle tasks are plain `TaskRecord`s (`{ value, context }`), never live actors; `applyEvent`
 * (apply.ts) restores a record with `taskMachine.resolveState` and runs XState's pure
 * `transition` on it. A refused event leaves the snapshot untouched (every accepted
 * transition below changes the state value or assigns the context, which is how a refusal
 * is told apart).
 *
 * States and transitions ("own run" = the event's runId is in `inFlight`; "last" = it is the
 * only one; everything not listed is refused with AX_E_ILLEGAL_TRANSITION):
 *
 * | state           | FIRE                                   | SUCCEEDED / FAILED / TIMED_OUT / REFUSED (own run)            | PAUSE   | RESUME                       | CANCEL    | UPSTREAM_FAILED |
 * |-----------------|----------------------------------------|---------------------------------------------------------------|---------|------------------------------|-----------|-----------------|
 * | pending         | running                                | –                                                             | paused  | –                            | cancelled | upstream_failed |
 * | running         | running if overlap "allow" (¹)         | not last: running; last: paused if pausedAfterRun, else (²)   | paused  | running, only if pausedAfterRun (clears it) | cancelled | – |
 * | success         | running                                | –                                                             | paused  | –                            | cancelled | upstream_failed |
 * | failed          | running                                | –                                                             | paused  | –                            | cancelled | upstream_failed |
 * | retry           | running (attempt + 1 whatever source)  | –                                                             | paused  | –                            | cancelled | upstream_failed |
 * | paused          | running, only with force (³)           | paused                                                        | paused (no-op) | running if runs in flight, else pending | cancelled | – |
 * | cancelled       | –                                      | cancelled (the run is dropped from inFlight)                  | –       | –                            | –         | –               |
 * | upstream_failed | running                                | –                                                             | paused  | –                            | cancelled | –               |
 *
 * (¹) overlap "forbid" with a run in flight: refused with AX_E_TASK_RUNNING and the running
 *     run id, also for a forced FIRE. A FIRE reusing a run id already in flight is refused.
 * (²) SUCCEEDED → success; FAILED / TIMED_OUT → retry while attempt < maxAttempts (and
 *     FAILED.retryable !== false), else failed; REFUSED → retry with the attempt given back.
 * (³) A forced run from paused sets `pausedAfterRun`: when it completes the task is paused again.
 *
 * Attempts: a FIRE with source "retry", or any FIRE from `retry`, runs attempt + 1; every
 * other FIRE starts a new chain at attempt 1. `cancelled` is the end of the line in the domain
 * sense, but not an XState final state: completions of runs still in flight must still be
 * accepted there (a final snapshot would ignore them).
 */
import { assign, setup } from "xstate";
import type { TaskContext, TaskEvent } from "./types.ts";

type Ev<T extends TaskEvent["type"]> = Extract<TaskEvent, { type: T }>;
type CompletionEvent = Ev<"SUCCEEDED" | "FAILED" | "TIMED_OUT" | "REFUSED">;

/** overlap "forbid" and something is in flight: no new run may start. */
export function busyForbidden(context: TaskContext): boolean {
  return context.overlap === "forbid" && context.inFlight.length > 0;
}

function isCompletion(event: TaskEvent): event is CompletionEvent {
  return event.type === "SUCCEEDED" || event.type === "FAILED" || event.type === "TIMED_OUT" || event.type === "REFUSED";
}

function canStart(context: TaskContext, event: TaskEvent): boolean {
  return event.type === "FIRE" && !busyForbidden(context) && !context.inFlight.includes(event.runId);
}

function ownRun(context: TaskContext, event: TaskEvent): boolean {
  return isCompletion(event) && context.inFlight.includes(event.runId);
}

function ownLastRun(context: TaskContext, event: TaskEvent): boolean {
  return ownRun(context, event) && context.inFlight.length === 1;
}

/** Would a failure of the last run leave an attempt to retry with? */
function retryable(context: TaskContext, event: TaskEvent): boolean {
  if (event.type === "FAILED" && event.retryable === false) return false;
  return context.attempt < context.maxAttempts;
}

function startRun(context: TaskContext, event: TaskEvent, fromRetry: boolean): TaskContext {
  if (event.type !== "FIRE") return context;
  const attempt = fromRetry || event.source === "retry" ? context.attempt + 1 : 1;
  return { ...context, attempt, inFlight: [...context.inFlight, event.runId], lastRunId: event.runId };
}

/** The context after a completion event of an own run. */
function finishRun(context: TaskContext, event: TaskEvent): TaskContext {
  if (!isCompletion(event)) return context;
  const inFlight = context.inFlight.filter((id) => id !== event.runId);
  const last = inFlight.length === 0;
  let { attempt, lastError } = context;
  switch (event.type) {
    case "SUCCEEDED":
      lastError = null;
      break;
    case "FAILED":
      lastError = event.error;
      break;
    case "TIMED_OUT":
      lastError = "timed out";
      break;
    case "REFUSED":
      // The dispatch never happened: give the attempt back so the next retry FIRE reuses it.
      if (last) attempt = Math.max(0, attempt - 1);
      break;
  }
  return { ...context, attempt, inFlight, lastError, pausedAfterRun: last ? false : context.pausedAfterRun };
}

export const taskMachine = setup({
  types: {} as { context: TaskContext; events: TaskEvent },
  guards: {
    canStart: ({ context, event }) => canStart(context, event),
    canStartForced: ({ context, event }) => canStart(context, event) && event.type === "FIRE" && event.force === true,
    ownRun: ({ context, event }) => ownRun(context, event),
    ownRunOthersRemain: ({ context, event }) => ownRun(context, event) && context.inFlight.length > 1,
    ownLastRunBackToPaused: ({ context, event }) => ownLastRun(context, event) && context.pausedAfterRun,
    ownLastRunRetryable: ({ context, event }) => ownLastRun(context, event) && retryable(context, event),
    ownLastRun: ({ context, event }) => ownLastRun(context, event),
    hasInFlight: ({ context }) => context.inFlight.length > 0,
    pausedAfterRun: ({ context }) => context.pausedAfterRun,
  },
  actions: {
    startRun: assign(({ context, event }, params: { fromRetry: boolean }) => startRun(context, event, params.fromRetry)),
    startForcedRun: assign(({ context, event }) => ({ ...startRun(context, event, false), pausedAfterRun: true })),
    finishRun: assign(({ context, event }) => finishRun(context, event)),
    clearPausedAfterRun: assign({ pausedAfterRun: false }),
    recordUpstreamFailure: assign({
      lastError: ({ event }) => (event.type === "UPSTREAM_FAILED" ? event.reason : null),
    }),
  },
}).createMachine({
  id: "task",
  initial: "pending",
  // Records are built by initialRecord(); this default only serves visualisation.
  context: { attempt: 0, maxAttempts: 1, overlap: "forbid", inFlight: [], lastRunId: null, lastError: null, pausedAfterRun: false },
  states: {
    pending: {
      on: {
        FIRE: { guard: "canStart", target: "running", actions: { type: "startRun", params: { fromRetry: false } } },
        PAUSE: { target: "paused", actions: "clearPausedAfterRun" },
        CANCEL: { target: "cancelled", actions: "clearPausedAfterRun" },
        UPSTREAM_FAILED: { target: "upstream_failed", actions: "recordUpstreamFailure" },
      },
    },
    running: {
      on: {
        FIRE: { guard: "canStart", actions: { type: "startRun", params: { fromRetry: false } } },
        SUCCEEDED: [
          { guard: "ownRunOthersRemain", actions: "finishRun" },
          { guard: "ownLastRunBackToPaused", target: "paused", actions: "finishRun" },
          { guard: "ownLastRun", target: "success", actions: "finishRun" },
        ],
        FAILED: [
          { guard: "ownRunOthersRemain", actions: "finishRun" },
          { guard: "ownLastRunBackToPaused", target: "paused", actions: "finishRun" },
          { guard: "ownLastRunRetryable", target: "retry", actions: "finishRun" },
          { guard: "ownLastRun", target: "failed", actions: "finishRun" },
        ],
        TIMED_OUT: [
          { guard: "ownRunOthersRemain", actions: "finishRun" },
          { guard: "ownLastRunBackToPaused", target: "paused", actions: "finishRun" },
          { guard: "ownLastRunRetryable", target: "retry", actions: "finishRun" },
          { guard: "ownLastRun", target: "failed", actions: "finishRun" },
        ],
        REFUSED: [
          { guard: "ownRunOthersRemain", actions: "finishRun" },
          { guard: "ownLastRunBackToPaused", target: "paused", actions: "finishRun" },
          { guard: "ownLastRun", target: "retry", actions: "finishRun" },
        ],
        PAUSE: { target: "paused", actions: "clearPausedAfterRun" },
        RESUME: { guard: "pausedAfterRun", actions: "clearPausedAfterRun" },
        CANCEL: { target: "cancelled", actions: "clearPausedAfterRun" },
      },
    },
    success: {
      on: {
        FIRE: { guard: "canStart", target: "running", actions: { type: "startRun", params: { fromRetry: false } } },
        PAUSE: { target: "paused", actions: "clearPausedAfterRun" },
        CANCEL: { target: "cancelled", actions: "clearPausedAfterRun" },
        UPSTREAM_FAILED: { target: "upstream_failed", actions: "recordUpstreamFailure" },
      },
    },
    failed: {
      on: {
        FIRE: { guard: "canStart", target: "running", actions: { type: "startRun", params: { fromRetry: false } } },
        PAUSE: { target: "paused", actions: "clearPausedAfterRun" },
        CANCEL: { target: "cancelled", actions: "clearPausedAfterRun" },
        UPSTREAM_FAILED: { target: "upstream_failed", actions: "recordUpstreamFailure" },
      },
    },
    retry: {
      on: {
        FIRE: { guard: "canStart", target: "running", actions: { type: "startRun", params: { fromRetry: true } } },
        PAUSE: { target: "paused", actions: "clearPausedAfterRun" },
        CANCEL: { target: "cancelled", actions: "clearPausedAfterRun" },
        UPSTREAM_FAILED: { target: "upstream_failed", actions: "recordUpstreamFailure" },
      },
    },
    paused: {
      on: {
        FIRE: { guard: "canStartForced", target: "running", actions: "startForcedRun" },
        SUCCEEDED: { guard: "ownRun", actions: "finishRun" },
        FAILED: { guard: "ownRun", actions: "finishRun" },
        TIMED_OUT: { guard: "ownRun", actions: "finishRun" },
        REFUSED: { guard: "ownRun", actions: "finishRun" },
        // Idempotent: pausing a paused task is accepted and changes nothing that matters.
        PAUSE: { actions: "clearPausedAfterRun" },
        RESUME: [
          { guard: "hasInFlight", target: "running", actions: "clearPausedAfterRun" },
          { target: "pending", actions: "clearPausedAfterRun" },
        ],
        CANCEL: { target: "cancelled", actions: "clearPausedAfterRun" },
      },
    },
    cancelled: {
      on: {
        SUCCEEDED: { guard: "ownRun", actions: "finishRun" },
        FAILED: { guard: "ownRun", actions: "finishRun" },
        TIMED_OUT: { guard: "ownRun", actions: "finishRun" },
        REFUSED: { guard: "ownRun", actions: "finishRun" },
      },
    },
    upstream_failed: {
      on: {
        FIRE: { guard: "canStart", target: "running", actions: { type: "startRun", params: { fromRetry: false } } },
        PAUSE: { target: "paused", actions: "clearPausedAfterRun" },
        CANCEL: { target: "cancelled", actions: "clearPausedAfterRun" },
      },
    },
  },
});

export type TaskMachine = typeof taskMachine;
