import { z } from "zod";

/**
 * Every message that crosses NATS, as zod schemas. Each boundary decodes with `decode()`:
 * a malformed message is refused with a reason (logged by the caller), never thrown into
 * a node's event loop. `v` is the wire version; readers refuse versions they do not know.
 */
/** Printable ASCII: run ids are ours (newRunId, derivedRunId); anything else (a NUL, a control character) is forged. */
const RUN_ID_RE = /^[\x21-\x7e]+$/;
const runId = z.string().min(1).max(128).regex(RUN_ID_RE, "a run id is printable ASCII");
/** Error texts executors report are cut to this many characters. */
export const MAX_ERROR_TEXT = 4096;
/**
 * Free text from another process (an executor's error, a trigger's reason): U+0000 removed
 * (PostgreSQL refuses it, and one such text used to fail the whole batch's write, restart the
 * shard and come back for days) and the length bounded.
 */
const stripNul = (s: string) => (s.includes("\u0000") ? s.replaceAll("\u0000", "") : s);
const text = (max: number) => z.string().transform((s) => stripNul(s).slice(0, max));
const ms = z.number().int().nonnegative();

export const RunSourceSchema = z.enum(["cron", "rate", "delay", "once", "manual", "dependency", "retry", "misfire", "backfill"]);

/** One run handed to an executor. */
export const DispatchRunSchema = z.object({
  runId,
  taskId: z.number().int().positive(),
  taskName: z.string(),
  attempt: z.number().int().positive(),
  source: RunSourceSchema,
  payload: z.unknown(),
  scheduledAt: ms.describe("the time the run was due (epoch ms)"),
  firedAt: ms,
  timeoutMs: z.number().int().positive(),
  /** Echoed on every event of the run; events without it are refused (see docs/PROTOCOL.md). */
  token: z.string().max(64).optional(),
  /** v2 batches: the shard of the run (its events go back tagged with it). */
  shard: z.number().int().nonnegative().optional(),
  /**
   * When the scheduler gives up on the run (epoch ms, firedAt + timeoutMs): an executor must not
   * start it after this. Absent from older nodes' dispatches (then firedAt + timeoutMs).
   */
  deadline: ms.optional(),
  /** The task's generation when the run was decided; a later one means the run is obsolete (see run.check). */
  gen: z.number().int().nonnegative().optional(),
});

/**
 * Subject `<ns>.dispatch.<executor>`; JetStream message id = `d:<first runId>`.
 * v1: every run of one shard (`shard`, `epoch`); events go to `<ns>.events.<shard>`.
 * v2: one message per executor per node round, runs of many shards (each run names its
 * `shard`); events go to `<ns>.events.n.<node>` as an EventBatch v2.
 */
export const DispatchBatchV1Schema = z.object({
  v: z.literal(1),
  shard: z.number().int().nonnegative(),
  epoch: z.number().int().nonnegative(),
  node: z.string(),
  runs: z.array(DispatchRunSchema).min(1),
});
export const DispatchBatchV2Schema = z.object({
  v: z.literal(2),
  node: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/),
  /**
   * When the node published the message (epoch ms, its clock). Runs may come ahead of their due
   * time to an executor that registered `holds`: it starts each `firedAt - sentAt` ms after it
   * received the message. Absent from older nodes' messages (released at the due time).
   */
  sentAt: ms.optional(),
  runs: z.array(DispatchRunSchema.extend({ shard: z.number().int().nonnegative() })).min(1),
});
export const DispatchBatchSchema = z.discriminatedUnion("v", [DispatchBatchV1Schema, DispatchBatchV2Schema]);

export const FailureSchema = z.object({
  message: text(MAX_ERROR_TEXT),
  type: text(128).optional(),
  nonRetryable: z.boolean().optional(),
});

/** Most bytes (as JSON) of a run's `result`; a larger one is replaced by a note saying so. */
export const MAX_RESULT_BYTES = 8192;

export const RunEventSchema = z.object({
  /**
   * `stale`: the executor refused to start the run (its deadline passed, a retry or a change of
   * its task superseded it, or its task was removed); `reason` says which. Not a failure of the
   * work: the run is recorded `stale` (and the task goes on as after a timeout).
   */
  type: z.enum(["started", "progress", "completed", "failed", "stale"]),
  runId,
  taskId: z.number().int().positive(),
  at: ms,
  error: FailureSchema.optional(),
  /**
   * On `completed` / `failed` only: when the run started. An executor whose `started` event was
   * still unsent when the run ended sends this instead of the `started` event (one event and one
   * row update fewer per short run); the scheduler records it as the start.
   */
  startedAt: ms.optional(),
  /** The run's `token` from its dispatch. */
  token: z.string().max(64).optional(),
  /** On `stale`: why the run was not started. */
  reason: text(MAX_ERROR_TEXT).optional(),
  /**
   * On `completed` / `failed`: what the run produced, kept on the run (e.g. an HTTP job's status
   * and body excerpt). At most MAX_RESULT_BYTES as JSON.
   */
  result: z.unknown().optional().refine((v) => v === undefined || JSON.stringify(v).length <= MAX_RESULT_BYTES, `at most ${MAX_RESULT_BYTES} bytes as JSON`),
  /** In an EventBatch v2: the shard of the run (from its dispatch). */
  shard: z.number().int().nonnegative().optional(),
});

