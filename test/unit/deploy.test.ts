import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { pathToFileURL } from "node:url";
import { join } from "node:path";
import type { Command, Option } from "commander";
import { parse, parseAllDocuments } from "yaml";
import { describe, expect, it } from "vitest";
import { ENV_DEFAULTS, NATS_AUTH_DOCS, OPTIONAL_DOCS, loadConfig } from "../../common/index.ts";
import { buildProgram } from "../../ops/cli.ts";
import { launcherFlags } from "../../bench/launcher.ts";

/**
 * Docker and Kubernetes cannot run here, so the deployment files are checked for what can go
 * wrong without them: they parse, every ax command in them exists with its options, every AX_*
 * variable is one ax reads (or one issue 14 is adding), every file they name exists or is built
 * from a source that exists, and nothing is published without authentication.
 */
const ROOT = process.cwd();
const read = (p: string) => readFileSync(join(ROOT, p), "utf8");
const SOURCE_DIRS = ["common", "cluster", "actors", "protocol", "ops"];


/** AX_* variables ax reads: the configuration's plus those read straight from process.env in the sources. */
function knownVars(): Set<string> {
  const vars = new Set([...Object.keys(ENV_DEFAULTS), ...Object.keys(NATS_AUTH_DOCS), ...Object.keys(OPTIONAL_DOCS)]);
  for (const dir of SOURCE_DIRS) {
    for (const f of readdirSync(join(ROOT, dir), { recursive: true })) {
      if (!String(f).endsWith(".ts")) continue;
      for (const m of read(join(dir, String(f))).matchAll(/process\.env\.(AX_[A-Z0-9_]+)/g)) vars.add(m[1]!);
    }
  }
  return vars;
}
const KNOWN = knownVars();
const expectKnown = (names: string[], where: string) => {
  const axVars = names.filter((n) => n.startsWith("AX_"));
  expect(axVars.filter((n) => !KNOWN.has(n)), `unknown AX_* variables in ${where}`).toEqual([]);
};

/** Walks `args` through the CLI's commands and options as commander would; fails on any unknown one. */
function expectCliArgs(args: string[], where: string): void {
  const program = buildProgram(() => undefined);
  let cmd: Command = program;
  const path = ["ax"];
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (a.startsWith("-")) {
      const flag = a.split("=")[0]!;
      const opt = [...cmd.options, ...program.options].find((o: Option) => o.long === flag || o.short === flag);
      expect(opt, `${where}: ${path.join(" ")} has no option ${flag}`).toBeDefined();
      if (!a.includes("=") && (opt!.required || opt!.optional)) i++;
      continue;
    }
    const sub = cmd.commands.find((c) => c.name() === a);
    if (sub) { cmd = sub; path.push(a); continue; }
    expect(cmd.registeredArguments.length, `${where}: ${path.join(" ")} takes no argument ${a}`).toBeGreaterThan(0);
  }
  expect(cmd, `${where}: ${args.join(" ")} names no command`).not.toBe(program);
  // A command with subcommands and no action of its own (ax task) does nothing by itself.
  const hasAction = (cmd as unknown as { _actionHandler: unknown })._actionHandler != null;
  expect(hasAction || cmd.commands.length === 0, `${where}: ${path.join(" ")} needs a subcommand`).toBe(true);
}

/** A compiled file the build makes (dist/x/y.js) exists as a source (x/y.ts) in a folder the build compiles. */
function expectBuiltFrom(distPath: string, where: string): void {
  const build = JSON.parse(read("tsconfig.build.json")) as { compilerOptions: { outDir: string; rewriteRelativeImportExtensions: boolean }; include: string[] };
  expect(build.compilerOptions.outDir).toBe("dist");
  expect(build.compilerOptions.rewriteRelativeImportExtensions).toBe(true);
  const m = /^dist\/(.+)\.js$/.exec(distPath);
  expect(m, `${where}: ${distPath} is not a compiled file under dist/`).not.toBeNull();
  expect(existsSync(join(ROOT, `${m![1]}.ts`)), `${where}: no source ${m![1]}.ts for ${distPath}`).toBe(true);
  expect(build.include).toContain(m![1]!.split("/")[0]);
}

/** Compose's ${VAR:-default} / ${VAR:?message} with a sample value for every required one. */
function interpolate(s: string): string {
  return s.replace(/\$\{([A-Z0-9_]+)(?::([-?])([^}]*))?\}/g, (_, _name: string, kind: string | undefined, rest: string) => (kind === "-" ? rest : "sample"));
}

