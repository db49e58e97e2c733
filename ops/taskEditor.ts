import { AxError, InvalidInputError, formatDuration, type Clock } from "../common/index.ts";
import { compileTrigger, findCycle, type CommandReply, type DefinitionChange, type MisfirePolicy, type OverlapPolicy, type ShardCommand, type Store, type TaskHistory, type TaskRow, type TriggerRow, type TriggerSpec } from "../actors/index.ts";
import { SPEC_FIELDS, TRIGGER_FIELDS, canonicalJson, checkFields, declaredTask, declaredTrigger, nextTimes, sameTrigger, type DeclaredTask } from "./taskSpec.ts";

/** What parseTaskSpec (ops/api.ts) returns, as far as editing needs it. */
interface Parsed {
  after: string[];
  task: { executor: string; payload: unknown; timeoutMs: number; maxAttempts: number; backoffMs: number; backoffMaxMs: number; misfire: MisfirePolicy; overlap: OverlapPolicy;
    triggers: Array<{ kind: TriggerRow["kind"]; spec: unknown }> };
}

export interface EditorDeps {
  store: Store;
  clock: Clock;
  parseSpec: (raw: Record<string, unknown>, now: number) => Parsed;
  resolveTask: (ref: unknown) => Promise<TaskRow>;
  shardCommand: (shard: number, cmd: ShardCommand) => Promise<CommandReply>;
  /** Dependency edges of these tasks changed: their owners re-read them (Api.depsChanged). */
  depsChanged: (ids: Iterable<number>) => Promise<void>;
  createTask: (spec: Record<string, unknown>, applySet: string) => Promise<unknown>;
  removeTask: (id: number) => Promise<unknown>;
  /** Progress of a long apply, published to the caller's inbox (NATS) when it gave one. */
  publish?: (subject: string, value: unknown) => void;
}

const NAME_RE = /^[A-Za-z0-9_.-]{1,128}$/;
const UPDATE_FIELDS = new Set([...SPEC_FIELDS].filter((f) => f !== "name" && f !== "after"));
const APPLY_FIELDS = new Set([...SPEC_FIELDS].filter((f) => f !== "delay"));
/** Most tasks one `apply` takes (its file travels in one NATS message, 1 MB by default). */
export const APPLY_MAX = 5000;

type Summary = Record<string, { from: unknown; to: unknown }>;

/** A planned update: nothing (unchanged) or the fields that change, in words and in values. */
interface UpdatePlan {
  summary: Summary;
  fields: Omit<DefinitionChange["fields"], "triggers">;
  trigger: { kind: TriggerRow["kind"]; spec: unknown } | null;
}

const describe = (spec: unknown): string => { try { return compileTrigger(spec as TriggerSpec).describe(); } catch (e) { return `(unreadable: ${(e as Error).message})`; } };
const isoOrNull = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());

/**
 * `task.update`, `task.history`, `apply` and `export`: editing tasks in place. The API validates
 * and plans; the task's shard applies the change between fires (ShardActor.onUpdate), so a run
 * recorded ahead is decided again under the new definition and a running run is left alone.
 */
export class TaskEditor {
  readonly history: TaskHistory;
  constructor(private readonly d: EditorDeps) { this.history = d.store.history; }

