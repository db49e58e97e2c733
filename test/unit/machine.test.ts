import { describe, expect, it } from "vitest";
import { AxError } from "../../common/index.ts";
import {
  TASK_EVENT_TYPES,
  TASK_STATES,
  applyEvent,
  initialRecord,
  isIdle,
  packIdle,
  taskMachine,
  unpackIdle,
  type TaskContext,
  type TaskEvent,
  type TaskEventType,
  type TaskRecord,
  type TaskState,
  type TransitionResult,
} from "../../actors/machine/index.ts";

function rec(value: TaskState, ctx: Partial<TaskContext> = {}): TaskRecord {
  return {
    value,
    context: {
      attempt: 1,
      maxAttempts: 3,
      overlap: "forbid",
      inFlight: [],
      lastRunId: "r0",
      lastError: null,
      pausedAfterRun: false,
      ...ctx,
    },
  };
}

function ok(r: TransitionResult): TaskRecord {
  if (!r.ok) throw new Error(`expected ok, got ${r.code}: ${r.reason}`);
  return r.record;
}

/** Apply events in order, each must be accepted. */
function run(start: TaskRecord, ...events: TaskEvent[]): TaskRecord {
  return events.reduce((r, e) => ok(applyEvent(r, e)), start);
}

function deepFreeze<T>(o: T): T {
  if (o !== null && typeof o === "object") {
    for (const v of Object.values(o)) deepFreeze(v);
    Object.freeze(o);
  }
  return o;
}

const fire = (runId: string, source: TaskEvent & { type: "FIRE" } extends { source: infer S } ? S : never = "cron", force?: boolean): TaskEvent =>
  force === undefined ? { type: "FIRE", runId, source } : { type: "FIRE", runId, source, force };

/** The canonical event of each type; completions name run "r1". */
function eventOf(type: TaskEventType): TaskEvent {
  switch (type) {
    case "FIRE":
      return { type, runId: "r-new", source: "cron" };
    case "SUCCEEDED":
      return { type, runId: "r1" };
    case "FAILED":
      return { type, runId: "r1", error: "boom" };
    case "TIMED_OUT":
      return { type, runId: "r1" };
    case "REFUSED":
      return { type, runId: "r1", reason: "executor full" };
    case "UPSTREAM_FAILED":
      return { type, upstreamRunId: "u1", reason: "upstream u failed" };
    default:
      return { type };
  }
}

describe("initialRecord", () => {
  it("builds a pending record with nothing in flight", () => {
    expect(initialRecord({ maxAttempts: 3, overlap: "allow" })).toEqual({
      value: "pending",
      context: { attempt: 0, maxAttempts: 3, overlap: "allow", inFlight: [], lastRunId: null, lastError: null, pausedAfterRun: false },
    });
  });
  it("refuses bad input with a field", () => {
    expect(() => initialRecord({ maxAttempts: 0, overlap: "forbid" })).toThrow(AxError);
    expect(() => initialRecord({ maxAttempts: 1.5, overlap: "forbid" })).toThrow(/maxAttempts/);
    expect(() => initialRecord({ maxAttempts: 1, overlap: "sometimes" as "allow" })).toThrow(/overlap/);
  });
  it("the machine knows exactly the task states", () => {
    expect(Object.keys(taskMachine.root.states).sort()).toEqual([...TASK_STATES].sort());
    expect(taskMachine.config.initial).toBe("pending");
  });
});

/**
 * The cross product: every fixture state x every event type, against the expected-legal
 * table (the target state of each legal event; absent = refused).
 */
