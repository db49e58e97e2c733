import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectNats } from "../../common/index.ts";
import type { AxNode } from "../../ops/node.ts";
import type { NatsConnection } from "@nats-io/transport-node";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";
import { lintExposition, parseExposition } from "../promLint.ts";

/**
 * Alert hooks end to end: a run that fails for good, its downstream marked upstream_failed and
 * a slot missed under overlap=forbid each reach a webhook (a local HTTP server, Slack-shaped
 * body) and a NATS subject, per task or per executor. And a busy node's /metrics passes the
 * promtool checks.
 */
const tc = new TestCluster("alerts");
let node: AxNode;
let base: string;
let hook: Server;
let hookUrl: string;
const received: Array<{ path: string; body: { text: string; ax: Record<string, unknown> } }> = [];
let nc: NatsConnection;
const onNats: Array<Record<string, unknown>> = [];

const api = async (op: string, body: Record<string, unknown>) => {
  const r = await fetch(`${base}/api/${op}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const j = await r.json() as { ok: boolean; value?: unknown; error?: { code: string; message: string } };
  if (!j.ok) throw new Error(`${op}: ${j.error!.code} ${j.error!.message}`);
  return j.value as Record<string, unknown>;
};

beforeAll(async () => {
  hook = createServer((req, res) => {
    let data = "";
    req.on("data", (c) => (data += c));
    req.on("end", () => { received.push({ path: req.url ?? "", body: JSON.parse(data) }); res.writeHead(200).end("ok"); });
  });
  await new Promise<void>((r) => hook.listen(0, "127.0.0.1", r));
  hookUrl = `http://127.0.0.1:${(hook.address() as AddressInfo).port}`;
  node = await tc.startNode("a1", { httpPort: 0 });
  await tc.waitForShards();
  base = node.httpAddress!;
  nc = await connectNats(tc.config.nats);
  nc.subscribe(`${tc.ns}.alerts.>`, { callback: (_e, m) => { onNats.push(m.json()); } });
  await nc.flush();
  const fails = await tc.startExecutor("alx-fail", () => { throw new Error("boom"); });
  const slow = await tc.startExecutor("alx-slow", () => new Promise((r) => setTimeout(r, 2500)));
  await Promise.all([fails.registered, slow.registered]);
}, 60_000);
afterAll(async () => {
  await nc?.close();
  await new Promise((r) => hook?.close(r));
  await tc.teardown();
});

