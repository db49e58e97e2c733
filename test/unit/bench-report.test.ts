import { describe, expect, it } from "vitest";
import { targets, type ResultRow } from "../../bench/report.ts";

/** A max-rate row as bench/run.ts records it: the rate found, and each step of its sweep. */
function maxRate(rate: number, sweep: Array<[number, boolean]>, peer?: string): { row: ResultRow } {
  return {
    row: {
      scenario: "max-rate", tasks: rate * 10, rate, achievedRate: rate, latencyMs: null, lost: 0, duplicated: 0, nodeCpuS: 1, nodeRssMb: 1, serversCpuS: 1,
      cpuUsPerRun: 100, sweep: sweep.map(([r, pass]) => ({ rate: r, p99: pass ? 50 : 200, lost: 0, pass })), ...(peer ? { peer, ratio: rate } : {}),
    },
  };
}
const statusOf = (md: string) => /\| max-rate \(p99 ≤ 100 ms\) ≥ 1\.5 × BullMQ's \|[^|]*\| ([^|]*) \|/.exec(md)![1]!.trim();

describe("the max-rate target", () => {
  it("is met or missed by the ratio when both sweeps passed their first step", () => {
    expect(statusOf(targets([maxRate(12_000, [[6000, true], [9000, true], [13500, false], [12000, true]]), maxRate(7000, [[6000, true], [9000, false], [7000, true]], "bullmq")]))).toBe("met");
    expect(statusOf(targets([maxRate(9000, [[6000, true], [9000, true]]), maxRate(16000, [[6000, true], [16000, true]], "bullmq")]))).toBe("**not met**");
  });

  it("is not shown when either sweep failed its first step (it searched only below its start)", () => {
    expect(statusOf(targets([maxRate(11_250, [[6000, true], [11250, true]]), maxRate(5625, [[6000, false], [5625, true]], "bullmq")])))
      .toBe("not shown (BullMQ's sweep failed its first step, 6000/s, and searched only below it)");
    expect(statusOf(targets([maxRate(5625, [[6000, false], [5625, true]]), maxRate(16000, [[6000, true], [16000, true]], "bullmq")])))
      .toMatch(/^not shown \(ax's sweep failed its first step/);
  });
});
