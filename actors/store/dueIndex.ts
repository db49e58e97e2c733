import { Redis } from "ioredis";
import { names } from "../../common/index.ts";

/**
 * take-due — KEYS[1] = the shard's due sorted set; ARGV[1] = upper bound (epoch ms, inclusive),
 * ARGV[2] = max members. Returns [member, score, member, score, ...] of the earliest members due
 * by the bound and removes exactly those, atomically: two callers never both take a member.
 */
const TAKE_DUE = `
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #items, 2 do redis.call('ZREM', KEYS[1], items[i]) end
return items`;

/**
 * The per-shard due index: a sorted set (member = task id, score = due epoch ms) per shard,
 * keys hash-tagged `{shard}` so Redis Cluster keeps a shard's keys on one slot. The near
 * horizon is taken out of it into the shard's wheel; PostgreSQL stays the truth and the index
 * is rebuilt from it whenever a shard is acquired or the index is found missing.
 */
export class DueIndex {
  readonly redis: Redis;
  private readonly n: ReturnType<typeof names>;
  constructor(redisUrl: string, readonly namespace: string) {
    this.redis = new Redis(redisUrl, {
      maxRetriesPerRequest: 3, lazyConnect: false, enableAutoPipelining: true,
      // ioredis backs off up to 5 s between reconnects: a Redis back after an outage would wait
      // that long. Capped at 1 s (jittered) so firing resumes within about a second.
      retryStrategy: (times: number) => Math.min(1000, 50 * 2 ** Math.min(times - 1, 10)) + Math.floor(Math.random() * 100),
    });
    this.redis.on("error", () => undefined); // reconnects by itself; callers see failed commands
    this.redis.defineCommand("axTakeDue", { numberOfKeys: 1, lua: TAKE_DUE });
    this.n = names(namespace);
  }
  private markerKey(shard: number): string { return `${this.n.dueKey(shard)}:built`; }

  async add(shard: number, entries: ReadonlyArray<{ id: number; dueMs: number }>): Promise<void> {
    for (let i = 0; i < entries.length; i += 1000) {
      const args: Array<string | number> = [];
      for (const e of entries.slice(i, i + 1000)) args.push(e.dueMs, e.id);
      await this.redis.zadd(this.n.dueKey(shard), ...args);
    }
  }
  async remove(shard: number, ids: ReadonlyArray<number>): Promise<void> {
    if (ids.length) await this.redis.zrem(this.n.dueKey(shard), ...ids.map(String));
  }
  async takeDue(shard: number, untilMs: number, limit: number): Promise<Array<{ id: number; dueMs: number }>> {
    const flat = (await (this.redis as unknown as { axTakeDue(k: string, a: number, b: number): Promise<string[]> })
      .axTakeDue(this.n.dueKey(shard), untilMs, limit)) ?? [];
    const out: Array<{ id: number; dueMs: number }> = [];
    for (let i = 0; i < flat.length; i += 2) out.push({ id: Number(flat[i]), dueMs: Number(flat[i + 1]) });
    return out;
  }
  async size(shard: number): Promise<number> { return this.redis.zcard(this.n.dueKey(shard)); }
  async isBuilt(shard: number): Promise<boolean> { return (await this.redis.exists(this.markerKey(shard))) === 1; }

  /** Replaces the shard's index with `entries` (read from PostgreSQL) and marks it built. */
  async rebuild(shard: number, entries: ReadonlyArray<{ id: number; dueMs: number }>): Promise<void> {
    await this.redis.del(this.n.dueKey(shard));
    await this.add(shard, entries);
    await this.redis.set(this.markerKey(shard), String(Date.now()));
  }

  /** Removes every key of the namespace (tests, `ax` namespace teardown). */
  async dropNamespace(): Promise<number> {
    let cursor = "0"; let removed = 0;
    do {
      const [next, keys] = await this.redis.scan(cursor, "MATCH", `${this.n.redisPrefix}*`, "COUNT", 1000);
      cursor = next;
      if (keys.length) removed += await this.redis.del(...keys);
    } while (cursor !== "0");
    return removed;
  }
  async close(): Promise<void> { this.redis.disconnect(); }
}
