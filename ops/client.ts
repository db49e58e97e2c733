import type { NatsConnection } from "@nats-io/transport-node";
import { AxError, connectNats, loadNatsSettings, names, type NatsSettings } from "../common/index.ts";
import type { Envelope } from "./envelope.ts";

/** Talks to any node of the cluster over NATS request/reply: the CLI needs only AX_NATS_URL. */
export class AxClient {
  private constructor(private readonly nc: NatsConnection, private readonly namespace: string) {}
  /** `nats`: the configuration's NATS settings (credentials, TLS), or a bare URL without credentials. */
  static async connect(nats: NatsSettings | string, namespace: string): Promise<AxClient> {
    const s = typeof nats === "string" ? loadNatsSettings({}, { AX_NATS_URL: nats }) : nats;
    const nc = await connectNats(s, { name: "ax-cli", timeout: 3000, maxReconnectAttempts: 0 });
    return new AxClient(nc, namespace);
  }
  async call<T = unknown>(op: string, args: Record<string, unknown> = {}, timeoutMs = 15_000): Promise<T> {
    let reply;
    try {
      reply = await this.nc.request(names(this.namespace).apiSubject(op), JSON.stringify(args), { timeout: timeoutMs });
    } catch (e) {
      const msg = String((e as Error).message ?? e);
      if (/permissions? violation/i.test(msg)) throw new AxError("AX_E_FORBIDDEN", `NATS does not allow this user to call ${op} (Permissions Violation on ${names(this.namespace).apiSubject(op)}): ask for a NATS user with operator permissions`, { field: "op", value: op });
      if (/no responders|503/i.test(msg)) throw new AxError("AX_E_UNAVAILABLE", `no ax node is running in namespace "${this.namespace}" (start one with: ax node)`, { field: "AX_NAMESPACE", value: this.namespace });
      throw new AxError("AX_E_TIMEOUT", `the cluster did not answer ${op} in ${timeoutMs}ms: ${msg}`);
    }
    const env = JSON.parse(new TextDecoder().decode(reply.data)) as Envelope<T>;
    if (!env.ok) throw AxError.fromJSON(env.error);
    return env.value;
  }
  async close(): Promise<void> { await this.nc.drain().catch(() => undefined); }
}
