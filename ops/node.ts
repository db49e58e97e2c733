import { hostname } from "node:os";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, type JetStreamClient } from "@nats-io/jetstream";
import { AxError, InvalidInputError, RateWindow, SystemClock, connectNats, createLogger, names, type AxConfig, type Clock, type Logger, type Names } from "../common/index.ts";
import { DeadLetters, DispatchDelivery, encode, noteJetStreamTrouble, ensureExecutorConsumer, ensureShardConsumers, ensureStreams, missingStreams } from "../protocol/index.ts";
import { DECIDE_STEP_MS, DependencyActor, DueIndex, InFlightLimiter, NodeEvents, Persister, Releaser, ShardActor, Store, type ShardCommand } from "../actors/index.ts";
import { LedgerStore } from "../actors/store/index.ts";
import { LeaseBucket, ShardSupervisor, controlKey, type Heartbeat, type ShardHandle } from "../cluster/index.ts";
import { Api } from "./api.ts";
import { waitingFor } from "./jetstreamReady.ts";
import { errEnvelope, okEnvelope, type Envelope } from "./envelope.ts";
import { RefusalLog } from "./refusals.ts";
import { childrenOf, createMetrics, type Metrics } from "./metrics.ts";
import { startHttp, type HttpServer } from "./http.ts";
import { DependencyHealth, type Dependency } from "./health.ts";
import { AlertDispatcher } from "./alerts.ts";

const NODE_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
/** How often a node reads the registered executors again (limits and `holds` registered through another node). */
const EXECUTORS_REFRESH_MS = 10_000;

export interface NodeOptions {
  config: AxConfig;
  nodeId?: string;
  httpPort?: number | null;
  clock?: Clock;
  logger?: Logger;
}

/**
 * One ax scheduler node: connections, schema, streams, the shard supervisor (leases, ring)
 * and the actors it starts, the DependencyActor, the API on NATS and HTTP.
 *
 * Lifecycle: starting → running → stopping (SIGTERM/SIGINT: stop firing, flush, release
 * leases, drain connections) → stopped.
 */
export class AxNode {
  readonly id: string;
  readonly config: AxConfig;
  readonly names: Names;
  readonly clock: Clock;
  readonly log: Logger;
  readonly metrics: Metrics;
  /** The run duration histogram's children, by label values (see childrenOf). */
  private readonly durationOf: (executor: string, outcome: string) => { observe(v: number): void };
  store!: Store;
  due!: DueIndex;
  nc!: NatsConnection;
  js!: JetStreamClient;
  api!: Api;
  supervisor!: ShardSupervisor;
  private persister!: Persister;
  private releaser: Releaser | null = null;
  private delivery!: DispatchDelivery;
  private limiter!: InFlightLimiter;
  private deps!: DependencyActor;
  private alerts!: AlertDispatcher;
  private nodeEvents: NodeEvents | null = null;
  private orphanTimer: NodeJS.Timeout | null = null;
  private streamTimer: NodeJS.Timeout | null = null;
  health: DependencyHealth | null = null;
  private actors = new Map<number, ShardActor>();
  private subs: Subscription[] = [];
  private http: HttpServer | null = null;
  private pruneTimer: NodeJS.Timeout | null = null;
  private executorsTimer: NodeJS.Timeout | null = null;
  /** Executors registered as holding runs received ahead of their due time (see Persister's holdsAhead). */
  private readonly holdingExecutors = new Set<string>();
  private readonly firedWindow = new RateWindow(5000, 100);
  private readonly refusals: RefusalLog;
  private readonly deadLog: RefusalLog;
  private dead!: DeadLetters;
  private shardCount = 0;
  private dispatchSecret: Buffer = Buffer.alloc(0);
  private stopped = false;

