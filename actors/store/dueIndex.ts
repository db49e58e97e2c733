import type { Cluster, Redis } from "ioredis";
import { names, type Names, type RedisTarget } from "../../common/index.ts";
import { checkRedis, createRedis, keySlot, type RedisClient } from "./redis.ts";

/**
 * take-due — KEYS[1] = the shard's due sorted set, KEYS[2] = its "built" marker; ARGV[1] = upper
 * bound (epoch ms, inclusive), ARGV[2] = max members. Without the marker (the index was lost or
 * never built) it takes nothing and returns nil. Otherwise returns [member, score, member,
 * score, ...] of the earliest members due by the bound and removes exactly those, atomically:
 * two callers never both take a member; then, if any member is left, the earliest score left
 * (so the list has an odd length), which tells the shard when its next refill has something to
 * take. One command per refill, where a marker check of its own was a second.
 */
export const TAKE_DUE_KEYS = 2;
export const TAKE_DUE = `
if redis.call('EXISTS', KEYS[2]) == 0 then return false end
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #items, 2 do redis.call('ZREM', KEYS[1], items[i]) end
local left = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if left[2] then items[#items + 1] = left[2] end
return items`;

/** What a take-due took, and the earliest due time left in the index (null: none). */
export interface TakenDue { items: Array<{ id: number; dueMs: number }>; nextDueMs: number | null }

/**
 * Every key the index of one shard touches. Each carries the hash tag `{shard}` (the namespace
 * cannot contain a brace), so in a Redis Cluster they share one slot: the take-due script and
 * every multi-key command stay on one master.
 */
export function shardKeys(n: Names, shard: number): { due: string; built: string } {
  const due = n.dueKey(shard);
  return { due, built: `${due}:built` };
}

/**
 * The per-shard due index: a sorted set (member = task id, score = due epoch ms) per shard,
 * keys hash-tagged `{shard}` so Redis Cluster keeps a shard's keys on one slot. The near
 * horizon is taken out of it into the shard's wheel; PostgreSQL stays the truth and the index
 * is rebuilt from it whenever a shard is acquired or the index is found missing.
 */
export class DueIndex {
  readonly redis: RedisClient;
  private readonly n: ReturnType<typeof names>;
  /**
   * Per shard, the server its keys were on when this process last rebuilt or checked its index.
   * Replication is asynchronous: a replica promoted by Sentinel or Cluster may lack the last
   * writes (entries added, or taken ones back) while its `:built` marker survived. A shard whose
   * server changed since is rebuilt from PostgreSQL as if its index were missing.
   */
  private readonly builtOn = new Map<number, string>();
  /** single and sentinel modes: bumped on every (re)connection, which is when the master may have changed. */
  private connections = 0;
  private closed = false;

  constructor(readonly target: RedisTarget, readonly namespace: string) {
    this.redis = createRedis(target);
    this.redis.on("error", () => undefined); // reconnects by itself; callers see failed commands
    this.redis.on("ready", () => { this.connections++; });
    // ioredis gives up on a connection in rare races (an "end" nobody asked for; every command
    // then fails with "Connection is closed."): start it again rather than lose Redis for good.
    this.redis.on("end", () => {
      if (this.closed) return;
      setTimeout(() => { if (!this.closed && this.redis.status === "end") this.redis.connect().catch(() => undefined); }, 1000).unref();
    });
    this.redis.defineCommand("axTakeDue", { numberOfKeys: TAKE_DUE_KEYS, lua: TAKE_DUE });
    this.n = names(namespace);
  }
  private markerKey(shard: number): string { return shardKeys(this.n, shard).built; }
  private dueKey(shard: number): string { return shardKeys(this.n, shard).due; }

  /** Waits for the connection and refuses a deployment that is not what the mode says (see checkRedis). */
  async check(timeoutMs?: number): Promise<void> { await checkRedis(this.redis, this.target, timeoutMs); }

  /** Which server holds the shard's slot now, as far as this client knows. */
  private serverOf(shard: number): string {
    if (this.target.mode === "cluster") return (this.redis as Cluster).slots[keySlot(this.dueKey(shard))]?.[0] ?? "?";
    return `connection ${this.connections}`;
  }