const FIXTURES: { name: string; record: TaskRecord; legal: Partial<Record<TaskEventType, TaskState>>; running?: TaskEventType[] }[] = [
  { name: "pending", record: rec("pending", { attempt: 0, lastRunId: null }), legal: { FIRE: "running", PAUSE: "paused", CANCEL: "cancelled", UPSTREAM_FAILED: "upstream_failed" } },
  {
    name: "running (forbid)",
    record: rec("running", { inFlight: ["r1"], lastRunId: "r1" }),
    legal: { SUCCEEDED: "success", FAILED: "retry", TIMED_OUT: "retry", REFUSED: "retry", PAUSE: "paused", CANCEL: "cancelled" },
    running: ["FIRE"],
  },
  {
    name: "running (allow)",
    record: rec("running", { overlap: "allow", inFlight: ["r1"], lastRunId: "r1" }),
    legal: { FIRE: "running", SUCCEEDED: "success", FAILED: "retry", TIMED_OUT: "retry", REFUSED: "retry", PAUSE: "paused", CANCEL: "cancelled" },
  },
  {
    name: "running (forced from paused)",
    record: rec("running", { inFlight: ["r1"], lastRunId: "r1", pausedAfterRun: true }),
    legal: { SUCCEEDED: "paused", FAILED: "paused", TIMED_OUT: "paused", REFUSED: "paused", PAUSE: "paused", RESUME: "running", CANCEL: "cancelled" },
    running: ["FIRE"],
  },
  { name: "success", record: rec("success"), legal: { FIRE: "running", PAUSE: "paused", CANCEL: "cancelled", UPSTREAM_FAILED: "upstream_failed" } },
  { name: "failed", record: rec("failed", { attempt: 3, lastError: "boom" }), legal: { FIRE: "running", PAUSE: "paused", CANCEL: "cancelled", UPSTREAM_FAILED: "upstream_failed" } },
  { name: "retry", record: rec("retry", { lastError: "boom" }), legal: { FIRE: "running", PAUSE: "paused", CANCEL: "cancelled", UPSTREAM_FAILED: "upstream_failed" } },
  { name: "paused (idle)", record: rec("paused"), legal: { PAUSE: "paused", RESUME: "pending", CANCEL: "cancelled" } },
  {
    name: "paused (run in flight)",
    record: rec("paused", { inFlight: ["r1"], lastRunId: "r1" }),
    legal: { SUCCEEDED: "paused", FAILED: "paused", TIMED_OUT: "paused", REFUSED: "paused", PAUSE: "paused", RESUME: "running", CANCEL: "cancelled" },
  },
  { name: "cancelled (idle)", record: rec("cancelled"), legal: {} },
  {
    name: "cancelled (run in flight)",
    record: rec("cancelled", { inFlight: ["r1"], lastRunId: "r1" }),
    legal: { SUCCEEDED: "cancelled", FAILED: "cancelled", TIMED_OUT: "cancelled", REFUSED: "cancelled" },
  },
  { name: "upstream_failed", record: rec("upstream_failed", { lastError: "upstream" }), legal: { FIRE: "running", PAUSE: "paused", CANCEL: "cancelled" } },
];

describe("state x event cross product", () => {
  it("covers every state", () => {
    expect(new Set(FIXTURES.map((f) => f.record.value))).toEqual(new Set(TASK_STATES));
  });
  const cases = FIXTURES.flatMap((f) => TASK_EVENT_TYPES.map((type) => [f.name, type, f] as const));
  it.each(cases)("%s + %s", (_name, type, f) => {
    const record = deepFreeze(structuredClone(f.record));
    const before = JSON.stringify(record);
    const r = applyEvent(record, eventOf(type));
    const to = f.legal[type];
    if (to !== undefined) {
      expect(r).toMatchObject({ ok: true, from: f.record.value, to });
      expect(ok(r).value).toBe(to);
    } else if (f.running?.includes(type)) {
      expect(r).toEqual({ ok: false, code: "AX_E_TASK_RUNNING", reason: expect.stringContaining(`event ${type} not allowed in state ${f.record.value}`), runningRunId: "r1" });
    } else {
      expect(r).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION" });
      expect(r.ok === false && r.reason).toMatch(new RegExp(`^event ${type} not allowed in state ${f.record.value}`));
      expect(r.ok === false && r.runningRunId).toBeUndefined();
    }
    expect(JSON.stringify(record)).toBe(before);
  });
});

/** What the canonical completion event (attempt 1 in flight, last run) does to the context. */
function completionCtx(t: "SUCCEEDED" | "FAILED" | "TIMED_OUT" | "REFUSED"): Partial<TaskContext> {
  if (t === "SUCCEEDED") return { lastError: null };
  if (t === "FAILED") return { lastError: "boom" };
  if (t === "TIMED_OUT") return { lastError: "timed out" };
  return { attempt: 0 }; // the refused dispatch gives its attempt back
}

