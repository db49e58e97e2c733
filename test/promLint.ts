/**
 * A Prometheus text exposition (0.0.4) parser and the checks `promtool check metrics` makes
 * (its promlint rules), for tests: no promtool on the machines. Returns the problems found,
 * each naming the metric; an empty list means the text passes.
 *
 * Checked: every line parses (values as Go's ParseFloat reads them); each family has HELP and TYPE, declared once, before its
 * samples; names and label names are valid (no leading `__` label, no reserved `:` in names
 * we own, no camelCase); counters end in `_total`, nothing else does; histograms have
 * `_bucket` with `le` (including `+Inf`), `_sum` and `_count`, and summaries `_sum`/`_count`;
 * base units only (seconds, bytes, not milliseconds, minutes, kilobytes…) and no unit
 * abbreviations (`_ms`, `_sec`, `_secs`, …); no duplicate series.
 */
export interface Family { name: string; type: string | null; help: string | null; samples: Array<{ name: string; labels: Record<string, string>; value: number }> }

const NAME_RE = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_RE = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const NON_BASE_UNITS = ["milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days", "weeks", "kilobytes", "megabytes", "gigabytes", "terabytes", "kibibytes", "mebibytes", "gibibytes", "bits", "percent", "celsius", "fahrenheit"];
/** promlint's list (lintUnitAbbreviations), matched against the `_`-separated parts of a name. */
const ABBREVIATIONS = ["s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"];
const TYPE_WORDS = ["counter", "gauge", "histogram", "summary", "untyped"];

function parseLabels(s: string): Record<string, string> | string {
  const out: Record<string, string> = {};
  let i = 0;
  while (i < s.length) {
    while (s[i] === " " || s[i] === ",") i++;
    if (i >= s.length) break;
    const eq = s.indexOf("=", i);
    if (eq < 0) return `label without '=' in {${s}}`;
    const name = s.slice(i, eq).trim();
    if (s[eq + 1] !== '"') return `label ${name}: value not quoted`;
    let j = eq + 2; let v = "";
    for (; j < s.length && s[j] !== '"'; j++) {
      if (s[j] === "\\") { const n = s[++j]; v += n === "n" ? "\n" : n; } else v += s[j];
    }
    if (j >= s.length) return `label ${name}: unterminated value`;
    if (name in out) return `label ${name} repeated`;
    out[name] = v;
    i = j + 1;
  }
  return out;
}