  constructor(private readonly opts: NodeOptions) {
    this.config = opts.config;
    this.id = opts.nodeId ?? `${hostname().replace(/[^A-Za-z0-9_-]/g, "-")}-${process.pid}`;
    // The id names NATS subjects and a durable consumer: no dots, wildcards or spaces.
    if (!NODE_ID_RE.test(this.id)) throw new InvalidInputError("id", this.id, "a node id is 1-64 letters, digits, _ or -");
    this.names = names(opts.config.namespace);
    this.clock = opts.clock ?? new SystemClock();
    this.log = (opts.logger ?? createLogger({ level: opts.config.logLevel })).child({ node: this.id, ns: opts.config.namespace });
    this.metrics = createMetrics();
    this.durationOf = childrenOf((executor, outcome) => this.metrics.duration.labels(executor, outcome));
    this.refusals = new RefusalLog(this.log, this.metrics.refused);
    // Once per consumer/cause a minute, with the count since: a flood of poison is one line.
    this.deadLog = new RefusalLog(this.log, this.metrics.deadLetters, 60_000, () => Date.now(), "message parked as a dead letter");
  }

  get httpAddress(): string | null { return this.http?.address ?? null; }
  /** What a start-up step against JetStream needs to wait (waitingFor). */
  private get ready() { return { clock: this.clock, log: this.log }; }
  ownedShards(): number[] { return this.supervisor.ownedShards(); }

  async start(): Promise<void> {
    try {
      await this.boot();
    } catch (e) {
      // Whatever was opened (pools, NATS, Redis, the HTTP port) is closed again, so a refused
      // start ends the process instead of leaving it hanging on open handles.
      await this.stop().catch(() => undefined);
      throw e;
    }
  }

