import { describe, expect, it } from "vitest";
import { loadConfig, names, parseDuration, formatDuration, SimulatedClock } from "../../common/index.ts";

describe("configuration", () => {
  it("uses the documented defaults", () => {
    const c = loadConfig({});
    expect(c).toMatchObject({ natsUrl: "nats://127.0.0.1:4222", redisUrl: "redis://127.0.0.1:6379", pgUrl: "postgres://postgres@127.0.0.1:5432/ax", namespace: "ax", shardCount: 64, leaseTtlMs: 6000, deliveryGraceMs: 30_000, taskWriteDeferMs: 2000 });
  });
  it("takes a delivery grace of 0s (no wait for delivery)", () => {
    expect(loadConfig({ AX_DELIVERY_GRACE: "0s" }).deliveryGraceMs).toBe(0);
  });
  it("takes a task write deferral of 0s (the task row written with each fire)", () => {
    expect(loadConfig({ AX_TASK_WRITE_DEFER: "0s" }).taskWriteDeferMs).toBe(0);
    expect(loadConfig({ AX_TASK_WRITE_DEFER: "750ms" }).taskWriteDeferMs).toBe(750);
  });
  it("flags override the environment", () => {
    expect(loadConfig({ AX_NAMESPACE: "a" }, { AX_NAMESPACE: "b" }).namespace).toBe("b");
  });
  it.each([
    ["AX_NAMESPACE", "Bad-Name"], ["AX_NAMESPACE", "x".repeat(40)], ["AX_NATS_URL", "http://x"], ["AX_PG_URL", "nope"],
    ["AX_SHARDS", "0"], ["AX_SHARDS", "12.5"], ["AX_LEASE_TTL", "6x"], ["AX_LEASE_TTL", "100ms"], ["AX_DELIVERY_GRACE", "-1s"], ["AX_DELIVERY_GRACE", "soon"], ["AX_TASK_WRITE_DEFER", "-2s"], ["AX_TASK_WRITE_DEFER", "later"], ["AX_LOG_LEVEL", "loud"], ["AX_REPLICAS", "0"], ["AX_REPLICAS", "2"], ["AX_REPLICAS", "7"], ["AX_REPLICAS", "three"],
  ])("refuses %s=%s naming the variable and value", (k, v) => {
    try { loadConfig({ [k]: v }); expect.unreachable(); } catch (e) {
      expect(e).toMatchObject({ code: "AX_E_CONFIG", field: k, value: v });
      expect(String((e as Error).message)).toContain(k);
    }
  });
  it("derives every name of a namespace in one place", () => {
    const n = names("ax");
    expect([n.dispatchStream, n.eventsStream, n.dispatchSubject("e"), n.dueKey(7)]).toEqual(["AX_DISPATCH", "AX_EVENTS", "ax.dispatch.e", "ax:due:{7}"]);
  });
});

describe("durations", () => {
  it.each([["250ms", 250], ["10s", 10_000], ["1h30m", 5_400_000], ["2d", 172_800_000], ["1500", 1500], ["0.5s", 500]])("%s = %d ms", (s, ms) => {
    expect(parseDuration("f", s)).toBe(ms);
  });
  it.each(["", "10x", "-1s", "s", "1s2"])("refuses %j naming the field", (s) => {
    expect(() => parseDuration("every", s)).toThrow(/^every:/);
  });
  it("refuses zero unless allowed", () => {
    expect(() => parseDuration("every", "0s")).toThrow(/> 0/);
    expect(parseDuration("backoff", "0", { allowZero: true })).toBe(0);
  });
  it("formats back", () => expect(formatDuration(5_400_250)).toBe("1h30m250ms"));
});

describe("simulated clock", () => {
  it("runs timers in due order and can step the wall clock alone", () => {
    const c = new SimulatedClock(1000);
    const seen: number[] = [];
    c.setTimeout(() => seen.push(2), 20);
    c.setTimeout(() => seen.push(1), 10);
    const h = c.setTimeout(() => seen.push(3), 30);
    c.clearTimeout(h);
    c.advance(50);
    expect(seen).toEqual([1, 2]);
    expect(c.now()).toBe(1050);
    c.stepWall(-5000);
    expect(c.now()).toBe(-3950);
    expect(c.monotonic()).toBe(50);
  });
});
