#!/usr/bin/env node
// Thin launcher: runs the TypeScript CLI through tsx so a clone needs no build step.
import { register } from "tsx/esm/api";
register();
await import("../ops/cli.ts");