export function parseExposition(text: string): { families: Map<string, Family>; problems: string[] } {
  const families = new Map<string, Family>();
  const problems: string[] = [];
  const seenSeries = new Set<string>();
  const familyOf = (sample: string): Family | undefined => {
    const direct = families.get(sample);
    if (direct) return direct;
    for (const suf of ["_bucket", "_sum", "_count"]) if (sample.endsWith(suf)) { const f = families.get(sample.slice(0, -suf.length)); if (f && (f.type === "histogram" || f.type === "summary")) return f; }
    return undefined;
  };
  const lines = text.split("\n");
  lines.forEach((line, n) => {
    if (!line.trim()) return;
    const meta = /^#\s+(HELP|TYPE)\s+(\S+)(?:\s+(.*))?$/.exec(line);
    if (meta) {
      const [, kind, name, rest] = meta as unknown as [string, string, string, string | undefined];
      let f = families.get(name);
      if (!f) { f = { name, type: null, help: null, samples: [] }; families.set(name, f); }
      if (f.samples.length) problems.push(`${name}: ${kind} after its samples (line ${n + 1})`);
      if (kind === "HELP") { if (f.help !== null) problems.push(`${name}: HELP given twice`); f.help = rest ?? ""; }
      else {
        if (f.type !== null) problems.push(`${name}: TYPE given twice`);
        f.type = rest ?? "";
        if (!["counter", "gauge", "histogram", "summary", "untyped"].includes(f.type)) problems.push(`${name}: unknown TYPE ${f.type}`);
      }
      return;
    }
    if (line.startsWith("#")) return;
    const m = /^([^\s{]+)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?$/.exec(line);
    if (!m) { problems.push(`line ${n + 1}: cannot parse: ${line}`); return; }
    const [, name, labelText, valueText] = m as unknown as [string, string, string | undefined, string];
    if (!NAME_RE.test(name)) problems.push(`${name}: invalid metric name`);
    const labels = parseLabels(labelText ?? "");
    if (typeof labels === "string") { problems.push(`${name}: ${labels}`); return; }
    for (const l of Object.keys(labels)) {
      if (!LABEL_RE.test(l)) problems.push(`${name}: invalid label name ${JSON.stringify(l)}`);
      if (l.startsWith("__")) problems.push(`${name}: label ${l} is reserved (leading __)`);
    }
    // Go's ParseFloat, which the exposition parser uses, takes Inf and NaN in any case.
    const lower = valueText.toLowerCase();
    const value = /^[+]?inf(inity)?$/.test(lower) ? Infinity : /^-inf(inity)?$/.test(lower) ? -Infinity : lower === "nan" ? NaN : Number(valueText);
    if (Number.isNaN(value) && lower !== "nan") problems.push(`${name}: value ${valueText} is not a number`);
    const key = `${name}{${Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(",")}}`;
    if (seenSeries.has(key)) problems.push(`${key}: duplicate series`);
    seenSeries.add(key);
    const f = familyOf(name);
    if (!f) { problems.push(`${name}: sample without HELP/TYPE`); return; }
    f.samples.push({ name, labels, value });
  });
  return { families, problems };
}

/** The problems `promtool check metrics` would report for `text` (empty: it passes). */
export function lintExposition(text: string): string[] {
  const { families, problems } = parseExposition(text);
  for (const f of families.values()) {
    const n = f.name;
    if (f.help === null || !f.help.trim()) problems.push(`${n}: no help text`);
    if (f.type === null) problems.push(`${n}: no TYPE`);
    if (/[A-Z]/.test(n)) problems.push(`${n}: metric names should be snake_case, not camelCase`);
    for (const s of f.samples) for (const l of Object.keys(s.labels)) if (/[A-Z]/.test(l)) problems.push(`${n}: label ${l} should be snake_case`);
    if (f.type === "counter" && !n.endsWith("_total")) problems.push(`${n}: counter metrics should have "_total" suffix`);
    if (f.type !== "counter" && n.endsWith("_total")) problems.push(`${n}: non-counter metrics should not have "_total" suffix`);
    const parts = n.split("_");
    for (const u of NON_BASE_UNITS) if (parts.includes(u)) problems.push(`${n}: use base unit instead of ${u}`);
    for (const a of ABBREVIATIONS) if (parts.includes(a)) problems.push(`${n}: metric names should not contain abbreviated units (${a})`);
    for (const t of TYPE_WORDS) if (parts.includes(t)) problems.push(`${n}: metric name should not include type '${t}'`);
    if (n.includes(":")) problems.push(`${n}: metric names should not contain ':'`);
    if (f.type !== "histogram" && n.endsWith("_bucket")) problems.push(`${n}: non-histogram metrics should not have "_bucket" suffix`);
    if (f.type !== "histogram" && f.type !== "summary" && (n.endsWith("_count") || n.endsWith("_sum"))) problems.push(`${n}: non-histogram and non-summary metrics should not have "_count"/"_sum" suffix`);
    if (f.type === "histogram") {
      const buckets = f.samples.filter((s) => s.name === `${n}_bucket`);
      if (f.samples.some((s) => s.name !== `${n}_bucket` && s.name !== `${n}_sum` && s.name !== `${n}_count`)) problems.push(`${n}: histogram with a sample that is not _bucket, _sum or _count`);
      if (buckets.some((b) => !("le" in b.labels))) problems.push(`${n}: _bucket without le`);
      const series = new Set(f.samples.filter((s) => s.name === `${n}_count`).map((s) => JSON.stringify(s.labels)));
      for (const c of series) {
        const lbl = JSON.parse(c) as Record<string, string>;
        const same = (s: { labels: Record<string, string> }) => Object.entries(lbl).every(([k, v]) => s.labels[k] === v);
        if (!buckets.some((b) => same(b) && b.labels.le === "+Inf")) problems.push(`${n}${c}: no le="+Inf" bucket`);
        if (!f.samples.some((s) => s.name === `${n}_sum` && same(s))) problems.push(`${n}${c}: no _sum`);
      }
    }
    if (f.type === "summary" && f.samples.some((s) => s.name !== n && s.name !== `${n}_sum` && s.name !== `${n}_count`)) problems.push(`${n}: summary with an unexpected sample`);
    if ((f.type === "counter" || f.type === "gauge") && f.samples.some((s) => s.name !== n)) problems.push(`${n}: ${f.type} with a sample of another name`);
  }
  return problems;
}
