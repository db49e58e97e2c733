import { describe, expect, it } from "vitest";
import { SimulatedClock, silentLogger } from "../../common/index.ts";
import { runToken, type DependencyTrigger, type RunEvent } from "../../protocol/index.ts";
import { initialRecord, type TaskRecord } from "../../actors/machine/index.ts";
import { InFlightLimiter } from "../../actors/limiter.ts";
import { Horizon } from "../../actors/shard/horizon.ts";
import { ShardDecisions, NONE_RECORDED, backfillRunId, dependencyRunId, UNDELIVERED_GRACE_MS } from "../../actors/shard/decide.ts";
import { liveTask, type CommandReply, type Mail, type Round } from "../../actors/shard/types.ts";
import type { TaskRow, TriggerRow } from "../../actors/store/index.ts";

/**
 * The shard's decisions without the actor, PostgreSQL, Redis or NATS: a round's mail in, its
 * plan out (decide.ts). The ports are the real in-memory limiter and horizon (on a simulated
 * clock, never refilled here) and small stand-ins for what the actor would answer (which runs
 * can still be withdrawn, whether the events stream has been read up to a moment). Each case
 * below is one row of a table: what the shard holds, the mail, and what the plan must say.
 */

const T0 = Date.UTC(2026, 0, 1);
const SECRET = new Uint8Array(32).fill(7);
const EVERY = 1000;

function rateTrigger(): TriggerRow {
  return { id: 11, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: EVERY, anchorMs: T0 - 10 * EVERY }, enabled: true };
}

/** A task on a 1 s fixed-rate trigger whose next slot is due at `dueMs`. */
function task(id: number, dueMs: number, o: Partial<TaskRow> = {}): TaskRow {
  const maxAttempts = o.maxAttempts ?? 1;
  const overlap = o.overlap ?? "forbid";
  return {
    id, name: `t${id}`, shard: 3, executor: "e", payload: { n: id }, timeoutMs: 5000, maxAttempts, backoffMs: 200, backoffMaxMs: 200,
    misfire: "once", overlap, state: "pending", record: initialRecord({ maxAttempts, overlap }), upstreams: [],
    nextDueMs: dueMs, nextSlotMs: dueMs, nextSource: "rate", nextReason: "fixed rate", triggerSlots: { "11": dueMs - EVERY },
    nextTriggerId: 11, nextCausedBy: null, createdMs: T0 - 60_000, updatedMs: T0 - 60_000, triggers: [rateTrigger()],
    hasDownstreams: false, generation: 0, applySet: null, ...o,
  };
}

/** The same task on a 10 s fixed-rate trigger with slots at T0 + 5 s + k·10 s. */
function tenSeconds(row: TaskRow): TaskRow {
  const slot = row.nextDueMs!;
  return { ...row, triggers: [{ ...rateTrigger(), spec: { kind: "fixed_rate", everyMs: 10_000, anchorMs: T0 + 5000 - 100_000 } }], triggerSlots: { "11": slot - 10_000 } };
}

function setup(opts: { limit?: number; covered?: boolean; acquiredMs?: number; deliveryGraceMs?: number; maxAhead?: number; holds?: boolean } = {}) {
  const clock = new SimulatedClock(T0);
  const limiter = new InFlightLimiter(opts.limit ?? 10, { max: opts.maxAhead ?? 0, holds: (e) => !!opts.holds && e === "e" });
  const horizon = new Horizon({
    shard: 3, tickMs: 20, wheelSize: 512, clock, log: silentLogger, horizonMs: 5000, leadMs: 100,
    due: { rebuildFrom: async () => undefined, takeDue: async () => ({ items: [], nextDueMs: null }) }, store: { dueOfShard: async () => [] },
    onDue: () => undefined, onRefilled: () => undefined, active: () => false,
  });
  const told: Mail[] = [];
  const withdrawable = new Set<string>();
  /** Runs whose dispatch the node's round saw land late: when. */
  const landed = new Map<string, number>();
  const catchUpRequests: Array<(unconfirmed?: string) => void> = [];
  /** The executors' consumer as the fake JetStream answers it: delivered up to `seq` (null: no answer), when asked. */
  const delivery = { seq: null as number | null, answeredAt: -Infinity, asks: [] as Array<() => void>, asked: 0 };
  const answerDelivery = (seq: number | null) => {
    delivery.seq = seq; delivery.answeredAt = clock.now();
    for (const f of delivery.asks.splice(0)) f();
  };
  const seen = { fired: [] as unknown[], finished: [] as Array<{ state: string; final: boolean }>, missed: [] as Array<{ reason: string }> };
  const d = new ShardDecisions({
    shard: 3, epoch: 7, nodeId: "n1", clock, log: silentLogger, tickMs: 20, limiter, horizon, spreadAheadMs: 220,
    calendars: { exclusion: () => null },
    persister: { withdraw: (id) => withdrawable.delete(id), isPublishing: () => false, landedAt: (id) => landed.get(id) },
    catchUp: { covers: () => opts.covered ?? true, request: (then) => { catchUpRequests.push(then); } },
    delivery: {
      status: (_e, seq, notBefore) => (delivery.answeredAt < notBefore ? "ask" : delivery.seq !== null && delivery.seq >= seq ? "delivered" : "undelivered"),
      ask: (_e, then) => { delivery.asked++; delivery.asks.push(then); },
    },
    deliveryGraceMs: opts.deliveryGraceMs,
    dispatchSecret: SECRET, random: () => 0,
    events: {
      "run:fired": (e) => seen.fired.push(e),
      "run:finished": (e) => seen.finished.push({ state: e.state, final: e.final }),
      "slot:missed": (e) => seen.missed.push({ reason: e.reason }),
    },
    tell: (m) => told.push(m), active: () => true,
  });
  d.acquired(opts.acquiredMs ?? T0 - 30_000, { owner: null, epoch: null, sinceMs: null });
  const add = (row: TaskRow) => { d.live.set(row.id, liveTask(row)); return row; };
  /** Puts the task's slot on the wheel, as the refill would, so a `due` mail for it is current. */
  const onWheel = (row: TaskRow) => horizon.schedule({ redisAdd: [], redisRemove: [] }, row.id, row.nextDueMs!);
  const due = (row: TaskRow): Mail => ({ t: "due", items: [{ dueMs: row.nextDueMs!, item: { k: 0, id: row.id, due: row.nextDueMs! } }], lateMs: 0 });
  const acks = { acked: 0, naked: 0 };
  const msg = { ack: () => { acks.acked++; }, nak: () => { acks.naked++; } };
  const event = (runId: string, type: RunEvent["type"], o: Partial<RunEvent> = {}): Mail =>
    ({ t: "events", instance: "x1", msg, events: [{ type, runId, taskId: 1, at: clock.now(), token: runToken(SECRET, runId), ...o }] });
  const replies: CommandReply[] = [];
  const cmd = (c: Extract<Mail, { t: "cmd" }>["cmd"]): Mail => ({ t: "cmd", cmd: c, reply: (r) => replies.push(r) });
  const decide = (mail: Mail[], ctx: { canFire?: boolean; recorded?: ReadonlySet<string> } = {}): Round => {
    const round = d.decide(mail, { now: clock.now(), canFire: ctx.canFire ?? true, recorded: ctx.recorded ?? NONE_RECORDED });
    for (const r of round.replies) r();
    return round;
  };
  /** Fires `row` at its due time and returns the run id (the state most cases start from). */
  const fireNow = (row: TaskRow): string => {
    onWheel(row);
    const r = decide([due(row)]);
    expect(r.write.runInserts).toHaveLength(1);
    return r.write.runInserts[0]!.id;
  };
  return { clock, limiter, horizon, told, withdrawable, landed, catchUpRequests, delivery, answerDelivery, seen, d, add, onWheel, due, event, cmd, decide, fireNow, acks, msg, replies };
}

