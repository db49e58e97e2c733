import { describe, expect, it } from "vitest";
import { transition } from "xstate";
import { TASK_STATES, taskMachine, type TaskContext, type TaskEvent, type TaskState } from "../../actors/machine/index.ts";
import { compiledTaskMachine, compiledTaskMachineUnsupported } from "../../actors/machine/compiled.ts";

/** What XState itself decides: the next { value, context }, or null when the snapshot is returned unchanged. */
function viaXState(value: TaskState, context: TaskContext, event: TaskEvent): { value: TaskState; context: TaskContext } | null {
  const snap = taskMachine.resolveState({ value, context });
  const [next] = transition(taskMachine, snap, event);
  if (next.status === "error") throw next.error;
  return next === snap ? null : { value: next.value as TaskState, context: next.context };
}

function contexts(): TaskContext[] {
  const out: TaskContext[] = [];
  for (const attempt of [0, 1, 2, 3])
    for (const maxAttempts of [1, 3])
      for (const overlap of ["forbid", "allow"] as const)
        for (const inFlight of [[], ["r1"], ["r2"], ["r1", "r2"]])
          for (const pausedAfterRun of [false, true])
            for (const lastError of [null, "boom"])
              out.push({ attempt, maxAttempts, overlap, inFlight, lastRunId: inFlight.at(-1) ?? "r0", lastError, pausedAfterRun });
  return out;
}

function events(): TaskEvent[] {
  const out: TaskEvent[] = [];
  for (const runId of ["r1", "r3"])
    for (const source of ["cron", "retry", "manual", "dependency"] as const)
      for (const force of [undefined, true, false]) out.push(force === undefined ? { type: "FIRE", runId, source } : { type: "FIRE", runId, source, force });
  for (const runId of ["r1", "r2", "r3"]) {
    out.push({ type: "SUCCEEDED", runId }, { type: "TIMED_OUT", runId }, { type: "REFUSED", runId, reason: "full" });
    out.push({ type: "FAILED", runId, error: "e" }, { type: "FAILED", runId, error: "e", retryable: false }, { type: "FAILED", runId, error: "e", retryable: true });
  }
  out.push({ type: "PAUSE" }, { type: "RESUME" }, { type: "CANCEL" }, { type: "UPSTREAM_FAILED", upstreamRunId: "u1", reason: "up failed" });
  return out;
}

describe("compiled task machine", () => {
  it("compiles the machine definition (no unsupported features)", () => {
    expect(compiledTaskMachineUnsupported).toBeNull();
    expect(compiledTaskMachine).not.toBeNull();
  });

  it("decides exactly as XState on every state × context × event", () => {
    let compared = 0; let accepted = 0;
    for (const value of TASK_STATES) for (const context of contexts()) for (const event of events()) {
      const want = viaXState(value, context, event);
      const got = compiledTaskMachine!.transition(value, context, event);
      if (want === null) expect(got, `${value} ${JSON.stringify(context)} ${JSON.stringify(event)}`).toBeNull();
      else {
        expect(got, `${value} ${JSON.stringify(context)} ${JSON.stringify(event)}`).not.toBeNull();
        expect(got!.value).toBe(want.value);
        expect(got!.context).toEqual(want.context);
        accepted++;
      }
      compared++;
    }
    expect(compared).toBeGreaterThan(50_000);
    expect(accepted).toBeGreaterThan(5_000);
  });

  it("never mutates its input", () => {
    const context: TaskContext = Object.freeze({ attempt: 1, maxAttempts: 3, overlap: "forbid", inFlight: Object.freeze(["r1"]) as string[], lastRunId: "r1", lastError: null, pausedAfterRun: false });
    const next = compiledTaskMachine!.transition("running", context, { type: "SUCCEEDED", runId: "r1" });
    expect(next?.value).toBe("success");
    expect(context.inFlight).toEqual(["r1"]);
  });
});
