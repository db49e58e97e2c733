import type { NatsConnection } from "@nats-io/transport-node";
import type { JetStreamClient } from "@nats-io/jetstream";
import { AxError, atWallTime, type Clock, type Logger, type Names } from "../../common/index.ts";
import {
  EventCatchUp, connectionUptime, derivedRunId, encode, jetStreamProgress, newRunId, runToken,
  nakLater, nodeEventsConsumer, shardEventsConsumer, tokenMatches,
  type DeadLetters, type DispatchRun, type RunEvent, type Outcome, type DependencyTrigger,
} from "../../protocol/index.ts";
import { applyEvent, type TaskEvent, type TaskRecord } from "../machine/index.ts";
import type { WheelRef } from "../wheel/index.ts";
import { Horizon, type DueIndexChanges, type WheelItem } from "./horizon.ts";
import { ShardConsumers } from "./consumers.ts";
import { decideEvent } from "./runEvents.ts";
import type { DueIndex, RunInsert, RunRow, RunSource, RunUpdate, ShardWrite, Store, TaskRow, TaskUpdate } from "../store/index.ts";
import type { InFlightLimiter } from "../limiter.ts";
import type { Ackable, EventSink } from "../events/index.ts";
import { publishDispatch, replayParts, type Persister, type ShardDispatchRun, type Submitted } from "../persister.ts";
import { backoffMs, compiledOf, countTaken, endedReason, nextPointer, type Pointer } from "./schedule.ts";
import { CalendarCache } from "./calendars.ts";
import { applyDefinitionChange, type DefinitionChange } from "./update.ts";
import { LedgerStore, loadCalendars } from "../store/index.ts";
import * as ledger from "./ledger.ts";

export interface ShardActorDeps {
  nodeId: string;
  store: Store;
  due: DueIndex;
  persister: Persister;
  limiter: InFlightLimiter;
  nc: NatsConnection;
  js: JetStreamClient;
  names: Names;
  clock: Clock;
  log: Logger;
  tickMs: number;
  wheelSize: number;
  /** How far ahead due times are taken from Redis into the wheel. */
  horizonMs?: number;
  /**
   * How often due entries are taken from Redis into the wheel (default 250 ms, at most a quarter
   * of the horizon). Often and small: at 8,200 runs/s a refill every 2.5 s moved ~20k entries in
   * one burst and showed as a p99 spike every 2.5 s.
   */
  refillEveryMs?: number;
  /**
   * How long before its due time a task's run is decided and written (default 100 ms). The run
   * is published at its due time; a task with a run in flight is decided at the due time instead.
   */
  leadMs?: number;
  /** Lease still valid? Checked before anything is fired. */
  leaseValid: () => boolean;
  /**
   * Lifetime of each pull request on the shard's consumers (>= 1000). Kept below the lease
   * TTL so that a node frozen (SIGSTOP, VM pause) while owning the shard stops being handed
   * this shard's events before its lease can pass to the next owner. Default 30 s.
   */
  pullExpiresMs?: number;
  /** The cluster's dispatch secret: each run's token is derived from it (see runToken). */
  dispatchSecret: Uint8Array;
  /** Told when a write was refused for a stale epoch: the shard must stop. */
  onFenced: (shard: number) => void;
  /** Where messages that can never be processed are parked (without it they are only terminated). */
  dead?: DeadLetters;
  events?: ShardEvents;
  random?: () => number;
}

/** Typed, namespaced events for metrics, logs and the dashboard. */
export interface ShardEvents {
  "run:fired"?: (e: { shard: number; runId: string; taskId: number; lateMs: number; source: RunSource; executor: string }) => void;
  /**
   * `final`: no retry follows (success, or failed/timed out with no attempts left, or its task is
   * gone); `durationMs`: from the executor's reported start to the end, null when no start was reported.
   */
  "run:finished"?: (e: { shard: number; runId: string; taskId: number; state: string; executor: string; final: boolean; durationMs: number | null; task: string | null; error: string | null }) => void;
  /** A scheduled slot not fired: the previous run still in flight (overlap=forbid) or the executor full. */
  "slot:missed"?: (e: { shard: number; runId: string; taskId: number; task: string; executor: string; reason: "overlap" | "executor_full"; slotMs: number | null; detail: string }) => void;
  /** A task marked upstream_failed (an upstream failed for good). */
  "task:upstreamFailed"?: (e: { shard: number; taskId: number; task: string; executor: string; upstreamRun: string; reason: string }) => void;
  "task:stuck"?: (e: { shard: number; taskId: number; reason: string }) => void;
  /** Slots accounted by a written round, per outcome (run or a non-run reason; see ledger.ts). */
  "slots:accounted"?: (e: { shard: number; outcome: ledger.SlotOutcome; count: number }) => void;
}

export type ShardCommand =
  | { type: "load"; taskId: number }
  | { type: "run"; taskId: number; payload?: unknown; force: boolean }
  | { type: "pause"; taskId: number }
  | { type: "resume"; taskId: number }
  | { type: "cancel"; taskId: number }
  /** `ax task update`: applied between fires (see onUpdate). */
  | { type: "update"; taskId: number; change: DefinitionChange }
  /** Fire one backfill run for a past slot (ax task backfill); its run id is derived from (task, slot), so a slot fires once. */
  | { type: "backfill"; taskId: number; triggerId: number | null; slotMs: number; reason: string };

export type CommandReply = { ok: true; value?: unknown } | { ok: false; error: ReturnType<AxError["toJSON"]> };

interface InFlightRun {
  runId: string;
  taskId: number;
  executor: string;
  timeoutMs: number;
  ref: WheelRef | null;
  /** Its dispatch token (derived again for runs adopted at load). */
  token: string;
  /** The task's trigger slots before this run's slot was taken (given back if the run is withdrawn). */
  slotsBefore?: { key: string; value: number | undefined };
  /** Recorded ahead of its due time: the pointer it was decided from (an update withdraws it and decides it again). */
  held?: Pointer;
  /** The ledger's watermark before this run's slot was accounted (given back with it). */
  ledgerBefore?: { key: string; value: number | undefined };
  /** When the executor reported the start (run duration metrics). */
  startedMs?: number;
  /** Adopted at load and its task's row was not found at its timeout: the task was removed. */
  taskGone?: boolean;
  /**
   * When its dispatch landed in JetStream, if that was well after it was released (a publish
   * retried through a NATS restart or a stream leader election): its timeout counts from here.
   */
  visibleMs?: number;
}

