// Writes protocol/schema/<Message>.json from the zod schemas, so executors in other languages
// can be written (and validated) from the docs alone. Run: npm run schema
import { mkdirSync, writeFileSync } from "node:fs";
import { z } from "zod";
import { WIRE_SCHEMAS } from "../protocol/index.ts";

mkdirSync("protocol/schema", { recursive: true });
for (const [name, schema] of Object.entries(WIRE_SCHEMAS)) {
  const json = z.toJSONSchema(schema as z.ZodType, { unrepresentable: "any", io: "input" });
  writeFileSync(`protocol/schema/${name}.json`, JSON.stringify({ $id: `ax/${name}`, title: name, ...json }, null, 2) + "\n");
  process.stdout.write(`protocol/schema/${name}.json\n`);
}
