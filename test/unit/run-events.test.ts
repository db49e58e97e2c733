import { describe, expect, it } from "vitest";
import { decideEvent, type EventContext, type EventDecision } from "../../actors/shard/runEvents.ts";
import type { RunEvent } from "../../protocol/index.ts";

/**
 * The shard's handling of an executor's event, as a table: every event type against a run in
 * flight or not, an end already applied or not, and a token that matches or not. The actor only
 * carries out what decideEvent says (actors/shard/decide.ts, onEvents).
 */
const runId = "r1";
const ev = (type: RunEvent["type"], extra: Partial<RunEvent> = {}): RunEvent => ({ type, runId, taskId: 7, at: 1000, ...extra });
const ctx = (over: Partial<EventContext> = {}): EventContext => ({ inFlight: true, tokenOk: true, endApplied: false, instance: "i1", ...over });

const cases: Array<{ name: string; ev: RunEvent; ctx: EventContext; want: EventDecision }> = [
  // A forgery changes nothing, whatever the run's state.
  ...(["started", "progress", "completed", "failed", "stale"] as const).flatMap((t) => [true, false].map((inFlight) => ({
    name: `${t}, ${inFlight ? "in flight" : "not in flight"}, wrong token: refused`, ev: ev(t), ctx: ctx({ inFlight, tokenOk: false }), want: { refuse: true } as EventDecision,
  }))),
  { name: "started, in flight: recorded, timeout renewed, start noted", ev: ev("started"), ctx: ctx(),
    want: { runUpdate: { startedMs: 1000, executorInstance: "i1" }, extend: true, startedMs: 1000 } },
  { name: "started, not in flight (timed out meanwhile): the start is still recorded", ev: ev("started"), ctx: ctx({ inFlight: false }),
    want: { runUpdate: { startedMs: 1000, executorInstance: "i1" } } },
  { name: "progress, in flight: timeout renewed, no row change", ev: ev("progress"), ctx: ctx(), want: { extend: true } },
  { name: "progress, not in flight: nothing", ev: ev("progress"), ctx: ctx({ inFlight: false }), want: {} },
  { name: "completed, in flight: success", ev: ev("completed"), ctx: ctx(),
    want: { finish: { event: { type: "SUCCEEDED", runId }, update: { finishedMs: 1000, state: "success" } } } },
  { name: "completed carrying its start and a result, in flight", ev: ev("completed", { startedAt: 990, result: { code: 200 } }), ctx: ctx(),
    want: { finish: { event: { type: "SUCCEEDED", runId }, update: { finishedMs: 1000, state: "success", startedMs: 990, executorInstance: "i1", result: { code: 200 } } } } },
  { name: "failed, in flight: failed with the executor's message", ev: ev("failed", { error: { message: "boom", type: "Error" } }), ctx: ctx(),
    want: { finish: { event: { type: "FAILED", runId, error: "boom" }, update: { finishedMs: 1000, state: "failed", error: "boom" } } } },
  { name: "failed non-retryable, in flight: the machine is told not to retry", ev: ev("failed", { error: { message: "bad input", type: "Error", nonRetryable: true } }), ctx: ctx(),
    want: { finish: { event: { type: "FAILED", runId, error: "bad input", retryable: false }, update: { finishedMs: 1000, state: "failed", error: "bad input" } } } },
  { name: "failed without a message, in flight", ev: ev("failed"), ctx: ctx(),
    want: { finish: { event: { type: "FAILED", runId, error: "failed" }, update: { finishedMs: 1000, state: "failed", error: "failed" } } } },
  { name: "completed, not in flight (timed out before): a late outcome, the task does not move", ev: ev("completed", { startedAt: 990 }), ctx: ctx({ inFlight: false }),
    want: { runUpdate: { lateOutcome: "success", executorInstance: "i1", startedMs: 990 } } },
  { name: "failed, not in flight: a late failure", ev: ev("failed", { error: { message: "boom", type: "Error" } }), ctx: ctx({ inFlight: false }),
    want: { runUpdate: { lateOutcome: "failed: boom", executorInstance: "i1" } } },
  { name: "completed again after its end was applied (redelivered): nothing", ev: ev("completed"), ctx: ctx({ inFlight: false, endApplied: true }), want: {} },
  { name: "failed again after its end was applied: nothing", ev: ev("failed"), ctx: ctx({ inFlight: false, endApplied: true }), want: {} },
  { name: "stale, in flight: recorded stale, the task goes on as after a timeout", ev: ev("stale", { reason: "expired" }), ctx: ctx(),
    want: { finish: { event: { type: "TIMED_OUT", runId }, update: { finishedMs: 1000, state: "stale", error: "not run by executor i1: expired" } } } },
  { name: "stale, not in flight: a late note on the run", ev: ev("stale"), ctx: ctx({ inFlight: false }), want: { runUpdate: { lateOutcome: "stale: stale" } } },
  { name: "stale again after its end was applied: nothing", ev: ev("stale", { reason: "x" }), ctx: ctx({ inFlight: false, endApplied: true }), want: {} },
];

describe("decideEvent", () => {
  it.each(cases)("$name", ({ ev: e, ctx: c, want }) => {
    expect(decideEvent(e, c)).toEqual(want);
  });

  it("covers every event type with a run in flight and without", () => {
    const seen = new Set(cases.filter((c) => c.ctx.tokenOk).map((c) => `${c.ev.type}:${c.ctx.inFlight}`));
    for (const t of ["started", "progress", "completed", "failed", "stale"]) for (const f of [true, false]) expect(seen.has(`${t}:${f}`), `${t}, in flight ${f}`).toBe(true);
  });

  it("an end only finishes a run in flight, and never twice", () => {
    for (const t of ["completed", "failed", "stale"] as const) {
      expect("finish" in decideEvent(ev(t), ctx({ inFlight: false }))).toBe(false);
      expect(decideEvent(ev(t), ctx({ inFlight: false, endApplied: true }))).toEqual({});
    }
  });
});