/** Every row of the machine's transition table, with the context it must produce. */
describe("legal transitions", () => {
  const rows: { name: string; from: TaskRecord; event: TaskEvent; to: TaskState; ctx: Partial<TaskContext> }[] = [
    // FIRE
    ...(["pending", "success", "failed", "upstream_failed"] as const).map((s) => ({
      name: `${s} FIRE cron -> running, new chain`,
      from: rec(s, { attempt: 2, lastError: "x" }),
      event: fire("r9"),
      to: "running" as const,
      ctx: { attempt: 1, inFlight: ["r9"], lastRunId: "r9", lastError: "x" },
    })),
    { name: "failed FIRE source retry -> attempt + 1", from: rec("failed", { attempt: 1 }), event: fire("r9", "retry"), to: "running", ctx: { attempt: 2, inFlight: ["r9"], lastRunId: "r9" } },
    { name: "retry FIRE retry -> attempt + 1", from: rec("retry", { attempt: 1 }), event: fire("r9", "retry"), to: "running", ctx: { attempt: 2, inFlight: ["r9"], lastRunId: "r9" } },
    { name: "retry FIRE cron -> still attempt + 1", from: rec("retry", { attempt: 1 }), event: fire("r9", "cron"), to: "running", ctx: { attempt: 2, inFlight: ["r9"], lastRunId: "r9" } },
    { name: "running(allow) FIRE -> running, inFlight grows", from: rec("running", { overlap: "allow", inFlight: ["r1"] }), event: fire("r2", "manual"), to: "running", ctx: { attempt: 1, inFlight: ["r1", "r2"], lastRunId: "r2" } },
    { name: "paused FIRE force -> running, back to paused after", from: rec("paused", { attempt: 3 }), event: fire("r9", "manual", true), to: "running", ctx: { attempt: 1, inFlight: ["r9"], lastRunId: "r9", pausedAfterRun: true } },
    // completions in running
    { name: "running SUCCEEDED last -> success", from: rec("running", { inFlight: ["r1"], lastError: "old" }), event: { type: "SUCCEEDED", runId: "r1" }, to: "success", ctx: { inFlight: [], lastError: null } },
    { name: "running SUCCEEDED not last -> running", from: rec("running", { overlap: "allow", inFlight: ["r1", "r2"] }), event: { type: "SUCCEEDED", runId: "r1" }, to: "running", ctx: { inFlight: ["r2"] } },
    { name: "running FAILED attempts left -> retry", from: rec("running", { inFlight: ["r1"] }), event: { type: "FAILED", runId: "r1", error: "boom" }, to: "retry", ctx: { attempt: 1, inFlight: [], lastError: "boom" } },
    { name: "running FAILED retryable:false -> failed", from: rec("running", { inFlight: ["r1"] }), event: { type: "FAILED", runId: "r1", error: "bad", retryable: false }, to: "failed", ctx: { inFlight: [], lastError: "bad" } },
    { name: "running FAILED last attempt -> failed", from: rec("running", { attempt: 3, inFlight: ["r1"] }), event: { type: "FAILED", runId: "r1", error: "boom" }, to: "failed", ctx: { attempt: 3, inFlight: [], lastError: "boom" } },
    { name: "running FAILED not last -> running", from: rec("running", { overlap: "allow", inFlight: ["r1", "r2"] }), event: { type: "FAILED", runId: "r2", error: "boom" }, to: "running", ctx: { inFlight: ["r1"], lastError: "boom" } },
    { name: "running TIMED_OUT attempts left -> retry", from: rec("running", { inFlight: ["r1"] }), event: { type: "TIMED_OUT", runId: "r1" }, to: "retry", ctx: { inFlight: [], lastError: "timed out" } },
    { name: "running TIMED_OUT last attempt -> failed", from: rec("running", { attempt: 3, inFlight: ["r1"] }), event: { type: "TIMED_OUT", runId: "r1" }, to: "failed", ctx: { inFlight: [], lastError: "timed out" } },
    { name: "running TIMED_OUT not last -> running", from: rec("running", { overlap: "allow", inFlight: ["r1", "r2"] }), event: { type: "TIMED_OUT", runId: "r1" }, to: "running", ctx: { inFlight: ["r2"], lastError: "timed out" } },
    { name: "running REFUSED -> retry, attempt given back", from: rec("running", { attempt: 3, inFlight: ["r1"] }), event: { type: "REFUSED", runId: "r1", reason: "full" }, to: "retry", ctx: { attempt: 2, inFlight: [], lastError: null } },
    { name: "running REFUSED not last -> running", from: rec("running", { overlap: "allow", inFlight: ["r1", "r2"] }), event: { type: "REFUSED", runId: "r2", reason: "full" }, to: "running", ctx: { attempt: 1, inFlight: ["r1"] } },
    ...(["SUCCEEDED", "FAILED", "TIMED_OUT", "REFUSED"] as const).map((t) => ({
      name: `running(forced) ${t} last -> paused`,
      from: rec("running", { inFlight: ["r1"], pausedAfterRun: true }),
      event: eventOf(t),
      to: "paused" as const,
      ctx: { ...completionCtx(t), inFlight: [], pausedAfterRun: false },
    })),
    { name: "running(forced, allow) SUCCEEDED not last -> running, still forced", from: rec("running", { overlap: "allow", inFlight: ["r1", "r2"], pausedAfterRun: true }), event: { type: "SUCCEEDED", runId: "r1" }, to: "running", ctx: { inFlight: ["r2"], pausedAfterRun: true } },
    { name: "running(forced) RESUME -> running, normal outcome after", from: rec("running", { inFlight: ["r1"], pausedAfterRun: true }), event: { type: "RESUME" }, to: "running", ctx: { inFlight: ["r1"], pausedAfterRun: false } },
    // PAUSE / RESUME
    ...(["pending", "success", "failed", "retry", "upstream_failed"] as const).map((s) => ({ name: `${s} PAUSE -> paused`, from: rec(s), event: { type: "PAUSE" } as const, to: "paused" as const, ctx: { inFlight: [] } })),
    { name: "running PAUSE -> paused, run keeps going", from: rec("running", { inFlight: ["r1"], pausedAfterRun: true }), event: { type: "PAUSE" }, to: "paused", ctx: { inFlight: ["r1"], pausedAfterRun: false } },
    { name: "paused PAUSE -> paused (idempotent)", from: rec("paused"), event: { type: "PAUSE" }, to: "paused", ctx: {} },
    { name: "paused RESUME idle -> pending", from: rec("paused"), event: { type: "RESUME" }, to: "pending", ctx: { inFlight: [] } },
    { name: "paused RESUME in flight -> running", from: rec("paused", { inFlight: ["r1"] }), event: { type: "RESUME" }, to: "running", ctx: { inFlight: ["r1"] } },
    ...(["SUCCEEDED", "FAILED", "TIMED_OUT", "REFUSED"] as const).map((t) => ({
      name: `paused ${t} of own run -> paused`,
      from: rec("paused", { inFlight: ["r1"] }),
      event: eventOf(t),
      to: "paused" as const,
      ctx: { ...completionCtx(t), inFlight: [] },
    })),
    // CANCEL
    ...(["pending", "running", "success", "failed", "retry", "paused", "upstream_failed"] as const).map((s) => ({
      name: `${s} CANCEL -> cancelled`,
      from: rec(s, s === "running" ? { inFlight: ["r1"] } : {}),
      event: { type: "CANCEL" } as const,
      to: "cancelled" as const,
      ctx: { inFlight: s === "running" ? ["r1"] : [] },
    })),
    ...(["SUCCEEDED", "FAILED", "TIMED_OUT", "REFUSED"] as const).map((t) => ({
      name: `cancelled ${t} of own run -> cancelled`,
      from: rec("cancelled", { inFlight: ["r1"] }),
      event: eventOf(t),
      to: "cancelled" as const,
      ctx: { ...completionCtx(t), inFlight: [] },
    })),
    // UPSTREAM_FAILED
    ...(["pending", "success", "failed", "retry"] as const).map((s) => ({
      name: `${s} UPSTREAM_FAILED -> upstream_failed`,
      from: rec(s),
      event: { type: "UPSTREAM_FAILED", upstreamRunId: "u1", reason: "upstream u failed" } as const,
      to: "upstream_failed" as const,
      ctx: { lastError: "upstream u failed" },
    })),
  ];
  it.each(rows.map((r) => [r.name, r] as const))("%s", (_n, row) => {
    const from = deepFreeze(structuredClone(row.from));
    const r = applyEvent(from, row.event);
    expect(r).toMatchObject({ ok: true, from: row.from.value, to: row.to });
    const next = ok(r);
    expect(next.context).toEqual({ ...row.from.context, ...row.ctx });
    expect(next).not.toBe(from);
  });
});

