export { Releaser, type Held, type HoldRequest, type ReleaseOutcome } from "./releaser.ts";
