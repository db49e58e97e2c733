import type { NatsConnection } from "@nats-io/transport-node";
import { AxError, InvalidInputError, parseDuration, formatDuration, type Clock, type Names } from "../common/index.ts";
import { jetstreamManager } from "@nats-io/jetstream";
import { decode, encode, ensureExecutorConsumer, listDeadLetters } from "../protocol/index.ts";
import { MAX_HORIZON_MS, initialRecord, nextPointer, type CommandReply, type ShardCommand, type Store, type TaskRow, type DueIndex, type RunRow } from "../actors/index.ts";
import type { BulkCreated, BulkNewTask, NewTask } from "../actors/store/index.ts";
import type { TriggerInput } from "../actors/triggers/index.ts";
import type { TaskRecord } from "../actors/machine/index.ts";
import { parseTrigger, compileTrigger, previewMarks, type TriggerSpec } from "../actors/index.ts";
import { describeOptions, scheduleOptionsOf } from "../actors/triggers/index.ts";
import { hash32, type ShardSupervisor } from "../cluster/index.ts";
import { explainRun } from "./why.ts";
import { LedgerView, parseInstant } from "./ledgerView.ts";
import { AuditLog, isWriteOp } from "./audit.ts";
import { TaskEditor } from "./taskEditor.ts";
import { describeChange } from "./history.ts";
import { RunOps } from "./runOps.ts";
import { runListFilters, taskListFilters } from "./opsFilters.ts";
import { checkHttpTasks } from "./httpJob.ts";
import { SchedulingOps, checkCalendarsExist, specWithOptions } from "./scheduling.ts";
import { attemptsOf, failures, inFlightByExecutor, parseTags, searchTasks, tagTask, taskTags, type BrowseDeps } from "./browse.ts";
import { alertsOp } from "./alerts.ts";
import { z } from "zod";

const NAME_RE = /^[A-Za-z0-9_.-]{1,128}$/;
const EXECUTOR_RE = /^[A-Za-z0-9_-]{1,64}$/;
/** Task timeouts and backoffs are timer delays (executors and nodes use setTimeout): at most 24 days. */
export const MAX_TASK_DURATION_MS = 24 * 86_400_000;
/** Strings outside a payload (names, cron, zones, ISO times) are short; a longer one is refused before anything parses it. */
const MAX_TEXT = 4096;

/** The edge limits the API enforces (see Limits in common/config.ts). */
export interface ApiLimits { payloadBytes: number; payloadDepth: number }
export const DEFAULT_API_LIMITS: ApiLimits = { payloadBytes: 64 * 1024, payloadDepth: 32 };

/**
 * Refuses, naming the field, what PostgreSQL or a node cannot take: U+0000 anywhere (text and
 * jsonb refuse it, and the write of a whole batch would fail), strings over MAX_TEXT outside
 * payloads, nesting deeper than the payload limit allows. Iterative: a 100,000-deep value
 * costs no stack.
 */
