import type { JetStreamClient } from "@nats-io/jetstream";
import { AxError, atWallTime, type Clock, type Logger, type Names, type TimerHandle } from "../common/index.ts";
import { encode, type DispatchRun } from "../protocol/index.ts";
import { refusedForData, type DispatchRecord, type ShardWrite, type Store } from "./store/index.ts";
import type { ReleaseOutcome, Releaser } from "./releaser/index.ts";

/** A run to dispatch, with the shard whose round fired it (a node message carries many shards). */
export type ShardDispatchRun = DispatchRun & { shard: number };

export interface PersisterDeps {
  store: Store;
  log: Logger;
  js: JetStreamClient;
  names: Names;
  nodeId: string;
  /** Wall clock for release times and the dispatch records' age. */
  clock: Clock;
  /**
   * Asked at each release for every shard with runs in the message: "yes" (its actor is active
   * and its lease valid); "wait" (its actor is active but the lease is not confirmed right now, as
   * while NATS reconnects: the whole message is held and asked again shortly); "never" (fenced or
   * gone: its runs stay recorded and unstarted, and the shard's next owner publishes their
   * recorded message, see ShardActor.start).
   */
  mayRelease: (shard: number) => "yes" | "wait" | "never";
  /** Told when a dispatch publish got no answer (JetStream not answering: run timeouts wait for it to settle, see EventCatchUp). */
  onJetStreamTrouble?: () => void;
  /** Told of each published run and when (lateness metrics). */
  onReleased?: (runs: ReadonlyArray<ShardDispatchRun>, atMs: number, executor: string) => void;
  /** Batches in flight at once (each one transaction on its own connection). */
  lanes?: number;
  /**
   * The releaser thread: the backstop of this thread's release timers. A message written ahead
   * of its due time is handed over as well as timed here; if the timer here is held up (a
   * collection pause), the thread publishes it BACKSTOP_MS after its release time. Only with a
   * clock that is the system clock (the thread keeps time by it).
   */
  releaser?: Releaser | null;
  /** How long from now the shard's runs may be released here (its lease's validity left; 0: not releasable). Needed with `releaser`. */
  releasableForMs?: (shard: number) => number;
  /**
   * Whether the executor's instances hold a run until its due time (they registered `holds`, as
   * the SDK does): its runs are then published as soon as they are written, ahead of their due
   * time, and the executor starts each at it. Otherwise (or without this) a message is published
   * at its runs' due time.
   */
  holdsAhead?: (executor: string) => boolean;
  /** Tells the executor's instances not to start these runs, published ahead and withdrawn before their due time. Needed with `holdsAhead`. */
  revoke?: (executor: string, runIds: string[]) => void;
  /**
   * Tells the executor's instances that this node's wall clock stepped back by `-stepMs` (see
   * watchClock): a run it sent before the step is held that much longer. Needed with `holdsAhead`.
   */
  clockStepped?: (executor: string, stepMs: number) => void;
}

/**
 * Release times are rounded UP to this grid: the runs due within one step share a message (a
 * JetStream publish each step and executor, not each run), and none is published before its due
 * time. A run is at most this much later than a publish at its exact time would be.
 *
 * 5 ms rather than 2: at 2 the node made ~580 dispatch publishes a second at 8,200 runs/s (each
 * its own socket write, JetStream append and ack), ~14 runs each. Alternated at 5: CPU a run at
 * 8,200/s 186 → 177 µs (NATS −5, node −5), at 835/s 906 → 733 µs; p50 +0–2 ms, p99 within the
 * noise (bench/analysis.md, fourteenth round).
 */
const RELEASE_STEP_MS = 5;

/** A dispatch that lands this much after its runs' release time is "late": their timeouts count from the landing. */
export const LATE_LANDING_MS = 250;
/** How long a late landing is remembered (a timeout longer than this counts from the release). */
const LANDED_KEPT_MS = 10 * 60_000;

/**
 * A run published ahead of its due time (to an executor that holds it) is withdrawn only while
 * its due time is at least this far off: the revoke must reach the executor's instances before
 * the run's start there. Closer to the due time a pause, cancel or update no longer withdraws the
 * run, as for a run already released at its due time.
 */
export const REVOKE_MARGIN_MS = 50;

/**
 * While runs sent ahead may be held by executors, the wall clock is compared with the monotonic
 * one this often; a backward step of more than CLOCK_STEP_TOLERANCE_MS is told to the executors
 * that got messages within the last RECENT_AHEAD_MS (slewing moves the two apart by well under
 * a millisecond a second).
 */
