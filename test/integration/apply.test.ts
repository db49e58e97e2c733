import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync, writeFileSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parse } from "yaml";
import type { AxClient } from "../../ops/client.ts";
import type { AxError } from "../../common/index.ts";
import { TestCluster } from "../cluster.ts";

const tc = new TestCluster("apply");
let client: AxClient;
let dir: string;

interface Task { id: number; name: string; generation: number; applySet: string | null; payload: unknown; timeout: string; upstreams: number[]; triggers: Array<{ description: string }> }
const show = async (task: string): Promise<Task> => {
  const t = await client.call<Omit<Task, "upstreams"> & { upstreams: Array<{ id: number }> }>("task.show", { task });
  return { ...t, upstreams: t.upstreams.map((u) => u.id) };
};
const file = (name: string, text: string) => { const p = join(dir, name); writeFileSync(p, text); return p; };
const apply = (args: string[]) => tc.cli(["apply", ...args]);
const applyJson = async (args: string[]) => {
  const r = await apply([...args, "--json"]);
  if (r.code !== 0) throw new Error(`ax apply ${args.join(" ")} exited ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as { create: string[]; update: Array<{ name: string; changes: Record<string, unknown> }>; unchanged: string[]; prune: string[]; deps: unknown[]; adopt: string[] };
};

const JOBS = `
# the nightly pipeline
set: nightly
defaults:
  executor: ax1
  retries: 2
tasks:
  - name: report
    after: [transform, extract]
    payload: { to: ["ops@example.com"], format: pdf }
  - name: extract
    cron: "0 2 * * *"
    tz: Europe/Paris
    timeout: 10m
    payload: { source: s3://bucket/raw, days: 1 }
  - name: transform
    after: [extract]
    timeout: 1h
  - name: heartbeat
    every: 30s
    retries: 0
`;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "ax-apply-"));
  await tc.startNode("n1");
  await tc.waitForShards();
  for (const name of ["ax1", "ax2"]) await (await tc.startExecutor(name, () => undefined)).registered;
  client = await tc.client();
}, 60_000);

afterAll(async () => {
  rmSync(dir, { recursive: true, force: true });
  await tc.teardown();
});

describe("ax apply / ax export", () => {
  it("creates in dependency order, is idempotent, and round-trips through export", async () => {
    const jobs = file("jobs.yaml", JOBS);
    const dry = await apply(["-f", jobs, "--dry-run"]);
    expect(dry.code).toBe(0);
    expect(dry.stdout).toMatch(/dry run: nothing changed\): 4 to create, 0 to update, 0 to remove, 0 unchanged/);
    expect(dry.stdout).toMatch(/\+ extract\n\+ transform\n\+ report\n\+ heartbeat|\+ extract[\s\S]*\+ transform[\s\S]*\+ report/);
    await expect(show("extract")).rejects.toMatchObject({ code: "AX_E_NOT_FOUND" });

    const first = await applyJson(["-f", jobs]);
    expect(first.create).toEqual(["extract", "transform", "report", "heartbeat"]);
    const report = await show("report");
    const [extract, transform] = [await show("extract"), await show("transform")];
    expect(report.upstreams.sort()).toEqual([extract.id, transform.id].sort());
    expect(transform.upstreams).toEqual([extract.id]);
    expect(report).toMatchObject({ applySet: "nightly", payload: { to: ["ops@example.com"], format: "pdf" }, generation: 0 });
    expect(extract.timeout).toBe("10m");

    const again = await applyJson(["-f", jobs]);
    expect(again).toMatchObject({ create: [], update: [], prune: [], deps: [] });
    expect(again.unchanged.sort()).toEqual(["extract", "heartbeat", "report", "transform"]);
    const human = await apply(["-f", jobs]);
    expect(human.stdout).toMatch(/0 created, 0 updated, 0 removed, 4 unchanged/);

    // export → apply: nothing changes; export again: the same file.
    const exp = await tc.cli(["export", "--set", "nightly"]);
    expect(exp.code).toBe(0);
    const exported = file("exported.yaml", exp.stdout);
    const doc = parse(exp.stdout) as { set: string; tasks: Array<{ name: string }> };
    expect(doc.set).toBe("nightly");
    expect(doc.tasks.map((t) => t.name)).toEqual(["extract", "transform", "report", "heartbeat"]);
    const round = await applyJson(["-f", exported]);
    expect(round.unchanged.length).toBe(4);
    expect(round.update).toEqual([]);
    const exp2 = await tc.cli(["export", "--set", "nightly", "-o", "json"]);
    expect(parse(exp2.stdout)).toEqual(doc);
    // JSON files are read too.
    const asJson = file("exported.json", exp2.stdout);
    expect((await applyJson(["-f", asJson])).unchanged.length).toBe(4);
    for (const t of ["extract", "transform", "report", "heartbeat"]) expect((await show(t)).generation).toBe(0);
  }, 180_000);

  it("updates in place: same id, history kept, edges changed, the diff printed", async () => {
    const before = await show("extract");
    const changed = JOBS.replace('cron: "0 2 * * *"', 'cron: "30 3 * * *"').replace("timeout: 1h", "timeout: 2h").replace("after: [transform, extract]", "after: [transform]");
    const jobs = file("jobs2.yaml", changed);
    const dry = await apply(["-f", jobs, "--dry-run"]);
    expect(dry.stdout).toMatch(/0 to create, 2 to update, 0 to remove, 1 unchanged/);
    expect(dry.stdout).toMatch(/~ extract\n\s+trigger: cron "0 2 \* \* \*".* → cron "30 3 \* \* \*"/);
    expect(dry.stdout).toMatch(/next before: .*T01:00:00\.000Z/);
    expect(dry.stdout).toMatch(/~ transform\n\s+timeout: 1h → 2h/);
    expect(dry.stdout).toMatch(/- report after extract/);
    expect((await show("extract")).generation).toBe(0);

    const r = await applyJson(["-f", jobs]);
    expect(r.update.map((u) => u.name).sort()).toEqual(["extract", "transform"]);
    const after = await show("extract");
    expect(after.id).toBe(before.id);
    expect(after.generation).toBe(1);
    expect(after.triggers[0]!.description).toMatch(/30 3 \* \* \*/);
    expect((await show("report")).upstreams).toEqual([(await show("transform")).id]);
    const hist = await client.call<Array<{ generation: number; change: Record<string, unknown> }>>("task.history", { task: "extract" });
    expect(hist).toHaveLength(1);
    expect((await applyJson(["-f", jobs])).unchanged.length).toBe(4);
    // The file is the whole declaration: a field it no longer gives goes back to its default.
    const bare = changed.replace("    payload: { source: s3://bucket/raw, days: 1 }\n", "").replace("    timeout: 10m\n", "");
    expect(bare).not.toMatch(/s3:/);
    const r2 = await applyJson(["-f", file("jobs2b.yaml", bare)]);
    expect(r2.update).toEqual([{ name: "extract", changes: { payload: { from: { source: "s3://bucket/raw", days: 1 }, to: null }, timeout: { from: "10m", to: "30s" } } }]);
    expect(await show("extract")).toMatchObject({ payload: null, timeout: "30s", generation: 2 });
    expect((await applyJson(["-f", jobs])).update.map((u) => u.name)).toEqual(["extract"]);
  }, 180_000);

  it("--prune removes only tasks of its own set", async () => {
    await client.call("task.create", { name: "by-hand", executor: "ax1", every: "1h" });
    // Progress of the changes on standard error (on a terminal, or with AX_PROGRESS=1).
    process.env.AX_PROGRESS = "1";
    const other = await apply(["-f", file("other.yaml", "set: other\ntasks:\n  - { name: other-1, executor: ax2, every: 1h }\n")]).finally(() => { delete process.env.AX_PROGRESS; });
    expect(other.code).toBe(0);
    expect(other.stderr).toMatch(/\[1\/1\] created other-1/);
    const smaller = file("jobs3.yaml", `set: nightly
tasks:
  - { name: extract, executor: ax1, cron: "30 3 * * *", tz: Europe/Paris, timeout: 10m, retries: 2, payload: { source: s3://bucket/raw, days: 1 } }
  - { name: transform, executor: ax1, after: [extract], timeout: 2h, retries: 2 }
`);
    const withoutPrune = await applyJson(["-f", smaller]);
    expect(withoutPrune.prune).toEqual([]);
    await show("report");
    const dry = await apply(["-f", smaller, "--prune", "--dry-run"]);
    expect(dry.stdout).toMatch(/- report\n- heartbeat|- heartbeat\n- report/);
    const pruned = await applyJson(["-f", smaller, "--prune"]);
    expect(pruned.prune.sort()).toEqual(["heartbeat", "report"]);
    await expect(show("report")).rejects.toMatchObject({ code: "AX_E_NOT_FOUND" });
    await expect(show("heartbeat")).rejects.toMatchObject({ code: "AX_E_NOT_FOUND" });
    await show("by-hand");
    await show("other-1");
    await show("extract");
    // An empty set with --prune removes the set's tasks, downstreams first; nothing else.
    await applyJson(["-f", file("empty.yaml", "set: nightly\ntasks: []\n"), "--prune"]);
    await expect(show("extract")).rejects.toMatchObject({ code: "AX_E_NOT_FOUND" });
    await show("by-hand");
    await show("other-1");

    // A task made by hand (or by another set) is not taken over silently.
    const claim = file("claim.yaml", "set: nightly\ntasks:\n  - { name: by-hand, executor: ax1, every: 1h }\n");
    const refused = await apply(["-f", claim]);
    expect(refused.code).toBe(3);
    expect(refused.stderr).toMatch(/tasks\[0\]\.name: .*not managed by apply \(made by hand\).*--adopt/);
    const adopted = await applyJson(["-f", claim, "--adopt"]);
    expect(adopted.adopt).toEqual(["by-hand"]);
    expect((await show("by-hand")).applySet).toBe("nightly");
    expect((await applyJson(["-f", claim])).unchanged).toEqual(["by-hand"]);
  }, 180_000);

  it("refuses invalid files with the place and the reason, changing nothing", async () => {
    const cases: Array<[string, string, RegExp, number]> = [
      ["syntax.yaml", "set: x\ntasks:\n  - name: a\n   executor: ax1\n", /not valid YAML at line 4/, 2],
      ["noset.yaml", "tasks:\n  - { name: a, executor: ax1, every: 1m }\n", /set: required/, 2],
      ["typo.yaml", "set: bad\ntasks:\n  - { name: a, executor: ax1, every: 1m }\n  - { name: b, executor: ax1, every: 1m, retires: 3 }\n", /tasks\[1\]\.retires: unknown field/, 2],
      ["cycle.yaml", "set: bad\ntasks:\n  - { name: a, executor: ax1, after: [c] }\n  - { name: b, executor: ax1, after: [a] }\n  - { name: c, executor: ax1, after: [b] }\n", /cycle: (a → b → c → a|b → c → a → b|c → a → b → c)/, 2],
      ["missing.yaml", "set: bad\ntasks:\n  - { name: a, executor: ax1, after: [nowhere] }\n", /tasks\[0\]\.after: no such task \(neither in this file nor in the cluster\)/, 2],
      ["dup.yaml", "set: bad\ntasks:\n  - { name: a, executor: ax1, every: 1m }\n  - { name: a, executor: ax1, every: 2m }\n", /tasks\[1\]\.name: .*appears twice/, 3],
      ["cron.yaml", "set: bad\ntasks:\n  - { name: a, executor: ax1, every: 1m }\n  - { name: b, executor: ax1, cron: '0 25 * * *' }\n", /tasks\[1\]\.cron/, 2],
      ["delay.yaml", "set: bad\ntasks:\n  - { name: a, executor: ax1, delay: 5m }\n", /tasks\[0\]\.delay: .*use at/, 2],
      ["notalist.yaml", "set: bad\ntasks: { a: 1 }\n", /tasks: .*must be a list/, 2],
    ];
    for (const [name, text, msg, code] of cases) {
      const r = await apply(["-f", file(name, text)]);
      expect(r.stderr, name).toMatch(msg);
      expect(r.code, name).toBe(code);
    }
    const e = await client.call("apply", { set: "bad", tasks: [{ name: "a", executor: "ax1", every: "1m" }, { name: "b", executor: "ax1", every: "soon" }] }).catch((x: AxError) => x);
    expect(e).toMatchObject({ code: "AX_E_DURATION", field: "tasks[1].every" });
    const set = await client.call<{ tasks: unknown[] }>("export", { set: "bad" });
    expect(set.tasks).toEqual([]);
    expect(readFileSync(join(dir, "cycle.yaml"), "utf8")).toMatch(/after/);
  }, 180_000);
});
