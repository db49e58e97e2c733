import { describe } from "vitest";
import { waitFor } from "../helpers.ts";
import { cli, infoField, sentinelMaster, startSentinels } from "../redisDeploy.ts";
import { failoverScenario } from "../redisFailover.ts";

/**
 * ax on a Sentinel-managed Redis of its own: a master, one replica and three sentinels (quorum
 * 2, down after 1 s) on free loopback ports. Every shard's keys are on the one master, so the
 * failover concerns them all. See failoverScenario for what is asserted.
 */
describe("Redis Sentinel: a master, a replica, three sentinels", () => {
  failoverScenario("rsentinel", async (procs) => {
    const s = await startSentinels(procs, "axmaster");
    return {
      env: { AX_REDIS_URL: `redis+sentinel://${s.sentinels.map((p) => `127.0.0.1:${p}`).join(",")}/axmaster` },
      // Single mode on the replica: it would refuse every write.
      wrong: { env: { AX_REDIS_MODE: "single", AX_REDIS_URL: `redis://127.0.0.1:${s.replica}` }, says: /is a replica.*AX_REDIS_MODE=sentinel/ },
      async victim(shards) {
        return { master: await sentinelMaster(s.sentinels[0]!, "axmaster"), replica: s.replica, shards };
      },
      async promoted(master, replica) {
        await waitFor(async () => {
          for (const p of s.sentinels) if (await sentinelMaster(p, "axmaster") !== replica) return false;
          return infoField(await cli(replica, "info", "replication"), "role") === "master";
        }, 30_000, "the sentinels to promote the replica", 50);
        void master;
      },
    };
  });
});