const CLOCK_CHECK_MS = 10;
const CLOCK_STEP_TOLERANCE_MS = 2;
const RECENT_AHEAD_MS = 30_000;

/** A batch that published nothing: no run's stream sequence to note. */
const NO_SEQUENCES: ReadonlyMap<string, number> = new Map();

/** Longest a release waits for a lease that is held but not confirmed (NATS reconnecting). */
const MAX_RELEASE_WAIT_MS = 10_000;

interface Message {
  id: string; executor: string; releaseAt: number; runs: ShardDispatchRun[];
  /** Handed to the releaser thread too (its slot), with what to do once it is released. */
  handed?: { slot: number; sequences: Map<string, number>; done: () => void };
}
interface Queued { write: ShardWrite; dispatch: ReadonlyMap<string, ShardDispatchRun[]>; resolve: (s: Submitted) => void; reject: (e: unknown) => void }

export interface Submitted {
  /** The shard's epoch was no longer current: nothing of its write landed, and none of its runs were published. */
  stale: boolean;
  /**
   * Resolves when the runs of this batch were handed to JetStream (or their publish gave up and
   * was logged), with the stream sequence of each published run's message (by run id; a shard
   * keeps it with its run in flight, see DeliveryView).
   */
  published: Promise<ReadonlyMap<string, number>>;
}

/**
 * Rows per batch (one transaction), about: a batch's runs are published only once it is
 * committed, so a batch of everything queued turned the node into a convoy at the in-flight
 * bound (5,000 runs fired in one batch, published together, completed together, their places
 * freed together and taken by the next 5,000 in one batch again). Batches of this size stream
 * through the two lanes: the first runs go out while later ones are written.
 */
const MAX_BATCH_ROWS = 2000;

/** Runs per dispatch message: big enough to amortise a JetStream publish, small enough for a few KB payloads each under 1 MB. */
const RUNS_PER_MESSAGE = 256;
/** Roughly the bytes of a message before it is cut (payloads vary; NATS refuses messages over its max_payload, 1 MB by default). */
const BYTES_PER_MESSAGE = 512 * 1024;

/**
 * The node's round. Shard actors submit what their rounds decided (a fenced write and the runs to
 * dispatch); everything submitted while a batch is being written goes into the next one, so
 * PostgreSQL sees one fenced transaction for all shards of the node, and JetStream one dispatch
 * message per executor (runs of many shards, each tagged with its shard) instead of one per
 * shard per tick. With 64 shards on a node the per-shard messages were what overloaded
 * nats-server (lease renewals timed out behind them).
 *
 * Order of effects, per batch: the message ids are fixed and written with the runs (each run row
 * names its message; the message's run list goes to `dispatches`) → commit → publish. A crash
 * between commit and publish leaves runs `running` and unstarted; whichever node loads one of
 * their shards publishes the whole recorded message again under the same id (ShardActor.start),
 * and JetStream drops the copy if the first publish had landed.
 *
 * Up to `lanes` batches are in flight at once. A shard actor may have two rounds submitted (it
 * decides the next one while the previous is written). One shard's writes are applied in the
 * order they were submitted, and none after one that failed: both in one batch (one transaction;
 * the statements apply the rows in submission order), or the later one in a batch that starts
 * after the earlier one's committed — a lane never takes a write of a shard that has a write in a
 * batch another lane is writing, nor one of a shard with an earlier write left queued; and once
 * a write of a shard's epoch failed, that epoch's writes still queued are refused unwritten (the
 * shard restarts from PostgreSQL under a new epoch). A round is decided on top of the ones before
 * it: its rows are not consistent by themselves. A later round written after an earlier one
 * failed left a run PostgreSQL showed `running` for ever — a fire whose task row waited for the
 * run's end (AX_TASK_WRITE_DEFER) on top of a completion that was never written, so no next
 * owner could find the run or redo the fire. Different shards' writes go side by side. A second
 * lane only starts while the first is busy, so under load writes still coalesce, into batches of
 * up to about MAX_BATCH_ROWS rows.
 */
