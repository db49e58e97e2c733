import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AxNode } from "../../ops/node.ts";
import type { AxClient } from "../../ops/client.ts";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";

const tc = new TestCluster("hostile", { AX_MAX_PAYLOAD: "16KB" });
let node: AxNode;
let client: AxClient;
let base: string;

beforeAll(async () => {
  node = await tc.startNode("h1", { httpPort: 0 });
  await tc.waitForShards();
  base = node.httpAddress!;
  const ex = await tc.startExecutor("hx", async () => undefined);
  await ex.registered;
  client = await tc.client();
});
afterAll(() => tc.teardown());

const json = { "content-type": "application/json" };
async function post(op: string, body: unknown): Promise<{ status: number; body: { ok: boolean; error?: { code: string; field?: string; message: string } } }> {
  const r = await fetch(`${base}/api/${op}`, { method: "POST", headers: json, body: typeof body === "string" ? body : JSON.stringify(body) });
  const text = await r.text();
  expect(text).not.toMatch(/\n\s+at /); // never a stack trace
  return { status: r.status, body: JSON.parse(text) };
}
/** A payload nested `depth` levels, as JSON text (built as text: JSON.stringify itself would overflow the stack). */
const nested = (depth: number): string => `{"name":"x10","executor":"hx","every":"1s","payload":${'{"a":'.repeat(depth)}1${"}".repeat(depth)}}`;

describe("bad input gets a 4xx naming the field, never a 500 (HTTP) — the 6 causes of the 198 HTTP 500s", () => {
  it.each([
    ["a null body", "task/create", "null", "body"],
    ["a wrongly typed task.create (executor a number)", "task/create", { name: "x1", executor: 5, every: "1s" }, "executor"],
    ["a wrongly typed task.create (cron an object)", "task/create", { name: "x2", executor: "hx", cron: { a: 1 } }, "cron"],
    ["a wrongly typed task.create (after not an array)", "task/create", { name: "x3", executor: "hx", after: "y" }, "after"],
    ["1e308 as an id", "task/show", { task: 1e308 }, "task"],
    ["a 30-digit id", "task/pause", { task: "123456789012345678901234567890" }, "task"],
    ["1e308 as a limit", "task/ls", { limit: 1e308 }, "limit"],
    ["a NUL byte in a name", "task/create", { name: "a\u0000b", executor: "hx", every: "1s" }, "name"],
    ["a NUL byte in the executor", "task/create", { name: "x4", executor: "h\u0000x", every: "1s" }, "executor"],
    ["a NUL byte in the payload", "task/create", { name: "x5", executor: "hx", every: "1s", payload: { s: "a\u0000b" } }, "payload.s"],
    ["a NUL byte in a tz", "task/create", { name: "x6", executor: "hx", cron: "* * * * *", tz: "UTC\u0000" }, "tz"],
    ["a huge backoff", "task/create", { name: "x7", executor: "hx", every: "1s", retries: 2, backoff: 1e308 }, "backoff"],
    ["a huge backoff (text)", "task/create", { name: "x8", executor: "hx", every: "1s", retries: 2, backoff: "99999999999d" }, "backoff"],
    ["a huge timeout", "task/create", { name: "x9", executor: "hx", every: "1s", timeout: "9999999d" }, "timeout"],
    ["a payload nested 40 levels (limit 32)", "task/create", nested(40), "payload"],
    ["a payload nested 100,000 levels", "task/create", nested(100_000), "payload"],
    ["a 50 KB payload (limit 16 KB)", "task/create", { name: "x11", executor: "hx", every: "1s", payload: "x".repeat(50_000) }, "payload"],
    ["a 50 KB manual run payload", "run", { task: "ok1", payload: "x".repeat(50_000) }, "payload"],
    ["a 100 KB name", "task/create", { name: "n".repeat(100_000), executor: "hx", every: "1s" }, "name"],
    ["a bulk spec that is null", "task/bulkCreate", { tasks: [null] }, "tasks[0]"],
    ["a bulk spec with a NUL", "task/bulkCreate", { tasks: [{ name: "b\u0000", executor: "hx", every: "1s" }] }, "tasks[0].name"],
    ["an executor.register with a huge maxInFlight", "executor/register", { name: "e1", maxInFlight: 1e308 }, "maxInFlight"],
  ])("%s", async (_what, op, body, field) => {
    if (op === "run") await post("task/create", { name: "ok1", executor: "hx", every: "1h" });
    const r = await post(op, body);
    expect(r.status, JSON.stringify(r.body)).toBeGreaterThanOrEqual(400);
    expect(r.status).toBeLessThan(500);
    expect(r.body.error!.field).toBe(field);
  });

  it("the same over NATS: a null or non-object request is refused naming the body", async () => {
    for (const args of [null, [1], 5]) {
      const e = await client.call("task.create", args as unknown as Record<string, unknown>).then(() => null, (x: unknown) => x);
      expect(e).toMatchObject({ code: "AX_E_INVALID", field: "body" });
    }
  });
});

describe("a bulk spec cannot reach the prototype of the spec it is merged into", () => {
  it("a \"__proto__\" key in a spec over defaults stays a key: nothing it holds is inherited", async () => {
    // As JSON text: "__proto__" is then an own key of the decoded spec, as a client could send it.
    const body = '{"defaults":{"executor":"hx"},"tasks":[{"name":"proto-1","every":"1h","__proto__":{"timeout":"5s","retries":3}}]}';
    const r = await post("task/bulkCreate", body);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const t = await client.call<{ timeout: string; retries: number; executor: string }>("task.show", { task: "proto-1" });
    expect({ timeout: t.timeout, retries: t.retries, executor: t.executor }).toEqual({ timeout: "30s", retries: 0, executor: "hx" });
  });
});

describe("replies that could exceed the NATS max payload are paged", () => {
  it("attack: ax task ls --limit 100000 after bulk-creating 5,000 tasks answers them all and the node survives", async () => {
    const tasks = Array.from({ length: 5000 }, (_, i) => ({ name: `bulk-${i}`, executor: "hx", every: "1h", payload: { pad: "p".repeat(200) } }));
    for (let i = 0; i < tasks.length; i += 2500) {
      const r = await client.call<{ created: number }>("task.bulkCreate", { tasks: tasks.slice(i, i + 2500) });
      expect(r.created).toBe(2500);
    }
    const all = await client.call<unknown[]>("task.ls", { limit: 100_000 }, 60_000);
    expect(all.length).toBeGreaterThanOrEqual(5000);
    const cli = await tc.cli(["task", "ls", "--limit", "100000", "--json"], 120_000);
    expect(cli.code).toBe(0);
    expect(JSON.parse(cli.stdout).length).toBe(all.length);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    expect(await client.call("status")).toBeTruthy();
  }, 180_000);
});

describe("the node keeps firing through all of it", () => {
  it("a task created before the attacks still runs", async () => {
    await post("task/create", { name: "alive", executor: "hx", every: "1s" });
    const runs = await waitFor(async () => {
      const rs = await client.call<Array<{ state: string }>>("runs", { task: "alive", limit: 10 });
      return rs.filter((x) => x.state === "success").length >= 2 ? rs : null;
    }, 20_000, "two successful runs of alive");
    expect(runs.length).toBeGreaterThanOrEqual(2);
  });
});