type Setup = ReturnType<typeof setup>;
const record = (row: TaskRow) => row.record as TaskRecord;

describe("shard decisions: due slots", () => {
  it.each([
    {
      name: "at its due time: recorded running, released now, pointer to the next slot",
      given: (s: Setup) => { const row = s.add(task(1, T0)); s.onWheel(row); return row; },
      check: (s: Setup, r: Round, row: TaskRow) => {
        expect(r.write.runInserts.map((x) => [x.state, x.firedMs, x.dueMs, x.source, x.epoch, x.shard])).toEqual([["running", T0, T0, "rate", 7, 3]]);
        expect(r.dispatch.get("e")?.map((x) => [x.taskId, x.firedAt, x.scheduledAt, x.token])).toEqual([[1, T0, T0, runToken(SECRET, r.write.runInserts[0]!.id)]]);
        // No deadline on the wire: an executor takes firedAt + timeoutMs, the shard's own timeout.
        expect(r.dispatch.get("e")![0]).not.toHaveProperty("deadline");
        expect(row.state).toBe("running");
        expect(row.nextDueMs).toBe(T0 + EVERY);
        expect(s.limiter.inFlight("e")).toBe(1);
        expect(r.touched.has(1)).toBe(true);
      },
    },
    {
      name: "in the lead window (80 ms ahead): recorded now, released at the due time, never before",
      given: (s: Setup) => { const row = s.add(task(1, T0 + 80)); s.onWheel(row); return row; },
      check: (_s: Setup, r: Round) => {
        expect(r.write.runInserts.map((x) => [x.state, x.firedMs, x.createdMs])).toEqual([["running", T0 + 80, T0]]);
        expect(r.dispatch.get("e")![0]!.firedAt).toBe(T0 + 80);
      },
    },
    {
      name: "paused: nothing recorded, nothing dispatched",
      given: (s: Setup) => { const row = s.add(task(1, T0, { state: "paused", record: { ...initialRecord({ maxAttempts: 1, overlap: "forbid" }), value: "paused" } })); s.onWheel(row); return row; },
      check: (s: Setup, r: Round) => { expect(r.write.runInserts).toEqual([]); expect(r.dispatch.size).toBe(0); expect(s.limiter.inFlight("e")).toBe(0); },
    },
    {
      name: "superseded (the row points elsewhere since): nothing",
      given: (s: Setup) => { const row = s.add(task(1, T0)); s.onWheel(row); row.nextDueMs = T0 + 500; return row; },
      check: (_s: Setup, r: Round) => { expect(r.write.runInserts).toEqual([]); expect(r.dispatch.size).toBe(0); },
    },
    {
      name: "executor full: nothing written but the task; it waits in the limiter in due order",
      given: (s: Setup) => { s.limiter.force("e"); const row = s.add(task(1, T0)); s.onWheel(row); return row; },
      limit: 1,
      check: (s: Setup, r: Round, row: TaskRow) => {
        expect(r.write.runInserts).toEqual([]);
        expect(r.touched.has(1)).toBe(true);
        expect(s.d.waitingForCapacity.get(1)).toBe(T0);
        expect(s.limiter.waiting("e")).toBe(1);
        expect(row.nextDueMs).toBe(T0); // the pointer stays: PostgreSQL still says it is due
        s.limiter.release("e"); // a place frees: the shard is told, with the place reserved
        expect(s.told).toEqual([{ t: "capacity", taskId: 1, dueMs: T0, executor: "e" }]);
        expect(s.d.reserved.get(1)).toBe("e");
      },
    },
    {
      name: "executor full after a catch-up re-dated the slot: the task is written pointing at the catch-up, which waits and fires when a place frees",
      given: (s: Setup) => { s.limiter.force("e"); const row = s.add(tenSeconds(task(1, T0 - 45_000))); s.onWheel(row); return row; },
      limit: 1,
      acquiredMs: T0 - 1000,
      check: (s: Setup, r: Round, row: TaskRow) => {
        expect(r.write.runInserts).toEqual([]);
        expect(r.write.ledger!.map((l) => l.reason)).toEqual(["outage"]);
        expect(r.touched.has(1)).toBe(true);
        expect([row.nextDueMs, row.nextSource]).toEqual([T0, "misfire"]);
        expect(s.limiter.waiting("e")).toBe(1);
        s.limiter.release("e");
        expect(s.told).toEqual([{ t: "capacity", taskId: 1, dueMs: T0, executor: "e" }]);
        // Its capacity mail fires the catch-up (it was dropped: the row still named the missed slot).
        const woken = s.decide([s.told[0]!]);
        expect(woken.write.runInserts.map((x) => [x.source, x.dueMs])).toEqual([["misfire", T0]]);
        expect(woken.write.ledger, "the gap went in with the wait, as it goes in with a catch-up fired at once").toEqual([]);
        expect(row.nextDueMs).toBe(T0 + 5000);
      },
    },
    {
      name: "lease not valid: back to the due index, nothing fired",
      given: (s: Setup) => { const row = s.add(task(1, T0)); s.onWheel(row); return row; },
      canFire: false,
      check: (_s: Setup, r: Round) => { expect(r.write.runInserts).toEqual([]); expect(r.redisAdd).toEqual([{ id: 1, dueMs: T0 }]); },
    },
    {
      name: "came due while nobody owned the shard, misfire=skip: no run, the cadence resumes, the gap is in the ledger",
      given: (s: Setup) => { const row = s.add(tenSeconds(task(1, T0 - 45_000, { misfire: "skip" }))); s.onWheel(row); return row; },
      acquiredMs: T0 - 1000,
      check: (_s: Setup, r: Round, row: TaskRow) => {
        expect(r.write.runInserts).toEqual([]);
        expect(row.nextDueMs).toBe(T0 + 5000);
        expect(r.write.ledger!.map((l) => [l.reason, l.count, l.fromMs, l.toMs])).toEqual([["outage", 5, T0 - 45_000, T0 - 5000]]);
      },
    },
    {
      name: "came due while nobody owned the shard, misfire=once: one catch-up run now, then the cadence",
      given: (s: Setup) => { const row = s.add(tenSeconds(task(1, T0 - 45_000))); s.onWheel(row); return row; },
      acquiredMs: T0 - 1000,
      check: (_s: Setup, r: Round, row: TaskRow) => {
        expect(r.write.runInserts.map((x) => [x.state, x.source, x.firedMs])).toEqual([["running", "misfire", T0]]);
        expect(row.nextDueMs).toBe(T0 + 5000);
      },
    },
    {
      name: "behind, not down (due 3 s ago under this owner, no later slot passed): fires as itself",
      given: (s: Setup) => { const row = s.add(task(1, T0 - 3000, { triggers: [{ ...rateTrigger(), spec: { kind: "fixed_rate", everyMs: 60_000, anchorMs: T0 - 3000 } }] })); s.onWheel(row); return row; },
      acquiredMs: T0 - 10_000,
      check: (_s: Setup, r: Round) => {
        expect(r.write.runInserts.map((x) => [x.source, x.dueMs, x.firedMs])).toEqual([["rate", T0 - 3000, T0]]);
      },
    },
  ])("$name", ({ given, check, canFire, limit, acquiredMs }) => {
    const s = setup({ ...(limit !== undefined ? { limit } : {}), ...(acquiredMs !== undefined ? { acquiredMs } : {}) });
    const row = given(s);
    const r = s.decide([s.due(row)], { canFire: canFire ?? true });
    check(s, r, row);
  });

  it("overlap=forbid: a slot due while the previous run is in flight is recorded skipped, with the run that held it", () => {
    const s = setup();
    const row = s.add(task(1, T0));
    const first = s.fireNow(row);
    s.clock.stepWall(EVERY);
    s.onWheel(row);
    const r = s.decide([s.due(row)]);
    expect(r.write.runInserts.map((x) => [x.state, x.error])).toEqual([["skipped", `not fired: previous run ${first} still in flight (overlap=forbid)`]]);
    expect(r.dispatch.size).toBe(0);
    expect(s.seen.missed).toEqual([{ reason: "overlap" }]);
    expect(row.nextDueMs).toBe(T0 + 2 * EVERY);
  });

  it("overlap=allow: the next slot fires beside the run in flight", () => {
    const s = setup();
    const row = s.add(task(1, T0, { overlap: "allow" }));
    s.fireNow(row);
    s.clock.stepWall(EVERY);
    s.onWheel(row);
    const r = s.decide([s.due(row)]);
    expect(r.write.runInserts.map((x) => x.state)).toEqual(["running"]);
    expect(record(row).context.inFlight).toHaveLength(2);
    expect(s.limiter.inFlight("e")).toBe(2);
  });

  it("a slot of a task with a run in flight, seen ahead of its due time, is held until its due time", () => {
    const s = setup();
    const row = s.add(task(1, T0));
    s.fireNow(row);
    s.clock.stepWall(EVERY - 80); // the next slot enters the lead window
    s.onWheel(row);
    const r = s.decide([s.due(row)]);
    expect(r.write.runInserts).toEqual([]);
    expect(s.horizon.dueOf(1)).toBe(T0 + EVERY);
  });
});

