import type { JetStreamClient } from "@nats-io/jetstream";
import { atWallTime, type Clock, type Logger, type Names } from "../../common/index.ts";
import { encode, runToken, type DispatchRun } from "../../protocol/index.ts";
import type { Horizon } from "./horizon.ts";
import type { DueIndex, RunRow, Store, TaskUpdate } from "../store/index.ts";
import { LATE_LANDING_MS, publishDispatch, replayParts, type ShardDispatchRun } from "../persister.ts";
import { unchanged, written, type InFlightRun, type LiveTask, type Round } from "./types.ts";

/** Inside JetStream's 2-minute duplicate window, with a margin. */
const REPUBLISH_WINDOW_MS = 100_000;

/**
 * The task rows a round changed, as updates for its fenced write: only those whose written fields
 * differ from what PostgreSQL holds (see Written); each one's copy of what is written moves on.
 */
export function taskUpdatesOf(touched: Iterable<number>, live: ReadonlyMap<number, LiveTask>): TaskUpdate[] {
  const out: TaskUpdate[] = [];
  for (const id of touched) {
    const lt = live.get(id);
    if (!lt) continue;
    const r = lt.row;
    if (unchanged(lt.written, r)) continue;
    lt.written = written(r);
    out.push({
      id, state: r.state, record: r.record, triggerSlots: r.triggerSlots, nextDueMs: r.nextDueMs, nextSlotMs: r.nextSlotMs,
      nextTriggerId: r.nextTriggerId, nextSource: r.nextSource, nextReason: r.nextReason, nextCausedBy: r.nextCausedBy,
    });
  }
  return out;
}

export interface ShardEffectsOptions {
  shard: number;
  epoch: number;
  nodeId: string;
  js: JetStreamClient;
  names: Names;
  due: Pick<DueIndex, "add" | "remove">;
  store: Pick<Store, "dispatchReplay">;
  clock: Clock;
  log: Logger;
  dispatchSecret: Uint8Array;
  horizon: Pick<Horizon, "addTimeout" | "cancel">;
  /** The decisions' memory: runs in flight (their timeouts), live rows (payloads, generations). */
  view: { readonly live: ReadonlyMap<number, LiveTask>; readonly inFlight: ReadonlyMap<string, InFlightRun> };
  /** Recorded runs of this shard may still go out (it was not fenced). */
  releasable: () => boolean;
  /** A publish may keep being retried (the shard is not stopped and its lease is valid). */
  mayPublish: () => boolean;
  /** A re-published message landed (the node's round remembers late landings: Persister.noteLanded). */
  noteLanded: (runs: ReadonlyArray<{ runId: string; firedAt: number }>, atMs: number) => void;
}

/**
 * What a shard's written rounds do outside PostgreSQL: outcomes to the dependency stream, the due
 * index in Redis, the late-publish notes and replies once the dispatch is out, and, at load, the
 * re-publishing of messages the previous owner recorded but no executor started.
 */
export class ShardEffects {
  /** Dispatches written and not yet released (they wait for their due time); a planned stop waits for them. */
  private readonly releases = new Set<Promise<unknown>>();

  constructor(private readonly o: ShardEffectsOptions) {}

  /** Resolves once every dispatch written so far is released (or failed). */
  async released(): Promise<void> { await Promise.all([...this.releases]); }

  /**
   * A written round's effects. Its dispatches are published by the node's round, some at once and
   * some at their due time: the next round does not wait for those (only Redis needs round order),
   * the replies do.
   */
  async apply(round: Round, published: Promise<ReadonlyMap<string, number>>): Promise<void> {
    this.releases.add(published);
    void published.finally(() => this.releases.delete(published));
    const jobs: Array<Promise<unknown>> = [];
    if (round.outcomes.length) {
      jobs.push(this.o.js.publish(this.o.names.outcomeSubject(this.o.shard), encode({ v: 1, outcomes: round.outcomes }), { msgID: `o:${round.outcomes[0]!.taskId}:${round.outcomes[0]!.runId}:${round.outcomes[0]!.outcome}` })
        .catch((e) => this.o.log.error({ err: String(e) }, "outcome publish failed")));
    }
    const removeSet = new Set(round.redisRemove);
    for (const a of round.redisAdd) removeSet.delete(a.id);
    if (removeSet.size) jobs.push(this.o.due.remove(this.o.shard, [...removeSet]).catch(() => undefined));
    if (round.redisAdd.length) jobs.push(this.o.due.add(this.o.shard, round.redisAdd).catch((e) => this.o.log.error({ err: String(e) }, "due index add failed; rebuilt on next load")));
    await Promise.all(jobs);
    if (round.dispatch.size) void published.then((sequences) => this.noteLanding(round, sequences));
    if (round.replies.length) void published.then(() => { for (const r of round.replies) r(); });
  }

