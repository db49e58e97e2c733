import { describe, expect, it } from "vitest";
import { SimulatedClock, silentLogger } from "../../common/index.ts";
import { runToken, type DependencyTrigger } from "../../protocol/index.ts";
import { initialRecord, type TaskRecord } from "../../actors/machine/index.ts";
import { InFlightLimiter } from "../../actors/limiter.ts";
import { Horizon, type WheelItem } from "../../actors/shard/horizon.ts";
import { ShardDecisions, NONE_RECORDED, UNDELIVERED_GRACE_MS, dependencyRunId } from "../../actors/shard/decide.ts";
import { liveTask, type Mail, type Round } from "../../actors/shard/types.ts";
import type { RunInsert, TaskRow } from "../../actors/store/index.ts";
import { rng as mulberry32 } from "./cron-reference.ts";

/**
 * The shard's decisions driven through long random histories, with a fixed seed per history:
 * slots coming due on the real wheel, completions, failures, silences (timeouts), pauses,
 * resumes, manual runs, cancellations and a small in-flight bound. The test plays PostgreSQL
 * (it applies each round's write), Redis (the due index the rounds add to, refilled into the
 * wheel) and the node's round (a run written ahead is released at its due time; until then a
 * pause can withdraw it). After every round it checks what must hold whatever happened:
 *
 * - every place at the executor is held by a run in flight or a reservation, no more, no fewer;
 * - a run is inserted once and ends once; one is withdrawn only while its release is still held;
 * - a scheduled slot of a task runs at most once (a slot given back by a withdrawal may run again);
 * - nothing is released before its due time;
 * - a task paused before a round gets no scheduled run from it;
 * - the runs PostgreSQL holds as running are exactly the runs in flight here, and each task's
 *   machine names only runs in flight;
 * - a dependency trigger is settled once, acked only when its run is recorded (or its task was
 *   cancelled), never handed back; one not settled is held only while its task cannot run
 *   (paused, or a run in flight with overlap forbid) or it waits for a place at its executor;
 * - a manual run refused at a full executor leaves no retry behind.
 *
 * At the end every run in flight is completed, every trigger acked, and everything must be final.
 */

const T0 = Date.UTC(2026, 0, 1);
const SECRET = new Uint8Array(32).fill(3);
const FINAL = new Set(["success", "failed", "timed_out", "refused", "stale", "skipped"]);

