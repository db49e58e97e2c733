import { readFileSync } from "node:fs";
import { parse } from "yaml";
import { describe, expect, it } from "vitest";
import { createMetrics } from "../../ops/metrics.ts";
import { lintExposition, parseExposition } from "../promLint.ts";

/** A registry with every ax series given a value (labelled ones included), as a busy node has. */
async function populated(): Promise<string> {
  const m = createMetrics();
  m.sources.inFlightByExecutor = () => new Map([["ex-a", 3], ["ex-b", 1]]);
  m.sources.executorQueues = async () => new Map([["ex-a", { pending: 7, ackPending: 2 }]]);
  m.sources.executorsSeen = async () => [{ name: "ex-a", lastSeenMs: 1_700_000_000_000 }, { name: "ex-b", lastSeenMs: null }];
  m.sources.unownedShards = () => 0;
  m.sources.shardLagMs = () => 1200;
  m.fired.inc({ source: "cron", executor: "ex-a" });
  m.finished.inc({ outcome: "failed", executor: "ex-a" });
  m.finalFailures.inc({ executor: "ex-a" });
  m.skipped.inc({ executor: "ex-a", reason: "overlap" });
  m.upstreamFailed.inc({ executor: "ex-b" });
  m.lateness.observe({ executor: "ex-a" }, 0.02);
  m.duration.observe({ executor: "ex-a", outcome: "success" }, 1.5);
  m.stuck.inc();
  m.shards.set(4);
  m.leaseRenewals.inc({ result: "ok" });
  m.leasesLost.inc();
  m.dependencyTriggers.inc({ kind: "run" });
  m.alertsSent.inc({ channel: "webhook", result: "ok" });
  m.dependencyUp.set({ dependency: "postgres" }, 1);
  m.dependencyOutages.inc({ dependency: "redis" });
  m.shardStartFailures.inc();
  m.refused.inc({ cause: "api" });
  return m.registry.metrics();
}

/** The metric families an expression names (ax_… and the standard Node/process ones). */
function metricNames(expr: string): string[] {
  return [...expr.matchAll(/\b((?:ax|nodejs|process)_[a-z0-9_]+)\b/g)].map((x) => x[1]!);
}
function familyExists(families: Set<string>, name: string): boolean {
  return families.has(name) || ["_bucket", "_sum", "_count"].some((s) => name.endsWith(s) && families.has(name.slice(0, -s.length)));
}

describe("metrics: what promtool check metrics checks", () => {
  it("the linter finds what promtool would refuse (so a pass means something)", () => {
    const bad = [
      "# HELP ax_things Things", "# TYPE ax_things counter", "ax_things 1",
      "# TYPE ax_nohelp gauge", "ax_nohelp 1",
      "# HELP ax_wait_milliseconds Wait", "# TYPE ax_wait_milliseconds gauge", "ax_wait_milliseconds 3",
      "# HELP ax_lag_ms Lag", "# TYPE ax_lag_ms gauge", "ax_lag_ms 3",
      "# HELP ax_open_total Open", "# TYPE ax_open_total gauge", "ax_open_total 3",
      "# HELP ax_dup_total Dup", "# TYPE ax_dup_total counter", 'ax_dup_total{a="1"} 1', 'ax_dup_total{a="1"} 2',
      "# HELP ax_lbl Lbl", "# TYPE ax_lbl gauge", 'ax_lbl{__x="1"} 1', 'ax_lbl{bad-name="1"} 1',
      "# HELP ax_h H", "# TYPE ax_h histogram", 'ax_h_bucket{le="1"} 1', "ax_h_count 1",
      "ax_orphan 1",
    ].join("\n");
    const problems = lintExposition(bad).join("\n");
    expect(problems).toMatch(/ax_things: counter metrics should have "_total" suffix/);
    expect(problems).toMatch(/ax_nohelp: no help text/);
    expect(problems).toMatch(/ax_wait_milliseconds: use base unit/);
    expect(problems).toMatch(/ax_lag_ms: metric names should not contain abbreviated units/);
    expect(problems).toMatch(/ax_open_total: non-counter metrics should not have "_total" suffix/);
    expect(problems).toMatch(/ax_dup_total\{a="1"\}: duplicate series/);
    expect(problems).toMatch(/label __x is reserved/);
    expect(problems).toMatch(/cannot parse|invalid label name/);
    expect(problems).toMatch(/no le="\+Inf" bucket/);
    expect(problems).toMatch(/no _sum/);
    expect(problems).toMatch(/ax_orphan: sample without HELP\/TYPE/);
  });

  it("a node's registry passes, with conventional names and the standard Node metrics unprefixed", async () => {
    const text = await populated();
    expect(lintExposition(text)).toEqual([]);
    const { families } = parseExposition(text);
    const type = (n: string) => families.get(n)?.type;
    // Standard Node metrics under their standard names (stock dashboards work).
    expect(type("process_cpu_seconds_total")).toBe("counter");
    expect(type("process_resident_memory_bytes")).toBe("gauge");
    expect(type("nodejs_eventloop_lag_seconds")).toBe("gauge");
    expect([...families.keys()].some((n) => n.startsWith("ax_node_"))).toBe(false);
    // What the issue asks for.
    expect(type("ax_runs_finished_total")).toBe("counter");
    expect(families.get("ax_runs_finished_total")!.samples[0]!.labels).toEqual({ outcome: "failed", executor: "ex-a" });
    expect(type("ax_fire_lateness_seconds")).toBe("histogram");
    expect(type("ax_run_duration_seconds")).toBe("histogram");
    expect(families.get("ax_runs_in_flight")!.samples.map((s) => [s.labels.executor, s.value])).toEqual([["ex-a", 3], ["ex-b", 1]]);
    expect(families.get("ax_executor_queue_messages")!.samples[0]).toMatchObject({ labels: { executor: "ex-a" }, value: 7 });
    expect(families.get("ax_executor_unacked_messages")!.samples[0]).toMatchObject({ labels: { executor: "ex-a" }, value: 2 });
    expect(families.get("ax_executor_last_seen_timestamp_seconds")!.samples).toEqual([{ name: "ax_executor_last_seen_timestamp_seconds", labels: { executor: "ex-a" }, value: 1_700_000_000 }]);
    expect(families.get("ax_shard_lag_seconds")!.samples[0]!.value).toBe(1.2);
    for (const n of ["ax_shards_owned", "ax_shards_unowned", "ax_lease_renewals_total", "ax_leases_lost_total", "ax_dependency_triggers_total", "ax_slots_missed_total", "ax_runs_failed_final_total"]) expect(families.has(n), n).toBe(true);
    // Every ax counter ends in _total, every ax time is in seconds.
    for (const f of families.values()) {
      if (f.type === "counter") expect(f.name).toMatch(/_total$/);
      expect(f.name).not.toMatch(/_(ms|millis|milliseconds)(_|$)/);
    }
  });

  it("a second scrape is still clean (per-scrape gauges reset, no duplicates)", async () => {
    const m = createMetrics();
    let n = 2;
    m.sources.inFlightByExecutor = () => new Map(n === 2 ? [["a", 1], ["b", 1]] : [["a", 5]]);
    await m.registry.metrics();
    n = 1;
    const text = await m.registry.metrics();
    expect(lintExposition(text)).toEqual([]);
    expect(parseExposition(text).families.get("ax_runs_in_flight")!.samples.map((s) => s.labels.executor)).toEqual(["a"]);
  });
});

