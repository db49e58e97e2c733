import { describe, expect, it } from "vitest";
import { CPU_AHEAD_MS, Recorder, cpuWindow, percentile, summarize } from "../../bench/recorder.ts";
import { crossCheck, type RunRowTuple } from "../../bench/crosscheck.ts";

const T0 = 1_800_000_000_000;
const dueOf = (i: number) => T0 + i * 10;

describe("bench recorder: one clock, signed lateness", () => {
  it("keeps a start before the due time negative and counts it as early", () => {
    const r = new Recorder(4, T0);
    r.record(0, dueOf(0), dueOf(0) + 5);
    r.record(1, dueOf(1), dueOf(1) - 3); // early
    r.record(2, dueOf(2), dueOf(2) + 7);
    r.record(3, dueOf(3), dueOf(3) + 9);
    const s = r.summary();
    expect(s.early).toBe(1);
    expect(s.latencyMs.min).toBe(-3);
    expect(s.latencyMs.p50).toBe(5);
    expect(s.latencyMs.max).toBe(9);
    expect(s.lost).toBe(0);
  });

  it("reports all-early runs with negative percentiles, not zeros", () => {
    const r = new Recorder(3, T0);
    for (let i = 0; i < 3; i++) r.record(i, dueOf(i), dueOf(i) - 20 + i);
    const s = r.summary();
    expect(s.early).toBe(3);
    expect(s.latencyMs.p99).toBe(-18);
    expect(s.latencyMs.p50).toBe(-19);
  });

  it("counts lost, duplicated and runs of tasks it did not expect", () => {
    const r = new Recorder(3, T0);
    r.record(0, dueOf(0), dueOf(0) + 1);
    r.record(0, dueOf(0), dueOf(0) + 2);
    r.record(7, dueOf(7), dueOf(7) + 1);
    const s = r.summary();
    expect(s).toMatchObject({ runs: 2, lost: 2, duplicated: 1, unexpected: 1 });
    expect(r.first(0)).toEqual({ startMs: dueOf(0) + 1, firedMs: null, runs: 2 });
  });

  it("uses nearest-rank percentiles on sorted values", () => {
    const v = Float64Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentile(v, 0.5)).toBe(50);
    expect(percentile(v, 0.99)).toBe(99);
    expect(percentile(v, 1)).toBe(100);
    expect(summarize([-5, 10, 0]).min).toBe(-5);
  });
});

