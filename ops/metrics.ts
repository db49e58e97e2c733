import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

/** Seconds buckets shared by lateness (ms to a minute) and run durations (ms to an hour). */
const LATENESS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const DURATION_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600];

/** What the node answers at scrape time (gauges read on demand, never kept up to date by hand). */
export interface MetricSources {
  /** Runs in flight on this node, per executor. */
  inFlightByExecutor?: () => Map<string, number>;
  /** Messages waiting in / delivered and not acked by each executor's durable consumer (JetStream). */
  executorQueues?: () => Promise<Map<string, { pending: number; ackPending: number }>>;
  /** Executors and the last time each was seen (ms since the epoch), from PostgreSQL. */
  executorsSeen?: () => Promise<Array<{ name: string; lastSeenMs: number | null }>>;
  /** Shards no live node owns (as this node sees the cluster). */
  unownedShards?: () => number;
  /** The largest lateness of the latest fire of this node's shards, ms. */
  shardLagMs?: () => number;
}

/**
 * Prometheus metrics of one node, named the conventional way (`promtool check metrics` clean,
 * checked by test/unit/metricsConformance.test.ts): counters end in `_total`, times are in
 * seconds, the standard Node metrics keep their standard names (no prefix) so stock
 * dashboards work. Labels are bounded: executor, source, outcome, dependency, cause, kind,
 * result (never a task name or run id). Per-scrape gauges read `sources` (set by the node once
 * it runs).
 */
/**
 * A metric's child for two label values, looked up once per pair (the run duration histogram,
 * observed at every run's end): the label object is not built again on each call. prom-client
 * still hashes the labels inside a child's observe(); the run counters avoid that with PairTally.
 * Only for metrics that are never reset (a reset orphans kept children).
 */
export function childrenOf<C>(labels: (a: string, b: string) => C): (a: string, b: string) => C {
  const byFirst = new Map<string, Map<string, C>>();
  return (a, b) => {
    let m = byFirst.get(a);
    if (!m) { m = new Map(); byFirst.set(a, m); }
    let c = m.get(b);
    if (c === undefined) { c = labels(a, b); m.set(b, c); }
    return c;
  };
}

/**
 * Counts kept by label pair and added to their counter when it is read (its collect()): inc()
 * hashes the label set on every call, a labelled child's too, and the node counts every run that
 * fires and every run that ends. A scrape sees every count added before it.
 */
export class PairTally {
  private readonly byFirst = new Map<string, Map<string, number>>();
  add(a: string, b: string): void {
    let m = this.byFirst.get(a);
    if (!m) { m = new Map(); this.byFirst.set(a, m); }
    m.set(b, (m.get(b) ?? 0) + 1);
  }
  /** Hands over every count added since the last drain. */
  drain(into: (a: string, b: string, n: number) => void): void {
    for (const [a, m] of this.byFirst) for (const [b, n] of m) if (n > 0) { into(a, b, n); m.set(b, 0); }
  }
}

