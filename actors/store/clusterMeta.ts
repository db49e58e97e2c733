import { randomBytes } from "node:crypto";
import type pg from "pg";
import { InvalidInputError } from "../../common/index.ts";
import type { ShardRow } from "./types.ts";

/** The drained set in `meta` (read by the supervisor, the status and setDrained). */
async function drainedOn(q: pg.Pool | pg.PoolClient): Promise<string[]> {
  const r = await q.query("select value from meta where key = 'drained'");
  return (r.rows[0]?.value as string[] | undefined) ?? [];
}

/**
 * The cluster's own rows: the shard count and the shards' owners and epochs, the dispatch secret,
 * the drained nodes (`meta`), and the registered executors.
 */
export class ClusterMeta {
  constructor(private readonly pool: pg.Pool, private readonly schema: string,
    private readonly transaction: <T>(fn: (c: pg.PoolClient) => Promise<T>) => Promise<T>) {}

  /** The shard count is fixed when the cluster is created; later nodes read it back. */
  initShardCount(requested: number): Promise<number> {
    return this.transaction(async (c) => {
      await c.query("select pg_advisory_xact_lock(hashtext($1))", [`ax-shards:${this.schema}`]);
      const r = await c.query("select value from meta where key = 'shard_count'");
      if (r.rowCount) return Number(r.rows[0].value);
      await c.query("insert into meta (key, value) values ('shard_count', $1::jsonb)", [JSON.stringify(requested)]);
      await c.query("insert into shards (shard) select generate_series(0, $1::int - 1) on conflict do nothing", [requested]);
      return requested;
    });
  }
  /** The cluster's dispatch secret (see runToken): made once, when the first node starts; 32 random bytes. */
  async dispatchSecret(): Promise<Buffer> {
    await this.pool.query("insert into meta (key, value) values ('dispatch_secret', to_jsonb($1::text)) on conflict (key) do nothing", [randomBytes(32).toString("hex")]);
    const r = await this.pool.query("select value from meta where key = 'dispatch_secret'");
    return Buffer.from(String(r.rows[0].value), "hex");
  }
  /** Marks a node drained (it owns no shard while drained) or not; returns the drained set. */
  setDrained(node: string, drained: boolean): Promise<string[]> {
    return this.transaction(async (c) => {
      await c.query("select pg_advisory_xact_lock(hashtext($1))", [`ax-drain:${this.schema}`]);
      const set = new Set(await drainedOn(c));
      if (drained) set.add(node); else set.delete(node);
      await c.query("insert into meta (key, value) values ('drained', $1::jsonb) on conflict (key) do update set value = excluded.value", [JSON.stringify([...set])]);
      return [...set];
    });
  }
  /** Those of these executors that are HTTP bridges (kind http). */
  async httpExecutorsAmong(names: string[]): Promise<Set<string>> {
    const r = await this.pool.query<{ name: string }>("select name from executors where kind = 'http' and name = any($1::text[])", [names]);
    return new Set(r.rows.map((x) => x.name));
  }
  async executorExists(name: string): Promise<boolean> {
    return ((await this.pool.query("select 1 from executors where name = $1", [name])).rowCount ?? 0) > 0;
  }
  /** The nodes marked drained (`ax node drain`). */
  drainedNodes(): Promise<string[]> { return drainedOn(this.pool); }
  async listShards(): Promise<ShardRow[]> {
    const r = await this.pool.query("select shard, owner, epoch, pinned_to, updated_ms from shards order by shard");
    return r.rows.map((x) => ({ shard: x.shard, owner: x.owner, epoch: x.epoch, pinnedTo: x.pinned_to, updatedMs: x.updated_ms }));
  }
  /**
   * Records that `owner` now holds `shard` under `epoch` (the lease revision). Epochs only move
   * forward: a claim with an epoch not greater than the recorded one changes nothing and
   * returns false. Takes the row lock, so it waits for any in-flight fenced batch of the old
   * owner to commit; afterwards every write under an older epoch is refused.
   */
  async claimShard(shard: number, owner: string, epoch: number, nowMs: number): Promise<boolean> {
    const r = await this.pool.query("update shards set owner = $2, epoch = $3, updated_ms = $4 where shard = $1 and epoch < $3",
      [shard, owner, epoch, nowMs]);
    return (r.rowCount ?? 0) > 0;
  }
  async setPin(shard: number, node: string | null): Promise<void> {
    const r = await this.pool.query("update shards set pinned_to = $2 where shard = $1", [shard, node]);
    if (!r.rowCount) throw new InvalidInputError("shard", shard, "no such shard");
  }
  /**
   * `holds`: what the registering instance said (the latest registration of the name decides).
   * `maxInFlight`: the executor's own limit; null keeps the one it has (none at first: the node's
   * AX_MAX_IN_FLIGHT applies).
   */
  async upsertExecutor(name: string, kind: "nats" | "http", maxInFlight: number | null, nowMs: number, holds = false): Promise<void> {
    await this.pool.query(
      `insert into executors (name, kind, max_in_flight, created_ms, last_seen_ms, holds) values ($1, $2, $3, $4, $4, $5)
       on conflict (name) do update set last_seen_ms = $4, max_in_flight = coalesce($3, executors.max_in_flight), kind = $2, holds = $5`,
      [name, kind, maxInFlight, nowMs, holds]);
  }
  async listExecutors(): Promise<ExecutorRow[]> {
    const r = await this.pool.query("select name, kind, max_in_flight, last_seen_ms, holds from executors order by name");
    return r.rows.map((x) => ({ name: x.name, kind: x.kind, maxInFlight: x.max_in_flight, lastSeenMs: x.last_seen_ms, holds: x.holds }));
  }
}

/** An executor as registered: `holds` if its instances hold runs received ahead of their due time until it (see Persister). */
export interface ExecutorRow {
  name: string; kind: string;
  /** Its own limit of runs in flight per node; null: none, the node's AX_MAX_IN_FLIGHT applies. */
  maxInFlight: number | null;
  lastSeenMs: number | null; holds: boolean;
}
