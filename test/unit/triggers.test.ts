import { describe, expect, it } from "vitest";
import { InvalidInputError } from "../../common/index.ts";
import {
  CRON_MISSED_COUNT_LIMIT, compileTrigger, parseTrigger, planAfter, preview, previewMarks,
  type CompiledTrigger, type TriggerSpec,
} from "../../actors/triggers/index.ts";
import { cachedCron, cronCacheStats, cronLatestBefore } from "../../actors/triggers/cron.ts";

const T = (iso: string): number => {
  const ms = Date.parse(iso);
  if (Number.isNaN(ms)) throw new Error(`bad test instant ${iso}`);
  return ms;
};
const iso = (ms: number | null): string | null => (ms === null ? null : new Date(ms).toISOString());
const cron = (expr: string, tz = "UTC"): CompiledTrigger => compileTrigger({ kind: "cron", expr, tz });
const NOW = T("2026-01-01T00:00:00Z");
const S = 1000;

function caught(fn: () => unknown): InvalidInputError {
  try { fn(); } catch (e) {
    expect(e).toBeInstanceOf(InvalidInputError);
    return e as InvalidInputError;
  }
  throw new Error("expected an InvalidInputError");
}

/* ------------------------------------------------------------------------------------------ */

describe("parseTrigger: valid input", () => {
  const cases: Array<{ name: string; input: Parameters<typeof parseTrigger>[0]; want: TriggerSpec }> = [
    { name: "cron defaults to UTC", input: { cron: "0 2 * * *" }, want: { kind: "cron", expr: "0 2 * * *", tz: "UTC" } },
    { name: "cron whitespace normalized", input: { cron: "  0   2 * * * " }, want: { kind: "cron", expr: "0 2 * * *", tz: "UTC" } },
    { name: "6-field cron", input: { cron: "*/10 * * * * *", tz: "Asia/Shanghai" }, want: { kind: "cron", expr: "*/10 * * * * *", tz: "Asia/Shanghai" } },
    { name: "tz canonicalized", input: { cron: "0 9 * * mon-fri", tz: "asia/shanghai" }, want: { kind: "cron", expr: "0 9 * * mon-fri", tz: "Asia/Shanghai" } },
    { name: "cron extensions", input: { cron: "0 0 L * *" }, want: { kind: "cron", expr: "0 0 L * *", tz: "UTC" } },
    { name: "nth weekday", input: { cron: "0 0 * * FRI#3" }, want: { kind: "cron", expr: "0 0 * * FRI#3", tz: "UTC" } },
    { name: "every string", input: { every: "10s" }, want: { kind: "fixed_rate", everyMs: 10_000, anchorMs: NOW } },
    { name: "every number", input: { every: 250 }, want: { kind: "fixed_rate", everyMs: 250, anchorMs: NOW } },
    { name: "fixedDelay", input: { fixedDelay: "1m30s" }, want: { kind: "fixed_delay", delayMs: 90_000 } },
    { name: "delay → once", input: { delay: "5m" }, want: { kind: "once", atMs: NOW + 300_000 } },
    { name: "at with Z", input: { at: "2026-03-08T09:00:00Z" }, want: { kind: "once", atMs: T("2026-03-08T09:00:00Z") } },
    { name: "at with offset", input: { at: "2026-03-08T17:00:00.250+08:00" }, want: { kind: "once", atMs: T("2026-03-08T09:00:00.250Z") } },
    { name: "at with compact offset", input: { at: "2026-03-08T04:00-0500" }, want: { kind: "once", atMs: T("2026-03-08T09:00:00Z") } },
    { name: "at 30s in the past is tolerated", input: { at: "2025-12-31T23:59:30Z" }, want: { kind: "once", atMs: NOW - 30 * S } },
    { name: "undefined/null fields are absent", input: { cron: undefined, every: "1h", at: null as unknown as undefined }, want: { kind: "fixed_rate", everyMs: 3_600_000, anchorMs: NOW } },
  ];
  it.each(cases)("$name", ({ input, want }) => {
    expect(parseTrigger(input, NOW)).toEqual(want);
  });

  it("fixed_rate is anchored at now, so the first slot is now + every", () => {
    const t = compileTrigger(parseTrigger({ every: "10s" }, NOW));
    expect(t.next(NOW)).toBe(NOW + 10 * S);
  });

  it("pastToleranceMs is configurable", () => {
    expect(() => parseTrigger({ at: "2025-12-31T23:59:30Z" }, NOW, { pastToleranceMs: 10 * S })).toThrow(InvalidInputError);
    expect(parseTrigger({ at: "2025-12-31T23:00:00Z" }, NOW, { pastToleranceMs: 3_600_000 })).toEqual({ kind: "once", atMs: NOW - 3_600_000 });
  });
});

