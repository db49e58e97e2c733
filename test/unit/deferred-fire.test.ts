import { describe, expect, it } from "vitest";
import { SimulatedClock } from "../../common/index.ts";
import { runToken } from "../../protocol/index.ts";
import { initialRecord, type TaskRecord } from "../../actors/machine/index.ts";
import { Horizon } from "../../actors/shard/horizon.ts";
import { ShardDecisions, NONE_RECORDED } from "../../actors/shard/decide.ts";
import { compiledOf } from "../../actors/shard/schedule.ts";
import { taskUpdatesOf } from "../../actors/shard/effects.ts";
import { liveTask, written, type Mail, type Round } from "../../actors/shard/types.ts";
import { runsKey } from "../../actors/triggers/index.ts";
import type { RunInsert, RunRow, TaskRow, TriggerRow } from "../../actors/store/index.ts";
import { rng as mulberry32 } from "./cron-reference.ts";
import { stubDecisions } from "../redo.ts";

/**
 * A fire may leave its task row to the task's next write (AX_TASK_WRITE_DEFER): the run row is
 * written with the round, the task row is not. If the shard changes hands before the row is
 * written, the next owner finds the run `running` while the row lists nothing in flight and still
 * points at the run's slot, and redoes the fire on that row (ShardDecisions.replayFire). These
 * tests hold the redone row against the row the firing node had in memory, field by field, over
 * random tasks (fixed seed): fixed rates, crons in zones with DST, one-shots, --max-runs, jitter,
 * retries and catch-ups, decided in the lead or behind (a slot passed more than the grace ago).
 */

const T0 = Date.UTC(2026, 2, 29, 0, 30); // the night Europe/London and Europe/Berlin spring forward
const SECRET = new Uint8Array(32).fill(5);

function decisions(clock: SimulatedClock, defer: boolean) {
  const x = stubDecisions(clock, { spreadAheadMs: 220, secret: SECRET, random: () => 0.5, active: true, deferFireWrites: defer });
  x.d.acquired(T0 - 3_600_000, { owner: null, epoch: null, sinceMs: null });
  return x;
}

const clone = <T>(x: T): T => structuredClone(x);

