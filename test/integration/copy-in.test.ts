import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { copyIn, CopyText } from "../../actors/store/copyText.ts";
import { testConfig, testNamespace } from "../helpers.ts";

// COPY FROM STDIN through the store's own submittable, on a client with the store's read timeout.
const ns = testNamespace("copyin");
const cfg = testConfig(ns);
const client = new pg.Client({ connectionString: cfg.pgUrl, query_timeout: 60_000 });
const timers = () => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;

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
    const before = timers();
    expect(await copyIn(client as unknown as pg.PoolClient, `copy "${ns}".t (id, v) from stdin`, text.chunks())).toBe(5000);
    expect(timers()).toBe(before);
    expect(Number((await client.query(`select count(*) as n from "${ns}".t`)).rows[0].n)).toBe(5000);
  });

  it("rejects with PostgreSQL's error, also without a timer left, and the client stays usable", async () => {
    const before = timers();
    await expect(copyIn(client as unknown as pg.PoolClient, `copy "${ns}".t (id, v) from stdin`, ["1\tduplicate\n"])).rejects.toMatchObject({ code: "23505" });
    expect(timers()).toBe(before);
    expect((await client.query("select 1 as one")).rows[0].one).toBe(1);
  });
});