describe("shard decisions: runs spread ahead of a burst", () => {
  /** The task's slot, due `aheadMs` from now, comes up now (as a spread entry does). */
  const spreadDue = (s: Setup, row: TaskRow): Mail => { s.onWheel(row); return s.due(row); };

  it("to an executor that holds runs: recorded now, released at its due time, on a place ahead that its end gives back", () => {
    const s = setup({ holds: true, maxAhead: 5, limit: 1 });
    const row = s.add(task(1, T0 + 3000));
    const r = s.decide([spreadDue(s, row)]);
    expect(r.write.runInserts.map((x) => [x.state, x.dueMs, x.firedMs])).toEqual([["running", T0 + 3000, T0 + 3000]]);
    expect(r.dispatch.get("e")?.map((x) => x.firedAt)).toEqual([T0 + 3000]);
    expect([s.limiter.ahead("e"), s.limiter.inFlight("e")]).toEqual([1, 0]);
    // The place under the limit is still free for a run due now.
    expect(s.limiter.tryAcquire("e")).toBe(true);
    s.limiter.release("e");
    s.clock.advance(3010);
    s.decide([s.event(r.write.runInserts[0]!.id, "completed", { startedAt: T0 + 3001 })]);
    expect([s.limiter.ahead("e"), s.limiter.inFlight("e")]).toEqual([0, 0]);
  });

  it.each([
    { name: "its executor does not hold runs", o: { holds: false, maxAhead: 5 }, before: (_s: Setup) => undefined },
    { name: "its executor has as many runs ahead as it may", o: { holds: true, maxAhead: 1 }, before: (s: Setup) => { expect(s.limiter.tryAcquireAhead("e")).toBe(true); } },
    { name: "a run due now waits for a place at its executor", o: { holds: true, maxAhead: 5, limit: 1 }, before: (s: Setup) => { s.limiter.tryAcquire("e"); s.limiter.wait("e", { dueMs: T0, wake: () => true }); } },
  ])("not ahead when $name: nothing written, back on the wheel in the lead", ({ o, before }) => {
    const s = setup(o);
    before(s);
    const row = s.add(task(1, T0 + 3000));
    const r = s.decide([spreadDue(s, row)]);
    expect(r.write.runInserts).toEqual([]);
    expect(r.dispatch.size).toBe(0);
    expect(s.horizon.dueOf(1)).toBe(T0 + 3000);
    expect(s.limiter.inFlight("e") + s.limiter.ahead("e")).toBe(o.maxAhead === 1 ? 1 : o.limit === 1 ? 1 : 0);
  });

  it("a run of a spread burst found recorded at load takes a place ahead; one due sooner is counted under the limit", () => {
    const s = setup({ holds: true, maxAhead: 5, limit: 1 });
    s.add(task(1, T0 + 3000)); s.add(task(2, T0 + 100));
    const found = (id: string, taskId: number, firedMs: number) => ({ id, taskId, executor: "e", firedMs }) as unknown as Parameters<Setup["d"]["adoptRunning"]>[0];
    s.d.adoptRunning(found("r1", 1, T0 + 3000), T0);
    s.d.adoptRunning(found("r2", 2, T0 + 100), T0);
    expect([s.limiter.ahead("e"), s.limiter.inFlight("e")]).toEqual([1, 1]);
    s.d.dropInFlight();
    expect([s.limiter.ahead("e"), s.limiter.inFlight("e")]).toEqual([0, 0]);
  });

  it("within the lead a run takes a place under the limit as before, whatever its executor", () => {
    const s = setup({ holds: true, maxAhead: 5 });
    const row = s.add(task(1, T0 + 150));
    const r = s.decide([spreadDue(s, row)]);
    expect(r.write.runInserts.map((x) => x.firedMs)).toEqual([T0 + 150]);
    expect([s.limiter.ahead("e"), s.limiter.inFlight("e")]).toEqual([0, 1]);
  });

  it("a pause before its due time withdraws a run recorded ahead and gives its place ahead back", () => {
    const s = setup({ holds: true, maxAhead: 5 });
    const row = s.add(task(1, T0 + 3000));
    const r = s.decide([spreadDue(s, row)]);
    const runId = r.write.runInserts[0]!.id;
    s.withdrawable.add(runId);
    const p = s.decide([s.cmd({ type: "pause", taskId: 1 } as Extract<Mail, { t: "cmd" }>["cmd"])]);
    expect(p.write.runUpdates.map((u) => [u.id, u.state])).toEqual([[runId, "refused"]]);
    expect(s.limiter.ahead("e")).toBe(0);
  });
});

