import { describe } from "vitest";
import { waitFor } from "../helpers.ts";
import { clusterNodes, infoField, cli, startRedisCluster } from "../redisDeploy.ts";
import { keySlot } from "../../actors/store/redis.ts";
import { failoverScenario } from "../redisFailover.ts";

/**
 * ax on a Redis Cluster of its own: 3 masters with a replica each (node timeout 1 s) on free
 * loopback ports. See failoverScenario for what is asserted.
 */
describe("Redis Cluster: 3 masters, 3 replicas", () => {
  failoverScenario("rcluster", async (procs) => {
    const { ports } = await startRedisCluster(procs);
    const slotsOf = async (port: number) => (await clusterNodes(port)).filter((x) => x.master && !x.failed);
    return {
      env: { AX_REDIS_MODE: "cluster", AX_REDIS_URL: ports.slice(0, 2).map((p) => `redis://127.0.0.1:${p}`).join(",") },
      // The reported misconfiguration: one cluster node given as a single server.
      wrong: { env: { AX_REDIS_MODE: "single", AX_REDIS_URL: `redis://127.0.0.1:${ports[0]}` }, says: /cluster_enabled:1.*AX_REDIS_MODE=cluster/ },
      async victim(shards, keyOf) {
        const nodes = await clusterNodes(ports[0]!);
        // Our slot function agrees with the server's for every shard's key.
        for (const s of shards) if (Number((await cli(ports[0]!, "cluster", "keyslot", keyOf(s))).trim()) !== keySlot(keyOf(s))) throw new Error(`slot of ${keyOf(s)} differs`);
        const masters = nodes.filter((x) => x.master).map((m) => ({ m, shards: shards.filter((s) => m.slots.some(([a, b]) => keySlot(keyOf(s)) >= a && keySlot(keyOf(s)) <= b)) }));
        // The shards spread over all three masters, so the node really talks to several.
        if (masters.filter((x) => x.shards.length > 0).length < 3) throw new Error(`shards on fewer than 3 masters: ${JSON.stringify(masters.map((x) => x.shards))}`);
        const pick = masters.sort((a, b) => b.shards.length - a.shards.length)[0]!;
        const replica = nodes.find((x) => x.masterId === pick.m.id)!;
        return { master: pick.m.port, replica: replica.port, shards: pick.shards };
      },
      async promoted(master, replica) {
        const other = ports.find((p) => p !== master && p !== replica)!;
        await waitFor(async () => {
          const m = (await slotsOf(other)).find((x) => x.port === replica);
          return m !== undefined && m.slots.length > 0 && infoField(await cli(other, "cluster", "info"), "cluster_state") === "ok";
        }, 30_000, "the replica promoted and the cluster ok", 50);
      },
    };
  });
});
