/**
 * Shard → node assignment: a consistent-hash ring with virtual nodes gives every shard a
 * preference order over nodes; a load bound (ceil(shards / nodes)) and stickiness to current
 * owners turn that order into an assignment that is balanced and moves few shards.
 *
 * The function is pure: every node computes it from the same inputs (live schedulable members,
 * current lease owners, operator pins) and so agrees on the result without talking.
 *
 * Phases:
 *  1. pins: a shard pinned to a live, schedulable node goes there (operator pins, and the moves
 *     of a rebalance in progress);
 *  2. stickiness: a node keeps the shards it already owns, best-ranked first, up to the bound;
 *  3. the rest, in shard order, go to the first node in the shard's ring order below the bound.
 * A node joining an N-node cluster therefore takes about shards/(N+1) shards, all from others'
 * overflow, and no shard moves between the old nodes.
 */
export interface AssignmentInput {
  shardCount: number;
  /** Live nodes that may own shards (not draining). */
  nodes: readonly string[];
  /** Current owner per shard (from the lease bucket), if any. */
  owners?: ReadonlyMap<number, string>;
  /** Operator pins. */
  pins?: ReadonlyMap<number, string>;
  vnodes?: number;
}

export function hash32(s: string): number {
  // FNV-1a followed by a murmur3 finalizer: cheap and well spread for short keys.
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b); h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35); h ^= h >>> 16;
  return h >>> 0;
}

export class HashRing {
  private readonly points: Array<{ at: number; node: string }>;
  readonly nodes: readonly string[];
  constructor(nodes: readonly string[], vnodes = 160) {
    this.nodes = [...new Set(nodes)].sort();
    this.points = [];
    for (const n of this.nodes) for (let v = 0; v < vnodes; v++) this.points.push({ at: hash32(`${n}#${v}`), node: n });
    this.points.sort((a, b) => a.at - b.at || (a.node < b.node ? -1 : 1));
  }
  /** Distinct nodes in clockwise order from the shard's point. */
  preference(shard: number): string[] {
    const out: string[] = [];
    if (!this.points.length) return out;
    const h = hash32(`shard:${shard}`);
    let lo = 0, hi = this.points.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (this.points[mid]!.at < h) lo = mid + 1; else hi = mid; }
    for (let i = 0; i < this.points.length && out.length < this.nodes.length; i++) {
      const p = this.points[(lo + i) % this.points.length]!;
      if (!out.includes(p.node)) out.push(p.node);
    }
    return out;
  }
}

/** Every shard's preference order; the last result is kept (nodes reconcile often, membership rarely changes). */
let lastPrefs: { key: string; prefs: string[][] } | null = null;
function preferences(nodes: string[], shardCount: number, vnodes: number | undefined): string[][] {
  const key = `${shardCount}|${vnodes ?? ""}|${nodes.join("\u0000")}`;
  if (lastPrefs?.key === key) return lastPrefs.prefs;
  const ring = new HashRing(nodes, vnodes);
  const prefs: string[][] = [];
  for (let s = 0; s < shardCount; s++) prefs.push(ring.preference(s));
  lastPrefs = { key, prefs };
  return prefs;
}

export function assignShards(input: AssignmentInput): Map<number, string> {
  const result = new Map<number, string>();
  const nodes = [...new Set(input.nodes)].sort();
  if (!nodes.length) return result;
  const live = new Set(nodes);
  const bound = Math.ceil(input.shardCount / nodes.length);
  const load = new Map(nodes.map((n) => [n, 0]));
  const prefs = preferences(nodes, input.shardCount, input.vnodes);
  const give = (s: number, n: string) => { result.set(s, n); load.set(n, load.get(n)! + 1); };

  for (const [s, n] of input.pins ?? []) if (s < input.shardCount && live.has(n)) give(s, n);

  const byOwner = new Map<string, number[]>();
  for (const [s, n] of input.owners ?? []) {
    if (s >= input.shardCount || result.has(s) || !live.has(n)) continue;
    if (!byOwner.has(n)) byOwner.set(n, []);
    byOwner.get(n)!.push(s);
  }
  for (const [n, owned] of [...byOwner].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
    owned.sort((a, b) => prefs[a]!.indexOf(n) - prefs[b]!.indexOf(n) || a - b);
    for (const s of owned) if (load.get(n)! < bound) give(s, n);
  }

  for (let s = 0; s < input.shardCount; s++) {
    if (result.has(s)) continue;
    const n = prefs[s]!.find((x) => load.get(x)! < bound) ?? prefs[s]![0]!;
    give(s, n);
  }
  return result;
}

/** The moves from `current` owners to `target`, for `ax shards rebalance --dry-run`. */
export function planMoves(current: ReadonlyMap<number, string>, target: ReadonlyMap<number, string>): Array<{ shard: number; from: string | null; to: string }> {
  const moves: Array<{ shard: number; from: string | null; to: string }> = [];
  for (const [s, to] of [...target].sort((a, b) => a[0] - b[0])) {
    const from = current.get(s) ?? null;
    if (from !== to) moves.push({ shard: s, from, to });
  }
  return moves;
}
