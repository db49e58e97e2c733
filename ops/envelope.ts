import { AxError } from "../common/index.ts";

/** Every API answer, over NATS or HTTP: data, never a thrown string. */
export type Envelope<T = unknown> = { ok: true; value: T } | { ok: false; error: ReturnType<AxError["toJSON"]> };

export function okEnvelope<T>(value: T): Envelope<T> { return { ok: true, value }; }
export function errEnvelope(e: unknown): Envelope<never> {
  if (e instanceof AxError) return { ok: false, error: e.toJSON() };
  return { ok: false, error: { code: "AX_E_INTERNAL", message: e instanceof Error ? e.message : String(e) } };
}
