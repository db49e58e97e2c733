import { hostname } from "node:os";
import type { NatsConnection } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, type JetStreamClient, type JsMsg } from "@nats-io/jetstream";
import { connectNats, loadNatsSettings, names, silentLogger, type Logger, type Names, type NatsSettings } from "../common/index.ts";
import { DispatchBatchSchema, DispatchRunSchema, MAX_RESULT_BYTES, decode, encode, isInt, type DispatchBatch, type DispatchRun, type RunEvent, type Failure } from "./messages.ts";
import { closeGently, ensureExecutorConsumer, ensureStreams, handBack } from "./jetstream.ts";
import { RecentPublishes, watchReconnects, type RecentPublish } from "./republish.ts";
import { HoldClock } from "./hold.ts";

export interface RunContext {
  runId: string;
  taskId: number;
  taskName: string;
  attempt: number;
  source: DispatchRun["source"];
  payload: unknown;
  /** The time the run was due (epoch ms). */
  scheduledAt: number;
  firedAt: number;
  /**
   * Aborts when the task's timeout elapses (measured from when this instance started the run), or
   * when an operator cancels the run (`ax run cancel`): the reason is then a CancelledError.
   */
  signal: AbortSignal;
}

/** The reason of a run's AbortSignal when an operator cancelled it; the run fails for good (no retry). */
export class CancelledError extends Error {
  override name = "CancelledError";
  readonly type = "cancelled";
  readonly nonRetryable = true;
}

export type RunHandler = (ctx: RunContext) => unknown | Promise<unknown>;

/**
 * Throw this (or any error with `nonRetryable: true`) to fail a run without retries. Any error
 * with a `result` property has it kept on the run (as a handler's return value is on success).
 */
export class NonRetryableError extends Error {
  override name = "NonRetryableError";
  readonly nonRetryable = true;
}

export interface ExecutorOptions {
  name: string;
  handler: RunHandler;
  /** Runs executed at once by this instance. */
  concurrency?: number;
  namespace?: string;
  natsUrl?: string;
  /** Replicas of the streams if this executor is the first to create them (default AX_REPLICAS, else 1). */
  replicas?: number;
  /**
   * Servers, credentials and TLS (see loadNatsSettings). Default: from the environment
   * (AX_NATS_URL, AX_NATS_USER/PASSWORD, AX_NATS_TOKEN, AX_NATS_NKEY, AX_NATS_CREDS, AX_NATS_TLS_*),
   * with `natsUrl` over AX_NATS_URL.
   */
  nats?: NatsSettings;
  /** Reuse a connection instead of opening one. */
  connection?: NatsConnection;
  instance?: string;
  logger?: Logger;
  /** Announce the executor to the cluster (so tasks can name it). Default true. */
  register?: boolean;
  maxInFlight?: number;
  /**
   * Events are flushed at most this often (default EVENT_FLUSH_MS); completions of many runs share
   * one message, and a dispatch is acked once its events are stored, up to this much later.
   */
  eventFlushMs?: number;
  ackWaitMs?: number;
  /** The kind registered for the executor: `http` for an HTTP bridge (tasks' payloads are then HTTP requests). Default nats. */
  kind?: "nats" | "http";
  /** How often this instance reports its liveness (last seen, runs in flight) to the cluster. Default 5 s; 0 = never. */
  heartbeatMs?: number;
  /**
   * A run delivered this long after its message was published (a queue built up while no
   * instance ran, or a publish that was tried again), or delivered again, is checked with the
   * cluster before it starts (`run.check`: its task removed or changed, a retry superseded it).
   * Default 2 s. Expired runs are refused without asking. A message from a node that predates
   * `sentAt` (v1) is timed from its runs' fire instead.
   */
  staleCheckAfterMs?: number;
  /**
   * Registers this executor as holding runs until their due time (default true): nodes then
   * publish its runs as soon as they are recorded, ahead of their due time, and each instance
   * starts each run at it (and drops runs the scheduler revokes before it). False: nodes publish
   * each run at its due time. The latest registration of the name decides for every instance.
   */
  holdAhead?: boolean;
}

const EXECUTOR_NAME_RE = /^[A-Za-z0-9_-]{1,64}$/;
/** Lifetime of each pull request on the dispatch consumer (see start()). */
const DISPATCH_PULL_EXPIRES_MS = 2000;
/** How often the sweeper checks active runs for their timeout and heartbeat (heartbeats are >= 250 ms apart). */
const SWEEP_MS = 50;

interface ActiveRun {
  startedMono: number;
  timeoutMs: number;
  deadline: number;
  hbEvery: number;
  nextHb: number;
  /**
   * Made only when the handler reads `ctx.signal`: an AbortController per run cost ~7 µs
   * (a third of the SDK's CPU a run at thousands of runs a second), and most handlers never look.
   */
  ac: AbortController | null;
  /** Set once the deadline passed (the run's failure and the signal's reason); a controller made afterwards starts aborted. */
  timedOut: Error | null;
  /** Rejects the run's wait for an async handler when the deadline passes. */
  onTimeout: ((e: Error) => void) | null;
  route: Route;
  taskId: number;
  token: string | undefined;
  /** Set when an operator cancelled the run (`ax run cancel`). */
  cancelled?: Error;
}

