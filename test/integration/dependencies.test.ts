import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ChildProcess } from "node:child_process";
import pg from "pg";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { names, type Names } from "../../common/index.ts";
import type { AxNode } from "../../ops/node.ts";
import type { AxClient } from "../../ops/client.ts";
import { DEPENDENCY_CONSUMER, shardTriggerConsumer, type RunContext } from "../../protocol/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

interface Run { id: string; task: string; source: string; state: string; node: string | null; shard: number; attempt: number; upstreamRuns: string[] | null; error: string | null }
interface Task { id: number; name: string; state: string; shard: number; lastError: string | null }
interface Shown extends Task {
  upstreams: Array<{ id: number; name: string; state: string; lastRun: { id: string; state: string } | null }>;
  downstreams: Array<{ id: number; name: string; state: string; lastRun: { id: string; state: string } | null }>;
}

const tc = new TestCluster("deps");
let n1: AxNode;
let n2: AxNode | null = null;
let client: AxClient;
let nc: NatsConnection;
let jsm: JetStreamManager;
let db: pg.Pool;
let N: Names;

const calls: Array<{ runId: string; task: string; attempt: number; node?: string }> = [];
const failing = new Set<string>();
const hold = new Map<string, number>(); // task name → ms a run takes

async function handler(ctx: RunContext): Promise<void> {
  calls.push({ runId: ctx.runId, task: ctx.taskName, attempt: ctx.attempt });
  await sleep(hold.get(ctx.taskName) ?? 20);
  if (failing.has(ctx.taskName)) throw new Error(`planned failure of ${ctx.taskName}`);
}

const runsOf = async (task: string) => (await client.call<Run[]>("runs", { task, limit: 100 })).reverse(); // oldest first
const callsOf = (task: string) => calls.filter((c) => c.task === task);
const show = (task: string) => client.call<Shown>("task.show", { task });
const create = (name: string, args: Record<string, unknown>) => client.call<Task>("task.create", { name, executor: "dx", ...args });
const runNow = async (task: string) => (await client.call<{ runId: string }>("run", { task })).runId;
const succeeded = async (task: string, n: number) => {
  const rs = (await runsOf(task)).filter((r) => r.state === "success");
  return rs.length >= n ? rs : null;
};
/** The edge downstream ← upstream as the DependencyActor left it. */
async function edge(down: string, up: string): Promise<{ satisfied_run: string | null; seen_run: string | null; trigger_key: string | null }> {
  const r = await db.query(
    `select d.satisfied_run, d.seen_run, d.trigger_key from dependencies d join tasks a on a.id = d.downstream join tasks b on b.id = d.upstream
     where a.name = $1 and b.name = $2`, [down, up]);
  return r.rows[0];
}

/** Holds row locks in an open transaction until released (also released by afterAll, so a failure never blocks teardown). */
const held = new Set<{ release: () => Promise<void> }>();
async function lock(sql: string, params: unknown[]): Promise<{ release: () => Promise<void> }> {
  const c = await db.connect();
  await c.query("begin");
  await c.query(sql, params);
  const h = { release: async () => { if (!held.delete(h)) return; await c.query("rollback").catch(() => undefined); c.release(); } };
  held.add(h);
  return h;
}

/** Removes every outcome message about `taskId` from the stream (a publish that never happened). */
async function deleteOutcomesOf(taskId: number): Promise<number> {
  const info = await jsm.streams.info(N.eventsStream);
  let n = 0;
  for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq++) {
    const m = await jsm.streams.getMessage(N.eventsStream, { seq }).catch(() => null);
    if (!m || !m.subject.startsWith(`${tc.ns}.outcome.`)) continue;
    if (m.json<{ outcomes: Array<{ taskId: number }> }>().outcomes.some((o) => o.taskId === taskId)) {
      await jsm.streams.deleteMessage(N.eventsStream, seq);
      n++;
    }
  }
  return n;
}

/** Nothing left for the DependencyActor nor any shard's trigger consumer: every outcome and trigger was handled and acked. */
async function settled(timeoutMs = 15_000): Promise<void> {
  await waitFor(async () => {
    const infos = await Promise.all([DEPENDENCY_CONSUMER, ...Array.from({ length: tc.config.shardCount }, (_, s) => shardTriggerConsumer(s))]
      .map((c) => jsm.consumers.info(N.eventsStream, c)));
    return infos.every((i) => i.num_pending === 0 && i.num_ack_pending === 0);
  }, timeoutMs, "outcomes and dependency triggers all handled");
}

