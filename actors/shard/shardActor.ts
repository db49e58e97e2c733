import type { NatsConnection } from "@nats-io/transport-node";
import type { JetStreamClient } from "@nats-io/jetstream";
import { AxError, type Clock, type Logger, type Names, type TimerHandle } from "../../common/index.ts";
import {
  DEPENDENCY_ACK_WAIT_MS, EventCatchUp, connectionUptime, handBack, noteJetStreamTrouble, type DeliveryView, jetStreamProgress, nakLater, nodeEventsConsumer, shardEventsConsumer, type DeadLetters, type RunEvent,
} from "../../protocol/index.ts";
import type { TaskRecord } from "../machine/index.ts";
import { Horizon } from "./horizon.ts";
import { ShardConsumers } from "./consumers.ts";
import type { DueIndex, Store } from "../store/index.ts";
import type { InFlightLimiter } from "../limiter.ts";
import type { Ackable, EventSink } from "../events/index.ts";
import type { Persister, Submitted } from "../persister.ts";
import { CalendarCache } from "./calendars.ts";
import { LedgerStore, loadCalendars } from "../store/index.ts";
import * as ledger from "./ledger.ts";
import { ShardEffects, taskUpdatesOf } from "./effects.ts";
import { ShardDecisions, NONE_RECORDED, backfillRunId, dependencyRunId } from "./decide.ts";
import { liveTask, type CommandReply, type Mail, type Round, type ShardCommand, type ShardEvents } from "./types.ts";

export type { CommandReply, ShardCommand, ShardEvents } from "./types.ts";

/**
 * A node's shards decide the runs written ahead on a common 100 ms grid rather than at each
 * 20 ms tick: the 64 shards of a busy node then run one round each per step (all in one batch
 * write) instead of five small ones. Measured alternated against deciding at every tick, 120k
 * runs at 8,200/s: 183 against 196 µs of CPU a run (node 88 against 95); 12k at 835/s: 894
 * against 994 (PostgreSQL 126 against 172). A run is still never published before its due time.
 */
export const DECIDE_STEP_MS = 100;

/**
 * How far past a shard's load a fire found unwritten on its task row may be due (see
 * ShardActor.start): such a fire was decided at most the lead and a step before its due time, by
 * a node whose clock may run ahead of this one's. Clocks further apart than this (less the lead)
 * would let a next owner miss the fire and fire its slot again.
 */
export const UNWRITTEN_FIRE_CLOCK_MARGIN_MS = 60_000;

export interface ShardActorDeps {
  nodeId: string;
  store: Store;
  due: DueIndex;
  persister: Persister;
  /** The executors' consumers' delivery progress (one per node, shared by its shards). */
  delivery: DeliveryView;
  /** AX_DELIVERY_GRACE (see DecisionPorts.deliveryGraceMs). */
  deliveryGraceMs?: number;
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
  /**
   * The decision grid (see HorizonOptions.decideStepMs; default DECIDE_STEP_MS, capped at the
   * lead): runs due within one step are decided together, between the lead and the lead plus a
   * step ahead of their due time.
   */
  decideStepMs?: number;
  /**
   * At most this many due times per step of the decision grid (see HorizonOptions.perStep;
   * default 0: no bound): a burst is decided over the seconds before it. Its runs go ahead to an
   * executor that holds them outside the in-flight limit (see InFlightLimiter.tryAcquireAhead).
   */
  perStep?: number;
  /**
   * Longest a fire may leave its task row unwritten (AX_TASK_WRITE_DEFER; default 2 s, 0: never):
   * the run's end, most often within it, writes the fire's change and its own in one update.
   */
  taskWriteDeferMs?: number;
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
  /**
   * The shard's previous actor on this node stopped on a failure (a round PostgreSQL refused, say):
   * a message delivered again in this actor's first CAREFUL_MS is decided in a round of its own and
   * written before the next round is decided. The message that caused the failure then fails
   * alone, and those that only shared its rounds are applied instead of failing with it on every
   * delivery until they are parked as dead letters beside it (their runs left to time out).
   */
  careful?: boolean;
  events?: ShardEvents;
  random?: () => number;
}

/** Rounds of one shard submitted and not yet written: one being written, the next one queued behind it. */
const MAX_ROUNDS_WRITING = 2;