/** v1: subject `<ns>.events.<shard>`, every event of one shard; read by that shard's owner. */
export const EventBatchV1Schema = z.object({
  v: z.literal(1),
  executor: z.string(),
  instance: z.string(),
  shard: z.number().int().nonnegative(),
  events: z.array(RunEventSchema).min(1),
});
/**
 * v2: subject `<ns>.events.n.<node>`, the events of runs that `node` dispatched (v2 dispatch),
 * each tagged with its shard. The node applies those of shards it owns and forwards the rest
 * as v1 batches to the shards' own subjects.
 */
export const EventBatchV2Schema = z.object({
  v: z.literal(2),
  executor: z.string(),
  instance: z.string(),
  node: z.string(),
  events: z.array(RunEventSchema.extend({ shard: z.number().int().nonnegative() })).min(1),
});
export const EventBatchSchema = z.discriminatedUnion("v", [EventBatchV1Schema, EventBatchV2Schema]);

/** One run chain's end, as the DependencyActor needs it. */
export const OutcomeSchema = z.object({
  taskId: z.number().int().positive(),
  runId,
  outcome: z.enum(["success", "failed", "upstream_failed"]),
  at: ms,
  reason: text(MAX_ERROR_TEXT).optional(),
});

/** Subject `<ns>.outcome.<shard>`, published by shard actors (one message per round); read by the DependencyActor. */
export const OutcomeBatchSchema = z.object({ v: z.literal(1), outcomes: z.array(OutcomeSchema).min(1) });

/** Subject `<ns>.trigger.<shard>`, published by the DependencyActor for a downstream task. */
export const DependencyTriggerSchema = z.object({
  v: z.literal(1),
  kind: z.enum(["due", "upstream_failed"]),
  taskId: z.number().int().positive(),
  // Not cut: run ids are derived from the whole key (a fan-in's key lists its upstream runs).
  key: z.string().min(1).max(65_536).transform(stripNul),
  upstreamRuns: z.array(runId),
  reason: text(MAX_ERROR_TEXT),
  at: ms,
});

export type DispatchRun = z.infer<typeof DispatchRunSchema>;
export type DispatchBatch = z.infer<typeof DispatchBatchSchema>;
export type DispatchBatchV2 = z.infer<typeof DispatchBatchV2Schema>;
export type RunEvent = z.infer<typeof RunEventSchema>;
export type EventBatch = z.infer<typeof EventBatchSchema>;
export type EventBatchV1 = z.infer<typeof EventBatchV1Schema>;
export type Outcome = z.infer<typeof OutcomeSchema>;
export type OutcomeBatch = z.infer<typeof OutcomeBatchSchema>;
export type DependencyTrigger = z.infer<typeof DependencyTriggerSchema>;
export type Failure = z.infer<typeof FailureSchema>;

export const WIRE_SCHEMAS = {
  DispatchBatch: DispatchBatchSchema,
  EventBatch: EventBatchSchema,
  OutcomeBatch: OutcomeBatchSchema,
  DependencyTrigger: DependencyTriggerSchema,
} as const;

const textDecoder = new TextDecoder();
const textEncoder = new TextEncoder();

export type Decoded<T> = { ok: true; value: T } | { ok: false; reason: string };

export function decode<T>(schema: z.ZodType<T>, data: Uint8Array | string): Decoded<T> {
  let json: unknown;
  try {
    json = JSON.parse(typeof data === "string" ? data : textDecoder.decode(data));
  } catch (e) {
    return { ok: false, reason: `not JSON: ${(e as Error).message}` };
  }
  const r = schema.safeParse(json);
  if (!r.success) {
    const issue = r.error.issues[0];
    return { ok: false, reason: `${issue?.path.join(".") || "(root)"}: ${issue?.message ?? "invalid"}` };
  }
  return { ok: true, value: r.data };
}

export function encode(value: unknown): Uint8Array {
  return textEncoder.encode(JSON.stringify(value));
}

