import { connect, type NatsConnection } from "@nats-io/transport-node";
import { AxError, names } from "../common/index.ts";
import type { Envelope } from "./envelope.ts";

/** Talks to any node of the cluster over NATS request/reply: the CLI needs only AX_NATS_URL. */
export class AxClient {
  private constructor(private readonly nc: NatsConnection, private readonly namespace: string) {}
  static async connect(natsUrl: string, namespace: string): Promise<AxClient> {
    let nc: NatsConnection;
    try {
      nc = await connect({ servers: natsUrl.split(","), name: "ax-cli", timeout: 3000, maxReconnectAttempts: 0 });
    } catch (e) {
      throw new AxError("AX_E_UNAVAILABLE", `cannot reach NATS at ${natsUrl} (AX_NATS_URL): ${(e as Error).message}`, { field: "AX_NATS_URL", value: natsUrl });
    }
    return new AxClient(nc, namespace);
  }
  async call<T = unknown>(op: string, args: Record<string, unknown> = {}, timeoutMs = 15_000): Promise<T> {
    let reply;
    try {
      reply = await this.nc.request(names(this.namespace).apiSubject(op), JSON.stringify(args), { timeout: timeoutMs });
    } catch (e) {
      const msg = String((e as Error).message ?? e);
      if (/no responders|503/i.test(msg)) throw new AxError("AX_E_UNAVAILABLE", `no ax node is running in namespace "${this.namespace}" (start one with: ax node)`, { field: "AX_NAMESPACE", value: this.namespace });
      throw new AxError("AX_E_TIMEOUT", `the cluster did not answer ${op} in ${timeoutMs}ms: ${msg}`);
    }
    const env = JSON.parse(new TextDecoder().decode(reply.data)) as Envelope<T>;
    if (!env.ok) throw AxError.fromJSON(env.error);
    return env.value;
  }
  async close(): Promise<void> { await this.nc.drain().catch(() => undefined); }
}