  /**
   * A run's timeout is armed at its release, on the assumption that its dispatch is visible
   * within moments. While the publish is retried the timeout is held (isPublishing); once it
   * lands late, the run is given its whole timeout from then, as the executor gives its handler:
   * otherwise a run whose dispatch waited out a 4 s election would have 1 s of a 5 s timeout left,
   * and a completion still on its way would find the run timed out (and retried beside it).
   */
  private noteLanding(round: Round, sequences: ReadonlyMap<string, number>): void {
    const at = this.o.clock.now();
    for (const list of round.dispatch.values()) {
      for (const r of list) {
        const run = this.o.view.inFlight.get(r.runId);
        if (!run) continue;
        const seq = sequences.get(r.runId);
        // Where it sits in the stream: a timeout asks whether it was delivered (DeliveryView).
        if (seq !== undefined) run.dispatchSeq = seq;
        if (at - r.firedAt >= LATE_LANDING_MS) run.visibleMs = at;
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
  async republishUnstarted(running: RunRow[], now: number): Promise<number> {
    const ids = new Set<string>();
    const legacy = new Map<string, { executor: string; runs: DispatchRun[] }>();
    for (const r of running) {
      const row = this.o.view.live.get(r.taskId)?.row;
      if (!row || r.startedMs !== null || !r.dispatchId || r.firedMs === null) continue;
      if (now - r.firedMs > REPUBLISH_WINDOW_MS) continue;
      ids.add(r.dispatchId);
    }
    if (!ids.size) return 0;
    const recorded = await this.o.store.dispatchReplay([...ids]);
    let n = 0;
    const jobs: Array<Promise<unknown>> = [];
    for (const m of recorded) {
      ids.delete(m.id);
      if (!m.runs.length) continue;
      n += m.runs.length;
      const runs: ShardDispatchRun[] = m.runs.map((r) => ({ runId: r.id, taskId: r.taskId, taskName: r.taskName, attempt: r.attempt, source: r.source,
        payload: r.payload, scheduledAt: r.dueMs, firedAt: r.firedMs ?? now, timeoutMs: r.timeoutMs, shard: r.shard, token: runToken(this.o.dispatchSecret, r.id),
        // From when it goes out (see above); a copy of a publish that did land is dropped anyway.
        deadline: Math.max(r.firedMs ?? now, now) + r.timeoutMs, ...(this.o.view.live.get(r.taskId) ? { gen: this.o.view.live.get(r.taskId)!.row.generation } : {}) }));
      for (const r of runs) {
        const own = r.shard === this.o.shard ? this.o.view.inFlight.get(r.runId) : undefined;
        if (own && r.deadline! > r.firedAt + r.timeoutMs) {
          if (own.ref) this.o.horizon.cancel(own.ref);
          own.ref = this.o.horizon.addTimeout(r.deadline!, r.runId);
        }
      }
      // Recorded ahead of their due time by the previous owner: published at it, never before.
      // Tried again while this actor holds the shard, as a first publish is (a NATS leader election
      // can outlast the few seconds a plain retry allows; the runs' timeouts start only after this).
      const send = () => Promise.all(replayParts(m.id, m.releasedShards, runs).map((part) => publishDispatch(this.o.js, this.o.names, this.o.nodeId, m.executor, part.id, part.runs,
        { sentAt: this.o.clock.now(), keepTrying: () => this.o.mayPublish() }).then((seq) => {
          this.o.noteLanded(part.runs, this.o.clock.now());
          for (const r of part.runs) { const own = r.shard === this.o.shard ? this.o.view.inFlight.get(r.runId) : undefined; if (own) own.dispatchSeq = seq; }
        })
        .catch((e) => this.o.log.error({ err: String(e), msgID: part.id }, "re-publishing a recorded dispatch failed; its runs time out and retry"))));
      const releaseAt = Math.max(...runs.map((r) => r.firedAt));
      if (releaseAt <= now) jobs.push(send());
      else atWallTime(this.o.clock, releaseAt, () => { if (this.o.releasable()) void send(); });
    }
    for (const r of running) {
      const row = this.o.view.live.get(r.taskId)?.row;
      if (!row || !r.dispatchId || !ids.has(r.dispatchId) || r.startedMs !== null || r.firedMs === null) continue;
      let g = legacy.get(r.dispatchId);
      if (!g) { g = { executor: r.executor, runs: [] }; legacy.set(r.dispatchId, g); }
      g.runs.push({ runId: r.id, taskId: r.taskId, taskName: r.taskName, attempt: r.attempt, source: r.source, payload: row.payload,
        scheduledAt: r.dueMs, firedAt: r.firedMs, timeoutMs: row.timeoutMs, token: runToken(this.o.dispatchSecret, r.id) });
    }
    for (const [id, g] of legacy) {
      n += g.runs.length;
      const data = encode({ v: 1, shard: this.o.shard, epoch: this.o.epoch, node: this.o.nodeId, runs: g.runs });
      jobs.push(this.o.js.publish(this.o.names.dispatchSubject(g.executor), data, { msgID: id })
        .catch((e) => this.o.log.error({ err: String(e), msgID: id }, "re-publishing a dispatch failed; its runs time out and retry")));
    }
    await Promise.all(jobs);
    return n;
  }
}