export class Persister {
  private queue: Queued[] = [];
  private inFlight = 0;
  /** Shards with writes in a batch being written (counted): another lane leaves their writes queued. */
  private readonly writingShards = new Map<number, number>();
  /** A shard's epoch whose write failed: its later writes are refused unwritten (see the class comment). */
  private readonly failedEpochs = new Map<number, number>();
  /** Runs whose message is being published (tried again until it lands while their shards are held). */
  private readonly publishing = new Set<string>();
  /** Runs whose dispatch landed late (see noteLanded), oldest first: run id → when it landed. */
  private readonly landedLate = new Map<string, number>();
  private readonly lanes: number;
  /** Written messages waiting for their release time, by run id (see withdraw()). */
  private readonly held = new Map<string, Message>();
  /** Runs published ahead of their due time to an executor that holds them, roughly in due order: run id → executor and due time (see withdraw()). */
  private readonly ahead = new Map<string, { executor: string; firedAt: number }>();
  /** Revokes to send on the next turn, by executor (one message for the runs a round withdrew). */
  private revokes: Map<string, string[]> | null = null;
  /** Executors sent runs ahead lately: executor → monotonic time of the last such message (see watchClock). */
  private readonly aheadTo = new Map<string, number>();
  /** The clock watch while it runs: its timer and the last wall - monotonic reading. */
  private clockWatch: { timer: TimerHandle; wallMinusMono: number } | null = null;
  private closed = false;
  /** `beside`: batches started while another lane was writing; `leftQueued`: times a lane passed over a queued write (a row in common, or the batch full). */
  readonly stats = { batches: 0, beside: 0, leftQueued: 0, rows: 0, lastBatchMs: 0, maxBatchWrites: 0, messages: 0, publishFailures: 0, held: 0, ahead: 0, withdrawn: 0, revoked: 0, clockSteps: 0, notReleased: 0 };
  constructor(private readonly d: PersisterDeps) { this.lanes = d.lanes ?? 2; }

  submit(write: ShardWrite, dispatch: ReadonlyMap<string, ShardDispatchRun[]> = new Map()): Promise<Submitted> {
    if (!write.runInserts.length && !write.runUpdates.length && !write.taskUpdates.length && !write.ledger?.length && !write.defUpdates?.length && !dispatch.size) {
      return Promise.resolve({ stale: false, published: Promise.resolve(NO_SEQUENCES) });
    }
    return new Promise((resolve, reject) => {
      this.queue.push({ write, dispatch, resolve, reject });
      // A lane starts on the next turn of the event loop, not inside this call: the shards whose
      // rounds ran in the same turn (their wheels tick together) then share one transaction and
      // one message per executor and release time, instead of the first two going alone.
      if (this.inFlight + this.starting < this.lanes) {
        this.starting++;
        setImmediate(() => { this.starting--; void this.drain(); });
      }
    });
  }
  private starting = 0;

  private async drain(): Promise<void> {
    this.inFlight++;
    try {
      for (;;) {
        const batch = this.take(256);
        // Empty, or only writes of shards another lane is writing: that lane takes them on its next turn.
        if (!batch.length) break;
        if (this.writingShards.size) this.stats.beside++;
        for (const b of batch) this.mark(b.write, 1);
        const t0 = performance.now();
        let messages: Message[] = [];
        try {
          messages = this.compose(batch);
          // Held from now on (not only once written): a pause decided by the shard's next round
          // while this batch is written withdraws its runs before they are published.
          for (const m of messages) for (const r of m.runs) this.held.set(r.runId, m);
          const createdMs = this.d.clock.now();
          const records: DispatchRecord[] = messages.map((m) => ({ id: m.id, executor: m.executor, node: this.d.nodeId, runIds: m.runs.map((r) => r.runId), createdMs }));
          const { stale, failed } = await this.writeIsolating(batch.map((b) => b.write), records);
          const staleSet = new Set(stale);
          // The runs of a shard whose part was refused or not written are not published.
          const published = this.publish(messages, failed.size ? new Set([...staleSet, ...failed.keys()]) : staleSet);
          for (const b of batch) {
            if (failed.has(b.write.shard)) { this.failedEpochs.set(b.write.shard, b.write.epoch); b.reject(failed.get(b.write.shard)); }
            else b.resolve({ stale: staleSet.has(b.write.shard), published });
          }
          this.stats.batches++;
          this.stats.maxBatchWrites = Math.max(this.stats.maxBatchWrites, batch.length);
          this.stats.rows += batch.reduce((n, b) => n + b.write.runInserts.length + b.write.runUpdates.length + b.write.taskUpdates.length, 0);
          this.stats.lastBatchMs = performance.now() - t0;
        } catch (e) {
          for (const m of messages) for (const r of m.runs) this.held.delete(r.runId);
          for (const b of batch) { this.failedEpochs.set(b.write.shard, b.write.epoch); b.reject(e); }
        } finally {
          for (const b of batch) this.mark(b.write, -1);
        }
      }
    } finally {
      this.inFlight--;
    }
  }