function history(seed: number): { rounds: number; runs: number; withdrawn: number; timedOut: number; waited: number; misfireRuns: number; triggers: number; dependencyRuns: number; heldTriggers: number; triggersWaitedForPlace: number } {
  const rnd = mulberry32(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  const clock = new SimulatedClock(T0);
  const limit = 1 + Math.floor(rnd() * 3);
  const limiter = new InFlightLimiter(limit);
  const came: Array<{ dueMs: number; item: WheelItem }> = [];
  const horizon = new Horizon({
    shard: 0, tickMs: 20, wheelSize: 256, clock, log: silentLogger, horizonMs: 4000, leadMs: 100,
    due: { rebuildFrom: async () => undefined, takeDue: async () => ({ items: [], nextDueMs: null }) }, store: { dueOfShard: async () => [] },
    onDue: (items) => { came.push(...items); }, onRefilled: () => undefined, active: () => true,
  });
  const told: Mail[] = [];
  const catchUps: Array<() => void> = [];
  /** Runs written ahead, not released yet: run id → release time (the node's round holds them). */
  const held = new Map<string, number>();
  /** Runs the node's round gave back before their release (a withdrawal it agreed to). */
  const givenBack = new Set<string>();
  // The executors' consumer: how far it has delivered, as last answered (null: JetStream did not answer).
  const delivery = { seq: null as number | null, answeredAt: -Infinity, asks: [] as Array<() => void>, published: 0 };
  const d = new ShardDecisions({
    shard: 0, epoch: 1, nodeId: "n", clock, log: silentLogger, tickMs: 20, limiter, horizon,
    calendars: { exclusion: () => null },
    persister: { withdraw: (id) => { const ok = held.delete(id); if (ok) givenBack.add(id); return ok; }, isPublishing: () => false, landedAt: () => undefined },
    catchUp: { covers: () => rnd() < 0.7, request: (then) => { catchUps.push(() => then()); } },
    delivery: {
      status: (_e, seq, notBefore) => (delivery.answeredAt < notBefore ? "ask" : delivery.seq !== null && delivery.seq >= seq ? "delivered" : "undelivered"),
      ask: (_e, then) => { delivery.asks.push(then); },
    },
    dispatchSecret: SECRET, random: rnd, tell: (m) => told.push(m), active: () => true,
  });
  d.acquired(T0 - 60_000, { owner: null, epoch: null, sinceMs: null });

  // The tasks, as PostgreSQL holds them, and the due index.
  const n = 2 + Math.floor(rnd() * 4);
  const index = new Map<number, number>();
  for (let id = 1; id <= n; id++) {
    const every = pick([300, 700, 1000, 2500]);
    const maxAttempts = 1 + Math.floor(rnd() * 3);
    const overlap = rnd() < 0.7 ? "forbid" as const : "allow" as const;
    const first = T0 + Math.floor(rnd() * every);
    const row: TaskRow = {
      id, name: `t${id}`, shard: 0, executor: "e", payload: null, timeoutMs: pick([400, 1500, 5000]), maxAttempts, backoffMs: 100, backoffMaxMs: 400,
      misfire: pick(["once", "skip", "all"] as const), overlap, state: "pending", record: initialRecord({ maxAttempts, overlap }), upstreams: [],
      nextDueMs: first, nextSlotMs: first, nextSource: "rate", nextReason: "fixed rate", triggerSlots: {}, nextTriggerId: 10 + id, nextCausedBy: null,
      createdMs: T0 - 1, updatedMs: T0 - 1, triggers: [{ id: 10 + id, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: every, anchorMs: first }, enabled: true }],
      hasDownstreams: false, generation: 0, applySet: null,
    };
    d.live.set(id, liveTask(row));
    index.set(id, first);
  }
  horizon.start();

  // PostgreSQL's runs, and what was seen of them.
  const runs = new Map<string, RunInsert & { ended?: string }>();
  const slotRuns = new Map<string, string[]>(); // "task:slot" → scheduled runs that hold the slot
  const msg = { ack: () => undefined, nak: () => undefined };
  let rounds = 0; let withdrawn = 0;
  /** Dependency triggers delivered to the shard, by key, and how each was settled. */
  const triggers = new Map<string, { taskId: number; runId: string; settled?: "ack" | "nak" }>();
  let triggerSeq = 0;
  const trigger = (taskId: number, now: number): Mail => {
    const key = `up:${++triggerSeq}`;
    const trig: DependencyTrigger = { v: 1, kind: "due", taskId, key, upstreamRuns: [`u${triggerSeq}`], reason: "upstream succeeded", at: now };
    const rec: { taskId: number; runId: string; settled?: "ack" | "nak" } = { taskId, runId: dependencyRunId(trig) };
    triggers.set(key, rec);
    const settle = (how: "ack" | "nak") => {
      expect(rec.settled, `trigger ${key} settled twice (${rec.settled}, then ${how}; seed ${seed})`).toBeUndefined();
      rec.settled = how;
    };
    return { t: "trigger", trig, msg: { ack: () => settle("ack"), nak: () => settle("nak"), working: () => undefined } };
  };
  const checkTriggers = () => {
    let pending = 0;
    for (const [key, t] of triggers) {
      const lt = d.live.get(t.taskId)!;
      expect(t.settled, `trigger ${key} handed back (seed ${seed})`).not.toBe("nak");
      if (t.settled === "ack") {
        expect(runs.has(t.runId) || lt.row.state === "cancelled", `trigger ${key} acked without its run (seed ${seed})`).toBe(true);
        continue;
      }
      pending++;
      const ctx = (lt.row.record as TaskRecord).context;
      const forPlace = d.triggersWaitingForPlace.has(t.runId) || d.triggerPlaces.has(t.runId); // (a place given: decided with its wake mail)
      if (forPlace) waitedForPlace.add(key);
      expect(lt.row.state === "paused" || (ctx.overlap === "forbid" && ctx.inFlight.length > 0) || forPlace,
        `trigger ${key} held while task ${t.taskId} can run (${lt.row.state}, ${ctx.inFlight.length} in flight; seed ${seed})`).toBe(true);
    }
    expect(d.heldTriggerMessages()).toHaveLength(pending);
    if (pending) roundsHolding++;
  };
  let roundsHolding = 0; // rounds after which a trigger was held
  const waitedForPlace = new Set<string>();

  const check = (round: Round, pausedBefore: ReadonlySet<number>, now: number) => {
    for (const r of round.write.runInserts) {
      expect(runs.has(r.id), `run ${r.id} inserted twice`).toBe(false);
      runs.set(r.id, { ...r });
      if (r.state === "running" && (r.source === "rate" || r.source === "misfire") && r.slotMs !== null) {
        const k = `${r.taskId}:${r.slotMs}`;
        const live = (slotRuns.get(k) ?? []).filter((id) => runs.get(id)!.ended !== "refused");
        expect(live, `slot ${k} ran twice (seed ${seed})`).toEqual([]);
        slotRuns.set(k, [...(slotRuns.get(k) ?? []), r.id]);
        expect(pausedBefore.has(r.taskId), `paused task ${r.taskId} got a scheduled run`).toBe(false);
      }
      if (r.state === "refused" && r.source === "manual") {
        const row = d.live.get(r.taskId)!.row;
        expect(row.nextCausedBy === r.id, `refused manual run ${r.id} left a retry (seed ${seed})`).toBe(false);
      }
      if (r.state === "running") {
        expect(r.firedMs!, "released before its due time").toBeGreaterThanOrEqual(r.dueMs);
        expect(r.firedMs!).toBeGreaterThanOrEqual(now);
        if (r.firedMs! > now) held.set(r.id, r.firedMs!);
      } else {
        expect(FINAL.has(r.state), `inserted as ${r.state}`).toBe(true);
      }
    }
    for (const u of round.write.runUpdates) {
      const r = runs.get(u.id);
      expect(r, `update of a run never inserted: ${u.id}`).toBeDefined();
      if (u.state) {
        expect(r!.ended, `run ${u.id} ended twice (${r!.ended}, then ${u.state})`).toBeUndefined();
        expect(r!.state).toBe("running");
        r!.ended = u.state;
        if (u.state === "refused") {
          // Only a run its node's round still held (not released) can be withdrawn.
          expect(givenBack.has(u.id), `run ${u.id} withdrawn after its release`).toBe(true);
          withdrawn++;
        }
      }
    }
    for (const list of round.dispatch.values()) {
      for (const x of list) expect(x.firedAt, "dispatched before its due time").toBeGreaterThanOrEqual(x.scheduledAt);
    }
    expect(limiter.inFlight("e"), "places at the executor").toBe(d.inFlight.size + d.reserved.size + d.triggerPlaces.size);
    const runningInPg = [...runs.values()].filter((r) => r.state === "running" && !r.ended).map((r) => r.id).sort();
    expect(runningInPg).toEqual([...d.inFlight.keys()].sort());
    for (const lt of d.live.values()) for (const id of (lt.row.record as TaskRecord).context.inFlight) expect(d.inFlight.has(id)).toBe(true);
    for (const a of round.redisAdd) index.set(a.id, a.dueMs);
    for (const id of round.redisRemove) if (!round.redisAdd.some((a) => a.id === id)) index.delete(id);
  };

  const decide = (mail: Mail[]) => {
    const now = clock.now();
    const pausedBefore = new Set([...d.live.values()].filter((lt) => lt.row.state === "paused").map((lt) => lt.row.id));
    // A resume in this round may fire at once.
    for (const m of mail) if (m.t === "cmd" && m.cmd.type === "resume") pausedBefore.delete(m.cmd.taskId);
    const before = new Map([...d.inFlight].map(([id, r]) => [id, { seq: r.dispatchSeq, started: r.startedMs !== undefined, undeliveredSince: r.undeliveredSince }]));
    const round = d.decide(mail, { now, canFire: true, recorded: NONE_RECORDED });
    rounds++;
    // A run never started, whose message's place is known, times out only once delivered or after the grace.
    for (const u of round.write.runUpdates) {
      const b = before.get(u.id);
      if (u.state !== "timed_out" || !b || b.seq === undefined || b.started) continue;
      const delivered = delivery.seq !== null && delivery.seq >= b.seq;
      expect(delivered || (b.undeliveredSince !== undefined && now - b.undeliveredSince >= UNDELIVERED_GRACE_MS), `run ${u.id} timed out undelivered (seed ${seed})`).toBe(true);
    }
    for (const r of round.replies) r();
    check(round, pausedBefore, now);
    // The round's write is done: its messages are settled (the actor does this after the write).
    for (const m of round.acks) m.ack();
    for (const m of round.naks) m.nak();
    checkTriggers();
  };

  /**
   * Liveness: a task that is due again (not paused or ended) is somewhere it will be decided from:
   * on the wheel or in the due index at its pointer, come due and not decided yet, or waiting for
   * (or woken with) a place at its pointer. A task found nowhere is stranded: it would sit due in
   * the past until its shard is loaded again (a catch-up that waited for a place once was).
   */
  const checkReachable = (now: number) => {
    const comeDue = new Set(came.map((c) => (c.item.k === 0 ? c.item.id : -1)));
    const woken = new Set(told.flatMap((m) => (m.t === "capacity" ? [m.taskId] : [])));
    for (const lt of d.live.values()) {
      const row = lt.row;
      // (A forced run of a paused task leaves it paused when it ends: pausedAfterRun.)
      if (row.nextDueMs === null || row.state === "paused" || row.state === "cancelled" || lt.stuck !== undefined || (row.record as TaskRecord).context.pausedAfterRun) continue;
      const at = row.nextDueMs;
      const reachable = horizon.dueOf(row.id) === at || index.get(row.id) === at || comeDue.has(row.id)
        || d.waitingForCapacity.get(row.id) === at || d.reserved.has(row.id) || woken.has(row.id);
      expect(reachable, `task ${row.id} due at ${at - T0} (now ${now - T0}, ${row.nextSource}) is stranded (seed ${seed})`).toBe(true);
    }
  };

  for (let step = 0; step < 400; step++) {
    // Now and then the node stalls (a collection pause, an overloaded box) past several slots:
    // what comes due then is decided late, some of it as misfire catch-ups.
    clock.advance(rnd() < 0.03 ? 1500 + Math.floor(rnd() * 2500) : 10 + Math.floor(rnd() * 150));
    const now = clock.now();
    for (const [id, at] of held) if (at <= now) held.delete(id); // released by the node's round
    const mail: Mail[] = [];
    // The refill: index entries within the horizon go to the wheel.
    const refill = [...index].filter(([, due]) => due <= now + 4000).map(([id, dueMs]) => ({ id, dueMs }));
    if (refill.length) { for (const r of refill) index.delete(r.id); mail.push({ t: "refilled", items: refill }); }
    if (came.length) mail.push({ t: "due", items: came.splice(0), lateMs: 0 });
    mail.push(...told.splice(0));
    if (catchUps.length && rnd() < 0.5) for (const c of catchUps.splice(0)) c();
    // Published runs get their message's place; the consumer delivers some of them, or does not answer.
    for (const r of d.inFlight.values()) if (!held.has(r.runId) && r.dispatchSeq === undefined && rnd() < 0.8) r.dispatchSeq = ++delivery.published;
    if (delivery.asks.length && rnd() < 0.6) {
      delivery.seq = rnd() < 0.2 ? null : Math.max(delivery.seq ?? 0, delivery.published - Math.floor(rnd() * 4));
      delivery.answeredAt = now;
      for (const f of delivery.asks.splice(0)) f();
    }
    // The executor: some runs in flight start, finish, fail or are never heard of (they time out).
    const released = [...d.inFlight.values()].filter((r) => !held.has(r.runId));
    const events = [];
    for (const r of released) {
      const x = rnd();
      const ev = { runId: r.runId, taskId: r.taskId, at: now, token: runToken(SECRET, r.runId) };
      if (x < 0.25) events.push({ ...ev, type: "completed" as const });
      else if (x < 0.35) events.push({ ...ev, type: "failed" as const, error: { message: "boom" } });
      else if (x < 0.4) events.push({ ...ev, type: "started" as const });
      else if (x < 0.42) events.push({ ...ev, type: "completed" as const, token: "forged-token-000000000" });
    }
    if (events.length) mail.push({ t: "events", events, instance: "x", msg });
    // An operator, now and then.
    if (rnd() < 0.06) {
      const taskId = 1 + Math.floor(rnd() * n);
      const type = pick(["pause", "resume", "run", "pause", "resume"] as const);
      const reply = () => undefined;
      mail.push(type === "run" ? { t: "cmd", cmd: { type, taskId, force: rnd() < 0.3 }, reply } : { t: "cmd", cmd: { type, taskId }, reply });
    }
    // An upstream of a task succeeded (its trigger comes with whatever else is in the round).
    if (rnd() < 0.05) mail.push(trigger(1 + Math.floor(rnd() * n), now));
    if (mail.length) decide(mail);
    checkReachable(now);
  }

  // Quiet: everyone resumed, every run answered, time enough for everything to end.
  decide([...Array.from({ length: n }, (_, i): Mail => ({ t: "cmd", cmd: { type: "cancel", taskId: i + 1 }, reply: () => undefined }))]);
  for (let i = 0; i < 40 && (d.inFlight.size || came.length || told.length); i++) {
    clock.advance(500);
    for (const [id, at] of held) if (at <= clock.now()) held.delete(id);
    const mail: Mail[] = [];
    if (came.length) mail.push({ t: "due", items: came.splice(0), lateMs: 0 });
    mail.push(...told.splice(0));
    for (const c of catchUps.splice(0)) c();
    delivery.seq = delivery.published; delivery.answeredAt = clock.now();
    for (const f of delivery.asks.splice(0)) f();
    const events = [...d.inFlight.values()].filter((r) => !held.has(r.runId))
      .map((r) => ({ type: "completed" as const, runId: r.runId, taskId: r.taskId, at: clock.now(), token: runToken(SECRET, r.runId) }));
    if (events.length) mail.push({ t: "events", events, instance: "x", msg });
    if (mail.length) decide(mail);
  }
  expect(d.inFlight.size).toBe(0);
  expect(limiter.inFlight("e")).toBe(0);
  for (const [key, t] of triggers) expect(t.settled, `trigger ${key} never settled (seed ${seed})`).toBe("ack");
  for (const r of runs.values()) expect(r.state !== "running" || r.ended !== undefined, `run ${r.id} never ended`).toBe(true);
  const misfireRuns = [...runs.values()].filter((r) => r.source === "misfire").length;
  const dependencyRuns = [...runs.values()].filter((r) => r.source === "dependency" && r.state === "running").length;
  return { rounds, runs: runs.size, withdrawn, timedOut: d.stats.timedOut, waited: d.stats.waited, misfireRuns, triggers: triggers.size, dependencyRuns, heldTriggers: roundsHolding, triggersWaitedForPlace: waitedForPlace.size };
}

