import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import type { AxClient } from "../../ops/client.ts";
import type { RunContext } from "../../protocol/index.ts";
import { AxError } from "../../common/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

// A long lead (runs recorded 400 ms ahead of their due time) gives the test a wide window in
// which an update meets a run that is recorded and not yet released.
const tc = new TestCluster("upd", { AX_LEAD: "400ms" });
let client: AxClient;
let db: pg.Pool;

const calls: Array<{ runId: string; task: string; payload: unknown; scheduledAt: number }> = [];
const hold = new Map<string, number>();
async function handler(ctx: RunContext): Promise<void> {
  calls.push({ runId: ctx.runId, task: ctx.taskName, payload: ctx.payload, scheduledAt: ctx.scheduledAt });
  await sleep(hold.get(ctx.taskName) ?? 5);
}

interface Task { id: number; name: string; generation: number; nextDueAt: string | null; timeout: string; retries: number; payload: unknown; triggers: Array<{ id: number; description: string }> }
interface Run { id: string; state: string; source: string; dueAt: string; error: string | null }
interface Updated { task: string; generation: number; changes: Record<string, { from: unknown; to: unknown }>; before: string[]; after: string[]; withdrawn?: string[]; unchanged?: boolean; dryRun?: boolean }

const show = (task: string) => client.call<Task>("task.show", { task });
const update = (task: string, args: Record<string, unknown>) => client.call<Updated>("task.update", { task, ...args });
const refusal = async (p: Promise<unknown>): Promise<AxError> => {
  try { await p; } catch (e) { return e as AxError; }
  throw new Error("expected a refusal");
};
/** Slots of the task's runs that reached an executor (not withdrawn, refused or skipped), from the runs table. */
async function firedSlots(taskId: number): Promise<Array<{ id: string; slot: number; created: number }>> {
  const r = await db.query("select id, slot_ms, created_ms from runs where task_id = $1 and state not in ('refused', 'skipped') and source <> 'manual' order by slot_ms", [taskId]);
  return r.rows.map((x) => ({ id: String(x.id), slot: Number(x.slot_ms), created: Number(x.created_ms) }));
}

beforeAll(async () => {
  await tc.startNode("n1");
  await tc.waitForShards();
  const ex = await tc.startExecutor("ux", handler);
  await ex.registered;
  const ex2 = await tc.startExecutor("ux2", handler);
  await ex2.registered;
  client = await tc.client();
  db = new pg.Pool({ connectionString: tc.config.pgUrl, max: 2, options: `-c search_path=${tc.ns}` });
}, 60_000);

afterAll(async () => {
  await db?.end();
  await tc.teardown();
});