  /**
   * Queued writes, in queue order, up to `maxWrites` writes and about MAX_BATCH_ROWS rows (at
   * least one write), of shards with no write in a batch being written nor an earlier write left
   * queued (so one shard's writes keep their order). Writes of an epoch whose write failed are
   * refused here, unwritten.
   */
  private take(maxWrites: number): Queued[] {
    const out: Queued[] = [];
    const rest: Queued[] = [];
    const heldShards = new Set<number>();
    let rows = 0;
    let i = 0;
    for (; i < this.queue.length; i++) {
      const q = this.queue[i]!;
      const shard = q.write.shard;
      if (this.failedEpochs.get(shard) === q.write.epoch) {
        q.reject(new AxError("AX_E_UNAVAILABLE", `shard ${shard}: an earlier round of epoch ${q.write.epoch} was not written; this one is not written either`));
        continue;
      }
      const n = rowCount(q.write);
      if (out.length && (out.length >= maxWrites || rows + n > MAX_BATCH_ROWS)) break;
      if (this.writingShards.has(shard) || heldShards.has(shard)) {
        rest.push(q);
        this.stats.leftQueued++;
        heldShards.add(shard);
        continue;
      }
      out.push(q);
      rows += n;
    }
    for (; i < this.queue.length; i++) rest.push(this.queue[i]!);
    this.queue = rest;
    return out;
  }

  /** Counts (+1) or uncounts (-1) a write in a batch being written. */
  private mark(w: ShardWrite, by: 1 | -1): void {
    const n = (this.writingShards.get(w.shard) ?? 0) + by;
    if (n > 0) this.writingShards.set(w.shard, n); else this.writingShards.delete(w.shard);
  }

  /**
   * One message per executor and release time (runs fired at once go out at once; runs written
   * ahead of their due time wait for it, rounded up to RELEASE_STEP_MS, unless their executor
   * holds them: then they go out at once as well), cut at RUNS_PER_MESSAGE
   * runs or about BYTES_PER_MESSAGE. Its id is fixed before the write and written on every run it carries.
   */
  private compose(batch: ReadonlyArray<{ write: ShardWrite; dispatch: ReadonlyMap<string, ShardDispatchRun[]> }>): Message[] {
    const groups = new Map<string, { executor: string; releaseAt: number; runs: ShardDispatchRun[] }>();
    const now = this.d.clock.now();
    for (const b of batch) {
      for (const [executor, runs] of b.dispatch) {
        // An executor that holds runs until their due time gets them all at once, due or not.
        const ahead = this.d.holdsAhead?.(executor) ?? false;
        for (const r of runs) {
          const releaseAt = r.firedAt <= now || ahead ? 0 : Math.ceil(r.firedAt / RELEASE_STEP_MS) * RELEASE_STEP_MS;
          const key = `${releaseAt}|${executor}`;
          let g = groups.get(key);
          if (!g) { g = { executor, releaseAt, runs: [] }; groups.set(key, g); }
          g.runs.push(r);
        }
      }
    }
    if (!groups.size) return [];
    const inserts = new Map<string, ShardWrite["runInserts"][number]>();
    for (const b of batch) for (const r of b.write.runInserts) inserts.set(r.id, r);
    const out: Message[] = [];
    for (const { executor, releaseAt, runs } of groups.values()) {
      let chunk: ShardDispatchRun[] = [];
      let bytes = 0;
      const cut = () => {
        if (!chunk.length) return;
        const id = `d:${chunk[0]!.runId}`;
        for (const r of chunk) { const row = inserts.get(r.runId); if (row) row.dispatchId = id; }
        out.push({ id, executor, releaseAt, runs: chunk });
        chunk = []; bytes = 0;
      };
      for (const r of runs) {
        const size = 200 + (r.payload === null || r.payload === undefined ? 0 : JSON.stringify(r.payload).length);
        if (chunk.length && (chunk.length >= RUNS_PER_MESSAGE || bytes + size > BYTES_PER_MESSAGE)) cut();
        chunk.push(r);
        bytes += size;
      }
      cut();
    }
    return out;
  }

  /**
   * Takes a written run back before its due time (the task was paused, cancelled, removed or
   * updated). True if it will not be published; "revoked" if it was published ahead to an
   * executor that holds it and is now revoked there (its due time at least REVOKE_MARGIN_MS off);
   * false if it was published already (or is not held here).
   */
  withdraw(runId: string): boolean | "revoked" {
    const m = this.held.get(runId);
    if (!m) {
      const a = this.ahead.get(runId);
      if (!a) return this.withdrawQueued(runId);
      this.ahead.delete(runId);
      if (a.firedAt - this.d.clock.now() < REVOKE_MARGIN_MS || !this.d.revoke) return false;
      this.stats.revoked++;
      this.queueRevoke(a.executor, runId);
      return "revoked";
    }
    if (m.handed) {
      const { slot, sequences, done } = m.handed;
      // Taken by the releaser thread already: it is being published (or comes back to release()).
      if (!this.claimBack(slot)) return false;
      m.handed = undefined;
      this.held.delete(runId);
      m.runs = m.runs.filter((r) => r.runId !== runId);
      this.stats.withdrawn++;
      this.schedule(m, sequences, done); // the rest of it, handed over again
      return true;
    }
    this.held.delete(runId);
    m.runs = m.runs.filter((r) => r.runId !== runId);
    this.stats.withdrawn++;
    return true;
  }

