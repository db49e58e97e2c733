import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

/** Prometheus metrics of one node; fed by the typed shard events. */
export function createMetrics() {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: "ax_node_" });
  return {
    registry,
    fired: new Counter({ name: "ax_runs_fired_total", help: "Runs dispatched", labelNames: ["source"], registers: [registry] }),
    finished: new Counter({ name: "ax_runs_finished_total", help: "Runs ended, by state", labelNames: ["state"], registers: [registry] }),
    lateness: new Histogram({ name: "ax_fire_lateness_seconds", help: "Fire time minus due time", buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10], registers: [registry] }),
    stuck: new Counter({ name: "ax_tasks_stuck_total", help: "Tasks paused because their schedule could not be computed", registers: [registry] }),
    shards: new Gauge({ name: "ax_shards_owned", help: "Shards owned by this node", registers: [registry] }),
    inFlight: new Gauge({ name: "ax_runs_in_flight", help: "Runs in flight on this node", registers: [registry] }),
    dependencyUp: new Gauge({ name: "ax_dependency_up", help: "1 while this node reaches the dependency (postgres, redis, nats)", labelNames: ["dependency"], registers: [registry] }),
    dependencyOutages: new Counter({ name: "ax_dependency_outages_total", help: "Outages of a dependency seen by this node", labelNames: ["dependency"], registers: [registry] }),
    shardStartFailures: new Counter({ name: "ax_shard_start_failures_total", help: "Shard starts (or rounds) that failed and are retried with back-off", registers: [registry] }),
    slots: new Counter({ name: "ax_slots_total", help: "Trigger slots accounted, by outcome: run, or the reason it did not run (paused, overlap, misfire-skip, collapsed, outage, refused, upstream, excluded)", labelNames: ["outcome"], registers: [registry] }),
    refused: new Counter({ name: "ax_refused_total", help: "Inputs refused at the edges (API, HTTP), by cause", labelNames: ["cause"], registers: [registry] }),
  };
}
export type Metrics = ReturnType<typeof createMetrics>;
