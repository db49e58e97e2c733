import { AxError, type Clock, type Logger } from "../common/index.ts";

/** How long a starting node keeps asking JetStream before it gives up and exits. */
export const JETSTREAM_PATIENCE_MS = 60_000;
const RETRY_EVERY_MS = 1000;

/** JetStream's answers that may change while the node waits: no answer yet, or a cluster still forming. */
const TRANSIENT = /timeout|timed out|no responders|503|unavailable|insufficient resources|no suitable peers/i;
/** An answer that will not change by waiting. */
const DEFINITIVE = /not enabled/i;

/**
 * Runs a start-up step against JetStream (checking it, creating streams, consumers, the lease
 * bucket). While JetStream does not answer yet it is asked again every second for up to
 * `patienceMs`, with a warning each time naming the step: a clustered nats-server that was just
 * started (or is electing its meta leader) can take longer than one request's timeout to create
 * replicated streams, and a node started beside it must not exit for that. After that, or on an
 * answer that will not change (JetStream not enabled), it fails with what to check.
 */
export async function waitingFor<T>(what: string, replicas: number, fn: () => Promise<T>,
  o: { clock: Clock; log: Logger; patienceMs?: number }): Promise<T> {
  const start = o.clock.monotonic();
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (e) {
      const msg = String((e as Error)?.message ?? e);
      const definitive = DEFINITIVE.test(msg);
      if (e instanceof AxError || (!definitive && !TRANSIENT.test(msg))) throw e;
      const waited = o.clock.monotonic() - start;
      if (definitive || waited >= (o.patienceMs ?? JETSTREAM_PATIENCE_MS)) {
        throw new AxError("AX_E_UNAVAILABLE", `JetStream did not answer while ${what} (${msg}): check that nats-server runs with JetStream (-js)` +
          (replicas > 1 ? ` and that a majority of the servers holding the namespace's streams (AX_REPLICAS=${replicas}) are up and clustered` : ""), { field: "AX_NATS_URL", cause: e });
      }
      o.log.warn({ step: what, attempt, waitedMs: Math.round(waited), err: msg }, "JetStream did not answer yet; asking again");
      await new Promise<void>((resolve) => o.clock.setTimeout(resolve, RETRY_EVERY_MS));
    }
  }
}
