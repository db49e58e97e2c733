export { AxError, InvalidInputError, StaleEpochError, isAxError, type AxErrorCode } from "./errors.ts";
export { SystemClock, SimulatedClock, atWallTime, type Clock, type TimerHandle } from "./clock.ts";
export { parseDuration, formatDuration } from "./duration.ts";
export { loadConfig, names, ENV_DEFAULTS, ENV_DOCS, NAMESPACE_RE, type AxConfig, type Names } from "./config.ts";
export { createLogger, silentLogger, type Logger } from "./log.ts";
export { RateWindow } from "./rateWindow.ts";
