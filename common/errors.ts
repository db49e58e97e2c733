/**
 * Typed errors. Every failure ax reports carries a stable `code` (AX_E_...), the offending
 * `value` when there is one, and the `field` it came from, so a CLI can print "which field,
 * why" and an API can answer with data instead of prose.
 */
export type AxErrorCode =
  | "AX_E_CONFIG"
  | "AX_E_INVALID"
  | "AX_E_CRON_FIELD"
  | "AX_E_TIMEZONE"
  | "AX_E_DURATION"
  | "AX_E_TRIGGER"
  /** A task's trigger did not advance (next(t) <= t) or its schedule could not be computed. */
  | "AX_E_TRIGGER_STUCK"
  | "AX_E_NOT_FOUND"
  | "AX_E_CONFLICT"
  | "AX_E_CYCLE"
  | "AX_E_TASK_RUNNING"
  | "AX_E_STALE_EPOCH"
  | "AX_E_ILLEGAL_TRANSITION"
  | "AX_E_UNAVAILABLE"
  | "AX_E_TIMEOUT"
  | "AX_E_AUTH"
  | "AX_E_FORBIDDEN"
  | "AX_E_TOO_LARGE"
  /** `ax run --wait`: the run (chain) ended without success (exit 5). */
  | "AX_E_RUN_FAILED"
  | "AX_E_INTERNAL";

export class AxError extends Error {
  override name = "AxError";
  readonly code: AxErrorCode;
  readonly field: string | undefined;
  readonly value: unknown;
  constructor(code: AxErrorCode, message: string, opts: { field?: string; value?: unknown; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    this.field = opts.field;
    this.value = opts.value;
  }
  /** The wire form: failures that cross NATS are data. */
  toJSON(): { code: AxErrorCode; message: string; field?: string; value?: unknown } {
    const out: { code: AxErrorCode; message: string; field?: string; value?: unknown } = { code: this.code, message: this.message };
    if (this.field !== undefined) out.field = this.field;
    if (this.value !== undefined) out.value = this.value;
    return out;
  }
  static fromJSON(j: { code?: string; message?: string; field?: string; value?: unknown }): AxError {
    const opts: { field?: string; value?: unknown } = {};
    if (j.field !== undefined) opts.field = j.field;
    if (j.value !== undefined) opts.value = j.value;
    return new AxError((j.code as AxErrorCode) ?? "AX_E_INTERNAL", j.message ?? "unknown error", opts);
  }
}

/** Bad user input: a field and the value that was refused. */
export class InvalidInputError extends AxError {
  override name = "InvalidInputError";
  constructor(field: string, value: unknown, why: string, code: AxErrorCode = "AX_E_INVALID") {
    super(code, `${field}: ${why} (got ${JSON.stringify(value)})`, { field, value });
  }
}

/** A write made under a fencing epoch that is no longer current changed nothing. */
export class StaleEpochError extends AxError {
  override name = "StaleEpochError";
  constructor(shard: number, epoch: number) {
    super("AX_E_STALE_EPOCH", `shard ${shard}: epoch ${epoch} is no longer current; write refused`, { field: "epoch", value: { shard, epoch } });
  }
}

export function isAxError(e: unknown): e is AxError {
  return e instanceof AxError;
}
