import { pino, type Logger } from "pino";

export type { Logger };

/** Structured logs: callers bind taskId, runId, shard and epoch as fields, never into the text. */
export function createLogger(opts: { level?: string; name?: string; destination?: number } = {}): Logger {
  return pino({ level: opts.level ?? process.env.AX_LOG_LEVEL ?? "info", name: opts.name ?? "ax", base: { pid: process.pid } },
    pino.destination({ dest: opts.destination ?? 2, sync: false }));
}

export const silentLogger: Logger = pino({ level: "silent" });
