import { afterEach, describe, expect, it } from "vitest";
import { expectHealthy, runScenario, type FaultRig } from "../faults.ts";
import { sleep } from "../helpers.ts";

let rig: FaultRig | null = null;
afterEach(async () => { await rig?.teardown(); rig = null; });

describe("faults: Redis", () => {
  it("restarted empty after 3 s down: the due index is rebuilt, nothing is lost or doubled", async () => {
    const r = await runScenario("redis-restart", async (x) => {
      await x.redis.stopServer("SIGKILL");
      await sleep(3000);
      await x.redis.startServer();
      return Date.now();
    });
    rig = r.rig;
    expectHealthy(r);
    const lines = r.rig.logLines();
    expect(lines.filter((l) => l.msg === "dependency:down" && l.dependency === "redis").length).toBeGreaterThanOrEqual(1);
    expect(lines.filter((l) => l.msg === "dependency:up" && l.dependency === "redis").length).toBeGreaterThanOrEqual(1);
  }, 240_000);

  it("FLUSHALL under load: the due index is rebuilt, nothing is lost or doubled", async () => {
    const r = await runScenario("redis-flushall", async (x) => {
      x.redis.flushAll();
      return Date.now();
    });
    rig = r.rig;
    expectHealthy(r);
  }, 240_000);
});
