import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { names } from "../../common/index.ts";
import type { AxClient } from "../../ops/client.ts";
import { Executor, encode, type RunContext } from "../../protocol/index.ts";
import { httpHandler, parseAllowList } from "../../ops/httpJob.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

// Issue 16 items 3, 4, 6, 7: HTTP jobs, stale work not run, executor liveness, CLI.
// Runs queued while no executor pulls are timed out at once here (AX_DELIVERY_GRACE 0s): this file is about
// what the SDK does with such stale runs; the wait for delivery is test/integration/undelivered-timeout.test.ts.
const tc = new TestCluster("opsx", { AX_DELIVERY_GRACE: "0s" });
const n = names(tc.ns);
let client: AxClient;
let nc: NatsConnection;
let server: Server;
let port = 0;
const received: Array<{ method: string; url: string; headers: IncomingMessage["headers"]; body: string }> = [];

interface Run { id: string; state: string; attempt: number; error: string | null; lateOutcome: string | null; result: unknown; source: string }
interface Why { run: Run; sentences: string[] }
interface ExecView { name: string; kind: string; liveness: string; dead: boolean; instances: number; inFlight: number; lastSeenMs: number | null }

const why = (run: string) => client.call<Why>("why", { run });
const runsOf = (task: string) => client.call<Run[]>("runs", { task, limit: 50 });
const executors = async () => ((await client.call<{ executors: ExecView[] }>("status")).executors);

beforeAll(async () => {
  server = createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      received.push({ method: req.method!, url: req.url!, headers: req.headers, body });
      if (req.url!.startsWith("/fail")) { res.writeHead(500); res.end("upstream broke"); return; }
      if (req.url!.startsWith("/big")) { res.writeHead(200); res.end("x".repeat(10_000)); return; }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ ok: true, echo: body }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  port = (server.address() as AddressInfo).port;
  await tc.startNode("n1");
  await tc.waitForShards();
  client = await tc.client();
  nc = await connect({ servers: tc.config.natsUrl });
});

afterAll(async () => {
  await nc?.close();
  await new Promise((r) => server?.close(r));
  await tc.teardown();
}, 180_000);

describe("stale work is not run (item 4)", () => {
  it("runs queued while the executor was down are not executed: timed out (and retried), task removed, task changed, superseded", async () => {
    // The executor registers (its durable consumer is made), then goes away.
    const first = new Executor({ name: "late", handler: () => undefined, namespace: tc.ns, nats: tc.config.nats, eventFlushMs: 2 });
    await first.start();
    await first.registered;
    await first.stop();

    await client.call("task.create", { name: "expires", executor: "late", delay: "1h", timeout: "1s", retries: 1, backoff: "100ms" });
    await client.call("task.create", { name: "removed", executor: "late", delay: "1h", timeout: "1m" });
    await client.call("task.create", { name: "changed", executor: "late", delay: "1h", timeout: "1m" });
    const expired = (await client.call<{ runId: string }>("run", { task: "expires" })).runId;
    const removed = (await client.call<{ runId: string }>("run", { task: "removed" })).runId;
    const changed = (await client.call<{ runId: string }>("run", { task: "changed" })).runId;
    // Meanwhile: the first run times out and its retry too; one task is removed, one changes generation.
    await waitFor(async () => (await runsOf("expires")).filter((r) => r.state === "timed_out").length === 2, 15_000, "both attempts timed out");
    await client.call("task.rm", { task: "removed" });
    // Changed in place (ax task update): its generation moves on; the queued run is of the old definition.
    await client.call("task.update", { task: "changed", payload: { v: "new" } });
    await sleep(2100); // every queued run is now older than the SDK's check threshold (2 s)

    const executed: string[] = [];
    const ex = await tc.startExecutor("late", (ctx: RunContext) => { executed.push(ctx.runId); });
    await waitFor(async () => (await why(changed)).run.state === "stale" && (await why(removed)).run.state === "stale", 15_000, "stale runs reported");
    const retry = (await runsOf("expires")).find((r) => r.source === "retry")!;
    await waitFor(async () => (await why(expired)).run.lateOutcome?.startsWith("stale: expired") && (await why(retry.id)).run.lateOutcome?.startsWith("stale: expired"), 15_000, "expired runs reported");
    expect(executed).toEqual([]);
    expect(ex.stats.expired).toBe(2);
    expect(ex.stats.stale).toBe(2);
    expect((await why(removed)).run.error).toMatch(/was removed/);
    expect((await why(changed)).run.error).toMatch(/generation 0 → 1/);
    expect((await why(changed)).sentences.join(" ")).toMatch(/executor did not run it/);
    expect((await runsOf("changed"))[0]!.state).toBe("stale");
    const staleOnly = await tc.cli(["runs", "changed", "--outcome", "stale", "--json"]);
    expect(staleOnly.code).toBe(0);
    expect((JSON.parse(staleOnly.stdout) as Run[]).map((r) => r.id)).toEqual([changed]);

    // A dispatch of a run that already ended (a retry replaced it), delivered with a deadline still
    // ahead (as under clock skew): the cluster says it is superseded, and it does not run.
    const now = Date.now();
    const ghost = { runId: expired, taskId: (await client.call<{ id: number }>("task.show", { task: "expires" })).id, taskName: "expires", attempt: 1, source: "manual",
      payload: null, scheduledAt: now - 5000, firedAt: now - 5000, timeoutMs: 60_000, deadline: now + 60_000, gen: 1 };
    const before = ex.stats.stale;
    // A new instance: the first remembers the run id as done and would drop it as a duplicate.
    const executed2: string[] = [];
    const ex2 = await tc.startExecutor("late", (ctx: RunContext) => { executed2.push(ctx.runId); });
    await ex.stop();
    await jetstream(nc).publish(n.dispatchSubject("late"), encode({ v: 1, shard: 0, epoch: 1, node: "test", runs: [ghost] }), { msgID: `d:ghost:${now}` });
    await waitFor(() => ex2.stats.stale > 0, 10_000, "superseded run refused");
    expect(executed2).toEqual([]);
    expect(ex.stats.stale).toBe(before);
  }, 180_000);
});