describe("retries", () => {
  it("exhausts maxAttempts, counting FAILED and TIMED_OUT", () => {
    let r = run(initialRecord({ maxAttempts: 3, overlap: "forbid" }), fire("a", "cron"));
    expect(r.context.attempt).toBe(1);
    r = run(r, { type: "FAILED", runId: "a", error: "e1" });
    expect(r.value).toBe("retry");
    r = run(r, fire("b", "retry"));
    expect(r.context.attempt).toBe(2);
    r = run(r, { type: "TIMED_OUT", runId: "b" });
    expect(r.value).toBe("retry");
    r = run(r, fire("c", "retry"));
    expect(r.context.attempt).toBe(3);
    r = run(r, { type: "FAILED", runId: "c", error: "e3" });
    expect(r).toMatchObject({ value: "failed", context: { attempt: 3, lastError: "e3", inFlight: [], lastRunId: "c" } });
    // the next scheduled fire starts a fresh chain
    expect(run(r, fire("d", "cron")).context.attempt).toBe(1);
  });
  it("maxAttempts 1 fails at once; retryable:false fails with attempts left", () => {
    const one = run(initialRecord({ maxAttempts: 1, overlap: "forbid" }), fire("a"), { type: "TIMED_OUT", runId: "a" });
    expect(one.value).toBe("failed");
    const nr = run(initialRecord({ maxAttempts: 5, overlap: "forbid" }), fire("a"), { type: "FAILED", runId: "a", error: "bad input", retryable: false });
    expect(nr).toMatchObject({ value: "failed", context: { attempt: 1, lastError: "bad input" } });
    const rt = run(initialRecord({ maxAttempts: 5, overlap: "forbid" }), fire("a"), { type: "FAILED", runId: "a", error: "flaky", retryable: true });
    expect(rt.value).toBe("retry");
  });
  it("REFUSED does not consume an attempt", () => {
    let r = run(initialRecord({ maxAttempts: 2, overlap: "forbid" }), fire("a", "cron"), { type: "REFUSED", runId: "a", reason: "full" });
    expect(r).toMatchObject({ value: "retry", context: { attempt: 0 } });
    r = run(r, fire("b", "retry"));
    expect(r.context.attempt).toBe(1); // the refused first try is re-run as attempt 1
    r = run(r, { type: "FAILED", runId: "b", error: "e" }, fire("c", "retry"));
    expect(r.context.attempt).toBe(2);
    // refused again, many times: still attempt 2 on the next dispatch
    for (const id of ["d", "e", "f"]) {
      r = run(r, { type: "REFUSED", runId: r.context.lastRunId ?? "", reason: "full" });
      expect(r).toMatchObject({ value: "retry", context: { attempt: 1 } });
      r = run(r, fire(id, "retry"));
      expect(r.context.attempt).toBe(2);
    }
    r = run(r, { type: "FAILED", runId: "f", error: "e2" });
    expect(r).toMatchObject({ value: "failed", context: { attempt: 2, lastError: "e2" } });
  });
});