export function checkArgs(args: Record<string, unknown>, limits: ApiLimits): void {
  const stack: Array<[unknown, string, number, boolean]> = [[args, "", 0, false]];
  while (stack.length) {
    const [v, path, depth, inPayload] = stack.pop()!;
    if (typeof v === "string") {
      if (v.includes("\u0000")) throw new InvalidInputError(path || "body", v.length > 64 ? `${v.slice(0, 64)}…` : v, "contains U+0000 (NUL), which cannot be stored");
      if (!inPayload && v.length > MAX_TEXT) throw new InvalidInputError(path || "body", `${v.slice(0, 32)}… (${v.length} characters)`, `longer than ${MAX_TEXT} characters`);
      continue;
    }
    if (v === null || typeof v !== "object") continue;
    // Payloads may nest payloadDepth levels below their own field (specs sit two levels down in a bulk call).
    if (depth > limits.payloadDepth + 4) throw new InvalidInputError(path.split(/[.[]/)[0] || "body", "(too deep)", `nested deeper than ${limits.payloadDepth} levels (AX_MAX_PAYLOAD_DEPTH)`);
    if (Array.isArray(v)) { for (let i = v.length - 1; i >= 0; i--) stack.push([v[i], `${path}[${i}]`, depth + 1, inPayload]); continue; }
    for (const k of Object.keys(v)) {
      if (k.includes("\u0000")) throw new InvalidInputError(path || "body", k, "a key contains U+0000 (NUL)");
      stack.push([(v as Record<string, unknown>)[k], path ? `${path}.${k}` : k, depth + 1, inPayload || k === "payload"]);
    }
  }
}

/** A payload within AX_MAX_PAYLOAD (as JSON) and AX_MAX_PAYLOAD_DEPTH; runs carry it in one NATS message. */
export function checkPayload(field: string, payload: unknown, limits: ApiLimits): void {
  if (payload === undefined || payload === null) return;
  let depth = 0;
  const stack: Array<[unknown, number]> = [[payload, 1]];
  while (stack.length) {
    const [v, d] = stack.pop()!;
    if (v === null || typeof v !== "object") continue;
    depth = Math.max(depth, d);
    if (depth > limits.payloadDepth) throw new InvalidInputError(field, "(too deep)", `nested deeper than ${limits.payloadDepth} levels (AX_MAX_PAYLOAD_DEPTH)`);
    for (const x of Array.isArray(v) ? v : Object.values(v)) stack.push([x, d + 1]);
  }
  const bytes = Buffer.byteLength(JSON.stringify(payload));
  if (bytes > limits.payloadBytes) throw new AxError("AX_E_TOO_LARGE", `${field}: ${bytes} bytes as JSON, over the limit of ${limits.payloadBytes} (AX_MAX_PAYLOAD)`, { field, value: bytes });
}

function boundedDuration(field: string, ms: number): number {
  if (ms > MAX_TASK_DURATION_MS) throw new InvalidInputError(field, formatDuration(ms), `at most ${formatDuration(MAX_TASK_DURATION_MS)}`, "AX_E_DURATION");
  return ms;
}

export interface ApiDeps {
  store: Store;
  due: DueIndex;
  nc: NatsConnection;
  names: Names;
  clock: Clock;
  shardCount: number;
  supervisor: ShardSupervisor;
  nodeId: string;
  status: () => Promise<unknown>;
  /** The live nodes' loads from their heartbeats (this one's own), without a query. */
  nodes: () => ReadonlyArray<{ load?: { byExecutor?: Record<string, number> } }>;
  limits?: ApiLimits;
  /** AX_MAX_IN_FLIGHT: the limit of an executor that registered none (shown by status). */
  defaultMaxInFlight?: number;
  /** AX_TASK_WRITE_DEFER: a task row may point at a slot already fired that long (shards ls does not count it as lag). */
  taskWriteDeferMs?: number;
}

export const shardOfTask = (id: number, shardCount: number) => hash32(`task:${id}`) % shardCount;

const str = (field: string, v: unknown): string => {
  if (typeof v !== "string" || !v.length) throw new InvalidInputError(field, v, "required");
  return v;
};
const opt = <T>(v: T | undefined | null): v is T => v !== undefined && v !== null && v !== "";

function intIn(field: string, v: unknown, min: number, max: number): number {
  const n = typeof v === "string" && /^-?\d+$/.test(v) ? Number(v) : v;
  if (typeof n !== "number" || !Number.isInteger(n) || n < min || n > max) throw new InvalidInputError(field, v, `must be a whole number from ${min} to ${max}`);
  return n;
}

export const CreateTaskInput = z.object({
  name: z.unknown(), executor: z.unknown(), cron: z.string().optional(), tz: z.string().optional(),
  dstGap: z.string().optional(), dstRepeat: z.string().optional(), every: z.union([z.string(), z.number()]).optional(),
  fixedDelay: z.union([z.string(), z.number()]).optional(), at: z.string().optional(), delay: z.union([z.string(), z.number()]).optional(),
  after: z.array(z.string()).optional(), timeout: z.union([z.string(), z.number()]).optional(), retries: z.union([z.string(), z.number()]).optional(),
  backoff: z.union([z.string(), z.number()]).optional(), backoffMax: z.union([z.string(), z.number()]).optional(), misfire: z.string().optional(), overlap: z.string().optional(),
  payload: z.unknown().optional(),
  jitter: z.union([z.string(), z.number()]).optional(), start: z.union([z.string(), z.number()]).optional(), end: z.union([z.string(), z.number()]).optional(),
  maxRuns: z.union([z.string(), z.number()]).optional(), excludeCalendar: z.string().optional(),
}).passthrough();

/** Most tasks one `task.bulkCreate` call takes (a NATS message is 1 MB by default: ~5-10k specs). */
export const BULK_MAX = 50_000;

export interface ParsedTaskSpec { after: string[]; task: Omit<NewTask, "shardOf" | "upstreams"> }

/** Validates one task spec (the body of `task.create`) and computes its first due time. Pure: no I/O. */
export function parseTaskSpec(raw: Record<string, unknown>, now: number, limits: ApiLimits = DEFAULT_API_LIMITS): ParsedTaskSpec {
  // The common shape is checked by hand (the same rules as CreateTaskInput, much cheaper); zod
  // parses whatever fails the check, so a refusal reads exactly as before.
  const a = matchesCreateTaskInput(raw) ? (raw as z.infer<typeof CreateTaskInput>) : CreateTaskInput.parse(raw);
  const name = str("name", a.name);
  if (!NAME_RE.test(name)) throw new InvalidInputError("name", name, "use letters, digits, '.', '_' or '-' (at most 128)");
  const executor = str("executor", a.executor);
  if (!EXECUTOR_RE.test(executor)) throw new InvalidInputError("executor", executor, "use letters, digits, '_' or '-' (at most 64)");
  const after = a.after ?? [];
  checkPayload("payload", a.payload, limits);
  const hasTrigger = opt(a.cron) || opt(a.every) || opt(a.fixedDelay) || opt(a.at) || opt(a.delay);
  let spec: TriggerSpec | null = null;
  if (hasTrigger || !after.length) {
    const input: TriggerInput = {};
    if (opt(a.cron)) input.cron = a.cron;
    if (opt(a.tz)) input.tz = a.tz;
    if (opt(a.dstGap)) input.dstGap = a.dstGap;
    if (opt(a.dstRepeat)) input.dstRepeat = a.dstRepeat;
    if (opt(a.every)) input.every = a.every;
    if (opt(a.fixedDelay)) input.fixedDelay = a.fixedDelay;
    if (opt(a.at)) input.at = a.at;
    if (opt(a.delay)) input.delay = a.delay;
    spec = parseTrigger(input, now);
  } else {
    for (const f of ["tz", "dstGap", "dstRepeat"] as const) if (opt(a[f])) throw new InvalidInputError(f, a[f], "only with --cron");
  }
  spec = specWithOptions(a, spec, now); // --jitter, --start, --end, --max-runs, --exclude-calendar
  const timeoutMs = opt(a.timeout) ? boundedDuration("timeout", durationOf("timeout", a.timeout)) : 30_000;
  const retries = opt(a.retries) ? intIn("retries", a.retries, 0, 100) : 0;
  const backoffMs = opt(a.backoff) ? boundedDuration("backoff", durationOf("backoff", a.backoff, true)) : 1000;
  const backoffMaxMs = opt(a.backoffMax) ? boundedDuration("backoffMax", durationOf("backoffMax", a.backoffMax)) : Math.max(60_000, backoffMs);
  const misfire = a.misfire ?? "once";
  if (misfire !== "once" && misfire !== "skip" && misfire !== "all") throw new InvalidInputError("misfire", misfire, "must be once, skip or all");
  const overlap = a.overlap ?? "forbid";
  if (overlap !== "forbid" && overlap !== "allow") throw new InvalidInputError("overlap", overlap, "must be forbid or allow");
  const triggers = spec ? [{ kind: spec.kind, spec }] : [];
  const pointer = spec ? nextPointer({ name, triggers: [{ id: 0, kind: spec.kind, spec, enabled: true }], triggerSlots: {}, misfire, createdMs: now }, now) : null;
  const record = freshRecord(retries + 1, overlap);
  return {
    after,
    task: {
      name, executor, payload: a.payload ?? null, timeoutMs, maxAttempts: retries + 1, backoffMs, backoffMaxMs,
      misfire, overlap, state: record.value, record, triggers,
      nextDueMs: pointer?.dueMs ?? null, nextSlotMs: pointer?.slotMs ?? null, nextSource: pointer?.source ?? null, nextReason: pointer?.reason ?? null, nowMs: now,
    },
  };
}

// Pure functions of their input, memoized for bulk calls where thousands of specs share them.
const durationMemo = new Map<string, number>();
function durationOf(field: string, v: string | number, allowZero = false): number {
  if (typeof v !== "string") return parseDuration(field, v, { allowZero });
  const key = `${allowZero ? 1 : 0}${field}:${v}`;
  let ms = durationMemo.get(key);
  if (ms === undefined) {
    ms = parseDuration(field, v, { allowZero });
    if (durationMemo.size > 1000) durationMemo.clear();
    durationMemo.set(key, ms);
  }
  return ms;
}
/** Fresh records are never mutated (transitions return new ones), so one per (maxAttempts, overlap) is shared. */
const recordMemo = new Map<string, TaskRecord>();
function freshRecord(maxAttempts: number, overlap: "forbid" | "allow"): TaskRecord {
  const key = `${maxAttempts}:${overlap}`;
  let r = recordMemo.get(key);
  if (!r) { r = initialRecord({ maxAttempts, overlap }); recordMemo.set(key, r); }
  return r;
}

const STRING_FIELDS = new Set(["cron", "tz", "dstGap", "dstRepeat", "at", "misfire", "overlap", "excludeCalendar"]);
const STRING_OR_NUMBER_FIELDS = new Set(["every", "fixedDelay", "delay", "timeout", "retries", "backoff", "backoffMax", "jitter", "start", "end", "maxRuns"]);

/** True when `raw` passes CreateTaskInput as is (optional = absent or undefined; passthrough keeps the rest). */
function matchesCreateTaskInput(raw: unknown): boolean {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return false;
  const r = raw as Record<string, unknown>;
  for (const k in r) {
    const v = r[k];
    if (v === undefined) continue;
    if (STRING_FIELDS.has(k)) { if (typeof v !== "string") return false; }
    else if (STRING_OR_NUMBER_FIELDS.has(k)) { if (typeof v !== "string" && !(typeof v === "number" && Number.isFinite(v))) return false; }
    else if (k === "after" && (!Array.isArray(v) || !v.every((x) => typeof x === "string"))) return false;
  }
  return true;
}

/**
 * A bulk call's spec over its defaults: `{ ...defaults, ...item }`, made with Object.assign. The
 * spread of a decoded spec took 1.2–3 µs (V8's generic path), Object.assign 0.07. Object.assign
 * sets properties where the spread defines them; they differ only for a key "__proto__" (the
 * setter would change the copy's prototype), which JSON can carry: such a spec keeps the spread.
 */
function withDefaults(defaults: Record<string, unknown>, item: Record<string, unknown>): Record<string, unknown> {
  if (Object.hasOwn(defaults, "__proto__") || Object.hasOwn(item, "__proto__")) return { ...defaults, ...item };
  return Object.assign({}, defaults, item);
}

/** An error about one spec of a bulk call, re-addressed to `tasks[i].<field>`. */
function inItem(e: unknown, i: number): unknown {
  if (e instanceof AxError) return new AxError(e.code, `tasks[${i}].${e.message}`, { field: e.field === undefined ? `tasks[${i}]` : `tasks[${i}].${e.field}`, value: e.value });
  if (e instanceof z.ZodError) {
    const issue = e.issues[0];
    return new InvalidInputError(`tasks[${i}].${issue?.path.join(".") ?? ""}`, undefined, issue?.message ?? "invalid");
  }
  return e;
}

/** The operations of the cluster, shared by the NATS API, the HTTP API and the CLI. */
export class Api {
  private readonly limits: ApiLimits;
  private readonly audit: AuditLog;
  /** task.update, task.history, apply, export (ops/taskEditor.ts). */
  private readonly editor: TaskEditor;
  /** Single runs and executor instances (ops/runOps.ts). */
  readonly runOps: RunOps;
  /** Calendars, backfill, forecast (ops/scheduling.ts). */
  readonly scheduling: SchedulingOps;
  private readonly browse: BrowseDeps;
  constructor(private readonly d: ApiDeps) {
    this.limits = d.limits ?? DEFAULT_API_LIMITS; this.audit = new AuditLog(d.store.audit);
    this.browse = { store: d.store, publicTask, publicRun, nowMs: () => d.clock.now() };
    this.scheduling = new SchedulingOps({ store: d.store, clock: d.clock, shardCommand: (shard, cmd) => this.shardCommand(shard, cmd) });
    this.runOps = new RunOps({ store: d.store, nc: d.nc, names: d.names, clock: d.clock, defaultMaxInFlight: d.defaultMaxInFlight ?? null });
    this.editor = new TaskEditor({
      store: d.store, clock: d.clock, parseSpec: (raw, now) => parseTaskSpec(raw, now, this.limits), resolveTask: (ref) => this.task({ task: ref }),
      shardCommand: (shard, cmd) => this.shardCommand(shard, cmd), createTask: (spec, applySet) => this.createTask(spec, applySet),
      depsChanged: (ids) => this.depsChanged(ids),
      removeTask: (id) => this.removeTask({ task: id }), publish: (subject, value) => d.nc.publish(subject, encode(value)),
    });
  }

  /**
   * One operation. Whatever the input, a refusal is an AxError naming the field (a 4xx over
   * HTTP, exit 2 in the CLI), never an unexplained internal error: the arguments must be an
   * object; strings, sizes and nesting are checked before any parsing (checkArgs); a schema
   * refusal names its path; a value PostgreSQL still refuses (a data exception) is reported as
   * bad input.
   * `ctx.who`: the caller (token name, NATS user) for the audit trail.
   */
  async call(op: string, args: Record<string, unknown>, ctx: { who?: string } = {}): Promise<unknown> {
    if (!isWriteOp(op)) return this.checkedCall(op, args, ctx.who ?? "unknown");
    let error: unknown = null;
    try {
      return await this.checkedCall(op, args, ctx.who ?? "unknown");
    } catch (e) {
      error = e;
      throw e;
    } finally {
      const safeArgs = args !== null && typeof args === "object" && !Array.isArray(args) ? args : { body: String(args) };
      // The trail must not turn a done write into a reported failure: a failed insert is only logged by the caller's metrics.
      await this.audit.record(this.d.clock.now(), ctx.who ?? "unknown", op, safeArgs, error).catch(() => undefined);
    }
  }

  private async checkedCall(op: string, args: Record<string, unknown>, who: string): Promise<unknown> {
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      throw new InvalidInputError("body", args, "must be a JSON object of arguments");
    }
    checkArgs(args, this.limits);
    try {
      return await (this.runOps.handle(op, args, who) ?? this.dispatch(op, args, who));
    } catch (e) {
      if (e instanceof z.ZodError) {
        const issue = e.issues[0];
        const field = issue?.path.join(".") || "body";
        throw new InvalidInputError(field, field === "body" ? undefined : issue?.path.reduce<unknown>((o, k) => (o as Record<PropertyKey, unknown> | undefined)?.[k as PropertyKey], args), issue?.message ?? "invalid");
      }
      const pgCode = (e as { code?: unknown })?.code;
      if (!(e instanceof AxError) && typeof pgCode === "string" && /^22/.test(pgCode)) {
        throw new AxError("AX_E_INVALID", `a value is out of range or malformed (${(e as Error).message})`, { field: "body" });
      }
      throw e;
    }
  }

  private async dispatch(op: string, args: Record<string, unknown>, who: string): Promise<unknown> {
    if (op.startsWith("executor.register.")) {
      // The executor's own subject: NATS permissions can let executor E register E and nothing else.
      const own = op.slice("executor.register.".length);
      if (args.name !== undefined && args.name !== own) throw new InvalidInputError("name", args.name, `must be ${own} on this subject`);
      return this.registerExecutor({ ...args, name: own });
    }
    switch (op) {
      case "executor.register": return this.registerExecutor(args);
      case "task.create": return this.createTask(args);
      case "task.bulkCreate": return this.bulkCreate(args);
      case "run.get": { const r = await this.runOps.getRun(args); return { ...r, run: publicRun(r.run) }; }
      case "task.ls": return (await this.d.store.listTasks({
        limit: args.limit ? intIn("limit", args.limit, 1, 100_000) : 1000, ...taskListFilters(args),
        ...(args.after !== undefined ? { afterId: intIn("after", args.after, 0, Number.MAX_SAFE_INTEGER) } : {}),
      })).map(publicTask);
      case "task.show": return this.showTask(args);
      case "task.search": return searchTasks(this.browse, args);
      case "task.tag": return tagTask(this.browse, await this.task(args), args);
      case "failures": return failures(this.browse, args);
      case "executors.inflight": return inFlightByExecutor(this.browse, this.d.nodes());
      case "run.show": return this.showRun(args);
      case "alerts.set": case "alerts.ls": case "alerts.rm": return alertsOp(this.d.store.alertHooks, op, args, this.d.clock.now());
      case "task.preview": return this.previewTask(args);
      case "task.pause": return this.toShard(args, "pause");
      case "task.resume": return this.toShard(args, "resume");
      case "task.rm": return this.removeTask(args);
      case "task.update": return this.editor.update(args, who);
      case "task.history": {
        const t = await this.task(args);
        return this.editor.history.list(t.id, args.limit !== undefined ? intIn("limit", args.limit, 1, 10_000) : 50);
      }
      case "apply": return this.editor.apply(args, who);
      case "export": return this.editor.exportSet(args);
      case "task.deps.add": return this.depsAdd(args);
      case "task.deps.rm": return this.depsRm(args);
      case "dag": return this.dag(args);
      case "run": return this.manualRun(args);
      case "runs": return this.runs(args);
      case "why": return args.task !== undefined ? this.whyTask(args) : this.why(args);
      case "ledger": return this.ledgerTimeline(args);
      case "status": return this.d.status();
      case "audit": return this.audit.list({
        limit: args.limit !== undefined ? intIn("limit", args.limit, 1, 10_000) : 50,
        ...(args.task !== undefined ? { task: String(args.task) } : {}),
      });
      case "shards.ls": return this.shardsLs();
      case "dead.ls": return listDeadLetters(await jetstreamManager(this.d.nc), this.d.names, args.limit === undefined ? 50 : intIn("limit", args.limit, 1, 1000));
      case "shards.move": return this.shardsMove(args);
      case "shards.unpin": return this.shardsUnpin(args);
      case "shards.rebalance": return this.rebalance(args);
      case "node.drain": return this.drain(args, true);
      case "node.undrain": return this.drain(args, false);
      case "calendar.create": return this.scheduling.calendarCreate(args);
      case "calendar.ls": return this.scheduling.calendarLs();
      case "calendar.show": return this.scheduling.calendarShow(args);
      case "calendar.rm": return this.scheduling.calendarRm(args);
      case "task.backfill": return this.scheduling.backfill(await this.task(args), args);
      case "forecast": return this.scheduling.forecast(args);
      default: throw new InvalidInputError("op", op, "unknown operation");
    }
  }

  private async registerExecutor(a: Record<string, unknown>): Promise<unknown> {
    const name = str("name", a.name);
    if (!/^[A-Za-z0-9_-]{1,64}$/.test(name)) throw new InvalidInputError("name", name, "letters, digits, _ or - only");
    await this.d.store.upsertExecutor(name, a.kind === "http" ? "http" : "nats", a.maxInFlight ? intIn("maxInFlight", a.maxInFlight, 1, 10_000_000) : null, this.d.clock.now(), a.holds === true);
    // The node makes the executor's durable consumer: on a least-privilege NATS (deploy/nats)
    // executors may only pull their own consumer, not create one (a creator picks the filter).
    // An `http` executor is a bridge (ax executor http) that pulls its dispatches the same way.
    await ensureExecutorConsumer(await jetstreamManager(this.d.nc), this.d.names, name);
    return { name };
  }

  async createTask(raw: Record<string, unknown>, applySet?: string): Promise<unknown> {
    const now = this.d.clock.now();
    const p = parseTaskSpec(raw, now, this.limits);
    await checkHttpTasks(this.d.store, [p.task]);
    await checkCalendarsExist(this.d.store, p.task.triggers.map((t) => t.spec as TriggerSpec));
    const upstreams: number[] = [];
    for (const up of p.after) upstreams.push((await this.d.store.requireTask(up).catch(() => { throw new InvalidInputError("after", up, "no such task", "AX_E_NOT_FOUND"); })).id);
    const tags = raw.tags !== undefined ? parseTags(raw.tags) : [];
    const row = await this.d.store.createTask({ ...p.task, upstreams, shardOf: (id) => shardOfTask(id, this.d.shardCount), ...(applySet ? { applySet } : {}) });
    if (upstreams.length) await this.depsChanged(upstreams);
    if (tags.length) await tagTask(this.browse, row, { tags });
    if (row.nextDueMs !== null) await this.d.due.add(row.shard, [{ id: row.id, dueMs: row.nextDueMs }]);
    await this.shardCommand(row.shard, { type: "load", taskId: row.id }).catch(() => undefined); // the owner also refills from Redis
    return { ...publicTask(row), tags };
  }

  /**
   * `task.bulkCreate { tasks: [spec…], defaults?: spec, returnIds?: boolean }`: registers up to
   * BULK_MAX tasks in one transaction (COPY), every spec validated exactly as `task.create`
   * validates one (a refusal names `tasks[i].<field>` and creates nothing). Each spec is
   * `{ ...defaults, ...spec }`. `after` may name existing tasks only. Due times go to the
   * Redis index in batches of 1000 per shard; the owner of every shard with due times within its
   * horizon is handed one of them, which makes it take them all from Redis at once.
   */
  async bulkCreate(a: Record<string, unknown>): Promise<{ created: number; ids?: number[] }> {
    const list = a.tasks;
    if (!Array.isArray(list) || !list.length) throw new InvalidInputError("tasks", list, "must be a non-empty array of task specs");
    if (list.length > BULK_MAX) throw new InvalidInputError("tasks", list.length, `at most ${BULK_MAX} tasks per call`);
    const defaults = a.defaults === undefined || a.defaults === null ? {} : a.defaults;
    if (typeof defaults !== "object" || Array.isArray(defaults)) throw new InvalidInputError("defaults", defaults, "must be an object (a partial task spec)");
    const now = this.d.clock.now();
    const noDefaults = Object.keys(defaults).length === 0;
    const parsed: ParsedTaskSpec[] = new Array(list.length);
    const afterNames = new Set<string>();
    for (let i = 0; i < list.length; i++) {
      const item = list[i];
      if (item === null || typeof item !== "object" || Array.isArray(item)) throw new InvalidInputError(`tasks[${i}]`, item, "must be a task spec object");
      try {
        // (no copy of each spec when there are no defaults: GC was a sixth of a bulk call's time)
        parsed[i] = parseTaskSpec(noDefaults ? item as Record<string, unknown> : withDefaults(defaults as Record<string, unknown>, item as Record<string, unknown>), now, this.limits);
      } catch (e) { throw inItem(e, i); }
      for (const n of parsed[i]!.after) afterNames.add(n);
    }
    try { await checkHttpTasks(this.d.store, parsed.map((p) => p.task)); } catch (e) { throw inItem(e, (e as { index?: number }).index ?? 0); }
    await checkCalendarsExist(this.d.store, parsed.flatMap((p) => p.task.triggers.map((t) => t.spec as TriggerSpec)), "tasks[].excludeCalendar");
    const upIds = afterNames.size ? await this.d.store.taskIdsByName([...afterNames]) : new Map<string, number>();
    const tasks: BulkNewTask[] = parsed.map((p, i) => {
      const task = p.task as BulkNewTask; // parseTaskSpec's object is ours: completed in place, not copied
      task.upstreams = p.after.map((n) => {
        const id = upIds.get(n);
        if (id === undefined) throw new InvalidInputError(`tasks[${i}].after`, n, "no such task (a bulk task may only depend on tasks that already exist)", "AX_E_NOT_FOUND");
        return id;
      });
      return task;
    });
    const created = await this.d.store.createTasksBulk(tasks, (id) => shardOfTask(id, this.d.shardCount));
    if (upIds.size) await this.depsChanged(new Set(tasks.flatMap((t) => t.upstreams)));
    const byShard = new Map<number, Array<{ id: number; dueMs: number }>>();
    const handoff = new Map<number, BulkCreated>(); // per shard, its earliest task due within the horizon
    for (const c of created) {
      if (c.nextDueMs === null) continue;
      let l = byShard.get(c.shard);
      if (!l) { l = []; byShard.set(c.shard, l); }
      l.push({ id: c.id, dueMs: c.nextDueMs });
      const h = handoff.get(c.shard);
      if (c.nextDueMs < now + MAX_HORIZON_MS && (!h || c.nextDueMs < h.nextDueMs!)) handoff.set(c.shard, c);
    }
    await Promise.all([...byShard].map(([shard, entries]) => this.d.due.add(shard, entries)));
    // The owners take due times from Redis every 250 ms to 1 s (Horizon.scheduleRefill). A
    // hand-over (`load`) makes its owner refill at once, and that refill takes every entry of the
    // shard within its horizon: one task a shard is handed over, so imminent tasks are on the
    // wheels at once and a burst created less than 10 s ahead is spread over all the time left.
    const loads = [...handoff.values()];
    for (let i = 0; i < loads.length; i += 64) {
      await Promise.all(loads.slice(i, i + 64).map((c) => this.shardCommand(c.shard, { type: "load", taskId: c.id }).catch(() => undefined)));
    }
    return { created: created.length, ...(a.returnIds === true ? { ids: created.map((c) => c.id) } : {}) };
  }

  private async task(a: Record<string, unknown>): Promise<TaskRow> {
    const ref = a.task;
    if (typeof ref !== "string" && typeof ref !== "number") throw new InvalidInputError("task", ref, "required (a task name or id)");
    if (typeof ref === "number" && (!Number.isSafeInteger(ref) || ref < 1)) throw new InvalidInputError("task", ref, "not a task id (a whole number from 1)");
    if (typeof ref === "string" && (!ref.length || ref.length > 128)) throw new InvalidInputError("task", ref.slice(0, 32), "not a task name (1 to 128 characters)");
    if (typeof ref === "string" && /^\d+$/.test(ref) && !Number.isSafeInteger(Number(ref))) {
      // Too long to be an id: only a task named with these digits can match.
      const id = (await this.d.store.taskIdsByName([ref])).get(ref);
      if (id === undefined) throw new InvalidInputError("task", ref, "no such task", "AX_E_NOT_FOUND");
      return this.d.store.requireTask(id);
    }
    return this.d.store.requireTask(ref);
  }

  private async showTask(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const ups = await Promise.all(t.upstreams.map(async (id) => {
      const u = await this.d.store.getTask(id);
      const last = await this.d.store.lastRunOf(id);
      return { id, name: u?.name ?? String(id), state: u?.state, lastRun: last ? { id: last.id, state: last.state, finishedAt: last.finishedMs } : null };
    }));
    const downs = await Promise.all((await this.d.store.downstreamsOf(t.id)).map(async (d) => {
      const last = await this.d.store.lastRunOf(d.id);
      const row = await this.d.store.getTask(d.id);
      return { id: d.id, name: d.name, state: row?.state, lastRun: last ? { id: last.id, state: last.state, finishedAt: last.finishedMs } : null };
    }));
    const recent = await this.d.store.listRuns(t.id, a.runs !== undefined ? intIn("runs", a.runs, 1, 200) : 5);
    return { ...publicTask(t), tags: await taskTags(this.browse, t.id), upstreams: ups, downstreams: downs, recentRuns: recent.map(publicRun) };
  }

  /** `run.show { run }`: the run, why it ran (as `why`), the attempts of its retry chain, and its task's payload. */
  private async showRun(a: Record<string, unknown>): Promise<unknown> {
    const w = await this.why(a) as { run: unknown; sentences: string[] };
    const run = (await this.d.store.getRun(String(a.run)))!;
    const task = await this.d.store.getTask(run.taskId);
    const attempts = await attemptsOf(this.browse, run);
    return { ...w, attempts: attempts.map(publicRun), task: task ? { name: task.name, executor: task.executor, state: task.state, payload: task.payload, maxAttempts: task.maxAttempts } : null };
  }

  private async previewTask(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const count = a.count !== undefined ? intIn("count", a.count, 1, 1000) : 10;
    const now = this.d.clock.now();
    const out: Array<{ trigger: string; tz: string; times: string[]; marks: Array<{ at: string | null; utc: string | null; note: string }> }> = [];
    for (const tr of t.triggers) {
      const c = compileTrigger(tr.spec as TriggerSpec);
      const tz = (tr.spec as { tz?: string }).tz ?? "UTC";
      const from = tr.kind === "fixed_rate" ? Math.max(now, t.triggerSlots[String(tr.id)] ?? 0) : now;
      // marks: every slot (zone and UTC) plus the wall times a DST rule left out, each with
      // what the rule did ("" for an ordinary slot); times: the slots alone, as before.
      const marks = previewMarks(c, from, count).map((m) => ({
        at: m.slotMs === null ? null : fmtInZone(m.slotMs, tz), utc: m.slotMs === null ? null : new Date(m.slotMs).toISOString(), note: m.note,
      }));
      out.push({ trigger: c.describe(), tz, times: marks.filter((m) => m.at !== null).map((m) => m.at!), marks });
    }
    return { task: t.name, nextDue: t.nextDueMs ? new Date(t.nextDueMs).toISOString() : null, triggers: out };
  }

  /**
   * Dependency edges of these tasks changed (committed): their shard owners read the edge fields
   * again for rows they hold in memory. A run in flight otherwise finished with the old ones,
   * and a downstream added while its upstream ran was not triggered by that run.
   */
  private async depsChanged(ids: Iterable<number>): Promise<void> {
    await Promise.all([...new Set(ids)].map((id) => this.shardCommand(shardOfTask(id, this.d.shardCount), { type: "deps", taskId: id }).catch(() => undefined)));
  }

  private async shardCommand(shard: number, cmd: ShardCommand, timeoutMs = 5000): Promise<CommandReply> {
    let lastErr: unknown;
    for (let i = 0; i < 3; i++) {
      try {
        const m = await this.d.nc.request(this.d.names.shardSubject(shard, "cmd"), encode(cmd), { timeout: timeoutMs });
        const r = JSON.parse(new TextDecoder().decode(m.data)) as CommandReply;
        if (!r.ok && r.error.code === "AX_E_UNAVAILABLE" && i < 2) { await new Promise((res) => setTimeout(res, 500)); continue; }
        return r;
      } catch (e) {
        lastErr = e;
        await new Promise((res) => setTimeout(res, 500));
      }
    }
    throw new AxError("AX_E_UNAVAILABLE", `shard ${shard} has no owner answering right now (${String((lastErr as Error)?.message ?? lastErr)}); retry in a few seconds`, { field: "shard", value: shard });
  }

  private async toShard(a: Record<string, unknown>, type: "pause" | "resume"): Promise<unknown> {
    const t = await this.task(a);
    if (type === "resume" && t.state !== "paused" && !(t.record as TaskRecord).context.pausedAfterRun) {
      // Nothing to resume: said plainly, and changes nothing (resuming twice is not an error).
      return { ...publicTask(t), notPaused: true, message: `task ${t.name} is not paused (it is ${t.state}); nothing to resume` };
    }
    const r = await this.shardCommand(t.shard, { type, taskId: t.id });
    if (!r.ok) throw AxError.fromJSON(r.error);
    return publicTask((await this.d.store.getTask(t.id))!);
  }

  private async removeTask(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const downs = await this.d.store.downstreamsOf(t.id);
    if (downs.length) throw new InvalidInputError("task", t.name, `other tasks depend on it (${downs.map((d) => d.name).join(", ")}); remove those edges first`, "AX_E_CONFLICT");
    const r = await this.shardCommand(t.shard, { type: "cancel", taskId: t.id });
    if (!r.ok) throw AxError.fromJSON(r.error);
    await this.d.due.remove(t.shard, [t.id]);
    await this.d.store.deleteTask(t.id);
    return { removed: t.name };
  }

  private async depsAdd(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const up = await this.d.store.requireTask(str("upstream", a.upstream)).catch((e) => { throw new InvalidInputError("upstream", a.upstream, (e as Error).message, "AX_E_NOT_FOUND"); });
    await this.d.store.addDependency(t.id, up.id, this.d.clock.now());
    await this.depsChanged([t.id, up.id]);
    return { task: t.name, upstream: up.name };
  }
  private async depsRm(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const up = await this.d.store.requireTask(str("upstream", a.upstream));
    if (!(await this.d.store.removeDependency(t.id, up.id))) throw new InvalidInputError("upstream", up.name, `${t.name} does not depend on it`, "AX_E_NOT_FOUND");
    await this.depsChanged([t.id, up.id]);
    return { task: t.name, upstream: up.name, removed: true };
  }

  private async dag(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const edges = await this.d.store.allEdges();
    // The connected component around the task.
    const seen = new Set<number>([t.id]); const queue = [t.id];
    while (queue.length) {
      const n = queue.pop()!;
      for (const e of edges) for (const [x, y] of [[e.upstream, e.downstream], [e.downstream, e.upstream]] as const) if (x === n && !seen.has(y)) { seen.add(y); queue.push(y); }
    }
    const nodes = await Promise.all([...seen].map(async (id) => {
      const row = await this.d.store.getTask(id);
      const last = await this.d.store.lastRunOf(id);
      return { id, name: row?.name ?? String(id), state: row?.state ?? "?", lastRun: last?.state ?? null };
    }));
    return { root: t.name, nodes, edges: edges.filter((e) => seen.has(e.upstream)) };
  }

  private async manualRun(a: Record<string, unknown>): Promise<unknown> {
    checkPayload("payload", a.payload, this.limits);
    const t = await this.task(a);
    const r = await this.shardCommand(t.shard, { type: "run", taskId: t.id, force: a.force === true, ...(a.payload !== undefined ? { payload: a.payload } : {}) });
    if (!r.ok) throw AxError.fromJSON(r.error);
    return { task: t.name, ...(r.value as object) };
  }

  private async runs(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const limit = a.limit !== undefined ? intIn("limit", a.limit, 1, 10_000) : 20;
    if (a.all === true) return new LedgerView(this.d.store, () => this.d.clock.now()).timeline(t, limit);
    return (await this.d.store.listRuns(t.id, limit, runListFilters(a, this.d.clock.now()))).map(publicRun);
  }

  private async why(a: Record<string, unknown>): Promise<unknown> {
    const id = str("run", a.run);
    const run = await this.d.store.getRun(id);
    if (!run) throw new InvalidInputError("run", id, "no such run (runs are kept for the retention period)", "AX_E_NOT_FOUND");
    const task = await this.d.store.getTask(run.taskId);
    const cause = run.causedBy ? await this.d.store.getRun(run.causedBy) : null;
    const ups = run.upstreamRuns ? await this.d.store.getRuns(run.upstreamRuns) : [];
    const sentences = explainRun(run, task, cause, ups);
    const change = await this.editor.history.changeBefore(run);
    if (change) sentences.splice(1, 0, `It is the first run after update ${change.generation} of the task at ${change.at} by ${change.who} (${describeChange(change.change)}).`);
    return { run: publicRun(run), sentences, ...(change ? { afterUpdate: change } : {}) };
  }

  /** `why TASK --at TIME` / `--between T1 T2`: what happened to the slots (ops/ledgerView.ts). */
  private async whyTask(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const view = new LedgerView(this.d.store, () => this.d.clock.now());
    if (a.at !== undefined) return view.whyAt(t, parseInstant("at", a.at));
    if (a.from !== undefined && a.to !== undefined) return view.whyBetween(t, parseInstant("from", a.from), parseInstant("to", a.to));
    throw new InvalidInputError("at", a.at, "give --at TIME or --between T1 T2");
  }

  /** The dashboard's timeline of a task: runs and non-run intervals, newest first. */
  private async ledgerTimeline(a: Record<string, unknown>): Promise<unknown> {
    const t = await this.task(a);
    const limit = a.limit !== undefined ? intIn("limit", a.limit, 1, 10_000) : 100;
    return new LedgerView(this.d.store, () => this.d.clock.now()).timeline(t, limit);
  }

  private async shardsLs(): Promise<unknown> {
    const rows = await this.d.store.listShards();
    const counts = await this.d.store.countTasksByShard();
    const now = this.d.clock.now();
    // A row keeps pointing at a fired slot until its run ends or AX_TASK_WRITE_DEFER passes
    // (docs/CLUSTER.md): only a due time older than that and a second is lag.
    const oldest = await this.d.store.oldestOverdueByShard(now - 1000 - (this.d.taskWriteDeferMs ?? 0));
    const lagBy = new Map([...oldest].map(([shard, dueMs]) => [shard, now - dueMs]));
    return rows.map((r) => ({ shard: r.shard, owner: r.owner, epoch: r.epoch, pinnedTo: r.pinnedTo, tasks: counts.get(r.shard)?.tasks ?? 0,
      dueSoon: counts.get(r.shard)?.dueSoon ?? 0, lagMs: lagBy.get(r.shard) ?? 0 }));
  }

  private shardArg(a: Record<string, unknown>): number { return intIn("shard", a.shard, 0, this.d.shardCount - 1); }

  private async shardsMove(a: Record<string, unknown>): Promise<unknown> {
    const shard = this.shardArg(a);
    const node = str("node", a.node);
    if (!this.d.supervisor.liveMembers().some((m) => m.id === node) && node !== this.d.nodeId) throw new InvalidInputError("node", node, "not a live node (see ax status)", "AX_E_NOT_FOUND");
    await this.d.store.setPin(shard, node);
    this.d.nc.publish(this.d.names.heartbeatSubject + ".kick", encode({}));
    return { shard, pinnedTo: node };
  }
  private async shardsUnpin(a: Record<string, unknown>): Promise<unknown> {
    const shard = this.shardArg(a);
    await this.d.store.setPin(shard, null);
    this.kickCluster();
    return { shard, pinnedTo: null };
  }
  /** Operator state (pins, drains) changed in PostgreSQL: every node re-reads it and reconciles now. */
  private kickCluster(): void { this.d.nc.publish(this.d.names.heartbeatSubject + ".kick", encode({})); }
  private async rebalance(a: Record<string, unknown>): Promise<unknown> {
    const plan = this.d.supervisor.rebalancePlan();
    if (a.dryRun === true) return { dryRun: true, moves: plan };
    // One plan to every node: the moves are pins until done, so nothing else moves meanwhile.
    this.d.supervisor.requestMoves(plan.map((m) => ({ shard: m.shard, to: m.to })));
    return { dryRun: false, moves: plan };
  }
  private async drain(a: Record<string, unknown>, on: boolean): Promise<unknown> {
    const node = str("node", a.node);
    const drained = await this.d.store.setDrained(node, on);
    this.kickCluster();
    return { drained };
  }
}

