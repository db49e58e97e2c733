import type { NatsConnection } from "@nats-io/transport-node";
import type { JetStreamManager } from "@nats-io/jetstream";
import type { Cluster, Redis } from "ioredis";
import type { Store } from "../actors/index.ts";
import type { Clock, Logger } from "../common/index.ts";
import type { Metrics } from "./metrics.ts";

export type Dependency = "postgres" | "redis" | "nats";
export const DEPENDENCIES: readonly Dependency[] = ["postgres", "redis", "nats"];

interface DepState { up: boolean; reason: string | null; sinceMono: number; timeouts: number; probing: boolean }

export interface DependencyHealthOptions {
  /** PostgreSQL is probed through the store. */
  store: Pick<Store, "ping">;
  redis: Redis | Cluster;
  nc: NatsConnection;
  jsm: JetStreamManager;
  clock: Clock;
  log: Logger;
  metrics: Metrics;
  /** Probe period while a dependency answers. */
  intervalMs?: number;
  /** Probe period while it does not: short, so firing resumes soon after the server is back. */
  downIntervalMs?: number;
  /** A probe not answered in this time counts as a failure. */
  probeTimeoutMs?: number;
  /** Called on every up/down transition. */
  onChange?: (dep: Dependency, up: boolean) => void;
}

class ProbeTimeout extends Error {}

function within<T>(p: Promise<T>, ms: number, clock: Clock): Promise<T> {
  return new Promise((resolve, reject) => {
    const t = clock.setTimeout(() => reject(new ProbeTimeout(`no answer in ${ms}ms`)), ms);
    p.then((v) => { clock.clearTimeout(t); resolve(v); }, (e) => { clock.clearTimeout(t); reject(e); });
  });
}

/**
 * Whether this node can reach PostgreSQL, Redis and NATS/JetStream, probed on its own timers
 * (one cheap round-trip each). An outage is one `dependency:down` line when it starts and one
 * `dependency:up` line (with its length) when it ends, plus `ax_dependency_outages_total` and
 * `ax_dependency_up`: never a line per failed query. A refused connection counts at once; a
 * probe that merely times out counts on the second in a row, so one slow answer on a busy
 * machine does not take the node out of readiness. Connection events (NATS disconnect or
 * reconnect, Redis ready or close) trigger a probe at once instead of waiting for the timer.
 */
export class DependencyHealth {
  private readonly deps = new Map<Dependency, DepState>();
  private readonly timers = new Map<Dependency, ReturnType<Clock["setTimeout"]>>();
  private stopped = false;
  private readonly intervalMs: number;
  private readonly downIntervalMs: number;
  private readonly timeoutMs: number;
  private readonly onRedisEvent = () => this.probeSoon("redis");

  constructor(private readonly o: DependencyHealthOptions) {
    this.intervalMs = o.intervalMs ?? 1000;
    this.downIntervalMs = o.downIntervalMs ?? 250;
    this.timeoutMs = o.probeTimeoutMs ?? 2000;
    for (const d of DEPENDENCIES) {
      this.deps.set(d, { up: true, reason: null, sinceMono: o.clock.monotonic(), timeouts: 0, probing: false });
      o.metrics.dependencyUp.set({ dependency: d }, 1);
    }
  }

  start(): void {
    for (const d of DEPENDENCIES) this.schedule(d, this.intervalMs);
    this.o.redis.on("ready", this.onRedisEvent);
    this.o.redis.on("close", this.onRedisEvent);
    void (async () => {
      for await (const s of this.o.nc.status()) {
        if (this.stopped) return;
        // The client knows it lost the server: that is the outage's start (a probe would only
        // time out, its request buffered until the reconnect).
        if (s.type === "disconnect") { const d = this.deps.get("nats")!; if (d.up) this.transition("nats", d, false, `disconnected from ${String(s.server ?? "the server")}`); }
        if (s.type === "disconnect" || s.type === "reconnect") this.probeSoon("nats");
      }
    })().catch(() => undefined);
  }

  stop(): void {
    this.stopped = true;
    for (const t of this.timers.values()) this.o.clock.clearTimeout(t);
    this.timers.clear();
    this.o.redis.off("ready", this.onRedisEvent);
    this.o.redis.off("close", this.onRedisEvent);
  }

  isUp(d: Dependency): boolean { return this.deps.get(d)!.up; }

  /** Failing dependencies with the reason each failed (empty when all answer). */
  failing(): Partial<Record<Dependency, string>> {
    const out: Partial<Record<Dependency, string>> = {};
    for (const [d, s] of this.deps) if (!s.up) out[d] = s.reason ?? "unreachable";
    return out;
  }

  private schedule(d: Dependency, ms: number): void {
    if (this.stopped) return;
    const old = this.timers.get(d);
    if (old) this.o.clock.clearTimeout(old);
    this.timers.set(d, this.o.clock.setTimeout(() => { this.timers.delete(d); void this.probe(d); }, ms));
  }

  private probeSoon(d: Dependency): void { if (!this.deps.get(d)!.probing) this.schedule(d, 0); }

  private ask(d: Dependency): Promise<unknown> {
    switch (d) {
      case "postgres": return this.o.store.ping();
      case "redis": return this.o.redis.ping();
      // JetStream, not only the connection: a server up without its JetStream (or without a
      // quorum for the namespace's streams) fires nothing either.
      case "nats": return this.o.nc.isClosed() ? Promise.reject(new Error("connection closed")) : this.o.jsm.getAccountInfo();
    }
  }

  async probe(d: Dependency): Promise<void> {
    const s = this.deps.get(d)!;
    if (s.probing || this.stopped) return;
    s.probing = true;
    try {
      await within(this.ask(d), this.timeoutMs, this.o.clock);
      s.timeouts = 0;
      if (!s.up) this.transition(d, s, true, null);
    } catch (e) {
      const timedOut = e instanceof ProbeTimeout || /timeout/i.test(String((e as Error)?.message ?? e));
      s.timeouts = timedOut ? s.timeouts + 1 : 0;
      const reason = String((e as Error)?.message ?? e).slice(0, 300) || "unreachable";
      if (s.up && (!timedOut || s.timeouts >= 2)) this.transition(d, s, false, reason);
      else if (!s.up) s.reason = reason;
    } finally {
      s.probing = false;
      if (!this.stopped && !this.timers.has(d)) this.schedule(d, s.up ? this.intervalMs : this.downIntervalMs);
    }
  }

  private transition(d: Dependency, s: DepState, up: boolean, reason: string | null): void {
    const now = this.o.clock.monotonic();
    const forMs = Math.round(now - s.sinceMono);
    s.up = up; s.reason = reason; s.sinceMono = now;
    this.o.metrics.dependencyUp.set({ dependency: d }, up ? 1 : 0);
    if (up) this.o.log.warn({ dependency: d, downMs: forMs }, "dependency:up");
    else {
      this.o.metrics.dependencyOutages.inc({ dependency: d });
      this.o.log.error({ dependency: d, reason }, "dependency:down");
    }
    this.o.onChange?.(d, up);
  }
}