  private async boot(): Promise<void> {
    const c = this.config;
    this.store = new Store({ pgUrl: c.pgUrl, schema: c.namespace, poolSize: 10 });
    const { applied } = await this.store.migrate();
    if (applied.length) this.log.info({ applied }, "schema migrated");
    this.shardCount = await this.store.initShardCount(c.shardCount);
    this.dispatchSecret = await this.store.dispatchSecret();
    if (this.shardCount !== c.shardCount) this.log.info({ shardCount: this.shardCount }, "cluster shard count was fixed at creation; using it");
    this.due = new DueIndex(c.redis, c.namespace);
    // A wrong mode (a cluster node given as single, say) is refused here, once, with the fix.
    await this.due.check();
    this.nc = await connectNats(c.nats, { name: `ax-node:${this.id}`, maxReconnectAttempts: -1 });
    this.js = jetstream(this.nc);
    // Watches the connection from the start (see EventCatchUp: an outage before the first shard
    // actor counts too); the node tells it when JetStream did not answer.
    const jetStreamTrouble = noteJetStreamTrouble(this.nc, this.clock);
    const jsm = await waitingFor("checking that JetStream is enabled", c.replicas, () => jetstreamManager(this.nc), this.ready);
    await waitingFor(`creating the streams ${this.names.dispatchStream} and ${this.names.eventsStream}`, c.replicas, () => ensureStreams(jsm, this.names, { replicas: c.replicas, reconcileReplicas: true, deadLetters: true }), this.ready);
    await waitingFor(`creating the ${this.shardCount * 2 + 1} shard consumers`, c.replicas, () => ensureShardConsumers(jsm, this.names, this.shardCount), this.ready);
    const bucket = new LeaseBucket({
      nc: this.nc, jsm, name: this.names.leaseBucket, ttlMs: c.leaseTtlMs, replicas: c.replicas, log: this.log,
      maxRecordedEpoch: async () => Math.max(0, ...(await this.store.listShards()).map((s) => s.epoch)),
    });
    await waitingFor(`creating the lease bucket ${this.names.leaseBucket}`, c.replicas, () => bucket.open(), this.ready);
    this.health = new DependencyHealth({
      store: this.store, redis: this.due.redis, nc: this.nc, jsm, clock: this.clock, log: this.log, metrics: this.metrics,
      // Back: start the shards that waited for it now rather than on the next heartbeat. Lost:
      // reconcile now (PostgreSQL lost while another node reaches it: the shards go there).
      // NATS down, or back: run timeouts wait until it has answered for a while (EventCatchUp),
      // so the executors' completions of the outage land first.
      onChange: (dep) => { if (dep === "nats") jetStreamTrouble(); this.supervisor?.kick(); },
    });
    this.health.start();
    this.dead = new DeadLetters({
      js: this.js, names: this.names, nodeId: this.id, log: this.log, maxDeliveries: c.deadAfter,
      healthy: () => Object.keys(this.failing()).length === 0,
      onParked: (consumer, cause, reason) => this.deadLog.note(`${consumer}/${cause}`, new Error(reason)),
    });
    // The bucket's max age is what really expires leases; it was fixed by the node that created
    // the bucket. Acting on a longer TTL than the bucket's would be unsafe: use the bucket's.
    const bucketTtlMs = (await bucket.kv.status()).ttl;
    const leaseTtlMs = bucketTtlMs > 0 ? bucketTtlMs : c.leaseTtlMs;
    if (leaseTtlMs !== c.leaseTtlMs) this.log.warn({ configured: c.leaseTtlMs, bucket: leaseTtlMs }, "AX_LEASE_TTL differs from the lease bucket's TTL; using the bucket's");
    // The releaser thread keeps time by the system clock: a node given another clock (a test's)
    // releases on its own thread.
    if (c.releaser === "thread" && Object.getPrototypeOf(this.clock) === SystemClock.prototype) {
      this.releaser = await Releaser.start({ nats: c.nats, name: `ax-node:${this.id}:releaser`, log: this.log });
    }
    this.persister = new Persister({
      store: this.store, log: this.log, js: this.js, names: this.names, nodeId: this.id, clock: this.clock,
      // A run is released only by a shard that is still this node's (not fenced, lease valid).
      mayRelease: (shard) => (!(this.actors.get(shard)?.releasable ?? false) ? "never" : this.supervisor.leaseValid(shard) ? "yes" : "wait"),
      releaser: this.releaser,
      onJetStreamTrouble: jetStreamTrouble,
      releasableForMs: (shard) => ((this.actors.get(shard)?.releasable ?? false) ? this.supervisor.leaseRemainingMs(shard) : 0),
      holdsAhead: (executor) => this.holdingExecutors.has(executor),
      // Core NATS, to every instance: the one holding a run (or receiving it later) drops it.
      revoke: (executor, runIds) => this.nc.publish(this.names.executorCancelSubject(executor), encode({ revoke: runIds })),
      clockStepped: (executor, stepMs) => this.nc.publish(this.names.executorCancelSubject(executor), encode({ clockStep: { node: this.id, ms: stepMs } })),
      onReleased: (runs, at, executor) => {
        // The labelled child is looked up (a key string built from the sorted labels) once per message, not per run.
        const lateness = this.metrics.lateness.labels({ executor });
        for (const r of runs) lateness.observe(Math.max(0, at - r.scheduledAt) / 1000);
      },
    });
    this.delivery = new DispatchDelivery({ jsm, names: this.names, clock: this.clock });
    this.limiter = new InFlightLimiter(c.maxInFlightPerExecutor, { max: c.maxAhead, holds: (executor) => this.holdingExecutors.has(executor) });
    this.noteExecutors(await this.store.listExecutors());

    this.http = this.opts.httpPort !== null && this.opts.httpPort !== undefined ? await startHttp(this, this.opts.httpPort, { host: c.httpHost, tokensFile: c.httpTokensFile, maxBodyBytes: c.limits.httpBodyBytes }) : null;
    this.supervisor = new ShardSupervisor({
      nodeId: this.id, httpAddress: this.http?.address ?? null, shardCount: this.shardCount, leaseTtlMs,
      heartbeatMs: c.heartbeatMs, nc: this.nc, bucket, store: this.store, names: this.names, clock: this.clock, log: this.log,
      startShard: (shard, epoch, opts) => this.startShard(shard, epoch, opts),
      load: () => this.load(),
      failing: () => this.failing(),
      onBucketReplaced: (createdHere) => { if (createdHere) this.metrics.recreated.inc({ asset: "leases" }); },
      onLease: (r) => {
        if (r === "lost") this.metrics.leasesLost.inc(); else this.metrics.leaseRenewals.inc({ result: r });
        // An unanswered renewal is JetStream not answering: timeouts wait for it to settle (EventCatchUp).
        if (r === "unanswered") jetStreamTrouble();
      },
      onRefused: (cause, e) => this.refusals.note(cause, e),
      controlKey: controlKey(this.dispatchSecret),
    });
    this.alerts = new AlertDispatcher({ hooks: this.store.alertHooks, nc: this.nc, log: this.log, metrics: this.metrics, clock: this.clock, namespace: c.namespace, node: this.id });
    this.wireMetricSources(jsm);
    this.api = new Api({
      store: this.store, due: this.due, nc: this.nc, names: this.names, clock: this.clock, shardCount: this.shardCount,
      supervisor: this.supervisor, nodeId: this.id, status: () => this.status(), nodes: () => this.nodes(),
      limits: { payloadBytes: c.limits.payloadBytes, payloadDepth: c.limits.payloadDepth }, defaultMaxInFlight: c.maxInFlightPerExecutor,
      taskWriteDeferMs: c.taskWriteDeferMs,
    });
    // The API: any node answers (queue group), so the CLI needs only a NATS URL.
    this.subs.push(this.nc.subscribe(this.names.apiSubject(">"), {
      queue: "ax-api",
      callback: (err, msg) => {
        if (err) return;
        const op = msg.subject.slice(this.names.apiSubject("").length);
        let args: Record<string, unknown> = {};
        try { args = msg.data.length ? JSON.parse(new TextDecoder().decode(msg.data)) : {}; } catch {
          this.reply(msg, errEnvelope(new InvalidInputError("body", undefined, "not JSON")));
          return;
        }
        const who = msg.headers?.get("Ax-Caller") || "nats";
        const skip = args !== null && typeof args === "object" && typeof args.skip === "number" && Number.isSafeInteger(args.skip) && args.skip > 0 ? args.skip : 0;
        if (skip) delete args.skip;
        this.api.call(op, args, { who }).then((v) => {
          if (op.startsWith("executor.register")) {
            this.noteExecutor((v as { name: string }).name, typeof args.maxInFlight === "number" ? args.maxInFlight : undefined, args.holds === true);
          }
          this.reply(msg, okEnvelope(v), op, args, skip);
        }, (e) => this.reply(msg, errEnvelope(e)));
      },
    }));
    // Events of the runs this node dispatches: the consumer exists before the first dispatch.
    this.nodeEvents = new NodeEvents({
      js: this.js, jsm, names: this.names, nodeId: this.id, clock: this.clock, log: this.log,
      sinkOf: (shard) => this.actors.get(shard), dead: this.dead,
      pullExpiresMs: Math.min(30_000, Math.max(1000, Math.floor(leaseTtlMs / 3))),
    });
    await this.nodeEvents.start();
    // Hand-over hints, rebalance plans and operator kicks are the supervisor's own subscriptions.
    this.deps = new DependencyActor({ store: this.store, js: this.js, names: this.names, log: this.log, dead: this.dead, onTrigger: (kind) => this.metrics.dependencyTriggers.inc({ kind }) });
    await this.deps.start();
    await this.supervisor.start();
    this.pruneTimer = setInterval(() => {
      void this.store.pruneRuns(this.clock.now() - c.retentionMs).then((n) => { if (n) this.log.info({ pruned: n }, "run history pruned"); }, () => undefined);
      void new LedgerStore(this.store.pool).prune(this.clock.now() - c.retentionMs).then((n) => { if (n) this.log.info({ pruned: n }, "ledger pruned"); }, () => undefined);
      // Message records serve re-publishing inside JetStream's 2-minute duplicate window only.
      void this.store.pruneDispatches(this.clock.now() - 600_000).catch(() => undefined);
    }, 60_000);
    this.pruneTimer.unref();
    // A registration is answered by one node; the others learn it here (its limit, whether it holds runs).
    this.executorsTimer = setInterval(() => { void this.store.listExecutors().then((list) => this.noteExecutors(list), () => undefined); }, EXECUTORS_REFRESH_MS);
    this.executorsTimer.unref();
    // Nodes that are gone may have left events behind; drained once this node has seen the
    // cluster for a while (a node that just started does not know who is alive yet).
    const since = this.clock.monotonic();
    this.orphanTimer = setInterval(() => {
      if (this.clock.monotonic() - since < Math.max(10_000, 5 * c.heartbeatMs)) return;
      const live = new Set(this.supervisor.liveMembers().map((m) => m.id));
      void this.nodeEvents?.drainOrphans(live).catch((e) => this.log.warn({ err: String(e) }, "draining the events of gone nodes failed"));
    }, 5_000);
    this.orphanTimer.unref();
    this.watchStreams(jsm);
    this.log.info({ http: this.http?.address ?? null, shards: this.shardCount }, "node started");
  }

