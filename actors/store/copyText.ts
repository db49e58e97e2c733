import type pg from "pg";
import { AxError } from "../../common/index.ts";

// Bulk loading in PostgreSQL's COPY text format (task registration): ids drawn up front, rows
// formatted as text, sent with COPY FROM STDIN on a pg client.

/** The id sequence of each table, resolved once per schema (tables never change sequence). */
const sequenceOf = new Map<string, string>();

/** `n` fresh ids from the table's id sequence (one round trip; returned as one comma-separated text, cheap to read). */
export async function reserveIds(c: pg.PoolClient, schema: string, table: string, n: number): Promise<number[]> {
  const key = `${schema}.${table}`;
  let seq = sequenceOf.get(key);
  if (seq === undefined) {
    seq = String((await c.query("select pg_get_serial_sequence($1, 'id') as s", [table])).rows[0].s);
    sequenceOf.set(key, seq);
  }
  // nextval of a constant regclass: resolving the sequence per row cost 2-7 µs an id, this 0.5.
  const r = await c.query({
    text: `select string_agg(nextval('${seq.replace(/'/g, "''")}'::regclass)::text, ',') as ids from generate_series(1, $1::int)`,
    values: [n], rowMode: "array",
  });
  const text = String((r.rows[0] as unknown[])[0]);
  const out: number[] = new Array(n);
  let k = 0; let v = 0;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (ch === 44) { out[k++] = v; v = 0; } else v = v * 10 + (ch - 48);
  }
  out[k++] = v;
  if (k !== n) throw new AxError("AX_E_INTERNAL", `reserved ${k} ids of ${table}, wanted ${n}`);
  return out;
}

/** A value for one column of a COPY text row: `\N` for null, backslash escapes. */
export function cp(v: string | number | null | undefined): string {
  if (v === null || v === undefined) return "\\N";
  if (typeof v === "number") return String(v);
  return COPY_SPECIAL.test(v) ? v.replace(COPY_SPECIAL_G, escapeCopyChar) : v;
}

/** Rows in PostgreSQL's COPY text format, collected into chunks of about 256 KB. */
export class CopyText {
  private parts: string[] = [];
  private done: string[] = [];
  private size = 0;
  /** One row, already formatted (tab-separated values from `cp`, no newline). */
  line(text: string): void {
    this.parts.push(text);
    this.size += text.length + 1;
    if (this.size >= 262_144) this.flush();
  }
  private flush(): void {
    if (this.parts.length) { this.parts.push(""); this.done.push(this.parts.join("\n")); }
    this.parts = []; this.size = 0;
  }
  chunks(): string[] { this.flush(); return this.done; }
}
const COPY_SPECIAL = /[\\\n\r\t]/;
const COPY_SPECIAL_G = /[\\\n\r\t]/g;
const escapeCopyChar = (ch: string): string => (ch === "\\" ? "\\\\" : ch === "\n" ? "\\n" : ch === "\r" ? "\\r" : "\\t");

/**
 * `COPY … FROM STDIN` on a pg client without an extra dependency: a submittable query that
 * answers the server's CopyInResponse with the data and resolves on ReadyForQuery.
 *
 * It settles through `callback` as pg's own Query does: with `query_timeout` set, pg wraps the
 * callback to clear a read-timeout timer, and a submittable that never calls it left that timer,
 * and through its closure every chunk of the COPY, alive for the whole timeout (a 300k-task bulk
 * load kept ~100 MB of COPY text for a minute after it returned).
 */
export function copyIn(c: pg.PoolClient, sql: string, chunks: string[]): Promise<number> {
  let data: string[] | null = chunks;
  return new Promise<number>((resolve, reject) => {
    let settled = false;
    let rows = 0;
    const settle = (e: unknown) => {
      if (settled) return;
      settled = true;
      data = null;
      q.callback?.(e ?? null, undefined);
      if (e) reject(e); else resolve(rows);
    };
    const q = {
      callback: undefined as ((err: unknown, res?: unknown) => void) | undefined, // set by pg (see above)
      submit(con: { query(text: string): void }) { con.query(sql); },
      handleCopyInResponse(con: { sendCopyFromChunk(b: Buffer): void; endCopyFrom(): void }) {
        for (const ch of data ?? []) con.sendCopyFromChunk(Buffer.from(ch, "utf8"));
        data = null; // sent: the socket holds its own copies
        con.endCopyFrom();
      },
      handleCommandComplete(msg: { text?: string }) { rows = Number(/(\d+)$/.exec(msg.text ?? "")?.[1] ?? 0); },
      // pg drops the active query on an error (no ReadyForQuery reaches it): settle here.
      handleError(e: unknown) { settle(e); },
      handleReadyForQuery() { settle(null); },
      handleRowDescription() { /* none for COPY FROM */ },
      handleDataRow() { /* none */ },
      handleEmptyQuery() { /* none */ },
      handlePortalSuspended() { /* none */ },
      handleCopyData() { /* only for COPY TO */ },
    };
    (c as unknown as { query(q: unknown): void }).query(q);
  });
}
