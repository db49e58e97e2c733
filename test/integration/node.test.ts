import { createServer } from "node:net";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { names } from "../../common/index.ts";
import type { AxNode } from "../../ops/node.ts";
import type { AxClient } from "../../ops/client.ts";
import { EventBatchSchema, decode, type RunContext, type RunEvent } from "../../protocol/index.ts";
import { DueIndex } from "../../actors/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

interface Run { id: string; source: string; state: string; dueAt: string; firedAt: string | null; finishedAt: string | null; attempt: number; error: string | null; lateOutcome: string | null; startedAt: string | null }

const tc = new TestCluster("node");
let node: AxNode;
let client: AxClient;
let nc: NatsConnection;
let nodeStartedAt = 0;
const starts: Array<{ runId: string; task: string; at: number; scheduledAt: number; attempt: number }> = [];
const hold = new Map<string, number>(); // task name → ms the handler takes
const gates = new Map<string, Promise<void>>(); // task name → its runs end when the test opens the gate
function gate(task: string): () => void {
  let open!: () => void;
  gates.set(task, new Promise<void>((r) => { open = r; }));
  return open;
}

async function handler(ctx: RunContext): Promise<void> {
  starts.push({ runId: ctx.runId, task: ctx.taskName, at: Date.now(), scheduledAt: ctx.scheduledAt, attempt: ctx.attempt });
  const p = (ctx.payload ?? {}) as { failAttempts?: number };
  const held = gates.get(ctx.taskName);
  const ms = hold.get(ctx.taskName) ?? 20;
  // 0 = no timer at all: the run ends in microtasks, before any event flush timer can fire.
  if (held) await held; else if (ms > 0) await sleep(ms);
  if (typeof p.failAttempts === "number" && ctx.attempt <= p.failAttempts) throw new Error(`planned failure ${ctx.attempt}`);
}

const runsOf = (task: string, limit = 100) => client.call<Run[]>("runs", { task, limit });
const startsOf = (task: string) => starts.filter((s) => s.task === task);

beforeAll(async () => {
  nodeStartedAt = Date.now();
  node = await tc.startNode("n1");
  await tc.waitForShards();
  const ex = await tc.startExecutor("work", handler);
  await ex.registered;
  client = await tc.client();
  nc = await connect({ servers: tc.config.natsUrl });
});

afterAll(async () => {
  await nc?.close();
  await tc.teardown();
});