const RUN_SOURCES = new Set(DispatchRunSchema.shape.source.options as readonly string[]);
const utf8 = new TextDecoder();

/**
 * DispatchBatchSchema, checked by hand for the common well-formed batch (zod costs several µs
 * per run); anything that fails the check goes through zod, so refusals read as before.
 */
function decodeDispatch(data: Uint8Array): ReturnType<typeof decode<DispatchBatch>> {
  let v: unknown;
  try { v = JSON.parse(utf8.decode(data)); } catch { return decode(DispatchBatchSchema, data); }
  const b = v as Record<string, unknown>;
  if (b !== null && typeof b === "object" && typeof b.node === "string" && Array.isArray(b.runs) && b.runs.length >= 1) {
    if (b.v === 2 && NODE_ID_RE.test(b.node) && (b.runs as unknown[]).every((r) => isDispatchRun(r) && isInt((r as { shard?: unknown }).shard, 0))) {
      return { ok: true, value: b as unknown as DispatchBatch };
    }
    if (b.v === 1 && isInt(b.shard, 0) && isInt(b.epoch, 0) && (b.runs as unknown[]).every(isDispatchRun)) {
      return { ok: true, value: b as unknown as DispatchBatch };
    }
  }
  return decode(DispatchBatchSchema, data);
}
const NODE_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
function isDispatchRun(x: unknown): boolean {
  if (x === null || typeof x !== "object") return false;
  const r = x as Record<string, unknown>;
  return typeof r.runId === "string" && r.runId.length >= 1 && r.runId.length <= 128 && isInt(r.taskId, 1) && typeof r.taskName === "string"
    && isInt(r.attempt, 1) && typeof r.source === "string" && RUN_SOURCES.has(r.source) && isInt(r.scheduledAt, 0) && isInt(r.firedAt, 0)
    && isInt(r.timeoutMs, 1);
}

/** A handler's result as sent: JSON within MAX_RESULT_BYTES, else a note saying what was left out. */
function boundedResult(v: unknown): unknown {
  let json: string | undefined;
  try { json = JSON.stringify(v); } catch (e) { return { unserializable: String((e as Error)?.message ?? e) }; }
  if (json === undefined) return undefined;
  if (json.length <= MAX_RESULT_BYTES) return JSON.parse(json);
  return { truncated: true, bytes: json.length, excerpt: json.slice(0, 1024) };
}

/**
 * Where a run's events go: to the node that dispatched it (v2, `n:<node>`, each event tagged with
 * its shard) or to its shard's subject (v1, `s:<shard>`). The key groups buffered events.
 */
type Route = { key: string; node: string | null; shard: number };
const routeOf = (batch: DispatchBatch, run: DispatchRun): Route =>
  batch.v === 2 ? { key: `n:${batch.node}`, node: batch.node, shard: run.shard! } : { key: `s:${batch.shard}`, node: null, shard: batch.shard };

/**
 * How long buffered events wait for company. nats-server's CPU follows the number of messages it
 * stores (about 170 µs each at these rates), not their size. Alternated at 835 runs/s, 20 ms
 * against 5 cost 1,125 and 1,144 µs a run in all against 1,517 and 1,371 (NATS, PostgreSQL and
 * the node all lower: fewer event messages, fewer completion rounds); at 4,000/s 369 and 419
 * against 416 and 422. The price: a completion is recorded up to 20 ms later, and a handler that
 * finished within the last 20 ms before its instance died may run again on another instance (the
 * window was 5 ms): handlers use the run id as an idempotency key (README, Limits).
 */
export const EVENT_FLUSH_MS = 20;
/** Largest event message sent (NATS's default max_payload is 1 MB). */
const MAX_EVENT_MESSAGE_BYTES = 768 * 1024;

/**
 * The executor SDK. Pulls dispatch batches from the executor's durable consumer, runs the
 * handler per run with bounded concurrency and publishes started / progress / completed /
 * failed events in batches.
 *
 * Delivery is at least once; the effect is once per run id within an instance:
 * - a run id already finished here (its ack was lost, the batch came back) is not run again;
 * - a run id running here is not started a second time;
 * - a run delivered after its deadline (fired + timeout) starts only if the cluster says it is
 *   still `running` (run.check): otherwise, or if no node answers, it is dropped — the scheduler
 *   has timed it out and owns its retry.
 * A dispatch message is acked only after every run in it finished and their events were
 * stored by JetStream, and kept alive with in-progress acks while runs take long.
 */
