import { parentPort, workerData } from "node:worker_threads";
import { jetstream } from "@nats-io/jetstream";
import type { NatsSettings } from "../../common/index.ts";
import { connectNats } from "../../common/index.ts";
import { HELD, TAKEN, sharedMonotonicMs, type FromReleaser, type ToReleaser } from "./shared.ts";

/**
 * The releaser thread: publishes dispatch messages the node recorded ahead of their due time, at
 * that time. It has its own event loop, heap and NATS connection, so a pause of the node's thread
 * (a young-generation collection of 20–30 ms at thousands of runs a second) does not delay a
 * release. It decides nothing: a message whose slot the node recalled is dropped, and one whose
 * leases it cannot confirm is handed back unpublished (see Releaser).
 */

interface Init { nats: NatsSettings; name: string; slots: SharedArrayBuffer; revocations: SharedArrayBuffer }

const port = parentPort!;
const init = workerData as Init;
const slots = new Int32Array(init.slots);
const revocations = new Int32Array(init.revocations);
const post = (m: FromReleaser) => port.postMessage(m);

type Hold = Extract<ToReleaser, { t: "hold" }>;

/** Published at its release time, if its slot is still held and its leases still valid. */
function release(h: Hold): void {
  const left = h.releaseAt - Date.now();
  // Checked again when the timer fires: a timer may fire before a wall-clock step forward catches up.
  if (left > 0) { setTimeout(release, left, h); return; }
  if (Atomics.compareExchange(slots, h.slot, HELD, TAKEN) !== HELD) { post({ t: "recalled", slot: h.slot }); return; }
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
    if (m.t === "hold") release(m);
    else { void nc.drain().finally(() => port.close()); }
  });
  post({ t: "ready" });
} catch (e) {
  post({ t: "failed-to-start", error: String((e as Error)?.message ?? e) });
}
