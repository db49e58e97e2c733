/**
 * Summarises a V8 .cpuprofile (from `npm run bench -- … --prof DIR`):
 * `node --import tsx bench/cpuprof.ts FILE [--top 30]` prints self time per function and per file.
 */
import { readFileSync } from "node:fs";

interface Node { id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[]; hitCount?: number }
const file = process.argv[2];
if (!file) { process.stderr.write("usage: cpuprof.ts FILE [--top N]\n"); process.exit(2); }
const top = Number(process.argv[process.argv.indexOf("--top") + 1]) || 30;
const p = JSON.parse(readFileSync(file, "utf8")) as { nodes: Node[]; samples: number[]; timeDeltas: number[]; startTime: number; endTime: number };
const byId = new Map(p.nodes.map((n) => [n.id, n]));
const self = new Map<number, number>();
for (let i = 0; i < p.samples.length; i++) self.set(p.samples[i]!, (self.get(p.samples[i]!) ?? 0) + (p.timeDeltas[i] ?? 0));
const total = [...self.values()].reduce((a, b) => a + b, 0);
const short = (u: string) => u.replace(/^file:\/\/\/work\/main\//, "").replace(/.*node_modules\//, "nm/");
const fnSelf = new Map<string, number>(); const fileSelf = new Map<string, number>();
for (const [id, t] of self) {
  const n = byId.get(id)!; const f = n.callFrame;
  const k = `${f.functionName || "(anon)"} ${short(f.url)}:${f.lineNumber + 1}`;
  fnSelf.set(k, (fnSelf.get(k) ?? 0) + t);
  const fk = short(f.url) || `(${f.functionName})`;
  fileSelf.set(fk, (fileSelf.get(fk) ?? 0) + t);
}
// inclusive time per function name+url
const parent = new Map<number, number>();
for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const incl = new Map<string, number>();
for (const [id, t] of self) {
  const seen = new Set<string>();
  for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
    const f = byId.get(cur)!.callFrame;
    const k = `${f.functionName || "(anon)"} ${short(f.url)}:${f.lineNumber + 1}`;
    if (!seen.has(k)) { seen.add(k); incl.set(k, (incl.get(k) ?? 0) + t); }
  }
}
const pr = (title: string, m: Map<string, number>, n: number) => {
  process.stdout.write(`\n== ${title} (total ${(total / 1e6).toFixed(2)} s sampled)\n`);
  for (const [k, v] of [...m].sort((a, b) => b[1] - a[1]).slice(0, n)) process.stdout.write(`${(100 * v / total).toFixed(1).padStart(5)}%  ${(v / 1e6).toFixed(2).padStart(6)}s  ${k}\n`);
};
pr("self time by file", fileSelf, 25);
pr("self time by function", fnSelf, top);
pr("inclusive time by function", incl, top);

// --under NAME: inclusive time of every function called (directly or not) beneath frames named NAME.
const underIdx = process.argv.indexOf("--under");
if (underIdx > 0) {
  const name = process.argv[underIdx + 1]!;
  const sub = new Map<string, number>(); let base = 0;
  for (const [id, t] of self) {
    const chain: string[] = [];
    let hit = -1;
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const f = byId.get(cur)!.callFrame;
      chain.push(`${f.functionName || "(anon)"} ${short(f.url)}`);
      if (f.functionName === name) hit = chain.length - 1;
    }
    if (hit < 0) continue;
    base += t;
    const seen = new Set<string>();
    for (let i = 0; i < hit; i++) if (!seen.has(chain[i]!)) { seen.add(chain[i]!); sub.set(chain[i]!, (sub.get(chain[i]!) ?? 0) + t); }
  }
  process.stdout.write(`\n== beneath ${name}: ${(base / 1e6).toFixed(2)} s\n`);
  for (const [k, v] of [...sub].sort((a, b) => b[1] - a[1]).slice(0, top)) process.stdout.write(`${(100 * v / base).toFixed(1).padStart(5)}%  ${(v / 1e6).toFixed(2).padStart(6)}s  ${k}\n`);
}
