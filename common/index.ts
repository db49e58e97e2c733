export { AxError, InvalidInputError, StaleEpochError, isAxError, type AxErrorCode } from "./errors.ts";
export { SystemClock, SimulatedClock, atWallTime, type Clock, type TimerHandle } from "./clock.ts";
export { parseDuration, formatDuration } from "./duration.ts";
export { loadConfig, loadNatsSettings, names, ENV_DEFAULTS, ENV_DOCS, NATS_AUTH_DOCS, OPTIONAL_DOCS, SECRET_VARS, NAMESPACE_RE, type AxConfig, type Limits, type NatsSettings, type Names, type RedisTarget, type RedisMode, type RedisNode } from "./config.ts";
export { createLogger, silentLogger, type Logger } from "./log.ts";
export { RateWindow } from "./rateWindow.ts";
export { redact, redactUrl, registerSecret, clearSecrets } from "./redact.ts";
export { connectNats, natsConnectOptions, natsFailure } from "./nats.ts";
