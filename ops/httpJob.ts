import { z } from "zod";
import { InvalidInputError, parseDuration, type Logger } from "../common/index.ts";
import { NonRetryableError, type RunContext, type RunHandler } from "../protocol/index.ts";
import type { Store } from "../actors/index.ts";

/**
 * HTTP jobs: a task whose executor is registered with kind `http` (an `ax executor http`
 * bridge) has an HTTP request as its payload:
 *
 *   { "method": "POST", "url": "https://hooks.example.com/report?run={{runId}}",
 *     "headers": { "Authorization": "Bearer …" },
 *     "body": { "run": "{{runId}}", "due": "{{scheduledAt}}" },   // or a string
 *     "timeout": "10s", "successStatus": ["2xx", 304] }
 *
 * Templates `{{runId}}`, `{{taskId}}`, `{{taskName}}`, `{{attempt}}`, `{{source}}`,
 * `{{scheduledAt}}` / `{{firedAt}}` (ISO-8601) and `{{scheduledAtMs}}` / `{{firedAtMs}}` are
 * replaced in the URL, header values and the body's strings. The request is refused (the run
 * fails for good, the reason on the run) unless its host is on the bridge's allow-list. A status
 * outside `successStatus` (default 2xx) or a network error fails the run, retried per the task.
 * The run keeps `{status, body, bytes, truncated, durationMs}` as its result.
 */
export const TEMPLATE_NAMES = ["runId", "taskId", "taskName", "attempt", "source", "scheduledAt", "scheduledAtMs", "firedAt", "firedAtMs"] as const;
const TEMPLATE_RE = /\{\{\s*([A-Za-z]+)\s*\}\}/g;
const METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"] as const;
const HEADER_NAME_RE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$/;

function templatesKnown(s: string): boolean {
  for (const m of s.matchAll(TEMPLATE_RE)) if (!(TEMPLATE_NAMES as readonly string[]).includes(m[1]!)) return false;
  return true;
}
const templated = z.string().refine(templatesKnown, { message: `unknown template; known: ${TEMPLATE_NAMES.map((n) => `{{${n}}}`).join(" ")}` });

/** A JSON body whose strings may hold templates. */
const JsonBody: z.ZodType<unknown> = z.lazy(() => z.union([templated, z.number(), z.boolean(), z.null(), z.array(JsonBody), z.record(z.string(), JsonBody)]));

const StatusSpec = z.union([
  z.number().int().min(100).max(599),
  z.string().regex(/^[1-5]xx$|^[1-5]\d\d(-[1-5]\d\d)?$/, "a status (200), a class (2xx) or a range (200-299)"),
]);

export const HttpRequestSpecSchema = z.object({
  method: z.string().transform((m) => m.toUpperCase()).pipe(z.enum(METHODS)).default("GET"),
  url: templated.refine((u) => {
    try { const p = new URL(u.replace(TEMPLATE_RE, "x")); return p.protocol === "http:" || p.protocol === "https:"; } catch { return false; }
  }, "an absolute http:// or https:// URL"),
  headers: z.record(z.string().regex(HEADER_NAME_RE, "a header name"), templated.refine((v) => !/[\r\n]/.test(v), "no line breaks in a header value")).default({}),
  body: JsonBody.optional(),
  /** At most the task's timeout (the run is aborted then anyway). */
  timeout: z.union([z.string(), z.number().int().positive()]).optional(),
  successStatus: z.array(StatusSpec).min(1).default(["2xx"]),
}).strict();
export type HttpRequestSpec = z.infer<typeof HttpRequestSpecSchema>;