describe("shard decisions: events, timeouts", () => {
  it.each([
    {
      name: "completed, with the run's token: the run ends success, its place is freed, the task waits for its next slot",
      mail: (s: Setup, runId: string) => [s.event(runId, "completed", { startedAt: T0 + 5 })],
      check: (s: Setup, r: Round, row: TaskRow, runId: string) => {
        expect(r.write.runUpdates).toEqual([{ id: runId, finishedMs: T0 + 50, state: "success", startedMs: T0 + 5, executorInstance: "x1" }]);
        expect(s.d.inFlight.has(runId)).toBe(false);
        expect(s.limiter.inFlight("e")).toBe(0);
        expect(row.state).toBe("success");
        expect(s.seen.finished).toEqual([{ state: "success", final: true }]);
        expect(r.acks).toHaveLength(1);
      },
    },
    {
      name: "a forged completion (no token): refused, nothing written, the run stays in flight",
      mail: (s: Setup, runId: string) => [s.event(runId, "completed", { token: "x".repeat(22) })],
      check: (s: Setup, r: Round, row: TaskRow, runId: string) => {
        expect(r.write.runUpdates).toEqual([]);
        expect(s.d.inFlight.has(runId)).toBe(true);
        expect(row.state).toBe("running");
        expect(s.d.stats.refusedEvents).toBe(1);
      },
    },
    {
      name: "the same completion twice in one round: applied once",
      mail: (s: Setup, runId: string) => [s.event(runId, "completed"), s.event(runId, "completed")],
      check: (s: Setup, r: Round) => {
        expect(r.write.runUpdates.map((u) => u.state)).toEqual(["success"]);
        expect(s.d.stats.finished).toBe(1);
        expect(r.acks).toHaveLength(2);
      },
    },
    {
      name: "failed with attempts left: a retry after the backoff, caused by the failed run",
      row: { maxAttempts: 3 },
      mail: (s: Setup, runId: string) => [s.event(runId, "failed", { error: { message: "boom" } })],
      check: (_s: Setup, r: Round, row: TaskRow, runId: string) => {
        expect(r.write.runUpdates.map((u) => [u.state, u.error])).toEqual([["failed", "boom"]]);
        expect(row.state).toBe("retry");
        // Backoff 200 ms with half of it jittered; the jitter here draws 0.
        expect([row.nextSource, row.nextDueMs, row.nextSlotMs, row.nextCausedBy]).toEqual(["retry", T0 + 50 + 100, T0 + EVERY, runId]);
      },
    },
    {
      name: "failed, marked non-retryable: the chain ends failed although attempts are left",
      row: { maxAttempts: 3 },
      mail: (s: Setup, runId: string) => [s.event(runId, "failed", { error: { message: "bad input", nonRetryable: true } })],
      check: (_s: Setup, _r: Round, row: TaskRow) => { expect(row.state).toBe("failed"); expect(row.nextSource).toBe("rate"); },
    },
    {
      name: "started: recorded, and the run's timeout counts again from now",
      mail: (s: Setup, runId: string) => [s.event(runId, "started")],
      check: (s: Setup, r: Round, _row: TaskRow, runId: string) => {
        expect(r.write.runUpdates).toEqual([{ id: runId, startedMs: T0 + 50, executorInstance: "x1" }]);
        expect(s.d.inFlight.has(runId)).toBe(true);
      },
    },
    {
      name: "its timeout, with the events stream read past it: timed out, the place freed",
      mail: (_s: Setup, runId: string): Mail[] => [{ t: "due", items: [{ dueMs: T0 + 50, item: { k: 1, runId } }], lateMs: 0 }],
      check: (s: Setup, r: Round, row: TaskRow, runId: string) => {
        expect(r.write.runUpdates.map((u) => [u.id, u.state])).toEqual([[runId, "timed_out"]]);
        expect(s.limiter.inFlight("e")).toBe(0);
        expect(row.state).toBe("failed");
      },
    },
    {
      name: "its timeout, events not yet read past it: nothing decided; asked again once they are",
      covered: false,
      mail: (_s: Setup, runId: string): Mail[] => [{ t: "due", items: [{ dueMs: T0 + 50, item: { k: 1, runId } }], lateMs: 0 }],
      check: (s: Setup, r: Round, row: TaskRow, runId: string) => {
        expect(r.write.runUpdates).toEqual([]);
        expect(row.state).toBe("running");
        expect(s.catchUpRequests).toHaveLength(1);
        s.catchUpRequests[0]!();
        expect(s.told).toEqual([{ t: "due", items: [{ dueMs: T0 + 50, item: { k: 1, runId } }], lateMs: 0 }]);
      },
    },
  ])("$name", ({ row: o, mail, check, covered }) => {
    const s = setup({ covered: covered ?? true });
    const row = s.add(task(1, T0, o ?? {}));
    const runId = s.fireNow(row);
    s.clock.stepWall(50);
    const r = s.decide(mail(s, runId));
    check(s, r, row, runId);
  });

  it("a run whose dispatch landed late (an election, a re-publish) gets its whole timeout from the landing", () => {
    const s = setup();
    const row = s.add(task(1, T0));
    const runId = s.fireNow(row);
    s.landed.set(runId, T0 + 4900); // published at T0, landed 4.9 s later
    s.clock.stepWall(5000);
    const timeout = (): Mail => ({ t: "due", items: [{ dueMs: T0 + 5000, item: { k: 1, runId } }], lateMs: 0 });
    const r = s.decide([timeout()]);
    expect(r.write.runUpdates).toEqual([]);
    expect(s.d.inFlight.has(runId)).toBe(true);
    s.clock.stepWall(4900); // the whole timeout after the landing
    expect(s.decide([timeout()]).write.runUpdates.map((u) => u.state)).toEqual(["timed_out"]);
  });

  describe("a timeout of a run no executor reported starting waits for its dispatch's delivery", () => {
    const timeoutAt = (runId: string, at: number): Mail => ({ t: "due", items: [{ dueMs: at, item: { k: 1, runId } }], lateMs: 0 });
    /** A run fired at T0 whose message landed at stream sequence 42, at its timeout (T0 + 5 s). */
    function atTimeout() {
      const s = setup();
      const row = s.add(task(1, T0));
      const runId = s.fireNow(row);
      s.d.inFlight.get(runId)!.dispatchSeq = 42;
      s.clock.stepWall(5000);
      return { s, row, runId };
    }

    it.each([
      { name: "delivered (the consumer is past its message): timed out", seq: 42 as number | null, state: "timed_out" },
      { name: "delivered long ago: timed out", seq: 900 as number | null, state: "timed_out" },
      { name: "still in the stream: not timed out, asked again in a second", seq: 41 as number | null, state: null },
      { name: "JetStream did not answer (a leader election): not timed out, asked again in a second", seq: null, state: null },
    ])("$name", ({ seq, state }) => {
      const { s, row, runId } = atTimeout();
      const first = s.decide([timeoutAt(runId, T0 + 5000)]);
      // Asked first: nothing decided until the answer comes back as mail.
      expect(first.write.runUpdates).toEqual([]);
      expect(s.delivery.asked).toBe(1);
      s.answerDelivery(seq);
      expect(s.told).toEqual([timeoutAt(runId, T0 + 5000)]);
      const r = s.decide([s.told.pop()!]);
      if (state) {
        expect(r.write.runUpdates.map((u) => [u.id, u.state])).toEqual([[runId, state]]);
        expect(s.limiter.inFlight("e")).toBe(0);
      } else {
        expect(r.write.runUpdates).toEqual([]);
        expect(row.state).toBe("running");
        expect(s.d.inFlight.get(runId)!.ref).not.toBeNull();
        expect(s.horizon.size).toBeGreaterThan(0);
      }
    });

    it("delivered later: its timeout counts from then; delivered and still not started after that, it times out (asking afresh each time)", () => {
      const { s, runId } = atTimeout();
      s.decide([timeoutAt(runId, T0 + 5000)]);
      s.answerDelivery(10);
      s.decide([s.told.pop()!]); // undelivered: re-armed
      s.clock.stepWall(1000);
      expect(s.decide([timeoutAt(runId, T0 + 6000)]).write.runUpdates).toEqual([]);
      expect(s.delivery.asked).toBe(2);
      s.answerDelivery(42);
      // Taken since the last check: the executor may hold it (a run sent ahead) and then gives
      // its handler the whole timeout, so the shard does too, from now.
      expect(s.decide([s.told.pop()!]).write.runUpdates).toEqual([]);
      const timeoutMs = s.d.inFlight.get(runId)!.timeoutMs;
      s.clock.stepWall(timeoutMs + (s.d.inFlight.get(runId)!.holdMs ?? 0));
      expect(s.decide([timeoutAt(runId, s.clock.now())]).write.runUpdates).toEqual([]);
      expect(s.delivery.asked).toBe(3);
      s.answerDelivery(42);
      expect(s.decide([s.told.pop()!]).write.runUpdates.map((u) => u.state)).toEqual(["timed_out"]);
    });

    it("never delivered: times out once the grace past its timeout is over", () => {
      const { s, runId } = atTimeout();
      let at = T0 + 5000;
      for (let i = 0; ; i++) {
        expect(i).toBeLessThan(UNDELIVERED_GRACE_MS / 1000 + 3);
        const r = s.decide([timeoutAt(runId, at)]);
        if (r.write.runUpdates.length) { expect(r.write.runUpdates.map((u) => u.state)).toEqual(["timed_out"]); break; }
        s.answerDelivery(null);
        const again = s.decide([s.told.pop()!]);
        if (again.write.runUpdates.length) { expect(again.write.runUpdates.map((u) => u.state)).toEqual(["timed_out"]); break; }
        s.clock.stepWall(1000); at += 1000;
      }
      expect(s.clock.now() - (T0 + 5000)).toBeGreaterThanOrEqual(UNDELIVERED_GRACE_MS);
      expect(s.clock.now() - (T0 + 5000)).toBeLessThan(UNDELIVERED_GRACE_MS + 2000);
    });

    it("a grace of 0 (AX_DELIVERY_GRACE=0s): times out without asking", () => {
      const s = setup({ deliveryGraceMs: 0 });
      const row = s.add(task(1, T0));
      const runId = s.fireNow(row);
      s.d.inFlight.get(runId)!.dispatchSeq = 42;
      s.clock.stepWall(5000);
      expect(s.decide([timeoutAt(runId, T0 + 5000)]).write.runUpdates.map((u) => u.state)).toEqual(["timed_out"]);
      expect(s.delivery.asked).toBe(0);
    });

    it("started (the executor has it): times out without asking", () => {
      const { s, runId } = atTimeout();
      s.decide([s.event(runId, "started")]);
      s.clock.stepWall(5000);
      expect(s.decide([timeoutAt(runId, T0 + 10_000)]).write.runUpdates.map((u) => u.state)).toEqual(["timed_out"]);
      expect(s.delivery.asked).toBe(0);
    });

    it("its message's place unknown (adopted at load, not re-published): times out without asking", () => {
      const { s, runId } = atTimeout();
      delete s.d.inFlight.get(runId)!.dispatchSeq;
      expect(s.decide([timeoutAt(runId, T0 + 5000)]).write.runUpdates.map((u) => u.state)).toEqual(["timed_out"]);
      expect(s.delivery.asked).toBe(0);
    });
  });

  it("a run whose task is gone times out without it (the actor found no row)", () => {
    const s = setup();
    const row = s.add(task(1, T0));
    const runId = s.fireNow(row);
    s.d.live.delete(1);
    s.clock.stepWall(6000);
    const r = s.decide([{ t: "due", items: [{ dueMs: T0 + 5000, item: { k: 1, runId } }], lateMs: 0 }]);
    expect(r.write.runUpdates.map((u) => u.state)).toEqual(["timed_out"]);
    expect(r.write.taskUpdates).toEqual([]);
    expect(s.seen.finished).toEqual([{ state: "timed_out", final: true }]);
  });

  it("a late completion of a run already timed out is recorded on the run; the task does not move", () => {
    const s = setup();
    const row = s.add(task(1, T0, { maxAttempts: 3 }));
    const runId = s.fireNow(row);
    s.clock.stepWall(6000);
    s.decide([{ t: "due", items: [{ dueMs: T0 + 5000, item: { k: 1, runId } }], lateMs: 0 }]);
    const before = { state: row.state, next: row.nextDueMs };
    const r = s.decide([s.event(runId, "completed")]);
    expect(r.write.runUpdates.map((u) => u.lateOutcome)).toEqual(["success"]);
    expect({ state: row.state, next: row.nextDueMs }).toEqual(before);
  });
});