export function createMetrics() {
  const registry = new Registry();
  const firedTally = new PairTally();
  const finishedTally = new PairTally();
  collectDefaultMetrics({ register: registry });
  // prom-client also exposes three gauges named `_total`, which promtool refuses ("non-counter
  // metrics should not have _total suffix"); the same numbers stay, by type, in
  // nodejs_active_handles, nodejs_active_requests and nodejs_active_resources.
  for (const n of ["nodejs_active_handles_total", "nodejs_active_requests_total", "nodejs_active_resources_total"]) registry.removeSingleMetric(n);
  const sources: MetricSources = {};
  return {
    registry,
    sources,
    fired: new Counter({ name: "ax_runs_fired_total", help: "Runs dispatched, by source and executor", labelNames: ["source", "executor"], registers: [registry],
      collect() { firedTally.drain((source, executor, n) => this.inc({ source, executor }, n)); } }),
    /** Counted per run (source, executor); read into `fired` at each scrape. */
    firedTally,
    finished: new Counter({ name: "ax_runs_finished_total", help: "Runs ended, by outcome (success, failed, timed_out) and executor", labelNames: ["outcome", "executor"], registers: [registry],
      collect() { finishedTally.drain((outcome, executor, n) => this.inc({ outcome, executor }, n)); } }),
    /** Counted per run (outcome, executor); read into `finished` at each scrape. */
    finishedTally,
    finalFailures: new Counter({ name: "ax_runs_failed_final_total", help: "Runs that failed with no retries left, by executor", labelNames: ["executor"], registers: [registry] }),
    skipped: new Counter({ name: "ax_slots_missed_total", help: "Scheduled slots not fired (previous run still in flight with overlap=forbid), by executor and reason", labelNames: ["executor", "reason"], registers: [registry] }),
    upstreamFailed: new Counter({ name: "ax_tasks_upstream_failed_total", help: "Tasks marked upstream_failed, by executor", labelNames: ["executor"], registers: [registry] }),
    lateness: new Histogram({ name: "ax_fire_lateness_seconds", help: "Release time of a run minus its due time, by executor", labelNames: ["executor"], buckets: LATENESS_BUCKETS, registers: [registry] }),
    duration: new Histogram({ name: "ax_run_duration_seconds", help: "Run time from the executor's start to its end (runs whose start was reported), by executor and outcome", labelNames: ["executor", "outcome"], buckets: DURATION_BUCKETS, registers: [registry] }),
    stuck: new Counter({ name: "ax_tasks_stuck_total", help: "Tasks paused because their schedule could not be computed", registers: [registry] }),
    shards: new Gauge({ name: "ax_shards_owned", help: "Shards owned by this node", registers: [registry] }),
    unowned: new Gauge({
      name: "ax_shards_unowned", help: "Shards no live node owns, as this node sees the cluster", registers: [registry],
      collect() { if (sources.unownedShards) this.set(sources.unownedShards()); },
    }),
    shardLag: new Gauge({
      name: "ax_shard_lag_seconds", help: "Largest lateness of the latest fire among this node's shards", registers: [registry],
      collect() { if (sources.shardLagMs) this.set(sources.shardLagMs() / 1000); },
    }),
    leaseRenewals: new Counter({ name: "ax_lease_renewals_total", help: "Shard lease renewals, by result (ok, refused, unanswered)", labelNames: ["result"], registers: [registry] }),
    deadLetters: new Counter({ name: "ax_dead_letters_total", help: "Messages parked in the dead-letter stream (ax dead ls), by consumer/cause", labelNames: ["cause"], registers: [registry] }),
    recreated: new Counter({ name: "ax_jetstream_recreated_total", help: "JetStream assets found deleted and created again by this node (lease bucket, streams)", labelNames: ["asset"], registers: [registry] }),
    leasesLost: new Counter({ name: "ax_leases_lost_total", help: "Shard leases lost (renewal refused or too old)", registers: [registry] }),
    inFlight: new Gauge({
      name: "ax_runs_in_flight", help: "Runs in flight on this node, by executor", labelNames: ["executor"], registers: [registry],
      collect() {
        if (!sources.inFlightByExecutor) return;
        this.reset();
        for (const [e, n] of sources.inFlightByExecutor()) this.set({ executor: e }, n);
      },
    }),
    queue: new Gauge({
      name: "ax_executor_queue_messages", help: "Dispatch messages waiting for each executor (JetStream consumer num_pending; a message carries one or more runs)", labelNames: ["executor"], registers: [registry],
      async collect() {
        if (!sources.executorQueues) return;
        const q = await sources.executorQueues().catch(() => null);
        if (!q) return;
        this.reset();
        for (const [e, v] of q) this.set({ executor: e }, v.pending);
      },
    }),
    unacked: new Gauge({
      name: "ax_executor_unacked_messages", help: "Dispatch messages delivered to each executor and not acked yet", labelNames: ["executor"], registers: [registry],
      async collect() {
        if (!sources.executorQueues) return;
        const q = await sources.executorQueues().catch(() => null);
        if (!q) return;
        this.reset();
        for (const [e, v] of q) this.set({ executor: e }, v.ackPending);
      },
    }),
    lastSeen: new Gauge({
      name: "ax_executor_last_seen_timestamp_seconds", help: "When each executor was last seen (registration or heartbeat), Unix time", labelNames: ["executor"], registers: [registry],
      async collect() {
        if (!sources.executorsSeen) return;
        const list = await sources.executorsSeen().catch(() => null);
        if (!list) return;
        this.reset();
        for (const e of list) if (e.lastSeenMs !== null) this.set({ executor: e.name }, e.lastSeenMs / 1000);
      },
    }),
    dependencyTriggers: new Counter({ name: "ax_dependency_triggers_total", help: "Triggers published to downstream tasks, by kind (run, upstream_failed)", labelNames: ["kind"], registers: [registry] }),
    alertsSent: new Counter({ name: "ax_alerts_sent_total", help: "Alert notifications sent, by channel (nats, webhook) and result (ok, failed)", labelNames: ["channel", "result"], registers: [registry] }),
    dependencyUp: new Gauge({ name: "ax_dependency_up", help: "1 while this node reaches the dependency (postgres, redis, nats)", labelNames: ["dependency"], registers: [registry] }),
    dependencyOutages: new Counter({ name: "ax_dependency_outages_total", help: "Outages of a dependency seen by this node", labelNames: ["dependency"], registers: [registry] }),
    shardStartFailures: new Counter({ name: "ax_shard_start_failures_total", help: "Shard starts (or rounds) that failed and are retried with back-off", registers: [registry] }),
    slots: new Counter({ name: "ax_slots_total", help: "Trigger slots accounted, by outcome: run, or the reason it did not run (paused, overlap, misfire-skip, collapsed, outage, refused, upstream, excluded)", labelNames: ["outcome"], registers: [registry] }),
    refused: new Counter({ name: "ax_refused_total", help: "Inputs refused at the edges (API, HTTP), by cause", labelNames: ["cause"], registers: [registry] }),
  };
}
export type Metrics = ReturnType<typeof createMetrics>;
