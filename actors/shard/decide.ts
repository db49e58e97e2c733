import { AxError, type Clock, type Logger } from "../../common/index.ts";
import { derivedRunId, handBack, newRunId, runToken, tokenMatches, type DeliveryView, type EventCatchUp, type RunEvent, type DependencyTrigger } from "../../protocol/index.ts";
import { applyEvent, busyForbidden, type TaskEvent, type TaskRecord } from "../machine/index.ts";
import type { Horizon } from "./horizon.ts";
import { decideEvent } from "./runEvents.ts";
import type { RunInsert, RunRow, RunSource, RunUpdate, TaskRow } from "../store/index.ts";
import { withSlot } from "../store/index.ts";
import type { InFlightLimiter } from "../limiter.ts";
import type { Ackable } from "../events/index.ts";
import type { Persister } from "../persister.ts";
import { backoffMs, compiledOf, countTaken, endedReason, nextPointer, type Pointer } from "./schedule.ts";
import type { CalendarCache } from "./calendars.ts";
import { applyDefinitionChange, type DefinitionChange } from "./update.ts";
import * as ledger from "./ledger.ts";
import type { CommandReply, InFlightRun, LiveTask, Mail, Round, ShardCommand, ShardEvents } from "./types.ts";

/** A slot decided more than this after its due time may have had later slots pass: the misfire policy looks. */
export const GRACE_MS = 1000;
/**
 * Longest a run whose dispatch still sits undelivered in the stream waits past its timeout
 * (NATS leader elections measured 4-9 s, a pull issued again 2 s later); then it times out as any.
 * The default of AX_DELIVERY_GRACE (DecisionPorts.deliveryGraceMs).
 */
export const UNDELIVERED_GRACE_MS = 30_000;
/** How often a timed-out run with an undelivered dispatch asks again. */
const UNDELIVERED_RECHECK_MS = 1000;
/** A dependency trigger's run id, derived from its key: a redelivered trigger finds its run. */
export const dependencyRunId = (trig: DependencyTrigger): string => derivedRunId("rd", `${trig.taskId}:${trig.key}`);
/** A backfill's run id, derived from (task, slot): a slot is backfilled once. */
export const backfillRunId = (cmd: { taskId: number; slotMs: number }): string => derivedRunId("rb", `${cmd.taskId}:${cmd.slotMs}`);

/**
 * What the decisions reach beyond their own state. Every port is in memory and answers at once:
 * deciding never waits, never reads PostgreSQL, Redis or NATS, and never starts a request of its
 * own. What must leave the process goes into the round's plan (Round), carried out by the actor
 * once the round's write is durable. The horizon and the node's limiter are changed in place
 * because other rounds (of this shard: the wheel; of every shard: the places in flight) must see
 * the change at once.
 */
export interface DecisionPorts {
  shard: number;
  epoch: number;
  nodeId: string;
  clock: Pick<Clock, "now" | "monotonic">;
  log: Logger;
  tickMs: number;
  limiter: Pick<InFlightLimiter, "tryAcquire" | "tryAcquireAhead" | "mayGoAhead" | "release" | "force" | "wait" | "limitOf" | "inFlight">;
  /**
   * A run decided more than this before its due time was spread ahead by the horizon (a burst):
   * it asks the limiter for a place ahead first (default: never).
   */
  spreadAheadMs?: number;
  horizon: Pick<Horizon, "cameDue" | "holdUntilDue" | "deferToLead" | "backToIndex" | "refilled" | "schedule" | "unschedule" | "takeOff" | "addTimeout" | "cancel">;
  calendars: Pick<CalendarCache, "exclusion">;
  /** Runs written ahead and not released yet can be withdrawn; a run being published is not visible yet. */
  persister: Pick<Persister, "withdraw" | "isPublishing" | "landedAt">;
  /** Has the shard read the events published before a moment (a timeout waits until it has)? */
  catchUp: Pick<EventCatchUp, "covers" | "request">;
  /** Was a run's dispatch handed to an executor (a timeout of a run never started waits until it was)? */
  delivery: DeliveryView;
  /** Longest such a run waits past its timeout (AX_DELIVERY_GRACE; default UNDELIVERED_GRACE_MS; 0: not at all). */
  deliveryGraceMs?: number | undefined;
  dispatchSecret: Uint8Array;
  events?: ShardEvents | undefined;
  random?: (() => number) | undefined;
  /** Mail to this shard, later: a place freed at an executor, a timeout to check again. */
  tell: (m: Mail) => void;
  /** The shard is active here (a place freed once it stopped goes to the next waiter). */
  active: () => boolean;
  /**
   * A fire may leave its task row to the task's next write (see fire, `deferrable`): the actor
   * flushes it within AX_TASK_WRITE_DEFER and a next owner redoes it (replayFire). Off: every
   * fire writes its task row with its run, as before.
   */
  deferFireWrites?: boolean;
}

/** What a round is decided with, besides its mail. */
export interface RoundContext {
  now: number;
  /** The lease is valid and the shard active: nothing is fired otherwise. */
  canFire: boolean;
  /** Derived run ids (dependency triggers', backfills') PostgreSQL already holds. */
  recorded: ReadonlySet<string>;
}

export const NONE_RECORDED: ReadonlySet<string> = new Set();

/**
 * A shard's decisions: what its tasks do with the mail of a round. It remembers what it decided
 * (the live task rows, the runs in flight, the tasks waiting for a place) and turns each round's
 * mail into a plan, `decide(mail, context) → Round`, without waiting on anything. The actor
 * loads the rows a round needs before deciding it and carries the plan out after.
 */