describe("shard decisions: commands", () => {
  it.each([
    {
      name: "pause before the due time withdraws the run recorded ahead; the slot counts as not fired",
      run: (s: Setup, row: TaskRow) => {
        s.clock.stepWall(-80); // decided in the lead window
        const runId = s.fireNow(row);
        s.withdrawable.add(runId);
        const r = s.decide([s.cmd({ type: "pause", taskId: 1 })]);
        expect(r.write.runUpdates.map((u) => [u.id, u.state])).toEqual([[runId, "refused"]]);
        expect(r.write.runUpdates[0]!.error).toMatch(/^withdrawn before dispatch: the task was paused/);
        expect(row.state).toBe("paused");
        expect(row.nextDueMs).toBeNull();
        expect(row.triggerSlots["11"]).toBe(T0 - EVERY); // given back
        expect(s.limiter.inFlight("e")).toBe(0);
        expect(s.replies).toEqual([{ ok: true, value: { state: "paused" } }]);
      },
    },
    {
      name: "pause after the release: the run goes on; the task is paused after it",
      run: (s: Setup, row: TaskRow) => {
        const runId = s.fireNow(row);
        const r = s.decide([s.cmd({ type: "pause", taskId: 1 })]);
        expect(r.write.runUpdates).toEqual([]);
        expect(s.d.inFlight.has(runId)).toBe(true);
        expect(row.nextDueMs).toBeNull();
      },
    },
    {
      name: "a manual run at a full executor is refused to the caller and recorded refused; nothing runs later on its own, the task is as it was",
      limit: 1,
      run: (s: Setup, row: TaskRow) => {
        s.limiter.force("e");
        const before = { state: row.state, record: structuredClone(row.record), nextDueMs: row.nextDueMs, nextSource: row.nextSource, slots: { ...row.triggerSlots } };
        const r = s.decide([s.cmd({ type: "run", taskId: 1, force: false })]);
        expect(r.write.runInserts.map((x) => [x.state, x.source])).toEqual([["refused", "manual"]]);
        expect(r.write.runInserts[0]!.error).toMatch(/nothing was run, try again later$/);
        expect(s.replies).toHaveLength(1);
        expect(s.replies[0]).toMatchObject({ ok: false, error: { code: "AX_E_UNAVAILABLE", field: "executor", value: "e" } });
        // Told "refused", a caller may try again: had ax retried it too, that was two runs.
        expect([row.state, row.record, row.nextDueMs, row.nextSource, row.triggerSlots]).toEqual([before.state, before.record, before.nextDueMs, before.nextSource, before.slots]);
        expect(r.touched.has(1)).toBe(false);
        s.limiter.release("e");
        s.clock.advance(2 * EVERY);
        const later = s.decide([]);
        expect(later.write.runInserts).toEqual([]);
      },
    },
    {
      name: "a manual run while one is in flight (overlap=forbid) is refused with the running run",
      run: (s: Setup, row: TaskRow) => {
        const runId = s.fireNow(row);
        const r = s.decide([s.cmd({ type: "run", taskId: 1, force: false })]);
        expect(r.write.runInserts).toEqual([]);
        expect(s.replies[0]).toMatchObject({ ok: false, error: { code: "AX_E_TASK_RUNNING", value: { runId } } });
      },
    },
    {
      name: "an update made against an older generation is refused and changes nothing",
      run: (s: Setup, row: TaskRow) => {
        const r = s.decide([s.cmd({ type: "update", taskId: 1, change: { expectGeneration: 4, fields: { timeoutMs: 1 }, summary: {}, who: "t" } as never })]);
        expect(r.write.defUpdates ?? []).toEqual([]);
        expect(row.timeoutMs).toBe(5000);
        expect(s.replies[0]).toMatchObject({ ok: false, error: { code: "AX_E_CONFLICT" } });
      },
    },
    {
      name: "a command on the lease's last breath is refused as unavailable",
      canFire: false,
      run: (s: Setup) => {
        s.decide([s.cmd({ type: "pause", taskId: 1 })], { canFire: false });
        expect(s.replies[0]).toMatchObject({ ok: false, error: { code: "AX_E_UNAVAILABLE" } });
      },
    },
    {
      name: "cancel of a task not here is done; pause of one is not found",
      run: (s: Setup) => {
        s.decide([s.cmd({ type: "cancel", taskId: 99 }), s.cmd({ type: "pause", taskId: 98 })]);
        expect(s.replies[0]).toEqual({ ok: true });
        expect(s.replies[1]).toMatchObject({ ok: false, error: { code: "AX_E_NOT_FOUND", value: 98 } });
      },
    },
    {
      name: "a backfill of a slot PostgreSQL already holds answers with that run and fires nothing",
      run: (s: Setup) => {
        const id = backfillRunId({ taskId: 1, slotMs: T0 - 7 * EVERY });
        const r = s.decide([s.cmd({ type: "backfill", taskId: 1, triggerId: 11, slotMs: T0 - 7 * EVERY, reason: "b" })], { recorded: new Set([id]) });
        expect(r.write.runInserts).toEqual([]);
        expect(s.replies).toEqual([{ ok: true, value: { runId: id, existed: true } }]);
      },
    },
    {
      name: "a backfill of a new slot fires under its derived id and leaves the cadence alone",
      run: (s: Setup, row: TaskRow) => {
        const id = backfillRunId({ taskId: 1, slotMs: T0 - 7 * EVERY });
        const r = s.decide([s.cmd({ type: "backfill", taskId: 1, triggerId: 11, slotMs: T0 - 7 * EVERY, reason: "b" })]);
        expect(r.write.runInserts.map((x) => [x.id, x.source, x.slotMs])).toEqual([[id, "backfill", T0 - 7 * EVERY]]);
        expect(row.nextDueMs).toBe(T0);
        expect(s.replies).toEqual([{ ok: true, value: { runId: id } }]);
      },
    },
    {
      name: "resumed while a forced run of the paused task is in flight: the run's end brings the schedule back",
      run: (s: Setup, row: TaskRow) => {
        s.decide([s.cmd({ type: "pause", taskId: 1 })]);
        expect(row.nextDueMs).toBeNull();
        const r = s.decide([s.cmd({ type: "run", taskId: 1, force: true })]);
        const runId = r.write.runInserts[0]!.id;
        expect(row.state).toBe("running");
        s.decide([s.cmd({ type: "resume", taskId: 1 })]);
        expect([row.state, row.nextDueMs, (row.record as TaskRecord).context.pausedAfterRun]).toEqual(["running", null, false]);
        s.decide([s.event(runId, "completed")]);
        // Not paused again, and not left without a pointer: the run's end schedules the next slot.
        expect(row.state).toBe("success");
        expect(row.nextDueMs).not.toBeNull();
        expect(s.horizon.dueOf(1)).toBe(row.nextDueMs);
      },
    },
  ])("$name", ({ run, limit }) => {
    const s = setup(limit !== undefined ? { limit } : {});
    const row = s.add(task(1, T0));
    run(s, row);
  });
});