describe("overlap", () => {
  it("forbid: FIRE while running is AX_E_TASK_RUNNING with the running run id, even forced", () => {
    const r = run(initialRecord({ maxAttempts: 1, overlap: "forbid" }), fire("a"));
    for (const e of [fire("b"), fire("b", "manual", true), fire("a", "retry"), fire("b", "dependency")]) {
      expect(applyEvent(r, e)).toMatchObject({ ok: false, code: "AX_E_TASK_RUNNING", runningRunId: "a" });
    }
  });
  it("forbid: a paused task with a run in flight refuses a forced FIRE as running, an unforced one as illegal", () => {
    const p = run(initialRecord({ maxAttempts: 1, overlap: "forbid" }), fire("a"), { type: "PAUSE" });
    expect(applyEvent(p, fire("b", "manual", true))).toMatchObject({ ok: false, code: "AX_E_TASK_RUNNING", runningRunId: "a" });
    expect(applyEvent(p, fire("b", "manual"))).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION" });
  });
  it("forbid: a cancelled task with a run in flight refuses FIRE as illegal", () => {
    const c = run(initialRecord({ maxAttempts: 1, overlap: "forbid" }), fire("a"), { type: "CANCEL" });
    expect(applyEvent(c, fire("b", "manual", true))).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION" });
  });
  it("allow: runs overlap; the state leaves running when the last one completes", () => {
    let r = run(initialRecord({ maxAttempts: 1, overlap: "allow" }), fire("a"), fire("b"), fire("c", "manual"));
    expect(r).toMatchObject({ value: "running", context: { inFlight: ["a", "b", "c"], lastRunId: "c" } });
    r = run(r, { type: "SUCCEEDED", runId: "b" }, { type: "FAILED", runId: "a", error: "x" });
    expect(r).toMatchObject({ value: "running", context: { inFlight: ["c"] } });
    r = run(r, { type: "SUCCEEDED", runId: "c" });
    expect(r).toMatchObject({ value: "success", context: { inFlight: [], lastError: null } });
  });
  it("allow: a FIRE reusing an in-flight run id is refused", () => {
    const r = run(initialRecord({ maxAttempts: 1, overlap: "allow" }), fire("a"));
    expect(applyEvent(r, fire("a"))).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION", reason: expect.stringContaining("already in flight") });
  });
});

