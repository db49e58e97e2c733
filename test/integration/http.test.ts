import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AxNode } from "../../ops/node.ts";
import { TestCluster } from "../cluster.ts";

const tc = new TestCluster("http");
let node: AxNode;
let base: string;

beforeAll(async () => {
  node = await tc.startNode("h1", { httpPort: 0 });
  await tc.waitForShards();
  base = node.httpAddress!;
  const ex = await tc.startExecutor("hx", async () => undefined);
  await ex.registered;
});
afterAll(() => tc.teardown());

describe("HTTP", () => {
  it("serves health, Prometheus metrics, the dashboard and the API", async () => {
    expect(await (await fetch(`${base}/healthz`)).json()).toMatchObject({ ok: true, node: "h1", shards: tc.config.shardCount });
    const ready = await fetch(`${base}/readyz`);
    expect(await ready.json()).toEqual({ ready: true, node: "h1", shards: tc.config.shardCount, reasons: [], failing: {} });
    expect(ready.status).toBe(200);
    const created = await fetch(`${base}/api/task/create`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ name: "web", executor: "hx", every: "1h" }) });
    expect(created.status).toBe(200);
    expect((await created.json()).value).toMatchObject({ name: "web", state: "pending" });
    const bad = await fetch(`${base}/api/task/create`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ name: "web2", executor: "hx", every: "-3s" }) });
    expect(bad.status).toBe(400);
    expect((await bad.json()).error).toMatchObject({ code: "AX_E_DURATION", field: "every" });
    const missing = await fetch(`${base}/api/task/show?task=nope`);
    expect(missing.status).toBe(404);
    const ls = await (await fetch(`${base}/api/task/ls`)).json();
    expect(ls.value.map((t: { name: string }) => t.name)).toEqual(["web"]);
    expect((await fetch(`${base}/api/task/create`)).status).toBe(405); // writes need POST
    const metrics = await (await fetch(`${base}/metrics`)).text();
    expect(metrics).toMatch(/ax_shards_owned \d+/);
    expect(metrics).toMatch(/ax_runs_fired_total/);
    const html = await (await fetch(`${base}/`)).text();
    expect(html).toContain("<title>ax dashboard</title>");
  });
});