/** Validates an HTTP job's payload; a refusal names the field under `payload.`. */
export function parseHttpRequestSpec(payload: unknown): HttpRequestSpec & { timeoutMs: number | null } {
  if (payload === null || typeof payload !== "object" || Array.isArray(payload)) throw new InvalidInputError("payload", payload, "an HTTP job's payload is its request: {method, url, headers, body, timeout, successStatus}");
  const r = HttpRequestSpecSchema.safeParse(payload);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const path = issue.path.join(".");
    const value = issue.path.reduce<unknown>((o, k) => (o as Record<PropertyKey, unknown> | undefined)?.[k as PropertyKey], payload);
    throw new InvalidInputError(`payload${path ? `.${path}` : ""}`, value, issue.code === "unrecognized_keys" ? `unknown field(s) ${issue.keys.join(", ")}` : issue.message);
  }
  const timeoutMs = r.data.timeout === undefined ? null : parseDuration("payload.timeout", r.data.timeout);
  return { ...r.data, timeoutMs };
}

/** Refuses, at create, an HTTP executor's task whose payload is not a valid request (`index`: the spec's place in a bulk call). */
export async function checkHttpTasks(store: Store, tasks: Array<{ executor: string; payload: unknown }>): Promise<void> {
  const names = [...new Set(tasks.map((t) => t.executor))];
  const http = await store.httpExecutorsAmong(names);
  if (!http.size) return;
  tasks.forEach((t, index) => {
    if (!http.has(t.executor)) return;
    try { parseHttpRequestSpec(t.payload); } catch (e) { throw Object.assign(e as Error, { index }); }
  });
}

/** One allowed host: `api.example.com`, `*.example.com` (any subdomain), either with `:port`. */
export interface AllowedHost { host: string; wildcard: boolean; port: string | null }
export function parseAllowList(entries: string[]): AllowedHost[] {
  return entries.flatMap((e) => e.split(",")).map((e) => e.trim()).filter(Boolean).map((e) => {
    const m = /^(\*\.)?([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::(\d{1,5}))?$/.exec(e);
    if (!m) throw new InvalidInputError("--allow-host", e, "a host (api.example.com), a wildcard (*.example.com), either with :port");
    return { host: m[2]!.toLowerCase(), wildcard: !!m[1], port: m[3] ?? null };
  });
}
export function hostAllowed(url: URL, allow: AllowedHost[]): boolean {
  const host = url.hostname.toLowerCase();
  const port = url.port || (url.protocol === "https:" ? "443" : "80");
  return allow.some((a) => (a.wildcard ? host.endsWith(`.${a.host}`) : host === a.host) && (a.port === null || a.port === port));
}

function statusOk(status: number, specs: Array<number | string>): boolean {
  return specs.some((s) => {
    if (typeof s === "number") return status === s;
    if (/^[1-5]xx$/.test(s)) return Math.floor(status / 100) === Number(s[0]);
    const [lo, hi] = s.split("-").map(Number);
    return status >= lo! && status <= (hi ?? lo!);
  });
}

function fill(s: string, ctx: RunContext): string {
  const v: Record<string, string> = {
    runId: ctx.runId, taskId: String(ctx.taskId), taskName: ctx.taskName, attempt: String(ctx.attempt), source: ctx.source,
    scheduledAt: new Date(ctx.scheduledAt).toISOString(), scheduledAtMs: String(ctx.scheduledAt),
    firedAt: new Date(ctx.firedAt).toISOString(), firedAtMs: String(ctx.firedAt),
  };
  return s.replace(TEMPLATE_RE, (all, name: string) => v[name] ?? all);
}
function fillJson(x: unknown, ctx: RunContext): unknown {
  if (typeof x === "string") return fill(x, ctx);
  if (Array.isArray(x)) return x.map((y) => fillJson(y, ctx));
  if (x !== null && typeof x === "object") return Object.fromEntries(Object.entries(x).map(([k, y]) => [k, fillJson(y, ctx)]));
  return x;
}

/** What an HTTP run keeps: its status and the start of the response body. */
export interface HttpResult { status: number; body: string; bytes: number; truncated: boolean; durationMs: number; url: string }

/** Thrown for a status outside successStatus: retried per the task, its result kept on the run. */
export class HttpStatusError extends Error {
  override name = "HttpStatusError";
  readonly type = "HttpStatus";
  constructor(message: string, readonly result: HttpResult) { super(message); }
}

async function readExcerpt(res: Response, max: number): Promise<{ body: string; bytes: number; truncated: boolean }> {
  if (!res.body) return { body: "", bytes: 0, truncated: false };
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  let truncated = false;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (bytes < max) chunks.push(value.subarray(0, max - bytes));
    bytes += value.length;
    // Stop reading far past the excerpt: a huge response is not downloaded for nothing.
    if (bytes > max) { truncated = true; if (bytes > max * 16) { await reader.cancel().catch(() => undefined); break; } }
  }
  const text = new TextDecoder("utf-8", { fatal: false }).decode(Buffer.concat(chunks)).replace(/\uFFFD+$/, "");
  return { body: text, bytes, truncated };
}