beforeAll(async () => {
  N = names(tc.ns);
  n1 = await tc.startNode("n1");
  await tc.waitForShards();
  const ex = await tc.startExecutor("dx", handler);
  await ex.registered;
  client = await tc.client();
  nc = await connect({ servers: tc.config.natsUrl });
  jsm = await jetstreamManager(nc);
  db = new pg.Pool({ connectionString: tc.config.pgUrl, max: 4, options: `-c search_path=${tc.ns}` });
});

afterAll(async () => {
  for (const h of [...held]) await h.release();
  await db?.end();
  await nc?.close();
  await tc.teardown();
});

describe("dependencies", () => {
  it("a chain A → B → C runs in order, once per A run, with lineage; show, dag and why say so", async () => {
    await create("ch-a", { delay: "1h" });
    await create("ch-b", { after: ["ch-a"] });
    await create("ch-c", { after: ["ch-b"] });
    const started = await tc.cli(["run", "ch-a", "--json"]);
    expect(started.code).toBe(0);
    const [c1] = (await waitFor(() => succeeded("ch-c", 1), 10_000, "ch-c ran"))!;
    const [a1] = (await runsOf("ch-a"))!;
    const [b1] = (await runsOf("ch-b"))!;
    expect(a1).toMatchObject({ id: (JSON.parse(started.stdout) as { runId: string }).runId, source: "manual", state: "success" });
    expect(b1).toMatchObject({ source: "dependency", state: "success", upstreamRuns: [a1!.id] });
    expect(c1).toMatchObject({ source: "dependency", state: "success", upstreamRuns: [b1!.id] });
    // In order: each started after its upstream's run was handed to the executor.
    const order = calls.filter((c) => c.task.startsWith("ch-")).map((c) => c.task);
    expect(order).toEqual(["ch-a", "ch-b", "ch-c"]);

    // A second run of A (by hand) runs B and C once more each.
    const a2 = await runNow("ch-a");
    await waitFor(() => succeeded("ch-c", 2), 10_000, "ch-c ran twice");
    await settled();
    const bs = await runsOf("ch-b");
    expect(bs.map((r) => r.upstreamRuns)).toEqual([[a1!.id], [a2]]);
    expect((await runsOf("ch-c")).map((r) => r.upstreamRuns)).toEqual([[b1!.id], [bs[1]!.id]]);
    expect(callsOf("ch-b")).toHaveLength(2);
    expect(callsOf("ch-c")).toHaveLength(2);

    const why = await tc.cli(["why", b1!.id]);
    expect(why.code).toBe(0);
    expect(why.stdout).toContain(`ran because ch-a (run ${a1!.id}) succeeded`);
    expect(why.stdout).toContain(`Upstream run ${a1!.id} of ch-a ended success`);

    const shown = await tc.cli(["task", "show", "ch-b"]);
    expect(shown.code).toBe(0);
    expect(shown.stdout).toContain(`upstream ch-a: success, last run ${a2} success`);
    expect(shown.stdout).toContain(`downstream ch-c: success, last run ${(await runsOf("ch-c"))[1]!.id} success`);
    const j = await show("ch-b");
    expect(j.upstreams.map((u) => [u.name, u.lastRun?.state])).toEqual([["ch-a", "success"]]);
    expect(j.downstreams.map((u) => [u.name, u.lastRun?.state])).toEqual([["ch-c", "success"]]);

    const dag = await tc.cli(["dag", "ch-b"]);
    expect(dag.code).toBe(0);
    expect(dag.stdout.trim().split("\n").map((l) => l.replace(/ \[.*\]$/, ""))).toEqual(["ch-a", "  └─ ch-b", "    └─ ch-c"]);
    expect(dag.stdout).toContain("ch-b [success, last success]");
  });

  it("fan-in A1, A2, A3 → B waits for all three and runs B once; later successes coalesce", async () => {
    for (const a of ["fi-a1", "fi-a2", "fi-a3"]) await create(a, { delay: "1h" });
    await create("fi-b", { after: ["fi-a1", "fi-a2", "fi-a3"] });
    const r1 = await runNow("fi-a1");
    await waitFor(async () => (await edge("fi-b", "fi-a1")).satisfied_run === r1, 10_000, "edge a1 satisfied");
    const r2 = await runNow("fi-a2");
    await waitFor(async () => (await edge("fi-b", "fi-a2")).satisfied_run === r2, 10_000, "edge a2 satisfied");
    expect(await runsOf("fi-b")).toHaveLength(0);
    // A1 again before A3: its newer success replaces the older one.
    const r1b = await runNow("fi-a1");
    await waitFor(async () => (await edge("fi-b", "fi-a1")).satisfied_run === r1b, 10_000, "edge a1 satisfied again");
    const r3 = await runNow("fi-a3");
    const [b1] = (await waitFor(() => succeeded("fi-b", 1), 10_000, "fi-b ran"))!;
    expect(b1).toMatchObject({ source: "dependency", upstreamRuns: [r1b, r2, r3] });
    await settled();
    expect(await runsOf("fi-b")).toHaveLength(1);
    expect(callsOf("fi-b")).toHaveLength(1);
    // The edges are consumed: B waits for all three again.
    for (const a of ["fi-a1", "fi-a2", "fi-a3"]) expect((await edge("fi-b", a)).satisfied_run).toBeNull();
    const r1c = await runNow("fi-a1");
    await waitFor(async () => (await edge("fi-b", "fi-a1")).satisfied_run === r1c, 10_000, "edge a1 satisfied (second round)");
    expect(await runsOf("fi-b")).toHaveLength(1);
  });

  it("upstreams on different schedules: B runs when every upstream has succeeded since B last ran; B may have its own trigger", async () => {
    await create("ds-fast", { every: "300ms" });
    await create("ds-slow", { delay: "1h" });
    await create("ds-b", { after: ["ds-fast", "ds-slow"] });
    await waitFor(() => succeeded("ds-fast", 3), 10_000, "ds-fast succeeded 3 times");
    expect(await runsOf("ds-b")).toHaveLength(0);
    const slow = await runNow("ds-slow");
    const [b1] = (await waitFor(() => succeeded("ds-b", 1), 10_000, "ds-b ran"))!;
    await client.call("task.pause", { task: "ds-fast" });
    const fast = (await runsOf("ds-fast")).filter((r) => r.state === "success").map((r) => r.id);
    // The latest fast success at the time, not the first: successes of one upstream replace each other.
    expect(b1!.upstreamRuns).toHaveLength(2);
    expect(fast.slice(2)).toContain(b1!.upstreamRuns![0]);
    expect(b1!.upstreamRuns![1]).toBe(slow);
    await settled();
    expect(await runsOf("ds-b")).toHaveLength(1);

    // Its own trigger and its upstream both run it.
    await create("ot-a", { delay: "1h" });
    await create("ot-b", { delay: "300ms", after: ["ot-a"] });
    await waitFor(() => succeeded("ot-b", 1), 10_000, "ot-b ran by its own trigger");
    const ra = await runNow("ot-a");
    const bs = (await waitFor(() => succeeded("ot-b", 2), 10_000, "ot-b ran after ot-a"))!;
    expect(bs.map((r) => [r.source, r.upstreamRuns])).toEqual([["once", null], ["dependency", [ra]]]);
  });

  it("A fails for good → B, C and D become upstream_failed naming A's run and do not run; A's next success runs them again", async () => {
    failing.add("uf-a");
    await create("uf-a", { delay: "1h", retries: 1, backoff: "100ms" });
    await create("uf-b", { after: ["uf-a"] });
    await create("uf-c", { after: ["uf-b"] });
    await create("uf-d", { after: ["uf-c"] });
    await runNow("uf-a");
    await waitFor(async () => (await show("uf-d")).state === "upstream_failed", 10_000, "uf-d upstream_failed");
    const as = await runsOf("uf-a");
    expect(as.map((r) => [r.attempt, r.state])).toEqual([[1, "failed"], [2, "failed"]]);
    const last = as[1]!.id;
    const b = await show("uf-b");
    expect(b.state).toBe("upstream_failed");
    expect(b.lastError).toContain(`upstream uf-a failed for good (run ${last}`);
    const c = await show("uf-c");
    expect(c.lastError).toContain("upstream uf-b is upstream_failed");
    expect(c.lastError).toContain(last);
    const d = await show("uf-d");
    expect(d.lastError).toContain("upstream uf-c is upstream_failed");
    expect(d.lastError).toContain(last);
    for (const t of ["uf-b", "uf-c", "uf-d"]) expect(await runsOf(t)).toHaveLength(0);
    const shown = await tc.cli(["task", "show", "uf-b"]);
    expect(shown.stdout).toContain("task uf-b");
    expect(shown.stdout).toContain("upstream_failed");
    expect(shown.stdout).toContain(`upstream uf-a: failed, last run ${last} failed`);

    failing.delete("uf-a");
    const ok = await runNow("uf-a");
    const [d1] = (await waitFor(() => succeeded("uf-d", 1), 10_000, "uf-d ran after uf-a succeeded"))!;
    const [b1] = await runsOf("uf-b");
    const [c1] = await runsOf("uf-c");
    expect(b1).toMatchObject({ state: "success", upstreamRuns: [ok] });
    expect(c1).toMatchObject({ state: "success", upstreamRuns: [b1!.id] });
    expect(d1).toMatchObject({ upstreamRuns: [c1!.id] });
    for (const t of ["uf-b", "uf-c", "uf-d"]) expect((await show(t)).state).toBe("success");
  });

  it("upstream successes while the downstream is running coalesce: one more run, not one per success", async () => {
    hold.set("co-b", 1500);
    await create("co-a", { delay: "1h" });
    await create("co-b", { after: ["co-a"] });
    const r1 = await runNow("co-a");
    await waitFor(() => callsOf("co-b").length === 1, 10_000, "co-b started");
    const more: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await runNow("co-a");
      more.push(r);
      await waitFor(async () => (await edge("co-b", "co-a")).seen_run === r, 10_000, `co-a success ${i + 2} applied`);
    }
    const bs = (await waitFor(() => succeeded("co-b", 2), 15_000, "co-b ran a second time"))!;
    expect(bs.map((r) => r.upstreamRuns)).toEqual([[r1], [more[0]]]);
    // The later successes came before the second run fired: it used them up (the reconcile clears them).
    await waitFor(async () => (await edge("co-b", "co-a")).satisfied_run === null, 10_000, "later successes used up");
    await settled();
    expect(await runsOf("co-b")).toHaveLength(2);
    expect(callsOf("co-b")).toHaveLength(2);
  });

  it("a trigger waiting for a downstream's long run is not a failed delivery: it is never parked, and runs when the run ends", async () => {
    // Handed back once a second while B runs, the trigger passed AX_DEAD_AFTER (8) deliveries
    // after ~8 s and was parked in the dead-letter stream: B's second run never happened.
    hold.set("lw-b", 12_000);
    await create("lw-a", { delay: "1h" });
    const b = await create("lw-b", { after: ["lw-a"] });
    const r1 = await runNow("lw-a");
    await waitFor(() => callsOf("lw-b").length === 1, 10_000, "lw-b started");
    const r2 = await runNow("lw-a");
    await waitFor(async () => (await edge("lw-b", "lw-a")).seen_run === r2, 10_000, "lw-a's second success applied");
    const bs = (await waitFor(() => succeeded("lw-b", 2), 40_000, "lw-b ran a second time"))!;
    expect(bs.map((r) => r.upstreamRuns)).toEqual([[r1], [r2]]);
    await settled();
    const trig = await jsm.consumers.info(N.eventsStream, shardTriggerConsumer(b.shard));
    expect(trig.num_pending + trig.num_ack_pending).toBe(0);
    const dead = await jsm.streams.info(N.deadStream).then((i) => i.state.messages, () => 0);
    expect(dead).toBe(0);
    expect(callsOf("lw-b")).toHaveLength(2);
  }, 90_000);

  it("edges added while the upstream's shard holds its row (a run in flight) count for its runs fired after them", async () => {
    // Overlaps allowed: the second run fires while the first is in flight, so the shard keeps
    // the row it read before the edges existed, and the second run ends the chain.
    hold.set("wr-a", 5000);
    // The outcome must come with the run's end: the DependencyActor's reconcile (every 5 s) would
    // find it in the run history later and hide a stale row behind a delay.
    const reconciled = () => (n1 as unknown as { deps: { stats: { reconciled: number } } }).deps.stats.reconciled;
    const reconciledBefore = reconciled();
    await create("wr-a", { delay: "1h", overlap: "allow" });
    const first = await runNow("wr-a");
    await waitFor(() => callsOf("wr-a").length === 1, 10_000, "wr-a's first run started");
    await create("wr-b", { after: ["wr-a"] });
    await create("wr-c", { delay: "1h" });
    await client.call("task.deps.add", { task: "wr-c", upstream: "wr-a" });
    const second = await runNow("wr-a");
    expect((await runsOf("wr-a")).find((r) => r.id === first)?.state, "the first run still in flight when the second fired").toBe("running");
    const [b, c] = [(await waitFor(() => succeeded("wr-b", 1), 20_000, "wr-b ran"))!, (await waitFor(() => succeeded("wr-c", 1), 20_000, "wr-c ran"))!];
    // Triggered by the run fired after the edges (the first was fired before them: it does not count).
    expect(b.map((r) => r.upstreamRuns)).toEqual([[second]]);
    expect(c.map((r) => r.upstreamRuns)).toEqual([[second]]);
    expect(reconciled() - reconciledBefore, "outcomes recovered by the reconcile instead of sent").toBe(0);
  });

  it("cycles are refused with exit code 2 and named; two conflicting edges at once through two nodes: exactly one is accepted", async () => {
    await create("cy-a", { delay: "1h" });
    await create("cy-b", { after: ["cy-a"] });
    await create("cy-c", { after: ["cy-b"] });
    const direct = await tc.cli(["task", "deps", "add", "cy-a", "cy-b"]);
    expect(direct.code, `exit ${direct.code}; stdout: ${direct.stdout}; stderr: ${direct.stderr}`).toBe(2);
    expect(direct.stderr).toContain("cy-a → cy-b → cy-a");
    const three = await tc.cli(["task", "deps", "add", "cy-a", "cy-c"]);
    expect(three.code, `exit ${three.code}; stdout: ${three.stdout}; stderr: ${three.stderr}`).toBe(2);
    expect(three.stderr).toContain("cy-a → cy-b → cy-c → cy-a");
    const self = await tc.cli(["task", "deps", "add", "cy-a", "cy-a"]);
    expect(self.code).toBe(2);
    // A legal edge still goes in (and the graph stays as it was otherwise).
    const fine = await tc.cli(["task", "deps", "add", "cy-c", "cy-a", "--json"]);
    expect(fine.code).toBe(0);
    expect((await show("cy-c")).upstreams.map((u) => u.name).sort()).toEqual(["cy-a", "cy-b"]);
    expect((await show("cy-a")).upstreams).toEqual([]);

    n2 = await tc.startNode("n2");
    for (let i = 0; i < 4; i++) {
      await create(`cx-${i}-x`, { delay: "1h" });
      await create(`cx-${i}-y`, { delay: "1h" });
      const [p, q] = await Promise.allSettled([
        n1.api.call("task.deps.add", { task: `cx-${i}-y`, upstream: `cx-${i}-x` }),
        n2.api.call("task.deps.add", { task: `cx-${i}-x`, upstream: `cx-${i}-y` }),
      ]);
      const ok = [p, q].filter((r) => r.status === "fulfilled");
      const refused = [p, q].filter((r) => r.status === "rejected") as PromiseRejectedResult[];
      expect(ok).toHaveLength(1);
      expect(refused).toHaveLength(1);
      expect((refused[0]!.reason as { code: string }).code).toBe("AX_E_CYCLE");
      expect(String((refused[0]!.reason as Error).message)).toMatch(new RegExp(`cx-${i}-(x|y) → cx-${i}-(x|y) → cx-${i}-(x|y)`));
      const edges = await db.query(
        "select count(*)::int as n from dependencies d join tasks t on t.id = d.downstream where t.name in ($1, $2)", [`cx-${i}-x`, `cx-${i}-y`]);
      expect(edges.rows[0].n).toBe(1);
    }
  });

  it("a chain across shards owned by different nodes runs the same way", async () => {
    const nodes = [n1, n2!];
    await waitFor(() => nodes.every((n) => n.ownedShards().length > 0) && nodes.reduce((s, n) => s + n.ownedShards().length, 0) === tc.config.shardCount,
      15_000, "both nodes own shards");
    const owner = (shard: number) => nodes.find((n) => n.ownedShards().includes(shard))?.id;
    const a = await create("xs-a", { delay: "1h" });
    const picked: Task[] = [];
    // B on the other node than A, C on the other node than B.
    for (let i = 0; picked.length < 2 && i < 40; i++) {
      const t = await create(`xs-cand-${i}`, { delay: "1h" });
      const prev = picked.length ? picked[picked.length - 1]! : a;
      if (owner(t.shard) !== owner(prev.shard)) picked.push(t);
    }
    const [b, c] = picked as [Task, Task];
    expect(b).toBeDefined();
    expect(c).toBeDefined();
    await client.call("task.deps.add", { task: b.name, upstream: "xs-a" });
    await client.call("task.deps.add", { task: c.name, upstream: b.name });
    const ra = await runNow("xs-a");
    const [c1] = (await waitFor(() => succeeded(c.name, 1), 10_000, "C ran"))!;
    const [a1] = await runsOf("xs-a");
    const [b1] = await runsOf(b.name);
    expect(b1).toMatchObject({ source: "dependency", state: "success", upstreamRuns: [ra] });
    expect(c1).toMatchObject({ source: "dependency", upstreamRuns: [b1!.id] });
    expect(a1!.node).toBe(owner(a.shard));
    expect(b1!.node).toBe(owner(b.shard));
    expect(c1!.node).toBe(owner(c.shard));
    expect(a1!.node).not.toBe(b1!.node);
    expect(b1!.node).not.toBe(c1!.node);
    await settled();
    expect(callsOf(b.name)).toHaveLength(1);
    expect(callsOf(c.name)).toHaveLength(1);
  });

  it("kill -9 of the node between A's completion and B's dispatch: after restart B runs exactly once", async () => {
    // From here on only real `ax node` processes.
    await tc.stopNode(n1);
    if (n2) await tc.stopNode(n2);
    const owners = async () => (await db.query("select distinct owner from shards")).rows.map((r) => r.owner as string);
    const startNode = async (id: string): Promise<ChildProcess> => {
      const p = tc.spawn(["node", "--id", id]);
      await waitFor(async () => { const o = await owners(); return o.length === 1 && o[0] === id; }, 20_000, `${id} owns every shard`);
      return p;
    };
    const killed = (p: ChildProcess) => new Promise<void>((r) => { if (p.exitCode !== null || p.signalCode !== null) r(); else { p.once("exit", () => r()); p.kill("SIGKILL"); } });
    const waitingOnLock = async () => (await db.query(
      "select count(*)::int as n from pg_stat_activity where application_name = $1 and wait_event_type = 'Lock'", [`ax:${tc.ns}`])).rows[0].n > 0;

    let node = await startNode("k1");
    // 1. The node dies while its DependencyActor handles A's outcome (A's success is recorded,
    //    nothing for B is published yet). kd: the outcome message is redelivered to the next node.
    //    kl: the outcome message is gone too, as if the node had died between recording the run and
    //    publishing it: the next node finds it in the run history. Both B's run exactly once.
    await create("kd-a", { delay: "1h" });
    const b = await create("kd-b", { after: ["kd-a"] });
    const la = await create("kl-a", { delay: "1h" });
    const lb = await create("kl-b", { after: ["kl-a"] });
    const hold = await lock("select 1 from dependencies where downstream = any($1::bigint[]) order by downstream for update", [[b.id, lb.id]]);
    const ra = await runNow("kd-a");
    await waitFor(() => succeeded("kd-a", 1), 10_000, "kd-a recorded success");
    const rla = await runNow("kl-a");
    await waitFor(() => succeeded("kl-a", 1), 10_000, "kl-a recorded success");
    await waitFor(waitingOnLock, 10_000, "the DependencyActor is inside the window");
    await killed(node);
    expect(await deleteOutcomesOf(la.id)).toBe(1);
    await hold.release();
    expect((await db.query("select count(*)::int as n from runs where task_id = any($1::bigint[])", [[b.id, lb.id]])).rows[0].n).toBe(0);
    node = await startNode("k2");
    await waitFor(async () => (await succeeded("kd-b", 1)) && (await succeeded("kl-b", 1)), 20_000, "kd-b and kl-b ran after the restart");
    await settled(20_000); // includes kd-a's redelivered outcome, which must be recognised as applied
    expect((await runsOf("kd-b")).map((r) => [r.state, r.upstreamRuns])).toEqual([["success", [ra]]]);
    expect((await runsOf("kl-b")).map((r) => [r.state, r.upstreamRuns])).toEqual([["success", [rla]]]);
    expect(callsOf("kd-b")).toHaveLength(1);
    expect(callsOf("kl-b")).toHaveLength(1);

    // 2. The node dies while B's shard records B's run (the due trigger is out, B not dispatched):
    //    the trigger comes back to the next owner, which runs B once.
    await create("kt-a", { delay: "1h" });
    const tb = await create("kt-b", { after: ["kt-a"] });
    // NO KEY UPDATE: what the shard's task update needs (FOR UPDATE would also stop foreign-key checks elsewhere).
    const hold2 = await lock("select 1 from tasks where id = $1 for no key update", [tb.id]);
    const rta = await runNow("kt-a");
    await waitFor(() => succeeded("kt-a", 1), 10_000, "kt-a recorded success");
    await waitFor(async () => (await edge("kt-b", "kt-a")).trigger_key !== null && (await waitingOnLock()), 10_000, "kt-b's shard is inside the window");
    await killed(node);
    await hold2.release();
    // Under load the node may die a little later than the window: with B's run recorded but
    // not published (the next owner re-publishes it under its message id) or even published.
    // Either way B must run exactly once.
    expect((await db.query("select count(*)::int as n from runs where task_id = $1", [tb.id])).rows[0].n).toBeLessThanOrEqual(1);
    node = await startNode("k3");
    await waitFor(() => succeeded("kt-b", 1), 20_000, "kt-b ran after the restart");
    await settled(20_000);
    expect((await runsOf("kt-b")).map((r) => [r.state, r.upstreamRuns])).toEqual([["success", [rta]]]);
    expect(callsOf("kt-b")).toHaveLength(1);
  });
});