export function fmtInZone(ms: number, tz: string): string {
  const parts = new Intl.DateTimeFormat("en-CA", { timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false, timeZoneName: "shortOffset" }).formatToParts(new Date(ms));
  const g = (t: string) => parts.find((p) => p.type === t)?.value ?? "";
  return `${g("year")}-${g("month")}-${g("day")} ${g("hour") === "24" ? "00" : g("hour")}:${g("minute")}:${g("second")} ${g("timeZoneName")} (${tz})`;
}

/** A stored trigger in words; one that no longer compiles says so (its task is shown, not refused). */
function describeTrigger(spec: unknown): string {
  try { const o = describeOptions(scheduleOptionsOf(spec)); return compileTrigger(spec as TriggerSpec).describe() + (o ? `; ${o}` : ""); } catch (e) { return `cannot be read: ${(e as Error).message}`; }
}

export function publicTask(t: TaskRow) {
  const ctx = (t.record as { context?: { attempt?: number; inFlight?: string[]; lastError?: string | null } }).context ?? {};
  return {
    id: t.id, name: t.name, executor: t.executor, state: t.state, shard: t.shard, payload: t.payload,
    triggers: t.triggers.map((tr) => ({ id: tr.id, kind: tr.kind, spec: tr.spec, description: describeTrigger(tr.spec) })),
    timeout: formatDuration(t.timeoutMs), retries: t.maxAttempts - 1, backoff: formatDuration(t.backoffMs), misfire: t.misfire, overlap: t.overlap,
    nextDueAt: t.nextDueMs !== null ? new Date(t.nextDueMs).toISOString() : null, nextSource: t.nextSource, nextReason: t.nextReason,
    attempt: ctx.attempt ?? 0, inFlight: ctx.inFlight ?? [], lastError: ctx.lastError ?? null, upstreams: t.upstreams,
    generation: t.generation, applySet: t.applySet,
  };
}

export function publicRun(r: RunRow) {
  const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());
  return {
    id: r.id, taskId: r.taskId, task: r.taskName, source: r.source, state: r.state, dueAt: iso(r.dueMs), firedAt: iso(r.firedMs),
    startedAt: iso(r.startedMs), finishedAt: iso(r.finishedMs), node: r.node, shard: r.shard, epoch: r.epoch, attempt: r.attempt,
    executor: r.executor, executorInstance: r.executorInstance, error: r.error, causedBy: r.causedBy, upstreamRuns: r.upstreamRuns,
    lateOutcome: r.lateOutcome, dueReason: r.dueReason, result: r.result ?? null, slotAt: iso(r.slotMs),
  };
}

export { decode };
