import { Cluster, Redis, type ClusterOptions, type RedisOptions } from "ioredis";
import { AxError, type RedisTarget } from "../../common/index.ts";

/** A client for any of the three modes: one server, a Redis Cluster, or a Sentinel-managed master. */
export type RedisClient = Redis | Cluster;

/**
 * The one place a Redis client is built from the configuration, so every component reaches the
 * same deployment the same way. Commands fail after a few retries instead of queueing forever:
 * the callers (refills, the API) retry on their own schedule.
 */
export function createRedis(t: RedisTarget): RedisClient {
  const auth: RedisOptions = {};
  if (t.username !== undefined) auth.username = t.username;
  if (t.password !== undefined) auth.password = t.password;
  if (t.tls) auth.tls = {};
  // Reconnect at least every 500 ms (ioredis backs off to 2 s): after a fail-over the client
  // finds the promoted master sooner, and an attempt at a server that is down costs little.
  const common: RedisOptions = { ...auth, maxRetriesPerRequest: 3, enableAutoPipelining: true, retryStrategy: (times) => Math.min(times * 50, 500) };
  if (t.mode === "cluster") {
    const o: ClusterOptions = {
      redisOptions: { ...auth, maxRetriesPerRequest: 3 },
      enableAutoPipelining: true,
      scaleReads: "master", // reads from a replica could miss a take-due's removal
      // A failover takes the cluster a few seconds (cluster-node-timeout + election); retry
      // redirections and CLUSTERDOWN for that long rather than failing every refill at once.
      maxRedirections: 16,
      retryDelayOnFailover: 200,
      retryDelayOnClusterDown: 200,
      retryDelayOnTryAgain: 100,
      slotsRefreshTimeout: 2000,
      slotsRefreshInterval: 2000,
      clusterRetryStrategy: (times) => Math.min(100 * times, 2000),
    };
    return new Cluster(t.nodes.map((n) => ({ host: n.host, port: n.port })), o);
  }
  if (t.mode === "sentinel") {
    const o: RedisOptions = {
      ...common, db: t.db, sentinels: t.nodes.map((n) => ({ host: n.host, port: n.port })), name: t.masterName!, role: "master",
      // No failoverDetector: a killed master closes the connection and a promotion makes Redis
      // drop its clients anyway; with it on, a +switch-master arriving while the client was
      // reconnecting left it ended for good ("Connection is closed." on every command, seen in
      // the sentinel test; ioredis issue 1683 reports the same symptom).
      sentinelRetryStrategy: (times) => Math.min(100 * times, 1000),
      enableTLSForSentinelMode: t.tls,
      ...(t.tls ? { sentinelTLS: {} } : {}),
    };
    if (t.sentinelPassword !== undefined) o.sentinelPassword = t.sentinelPassword;
    return new Redis(o);
  }
  return new Redis({ ...common, host: t.nodes[0]!.host, port: t.nodes[0]!.port, db: t.db });
}

function infoField(info: string, field: string): string | undefined {
  const m = new RegExp(`^${field}:(.*)$`, "m").exec(info);
  return m?.[1]?.trim();
}

/** Any password the server or client quoted back is not repeated in a refusal. */
function clean(msg: string, t: RedisTarget): string {
  let s = msg;
  for (const secret of [t.password, t.sentinelPassword]) if (secret) s = s.split(secret).join("***");
  return s;
}

/**
 * Connects and checks that the deployment is what the configuration says, so a wrong mode is one
 * clear refusal at start-up instead of MOVED replies on every shard (issue 19):
 * single mode refuses a Redis Cluster node and a replica; cluster mode refuses servers without
 * cluster support or a cluster whose slots are not all served; sentinel mode needs the named
 * master. Throws AX_E_CONFIG naming the variable to change, or AX_E_UNAVAILABLE when nothing
 * answers within `timeoutMs`.
 */
export async function checkRedis(client: RedisClient, t: RedisTarget, timeoutMs = 10_000): Promise<void> {
  const where = `AX_REDIS_MODE=${t.mode} ${t.display}`;
  if (client.status !== "ready") {
    await new Promise<void>((resolve, reject) => {
      let lastErr = "";
      const done = (e?: AxError) => { clearTimeout(timer); client.off("ready", onReady); client.off("error", onError); if (e) reject(e); else resolve(); };
      const onReady = () => done();
      const onError = (e: unknown) => {
        const err = e as Error & { lastNodeError?: Error };
        lastErr = clean(`${err?.message ?? String(e)}${err?.lastNodeError ? ` (${err.lastNodeError.message})` : ""}`, t);
        // A plain server answers a Cluster client's CLUSTER SLOTS with this: no point waiting.
        if (/cluster support disabled/i.test(lastErr)) {
          done(new AxError("AX_E_CONFIG", `${where}: the server is not a Redis Cluster node (cluster support disabled); set AX_REDIS_MODE=single for a plain server`, { field: "AX_REDIS_MODE", value: t.mode }));
        }
      };
      const timer = setTimeout(() => done(new AxError("AX_E_UNAVAILABLE", `${where}: no ready connection after ${timeoutMs} ms${lastErr ? ` (last error: ${lastErr})` : ""}`, { field: "AX_REDIS_URL", value: t.display })), timeoutMs);
      client.once("ready", onReady);
      client.on("error", onError);
    });
  }
  if (t.mode === "cluster") {
    const info = String(await (client as Cluster).cluster("INFO"));
    const state = infoField(info, "cluster_state");
    if (state !== "ok") throw new AxError("AX_E_UNAVAILABLE", `${where}: cluster_state is ${state ?? "unknown"}; some hash slots have no master (check \`redis-cli --cluster check\`)`, { field: "AX_REDIS_URL", value: t.display });
    return;
  }
  const c = client as Redis;
  const cluster = String(await c.info("cluster"));
  if (infoField(cluster, "cluster_enabled") === "1") {
    throw new AxError("AX_E_CONFIG",
      `${where}: the server is a Redis Cluster node (cluster_enabled:1); shards whose hash slot is on another master would fail with MOVED. ` +
      "Set AX_REDIS_MODE=cluster (AX_REDIS_URL may list several nodes, comma separated)", { field: "AX_REDIS_MODE", value: t.mode });
  }
  const role = infoField(String(await c.info("replication")), "role");
  if (role === "slave") {
    throw new AxError("AX_E_CONFIG",
      `${where}: the server is a replica (read only); point AX_REDIS_URL at the master${t.mode === "single" ? ", or use AX_REDIS_MODE=sentinel to follow failovers" : ""}`,
      { field: "AX_REDIS_URL", value: t.display });
  }
}

/** CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with. */
const CRC_TABLE = (() => {
  const table = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i << 8;
    for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
    table[i] = c;
  }
  return table;
})();

function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const b of bytes) crc = ((crc << 8) & 0xffff) ^ CRC_TABLE[((crc >> 8) ^ b) & 0xff]!;
  return crc;
}

/**
 * The Redis Cluster hash slot of `key`: the part between the first `{` and the next `}` when
 * that part is not empty (the hash tag), else the whole key; CRC16 mod 16384.
 */
export function keySlot(key: string): number {
  let k = key;
  const open = key.indexOf("{");
  if (open >= 0) {
    const close = key.indexOf("}", open + 1);
    if (close > open + 1) k = key.slice(open + 1, close);
  }
  return crc16(new TextEncoder().encode(k)) & 16383;
}