  /**
   * Answers an API request. A reply over the server's max_payload would be refused by NATS (and
   * used to throw out of the callback and kill the node): a list is cut to the prefix that fits
   * and says where the rest starts (`next`), which AxClient follows page by page; anything else
   * that does not fit is an AX_E_TOO_LARGE refusal. Never throws.
   */
  private reply(msg: Msg, env: Envelope, op = "", args: Record<string, unknown> = {}, skip = 0): void {
    const max = (this.nc.info?.max_payload ?? 1024 * 1024) - 4096;
    try {
      let body = encode(env);
      if (env.ok && Array.isArray(env.value) && (skip || body.length > max)) {
        const list = (env.value as unknown[]).slice(skip);
        const at = (n: number) => encode({ ...env, value: list.slice(0, n) });
        let lo = 0; let hi = list.length; // largest n that fits
        const room = max - 256; // for the `next` cursor
        if (encode({ ...env, value: list }).length <= max) lo = hi;
        else while (lo < hi) { const mid = Math.ceil((lo + hi) / 2); if (at(mid).length <= room) lo = mid; else hi = mid - 1; }
        if (lo === 0 && list.length) throw new AxError("AX_E_TOO_LARGE", `${op}: one item is larger than the NATS max_payload (${max + 4096} bytes)`, { field: "op", value: op });
        const last = list[lo - 1] as { id?: unknown } | undefined;
        const next = lo >= list.length ? undefined
          : op === "task.ls" && typeof last?.id === "number" ? { after: last.id, ...(args.limit !== undefined ? { limit: Number(args.limit) - lo } : {}) }
            : { skip: skip + lo };
        body = encode({ ok: true, value: list.slice(0, lo), ...(next ? { next } : {}) });
      }
      if (body.length > max) throw new AxError("AX_E_TOO_LARGE", `the answer to ${op} is ${body.length} bytes, over the NATS max_payload; ask for less`, { field: "op", value: op });
      msg.respond(body);
    } catch (e) {
      this.refusals.note("api.reply", e);
      try { msg.respond(encode(errEnvelope(e instanceof AxError ? e : new AxError("AX_E_INTERNAL", "the answer could not be sent")))); } catch { /* the requester will time out */ }
    }
  }