  /**
   * Compares `args` with the task; refusals name the field (prefixed by `where`). `patch` (task.update):
   * fields not given stay as they are, a new cron keeps the zone and DST policy. `replace` (apply): `args`
   * is the whole declaration, a field not given takes its default (payload none, timeout 30s, zone UTC…).
   */
  planUpdate(row: TaskRow, args: Record<string, unknown>, now: number, where = "", mode: "patch" | "replace" = "patch"): UpdatePlan {
    const at = (f: string) => (where ? `${where}.${f}` : f);
    checkFields(where, args, UPDATE_FIELDS);
    const cur = declaredTask(row, []);
    const curTrig = row.triggers[0] ? declaredTrigger(row.triggers[0]) : null;
    const given = TRIGGER_FIELDS.filter((k) => args[k] !== undefined);
    let trig: Record<string, unknown> | null = null;
    if (given.some((k) => k !== "tz" && k !== "dstGap" && k !== "dstRepeat")) {
      trig = {};
      for (const k of given) trig[k] = args[k];
      // A new cron keeps the zone and DST policy of the old one unless they are given too.
      if (mode === "patch" && trig.cron !== undefined && curTrig?.cron !== undefined) for (const f of ["tz", "dstGap", "dstRepeat"]) if (!(f in args) && curTrig[f] !== undefined) trig[f] = curTrig[f];
    } else if (given.length && mode === "replace") {
      trig = Object.fromEntries(given.map((k) => [k, args[k]])); // a zone without a cron: the parse refuses it
    } else if (given.length) {
      const f = given[0]!;
      if (curTrig?.cron === undefined) throw new InvalidInputError(at(f), args[f], `only with a cron trigger (the task's trigger is ${row.triggers[0] ? describe(row.triggers[0].spec) : "none: it runs after its upstreams"})`, "AX_E_TRIGGER");
      trig = { ...curTrig };
      for (const k of given) trig[k] = args[k];
    }
    if (trig) for (const k of Object.keys(trig)) if (trig[k] === null) delete trig[k]; // null: back to the default
    // Declared exactly as it is: unchanged (a one-shot `at` that has passed need not parse again).
    if (trig && curTrig && sameDeclaredTrigger(trig, curTrig)) trig = null;
    const base: Record<string, unknown> = mode === "patch" ? { ...cur } : { name: row.name, executor: row.executor };
    for (const k of TRIGGER_FIELDS) delete base[k];
    for (const [k, v] of Object.entries(args)) if (!(TRIGGER_FIELDS as readonly string[]).includes(k) && v !== undefined) base[k] = v;
    if (base.payload === null) delete base.payload;
    // No trigger to parse: a placeholder upstream stands for "the trigger stays as it is".
    const p = this.d.parseSpec(trig ? { ...base, ...trig } : { ...base, after: ["(unchanged)"] }, now);
    const t = p.task;
    const summary: Summary = {};
    const fields: UpdatePlan["fields"] = {};
    if (t.executor !== row.executor) { fields.executor = t.executor; summary.executor = { from: row.executor, to: t.executor }; }
    if (canonicalJson(t.payload ?? null) !== canonicalJson(row.payload ?? null)) { fields.payload = t.payload ?? null; summary.payload = { from: row.payload ?? null, to: t.payload ?? null }; }
    const dur = (k: "timeoutMs" | "backoffMs" | "backoffMaxMs", name: string) => {
      if (t[k] !== row[k]) { fields[k] = t[k]; summary[name] = { from: formatDuration(row[k]), to: formatDuration(t[k]) }; }
    };
    dur("timeoutMs", "timeout"); dur("backoffMs", "backoff"); dur("backoffMaxMs", "backoffMax");
    if (t.maxAttempts !== row.maxAttempts) { fields.maxAttempts = t.maxAttempts; summary.retries = { from: row.maxAttempts - 1, to: t.maxAttempts - 1 }; }
    if (t.misfire !== row.misfire) { fields.misfire = t.misfire; summary.misfire = { from: row.misfire, to: t.misfire }; }
    if (t.overlap !== row.overlap) { fields.overlap = t.overlap; summary.overlap = { from: row.overlap, to: t.overlap }; }
    let trigger: UpdatePlan["trigger"] = null;
    const nt = trig ? t.triggers[0] : undefined;
    if (nt && !(row.triggers[0] && sameTrigger(row.triggers[0].spec, nt.spec))) {
      trigger = nt;
      summary.trigger = { from: row.triggers[0] ? describe(row.triggers[0].spec) : null, to: describe(nt.spec) };
    }
    return { summary, fields, trigger };
  }

  /** `task.update { task, …fields, dryRun? }`. */
  async update(args: Record<string, unknown>, who: string): Promise<unknown> {
    const row = await this.d.resolveTask(args.task);
    const { task: _t, dryRun, ...change } = args;
    return this.updateRow(row, change, who, dryRun === true);
  }