describe("deploy/: Prometheus rules and the Grafana dashboard", () => {
  it("the alert rules have the shape Prometheus loads and name only metrics ax exports", async () => {
    const families = new Set(parseExposition(await populated()).families.keys());
    const doc = parse(readFileSync("deploy/prometheus/ax-alerts.yml", "utf8")) as { groups: Array<{ name: string; rules: Array<Record<string, unknown>> }> };
    expect(Array.isArray(doc.groups)).toBe(true);
    const names: string[] = [];
    for (const g of doc.groups) {
      expect(typeof g.name).toBe("string");
      expect(Array.isArray(g.rules)).toBe(true);
      for (const r of g.rules) {
        expect(Object.keys(r).every((k) => ["alert", "expr", "for", "keep_firing_for", "labels", "annotations"].includes(k)), JSON.stringify(r)).toBe(true);
        expect(r.alert).toMatch(/^[A-Za-z_][A-Za-z0-9_]*$/);
        expect(typeof r.expr).toBe("string");
        if (r.for !== undefined) expect(r.for).toMatch(/^(\d+(ms|s|m|h|d|w|y))+$/);
        expect((r.labels as Record<string, string>).severity).toMatch(/^(warning|critical)$/);
        expect(typeof (r.annotations as Record<string, string>).summary).toBe("string");
        const used = metricNames(r.expr as string);
        expect(used.length).toBeGreaterThan(0);
        for (const n of used) expect(familyExists(families, n), `${r.alert as string}: ${n}`).toBe(true);
        names.push(r.alert as string);
      }
    }
    expect(new Set(names).size).toBe(names.length);
    // The five the issue names.
    for (const a of ["AxTaskMissingSlots", "AxFailureRatioHigh", "AxLatenessP99High", "AxShardsUnowned", "AxExecutorGone"]) expect(names).toContain(a);
  });

  it("the Grafana dashboard is valid JSON whose queries name only exported metrics", async () => {
    const families = new Set(parseExposition(await populated()).families.keys());
    const d = JSON.parse(readFileSync("deploy/grafana/ax-dashboard.json", "utf8")) as { uid: string; title: string; panels: Array<{ id: number; title: string; gridPos: object; targets: Array<{ expr: string; refId: string }> }> };
    expect(d.uid).toBe("ax-scheduler");
    expect(new Set(d.panels.map((p) => p.id)).size).toBe(d.panels.length);
    for (const p of d.panels) {
      expect(p.targets.length).toBeGreaterThan(0);
      for (const t of p.targets) for (const n of metricNames(t.expr)) expect(familyExists(families, n), `${p.title}: ${n}`).toBe(true);
    }
  });
});