/** A random task whose pointer is due near T0, and the moment its slot is decided. */
function randomCase(rnd: () => number): { row: TaskRow; now: number } {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  const id = 1 + Math.floor(rnd() * 1000);
  const kind = pick(["rate", "rate", "cron", "cron", "once"] as const);
  const sched: Record<string, number> = {};
  if (rnd() < 0.3) sched.maxRuns = 2 + Math.floor(rnd() * 5);
  if (rnd() < 0.3) sched.jitterMs = pick([50, 400, 5000]);
  const opt = Object.keys(sched).length ? { sched } : {};
  const trigger: TriggerRow = kind === "rate"
    ? { id: 7, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: pick([300, 1000, 60_000, 3_600_000]), anchorMs: T0 - 7_200_000 - Math.floor(rnd() * 1000), ...opt }, enabled: true }
    : kind === "cron"
      ? { id: 7, kind: "cron", spec: { kind: "cron", expr: pick(["*/5 * * * * *", "30 * * * *", "0 */2 * * *", "15 1 * * *"]), tz: pick(["UTC", "Europe/London", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kathmandu"]), ...opt }, enabled: true }
      : { id: 7, kind: "once", spec: { kind: "once", atMs: T0 + Math.floor(rnd() * 1000), ...opt }, enabled: true };
  const c = compiledOf(trigger);
  const prev = kind === "once" ? null : c.next(T0 - 4 * 3_600_000 * rnd() - 1000);
  const raw = kind === "once" ? (trigger.spec as { atMs: number }).atMs : c.next(prev!)!;
  const slot = raw;
  const triggerSlots: Record<string, number> = {};
  if (prev !== null) triggerSlots["7"] = prev;
  const w = rnd();
  if (prev !== null && w < 0.4) triggerSlots["w:7"] = prev;
  else if (prev !== null && w < 0.7) triggerSlots["w:7"] = prev - 3 * 3_600_000; // slots not accounted yet: the ledger fills the gap
  if (sched.maxRuns !== undefined) triggerSlots[runsKey(7)] = Math.floor(rnd() * (sched.maxRuns - 1));
  const maxAttempts = 1 + Math.floor(rnd() * 3);
  const overlap = pick(["forbid", "allow"] as const);
  const source = kind === "rate" ? "rate" : kind === "cron" ? "cron" : "once";
  let record = initialRecord({ maxAttempts, overlap }) as TaskRecord;
  let state: TaskRow["state"] = "pending";
  let nextSource: TaskRow["nextSource"] = source;
  let causedBy: string | null = null;
  const due = slot + (sched.jitterMs ? Math.floor(rnd() * sched.jitterMs) : 0);
  const variant = rnd();
  if (variant < 0.2 && maxAttempts > 1) {
    // A retry of a failed attempt: same slot, its own due time.
    record = { value: "retry", context: { ...record.context, attempt: 1, lastRunId: "r-failed", lastError: "boom" } };
    state = "retry"; nextSource = "retry"; causedBy = "r-failed";
  } else if (variant < 0.35 && prev !== null) {
    // A catch-up fired for slots passed while the previous run was in flight.
    nextSource = "misfire"; causedBy = "r-slow";
  }
  const row: TaskRow = {
    id, name: `t${id}`, shard: 1, executor: "e", payload: { id }, timeoutMs: 30_000, maxAttempts, backoffMs: 100, backoffMaxMs: 1000,
    misfire: pick(["once", "skip", "all"] as const), overlap, state, record, upstreams: [],
    nextDueMs: due, nextSlotMs: slot, nextTriggerId: 7, nextSource, nextReason: "the pointer's reason", nextCausedBy: causedBy,
    triggerSlots, createdMs: T0 - 8 * 3_600_000, updatedMs: T0 - 60_000, triggers: [trigger], hasDownstreams: false, generation: 0, applySet: null,
  };
  // Decided in the lead (up to 100 ms ahead) or behind: up to the grace late, or past it.
  const late = rnd();
  const now = late < 0.5 ? due - Math.floor(rnd() * 100) : late < 0.8 ? due + Math.floor(rnd() * 900) : due + 1000 + Math.floor(rnd() * 2500);
  return { row, now };
}

/** What PostgreSQL would hold of the run the round inserted (the fields replayFire reads). */
function runRowOf(ins: RunInsert): RunRow {
  return { ...ins, executorInstance: null, startedMs: null, finishedMs: null, lateOutcome: null, dispatchId: null, result: null } as RunRow;
}

function fire(d: ShardDecisions, horizon: Horizon, row: TaskRow, now: number): Round {
  d.live.set(row.id, liveTask(row));
  horizon.schedule({ redisAdd: [], redisRemove: [] }, row.id, row.nextDueMs!);
  const mail: Mail = { t: "due", items: [{ dueMs: row.nextDueMs!, item: { k: 0, id: row.id, due: row.nextDueMs! } }], lateMs: 0 };
  return d.decide([mail], { now, canFire: true, recorded: NONE_RECORDED });
}

describe("a fire that leaves its task row unwritten", () => {
  it("writes the run and not the task row; the round says which task waits", () => {
    const clock = new SimulatedClock(T0);
    const { d, horizon } = decisions(clock, true);
    const { row, now } = randomCase(mulberry32(4));
    clock.stepWall((now) - clock.now());
    const r = fire(d, horizon, row, now);
    expect(r.write.runInserts.map((x) => x.state)).toEqual(["running"]);
    expect(r.deferred).toEqual([row.id]);
    expect(taskUpdatesOf(r.touched, d.live)).toEqual([]);
    expect(d.stats.deferredWrites).toBe(1);
  });

  it("writes the task row with the fire where a next owner could not redo it", () => {
    const clock = new SimulatedClock(T0);
    // Off: every fire writes its row.
    {
      const { d, horizon } = decisions(clock, false);
      const row: TaskRow = randomCase(mulberry32(4)).row;
      clock.stepWall((row.nextDueMs!) - clock.now());
      const r = fire(d, horizon, row, row.nextDueMs!);
      expect(r.deferred).toEqual([]);
      expect(taskUpdatesOf(r.touched, d.live).map((u) => u.id)).toEqual([row.id]);
    }
    // A run of the task already in flight (overlap=allow): the row lists it, so the next fire is written.
    {
      const { d, horizon, limiter } = decisions(clock, true);
      const base = randomCase(mulberry32(9)).row;
      const row: TaskRow = { ...base, overlap: "allow", state: "running", record: { value: "running", context: { ...initialRecord({ maxAttempts: 1, overlap: "allow" }).context, attempt: 1, inFlight: ["r-old"], lastRunId: "r-old" } } };
      d.adoptRunning(runRowOf({ id: "r-old", taskId: row.id, taskName: row.name, triggerId: 7, source: "rate", dueMs: T0 - 5000, slotMs: T0 - 5000, dueReason: null,
        firedMs: T0 - 5000, node: "n0", shard: 1, epoch: 1, attempt: 1, executor: "e", state: "running", error: null, causedBy: null, upstreamRuns: null, createdMs: T0 - 5000 }), T0);
      expect(limiter.inFlight("e")).toBe(1);
      clock.stepWall((row.nextDueMs!) - clock.now());
      const r = fire(d, horizon, row, row.nextDueMs!);
      expect(r.write.runInserts.map((x) => x.state)).toEqual(["running"]);
      expect(r.deferred).toEqual([]);
      expect(taskUpdatesOf(r.touched, d.live).map((u) => u.id)).toEqual([row.id]);
    }
    // The same round changed the task before the fire (its previous run's completion): both written.
    {
      const { d, horizon } = decisions(clock, true);
      const row: TaskRow = { ...randomCase(mulberry32(12)).row, overlap: "forbid" };
      const first = fire(d, horizon, { ...row }, row.nextDueMs!);
      const runId = first.write.runInserts[0]!.id;
      const lt = d.live.get(row.id)!;
      clock.stepWall((lt.row.nextDueMs ?? T0 + 60_000) - clock.now());
      const next = lt.row.nextDueMs;
      if (next !== null) horizon.schedule({ redisAdd: [], redisRemove: [] }, row.id, next);
      const mail: Mail[] = [{ t: "events", instance: "x", msg: { ack: () => undefined, nak: () => undefined }, events: [{ type: "completed", runId, taskId: row.id, at: clock.now(), token: runToken(SECRET, runId) }] }];
      if (next !== null) mail.push({ t: "due", items: [{ dueMs: next, item: { k: 0, id: row.id, due: next } }], lateMs: 0 });
      const r = d.decide(mail, { now: clock.now(), canFire: true, recorded: NONE_RECORDED });
      expect(r.deferred).toEqual([]);
      expect(taskUpdatesOf(r.touched, d.live).map((u) => u.id)).toEqual([row.id]);
    }
  });

  it("a flush mail writes the rows whose fires waited, with everything since", () => {
    const clock = new SimulatedClock(T0);
    const { d, horizon } = decisions(clock, true);
    const { row, now } = randomCase(mulberry32(21));
    clock.stepWall((now) - clock.now());
    const r = fire(d, horizon, clone(row), now);
    expect(r.deferred).toEqual([row.id]);
    const f = d.decide([{ t: "flush", taskIds: [row.id, 999_999] }], { now, canFire: true, recorded: NONE_RECORDED });
    const ups = taskUpdatesOf(f.touched, d.live);
    expect(ups.map((u) => [u.id, u.state])).toEqual([[row.id, "running"]]);
    expect((ups[0]!.record as TaskRecord).context.inFlight).toEqual([r.write.runInserts[0]!.id]);
    expect(d.stats.flushedWrites).toBe(1);
  });

  it("the next owner redoes the fire on the row PostgreSQL holds and gets the row the firing node had, over 600 random tasks", () => {
    const rnd = mulberry32(20261207);
    let deferred = 0; let behind = 0; let gaps = 0;
    const sources = new Set<string>();
    for (let i = 0; i < 600; i++) {
      const { row, now } = randomCase(rnd);
      const clock = new SimulatedClock(now);
      const first = decisions(clock, true);
      const stored = clone(row); // PostgreSQL's row: the fire's round does not write it
      const r = fire(first.d, first.horizon, clone(row), now);
      const ins = r.write.runInserts.find((x) => x.state === "running");
      if (!ins) continue; // not fired as itself (a misfire policy re-dated or skipped it): written, nothing to redo
      if (!r.deferred.includes(row.id)) {
        // Written with its round: then the stored row is the firing node's, and nothing is redone.
        expect(taskUpdatesOf(r.touched, first.d.live).map((u) => u.id)).toEqual([row.id]);
        continue;
      }
      deferred++;
      sources.add(ins.source);
      if (now - row.nextDueMs! > 1000) behind++;
      if (r.write.ledger!.length) gaps++;
      const inMemory = written(first.d.live.get(row.id)!.row);
      // The next owner: a later clock, the stored row, and the run PostgreSQL holds.
      const later = new SimulatedClock(now + 5000);
      const next = decisions(later, true);
      next.d.live.set(row.id, liveTask(stored));
      const replay = next.d.newRound();
      expect(next.d.replayFire(replay, next.d.live.get(row.id)!, runRowOf(ins)), `case ${i}: redone`).toBe(true);
      next.d.adoptRunning(runRowOf(ins), later.now());
      expect(written(next.d.live.get(row.id)!.row), `case ${i} (${ins.source}, ${JSON.stringify(row.triggers[0]!.spec)}, ${now - row.nextDueMs!} ms late)`).toEqual(inMemory);
      expect(replay.write.ledger, "the fire's ledger rows were written with its run").toEqual([]);
      expect(taskUpdatesOf(replay.touched, next.d.live).map((u) => u.id)).toEqual([row.id]);
      // Its next due time goes on the wheel or into the index with the redone round.
      const nextDue = inMemory.nextDueMs;
      if (nextDue !== null) expect(next.horizon.dueOf(row.id) === nextDue || replay.redisAdd.some((a) => a.id === row.id && a.dueMs === nextDue)).toBe(true);
      // Redone once: the row as brought forward lists the run, and is not redone again.
      expect(next.d.replayFire(next.d.newRound(), next.d.live.get(row.id)!, runRowOf(ins))).toBe(false);
      // A run the stored row does not point at (another slot) is not redone.
      const other = decisions(later, true);
      other.d.live.set(row.id, liveTask(clone(row)));
      expect(other.d.replayFire(other.d.newRound(), other.d.live.get(row.id)!, runRowOf({ ...ins, dueMs: ins.dueMs + 1 }))).toBe(false);
    }
    // The cases reach what they are meant to.
    expect(deferred).toBeGreaterThan(250);
    expect(behind).toBeGreaterThan(20);
    expect(gaps).toBeGreaterThan(20);
    expect([...sources].sort()).toEqual(["cron", "misfire", "once", "rate", "retry"]);
  });
});
