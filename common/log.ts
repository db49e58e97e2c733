import { pino, type Logger } from "pino";
import { redact } from "./redact.ts";

export type { Logger };

/** Structured logs: callers bind taskId, runId, shard and epoch as fields, never into the text. */
export function createLogger(opts: { level?: string; name?: string; destination?: number } = {}): Logger {
  return pino({ level: opts.level ?? process.env.AX_LOG_LEVEL ?? "info", name: opts.name ?? "ax", base: { pid: process.pid },
    hooks: { logMethod(args, method) { method.apply(this, args.map((a) => scrub(a, 2)) as Parameters<typeof method>); } } },
    pino.destination({ dest: opts.destination ?? 2, sync: false }));
}

export const silentLogger: Logger = pino({ level: "silent" });

/** No configured secret reaches a log line: strings, errors and (two levels of) object fields are redacted. */
function scrub(v: unknown, depth: number): unknown {
  if (typeof v === "string") return redact(v);
  if (v instanceof Error) return { type: v.name, message: redact(v.message), ...(v.stack ? { stack: redact(v.stack) } : {}), ...((v as { code?: unknown }).code !== undefined ? { code: (v as { code?: unknown }).code } : {}) };
  if (depth > 0 && v !== null && typeof v === "object" && !Array.isArray(v)) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = scrub(x, depth - 1);
    return out;
  }
  return v;
}
