/** Task lifecycle: the XState machine that decides every transition, pure transitions on plain records, compact idle packing. */
export {
  TASK_STATES,
  TASK_EVENT_TYPES,
  type TaskState,
  type RunSource,
  type OverlapPolicy,
  type TaskContext,
  type TaskRecord,
  type TaskEvent,
  type TaskEventType,
  type TransitionRefusalCode,
  type TransitionResult,
} from "./types.ts";
export { taskMachine, busyForbidden, type TaskMachine } from "./task-machine.ts";
export { initialRecord, applyEvent, isTaskState } from "./apply.ts";
export { packIdle, unpackIdle, isIdle, type PackedIdle } from "./pack.ts";
