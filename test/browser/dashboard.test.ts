import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashToken } from "../../ops/httpAuth.ts";
import type { AxNode } from "../../ops/node.ts";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";

/**
 * The dashboard in a real headless Chromium (Debian's /usr/bin/chromium, installed by
 * scripts/browser.sh), against a real node with bearer tokens: sign in, search, filter and
 * page through tasks, a task page with its next times and DAG, pause and resume (and their
 * effect in the API), run now with a payload, a run's page with its why, the failures view,
 * the cluster view, every main page at 400 px without horizontal overflow. Screenshots of the
 * main pages go to docs/screenshots/.
 */
const dir = mkdtempSync(join(tmpdir(), "ax-dash-"));
const tokensFile = join(dir, "tokens");
let tc: TestCluster; // made once the tokens file exists (the configuration checks it)
let node: AxNode;
let base: string;
let token: string;
let ctx: BrowserContext;
let page: Page;
const SHOTS = "docs/screenshots";

async function api(op: string, body?: Record<string, unknown>): Promise<any> { // eslint-disable-line @typescript-eslint/no-explicit-any
  const r = await fetch(`${base}/api/${op}`, body ? { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${token}` }, body: JSON.stringify(body) } : { headers: { authorization: `Bearer ${token}` } });
  const j = await r.json() as { ok: boolean; value: unknown; error?: { message: string } };
  if (!j.ok) throw new Error(`${op}: ${j.error!.message}`);
  return j.value;
}
/** Navigates and waits until the view has drawn its data for this route. */
async function go(hash: string): Promise<void> {
  await page.evaluate((h) => { location.hash = h; }, hash);
  await page.waitForFunction((h) => document.body.getAttribute("data-ready") === h, hash, { timeout: 15_000 });
}
async function noOverflowAt400(): Promise<void> {
  const w = await page.evaluate(() => Math.max(document.documentElement.scrollWidth, document.body.scrollWidth));
  expect(w, `page width at 400 px on ${page.url()}`).toBeLessThanOrEqual(400);
}

beforeAll(async () => {
  const admin = await hashToken("ops", "admin");
  token = admin.token;
  writeFileSync(tokensFile, `${admin.line}\n`);
  tc = new TestCluster("dash", { AX_HTTP_TOKENS_FILE: tokensFile });
  node = await tc.startNode("d1", { httpPort: 0 });
  await tc.waitForShards();
  base = node.httpAddress!;
  const ok = await tc.startExecutor("web", async () => undefined);
  const bad = await tc.startExecutor("bad", () => { throw new Error("boom: the database said no"); });
  await Promise.all([ok.registered, bad.registered]);
  await api("task/bulkCreate", { tasks: Array.from({ length: 120 }, (_, i) => ({ name: `t-${String(i).padStart(3, "0")}`, executor: "web", every: "1h" })) });
  for (const n of ["t-001", "t-002", "t-003"]) await api("task/tag", { task: n, tags: ["billing"] });
  await api("task/create", { name: "nightly-extract", executor: "web", cron: "0 2 * * *", tz: "Europe/Paris", tags: ["etl"] });
  await api("task/create", { name: "nightly-transform", executor: "web", after: ["nightly-extract"], tags: ["etl"] });
  await api("task/create", { name: "nightly-load", executor: "web", after: ["nightly-transform"], tags: ["etl"] });
  await api("task/create", { name: "flaky-import", executor: "bad", delay: "100ms", retries: 1, backoff: "100ms" });
  mkdirSync(SHOTS, { recursive: true });
  ctx = await chromium.launchPersistentContext(join(dir, "profile"), {
    executablePath: "/usr/bin/chromium", headless: true, viewport: { width: 1100, height: 760 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  page = ctx.pages()[0] ?? await ctx.newPage();
  page.on("dialog", (d) => void d.accept());
  await waitFor(async () => (await api("failures")).total >= 2, 20_000, "the flaky task's two failures");
}, 120_000);

afterAll(async () => {
  await ctx?.close();
  await tc?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

describe("dashboard in Chromium", () => {
  it("asks for the bearer token, then lists tasks with a total that matches the cluster's count", async () => {
    await page.goto(`${base}/#/tasks`);
    await page.waitForSelector("#login:not([hidden])");
    await page.fill("#tok", token);
    await page.click("#login button");
    await page.waitForFunction(() => document.body.getAttribute("data-ready") === "#/tasks");
    const status = await api("status");
    expect(status.tasks).toBe(124);
    expect(await page.textContent("#count")).toBe("showing 1–50 of 124 task(s)");
    expect(await page.locator("#list tbody tr").count()).toBe(50);
    expect(await page.textContent("#summary")).toContain("124 tasks");
    // No float noise anywhere (the old page showed 1.2000000000000002 fires/s).
    expect(await page.textContent("body")).not.toMatch(/\d\.\d{5,}/);
    await page.screenshot({ path: `${SHOTS}/tasks.png` });
  });

  it("pages through every task (no silent stop), searches and filters by state, executor and tag", async () => {
    await page.click("#next");
    await page.waitForFunction(() => document.body.getAttribute("data-ready") === "#/tasks?page=2");
    await page.click("#next");
    await page.waitForFunction(() => document.body.getAttribute("data-ready") === "#/tasks?page=3");
    expect(await page.textContent("#count")).toBe("showing 101–124 of 124 task(s)");
    expect(await page.locator("#list tbody tr").count()).toBe(24);
    expect(await page.isDisabled("#next")).toBe(true);
    await go("#/tasks");
    await page.fill("input[name=q]", "t-11");
    await page.click("#filters button");
    await page.waitForFunction(() => document.body.getAttribute("data-ready") === "#/tasks?q=t-11");
    expect(await page.textContent("#count")).toBe("showing 1–10 of 10 task(s)");
    await go("#/tasks?tag=billing");
    expect(await page.locator("#list tbody tr td:first-child").allTextContents()).toEqual(["t-001", "t-002", "t-003"]);
    await go("#/tasks?executor=bad");
    expect(await page.locator("#list tbody tr td:first-child").allTextContents()).toEqual(["flaky-import"]);
    await go("#/tasks?state=failed");
    expect(await page.locator("#list tbody tr td:first-child").allTextContents()).toEqual(["flaky-import"]);
  });

  it("a task page: next times in its zone and UTC, the DAG drawn, history", async () => {
    await go("#/task/nightly-transform");
    const svgNodes = await page.locator("svg.dag g.dagnode").evaluateAll((gs) => gs.map((g) => g.getAttribute("data-task")));
    expect(svgNodes.sort()).toEqual(["nightly-extract", "nightly-load", "nightly-transform"]);
    expect(await page.locator("svg.dag path[marker-end]").count()).toBe(2);
    await go("#/task/nightly-extract");
    const first = await page.locator("#next tbody tr").first().locator("td").allTextContents();
    expect(first[0]).toMatch(/^\d{4}-\d\d-\d\d 02:00:00 GMT\+[12] \(Europe\/Paris\)$/);
    expect(first[1]).toMatch(/^\d{4}-\d\d-\d\dT0[01]:00:00Z$/);
    expect(await page.locator("#next time").first().getAttribute("title")).toMatch(/ UTC$/);
    await page.screenshot({ path: `${SHOTS}/task.png`, fullPage: true });
  });

  it("pause and resume act through the API, and the page and the API show the effect", async () => {
    await go("#/task/t-005");
    await page.click("#pause");
    await page.waitForFunction(() => document.querySelector("#tstate")?.textContent === "paused", undefined, { timeout: 15_000 });
    expect((await api("task/show?task=t-005")).state).toBe("paused");
    expect(await page.isDisabled("#pause")).toBe(true);
    const audit = await api("audit?task=t-005&limit=5");
    expect(JSON.stringify(audit)).toContain("token:ops");
    await page.click("#resume");
    await page.waitForFunction(() => document.querySelector("#tstate")?.textContent !== "paused", undefined, { timeout: 15_000 });
    expect((await api("task/show?task=t-005")).state).not.toBe("paused");
  });

  it("run now with a payload, then the run's page says why it ran", async () => {
    await go("#/task/t-007");
    await page.click("#payloadbox summary");
    await page.fill("#payload", "not json");
    await page.click("#runpayload");
    await page.waitForFunction(() => /payload: not JSON/.test(document.querySelector("#flash")?.textContent ?? ""));
    await page.fill("#payload", '{"day": "2026-12-03"}');
    await page.click("#runpayload");
    await page.waitForFunction(() => /started with the payload/.test(document.querySelector("#flash")?.textContent ?? ""));
    const runId = (await page.textContent("#flash"))!.match(/run (\S+) started/)![1]!;
    await waitFor(async () => (await api(`run/show?run=${runId}`)).run.state === "success", 15_000, "the manual run to succeed");
    await go(`#/run/${encodeURIComponent(runId)}`);
    expect(await page.textContent("#rstate")).toBe("success");
    expect((await page.locator("#why li").allTextContents()).join(" ")).toMatch(/was started by hand/);
  });

  it("failures across tasks lead to a run's page with its error and attempts; retry runs the task again", async () => {
    await go("#/failures");
    expect(await page.textContent("#fcount")).toMatch(/^2 failed or timed-out run\(s\) since /);
    expect(await page.locator("#flist tbody tr").count()).toBe(2);
    await page.screenshot({ path: `${SHOTS}/failures.png` });
    const first = page.locator("#flist tbody tr").first().locator("a").first();
    const id = await first.textContent();
    await first.click();
    await page.waitForFunction((h) => document.body.getAttribute("data-ready") === h, `#/run/${encodeURIComponent(id!)}`);
    expect(await page.textContent("#rerr")).toContain("boom: the database said no");
    expect(await page.locator("#attempts tbody tr").count()).toBe(2);
    expect((await page.locator("#why li").allTextContents()).length).toBeGreaterThan(0);
    await page.screenshot({ path: `${SHOTS}/run.png`, fullPage: true });
    const before = (await api("failures")).total;
    await page.click("#retry");
    await page.waitForFunction(() => /retry started/.test(document.querySelector("#flash")?.textContent ?? ""));
    await waitFor(async () => (await api("failures")).total > before, 15_000, "the retry to fail too");
  });

  it("the cluster view: nodes, shards with owner and epoch, executors; a shard move is applied", async () => {
    await go("#/cluster");
    expect(await page.locator("#nodes tbody tr").count()).toBe(1);
    expect(await page.locator("#shards tbody tr").count()).toBe(tc.config.shardCount);
    expect(await page.locator("#shards tbody tr").first().locator("td").nth(1).textContent()).toBe("d1");
    expect((await page.locator("#execs tbody tr td:first-child").allTextContents()).sort()).toEqual(["bad", "web"]);
    // In flight, from executors.inflight: web has nothing running; bad may have the retry's second attempt.
    const inflight = await page.locator("#execs tbody tr td:nth-child(5)").allTextContents();
    expect(inflight[0]).toMatch(/^[01]$/);
    expect(inflight[1]).toBe("0");
    await page.click('[data-move="0"]');
    await waitFor(async () => (await api("shards/ls")).find((s: { shard: number }) => s.shard === 0).pinnedTo === "d1", 10_000, "shard 0 pinned");
    await page.screenshot({ path: `${SHOTS}/cluster.png` });
  });

  it("every main page is readable at 400 px: no horizontal overflow", async () => {
    await page.setViewportSize({ width: 400, height: 800 });
    for (const h of ["#/tasks", "#/task/nightly-transform", "#/task/nightly-extract", "#/failures", "#/cluster"]) {
      await go(h);
      await noOverflowAt400();
    }
    const runId = (await api("failures")).items[0].id as string;
    await go(`#/run/${encodeURIComponent(runId)}`);
    await noOverflowAt400();
    await go("#/tasks");
    await page.screenshot({ path: `${SHOTS}/tasks-400px.png` });
  });
});