describe("alert hooks", () => {
  it("refuses a hook without a channel, a wildcard subject or a non-HTTP URL, naming the field", async () => {
    await expect(api("alerts/set", { task: "x" })).rejects.toThrow(/AX_E_INVALID.*nats/);
    await expect(api("alerts/set", { task: "x", nats: "a.*" })).rejects.toThrow(/no wildcards/);
    await expect(api("alerts/set", { executor: "e", webhook: "file:///etc/passwd" })).rejects.toThrow(/http/);
    await expect(api("alerts/set", { executor: "e", task: "x", nats: "a" })).rejects.toThrow(/exactly one/);
    await expect(api("alerts/set", { executor: "e", nats: "a", on: ["nope"] })).rejects.toThrow(/on/);
  });

  it("a final failure and the downstream's upstream_failed reach the executor's webhook and NATS subject", async () => {
    await api("alerts/set", { executor: "alx-fail", webhook: `${hookUrl}/exec`, nats: `${tc.ns}.alerts.exec` });
    expect((await (await fetch(`${base}/api/alerts/ls`)).json()).value).toEqual([
      { scope: "executor", target: "alx-fail", nats: `${tc.ns}.alerts.exec`, webhook: `${hookUrl}/exec`, on: ["failed", "upstream_failed", "missed"] },
    ]);
    await api("task/create", { name: "al-up", executor: "alx-fail", delay: "200ms", retries: 1, backoff: "100ms" });
    await api("task/create", { name: "al-down", executor: "alx-fail", after: ["al-up"] });
    const final = await waitFor(() => received.find((r) => r.path === "/exec" && r.body.ax.kind === "failed"), 20_000, "the failure's webhook");
    expect(final.body.text).toMatch(/task al-up failed \(no retries left\).*boom/);
    expect(final.body.ax).toMatchObject({ task: "al-up", executor: "alx-fail", namespace: tc.ns, node: "a1" });
    // Two attempts, one alert: the first failure was retried.
    expect(received.filter((r) => r.body.ax.kind === "failed" && r.body.ax.task === "al-up")).toHaveLength(1);
    const uf = await waitFor(() => received.find((r) => r.body.ax.kind === "upstream_failed"), 20_000, "upstream_failed webhook");
    expect(uf.body.ax).toMatchObject({ task: "al-down" });
    await waitFor(() => onNats.some((m) => (m.ax as { kind: string }).kind === "failed") && onNats.some((m) => (m.ax as { kind: string }).kind === "upstream_failed"), 10_000, "the NATS alerts");
  }, 40_000);

  it("a task's own hook wins over its executor's, and only for the kinds it lists: a missed slot", async () => {
    await api("alerts/set", { executor: "alx-slow", webhook: `${hookUrl}/slow-exec`, on: "missed" });
    await api("alerts/set", { task: "al-slow", webhook: `${hookUrl}/slow-task`, nats: `${tc.ns}.alerts.task`, on: ["missed"] });
    await api("task/create", { name: "al-slow", executor: "alx-slow", every: "1s", overlap: "forbid" });
    const missed = await waitFor(() => received.find((r) => r.path === "/slow-task"), 20_000, "a missed-slot alert");
    expect(missed.body.ax).toMatchObject({ kind: "missed", task: "al-slow", executor: "alx-slow" });
    expect(missed.body.text).toMatch(/missed a slot.*overlap=forbid/);
    await waitFor(() => onNats.some((m) => (m.ax as { task: string }).task === "al-slow"), 10_000, "NATS missed alert");
    expect(received.some((r) => r.path === "/slow-exec")).toBe(false);
    await api("task/pause", { task: "al-slow" });
  }, 40_000);

  it("the node's /metrics passes the promtool checks and counts what happened", async () => {
    const scrape = async () => parseExposition(await (await fetch(`${base}/metrics`)).text()).families;
    // The slow task's first run (2.5 s) ends after the missed slot was seen.
    await waitFor(async () => (await scrape()).get("ax_run_duration_seconds")?.samples.some((s) => s.name === "ax_run_duration_seconds_count" && s.labels.executor === "alx-slow" && s.labels.outcome === "success"), 15_000, "a slow run's duration");
    const text = await (await fetch(`${base}/metrics`)).text();
    expect(lintExposition(text)).toEqual([]);
    const f = parseExposition(text).families;
    const sum = (name: string, pred: (l: Record<string, string>) => boolean) => (f.get(name.replace(/_count$/, "")) ?? f.get(name))?.samples
      .filter((s) => s.name === name && pred(s.labels)).reduce((n, s) => n + s.value, 0) ?? 0;
    expect(sum("ax_runs_finished_total", (l) => l.outcome === "failed" && l.executor === "alx-fail")).toBeGreaterThanOrEqual(2);
    expect(sum("ax_runs_failed_final_total", (l) => l.executor === "alx-fail")).toBeGreaterThanOrEqual(1);
    expect(sum("ax_slots_missed_total", (l) => l.executor === "alx-slow" && l.reason === "overlap")).toBeGreaterThanOrEqual(1);
    expect(sum("ax_dependency_triggers_total", (l) => l.kind === "upstream_failed")).toBeGreaterThanOrEqual(1);
    expect(sum("ax_lease_renewals_total", (l) => l.result === "ok")).toBeGreaterThan(0);
    expect(sum("ax_shards_owned", () => true)).toBe(tc.config.shardCount);
    expect(sum("ax_shards_unowned", () => true)).toBe(0);
    expect(f.get("ax_executor_last_seen_timestamp_seconds")!.samples.map((s) => s.labels.executor).sort()).toEqual(["alx-fail", "alx-slow"]);
    expect(f.get("ax_executor_queue_messages")!.samples.map((s) => s.labels.executor).sort()).toEqual(["alx-fail", "alx-slow"]);
    expect(sum("ax_run_duration_seconds_count", (l) => l.executor === "alx-slow" && l.outcome === "success")).toBeGreaterThanOrEqual(1);
    expect(sum("ax_alerts_sent_total", (l) => l.channel === "webhook" && l.result === "ok")).toBeGreaterThanOrEqual(3);
  }, 20_000);
});