/** How long after its start a careful actor (ShardActorDeps.careful) decides a redelivered message alone. */
const CAREFUL_MS = 60_000;

/** A message delivered before (its processing failed, or its shard moved while holding it). */
function redelivered(m: Mail): boolean {
  return (m.t === "events" || m.t === "trigger") && (m.msg.info?.deliveryCount ?? 1) > 1;
}

/** A message past its deliveries, to be parked if it fails alone (DeadLetters.lastChance). */
function lastChance(m: Mail): boolean {
  return (m.t === "events" || m.t === "trigger") && m.msg.park !== undefined;
}

/** A failed round's message: parked if it was a last chance decided alone, else handed back with its back-off. */
function failed(m: Ackable, alone: Ackable | null): void {
  if (m === alone && m.park) m.park(); else nakLater(m);
}

/** The message of a round decided for it alone (see loop): if that round fails, the failure is its own. */
function aloneIn(batch: Mail[]): Ackable | null {
  const m = batch.length === 1 ? batch[0]! : null;
  return m && (m.t === "events" || m.t === "trigger") ? m.msg : null;
}

/** An Ackable that passes on only its first ack or nak. */
function once(a: Ackable): Ackable {
  let done = false;
  return {
    ack: () => { if (!done) { done = true; a.ack(); } }, nak: (d?: number) => { if (!done) { done = true; a.nak(d); } },
    working: () => { if (!done) a.working?.(); },
    ...(a.park ? { park: () => { if (!done) { done = true; a.park!(); } } } : {}),
    // The delivery count sets a failed round's back-off (nakLater) and makes a message suspect (see careful).
    ...(a.info ? { info: a.info } : {}),
  };
}

