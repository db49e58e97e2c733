import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AxClient } from "../../ops/client.ts";
import type { RunContext } from "../../protocol/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

/**
 * Jitter, window, max runs, calendars, backfill and forecast against real servers (issue 13
 * items 7 and 8): one node, one executor, PostgreSQL, Redis and NATS as deployed.
 */

interface Run { id: string; source: string; state: string; dueAt: string; slotAt: string | null; error: string | null; dueReason: string | null }
interface TaskView { id: number; name: string; nextDueAt: string | null; nextReason: string | null; triggers: Array<{ id: number; spec: Record<string, unknown> }> }

const tc = new TestCluster("sched");
let client: AxClient;
const starts: Array<{ task: string; runId: string }> = [];

beforeAll(async () => {
  await tc.startNode("s1");
  await tc.waitForShards();
  for (const name of ["w", "fc"]) {
    const ex = await tc.startExecutor(name, async (ctx: RunContext) => { starts.push({ task: ctx.taskName, runId: ctx.runId }); await sleep(20); });
    await ex.registered;
  }
  client = await tc.client();
});
afterAll(() => tc.teardown());

const runsOf = (task: string) => client.call<Run[]>("runs", { task, limit: 500 });
const day = (ms: number) => new Date(ms).toISOString().slice(0, 10);
const MIN = 60_000;

describe("calendars", () => {
  it("slots on an excluded date are recorded skipped with the reason `excluded`, never dispatched; a changed calendar applies to later slots", async () => {
    const now = Date.now();
    await client.call("calendar.create", { name: "today", dates: [day(now - 86_400_000), day(now), day(now + 86_400_000)].join(",") });
    await client.call("task.create", { name: "cal", executor: "w", every: "300ms", excludeCalendar: "today" });
    await waitFor(async () => (await runsOf("cal")).filter((r) => r.state === "skipped").length >= 3, 15_000, "three excluded slots");
    const runs = await runsOf("cal");
    for (const r of runs) {
      expect(r.state).toBe("skipped");
      expect(r.error).toMatch(/^excluded: \d{4}-\d{2}-\d{2} \(UTC\) is in calendar today$/);
      expect(r.slotAt).not.toBeNull();
    }
    expect(starts.filter((s) => s.task === "cal")).toHaveLength(0);
    const why = await client.call<{ sentences: string[] }>("why", { run: runs[0]!.id });
    expect(why.sentences.join(" ")).toMatch(/It was not fired: excluded: .* is in calendar today/);
    // In use: cannot be removed.
    await expect(client.call("calendar.rm", { name: "today" })).rejects.toThrow(/used by task\(s\) cal/);
    // The holiday is taken out of the calendar: the next slots run.
    await expect(client.call("calendar.create", { name: "today", dates: "2020-01-01" })).rejects.toThrow(/exists/);
    await client.call("calendar.create", { name: "today", dates: "2020-01-01", replace: true });
    await waitFor(async () => (await runsOf("cal")).filter((r) => r.state === "success").length >= 2, 15_000, "runs after the change");
    await client.call("task.pause", { task: "cal" });
    const shown = await client.call<{ name: string; dates: string[] }>("calendar.show", { name: "today" });
    expect(shown.dates).toEqual(["2020-01-01"]);
  });

  it("a task naming a calendar that does not exist is refused", async () => {
    await expect(client.call("task.create", { name: "nocal", executor: "w", every: "1m", excludeCalendar: "nope" })).rejects.toThrow(/excludeCalendar: no such calendar/);
  });
});

describe("max runs and window", () => {
  it("--max-runs 3: exactly three runs fire, then the task has no next due and says it completed", async () => {
    await client.call("task.create", { name: "three", executor: "w", every: "250ms", maxRuns: 3 });
    await waitFor(async () => (await runsOf("three")).filter((r) => r.state === "success").length >= 3, 15_000, "three runs");
    await sleep(1500);
    const runs = await runsOf("three");
    expect(runs.filter((r) => r.state !== "skipped")).toHaveLength(3);
    const t = await client.call<TaskView>("task.show", { task: "three" });
    expect(t.nextDueAt).toBeNull();
    expect(t.nextReason).toBe("completed: 3 of --max-runs 3 runs fired");
  });

  it("--start/--end: no slot outside the window fires; --jitter delays each run by its deterministic amount, the slot kept", async () => {
    const start = Date.now() + 1500;
    const end = start + 2000;
    await client.call("task.create", { name: "win", executor: "w", every: "500ms", jitter: "200ms", start: new Date(start).toISOString(), end: new Date(end).toISOString() });
    await waitFor(async () => (await client.call<TaskView>("task.show", { task: "win" })).nextDueAt === null && (await runsOf("win")).length > 0, 15_000, "window over");
    await sleep(800);
    const runs = await runsOf("win");
    expect(runs.length).toBeGreaterThanOrEqual(3);
    expect(runs.filter((r) => r.source === "rate").length).toBeGreaterThanOrEqual(2);
    for (const r of runs) {
      const slot = Date.parse(r.slotAt!);
      expect(slot).toBeGreaterThanOrEqual(start);
      expect(slot).toBeLessThanOrEqual(end);
      if (r.source === "rate") {
        const h = createHash("sha256").update(`win\u0000${slot}`).digest("hex").slice(0, 12);
        expect(Date.parse(r.dueAt) - slot).toBe(Number(BigInt(`0x${h}`) % 201n));
        expect(r.dueReason).toMatch(/--jitter 200ms/);
      }
    }
    expect((await client.call<TaskView>("task.show", { task: "win" })).nextReason).toMatch(/^completed: /);
  });
});