describe("pause and force", () => {
  const paused = run(initialRecord({ maxAttempts: 3, overlap: "forbid" }), { type: "PAUSE" });
  it("a paused task fires only with force", () => {
    for (const source of ["cron", "rate", "delay", "once", "manual", "dependency", "retry", "misfire"] as const) {
      expect(applyEvent(paused, fire("a", source))).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION", reason: expect.stringContaining("force") });
      expect(applyEvent(paused, fire("a", source, false))).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION" });
    }
  });
  it("a forced run returns to paused whatever its outcome", () => {
    const f = run(paused, fire("a", "manual", true));
    expect(f).toMatchObject({ value: "running", context: { pausedAfterRun: true, attempt: 1 } });
    expect(run(f, { type: "SUCCEEDED", runId: "a" })).toMatchObject({ value: "paused", context: { pausedAfterRun: false, inFlight: [] } });
    expect(run(f, { type: "FAILED", runId: "a", error: "x" })).toMatchObject({ value: "paused", context: { lastError: "x" } });
    expect(run(f, { type: "TIMED_OUT", runId: "a" }).value).toBe("paused");
    // and RESUME afterwards goes to pending
    expect(run(f, { type: "SUCCEEDED", runId: "a" }, { type: "RESUME" }).value).toBe("pending");
  });
  it("RESUME during a forced run cancels the return to paused", () => {
    const r = run(paused, fire("a", "manual", true), { type: "RESUME" }, { type: "SUCCEEDED", runId: "a" });
    expect(r.value).toBe("success");
  });
  it("pausing a running task lets the run finish, still paused; RESUME with a run in flight is running", () => {
    const p = run(initialRecord({ maxAttempts: 3, overlap: "forbid" }), fire("a"), { type: "PAUSE" });
    expect(p).toMatchObject({ value: "paused", context: { inFlight: ["a"] } });
    expect(run(p, { type: "FAILED", runId: "a", error: "x" })).toMatchObject({ value: "paused", context: { inFlight: [], lastError: "x" } });
    const resumed = run(p, { type: "RESUME" });
    expect(resumed).toMatchObject({ value: "running", context: { inFlight: ["a"] } });
    expect(run(resumed, { type: "SUCCEEDED", runId: "a" }).value).toBe("success");
  });
  it("a non-forced FIRE is refused in running with pausedAfterRun under forbid", () => {
    const f = run(paused, fire("a", "manual", true));
    expect(applyEvent(f, fire("b", "manual", true))).toMatchObject({ ok: false, code: "AX_E_TASK_RUNNING", runningRunId: "a" });
  });
});