describe("Dockerfile", () => {
  const text = read("Dockerfile");
  const stages = text.split(/^FROM /m).slice(1);
  const runtime = stages[stages.length - 1]!;

  it("runs the compiled CLI with production dependencies only", () => {
    const entry = JSON.parse(/^ENTRYPOINT (.+)$/m.exec(runtime)![1]!) as string[];
    expect(entry).toEqual(["node", "dist/ops/cli.js"]);
    expectBuiltFrom(entry[1]!, "Dockerfile ENTRYPOINT");
    expectCliArgs(JSON.parse(/^CMD (.+)$/m.exec(runtime)![1]!) as string[], "Dockerfile CMD");
    expect(runtime).toMatch(/npm ci --omit=dev/);
    expect(runtime).toMatch(/^COPY --from=build \/src\/dist dist$/m);
    expect(runtime).not.toMatch(/tsx/);
    // The runtime stage copies no TypeScript sources.
    for (const dir of SOURCE_DIRS) expect(runtime).not.toMatch(new RegExp(`^COPY ${dir}\\b`, "m"));
    expect(runtime).toMatch(/^USER node$/m);
  });

  it("copies only files that exist and .dockerignore keeps", () => {
    const ignored = read(".dockerignore").split("\n").map((l) => l.trim()).filter(Boolean);
    for (const m of text.matchAll(/^COPY (?!--from)(.+)$/gm)) {
      const parts = m[1]!.trim().split(/\s+/);
      for (const src of parts.slice(0, -1)) {
        expect(existsSync(join(ROOT, src)), `COPY ${src}`).toBe(true);
        expect(ignored, `COPY ${src} is excluded by .dockerignore`).not.toContain(src.split("/")[0]);
      }
    }
    expect(ignored).toContain("dist"); // the image builds its own
    expectKnown([...text.matchAll(/^ENV (AX_[A-Z0-9_]+)=/gm)].map((m) => m[1]!), "Dockerfile");
  });
});