/**
 * One owned shard: its wheel, its tasks' state machines, its dispatch. An actor: state is
 * private and everything arrives as mail, handled in rounds. A round takes all mail queued,
 * loads the rows it needs, is decided without waiting on anything (decide.ts), writes every
 * change in one fenced batch, and only then applies its effects (effects.ts: publish
 * dispatches, update the due index, reply; the events are acked here).
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
  /** What the shard remembers and decides with (decide.ts). */
  private readonly decisions: ShardDecisions;
  private mail: Mail[] = [];
  /** Last chances in `mail` (see lastChance): while none waits and the actor is not careful, a round takes the whole mail without looking. */
  private lastChancesInMail = 0;
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
  /** The last written round's publishes and due-index updates (see finishRound). */
  private effects: Promise<void> = Promise.resolve();
  /** What written rounds do outside PostgreSQL (effects.ts). */
  private readonly out: ShardEffects;
  private readonly consumers: ShardConsumers;
  /** Timeouts wait until the events published before them are read (see EventCatchUp). */
  private readonly catchUp: EventCatchUp;
  /** The node that owned the shard before this actor (its events consumer may hold this shard's completions). */
  private prevOwnerNode: string | null = null;
  private readonly calendars: CalendarCache;
  readonly stats: ShardDecisions["stats"];
  /** Tasks fired whose row a round has not written since (Round.deferred), with when (monotonic): flushed by taskWriteDeferMs. */
  private readonly unwrittenFires = new Map<number, number>();
  private flushTimer: TimerHandle | null = null;
  private keepHeldTimer: TimerHandle | null = null;
  /** Rounds are wanted now, completions included (the shard is stopping: see quiet). */
  private draining = false;
  /** The step the queued completions waited for has come (see eventsSoon). */
  private eventsDue = false;
  /** The round the queued completions wait for (see eventsSoon). */
  private eventsTimer: TimerHandle | null = null;
  private readonly taskWriteDeferMs: number;
  /** Until when (monotonic) a redelivered message is decided alone (see ShardActorDeps.careful). */
  private readonly carefulUntil: number;

  constructor(shard: number, epoch: number, deps: ShardActorDeps) {
    this.calendars = new CalendarCache((names) => loadCalendars(deps.store.pool, names), deps.clock);
    this.shard = shard;
    this.epoch = epoch;
    this.d = deps;
    this.taskWriteDeferMs = deps.taskWriteDeferMs ?? 2000;
    this.carefulUntil = deps.careful ? deps.clock.monotonic() + CAREFUL_MS : -Infinity;
    this.log = deps.log.child({ shard, epoch });
    // The shard's events come through its node's consumer (v2) and its own (v1, forwarded): a
    // timeout waits until both have applied what was published before it.
    // And through the previous owner's node consumer: completions of the runs it dispatched reach
    // this shard only once it forwards them (or, if it is gone, the live nodes' drain does), so
    // that consumer must have moved past them too. A node cut off from PostgreSQL held such a
    // completion while its shard moved here, and the run was timed out as if unanswered.
    const prevConsumer = () => (this.prevOwnerNode && this.prevOwnerNode !== deps.nodeId ? [nodeEventsConsumer(this.prevOwnerNode)] : []);
    this.catchUp = new EventCatchUp(jetStreamProgress(deps.js, deps.names.eventsStream,
      () => [shardEventsConsumer(shard), nodeEventsConsumer(deps.nodeId), ...prevConsumer()], (d) => prevConsumer().includes(d)),
      deps.clock, this.log, { uptimeMs: connectionUptime(deps.nc, deps.clock), onTrouble: noteJetStreamTrouble(deps.nc, deps.clock) });
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
      decideStepMs: deps.decideStepMs ?? DECIDE_STEP_MS, ...(deps.perStep !== undefined ? { perStep: deps.perStep } : {}),
      onDue: (items, lateMs) => this.tell({ t: "due", items, lateMs }),
      onRefilled: (items) => this.tell({ t: "refilled", items }),
      active: () => this.state === "active",
      inMemory: () => this.dueInMemory(),
    });
    this.decisions = new ShardDecisions({
      shard, epoch, nodeId: deps.nodeId, clock: deps.clock, log: this.log, tickMs: deps.tickMs, limiter: deps.limiter, horizon: this.horizon,
      // Decided further ahead than the lead and a step (and a tick late): spread by the horizon.
      spreadAheadMs: this.horizon.leadMs + this.horizon.decideStepMs + deps.tickMs,
      calendars: this.calendars,
      persister: deps.persister, catchUp: this.catchUp, delivery: deps.delivery, deliveryGraceMs: deps.deliveryGraceMs, dispatchSecret: deps.dispatchSecret, events: deps.events, random: deps.random,
      tell: (m) => this.tell(m), active: () => this.state === "active", deferFireWrites: this.taskWriteDeferMs > 0,
    });
    this.stats = this.decisions.stats;
    this.out = new ShardEffects({
      shard, epoch, nodeId: deps.nodeId, js: deps.js, names: deps.names, due: deps.due, store: deps.store, clock: deps.clock, log: this.log,
      dispatchSecret: deps.dispatchSecret, horizon: this.horizon, view: this.decisions, releasable: () => this.releasable,
      mayPublish: () => this.state !== "stopped" && deps.leaseValid(),
      noteLanded: (runs, atMs) => deps.persister.noteLanded(runs, atMs),
    });
  }

  get status() { return this.state; }
  /** Written runs of this actor may still be published: it was not fenced (a planned stop flushes them first). */
  get releasable(): boolean { return this.state === "active" || this.state === "stopping"; }
  get inFlightCount() { return this.decisions.inFlight.size; }
  get wheelSize() { return this.horizon.size; }

  async start(): Promise<void> {
    this.state = "loading";
    const acquiredMs = this.d.clock.now();
    const t0 = this.d.clock.monotonic();
    const prevOwner = await new LedgerStore(this.d.store.pool).previousOwner(this.shard);
    this.prevOwnerNode = prevOwner.owner;
    this.decisions.acquired(acquiredMs, prevOwner);
    const running = await this.d.store.runningRuns(this.shard);
    // Fires whose task rows were not written yet when the shard changed hands (see
    // ShardDecisions.fire): their rows still point at the runs' slots, and would fire them again.
    const unwritten = await this.d.store.firesNotOnTaskRow(this.shard,
      this.d.clock.now() + this.horizon.leadMs + this.horizon.decideStepMs + UNWRITTEN_FIRE_CLOCK_MARGIN_MS);
    const owners = await this.d.store.fetchTasks(this.shard, [...new Set([...running, ...unwritten].map((r) => r.taskId))]);
    for (const row of owners) this.decisions.live.set(row.id, liveTask(row));
    const replay = this.decisions.newRound();
    for (const r of unwritten) {
      const lt = this.decisions.live.get(r.taskId);
      if (!lt || !this.decisions.replayFire(replay, lt, r)) this.log.warn({ taskId: r.taskId, runId: r.id }, "a running run its task row does not show, and not a fire to redo: tracked until it ends or times out");
      running.push(r);
    }
    if (replay.touched.size) this.log.warn({ runs: replay.touched.size }, "redid fires whose task rows the previous owner had not written");
    // The rows as redone point past the runs' slots: their stale due times stay out of the index.
    const dueRows = (await this.d.store.dueOfShard(this.shard)).filter((e) => !replay.touched.has(e.id));
    await this.d.due.rebuild(this.shard, dueRows);
    const now = this.d.clock.now();
    for (const r of running) this.decisions.adoptRunning(r, now);
    const republished = await this.out.republishUnstarted(running, now);
    if (republished) this.log.warn({ runs: republished }, "re-published runs the previous owner recorded but no executor started");
    this.state = "active";
    // Written before anything else of the shard: the rows as redone, and their next due times.
    if (replay.touched.size) this.submitRound(replay, []);
    this.horizon.start();
    await this.horizon.refill();
    await this.consumers.start();
    this.log.info({ tasksDue: dueRows.length, running: running.length, ms: Math.round(this.d.clock.monotonic() - t0) }, "shard:acquired");
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
    if (lastChance(m)) this.lastChancesInMail++;
    this.mail.push(m);
    if (this.deciding) return;
    // Completions wait for the next step (see eventsSoon); anything else starts a round now, and
    // takes the waiting completions with it.
    if (m.t === "events" && this.eventsMayWait()) { this.eventsSoon(); return; }
    this.kick();
  }

  /** Starts the mailbox loop on the next turn (the mail queued until then is one round). */
  private kick(): void {
    if (this.eventsTimer !== null) { this.d.clock.clearTimeout(this.eventsTimer); this.eventsTimer = null; }
    if (this.deciding) return;
    this.deciding = true;
    setImmediate(() => { void this.loop(); });
  }

  /**
   * Not while runs wait for a place at an executor (a completion frees one: the wait would be
   * theirs), nor while the shard is stopping (see quiet).
   */
  private eventsMayWait(): boolean {
    return this.state === "active" && !this.draining && this.d.limiter.waiting() === 0;
  }

  /**
   * Completions (executor events) alone do not start a round: they wait for the round of the
   * shard's next decision step, or a tick after it when that step brings no due time. Each event
   * message an executor sends holds runs of every shard of the node, and a round per shard per
   * message made completions most of a 64-shard node's rounds (2,580 of 3,120 a second at 8,200
   * runs/s; 610 rounds in all with this). A completion is thus recorded up to a step and a tick
   * (120 ms at the defaults) after it reaches the node; a timeout, an overlap or a dependency
   * decided meanwhile sees it first, since any other mail starts a round at once and takes the
   * waiting completions with it, in the order they came.
   */
  private eventsSoon(): void {
    if (this.eventsTimer !== null) return;
    const wait = this.horizon.nextStepDelayMs() + this.d.tickMs;
    this.eventsTimer = this.d.clock.setTimeout(() => { this.eventsTimer = null; this.eventsDue = true; if (this.state !== "stopped") this.kick(); }, wait);
  }

  /** Resolves when no round is being decided or written and the mailbox is empty (or the shard stopped). */
  private async quiet(): Promise<void> {
    this.draining = true;
    if (this.mail.length) this.kick(); // completions waiting for their step: now
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
        // Completions that came while the last round was decided wait for the next step too.
        if (!this.eventsDue && this.eventsMayWait() && this.mail.every((m) => m.t === "events")) { this.eventsSoon(); break; }
        this.eventsDue = false;
        // A last chance, and after a failure a redelivered message, is a round of its own, alone in
        // the shard's writes (see ShardActorDeps.careful); the mail before it is one round, as usual.
        const careful = this.d.clock.monotonic() < this.carefulUntil;
        const suspect = careful || this.lastChancesInMail > 0 ? this.mail.findIndex((m) => lastChance(m) || (careful && redelivered(m))) : -1;
        if (suspect === 0 && this.writing.length) { await Promise.all(this.writing); continue; }
        const batch = suspect === 0 ? this.mail.splice(0, 1) : suspect > 0 ? this.mail.splice(0, suspect) : this.mail.splice(0);
        if (suspect === 0 && lastChance(batch[0]!)) this.lastChancesInMail--;
        this.inRounds.add(batch);
        try {
          await this.round(batch);
          if (suspect === 0) await Promise.all(this.writing);
        } catch (e) {
          this.inRounds.delete(batch);
          // The round's decisions are in memory but not durable: the only consistent state is
          // PostgreSQL's. Stop without writing and let the supervisor load the shard afresh
          // (fires that were not recorded are still due there; events come back unacked).
          this.log.error({ err: e instanceof Error ? e.stack : String(e) }, "round failed; shard restarts from PostgreSQL");
          for (const m of batch) {
            if (m.t === "events" || m.t === "trigger") failed(m.msg, aloneIn(batch));
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

  /**
   * One round: the rows its mail needs are loaded (one query for those not in memory, one for the
   * derived runs PostgreSQL holds), then the round is decided without waiting on anything
   * (decide.ts), then its plan is handed to the node's write (submitRound).
   */
  private async round(batch: Mail[]): Promise<void> {
    this.evictIdle();
    const { live, inFlight } = this.decisions;
    const now = this.d.clock.now();
    const canFire = this.state === "active" && this.d.leaseValid();
    const need = new Set<number>();
    for (const m of batch) {
      if (m.t === "due") {
        for (const it of m.items) {
          if (it.item.k === 0) need.add(it.item.id);
          else { const r = inFlight.get(it.item.runId); if (r) need.add(r.taskId); } // a timeout: its task (adopted runs' may not be live)
        }
      }
      if (m.t === "cmd") need.add(m.cmd.taskId);
      if (m.t === "trigger") need.add(m.trig.taskId);
      if (m.t === "events") for (const ev of m.events) { const r = inFlight.get(ev.runId); if (r) need.add(r.taskId); }
      if (m.t === "refilled") for (const it of m.items) { const d = this.horizon.dueOf(it.id); if (d !== undefined && d !== it.dueMs) need.add(it.id); }
      if (m.t === "capacity") need.add(m.taskId);
    }
    for (const id of need) this.evictable.add(id);
    // A row held in memory (a run of it in flight) is not read again, but for its dependency
    // edges when they changed (`deps`): a run that finishes must see the downstreams added while
    // it ran, or they are not triggered by it. Only those fields: the rest is this shard's own.
    const edgesChanged = new Set<number>();
    for (const m of batch) if (m.t === "cmd" && m.cmd.type === "deps") edgesChanged.add(m.cmd.taskId);
    const missing = [...need].filter((id) => !live.has(id) || edgesChanged.has(id));
    for (const row of await this.d.store.fetchTasks(this.shard, missing)) {
      const held = live.get(row.id);
      if (held) { held.row.hasDownstreams = row.hasDownstreams; held.row.upstreams = row.upstreams; } else live.set(row.id, liveTask(row));
    }
    // Calendars of excluded dates named by the tasks coming due (none: no query).
    await this.calendars.ensure([...need].map((id) => live.get(id)?.row));
    // Which derived runs (a dependency trigger's, a backfill's) PostgreSQL already holds: one
    // query before deciding, not one per message while the round is being decided.
    const derived: string[] = [];
    for (const m of batch) {
      if (m.t === "trigger" && m.trig.kind !== "upstream_failed") derived.push(dependencyRunId(m.trig));
      if (m.t === "cmd" && m.cmd.type === "backfill") derived.push(backfillRunId(m.cmd));
    }
    const recorded = derived.length ? new Set((await this.d.store.getRuns(derived)).map((r) => r.id)) : NONE_RECORDED;
    this.submitRound(this.decisions.decide(batch, { now, canFire, recorded }), batch);
    // A hand-over (`load`) says the API wrote due times that may be imminent: take them from
    // Redis now rather than at a refill backed off by an idle spell.
    if (batch.some((m) => m.t === "cmd" && m.cmd.type === "load")) this.horizon.refillSoon();
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
    if (round.deferred.length) {
      const now = this.d.clock.monotonic(); // (a wall clock stepped back must not hold the flush)
      for (const id of round.deferred) if (!this.unwrittenFires.has(id)) this.unwrittenFires.set(id, now);
    }
    for (const id of round.touched) {
      this.unwritten.set(id, (this.unwritten.get(id) ?? 0) + 1);
      this.unwrittenFires.delete(id);
    }
    if (this.unwrittenFires.size && this.flushTimer === null) this.scheduleFlush();
    if (this.decisions.heldTriggers.size && this.keepHeldTimer === null) this.keepHeldAlive();
    // (decisions write no task updates themselves: the round's are exactly the changed rows it touched)
    round.write.taskUpdates = taskUpdatesOf(round.touched, this.decisions.live);
    // The node's round (Persister) writes this round with the other shards' and publishes its runs
    // in one message per executor; each run row names the message that carries it.
    const submitted = this.d.persister.submit(round.write, round.dispatch);
    const alone = aloneIn(batch);
    const done = this.tail.then(() => this.finishRound(round, submitted, alone))
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
  private async finishRound(round: Round, submitted: Promise<Submitted>, alone: Ackable | null): Promise<void> {
    let result: Submitted;
    try {
      result = await submitted;
    } catch (e) {
      // Not durable: the only consistent state is PostgreSQL's. The events come back unacked; the
      // supervisor loads the shard afresh.
      for (const m of round.acks) failed(m, alone); // a failure: backed off, and counted towards parking
      if (this.state === "stopped") return; // an earlier round, or the lease, stopped it already
      this.log.error({ err: e instanceof Error ? e.stack : String(e) }, "round write failed; shard restarts from PostgreSQL");
      this.restart(`round write failed: ${String(e)}`);
      return;
    }
    if (result.stale) {
      for (const m of round.acks) handBack(m);
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
    this.effects = previous.then(() => this.out.apply(round, result.published))
      .catch((e) => this.log.error({ err: e instanceof Error ? e.stack : String(e) }, "applying a written round's effects failed; its runs time out and retry"));
    await previous;
  }

  /**
   * Idle tasks leave memory (PostgreSQL holds them, the wheel or Redis their due time): those a
   * round saw, once no run of theirs is in flight and no submitted round's write of them is
   * pending. Done at the start of a round, never while one is being decided.
   */
  private evictIdle(): void {
    // A task waiting for a place at its executor (or woken with one) stays: its capacity mail
    // decides it again, and evicted it was read back from PostgreSQL for that, a fetch a run
    // while the executor is full. The capacity round looks at it again.
    // So does a task holding a dependency trigger: the trigger is decided from its row in memory.
    const waits = this.decisions.waitingForCapacity; const placed = this.decisions.reserved; const held = this.decisions.heldTriggers;
    for (const id of this.evictable) {
      const lt = this.decisions.live.get(id);
      // A task that came due but no longer exists is evicted too (what the horizon knew of it goes).
      if (!lt || ((lt.row.record as TaskRecord).context.inFlight.length === 0 && lt.skippedWhileRunning === 0 && !this.unwritten.has(id) && !waits.has(id) && !placed.has(id) && !held.has(id))) {
        this.decisions.live.delete(id); this.horizon.forget(id);
      }
    }
    // Each is looked at once: a task still waiting for a write comes back when that write is done
    // (submitRound), and one with a run in flight when a round touches it again. Keeping the ones
    // waiting for a write made every round walk all of them again: evictIdle was ~2 % of a node's
    // CPU at 6,000 runs/s in a profile, and about a quarter less a run without that walk.
    this.evictable.clear();
  }

  /**
   * The live tasks' due times that only memory and the due index hold (see Horizon's inMemory):
   * not on the wheel, not waiting for (or woken with) a place at their executor.
   */
  private dueInMemory(): Array<{ id: number; dueMs: number }> {
    const out: Array<{ id: number; dueMs: number }> = [];
    const { live, waitingForCapacity, reserved } = this.decisions;
    for (const [id, lt] of live) {
      const due = lt.row.nextDueMs;
      if (due === null || this.horizon.dueOf(id) === due || waitingForCapacity.has(id) || reserved.has(id)) continue;
      out.push({ id, dueMs: due });
    }
    return out;
  }

  /**
   * Fires whose task rows a round has not written within taskWriteDeferMs are written by a round
   * of their own (flush mail), so readers of the row (`ax task show`) see them that late at most.
   */
  private scheduleFlush(): void {
    const oldest = this.unwrittenFires.values().next();
    if (oldest.done) return;
    const wait = Math.max(0, oldest.value + this.taskWriteDeferMs - this.d.clock.monotonic());
    this.flushTimer = this.d.clock.setTimeout(() => {
      this.flushTimer = null;
      if (this.state !== "active") return;
      const due = this.d.clock.monotonic() - this.taskWriteDeferMs;
      const ids: number[] = [];
      // In insertion order, which is the order of their fires: the first one not due ends the walk.
      for (const [id, since] of this.unwrittenFires) { if (since > due) break; ids.push(id); }
      for (const id of ids) this.unwrittenFires.delete(id);
      if (ids.length) this.tell({ t: "flush", taskIds: ids });
      this.scheduleFlush();
    }, wait);
  }

  /**
   * Held dependency triggers (ShardDecisions.heldTriggers) are told "in progress" well within
   * their consumer's ack wait, so JetStream does not hand them out again while they wait.
   */
  private keepHeldAlive(): void {
    this.keepHeldTimer = this.d.clock.setTimeout(() => {
      this.keepHeldTimer = null;
      if (this.state !== "active") return;
      const msgs = this.decisions.heldTriggerMessages();
      for (const m of msgs) m.working?.();
      if (msgs.length) this.keepHeldAlive();
    }, Math.floor(DEPENDENCY_ACK_WAIT_MS / 3));
  }

  /** The flush and the keep-alive of held triggers (the shard stops). */
  private clearTimers(): void {
    if (this.flushTimer !== null) { this.d.clock.clearTimeout(this.flushTimer); this.flushTimer = null; }
    if (this.keepHeldTimer !== null) { this.d.clock.clearTimeout(this.keepHeldTimer); this.keepHeldTimer = null; }
    if (this.eventsTimer !== null) { this.d.clock.clearTimeout(this.eventsTimer); this.eventsTimer = null; }
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
    // Fires whose task rows wait: written now, so the next owner has nothing to redo.
    this.clearTimers();
    if (this.unwrittenFires.size) this.tell({ t: "flush", taskIds: [...this.unwrittenFires.keys()] });
    this.unwrittenFires.clear();
    await this.quiet();
    await this.effects;
    await this.out.released();
    const back = this.horizon.dueTimes();
    for (const [id, dueMs] of this.decisions.waitingForCapacity) back.push({ id, dueMs });
    this.decisions.dropInFlight();
    if (back.length) await this.d.due.add(this.shard, back).catch(() => undefined);
    this.state = "stopped";
    this.d.persister.revoke(this.shard);
    this.catchUp.stop();
    this.log.info({ returned: back.length }, "shard:released");
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
    this.clearTimers(); // the rows not written are the next owner's to redo (see start)
    // The releaser thread publishes none of this shard's runs from here on (the node's own
    // release path asks whether the shard is still releasable, as before).
    this.d.persister.revoke(this.shard);
    this.catchUp.stop();
    this.horizon.halt();
    void this.consumers.close();
    this.decisions.dropInFlight();
    // The rounds in progress too (being decided or written): one may hang on a server this node cannot reach (a partition from
    // PostgreSQL), and the events it holds (completions of runs whose timeouts the next owner
    // counts) must reach the next owner now, not after the ack wait.
    for (const m of [...[...this.inRounds].flat(), ...this.mail]) {
      if (m.t === "cmd") { if (this.mail.includes(m)) m.reply({ ok: false, error: new AxError("AX_E_UNAVAILABLE", `shard ${this.shard} lost its lease; retry`).toJSON() }); }
      else if (m.t === "events" || m.t === "trigger") handBack(m.msg); // back to JetStream for the next owner
    }
    this.mail = [];
    this.lastChancesInMail = 0;
    this.inRounds.clear();
    this.log.warn({ reason }, reason === "lease lost" ? "lease:lost — shard stopped" : "shard:stopped");
  }
}