describe("late completions and cancel", () => {
  it("a completion after a timeout does not move the task twice", () => {
    const t = run(initialRecord({ maxAttempts: 3, overlap: "forbid" }), fire("a"), { type: "TIMED_OUT", runId: "a" });
    expect(t.value).toBe("retry");
    for (const e of [{ type: "SUCCEEDED", runId: "a" }, { type: "FAILED", runId: "a", error: "late" }, { type: "TIMED_OUT", runId: "a" }, { type: "REFUSED", runId: "a", reason: "x" }] as const) {
      expect(applyEvent(t, e)).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION", reason: expect.stringContaining("run a is not in flight") });
    }
    const b = run(t, fire("b", "retry"));
    expect(applyEvent(b, { type: "SUCCEEDED", runId: "a" })).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION" });
    expect(run(b, { type: "SUCCEEDED", runId: "b" })).toMatchObject({ value: "success", context: { attempt: 2 } });
  });
  it("cancelled is the end: in-flight completions are absorbed once, everything else refused", () => {
    const c = run(initialRecord({ maxAttempts: 3, overlap: "allow" }), fire("a"), fire("b"), { type: "CANCEL" });
    const d = run(c, { type: "FAILED", runId: "a", error: "x" }, { type: "SUCCEEDED", runId: "b" });
    expect(d).toMatchObject({ value: "cancelled", context: { inFlight: [] } });
    for (const type of TASK_EVENT_TYPES) {
      const e = type === "SUCCEEDED" ? { type, runId: "b" } : eventOf(type);
      expect(applyEvent(d, e)).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION", reason: expect.stringMatching(new RegExp(`^event ${type} not allowed in state cancelled`)) });
    }
  });
  it("unknown events and states", () => {
    const r = initialRecord({ maxAttempts: 1, overlap: "forbid" });
    expect(applyEvent(r, { type: "EXPLODE" } as unknown as TaskEvent)).toMatchObject({ ok: false, code: "AX_E_ILLEGAL_TRANSITION", reason: "event EXPLODE not allowed in state pending" });
    expect(() => applyEvent({ ...r, value: "sleeping" as TaskState }, fire("a"))).toThrow(/not a task state/);
  });
});

/** A seeded random walk over the machine: invariants, no mutation, JSON and pack round-trips. */
describe("random walk", () => {
  function lcg(seed: number): () => number {
    let s = seed >>> 0;
    return () => {
      s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
      return s / 2 ** 32;
    };
  }
  function randomEvent(rand: () => number, r: TaskRecord, n: number): TaskEvent {
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)] as T;
    const runId = rand() < 0.8 && r.context.inFlight.length > 0 ? pick(r.context.inFlight) : pick(["x", r.context.lastRunId ?? "y"]);
    switch (pick(TASK_EVENT_TYPES)) {
      case "FIRE":
        return { type: "FIRE", runId: `run-${n}`, source: pick(["cron", "manual", "retry", "misfire"] as const), force: rand() < 0.3 };
      case "SUCCEEDED":
        return { type: "SUCCEEDED", runId };
      case "FAILED":
        return { type: "FAILED", runId, error: pick(["boom", "exit 1", "a".repeat(300)]), retryable: rand() < 0.8 };
      case "TIMED_OUT":
        return { type: "TIMED_OUT", runId };
      case "REFUSED":
        return { type: "REFUSED", runId, reason: "full" };
      case "UPSTREAM_FAILED":
        return { type: "UPSTREAM_FAILED", upstreamRunId: "u", reason: "up" };
      case "PAUSE":
        return { type: "PAUSE" };
      case "RESUME":
        return { type: "RESUME" };
      case "CANCEL":
        return rand() < 0.1 ? { type: "CANCEL" } : { type: "PAUSE" };
    }
  }
  it("keeps invariants, never mutates, round-trips JSON and packing", () => {
    const rand = lcg(42);
    let accepted = 0;
    let idleSeen = 0;
    for (let walk = 0; walk < 60; walk++) {
      let r = deepFreeze(initialRecord({ maxAttempts: 1 + (walk % 4), overlap: walk % 2 ? "allow" : "forbid" }));
      for (let step = 0; step < 80; step++) {
        const e = randomEvent(rand, r, step);
        const before = JSON.stringify(r);
        const res = applyEvent(r, e);
        expect(JSON.stringify(r)).toBe(before);
        // a record restored from JSON decides exactly the same
        expect(applyEvent(JSON.parse(before) as TaskRecord, e)).toEqual(res);
        if (!res.ok) continue;
        accepted++;
        r = deepFreeze(res.record);
        const c = r.context;
        const busy = c.inFlight.length > 0;
        if (r.value === "running") expect(busy).toBe(true);
        if (busy) expect(["running", "paused", "cancelled"]).toContain(r.value);
        if (c.pausedAfterRun) expect(r.value).toBe("running");
        if (c.overlap === "forbid") expect(c.inFlight.length).toBeLessThanOrEqual(1);
        expect(new Set(c.inFlight).size).toBe(c.inFlight.length);
        expect(JSON.parse(JSON.stringify(r))).toEqual(r);
        if (isIdle(r)) {
          idleSeen++;
          expect(unpackIdle(packIdle(r))).toEqual(r);
        }
      }
    }
    expect(accepted).toBeGreaterThan(1000);
    expect(idleSeen).toBeGreaterThan(500);
  });
});

