import type pg from "pg";

export interface InstanceRow { executor: string; instance: string; startedMs: number; lastSeenMs: number; inFlight: number; concurrency: number | null; stats: { everyMs?: number } | null }

/** Executor instances' heartbeats (migration 14): what `ax status` judges liveness from. */
export class ExecutorInstances {
  constructor(private readonly pool: pg.Pool) {}

  async beat(b: { executor: string; instance: string; startedMs: number; nowMs: number; inFlight: number; concurrency: number | null; stats: unknown }): Promise<void> {
    await this.pool.query(
      `insert into executor_instances (executor, instance, started_ms, last_seen_ms, in_flight, concurrency, stats) values ($1, $2, $3, $4, $5, $6, $7)
       on conflict (executor, instance) do update set last_seen_ms = $4, in_flight = $5, concurrency = $6, stats = $7`,
      [b.executor, b.instance, b.startedMs, b.nowMs, b.inFlight, b.concurrency, JSON.stringify(b.stats)]);
    await this.seen(b.executor, b.nowMs);
  }

  /** The instance said goodbye (stopped on purpose). */
  async gone(executor: string, instance: string, nowMs: number): Promise<void> {
    await this.pool.query("delete from executor_instances where executor = $1 and instance = $2", [executor, instance]);
    await this.seen(executor, nowMs);
  }

  private async seen(executor: string, nowMs: number): Promise<void> {
    await this.pool.query("update executors set last_seen_ms = greatest(coalesce(last_seen_ms, 0), $2) where name = $1", [executor, nowMs]);
  }

  async forgetOlderThan(ms: number): Promise<void> {
    await this.pool.query("delete from executor_instances where last_seen_ms < $1", [ms]);
  }

  async list(): Promise<InstanceRow[]> {
    const r = await this.pool.query("select executor, instance, started_ms, last_seen_ms, in_flight, concurrency, stats from executor_instances order by executor, instance");
    return r.rows.map((x) => ({ executor: x.executor, instance: x.instance, startedMs: Number(x.started_ms), lastSeenMs: Number(x.last_seen_ms), inFlight: x.in_flight, concurrency: x.concurrency, stats: x.stats }));
  }
}
