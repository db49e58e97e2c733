import { parentPort, workerData } from "node:worker_threads";
import { jetstream } from "@nats-io/jetstream";
import { connectNats, type NatsSettings } from "../../common/index.ts";
import { BACKSTOP_MS, FREE, HELD, TAKEN, sharedMonotonicMs, type FromReleaser, type Hold, type ToReleaser } from "./shared.ts";

/**
 * The releaser thread: the backstop of the node's release timers. Each message the node recorded
 * ahead of its due time is handed here too; at BACKSTOP_MS past its release time, if the node has
 * not claimed it (its own timer was held up, typically by a young-generation collection), this
 * thread publishes it, from its own event loop, heap and NATS connection. It decides nothing: a
 * message whose leases it cannot confirm goes back to the node unpublished (see Releaser).
 */

interface Init { nats: NatsSettings; name: string; slots: SharedArrayBuffer; revocations: SharedArrayBuffer }

const port = parentPort!;
const init = workerData as Init;
const slots = new Int32Array(init.slots);
const revocations = new Int32Array(init.revocations);
const post = (m: FromReleaser) => port.postMessage(m);

/** At the backstop time: published if the node has not claimed it and its leases still hold. */
function backstop(h: Hold): void {
  const left = h.releaseAt + BACKSTOP_MS - Date.now();
  // Checked again when the timer fires: a timer may fire before a wall-clock step forward catches up.
  if (left > 0) { setTimeout(backstop, left, h); return; }
  if (Atomics.compareExchange(slots, h.slot, HELD, TAKEN) !== HELD) {
    Atomics.store(slots, h.slot, FREE); // claimed by the node, which is done with it; nothing else touches it here
    return;
  }
  const reason = refusal(h);
  if (reason) { post({ t: "returned", slot: h.slot, reason }); return; }
  js.publish(h.subject, h.data, { msgID: h.msgID, timeout: 2000 }).then(
    (ack) => post({ t: "landed", slot: h.slot, seq: ack.seq, atMs: Date.now() }),
    (e: unknown) => post({ t: "failed", slot: h.slot, error: String(e) }));
}

/** Why the message cannot be published from here now (null: it can). */
function refusal(h: Hold): string | null {
  if (sharedMonotonicMs() >= h.validUntil) return "a lease was not confirmed in time";
  for (let i = 0; i < h.shards.length; i++) if (Atomics.load(revocations, h.shards[i]!) !== h.revocations[i]) return `shard ${h.shards[i]} is no longer released here`;
  return null;
}

let js: ReturnType<typeof jetstream>;
try {
  const nc = await connectNats(init.nats, { name: init.name, maxReconnectAttempts: -1 });
  js = jetstream(nc);
  port.on("message", (m: ToReleaser) => {
    if (m.t === "hold") for (const h of m.holds) backstop(h);
    else { void nc.drain().finally(() => port.close()); }
  });
  post({ t: "ready" });
} catch (e) {
  post({ t: "failed-to-start", error: String((e as Error)?.message ?? e) });
}