export class ShardDecisions {
  /** Task rows in memory, as this shard last decided them. */
  readonly live = new Map<number, LiveTask>();
  readonly inFlight = new Map<string, InFlightRun>();
  /** Tasks due whose executor was full: the due time each waits in the node's limiter with. */
  readonly waitingForCapacity = new Map<number, number>();
  /** Places the limiter gave to waiting tasks, not yet used by a dispatch (task → executor). */
  readonly reserved = new Map<number, string>();
  /**
   * Dependency triggers whose task cannot run now (paused, or a run of it in flight with overlap
   * forbid), by task: held unacked, kept alive by the actor (see heldTriggerMessages), and
   * decided again at the end of the round in which their task can run. Handed back once a
   * second instead, a trigger waiting for a run longer than AX_DEAD_AFTER seconds was counted
   * as failing and parked in the dead-letter stream: the downstream's run never happened.
   */
  readonly heldTriggers = new Map<number, Array<{ trig: DependencyTrigger; msg: Ackable; runId: string }>>();
  /**
   * Held triggers whose executor was full, queued in the node's limiter with the other runs
   * waiting for a place, earliest due first (run id → executor); and the places it gave them,
   * not used yet (run id → executor).
   */
  readonly triggersWaitingForPlace = new Map<string, string>();
  readonly triggerPlaces = new Map<string, string>();
  /**
   * Runs whose completion this shard applied lately (two generations): a node-level event batch
   * that comes back after one of its other parts failed carries them again, and they are not late.
   */
  private finishedByEvent = new Set<string>();
  private finishedByEventOld = new Set<string>();
  private readonly timeoutCheckedFrom = new Map<string, number>();
  /** Wall time the actor began loading the shard: slots due before it came due while nobody here owned it. */
  private acquiredMs = Infinity;
  /** Who owned the shard before (named by outage intervals in the ledger). */
  private prevOwner: { owner: string | null; epoch: number | null; sinceMs: number | null } = { owner: null, epoch: null, sinceMs: null };
  /** Counters for the node's status (`shardTotals`); rounds and mails show how much a round batches. */
  readonly stats = { rounds: 0, mails: 0, fired: 0, finished: 0, skipped: 0, refused: 0, timedOut: 0, lastLateMs: 0, maxLateMs: 0, refusedEvents: 0, stuck: 0, waited: 0, deferredWrites: 0, flushedWrites: 0, replayedFires: 0 };

  constructor(private readonly p: DecisionPorts) {}

  /** The shard is being loaded: from when it is owned here, and who owned it before. */
  acquired(atMs: number, prevOwner: { owner: string | null; epoch: number | null; sinceMs: number | null }): void {
    this.acquiredMs = atMs;
    this.prevOwner = prevOwner;
  }


  /**
   * A run found `running` at load (the previous owner died or handed over): tracked again,
   * its timeout counted from the later of its fire time and now minus nothing — heartbeats
   * sent to the old owner are not known, so the deadline is fire time + timeout, at least now.
   */
  adoptRunning(r: RunRow, now: number): void {
    const timeoutMs = this.live.get(r.taskId)?.row.timeoutMs ?? 30_000;
    const run: InFlightRun = { runId: r.id, taskId: r.taskId, executor: r.executor, timeoutMs, ref: null, token: runToken(this.p.dispatchSecret, r.id) };
    // A run of a spread burst, recorded seconds ahead by the previous owner: on a place ahead here
    // too where there is one, so runs due before the burst do not wait behind it for places.
    if (this.spreadAhead(r.firedMs ?? now, now) && this.p.limiter.tryAcquireAhead(r.executor)) run.ahead = true;
    else this.p.limiter.force(r.executor);
    this.inFlight.set(r.id, run);
    const deadline = Math.max(now, (r.firedMs ?? now) + run.timeoutMs);
    run.ref = this.p.horizon.addTimeout(deadline, r.id);
  }

  /**
   * A fire whose task-row write had not happened when its shard changed hands (see fire,
   * `deferrable`): found at load as the task's latest run, `running`, due at the row's pointer,
   * while the row lists nothing in flight. The row is brought forward as that fire left it: the
   * same steps on the same row, with the run's id and its decision time (the run's createdMs) as
   * `now`. The ledger rows those steps make were written with the run and are dropped here; the
   * row goes out with `round`, its next due time with the round's due-index changes. False (and
   * nothing changed) when the run is not what such a fire records. Call adoptRunning after.
   */
  replayFire(round: Round, lt: LiveTask, r: RunRow): boolean {
    const row = lt.row;
    const source = row.nextSource ?? "once";
    if (row.nextDueMs !== r.dueMs || r.source !== source || r.slotMs !== row.nextSlotMs || r.triggerId !== row.nextTriggerId
      || (row.record as TaskRecord).context.inFlight.length > 0 || source === "dependency" || source === "backfill" || source === "manual") return false;
    const p: Pointer = { dueMs: r.dueMs, slotMs: row.nextSlotMs, triggerId: row.nextTriggerId, source, reason: row.nextReason ?? "", causedBy: row.nextCausedBy };
    const now = r.createdMs;
    if (!this.transition(lt, { type: "FIRE", runId: r.id, source }).ok) return false;
    const dropped: ledger.LedgerInsert[] = [];
    // fire's steps on the row, in its order: --max-runs, the slot's ledger entry, the next pointer.
    if (source !== "retry") row.triggerSlots = countTaken(row, p.triggerId);
    this.ledgerSlot(round, lt, p, source, source === "misfire" ? { outcome: "catch-up", runId: r.id } : { outcome: "run", runId: r.id }, now, dropped);
    this.advanceAfterFire(round, lt, p, now, dropped);
    round.touched.add(row.id);
    this.stats.replayedFires++;
    return true;
  }

  /** The held dependency triggers' messages (the actor keeps them from being redelivered). */
  heldTriggerMessages(): Ackable[] {
    const out: Ackable[] = [];
    for (const list of this.heldTriggers.values()) for (const h of list) out.push(h.msg);
    return out;
  }

