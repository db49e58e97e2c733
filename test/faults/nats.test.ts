import { afterEach, describe, it } from "vitest";
import { expectHealthy, runScenario, type FaultRig, type NatsServer } from "./rig.ts";
import { sleep } from "../helpers.ts";

let rig: FaultRig | null = null;
afterEach(async () => { await rig?.teardown(); rig = null; });

describe("faults: NATS", () => {
  it("nats-server restarted on the same store after 3 s down: completions keep being applied, nothing is lost or doubled", async () => {
    const r = await runScenario("nats-restart", async (x) => {
      await (x.nats as NatsServer).stopServer("SIGTERM");
      await sleep(3000);
      await (x.nats as NatsServer).startServer();
      return Date.now();
    });
    rig = r.rig;
    expectHealthy(r);
  }, 240_000);
});
