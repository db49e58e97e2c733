import type { NatsConnection } from "@nats-io/transport-node";

/**
 * The publishes of the last few seconds, kept so they can be published again after the
 * connection comes back.
 *
 * Why: nats-server 2.9.10 with an interest-retention stream on file storage loses messages it
 * stored in the last milliseconds before a clean shutdown (SIGTERM) whenever one of their
 * consumers had delivered messages not yet acked at that moment: the publisher got its ack, and
 * after the restart the messages are gone from the stream without having been delivered (the
 * stream continues at the next sequence; the unacked ones before them are redelivered as they
 * should be). Limits and work-queue streams keep them. `scripts/nats-interest-restart.ts`
 * reproduces it against the installed nats-server. For ax this lost executors' completions
 * (the events stream is interest-retention): the run was recorded `timed_out` though it had
 * succeeded, and retried.
 *
 * What to do about it: publish again, under the SAME message ids, what was published shortly
 * before the connection dropped. JetStream's duplicate window (2 min on ax's streams) drops the
 * copy of every message the server still holds (it answers `duplicate`) and stores the ones it
 * lost. A message that was already consumed, and so removed from the interest stream, is
 * forgotten by a restarted server's duplicate table too and is delivered a second time: its
 * readers take that (events are applied once per run id; a run that has its outcome keeps it).
 * The window (3 s) is far wider than the loss seen (the last ~20 ms before the stop).
 */
export interface RecentPublish { atMs: number; subject: string; data: Uint8Array; msgID: string }

export class RecentPublishes {
  private entries: RecentPublish[] = [];
  private head = 0;
  private bytes = 0;
  private readonly windowMs: number;
  private readonly maxBytes: number;
  private readonly now: () => number;

  constructor(opts: { windowMs?: number; maxBytes?: number; now?: () => number } = {}) {
    this.windowMs = opts.windowMs ?? 3000;
    this.maxBytes = opts.maxBytes ?? 8 * 1024 * 1024;
    this.now = opts.now ?? Date.now;
  }

  /** Remembers a publish JetStream acknowledged. */
  note(subject: string, data: Uint8Array, msgID: string): void {
    const atMs = this.now();
    this.entries.push({ atMs, subject, data, msgID });
    this.bytes += data.length;
    this.prune(atMs);
  }

  /** The publishes of the window before now, oldest first (taken when the connection drops). */
  takeRecent(): RecentPublish[] {
    this.prune(this.now());
    const out = this.entries.slice(this.head);
    this.entries = []; this.head = 0; this.bytes = 0;
    return out;
  }

  get size(): number { return this.entries.length - this.head; }

  private prune(nowMs: number): void {
    while (this.head < this.entries.length) {
      const e = this.entries[this.head]!;
      if (e.atMs >= nowMs - this.windowMs && this.bytes <= this.maxBytes) break;
      this.bytes -= e.data.length;
      this.head++;
    }
    // Compacted now and then, not on every shift (an array shift is O(n)).
    if (this.head > 1024 && this.head * 2 > this.entries.length) { this.entries = this.entries.slice(this.head); this.head = 0; }
  }
}

/**
 * Calls `onDisconnect` when `nc` loses its server and `onReconnect` when it is back (from the
 * connection's status events). Returns a function that stops watching.
 */
export function watchReconnects(nc: NatsConnection, onDisconnect: () => void, onReconnect: () => void): () => void {
  const status = nc.status();
  void (async () => {
    for await (const s of status) {
      if (s.type === "disconnect") onDisconnect();
      else if (s.type === "reconnect") onReconnect();
    }
  })().catch(() => undefined);
  return () => { (status as { stop?: () => void }).stop?.(); };
}