  private async updateRow(row: TaskRow, change: Record<string, unknown>, who: string, dryRun: boolean, where = "", mode: "patch" | "replace" = "patch"): Promise<Record<string, unknown>> {
    const now = this.d.clock.now();
    const plan = this.planUpdate(row, change, now, where, mode);
    const changed = Object.keys(plan.summary).length > 0;
    if (plan.fields.executor !== undefined) {
      if (!(await this.d.store.executorExists(plan.fields.executor))) throw new InvalidInputError(where ? `${where}.executor` : "executor", plan.fields.executor, "unknown executor (start it first, or see `ax status` for the known ones)", "AX_E_NOT_FOUND");
    }
    const before = nextTimes(row.triggers, now, 5, row.triggerSlots, row.triggers.map((t) => t.id));
    const after = plan.trigger ? nextTimes([plan.trigger], now, 5) : before;
    const base = { task: row.name, id: row.id, changes: plan.summary, before, after };
    if (dryRun) return { ...base, dryRun: true, generation: row.generation, unchanged: !changed };
    if (!changed) return { ...base, unchanged: true, generation: row.generation, nextDueAt: isoOrNull(row.nextDueMs) };
    let inserted: TriggerRow[] = [];
    if (plan.trigger) {
      inserted = [{ id: await this.d.store.insertTrigger(plan.trigger.kind, plan.trigger.spec, now), kind: plan.trigger.kind, spec: plan.trigger.spec, enabled: true }];
    }
    const cmd: ShardCommand = { type: "update", taskId: row.id, change: {
      expectGeneration: row.generation, who, summary: plan.summary, fields: { ...plan.fields, ...(plan.trigger ? { triggers: inserted } : {}) },
    } };
    // On a timeout it is not known whether the shard applied it: the trigger row is left (at worst
    // unlinked, harmless) rather than risk deleting a linked one.
    const reply = await this.d.shardCommand(row.shard, cmd);
    if (!reply.ok) {
      if (inserted.length) await this.d.store.deleteUnlinkedTriggers(inserted.map((t) => t.id)).catch(() => undefined);
      throw AxError.fromJSON(reply.error);
    }
    const v = reply.value as { generation: number; nextDueMs: number | null; withdrawn: string[] };
    return { ...base, generation: v.generation, nextDueAt: isoOrNull(v.nextDueMs), withdrawn: v.withdrawn };
  }

  /** `export { set? }`: the tasks (of one apply set, or all) as declared, upstreams before downstreams. */
  async exportSet(args: Record<string, unknown>): Promise<{ set?: string; tasks: DeclaredTask[] }> {
    const set = args.set === undefined || args.set === null ? null : setName("set", args.set);
    const rows: TaskRow[] = [];
    for (const id of await this.d.store.taskIdsOfSet(set)) { const t = await this.d.store.getTask(id); if (t) rows.push(t); }
    const names = await this.namesOf(rows.flatMap((t) => t.upstreams));
    const tasks = rows.map((t) => declaredTask(t, t.upstreams.map((id) => names.get(id) ?? String(id))));
    return { ...(set ? { set } : {}), tasks: topoOrder(tasks).map((i) => tasks[i]!) };
  }

  private async namesOf(ids: number[]): Promise<Map<number, string>> {
    return this.d.store.taskNamesByIds(ids);
  }