  private async startShard(shard: number, epoch: number, opts: { afterFailure: boolean } = { afterFailure: false }): Promise<ShardHandle> {
    // Only this actor's own entry: a late callback must not remove the shard's next actor.
    const forget = () => { if (this.actors.get(shard) === actor) this.actors.delete(shard); this.metrics.shards.set(this.actors.size); };
    const actor: ShardActor = new ShardActor(shard, epoch, {
      nodeId: this.id, store: this.store, due: this.due, persister: this.persister, delivery: this.delivery, deliveryGraceMs: this.config.deliveryGraceMs, limiter: this.limiter, nc: this.nc, js: this.js,
      names: this.names, clock: this.clock, log: this.log, tickMs: this.config.tickMs, wheelSize: this.config.wheelSize, leadMs: this.config.leadMs,
      taskWriteDeferMs: this.config.taskWriteDeferMs, careful: opts.afterFailure,
      ...(this.config.spreadRate > 0 ? { perStep: this.perStep() } : {}),
      leaseValid: () => this.supervisor.leaseValid(shard), dispatchSecret: this.dispatchSecret, dead: this.dead,
      // A frozen owner's pulls run out before its lease can pass on (see ShardActorDeps).
      pullExpiresMs: Math.min(30_000, Math.max(1000, Math.floor(this.supervisor.leaseTtlMs / 3))),
      onFenced: () => { forget(); void this.supervisor.dropShard(shard, epoch); },
      events: {
        "run:fired": (e) => { this.metrics.firedTally.add(e.source, e.executor); this.firedWindow.add(this.clock.monotonic()); },
        "run:finished": (e) => {
          this.metrics.finishedTally.add(e.state, e.executor);
          if (e.durationMs !== null) this.durationOf(e.executor, e.state).observe(e.durationMs / 1000);
          if (e.final && e.state !== "success") {
            this.metrics.finalFailures.inc({ executor: e.executor });
            if (e.task !== null) this.alerts.notify({ kind: "failed", task: e.task, executor: e.executor, runId: e.runId, reason: `${e.state}: ${e.error ?? ""}`, atMs: this.clock.now() });
          }
        },
        "slot:missed": (e) => {
          this.metrics.skipped.inc({ executor: e.executor, reason: e.reason });
          this.alerts.notify({ kind: "missed", task: e.task, executor: e.executor, runId: e.runId, reason: e.detail, atMs: this.clock.now() });
        },
        "task:upstreamFailed": (e) => {
          this.metrics.upstreamFailed.inc({ executor: e.executor });
          this.alerts.notify({ kind: "upstream_failed", task: e.task, executor: e.executor, runId: e.upstreamRun, reason: e.reason, atMs: this.clock.now() });
        },
        "task:stuck": () => this.metrics.stuck.inc(),
        "slots:accounted": (e) => this.metrics.slots.inc({ outcome: e.outcome }, e.count),
      },
    });
    // Registered before it starts: start() ends with the actor active, its wheel and refill running
    // and its consumers being bound, and the rounds it runs meanwhile (the misfire catch-ups of a
    // shard loaded after an outage) are released only if mayRelease finds it here. Unregistered,
    // they were dropped as "never" while the actor kept the shard: recorded `running`, never
    // published, timed out.
    this.actors.set(shard, actor);
    this.metrics.shards.set(this.actors.size);
    try {
      await actor.start();
    } catch (e) {
      actor.fence(`start failed: ${String(e)}`); // a half-started actor must not keep timers running without a shard
      forget();
      throw e;
    }
    const sub = this.nc.subscribe(this.names.shardSubject(shard, "cmd"), {
      callback: (err, msg) => {
        if (err) return;
        let cmd: ShardCommand;
        try { cmd = JSON.parse(new TextDecoder().decode(msg.data)) as ShardCommand; } catch { this.refusals.note("shard.cmd", new Error("not JSON")); return; }
        // `null`, a number or an object without a type never reaches the actor (each used to restart the shard).
        if (cmd === null || typeof cmd !== "object" || typeof (cmd as { type?: unknown }).type !== "string") {
          this.refusals.note("shard.cmd", new Error(`not a command: ${JSON.stringify(cmd)?.slice(0, 64)}`));
          try { msg.respond(encode({ ok: false, error: { code: "AX_E_INVALID", message: "not a shard command", field: "type" } })); } catch { /* no reply subject */ }
          return;
        }
        // A connection closing under the reply (the node stopping) throws: not worth ending the process.
        void actor.command(cmd).then((r) => { try { msg.respond(JSON.stringify(r)); } catch { /* closing */ } });
      },
    });
    return {
      shard, epoch,
      stop: async () => { sub.unsubscribe(); await actor.stop(); forget(); },
      fence: (reason) => { sub.unsubscribe(); actor.fence(reason); forget(); },
    };
  }