describe("shard decisions: random histories (fixed seeds)", () => {
  it("keep their invariants over 60 histories of 400 steps", () => {
    const totals = { rounds: 0, runs: 0, withdrawn: 0, timedOut: 0, waited: 0, misfireRuns: 0, triggers: 0, dependencyRuns: 0, heldTriggers: 0, triggersWaitedForPlace: 0 };
    for (let seed = 1; seed <= 60; seed++) {
      const h = history(seed);
      for (const k of Object.keys(totals) as Array<keyof typeof totals>) totals[k] += h[k];
    }
    // The histories reach what they are meant to: waits for a place, timeouts, withdrawals.
    expect(totals.runs).toBeGreaterThan(3000);
    expect(totals.waited).toBeGreaterThan(50);
    expect(totals.timedOut).toBeGreaterThan(50);
    expect(totals.withdrawn).toBeGreaterThan(5);
    expect(totals.misfireRuns).toBeGreaterThan(20);
    // Dependency triggers: many become runs, many wait (held) for a run in flight or a resume first.
    expect(totals.dependencyRuns).toBeGreaterThan(200);
    expect(totals.heldTriggers).toBeGreaterThan(100);
    expect(totals.triggersWaitedForPlace).toBeGreaterThan(20);
    console.log(JSON.stringify(totals));
  });
});