describe("ax task update", () => {
  it("updates while the task fires: no slot lost or doubled, a recorded-ahead run is decided again, history and why name the change", async () => {
    const created = await client.call<Task>("task.create", { name: "tick", executor: "ux", every: "1s", payload: { v: 0 } });
    await waitFor(() => calls.filter((c) => c.task === "tick").length >= 2, 15_000, "two runs of tick");
    // Updates aimed inside the lead window (recorded, not yet released), until one meets a held run.
    let hits = 0;
    let v = 0;
    for (let attempt = 0; attempt < 8 && hits < 2; attempt++) {
      const t = await show("tick");
      const due = Date.parse(t.nextDueAt!);
      const wait = due - 200 - Date.now();
      // The row still names the slot just fired: its next due time is written with the run's end
      // (AX_TASK_WRITE_DEFER), up to a decision step after the completion reached the node.
      if (wait < 0) { await sleep(300); continue; }
      await sleep(wait);
      const r = await update("tick", { payload: { v: ++v } });
      if (r.withdrawn?.length) hits++;
    }
    expect(hits).toBeGreaterThan(0);
    // And some updates at arbitrary moments.
    for (let i = 0; i < 3; i++) { await update("tick", { payload: { v: ++v } }); await sleep(333); }
    const lastPayloadUpdate = await show("tick");
    expect(lastPayloadUpdate.generation).toBe(v);
    expect(lastPayloadUpdate.id).toBe(created.id);
    await waitFor(async () => calls.filter((c) => c.task === "tick" && (c.payload as { v: number }).v === v).length >= 2, 15_000, "runs with the last payload");

    // Every slot of the fixed rate fired exactly once, withdrawn runs included: consecutive slots 1 s apart.
    const slots = await firedSlots(created.id);
    for (let i = 1; i < slots.length; i++) expect(slots[i]!.slot - slots[i - 1]!.slot).toBe(1000);
    const ran = calls.filter((c) => c.task === "tick");
    expect(new Set(ran.map((c) => c.scheduledAt)).size).toBe(ran.length);
    // Withdrawn runs are recorded as such and never reached the executor.
    const withdrawn = (await db.query("select id, error from runs where task_id = $1 and state = 'refused'", [created.id])).rows as Array<{ id: string; error: string }>;
    expect(withdrawn.length).toBeGreaterThanOrEqual(hits);
    for (const w of withdrawn) {
      // Not published yet, or published ahead to the executor (it holds runs) and revoked there.
      expect(w.error).toMatch(/^withdrawn before (dispatch|its start \([^)]*\)): the task was updated \(generation \d+\)/);
      expect(ran.some((c) => c.runId === w.id)).toBe(false);
    }

    // A trigger change: the new cadence counts from the update, the old slots stop.
    const tr = await update("tick", { every: "700ms" });
    expect(tr.changes.trigger).toEqual({ from: expect.stringMatching(/^every 1s/), to: expect.stringMatching(/^every 700ms/) });
    const history = await client.call<Array<{ generation: number; who: string; change: Record<string, unknown> }>>("task.history", { task: "tick" });
    expect(history.map((h) => h.generation)).toEqual(Array.from({ length: v + 1 }, (_, i) => v + 1 - i));
    expect(history[0]!.change.trigger).toEqual(tr.changes.trigger);
    await waitFor(async () => {
      const rs = await db.query("select id from runs where task_id = $1 and created_ms >= (select at_ms from task_history where task_id = $1 and generation = $2) and state = 'success'", [created.id, v + 1]);
      return rs.rowCount! >= 2;
    }, 15_000, "two runs after the trigger change");
    const changedAt = Number((await db.query("select at_ms from task_history where task_id = $1 and generation = $2", [created.id, v + 1])).rows[0].at_ms);
    const after = (await firedSlots(created.id)).filter((s) => s.slot > changedAt);
    expect(after.length).toBeGreaterThanOrEqual(2);
    for (let i = 1; i < after.length; i++) expect(after[i]!.slot - after[i - 1]!.slot).toBe(700);
    const allSlots = (await firedSlots(created.id)).map((s) => s.slot);
    expect(new Set(allSlots).size).toBe(allSlots.length);

    // `ax why` names the update for the first run after it, and only for that one.
    const firstAfter = (await db.query(`select id from runs where task_id = $1 and created_ms >= (select at_ms from task_history where task_id = $1 and generation = $2)
      and not (id = any(coalesce((select array(select jsonb_array_elements_text(change->'withdrawn')) from task_history where task_id = $1 and generation = $2), '{}'))) order by created_ms, id limit 2`, [created.id, v + 1])).rows as Array<{ id: string }>;
    const why1 = await tc.cli(["why", firstAfter[0]!.id]);
    expect(why1.code).toBe(0);
    expect(why1.stdout).toMatch(new RegExp(`first run after update ${v + 1} of the task .* \\(trigger every 1s .*→ every 700ms`));
    const why2 = await client.call<{ sentences: string[] }>("why", { run: firstAfter[1]!.id });
    expect(why2.sentences.join(" ")).not.toMatch(/first run after update/);
    // The audit trail has each update too.
    const audit = await client.call<Array<{ op: string; task: string }>>("audit", { task: "tick", limit: 100 });
    expect(audit.filter((a) => a.op === "task.update").length).toBe(v + 1);
    await client.call("task.pause", { task: "tick" });
  }, 180_000);

  it("leaves a running run alone: it finishes under the old definition, the next run uses the new one", async () => {
    hold.set("slow", 1500);
    await client.call("task.create", { name: "slow", executor: "ux", delay: "1h", timeout: "10s", payload: { old: true } });
    const { runId } = await client.call<{ runId: string }>("run", { task: "slow" });
    await waitFor(() => calls.some((c) => c.runId === runId), 10_000, "the run started");
    const r = await update("slow", { executor: "ux2", payload: { old: false }, timeout: "20s" });
    expect(r.withdrawn ?? []).toEqual([]);
    await waitFor(async () => (await client.call<Run[]>("runs", { task: "slow" })).find((x) => x.id === runId)?.state === "success", 10_000, "the running run succeeded");
    const { runId: second } = await client.call<{ runId: string }>("run", { task: "slow" });
    await waitFor(() => calls.some((c) => c.runId === second), 10_000, "the second run");
    expect(calls.find((c) => c.runId === second)!.payload).toEqual({ old: false });
    const row = (await db.query("select executor from runs where id = $1", [second])).rows[0] as { executor: string };
    expect(row.executor).toBe("ux2");
  }, 120_000);

  it("--dry-run prints the changes and the next five times before and after, and changes nothing", async () => {
    await client.call("task.create", { name: "daily", executor: "ux", cron: "0 2 * * *", tz: "UTC" });
    const r = await tc.cli(["task", "update", "daily", "--cron", "30 6 * * *", "--tz", "Europe/Paris", "--dry-run"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/dry run, generation 0\): would change/);
    expect(r.stdout).toMatch(/trigger: cron "0 2 \* \* \*" .*UTC.* → cron "30 6 \* \* \*" .*Europe\/Paris/);
    const before = r.stdout.split("next five before:")[1]!.split("next five after:")[0]!.trim().split("\n").map((l) => l.trim());
    const after = r.stdout.split("next five after:")[1]!.trim().split("\n").map((l) => l.trim());
    expect(before).toHaveLength(5);
    expect(after).toHaveLength(5);
    for (const t of before) expect(t).toMatch(/T02:00:00\.000Z$/);
    for (const t of after) expect(t).toMatch(/T0[45]:30:00\.000Z$/); // 06:30 in Paris
    const t = await show("daily");
    expect(t.generation).toBe(0);
    expect(t.triggers[0]!.description).toMatch(/0 2 \* \* \*/);
    // The same change applied; applying it again changes nothing.
    const applied = await update("daily", { cron: "30 6 * * *", tz: "Europe/Paris" });
    expect(applied.generation).toBe(1);
    const again = await update("daily", { cron: "30 6 * * *", tz: "Europe/Paris" });
    expect(again).toMatchObject({ unchanged: true, generation: 1 });
    // Only the zone: the expression stays.
    const tz = await update("daily", { tz: "Asia/Tokyo" });
    expect(tz.changes.trigger!.to).toMatch(/30 6 \* \* \*.*Asia\/Tokyo/);
  }, 120_000);

  it("refuses invalid changes naming the field and the value", async () => {
    await client.call("task.create", { name: "val", executor: "ux", every: "1h" });
    const cases: Array<[Record<string, unknown>, string, RegExp]> = [
      [{ timeout: "soon" }, "timeout", /not a duration/],
      [{ tz: "Europe/Paris" }, "tz", /only with a cron trigger \(the task's trigger is every 1h/],
      [{ cron: "61 * * * *" }, "cron", /minute|61/],
      [{ retries: -1 }, "retries", /whole number/],
      [{ misfire: "sometimes" }, "misfire", /once, skip or all/],
      [{ executor: "nobody" }, "executor", /unknown executor/],
      [{ retires: 3 }, "retires", /unknown field/],
      [{ cron: "* * * * *", every: "1s" }, "trigger", /conflict/],
    ];
    for (const [args, field, msg] of cases) {
      const e = await refusal(update("val", args));
      expect(e.field, JSON.stringify(args)).toBe(field);
      expect(e.message).toMatch(msg);
      expect(e.code).toMatch(/^AX_E_/);
    }
    expect((await show("val")).generation).toBe(0);
    const cli = await tc.cli(["task", "update", "val", "--timeout", "soon"]);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toMatch(/timeout/);
  }, 120_000);
});