export interface HttpHandlerOptions {
  allow: AllowedHost[];
  /** Bytes of the response body kept on the run. Default 2048. */
  maxBodyBytes?: number;
  log?: Logger;
}

/** The run handler of `ax executor http`. */
export function httpHandler(o: HttpHandlerOptions): RunHandler {
  const max = o.maxBodyBytes ?? 2048;
  return async (ctx) => {
    let spec: ReturnType<typeof parseHttpRequestSpec>;
    try { spec = parseHttpRequestSpec(ctx.payload); } catch (e) { throw new NonRetryableError(`not an HTTP request: ${(e as Error).message}`); }
    const url = new URL(fill(spec.url, ctx));
    if (!hostAllowed(url, o.allow)) {
      throw Object.assign(new NonRetryableError(`host ${url.host} is not on this HTTP bridge's allow-list (--allow-host ${o.allow.map((a) => `${a.wildcard ? "*." : ""}${a.host}${a.port ? `:${a.port}` : ""}`).join(",") || "(empty)"}); request not sent`), { type: "HostNotAllowed" });
    }
    const headers = new Headers();
    for (const [k, v] of Object.entries(spec.headers)) headers.set(k, fill(v, ctx));
    // The run id is the idempotency key of the side effect (delivery is at least once).
    if (!headers.has("idempotency-key")) headers.set("Idempotency-Key", ctx.runId);
    headers.set("X-Ax-Run-Id", ctx.runId);
    let body: string | undefined;
    if (spec.body !== undefined && spec.method !== "GET" && spec.method !== "HEAD") {
      if (typeof spec.body === "string") body = fill(spec.body, ctx);
      else { body = JSON.stringify(fillJson(spec.body, ctx)); if (!headers.has("content-type")) headers.set("Content-Type", "application/json"); }
    }
    const signal = spec.timeoutMs !== null ? AbortSignal.any([ctx.signal, AbortSignal.timeout(spec.timeoutMs)]) : ctx.signal;
    const t0 = performance.now();
    let res: Response;
    try {
      res = await fetch(url, { method: spec.method, headers, ...(body !== undefined ? { body } : {}), signal, redirect: "manual" });
    } catch (e) {
      if (ctx.signal.aborted) throw ctx.signal.reason as Error;
      const err = e as Error & { cause?: { code?: string; message?: string } };
      const why = err.name === "TimeoutError" ? `no answer within ${spec.timeoutMs} ms` : err.cause?.code ?? err.cause?.message ?? err.message;
      throw Object.assign(new Error(`${spec.method} ${url.origin}${url.pathname} failed: ${why}`), { type: "HttpError" });
    }
    const excerpt = await readExcerpt(res, max).catch((e) => ({ body: `(body unreadable: ${(e as Error).message})`, bytes: 0, truncated: false }));
    const result: HttpResult = { status: res.status, ...excerpt, durationMs: Math.round(performance.now() - t0), url: `${url.origin}${url.pathname}` };
    o.log?.info({ runId: ctx.runId, task: ctx.taskName, status: res.status, durationMs: result.durationMs }, "http run done");
    if (!statusOk(res.status, spec.successStatus)) throw new HttpStatusError(`${spec.method} ${result.url} answered ${res.status} (success: ${spec.successStatus.join(", ")})`, result);
    return result;
  };
}