  /**
   * A shard's share of AX_SPREAD_RATE on one step of the decision grid, as if this node owned
   * every shard: with more nodes a burst is spread earlier than it need be, never later.
   */
  private perStep(): number {
    return Math.max(1, Math.ceil((this.config.spreadRate * DECIDE_STEP_MS) / 1000 / Math.max(1, this.shardCount)));
  }

  /** Takes in the registered executors: each one's in-flight limit, and whether its runs may go out ahead of their due time. */
  private noteExecutors(list: ReadonlyArray<{ name: string; maxInFlight: number | null; holds: boolean }>): void {
    for (const e of list) this.noteExecutor(e.name, e.maxInFlight, e.holds);
  }
  /**
   * One executor's registration or stored row. `maxInFlight`: its own limit; null (a row without
   * one): the node's AX_MAX_IN_FLIGHT; undefined (a registration that names none): unchanged,
   * since a limit another instance registered stays (see upsertExecutor).
   */
  private noteExecutor(name: string, maxInFlight: number | null | undefined, holds: boolean): void {
    if (maxInFlight !== undefined) this.limiter.setLimit(name, maxInFlight);
    if (holds) this.holdingExecutors.add(name); else this.holdingExecutors.delete(name);
  }

  /**
   * The streams deleted under a running node (an operator's mistake, a client with too broad
   * permissions) are created again, with the consumers the node and the executors read through:
   * the shard consumers and the DependencyActor's, one per known executor (with the default ack
   * wait; an executor that starts later sets its own). The loops that read the old consumers end
   * (shard actors restart and load again, NodeEvents re-creates its own); the executors' pulls
   * find the new durables. Messages that were in the deleted stream are gone: their runs time
   * out and follow their retry policy. Checked as often as the lease bucket.
   */
  private watchStreams(jsm: Awaited<ReturnType<typeof jetstreamManager>>): void {
    let checking = false; let failingLogged = false;
    this.streamTimer = setInterval(() => {
      if (checking || this.stopped) return;
      checking = true;
      void (async () => {
        const missing = await missingStreams(jsm, this.names);
        if (!missing.length) return;
        this.log.warn({ missing }, "JetStream streams missing: creating them and their consumers again");
        await ensureStreams(jsm, this.names, { replicas: this.config.replicas, deadLetters: true });
        await ensureShardConsumers(jsm, this.names, this.shardCount);
        for (const e of await this.store.listExecutors()) await ensureExecutorConsumer(jsm, this.names, e.name);
        for (const s of missing) this.metrics.recreated.inc({ asset: s === this.names.dispatchStream ? "dispatch" : s === this.names.eventsStream ? "events" : "dead" });
        this.log.warn({ recreated: missing }, "JetStream streams created again");
      })().then(() => { failingLogged = false; }, (e) => {
        if (!failingLogged) this.log.warn({ err: String(e) }, "could not check or recreate the JetStream streams; retrying");
        failingLogged = true;
      }).finally(() => { checking = false; });
    }, 1000);
    this.streamTimer.unref();
  }