describe("parseTrigger: every refusal names the field, the code and the bad token", () => {
  // `contains` is checked in the explanation alone; for a cron expression the "(got ...)" echo
  // repeats the whole input, so the bad token must appear in the explanation itself. Duration
  // errors come from common/parseDuration, where the echo IS the bad token (`echo`).
  type Case = { name: string; input: Record<string, unknown>; field: string; code: string; contains: string[]; echo?: string };
  const cases: Case[] = [
    // shape
    { name: "no kind", input: {}, field: "trigger", code: "AX_E_TRIGGER", contains: ["cron", "every", "fixedDelay", "at", "delay"] },
    { name: "cron and every", input: { cron: "* * * * *", every: "10s" }, field: "trigger", code: "AX_E_TRIGGER", contains: ["cron", "every", "conflict"] },
    { name: "at and delay", input: { at: "2026-03-08T09:00:00Z", delay: "5m" }, field: "trigger", code: "AX_E_TRIGGER", contains: ["at", "delay"] },
    { name: "tz without cron", input: { every: "10s", tz: "UTC" }, field: "tz", code: "AX_E_TRIGGER", contains: ["cron", "every"] },
    // time zone
    { name: "unknown zone", input: { cron: "0 2 * * *", tz: "Mars/Olympus" }, field: "tz", code: "AX_E_TIMEZONE", contains: ["Mars/Olympus"] },
    { name: "empty zone", input: { cron: "0 2 * * *", tz: "" }, field: "tz", code: "AX_E_TIMEZONE", contains: ["IANA"] },
    { name: "offset is not a zone", input: { cron: "0 2 * * *", tz: "+08:00" }, field: "tz", code: "AX_E_TIMEZONE", contains: ["+08:00"] },
    // cron fields
    { name: "second out of range", input: { cron: "60 * * * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["second", "60", "0-59"] },
    { name: "minute out of range", input: { cron: "61 * * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["minute", "61", "0-59"] },
    { name: "minute in a range", input: { cron: "5-61 * * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["minute", "5-61", "61"] },
    { name: "hour out of range", input: { cron: "0 24 * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["hour", "24", "0-23"] },
    { name: "day-of-month out of range", input: { cron: "0 0 32 * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-month", "32", "1-31"] },
    { name: "day-of-month zero", input: { cron: "0 0 0 * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-month", "0", "1-31"] },
    { name: "month out of range", input: { cron: "0 0 * 13 *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["month", "13", "1-12"] },
    { name: "bad month name", input: { cron: "0 0 * foo *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["month", "foo"] },
    { name: "day-of-week out of range", input: { cron: "0 0 * * 8" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-week", "8", "0-7"] },
    { name: "bad weekday name", input: { cron: "0 0 * * funday" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-week", "funday"] },
    { name: "garbage token", input: { cron: "0 x * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["hour", "x"] },
    { name: "zero step", input: { cron: "*/0 * * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["minute", "*/0"] },
    { name: "step wider than the field", input: { cron: "*/90 * * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["minute", "*/90"] },
    { name: "backwards range", input: { cron: "0 22-2 * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["hour", "22-2"] },
    { name: "empty list item", input: { cron: "1,,2 * * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["minute", "1,,2", "empty"] },
    { name: "double slash", input: { cron: "*/5/2 * * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["minute", "*/5/2"] },
    { name: "hashed value", input: { cron: "H * * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["minute", "H"] },
    { name: "question mark", input: { cron: "0 0 ? * 1" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-month", "?"] },
    { name: "bad nth weekday", input: { cron: "0 0 * * 5#6" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-week", "5#6", "6"] },
    { name: "standalone L in day-of-week", input: { cron: "0 0 * * L" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-week", "L"] },
    { name: "both day fields", input: { cron: "0 0 1 * 1" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-month", "day-of-week", "either"] },
    { name: "impossible date", input: { cron: "0 0 31 4,6 *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-month", "31", "4,6"] },
    { name: "february 30", input: { cron: "0 0 30 feb *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["day-of-month", "30", "feb"] },
    { name: "4 fields", input: { cron: "* * * *" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["5 fields", "got 4"] },
    { name: "7 fields", input: { cron: "0 * * * * * 2026" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["got 7"] },
    { name: "empty", input: { cron: "" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["got 0"] },
    { name: "macro", input: { cron: "@daily" }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["@daily"] },
    { name: "not a string", input: { cron: 5 }, field: "cron", code: "AX_E_CRON_FIELD", contains: ["string"] },
    // durations
    { name: "every not a duration", input: { every: "10x" }, field: "every", code: "AX_E_DURATION", contains: ["not a duration"], echo: `"10x"` },
    { name: "every zero", input: { every: 0 }, field: "every", code: "AX_E_DURATION", contains: ["> 0"], echo: "got 0" },
    { name: "every negative", input: { every: -5 }, field: "every", code: "AX_E_DURATION", contains: ["> 0"], echo: "got -5" },
    { name: "every rounds to 0", input: { every: 0.4 }, field: "every", code: "AX_E_DURATION", contains: ["1ms"] },
    { name: "every too long", input: { every: "99999w" }, field: "every", code: "AX_E_DURATION", contains: ["at most"], echo: `"99999w"` },
    { name: "fixedDelay zero", input: { fixedDelay: "0s" }, field: "fixedDelay", code: "AX_E_DURATION", contains: ["> 0"], echo: `"0s"` },
    { name: "delay not a duration", input: { delay: "soon" }, field: "delay", code: "AX_E_DURATION", contains: ["not a duration"], echo: `"soon"` },
    { name: "delay wrong type", input: { delay: true }, field: "delay", code: "AX_E_DURATION", contains: ["duration"] },
    // at
    { name: "at without offset", input: { at: "2026-03-08T09:00:00" }, field: "at", code: "AX_E_TRIGGER", contains: ["offset", "Z"] },
    { name: "at date only", input: { at: "2026-03-08" }, field: "at", code: "AX_E_TRIGGER", contains: ["ISO-8601"] },
    { name: "at not a time", input: { at: "tomorrow" }, field: "at", code: "AX_E_TRIGGER", contains: ["ISO-8601"] },
    { name: "at impossible day", input: { at: "2026-02-29T00:00:00Z" }, field: "at", code: "AX_E_TRIGGER", contains: ["29", "2026-02"] },
    { name: "at bad hour", input: { at: "2026-03-08T24:00:00Z" }, field: "at", code: "AX_E_TRIGGER", contains: ["hour", "24"] },
    { name: "at bad offset", input: { at: "2026-03-08T09:00:00+19:00" }, field: "at", code: "AX_E_TRIGGER", contains: ["+19:00"] },
    { name: "at too far in the past", input: { at: "2025-12-31T23:58:00Z" }, field: "at", code: "AX_E_TRIGGER", contains: ["2025-12-31T23:58:00.000Z", "2m", "in the past"] },
  ];
  it.each(cases)("$name", ({ input, field, code, contains, echo }) => {
    const err = caught(() => parseTrigger(input as Parameters<typeof parseTrigger>[0], NOW));
    expect(err.field).toBe(field);
    expect(err.code).toBe(code);
    // Look only at the explanation, not the "(got ...)" echo of the whole input.
    const why = err.message.split(" (got ")[0]!;
    for (const s of contains) expect(why).toContain(s);
    if (echo !== undefined) expect(err.message).toContain(echo);
  });

  it.each([
    { cron: "0 0 * * 0,7", from: "2026-01-01T00:00:00Z", want: ["2026-01-04T00:00:00.000Z", "2026-01-11T00:00:00.000Z"] },
    { cron: "*/15,30 * * * *", from: "2026-01-01T00:00:00Z", want: ["2026-01-01T00:15:00.000Z", "2026-01-01T00:30:00.000Z", "2026-01-01T00:45:00.000Z", "2026-01-01T01:00:00.000Z"] },
    { cron: "0 8-18,12 * * *", from: "2026-01-01T17:30:00Z", want: ["2026-01-01T18:00:00.000Z", "2026-01-02T08:00:00.000Z"] },
    { cron: "0 0 1,1-3,2 * *", from: "2026-01-01T00:00:00Z", want: ["2026-01-02T00:00:00.000Z", "2026-01-03T00:00:00.000Z", "2026-02-01T00:00:00.000Z"] },
    { cron: "0 0 0 * * sun,0,7,SUN", from: "2026-01-01T00:00:00Z", want: ["2026-01-04T00:00:00.000Z", "2026-01-11T00:00:00.000Z"] },
  ])("overlapping list items are merged: $cron", ({ cron: expr, from, want }) => {
    const spec = parseTrigger({ cron: expr }, NOW);
    expect(spec).toEqual({ kind: "cron", expr, tz: "UTC" });
    expect(preview(compileTrigger(spec), T(from), want.length).map(iso)).toEqual(want);
  });

  it("a refusal next to an overlapping item still names the field and the token", () => {
    const err = caught(() => parseTrigger({ cron: "0 0 * * 0,7,8" }, NOW));
    expect([err.field, err.code]).toEqual(["cron", "AX_E_CRON_FIELD"]);
    expect(err.message).toContain(`day-of-week field "0,7,8": 8 is out of range 0-7`);
  });

  it("a leap day is accepted in a leap year", () => {
    expect(parseTrigger({ at: "2028-02-29T00:00:00Z" }, NOW)).toEqual({ kind: "once", atMs: T("2028-02-29T00:00:00Z") });
    expect(parseTrigger({ cron: "0 0 29 2 *" }, NOW).kind).toBe("cron");
  });
});

/* ------------------------------------------------------------------------------------------ */

describe("next() for each kind", () => {
  const cases: Array<{ name: string; spec: TriggerSpec; after: string; want: string | null }> = [
    { name: "cron 5-field", spec: { kind: "cron", expr: "0 2 * * *", tz: "UTC" }, after: "2026-01-01T00:00:00Z", want: "2026-01-01T02:00:00.000Z" },
    { name: "cron strictly after a matching instant", spec: { kind: "cron", expr: "0 2 * * *", tz: "UTC" }, after: "2026-01-01T02:00:00Z", want: "2026-01-02T02:00:00.000Z" },
    { name: "cron from a fractional ms", spec: { kind: "cron", expr: "0 2 * * *", tz: "UTC" }, after: "2026-01-01T01:59:59.999Z", want: "2026-01-01T02:00:00.000Z" },
    { name: "cron 6-field seconds", spec: { kind: "cron", expr: "*/10 * * * * *", tz: "UTC" }, after: "2026-01-01T00:00:10Z", want: "2026-01-01T00:00:20.000Z" },
    { name: "cron 6-field seconds mid-step", spec: { kind: "cron", expr: "15,45 * * * * *", tz: "UTC" }, after: "2026-01-01T00:00:16Z", want: "2026-01-01T00:00:45.000Z" },
    { name: "cron weekdays", spec: { kind: "cron", expr: "0 9 * * mon-fri", tz: "UTC" }, after: "2026-01-02T09:00:00Z", want: "2026-01-05T09:00:00.000Z" },
    { name: "cron last day of month", spec: { kind: "cron", expr: "0 0 L * *", tz: "UTC" }, after: "2026-02-01T00:00:00Z", want: "2026-02-28T00:00:00.000Z" },
    { name: "cron third Friday", spec: { kind: "cron", expr: "0 0 * * 5#3", tz: "UTC" }, after: "2026-01-01T00:00:00Z", want: "2026-01-16T00:00:00.000Z" },
    { name: "cron Shanghai 09:00 = 01:00Z", spec: { kind: "cron", expr: "0 9 * * *", tz: "Asia/Shanghai" }, after: "2026-01-01T01:00:00Z", want: "2026-01-02T01:00:00.000Z" },
    { name: "fixed_rate before the first slot", spec: { kind: "fixed_rate", everyMs: 10_000, anchorMs: NOW }, after: "2025-12-31T00:00:00Z", want: "2026-01-01T00:00:10.000Z" },
    { name: "fixed_rate at the anchor", spec: { kind: "fixed_rate", everyMs: 10_000, anchorMs: NOW }, after: "2026-01-01T00:00:00Z", want: "2026-01-01T00:00:10.000Z" },
    { name: "fixed_rate on a slot", spec: { kind: "fixed_rate", everyMs: 10_000, anchorMs: NOW }, after: "2026-01-01T00:00:30Z", want: "2026-01-01T00:00:40.000Z" },
    { name: "fixed_rate between slots", spec: { kind: "fixed_rate", everyMs: 10_000, anchorMs: NOW }, after: "2026-01-01T00:00:31.500Z", want: "2026-01-01T00:00:40.000Z" },
    { name: "fixed_delay", spec: { kind: "fixed_delay", delayMs: 10_000 }, after: "2026-01-01T00:00:03.250Z", want: "2026-01-01T00:00:13.250Z" },
    { name: "once before", spec: { kind: "once", atMs: NOW }, after: "2025-12-31T23:59:59.999Z", want: "2026-01-01T00:00:00.000Z" },
    { name: "once at its slot", spec: { kind: "once", atMs: NOW }, after: "2026-01-01T00:00:00Z", want: null },
    { name: "once after", spec: { kind: "once", atMs: NOW }, after: "2026-06-01T00:00:00Z", want: null },
  ];
  it.each(cases)("$name", ({ spec, after, want }) => {
    expect(iso(compileTrigger(spec).next(T(after)))).toBe(want);
  });

  it("Asia/Shanghai (UTC+8, no DST) fires at 01:00Z every day of the year", () => {
    const slots = preview(cron("0 9 * * *", "Asia/Shanghai"), T("2026-01-01T00:00:00Z"), 365);
    expect(slots).toHaveLength(365);
    slots.forEach((s, i) => expect(s).toBe(T("2026-01-01T01:00:00Z") + i * 86_400_000));
  });

  it("compileTrigger refuses malformed specs", () => {
    expect(caught(() => compileTrigger({ kind: "fixed_rate", everyMs: 0, anchorMs: NOW })).field).toBe("everyMs");
    expect(caught(() => compileTrigger({ kind: "fixed_delay", delayMs: Number.NaN })).field).toBe("delayMs");
    expect(caught(() => compileTrigger({ kind: "once", atMs: Infinity })).field).toBe("atMs");
    expect(caught(() => compileTrigger({ kind: "cron", expr: "61 * * * *", tz: "UTC" })).code).toBe("AX_E_CRON_FIELD");
    expect(caught(() => compileTrigger({ kind: "cron", expr: "* * * * *", tz: "Nowhere/Land" })).code).toBe("AX_E_TIMEZONE");
    expect(caught(() => compileTrigger({ kind: "weekly" } as unknown as TriggerSpec)).field).toBe("kind");
    expect(caught(() => cron("* * * * *").next(Number.NaN)).field).toBe("afterMs");
  });
});

/* ------------------------------------------------------------------------------------------ */

describe("DST behaviour (docs/TRIGGERS.md, America/New_York)", () => {
  const NY = "America/New_York";

  it("spring forward 2026-03-08: 30 2 * * * fires once, at 03:30 EDT (07:30Z)", () => {
    const slots = preview(cron("30 2 * * *", NY), T("2026-03-06T12:00:00Z"), 4).map(iso);
    expect(slots).toEqual([
      "2026-03-07T07:30:00.000Z", // 02:30 EST
      "2026-03-08T07:30:00.000Z", // 02:30 does not exist; 03:30 EDT
      "2026-03-09T06:30:00.000Z", // 02:30 EDT
      "2026-03-10T06:30:00.000Z",
    ]);
  });

  it("spring forward: 0 2 * * * fires at 03:00 EDT (07:00Z), the first instant after the gap", () => {
    expect(preview(cron("0 2 * * *", NY), T("2026-03-07T12:00:00Z"), 2).map(iso))
      .toEqual(["2026-03-08T07:00:00.000Z", "2026-03-09T06:00:00.000Z"]);
  });

  it("spring forward: */30 * * * * skips the missing hour", () => {
    expect(preview(cron("*/30 * * * *", NY), T("2026-03-08T06:00:00Z"), 4).map(iso)).toEqual([
      "2026-03-08T06:30:00.000Z", // 01:30 EST
      "2026-03-08T07:00:00.000Z", // 03:00 EDT (02:00-02:59 never happen)
      "2026-03-08T07:30:00.000Z", // 03:30 EDT
      "2026-03-08T08:00:00.000Z",
    ]);
  });

  it("fall back 2026-11-01: 30 1 * * * fires once, at the first 01:30 (EDT, 05:30Z)", () => {
    const slots = preview(cron("30 1 * * *", NY), T("2026-10-31T00:00:00Z"), 3).map(iso);
    expect(slots).toEqual([
      "2026-10-31T05:30:00.000Z", // 01:30 EDT
      "2026-11-01T05:30:00.000Z", // first 01:30 (EDT); the second (06:30Z, EST) is skipped
      "2026-11-02T06:30:00.000Z", // 01:30 EST
    ]);
  });

  it("fall back: */30 * * * * fires in both copies of the repeated hour", () => {
    expect(preview(cron("*/30 * * * *", NY), T("2026-11-01T04:00:00Z"), 6).map(iso)).toEqual([
      "2026-11-01T04:30:00.000Z", // 00:30 EDT
      "2026-11-01T05:00:00.000Z", // 01:00 EDT
      "2026-11-01T05:30:00.000Z", // 01:30 EDT
      "2026-11-01T06:00:00.000Z", // 01:00 EST (repeated)
      "2026-11-01T06:30:00.000Z", // 01:30 EST (repeated)
      "2026-11-01T07:00:00.000Z", // 02:00 EST
    ]);
  });

  it("fall back: the second 01:30 is not a slot, however next() is asked", () => {
    const t = cron("30 1 * * *", NY);
    expect(iso(t.next(T("2026-11-01T05:30:00Z")))).toBe("2026-11-02T06:30:00.000Z");
    // From inside the repeated hour too (cron-parser used to return the second 01:30 here):
    // the slots are one fixed set, so next() does not depend on where it is asked from.
    expect(iso(t.next(T("2026-11-01T06:10:00Z")))).toBe("2026-11-02T06:30:00.000Z");
  });

  it("explain() calls out the DST cases", () => {
    const t = cron("0 2 * * *", NY);
    const gap = t.explain(T("2026-03-08T06:00:00Z"), T("2026-03-08T07:00:00Z"));
    expect(gap).toContain(`next time matching cron "0 2 * * *" in America/New_York after 2026-03-08T01:00:00-05:00`);
    expect(gap).toContain("2026-03-08T03:00:00-04:00");
    expect(gap).toContain("DST gap");
    const repeated = cron("*/30 * * * *", NY).explain(T("2026-11-01T05:30:00Z"), T("2026-11-01T06:00:00Z"));
    expect(repeated).toContain("2026-11-01T01:00:00-05:00");
    expect(repeated).toContain("second occurrence");
    const plain = cron("*/30 * * * *", NY).explain(T("2026-11-01T05:00:00Z"), T("2026-11-01T05:30:00Z"));
    expect(plain).not.toContain("DST");
    expect(plain).not.toContain("second occurrence");
  });

  it("the backward jump used after long outages agrees with the forward chain across DST", () => {
    const c = cachedCron("30 1 * * *", NY);
    // prev() alone would return the second 01:30 (06:30Z); it is not on the forward chain.
    expect(cronLatestBefore(c, T("2026-11-02T00:00:00Z"), T("2026-10-29T00:00:00Z"), 2).map(iso))
      .toEqual(["2026-10-31T05:30:00.000Z", "2026-11-01T05:30:00.000Z"]);
    const every = cachedCron("*/30 * * * *", NY);
    expect(cronLatestBefore(every, T("2026-11-01T07:00:00Z"), T("2026-11-01T04:00:00Z"), 10).map(iso))
      .toEqual(preview(cron("*/30 * * * *", NY), T("2026-11-01T04:00:00Z"), 5).map(iso));
  });
});

describe("DST policy per schedule (dstGap, dstRepeat)", () => {
  const NY = "America/New_York";
  const slots = (expr: string, from: string, n: number, dst: Record<string, string>): Array<string | null> =>
    preview(compileTrigger(parseTrigger({ cron: expr, tz: NY, ...dst }, NOW)), T(from), n).map(iso);

  it.each([
    { dst: {} as Record<string, string>, want: ["2026-03-07T07:30:00.000Z", "2026-03-08T07:30:00.000Z", "2026-03-09T06:30:00.000Z"] },
    { dst: { dstGap: "shift" }, want: ["2026-03-07T07:30:00.000Z", "2026-03-08T07:30:00.000Z", "2026-03-09T06:30:00.000Z"] },
    { dst: { dstGap: "skip" }, want: ["2026-03-07T07:30:00.000Z", "2026-03-09T06:30:00.000Z", "2026-03-10T06:30:00.000Z"] },
    { dst: { dstGap: "transition" }, want: ["2026-03-07T07:30:00.000Z", "2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z"] },
  ])("gap: 30 2 * * * on 2026-03-08 with $dst", ({ dst, want }) => {
    expect(slots("30 2 * * *", "2026-03-07T00:00:00Z", 3, dst)).toEqual(want);
  });

  it.each([
    { dst: {} as Record<string, string>, want: ["2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"] },
    { dst: { dstRepeat: "first" }, want: ["2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"] },
    { dst: { dstRepeat: "second" }, want: ["2026-11-01T06:30:00.000Z", "2026-11-02T06:30:00.000Z"] },
    { dst: { dstRepeat: "both" }, want: ["2026-11-01T05:30:00.000Z", "2026-11-01T06:30:00.000Z"] },
  ])("repeat: 30 1 * * * on 2026-11-01 with $dst", ({ dst, want }) => {
    expect(slots("30 1 * * *", "2026-11-01T00:00:00Z", 2, dst)).toEqual(want);
  });

  it("every-hour expressions default to both copies; first/second narrow them", () => {
    expect(slots("30 * * * *", "2026-11-01T05:00:00Z", 3, {})).toEqual(["2026-11-01T05:30:00.000Z", "2026-11-01T06:30:00.000Z", "2026-11-01T07:30:00.000Z"]);
    expect(slots("30 * * * *", "2026-11-01T05:00:00Z", 2, { dstRepeat: "first" })).toEqual(["2026-11-01T05:30:00.000Z", "2026-11-01T07:30:00.000Z"]);
    expect(slots("30 * * * *", "2026-11-01T05:00:00Z", 2, { dstRepeat: "second" })).toEqual(["2026-11-01T06:30:00.000Z", "2026-11-01T07:30:00.000Z"]);
  });

  it("the spec keeps only what was given, and describe() names it", () => {
    expect(parseTrigger({ cron: "30 2 * * *", tz: NY }, NOW)).toEqual({ kind: "cron", expr: "30 2 * * *", tz: NY });
    const spec = parseTrigger({ cron: "30 2 * * *", tz: NY, dstGap: "skip", dstRepeat: "both" }, NOW);
    expect(spec).toEqual({ kind: "cron", expr: "30 2 * * *", tz: NY, dstGap: "skip", dstRepeat: "both" });
    expect(compileTrigger(spec).describe()).toBe(`cron "30 2 * * *" in America/New_York (dst-gap skip, dst-repeat both)`);
    expect(compileTrigger(spec).spec).toEqual(spec);
  });

  it("refusals name the field", () => {
    const bad = caught(() => parseTrigger({ cron: "30 2 * * *", dstGap: "later" }, NOW));
    expect([bad.field, bad.code]).toEqual(["dstGap", "AX_E_TRIGGER"]);
    expect(bad.message).toContain("shift, skip, transition");
    expect(caught(() => parseTrigger({ cron: "30 2 * * *", dstRepeat: "twice" }, NOW)).field).toBe("dstRepeat");
    expect(caught(() => parseTrigger({ every: "1h", dstRepeat: "both" }, NOW)).field).toBe("dstRepeat");
    expect(caught(() => compileTrigger({ kind: "cron", expr: "* * * * *", tz: "UTC", dstGap: "nope" as "skip" })).field).toBe("dstGap");
  });

  it("previewMarks marks what a rule moved, skipped or repeated", () => {
    const marks = (expr: string, from: string, n: number, dst: Record<string, string>) =>
      previewMarks(compileTrigger(parseTrigger({ cron: expr, tz: NY, ...dst }, NOW)), T(from), n).map((m) => [iso(m.slotMs), m.note]);
    const shifted = marks("30 2 * * *", "2026-03-07T12:00:00Z", 2, {});
    expect(shifted[0]![0]).toBe("2026-03-08T07:30:00.000Z");
    expect(shifted[0]![1]).toContain("2026-03-08T02:30:00 did not exist");
    expect(shifted[1]).toEqual(["2026-03-09T06:30:00.000Z", ""]);
    expect(marks("30 2 * * *", "2026-03-07T12:00:00Z", 1, { dstGap: "skip" })).toEqual([
      [null, "skipped: 2026-03-08T02:30:00 did not exist (DST gap at 2026-03-08T07:00:00.000Z; dst-gap skip)"],
      ["2026-03-09T06:30:00.000Z", ""],
    ]);
    const repeated = marks("30 1 * * *", "2026-10-31T12:00:00Z", 2, {});
    expect(repeated[0]).toEqual(["2026-11-01T05:30:00.000Z", "this is the first occurrence of a wall time repeated when DST ended; only the first fires (dst-repeat first)"]);
    expect(repeated[1]).toEqual([null, "not fired: 2026-11-01T01:30:00 at 2026-11-01T06:30:00.000Z, a repeated wall time whose other copy fires (dst-repeat first)"]);
    expect(repeated[2]).toEqual(["2026-11-02T06:30:00.000Z", ""]);
    // Non-cron triggers have no notes.
    expect(previewMarks(compileTrigger({ kind: "fixed_rate", everyMs: 1000, anchorMs: NOW }), NOW, 2)).toEqual([{ slotMs: NOW + 1000, note: "" }, { slotMs: NOW + 2000, note: "" }]);
  });

  it("planAfter's long-outage jump follows the trigger's policy", () => {
    const t = compileTrigger({ kind: "cron", expr: "* * * * * *", tz: NY, dstRepeat: "first" });
    const p = planAfter(t, T("2026-11-01T03:00:00Z"), T("2026-11-01T07:00:00Z"), "all", { maxCatchUp: 2 });
    expect(p.missed).toBe(CRON_MISSED_COUNT_LIMIT);
    // 06:00-06:59:59Z repeat 01:00-01:59:59 (already fired at 05:xxZ): the latest slots are before 06:00Z.
    expect(p.fire.map((f) => iso(f.slotMs))).toEqual(["2026-11-01T05:59:58.000Z", "2026-11-01T05:59:59.000Z"]);
    expect(iso(p.nextSlotMs)).toBe("2026-11-01T07:00:00.000Z");
  });
});

/* ------------------------------------------------------------------------------------------ */

describe("describe() and explain()", () => {
  it.each([
    { spec: { kind: "cron", expr: "*/10 * * * * *", tz: "Asia/Shanghai" } as TriggerSpec, want: `cron "*/10 * * * * *" in Asia/Shanghai` },
    { spec: { kind: "fixed_rate", everyMs: 10_000, anchorMs: NOW } as TriggerSpec, want: "every 10s (anchored at 2026-01-01T00:00:00.000Z)" },
    { spec: { kind: "fixed_delay", delayMs: 10_000 } as TriggerSpec, want: "10s after the previous run finished" },
    { spec: { kind: "once", atMs: NOW } as TriggerSpec, want: "once at 2026-01-01T00:00:00.000Z" },
  ])("$want", ({ spec, want }) => {
    expect(compileTrigger(spec).describe()).toBe(want);
  });

  it("explain() shows the arithmetic and flags a slot that next() would not give", () => {
    const rate = compileTrigger({ kind: "fixed_rate", everyMs: 10_000, anchorMs: NOW });
    expect(rate.explain(NOW + 31 * S, NOW + 40 * S))
      .toBe("first slot of every 10s strictly after 2026-01-01T00:00:31.000Z: anchor 2026-01-01T00:00:00.000Z + 4 × 10s = 2026-01-01T00:00:40.000Z");
    expect(rate.explain(NOW, NOW + 40 * S)).toContain("next slot after 2026-01-01T00:00:00.000Z is actually 2026-01-01T00:00:10.000Z");
    const delay = compileTrigger({ kind: "fixed_delay", delayMs: 10_000 });
    expect(delay.explain(NOW + 3 * S, NOW + 13 * S)).toContain("10s after 2026-01-01T00:00:03.000Z");
    const once = compileTrigger({ kind: "once", atMs: NOW });
    expect(once.explain(NOW - S, NOW)).toBe("the single slot of a once trigger, at 2026-01-01T00:00:00.000Z");
    expect(cron("0 9 * * *", "Asia/Shanghai").explain(NOW, NOW + 3_600_000))
      .toBe(`next time matching cron "0 9 * * *" in Asia/Shanghai after 2026-01-01T08:00:00+08:00: 2026-01-01T09:00:00+08:00 (2026-01-01T01:00:00.000Z)`);
  });
});

describe("preview()", () => {
  it("lists the next slots and stops when the trigger runs out", () => {
    expect(preview(cron("*/10 * * * * *"), NOW, 3)).toEqual([NOW + 10 * S, NOW + 20 * S, NOW + 30 * S]);
    expect(preview(compileTrigger({ kind: "once", atMs: NOW + S }), NOW, 5)).toEqual([NOW + S]);
    expect(preview(compileTrigger({ kind: "fixed_delay", delayMs: 500 }), NOW, 2)).toEqual([NOW + 500, NOW + 1000]);
    expect(preview(cron("* * * * *"), NOW, 0)).toEqual([]);
  });
  it("refuses a bad count", () => {
    expect(caught(() => preview(cron("* * * * *"), NOW, -1)).field).toBe("count");
    expect(caught(() => preview(cron("* * * * *"), NOW, 1.5)).field).toBe("count");
    expect(caught(() => preview(cron("* * * * *"), NOW, 1e9)).field).toBe("count");
  });
});

/* ------------------------------------------------------------------------------------------ */

describe("planAfter", () => {
  const rate10s = compileTrigger({ kind: "fixed_rate", everyMs: 10_000, anchorMs: NOW });

  it("nothing missed: fires nothing and returns the next slot", () => {
    expect(planAfter(rate10s, NOW + 10 * S, NOW + 12 * S, "all")).toEqual({ fire: [], missed: 0, nextSlotMs: NOW + 20 * S });
  });

  it("a slot within graceMs is not missed: it is returned for the timer to fire", () => {
    // Looking 900ms late at the 20s slot (grace 1000ms).
    expect(planAfter(rate10s, NOW + 10 * S, NOW + 20_900, "once")).toEqual({ fire: [], missed: 0, nextSlotMs: NOW + 20 * S });
    // Exactly at the grace boundary it still counts as on time; 1ms later it is missed.
    expect(planAfter(rate10s, NOW + 10 * S, NOW + 21_000, "once").missed).toBe(0);
    expect(planAfter(rate10s, NOW + 10 * S, NOW + 21_001, "once").missed).toBe(1);
    expect(planAfter(rate10s, NOW + 10 * S, NOW + 25 * S, "once", { graceMs: 10 * S }).missed).toBe(0);
  });

  // lastSlot = 10s, now = 55s: slots 20, 30, 40, 50 were missed; 60 is next.
  const last = NOW + 10 * S;
  const now = NOW + 55 * S;
  it.each([
    {
      policy: "once" as const, opts: {},
      fire: [{ slotMs: NOW + 50 * S, dueMs: now, catchUp: true }],
    },
    { policy: "skip" as const, opts: {}, fire: [] },
    {
      policy: "all" as const, opts: {},
      fire: [20, 30, 40, 50].map((s) => ({ slotMs: NOW + s * S, dueMs: NOW + s * S, catchUp: true })),
    },
    {
      policy: "all" as const, opts: { maxCatchUp: 2 },
      fire: [40, 50].map((s) => ({ slotMs: NOW + s * S, dueMs: NOW + s * S, catchUp: true })),
    },
    { policy: "all" as const, opts: { maxCatchUp: 0 }, fire: [] },
  ])("misfire $policy $opts", ({ policy, opts, fire }) => {
    for (const t of [rate10s, cron("*/10 * * * * *")]) {
      expect(planAfter(t, last, now, policy, opts)).toEqual({ fire, missed: 4, nextSlotMs: NOW + 60 * S });
    }
  });

  it("all: at most maxCatchUp (default 100) fire, the latest ones, and missed counts them all", () => {
    const t = compileTrigger({ kind: "fixed_rate", everyMs: 1000, anchorMs: NOW });
    const p = planAfter(t, null, NOW + 1_000_000 + 500, "all");
    expect(p.missed).toBe(999); // slots 1s..999s; 1000s is within grace of now (1000.5s)
    expect(p.fire).toHaveLength(100);
    expect(p.fire[0]!.slotMs).toBe(NOW + 900 * S);
    expect(p.fire[99]!.slotMs).toBe(NOW + 999 * S);
    expect(p.fire.every((f, i) => i === 0 || f.slotMs > p.fire[i - 1]!.slotMs)).toBe(true);
    expect(p.nextSlotMs).toBe(NOW + 1000 * S);
  });

  it("fixed_rate: a late look never shifts future slots (no drift)", () => {
    let lastSlot: number | null = null;
    const fired: number[] = [];
    // The scheduler looks 0.3-0.9s late every time; slots must stay on the 10s grid.
    for (let i = 0; i < 20; i++) {
      const lookAt = (lastSlot ?? NOW) + 10 * S + 300 + (i % 7) * 100;
      const p = planAfter(rate10s, lastSlot, lookAt, "once");
      expect(p.fire).toEqual([]);
      fired.push(p.nextSlotMs!);
      lastSlot = p.nextSlotMs!;
    }
    fired.forEach((s, i) => expect(s).toBe(NOW + (i + 1) * 10 * S));
  });

  it("cron: after an outage cadence resumes on the schedule, not relative to now", () => {
    const t = cron("0 * * * *");
    // Last ran 03:00, scheduler back at 07:42: 04:00-07:00 missed, next is 08:00 (not 08:42).
    const p = planAfter(t, T("2026-01-01T03:00:00Z"), T("2026-01-01T07:42:17Z"), "once");
    expect(p).toEqual({
      fire: [{ slotMs: T("2026-01-01T07:00:00Z"), dueMs: T("2026-01-01T07:42:17Z"), catchUp: true }],
      missed: 4,
      nextSlotMs: T("2026-01-01T08:00:00Z"),
    });
  });

  it("first look (lastSlotMs null) per kind", () => {
    // cron: from createdAtMs, so slots since creation count as missed.
    expect(planAfter(cron("0 * * * *"), null, T("2026-01-01T02:30:00Z"), "all", { createdAtMs: T("2026-01-01T00:30:00Z") }))
      .toEqual({
        fire: [T("2026-01-01T01:00:00Z"), T("2026-01-01T02:00:00Z")].map((s) => ({ slotMs: s, dueMs: s, catchUp: true })),
        missed: 2, nextSlotMs: T("2026-01-01T03:00:00Z"),
      });
    expect(planAfter(cron("0 * * * *"), null, T("2026-01-01T02:30:00Z"), "all").nextSlotMs).toBe(T("2026-01-01T03:00:00Z"));
    // fixed_rate: from the anchor, whatever createdAtMs says.
    expect(planAfter(rate10s, null, NOW + 2 * S, "once", { createdAtMs: NOW + 5 * S }).nextSlotMs).toBe(NOW + 10 * S);
    // fixed_delay: creation + delay.
    const fd = compileTrigger({ kind: "fixed_delay", delayMs: 10_000 });
    expect(planAfter(fd, null, NOW, "once").nextSlotMs).toBe(NOW + 10 * S);
    expect(planAfter(fd, null, NOW + 3 * S, "once", { createdAtMs: NOW }).nextSlotMs).toBe(NOW + 10 * S);
  });

  it("cron DST: a skip after fall-back resumes from the scheduled slot, so 01:30 runs once", () => {
    const t = cron("30 1 * * *", "America/New_York");
    // Down from before the first 01:30 (05:30Z) until 01:10 EST (06:10Z), inside the repeated hour.
    const p = planAfter(t, T("2026-10-31T05:30:00Z"), T("2026-11-01T06:10:00Z"), "skip");
    expect(p).toEqual({ fire: [], missed: 1, nextSlotMs: T("2026-11-02T06:30:00Z") });
  });

  describe("a once trigger fires exactly once", () => {
    const at = NOW + 60 * S;
    const t = compileTrigger({ kind: "once", atMs: at });

    it("on time: the timer fires it, then nothing is left", () => {
      expect(planAfter(t, null, NOW, "once")).toEqual({ fire: [], missed: 0, nextSlotMs: at });
      for (const policy of ["once", "skip", "all"] as const) {
        expect(planAfter(t, at, at + 5 * S, policy)).toEqual({ fire: [], missed: 0, nextSlotMs: null });
        expect(planAfter(t, at, at + 86_400_000, policy)).toEqual({ fire: [], missed: 0, nextSlotMs: null });
      }
    });

    it.each([
      { policy: "once" as const, fire: [{ slotMs: NOW + 60 * S, dueMs: NOW + 120 * S, catchUp: true }] },
      { policy: "all" as const, fire: [{ slotMs: NOW + 60 * S, dueMs: NOW + 60 * S, catchUp: true }] },
      { policy: "skip" as const, fire: [] },
    ])("missed (scheduler down), $policy", ({ policy, fire }) => {
      const p = planAfter(t, null, at + 60 * S, policy, { createdAtMs: NOW });
      expect(p).toEqual({ fire, missed: 1, nextSlotMs: null });
      // Whatever fired, planning again from that slot yields nothing more.
      expect(planAfter(t, at, at + 61 * S, policy)).toEqual({ fire: [], missed: 0, nextSlotMs: null });
    });

    it("an `at` slightly in the past at creation still fires once, even under skip", () => {
      const spec = parseTrigger({ at: "2025-12-31T23:59:30Z" }, NOW);
      const late = compileTrigger(spec);
      for (const policy of ["once", "skip"] as const) {
        const p = planAfter(late, null, NOW, policy);
        expect(p).toEqual({ fire: [{ slotMs: NOW - 30 * S, dueMs: NOW, catchUp: true }], missed: 1, nextSlotMs: null });
        expect(planAfter(late, p.fire[0]!.slotMs, NOW + S, policy)).toEqual({ fire: [], missed: 0, nextSlotMs: null });
      }
    });
  });

  describe("fixed_delay", () => {
    const t = compileTrigger({ kind: "fixed_delay", delayMs: 10_000 });
    it("measures from the previous run's completion", () => {
      expect(planAfter(t, NOW + 4 * S, NOW + 4 * S, "once")).toEqual({ fire: [], missed: 0, nextSlotMs: NOW + 14 * S });
    });
    it.each([
      { policy: "once" as const, plan: { fire: [{ slotMs: NOW + 14 * S, dueMs: NOW + 60 * S, catchUp: true }], missed: 1, nextSlotMs: null } },
      { policy: "all" as const, plan: { fire: [{ slotMs: NOW + 14 * S, dueMs: NOW + 14 * S, catchUp: true }], missed: 1, nextSlotMs: null } },
      { policy: "skip" as const, plan: { fire: [], missed: 1, nextSlotMs: NOW + 70 * S } },
    ])("at most one slot is ever missed ($policy)", ({ policy, plan }) => {
      expect(planAfter(t, NOW + 4 * S, NOW + 60 * S, policy)).toEqual(plan);
    });
  });

  it("a long cron outage is bounded: missed saturates, the latest slots still fire, cadence resumes", () => {
    const t = cron("* * * * * *");
    const last = NOW;
    const now = NOW + 3 * 3_600_000; // 10 798 slots missed (grace 1s)
    const started = performance.now();
    const all = planAfter(t, last, now, "all");
    expect(performance.now() - started).toBeLessThan(5_000);
    expect(all.missed).toBe(CRON_MISSED_COUNT_LIMIT);
    expect(all.fire.map((f) => f.slotMs)).toEqual(Array.from({ length: 100 }, (_, i) => now - 101 * S + i * S));
    expect(all.nextSlotMs).toBe(now - S);
    const once = planAfter(t, last, now, "once");
    expect(once.fire).toEqual([{ slotMs: now - 2 * S, dueMs: now, catchUp: true }]);
    expect(once.nextSlotMs).toBe(now - S);
    expect(planAfter(t, last, now, "skip")).toEqual({ fire: [], missed: CRON_MISSED_COUNT_LIMIT, nextSlotMs: now - S });
  });

  it("a cron outage just over the limit is still consistent across the repeated hour", () => {
    // Every second through the New York fall-back: the forward chain visits every UTC second.
    const t = cron("* * * * * *", "America/New_York");
    const last = T("2026-11-01T04:00:00Z");
    const now = T("2026-11-01T07:00:00Z");
    const p = planAfter(t, last, now, "all", { maxCatchUp: 3 });
    expect(p.missed).toBe(CRON_MISSED_COUNT_LIMIT); // 10 798 slots: the jump path ran
    expect(p.fire.map((f) => iso(f.slotMs))).toEqual(["2026-11-01T06:59:56.000Z", "2026-11-01T06:59:57.000Z", "2026-11-01T06:59:58.000Z"]);
    expect(iso(p.nextSlotMs)).toBe("2026-11-01T06:59:59.000Z");
  });

  it("refuses bad arguments naming them", () => {
    expect(caught(() => planAfter(rate10s, null, NOW, "sometimes" as "once")).field).toBe("misfire");
    expect(caught(() => planAfter(rate10s, Number.NaN, NOW, "once")).field).toBe("lastSlotMs");
    expect(caught(() => planAfter(rate10s, null, NOW, "once", { graceMs: -1 })).field).toBe("graceMs");
    expect(caught(() => planAfter(rate10s, null, NOW, "all", { maxCatchUp: 1.5 })).field).toBe("maxCatchUp");
  });
});

/* ------------------------------------------------------------------------------------------ */

describe("cron expression cache", () => {
  it("the same expr+tz is parsed once, and spellings of the same zone share the entry", () => {
    const before = cronCacheStats().parses;
    const a = compileTrigger({ kind: "cron", expr: "7 7 7 * *", tz: "Asia/Shanghai" });
    const b = compileTrigger({ kind: "cron", expr: "7 7 7 * *", tz: "Asia/Shanghai" });
    compileTrigger(parseTrigger({ cron: " 7  7 7 * * ", tz: "asia/shanghai" }, NOW));
    expect(cronCacheStats().parses).toBe(before + 1);
    expect(cachedCron("7 7 7 * *", "Asia/Shanghai")).toBe(cachedCron("7  7 7 * *", "asia/shanghai"));
    expect(a.next(NOW)).toBe(b.next(NOW));
    // A different zone is a different expression.
    compileTrigger({ kind: "cron", expr: "7 7 7 * *", tz: "UTC" });
    expect(cronCacheStats().parses).toBe(before + 2);
  });

  it("triggers sharing a parsed expression do not disturb each other", () => {
    const x = cron("0 9 * * *", "Asia/Shanghai");
    const y = cron("0 9 * * *", "Asia/Shanghai");
    expect(x.next(T("2026-01-01T00:00:00Z"))).toBe(T("2026-01-01T01:00:00Z"));
    expect(y.next(T("2026-06-01T02:00:00Z"))).toBe(T("2026-06-02T01:00:00Z"));
    expect(x.next(T("2026-01-01T00:00:00Z"))).toBe(T("2026-01-01T01:00:00Z"));
  });
});
