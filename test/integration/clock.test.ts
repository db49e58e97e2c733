import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SystemClock, type Clock } from "../../common/index.ts";
import type { AxClient } from "../../ops/client.ts";
import type { Executor, RunContext } from "../../protocol/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

/** The system clock with a wall-clock offset a test can step, as NTP would; monotonic time is untouched. */
class SteppableClock extends SystemClock implements Clock {
  offset = 0;
  override now(): number { return super.now() + this.offset; }
}

interface Run { id: string; source: string; state: string; dueAt: string; error: string | null }

const tc = new TestCluster("clock");
const clock = new SteppableClock();
let client: AxClient;
let ex: Executor;
let node: Awaited<ReturnType<TestCluster["startNode"]>>;
const starts: Array<{ task: string; runId: string; at: number; scheduledAt: number }> = [];
const hold = new Map<string, number>();

beforeAll(async () => {
  node = await tc.startNode("c1", { clock });
  await tc.waitForShards();
  ex = await tc.startExecutor("w", async (ctx: RunContext) => {
    starts.push({ task: ctx.taskName, runId: ctx.runId, at: clock.now(), scheduledAt: ctx.scheduledAt });
    await sleep(hold.get(ctx.taskName) ?? 10);
  });
  await ex.registered;
  client = await tc.client();
});
afterAll(() => tc.teardown());

const runsOf = (task: string) => client.call<Run[]>("runs", { task, limit: 200 });

describe("time", () => {
  it("a wall clock stepping back never re-fires a slot and never fires before due; stepping forward fires what became due once", async () => {
    await client.call("task.create", { name: "steady", executor: "w", every: "500ms" });
    await waitFor(() => starts.filter((s) => s.task === "steady").length >= 3, 5000, "steady firing");
    // Stepped halfway between two slots (the steps below keep to that grid): a step within the
    // node's detection delay of a run's due time, while the run is held at its executor, is the
    // limit README states; the last test here steps while a run is held.
    let mid = Math.max(...starts.filter((s) => s.task === "steady").map((s) => s.scheduledAt)) + 250;
    while (mid - clock.now() < 30) mid += 500;
    await sleep(mid - clock.now());
    clock.offset -= 2000; // NTP steps the wall clock back 2 s
    await sleep(3500);
    clock.offset += 6000; // … and forward 6 s (4 s ahead of real time)
    await sleep(2500);
    await client.call("task.pause", { task: "steady" });
    const runs = await runsOf("steady");
    const fired = runs.filter((r) => r.state !== "skipped");
    const slots = fired.map((r) => r.dueAt);
    expect(new Set(slots).size, JSON.stringify(slots)).toBe(slots.length); // no slot twice
    for (const s of starts.filter((x) => x.task === "steady")) expect(s.at).toBeGreaterThanOrEqual(s.scheduledAt); // never early
    // The forward step made ~8 slots due at once: one catch-up, then the cadence resumed.
    expect(fired.filter((r) => r.source === "misfire")).toHaveLength(1);
  });

  it("a slow run never shifts the cadence: slots due meanwhile are skipped with the reason, one catch-up fires at once", async () => {
    hold.set("slow", 1300);
    await client.call("task.create", { name: "slow", executor: "w", every: "500ms" });
    await waitFor(async () => (await runsOf("slow")).filter((r) => r.source === "misfire" && r.state === "success").length >= 2, 15_000, "two catch-ups");
    await client.call("task.pause", { task: "slow" });
    const runs = (await runsOf("slow")).reverse();
    const skipped = runs.filter((r) => r.state === "skipped");
    expect(skipped.length).toBeGreaterThanOrEqual(2);
    for (const r of skipped) expect(r.error).toMatch(/previous run .* still in flight \(overlap=forbid\)/);
    const created = Date.parse(runs[0]!.dueAt) - 500;
    for (const r of runs.filter((x) => x.source === "rate")) expect((Date.parse(r.dueAt) - created) % 500).toBe(0); // still on the grid
    const starts2 = starts.filter((s) => s.task === "slow");
    for (let i = 1; i < starts2.length; i++) expect(starts2[i]!.at - starts2[i - 1]!.at).toBeGreaterThanOrEqual(1250); // one at a time
  });

  it("a node's clock stepping back while a run sent ahead is held at its executor: the run waits for its due time on the new clock", async () => {
    const heldBefore = ex.stats.held;
    const stepsBefore = ((await node.status()) as { persister: { clockSteps: number } }).persister.clockSteps;
    const due = clock.now() + 1500;
    await client.call("task.create", { name: "held-step", executor: "w", at: new Date(due).toISOString() });
    await waitFor(() => ex.stats.held > heldBefore, 3000, "the run sent ahead and held at the executor");
    expect(clock.now(), "still held when the clock steps").toBeLessThan(due - 20);
    const stepMono = performance.now();
    clock.offset -= 2000;
    await waitFor(() => starts.some((s) => s.task === "held-step"), 8000, "the run started");
    const s = starts.find((x) => x.task === "held-step")!;
    expect(s.at, "started before its due time on the stepped clock").toBeGreaterThanOrEqual(s.scheduledAt);
    expect(performance.now() - stepMono).toBeGreaterThanOrEqual(2000);
    expect(((await node.status()) as { persister: { clockSteps: number } }).persister.clockSteps).toBeGreaterThan(stepsBefore);
  });
});
