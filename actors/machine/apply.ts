/**
 * Pure transitions on plain task records. Contract of `applyEvent(record, event)`:
 * - never mutates `record` (nor its context or inFlight array); the result record is new;
 * - accepted: `{ ok: true, record, from, to }` as decided by `taskMachine`;
 * - refused: `{ ok: false, code, reason }` and nothing changed. The code is
 *   AX_E_TASK_RUNNING (with `runningRunId`) when the FIRE would have been accepted but for
 *   the run in flight under overlap "forbid", AX_E_ILLEGAL_TRANSITION otherwise.
 */
import { transition } from "xstate";
import { AxError, InvalidInputError } from "../../common/index.ts";
import { busyForbidden, taskMachine } from "./task-machine.ts";
import { compiledTaskMachine } from "./compiled.ts";
import { TASK_STATES, type OverlapPolicy, type TaskContext, type TaskEvent, type TaskRecord, type TaskState, type TransitionResult } from "./types.ts";

const STATE_SET: ReadonlySet<string> = new Set(TASK_STATES);

export function isTaskState(v: unknown): v is TaskState {
  return typeof v === "string" && STATE_SET.has(v);
}

/** A fresh task: `pending`, no run yet. */
export function initialRecord(input: { maxAttempts: number; overlap: OverlapPolicy }): TaskRecord {
  if (!Number.isSafeInteger(input.maxAttempts) || input.maxAttempts < 1) {
    throw new InvalidInputError("maxAttempts", input.maxAttempts, "must be an integer >= 1");
  }
  if (input.overlap !== "forbid" && input.overlap !== "allow") {
    throw new InvalidInputError("overlap", input.overlap, 'must be "forbid" or "allow"');
  }
  return {
    value: "pending",
    context: {
      attempt: 0,
      maxAttempts: input.maxAttempts,
      overlap: input.overlap,
      inFlight: [],
      lastRunId: null,
      lastError: null,
      pausedAfterRun: false,
    },
  };
}

/** Run one event through the machine on a plain record. Pure. */
export function applyEvent(record: TaskRecord, event: TaskEvent): TransitionResult {
  const from = record.value;
  if (!isTaskState(from)) throw new InvalidInputError("record.value", from, "not a task state");
  if (compiledTaskMachine) {
    // The machine's own definition, evaluated without XState's actor machinery (compiled.ts).
    let next: { value: TaskState; context: TaskContext } | null;
    try {
      next = compiledTaskMachine.transition(from, record.context, event);
    } catch (e) {
      throw new AxError("AX_E_INTERNAL", `task machine failed on ${event.type} in state ${from}`, { cause: e });
    }
    if (next === null) return refusal(from, record.context, event);
    return { ok: true, record: { value: next.value, context: next.context }, from, to: next.value };
  }
  const snapshot = taskMachine.resolveState({ value: from, context: record.context });
  const [next] = transition(taskMachine, snapshot, event);
  if (next.status === "error") {
    throw new AxError("AX_E_INTERNAL", `task machine failed on ${event.type} in state ${from}`, { cause: next.error });
  }
  // Every accepted transition changes the value or assigns the context: same snapshot = refused.
  if (next === snapshot) return refusal(from, record.context, event);
  const to = next.value as TaskState;
  return { ok: true, record: { value: to, context: next.context }, from, to };
}

function refusal(from: TaskState, context: TaskContext, event: TaskEvent): TransitionResult {
  const base = `event ${event.type} not allowed in state ${from}`;
  if (event.type === "FIRE" && busyForbidden(context)) {
    // Ask the machine whether the FIRE would pass with nothing in flight: then the run in
    // flight is the only reason, and the caller gets the running run id.
    const idle = taskMachine.resolveState({ value: from, context: { ...context, inFlight: [] } });
    const runningRunId = context.inFlight[0];
    if (runningRunId !== undefined && idle.can(event)) {
      return {
        ok: false,
        code: "AX_E_TASK_RUNNING",
        reason: `${base}: run ${runningRunId} is in flight and overlap is "forbid"`,
        runningRunId,
      };
    }
  }
  return { ok: false, code: "AX_E_ILLEGAL_TRANSITION", reason: base + detail(from, context, event) };
}

/** Words for the reason only; the decision was the machine's. */
function detail(from: TaskState, context: TaskContext, event: TaskEvent): string {
  switch (event.type) {
    case "FIRE":
      if (from === "paused" && event.force !== true) return " (a paused task runs only with force)";
      if (context.inFlight.includes(event.runId)) return ` (run ${event.runId} is already in flight)`;
      return "";
    case "SUCCEEDED":
    case "FAILED":
    case "TIMED_OUT":
    case "REFUSED":
      return context.inFlight.includes(event.runId) ? "" : ` (run ${event.runId} is not in flight)`;
    default:
      return "";
  }
}