describe("single node end to end", () => {
  it("an every-1s task fires at least 5 times in 6 s, no duplicate run ids, lateness under 1 s", async () => {
    await client.call("task.create", { name: "tick", executor: "work", every: "1s" });
    await sleep(6000);
    await client.call("task.pause", { task: "tick" });
    const s = startsOf("tick");
    expect(s.length).toBeGreaterThanOrEqual(5);
    expect(new Set(s.map((x) => x.runId)).size).toBe(s.length);
    for (const x of s) expect(x.at - x.scheduledAt).toBeLessThan(1000);
    const runs = await runsOf("tick");
    expect(runs.filter((r) => r.state === "success").length).toBeGreaterThanOrEqual(5);
    // The cadence follows the scheduled slots: due times are exactly 1 s apart.
    const dues = runs.map((r) => Date.parse(r.dueAt)).sort((a, b) => a - b);
    for (let i = 1; i < dues.length; i++) expect(dues[i]! - dues[i - 1]!).toBe(1000);
  });

  it("a stale due-index copy taken by a refill never replaces the task's current time in the wheel", async () => {
    // A reschedule removes the old Redis entry only after its write; a refill in between takes
    // that stale copy while the wheel already holds the current time. The row decides.
    const dueAt = Date.now() + 4000;
    await client.call("task.create", { name: "stale-copy", executor: "work", at: new Date(dueAt).toISOString() });
    const t = await client.call<{ id: number; shard: number }>("task.show", { task: "stale-copy" });
    const due = new DueIndex(tc.config.redis, tc.ns);
    try { await due.add(t.shard, [{ id: t.id, dueMs: dueAt - 2500 }]); } finally { await due.close(); }
    await waitFor(() => startsOf("stale-copy").length === 1, 10_000, "stale-copy to run");
    await sleep(500);
    const s = startsOf("stale-copy");
    expect(s).toHaveLength(1);
    expect(s[0]!.scheduledAt).toBe(dueAt);
    expect(s[0]!.at).toBeGreaterThanOrEqual(dueAt);
  });

  it("a fired one-shot's leftover due-index entry is taken by the next refill and fires nothing", async () => {
    // A run fired off the wheel skips the ZREM when the refill already took the task's entry, so
    // an entry can outlive its fire when the API wrote one just before (task.create, bulk
    // hand-off). Such a leftover is harmless: the next refill takes it and the row says done.
    const dueAt = Date.now() + 300;
    await client.call("task.create", { name: "leftover", executor: "work", at: new Date(dueAt).toISOString() });
    await waitFor(() => startsOf("leftover").length === 1, 5000, "leftover to run");
    await waitFor(async () => (await client.call<{ state: string }>("task.show", { task: "leftover" })).state === "success", 5000, "leftover to succeed");
    const t = await client.call<{ id: number; shard: number; nextDueAt: string | null }>("task.show", { task: "leftover" });
    expect(t.nextDueAt).toBeNull();
    const due = new DueIndex(tc.config.redis, tc.ns);
    const key = names(tc.ns).dueKey(t.shard);
    try {
      await due.add(t.shard, [{ id: t.id, dueMs: dueAt }]);
      await waitFor(async () => (await due.redis.zscore(key, String(t.id))) === null, 3000, "the refill to take the leftover");
      await sleep(500);
      expect(startsOf("leftover")).toHaveLength(1);
      expect((await runsOf("leftover")).length).toBe(1);
    } finally { await due.close(); }
  });

  it("task.bulkCreate applies defaults, links existing upstreams, runs an imminent one, and refuses a bad spec by its index", async () => {
    const up = await client.call<{ id: number }>("task.create", { name: "bulk-up", executor: "work", every: "1h" });
    const dueAt = Date.now() + 1500;
    const r = await client.call<{ created: number; ids: number[] }>("task.bulkCreate", {
      defaults: { executor: "work", retries: 2 }, returnIds: true,
      tasks: [{ name: "bulk-a", every: "1h" }, { name: "bulk-b", after: ["bulk-up"] }, { name: "bulk-c", at: new Date(dueAt).toISOString() }],
    });
    expect(r.created).toBe(3);
    expect(new Set(r.ids).size).toBe(3);
    const b = await client.call<{ upstreams: Array<{ id: number; name: string }>; retries: number }>("task.show", { task: "bulk-b" });
    expect(b.upstreams.map((u) => [u.id, u.name])).toEqual([[up.id, "bulk-up"]]);
    expect(b.retries).toBe(2); // from defaults
    await waitFor(() => startsOf("bulk-c").length === 1, 8000, "bulk-c to run");
    expect(startsOf("bulk-c")[0]!.scheduledAt).toBe(dueAt);
    // All or nothing, and the refusal names the spec: nothing of the batch exists afterwards.
    await expect(client.call("task.bulkCreate", { defaults: { executor: "work" }, tasks: [{ name: "bulk-ok", every: "1h" }, { name: "bulk-bad", every: "1x" }] }))
      .rejects.toMatchObject({ field: "tasks[1].every" });
    await expect(client.call("task.bulkCreate", { tasks: [{ name: "bulk-orphan", executor: "work", every: "1h", after: ["no-such-task"] }] }))
      .rejects.toMatchObject({ code: "AX_E_NOT_FOUND", field: "tasks[0].after", value: "no-such-task" });
    await expect(client.call("task.show", { task: "bulk-ok" })).rejects.toMatchObject({ code: "AX_E_NOT_FOUND" });
  });

  it("fixed-delay waits for completion before counting", async () => {
    hold.set("fd", 600);
    await client.call("task.create", { name: "fd", executor: "work", fixedDelay: "400ms" });
    await waitFor(async () => (await runsOf("fd")).filter((r) => r.state === "success").length >= 3, 10_000, "3 fixed-delay runs");
    await client.call("task.pause", { task: "fd" });
    const runs = (await runsOf("fd")).filter((r) => r.state === "success").reverse();
    for (let i = 1; i < runs.length; i++) {
      const gap = Date.parse(runs[i]!.dueAt) - Date.parse(runs[i - 1]!.finishedAt!);
      expect(gap).toBeGreaterThanOrEqual(395);
      expect(gap).toBeLessThanOrEqual(450);
    }
  });

  it("once (--delay and --at) fires exactly once", async () => {
    await client.call("task.create", { name: "once-d", executor: "work", delay: "300ms" });
    await client.call("task.create", { name: "once-at", executor: "work", at: new Date(Date.now() + 500).toISOString() });
    await waitFor(async () => (await runsOf("once-at")).some((r) => r.state === "success"), 5000, "once-at ran");
    await sleep(1500);
    expect(startsOf("once-d")).toHaveLength(1);
    expect(startsOf("once-at")).toHaveLength(1);
    const t = await client.call<{ state: string; nextDueAt: string | null }>("task.show", { task: "once-d" });
    expect(t).toMatchObject({ state: "success", nextDueAt: null });
  });

  it("a short run's end carries its start (one event), a long run sends started then completed; both record start and instance", async () => {
    hold.set("quick", 0); // ends before the executor's event flush, however loaded the machine
    hold.set("slow", 300); // far longer than the executor's event flush (5 ms)
    const seen: RunEvent[] = [];
    const sub = nc.subscribe(names(tc.ns).eventsWildcard, { callback: (_e, m) => {
      const d = decode(EventBatchSchema, m.data);
      if (d.ok) seen.push(...d.value.events);
    } });
    await nc.flush();
    await client.call("task.create", { name: "quick", executor: "work", delay: "200ms" });
    await client.call("task.create", { name: "slow", executor: "work", delay: "200ms" });
    await waitFor(async () => (await runsOf("quick")).some((r) => r.state === "success")
      && (await runsOf("slow")).some((r) => r.state === "success"), 5000, "both ran");
    sub.unsubscribe();
    const [quick] = await client.call<Array<Run & { executorInstance: string | null }>>("runs", { task: "quick" });
    const [slow] = await client.call<Array<Run & { executorInstance: string | null }>>("runs", { task: "slow" });
    const of = (runId: string) => seen.filter((e) => e.runId === runId).map((e) => ({ type: e.type, folded: e.startedAt !== undefined }));
    expect(of(quick!.id)).toEqual([{ type: "completed", folded: true }]);
    expect(of(slow!.id)).toEqual([{ type: "started", folded: false }, { type: "completed", folded: false }]);
    for (const r of [quick!, slow!]) {
      expect(r.startedAt).not.toBeNull();
      expect(r.executorInstance).toMatch(/.+/);
      expect(Date.parse(r.startedAt!)).toBeLessThanOrEqual(Date.parse(r.finishedAt!));
    }
    expect(Date.parse(slow!.finishedAt!) - Date.parse(slow!.startedAt!)).toBeGreaterThanOrEqual(290);
  });

  it("fails then succeeds with growing backoff", async () => {
    await client.call("task.create", { name: "flaky", executor: "work", delay: "100ms", retries: 3, backoff: "200ms", payload: { failAttempts: 2 } });
    await waitFor(async () => (await runsOf("flaky")).some((r) => r.state === "success"), 10_000, "flaky succeeded");
    const runs = (await runsOf("flaky")).reverse();
    expect(runs.map((r) => [r.attempt, r.state, r.source])).toEqual([[1, "failed", "once"], [2, "failed", "retry"], [3, "success", "retry"]]);
    // Equal jitter: backoff n is in [base·2^(n-1)/2, base·2^(n-1)], counted from when the node
    // decides the failure: the executor's finish plus the event's way to the node (its flush, the
    // node's decision step; 281 ms once under CI's load). The upper bounds allow a second of that.
    const wait1 = Date.parse(runs[1]!.dueAt) - Date.parse(runs[0]!.finishedAt!);
    const wait2 = Date.parse(runs[2]!.dueAt) - Date.parse(runs[1]!.finishedAt!);
    expect(wait1).toBeGreaterThanOrEqual(90); expect(wait1).toBeLessThanOrEqual(200 + 1000);
    expect(wait2).toBeGreaterThanOrEqual(190); expect(wait2).toBeLessThanOrEqual(400 + 1000);
    const why = await client.call<{ sentences: string[] }>("why", { run: runs[2]!.id });
    expect(why.sentences.join(" ")).toMatch(/retry 3\/4 of run .* \(failed: planned failure 2\)/);
    expect(why.sentences.join(" ")).toMatch(/succeeded/);
  });

  it("no completion within the timeout → timed_out → retry; a late completion does not move the task twice", async () => {
    // An executor that takes runs and never answers: a bare JetStream consumer.
    const js = jetstream(nc);
    const { ensureExecutorConsumer } = await import("../../protocol/index.ts");
    const jsm = await (await import("@nats-io/jetstream")).jetstreamManager(nc);
    const durable = await ensureExecutorConsumer(jsm, names(tc.ns), "mute");
    await client.call("executor.register", { name: "mute" });
    const consumer = await js.consumers.get(names(tc.ns).dispatchStream, durable);
    const got: string[] = [];
    const tokens = new Map<string, string>();
    const msgs = await consumer.consume({ max_messages: 10 });
    void (async () => {
      for await (const m of msgs) {
        for (const r of JSON.parse(m.string()).runs as Array<{ runId: string; token: string }>) { got.push(r.runId); tokens.set(r.runId, r.token); }
        m.ack();
      }
    })();
    await client.call("task.create", { name: "mute-task", executor: "mute", delay: "100ms", timeout: "600ms", retries: 1, backoff: "100ms" });
    await waitFor(async () => (await runsOf("mute-task")).filter((r) => r.state === "timed_out").length === 2, 10_000, "two timeouts");
    await msgs.close();
    const runs = (await runsOf("mute-task")).reverse();
    expect(runs.map((r) => [r.attempt, r.state, r.source])).toEqual([[1, "timed_out", "once"], [2, "timed_out", "retry"]]);
    expect((await client.call<{ state: string }>("task.show", { task: "mute-task" })).state).toBe("failed");
    // A forged completion (no dispatch token) changes nothing, not even the late outcome.
    const task = await client.call<{ id: number; shard: number }>("task.show", { task: "mute-task" });
    await js.publish(names(tc.ns).eventsSubject(task.shard), JSON.stringify({ v: 1, executor: "mute", instance: "forged", shard: task.shard,
      events: [{ type: "failed", runId: runs[0]!.id, taskId: task.id, at: Date.now(), error: { message: "forged" }, token: "AAAAAAAAAAAAAAAAAAAAAA" }] }));
    await sleep(1500);
    expect((await runsOf("mute-task")).find((r) => r.id === runs[0]!.id)?.lateOutcome).toBeNull();
    // Now the first run's real completion arrives, far too late.
    await js.publish(names(tc.ns).eventsSubject(task.shard), JSON.stringify({ v: 1, executor: "mute", instance: "late", shard: task.shard,
      events: [{ type: "completed", runId: runs[0]!.id, taskId: task.id, at: Date.now(), token: tokens.get(runs[0]!.id) }] }));
    await waitFor(async () => (await runsOf("mute-task")).find((r) => r.id === runs[0]!.id)?.lateOutcome === "success", 5000, "late outcome recorded");
    const after = await client.call<{ state: string }>("task.show", { task: "mute-task" });
    expect(after.state).toBe("failed");
    expect((await runsOf("mute-task")).length).toBe(2);
    expect(got).toHaveLength(2);
  });

  it("a manual run is refused while one is in flight (exit 3, message, run id); --force does not bypass it", async () => {
    // The run lasts until the test ends, however long the three CLI processes take to start.
    const release = gate("long");
    await client.call("task.create", { name: "long", executor: "work", every: "1h" });
    const first = await tc.cli(["run", "long", "--json"]);
    expect(first.code).toBe(0);
    const runId = JSON.parse(first.stdout).runId as string;
    const again = await tc.cli(["run", "long"]);
    expect(again.code).toBe(3);
    expect(again.stderr).toContain(`task is running (run ${runId})`);
    const forced = await tc.cli(["run", "long", "--force"]);
    expect(forced.code).toBe(3);
    const runs = await runsOf("long");
    expect(runs.map((r) => r.source)).toEqual(["manual"]);
    release();
    await waitFor(async () => (await runsOf("long"))[0]?.state === "success", 5000, "the held run ended");
  });

  it("pause stops fires; resume applies the misfire policy (once: one catch-up)", async () => {
    await client.call("task.create", { name: "pz", executor: "work", every: "500ms" });
    await waitFor(() => startsOf("pz").length >= 2, 5000, "pz running");
    await client.call("task.pause", { task: "pz" });
    // A run recorded ahead (AX_LEAD) is withdrawn by the pause, and its executor told to drop it;
    // counted after that window, so a loaded machine's slow revoke is not taken for a fire.
    await sleep(tc.config.leadMs + 300);
    const n = startsOf("pz").length;
    await sleep(2000);
    expect(startsOf("pz").length).toBe(n);
    const paused = await tc.cli(["run", "pz"]);
    expect(paused.code).toBe(3);
    expect(paused.stderr).toContain("paused");
    await client.call("task.resume", { task: "pz" });
    await waitFor(() => startsOf("pz").length >= n + 2, 5000, "pz resumed");
    // Runs that never started (one withdrawn by the pause, a slot skipped for overlap) have rows too.
    const runs = (await runsOf("pz")).reverse().filter((r) => r.state !== "refused" && r.state !== "skipped").slice(n);
    expect(runs[0]!.source, JSON.stringify(runs.map((r) => [r.source, r.dueAt, r.state]))).toBe("misfire");
    // One catch-up for the pause; a slot that comes due while that catch-up is in flight may add
    // its own (caused by the catch-up run), which is the overlap rule, not a second resume catch-up.
    expect(runs.filter((r) => r.source === "misfire" && (r as Run & { causedBy: string | null }).causedBy === null), JSON.stringify(await runsOf("pz"))).toHaveLength(1);
    await client.call("task.pause", { task: "pz" });
  });

  it("malformed messages on the dispatch and event subjects are refused; the node keeps working", async () => {
    const js = jetstream(nc);
    const n = names(tc.ns);
    await js.publish(n.dispatchSubject("work"), "not json");
    await js.publish(n.dispatchSubject("work"), JSON.stringify({ v: 1, shard: 0, epoch: 1, node: "x", runs: [{ runId: 5 }] }));
    for (let s = 0; s < tc.config.shardCount; s++) await js.publish(n.eventsSubject(s), JSON.stringify({ v: 2, junk: true }));
    await client.call("task.create", { name: "after-junk", executor: "work", delay: "200ms" });
    await waitFor(async () => (await runsOf("after-junk")).some((r) => r.state === "success"), 5000, "a task still runs");
    expect(node.ownedShards()).toHaveLength(tc.config.shardCount);
  });

  it("invalid CLI input is refused with exit code 2 naming the field", async () => {
    const cases: Array<[string[], RegExp]> = [
      [["task", "create", "b1", "--executor", "work", "--cron", "* 25 * * *"], /hour/],
      [["task", "create", "b2", "--executor", "nobody", "--every", "1s"], /executor/],
      [["task", "create", "b3", "--executor", "work", "--every", "ten seconds"], /every/],
      [["task", "create", "b4", "--executor", "work", "--every", "1s", "--payload", "{oops"], /payload/],
      [["task", "create", "b5", "--executor", "work", "--cron", "0 * * * *", "--tz", "Mars/Olympus"], /tz/],
      [["task", "create", "b6", "--executor", "work", "--every", "1s", "--delay", "2s"], /every|delay|trigger/],
      [["task", "create", "b7", "--executor", "work", "--every", "1s", "--misfire", "sometimes"], /misfire/],
      [["runs", "no-such-task"], /task/],
    ];
    for (const [args, re] of cases) {
      const r = await tc.cli(args);
      expect(r.code, `${args.join(" ")} → ${r.stderr}`).toBe(2);
      expect(r.stderr).toMatch(re);
    }
  });

  it("with no node in the namespace, a bad task spec is still refused naming the field; a good one is told no node runs", async () => {
    const empty = new TestCluster("nonode");
    try {
      const bad: Array<[string[], RegExp]> = [
        [["task", "create", "c1", "--executor", "work", "--every", "0s"], /every/],
        [["task", "create", "c2", "--executor", "work", "--cron", "61 * * * *"], /minute/],
        [["task", "create", "c3", "--executor", "work", "--cron", "0 * * * *", "--tz", "Mars/Olympus"], /tz/],
        [["task", "create", "bad name", "--executor", "work", "--every", "1s"], /name/],
      ];
      for (const [args, re] of bad) {
        const r = await empty.cli(args);
        expect(r.code, `${args.join(" ")} → ${r.stderr}`).toBe(2);
        expect(r.stderr).toMatch(re);
      }
      const good = await empty.cli(["task", "create", "c4", "--executor", "work", "--every", "1s"]);
      expect(good.code, good.stderr).toBe(1);
      expect(good.stderr).toMatch(/no ax node is running/);
    } finally { await empty.teardown(); }
  });

  it("a node whose HTTP port is taken exits with code 2 naming the port, and does not hang on what it opened", async () => {
    const blocker = createServer();
    await new Promise<void>((r) => blocker.listen(0, "127.0.0.1", () => r()));
    const port = (blocker.address() as AddressInfo).port;
    try {
      const r = await tc.cli(["node", "--id", "port-taken", "--http", String(port)], 20_000);
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toContain(`cannot listen on 127.0.0.1:${port}`);
      expect(r.stderr).not.toMatch(/\n\s+at /); // one line, no stack trace
    } finally { await new Promise((r) => blocker.close(r)); }
  });

  it("the CLI reads back what happened: runs --json, why, task show/preview, status", async () => {
    const runs = JSON.parse((await tc.cli(["runs", "tick", "--json", "--limit", "3"])).stdout) as Array<Record<string, unknown>>;
    expect(runs).toHaveLength(3);
    for (const k of ["id", "taskId", "source", "state", "dueAt", "firedAt", "finishedAt", "node", "shard", "epoch", "attempt"]) expect(runs[0]).toHaveProperty(k);
    const why = await tc.cli(["why", String(runs[0]!.id)]);
    expect(why.code).toBe(0);
    expect(why.stdout).toMatch(/every 1s/);
    expect(why.stdout).toMatch(/Node n1 fired it .* shard \d+ under lease epoch \d+/);
    expect(why.stdout).toMatch(/Executor instance .* started it/);
    const preview = await tc.cli(["task", "preview", "tick", "--count", "3"]);
    expect(preview.stdout.trim().split("\n")).toHaveLength(4);
    const status = JSON.parse((await tc.cli(["status", "--json"])).stdout);
    expect(status.nodes[0].shards).toHaveLength(tc.config.shardCount);
  });

  it("an executor that registered no in-flight limit is bounded by the node's AX_MAX_IN_FLIGHT, also after the node re-reads the executors", async () => {
    // The node re-reads the registered executors every 10 s; before, a row's stored default (5,000)
    // became the executor's limit there, below the node's 20,000.
    await sleep(Math.max(0, nodeStartedAt + 11_000 - Date.now()));
    const st = await client.call<{ executors: Array<{ name: string; maxInFlight: number; maxInFlightFrom: string }>; limiter: { limits: Record<string, number> } }>("status");
    expect(tc.config.maxInFlightPerExecutor).toBe(20_000);
    expect(st.limiter.limits.work).toBe(20_000);
    expect(st.executors.find((e) => e.name === "work")).toMatchObject({ maxInFlight: 20_000, maxInFlightFrom: "node" });
    const cli = await tc.cli(["status"]);
    expect(cli.stdout).toMatch(/work .*20000 \(node\)/);
  }, 30_000);
});