  /** One revoke message per executor for the runs withdrawn in this turn (a round may withdraw many). */
  private queueRevoke(executor: string, runId: string): void {
    if (!this.revokes) {
      this.revokes = new Map();
      queueMicrotask(() => {
        const all = this.revokes!; this.revokes = null;
        for (const [ex, ids] of all) this.d.revoke!(ex, ids);
      });
    }
    const list = this.revokes.get(executor);
    if (list) list.push(runId); else this.revokes.set(executor, [runId]);
  }

  /**
   * A run sent ahead is held by its executor for `firedAt - sentAt` of its own monotonic time: if
   * this node's wall clock steps back meanwhile, that ends before the due time on the new clock.
   * So while executors may hold runs of this node, the step is looked for (wall - monotonic
   * falling) and told to them, and they hold those runs that much longer. A forward step needs
   * nothing: held runs then start late, never early.
   */
  private watchClock(): void {
    if (this.clockWatch || this.closed || !this.d.clockStepped) return;
    const check = (): void => {
      const w = this.clockWatch;
      if (!w) return;
      const mono = this.d.clock.monotonic();
      const wallMinusMono = this.d.clock.now() - mono;
      const step = wallMinusMono - w.wallMinusMono;
      if (step < -CLOCK_STEP_TOLERANCE_MS) {
        this.stats.clockSteps++;
        const told = [...this.aheadTo].filter(([, at]) => mono - at < RECENT_AHEAD_MS).map(([ex]) => ex);
        this.d.log.warn({ stepMs: Math.round(step), executors: told }, "the wall clock stepped back: executors holding runs sent ahead hold them that much longer");
        for (const ex of told) this.d.clockStepped!(ex, Math.round(step));
      }
      for (const [ex, at] of this.aheadTo) if (mono - at >= RECENT_AHEAD_MS) this.aheadTo.delete(ex);
      if (!this.aheadTo.size) { this.clockWatch = null; return; }
      w.wallMinusMono = wallMinusMono;
      w.timer = this.d.clock.setTimeout(check, CLOCK_CHECK_MS);
    };
    this.clockWatch = { timer: this.d.clock.setTimeout(check, CLOCK_CHECK_MS), wallMinusMono: this.d.clock.now() - this.d.clock.monotonic() };
  }

  /** Stops the clock watch (the node is stopping). */
  close(): void {
    this.closed = true;
    if (this.clockWatch) { this.d.clock.clearTimeout(this.clockWatch.timer); this.clockWatch = null; }
  }

  /** Forgets runs published ahead whose due time has passed (no longer withdrawable), oldest first. */
  private pruneAhead(now: number): void {
    for (const [id, a] of this.ahead) { if (a.firedAt > now) break; this.ahead.delete(id); }
  }

  /** A run of a write still queued (its shard's previous round is being written): taken out of its dispatch. */
  private withdrawQueued(runId: string): boolean {
    for (const q of this.queue) {
      for (const runs of q.dispatch.values()) {
        const i = runs.findIndex((r) => r.runId === runId);
        if (i < 0) continue;
        runs.splice(i, 1);
        this.stats.withdrawn++;
        return true;
      }
    }
    return false;
  }

  /**
   * Publishes a written batch's messages (runs of stale shards left out): at once when they were
   * fired at their due time, at their release time when they were written ahead of it. A failed
   * publish is retried under the same id, then logged: its runs time out and retry.
   */
  private publish(messages: Message[], stale: ReadonlySet<number>): Promise<ReadonlyMap<string, number>> {
    if (!messages.length) return Promise.resolve(NO_SEQUENCES);
    const sequences = new Map<string, number>();
    return Promise.all(messages.map((m) => {
      if (stale.size) {
        for (const r of m.runs) if (stale.has(r.shard)) this.held.delete(r.runId);
        m.runs = m.runs.filter((r) => !stale.has(r.shard));
      }
      if (!m.runs.length) return undefined;
      if (m.releaseAt > this.d.clock.now()) this.stats.held += m.runs.length;
      return new Promise<void>((resolve) => this.schedule(m, sequences, resolve));
    })).then(() => sequences);
  }

