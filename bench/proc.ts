import { readdirSync, readFileSync } from "node:fs";
import { execSync } from "node:child_process";

let clkTck = 100;
try { clkTck = Number(execSync("getconf CLK_TCK", { encoding: "utf8" }).trim()) || 100; } catch { /* keep 100 */ }

/** utime + stime (+ reaped children) of one process in seconds, from /proc/<pid>/stat; null if gone. */
export function procCpuS(pid: number, withChildren = false): number | null {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = s.slice(s.lastIndexOf(")") + 2).split(" ");
    // fields after "(comm)": state=0, ... utime=11, stime=12, cutime=13, cstime=14 (1-based 14..17)
    const t = Number(f[11]) + Number(f[12]) + (withChildren ? Number(f[13]) + Number(f[14]) : 0);
    return t / clkTck;
  } catch { return null; }
}

/** Resident set size of a process in MB, from /proc/<pid>/status. */
export function procRssMb(pid: number): number | null {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return m ? Number(m[1]) / 1024 : null;
  } catch { return null; }
}

const SERVERS: Record<string, "postgres" | "redis" | "nats"> = { postgres: "postgres", "redis-server": "redis", "nats-server": "nats" };

export interface ServersCpu { postgres: number; redis: number; nats: number; total: number; /** this run's own PostgreSQL backends */ pgOwn?: number; /** the bench process: executor + recorder */ executor?: number }

/**
 * CPU seconds used so far by every postgres, redis-server and nats-server process on the
 * machine (utime + stime + reaped children, so PostgreSQL backends that exited are counted
 * in the postmaster). Take it before and after a run and subtract.
 */
export function serversCpu(): ServersCpu {
  const out: ServersCpu = { postgres: 0, redis: 0, nats: 0, total: 0 };
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    let stat: string;
    try { stat = readFileSync(`/proc/${d}/stat`, "utf8"); } catch { continue; }
    const comm = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
    const key = SERVERS[comm];
    if (!key) continue;
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const t = (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / clkTck;
    out[key] += t;
  }
  out.total = out.postgres + out.redis + out.nats;
  return out;
}

export function diffServers(a: ServersCpu, b: ServersCpu): ServersCpu {
  const r = (x: number) => Math.round(x * 100) / 100;
  return { postgres: r(b.postgres - a.postgres), redis: r(b.redis - a.redis), nats: r(b.nats - a.nats), total: r(b.total - a.total) };
}