  /** Sets the entries' due times; `onlyNew`: leaves a task's entry that is already there as it is (ZADD NX). */
  async add(shard: number, entries: ReadonlyArray<{ id: number; dueMs: number }>, onlyNew = false): Promise<void> {
    for (let i = 0; i < entries.length; i += 1000) {
      const args: Array<string | number> = onlyNew ? ["NX"] : [];
      for (const e of entries.slice(i, i + 1000)) args.push(e.dueMs, e.id);
      await this.redis.zadd(this.dueKey(shard), ...args);
    }
  }
  async remove(shard: number, ids: ReadonlyArray<number>): Promise<void> {
    if (ids.length) await this.redis.zrem(this.dueKey(shard), ...ids.map(String));
  }
  /**
   * Takes the entries due by `untilMs` (at most `limit`), or returns null when the index must be
   * rebuilt from PostgreSQL first: its marker is missing, or the shard's server changed since
   * this process last built or checked it (a failover; see isBuilt). In the second case the
   * entries taken are dropped with the rest: the rebuild restores them.
   */
  async takeDue(shard: number, untilMs: number, limit: number): Promise<TakenDue | null> {
    const flat = await (this.redis as unknown as { axTakeDue(k: string, m: string, a: number, b: number): Promise<string[] | null> })
      .axTakeDue(this.dueKey(shard), this.markerKey(shard), untilMs, limit);
    if (flat === null || !this.builtHere(shard, true)) return null;
    const items: Array<{ id: number; dueMs: number }> = [];
    const pairs = flat.length - (flat.length % 2);
    for (let i = 0; i < pairs; i += 2) items.push({ id: Number(flat[i]), dueMs: Number(flat[i + 1]) });
    return { items, nextDueMs: flat.length % 2 ? Number(flat[flat.length - 1]) : null };
  }
  async size(shard: number): Promise<number> { return this.redis.zcard(this.dueKey(shard)); }
  /**
   * False when the marker is missing, and also when the shard's server changed since this
   * process last built or checked the index (a failover), so the caller rebuilds it.
   */
  async isBuilt(shard: number): Promise<boolean> {
    return this.builtHere(shard, (await this.redis.exists(this.markerKey(shard))) === 1);
  }

  /**
   * Whether the index counts as built, given whether a command just found its marker: only if it
   * did and the shard's server is the one this process last built or checked it on (the first
   * check records it). Called right after the command: a MOVED or a reconnection on the way has
   * updated the view of the server.
   */
  private builtHere(shard: number, markerFound: boolean): boolean {
    if (!markerFound) return false;
    const now = this.serverOf(shard);
    const seen = this.builtOn.get(shard);
    if (seen === undefined) { this.builtOn.set(shard, now); return true; }
    return seen === now;
  }

  /** Replaces the shard's index with `entries` (read from PostgreSQL) and marks it built. */
  async rebuild(shard: number, entries: ReadonlyArray<{ id: number; dueMs: number }>): Promise<void> {
    await this.rebuildFrom(shard, { stored: async () => entries });
  }

  /**
   * Rebuilds the index of a shard that is active here (a failover lost it, or lost its latest
   * writes): emptied, then filled with the due times its actor holds in memory (`memory`,
   * called once the index is empty) and then those PostgreSQL holds (`stored`, read after
   * that), neither overwriting an entry already there. PostgreSQL's rows alone are not enough:
   * a fire's task-row write waits for the run's end (AX_TASK_WRITE_DEFER), so a row may still
   * name the slot just fired while the next due time was in the lost writes; rebuilt from it,
   * the task was stranded (the stale entry was superseded when it came due, and nothing held
   * the next one). And the rounds go on meanwhile: an entry one adds after the index was emptied
   * is newer than a snapshot or a read taken before it, so none is overwritten.
   */
  async rebuildFrom(shard: number, from: { memory?: () => ReadonlyArray<{ id: number; dueMs: number }>; stored: () => Promise<ReadonlyArray<{ id: number; dueMs: number }>> }): Promise<void> {
    // The server before the first write: should it change while rebuilding, the next check
    // sees a different one and rebuilds again on the new server.
    const on = this.serverOf(shard);
    this.builtOn.delete(shard);
    await this.redis.del(this.dueKey(shard));
    if (from.memory) await this.add(shard, from.memory(), true);
    await this.add(shard, await from.stored(), true);
    await this.redis.set(this.markerKey(shard), String(Date.now()));
    this.builtOn.set(shard, on);
  }

  /** Removes every key of the namespace (tests, `ax` namespace teardown). */
  async dropNamespace(): Promise<number> {
    // A cluster has its keys spread over the masters: scan each; keys of different slots
    // cannot share one DEL there, so they go one by one.
    const servers: Redis[] = this.target.mode === "cluster" ? (this.redis as Cluster).nodes("master") : [this.redis as Redis];
    let removed = 0;
    for (const r of servers) {
      let cursor = "0";
      do {
        const [next, keys] = await r.scan(cursor, "MATCH", `${this.n.redisPrefix}*`, "COUNT", 1000);
        cursor = next;
        if (keys.length) removed += (await Promise.all(keys.map((k) => r.del(k)))).reduce((a, b) => a + b, 0);
      } while (cursor !== "0");
    }
    return removed;
  }
  async close(): Promise<void> { this.closed = true; this.redis.disconnect(); }
}
