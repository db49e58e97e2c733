import { spawn } from "node:child_process";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { afterAll, beforeAll, expect, it } from "vitest";
import { Store } from "../actors/index.ts";
import { names } from "../common/index.ts";
import type { AxClient } from "../ops/client.ts";
import { TestCluster } from "./cluster.ts";
import { waitFor } from "./helpers.ts";
import { cli, RedisProcs } from "./redisDeploy.ts";

/**
 * One Redis deployment of a test's own (a Redis Cluster, or a Sentinel-managed master) and what
 * the shared scenario needs to know about it.
 */
export interface Deployment {
  /** AX_REDIS_* for the node. */
  env: Record<string, string>;
  /** A misconfiguration of this deployment and what its refusal must say. */
  wrong: { env: Record<string, string>; says: RegExp };
  /** The master the failover kills, its replica, and which of `shards` have their keys on it. */
  victim(shards: number[], keyOf: (shard: number) => string): Promise<{ master: number; replica: number; shards: number[] }>;
  /** Resolves once `replica` serves as master (after `master` was killed). */
  promoted(master: number, replica: number): Promise<void>;
}

interface Run { task: string; slot: number | null; source: string; state: string; fired: number; shard: number }

const SHARDS = 16;

/**
 * The scenario of issue 19 against one deployment: a wrong mode is one clear error; a node with
 * tasks on every shard fires them all; then the master holding some shards' keys is killed
 * while its replica lags behind (paused), the replica is promoted, and: no slot of the every-1s and
 * every-6s tasks is lost or fired twice, and the one-shot tasks whose index entries only the dead master had
 * still fire, because the index is rebuilt on the promoted replica.
 */
