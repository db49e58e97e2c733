import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { copyIn, CopyText } from "../../actors/store/copyText.ts";
import { testConfig, testNamespace } from "../helpers.ts";

// COPY FROM STDIN through the store's own submittable, on a client with the store's read timeout.
const ns = testNamespace("copyin");
const cfg = testConfig(ns);
const client = new pg.Client({ connectionString: cfg.pgUrl, query_timeout: 60_000 });

/**
 * Runs `fn` and returns how many of the timers it set are still pending (neither fired nor
 * cleared). Counting every timer of the process instead flaked: an unrelated timer that fired
 * during the COPY hid one left behind, and failed the test when none was.
 */
async function timersLeftBy<T>(fn: () => Promise<T>): Promise<{ result: T | undefined; error: unknown; left: number }> {
  const pending = new Set<unknown>();
  const { setTimeout: set, clearTimeout: clear } = globalThis;
  globalThis.setTimeout = ((cb: (...a: unknown[]) => void, ms?: number, ...args: unknown[]) => {
    const t = set(() => { pending.delete(t); cb(...args); }, ms);
    pending.add(t);
    return t;
  }) as typeof setTimeout;
  globalThis.clearTimeout = ((t: Parameters<typeof clearTimeout>[0]) => { pending.delete(t); clear(t); }) as typeof clearTimeout;
  try {
    return { result: await fn(), error: undefined, left: pending.size };
  } catch (error) {
    return { result: undefined, error, left: pending.size };
  } finally {
    globalThis.setTimeout = set;
    globalThis.clearTimeout = clear;
  }
}

beforeAll(async () => {
  await client.connect();
  await client.query(`create schema "${ns}"`);
  await client.query(`create table "${ns}".t (id int primary key, v text)`);
});
afterAll(async () => {
  await client.query(`drop schema if exists "${ns}" cascade`);
  await client.end();
});

describe("copyIn", () => {
  it("loads the rows and leaves no read-timeout timer behind (its closure held the COPY text)", async () => {
    const text = new CopyText();
    for (let i = 0; i < 5000; i++) text.line(`${i}\tv${i}`);
    const { result, left } = await timersLeftBy(() => copyIn(client as unknown as pg.PoolClient, `copy "${ns}".t (id, v) from stdin`, text.chunks()));
    expect(result).toBe(5000);
    expect(left, "timers the COPY left pending").toBe(0);
    expect(Number((await client.query(`select count(*) as n from "${ns}".t`)).rows[0].n)).toBe(5000);
  });

  it("rejects with PostgreSQL's error, also without a timer left, and the client stays usable", async () => {
    const { error, left } = await timersLeftBy(() => copyIn(client as unknown as pg.PoolClient, `copy "${ns}".t (id, v) from stdin`, ["1\tduplicate\n"]));
    expect(error).toMatchObject({ code: "23505" });
    expect(left, "timers the failed COPY left pending").toBe(0);
    expect((await client.query("select 1 as one")).rows[0].one).toBe(1);
  });
});
