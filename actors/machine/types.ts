/** Task lifecycle types: the plain, JSON-serializable shapes the scheduler stores and moves. */

export type TaskState =
  | "pending"
  | "running"
  | "success"
  | "failed"
  | "retry"
  | "paused"
  | "cancelled"
  | "upstream_failed";

/** Every task state, in a fixed order (the order is part of the packed idle encoding). */
export const TASK_STATES: readonly TaskState[] = [
  "pending",
  "running",
  "success",
  "failed",
  "retry",
  "paused",
  "cancelled",
  "upstream_failed",
];

export type RunSource = "cron" | "rate" | "delay" | "once" | "manual" | "dependency" | "retry" | "misfire" | "backfill";

export type OverlapPolicy = "forbid" | "allow";

export interface TaskContext {
  /**
   * Attempt number of the current/last run chain (1 = first try). In `retry` it is the number
   * of attempts consumed so far: the next FIRE runs attempt + 1 (a REFUSED dispatch gives its
   * attempt back, so it can be 0 there).
   */
  attempt: number;
  /** Total tries allowed (retries + 1), >= 1. */
  maxAttempts: number;
  overlap: OverlapPolicy;
  /** Run ids currently in flight (usually 0 or 1). Empty in every state but running/paused/cancelled. */
  inFlight: string[];
  lastRunId: string | null;
  lastError: string | null;
  /**
   * Set when a forced run was fired from `paused`: once the last in-flight run completes the
   * task goes back to `paused` instead of success/failed/retry. Only ever true in `running`.
   */
  pausedAfterRun: boolean;
}

/** The cheap idle representation: JSON-serializable and persisted as-is. */
export interface TaskRecord {
  value: TaskState;
  context: TaskContext;
}

export type TaskEvent =
  /** A run is being dispatched (`running` is entered at dispatch, not when the executor answers). */
  | { type: "FIRE"; runId: string; source: RunSource; force?: boolean }
  | { type: "SUCCEEDED"; runId: string }
  /** The executor reported failure; `retryable: false` skips the remaining attempts. */
  | { type: "FAILED"; runId: string; error: string; retryable?: boolean }
  /** No completion / heartbeat within the timeout. */
  | { type: "TIMED_OUT"; runId: string }
  /** Dispatch refused (executor in-flight bound full): goes to retry, the attempt is not consumed. */
  | { type: "REFUSED"; runId: string; reason: string }
  | { type: "PAUSE" }
  | { type: "RESUME" }
  | { type: "CANCEL" }
  | { type: "UPSTREAM_FAILED"; upstreamRunId: string; reason: string };

export type TaskEventType = TaskEvent["type"];

/** Every event type, for tables and generated tests. */
export const TASK_EVENT_TYPES: readonly TaskEventType[] = [
  "FIRE",
  "SUCCEEDED",
  "FAILED",
  "TIMED_OUT",
  "REFUSED",
  "PAUSE",
  "RESUME",
  "CANCEL",
  "UPSTREAM_FAILED",
];

export type TransitionRefusalCode = "AX_E_ILLEGAL_TRANSITION" | "AX_E_TASK_RUNNING";

export type TransitionResult =
  | { ok: true; record: TaskRecord; from: TaskState; to: TaskState }
  | { ok: false; code: TransitionRefusalCode; reason: string; runningRunId?: string };
