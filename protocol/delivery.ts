import type { JetStreamManager } from "@nats-io/jetstream";
import type { Clock, Names } from "../common/index.ts";

/**
 * Has the executors' consumer handed out the dispatch message at stream sequence `seq`?
 * - "delivered": it has (to some instance; a run it started says so itself);
 * - "undelivered": not yet, or JetStream did not answer (a stream or consumer leader being
 *   elected answers nothing; the message cannot be delivered meanwhile either);
 * - "ask": nothing known from after `notBefore`: call `ask`, which calls back once it knows.
 */
export interface DeliveryView {
  status(executor: string, seq: number, notBefore: number): "delivered" | "undelivered" | "ask";
  ask(executor: string, then: () => void): void;
}

/**
 * The dispatch consumers' delivery progress, one consumer-info request per executor at a time
 * (however many runs wait on it), kept with the moment it was asked.
 *
 * Why: a run's timeout counts from its dispatch's landing in the stream. When delivery from the
 * stream stalls (the consumer's leader killed: a new one is elected, and the pulls the dead one
 * held are issued again) a run can sit in the stream past its timeout without any executor
 * having seen it, and timing it out then fails (without retries, loses) a run that never had its
 * chance. A shard asks here before timing out a run no executor reported starting.
 */
export class DispatchDelivery implements DeliveryView {
  /** Per executor: the consumer's last delivered stream sequence (null: no answer), and when it was asked. */
  private readonly known = new Map<string, { askedAt: number; deliveredSeq: number | null }>();
  private readonly asking = new Map<string, Array<() => void>>();
  constructor(private readonly d: { jsm: JetStreamManager; names: Names; clock: Pick<Clock, "now">; timeoutMs?: number }) {}

  status(executor: string, seq: number, notBefore: number): "delivered" | "undelivered" | "ask" {
    const k = this.known.get(executor);
    if (!k || k.askedAt < notBefore) return "ask";
    return k.deliveredSeq !== null && k.deliveredSeq >= seq ? "delivered" : "undelivered";
  }

  ask(executor: string, then: () => void): void {
    const waiting = this.asking.get(executor);
    if (waiting) { waiting.push(then); return; }
    const waiters = [then];
    this.asking.set(executor, waiters);
    const askedAt = this.d.clock.now();
    const info = this.d.jsm.consumers.info(this.d.names.dispatchStream, this.d.names.executorConsumer(executor));
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<null>((r) => { timer = setTimeout(() => r(null), this.d.timeoutMs ?? 2000); timer.unref?.(); });
    void Promise.race([info.then((ci) => ci.delivered.stream_seq, () => null), timeout]).then((deliveredSeq) => {
      clearTimeout(timer);
      this.known.set(executor, { askedAt, deliveredSeq });
      this.asking.delete(executor);
      for (const f of waiters) f();
    });
  }
}