  /** The per-scrape gauges of /metrics (see MetricSources). */
  private wireMetricSources(jsm: Awaited<ReturnType<typeof jetstreamManager>>): void {
    const src = this.metrics.sources;
    src.inFlightByExecutor = () => this.limiter.byExecutor();
    src.shardLagMs = () => this.maxLagMs();
    src.unownedShards = () => {
      const owned = new Set<number>(this.ownedShards());
      for (const m of this.supervisor.liveMembers()) for (const s of m.shards) owned.add(s);
      return this.shardCount - owned.size;
    };
    // PostgreSQL and JetStream are asked at most every 5 s whatever the scrape rate.
    let execCache: { at: number; v: Array<{ name: string; lastSeenMs: number | null }> } | null = null;
    src.executorsSeen = async () => {
      if (!execCache || this.clock.monotonic() - execCache.at > 5000) execCache = { at: this.clock.monotonic(), v: await this.store.listExecutors() };
      return execCache.v;
    };
    let queueCache: { at: number; v: Promise<Map<string, { pending: number; ackPending: number }>> } | null = null;
    src.executorQueues = () => {
      if (queueCache && this.clock.monotonic() - queueCache.at < 5000) return queueCache.v;
      const v = (async () => {
        const out = new Map<string, { pending: number; ackPending: number }>();
        for (const e of await src.executorsSeen!()) {
          const info = await jsm.consumers.info(this.names.dispatchStream, this.names.executorConsumer(e.name)).catch(() => null);
          if (info) out.set(e.name, { pending: info.num_pending, ackPending: info.num_ack_pending });
        }
        return out;
      })();
      queueCache = { at: this.clock.monotonic(), v };
      v.catch(() => { queueCache = null; });
      return v;
    };
  }

  private firedPerSec(): number {
    return Math.round(this.firedWindow.perSecond(this.clock.monotonic()) * 10) / 10;
  }
  private maxLagMs(): number {
    let m = 0; for (const a of this.actors.values()) m = Math.max(m, a.stats.lastLateMs); return Math.round(m);
  }

  /** Dependencies this node cannot reach right now, with the reason each failed. */
  failing(): Partial<Record<Dependency, string>> { return this.health?.failing() ?? {}; }

  /**
   * Ready = alive, not stopping, past joining, owning every shard the assignment gives it
   * (or none to own), and PostgreSQL, Redis and NATS reachable. `reasons` says what is not.
   */
  readiness(): { ready: boolean; reasons: string[] } {
    const reasons: string[] = [];
    if (this.stopped) reasons.push("stopping");
    for (const [d, why] of Object.entries(this.failing())) reasons.push(`${d} unreachable: ${why}`);
    const sup = this.supervisor as ShardSupervisor | undefined;
    if (!sup) reasons.push("starting");
    else if (sup.joining()) reasons.push("joining the cluster");
    else {
      const missing = sup.unownedAssigned();
      if (missing.length) reasons.push(`${missing.length} assigned shard(s) not running yet: ${missing.slice(0, 10).join(", ")}${missing.length > 10 ? ", …" : ""}`);
    }
    return { ready: reasons.length === 0, reasons };
  }

