import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { z } from "zod";
import { decode, encode } from "../protocol/index.ts";
import type { Clock, Logger, Names } from "../common/index.ts";

export const HeartbeatSchema = z.object({
  v: z.literal(1),
  id: z.string().min(1).max(256),
  http: z.string().max(1024).nullable(),
  startedAt: z.number(),
  shards: z.array(z.number().int()).max(65_536),
  load: z.object({
    firedPerSec: z.number(), inFlight: z.number(), lagMs: z.number(),
    /** Places held at each executor (runs dispatched and not ended, places reserved): the dashboard's "in flight". Absent from older nodes. */
    byExecutor: z.record(z.string().max(256), z.number().int().nonnegative()).optional(),
  }),
  stopping: z.boolean(),
  /** False while the node is joining (it owns nothing yet and others hold hand-overs to it back); absent = ready. */
  ready: z.boolean().optional(),
  /** Dependencies this node cannot reach, with the reason (absent or empty = all reachable). */
  failing: z.record(z.string().max(64), z.string().max(1024)).optional(),
});

/** Bounds on heartbeats: a larger one, or a new member beyond MAX_MEMBERS, is refused. */
export const HEARTBEAT_LIMITS = { bytes: 512 * 1024, members: 1024 };
export type Heartbeat = z.infer<typeof HeartbeatSchema>;

export interface Member extends Heartbeat { lastSeenMono: number }

/**
 * Membership over core NATS: every node publishes a heartbeat each `intervalMs`; a member
 * not heard from for `deadAfterMissed` intervals is dead. Seen-times are monotonic, so a wall
 * clock step never kills or revives anyone. A stopping node says so in its last heartbeat
 * and is dropped at once. `onChange` fires when a member appears, leaves, or becomes ready.
 */
export class Membership {
  private members = new Map<string, Member>();
  private sub: Subscription | null = null;
  constructor(
    private readonly nc: NatsConnection,
    private readonly n: Names,
    private readonly clock: Clock,
    private readonly log: Logger,
    private readonly intervalMs: number,
    private readonly deadAfterMissed = 3,
    private readonly onRefused: (cause: string, e: Error) => void = (cause, e) => log.warn({ cause, reason: e.message }, "heartbeat refused"),
  ) {}

  start(onChange: () => void): void {
    this.sub = this.nc.subscribe(this.n.heartbeatSubject, {
      callback: (err, msg) => {
        if (err) return;
        if (msg.data.length > HEARTBEAT_LIMITS.bytes) { this.onRefused("heartbeat", new Error(`${msg.data.length} bytes (at most ${HEARTBEAT_LIMITS.bytes})`)); return; }
        const d = decode(HeartbeatSchema, msg.data);
        if (!d.ok) { this.onRefused("heartbeat", new Error(d.reason)); return; }
        const prev = this.members.get(d.value.id);
        if (!prev && !d.value.stopping && this.members.size >= HEARTBEAT_LIMITS.members) {
          this.sweep();
          if (this.members.size >= HEARTBEAT_LIMITS.members) { this.onRefused("heartbeat", new Error(`${this.members.size} members (at most ${HEARTBEAT_LIMITS.members})`)); return; }
        }
        if (d.value.stopping) {
          if (this.members.delete(d.value.id)) onChange();
          return;
        }
        this.members.set(d.value.id, { ...d.value, lastSeenMono: this.clock.monotonic() });
        if (!prev || (prev.ready !== false) !== (d.value.ready !== false)) onChange();
      },
    });
  }

  publish(hb: Heartbeat): void { this.nc.publish(this.n.heartbeatSubject, encode(hb)); }

  /** Drops members not heard from in time; returns the ids that died. */
  sweep(): string[] {
    const dead: string[] = [];
    const limit = this.intervalMs * this.deadAfterMissed;
    for (const [id, m] of this.members) if (this.clock.monotonic() - m.lastSeenMono > limit) { this.members.delete(id); dead.push(id); }
    return dead;
  }

  /** Counts everyone as just heard from (after this process was paused, nobody's silence is known). */
  touchAll(): void { const now = this.clock.monotonic(); for (const m of this.members.values()) m.lastSeenMono = now; }

  live(): Member[] { return [...this.members.values()].sort((a, b) => (a.id < b.id ? -1 : 1)); }
  get(id: string): Member | undefined { return this.members.get(id); }
  stop(): void { this.sub?.unsubscribe(); this.sub = null; }
}