describe("shard decisions: dependency triggers", () => {
  const trig = (o: Partial<DependencyTrigger> = {}): DependencyTrigger => ({ v: 1, kind: "due", taskId: 1, key: "up:r1", upstreamRuns: ["r1"], reason: "upstream r1 succeeded", at: T0, ...o });

  it.each([
    { name: "fires once under the id derived from its key, and is acked", recorded: false, inFlight: false, runs: 1, acked: 1, naked: 0 },
    { name: "already recorded (redelivered): acked, nothing fired", recorded: true, inFlight: false, runs: 0, acked: 1, naked: 0 },
    { name: "its task has a run in flight (overlap=forbid): held, neither acked nor nak'ed (see below)", recorded: false, inFlight: true, runs: 0, acked: 0, naked: 0 },
  ])("$name", ({ recorded, inFlight, runs, acked, naked }) => {
    const s = setup();
    const row = s.add(task(1, T0 + 60_000, { triggers: [] , nextSource: null, nextTriggerId: null, nextSlotMs: null, triggerSlots: {} }));
    if (inFlight) s.decide([s.cmd({ type: "run", taskId: 1, force: false })]);
    const t = trig();
    const r = s.decide([{ t: "trigger", trig: t, msg: s.msg }], { recorded: recorded ? new Set([dependencyRunId(t)]) : NONE_RECORDED });
    expect(r.write.runInserts.filter((x) => x.source === "dependency").map((x) => x.id)).toEqual(runs ? [dependencyRunId(t)] : []);
    expect(r.acks.length).toBe(acked);
    expect(r.naks.length).toBe(naked);
    expect(row.nextDueMs).toBe(T0 + 60_000); // its own schedule is not moved by the trigger
  });

  it("waiting for its task's run (overlap=forbid): held, neither acked nor handed back; the run's end fires it and acks it", () => {
    const s = setup();
    const row = s.add(task(1, T0 + 60_000, { triggers: [], nextSource: null, nextTriggerId: null, nextSlotMs: null, triggerSlots: {} }));
    s.decide([s.cmd({ type: "run", taskId: 1, force: false })]);
    const running = [...s.d.inFlight.keys()][0]!;
    const t = trig();
    let r = s.decide([{ t: "trigger", trig: t, msg: s.msg }]);
    expect([r.acks.length, r.naks.length, r.write.runInserts.length]).toEqual([0, 0, 0]);
    expect(s.d.heldTriggerMessages()).toEqual([s.msg]);
    // Rounds about other things leave it held.
    s.clock.advance(30_000);
    r = s.decide([s.event(running, "started")]);
    expect([r.acks.length, r.naks.length]).toEqual([1, 0]); // (the event's)
    expect(s.d.heldTriggerMessages()).toHaveLength(1);
    r = s.decide([s.event(running, "completed")]);
    expect(r.write.runInserts.map((x) => [x.id, x.source, x.upstreamRuns])).toEqual([[dependencyRunId(t), "dependency", ["r1"]]]);
    expect(r.acks).toHaveLength(2); // the event's and the trigger's
    expect(s.d.heldTriggerMessages()).toEqual([]);
    expect(row.state).toBe("running");
  });

  it("two triggers held for one run: the first fires when it ends, the second waits for that run in turn", () => {
    const s = setup();
    s.add(task(1, T0 + 60_000, { triggers: [], nextSource: null, nextTriggerId: null, nextSlotMs: null, triggerSlots: {} }));
    s.decide([s.cmd({ type: "run", taskId: 1, force: false })]);
    const first = [...s.d.inFlight.keys()][0]!;
    const t1 = trig(); const t2 = trig({ key: "up:r2", upstreamRuns: ["r2"] });
    s.decide([{ t: "trigger", trig: t1, msg: s.msg }, { t: "trigger", trig: t2, msg: s.msg }]);
    expect(s.d.heldTriggerMessages()).toHaveLength(2);
    let r = s.decide([s.event(first, "completed")]);
    expect(r.write.runInserts.map((x) => x.id)).toEqual([dependencyRunId(t1)]);
    expect(s.d.heldTriggerMessages()).toHaveLength(1);
    r = s.decide([s.event(dependencyRunId(t1), "completed")]);
    expect(r.write.runInserts.map((x) => x.id)).toEqual([dependencyRunId(t2)]);
    expect(s.d.heldTriggerMessages()).toEqual([]);
  });

  it("a paused task holds its trigger until it is resumed; a cancelled one drops it (acked, nothing runs)", () => {
    const s = setup();
    const row = s.add(task(1, T0 + 60_000));
    s.decide([s.cmd({ type: "pause", taskId: 1 })]);
    const t = trig();
    let r = s.decide([{ t: "trigger", trig: t, msg: s.msg }]);
    expect([r.acks.length, r.naks.length, r.write.runInserts.length]).toEqual([0, 0, 0]);
    r = s.decide([s.cmd({ type: "resume", taskId: 1 })]);
    expect(r.write.runInserts.map((x) => [x.id, x.source])).toEqual([[dependencyRunId(t), "dependency"]]);
    expect(r.acks).toHaveLength(1);
    expect(row.state).toBe("running");

    const s2 = setup();
    s2.add(task(1, T0 + 60_000));
    s2.decide([s2.cmd({ type: "pause", taskId: 1 })]);
    s2.decide([{ t: "trigger", trig: t, msg: s2.msg }]);
    r = s2.decide([s2.cmd({ type: "cancel", taskId: 1 })]);
    expect(r.write.runInserts).toEqual([]);
    expect(r.acks).toHaveLength(1);
    expect(s2.d.heldTriggerMessages()).toEqual([]);
  });

  it("its executor full: held for a place in due order, the task's schedule untouched; the freed place fires it with its lineage", () => {
    const s = setup({ limit: 1 });
    const row = s.add(task(1, T0 + 60_000));
    s.limiter.force("e");
    const t = trig();
    let r = s.decide([{ t: "trigger", trig: t, msg: s.msg }]);
    expect([r.acks.length, r.naks.length, r.write.runInserts.length]).toEqual([0, 0, 0]);
    expect([row.state, row.nextDueMs, row.nextSource]).toEqual(["pending", T0 + 60_000, "rate"]);
    expect(s.d.triggersWaitingForPlace.get(dependencyRunId(t))).toBe("e");
    // Rounds meanwhile do not take it out of the queue, nor give it a place ahead of it.
    r = s.decide([s.cmd({ type: "load", taskId: 1 })]);
    expect(r.write.runInserts).toEqual([]);
    expect(s.limiter.waiting("e")).toBe(1);
    s.limiter.release("e");
    expect(s.told).toEqual([{ t: "wake" }]);
    expect(s.limiter.inFlight("e")).toBe(1); // the place is the trigger's
    r = s.decide(s.told.splice(0));
    expect(r.write.runInserts.map((x) => [x.id, x.source, x.state, x.upstreamRuns])).toEqual([[dependencyRunId(t), "dependency", "running", ["r1"]]]);
    expect(r.acks).toHaveLength(1);
    expect(s.limiter.inFlight("e")).toBe(1);
    expect(s.d.triggerPlaces.size + s.d.triggersWaitingForPlace.size).toBe(0);
    expect(row.nextDueMs).toBe(T0 + 60_000);
  });

  it("held for a place, then its task is cancelled: dropped, and the place it was given goes back", () => {
    const s = setup({ limit: 1 });
    s.add(task(1, T0 + 60_000));
    s.limiter.force("e");
    s.decide([{ t: "trigger", trig: trig(), msg: s.msg }]);
    s.limiter.release("e"); // given to the trigger, its mail not decided yet
    const r = s.decide([s.cmd({ type: "cancel", taskId: 1 }), ...s.told.splice(0)]);
    expect(r.write.runInserts).toEqual([]);
    expect(r.acks).toHaveLength(1);
    expect(s.limiter.inFlight("e")).toBe(0);
    expect(s.d.triggerPlaces.size + s.d.triggersWaitingForPlace.size).toBe(0);
  });

  it("held for a place, then paused: the place it is given goes back at once; resumed, it takes a free one and runs", () => {
    const s = setup({ limit: 1 });
    const row = s.add(task(1, T0 + 60_000));
    s.limiter.force("e");
    const t = trig();
    s.decide([{ t: "trigger", trig: t, msg: s.msg }]);
    s.decide([s.cmd({ type: "pause", taskId: 1 })]);
    s.limiter.release("e");
    let r = s.decide(s.told.splice(0));
    expect(r.write.runInserts).toEqual([]);
    expect(s.limiter.inFlight("e")).toBe(0); // not kept by a paused task
    expect(s.d.heldTriggerMessages()).toHaveLength(1);
    r = s.decide([s.cmd({ type: "resume", taskId: 1 })]);
    expect(r.write.runInserts.map((x) => [x.id, x.source])).toEqual([[dependencyRunId(t), "dependency"]]);
    expect(s.limiter.inFlight("e")).toBe(1);
    expect(row.state).toBe("running");
  });

  it("held triggers go back to JetStream when the shard stops (dropInFlight), for the next owner", () => {
    const s = setup();
    s.add(task(1, T0 + 60_000));
    s.decide([s.cmd({ type: "pause", taskId: 1 })]);
    s.decide([{ t: "trigger", trig: trig(), msg: s.msg }]);
    const naked = s.acks.naked;
    s.d.dropInFlight();
    expect(s.acks.naked).toBe(naked + 1);
    expect(s.d.heldTriggerMessages()).toEqual([]);
  });

  it("upstream_failed marks the task and passes the outcome on to its downstreams", () => {
    const s = setup();
    const row = s.add(task(1, T0 + 60_000, { hasDownstreams: true }));
    const r = s.decide([{ t: "trigger", trig: trig({ kind: "upstream_failed", reason: "r1 failed" }), msg: s.msg }]);
    expect(row.state).toBe("upstream_failed");
    expect(r.outcomes.map((o) => [o.taskId, o.outcome])).toEqual([[1, "upstream_failed"]]);
    expect(r.acks).toHaveLength(1);
  });
});

describe("shard decisions: a poisoned task", () => {
  it("a schedule that cannot be computed pauses that task only; the round goes on for the others", () => {
    const s = setup();
    const bad = s.add(task(1, T0, { triggers: [{ id: 11, kind: "cron", spec: { kind: "cron", expr: "not a cron", tz: "UTC" }, enabled: true }], nextSource: "cron" }));
    const good = s.add(task(2, T0));
    s.onWheel(bad);
    s.onWheel(good);
    const r = s.decide([s.due(bad), s.due(good)]);
    expect(bad.state).toBe("paused");
    expect(String((bad.record as TaskRecord).context.lastError)).toMatch(/^schedule stuck: /);
    expect(s.d.stats.stuck).toBe(1);
    expect(r.write.runInserts.filter((x) => x.taskId === 2).map((x) => x.state)).toEqual(["running"]);
    expect(good.nextDueMs).toBe(T0 + EVERY);
  });
});