export class Executor {
  readonly name: string;
  readonly instance: string;
  private readonly opts: ExecutorOptions;
  private readonly log: Logger;
  private readonly n: Names;
  private nc: NatsConnection | null = null;
  private ownsConnection = false;
  private js: JetStreamClient | null = null;
  private stopping = false;
  private active = new Map<string, ActiveRun>();
  /**
   * Runs taken by a delivery that is still asking run.check about them, before they are active:
   * a second delivery of the same run meanwhile (a redelivery after the ack wait, a re-published
   * message) is a duplicate too. Without this both passed the check and the handler ran twice.
   */
  private readonly claimed = new Set<string>();
  // Run ids finished here, in two generations of up to finishedCap each (so the latest
  // finishedCap are always remembered). Evicting the oldest key of one big Map is O(1) in
  // theory but not in V8: after many deletions from the front, finding the first live entry
  // walks the deleted slots, and the executor slowed to half its speed past 100k runs.
  private finished = new Set<string>();
  private finishedOld = new Set<string>();
  private readonly finishedCap = 100_000;
  /**
   * Runs received ahead of their due time and waiting for it here: run id → set once an operator
   * cancelled it meanwhile (`ax run cancel`: it then ends cancelled without its handler).
   */
  private readonly holding = new Map<string, { cancelledBy: string | null }>();
  /** Runs the scheduler revoked before their due time (withdrawn: a pause, cancel, removal or update), in two generations like `finished`; never started here. */
  private revoked = new Set<string>();
  private revokedOld = new Set<string>();
  /** What a run sent ahead may be credited for its message's transit (see HoldClock). */
  private readonly holdClock = new HoldClock();
  /** Backward steps of nodes' wall clocks they told of (clockStep), with when they arrived here; kept a minute. */
  private clockSteps: Array<{ node: string; mono: number; ms: number }> = [];
  private slots: number;
  private slotWaiters: Array<() => void> = [];
  /** Buffered events by route key (see Route); each list carries its route. */
  private pending = new Map<string, { route: Route; events: RunEvent[] }>();
  private flushTimer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> = Promise.resolve();
  /** A flush is queued behind the one being stored and has not taken the buffered events yet. */
  private flushQueued = false;
  /** Settled by the next flush: what a dispatch waits on before its ack (see eventsStored). */
  private nextFlush: { promise: Promise<void>; resolve: () => void; reject: (e: unknown) => void } | null = null;
  private loop: Promise<void> | null = null;
  private inflightMessages = new Set<Promise<void>>();
  private stopConsume: (() => void) | null = null;
  private eventSeq = 0;
  /** Event batches JetStream acked lately: published again after a reconnect (see RecentPublishes). */
  private readonly recent = new RecentPublishes();
  private toRepublish: RecentPublish[] | null = null;
  private stopWatching: (() => void) | null = null;
  private registeredResolve!: () => void;
  /** Resolves once a node has recorded this executor (tasks may name it from then on). */
  readonly registered: Promise<void> = new Promise((r) => { this.registeredResolve = r; });
  /** expired: refused past their deadline; stale: refused because run.check said so (task removed or changed, superseded); checked: runs asked about with run.check (see staleCheckAfterMs). */
  readonly stats = { runs: 0, succeeded: 0, failed: 0, duplicates: 0, expired: 0, stale: 0, malformed: 0, cancelled: 0, republished: 0, republishedLanded: 0, held: 0, revoked: 0, checked: 0 };
  private readonly startedMs = Date.now();
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private cancelSub: { unsubscribe(): void } | null = null;

  constructor(opts: ExecutorOptions) {
    if (!EXECUTOR_NAME_RE.test(opts.name)) throw new Error(`executor name ${JSON.stringify(opts.name)}: use letters, digits, _ or - (at most 64)`);
    this.opts = opts;
    this.name = opts.name;
    this.instance = opts.instance ?? `${hostname()}-${process.pid}-${Math.random().toString(36).slice(2, 6)}`;
    this.log = (opts.logger ?? silentLogger).child({ executor: opts.name, instance: this.instance });
    this.n = names(opts.namespace ?? process.env.AX_NAMESPACE ?? "ax");
    this.slots = Math.max(1, opts.concurrency ?? 64);
  }

