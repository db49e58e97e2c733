import { InvalidInputError } from "./errors.ts";

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/**
 * Parses "250ms", "10s", "5m", "1h30m", "2d" or a bare number of milliseconds.
 * Refuses anything else naming the field, so `--every 10x` says which flag was wrong.
 */
export function parseDuration(field: string, input: string | number, opts: { allowZero?: boolean } = {}): number {
  let ms: number;
  if (typeof input === "number") ms = input;
  else {
    const s = input.trim();
    if (/^\d+(\.\d+)?$/.test(s)) ms = Number(s);
    else {
      const re = /(\d+(?:\.\d+)?)(ms|s|m|h|d|w)/gy;
      ms = 0; let m: RegExpExecArray | null; let consumed = 0;
      while ((m = re.exec(s)) !== null) { ms += Number(m[1]) * UNITS[m[2]!]!; consumed = re.lastIndex; }
      if (consumed !== s.length || s.length === 0) {
        throw new InvalidInputError(field, input, "not a duration; use e.g. 500ms, 10s, 5m, 1h30m, 2d", "AX_E_DURATION");
      }
    }
  }
  if (!Number.isFinite(ms) || ms < 0 || (!opts.allowZero && ms === 0)) {
    throw new InvalidInputError(field, input, opts.allowZero ? "must be >= 0" : "must be > 0", "AX_E_DURATION");
  }
  return Math.round(ms);
}

export function formatDuration(ms: number): string {
  if (ms < 1000) return `${ms}ms`;
  const parts: string[] = [];
  let rest = ms;
  for (const [u, v] of [["d", 86_400_000], ["h", 3_600_000], ["m", 60_000], ["s", 1000]] as const) {
    if (rest >= v) { parts.push(`${Math.floor(rest / v)}${u}`); rest %= v; }
  }
  if (rest > 0) parts.push(`${rest}ms`);
  return parts.join("");
}