  /**
   * `apply { set, tasks, defaults?, prune?, dryRun?, adopt?, progress? }`: makes the set's tasks
   * what the file declares. Everything is validated and planned before anything changes; then
   * edges that go are removed, tasks are created or updated in dependency order (upstreams
   * first) with their new edges, and with `prune` the set's tasks the file no longer names are
   * removed (downstreams first). Only tasks of this set are ever updated or removed: a task of the
   * same name made by hand or by another set is refused unless `adopt`. Applying the same file
   * again changes nothing (every task "unchanged").
   */
  async apply(args: Record<string, unknown>, who: string): Promise<unknown> {
    checkFields("", args, new Set(["apiVersion", "set", "tasks", "defaults", "prune", "dryRun", "adopt", "progress"]));
    if (args.apiVersion !== undefined && args.apiVersion !== "ax/v1") throw new InvalidInputError("apiVersion", args.apiVersion, "must be ax/v1 (or left out)");
    const set = setName("set", args.set);
    const list = args.tasks ?? [];
    if (!Array.isArray(list)) throw new InvalidInputError("tasks", list, "must be a list of task specs");
    if (list.length > APPLY_MAX) throw new InvalidInputError("tasks", list.length, `at most ${APPLY_MAX} tasks per apply`);
    const defaults = args.defaults ?? {};
    if (defaults === null || typeof defaults !== "object" || Array.isArray(defaults)) throw new InvalidInputError("defaults", defaults, "must be a mapping of task fields");
    checkFields("defaults", defaults as Record<string, unknown>, new Set([...APPLY_FIELDS].filter((f) => f !== "name")));
    const progress = typeof args.progress === "string" && args.progress.startsWith("_INBOX.") ? args.progress : null;
    const now = this.d.clock.now();

    // 1. Each spec on its own.
    const specs: Array<Record<string, unknown>> = [];
    const index = new Map<string, number>();
    list.forEach((item, i) => {
      if (item === null || typeof item !== "object" || Array.isArray(item)) throw new InvalidInputError(`tasks[${i}]`, item, "must be a mapping of task fields");
      const spec = { ...(defaults as Record<string, unknown>), ...(item as Record<string, unknown>) };
      if ((item as Record<string, unknown>).delay !== undefined) throw new InvalidInputError(`tasks[${i}].delay`, (item as Record<string, unknown>).delay, "relative to the moment the file is applied, so every apply would change it: use at (an ISO time)");
      checkFields(`tasks[${i}]`, spec, APPLY_FIELDS);
      if (typeof spec.name !== "string" || !NAME_RE.test(spec.name)) throw new InvalidInputError(`tasks[${i}].name`, spec.name, "required: letters, digits, '.', '_' or '-' (at most 128)");
      if (index.has(spec.name)) throw new InvalidInputError(`tasks[${i}].name`, spec.name, `appears twice in the file (also tasks[${index.get(spec.name)}])`, "AX_E_CONFLICT");
      if (spec.after !== undefined && (!Array.isArray(spec.after) || !spec.after.every((x) => typeof x === "string"))) throw new InvalidInputError(`tasks[${i}].after`, spec.after, "must be a list of task names");
      index.set(spec.name, i);
      specs.push(spec);
    });
    // 2. Dependencies: inside the file or existing tasks; no cycle.
    const afterOf = (s: Record<string, unknown>) => [...new Set((s.after as string[] | undefined) ?? [])].sort();
    const outside = [...new Set(specs.flatMap(afterOf).filter((n) => !index.has(n)))];
    const outsideIds = outside.length ? await this.d.store.taskIdsByName(outside) : new Map<string, number>();
    specs.forEach((s, i) => { for (const n of afterOf(s)) if (!index.has(n) && !outsideIds.has(n)) throw new InvalidInputError(`tasks[${i}].after`, n, "no such task (neither in this file nor in the cluster)", "AX_E_NOT_FOUND"); });
    const edges: Array<[number, number]> = [];
    specs.forEach((s, i) => { for (const n of afterOf(s)) if (index.has(n)) edges.push([index.get(n)!, i]); });
    const cycle = findCycle(edges);
    if (cycle) { const path = cycle.map((i) => String(specs[i]!.name)); throw new AxError("AX_E_CYCLE", `tasks: the file's dependencies form a cycle: ${path.join(" → ")}`, { field: "tasks", value: path }); }
    const order = topoOrder(specs.map((s) => ({ name: String(s.name), after: afterOf(s) })));

    // 3. The plan, against what exists.
    const existingIds = specs.length ? await this.d.store.taskIdsByName(specs.map((s) => String(s.name))) : new Map<string, number>();
    const rows = new Map<string, TaskRow>();
    for (const [name, id] of existingIds) { const t = await this.d.store.getTask(id); if (t) rows.set(name, t); }
    const upNames = await this.namesOf([...rows.values()].flatMap((t) => t.upstreams));
    type Item = { i: number; name: string; action: "create" | "update" | "unchanged"; adopt?: boolean; changes?: Summary; before?: string[]; after?: string[];
      depsAdd: string[]; depsRm: string[]; change?: Record<string, unknown> };
    const items: Item[] = [];
    for (const i of order) {
      const s = specs[i]!;
      const name = String(s.name);
      const row = rows.get(name);
      const after = afterOf(s);
      const where = `tasks[${i}]`;
      if (!row) {
        try { this.d.parseSpec({ ...s, after: after.length ? after : s.after ?? [] }, now); } catch (e) { throw inSpec(e, where); }
        items.push({ i, name, action: "create", depsAdd: after, depsRm: [] });
        continue;
      }
      if (row.applySet !== set && args.adopt !== true) {
        throw new InvalidInputError(`${where}.name`, name, `a task with this name exists and is ${row.applySet ? `managed by apply set "${row.applySet}"` : "not managed by apply (made by hand)"}; pass adopt (ax apply --adopt) to take it into set "${set}"`, "AX_E_CONFLICT");
      }
      if (row.triggers.length && !TRIGGER_FIELDS.some((k) => s[k] !== undefined)) {
        throw new InvalidInputError(where, name, `declares no trigger, but the task has one (${describe(row.triggers[0]!.spec)}); a trigger cannot be taken away in place: remove the task and apply again`, "AX_E_TRIGGER");
      }
      const { name: _n, after: _a, ...change } = s;
      let plan: UpdatePlan;
      try { plan = this.planUpdate(row, change, now, where, "replace"); } catch (e) { throw inSpec(e, where); }
      const cur = row.upstreams.map((id) => upNames.get(id) ?? String(id)).sort();
      const depsAdd = after.filter((n) => !cur.includes(n));
      const depsRm = cur.filter((n) => !after.includes(n));
      const changed = Object.keys(plan.summary).length > 0;
      items.push({ i, name, action: changed ? "update" : "unchanged", ...(row.applySet !== set ? { adopt: true } : {}), ...(changed ? { changes: plan.summary } : {}),
        ...(plan.trigger ? { before: nextTimes(row.triggers, now, 5, row.triggerSlots, row.triggers.map((t) => t.id)), after: nextTimes([plan.trigger], now, 5) } : {}),
        depsAdd, depsRm, change });
      if (!after.length && !row.triggers.length && !plan.trigger) throw new InvalidInputError(`${where}`, name, "give a trigger (cron, every, fixedDelay, at) or after", "AX_E_TRIGGER");
    }
    const kept = specs.map((s) => String(s.name));
    const pruneRows = args.prune === true
      ? await this.d.store.tasksOfSetExcept(set, kept)
      : [];
    const pruned = new Set(pruneRows.map((x) => x.name));
    specs.forEach((s, i) => { for (const n of afterOf(s)) if (pruned.has(n)) throw new InvalidInputError(`tasks[${i}].after`, n, "is removed by --prune (the file no longer declares it): declare it, or drop the dependency", "AX_E_CONFLICT"); });
    const summary = {
      set, dryRun: args.dryRun === true,
      create: items.filter((x) => x.action === "create").map((x) => x.name),
      update: items.filter((x) => x.action === "update").map((x) => ({ name: x.name, changes: x.changes, ...(x.before ? { before: x.before, after: x.after } : {}) })),
      unchanged: items.filter((x) => x.action === "unchanged" && !x.depsAdd.length && !x.depsRm.length && !x.adopt).map((x) => x.name),
      adopt: items.filter((x) => x.adopt).map((x) => x.name),
      deps: items.flatMap((x) => [...x.depsRm.map((u) => ({ task: x.name, upstream: u, op: "rm" })), ...(x.action === "create" ? [] : x.depsAdd.map((u) => ({ task: x.name, upstream: u, op: "add" })))]),
      prune: pruneRows.map((x) => x.name),
    };
    if (args.dryRun === true) return summary;

    // 4. Carry it out.
    const steps = items.filter((x) => x.action !== "unchanged" || x.depsAdd.length || x.depsRm.length || x.adopt).length + pruneRows.length;
    let done = 0;
    const tick = (what: string) => { done++; if (progress) this.d.publish?.(progress, { done, total: steps, what }); };
    const ids = new Map<string, number>([...outsideIds, ...existingIds]);
    const edgesChanged: number[] = [];
    try {
      for (const x of items) {
        for (const u of x.depsRm) {
          const [down, up] = [ids.get(x.name)!, (await this.d.store.requireTask(u)).id];
          await this.d.store.removeDependency(down, up);
          edgesChanged.push(down, up);
        }
      }
      for (const x of items) {
        const s = specs[x.i]!;
        if (x.action === "create") {
          const t = await this.d.createTask({ ...s, after: afterOf(s) }, set) as { id: number };
          ids.set(x.name, t.id);
          tick(`created ${x.name}`);
          continue;
        }
        const id = ids.get(x.name)!;
        if (x.adopt) await this.d.store.setApplySet(id, set);
        if (x.action === "update") {
          const row = await this.d.store.requireTask(id);
          await this.updateRow(row, x.change!, who, false, `tasks[${x.i}]`, "replace");
        }
        for (const u of x.depsAdd) {
          const up = ids.get(u) ?? (await this.d.store.requireTask(u)).id;
          await this.d.store.addDependency(id, up, now);
          edgesChanged.push(id, up);
        }
        if (x.action !== "unchanged" || x.depsAdd.length || x.depsRm.length || x.adopt) tick(`${x.action === "unchanged" ? "linked" : "updated"} ${x.name}`);
      }
      for (const p of await this.pruneOrder(pruneRows)) { await this.d.removeTask(p.id); tick(`removed ${p.name}`); }
    } catch (e) {
      const err = e instanceof AxError ? e : new AxError("AX_E_INTERNAL", String((e as Error)?.message ?? e));
      throw new AxError(err.code, `${err.message} (apply stopped after ${done} of ${steps} changes; the file can be applied again to finish)`, { field: err.field ?? "tasks", value: err.value });
    } finally {
      // Also after a failure: the edges changed before it are committed.
      if (edgesChanged.length) await this.d.depsChanged(edgesChanged);
    }
    return summary;
  }