// ---- event batches without zod on the common path -------------------------------------------
//
// A node decodes every event batch its executors send (one message per executor flush, up to 500
// events): through zod that was 8 % of a busy node's allocations. A batch exactly in the shape an
// executor of this project writes (no unknown key, no text to cut or clean, no `result` to
// measure) is checked here by hand and taken as it is, which is then the value zod would have
// produced; anything else goes through the schema, so a refusal reads exactly as before.
// test/unit/event-decode.test.ts checks the two against each other on fuzzed batches.

const EVENT_KEYS = new Set(["type", "runId", "taskId", "at", "error", "startedAt", "token", "reason", "result", "shard"]);
const EVENT_TYPES = new Set(["started", "progress", "completed", "failed", "stale"]);
const FAILURE_KEYS = new Set(["message", "type", "nonRetryable"]);
const BATCH_V1_KEYS = new Set(["v", "executor", "instance", "shard", "events"]);
const BATCH_V2_KEYS = new Set(["v", "executor", "instance", "node", "events"]);

/** A whole number zod's `int()` takes (a safe integer), at least `min`: the hand checks' test for integer fields. */
export const isInt = (v: unknown, min: number): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= min;

/** A text the `text(max)` transform would leave as it is. */
const plainText = (v: unknown, max: number): boolean => typeof v === "string" && v.length <= max && !v.includes("\u0000");
function onlyKeys(o: object, keys: ReadonlySet<string>): boolean {
  for (const k of Object.keys(o)) if (!keys.has(k)) return false;
  return true;
}

function isPlainEvent(x: unknown, shardRequired: boolean): boolean {
  if (x === null || typeof x !== "object" || Array.isArray(x) || !onlyKeys(x, EVENT_KEYS)) return false;
  const e = x as Record<string, unknown>;
  if (typeof e.type !== "string" || !EVENT_TYPES.has(e.type)) return false;
  if (typeof e.runId !== "string" || e.runId.length > 128 || !RUN_ID_RE.test(e.runId)) return false;
  if (!isInt(e.taskId, 1) || !isInt(e.at, 0)) return false;
  if (e.startedAt !== undefined && !isInt(e.startedAt, 0)) return false;
  if (e.token !== undefined && !(typeof e.token === "string" && e.token.length <= 64)) return false;
  if (e.reason !== undefined && !plainText(e.reason, MAX_ERROR_TEXT)) return false;
  if (e.result !== undefined) return false;
  if (shardRequired ? !isInt(e.shard, 0) : e.shard !== undefined && !isInt(e.shard, 0)) return false;
  if (e.error !== undefined) {
    const f = e.error;
    if (f === null || typeof f !== "object" || Array.isArray(f) || !onlyKeys(f, FAILURE_KEYS)) return false;
    const g = f as Record<string, unknown>;
    if (!plainText(g.message, MAX_ERROR_TEXT)) return false;
    if (g.type !== undefined && !plainText(g.type, 128)) return false;
    if (g.nonRetryable !== undefined && typeof g.nonRetryable !== "boolean") return false;
  }
  return true;
}

function isPlainBatch(x: unknown, v: 1 | 2): boolean {
  if (x === null || typeof x !== "object" || Array.isArray(x) || !onlyKeys(x, v === 1 ? BATCH_V1_KEYS : BATCH_V2_KEYS)) return false;
  const b = x as Record<string, unknown>;
  if (b.v !== v || typeof b.executor !== "string" || typeof b.instance !== "string") return false;
  if (v === 1 ? !isInt(b.shard, 0) : typeof b.node !== "string") return false;
  if (!Array.isArray(b.events) || b.events.length < 1) return false;
  for (const e of b.events) if (!isPlainEvent(e, v === 2)) return false;
  return true;
}

function decodeEventBatch<T>(schema: z.ZodType<T>, v: 1 | 2, data: Uint8Array | string): Decoded<T> {
  let json: unknown;
  try { json = JSON.parse(typeof data === "string" ? data : textDecoder.decode(data)); } catch { return decode(schema, data); }
  return isPlainBatch(json, v) ? { ok: true, value: json as T } : decode(schema, data);
}

/** decode(EventBatchV1Schema, data), without zod for a batch in the usual shape. */
export function decodeEventBatchV1(data: Uint8Array | string): Decoded<EventBatchV1> { return decodeEventBatch(EventBatchV1Schema, 1, data); }
/** decode(EventBatchV2Schema, data), without zod for a batch in the usual shape. */
export function decodeEventBatchV2(data: Uint8Array | string): Decoded<z.infer<typeof EventBatchV2Schema>> { return decodeEventBatch(EventBatchV2Schema, 2, data); }