  /** Everything in flight is forgotten and its places given back (the shard stops or is fenced). */
  dropInFlight(): void {
    // Held triggers go back to JetStream (handBack), for the next owner.
    for (const m of this.heldTriggerMessages()) handBack(m);
    this.heldTriggers.clear();
    this.triggersWaitingForPlace.clear(); // (their waiters wake to nothing)
    for (const executor of this.triggerPlaces.values()) this.p.limiter.release(executor);
    this.triggerPlaces.clear();
    for (const run of this.inFlight.values()) this.p.limiter.release(run.executor, run.ahead);
    this.inFlight.clear();
    this.waitingForCapacity.clear();
    const places = [...this.reserved.values()];
    this.reserved.clear();
    for (const executor of places) this.p.limiter.release(executor);
  }

  newRound(): Round {
    return {
      write: { shard: this.p.shard, epoch: this.p.epoch, runInserts: [], runUpdates: [], taskUpdates: [], ledger: [] },
      dispatch: new Map(), acks: [], naks: [], redisAdd: [], redisRemove: [], outcomes: [], replies: [], touched: new Set(), deferred: [],
    };
  }

  /**
   * One round: the mail in the order it came, decided against what this shard remembers. The
   * rows the mail names must be live (loaded by the actor first); a row missing is a task gone.
   */
  decide(batch: readonly Mail[], ctx: RoundContext): Round {
    const round = this.newRound();
    const { now, canFire, recorded } = ctx;
    this.stats.rounds++; this.stats.mails += batch.length;
    for (const m of batch) {
      switch (m.t) {
        case "due": {
          if (m.lateMs > 0) { this.stats.lastLateMs = m.lateMs; this.stats.maxLateMs = Math.max(this.stats.maxLateMs, m.lateMs); }
          for (const it of m.items) {
            if (it.item.k === 1) { this.onTimeout(round, it.item.runId, now); continue; }
            const { id, due } = it.item;
            const w = this.p.horizon.cameDue(id, due);
            if (!w) continue; // superseded by a later schedule
            if (due > now && canFire && this.decideAtDue(id)) {
              // Ahead of time, but a run of the task is still in flight: whether this slot fires
              // (overlap) is decided at its due time, when that run may have ended.
              this.p.horizon.holdUntilDue(id, due, w.inRedis);
              continue;
            }
            if (canFire && this.spreadAhead(due, now) && !this.mayGoAhead(id)) {
              // Spread ahead of a burst, but its executor does not hold runs (or is full, or has
              // as many ahead as it may): decided in the lead, so it takes no place under the
              // limit early that a run due before it needs.
              this.p.horizon.deferToLead(id, due, w.inRedis);
              continue;
            }
            if (!canFire) { this.p.horizon.backToIndex(round, id, due); continue; }
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
          this.p.horizon.refilled(round, m.items, (id) => this.live.get(id)?.row.nextDueMs);
          break;
        case "wake":
          break; // a held trigger's place: decided with the held triggers below
        case "flush":
          // Fires whose task-row write waited (see fire): written now, with whatever else changed.
          for (const id of m.taskIds) if (this.live.has(id) && !round.touched.has(id)) { round.touched.add(id); this.stats.flushedWrites++; }
          break;
        case "capacity":
          if (canFire) this.guard(round, m.taskId, () => this.onDue(round, m.taskId, m.dueMs, now));
          else this.p.horizon.backToIndex(round, m.taskId, m.dueMs);
          // Not used (paused, removed, rescheduled meanwhile, or the shard is handing over): the
          // place goes to the next waiter.
          if (this.reserved.delete(m.taskId)) this.p.limiter.release(m.executor);
          break;
      }
    }
    if (this.heldTriggers.size) this.decideHeldTriggers(round, now, canFire, recorded);
    return round;
  }

  /** Held dependency triggers of tasks this round left able to run (or gone): decided now. */
  private decideHeldTriggers(round: Round, now: number, canFire: boolean, recorded: ReadonlySet<string>): void {
    if (!canFire) return; // held on; if the shard is handed over, dropInFlight gives them back
    const ready: Array<{ trig: DependencyTrigger; msg: Ackable; runId: string }> = [];
    for (const [taskId, list] of this.heldTriggers) {
      const lt = this.live.get(taskId);
      if (lt && this.triggerWaits(lt)) {
        // Paused or running again: no place is kept (nor queued for) while it cannot be used.
        for (const h of list) this.dropTriggerPlace(h.runId);
        continue;
      }
      // (one still queued for a place at its executor stays held until the limiter gives it one)
      const waiting = lt ? list.filter((h) => this.triggersWaitingForPlace.has(h.runId)) : [];
      if (waiting.length === list.length) continue;
      if (waiting.length) this.heldTriggers.set(taskId, waiting); else this.heldTriggers.delete(taskId);
      for (const h of list) if (!waiting.includes(h)) ready.push(h);
    }
    for (const h of ready) this.onDependencyTrigger(round, h.trig, h.msg, now, recorded);
  }

  /** (its run id kept with it: the rounds that look at a held trigger do not derive it again) */
  private holdTrigger(taskId: number, trig: DependencyTrigger, msg: Ackable, runId: string): void {
    const list = this.heldTriggers.get(taskId);
    if (list) list.push({ trig, msg, runId }); else this.heldTriggers.set(taskId, [{ trig, msg, runId }]);
  }

  /** A trigger settled or held for another reason: out of the limiter's queue, its place (if given) back. */
  private dropTriggerPlace(runId: string): void {
    this.triggersWaitingForPlace.delete(runId);
    const executor = this.triggerPlaces.get(runId);
    if (executor !== undefined) { this.triggerPlaces.delete(runId); this.p.limiter.release(executor); }
  }

  /** A place at `executor` for this trigger's run: one the limiter gave it, or a free one now (false: it waits). */
  private placeForTrigger(runId: string, executor: string, dueMs: number): boolean {
    const given = this.triggerPlaces.get(runId);
    if (given !== undefined) {
      this.triggerPlaces.delete(runId);
      if (given === executor) return true;
      this.p.limiter.release(given); // the task moved to another executor meanwhile
    }
    if (this.triggersWaitingForPlace.get(runId) === executor) return false; // queued: no jumping the queue
    if (this.p.limiter.tryAcquire(executor)) { this.triggersWaitingForPlace.delete(runId); return true; }
    this.triggersWaitingForPlace.set(runId, executor);
    this.waitForPlace(executor, dueMs, () => this.triggersWaitingForPlace.get(runId) === executor, () => {
      this.triggersWaitingForPlace.delete(runId);
      this.triggerPlaces.set(runId, executor);
      this.p.tell({ t: "wake" });
    });
    return false;
  }

  /**
   * Queues for a place at `executor` in the node's limiter, earliest due first: `granted` runs
   * when it gives one while `stillWaiting` holds (on a shard still active here); otherwise the
   * place goes to the next waiter.
   */
  private waitForPlace(executor: string, dueMs: number, stillWaiting: () => boolean, granted: () => void): void {
    this.stats.waited++;
    this.p.limiter.wait(executor, {
      dueMs,
      wake: () => {
        if (!this.p.active() || !stillWaiting()) return false;
        granted();
        return true;
      },
    });
  }

  /** Why a dependency trigger of this task cannot become a run now (null: it can). */
  private triggerWaits(lt: LiveTask): "paused" | "running" | null {
    if (lt.row.state === "paused") return "paused";
    return busyForbidden((lt.row.record as TaskRecord).context) ? "running" : null;
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
    this.p.log.error({ taskId: lt.row.id, err: reason }, "task:stuck: its schedule cannot be computed; the task is paused and the shard goes on");
    this.transition(lt, { type: "PAUSE" });
    ledger.notePaused(lt.row, this.p.clock.now());
    const rec = lt.row.record as TaskRecord;
    lt.row.record = { ...rec, context: { ...rec.context, lastError: `schedule stuck: ${reason}` } };
    round.touched.add(lt.row.id);
    this.p.events?.["task:stuck"]?.({ shard: this.p.shard, taskId: lt.row.id, reason });
  }

  private setPointer(round: Round, lt: LiveTask, p: Pointer | null): void {
    const row = lt.row;
    row.nextDueMs = p?.dueMs ?? null;
    row.nextSlotMs = p?.slotMs ?? null;
    row.nextTriggerId = p?.triggerId ?? null;
    row.nextSource = p?.source ?? null;
    row.nextReason = p?.reason ?? (lt.stuck ? `not scheduled: ${lt.stuck}` : endedReason(row, this.p.clock.now()));
    row.nextCausedBy = p?.causedBy ?? null;
    this.p.horizon.unschedule(round, row.id);
    if (p) this.p.horizon.schedule(round, row.id, p.dueMs);
    round.touched.add(row.id);
  }

  /** Is a run due at `dueMs` decided now further ahead than the lead (spread by the horizon)? */
  private spreadAhead(dueMs: number, now: number): boolean { return dueMs - now > (this.p.spreadAheadMs ?? Infinity); }

  /** May the task's run go out ahead of the lead (see InFlightLimiter.mayGoAhead)? A task not loaded: onDue sees to it. */
  private mayGoAhead(taskId: number): boolean {
    const lt = this.live.get(taskId);
    return !lt || this.p.limiter.mayGoAhead(lt.row.executor);
  }

  /** A task with a run in flight is decided at its due time, not ahead of it. */
  private decideAtDue(taskId: number): boolean {
    const lt = this.live.get(taskId);
    return !!lt && (lt.row.record as TaskRecord).context.inFlight.length > 0;
  }

  // ---- ledger of occurrences (actors/shard/ledger.ts) --------------------------------------

  private ledgerCtx(now: number): ledger.LedgerContext {
    return { node: this.p.nodeId, shard: this.p.shard, epoch: this.p.epoch, now };
  }

  /** Slots due before this actor began loading the shard came due while nobody here owned it. */
  private gapCause(dueMs: number): ledger.GapCause {
    if (dueMs >= this.acquiredMs) return { kind: "behind" };
    return { kind: "outage", acquiredMs: this.acquiredMs, node: this.p.nodeId, epoch: this.p.epoch,
      lastOwner: this.prevOwner.owner, lastEpoch: this.prevOwner.epoch, lastOwnerSinceMs: this.prevOwner.sinceMs };
  }

  /** What a fire decision did with a trigger's slot (retries, manual and dependency runs stand for none). */
  private ledgerSlot(round: Round, lt: LiveTask, p: Pointer, source: RunSource, fate: ledger.SlotFate, now: number, out = round.write.ledger!): void {
    if (p.triggerId === null || p.slotMs === null || source === "retry" || source === "manual" || source === "dependency") return;
    const f: ledger.SlotFate = source === "misfire" && fate.outcome !== "catch-up" && "runId" in fate ? { outcome: "catch-up", runId: fate.runId } : fate;
    if (ledger.recordSlot(out, lt.row, p.triggerId, p.slotMs, f, this.ledgerCtx(now))) round.touched.add(lt.row.id);
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
    let fromRow = true; // p is the row's own pointer (what a next owner can replay the fire from)
    if (scheduled && dueMs < now - GRACE_MS && p.source !== "delay" && !this.onlyBehind(row, p, now)) {
      // Came due while nobody owned the shard (node down, hand-over), or so long ago that later
      // slots passed too: the misfire policy decides.
      ledger.recordMisfireGap(round.write.ledger!, row, this.gapCause(dueMs), this.ledgerCtx(now), { graceMs: GRACE_MS });
      const np = this.nextOf(round, lt, now);
      if (!np) { this.setPointer(round, lt, null); return; }
      if (np.dueMs > now + this.p.tickMs) { this.setPointer(round, lt, np); return; } // skip: resume cadence
      p = np;
      fromRow = false;
    }
    this.fire(round, lt, p, now, { mayDefer: fromRow });
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

  private fire(round: Round, lt: LiveTask, p: Pointer, now: number, opts: { manual?: { force: boolean; payload?: unknown; reply: (r: CommandReply) => void }; upstreamRuns?: string[]; runId?: string; backfill?: (r: CommandReply) => void; mayDefer?: boolean; placed?: boolean }): void {
    const row = lt.row;
    // The task row's write may wait for the run's end (AX_TASK_WRITE_DEFER) when a next owner
    // can redo this fire from the row as PostgreSQL holds it: the row's own pointer, nothing else
    // changed in this round before, nothing in flight (so the run is the task's latest), decided
    // within the lead (a run spread seconds ahead is written at once).
    const deferrable = opts.mayDefer === true && this.p.deferFireWrites === true && !round.touched.has(row.id)
      && (row.record as TaskRecord).context.inFlight.length === 0 && !this.spreadAhead(p.dueMs, now);
    const runId = opts.runId ?? newRunId(now);
    const source: RunSource = opts.manual ? "manual" : p.source;
    // Decided ahead of its due time: dispatched (released) at the due time, recorded as fired then.
    const releaseAt = opts.manual ? now : Math.max(now, p.dueMs);
    const advanceSchedule = !opts.manual && source !== "dependency" && source !== "backfill";
    const excluded = advanceSchedule && source !== "retry" ? this.p.calendars.exclusion(row, p.triggerId, p.slotMs) : null;
    if (excluded) {
      // A slot on a date of the task's calendar: not fired, recorded (like an overlap skip) with the reason.
      this.stats.skipped++;
      round.write.runInserts.push({ id: runId, taskId: row.id, taskName: row.name, triggerId: p.triggerId, source, dueMs: p.dueMs, slotMs: p.slotMs, dueReason: p.reason,
        firedMs: null, node: this.p.nodeId, shard: this.p.shard, epoch: this.p.epoch, attempt: 0, executor: row.executor, state: "skipped", error: excluded,
        causedBy: p.causedBy, upstreamRuns: null, createdMs: now, finishedMs: now });
      this.advanceAfterFire(round, lt, p, now);
      return;
    }
    // A scheduled run (or retry, or catch-up) whose executor is full waits for a place, in due
    // order, instead of being refused: see InFlightLimiter. A dependency trigger comes with its
    // place (it waited for one held, see placeForTrigger); a caller's run (manual, backfill) is
    // refused to the caller.
    const waits = !opts.manual && source !== "dependency" && source !== "backfill";
    let placed = opts.placed === true;
    let waited = false;
    let ahead = false;
    if (waits) {
      const reservedFor = this.reserved.get(row.id);
      if (reservedFor !== undefined) {
        this.reserved.delete(row.id);
        if (reservedFor === row.executor) placed = waited = true; else this.p.limiter.release(reservedFor);
      }
      if (!placed && this.spreadAhead(p.dueMs, now)) placed = ahead = this.p.limiter.tryAcquireAhead(row.executor);
      if (!placed && !this.p.limiter.tryAcquire(row.executor)) {
        // The capacity mail is decided from the row (onDue matches the row's due time), so what
        // waits must be the row's pointer. A catch-up the misfire policy dated is not: the row
        // still named the missed slot, and the catch-up was dropped when woken (the task then sat
        // due in the past until its shard was next loaded). Written with the round, a next owner
        // fires it as this catch-up too.
        if (row.nextDueMs !== p.dueMs) this.setPointer(round, lt, p);
        this.waitForCapacity(round, lt, p.dueMs);
        return;
      }
      placed = true;
    }
    const recordBefore = row.record; const stateBefore = row.state; // (a refused caller's run puts them back)
    const res = this.transition(lt, { type: "FIRE", runId, source, ...(opts.manual?.force ? { force: true } : {}) });
    if (!res.ok && placed) this.p.limiter.release(row.executor, ahead);
    const base: RunInsert = {
      id: runId, taskId: row.id, taskName: row.name, triggerId: opts.manual ? null : p.triggerId, source,
      dueMs: opts.manual ? now : p.dueMs, slotMs: opts.manual ? null : p.slotMs, dueReason: opts.manual ? `manual run${opts.manual.force ? " (--force)" : ""}` : waited ? `${p.reason}; it waited for a place at executor ${row.executor} (limit ${this.p.limiter.limitOf(row.executor)} runs in flight per node)` : p.reason,
      firedMs: releaseAt, node: this.p.nodeId, shard: this.p.shard, epoch: this.p.epoch, attempt: (row.record as TaskRecord).context.attempt,
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
        this.p.events?.["slot:missed"]?.({ shard: this.p.shard, runId, taskId: row.id, task: row.name, executor: row.executor, reason: "overlap", slotMs: p.slotMs, detail: `previous run ${res.runningRunId} still in flight (overlap=forbid)` });
        this.advanceAfterFire(round, lt, p, now);
      } else if (source !== "dependency") {
        this.p.log.warn({ taskId: row.id, reason: res.reason }, "fire refused by the machine");
        this.ledgerSlot(round, lt, p, source, { outcome: "upstream", state: row.state, why: res.reason }, now);
        this.setPointer(round, lt, null);
      } // dependency: the trigger is nak'ed and comes back; the task's own schedule stays as it is
      return;
    }
    if (!placed && !(placed = this.p.limiter.tryAcquire(row.executor))) {
      // A caller's run at a full executor (manual, backfill): refused to the caller, who decides
      // whether to try again. Nothing runs later on its own (a retry of ours and the caller's
      // second try were two runs), and the task is as it was: its state, its attempts, its
      // schedule's pointer.
      this.stats.refused++;
      row.record = recordBefore; row.state = stateBefore;
      const why = `refused: executor ${row.executor} has ${this.p.limiter.inFlight(row.executor)} runs in flight (limit ${this.p.limiter.limitOf(row.executor)}); nothing was run, try again later`;
      const error = new AxError("AX_E_UNAVAILABLE", why, { field: "executor", value: row.executor }).toJSON();
      if (opts.manual) {
        round.write.runInserts.push({ ...base, state: "refused", finishedMs: now, error: why });
        opts.manual.reply({ ok: false, error });
      }
      // (a backfill's run id is its slot's: not recorded, so the slot can be backfilled later)
      opts.backfill?.({ ok: false, error });
      return;
    }
    this.stats.fired++;
    round.write.runInserts.push(base);
    if (advanceSchedule && p.source !== "retry") row.triggerSlots = countTaken(row, p.triggerId); // --max-runs
    if (opts.backfill) { const reply = opts.backfill; round.replies.push(() => reply({ ok: true, value: { runId } })); }
    const run: InFlightRun = { runId, taskId: row.id, executor: row.executor, timeoutMs: row.timeoutMs, ref: null, token: runToken(this.p.dispatchSecret, runId) };
    if (ahead) run.ahead = true;
    if (advanceSchedule && p.triggerId !== null) run.slotsBefore = { key: String(p.triggerId), value: row.triggerSlots[String(p.triggerId)] };
    if (!opts.manual && releaseAt > now) { run.held = p; run.holdMs = releaseAt - now; }
    if (p.triggerId !== null && source !== "misfire") run.ledgerBefore = ledger.saveWatermark(row.triggerSlots, p.triggerId);
    this.ledgerSlot(round, lt, p, source, source === "misfire" ? { outcome: "catch-up", runId } : { outcome: "run", runId }, now);
    run.ref = this.p.horizon.addTimeout(releaseAt + row.timeoutMs, runId);
    this.inFlight.set(runId, run);
    let list = round.dispatch.get(row.executor);
    if (!list) { list = []; round.dispatch.set(row.executor, list); }
    list.push({
      runId, taskId: row.id, taskName: row.name, attempt: base.attempt, source, payload: opts.manual?.payload ?? row.payload,
      // No `deadline`: it is firedAt + timeoutMs here, which is what an executor takes when it is
      // absent (25 of a run's ~260 bytes of dispatch, stored and delivered by JetStream). Only a
      // re-published run, whose timeout was moved, carries one (effects.ts).
      scheduledAt: base.dueMs, firedAt: releaseAt, timeoutMs: row.timeoutMs, shard: this.p.shard, token: run.token, gen: row.generation,
    });
    this.p.events?.["run:fired"]?.({ shard: this.p.shard, runId, taskId: row.id, lateMs: releaseAt - base.dueMs, source, executor: row.executor });
    if (opts.manual) { const reply = opts.manual.reply; round.replies.push(() => reply({ ok: true, value: { runId } })); }
    if (advanceSchedule) this.advanceAfterFire(round, lt, p, now);
    else round.touched.add(row.id);
    if (deferrable && advanceSchedule && lt.stuck === undefined) {
      // The run row is written with this round; the task row with its next change (the run's end,
      // most often) or at the latest AX_TASK_WRITE_DEFER from now (the actor's flush). Until then
      // PostgreSQL holds the row as it was before this fire, and a next owner redoes it (replayFire).
      round.touched.delete(row.id);
      round.deferred.push(row.id);
      this.stats.deferredWrites++;
    }
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
    // (A row nothing changed is left out of the write: see taskUpdatesOf.)
    round.touched.add(id);
    if (this.waitingForCapacity.get(id) === dueMs) return;
    this.waitingForCapacity.set(id, dueMs);
    const executor = lt.row.executor;
    this.waitForPlace(executor, dueMs, () => this.waitingForCapacity.get(id) === dueMs, () => {
      this.waitingForCapacity.delete(id);
      this.reserved.set(id, executor);
      this.p.tell({ t: "capacity", taskId: id, dueMs, executor });
    });
  }

  /** After a scheduled slot fired (or was skipped): remember the slot, point at the next one. */
  private advanceAfterFire(round: Round, lt: LiveTask, p: Pointer, now: number, ledgerOut = round.write.ledger!): void {
    const row = lt.row;
    // Slots only move forward: a catch-up for an older skipped slot never rewinds the cadence.
    const key = String(p.triggerId);
    if (p.triggerId !== null && p.slotMs !== null && p.source !== "retry" && p.slotMs > (row.triggerSlots[key] ?? -Infinity)) row.triggerSlots = withSlot(row.triggerSlots, key, p.slotMs);
    // Decided more than the grace late (a retry, a catch-up, a busy node): later slots may be past too.
    if (p.slotMs !== null && p.slotMs < now - GRACE_MS) ledger.recordMisfireGap(ledgerOut, row, { kind: "behind" }, this.ledgerCtx(now), { graceMs: GRACE_MS });
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
        tokenOk: tokenMatches(ev.token, run?.token ?? runToken(this.p.dispatchSecret, ev.runId)),
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
    const t = this.p.clock.monotonic();
    if (t - this.lastRefusalLog < 10_000) return;
    this.lastRefusalLog = t;
    this.p.log.warn({ runId: ev.runId, type: ev.type, refusedSoFar: this.stats.refusedEvents }, "event without its run's dispatch token refused");
  }

  private extend(run: InFlightRun, now: number): void {
    if (run.ref) this.p.horizon.cancel(run.ref);
    run.ref = this.p.horizon.addTimeout(now + run.timeoutMs, run.runId);
  }

  private onTimeout(round: Round, runId: string, now: number): void {
    const run = this.inFlight.get(runId);
    if (!run) { this.timeoutCheckedFrom.delete(runId); return; }
    if (this.p.persister.isPublishing(runId)) {
      // Its dispatch is not visible yet (NATS restarting, a stream leader election): nothing can
      // be running it, and timing it out now would let the late publish run it beside its retry.
      run.ref = this.p.horizon.addTimeout(now + run.timeoutMs, runId);
      return;
    }
    // Its dispatch became visible late: the executor has had less than its timeout so far. The
    // node's round knows the landing of each message at once (landedAt), also of one a new owner
    // re-published; the round's own note (visibleMs) comes only once all its messages are out.
    const visibleMs = Math.max(run.visibleMs ?? -Infinity, this.p.persister.landedAt(runId) ?? -Infinity);
    if (now < visibleMs + run.timeoutMs) {
      run.ref = this.p.horizon.addTimeout(visibleMs + run.timeoutMs, runId);
      return;
    }
    const graceMs = this.p.deliveryGraceMs ?? UNDELIVERED_GRACE_MS;
    if (run.startedMs === undefined && run.dispatchSeq !== undefined && graceMs > 0 && (run.undeliveredSince === undefined || now - run.undeliveredSince < graceMs)) {
      // No executor reported starting it: if its message still sits in the stream (delivery
      // stalled by a consumer leader election, or executors' places all taken), the executor has
      // not had its timeout yet. It waits for delivery, up to the grace past its timeout; a run
      // delivered and not started (an instance that died holding it) times out.
      const seen = this.p.delivery.status(run.executor, run.dispatchSeq, run.deliveryAskedAt ?? Infinity);
      if (seen === "ask") {
        run.deliveryAskedAt = now;
        this.p.delivery.ask(run.executor, () => this.p.tell({ t: "due", items: [{ dueMs: now, item: { k: 1, runId } }], lateMs: 0 }));
        return;
      }
      if (seen === "delivered" && run.undeliveredSince !== undefined) {
        // Taken since the last check, after waiting in the stream: its executor has had less than
        // its timeout, and holds a run sent ahead up to its lead after receiving it. Once, from
        // now; delivered and still not started after that, it times out.
        delete run.undeliveredSince; delete run.deliveryAskedAt;
        run.ref = this.p.horizon.addTimeout(now + (run.holdMs ?? 0) + run.timeoutMs, runId);
        return;
      }
      if (seen === "undelivered") {
        // (within the grace: the condition above)
        run.undeliveredSince ??= now;
        delete run.deliveryAskedAt;
        run.ref = this.p.horizon.addTimeout(now + UNDELIVERED_RECHECK_MS, runId);
        return;
      }
    }
    const from = this.timeoutCheckedFrom.get(runId) ?? now;
    if (!this.p.catchUp.covers(from)) {
      // Its completion may sit unread in the events stream (a reload after an outage, a lagging consumer).
      this.timeoutCheckedFrom.set(runId, from);
      this.p.catchUp.request((unconfirmed) => {
        if (unconfirmed) this.timeoutCheckedFrom.set(runId, -Infinity);
        this.p.tell({ t: "due", items: [{ dueMs: now, item: { k: 1, runId } }], lateMs: 0 });
      });
      return;
    }
    this.timeoutCheckedFrom.delete(runId);
    // The round loaded the row of the run's task with its mail (ShardActor.round): a task with no
    // row here was removed meanwhile, and finishRun times its run out without it.
    this.stats.timedOut++;
    this.finishRun(round, run, now, { type: "TIMED_OUT", runId }, { finishedMs: now, state: "timed_out", error: `no completion or heartbeat within ${run.timeoutMs}ms` });
  }

  private finishRun(round: Round, run: InFlightRun, now: number, ev: TaskEvent, upd: Omit<RunUpdate, "id">): void {
    this.inFlight.delete(run.runId);
    if (run.ref) this.p.horizon.cancel(run.ref);
    this.p.limiter.release(run.executor, run.ahead);
    this.stats.finished++;
    round.write.runUpdates.push({ id: run.runId, ...upd });
    const lt = this.live.get(run.taskId);
    const startedMs = upd.startedMs ?? run.startedMs;
    const finished = (final: boolean) => this.p.events?.["run:finished"]?.({
      shard: this.p.shard, runId: run.runId, taskId: run.taskId, state: upd.state ?? "?", executor: run.executor, final,
      durationMs: startedMs !== undefined ? Math.max(0, (upd.finishedMs ?? now) - startedMs) : null, task: lt?.row.name ?? null, error: upd.error ?? null,
    });
    if (!lt) { finished(true); return; } // task removed meanwhile
    const res = this.transition(lt, ev);
    finished(!res.ok || res.to !== "retry");
    if (!res.ok) { this.p.log.warn({ taskId: run.taskId, runId: run.runId, reason: res.reason }, "completion refused by the machine"); return; }
    round.touched.add(lt.row.id);
    if (res.to === "running" || res.to === "paused" || res.to === "cancelled") return;
    const row = lt.row;
    if (res.to === "retry") {
      const attempt = (row.record as TaskRecord).context.attempt;
      const delay = backoffMs(attempt, row.backoffMs, row.backoffMaxMs, this.p.random);
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
        this.p.events?.["task:upstreamFailed"]?.({ shard: this.p.shard, taskId: lt.row.id, task: lt.row.name, executor: lt.row.executor, upstreamRun: trig.upstreamRuns[0] ?? trig.key, reason: trig.reason });
        if (lt.row.hasDownstreams) round.outcomes.push({ taskId: lt.row.id, runId: trig.upstreamRuns[0] ?? trig.key, outcome: "upstream_failed", at: now, reason: trig.reason });
      }
      round.acks.push(msg);
      return;
    }
    // The run id is derived from the trigger's key: a redelivered trigger finds its run and stops.
    const runId = dependencyRunId(trig);
    if (recorded.has(runId) || this.inFlight.has(runId)) { this.dropTriggerPlace(runId); round.acks.push(msg); return; }
    if (lt.row.state === "cancelled") {
      // Nothing will run it: taken off the stream, not handed back for ever.
      this.p.log.info({ taskId: lt.row.id, runId, key: trig.key }, "dependency trigger of a cancelled task dropped");
      this.dropTriggerPlace(runId);
      round.acks.push(msg);
      return;
    }
    if (this.triggerWaits(lt)) {
      // Waits unacked for the run in flight to end (or a resume), then is decided again; a place
      // it was given meanwhile goes to the next waiter.
      this.dropTriggerPlace(runId);
      this.holdTrigger(lt.row.id, trig, msg, runId);
      return;
    }
    if (!this.placeForTrigger(runId, lt.row.executor, trig.at)) {
      // Its executor is full: waits, unacked, for a place in due order like a scheduled run (the
      // task's own schedule is not touched), and is decided again once the limiter gives it one.
      this.holdTrigger(lt.row.id, trig, msg, runId);
      return;
    }
    const before = this.stats.fired;
    this.fire(round, lt, { dueMs: trig.at, slotMs: null, triggerId: null, source: "dependency", causedBy: trig.upstreamRuns[0] ?? null, reason: trig.reason }, now, { upstreamRuns: trig.upstreamRuns, runId, placed: true });
    if (this.stats.fired > before) round.acks.push(msg);
    else round.naks.push(msg); // refused by the machine for a reason triggerWaits does not know: try again shortly
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
    if (!lt) { fail(new AxError("AX_E_NOT_FOUND", `no task ${cmd.taskId} on shard ${this.p.shard}`, { field: "task", value: cmd.taskId })); return; }
    if (!canFire) { fail(new AxError("AX_E_UNAVAILABLE", `shard ${this.p.shard} is handing over; retry`)); return; }
    const runId = backfillRunId(cmd);
    if (this.inFlight.has(runId) || round.write.runInserts.some((r) => r.id === runId) || recorded.has(runId)) {
      reply({ ok: true, value: { runId, existed: true } });
      return;
    }
    const ex = lt.row.executor;
    if (this.p.limiter.inFlight(ex) >= this.p.limiter.limitOf(ex)) {
      fail(new AxError("AX_E_UNAVAILABLE", `executor ${ex} is at its in-flight limit (${this.p.limiter.limitOf(ex)}); retry`, { field: "executor", value: ex }));
      return;
    }
    this.fire(round, lt, { dueMs: now, slotMs: cmd.slotMs, triggerId: cmd.triggerId, source: "backfill", causedBy: null, reason: cmd.reason }, now, { runId, backfill: reply });
  }

  private onCommand(round: Round, cmd: ShardCommand, reply: (r: CommandReply) => void, now: number, canFire: boolean): void {
    const lt = this.live.get(cmd.taskId);
    const fail = (e: AxError) => reply({ ok: false, error: e.toJSON() });
    if (!lt) {
      if (cmd.type === "cancel") { reply({ ok: true }); return; }
      fail(new AxError("AX_E_NOT_FOUND", `no task ${cmd.taskId} on shard ${this.p.shard}`, { field: "task", value: cmd.taskId }));
      return;
    }
    if (!canFire && cmd.type !== "load") { fail(new AxError("AX_E_UNAVAILABLE", `shard ${this.p.shard} is handing over; retry`)); return; }
    switch (cmd.type) {
      case "load": {
        if (lt.row.nextDueMs !== null) {
          // The index entry the API wrote stays: the wheel's copy is marked as having one.
          this.p.horizon.takeOff(lt.row.id);
          this.p.horizon.schedule(round, lt.row.id, lt.row.nextDueMs, true);
        }
        reply({ ok: true });
        return;
      }
      case "deps":
        reply({ ok: true }); // the row was read afresh before the round (ShardActor.round)
        return;
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
   * Runs of the task that were written ahead of their due time and are not published yet, or
   * were published ahead to an executor that holds them and are at least REVOKE_MARGIN_MS from
   * their due time (revoked there), are withdrawn (recorded `refused`, never started): a pause,
   * cancel or removal before the due time wins, as when the run was decided at its due time. The
   * slot counts as not fired.
   */
  private withdrawHeld(round: Round, lt: LiveTask, why: string, now: number): InFlightRun[] {
    const out: InFlightRun[] = [];
    for (const runId of [...(lt.row.record as TaskRecord).context.inFlight]) {
      const run = this.inFlight.get(runId);
      if (!run) continue;
      const withdrawn = this.p.persister.withdraw(runId);
      if (!withdrawn) continue;
      if (run.slotsBefore) {
        lt.row.triggerSlots = withSlot(lt.row.triggerSlots, run.slotsBefore.key, run.slotsBefore.value);
      }
      if (run.ledgerBefore) ledger.restoreWatermark(lt.row, run.ledgerBefore);
      this.finishRun(round, run, now, { type: "REFUSED", runId, reason: why }, { finishedMs: now, state: "refused",
        error: withdrawn === "revoked" ? `withdrawn before its start (its dispatch had gone out ahead to its executor, which dropped it): ${why}` : `withdrawn before dispatch: ${why}` });
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
    this.p.log.info({ taskId: row.id, generation, fields: Object.keys(change.summary), withdrawn: withdrawn.length }, "task:updated");
    round.replies.push(() => reply({ ok: true, value: { generation, nextDueMs: row.nextDueMs, withdrawn: withdrawn.map((r) => r.runId) } }));
  }

  private currentPointer(row: TaskRow): Pointer {
    return { dueMs: row.nextDueMs!, slotMs: row.nextSlotMs, triggerId: row.nextTriggerId, source: row.nextSource ?? "once", reason: row.nextReason ?? "", causedBy: row.nextCausedBy };
  }
}