  /** Tasks to remove, downstreams before their upstreams. */
  private async pruneOrder(rows: Array<{ id: number; name: string }>): Promise<Array<{ id: number; name: string }>> {
    if (rows.length < 2) return rows;
    const ids = new Set(rows.map((r) => r.id));
    const edges = (await this.d.store.allEdges()).filter((e) => ids.has(e.upstream) && ids.has(e.downstream));
    const byId = new Map(rows.map((r) => [r.id, r]));
    const ord = topoOrder(rows.map((r) => ({ name: String(r.id), after: edges.filter((e) => e.downstream === r.id).map((e) => String(e.upstream)) })));
    return ord.reverse().map((i) => byId.get(rows[i]!.id)!);
  }
}

/** Two declared triggers are the same: a cron's zone defaults to UTC, a one-shot's instant may be written in any offset. */
function sameDeclaredTrigger(a: Record<string, unknown>, b: Record<string, unknown>): boolean {
  const norm = (t: Record<string, unknown>) => {
    const x = { ...t };
    if (x.cron !== undefined && x.tz === undefined) x.tz = "UTC";
    if (typeof x.at === "string" && Number.isFinite(Date.parse(x.at))) x.at = Date.parse(x.at);
    return canonicalJson(x);
  };
  return norm(a) === norm(b);
}

