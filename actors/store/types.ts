import type { LedgerInsert } from "./ledgerStore.ts";
/** Row shapes as the engine sees them (bigint columns parsed to numbers: ids and epoch ms fit in 2^53). */
export type MisfirePolicy = "once" | "skip" | "all";
export type OverlapPolicy = "forbid" | "allow";
export type RunSource = "cron" | "rate" | "delay" | "once" | "manual" | "dependency" | "retry" | "misfire" | "backfill";
export type RunState = "running" | "success" | "failed" | "timed_out" | "refused" | "skipped" | "stale";

export interface TriggerRow { id: number; kind: "cron" | "fixed_rate" | "fixed_delay" | "once"; spec: unknown; enabled: boolean }

/** What a task is (its definition), shared by new and stored tasks. */
export interface TaskDefinition {
  name: string;
  executor: string;
  payload: unknown;
  timeoutMs: number;
  maxAttempts: number;
  backoffMs: number;
  backoffMaxMs: number;
  misfire: MisfirePolicy;
  overlap: OverlapPolicy;
  state: string;
  record: unknown;
  upstreams: number[];
  nextDueMs: number | null;
  nextSlotMs: number | null;
  nextSource: RunSource | null;
  nextReason: string | null;
}

export interface TaskRow extends TaskDefinition {
  id: number;
  shard: number;
  triggerSlots: Record<string, number>;
  nextTriggerId: number | null;
  nextCausedBy: string | null;
  createdMs: number;
  updatedMs: number;
  triggers: TriggerRow[];
  hasDownstreams: boolean;
  /** Changes of its definition so far (`ax task update`, `ax apply`; migration 11); goes out with each dispatch, so the SDK can refuse a queued run of an older definition. */
  generation: number;
  /** The `ax apply` set that owns the task (null: made by hand). */
  applySet: string | null;
}

export interface NewTask extends TaskDefinition {
  /** task → shard by a stable hash of the id the database assigns. */
  shardOf: (id: number) => number;
  triggers: Array<{ kind: TriggerRow["kind"]; spec: unknown }>;
  nowMs: number;
  /** The `ax apply` set that owns the new task. */
  applySet?: string | null;
}

/** One task of a bulk registration: as NewTask, with the shard computed by the store from a common function. */
export type BulkNewTask = Omit<NewTask, "shardOf">;
export interface BulkCreated { id: number; name: string; shard: number; nextDueMs: number | null }

export interface RunRow {
  id: string;
  taskId: number;
  taskName: string;
  triggerId: number | null;
  source: RunSource;
  dueMs: number;
  slotMs: number | null;
  dueReason: string | null;
  firedMs: number | null;
  node: string | null;
  shard: number;
  epoch: number;
  attempt: number;
  executor: string;
  executorInstance: string | null;
  startedMs: number | null;
  finishedMs: number | null;
  state: RunState;
  error: string | null;
  causedBy: string | null;
  upstreamRuns: string[] | null;
  lateOutcome: string | null;
  createdMs: number;
  dispatchId: string | null;
  /** What the executor reported with the run's end (bounded JSON), e.g. an HTTP job's status and body excerpt. */
  result: unknown;
}

export type RunInsert = Omit<RunRow, "executorInstance" | "startedMs" | "finishedMs" | "lateOutcome" | "dispatchId" | "result"> & {
  finishedMs?: number | null;
  /** JetStream message id of the dispatch that carries the run (set before the write, published after). */
  dispatchId?: string | null;
};

/** Only the fields given are changed (null/undefined = keep). */
export interface RunUpdate {
  id: string;
  state?: RunState;
  startedMs?: number;
  finishedMs?: number;
  executorInstance?: string;
  error?: string;
  lateOutcome?: string;
  /** The executor's result (bounded JSON; see RunEventSchema.result). */
  result?: unknown;
}

export interface TaskUpdate {
  id: number;
  state: string;
  record: unknown;
  triggerSlots: Record<string, number>;
  nextDueMs: number | null;
  nextSlotMs: number | null;
  nextTriggerId: number | null;
  nextSource: RunSource | null;
  nextReason: string | null;
  nextCausedBy: string | null;
}

/** Everything one shard wants written in one tick, under the epoch it believes it holds. */
export interface ShardWrite {
  shard: number;
  epoch: number;
  runInserts: RunInsert[];
  runUpdates: RunUpdate[];
  taskUpdates: TaskUpdate[];
  /** Non-run intervals decided in the round (actors/shard/ledger.ts), written in the same fenced transaction. */
  ledger?: LedgerInsert[];
  /** Definition changes (`ax task update`), written fenced with the round (see definitionUpdate.ts). */
  defUpdates?: TaskDefUpdate[];
}

/**
 * A task's new definition as its shard decided it, with the trigger links to change (trigger rows
 * were inserted by the API; `unlink` ones are deleted) and the history row that records it.
 */
export interface TaskDefUpdate extends Pick<TaskDefinition, "executor" | "payload" | "timeoutMs" | "maxAttempts" | "backoffMs" | "backoffMaxMs" | "misfire" | "overlap"> {
  id: number;
  generation: number;
  /** The new trigger set (null: unchanged). */
  triggers: TriggerRow[] | null;
  link: number[];
  unlink: number[];
  history: { taskName: string; atMs: number; who: string; kind: string; change: unknown; prevRun: string | null };
}

/** One dispatch message as recorded with the runs it carries (see migration 10). */
export interface DispatchRecord { id: string; executor: string; node: string; runIds: string[]; createdMs: number }

export interface ShardRow { shard: number; owner: string | null; epoch: number; pinnedTo: string | null; updatedMs: number }
