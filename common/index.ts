export { AxError, InvalidInputError, StaleEpochError, isAxError, type AxErrorCode } from "./errors.ts";
export { SystemClock, SimulatedClock, atWallTime, type Clock, type TimerHandle } from "./clock.ts";
export { parseDuration, formatDuration } from "./duration.ts";
export { loadConfig, names, redactUrl, ENV_DEFAULTS, ENV_DOCS, NAMESPACE_RE, type AxConfig, type Names, type RedisTarget, type RedisMode, type RedisNode } from "./config.ts";
export { createLogger, silentLogger, type Logger } from "./log.ts";
export { RateWindow } from "./rateWindow.ts";