  async start(): Promise<void> {
    if (this.opts.connection) this.nc = this.opts.connection;
    else {
      const s = this.opts.nats ?? loadNatsSettings(process.env, this.opts.natsUrl ? { AX_NATS_URL: this.opts.natsUrl } : {});
      this.nc = await connectNats(s, { name: `ax-executor:${this.name}` });
      this.ownsConnection = true;
    }
    this.js = jetstream(this.nc);
    this.stopWatching = watchReconnects(this.nc,
      () => { this.toRepublish = [...(this.toRepublish ?? []), ...this.recent.takeRecent()]; },
      () => { const list = this.toRepublish; this.toRepublish = null; if (list?.length) this.republish(list); });
    const jsm = await jetstreamManager(this.nc);
    let durable = this.n.executorConsumer(this.name);
    let mayCreate = true;
    try {
      await ensureStreams(jsm, this.n, { replicas: this.opts.replicas ?? (Number(process.env.AX_REPLICAS) || 1) });
      durable = await ensureExecutorConsumer(jsm, this.n, this.name, this.opts.ackWaitMs ?? 30_000);
    } catch (e) {
      // A least-privilege NATS user (deploy/nats) may not create streams or consumers: the node
      // creates this executor's consumer when it registers.
      if (!/permission/i.test(String((e as Error)?.message ?? e))) throw e;
      mayCreate = false;
      this.log.info("no permission to create the dispatch consumer; the node creates it at registration");
    }
    if (this.opts.register !== false) void this.registerLoop();
    if (!mayCreate) await this.registered;
    this.listenForCancels();
    this.startHeartbeats();
    const consumer = await this.js.consumers.get(this.n.dispatchStream, durable);
    // Pulls of 2 s (idle heartbeats every 1 s), not the client's default 30 s: a pull request
    // held by a server that dies (a consumer leader killed on a cluster, while this instance's own
    // server stays up, so no reconnect tells it) is noticed after two missed heartbeats and
    // re-issued, within 2 s instead of 30 s of undelivered dispatches (5 s pulls added 5 s to the
    // recovery from a killed NATS leader; an idle instance's pull every 2 s costs nothing).
    const messages = await consumer.consume({ max_messages: Math.max(8, Math.min(256, this.slots)), expires: DISPATCH_PULL_EXPIRES_MS });
    // Gently: dispatches on their way when it stops are handed back (handBack, 100 ms), not after the 30 s ack wait.
    this.stopConsume = () => { void closeGently(messages).catch(() => undefined); };
    this.loop = (async () => {
      for await (const m of messages) {
        if (this.stopping) { handBack(m); continue; }
        const p = this.onMessage(m).catch((e) => this.log.error({ err: e }, "dispatch handling failed"));
        this.inflightMessages.add(p);
        void p.finally(() => this.inflightMessages.delete(p));
        // Back-pressure: do not pull more than we can run.
        while (this.slots <= 0 && !this.stopping) await new Promise<void>((r) => this.slotWaiters.push(r));
      }
    })();
    this.log.info({ durable }, "executor started");
  }