function setName(field: string, v: unknown): string {
  if (typeof v !== "string" || !NAME_RE.test(v)) throw new InvalidInputError(field, v, "required: the apply set's name (letters, digits, '.', '_' or '-', at most 128)");
  return v;
}

/** An error about one spec, addressed to `tasks[i].<field>`. */
function inSpec(e: unknown, where: string): unknown {
  if (e instanceof AxError && !(e.field ?? "").startsWith("tasks[")) {
    return new AxError(e.code, `${where}.${e.message}`, { field: e.field === undefined ? where : `${where}.${e.field}`, value: e.value });
  }
  return e;
}

/** Indexes of `tasks` with every task after the tasks it names in `after` (stable; names outside the list are ignored). */
export function topoOrder(tasks: ReadonlyArray<{ name: string; after?: string[] }>): number[] {
  const index = new Map(tasks.map((t, i) => [t.name, i]));
  const out: number[] = [];
  const state = new Uint8Array(tasks.length); // 0 new, 1 visiting, 2 done
  const visit = (i: number) => {
    if (state[i] !== 0) return;
    state[i] = 1;
    for (const n of tasks[i]!.after ?? []) { const j = index.get(n); if (j !== undefined && state[j] === 0) visit(j); }
    state[i] = 2;
    out.push(i);
  };
  for (let i = 0; i < tasks.length; i++) visit(i);
  return out;
}