  /** The counters of the shard actors running here, summed (fired, finished, waited, …). */
  private shardTotals(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const a of this.actors.values()) for (const [k, v] of Object.entries(a.stats)) if (!k.endsWith("LateMs")) out[k] = (out[k] ?? 0) + v;
    return out;
  }

  /** What this node's heartbeat says of its load (and its status, of itself). */
  private load(): { firedPerSec: number; inFlight: number; lagMs: number; byExecutor: Record<string, number> } {
    return { firedPerSec: this.firedPerSec(), inFlight: this.limiter.inFlight(), lagMs: this.maxLagMs(), byExecutor: Object.fromEntries(this.limiter.byExecutor()) };
  }

  /** This node and the live members, as their heartbeats describe them (no query). */
  private nodes(): Array<{ id: string; http: string | null; shards: number[]; load: Heartbeat["load"]; failing: Record<string, string> }> {
    const self = { id: this.id, http: this.httpAddress, shards: this.ownedShards(), load: this.load(), failing: this.failing() };
    return [self, ...this.supervisor.liveMembers().filter((m) => m.id !== this.id).map((m) => ({ id: m.id, http: m.http, shards: m.shards, load: m.load, failing: m.failing ?? {} }))];
  }

  async status(): Promise<unknown> {
    const nodes = this.nodes();
    // Without PostgreSQL the status still answers (which node fails what is the point of asking
    // then); the counts it cannot read are null.
    const fromPg = await (async () => {
      const shards = await this.store.listShards();
      // Liveness from the instances' heartbeats (ops/runOps.ts): a dead executor is flagged.
      const executors = await this.api.runOps.executorLiveness();
      const { tasks, running } = await this.store.taskCounts();
      const drained = await this.store.drainedNodes();
      return { shards: shards.map((s) => s.shard), executors, tasks, running, drained };
    })().catch(() => null);
    const shardIds = fromPg?.shards ?? Array.from({ length: this.shardCount }, (_, i) => i);
    return {
      namespace: this.config.namespace, shardCount: this.shardCount, nodes, drained: fromPg?.drained ?? [],
      unowned: shardIds.filter((s) => !nodes.some((n) => n.shards.includes(s))),
      tasks: fromPg?.tasks ?? null, running: fromPg?.running ?? null, executors: fromPg?.executors ?? [],
      firedPerSec: nodes.reduce((n, x) => n + x.load.firedPerSec, 0),
      persister: this.persister.stats,
      releaser: this.releaser?.stats ?? null,
      // Runs holding a place at their executors and tasks queued for one (a pinned inFlight with
      // a growing queue is the in-flight bound limiting the rate), and the shards' counters summed.
      limiter: { inFlight: this.limiter.inFlight(), waiting: this.limiter.waiting(), ahead: this.limiter.ahead(), limits: this.limiter.limitsByExecutor() },
      shardTotals: this.shardTotals(),
      events: this.nodeEvents?.stats ?? null,
    };
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.log.info("node stopping: no new fires, flushing, releasing leases");
    if (this.pruneTimer) clearInterval(this.pruneTimer);
    if (this.executorsTimer) clearInterval(this.executorsTimer);
    if (this.orphanTimer) clearInterval(this.orphanTimer);
    if (this.streamTimer) clearInterval(this.streamTimer);
    this.health?.stop();
    // As on the node's thread (leaseValid is false from here on), the releaser thread releases
    // nothing more: runs written ahead stay recorded for the shards' next owners.
    for (const s of this.supervisor?.ownedShards() ?? []) this.persister?.revoke(s);
    await this.supervisor?.stop().catch((e) => this.log.error({ err: String(e) }, "supervisor stop failed"));
    this.persister?.close();
    await this.releaser?.close();
    await this.nodeEvents?.stop();
    await this.deps?.stop();
    for (const s of this.subs) s.unsubscribe();
    await this.http?.close();
    await this.nc?.drain().catch(() => undefined);
    await this.due?.close();
    await this.store?.close();
    this.log.info("node stopped");
  }
}