describe("backfill", () => {
  it("runs every slot of the window once (source=backfill), however often and concurrently it is asked", async () => {
    await client.call("task.create", { name: "bf", executor: "w", cron: "*/10 * * * * *", overlap: "allow" });
    const to = Math.floor(Date.now() / 10_000) * 10_000 - 1;
    const from = to - 60_000 + 1;
    const args = { task: "bf", from: new Date(from).toISOString(), to: new Date(to).toISOString(), rate: 20 };
    const dry = await client.call<{ toRun: number; list: Array<{ slot: string; status: string }> }>("task.backfill", { ...args, dryRun: true });
    expect(dry.toRun).toBe(6);
    expect(dry.list.map((x) => x.status)).toEqual(Array(6).fill("new"));
    // Two at once: both plan all six; the shard fires each slot once.
    const [a, b] = await Promise.all([client.call<{ toRun: number }>("task.backfill", args), client.call<{ toRun: number }>("task.backfill", args)]);
    expect(a.toRun + b.toRun).toBeGreaterThanOrEqual(6);
    const backfilled = async () => (await runsOf("bf")).filter((r) => r.source === "backfill");
    await waitFor(async () => (await backfilled()).filter((r) => r.state === "success").length === 6, 20_000, "six backfill runs");
    await sleep(1000);
    const runs = await backfilled();
    expect(runs).toHaveLength(6);
    expect(new Set(runs.map((r) => r.slotAt)).size).toBe(6);
    for (const r of runs) expect(Date.parse(r.slotAt!) % 10_000).toBe(0);
    const again = await client.call<{ toRun: number; alreadyBackfilled: number; job: string | null }>("task.backfill", args);
    expect(again).toMatchObject({ toRun: 0, alreadyBackfilled: 6, job: null });
    const why = await client.call<{ sentences: string[] }>("why", { run: runs[0]!.id });
    expect(why.sentences[0]).toMatch(/is a backfill run for the past slot/);
    await expect(client.call("task.backfill", { ...args, to: new Date(Date.now() + 60_000).toISOString() })).rejects.toThrow(/to: is in the future/);
    await client.call("task.pause", { task: "bf" });
  });
});