  /**
   * Releases the message at its release time (now if that has passed), from a timer here; a
   * message handed to the releaser thread as well goes from there if this timer is held up.
   */
  private schedule(m: Message, sequences: Map<string, number>, done: () => void): void {
    if (!m.runs.length) { done(); return; }
    const now = this.d.clock.now();
    if (m.releaseAt > now) {
      const slot = this.handOver(m, sequences, done);
      atWallTime(this.d.clock, m.releaseAt, () => {
        if (slot !== null) {
          // Handed again since (a withdrawal), or already reported on by the thread: not this timer's.
          if (m.handed?.slot !== slot) return;
          if (!this.claimBack(slot)) return; // the thread took it: its report settles it
          m.handed = undefined;
        }
        this.schedule(m, sequences, done);
      });
      return;
    }
    let ahead = false;
    for (const r of m.runs) {
      this.held.delete(r.runId);
      // Released before its due time: its executor holds it (see compose), and until then a revoke can still stop it.
      if (r.firedAt > now) { this.ahead.set(r.runId, { executor: m.executor, firedAt: r.firedAt }); this.stats.ahead++; ahead = true; }
    }
    this.pruneAhead(now);
    if (ahead) { this.aheadTo.set(m.executor, this.d.clock.monotonic()); this.watchClock(); }
    void this.release(m, sequences).then(done);
  }

  /**
   * Hands a message to the releaser thread as a backstop; its slot, or null if it is not handed
   * over (no thread, no free slot, or a lease that would lapse before the release time: this
   * thread alone decides then, as before).
   */
  private handOver(m: Message, sequences: Map<string, number>, done: () => void): number | null {
    const releaser = this.d.releaser;
    if (!releaser || !this.d.releasableForMs) return null;
    const shards = [...new Set(m.runs.map((r) => r.shard))];
    let validForMs = Infinity;
    for (const s of shards) validForMs = Math.min(validForMs, this.d.releasableForMs(s));
    if (!(validForMs > m.releaseAt - this.d.clock.now())) return null;
    const held = releaser.hold({ subject: this.d.names.dispatchSubject(m.executor), msgID: m.id, data: dispatchPayload(this.d.nodeId, m.runs, m.releaseAt), releaseAt: m.releaseAt, validForMs, shards });
    if (!held) return null;
    m.handed = { slot: held.slot, sequences, done };
    void held.outcome.then((o) => this.onHandedReleased(m, o));
    return held.slot;
  }

  /**
   * Takes a handed-over message back from the releaser thread. False only if the thread took it
   * (it reports on it); true also once the thread is closed (close() claimed everything back).
   */
  private claimBack(slot: number): boolean {
    const releaser = this.d.releaser!;
    return releaser.claim(slot) || !releaser.taken(slot);
  }

  /** The releaser thread's report on a message it took (this thread's timer was late): landed, or back to release() here (a lease not confirmed, a failed publish retried under the same id). */
  private onHandedReleased(m: Message, o: ReleaseOutcome): void {
    const { sequences, done } = m.handed!;
    m.handed = undefined;
    for (const r of m.runs) this.held.delete(r.runId);
    if (o.kind === "landed") {
      this.stats.messages++;
      this.noteLanded(m.runs, o.atMs);
      for (const r of m.runs) sequences.set(r.runId, o.seq);
      this.d.onReleased?.(m.runs, o.atMs, m.executor);
      done();
      return;
    }
    if (o.kind === "failed") this.d.log.warn({ err: o.error, msgID: m.id, executor: m.executor, runs: m.runs.length }, "releaser thread could not publish a dispatch; publishing it from the node's thread under the same id");
    void this.release(m, sequences).then(done);
  }

  /** The shard's actor no longer releases here (fenced, or stopped): the releaser thread publishes none of its runs from now on (this thread's release path asks mayRelease, as always). */
  revoke(shard: number): void { this.d.releaser?.revoke(shard); }