describe("dependencies at a full executor", () => {
  // One place per executor per node: a long run of another task holds the downstream's executor.
  const full = new TestCluster("depfull", { AX_MAX_IN_FLIGHT: "1" });
  let release = () => undefined as void; // (a failure before the test lets the blocking run go must not hang the teardown)
  afterAll(async () => { release(); await full.teardown(); }, 60_000);

  it("the trigger waits for a place: no refusal, the downstream's own schedule untouched; it runs with its lineage once the place frees", async () => {
    await full.startNode("f1");
    await full.waitForShards();
    const gate = new Promise<void>((r) => { release = r; });
    const started: string[] = [];
    const up = await full.startExecutor("fup", () => undefined);
    const slow = await full.startExecutor("fslow", async (ctx) => { started.push(ctx.taskName); if (ctx.taskName === "fblock") await gate; });
    await Promise.all([up.registered, slow.registered]);
    const c = await full.client();
    await c.call("task.create", { name: "fblock", executor: "fslow", delay: "1h", timeout: "2m" });
    await c.call("task.create", { name: "fa", executor: "fup", delay: "1h" });
    await c.call("task.create", { name: "fb", executor: "fslow", every: "1h", after: ["fa"] });
    const fbBefore = await c.call<{ nextDueAt: string; nextSource: string }>("task.show", { task: "fb" });
    await c.call("run", { task: "fblock" });
    await waitFor(() => started.includes("fblock"), 10_000, "fblock holds fslow's only place");
    const ra = (await c.call<{ runId: string }>("run", { task: "fa" })).runId;
    await waitFor(async () => (await c.call<Run[]>("runs", { task: "fa" }))[0]?.state === "success", 10_000, "fa succeeded");
    await sleep(3000); // the trigger has reached fb's shard and waits there
    expect(await c.call<Run[]>("runs", { task: "fb" }), "no run of fb (none refused) while fslow is full").toEqual([]);
    const fbWaiting = await c.call<{ nextDueAt: string; nextSource: string }>("task.show", { task: "fb" });
    expect([fbWaiting.nextDueAt, fbWaiting.nextSource]).toEqual([fbBefore.nextDueAt, fbBefore.nextSource]);
    release();
    await waitFor(async () => (await c.call<Run[]>("runs", { task: "fb" }))[0]?.state === "success", 15_000, "fb ran once fblock ended");
    const fb = await c.call<Run[]>("runs", { task: "fb" });
    expect(fb.map((r) => [r.source, r.state, r.upstreamRuns])).toEqual([["dependency", "success", [ra]]]);
    const fbAfter = await c.call<{ nextDueAt: string }>("task.show", { task: "fb" });
    expect(fbAfter.nextDueAt).toBe(fbBefore.nextDueAt);
    expect(started.filter((t) => t === "fb")).toHaveLength(1);
  }, 60_000);
});