describe("forecast", () => {
  const jitterOf = (name: string, slot: number, j: number) => Number(BigInt(`0x${createHash("sha256").update(`${name}\u0000${slot}`).digest("hex").slice(0, 12)}`) % BigInt(j + 1));

  it("fires per minute and the peak equal a slow reference; the what-if matches the misfire policies", async () => {
    const created = Date.now();
    const tomorrow = day(created + 86_400_000);
    await client.call("calendar.create", { name: "fc-hol", dates: tomorrow });
    const specs: Array<Record<string, unknown>> = [
      { name: "fc-5m", cron: "*/5 * * * *", misfire: "all" },
      { name: "fc-hourly-j", cron: "0 * * * *", jitter: "10m", misfire: "once" },
      { name: "fc-7m", every: "7m", misfire: "skip" },
      { name: "fc-3m-max", every: "3m", maxRuns: 30, misfire: "once" },
      { name: "fc-2m-cal", cron: "*/2 * * * *", excludeCalendar: "fc-hol", misfire: "all" },
    ];
    for (const s of specs) await client.call("task.create", { executor: "fc", ...s });
    const tasks = await Promise.all(specs.map((s) => client.call<TaskView>("task.show", { task: s.name as string })));
    const anchor = (n: string) => tasks.find((t) => t.name === n)!.triggers[0]!.spec.anchorMs as number;

    // Slow reference: every second of the window, asked "is this a slot of that task?"
    const from = Math.ceil((created + 10 * MIN) / MIN) * MIN;
    const to = from + 30 * 3_600_000;
    const isRate = (name: string) => name === "fc-7m" || name === "fc-3m-max";
    /** A slot of the task's trigger (`raw`: before its calendar and run limit). */
    const slotOf = (name: string, t: number, raw = false): boolean => {
      const d = new Date(t);
      const m = d.getUTCMinutes(), s = d.getUTCSeconds(), ms = d.getUTCMilliseconds();
      switch (name) {
        case "fc-5m": return ms === 0 && s === 0 && m % 5 === 0;
        case "fc-hourly-j": return ms === 0 && s === 0 && m === 0;
        case "fc-7m": return t > anchor(name) && (t - anchor(name)) % (7 * MIN) === 0;
        case "fc-3m-max": return t > anchor(name) && (t - anchor(name)) % (3 * MIN) === 0 && (raw || (t - anchor(name)) / (3 * MIN) <= 30);
        case "fc-2m-cal": return ms === 0 && s === 0 && m % 2 === 0 && (raw || day(t) !== tomorrow);
      }
      return false;
    };
    const ref = new Map<number, number>();
    for (const sp of specs) {
      const name = sp.name as string;
      const j = name === "fc-hourly-j" ? 10 * MIN : 0;
      const ms0 = isRate(name) ? anchor(name) % 1000 : 0; // rate slots keep the anchor's milliseconds
      for (let t = Math.floor((from - j) / 1000) * 1000 + ms0 - 1000; t < to; t += 1000) {
        if (!slotOf(name, t)) continue;
        const due = t + (j ? jitterOf(name, t, j) : 0);
        if (due >= from && due < to) ref.set(Math.floor(due / MIN) * MIN, (ref.get(Math.floor(due / MIN) * MIN) ?? 0) + 1);
      }
    }
    const fc = await client.call<{ total: number; tasks: number; peak: { at: string; fires: number }; buckets: Array<{ at: string; fires: number }> }>(
      "forecast", { from: new Date(from).toISOString(), to: new Date(to).toISOString(), executor: "fc", per: "minute" }, 60_000);
    expect(fc.tasks).toBe(5);
    expect(ref.size).toBeGreaterThan(500); // not vacuous: hundreds of the 1,800 minutes have runs
    expect(new Map(fc.buckets.map((b) => [Date.parse(b.at), b.fires]))).toEqual(ref);
    expect(fc.total).toBe([...ref.values()].reduce((a, n) => a + n, 0));
    expect(fc.peak.fires).toBe(Math.max(...ref.values()));
    const hourly = await client.call<{ total: number; buckets: Array<{ at: string; fires: number }> }>(
      "forecast", { from: new Date(from).toISOString(), to: new Date(to).toISOString(), executor: "fc", per: "hour" }, 60_000);
    expect(hourly.total).toBe(fc.total);

    // What-if: down for two hours; slots missed per task, and the runs each misfire policy fires at the end.
    const downFrom = from + 3_600_000, downTo = downFrom + 2 * 3_600_000;
    const wi = await client.call<{ catchUpRuns: number; tasks: Array<{ task: string; missed: number; catchUpRuns: number }> }>(
      "forecast", { executor: "fc", downFrom: new Date(downFrom).toISOString(), downTo: new Date(downTo).toISOString() }, 60_000);
    const want: Record<string, { missed: number; catchUpRuns: number }> = {};
    for (const sp of specs) {
      const name = sp.name as string;
      const ms0 = isRate(name) ? anchor(name) % 1000 : 0;
      const missedSlots: number[] = [];
      for (let t = Math.floor(downFrom / 1000) * 1000 + ms0; t < downTo - 1000; t += 1000) if (t > downFrom && slotOf(name, t, true)) missedSlots.push(t);
      const missed = missedSlots.length;
      let fired = missed === 0 || sp.misfire === "skip" ? [] : sp.misfire === "once" ? missedSlots.slice(-1) : missedSlots.slice(-100);
      fired = fired.filter((t) => name !== "fc-2m-cal" || day(t) !== tomorrow);
      if (name === "fc-3m-max") {
        const usedBefore = Math.min(30, Math.floor((downFrom - anchor(name)) / (3 * MIN)));
        fired = fired.slice(0, Math.max(0, 30 - usedBefore));
      }
      if (missed || fired.length) want[name] = { missed, catchUpRuns: fired.length };
    }
    expect(Object.keys(want).length).toBeGreaterThanOrEqual(4);
    expect(Object.fromEntries(wi.tasks.map((t) => [t.task, { missed: t.missed, catchUpRuns: t.catchUpRuns }]))).toEqual(want);
    expect(wi.catchUpRuns).toBe(Object.values(want).reduce((n, w) => n + w.catchUpRuns, 0));
    for (const s of specs) await client.call("task.pause", { task: s.name as string });
  });
});
