/**
 * The task machine's record as a task row stores it (migration 8). Every run rewrites its task
 * row twice, so the row's width is written to the WAL twice a run. The record's state, overlap
 * policy and attempt limit are already columns of the row (`state`, `overlap`, `max_attempts`),
 * so the stored form keeps only the rest, under one-letter keys, with defaults left out:
 *
 *   a = attempt (0)   f = inFlight ([])   r = lastRunId (null)   e = lastError (null)   p = pausedAfterRun (false → absent, true → 1)
 *
 * An idle task stores `{}` instead of ≈ 190 bytes of JSON. A record in the older full form
 * (`{ value, context }`) is read as it is.
 */

/** The record as the shard actors and the API see it (the machine's TaskRecord). */
export interface FullRecord {
  value: string;
  context: {
    attempt: number;
    maxAttempts: number;
    overlap: string;
    inFlight: string[];
    lastRunId: string | null;
    lastError: string | null;
    pausedAfterRun: boolean;
  };
}

export interface StoredRecord { a?: number; f?: string[]; r?: string; e?: string; p?: 1 }

/** The stored form of `record` (whatever part of a record is given: absent fields are defaults). */
export function storedRecord(record: unknown): StoredRecord {
  const c = ((record as { context?: Partial<FullRecord["context"]> } | null)?.context ?? {});
  const out: StoredRecord = {};
  if (c.attempt) out.a = c.attempt;
  if (c.inFlight?.length) out.f = c.inFlight;
  if (c.lastRunId) out.r = c.lastRunId;
  if (c.lastError !== null && c.lastError !== undefined) out.e = c.lastError;
  if (c.pausedAfterRun) out.p = 1;
  return out;
}

/** The full record from the stored form and the row's own columns. */
export function fullRecord(stored: unknown, state: string, overlap: string, maxAttempts: number): FullRecord {
  const s = (stored ?? {}) as StoredRecord & Partial<FullRecord>;
  if (s.context) return s as FullRecord; // written before migration 8
  return {
    value: state,
    context: {
      attempt: s.a ?? 0, maxAttempts, overlap, inFlight: s.f ?? [], lastRunId: s.r ?? null, lastError: s.e ?? null,
      pausedAfterRun: s.p === 1,
    },
  };
}
