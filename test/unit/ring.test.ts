import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { assignShards, HashRing, planMoves } from "../../cluster/index.ts";

const randomIds = (n: number) => Array.from({ length: n }, () => `node-${randomBytes(4).toString("hex")}`);

function loads(a: Map<number, string>, nodes: string[]): Map<string, number> {
  const l = new Map(nodes.map((n) => [n, 0]));
  for (const n of a.values()) l.set(n, (l.get(n) ?? 0) + 1);
  return l;
}
const ratio = (l: Map<string, number>) => Math.max(...l.values()) / Math.max(1, Math.min(...l.values()));
function shuffle<T>(xs: T[]): T[] {
  const a = [...xs];
  for (let i = a.length - 1; i > 0; i--) { const j = Math.floor(Math.random() * (i + 1)); [a[i], a[j]] = [a[j]!, a[i]!]; }
  return a;
}

describe("assignShards", () => {
  for (const n of [3, 4, 5]) {
    it(`balances 64 and 1024 shards over ${n} nodes with random ids (busiest/idlest <= 1.5, within the load bound)`, () => {
      for (let trial = 0; trial < 20; trial++) {
        const nodes = randomIds(n);
        for (const shardCount of [64, 1024]) {
          const a = assignShards({ shardCount, nodes });
          expect(a.size).toBe(shardCount);
          const l = loads(a, nodes);
          expect(ratio(l)).toBeLessThanOrEqual(1.5);
          expect(Math.max(...l.values())).toBeLessThanOrEqual(Math.ceil(shardCount / n));
          for (const owner of a.values()) expect(nodes).toContain(owner);
        }
      }
    });
  }

  it("is deterministic: node order, owner order and repeated calls do not change the result", () => {
    for (let trial = 0; trial < 20; trial++) {
      const nodes = randomIds(4);
      const base = assignShards({ shardCount: 64, nodes });
      const owners = new Map([...base].filter(([s]) => s % 3 !== 0)); // a partial, sticky view
      const pins = new Map([[5, nodes[2]!], [9, nodes[0]!]]);
      const one = assignShards({ shardCount: 64, nodes, owners, pins });
      const two = assignShards({ shardCount: 64, nodes: shuffle(nodes), owners: new Map(shuffle([...owners])), pins: new Map(shuffle([...pins])) });
      expect([...two].sort((a, b) => a[0] - b[0])).toEqual([...one].sort((a, b) => a[0] - b[0]));
      expect(assignShards({ shardCount: 64, nodes: shuffle(nodes) })).toEqual(base);
    }
  });

  it("is a fixed point: feeding an assignment back as the owners changes nothing", () => {
    for (const n of [3, 4, 5]) {
      const nodes = randomIds(n);
      const a = assignShards({ shardCount: 64, nodes });
      expect(planMoves(a, assignShards({ shardCount: 64, nodes, owners: a }))).toEqual([]);
    }
  });

  it("a node joining takes about shards/(N+1), only from the others, and nothing moves between old nodes", () => {
    for (let trial = 0; trial < 30; trial++) {
      for (const n of [3, 4]) {
        const nodes = randomIds(n);
        const before = assignShards({ shardCount: 64, nodes });
        const joined = randomIds(1)[0]!;
        const after = assignShards({ shardCount: 64, nodes: [...nodes, joined], owners: before });
        const moves = planMoves(before, after);
        for (const m of moves) expect(m.to).toBe(joined);
        const ideal = 64 / (n + 1);
        expect(moves.length).toBeGreaterThanOrEqual(Math.floor(ideal) - 1);
        expect(moves.length).toBeLessThanOrEqual(Math.ceil(ideal));
        expect(ratio(loads(after, [...nodes, joined]))).toBeLessThanOrEqual(1.5);
      }
    }
  });

  it("a node leaving moves only its own shards, spread over the others within the bound", () => {
    for (let trial = 0; trial < 30; trial++) {
      const nodes = randomIds(4);
      const before = assignShards({ shardCount: 64, nodes });
      const gone = nodes[trial % 4]!;
      const rest = nodes.filter((x) => x !== gone);
      const owners = new Map([...before].filter(([, n]) => n !== gone));
      const after = assignShards({ shardCount: 64, nodes: rest, owners });
      const moves = planMoves(before, after);
      expect(moves.length).toBe([...before.values()].filter((n) => n === gone).length);
      for (const m of moves) expect(m.from).toBe(gone);
      const l = loads(after, rest);
      expect(Math.max(...l.values())).toBeLessThanOrEqual(Math.ceil(64 / 3));
      expect(ratio(l)).toBeLessThanOrEqual(1.5);
    }
  });

  it("pins win over stickiness and the ring; a pin to a node that is not live is ignored", () => {
    const nodes = ["a", "b", "c"];
    const base = assignShards({ shardCount: 64, nodes });
    const s = [...base].find(([, n]) => n === "a")![0];
    const pinned = assignShards({ shardCount: 64, nodes, owners: base, pins: new Map([[s, "c"], [s + 1 < 64 ? s + 1 : 0, "zz"]]) });
    expect(pinned.get(s)).toBe("c");
    const moves = planMoves(base, pinned);
    expect(moves.map((m) => m.shard)).toContain(s);
    // The pinned node gives one shard back at most (its load bound), nothing else moves.
    expect(moves.length).toBeLessThanOrEqual(2);
    for (const to of pinned.values()) expect(nodes).toContain(to);
  });

  it("with no nodes assigns nothing; with one node assigns everything to it", () => {
    expect(assignShards({ shardCount: 8, nodes: [] }).size).toBe(0);
    const one = assignShards({ shardCount: 8, nodes: ["solo"] });
    expect([...one.values()]).toEqual(Array(8).fill("solo"));
  });
});

describe("HashRing", () => {
  it("gives every shard a preference order over all distinct nodes", () => {
    const ring = new HashRing(["x", "y", "z", "y"]);
    for (let s = 0; s < 64; s++) {
      const p = ring.preference(s);
      expect([...p].sort()).toEqual(["x", "y", "z"]);
    }
  });
});
