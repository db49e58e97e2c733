import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A free loopback TCP port (bound and released). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => { const p = (s.address() as { port: number }).port; s.close(() => resolve(p)); });
  });
}

/**
 * A nats-server of the test's own (loopback, free port, JetStream in a temp dir), started from
 * a configuration text (`{{PORT}}` and `{{STORE}}` are filled in). Never the shared server.
 */
export class OwnNatsServer {
  port = 0;
  dir = "";
  private proc: ChildProcess | null = null;
  log = "";
  constructor(private readonly configText: string, private readonly env: Record<string, string> = {}) {}

  get url(): string { return `nats://127.0.0.1:${this.port}`; }

  async start(): Promise<void> {
    this.port = await freePort();
    this.dir = mkdtempSync(join(tmpdir(), "ax-nats-"));
    const conf = join(this.dir, "nats.conf");
    writeFileSync(conf, this.configText.replaceAll("{{PORT}}", String(this.port)).replaceAll("{{STORE}}", join(this.dir, "js")).replaceAll("{{DIR}}", this.dir));
    this.proc = spawn("nats-server", ["-c", conf], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...this.env } });
    this.proc.stdout!.on("data", (d) => { this.log += d; });
    this.proc.stderr!.on("data", (d) => { this.log += d; });
    const deadline = Date.now() + 10_000;
    while (!/Server is ready/.test(this.log)) {
      if (this.proc.exitCode !== null) throw new Error(`nats-server exited: ${this.log}`);
      if (Date.now() > deadline) throw new Error(`nats-server did not start: ${this.log}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Writes a file into the server's temp dir (certificates, creds) and returns its path. */
  file(name: string, content: string): string {
    if (!this.dir) this.dir = mkdtempSync(join(tmpdir(), "ax-nats-"));
    const p = join(this.dir, name);
    writeFileSync(p, content);
    return p;
  }

  /** SIGSTOP freezes the server with its connections open (nothing answered, nothing refused); SIGCONT resumes it. */
  signal(sig: "SIGSTOP" | "SIGCONT"): void { this.proc?.kill(sig); }

  async stop(): Promise<void> {
    this.proc?.kill("SIGCONT");
    const p = this.proc;
    if (p && p.exitCode === null) {
      const exited = new Promise((r) => p.once("exit", r));
      p.kill("SIGTERM");
      await Promise.race([exited, new Promise((r) => setTimeout(r, 3000))]);
      if (p.exitCode === null) p.kill("SIGKILL");
    }
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
  }
}
