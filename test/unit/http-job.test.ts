import { describe, expect, it } from "vitest";
import { hostAllowed, parseAllowList, parseHttpRequestSpec } from "../../ops/httpJob.ts";
import { runListFilters, taskListFilters } from "../../ops/opsFilters.ts";
import { buildProgram } from "../../ops/cli.ts";
import { completionScript } from "../../ops/completion.ts";

describe("HTTP job request spec", () => {
  it("takes a full request and fills defaults", () => {
    const s = parseHttpRequestSpec({ method: "put", url: "https://api.example.com/x/{{runId}}", headers: { "X-Due": "{{scheduledAt}}" }, body: { a: ["{{attempt}}", 1, null] }, timeout: "5s", successStatus: ["2xx", 304, "400-404"] });
    expect(s.method).toBe("PUT");
    expect(s.timeoutMs).toBe(5000);
    const d = parseHttpRequestSpec({ url: "http://h/" });
    expect(d.method).toBe("GET");
    expect(d.successStatus).toEqual(["2xx"]);
    expect(d.headers).toEqual({});
  });

  it("refuses, naming the field, what cannot be sent", () => {
    const cases: Array<[unknown, RegExp]> = [
      [null, /^payload: an HTTP job's payload is its request/],
      [{}, /^payload\.url: /],
      [{ url: "ftp://h/x" }, /^payload\.url: an absolute http/],
      [{ url: "http://h/{{nope}}" }, /^payload\.url: unknown template/],
      [{ url: "http://h/", method: "FETCH" }, /^payload\.method/],
      [{ url: "http://h/", headers: { "X-A": "a\r\nX-B: b" } }, /^payload\.headers\.X-A: no line breaks/],
      [{ url: "http://h/", headers: { "bad name": "x" } }, /^payload\.headers/],
      [{ url: "http://h/", successStatus: ["6xx"] }, /^payload\.successStatus\.0/],
      [{ url: "http://h/", timeout: "soon" }, /^payload\.timeout: not a duration/],
      [{ url: "http://h/", retries: 3 }, /^payload: unknown field\(s\) retries/],
      [{ url: "http://h/", body: { x: "{{runid}}" } }, /^payload\.body\.x: unknown template/],
    ];
    for (const [p, re] of cases) expect(() => parseHttpRequestSpec(p), JSON.stringify(p)).toThrow(re);
  });

  it("allow-list: exact hosts, wildcard subdomains, ports", () => {
    const allow = parseAllowList(["api.example.com", "*.internal:8443,127.0.0.1:9000"]);
    const ok = (u: string) => hostAllowed(new URL(u), allow);
    expect(ok("https://API.example.com/x")).toBe(true);
    expect(ok("https://evil-api.example.com/x")).toBe(false);
    expect(ok("https://a.b.internal:8443/")).toBe(true);
    expect(ok("https://internal:8443/")).toBe(false);
    expect(ok("https://a.internal/")).toBe(false);
    expect(ok("http://127.0.0.1:9000/")).toBe(true);
    expect(ok("http://127.0.0.1:9001/")).toBe(false);
    expect(ok("http://api.example.com.evil.io/")).toBe(false);
    expect(() => parseAllowList(["http://x"])).toThrow(/--allow-host/);
  });
});

describe("list filters", () => {
  it("task ls: state, executor, prefix", () => {
    expect(taskListFilters({ state: "paused", executor: "web", prefix: "nightly-" })).toEqual({ state: "paused", executor: "web", namePrefix: "nightly-" });
    expect(() => taskListFilters({ state: "asleep" })).toThrow(/^state: one of pending/);
    expect(() => taskListFilters({ executor: "a b" })).toThrow(/^executor/);
  });
  it("runs: outcome list, since as a time or a duration back", () => {
    const now = Date.parse("2026-12-03T12:00:00Z");
    expect(runListFilters({ outcome: "failed,stale", since: "1h30m" }, now)).toEqual({ states: ["failed", "stale"], sinceMs: now - 5_400_000 });
    expect(runListFilters({ since: "2026-12-01T00:00:00Z" }, now)).toEqual({ sinceMs: Date.parse("2026-12-01T00:00:00Z") });
    expect(() => runListFilters({ outcome: "ok" }, now)).toThrow(/^outcome/);
    expect(() => runListFilters({ since: "yesterday" }, now)).toThrow(/^since/);
  });
});

describe("shell completion", () => {
  it("knows every command path and the choices of flags", () => {
    const script = completionScript(buildProgram(() => undefined), "bash");
    for (const path of ["'task ls'", "'task create'", "'executor http'", "'shards rebalance'", "'completion'"]) expect(script).toContain(path);
    expect(script).toContain("'--misfire') words_='once skip all'");
    expect(script).toContain("'-o') words_='json yaml wide'");
    expect(completionScript(buildProgram(() => undefined), "zsh")).toContain("compdef __ax_complete ax");
  });
});
