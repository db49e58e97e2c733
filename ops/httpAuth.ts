import { createHash, randomBytes, scrypt, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { AxError } from "../common/index.ts";

/**
 * Bearer tokens for the HTTP API. A token is `<name>.<secret>`; the tokens file holds, per
 * line, `<name> <role> scrypt$N$r$p$<salt>$<hash>` (base64url), so the file alone does not
 * let anyone in. Roles are ordered: read < operate < admin.
 */
export type Role = "read" | "operate" | "admin";
export const ROLES: readonly Role[] = ["read", "operate", "admin"];
const RANK: Record<Role, number> = { read: 0, operate: 1, admin: 2 };
export const roleAllows = (have: Role, need: Role) => RANK[have] >= RANK[need];

const TOKEN_NAME_RE = /^[A-Za-z0-9_-]{1,64}$/;
const SCRYPT = { N: 16384, r: 8, p: 1, keyLen: 32 };

interface Entry { name: string; role: Role; N: number; r: number; p: number; salt: Buffer; hash: Buffer }

function scryptAsync(secret: string, salt: Buffer, N: number, r: number, p: number, keyLen: number): Promise<Buffer> {
  return new Promise((resolve, reject) => scrypt(secret, salt, keyLen, { N, r, p, maxmem: 256 * N * r }, (e, k) => (e ? reject(e) : resolve(k))));
}

/** A new token for `name` with `role` (or the given secret): the token to hand out and the line for the tokens file. */
export async function hashToken(name: string, role: Role, secret = randomBytes(24).toString("base64url")): Promise<{ token: string; line: string }> {
  if (!TOKEN_NAME_RE.test(name)) throw new AxError("AX_E_INVALID", `name: use letters, digits, _ or - (at most 64) (got ${JSON.stringify(name)})`, { field: "name", value: name });
  if (!ROLES.includes(role)) throw new AxError("AX_E_INVALID", `role: must be read, operate or admin (got ${JSON.stringify(role)})`, { field: "role", value: role });
  if (secret.length < 16 || /\s/.test(secret)) throw new AxError("AX_E_INVALID", "token: at least 16 characters, no spaces", { field: "token" });
  const salt = randomBytes(16);
  const hash = await scryptAsync(secret, salt, SCRYPT.N, SCRYPT.r, SCRYPT.p, SCRYPT.keyLen);
  return { token: `${name}.${secret}`, line: `${name} ${role} scrypt$${SCRYPT.N}$${SCRYPT.r}$${SCRYPT.p}$${salt.toString("base64url")}$${hash.toString("base64url")}` };
}

export function parseTokensFile(path: string): Map<string, Entry> {
  const out = new Map<string, Entry>();
  const lines = readFileSync(path, "utf8").split("\n");
  lines.forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith("#")) return;
    const bad = (why: string): never => { throw new AxError("AX_E_CONFIG", `AX_HTTP_TOKENS_FILE line ${i + 1}: ${why} (expected: name role scrypt$N$r$p$salt$hash, from ax token hash)`, { field: "AX_HTTP_TOKENS_FILE", value: `line ${i + 1}` }); };
    const [name, role, h, extra] = line.split(/\s+/);
    if (extra !== undefined || !name || !role || !h) bad("three fields");
    if (!TOKEN_NAME_RE.test(name!)) bad(`name ${JSON.stringify(name)}`);
    if (!ROLES.includes(role as Role)) bad(`role ${JSON.stringify(role)} (read, operate or admin)`);
    const m = /^scrypt\$(\d+)\$(\d+)\$(\d+)\$([A-Za-z0-9_-]+)\$([A-Za-z0-9_-]+)$/.exec(h!);
    if (!m) bad("the hash is not scrypt$N$r$p$salt$hash");
    const [N, r, p] = [Number(m![1]), Number(m![2]), Number(m![3])];
    if (N < 1024 || N > 1 << 20 || (N & (N - 1)) !== 0 || r < 1 || r > 32 || p < 1 || p > 16) bad("scrypt parameters out of range");
    if (out.has(name!)) bad(`name ${name} appears twice`);
    out.set(name!, { name: name!, role: role as Role, N, r, p, salt: Buffer.from(m![4]!, "base64url"), hash: Buffer.from(m![5]!, "base64url") });
  });
  return out;
}

/**
 * Checks presented tokens. A verified token is remembered by its SHA-256 (scrypt costs tens of
 * milliseconds, the dashboard asks every 2 s); at most `maxConcurrent` scrypt checks run at
 * once, so a flood of wrong tokens costs the node a bounded share of its CPU.
 */
export class TokenVerifier {
  private readonly verified = new Map<string, Entry>();
  private running = 0;
  private readonly waiting: Array<() => void> = [];
  private readonly dummy: Entry;
  constructor(private readonly entries: Map<string, Entry>, private readonly maxConcurrent = 2) {
    this.dummy = { name: "", role: "read", N: SCRYPT.N, r: SCRYPT.r, p: SCRYPT.p, salt: randomBytes(16), hash: randomBytes(SCRYPT.keyLen) };
  }
  get size(): number { return this.entries.size; }

  /** The token's name and role, or null when it is not valid. */
  async verify(token: string): Promise<{ name: string; role: Role } | null> {
    if (token.length > 512) return null;
    const key = createHash("sha256").update(token).digest("hex");
    const hit = this.verified.get(key);
    if (hit) return { name: hit.name, role: hit.role };
    const dot = token.indexOf(".");
    const name = dot > 0 ? token.slice(0, dot) : "";
    const secret = dot > 0 ? token.slice(dot + 1) : token;
    // An unknown name costs the same scrypt as a known one: timing tells nothing about which names exist.
    const e = this.entries.get(name) ?? this.dummy;
    await this.slot();
    let derived: Buffer;
    try { derived = await scryptAsync(secret, e.salt, e.N, e.r, e.p, e.hash.length); } finally { this.release(); }
    if (e === this.dummy || !timingSafeEqual(derived, e.hash)) return null;
    if (this.verified.size >= 1000) this.verified.clear();
    this.verified.set(key, e);
    return { name: e.name, role: e.role };
  }

  private async slot(): Promise<void> {
    if (this.running < this.maxConcurrent) { this.running++; return; }
    await new Promise<void>((r) => this.waiting.push(r));
  }
  private release(): void {
    const next = this.waiting.shift();
    if (next) next(); else this.running--;
  }
}
