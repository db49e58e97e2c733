import { describe, expect, it } from "vitest";
import { findCycle } from "../../actors/store/graph.ts";
import { rng as mulberry32 } from "./cron-reference.ts";

/**
 * findCycle (the dependency graph's check before an edge is accepted) against a slow reference:
 * a graph has a cycle iff some node reaches itself. Random graphs with a fixed seed, each tried
 * in several edge orders (PostgreSQL returns the edges in no set order): the answer must not
 * depend on the order, and a cycle named must be a closed path of the graph's edges.
 */

type Edge = readonly [number, number];

function reachesItself(edges: readonly Edge[], n: number): boolean {
  const seen = new Set<number>();
  const stack = edges.filter(([a]) => a === n).map(([, b]) => b);
  while (stack.length) {
    const x = stack.pop()!;
    if (x === n) return true;
    if (seen.has(x)) continue;
    seen.add(x);
    for (const [a, b] of edges) if (a === x) stack.push(b);
  }
  return false;
}

function hasCycle(edges: readonly Edge[]): boolean {
  return [...new Set(edges.flat())].some((n) => reachesItself(edges, n));
}

function expectClosedPath(path: number[], edges: readonly Edge[], what: string): void {
  expect(path.length, what).toBeGreaterThanOrEqual(2);
  expect(path[0], what).toBe(path[path.length - 1]);
  const interior = path.slice(0, -1);
  expect(new Set(interior).size, `${what}: a node repeated inside the cycle ${path.join(" → ")}`).toBe(interior.length);
  for (let i = 0; i + 1 < path.length; i++) {
    expect(edges.some(([a, b]) => a === path[i] && b === path[i + 1]), `${what}: ${path[i]} → ${path[i + 1]} is not an edge`).toBe(true);
  }
}

describe("findCycle", () => {
  it("a cycle with a node downstream of it is found whatever the order of the edges", () => {
    // Before: [3 → 4] first made 4 the walk's start; 4 leads nowhere, and the cycle 1 → 2 → 3 → 1 went unreported.
    for (const edges of [[[1, 2], [2, 3], [3, 1], [3, 4]], [[3, 4], [1, 2], [2, 3], [3, 1]]] as Edge[][]) {
      const c = findCycle(edges);
      expect(c).not.toBeNull();
      expectClosedPath(c!, edges, JSON.stringify(edges));
    }
    expect(findCycle([[1, 2], [2, 3], [1, 3], [3, 4]])).toBeNull();
  });

  it("agrees with a slow reference on 3,000 random graphs, each in four edge orders", () => {
    const rnd = mulberry32(20261207);
    let cyclic = 0;
    for (let g = 0; g < 3000; g++) {
      const nodes = 2 + Math.floor(rnd() * 8);
      const m = Math.floor(rnd() * nodes * 2);
      const edges: Edge[] = [];
      for (let i = 0; i < m; i++) {
        const a = 1 + Math.floor(rnd() * nodes); const b = 1 + Math.floor(rnd() * nodes);
        if (a !== b && !edges.some(([x, y]) => x === a && y === b)) edges.push([a, b]);
      }
      const expected = hasCycle(edges);
      if (expected) cyclic++;
      for (let k = 0; k < 4; k++) {
        const order = k === 0 ? edges : [...edges].sort(() => rnd() - 0.5);
        const found = findCycle(order);
        const what = `graph ${g} ${JSON.stringify(order)}`;
        expect(found !== null, what).toBe(expected);
        if (found) expectClosedPath(found, edges, what);
      }
    }
    // Both kinds are well represented.
    expect(cyclic).toBeGreaterThan(500);
    expect(cyclic).toBeLessThan(2500);
  });
});
