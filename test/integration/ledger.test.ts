import type { ChildProcess } from "node:child_process";
import { afterAll, describe, expect, it } from "vitest";
import { Store, compiledOf, type TaskRow } from "../../actors/index.ts";
import { LedgerStore, type LedgerRow } from "../../actors/store/index.ts";
import { firstSlot, isSlotRun, watermark } from "../../actors/shard/ledger.ts";
import type { AxClient } from "../../ops/client.ts";
import { TestCluster } from "../cluster.ts";
import { asLoaded } from "../redo.ts";
import { TaskReads } from "../../actors/store/taskReads.ts";
import { RunReads } from "../../actors/store/runReads.ts";
import type pg from "pg";
import { sleep, waitFor } from "../helpers.ts";
import { rng as mulberry32 } from "../unit/cron-reference.ts";

/**
 * Completeness of the ledger as a property, on a real cluster: `ax node` processes (kill -9-able),
 * random schedules (fixed rates and crons, every misfire and overlap policy, some failing with
 * retries), random pause/resume windows, shard moves and a node kill. Afterwards every slot of
 * every trigger up to its watermark is a run or in exactly one non-run interval: never both,
 * never neither. Then `ax why TASK --at` is asked about one slot of each kind found.
 *
 * AX_SEED picks the schedule (default 18); AX_LONG=1 runs ~3 minutes of events instead of ~25 s.
 */

const SEED = Number(process.env.AX_SEED ?? 18);
const LONG = process.env.AX_LONG === "1";
const EVENTS_MS = LONG ? 180_000 : 15_000;
/** How far behind `checkedAt` a trigger's watermark may be: the task timeout (10 s) plus a margin for a loaded box. */
const LAG_BOUND_MS = 25_000;


interface Status { nodes: Array<{ id: string; shards: number[] }> }