describe("bench cross-check against the runs table", () => {
  const recorded = () => {
    const r = new Recorder(3, T0);
    for (let i = 0; i < 3; i++) r.record(i, dueOf(i), dueOf(i) + 12, dueOf(i) + 4);
    return r;
  };
  const table = (): RunRowTuple[] => [0, 1, 2].map((i) => [i, dueOf(i), dueOf(i) + 4, dueOf(i) + 11, "success", "once", dueOf(i)]);

  it("agrees when counts, due times and start times match", () => {
    const x = crossCheck(table(), recorded(), dueOf, 50);
    expect(x.problems).toEqual([]);
    expect(x).toMatchObject({ ok: true, started: 3, maxStartGapMs: 1 });
    expect(x.tableLatencyMs?.p50).toBe(11);
  });

  it("refuses a start the table puts after the handler's, or too long before it", () => {
    const t = table();
    t[0]![3] = dueOf(0) + 30; // after the handler started
    t[1]![3] = dueOf(1) - 1000; // 1012 ms before
    const x = crossCheck(t, recorded(), dueOf, 5000);
    expect(x.ok).toBe(false);
    expect(x.problems.join(" ")).toMatch(/task 0: .*-18 ms apart/);
    expect(x.problems.join(" ")).toMatch(/task 1: .*1012 ms apart/);
  });

  it("refuses a row whose p50 or p99 the table's own figures contradict", () => {
    const t = table();
    for (const r of t) { r[2] = null; r[3] = (r[3] as number) - 60; } // every start 60 ms before the handler's: within 1 s, but the figures differ
    const x = crossCheck(t, recorded(), dueOf, 20);
    expect(x.ok).toBe(false);
    expect(x.problems.join(" ")).toMatch(/p50 lateness: 12 ms by the handler, -49 ms by the runs table/);
    expect(crossCheck(t, recorded(), dueOf, 100).ok).toBe(true);
  });

  it("refuses a handler start the table does not have, and a due time the bench did not assign", () => {
    const t = table();
    t.pop();
    t[0]![1] = dueOf(0) + 1;
    const x = crossCheck(t, recorded(), dueOf, 50);
    expect(x.ok).toBe(false);
    expect(x.problems.join(" ")).toMatch(/task 2: 1 handler start\(s\), 0 started run\(s\)/);
    expect(x.problems.join(" ")).toMatch(/task 0: due_ms/);
  });

  it("counts a run re-dated as misfire or retry whose slot is the bench's due time", () => {
    const t = table();
    t[0]![1] = dueOf(0) + 1500; t[0]![5] = "misfire";
    const x = crossCheck(t, recorded(), dueOf, 50);
    expect(x.ok).toBe(true);
    expect(x.redated).toEqual({ misfire: 1 });
    expect(x.tableLatencyMs?.max).toBe(11); // from the slot, not the re-dated due time
  });

  it("refuses a fired time that differs from the dispatch's", () => {
    const t = table();
    t[2]![2] = dueOf(2) + 5;
    const x = crossCheck(t, recorded(), dueOf, 50);
    expect(x.ok).toBe(false);
    expect(x.problems[0]).toMatch(/task 2: the dispatch said firedAt/);
  });

  it("compares only the measured window: later starts are in neither the row nor the check", () => {
    const r = new Recorder(3, T0);
    r.record(0, dueOf(0), dueOf(0) + 12, dueOf(0) + 4);
    r.frozenAt = dueOf(0) + 2000; // the window closed; tasks 1 and 2 had not run
    r.record(1, dueOf(1), dueOf(1) + 2500, dueOf(1) + 4);
    expect(r.summary()).toMatchObject({ runs: 1, lost: 2, afterWindow: 1 });
    const t: RunRowTuple[] = [
      [0, dueOf(0), dueOf(0) + 4, dueOf(0) + 11, "success", "once", dueOf(0)],
      [1, dueOf(1), dueOf(1) + 4, dueOf(1) + 2499, "success", "once", dueOf(1)], // after the close
      [2, dueOf(2), dueOf(2) + 4, dueOf(0) + 1995, "success", "once", dueOf(2)], // just before it: its handler may have started after
    ];
    const x = crossCheck(t, r, dueOf, 20);
    expect(x.problems).toEqual([]);
    expect(x).toMatchObject({ started: 2, afterWindow: 1 });
    t[2]![3] = dueOf(0) + 500; // well before the close, yet the handler never saw it
    expect(crossCheck(t, r, dueOf, 20).problems.join(" ")).toMatch(/task 2: 0 handler start\(s\), 1 started run/);
  });
});

describe("the CPU window of a step", () => {
  it("opens CPU_AHEAD_MS before T0 (not before creation ended) and counts the warm-up runs due in it", () => {
    const T0 = 1_000_000;
    const warmDue = (i: number) => T0 - 24_000 + i * 1000; // 24 warm-up runs, one a second, the last 1 s before T0
    expect(cpuWindow(T0 - 60_000, T0, 24, warmDue)).toEqual({ fromMs: T0 - CPU_AHEAD_MS, warmRuns: 11 });
    // Creation ended later than that: from then on.
    expect(cpuWindow(T0 - 5_000, T0, 24, warmDue)).toEqual({ fromMs: T0 - 5_000, warmRuns: 5 });
    expect(cpuWindow(T0 - 60_000, T0, 0, warmDue)).toEqual({ fromMs: T0 - CPU_AHEAD_MS, warmRuns: 0 });
  });
});
