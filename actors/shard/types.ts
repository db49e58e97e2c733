import type { AxError } from "../../common/index.ts";
import type { RunEvent, Outcome, DependencyTrigger } from "../../protocol/index.ts";
import type { WheelRef } from "../wheel/index.ts";
import type { DueIndexChanges, WheelItem } from "./horizon.ts";
import type { RunSource, ShardWrite, TaskRow } from "../store/index.ts";
import type { Ackable } from "../events/index.ts";
import type { ShardDispatchRun } from "../persister.ts";
import type { Pointer } from "./schedule.ts";
import type { DefinitionChange } from "./update.ts";
import type * as ledger from "./ledger.ts";

/**
 * The shard's vocabulary, shared by its parts: the mail the actor takes (Mail), the plan a round
 * of decisions makes (Round), and what the decisions remember between rounds (LiveTask,
 * InFlightRun). The actor (shardActor.ts) owns the mailbox and the effects; decide.ts decides.
 */

export interface ShardEvents {
  "run:fired"?: (e: { shard: number; runId: string; taskId: number; lateMs: number; source: RunSource; executor: string }) => void;
  /**
   * `final`: no retry follows (success, or failed/timed out with no attempts left, or its task is
   * gone); `durationMs`: from the executor's reported start to the end, null when no start was reported.
   */
  "run:finished"?: (e: { shard: number; runId: string; taskId: number; state: string; executor: string; final: boolean; durationMs: number | null; task: string | null; error: string | null }) => void;
  /** A scheduled slot not fired: the previous run still in flight (overlap=forbid) or the executor full. */
  "slot:missed"?: (e: { shard: number; runId: string; taskId: number; task: string; executor: string; reason: "overlap"; slotMs: number | null; detail: string }) => void;
  /** A task marked upstream_failed (an upstream failed for good). */
  "task:upstreamFailed"?: (e: { shard: number; taskId: number; task: string; executor: string; upstreamRun: string; reason: string }) => void;
  "task:stuck"?: (e: { shard: number; taskId: number; reason: string }) => void;
  /** Slots accounted by a written round, per outcome (run or a non-run reason; see ledger.ts). */
  "slots:accounted"?: (e: { shard: number; outcome: ledger.SlotOutcome; count: number }) => void;
}

export type ShardCommand =
  | { type: "load"; taskId: number }
  /** Its dependency edges changed in PostgreSQL: a row held in memory takes the new ones (see ShardActor.round). */
  | { type: "deps"; taskId: number }
  | { type: "run"; taskId: number; payload?: unknown; force: boolean }
  | { type: "pause"; taskId: number }
  | { type: "resume"; taskId: number }
  | { type: "cancel"; taskId: number }
  /** `ax task update`: applied between fires (see onUpdate). */
  | { type: "update"; taskId: number; change: DefinitionChange }
  /** Fire one backfill run for a past slot (ax task backfill); its run id is derived from (task, slot), so a slot fires once. */
  | { type: "backfill"; taskId: number; triggerId: number | null; slotMs: number; reason: string };

export type CommandReply = { ok: true; value?: unknown } | { ok: false; error: ReturnType<AxError["toJSON"]> };

export interface InFlightRun {
  runId: string;
  taskId: number;
  executor: string;
  timeoutMs: number;
  ref: WheelRef | null;
  /** Its dispatch token (derived again for runs adopted at load). */
  token: string;
  /** The task's trigger slots before this run's slot was taken (given back if the run is withdrawn). */
  slotsBefore?: { key: string; value: number | undefined };
  /** Its place is one of the limiter's places ahead (see InFlightLimiter.tryAcquireAhead). */
  ahead?: true;
  /** Recorded ahead of its due time: the pointer it was decided from (an update withdraws it and decides it again). */
  held?: Pointer;
  /** The ledger's watermark before this run's slot was accounted (given back with it). */
  ledgerBefore?: { key: string; value: number | undefined };
  /** When the executor reported the start (run duration metrics). */
  startedMs?: number;
  /**
   * When its dispatch landed in JetStream, if that was well after it was released (a publish
   * retried through a NATS restart or a stream leader election): its timeout counts from here.
   */
  visibleMs?: number;
  /** The stream sequence of its dispatch message, once published: a timeout asks whether it was delivered. */
  dispatchSeq?: number;
  /** When a timeout first found its dispatch undelivered (it waits for delivery, up to UNDELIVERED_GRACE_MS). */
  undeliveredSince?: number;
  /** When this shard last asked about its delivery (an answer from before that is not used). */
  deliveryAskedAt?: number;
  /** Recorded ahead: the longest its executor may hold it after receiving it (its release time minus its decision). */
  holdMs?: number;
}