  /** Publishes the message's runs of shards still held here; notes each one's stream sequence in `sequences`. */
  private release(m: Message, sequences: Map<string, number>, waitingSince = this.d.clock.monotonic()): Promise<void> {
    const verdicts = new Map<number, "yes" | "wait" | "never">();
    for (const r of m.runs) if (!verdicts.has(r.shard)) verdicts.set(r.shard, this.d.mayRelease(r.shard));
    // Bounded: a lease unconfirmed for this long is lost anyway, and its next owner re-publishes.
    const waited = this.d.clock.monotonic() - waitingSince;
    if (waited >= MAX_RELEASE_WAIT_MS) for (const [s, v] of verdicts) if (v === "wait") verdicts.set(s, "never");
    if ([...verdicts.values()].includes("wait")) {
      // Not dropped: an actor that keeps its shard would never publish these runs again.
      return new Promise<void>((resolve) => { this.d.clock.setTimeout(() => { void this.release(m, sequences, waitingSince).then(resolve); }, 50); });
    }
    const runs = m.runs.filter((r) => verdicts.get(r.shard) === "yes");
    this.stats.notReleased += m.runs.length - runs.length;
    if (!runs.length) return Promise.resolve();
    this.stats.messages++;
    const at = this.d.clock.now();
    // Part of the message stays back (a shard lost meanwhile): note which part goes out, so the
    // lost shard's next owner re-publishes the rest under another id (see replayParts). If the
    // note cannot be written the part goes out anyway: delivering these runs comes first.
    const noted = runs.length < m.runs.length
      ? this.d.store.markPartialRelease(m.id, [...verdicts].filter(([, v]) => v === "yes").map(([s]) => s)).catch((e: unknown) => {
        this.d.log.warn({ err: String(e), msgID: m.id }, "could not note a partly released dispatch; the rest of it may wait for its runs' timeout");
      })
      : Promise.resolve();
    // Tried again until it lands while this node holds every shard of it (a NATS restart or a
    // stream leader election of several seconds delays these runs; it must not lose them), and
    // the shards hold their runs' timeouts meanwhile (isPublishing): a run whose dispatch is not
    // visible yet cannot be running anywhere.
    const shards = [...new Set(runs.map((r) => r.shard))];
    for (const r of runs) this.publishing.add(r.runId);
    return noted.then(() => publishDispatch(this.d.js, this.d.names, this.d.nodeId, m.executor, m.id, runs,
      { sentAt: this.d.clock.now(), keepTrying: () => shards.every((s) => this.d.mayRelease(s) === "yes"), ...(this.d.onJetStreamTrouble ? { onTrouble: this.d.onJetStreamTrouble } : {}) })).then(
      (seq) => {
        this.noteLanded(runs, this.d.clock.now());
        for (const r of runs) sequences.set(r.runId, seq);
        this.d.onReleased?.(runs, at, m.executor);
      },
      (e) => {
        this.stats.publishFailures++;
        this.d.log.error({ err: String(e), executor: m.executor, runs: runs.length, msgID: m.id }, "dispatch publish failed and a shard of it is no longer held here; its runs time out (or are re-published by the next owner)");
      }).finally(() => { for (const r of runs) this.publishing.delete(r.runId); });
  }

  /** The run's dispatch message is still being published (its timeout must not start yet). */
  isPublishing(runId: string): boolean {
    if (this.publishing.has(runId)) return true;
    const slot = this.held.get(runId)?.handed?.slot;
    return slot !== undefined && !!this.d.releaser?.taken(slot);
  }

  /**
   * A dispatch carrying these runs landed at `atMs`. Runs it reached LATE_LANDING_MS or more
   * after their release time (a publish retried through a NATS election, a message re-published
   * by a shard's next owner) are remembered with the landing, per run and at once: a shard's
   * timeout reads it (landedAt) rather than waiting for the rest of the round's messages.
   */
  noteLanded(runs: ReadonlyArray<{ runId: string; firedAt: number }>, atMs: number): void {
    for (const r of runs) if (atMs - r.firedAt >= LATE_LANDING_MS) { this.landedLate.delete(r.runId); this.landedLate.set(r.runId, atMs); }
    for (const [id, at] of this.landedLate) { if (at >= atMs - LANDED_KEPT_MS) break; this.landedLate.delete(id); }
  }

  /** When the run's dispatch landed, if it landed late (see noteLanded). */
  landedAt(runId: string): number | undefined { return this.landedLate.get(runId); }

  /**
   * The batch's write; when PostgreSQL refuses it for its data (a row one shard's round made: a
   * constraint, a trigger, a value out of range), each shard's part is written alone, in queue
   * order, and only the shards whose part is refused again fail (`failed`; they restart from
   * PostgreSQL). Without this one poison row failed every shard that shared its batch: each of
   * them restarted, and a shard's consecutive rounds go into the same batches on the decision
   * grid, so a poison event took its neighbours down with it on every delivery.
   */
  private async writeIsolating(writes: ShardWrite[], records: DispatchRecord[]): Promise<{ stale: number[]; failed: Map<number, unknown> }> {
    try {
      return { ...(await this.writeWithRetry(writes, records)), failed: new Map() };
    } catch (e) {
      const shards = [...new Set(writes.map((w) => w.shard))];
      if (shards.length < 2 || !refusedForData(e)) throw e;
      this.d.log.warn({ err: String(e), shards: shards.length }, "batch write refused for its data; writing each shard's part alone");
      const stale: number[] = []; const failed = new Map<number, unknown>();
      for (const shard of shards) {
        try {
          stale.push(...(await this.writeWithRetry(writes.filter((w) => w.shard === shard), records)).stale);
        } catch (err) { failed.set(shard, err); }
      }
      if (failed.size) this.d.log.error({ shards: [...failed.keys()], err: String(failed.values().next().value) }, "a shard's part of a batch write was refused; that shard restarts");
      return { stale, failed };
    }
  }