describe("docker-compose.yml", () => {
  const text = read("docker-compose.yml");
  const doc = parse(text, { merge: true }) as {
    services: Record<string, { build?: string; image?: string; command?: string[]; ports?: string[]; environment?: Record<string, string>; depends_on?: Record<string, unknown>; volumes?: string[]; healthcheck?: { test: string[] } }>;
    volumes: Record<string, unknown>;
  };
  const services = doc.services;
  const axServices = Object.entries(services).filter(([, s]) => s.image?.startsWith("ax:"));

  it("parses, and its ax services run commands the CLI has", () => {
    expect(axServices.map(([n]) => n).sort()).toEqual(["ax1", "ax2", "ax3", "executor"]);
    for (const [name, s] of axServices) {
      expect(s.build, name).toBe(".");
      expectCliArgs(s.command!, `compose ${name}`);
      for (const dep of Object.keys(s.depends_on ?? {})) expect(Object.keys(services), `${name} depends on ${dep}`).toContain(dep);
      const shell = s.healthcheck?.test.find((t) => t.includes("dist/ops/cli.js"));
      if (shell) {
        const m = /node (dist\/ops\/cli\.js) ([^|]+)\|/.exec(shell)!;
        expectBuiltFrom(m[1]!, `compose ${name} healthcheck`);
        expectCliArgs(m[2]!.trim().split(/\s+/), `compose ${name} healthcheck`);
      }
    }
    expect(existsSync(join(ROOT, "Dockerfile"))).toBe(true);
    const ignored = read(".gitignore").split("\n").map((l) => l.trim());
    for (const s of Object.values(services)) {
      for (const v of s.volumes ?? []) {
        const src = v.split(":")[0]!;
        // A bind mount names a file of the checkout, or one the operator creates (kept out of git: secrets).
        if (src.startsWith("./")) expect(existsSync(join(ROOT, src)) || ignored.includes(src.slice(2)), `compose mounts ${src}`).toBe(true);
        else expect(Object.keys(doc.volumes)).toContain(src);
      }
    }
  });

  it("gives ax only variables it reads, with values its configuration accepts", () => {
    for (const [name, s] of axServices) {
      expectKnown(Object.keys(s.environment!), `compose ${name}`);
      const env = Object.fromEntries(Object.entries(s.environment!).map(([k, v]) => [k, interpolate(String(v))]));
      // The tokens file is a path inside the container (mounted from ./deploy/http-tokens, checked above).
      delete env.AX_HTTP_TOKENS_FILE;
      expect(() => loadConfig(env), `compose ${name}`).not.toThrow();
    }
    // Every interpolation has a default or refuses to start without a value (none silently empty).
    for (const m of text.matchAll(/\$\{([^}]*)\}/g)) expect(m[1], `\${${m[1]}}`).toMatch(/^[A-Z0-9_]+:[-?]/);
  });

  it("publishes nothing beyond the host's loopback, and every server asks for a password", () => {
    for (const [name, s] of Object.entries(services)) for (const p of s.ports ?? []) expect(p, `${name} publishes ${p}`).toMatch(/^127\.0\.0\.1:\d+:\d+$/);
    const nats = services.nats!.command!;
    const user = nats[nats.indexOf("--user") + 1];
    const pass = nats[nats.indexOf("--pass") + 1];
    expect(pass).toMatch(/^\$\{AX_NATS_PASSWORD:\?/);
    for (const [name, s] of axServices) {
      expect(s.environment!.AX_NATS_USER, name).toBe(user);
      expect(s.environment!.AX_NATS_PASSWORD, name).toBe(pass);
      expect(s.environment!.AX_REDIS_URL, name).toContain(":${AX_REDIS_PASSWORD:?");
      expect(s.environment!.AX_PG_URL, name).toContain(":${AX_PG_PASSWORD:?");
    }
    expect(services.redis!.command).toContain("--requirepass");
    expect(services.postgres!.environment!.POSTGRES_PASSWORD).toMatch(/^\$\{AX_PG_PASSWORD:\?/);
    expect(JSON.stringify(services.postgres)).not.toMatch(/trust/);
  });
});

describe("deploy/kubernetes/ax.yaml", () => {
  const text = read("deploy/kubernetes/ax.yaml");
  const docs = parseAllDocuments(text).map((d) => {
    expect(d.errors).toEqual([]);
    return d.toJS() as { kind: string; metadata: { name: string; labels?: Record<string, string> }; data?: Record<string, string>; spec: Record<string, unknown> };
  });
  type Container = { args: string[]; env?: Array<{ name: string }>; envFrom?: Array<{ configMapRef?: { name: string }; secretRef?: { name: string } }>; ports?: Array<{ name: string }>;
    readinessProbe?: { httpGet: { port: string } }; livenessProbe?: { httpGet: { port: string } } };
  type Workload = { selector: { matchLabels: Record<string, string> }; template: { metadata: { labels: Record<string, string> }; spec: { containers: Container[] } } };
  const workloads = docs.filter((d) => d.kind === "StatefulSet" || d.kind === "Deployment");
  const configMaps = docs.filter((d) => d.kind === "ConfigMap");

  it("parses; containers run CLI commands with variables ax reads", () => {
    expect(docs.map((d) => d.kind).sort()).toEqual(["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "StatefulSet"]);
    for (const cm of configMaps) {
      expectKnown(Object.keys(cm.data!), `ConfigMap ${cm.metadata.name}`);
      expect(() => loadConfig({ ...cm.data, AX_PG_URL: "postgres://ax:x@pg:5432/ax" })).not.toThrow();
    }
    // The secret is made with kubectl (see the file's header): its keys are ax's too.
    const secretKeys = [...text.matchAll(/--from-literal=([A-Z0-9_]+)=/g)].map((m) => m[1]!);
    expect(secretKeys.length).toBeGreaterThan(0);
    expectKnown(secretKeys, "the secret's keys");
    for (const w of workloads) {
      const spec = w.spec as Workload;
      expect(spec.template.metadata.labels).toMatchObject(spec.selector.matchLabels);
      for (const c of spec.template.spec.containers) {
        expectCliArgs(c.args, `${w.kind} ${w.metadata.name}`);
        for (const ref of c.args.join(" ").matchAll(/\$\(([A-Z_]+)\)/g)) expect((c.env ?? []).map((e) => e.name), `$(${ref[1]})`).toContain(ref[1]);
        for (const from of c.envFrom ?? []) {
          if (from.configMapRef) expect(configMaps.map((m) => m.metadata.name)).toContain(from.configMapRef.name);
          if (from.secretRef) expect(text).toContain(`create secret generic ${from.secretRef.name}`);
        }
        for (const probe of [c.readinessProbe, c.livenessProbe]) if (probe) expect((c.ports ?? []).map((p) => p.name)).toContain(probe.httpGet.port);
      }
    }
  });

  it("exposes nothing outside the cluster; node ids are stable", () => {
    for (const s of docs.filter((d) => d.kind === "Service")) expect(s.spec.type ?? "ClusterIP").toBe("ClusterIP");
    expect(docs.some((d) => d.kind === "Ingress")).toBe(false);
    const nodes = workloads.find((w) => w.kind === "StatefulSet")!;
    expect((nodes.spec as Workload).template.spec.containers[0]!.args.join(" ")).toContain("--id $(POD_NAME)");
    const pdb = docs.find((d) => d.kind === "PodDisruptionBudget")!;
    expect((nodes.spec as Workload).template.metadata.labels).toMatchObject((pdb.spec.selector as { matchLabels: Record<string, string> }).matchLabels);
  });
});

describe("deploy/systemd", () => {
  const unit = read("deploy/systemd/ax-node.service");
  const sections = new Map<string, Map<string, string>>();
  let current: Map<string, string> | null = null;
  for (const raw of unit.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const sec = /^\[(\w+)\]$/.exec(line);
    if (sec) { current = new Map(); sections.set(sec[1]!, current); continue; }
    const kv = /^([A-Za-z]+)=(.*)$/.exec(line);
    expect(kv && current, `unit line: ${line}`).toBeTruthy();
    current!.set(kv![1]!, kv![2]!);
  }
  const KEYS: Record<string, string[]> = {
    Unit: ["Description", "Documentation", "Wants", "After", "Requires"],
    Service: ["Type", "User", "Group", "EnvironmentFile", "WorkingDirectory", "ExecStart", "KillSignal", "TimeoutStopSec", "Restart", "RestartSec", "LimitNOFILE",
      "NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
      "RestrictAddressFamilies", "RestrictNamespaces", "LockPersonality"],
    Install: ["WantedBy"],
  };

  it("is a unit of known sections and keys that starts the compiled CLI's node", () => {
    expect([...sections.keys()]).toEqual(["Unit", "Service", "Install"]);
    for (const [name, keys] of sections) for (const k of keys.keys()) expect(KEYS[name], `[${name}] ${k}`).toContain(k);
    const service = sections.get("Service")!;
    const [bin, ...rest] = service.get("ExecStart")!.split(/\s+/);
    expect(bin).toMatch(/^\/.+\/node$/);
    // Node's own flags come before the script (the launcher's V8 flags: see launchers below).
    const [script, ...args] = rest.slice(rest.findIndex((a) => !a.startsWith("--")));
    const dir = service.get("WorkingDirectory")!;
    expect(script!.startsWith(`${dir}/`)).toBe(true);
    expectBuiltFrom(script!.slice(dir.length + 1), "ExecStart");
    expectCliArgs(args, "ExecStart");
    expect(service.get("KillSignal")).toBe("SIGTERM");
  });

  it("has an example environment file of variables ax reads, with values its configuration accepts", () => {
    expect(sections.get("Service")!.get("EnvironmentFile")).toBe("/etc/ax/ax.env");
    const env = Object.fromEntries(read("deploy/systemd/ax.env.example").split("\n").filter((l) => l.trim() && !l.startsWith("#")).map((l) => {
      const i = l.indexOf("=");
      return [l.slice(0, i), l.slice(i + 1)];
    }));
    expectKnown(Object.keys(env), "ax.env.example");
    expect(() => loadConfig(env)).not.toThrow();
    expect(env.AX_HTTP_HOST).toBe("127.0.0.1");
  });
});

describe("launchers", () => {
  // bin/ax.mjs's launcher line carries the V8 flags the node runs with; every other way ax ships
  // to start a node passes the same ones, and the benchmark's node takes them from that line.
  const flags = launcherFlags();
  const joined = flags.join(" ");

  it("bin/ax.mjs names node and its flags on its launcher line", () => {
    expect(read("bin/ax.mjs").split("\n")[0]).toBe(`#!/usr/bin/env -S node ${joined}`);
    expect(flags).toContain("--max-semi-space-size=64");
  });

  it("the Dockerfile, the systemd unit and the demo pass the same flags", () => {
    expect(read("Dockerfile")).toMatch(new RegExp(`^ENV NODE_OPTIONS=${joined}$`, "m"));
    expect(read("deploy/systemd/ax-node.service")).toMatch(new RegExp(`^ExecStart=/usr/bin/node ${joined} /opt/ax/dist/ops/cli.js node `, "m"));
    expect(read("scripts/demo.sh")).toMatch(new RegExp(`^exec node ${joined} dist/ops/demo.js`, "m"));
  });

  it("refuses a launcher line that does not start node", () => {
    const dir = mkdtempSync(join(tmpdir(), "ax-launcher-"));
    try {
      writeFileSync(join(dir, "x.mjs"), "#!/bin/sh\n");
      expect(() => launcherFlags(pathToFileURL(join(dir, "x.mjs")))).toThrow(/launcher line/);
      writeFileSync(join(dir, "y.mjs"), "#!/usr/bin/env node\n");
      expect(launcherFlags(pathToFileURL(join(dir, "y.mjs")))).toEqual([]);
    } finally { rmSync(dir, { recursive: true, force: true }); }
  });
});