export interface LiveTask {
  row: TaskRow;
  skippedWhileRunning: number;
  lastSkipped?: { triggerId: number | null; slotMs: number | null };
  /** Its schedule could not be computed this round (see markStuck). */
  stuck?: string;
  /** The row's fenced fields as PostgreSQL holds them (see Written): a round that leaves them so writes nothing. */
  written: Written;
}

/**
 * The fields a task update writes, as loaded or last written. A round touches a task whenever it
 * might have changed it (a wait for a place in flight, an event that moves nothing); comparing
 * with this keeps the no-op updates off PostgreSQL, where at thousands of runs a second they were
 * half of the task writes. `record` and `triggerSlots` compare by reference: every change makes
 * new objects (applyEvent, the ledger's and schedule's helpers never mutate them in place), so a
 * new reference is a change and the same reference is none.
 */
export type Written = Pick<TaskRow, "state" | "record" | "triggerSlots" | "nextDueMs" | "nextSlotMs" | "nextTriggerId" | "nextSource" | "nextReason" | "nextCausedBy">;

export function written(r: TaskRow): Written {
  return { state: r.state, record: r.record, triggerSlots: r.triggerSlots, nextDueMs: r.nextDueMs, nextSlotMs: r.nextSlotMs,
    nextTriggerId: r.nextTriggerId, nextSource: r.nextSource, nextReason: r.nextReason, nextCausedBy: r.nextCausedBy };
}

export function unchanged(w: Written, r: TaskRow): boolean {
  return w.record === r.record && w.triggerSlots === r.triggerSlots && w.state === r.state && w.nextDueMs === r.nextDueMs
    && w.nextSlotMs === r.nextSlotMs && w.nextTriggerId === r.nextTriggerId && w.nextSource === r.nextSource
    && w.nextReason === r.nextReason && w.nextCausedBy === r.nextCausedBy;
}

export function liveTask(row: TaskRow): LiveTask {
  return { row, skippedWhileRunning: 0, written: written(row) };
}

export type Mail =
  | { t: "due"; items: Array<{ dueMs: number; item: WheelItem }>; lateMs: number }
  | { t: "events"; events: RunEvent[]; instance: string; msg: Ackable }
  | { t: "trigger"; trig: DependencyTrigger; msg: Ackable }
  | { t: "cmd"; cmd: ShardCommand; reply: (r: CommandReply) => void }
  /** Due entries taken from Redis for the near horizon (taken outside the round, see Horizon.refill). */
  | { t: "refilled"; items: Array<{ id: number; dueMs: number }> }
  /** The node's limiter gave this waiting task a place at its executor (see InFlightLimiter). */
  | { t: "capacity"; taskId: number; dueMs: number; executor: string }
  /** Task rows whose fire's write waited (Round.deferred): written with this round. */
  | { t: "flush"; taskIds: number[] }
  /** The limiter gave a held dependency trigger a place (ShardDecisions.triggerPlaces): decide it. */
  | { t: "wake" };

/**
 * The plan of one round: what the decisions wrote down for the actor to carry out once the
 * round's fenced write is durable (publishes, acks, due-index changes, replies).
 */
export interface Round extends DueIndexChanges {
  write: ShardWrite;
  dispatch: Map<string, ShardDispatchRun[]>;
  acks: Ackable[];
  naks: Ackable[];
  outcomes: Outcome[];
  replies: Array<() => void>;
  touched: Set<number>;
  /** Tasks this round fired without writing their rows (see ShardDecisions.fire): the actor flushes them later. */
  deferred: number[];
}