export function failoverScenario(label: string, deploy: (procs: RedisProcs) => Promise<Deployment>): void {
  const procs = new RedisProcs();
  let d: Deployment;
  let tc: TestCluster;
  let store: Store;
  let client: AxClient;
  const ran = new Map<string, number>(); // run id → times the executor ran it

  beforeAll(async () => {
    d = await deploy(procs);
    tc = new TestCluster(label, { AX_SHARDS: String(SHARDS), ...d.env });
    store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
  }, 60_000);
  afterAll(async () => {
    await store?.close();
    await tc?.teardown();
    await procs.teardown();
  }, 120_000);

  it("a wrong mode is one clear error at start-up, not a loop", async () => {
    const p = spawn(process.execPath, ["bin/ax.mjs", "node", "--id", "wrong"], { env: { ...process.env, ...tc.env, AX_LOG_LEVEL: "warn", ...d.wrong.env }, cwd: process.cwd(), stdio: ["ignore", "pipe", "pipe"] });
    let err = "";
    p.stderr.on("data", (b) => (err += b));
    p.stdout.on("data", () => undefined);
    const code = await new Promise<number | null>((resolve) => {
      const t = setTimeout(() => { p.kill("SIGKILL"); resolve(null); }, 30_000);
      p.on("exit", (c) => { clearTimeout(t); resolve(c); });
    });
    console.log(`[${label}] wrong mode: exit ${code}: ${err.trim()}`);
    expect(code, err).toBe(2);
    expect(err).toMatch(d.wrong.says);
    expect(err).not.toMatch(/MOVED \d+ /); // a redirection reply: the node got as far as using Redis
    expect(err.trim().split("\n").length, err).toBeLessThanOrEqual(3);
  });

  it("a node fires tasks on every shard; a master failover loses no slot, doubles none, and rebuilds what the promoted replica lacks", async () => {
    await tc.startNode("n1");
    await tc.waitForShards();
    const ex = await tc.startExecutor("w", (ctx) => { ran.set(ctx.runId, (ran.get(ctx.runId) ?? 0) + 1); });
    await ex.registered;
    client = await tc.client();

    // Every-second tasks until every shard has some. overlap allow: a slow completion on a busy
    // box must not turn into a skipped slot; misfire all: a slot the process fires more than 1 s
    // late (this shared 2-core box stalls event loops for seconds at times) is still fired and
    // recorded under its own slot. What is counted is whether a slot is recorded once, never,
    // or twice; how late is reported apart.
    const spec = { executor: "w", every: "1s", overlap: "allow", misfire: "all" };
    await waitFor(async () => { try { await client.call("task.create", { ...spec, name: "e000" }); return true; } catch (e) { if (/unknown executor/.test(String(e))) return false; throw e; } }, 20_000, "executor registered");
    const covered = new Set<number>();
    const every: string[] = ["e000"];
    covered.add((await client.call<{ shard: number }>("task.show", { task: "e000" })).shard);
    for (let i = 1; covered.size < SHARDS && i < 300; i++) {
      const name = `e${String(i).padStart(3, "0")}`;
      covered.add((await client.call<{ shard: number }>("task.create", { ...spec, name })).shard);
      every.push(name);
    }
    expect(covered.size).toBe(SHARDS);
    // As many every-6s tasks: their next due time is past the wheel's horizon (~5 s), so each
    // fire writes it to Redis: these depend on the due index across the failover.
    const step = new Map<string, number>(every.map((t) => [t, 1000]));
    for (let i = 0; i < every.length; i++) {
      const name = `m${String(i).padStart(3, "0")}`;
      await client.call("task.create", { ...spec, every: "6s", name });
      step.set(name, 6000);
    }
    const slow = [...step.keys()].filter((t) => step.get(t) === 6000);
    const runs = async (fromMs: number): Promise<Run[]> => (await store.pool.query(
      `select t.name as task, r.slot_ms, r.source, r.state, r.fired_ms, r.shard from runs r join tasks t on t.id = r.task_id where r.fired_ms >= $1`, [fromMs]))
      .rows.map((x) => ({ task: x.task, slot: x.slot_ms === null ? null : Number(x.slot_ms), source: x.source, state: x.state, fired: Number(x.fired_ms), shard: x.shard }));
    const t0 = Date.now();
    await waitFor(async () => { const r = await runs(t0); return every.every((t) => r.filter((x) => x.task === t).length >= 2) && slow.every((t) => r.some((x) => x.task === t)); }, 20_000, "every task fired", 250);

    // The failover. The victim's replica is paused and 16 MB of other writes fill the link's
    // socket buffers, so what is written next (a probe key, the one-shot tasks' index entries)
    // waits in the master's memory and dies with it: the promoted replica lacks it, as a
    // replica lagging behind a busy master would.
    const n = names(tc.ns);
    const v = await d.victim([...Array(SHARDS).keys()], (s) => n.dueKey(s));
    expect(v.shards.length, "the victim master holds some shards' keys").toBeGreaterThan(0);
    procs.signal(v.replica, "SIGSTOP");
    for (let i = 0; i < 4; i++) await cli(v.master, "eval", "redis.call('SET', KEYS[1], string.rep('x', tonumber(ARGV[1])))", "1", `${n.redisPrefix}junk:{${v.shards[0]}}:${i}`, "4000000");
    const probe = `${n.redisPrefix}probe:{${v.shards[0]}}`;
    await cli(v.master, "set", probe, "1");
    const lateAt = Date.now() + 12_000;
    const late: string[] = [];
    for (let i = 0; late.length < 4 && i < 100; i++) {
      const t = await client.call<{ shard: number }>("task.create", { name: `late${i}`, executor: "w", at: new Date(lateAt).toISOString() });
      if (v.shards.includes(t.shard)) late.push(`late${i}`);
    }
    expect(late.length).toBe(4);
    await new Promise((r) => setTimeout(r, 300)); // the shard actors' round writes the entries to Redis
    const loop = monitorEventLoopDelay({ resolution: 20 });
    loop.enable();
    const tKill = Date.now();
    procs.signal(v.master, "SIGKILL");
    procs.signal(v.replica, "SIGCONT");
    await d.promoted(v.master, v.replica);
    const promotedMs = Date.now() - tKill;
    expect(await cli(v.replica, "exists", probe), "the promoted replica lacks the writes made while it lagged").toMatch(/^0/);

    // Every victim shard's index is rebuilt on the promoted replica (the marker holds the time).
    const rebuiltAt = await waitFor(async () => {
      const at = await Promise.all(v.shards.map(async (s) => Number((await cli(v.replica, "get", `${n.dueKey(s)}:built`)).trim()) || 0));
      return at.every((x) => x > tKill) ? Math.max(...at) : null;
    }, 20_000, "victim shards' index rebuilt after the failover", 100);
    await waitFor(async () => (await runs(lateAt - 1000)).filter((r) => late.includes(r.task)).length === late.length, 25_000, "the one-shot tasks only the dead master knew to fire", 250);
    const tEnd = Date.now() + 2000;
    try {
      await waitFor(async () => { const r = await runs(tEnd); return [...step.keys()].every((t) => r.some((x) => x.task === t)); }, 20_000, "every task fired after the failover", 250);
    } catch (e) {
      // Which tasks did not fire, and where their rows point: a stranded task names its shard.
      const r = await runs(tEnd);
      const missing = [...step.keys()].filter((t) => !r.some((x) => x.task === t));
      const rows = (await store.pool.query("select name, shard, state, next_due_ms, next_source from tasks where name = any($1)", [missing])).rows;
      const now = Date.now();
      throw new Error(`${(e as Error).message}; not fired since +${tEnd - tKill} ms after the kill: ${rows.map((x) =>
        `${x.name} (shard ${x.shard}${v.shards.includes(x.shard) ? ", victim" : ""}, ${x.state}, next ${x.next_source} ${x.next_due_ms === null ? "none" : `${Number(x.next_due_ms) - now} ms from now`})`).join("; ")}`);
    }

    // One run per slot: the window from before the kill to after the late tasks.
    const rows = await runs(t0 - 2000);
    const all = rows.filter((r) => r.state !== "skipped" && r.state !== "refused");
    const from = tKill - 3000; const to = tEnd - 1000;
    let lost = 0; let doubled = 0; let checked = 0;
    const gaps: string[] = [];
    for (const [t, ms] of step) {
      const recorded = rows.filter((r) => r.task === t && r.slot !== null).map((r) => r.slot!);
      doubled += recorded.length - new Set(recorded).size;
      const slots = [...new Set(all.filter((r) => r.task === t && r.slot !== null).map((r) => r.slot!))].sort((a, b) => a - b);
      // A task's slots are `ms` apart from its first: count the ones missing in [start, to].
      const start = Math.max(from, slots[0] ?? from);
      const inWin = slots.filter((x) => x >= start && x <= to);
      checked += inWin.length;
      if (!inWin.length) { lost += Math.floor((to - start) / ms); continue; }
      lost += Math.floor((inWin[0]! - start) / ms) + Math.floor((to - inWin[inWin.length - 1]!) / ms);
      for (let i = 1; i < inWin.length; i++) {
        const gap = Math.round((inWin[i]! - inWin[i - 1]!) / ms) - 1;
        if (gap > 0) gaps.push(`${t}/s${rows.find((r) => r.task === t)?.shard}${v.shards.includes(rows.find((r) => r.task === t)!.shard) ? "(victim)" : ""}: ${gap} slot(s) after +${inWin[i - 1]! - tKill} ms`);
        lost += gap;
      }
    }
    loop.disable();
    const caught = all.filter((r) => step.has(r.task) && r.source === "misfire" && r.slot! >= from && r.slot! <= to);
    const catchUps = `${caught.filter((r) => v.shards.includes(r.shard)).length} on the victim's shards, ${caught.filter((r) => !v.shards.includes(r.shard)).length} on others`;
    const lateRuns = all.filter((r) => late.includes(r.task));
    const twice = [...ran].filter(([, c]) => c !== 1);
    console.log(`[${label}] failover: master :${v.master} killed holding ${v.shards.length}/${SHARDS} shards; replica :${v.replica} promoted after ${promotedMs} ms; ` +
      `victim shards' index rebuilt ${rebuiltAt - tKill} ms after the kill; ${checked} slots of ${every.length} every-1s and ${slow.length} every-6s tasks checked over ${Math.round((to - from) / 1000)} s: ` +
      `${lost} lost, ${doubled} doubled (${catchUps} fired over 1 s late as catch-ups; this process's event loop stalled up to ${Math.round(loop.max / 1e6)} ms); ${lateRuns.length}/${late.length} one-shots only the dead master had fired, latest ${Math.max(...lateRuns.map((r) => r.fired - lateAt))} ms after due`);
    expect(lost, `slots lost (relative to the kill):\n${gaps.join("\n")}`).toBe(0);
    expect(doubled, "slots fired twice").toBe(0);
    expect(lateRuns.length).toBe(late.length);
    expect(twice, "run ids the executor ran more than once").toEqual([]);
  }, 90_000);
}