interface LiveTask {
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
type Written = Pick<TaskRow, "state" | "record" | "triggerSlots" | "nextDueMs" | "nextSlotMs" | "nextTriggerId" | "nextSource" | "nextReason" | "nextCausedBy">;

function written(r: TaskRow): Written {
  return { state: r.state, record: r.record, triggerSlots: r.triggerSlots, nextDueMs: r.nextDueMs, nextSlotMs: r.nextSlotMs,
    nextTriggerId: r.nextTriggerId, nextSource: r.nextSource, nextReason: r.nextReason, nextCausedBy: r.nextCausedBy };
}

function unchanged(w: Written, r: TaskRow): boolean {
  return w.record === r.record && w.triggerSlots === r.triggerSlots && w.state === r.state && w.nextDueMs === r.nextDueMs
    && w.nextSlotMs === r.nextSlotMs && w.nextTriggerId === r.nextTriggerId && w.nextSource === r.nextSource
    && w.nextReason === r.nextReason && w.nextCausedBy === r.nextCausedBy;
}

function liveTask(row: TaskRow): LiveTask {
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
  | { t: "capacity"; taskId: number; dueMs: number; executor: string };

/** The effects of one round, applied after its write is durable. */
interface Round extends DueIndexChanges {
  write: ShardWrite;
  dispatch: Map<string, ShardDispatchRun[]>;
  acks: Ackable[];
  naks: Ackable[];
  outcomes: Outcome[];
  replies: Array<() => void>;
  touched: Set<number>;
}

const GRACE_MS = 1000;
const NONE_RECORDED: ReadonlySet<string> = new Set();
/** A dependency trigger's run id, derived from its key: a redelivered trigger finds its run. */
const dependencyRunId = (trig: DependencyTrigger): string => derivedRunId("rd", `${trig.taskId}:${trig.key}`);
/** A backfill's run id, derived from (task, slot): a slot is backfilled once. */
const backfillRunId = (cmd: { taskId: number; slotMs: number }): string => derivedRunId("rb", `${cmd.taskId}:${cmd.slotMs}`);
/** A dispatch that lands this much after its release gives its runs their timeout from then (noteLatePublish). */
const LATE_PUBLISH_MS = 250;
/** Rounds of one shard submitted and not yet written: one being written, the next one queued behind it. */
const MAX_ROUNDS_WRITING = 2;

/** An Ackable that passes on only its first ack or nak. */
function once(a: Ackable): Ackable {
  let done = false;
  return { ack: () => { if (!done) { done = true; a.ack(); } }, nak: (d?: number) => { if (!done) { done = true; a.nak(d); } } };
}
/** Inside JetStream's 2-minute duplicate window, with a margin. */
const REPUBLISH_WINDOW_MS = 100_000;

/**
 * One owned shard: its wheel, its tasks' state machines, its dispatch. An actor: state is
 * private and everything arrives as mail, handled in rounds. A round takes all mail queued,
 * decides with the pure machine and scheduler, writes every change in one fenced batch, and
 * only then applies effects (publish dispatches, ack events, update the due index, reply).
 * A crash between write and effect leaves runs `running` in PostgreSQL; the next owner times
 * them out and retries: nothing is lost, and nothing is fired twice for one slot.
 *
 * Lifecycle: created → loading (rebuild due index from PostgreSQL, load running runs) →
 * active (rounds) → stopping (no new fires; flush; ack) → stopped. `fence()` from the
 * outside (lease lost) stops at once without writing anything.
 */
export class ShardActor implements EventSink {
  readonly shard: number;
  readonly epoch: number;
  private readonly d: ShardActorDeps;
  private readonly log: Logger;
  private readonly horizon: Horizon;
  private readonly inFlight = new Map<string, InFlightRun>();
  /**
   * Runs whose completion this shard applied lately (two generations): a node-level event batch
   * that comes back after one of its other parts failed carries them again, and they are not late.
   */
  private finishedByEvent = new Set<string>();
  private finishedByEventOld = new Set<string>();
  private readonly live = new Map<number, LiveTask>();
  /** Tasks due whose executor was full: the due time each waits in the node's limiter with. */
  private readonly waitingForCapacity = new Map<number, number>();
  /** Places the limiter gave to waiting tasks, not yet used by a dispatch (task → executor). */
  private readonly reserved = new Map<number, string>();
  private mail: Mail[] = [];
  /** The mail of the rounds in progress, being decided or written (handed back by fence(), see there). */
  private readonly inRounds = new Set<Mail[]>();
  /** The mailbox loop is deciding rounds (it stops when the mailbox is empty). */
  private deciding = false;
  /**
   * Rounds decided and submitted whose write has not been handled yet, oldest first (see
   * submitRound): the next round is decided while the previous one is written, at most
   * MAX_ROUNDS_WRITING deep.
   */
  private readonly writing: Array<Promise<void>> = [];
  /** Handles written rounds in their order (acks, effects). */
  private tail: Promise<void> = Promise.resolve();
  private quietWaiters: Array<() => void> = [];
  /** Tasks a submitted round changed whose write is not handled yet: not evicted meanwhile (PostgreSQL does not hold their state yet). */
  private readonly unwritten = new Map<number, number>();
  /** Tasks seen by a round: evicted at the start of a later one when idle (see evictIdle). */
  private readonly evictable = new Set<number>();
  private state: "created" | "loading" | "active" | "stopping" | "stopped" = "created";
  /** The last written round's publishes and due-index updates (see commit()). */
  private effects: Promise<void> = Promise.resolve();
  /** Dispatches written and not yet released (they wait for their due time); a planned stop waits for them. */
  private readonly releases = new Set<Promise<void>>();
  private readonly consumers: ShardConsumers;
  /** Wall time this actor began loading the shard: slots due before it came due while nobody here owned it. */
  private acquiredMs = Infinity;
  /** Who owned the shard before this actor (named by outage intervals in the ledger). */
  private prevOwner: { owner: string | null; epoch: number | null; sinceMs: number | null } = { owner: null, epoch: null, sinceMs: null };
  /** Timeouts wait until the events published before them are read (see EventCatchUp). */
  private readonly catchUp: EventCatchUp;
  private readonly calendars: CalendarCache;
  private readonly timeoutCheckedFrom = new Map<string, number>();
  readonly stats = { fired: 0, finished: 0, skipped: 0, refused: 0, timedOut: 0, lastLateMs: 0, maxLateMs: 0, refusedEvents: 0, stuck: 0, waited: 0 };

  constructor(shard: number, epoch: number, deps: ShardActorDeps) {
    this.calendars = new CalendarCache((names) => loadCalendars(deps.store.pool, names), deps.clock);
    this.shard = shard;
    this.epoch = epoch;
    this.d = deps;
    this.log = deps.log.child({ shard, epoch });
    // The shard's events come through its node's consumer (v2) and its own (v1, forwarded): a
    // timeout waits until both have applied what was published before it.
    // And through the previous owner's node consumer: completions of the runs it dispatched reach
    // this shard only once it forwards them (or, if it is gone, the live nodes' drain does), so
    // that consumer must have moved past them too. A node cut off from PostgreSQL held such a
    // completion while its shard moved here, and the run was timed out as if unanswered.
    const prevConsumer = () => (this.prevOwner.owner && this.prevOwner.owner !== deps.nodeId ? [nodeEventsConsumer(this.prevOwner.owner)] : []);
    this.catchUp = new EventCatchUp(jetStreamProgress(deps.js, deps.names.eventsStream,
      () => [shardEventsConsumer(shard), nodeEventsConsumer(deps.nodeId), ...prevConsumer()], (d) => prevConsumer().includes(d)),
      deps.clock, this.log, { uptimeMs: connectionUptime(deps.nc, deps.clock) });
    this.consumers = new ShardConsumers({
      shard, nc: deps.nc, js: deps.js, names: deps.names, log: this.log,
      ...(deps.pullExpiresMs !== undefined ? { pullExpiresMs: deps.pullExpiresMs } : {}), ...(deps.dead ? { dead: deps.dead } : {}),
      active: () => this.state === "active",
      onEvents: (events, instance, msg) => this.tell({ t: "events", events, instance, msg }),
      onTrigger: (trig, msg) => this.tell({ t: "trigger", trig, msg }),
      onEnded: (why) => this.consumerEnded(why),
    });
    this.horizon = new Horizon({
      shard, tickMs: deps.tickMs, wheelSize: deps.wheelSize, clock: deps.clock, log: this.log, due: deps.due, store: deps.store,
      ...(deps.horizonMs !== undefined ? { horizonMs: deps.horizonMs } : {}), ...(deps.refillEveryMs !== undefined ? { refillEveryMs: deps.refillEveryMs } : {}),
      ...(deps.leadMs !== undefined ? { leadMs: deps.leadMs } : {}), ...(deps.random ? { random: deps.random } : {}),
      onDue: (items, lateMs) => this.tell({ t: "due", items, lateMs }),
      onRefilled: (items) => this.tell({ t: "refilled", items }),
      active: () => this.state === "active",
    });
  }

  get status() { return this.state; }
  /** Written runs of this actor may still be published: it was not fenced (a planned stop flushes them first). */
  get releasable(): boolean { return this.state === "active" || this.state === "stopping"; }
  get inFlightCount() { return this.inFlight.size; }
  get wheelSize() { return this.horizon.size; }

  async start(): Promise<void> {
    this.state = "loading";
    this.acquiredMs = this.d.clock.now();
    const t0 = this.d.clock.monotonic();
    this.prevOwner = await new LedgerStore(this.d.store.pool).previousOwner(this.shard);
    const dueRows = await this.d.store.dueOfShard(this.shard);
    await this.d.due.rebuild(this.shard, dueRows);
    const running = await this.d.store.runningRuns(this.shard);
    const now = this.d.clock.now();
    const owners = await this.d.store.fetchTasks(this.shard, [...new Set(running.map((r) => r.taskId))]);
    for (const row of owners) this.live.set(row.id, liveTask(row));
    for (const r of running) this.adoptRunning(r, now);
    const republished = await this.republishUnstarted(running, now);
    if (republished) this.log.warn({ runs: republished }, "re-published runs the previous owner recorded but no executor started");
    this.state = "active";
    this.horizon.start();
    await this.horizon.refill();
    await this.consumers.start();
    this.log.info({ tasksDue: dueRows.length, running: running.length, ms: Math.round(this.d.clock.monotonic() - t0) }, "shard:acquired");
  }

  /**
   * A run found `running` at load (the previous owner died or handed over): tracked again,
   * its timeout counted from the later of its fire time and now minus nothing — heartbeats
   * sent to the old owner are not known, so the deadline is fire time + timeout, at least now.
   */
  private adoptRunning(r: RunRow, now: number): void {
    this.d.limiter.force(r.executor);
    const timeoutMs = this.live.get(r.taskId)?.row.timeoutMs ?? 30_000;
    const run: InFlightRun = { runId: r.id, taskId: r.taskId, executor: r.executor, timeoutMs, ref: null, token: runToken(this.d.dispatchSecret, r.id) };
    this.inFlight.set(r.id, run);
    const deadline = Math.max(now, (r.firedMs ?? now) + run.timeoutMs);
    run.ref = this.horizon.addTimeout(deadline, r.id);
  }

  /**
   * A consumer loop ended while the shard is active (consumer deleted, a connection that lost it):
   * the shard would stay owned and deaf to its events. It is stopped instead and loaded afresh by
   * the supervisor, with new consumers.
   */
  private consumerEnded(why: string): void {
    if (this.state !== "active") return;
    this.log.warn({ why }, "shard restarts: a consumer stopped delivering");
    this.restart(why);
  }

  tell(m: Mail): void {
    if (this.state === "stopped") {
      if (m.t === "cmd") m.reply({ ok: false, error: new AxError("AX_E_UNAVAILABLE", `shard ${this.shard} is not owned here any more; retry`).toJSON() });
      return;
    }
    // Settled once: fence() hands back the messages of a round still in progress, and that round
    // may end later and settle them again (a node-level batch counts its parts' settlements).
    if (m.t === "events" || m.t === "trigger") m = { ...m, msg: once(m.msg) };
    this.mail.push(m);
    if (!this.deciding) {
      this.deciding = true;
      setImmediate(() => { void this.loop(); });
    }
  }

  /** Resolves when no round is being decided or written and the mailbox is empty (or the shard stopped). */
  private async quiet(): Promise<void> {
    while (this.deciding || this.writing.length) await new Promise<void>((r) => this.quietWaiters.push(r));
  }
  private wakeQuiet(): void { for (const w of this.quietWaiters.splice(0)) w(); }

  /** A part of a node-level event batch (see NodeEvents); false when the shard is not active here. */
  acceptEvents(events: RunEvent[], instance: string, part: Ackable): boolean {
    if (this.state !== "active") return false;
    this.tell({ t: "events", events, instance, msg: part });
    return true;
  }

  command(cmd: ShardCommand): Promise<CommandReply> {
    return new Promise((resolve) => this.tell({ t: "cmd", cmd, reply: resolve }));
  }

  private async loop(): Promise<void> {
    try {
      while (this.mail.length && this.state !== "stopped") {
        if (this.writing.length >= MAX_ROUNDS_WRITING) { await this.writing[0]; continue; }
        const batch = this.mail.splice(0);
        this.inRounds.add(batch);
        try {
          await this.round(batch);
        } catch (e) {
          this.inRounds.delete(batch);
          // The round's decisions are in memory but not durable: the only consistent state is
          // PostgreSQL's. Stop without writing and let the supervisor load the shard afresh
          // (fires that were not recorded are still due there; events come back unacked).
          this.log.error({ err: e instanceof Error ? e.stack : String(e) }, "round failed; shard restarts from PostgreSQL");
          for (const m of batch) {
            if (m.t === "events" || m.t === "trigger") nakLater(m.msg);
            if (m.t === "cmd") m.reply({ ok: false, error: new AxError("AX_E_UNAVAILABLE", `shard ${this.shard} is restarting: ${String(e)}; retry`).toJSON() });
          }
          this.restart(`round failed: ${String(e)}`);
          return;
        }
      }
    } finally {
      this.deciding = false;
      this.wakeQuiet();
    }
  }

  private newRound(): Round {
    return {
      write: { shard: this.shard, epoch: this.epoch, runInserts: [], runUpdates: [], taskUpdates: [], ledger: [] },
      dispatch: new Map(), acks: [], naks: [], redisAdd: [], redisRemove: [], outcomes: [], replies: [], touched: new Set(),
    };
  }

  private async round(batch: Mail[]): Promise<void> {
    this.evictIdle();
    const round = this.newRound();
    const now = this.d.clock.now();
    const canFire = this.state === "active" && this.d.leaseValid();
    // Gather which tasks this round needs and load those not live, in one query.
    const need = new Set<number>();
    for (const m of batch) {
      if (m.t === "due") for (const it of m.items) if (it.item.k === 0) need.add(it.item.id);
      if (m.t === "cmd") need.add(m.cmd.taskId);
      if (m.t === "trigger") need.add(m.trig.taskId);
      if (m.t === "events") for (const ev of m.events) { const r = this.inFlight.get(ev.runId); if (r) need.add(r.taskId); }
      if (m.t === "refilled") for (const it of m.items) { const d = this.horizon.dueOf(it.id); if (d !== undefined && d !== it.dueMs) need.add(it.id); }
      if (m.t === "capacity") need.add(m.taskId);
    }
    for (const id of need) this.evictable.add(id);
    const missing = [...need].filter((id) => !this.live.has(id));
    for (const row of await this.d.store.fetchTasks(this.shard, missing)) this.live.set(row.id, liveTask(row));
    // Calendars of excluded dates named by the tasks coming due (none: no query).
    await this.calendars.ensure([...need].map((id) => this.live.get(id)?.row));
    // Which derived runs (a dependency trigger's, a backfill's) PostgreSQL already holds: one
    // query before deciding, not one per message while the round is being decided.
    const derived: string[] = [];
    for (const m of batch) {
      if (m.t === "trigger" && m.trig.kind !== "upstream_failed") derived.push(dependencyRunId(m.trig));
      if (m.t === "cmd" && m.cmd.type === "backfill") derived.push(backfillRunId(m.cmd));
    }
    const recorded = derived.length ? new Set((await this.d.store.getRuns(derived)).map((r) => r.id)) : NONE_RECORDED;

    for (const m of batch) {
      switch (m.t) {
        case "due": {
          if (m.lateMs > 0) { this.stats.lastLateMs = m.lateMs; this.stats.maxLateMs = Math.max(this.stats.maxLateMs, m.lateMs); }
          for (const it of m.items) {
            if (it.item.k === 1) { this.onTimeout(round, it.item.runId, now); continue; }
            const { id, due } = it.item;
            const w = this.horizon.cameDue(id, due);
            if (!w) continue; // superseded by a later schedule
            if (due > now && canFire && this.decideAtDue(id)) {
              // Ahead of time, but a run of the task is still in flight: whether this slot fires
              // (overlap) is decided at its due time, when that run may have ended.
              this.horizon.holdUntilDue(id, due, w.inRedis);
              continue;
            }
            if (!canFire) { this.horizon.backToIndex(round, id, due); continue; }
            this.guard(round, id, () => this.onDue(round, id, due, now));
          }
          break;
        }
        case "events":
          this.onEvents(round, m.events, m.instance, now);
          round.acks.push(m.msg);
          break;
        case "trigger":
          if (!canFire) { round.naks.push(m.msg); break; }
          this.onDependencyTrigger(round, m.trig, m.msg, now, recorded);
          break;
        case "cmd":
          if (m.cmd.type === "backfill") this.onBackfill(round, m.cmd, m.reply, now, canFire, recorded);
          else this.onCommand(round, m.cmd, m.reply, now, canFire);
          break;
        case "refilled":
          this.horizon.refilled(round, m.items, (id) => this.live.get(id)?.row.nextDueMs);
          break;
        case "capacity":
          if (canFire) this.guard(round, m.taskId, () => this.onDue(round, m.taskId, m.dueMs, now));
          else this.horizon.backToIndex(round, m.taskId, m.dueMs);
          // Not used (paused, removed, rescheduled meanwhile, or the shard is handing over): the
          // place goes to the next waiter.
          if (this.reserved.delete(m.taskId)) this.d.limiter.release(m.executor);
          break;
      }
    }
    this.submitRound(round, batch);
  }

  // ---- decisions -------------------------------------------------------------------------

  private transition(lt: LiveTask, ev: TaskEvent): ReturnType<typeof applyEvent> {
    const res = applyEvent(lt.row.record as TaskRecord, ev);
    if (res.ok) { lt.row.record = res.record; lt.row.state = res.to; }
    return res;
  }

  /** nextPointer, where a schedule that cannot be computed marks its task instead of failing the round. */
  private nextOf(round: Round, lt: LiveTask, now: number, opts: { completedMs?: number } = {}): Pointer | null {
    try {
      return nextPointer(lt.row, now, opts);
    } catch (e) {
      this.markStuck(round, lt, e);
      return null;
    }
  }

  /**
   * Runs one task's decision; if it throws (a trigger that does not advance, a stored spec that no
   * longer compiles, any bug in one task's arithmetic), the task is marked stuck and the round — and
   * every other task of the shard — goes on. Without this, one poisoned task failed every round of
   * its shard, and the restarted shard met it again.
   */
  private guard(round: Round, taskId: number, decide: () => void): void {
    try {
      decide();
    } catch (e) {
      const lt = this.live.get(taskId);
      if (!lt) throw e;
      this.markStuck(round, lt, e);
      this.setPointer(round, lt, null);
    }
  }

  /**
   * A task whose schedule cannot be computed is paused with the reason as its last error (`task
   * show`: state paused, lastError and nextReason say why; `ax task resume` after a fix), counted
   * (ax_tasks_stuck_total) and logged once.
   */
  private markStuck(round: Round, lt: LiveTask, e: unknown): void {
    const reason = e instanceof Error ? e.message : String(e);
    lt.stuck = reason;
    this.stats.stuck++;
    this.log.error({ taskId: lt.row.id, err: reason }, "task:stuck: its schedule cannot be computed; the task is paused and the shard goes on");
    this.transition(lt, { type: "PAUSE" });
    ledger.notePaused(lt.row, this.d.clock.now());
    const rec = lt.row.record as TaskRecord;
    lt.row.record = { ...rec, context: { ...rec.context, lastError: `schedule stuck: ${reason}` } };
    round.touched.add(lt.row.id);
    this.d.events?.["task:stuck"]?.({ shard: this.shard, taskId: lt.row.id, reason });
  }

  private setPointer(round: Round, lt: LiveTask, p: Pointer | null): void {
    const row = lt.row;
    row.nextDueMs = p?.dueMs ?? null;
    row.nextSlotMs = p?.slotMs ?? null;
    row.nextTriggerId = p?.triggerId ?? null;
    row.nextSource = p?.source ?? null;
    row.nextReason = p?.reason ?? (lt.stuck ? `not scheduled: ${lt.stuck}` : endedReason(row, this.d.clock.now()));
    row.nextCausedBy = p?.causedBy ?? null;
    this.horizon.unschedule(round, row.id);
    if (p) this.horizon.schedule(round, row.id, p.dueMs);
    round.touched.add(row.id);
  }

  /** A task with a run in flight is decided at its due time, not ahead of it. */
  private decideAtDue(taskId: number): boolean {
    const lt = this.live.get(taskId);
    return !!lt && (lt.row.record as TaskRecord).context.inFlight.length > 0;
  }

  // ---- ledger of occurrences (actors/shard/ledger.ts) --------------------------------------

  private ledgerCtx(now: number): ledger.LedgerContext {
    return { node: this.d.nodeId, shard: this.shard, epoch: this.epoch, now };
  }

  /** Slots due before this actor began loading the shard came due while nobody here owned it. */
  private gapCause(dueMs: number): ledger.GapCause {
    if (dueMs >= this.acquiredMs) return { kind: "behind" };
    return { kind: "outage", acquiredMs: this.acquiredMs, node: this.d.nodeId, epoch: this.epoch,
      lastOwner: this.prevOwner.owner, lastEpoch: this.prevOwner.epoch, lastOwnerSinceMs: this.prevOwner.sinceMs };
  }

  /** What a fire decision did with a trigger's slot (retries, manual and dependency runs stand for none). */
  private ledgerSlot(round: Round, lt: LiveTask, p: Pointer, source: RunSource, fate: ledger.SlotFate, now: number): void {
    if (p.triggerId === null || p.slotMs === null || source === "retry" || source === "manual" || source === "dependency") return;
    const f: ledger.SlotFate = source === "misfire" && fate.outcome !== "catch-up" && "runId" in fate ? { outcome: "catch-up", runId: fate.runId } : fate;
    if (ledger.recordSlot(round.write.ledger!, lt.row, p.triggerId, p.slotMs, f, this.ledgerCtx(now))) round.touched.add(lt.row.id);
  }

  private onDue(round: Round, taskId: number, dueMs: number, now: number): void {
    const lt = this.live.get(taskId);
    if (!lt) return; // deleted
    const row = lt.row;
    if (row.nextDueMs !== dueMs || row.state === "paused" || row.state === "cancelled") return;
    let p: Pointer = {
      dueMs, slotMs: row.nextSlotMs, triggerId: row.nextTriggerId, source: row.nextSource ?? "once",
      reason: row.nextReason ?? "", causedBy: row.nextCausedBy,
    };
    const scheduled = p.source !== "retry" && p.source !== "misfire" && p.source !== "dependency";
    if (scheduled && dueMs < now - GRACE_MS && p.source !== "delay" && !this.onlyBehind(row, p, now)) {
      // Came due while nobody owned the shard (node down, hand-over), or so long ago that later
      // slots passed too: the misfire policy decides.
      ledger.recordMisfireGap(round.write.ledger!, row, this.gapCause(dueMs), this.ledgerCtx(now), { graceMs: GRACE_MS });
      const np = this.nextOf(round, lt, now);
      if (!np) { this.setPointer(round, lt, null); return; }
      if (np.dueMs > now + this.d.tickMs) { this.setPointer(round, lt, np); return; } // skip: resume cadence
      p = np;
    }
    this.fire(round, lt, p, now, {});
  }

  /**
   * A slot that came due while this actor owned the shard, with no later slot of its trigger
   * passed yet: the node is behind (overloaded), not down. The run fires as the slot it is, with
   * its own due time, instead of being re-dated as a misfire catch-up (and, with misfire=skip,
   * never run at all).
   */
  private onlyBehind(row: TaskRow, p: Pointer, now: number): boolean {
    if (p.dueMs < this.acquiredMs) return false;
    const tr = p.triggerId === null ? undefined : row.triggers.find((t) => t.id === p.triggerId);
    if (!tr) return false;
    const next = compiledOf(tr).next(p.slotMs ?? p.dueMs);
    return next === null || next > now;
  }

  private fire(round: Round, lt: LiveTask, p: Pointer, now: number, opts: { manual?: { force: boolean; payload?: unknown; reply: (r: CommandReply) => void }; upstreamRuns?: string[]; runId?: string; backfill?: (r: CommandReply) => void }): void {
    const row = lt.row;
    const runId = opts.runId ?? newRunId(now);
    const source: RunSource = opts.manual ? "manual" : p.source;
    // Decided ahead of its due time: dispatched (released) at the due time, recorded as fired then.
    const releaseAt = opts.manual ? now : Math.max(now, p.dueMs);
    const advanceSchedule = !opts.manual && source !== "dependency" && source !== "backfill";
    const excluded = advanceSchedule && source !== "retry" ? this.calendars.exclusion(row, p.triggerId, p.slotMs) : null;
    if (excluded) {
      // A slot on a date of the task's calendar: not fired, recorded (like an overlap skip) with the reason.
      this.stats.skipped++;
      round.write.runInserts.push({ id: runId, taskId: row.id, taskName: row.name, triggerId: p.triggerId, source, dueMs: p.dueMs, slotMs: p.slotMs, dueReason: p.reason,
        firedMs: null, node: this.d.nodeId, shard: this.shard, epoch: this.epoch, attempt: 0, executor: row.executor, state: "skipped", error: excluded,
        causedBy: p.causedBy, upstreamRuns: null, createdMs: now, finishedMs: now });
      this.advanceAfterFire(round, lt, p, now);
      return;
    }
    // A scheduled run (or retry, or catch-up) whose executor is full waits for a place, in due
    // order, instead of being refused: see InFlightLimiter. Manual runs and dependency triggers
    // keep their own answers (refused to the caller; the trigger comes back).
    const waits = !opts.manual && source !== "dependency" && source !== "backfill";
    let placed = false;
    let waited = false;
    if (waits) {
      const reservedFor = this.reserved.get(row.id);
      if (reservedFor !== undefined) {
        this.reserved.delete(row.id);
        if (reservedFor === row.executor) placed = waited = true; else this.d.limiter.release(reservedFor);
      }
      if (!placed && !this.d.limiter.tryAcquire(row.executor)) { this.waitForCapacity(round, lt, p.dueMs); return; }
      placed = true;
    }
    const res = this.transition(lt, { type: "FIRE", runId, source, ...(opts.manual?.force ? { force: true } : {}) });
    if (!res.ok && placed) this.d.limiter.release(row.executor);
    const base: RunInsert = {
      id: runId, taskId: row.id, taskName: row.name, triggerId: opts.manual ? null : p.triggerId, source,
      dueMs: opts.manual ? now : p.dueMs, slotMs: opts.manual ? null : p.slotMs, dueReason: opts.manual ? `manual run${opts.manual.force ? " (--force)" : ""}` : waited ? `${p.reason}; it waited for a place at executor ${row.executor} (limit ${this.d.limiter.limitOf(row.executor)} runs in flight per node)` : p.reason,
      firedMs: releaseAt, node: this.d.nodeId, shard: this.shard, epoch: this.epoch, attempt: (row.record as TaskRecord).context.attempt,
      executor: row.executor, state: "running", error: null, causedBy: p.causedBy, upstreamRuns: opts.upstreamRuns ?? null, createdMs: now,
    };
    if (!res.ok) {
      if (opts.backfill) {
        opts.backfill({ ok: false, error: new AxError(res.code === "AX_E_TASK_RUNNING" ? "AX_E_TASK_RUNNING" : "AX_E_CONFLICT", res.reason, { field: "task", value: row.name }).toJSON() });
        return;
      }
      if (opts.manual) {
        const e = res.code === "AX_E_TASK_RUNNING"
          ? new AxError("AX_E_TASK_RUNNING", `task is running (run ${res.runningRunId})`, { field: "task", value: { task: row.name, runId: res.runningRunId } })
          : new AxError("AX_E_CONFLICT", row.state === "paused" ? "task is paused (use --force to run it anyway)" : res.reason, { field: "task", value: row.name });
        opts.manual.reply({ ok: false, error: e.toJSON() });
        return;
      }
      if (res.code === "AX_E_TASK_RUNNING" && advanceSchedule) {
        // overlap=forbid: the slot is not fired; the record says so and why.
        this.stats.skipped++;
        lt.skippedWhileRunning++;
        lt.lastSkipped = { triggerId: p.triggerId, slotMs: p.slotMs };
        round.write.runInserts.push({ ...base, attempt: 0, state: "skipped", finishedMs: now, error: `not fired: previous run ${res.runningRunId} still in flight (overlap=forbid)` });
        this.ledgerSlot(round, lt, p, source, { outcome: "overlap", runId, runningRunId: res.runningRunId ?? "?" }, now);
        this.d.events?.["slot:missed"]?.({ shard: this.shard, runId, taskId: row.id, task: row.name, executor: row.executor, reason: "overlap", slotMs: p.slotMs, detail: `previous run ${res.runningRunId} still in flight (overlap=forbid)` });
        this.advanceAfterFire(round, lt, p, now);
      } else if (source !== "dependency") {
        this.log.warn({ taskId: row.id, reason: res.reason }, "fire refused by the machine");
        this.ledgerSlot(round, lt, p, source, { outcome: "upstream", state: row.state, why: res.reason }, now);
        this.setPointer(round, lt, null);
      } // dependency: the trigger is nak'ed and comes back; the task's own schedule stays as it is
      return;
    }
    if (!placed && !this.d.limiter.tryAcquire(row.executor)) {
      // Manual run or dependency trigger at a full executor: refused. The run goes to retry with backoff.
      this.stats.refused++;
      this.transition(lt, { type: "REFUSED", runId, reason: "executor full" });
      const delay = backoffMs(1, Math.max(row.backoffMs, 100), Math.max(row.backoffMaxMs, 1000), this.d.random);
      const why = `refused: executor ${row.executor} has ${this.d.limiter.inFlight(row.executor)} runs in flight (limit ${this.d.limiter.limitOf(row.executor)}); retry in ${delay}ms`;
      round.write.runInserts.push({ ...base, state: "refused", finishedMs: now, error: why });
      this.ledgerSlot(round, lt, p, source, { outcome: "refused", runId, executor: row.executor, inFlight: this.d.limiter.inFlight(row.executor), limit: this.d.limiter.limitOf(row.executor), retryInMs: delay }, now);
      if (advanceSchedule) this.d.events?.["slot:missed"]?.({ shard: this.shard, runId, taskId: row.id, task: row.name, executor: row.executor, reason: "executor_full", slotMs: p.slotMs, detail: why });
      if (advanceSchedule && p.triggerId !== null && p.slotMs !== null) row.triggerSlots = { ...(p.source === "retry" ? row.triggerSlots : countTaken(row, p.triggerId)), [String(p.triggerId)]: p.slotMs };
      this.setPointer(round, lt, { dueMs: now + delay, slotMs: p.slotMs, triggerId: p.triggerId, source: "retry", causedBy: runId, reason: `retry of run ${runId}, which was ${why}` });
      opts.manual?.reply({ ok: false, error: new AxError("AX_E_UNAVAILABLE", why, { field: "executor", value: row.executor }).toJSON() });
      return;
    }
    this.stats.fired++;
    round.write.runInserts.push(base);
    if (advanceSchedule && p.source !== "retry") row.triggerSlots = countTaken(row, p.triggerId); // --max-runs
    if (opts.backfill) { const reply = opts.backfill; round.replies.push(() => reply({ ok: true, value: { runId } })); }
    const run: InFlightRun = { runId, taskId: row.id, executor: row.executor, timeoutMs: row.timeoutMs, ref: null, token: runToken(this.d.dispatchSecret, runId) };
    if (advanceSchedule && p.triggerId !== null) run.slotsBefore = { key: String(p.triggerId), value: row.triggerSlots[String(p.triggerId)] };
    if (!opts.manual && releaseAt > now) run.held = p;
    if (p.triggerId !== null && source !== "misfire") run.ledgerBefore = ledger.saveWatermark(row.triggerSlots, p.triggerId);
    this.ledgerSlot(round, lt, p, source, source === "misfire" ? { outcome: "catch-up", runId } : { outcome: "run", runId }, now);
    run.ref = this.horizon.addTimeout(releaseAt + row.timeoutMs, runId);
    this.inFlight.set(runId, run);
    let list = round.dispatch.get(row.executor);
    if (!list) { list = []; round.dispatch.set(row.executor, list); }
    list.push({
      runId, taskId: row.id, taskName: row.name, attempt: base.attempt, source, payload: opts.manual?.payload ?? row.payload,
      scheduledAt: base.dueMs, firedAt: releaseAt, timeoutMs: row.timeoutMs, shard: this.shard, token: run.token,
      deadline: releaseAt + row.timeoutMs, gen: row.generation,
    });
    this.d.events?.["run:fired"]?.({ shard: this.shard, runId, taskId: row.id, lateMs: releaseAt - base.dueMs, source, executor: row.executor });
    if (opts.manual) { const reply = opts.manual.reply; round.replies.push(() => reply({ ok: true, value: { runId } })); }
    if (advanceSchedule) this.advanceAfterFire(round, lt, p, now);
    else round.touched.add(row.id);
    // A withdrawal gives back only what this fire moved. A retry takes no slot and accounts none:
    // giving back the values it merely saw would undo what runs fired after it moved (its task's
    // next slots fire meanwhile), and the ledger would account their slots a second time.
    if (run.slotsBefore && row.triggerSlots[run.slotsBefore.key] === run.slotsBefore.value) delete run.slotsBefore;
    if (run.ledgerBefore && row.triggerSlots[run.ledgerBefore.key] === run.ledgerBefore.value) delete run.ledgerBefore;
  }

  /**
   * The task's executor is full: the task keeps its pointer (nothing is written) and waits in the
   * node's limiter; its `capacity` mail decides it again when a place frees (see onDue, which
   * also sees a pause or a new schedule that came meanwhile).
   */
  private waitForCapacity(round: Round, lt: LiveTask, dueMs: number): void {
    const id = lt.row.id;
    // Written with the round: what this round decided about the task before it had to wait (the
    // ledger's watermark past slots it accounted, say) must not be lost if the shard moves now.
    round.touched.add(id);
    if (this.waitingForCapacity.get(id) === dueMs) return;
    this.waitingForCapacity.set(id, dueMs);
    this.stats.waited++;
    const executor = lt.row.executor;
    this.d.limiter.wait(executor, {
      dueMs,
      wake: () => {
        if (this.state !== "active" || this.waitingForCapacity.get(id) !== dueMs) return false;
        this.waitingForCapacity.delete(id);
        this.reserved.set(id, executor);
        this.tell({ t: "capacity", taskId: id, dueMs, executor });
        return true;
      },
    });
  }

  /** After a scheduled slot fired (or was skipped): remember the slot, point at the next one. */
  private advanceAfterFire(round: Round, lt: LiveTask, p: Pointer, now: number): void {
    const row = lt.row;
    // Slots only move forward: a catch-up for an older skipped slot never rewinds the cadence.
    const key = String(p.triggerId);
    if (p.triggerId !== null && p.slotMs !== null && p.source !== "retry" && p.slotMs > (row.triggerSlots[key] ?? -Infinity)) row.triggerSlots = { ...row.triggerSlots, [key]: p.slotMs };
    // Decided more than the grace late (a retry, a catch-up, a busy node): later slots may be past too.
    if (p.slotMs !== null && p.slotMs < now - GRACE_MS) ledger.recordMisfireGap(round.write.ledger!, row, { kind: "behind" }, this.ledgerCtx(now), { graceMs: GRACE_MS });
    // A fixed-delay trigger counts from completion: nothing is due until the run ends.
    this.setPointer(round, lt, this.nextOf(round, lt, now));
  }

  private onEvents(round: Round, events: RunEvent[], instance: string, now: number): void {
    for (const ev of events) {
      const run = this.inFlight.get(ev.runId);
      // Only the holder of the run's dispatch knows its token: anything else is a forgery (or an
      // executor that does not echo tokens) and changes nothing, in flight or late.
      const d = decideEvent(ev, {
        inFlight: run !== undefined, instance,
        tokenOk: tokenMatches(ev.token, run?.token ?? runToken(this.d.dispatchSecret, ev.runId)),
        endApplied: this.finishedByEvent.has(ev.runId) || this.finishedByEventOld.has(ev.runId),
      });
      if (d.refuse) { this.refuseEvent(ev); continue; }
      if (d.runUpdate) round.write.runUpdates.push({ id: ev.runId, ...d.runUpdate });
      if (!run) continue;
      if (d.startedMs !== undefined) run.startedMs = d.startedMs;
      if (d.extend) this.extend(run, now);
      if (d.finish) {
        this.finishedByEvent.add(run.runId);
        if (this.finishedByEvent.size >= 50_000) { this.finishedByEventOld = this.finishedByEvent; this.finishedByEvent = new Set(); }
        this.finishRun(round, run, now, d.finish.event, d.finish.update);
      }
    }
  }

  private lastRefusalLog = -Infinity;
  /** Counted always; logged at most once every 10 s per shard (a flood of forged events is not a flood of lines). */
  private refuseEvent(ev: RunEvent): void {
    this.stats.refusedEvents++;
    const t = this.d.clock.monotonic();
    if (t - this.lastRefusalLog < 10_000) return;
    this.lastRefusalLog = t;
    this.log.warn({ runId: ev.runId, type: ev.type, refusedSoFar: this.stats.refusedEvents }, "event without its run's dispatch token refused");
  }

  private extend(run: InFlightRun, now: number): void {
    if (run.ref) this.horizon.cancel(run.ref);
    run.ref = this.horizon.addTimeout(now + run.timeoutMs, run.runId);
  }

  private onTimeout(round: Round, runId: string, now: number): void {
    const run = this.inFlight.get(runId);
    if (!run) { this.timeoutCheckedFrom.delete(runId); return; }
    if (this.d.persister.isPublishing(runId)) {
      // Its dispatch is not visible yet (NATS restarting, a stream leader election): nothing can
      // be running it, and timing it out now would let the late publish run it beside its retry.
      run.ref = this.horizon.addTimeout(now + run.timeoutMs, runId);
      return;
    }
    if (run.visibleMs !== undefined && now < run.visibleMs + run.timeoutMs) {
      // Its dispatch became visible late: the executor has had less than its timeout so far.
      run.ref = this.horizon.addTimeout(run.visibleMs + run.timeoutMs, runId);
      return;
    }
    const from = this.timeoutCheckedFrom.get(runId) ?? now;
    if (!this.catchUp.covers(from)) {
      // Its completion may sit unread in the events stream (a reload after an outage, a lagging consumer).
      this.timeoutCheckedFrom.set(runId, from);
      this.catchUp.request((unconfirmed) => {
        if (unconfirmed) this.timeoutCheckedFrom.set(runId, -Infinity);
        this.tell({ t: "due", items: [{ dueMs: now, item: { k: 1, runId } }], lateMs: 0 });
      });
      return;
    }
    this.timeoutCheckedFrom.delete(runId);
    if (!this.live.has(run.taskId) && !run.taskGone) {
      // Adopted at load: the task row comes with the next round. A task removed meanwhile has no
      // row: its run is timed out without it (finishRun). PostgreSQL not answering: asked again
      // in a second (a rejection left unhandled here would end the process).
      const again = () => this.tell({ t: "due", items: [{ dueMs: now, item: { k: 1, runId } }], lateMs: 0 });
      void this.d.store.fetchTasks(this.shard, [run.taskId]).then((rows) => {
        for (const row of rows) if (!this.live.has(row.id)) this.live.set(row.id, liveTask(row));
        if (!rows.some((r) => r.id === run.taskId)) run.taskGone = true;
        again();
      }, (e: unknown) => {
        this.log.warn({ runId, taskId: run.taskId, err: String(e) }, "could not load the task of a run at its timeout; trying again in 1 s");
        this.d.clock.setTimeout(again, 1000);
      });
      return;
    }
    this.stats.timedOut++;
    this.finishRun(round, run, now, { type: "TIMED_OUT", runId }, { finishedMs: now, state: "timed_out", error: `no completion or heartbeat within ${run.timeoutMs}ms` });
  }

  private finishRun(round: Round, run: InFlightRun, now: number, ev: TaskEvent, upd: Omit<RunUpdate, "id">): void {
    this.inFlight.delete(run.runId);
    if (run.ref) this.horizon.cancel(run.ref);
    this.d.limiter.release(run.executor);
    this.stats.finished++;
    round.write.runUpdates.push({ id: run.runId, ...upd });
    const lt = this.live.get(run.taskId);
    const startedMs = upd.startedMs ?? run.startedMs;
    const finished = (final: boolean) => this.d.events?.["run:finished"]?.({
      shard: this.shard, runId: run.runId, taskId: run.taskId, state: upd.state ?? "?", executor: run.executor, final,
      durationMs: startedMs !== undefined ? Math.max(0, (upd.finishedMs ?? now) - startedMs) : null, task: lt?.row.name ?? null, error: upd.error ?? null,
    });
    if (!lt) { finished(true); return; } // task removed meanwhile
    const res = this.transition(lt, ev);
    finished(!res.ok || res.to !== "retry");
    if (!res.ok) { this.log.warn({ taskId: run.taskId, runId: run.runId, reason: res.reason }, "completion refused by the machine"); return; }
    round.touched.add(lt.row.id);
    if (res.to === "running" || res.to === "paused" || res.to === "cancelled") return;
    const row = lt.row;
    if (res.to === "retry") {
      const attempt = (row.record as TaskRecord).context.attempt;
      const delay = backoffMs(attempt, row.backoffMs, row.backoffMaxMs, this.d.random);
      this.setPointer(round, lt, {
        dueMs: now + delay, slotMs: row.nextSlotMs, triggerId: row.nextTriggerId, source: "retry", causedBy: run.runId,
        reason: `retry ${attempt + 1}/${row.maxAttempts} of run ${run.runId} (${upd.state}: ${upd.error ?? ""}), backoff ${delay}ms`,
      });
      return;
    }
    // The chain ended (success, or failed with no attempts left).
    if (row.hasDownstreams) round.outcomes.push({ taskId: row.id, runId: run.runId, outcome: res.to === "success" ? "success" : "failed", at: now, ...(upd.error ? { reason: upd.error } : {}) });
    ledger.recordMisfireGap(round.write.ledger!, row, { kind: "behind" }, this.ledgerCtx(now), { graceMs: GRACE_MS });
    let p = this.nextOf(round, lt, now, { completedMs: upd.finishedMs ?? now });
    if (lt.skippedWhileRunning > 0 && row.misfire !== "skip" && lt.lastSkipped && (!p || p.dueMs > now)) {
      // A slow run made slots pass: fire once at once for the latest of them, then the cadence resumes.
      p = { dueMs: now, slotMs: lt.lastSkipped.slotMs, triggerId: lt.lastSkipped.triggerId, source: "misfire", causedBy: run.runId,
        reason: `catch-up (misfire=${row.misfire}): ${lt.skippedWhileRunning} slot(s) came due while run ${run.runId} was in flight` };
    }
    lt.skippedWhileRunning = 0;
    delete lt.lastSkipped;
    this.setPointer(round, lt, p);
  }

  private onDependencyTrigger(round: Round, trig: DependencyTrigger, msg: Ackable, now: number, recorded: ReadonlySet<string>): void {
    const lt = this.live.get(trig.taskId);
    if (!lt) { round.acks.push(msg); return; }
    if (trig.kind === "upstream_failed") {
      const res = this.transition(lt, { type: "UPSTREAM_FAILED", upstreamRunId: trig.upstreamRuns[0] ?? "", reason: trig.reason });
      if (res.ok) {
        round.touched.add(lt.row.id);
        this.d.events?.["task:upstreamFailed"]?.({ shard: this.shard, taskId: lt.row.id, task: lt.row.name, executor: lt.row.executor, upstreamRun: trig.upstreamRuns[0] ?? trig.key, reason: trig.reason });
        if (lt.row.hasDownstreams) round.outcomes.push({ taskId: lt.row.id, runId: trig.upstreamRuns[0] ?? trig.key, outcome: "upstream_failed", at: now, reason: trig.reason });
      }
      round.acks.push(msg);
      return;
    }
    // The run id is derived from the trigger's key: a redelivered trigger finds its run and stops.
    const runId = dependencyRunId(trig);
    if (recorded.has(runId) || this.inFlight.has(runId)) { round.acks.push(msg); return; }
    const before = this.stats.fired;
    this.fire(round, lt, { dueMs: trig.at, slotMs: null, triggerId: null, source: "dependency", causedBy: trig.upstreamRuns[0] ?? null, reason: trig.reason }, now, { upstreamRuns: trig.upstreamRuns, runId });
    if (this.stats.fired > before || !this.inFlight.has(runId) && round.write.runInserts.some((r) => r.id === runId)) round.acks.push(msg);
    else round.naks.push(msg); // running (overlap=forbid): try again shortly
  }

  /**
   * One backfill run for a past slot (ax task backfill). Its id is derived from (task, slot): a
   * slot already backfilled — in PostgreSQL, in flight or in this round — is answered with its
   * run and not fired again. An executor at its in-flight limit, or a task whose run is in
   * flight (overlap=forbid), is answered with an error and the caller tries again later.
   */
  private onBackfill(round: Round, cmd: Extract<ShardCommand, { type: "backfill" }>, reply: (r: CommandReply) => void, now: number, canFire: boolean, recorded: ReadonlySet<string>): void {
    const lt = this.live.get(cmd.taskId);
    const fail = (e: AxError) => reply({ ok: false, error: e.toJSON() });
    if (!lt) { fail(new AxError("AX_E_NOT_FOUND", `no task ${cmd.taskId} on shard ${this.shard}`, { field: "task", value: cmd.taskId })); return; }
    if (!canFire) { fail(new AxError("AX_E_UNAVAILABLE", `shard ${this.shard} is handing over; retry`)); return; }
    const runId = backfillRunId(cmd);
    if (this.inFlight.has(runId) || round.write.runInserts.some((r) => r.id === runId) || recorded.has(runId)) {
      reply({ ok: true, value: { runId, existed: true } });
      return;
    }
    const ex = lt.row.executor;
    if (this.d.limiter.inFlight(ex) >= this.d.limiter.limitOf(ex)) {
      fail(new AxError("AX_E_UNAVAILABLE", `executor ${ex} is at its in-flight limit (${this.d.limiter.limitOf(ex)}); retry`, { field: "executor", value: ex }));
      return;
    }
    this.fire(round, lt, { dueMs: now, slotMs: cmd.slotMs, triggerId: cmd.triggerId, source: "backfill", causedBy: null, reason: cmd.reason }, now, { runId, backfill: reply });
  }

  private onCommand(round: Round, cmd: ShardCommand, reply: (r: CommandReply) => void, now: number, canFire: boolean): void {
    const lt = this.live.get(cmd.taskId);
    const fail = (e: AxError) => reply({ ok: false, error: e.toJSON() });
    if (!lt) {
      if (cmd.type === "cancel") { reply({ ok: true }); return; }
      fail(new AxError("AX_E_NOT_FOUND", `no task ${cmd.taskId} on shard ${this.shard}`, { field: "task", value: cmd.taskId }));
      return;
    }
    if (!canFire && cmd.type !== "load") { fail(new AxError("AX_E_UNAVAILABLE", `shard ${this.shard} is handing over; retry`)); return; }
    switch (cmd.type) {
      case "load": {
        if (lt.row.nextDueMs !== null) {
          // The index entry the API wrote stays: the wheel's copy is marked as having one.
          this.horizon.takeOff(lt.row.id);
          this.horizon.schedule(round, lt.row.id, lt.row.nextDueMs, true);
        }
        reply({ ok: true });
        return;
      }
      case "run":
        this.fire(round, lt, { dueMs: now, slotMs: null, triggerId: null, source: "manual", causedBy: null, reason: "manual" }, now,
          { manual: { force: cmd.force, payload: cmd.payload ?? lt.row.payload, reply } });
        return;
      case "pause": {
        const res = this.transition(lt, { type: "PAUSE" });
        if (!res.ok) { fail(new AxError("AX_E_CONFLICT", res.reason, { field: "task", value: lt.row.name })); return; }
        ledger.notePaused(lt.row, now);
        this.withdrawHeld(round, lt, "the task was paused before the run's due time", now);
        this.setPointer(round, lt, null);
        round.replies.push(() => reply({ ok: true, value: { state: lt.row.state } }));
        return;
      }
      case "resume": {
        const stuck = lt.stuck;
        delete lt.stuck;
        const res = this.transition(lt, { type: "RESUME" });
        if (!res.ok) { fail(new AxError("AX_E_CONFLICT", res.reason, { field: "task", value: lt.row.name })); return; }
        // The slots that fell while it was paused are recorded now, with the pause's window.
        ledger.recordMisfireGap(round.write.ledger!, lt.row, { kind: "paused", pausedAtMs: ledger.pausedAt(lt.row.triggerSlots), resumedAtMs: now, ...(stuck ? { stuck } : {}) },
          this.ledgerCtx(now), { graceMs: GRACE_MS });
        ledger.clearPaused(lt.row);
        // Missed slots while paused: the misfire policy decides, as after downtime.
        if (res.to !== "running") this.setPointer(round, lt, this.nextOf(round, lt, now));
        round.touched.add(lt.row.id);
        round.replies.push(() => reply({ ok: true, value: { state: lt.row.state, nextDueMs: lt.row.nextDueMs } }));
        return;
      }
      case "update":
        this.onUpdate(round, lt, cmd.change, reply, now);
        return;
      case "cancel": {
        this.transition(lt, { type: "CANCEL" });
        this.withdrawHeld(round, lt, "the task was cancelled or removed before the run's due time", now);
        this.setPointer(round, lt, null);
        round.replies.push(() => reply({ ok: true }));
        return;
      }
    }
  }

  /**
   * Runs of the task that were written ahead of their due time and are not published yet are
   * withdrawn (recorded `refused`, never dispatched): a pause, cancel or removal before the due
   * time wins, as when the run was decided at its due time. The slot counts as not fired.
   */
  private withdrawHeld(round: Round, lt: LiveTask, why: string, now: number): InFlightRun[] {
    const out: InFlightRun[] = [];
    for (const runId of [...(lt.row.record as TaskRecord).context.inFlight]) {
      const run = this.inFlight.get(runId);
      if (!run || !this.d.persister.withdraw(runId)) continue;
      if (run.slotsBefore) {
        const slots = { ...lt.row.triggerSlots };
        if (run.slotsBefore.value === undefined) delete slots[run.slotsBefore.key]; else slots[run.slotsBefore.key] = run.slotsBefore.value;
        lt.row.triggerSlots = slots;
      }
      if (run.ledgerBefore) ledger.restoreWatermark(lt.row, run.ledgerBefore);
      this.finishRun(round, run, now, { type: "REFUSED", runId, reason: why }, { finishedMs: now, state: "refused", error: `withdrawn before dispatch: ${why}` });
      out.push(run);
    }
    return out;
  }

  /**
   * `ax task update`, between two rounds' fires. A run recorded ahead and not released yet was
   * decided under the old definition: it is withdrawn (recorded `refused`, its slot given back)
   * and decided again from the new one — at its own due time when the triggers stay, from the new
   * triggers when they change. A run already released is not touched: it runs and reports under
   * the definition it was dispatched with. The new definition, the generation and a history row
   * go into this round's fenced write with the new schedule.
   */
  private onUpdate(round: Round, lt: LiveTask, change: DefinitionChange, reply: (r: CommandReply) => void, now: number): void {
    const row = lt.row;
    const fail = (e: AxError) => reply({ ok: false, error: e.toJSON() });
    if (row.state === "cancelled") { fail(new AxError("AX_E_CONFLICT", "task is cancelled (being removed)", { field: "task", value: row.name })); return; }
    if (row.generation !== change.expectGeneration) {
      fail(new AxError("AX_E_CONFLICT", `task ${row.name} was changed meanwhile (generation ${row.generation}, the update was made against ${change.expectGeneration}); read it again and retry`,
        { field: "task", value: { task: row.name, generation: row.generation } }));
      return;
    }
    const prevRun = (row.record as TaskRecord).context.lastRunId;
    const generation = row.generation + 1;
    const withdrawn = this.withdrawHeld(round, lt, `the task was updated (generation ${generation}) before the run's due time; decided again under the new definition`, now);
    const { unlinked } = applyDefinitionChange(row, change, now);
    if (change.fields.triggers) delete lt.stuck;
    if (row.state !== "paused") {
      const held = withdrawn.map((r) => r.held).filter((p): p is Pointer => !!p).sort((a, b) => a.dueMs - b.dueMs)[0];
      let p: Pointer | null;
      if (change.fields.triggers) {
        // A pending retry stays (it belongs to a failed run); anything else follows the new triggers.
        if (row.nextSource === "retry" && !withdrawn.length && row.nextDueMs !== null) p = this.currentPointer(row);
        else {
          try { p = nextPointer({ ...row, createdMs: now }, now); } catch (e) { this.markStuck(round, lt, e); p = null; }
        }
      } else {
        p = held ?? (row.nextDueMs !== null ? this.currentPointer(row) : null);
      }
      this.setPointer(round, lt, p);
    } else {
      round.touched.add(row.id);
    }
    (round.write.defUpdates ??= []).push({
      id: row.id, generation, executor: row.executor, payload: row.payload, timeoutMs: row.timeoutMs, maxAttempts: row.maxAttempts,
      backoffMs: row.backoffMs, backoffMaxMs: row.backoffMaxMs, misfire: row.misfire, overlap: row.overlap,
      triggers: change.fields.triggers ? row.triggers : null, link: change.fields.triggers ? row.triggers.map((t) => t.id) : [], unlink: unlinked,
      history: { taskName: row.name, atMs: now, who: change.who, kind: "update", change: { ...change.summary, ...(withdrawn.length ? { withdrawn: withdrawn.map((r) => r.runId) } : {}) }, prevRun },
    });
    this.log.info({ taskId: row.id, generation, fields: Object.keys(change.summary), withdrawn: withdrawn.length }, "task:updated");
    round.replies.push(() => reply({ ok: true, value: { generation, nextDueMs: row.nextDueMs, withdrawn: withdrawn.map((r) => r.runId) } }));
  }

  private currentPointer(row: TaskRow): Pointer {
    return { dueMs: row.nextDueMs!, slotMs: row.nextSlotMs, triggerId: row.nextTriggerId, source: row.nextSource ?? "once", reason: row.nextReason ?? "", causedBy: row.nextCausedBy };
  }

  // ---- effects -----------------------------------------------------------------------------

  /**
   * Hands the round's fenced write to the node's round (Persister) and returns without waiting
   * for it: the next round is decided while this one is written (at most MAX_ROUNDS_WRITING
   * deep; the persister applies one shard's writes in order). What follows the write — acks,
   * publishes, due-index updates, replies — happens in finishRound, round after round in order.
   * The rows written are taken as PostgreSQL's from now on: if the write fails or is refused as
   * stale, the shard stops and is loaded afresh from PostgreSQL.
   */
  private submitRound(round: Round, batch: Mail[]): void {
    for (const id of round.touched) {
      this.unwritten.set(id, (this.unwritten.get(id) ?? 0) + 1);
      const lt = this.live.get(id);
      if (!lt) continue;
      const r = lt.row;
      if (unchanged(lt.written, r)) continue;
      lt.written = written(r);
      const u: TaskUpdate = {
        id, state: r.state, record: r.record, triggerSlots: r.triggerSlots, nextDueMs: r.nextDueMs, nextSlotMs: r.nextSlotMs,
        nextTriggerId: r.nextTriggerId, nextSource: r.nextSource, nextReason: r.nextReason, nextCausedBy: r.nextCausedBy,
      };
      round.write.taskUpdates.push(u);
    }
    // The node's round (Persister) writes this round with the other shards' and publishes its runs
    // in one message per executor; each run row names the message that carries it.
    const submitted = this.d.persister.submit(round.write, round.dispatch);
    const done = this.tail.then(() => this.finishRound(round, submitted))
      .catch((e: unknown) => this.log.error({ err: e instanceof Error ? e.stack : String(e) }, "handling a written round failed"));
    this.tail = done;
    this.writing.push(done);
    void done.finally(() => {
      this.inRounds.delete(batch);
      void this.writing.shift(); // this round: they finish in order (one tail)
      for (const id of round.touched) {
        const n = (this.unwritten.get(id) ?? 1) - 1;
        if (n > 0) this.unwritten.set(id, n); else this.unwritten.delete(id);
        this.evictable.add(id);
      }
      this.wakeQuiet();
    });
  }

  /** A submitted round once its write is done: acks, then its effects after the previous round's. Never rejects. */
  private async finishRound(round: Round, submitted: Promise<Submitted>): Promise<void> {
    let result: Submitted;
    try {
      result = await submitted;
    } catch (e) {
      // Not durable: the only consistent state is PostgreSQL's. The events come back unacked; the
      // supervisor loads the shard afresh.
      for (const m of round.acks) nakLater(m); // a failure: backed off, and counted towards parking
      if (this.state === "stopped") return; // an earlier round, or the lease, stopped it already
      this.log.error({ err: e instanceof Error ? e.stack : String(e) }, "round write failed; shard restarts from PostgreSQL");
      this.restart(`round write failed: ${String(e)}`);
      return;
    }
    if (result.stale) {
      for (const m of round.acks) m.nak();
      if (this.state === "stopped") return;
      this.log.error("epoch is no longer current: write refused, shard stops");
      this.restart("epoch is no longer current");
      return;
    }
    const slotEvent = this.d.events?.["slots:accounted"];
    if (slotEvent) for (const [outcome, count] of ledger.slotOutcomes(round.write.ledger ?? [], round.write.runInserts)) slotEvent({ shard: this.shard, outcome, count });
    // The events this round recorded are durable now: acked at once, so JetStream can hand out more.
    for (const m of round.acks) m.ack();
    for (const m of round.naks) m.nak(1000); // "not now" (overlap, lease), not a failure: no back-off
    // Effects are pipelined one deep: this round's publishes and due-index updates go out once the
    // previous round's are done (Redis sees one shard's adds and removes in round order).
    const previous = this.effects;
    this.effects = previous.then(() => this.applyEffects(round, result.published))
      .catch((e) => this.log.error({ err: e instanceof Error ? e.stack : String(e) }, "applying a written round's effects failed; its runs time out and retry"));
    await previous;
  }

  /**
   * Idle tasks leave memory (PostgreSQL holds them, the wheel or Redis their due time): those a
   * round saw, once no run of theirs is in flight and no submitted round's write of them is
   * pending. Done at the start of a round, never while one is being decided.
   */
  private evictIdle(): void {
    for (const id of this.evictable) {
      const lt = this.live.get(id);
      // A task that came due but no longer exists is evicted too (what the horizon knew of it goes).
      if (!lt || ((lt.row.record as TaskRecord).context.inFlight.length === 0 && lt.skippedWhileRunning === 0 && !this.unwritten.has(id))) { this.live.delete(id); this.horizon.forget(id); }
      if (!this.unwritten.has(id)) this.evictable.delete(id);
    }
  }

  /**
   * A written round's effects. Its dispatches are published by the node's round, some at once and
   * some at their due time: the next round does not wait for those (only Redis needs round order),
   * the replies do.
   */
  private async applyEffects(round: Round, published: Promise<void>): Promise<void> {
    this.releases.add(published);
    void published.finally(() => this.releases.delete(published));
    const jobs: Array<Promise<unknown>> = [];
    if (round.outcomes.length) {
      jobs.push(this.d.js.publish(this.d.names.outcomeSubject(this.shard), encode({ v: 1, outcomes: round.outcomes }), { msgID: `o:${round.outcomes[0]!.taskId}:${round.outcomes[0]!.runId}:${round.outcomes[0]!.outcome}` })
        .catch((e) => this.log.error({ err: String(e) }, "outcome publish failed")));
    }
    const removeSet = new Set(round.redisRemove);
    for (const a of round.redisAdd) removeSet.delete(a.id);
    if (removeSet.size) jobs.push(this.d.due.remove(this.shard, [...removeSet]).catch(() => undefined));
    if (round.redisAdd.length) jobs.push(this.d.due.add(this.shard, round.redisAdd).catch((e) => this.log.error({ err: String(e) }, "due index add failed; rebuilt on next load")));
    await Promise.all(jobs);
    if (round.dispatch.size) void published.then(() => this.noteLatePublish(round));
    if (round.replies.length) void published.then(() => { for (const r of round.replies) r(); });
  }

  /**
   * A run's timeout is armed at its release, on the assumption that its dispatch is visible
   * within moments. While the publish is retried the timeout is held (isPublishing); once it
   * lands late, the run is given its whole timeout from then, as the executor gives its handler:
   * otherwise a run whose dispatch waited out a 4 s election would have 1 s of a 5 s timeout left,
   * and a completion still on its way would find the run timed out (and retried beside it).
   */
  private noteLatePublish(round: Round): void {
    const at = this.d.clock.now();
    for (const list of round.dispatch.values()) {
      for (const r of list) {
        if (at - r.firedAt < LATE_PUBLISH_MS) continue;
        const run = this.inFlight.get(r.runId);
        if (run) run.visibleMs = at;
      }
    }
  }

  /**
   * Runs recorded `running` that no executor reported starting may never have been published
   * (the previous owner died between its write and its publish, or its publish kept failing
   * until its lease ran out: a NATS cluster electing a new meta and stream leader answers
   * nothing for 4-9 s). Their recorded messages are published again, complete (runs of every
   * shard they carried) and under their recorded ids: when the first publish did land,
   * JetStream's duplicate window (2 min) drops the copy, so no run is delivered twice. Older ones
   * are left to time out and follow their retry policy.
   *
   * A run whose timeout passed while nobody could publish it is published too, with its deadline
   * counted from now: it never reached an executor, so timing it out would fail (and, without
   * retries, lose) a run that never had its chance. Its timeout on this shard is reset to match.
   * Messages written before node-level dispatch (one shard each, no record) go out as v1.
   */
  private async republishUnstarted(running: RunRow[], now: number): Promise<number> {
    const ids = new Set<string>();
    const legacy = new Map<string, { executor: string; runs: DispatchRun[] }>();
    for (const r of running) {
      const row = this.live.get(r.taskId)?.row;
      if (!row || r.startedMs !== null || !r.dispatchId || r.firedMs === null) continue;
      if (now - r.firedMs > REPUBLISH_WINDOW_MS) continue;
      ids.add(r.dispatchId);
    }
    if (!ids.size) return 0;
    const recorded = await this.d.store.dispatchReplay([...ids]);
    let n = 0;
    const jobs: Array<Promise<unknown>> = [];
    for (const m of recorded) {
      ids.delete(m.id);
      if (!m.runs.length) continue;
      n += m.runs.length;
      const runs: ShardDispatchRun[] = m.runs.map((r) => ({ runId: r.id, taskId: r.taskId, taskName: r.taskName, attempt: r.attempt, source: r.source,
        payload: r.payload, scheduledAt: r.dueMs, firedAt: r.firedMs ?? now, timeoutMs: r.timeoutMs, shard: r.shard, token: runToken(this.d.dispatchSecret, r.id),
        // From when it goes out (see above); a copy of a publish that did land is dropped anyway.
        deadline: Math.max(r.firedMs ?? now, now) + r.timeoutMs, ...(this.live.get(r.taskId) ? { gen: this.live.get(r.taskId)!.row.generation } : {}) }));
      for (const r of runs) {
        const own = r.shard === this.shard ? this.inFlight.get(r.runId) : undefined;
        if (own && r.deadline! > r.firedAt + r.timeoutMs) {
          if (own.ref) this.horizon.cancel(own.ref);
          own.ref = this.horizon.addTimeout(r.deadline!, r.runId);
        }
      }
      // Recorded ahead of their due time by the previous owner: published at it, never before.
      // Tried again while this actor holds the shard, as a first publish is (a NATS leader election
      // can outlast the few seconds a plain retry allows; the runs' timeouts start only after this).
      const send = () => Promise.all(replayParts(m.id, m.releasedShards, runs).map((part) => publishDispatch(this.d.js, this.d.names, this.d.nodeId, m.executor, part.id, part.runs,
        { keepTrying: () => this.state !== "stopped" && this.d.leaseValid() })
        .catch((e) => this.log.error({ err: String(e), msgID: part.id }, "re-publishing a recorded dispatch failed; its runs time out and retry"))));
      const releaseAt = Math.max(...runs.map((r) => r.firedAt));
      if (releaseAt <= now) jobs.push(send());
      else atWallTime(this.d.clock, releaseAt, () => { if (this.state === "active" || this.state === "stopping") void send(); });
    }
    for (const r of running) {
      const row = this.live.get(r.taskId)?.row;
      if (!row || !r.dispatchId || !ids.has(r.dispatchId) || r.startedMs !== null || r.firedMs === null) continue;
      let g = legacy.get(r.dispatchId);
      if (!g) { g = { executor: r.executor, runs: [] }; legacy.set(r.dispatchId, g); }
      g.runs.push({ runId: r.id, taskId: r.taskId, taskName: r.taskName, attempt: r.attempt, source: r.source, payload: row.payload,
        scheduledAt: r.dueMs, firedAt: r.firedMs, timeoutMs: row.timeoutMs, token: runToken(this.d.dispatchSecret, r.id) });
    }
    for (const [id, g] of legacy) {
      n += g.runs.length;
      const data = encode({ v: 1, shard: this.shard, epoch: this.epoch, node: this.d.nodeId, runs: g.runs });
      jobs.push(this.d.js.publish(this.d.names.dispatchSubject(g.executor), data, { msgID: id })
        .catch((e) => this.log.error({ err: String(e), msgID: id }, "re-publishing a dispatch failed; its runs time out and retry")));
    }
    await Promise.all(jobs);
    return n;
  }

  // ---- stopping -----------------------------------------------------------------------------

  /** Planned hand-over: stop firing, finish the current round, give due times back to Redis. */
  async stop(): Promise<void> {
    if (this.state === "stopped" || this.state === "stopping") return;
    this.state = "stopping";
    this.horizon.halt();
    await this.consumers.close();
    // A refill in flight has taken entries from Redis: let it finish so its mail is handled
    // (and the entries come back to Redis with the rest of the wheel below).
    await this.horizon.settled();
    await this.quiet();
    await this.effects;
    await Promise.all([...this.releases]);
    const back = this.horizon.dueTimes();
    for (const [id, dueMs] of this.waitingForCapacity) back.push({ id, dueMs });
    this.waitingForCapacity.clear();
    this.releaseReserved();
    if (back.length) await this.d.due.add(this.shard, back).catch(() => undefined);
    for (const run of this.inFlight.values()) this.d.limiter.release(run.executor);
    this.inFlight.clear();
    this.state = "stopped";
    this.catchUp.stop();
    this.log.info({ returned: back.length }, "shard:released");
  }

  /** Places the limiter gave this shard's waiting tasks and no dispatch used: back to the next waiter. */
  private releaseReserved(): void {
    const places = [...this.reserved.values()];
    this.reserved.clear();
    for (const executor of places) this.d.limiter.release(executor);
  }

  /** Stops now (see fence) and has the supervisor load the shard afresh from PostgreSQL. */
  private restart(reason: string): void {
    this.fence(reason);
    this.d.onFenced(this.shard);
  }

  /** Lease lost, or a round/start that failed: stop now, write nothing more. `reason` says which. */
  fence(reason = "lease lost"): void {
    if (this.state === "stopped") return;
    this.state = "stopped";
    this.catchUp.stop();
    this.horizon.halt();
    void this.consumers.close();
    for (const run of this.inFlight.values()) this.d.limiter.release(run.executor);
    this.inFlight.clear();
    this.waitingForCapacity.clear();
    this.releaseReserved();
    // The rounds in progress too (being decided or written): one may hang on a server this node cannot reach (a partition from
    // PostgreSQL), and the events it holds (completions of runs whose timeouts the next owner
    // counts) must reach the next owner now, not after the ack wait.
    for (const m of [...[...this.inRounds].flat(), ...this.mail]) {
      if (m.t === "cmd") { if (this.mail.includes(m)) m.reply({ ok: false, error: new AxError("AX_E_UNAVAILABLE", `shard ${this.shard} lost its lease; retry`).toJSON() }); }
      else if (m.t === "events" || m.t === "trigger") m.msg.nak(); // back to JetStream for the next owner
    }
    this.mail = [];
    this.inRounds.clear();
    this.log.warn({ reason }, reason === "lease lost" ? "lease:lost — shard stopped" : "shard:stopped");
  }
}