describe("JSON round-trip", () => {
  it("a persisted record, idle or mid-run, is restored and continues", () => {
    const mid = run(initialRecord({ maxAttempts: 2, overlap: "forbid" }), fire("a"), { type: "FAILED", runId: "a", error: "e" }, fire("b", "retry"));
    const restored = JSON.parse(JSON.stringify(mid)) as TaskRecord;
    expect(restored).toEqual(mid);
    expect(applyEvent(restored, fire("c"))).toMatchObject({ code: "AX_E_TASK_RUNNING", runningRunId: "b" });
    expect(run(restored, { type: "TIMED_OUT", runId: "b" })).toMatchObject({ value: "failed", context: { attempt: 2, lastError: "timed out" } });
    // JSON of an idle record is small and has exactly the documented fields
    const idle = run(restored, { type: "SUCCEEDED", runId: "b" });
    expect(Object.keys(idle.context).sort()).toEqual(["attempt", "inFlight", "lastError", "lastRunId", "maxAttempts", "overlap", "pausedAfterRun"]);
  });
});

describe("packed idle encoding", () => {
  it("a never-run task packs to a number; one with a run id to a short string", () => {
    const fresh = initialRecord({ maxAttempts: 4, overlap: "allow" });
    expect(typeof packIdle(fresh)).toBe("number");
    expect(unpackIdle(packIdle(fresh))).toEqual(fresh);
    const done = run(fresh, fire("0b5c1f3e-3a1d-4c8e-9f00-1234567890ab"), { type: "SUCCEEDED", runId: "0b5c1f3e-3a1d-4c8e-9f00-1234567890ab" });
    const p = packIdle(done);
    expect(typeof p).toBe("string");
    expect(String(p).length).toBeLessThan(50);
    expect(unpackIdle(p)).toEqual(done);
  });
  it("round-trips edge values: empty strings, separators, long and shared errors, every state", () => {
    for (const value of TASK_STATES) {
      for (const lastRunId of [null, "", "a.b.c", "ünï.cødé"]) {
        for (const lastError of [null, "", "timed out", "x.y", "e".repeat(5000)]) {
          const r = rec(value, { attempt: 65_535, maxAttempts: 65_535, overlap: "allow", lastRunId, lastError });
          expect(unpackIdle(packIdle(r))).toEqual(r);
          const q = rec(value, { attempt: 0, maxAttempts: 1, lastRunId, lastError });
          expect(unpackIdle(packIdle(q))).toEqual(q);
        }
      }
    }
  });
  it("refuses what is not idle or does not fit, and garbage", () => {
    expect(() => packIdle(rec("running", { inFlight: ["a"] }))).toThrow(AxError);
    expect(() => packIdle(rec("paused", { inFlight: ["a"] }))).toThrow(/idle/);
    expect(() => packIdle(rec("success", { attempt: 70_000 }))).toThrow(/attempt/);
    expect(() => unpackIdle("nonsense")).toThrow(AxError);
    expect(() => unpackIdle(-1)).toThrow(AxError);
  });
});
