import { afterEach, describe, expect, it } from "vitest";
import { expectHealthy, runScenario, type FaultRig } from "./rig.ts";
import { sleep, waitFor } from "../helpers.ts";

let rig: FaultRig | null = null;
afterEach(async () => { await rig?.teardown(); rig = null; });

describe("faults: Redis", () => {
  it("restarted empty after 3 s down: the due index is rebuilt, nothing is lost or doubled", async () => {
    let during: Awaited<ReturnType<FaultRig["readyz"]>> | null = null;
    let status: { nodes: Array<{ failing: Record<string, string> }> } | null = null;
    const r = await runScenario("redis-restart", async (x) => {
      expect((await x.readyz()).status).toBe(200);
      await x.redis.stopServer("SIGKILL");
      const t0 = Date.now();
      // Honest health: not ready, saying why, and `ax status` names the failing dependency.
      // Redis stays down until the node says so (or 15 s), so a slow machine cannot race it.
      await waitFor(async () => (during = await x.readyz()).status === 503, 15_000, "readyz 503 while Redis is down").catch(() => undefined);
      status = await x.client!.call("status");
      await sleep(Math.max(0, 3000 - (Date.now() - t0)));
      await x.redis.startServer();
      return Date.now();
    });
    rig = r.rig;
    expectHealthy(r);
    expect(during).toMatchObject({ status: 503, body: { ready: false, failing: { redis: expect.any(String) } } });
    expect(during!.body.reasons.join("; ")).toMatch(/redis unreachable/);
    expect(status!.nodes[0]!.failing).toHaveProperty("redis");
    await waitFor(async () => (await r.rig.readyz()).status === 200, 10_000, "ready again");
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