describe("ledger: every slot accounted for exactly once (real nodes, pauses, moves, kill -9)", () => {
  // AX_MAX_IN_FLIGHT=2: each node refuses runs beyond two in flight per executor (the `refused` case).
  const tc = new TestCluster("ledg", { AX_SHARDS: "8", AX_MAX_IN_FLIGHT: "2" });
  const store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
  const procs = new Map<string, ChildProcess>();
  const rnd = mulberry32(SEED);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  let client: AxClient;

  afterAll(async () => {
    await store.close();
    await tc.teardown();
  }, 60_000);

  it(`seed ${SEED}: runs and non-runs partition the slots`, async () => {
    // Two nodes in this process, one as a process of its own (the one kill -9 takes down).
    procs.set("c", tc.spawn(["node", "--id", "c"]));
    await Promise.all([tc.startNode("a"), tc.startNode("b")]);
    client = await tc.client();
    const live = new Set(["a", "b", "c"]);
    const owned = async () => (await client.call<Status>("status")).nodes.filter((n) => live.has(n.id)).flatMap((n) => n.shards);
    const t0 = Date.now();
    await waitFor(async () => (await owned()).length === 8 ? true : null, 60_000, "3 nodes own the 8 shards", 250);
    console.log(`[ledger] cluster up in ${Date.now() - t0} ms`);

    // Runs take 0–1.2 s (slots pass while they do: overlap); the f* tasks fail their first two attempts.
    const attempts = new Map<string, number>();
    const ex = await tc.startExecutor("w", async (ctx) => {
      await sleep(Math.floor(Math.random() * 1200));
      if (ctx.taskName.startsWith("f") && ctx.attempt <= 2) {
        attempts.set(ctx.taskName, (attempts.get(ctx.taskName) ?? 0) + 1);
        throw new Error("flaky");
      }
    });
    await ex.registered;
    const names: string[] = [];
    for (let i = 0; i < 8; i++) {
      const flaky = i >= 6;
      const name = `${flaky ? "f" : "t"}${i}`;
      const when = pick([{ every: "1s" }, { every: "1500ms" }, { every: "700ms" }, { cron: "*/2 * * * * *" }, { cron: "*/3 * * * * *", tz: "Asia/Shanghai" }]);
      const args = { name, executor: "w", ...when, misfire: pick(["once", "skip", "all"]), overlap: pick(["forbid", "forbid", "allow"]), timeout: "10s",
        ...(flaky ? { retries: 3, backoff: "1500ms" } : {}) };
      await waitFor(async () => { try { await client.call("task.create", args); return true; } catch (e) { if (/unknown executor/.test(String(e))) return false; throw e; } }, 20_000, "executor registered");
      names.push(name);
    }

    // Random events: pause/resume windows, shard moves, one kill -9.
    const pausedNow = new Set<string>();
    const log: string[] = [];
    const end = Date.now() + EVENTS_MS;
    let killed = false;
    // The node killed owns a shard with tasks (moved there first), so the kill leaves slots unowned.
    const killC = async () => {
      const shard = ((await store.getTask(pick(names))) as TaskRow).shard;
      await client.call("shards.move", { shard, node: "c" }).catch(() => undefined);
      await waitFor(async () => (await client.call<Status>("status")).nodes.find((n) => n.id === "c")?.shards.includes(shard) ? true : null, 10_000, "shard on c", 100).catch(() => undefined);
      await sleep(1500);
      procs.get("c")!.kill("SIGKILL"); live.delete("c"); killed = true; log.push(`move ${shard}→c, kill -9 c`);
    };
    while (Date.now() < end) {
      await sleep(700 + Math.floor(rnd() * 1800));
      const r = rnd();
      try {
        if (r < 0.35) {
          const t = pick(names.filter((n) => !pausedNow.has(n)));
          if (t) { await client.call("task.pause", { task: t }); pausedNow.add(t); log.push(`pause ${t}`); }
        } else if (r < 0.65 && pausedNow.size) {
          const t = pick([...pausedNow]);
          await client.call("task.resume", { task: t }); pausedNow.delete(t); log.push(`resume ${t}`);
        } else if (r < 0.85) {
          const shard = Math.floor(rnd() * 8); const to = pick([...live]);
          await client.call("shards.move", { shard, node: to }); log.push(`move ${shard}→${to}`);
        } else if (!killed && Date.now() > end - EVENTS_MS * 0.7) {
          await killC();
          if (LONG) { await sleep(4000); procs.set("c", tc.spawn(["node", "--id", "c"])); live.add("c"); log.push("restart c"); }
        }
      } catch (e) { log.push(`(${String(e).slice(0, 80)})`); } // a shard handing over answers "retry"
    }
    if (!killed) await killC();
    await waitFor(async () => (await owned()).length === 8 ? true : null, 30_000, "live nodes own the 8 shards", 250);
    for (const t of pausedNow) {
      await waitFor(async () => { try { await client.call("task.resume", { task: t }); return true; } catch { return false; } }, 15_000, `resume ${t}`, 250);
      log.push(`resume ${t}`);
    }
    // Let the last decisions (resumes, catch-ups, retry chains) be written.
    await sleep(5000);
    const checkedAt = Date.now();
    console.log(`[ledger] seed ${SEED}: ${log.join(", ")}`);

    const totals = new Map<string, number>();
    const examples = new Map<string, { task: string; slot: number }>();
    const tasks = new Map<string, TaskRow>();
    for (const name of names) tasks.set(name, (await store.getTask(name)) as TaskRow);
    // One snapshot of the task rows (watermarks), runs and ledger: the cluster keeps firing meanwhile.
    // A fire may not be on its task row yet (AX_TASK_WRITE_DEFER): the row is read as a shard's
    // next owner loads it, with that fire redone (test/redo.ts).
    const c = await store.pool.connect();
    const snap = new Map<string, { slots: Record<string, number>; runs: Array<{ id: string; triggerId: number | null; slotMs: number | null; source: string; state: string }>; rows: LedgerRow[] }>();
    let redone = 0;
    try {
      await c.query("begin isolation level repeatable read");
      const taskReads = new TaskReads(c as unknown as pg.Pool); const runReads = new RunReads(c as unknown as pg.Pool);
      for (const [name, task] of tasks) {
        const runRows = await runReads.listRuns(task.id, 100_000);
        const loaded = asLoaded((await taskReads.getTask(task.id))!, runRows);
        if (loaded.redone) redone++;
        const slots = loaded.row.triggerSlots as Record<string, number>;
        const runs = runRows.map((x) => ({ id: x.id, triggerId: x.triggerId, slotMs: x.slotMs, source: x.source, state: x.state }));
        snap.set(name, { slots, runs, rows: await new LedgerStore(c).all(task.id) });
      }
      await c.query("commit");
    } finally { c.release(); }
    console.log(`[ledger] seed ${SEED}: ${redone} fire(s) not on their task rows at the snapshot, redone as a next owner would`);
    for (const name of names) {
      const task = { ...tasks.get(name)!, triggerSlots: snap.get(name)!.slots };
      const { runs } = snap.get(name)!;
      const rows: LedgerRow[] = snap.get(name)!.rows;
      for (const tr of task.triggers) {
        const t = compiledOf(tr);
        const w = watermark(task.triggerSlots, tr.id);
        // Liveness: decisions keep up (nothing is paused any more; retry chains end within ~5 s).
        // The bound allows for the in-flight limit of 2: a slot waits for a place, and a place can
        // stay taken until a run's timeout (10 s) when its completion went down with node c; on a
        // loaded CI box (every test file at once on 2 cores) a 16 s lag was seen once.
        const story = () => `\n${name} ${t.describe()} misfire=${task.misfire} overlap=${task.overlap}\n` +
          runs.filter((r) => r.triggerId === tr.id).map((r) => `  run ${r.id} slot ${r.slotMs === null ? "-" : new Date(r.slotMs).toISOString()} ${r.source} ${r.state}`).join("\n") + "\n" +
          rows.filter((r) => r.triggerId === tr.id).map((r) => `  ${r.reason} ${new Date(r.fromMs).toISOString()}..${new Date(r.toMs).toISOString()} ×${r.count} ${JSON.stringify(r.details)}`).join("\n");
        expect(w, `${name}: trigger ${tr.id} has decided nothing`).not.toBeNull();
        expect(checkedAt - w!, `${name}: watermark ${new Date(w!).toISOString()} lags at ${new Date(checkedAt).toISOString()}; events: ${log.join(", ")}${story()}`).toBeLessThan(LAG_BOUND_MS);
        const seen = new Map<number, string>();
        const mark = (s: number, what: string) => {
          expect(seen.has(s), `${name}: slot ${new Date(s).toISOString()} is both ${seen.get(s)} and ${what}${story()}`).toBe(false);
          seen.set(s, what);
          totals.set(what, (totals.get(what) ?? 0) + 1);
          if (!examples.has(what)) examples.set(what, { task: name, slot: s });
        };
        for (const r of runs) if (r.triggerId === tr.id && isSlotRun(r)) {
          expect(r.slotMs!, `${name}: a run beyond the watermark${story()}`).toBeLessThanOrEqual(w!);
          mark(r.slotMs!, "run");
        }
        for (const iv of rows.filter((x) => x.triggerId === tr.id)) {
          const slots: number[] = [];
          for (let s: number | null = iv.fromMs; s !== null && s <= iv.toMs; s = t.next(s)) slots.push(s);
          expect(slots.length, `${name}: interval ${iv.reason} count${story()}`).toBe(iv.count);
          expect(iv.toMs, `${name}: an interval beyond the watermark${story()}`).toBeLessThanOrEqual(w!);
          for (const s of slots) mark(s, iv.reason);
        }
        // The slow reference: every slot from the first through the watermark, one next() at a time.
        let n = 0;
        for (let s = firstSlot(t, task.createdMs); s !== null && s <= w!; s = t.next(s)) {
          n++;
          expect(seen.has(s), `${name}: slot ${new Date(s).toISOString()} is neither a run nor a non-run${story()}`).toBe(true);
        }
        expect(seen.size, `${name}: accounted slots that are not slots of the trigger${story()}`).toBe(n);
      }
    }
    console.log(`[ledger] seed ${SEED}: slots by outcome ${JSON.stringify(Object.fromEntries(totals))}`);
    expect(totals.get("run") ?? 0).toBeGreaterThan(20);
    // A slot falls into the kill's gap more than the grace before the new owner loads the shard
    // only when the moved shard's tasks have one due then (the default seed does): not asserted.
    if (!totals.get("outage")) console.log(`[ledger] seed ${SEED}: no slot fell more than the grace into the kill's gap`);

    // `ax why TASK --at` for one slot of each kind found.
    for (const [what, ex] of examples) {
      const at = new Date(ex.slot).toISOString();
      // The API answers what the CLI prints (its sentences, one a line); the CLI itself is run once below.
      const r = { stdout: (await client.call<{ sentences: string[] }>("why", { task: ex.task, at })).sentences.join("\n") };
      console.log(`[ledger] $ ax why ${ex.task} --at ${at}    (${what})\n${r.stdout}`);
      if (what === "run") expect(r.stdout).toMatch(/It ran: run /);
      else expect(r.stdout).toMatch(new RegExp({ paused: "was paused", outage: "had no owner", overlap: "still in flight", refused: "in-flight bound", collapsed: "collapsed into a catch-up",
        "misfire-skip": "misfire", upstream: "not fired", excluded: "outside" }[what] ?? what));
    }
    const one = examples.get("paused") ?? examples.get("run")!;
    const cli = await tc.cli(["why", one.task, "--at", new Date(one.slot).toISOString()]);
    expect(cli.code, cli.stderr).toBe(0);
    expect(cli.stdout).toMatch(examples.has("paused") ? /was paused/ : /It ran/);
    // The timeline interleaves both kinds: the task of the first non-run example has some of each.
    const mixed = [...examples].find(([what]) => what !== "run")?.[1].task ?? names[0]!;
    const all = await client.call<Array<{ kind: string }>>("runs", { task: mixed, all: true, limit: 10_000 });
    expect(all.some((r) => r.kind === "run"), "runs --all shows runs").toBe(true);
    if (examples.size > 1) expect(all.some((r) => r.kind === "non-run"), "runs --all shows non-runs").toBe(true);
  }, LONG ? 400_000 : 120_000);
});