describe("runs delivered past their deadline (NATS leader elections)", () => {
  it("a run delivered after its deadline starts when run.check does not name it (the cluster still has it running), instead of being refused outright", async () => {
    const ran: string[] = [];
    const ex = await tc.startExecutor("late2", (ctx: RunContext) => { ran.push(ctx.runId); });
    await ex.registered;
    await client.call("task.create", { name: "late-ok", executor: "late2", delay: "1h", timeout: "1m" });
    const taskId = (await client.call<{ id: number }>("task.show", { task: "late-ok" })).id;
    // As a dispatch that waited out an election arrives: fired 70 s ago, its deadline 10 s past.
    const now = Date.now();
    const run = { runId: `r-late-${now}`, taskId, taskName: "late-ok", attempt: 1, source: "manual", payload: null,
      scheduledAt: now - 70_000, firedAt: now - 70_000, timeoutMs: 60_000, deadline: now - 10_000, gen: 0 };
    await jetstream(nc).publish(n.dispatchSubject("late2"), encode({ v: 1, shard: 0, epoch: 1, node: "test", runs: [run] }), { msgID: `d:late:${now}` });
    await waitFor(() => ran.includes(run.runId), 10_000, "the late run started");
    expect(ex.stats.expired).toBe(0);
  }, 60_000);
});

describe("run --wait and run cancel (item 4)", () => {
  it("--wait exits 0 on success, 5 after a cancel; cancel aborts the handler's signal and ends the chain", async () => {
    const reasons: unknown[] = [];
    await tc.startExecutor("waiter", async (ctx: RunContext) => {
      if ((ctx.payload as { hold?: boolean } | null)?.hold) {
        await new Promise<void>((_, reject) => ctx.signal.addEventListener("abort", () => { reasons.push(ctx.signal.reason); reject(new Error("stopped")); }));
      }
      return { done: ctx.runId };
    }).then((e) => e.registered);
    await client.call("task.create", { name: "quick", executor: "waiter", delay: "1h" });
    await client.call("task.create", { name: "held", executor: "waiter", delay: "1h", retries: 3, timeout: "1m", payload: { hold: true } });
    const ok = await tc.cli(["run", "quick", "--wait"]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/: success/);
    expect((await runsOf("quick"))[0]!.result).toMatchObject({ done: expect.any(String) });

    const waiting = tc.cli(["run", "held", "--wait"], 240_000);
    const running = await waitFor(async () => (await runsOf("held")).find((r) => r.state === "running"), 120_000, "held run running");
    const cancel = await tc.cli(["run", "cancel", running.id]);
    expect(cancel.code, cancel.stderr).toBe(0);
    expect(cancel.stdout).toMatch(/cancelled on instance/);
    const w = await waiting;
    expect(w.code).toBe(5);
    expect(w.stderr).toMatch(/cancelled by/);
    expect((reasons[0] as Error).name).toBe("CancelledError");
    const runs = await runsOf("held");
    expect(runs).toHaveLength(1); // cancelled: no retry despite retries=3
    expect(runs[0]!.state).toBe("failed");
    const again = await tc.cli(["run", "cancel", running.id]);
    expect(again.code).toBe(3);
    expect(again.stderr).toMatch(/is not running/);
  }, 360_000);
});

