import { describe, expect, it } from "vitest";
import { AxError, SystemClock } from "../../common/index.ts";
import { waitingFor } from "../../ops/jetstreamReady.ts";

/** A logger that keeps its warnings (pino's shape, as far as waitingFor uses it). */
function recorder() {
  const warnings: Array<{ fields: Record<string, unknown>; msg: string }> = [];
  const log = { warn: (fields: Record<string, unknown>, msg: string) => { warnings.push({ fields, msg }); } };
  return { log: log as never, warnings };
}
/** A step that fails with `errors` in turn, then answers "ok". */
function failing(...errors: string[]): { fn: () => Promise<string>; calls: () => number } {
  let n = 0;
  return { fn: async () => { const e = errors[n++]; if (e !== undefined) throw new Error(e); return "ok"; }, calls: () => n };
}
const clock = new SystemClock();

describe("a start-up step against JetStream (waitingFor)", () => {
  it("asks again while JetStream does not answer, warning each time with the step, and returns its answer", async () => {
    const { log, warnings } = recorder();
    const step = failing("TIMEOUT", "503 no responders");
    await expect(waitingFor("creating the streams", 3, step.fn, { clock, log, patienceMs: 10_000 })).resolves.toBe("ok");
    expect(step.calls()).toBe(3);
    expect(warnings.map((w) => [w.fields.step, w.fields.attempt, w.msg])).toEqual([
      ["creating the streams", 1, "JetStream did not answer yet; asking again"], ["creating the streams", 2, "JetStream did not answer yet; asking again"]]);
  });

  it("gives up after its patience with what to check, naming the replicas", async () => {
    const { log } = recorder();
    const step = failing(...Array.from({ length: 100 }, () => "timeout"));
    const e = await waitingFor("creating the streams", 3, step.fn, { clock, log, patienceMs: 1500 }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(AxError);
    expect((e as AxError).code).toBe("AX_E_UNAVAILABLE");
    expect((e as AxError).message).toMatch(/JetStream did not answer while creating the streams \(timeout\).*-js.*AX_REPLICAS=3/);
    expect(step.calls()).toBeGreaterThanOrEqual(2);
    expect(step.calls()).toBeLessThanOrEqual(4);
  });

  it("fails at once on an answer that will not change, and passes other errors through untouched", async () => {
    const { log, warnings } = recorder();
    const notEnabled = failing("jetstream not enabled for account");
    await expect(waitingFor("checking that JetStream is enabled", 1, notEnabled.fn, { clock, log })).rejects.toThrow(/JetStream did not answer while checking.*\(-js\)$/);
    expect(notEnabled.calls()).toBe(1);
    const other = failing("stream name already in use with a different configuration");
    await expect(waitingFor("creating the streams", 1, other.fn, { clock, log })).rejects.toThrow(/^stream name already in use/);
    expect(other.calls()).toBe(1);
    expect(warnings).toEqual([]);
  });
});
