/**
 * Secrets never reach an output: configuration errors, CLI errors and logs pass text through
 * `redact()`. Two rules: the password (or token) part of any URL is masked, and every secret
 * value the process learnt from its configuration (registerSecret) is masked wherever it shows
 * up — a driver's error message that quotes a connection string, a stack, an echoed value.
 */
const secrets = new Set<string>();
const MASK = "***";

/** Remembers a secret value so that redact() masks it. Values under 4 characters are masked in URLs only (too likely to hit ordinary text). */
export function registerSecret(value: string | undefined | null): void {
  if (value && value.length >= 4) secrets.add(value);
}

/**
 * `scheme://user:password@host` → `scheme://user:***@host`; for NATS, where a lone user part is
 * a token, `nats://token@host` → `nats://***@host`.
 */
export function redactUrl(text: string): string {
  return text.replace(/([a-z][a-z0-9+.-]*:\/\/)([^\s/@:,"']*)(?::([^\s/@,"']*))?@/gi, (m, scheme: string, user: string, pass: string | undefined) => {
    if (pass !== undefined) return `${scheme}${user}:${MASK}@`;
    return /^(nats|tls|ws|wss):\/\//i.test(scheme) ? `${scheme}${MASK}@` : m;
  });
}

/** Masks URL credentials and every registered secret in `text`. */
export function redact(text: string): string {
  let out = redactUrl(text);
  for (const s of secrets) {
    if (out.includes(s)) out = out.split(s).join(MASK);
    // A secret may also appear URL-encoded (as it was written in a URL).
    const enc = encodeURIComponent(s);
    if (enc !== s && out.includes(enc)) out = out.split(enc).join(MASK);
  }
  return out;
}

/** For tests: forget registered secrets. */
export function clearSecrets(): void { secrets.clear(); }