  private async writeWithRetry(writes: ShardWrite[], records: DispatchRecord[]): Promise<{ stale: number[] }> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.d.store.writeBatch(writes, records);
      } catch (e) {
        // PostgreSQL restarting or a serialization hiccup: retry briefly; the caller keeps its
        // effects (dispatches, acks) until the write is in. A write refused for its data would
        // be refused again: not retried.
        if (attempt >= 8 || refusedForData(e)) throw e;
        this.d.log.warn({ err: String(e), attempt }, "batch write failed; retrying");
        await new Promise((r) => setTimeout(r, Math.min(2000, 50 * 2 ** attempt)));
      }
    }
  }
}

/**
 * The messages that re-publish a recorded dispatch message's unstarted runs. Whole: one message
 * under its id (dropped by JetStream if the first publish landed). Partly released (its node
 * lost a shard between record and release and sent only the other shards' runs): the released
 * part under its id, as it was sent, and the rest under a second id; each is dropped as a
 * duplicate if it landed before, so every run goes out once whoever re-publishes first.
 */
export function replayParts<R extends { shard: number }>(id: string, releasedShards: readonly number[] | null, runs: readonly R[]): Array<{ id: string; runs: R[] }> {
  if (releasedShards === null) return runs.length ? [{ id, runs: [...runs] }] : [];
  const released = new Set(releasedShards);
  return [
    { id, runs: runs.filter((r) => released.has(r.shard)) },
    { id: `${id}:rest`, runs: runs.filter((r) => !released.has(r.shard)) },
  ].filter((p) => p.runs.length > 0);
}

/**
 * Publishes a v2 dispatch message under `msgID`, retrying a few times with the same id (JetStream
 * de-duplicates one that did land). Also used to publish a recorded message again after a crash.
 */
export async function publishDispatch(js: JetStreamClient, names: Names, nodeId: string, executor: string, msgID: string, runs: ReadonlyArray<ShardDispatchRun>,
  opts: { sentAt: number; keepTrying?: () => boolean; onTrouble?: () => void }): Promise<number> {
  // `sentAt` is the node's clock (the one its runs' due times are on), read before the publish. A
  // copy sent again later keeps the first `sentAt`: an executor then holds its runs longer, never less.
  const data = dispatchPayload(nodeId, runs, opts.sentAt);
  // Retried under the same id until it lands (JetStream drops a copy of one that did): while
  // `keepTrying` says so, or else until the runs' own timeout has passed. A NATS restart of a few
  // seconds must delay these runs, not lose them (a run whose publish gave up after four tries
  // was left to time out, and without retries never ran).
  const giveUpAt = Date.now() + Math.max(5000, Math.min(...runs.map((r) => r.timeoutMs)));
  for (let attempt = 0; ; attempt++) {
    try {
      // A copy dropped as a duplicate is acknowledged with the sequence of the one that landed.
      return (await js.publish(names.dispatchSubject(executor), data, { msgID, timeout: 2000 })).seq;
    } catch (e) {
      opts.onTrouble?.();
      if (opts.keepTrying ? !opts.keepTrying() : Date.now() >= giveUpAt) throw e;
      await new Promise((r) => setTimeout(r, Math.min(1000, 50 * 2 ** attempt)));
    }
  }
}

/**
 * The body of a v2 dispatch message. `sentAt` (this node's clock) lets an executor that holds runs
 * start each one `firedAt - sentAt` after it received the message, on its own monotonic clock:
 * never before the due time, whatever the skew between the two machines' wall clocks.
 */
function dispatchPayload(nodeId: string, runs: ReadonlyArray<ShardDispatchRun>, sentAt: number): Uint8Array {
  return encode({ v: 2, node: nodeId, sentAt, runs });
}

/** Rows a write changes (its ledger and definition rows counted too). */
function rowCount(w: ShardWrite): number {
  return w.runInserts.length + w.runUpdates.length + w.taskUpdates.length + (w.ledger?.length ?? 0) + (w.defUpdates?.length ?? 0);
}