describe("HTTP jobs (item 3)", () => {
  let bridge: Executor;
  beforeAll(async () => {
    bridge = new Executor({ name: "web", kind: "http", namespace: tc.ns, nats: tc.config.nats, eventFlushMs: 2,
      handler: httpHandler({ allow: parseAllowList([`127.0.0.1:${port}`]), maxBodyBytes: 512 }) });
    await bridge.start();
    await bridge.registered;
  });
  afterAll(async () => { await bridge?.stop(); });

  it("sends the templated request, keeps status and body excerpt on the run", async () => {
    await client.call("task.create", { name: "hook", executor: "web", delay: "1h", payload: {
      method: "post", url: `http://127.0.0.1:${port}/hook?run={{runId}}`, headers: { "X-Task": "{{taskName}}" },
      body: { run: "{{runId}}", due: "{{scheduledAt}}", n: 1 }, timeout: "5s" } });
    const { runId } = await client.call<{ runId: string }>("run", { task: "hook" });
    const run = await waitFor(async () => (await runsOf("hook")).find((r) => r.id === runId && r.state !== "running"), 15_000, "hook run ended");
    expect(run.state).toBe("success");
    const req = received.find((r) => r.url === `/hook?run=${runId}`)!;
    expect(req.method).toBe("POST");
    expect(req.headers["x-task"]).toBe("hook");
    expect(req.headers["idempotency-key"]).toBe(runId);
    const body = JSON.parse(req.body) as { run: string; due: string; n: number };
    expect(body.run).toBe(runId);
    expect(new Date(body.due).toISOString()).toBe(body.due);
    expect(run.result).toMatchObject({ status: 200, truncated: false });
    expect((run.result as { body: string }).body).toContain(runId);
  });

  it("a failing status is retried per the task; a large body is cut to the excerpt", async () => {
    await client.call("task.create", { name: "broken", executor: "web", delay: "1h", retries: 1, backoff: "100ms", payload: { url: `http://127.0.0.1:${port}/fail` } });
    await client.call("run", { task: "broken" });
    const runs = await waitFor(async () => { const rs = await runsOf("broken"); return rs.length === 2 && rs.every((r) => r.state === "failed") ? rs : null; }, 15_000, "two failed attempts");
    for (const r of runs) {
      expect(r.error).toMatch(/answered 500/);
      expect(r.result).toMatchObject({ status: 500, body: "upstream broke" });
    }
    await client.call("task.create", { name: "big", executor: "web", delay: "1h", payload: { url: `http://127.0.0.1:${port}/big` } });
    await client.call("run", { task: "big" });
    const big = await waitFor(async () => (await runsOf("big")).find((r) => r.state === "success"), 15_000, "big run");
    expect(big.result).toMatchObject({ status: 200, bytes: 10_000, truncated: true });
    expect((big.result as { body: string }).body).toHaveLength(512);
  });

  it("a host off the allow-list is refused with the reason on the run, not retried; a bad request is refused at create", async () => {
    await client.call("task.create", { name: "elsewhere", executor: "web", delay: "1h", retries: 2, payload: { url: `http://localhost:${port}/x` } });
    await client.call("run", { task: "elsewhere" });
    const r = await waitFor(async () => (await runsOf("elsewhere")).find((x) => x.state === "failed"), 15_000, "refused run");
    expect(r.error).toMatch(/host localhost:\d+ is not on this HTTP bridge's allow-list/);
    await sleep(300);
    expect(await runsOf("elsewhere")).toHaveLength(1);
    expect(received.some((x) => x.url === "/x")).toBe(false);
    const bad = await tc.cli(["task", "create", "nourl", "--executor", "web", "--delay", "1h", "--payload", '{"url":"ftp://x/y"}']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/payload\.url/);
    const badTemplate = await tc.cli(["task", "create", "tmpl", "--executor", "web", "--delay", "1h", "--payload", '{"url":"http://127.0.0.1/{{nope}}"}']);
    expect(badTemplate.code).toBe(2);
    expect(badTemplate.stderr).toMatch(/unknown template/);
  }, 120_000);
});

describe("executors are visible (item 6)", () => {
  it("status shows an instance alive with its runs in flight, and flags the executor dead when heartbeats stop", async () => {
    // A real executor process (ax executor demo) whose runs take a minute, heartbeating every 200 ms.
    const child = tc.spawn(["executor", "demo", "--name", "beat", "--sleep", "1m", "--heartbeat", "200ms"]);
    await waitFor(async () => (await executors()).some((e) => e.name === "beat"), 30_000, "beat registered");
    await client.call("task.create", { name: "beating", executor: "beat", delay: "1h", timeout: "2m" });
    await client.call("run", { task: "beating" });
    const alive = await waitFor(async () => (await executors()).find((e) => e.name === "beat" && e.liveness === "alive" && e.inFlight === 1), 15_000, "beat alive, 1 in flight");
    expect(alive.instances).toBe(1);
    expect(alive.dead).toBe(false);
    const shown = await tc.cli(["status"]);
    expect(shown.stdout).toMatch(/beat\s+nats\s+alive\s+1\s+1/);
    // The process hangs (SIGSTOP): no goodbye, heartbeats stop. (The teardown kills it.)
    child.kill("SIGSTOP");
    const dead = await waitFor(async () => (await executors()).find((e) => e.name === "beat" && e.liveness === "dead"), 10_000, "beat flagged dead");
    expect(dead.dead).toBe(true);
    expect(dead.instances).toBe(0);
    expect((await tc.cli(["status"])).stdout).toMatch(/beat\s+nats\s+DEAD/);
  }, 180_000);

  it("an instance that stops cleanly is gone at once (no instance), not dead", async () => {
    const ex = new Executor({ name: "polite", namespace: tc.ns, nats: tc.config.nats, heartbeatMs: 200, handler: () => undefined });
    await ex.start();
    await ex.registered;
    await waitFor(async () => (await executors()).find((e) => e.name === "polite" && e.liveness === "alive"), 10_000, "polite alive");
    await ex.stop();
    const gone = await waitFor(async () => (await executors()).find((e) => e.name === "polite" && e.liveness === "none"), 10_000, "polite gone");
    expect(gone.instances).toBe(0);
  });
});

describe("CLI (item 7)", () => {
  it("--version, completion, -o yaml|wide, task ls filters, resume of a task that is not paused", async () => {
    const v = await tc.cli(["--version"]);
    expect(v.code).toBe(0);
    expect(v.stdout.trim()).toMatch(/^\d+\.\d+\.\d+/);
    const bash = await tc.cli(["completion", "bash"]);
    expect(bash.stdout).toContain("complete -o default -F __ax_complete ax");
    expect(bash.stdout).toContain("'task ls'");

    const tasks = await tc.cli(["task", "ls", "--executor", "web", "--prefix", "b", "-o", "json"]);
    expect(tasks.code, tasks.stderr).toBe(0);
    expect((JSON.parse(tasks.stdout) as Array<{ name: string }>).map((t) => t.name).sort()).toEqual(["big", "broken"]);
    const paused = await client.call<Array<{ name: string }>>("task.ls", { state: "paused" });
    expect(paused).toEqual([]);
    const yaml = await tc.cli(["task", "ls", "--prefix", "hoo", "-o", "yaml"]);
    expect(yaml.stdout).toMatch(/^- id: \d+\n {2}name: hook/);
    const wide = await tc.cli(["task", "ls", "--prefix", "hoo", "-o", "wide"]);
    expect(wide.stdout.split("\n")[0]).toMatch(/MISFIRE\s+OVERLAP/);
    const bad = await tc.cli(["task", "ls", "--state", "sleeping"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/state: one of/);
    const since = await tc.cli(["runs", "broken", "--since", "1h", "--outcome", "failed,success", "--json"]);
    expect(JSON.parse(since.stdout)).toHaveLength(2);
    expect(await client.call("runs", { task: "broken", since: "2099-01-01T00:00:00Z" })).toHaveLength(0);
    expect(await client.call("runs", { task: "broken", outcome: "success" })).toHaveLength(0);

    const resume = await tc.cli(["task", "resume", "hook"]);
    expect(resume.code).toBe(0);
    expect(resume.stdout.trim()).toMatch(/^task hook is not paused \(it is \w+\); nothing to resume$/);
    await tc.cli(["task", "pause", "hook"]);
    const resumed = await tc.cli(["task", "resume", "hook"]);
    expect(resumed.stdout).toMatch(/task hook resumed/);
  }, 300_000);
});