  /** Stops pulling, lets running handlers finish, flushes events. */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.stopConsume?.();
    if (this.heartbeatTimer) { clearInterval(this.heartbeatTimer); this.heartbeatTimer = null; }
    this.cancelSub?.unsubscribe();
    for (const w of this.slotWaiters.splice(0)) w();
    await Promise.allSettled([...this.inflightMessages]);
    if (this.sweeper) { clearInterval(this.sweeper); this.sweeper = null; }
    await this.flush();
    await this.loop?.catch(() => undefined);
    this.stopWatching?.();
    // Gone on purpose: the cluster shows this instance as stopped at once, not dead later.
    if ((this.opts.heartbeatMs ?? 5000) > 0) await this.heartbeat(true).catch(() => undefined);
    if (this.ownsConnection) await this.nc?.drain().catch(() => undefined);
  }

  private async registerLoop(): Promise<void> {
    // `holds`: this instance starts a run received ahead of its due time at that time, and obeys
    // revokes (see onMessage), so nodes may publish its runs as soon as they are recorded.
    const body = encode({ name: this.name, kind: this.opts.kind ?? "nats", maxInFlight: this.opts.maxInFlight ?? null, instance: this.instance, holds: this.opts.holdAhead !== false });
    for (let i = 0; !this.stopping; i++) {
      try {
        // Its own subject (<ns>.api.executor.register.<name>): NATS permissions can allow exactly this one.
        await this.nc!.request(this.n.apiSubject(`executor.register.${this.name}`), body, { timeout: 2000 });
        this.registeredResolve();
        return;
      } catch {
        // No node answers yet; keep consuming and try again.
        await new Promise((r) => setTimeout(r, Math.min(5000, 250 * 2 ** i)));
      }
    }
  }

  private async onMessage(m: JsMsg): Promise<void> {
    const receivedMono = performance.now();
    const d = decodeDispatch(m.data);
    if (!d.ok) {
      this.stats.malformed++;
      this.log.warn({ reason: d.reason, seq: m.seq }, "malformed dispatch refused");
      m.term();
      return;
    }
    const batch = d.value;
    const keepAlive = setInterval(() => m.working(), Math.max(1000, (this.opts.ackWaitMs ?? 30_000) / 3));
    const fresh: Array<DispatchRun> = [];
    try {
      const runs: Array<Promise<void>> = [];
      const now = Date.now();
      const expired = new Map<string, string>();
      for (const run of batch.runs) {
        if (this.finished.has(run.runId) || this.finishedOld.has(run.runId) || this.active.has(run.runId) || this.claimed.has(run.runId)) { this.stats.duplicates++; continue; }
        // Past its deadline the scheduler has normally timed the run out and owns its retry. But
        // the deadline is only the dispatch's estimate: a dispatch that waited out a NATS leader
        // election (its publish retried, the consumer re-elected) arrives late while the shard,
        // which held the timeout meanwhile, still has it `running`. run.check decides below;
        // without an answer it is refused, on a first delivery as on a redelivery.
        const deadline = run.deadline ?? run.firedAt + run.timeoutMs;
        if (now > deadline) expired.set(run.runId, `expired: its deadline ${new Date(deadline).toISOString()} passed ${now - deadline} ms before it was delivered${m.info.deliveryCount > 1 ? ` (delivery ${m.info.deliveryCount})` : ""}`);
        fresh.push(run);
        this.claimed.add(run.runId);
      }
      // A message may come ahead of its runs' due times (this executor registered `holds`): each
      // run starts `firedAt - sentAt` after the message arrived, measured here on the monotonic
      // clock (less the transit credit, see HoldClock), so not before its due time on the node's
      // clock whatever the skew between the two machines' wall clocks. In due order, so one
      // timer at a time serves the message.
      const sentAt = batch.v === 2 ? batch.sentAt : undefined;
      const credit = sentAt !== undefined ? this.holdClock.creditFor(batch.node, sentAt, receivedMono) : 0;
      if (sentAt !== undefined) {
        fresh.sort((a, b) => a.firedAt - b.firedAt);
        // Known as held from now on, all of them (an operator's cancel finds any of them).
        for (const r of fresh) if (r.firedAt > sentAt) { this.holding.set(r.runId, { cancelledBy: null }); this.stats.held++; }
      }
      // "Delivered late" is counted from when the node published the message (v2 `sentAt`, kept by
      // a publish tried again), not from the runs' fire: a run a busy node fired late but published
      // at once did not sit in a queue, and asking about every such run made a node that was behind
      // answer a check for each of its runs on top of its work. A v1 message has no `sentAt`: its
      // runs' fire time stands in, as before.
      const staleAfter = this.opts.staleCheckAfterMs ?? 2000;
      const suspect = fresh.filter((r) => expired.has(r.runId) || m.info.deliveryCount > 1
        || now - (sentAt ?? r.firedAt) > staleAfter);
      this.stats.checked += suspect.length;
      const verdicts: Map<string, string> & { answered?: boolean } = suspect.length ? await this.checkRuns(suspect) : new Map<string, string>();
      for (const run of fresh) {
        const late = expired.get(run.runId);
        if (late !== undefined && (verdicts.answered === false || verdicts.has(run.runId))) {
          this.stats.expired++;
          this.refuseStale(batch, run, verdicts.has(run.runId) ? `${late}; ${verdicts.get(run.runId)}` : late);
          continue;
        }
        const why = verdicts.get(run.runId);
        if (why) { this.stats.stale++; this.refuseStale(batch, run, why); continue; }
        let cancelledBy: string | null = null;
        const hold = this.holding.get(run.runId);
        if (hold && sentAt !== undefined) {
          let startMono = HoldClock.startAt(run.firedAt, sentAt, receivedMono, credit);
          for (let shifted = 0; ;) {
            // A timer may fire a fraction of a millisecond before its time on this clock: wait again then.
            for (let left = startMono - performance.now(); left > 0; left = startMono - performance.now()) {
              await new Promise((r) => setTimeout(r, Math.ceil(left)));
            }
            // The node's clock stepped back since this message came: its due times are that much later now.
            const shift = this.clockStepSince(batch.node, receivedMono);
            if (shift <= shifted) break;
            startMono += shift - shifted;
            shifted = shift;
          }
          this.holding.delete(run.runId);
          cancelledBy = hold.cancelledBy;
        }
        if (this.revoked.has(run.runId) || this.revokedOld.has(run.runId)) {
          // Withdrawn by the scheduler, which recorded it `refused`: nothing to report.
          this.stats.revoked++;
          this.remember(run.runId);
          this.log.info({ runId: run.runId, taskId: run.taskId }, "revoked run not started");
          continue;
        }
        while (this.slots <= 0) await new Promise<void>((r) => this.slotWaiters.push(r));
        this.slots--;
        runs.push(this.execute(routeOf(batch, run), run, cancelledBy).finally(() => {
          this.slots++;
          this.slotWaiters.shift()?.();
        }));
      }
      await Promise.all(runs);
      await this.eventsStored();
      m.ack();
    } finally {
      clearInterval(keepAlive);
      // Only this delivery's claims (a duplicate's are none). Until now the run was claimed, then
      // active or remembered as finished: a duplicate never found it unmarked.
      for (const run of fresh) { this.claimed.delete(run.runId); this.holding.delete(run.runId); }
    }
  }

  /** A node's wall clock stepped back `ms` (see Persister.watchClock). */
  private noteClockStep(node: string, ms: number): void {
    const now = performance.now();
    this.clockSteps = this.clockSteps.filter((c) => now - c.mono < 60_000);
    this.clockSteps.push({ node, mono: now, ms });
    // Its offsets measured before the step would credit transit that was the step (HoldClock).
    this.holdClock.forget(node);
    this.log.warn({ node, stepMs: -ms }, "a node's clock stepped back: its runs held here wait that much longer");
  }

  /** How far the node's clock stepped back, in all, after `sinceMono`. */
  private clockStepSince(node: string, sinceMono: number): number {
    let ms = 0;
    for (const c of this.clockSteps) if (c.node === node && c.mono > sinceMono) ms += c.ms;
    return ms;
  }

  private noteRevoked(runId: string): void {
    if (this.active.has(runId)) {
      this.log.warn({ runId }, "a revoke came after the run started here; it runs to its end");
      return;
    }
    this.revoked.add(runId);
    if (this.revoked.size >= this.finishedCap) { this.revokedOld = this.revoked; this.revoked = new Set(); }
  }

  /** Reports a run this instance will not start (a `stale` event) and remembers it as done. */
  private refuseStale(batch: DispatchBatch, run: DispatchRun, reason: string): void {
    this.log.info({ runId: run.runId, taskId: run.taskId, reason }, "stale run not started");
    this.remember(run.runId);
    this.emit(routeOf(batch, run), { type: "stale", runId: run.runId, taskId: run.taskId, at: Date.now(), reason, ...(run.token ? { token: run.token } : {}) });
  }

  /**
   * Asks the cluster whether runs are still to be run (`run.check.<executor>`): their task still
   * exists at the dispatched generation and no retry superseded them. Answers runId → reason for
   * those that are not. If no node answers, the runs start (as they did before this check).
   */
  private async checkRuns(runs: DispatchRun[]): Promise<Map<string, string> & { answered?: boolean }> {
    const out: Map<string, string> & { answered?: boolean } = new Map<string, string>();
    out.answered = false;
    try {
      const body = encode({ runs: runs.map((r) => ({ runId: r.runId, taskId: r.taskId, ...(r.gen !== undefined ? { gen: r.gen } : {}) })) });
      const m = await this.nc!.request(this.n.apiSubject(`run.check.${this.name}`), body, { timeout: 5000 });
      const env = JSON.parse(utf8.decode(m.data)) as { ok: boolean; value?: { stale?: Record<string, string> }; error?: { message?: string } };
      if (!env.ok) { this.log.warn({ error: env.error?.message }, "run.check refused; the runs start"); return out; }
      for (const [id, why] of Object.entries(env.value?.stale ?? {})) if (typeof why === "string") out.set(id, why);
      out.answered = true;
    } catch (e) {
      this.log.warn({ err: String((e as Error)?.message ?? e), runs: runs.length }, "run.check unanswered; the runs start");
    }
    return out;
  }

  private listenForCancels(): void {
    this.cancelSub = this.nc!.subscribe(this.n.executorCancelSubject(this.name), {
      callback: (err, msg) => {
        if (err) return;
        let runId: unknown;
        let who: unknown;
        let revoke: unknown;
        let clockStep: unknown;
        try { ({ runId, who, revoke, clockStep } = JSON.parse(utf8.decode(msg.data)) as { runId?: unknown; who?: unknown; revoke?: unknown; clockStep?: unknown }); } catch { return; }
        if (clockStep !== null && typeof clockStep === "object") {
          const { node, ms } = clockStep as { node?: unknown; ms?: unknown };
          if (typeof node === "string" && typeof ms === "number" && Number.isFinite(ms) && ms < 0) this.noteClockStep(node, -ms);
          return;
        }
        if (Array.isArray(revoke)) {
          // Sent to every instance: whichever receives the runs (now or later) does not start them.
          for (const id of revoke) if (typeof id === "string") this.noteRevoked(id);
          return;
        }
        const held = typeof runId === "string" ? this.holding.get(runId) : undefined;
        if (held) {
          // Received and waiting for its due time: it ends cancelled then, without its handler.
          held.cancelledBy = typeof who === "string" ? who : "an operator";
          msg.respond(encode({ ok: true, value: { runId, instance: this.instance } }));
          return;
        }
        const a = typeof runId === "string" ? this.active.get(runId) : undefined;
        if (!a) return; // not running here: another instance answers, or nobody (the caller says so)
        if (!a.cancelled && !a.timedOut) {
          this.stats.cancelled++;
          a.cancelled = new CancelledError(`cancelled by ${typeof who === "string" ? who : "an operator"} (ax run cancel)`);
          a.ac?.abort(a.cancelled);
          a.onTimeout?.(a.cancelled);
        }
        msg.respond(encode({ ok: true, value: { runId, instance: this.instance } }));
      },
    });
  }

  private startHeartbeats(): void {
    const every = this.opts.heartbeatMs ?? 5000;
    if (every <= 0) return;
    void this.heartbeat(false).catch(() => undefined);
    this.heartbeatTimer = setInterval(() => { void this.heartbeat(false).catch(() => undefined); }, every);
    this.heartbeatTimer.unref();
  }
  /** One liveness report (`executor.heartbeat.<name>`): this instance, its runs in flight, its counters. */
  private async heartbeat(stopping: boolean): Promise<void> {
    const body = encode({ instance: this.instance, kind: this.opts.kind ?? "nats", inFlight: this.active.size, concurrency: this.opts.concurrency ?? 64,
      startedMs: this.startedMs, everyMs: this.opts.heartbeatMs ?? 5000, stopping, stats: this.stats });
    await this.nc!.request(this.n.apiSubject(`executor.heartbeat.${this.name}`), body, { timeout: 2000 });
  }

  /** Runs the handler (`cancelledBy`: an operator cancelled the run while it was held here; it ends cancelled without running). */
  private async execute(route: Route, run: DispatchRun, cancelledBy: string | null = null): Promise<void> {
    const now = performance.now();
    const hbEvery = Math.min(10_000, Math.max(250, Math.floor(run.timeoutMs / 3)));
    // Timeouts and heartbeats of every active run are served by one sweeper timer (sweep()),
    // not two timers per run: at thousands of runs a second the per-run timers cost more than
    // the runs.
    const a: ActiveRun = { startedMono: now, timeoutMs: run.timeoutMs, deadline: now + run.timeoutMs, hbEvery, nextHb: now + hbEvery, ac: null, timedOut: null, onTimeout: null, route, taskId: run.taskId, token: run.token };
    if (cancelledBy !== null) { this.stats.cancelled++; a.cancelled = new CancelledError(`cancelled by ${cancelledBy} (ax run cancel) before its due time`); }
    this.active.set(run.runId, a);
    this.ensureSweeper();
    this.stats.runs++;
    const started: RunEvent = { type: "started", runId: run.runId, taskId: run.taskId, at: Date.now(), ...(run.token ? { token: run.token } : {}) };
    const startedUnsentIn = this.emit(route, started);
    let failure: Failure | null = null;
    let result: unknown;
    try {
      // The handler runs in a microtask, as before (a synchronous throw is a failure like a rejection).
      await null;
      if (a.cancelled) throw a.cancelled;
      const returned = this.opts.handler({
        runId: run.runId, taskId: run.taskId, taskName: run.taskName, attempt: run.attempt, source: run.source,
        payload: run.payload, scheduledAt: run.scheduledAt, firedAt: run.firedAt,
        get signal() {
          if (!a.ac) { a.ac = new AbortController(); if (a.cancelled ?? a.timedOut) a.ac.abort(a.cancelled ?? a.timedOut); }
          return a.ac.signal;
        },
      });
      result = returned;
      if (returned !== null && typeof returned === "object" && typeof (returned as PromiseLike<unknown>).then === "function") {
        result = await Promise.race([
          returned,
          new Promise((_, reject) => { const stop = a.cancelled ?? a.timedOut; if (stop) reject(stop); else a.onTimeout = reject; }),
        ]);
      }
      if (a.cancelled) throw a.cancelled; // cancelled while a synchronous handler ran: still a cancellation
    } catch (e) {
      const err = e as { message?: string; name?: string; type?: string; nonRetryable?: boolean; result?: unknown };
      // An operator's cancel wins over whatever the aborted handler threw on its way out.
      const cause = a.cancelled ?? err;
      failure = { message: String(cause?.message ?? e), type: (cause as { type?: string }).type ?? cause?.name ?? "Error" };
      if ((cause as { nonRetryable?: boolean })?.nonRetryable) failure.nonRetryable = true;
      result = err?.result;
    }
    this.active.delete(run.runId);
    this.remember(run.runId);
    if (failure) this.stats.failed++; else this.stats.succeeded++;
    const end: RunEvent = failure
      ? { type: "failed", runId: run.runId, taskId: run.taskId, at: Date.now(), error: failure }
      : { type: "completed", runId: run.runId, taskId: run.taskId, at: Date.now() };
    if (run.token) end.token = run.token;
    if (result !== undefined) end.result = boundedResult(result);
    if (this.pending.get(route.key)?.events === startedUnsentIn) {
      // The start was not sent yet (short run): the end takes its place and carries its time.
      Object.assign(started, end, { startedAt: started.at });
    } else {
      this.emit(route, end);
    }
  }

  private sweeper: NodeJS.Timeout | null = null;
  private ensureSweeper(): void {
    if (this.sweeper) return;
    this.sweeper = setInterval(() => this.sweep(), SWEEP_MS);
    this.sweeper.unref();
  }
  /** Aborts runs past their timeout and heartbeats the long ones (progress events); stops when idle. */
  private sweep(): void {
    if (!this.active.size) { clearInterval(this.sweeper!); this.sweeper = null; return; }
    const now = performance.now();
    for (const [runId, a] of this.active) {
      if (now >= a.deadline && !a.timedOut) {
        a.timedOut = Object.assign(new Error(`timed out after ${a.timeoutMs}ms`), { type: "timeout" });
        a.ac?.abort(a.timedOut);
        a.onTimeout?.(a.timedOut);
      }
      if (now >= a.nextHb) {
        a.nextHb += a.hbEvery * Math.max(1, Math.ceil((now - a.nextHb) / a.hbEvery));
        this.emit(a.route, { type: "progress", runId, taskId: a.taskId, at: Date.now(), ...(a.token ? { token: a.token } : {}) });
      }
    }
  }

  private remember(runId: string): void {
    this.finished.add(runId);
    if (this.finished.size >= this.finishedCap) { this.finishedOld = this.finished; this.finished = new Set(); }
  }

  /** Buffers an event; returns the buffer it went into (still unsent while it is `pending`'s). */
  private emit(route: Route, ev: RunEvent): RunEvent[] {
    if (route.node !== null) ev.shard = route.shard;
    let p = this.pending.get(route.key);
    if (!p) { p = { route, events: [] }; this.pending.set(route.key, p); }
    p.events.push(ev);
    if (p.events.length >= 500 && !this.flushQueued) void this.flush().catch(() => undefined); // (logged in flush)
    else if (!this.flushTimer) this.flushTimer = setTimeout(() => { void this.flush().catch(() => undefined); }, this.opts.eventFlushMs ?? EVENT_FLUSH_MS);
    return p.events;
  }

  /**
   * Resolves when every event buffered so far is stored: a dispatch is acked only then, so a crash
   * never leaves an acked dispatch whose completions are lost. Buffered events go with the next
   * timed flush (at most eventFlushMs away) rather than a flush of their own: the dispatches that
   * finish within one flush interval share one event message (forcing a flush per dispatch gave
   * about one event message, and one ack, per dispatch message).
   */
  private eventsStored(): Promise<void> {
    if (this.pending.size === 0) return this.flushing;
    if (!this.nextFlush) {
      let resolve!: () => void;
      let reject!: (e: unknown) => void;
      const promise = new Promise<void>((res, rej) => { resolve = res; reject = rej; });
      this.nextFlush = { promise, resolve, reject };
    }
    return this.nextFlush.promise;
  }

  /**
   * Publishes every buffered event; resolves when JetStream stored them (and anything flushed
   * before). The events are taken when the previous flush is done, not when this one is asked
   * for: while one batch is being stored, everything since waits and goes out in the next, one
   * flush queued at a time. Taking them at the ask queued a flush per 500 events, stored one
   * after the other: at most 500 events per publish round trip (on the seed no effect stood out
   * of the noise, bench/analysis.md, twenty-fifth round).
   */
  flush(): Promise<void> {
    if (this.flushTimer) { clearTimeout(this.flushTimer); this.flushTimer = null; }
    if (this.flushQueued) return this.flushing; // the queued one takes everything buffered when it starts
    this.flushQueued = true;
    const prev = this.flushing;
    this.flushing = (async () => {
      // An earlier batch that could not be published was logged and failed its own waiters; it
      // must not stop this one.
      await prev.catch(() => undefined);
      this.flushQueued = false;
      const batches = [...this.pending.values()];
      this.pending = new Map();
      const waiting = this.nextFlush;
      this.nextFlush = null;
      try {
        await Promise.all(batches.map(({ route, events }) => this.publishRoute(route, events)));
      } catch (e) {
        waiting?.reject(e);
        throw e;
      }
      waiting?.resolve();
    })();
    return this.flushing;
  }

  /**
   * A route's buffered events, in order, in as few messages as fit: a message over
   * MAX_EVENT_MESSAGE_BYTES (NATS refuses more than 1 MB by default; a result may be 8 KB) is
   * split in two, and each half again if need be.
   */
  private async publishRoute(route: Route, events: RunEvent[]): Promise<void> {
    const [subject, data] = route.node !== null
      ? [this.n.nodeEventsSubject(route.node), encode({ v: 2, executor: this.name, instance: this.instance, node: route.node, events })]
      : [this.n.eventsSubject(route.shard), encode({ v: 1, executor: this.name, instance: this.instance, shard: route.shard, events })];
    if (data.byteLength > MAX_EVENT_MESSAGE_BYTES && events.length > 1) {
      const half = Math.ceil(events.length / 2);
      await this.publishRoute(route, events.slice(0, half));
      await this.publishRoute(route, events.slice(half));
      return;
    }
    const msgID = `e:${this.instance}:${++this.eventSeq}`;
    await this.publishEvents(subject, data, msgID).catch((e) => {
      this.log.error({ err: e, route: route.key, events: events.length }, "events could not be published");
      throw e;
    });
    this.recent.note(subject, data, msgID);
  }

  /** One event batch, retried under the same msgID (JetStream de-duplicates a publish that did land). */
  private async publishEvents(subject: string, data: Uint8Array, msgID: string): Promise<{ duplicate: boolean }> {
    for (let attempt = 0; ; attempt++) {
      try {
        // A short timeout: a publish sent into a connection that just dropped is never
        // answered, and waiting 5 s for that delayed completions by as much after a NATS restart.
        const ack = await this.js!.publish(subject, data, { msgID, timeout: 2000 });
        return { duplicate: ack.duplicate };
      } catch (e) {
        if (attempt >= 40) throw e;
        await new Promise((r) => setTimeout(r, Math.min(1000, 50 * 2 ** attempt)));
      }
    }
  }

  /**
   * After a reconnect: the event batches acked in the seconds before the connection dropped are
   * published again under their own ids. A server that kept them drops the copies; one that lost
   * them on a restart (see RecentPublishes) stores them now. Queued behind the flushes, so stop()
   * waits for it.
   */
  private republish(list: RecentPublish[]): void {
    const prev = this.flushing;
    this.flushing = (async () => {
      await prev.catch(() => undefined);
      let landed = 0;
      for (const p of list) {
        try {
          if (!(await this.publishEvents(p.subject, p.data, p.msgID)).duplicate) landed++;
          this.stats.republished++;
          this.recent.note(p.subject, p.data, p.msgID);
        } catch (e) {
          this.log.error({ err: e, msgID: p.msgID }, "events could not be published again after a reconnect");
        }
      }
      this.stats.republishedLanded += landed;
      // Any that land again were acknowledged and then lost by the server (or the outage outlasted
      // the duplicate window): worth a line.
      if (landed) this.log.warn({ batches: list.length, landed }, "event batches published again after a reconnect: some were missing from the stream");
    })();
  }
}
