import { afterEach, describe, expect, it } from "vitest";
import { expectHealthy, runScenario, type FaultRig } from "./rig.ts";
import { sleep } from "../helpers.ts";

let rig: FaultRig | null = null;
afterEach(async () => { await rig?.teardown(); rig = null; });

describe("faults: PostgreSQL", () => {
  it("stopped for 10 s (pg_ctl stop -m fast) and started again: the node survives, nothing is lost or doubled", async () => {
    const r = await runScenario("pg-stop", async (x) => {
      x.pg.stopServer("fast");
      await sleep(10_000);
      x.pg.startServer();
      return Date.now();
    });
    rig = r.rig;
    expectHealthy(r);
    // The outage is reported once as such, not as lost leases.
    const lines = r.rig.logLines();
    expect(lines.filter((l) => l.msg === "dependency:down" && l.dependency === "postgres").length).toBeGreaterThanOrEqual(1);
    expect(lines.filter((l) => l.msg === "dependency:up" && l.dependency === "postgres").length).toBeGreaterThanOrEqual(1);
    expect(lines.filter((l) => l.msg === "lease:lost")).toEqual([]);
  }, 240_000);

  it("kill -9 of the postmaster, then a start with crash recovery: the node survives, nothing is lost or doubled", async () => {
    const r = await runScenario("pg-kill9", async (x) => {
      x.pg.killPostmaster();
      await sleep(2000);
      x.pg.startServer();
      return Date.now();
    });
    rig = r.rig;
    expectHealthy(r);
    expect(r.rig.pg.log()).toMatch(/not properly shut down|automatic recovery/);
  }, 240_000);
});
