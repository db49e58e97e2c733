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

/** The shards rows as bench/run.ts records them: the default's with the ratios, the other as an exploration. */
function shards(achieved64: number, achieved4: number, ratios: { p99: number; cpuUsPerRun: number }): Array<{ row: ResultRow }> {
  const base = { scenario: "shards", tasks: 500_000, rate: 8200, latencyMs: null, lost: 0, duplicated: 0, nodeCpuS: 1, nodeRssMb: 1, serversCpuS: 1 };
  return [
    { row: { ...base, achievedRate: achieved64, shards: 64, ratios: { vsShards: 4, ...ratios } } },
    { row: { ...base, achievedRate: achieved4, shards: 4, exploration: ["4 shards"] } },
  ];
}
const shardsStatusOf = (md: string) => /\| 64 vs 4 shards: [^|]*\|[^|]*\| ([^|]*) \|/.exec(md)![1]!.trim();

describe("the 64 vs 4 shards target", () => {
  it("is decided by the ratios when both runs kept the seed's rate", () => {
    expect(shardsStatusOf(targets(shards(8201, 8200, { p99: 1.05, cpuUsPerRun: 1.08 })))).toBe("met");
    expect(shardsStatusOf(targets(shards(8201, 8200, { p99: 1.05, cpuUsPerRun: 1.2 })))).toBe("**not met**");
  });

  it("is not met when the default fell behind beside a 4-shard run that kept the rate, whatever the ratios", () => {
    expect(shardsStatusOf(targets(shards(5936, 8201, { p99: 1.0, cpuUsPerRun: 1.0 })))).toMatch(/^\*\*not met\*\* \(the default fell behind, 5936\/s/);
  });

  it("is not shown when both fell behind, or only the 4-shard run did (the ratio says nothing)", () => {
    expect(shardsStatusOf(targets(shards(5976, 5979, { p99: 0.99, cpuUsPerRun: 0.93 })))).toMatch(/^not shown \(both runs fell behind/);
    expect(shardsStatusOf(targets(shards(8200, 6000, { p99: 0.5, cpuUsPerRun: 1.0 })))).toMatch(/^not shown \(the 4-shard run fell behind/);
  });
});
