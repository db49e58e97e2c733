import { describe, expect, it } from "vitest";
import { loadConfig, names } from "../../common/index.ts";
import { keySlot } from "../../actors/store/redis.ts";
import { TAKE_DUE, TAKE_DUE_KEYS, shardKeys } from "../../actors/store/dueIndex.ts";

const refused = (env: Record<string, string>) => {
  try { loadConfig(env); } catch (e) { return e as { code: string; field: string; message: string; value: unknown }; }
  throw new Error(`accepted ${JSON.stringify(env)}`);
};

describe("Redis configuration", () => {
  it("defaults to one server", () => {
    expect(loadConfig({}).redis).toMatchObject({ mode: "single", nodes: [{ host: "127.0.0.1", port: 6379 }], db: 0, tls: false });
    expect(loadConfig({ AX_REDIS_URL: "rediss://u:p@r.internal:6380/3" }).redis)
      .toMatchObject({ mode: "single", nodes: [{ host: "r.internal", port: 6380 }], db: 3, tls: true, username: "u", password: "p" });
  });

  it("takes a seed list in cluster mode, the first URL's credentials for all", () => {
    const r = loadConfig({ AX_REDIS_URL: "redis://:s3cret@10.0.0.1:7000, 10.0.0.2:7001,redis://10.0.0.3", AX_REDIS_MODE: "cluster" }).redis;
    expect(r).toMatchObject({ mode: "cluster", password: "s3cret", nodes: [{ host: "10.0.0.1", port: 7000 }, { host: "10.0.0.2", port: 7001 }, { host: "10.0.0.3", port: 6379 }] });
    expect(r.display).not.toContain("s3cret");
  });

  it("finds Sentinel from a redis+sentinel URL or from AX_REDIS_SENTINELS + AX_REDIS_MASTER", () => {
    expect(loadConfig({ AX_REDIS_URL: "redis+sentinel://:pw@s1:26379,s2,[::1]:26380/mymaster/2" }).redis).toMatchObject({
      mode: "sentinel", masterName: "mymaster", db: 2, password: "pw",
      nodes: [{ host: "s1", port: 26379 }, { host: "s2", port: 26379 }, { host: "::1", port: 26380 }],
    });
    const r = loadConfig({ AX_REDIS_SENTINELS: "s1:1,s2:2", AX_REDIS_MASTER: "m", AX_REDIS_URL: "redis://:pw@ignored/1", AX_REDIS_SENTINEL_PASSWORD: "spw" }).redis;
    expect(r).toMatchObject({ mode: "sentinel", masterName: "m", db: 1, password: "pw", sentinelPassword: "spw", nodes: [{ host: "s1", port: 1 }, { host: "s2", port: 2 }] });
    expect(loadConfig({ AX_REDIS_MODE: "sentinel", AX_REDIS_SENTINELS: "s1:1", AX_REDIS_MASTER: "m" }).redis).toMatchObject({ db: 0, nodes: [{ host: "s1", port: 1 }] });
  });

  it.each([
    [{ AX_REDIS_MODE: "replicated" }, "AX_REDIS_MODE", /single, cluster or sentinel/],
    [{ AX_REDIS_URL: "redis://a:1,redis://b:2" }, "AX_REDIS_URL", /AX_REDIS_MODE=cluster/],
    [{ AX_REDIS_URL: "http://a:1" }, "AX_REDIS_URL", /redis: or rediss:/],
    [{ AX_REDIS_URL: "redis://a:1/2", AX_REDIS_MODE: "cluster" }, "AX_REDIS_URL", /database 0/],
    [{ AX_REDIS_URL: "redis://a:1,b:99999", AX_REDIS_MODE: "cluster" }, "AX_REDIS_URL", /out of range/],
    [{ AX_REDIS_MODE: "sentinel" }, "AX_REDIS_SENTINELS", /AX_REDIS_SENTINELS=host:port/],
    [{ AX_REDIS_SENTINELS: "s1:1" }, "AX_REDIS_MASTER", /master's name/],
    [{ AX_REDIS_URL: "redis+sentinel://s1:1/m", AX_REDIS_MODE: "cluster" }, "AX_REDIS_MODE", /redis\+sentinel/],
    [{ AX_REDIS_URL: "redis+sentinel://s1:1" }, "AX_REDIS_URL", /mastername/],
    [{ AX_REDIS_URL: "redis+sentinel://s1:1/m", AX_REDIS_SENTINELS: "s2:2" }, "AX_REDIS_SENTINELS", /not both/],
    [{ AX_REDIS_URL: "redis+sentinel://s1:1/m", AX_REDIS_MASTER: "other" }, "AX_REDIS_MASTER", /differs/],
    [{ AX_REDIS_MASTER: "m" }, "AX_REDIS_MASTER", /only used with AX_REDIS_MODE=sentinel/],
  ])("refuses %j naming %s", (env, field, why) => {
    const e = refused(env);
    expect(e).toMatchObject({ code: "AX_E_CONFIG", field });
    expect(e.message).toContain(field);
    expect(e.message).toMatch(why);
  });

  it("never prints a password in a refusal", () => {
    for (const env of <Array<Record<string, string>>>[
      { AX_REDIS_URL: "redis://user:hunter2@a:1,redis://user:hunter2@b:2" },
      { AX_REDIS_URL: "redis://:hunter2@a:1/x" },
      { AX_REDIS_URL: "redis://:hunter2@a:1,b:x", AX_REDIS_MODE: "cluster" },
      { AX_REDIS_URL: "redis+sentinel://:hunter2@s1:1" },
      { AX_PG_URL: "mysql://ax:hunter2@db/ax" },
    ]) {
      const e = refused(env);
      expect(e.message).not.toContain("hunter2");
      expect(JSON.stringify(e.value)).not.toContain("hunter2");
      expect(e.message).toContain("***");
    }
  });
});

describe("Redis Cluster hash slots", () => {
  it("computes Redis's CRC16 slots, hash tags included", () => {
    // Vectors from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    expect(keySlot("123456789")).toBe(0x31c3);
    expect(keySlot("foo")).toBe(12182);
    expect(keySlot("bar")).toBe(5061);
    expect(keySlot("{user1000}.following")).toBe(keySlot("{user1000}.followers"));
    expect(keySlot("foo{bar}{zap}")).toBe(keySlot("bar"));
    expect(keySlot("foo{}{bar}")).toBe(keySlot("foo{}{bar}")); // empty tag: the whole key
    expect(keySlot("foo{}{bar}")).not.toBe(keySlot("bar"));
    expect(keySlot("foo{{bar}}zap")).toBe(keySlot("{bar"));
  });

  it("every key a shard touches maps to one slot, and the take-due script names only its one key", () => {
    for (const ns of ["ax", "prod_eu", "t_0123456789abcdef0123456789abcd"]) {
      const slots = new Set<number>();
      for (let shard = 0; shard < 4096; shard++) {
        const keys = Object.values(shardKeys(names(ns), shard));
        expect(keys.length).toBeGreaterThanOrEqual(2);
        const s = new Set(keys.map(keySlot));
        expect(s.size, `${ns} shard ${shard}: ${keys.join(", ")}`).toBe(1);
        expect(keys.every((k) => k.startsWith(names(ns).redisPrefix))).toBe(true);
        slots.add([...s][0]!);
      }
      // The tag is the shard number alone, so shards spread over the slots (and so the masters).
      expect(slots.size).toBeGreaterThan(3000);
    }
    // The script names only the keys it is given, both of one shard: one slot.
    expect(TAKE_DUE_KEYS).toBe(2);
    expect(new Set(TAKE_DUE.match(/KEYS\[(\d+)\]/g))).toEqual(new Set(["KEYS[1]", "KEYS[2]"]));
    expect(Object.keys(shardKeys(names("ax"), 0))).toEqual(["due", "built"]);
  });
});
