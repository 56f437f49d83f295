/**
 * Whether the tests run under CI: `CI` set to anything but empty, `0` or `false` (`CI=1`
 * elsewhere), or this project's `.ci/run` (`MCP_DISPATCH_CI=1`, whatever `CI` says). Under CI a
 * suite whose Redis or PostgreSQL is unreachable fails instead of skipping.
 */
export function underCI(): boolean {
  const value = (process.env.CI ?? '').trim().toLowerCase()
  return (value !== '' && value !== '0' && value !== 'false') || underProjectCI()
}

/**
 * Whether the tests run under this project's own CI (`.ci/run` sets `MCP_DISPATCH_CI=1`),
 * which also installs every optional tool a suite drives: the MCP conformance runner, Bun,
 * Deno and workerd, Next.js, Chromium, PgBouncer (`redis-server`, for the Redis Clusters and
 * a private Redis, is preinstalled there, as PostgreSQL is). There
 * a suite whose tool is missing fails instead of skipping. Anywhere else, another CI's
 * `CI=true` included, it skips, saying so: `npm ci && npm test` in a clean clone needs only
 * Redis and PostgreSQL (and builds `dist/` first when it is missing: test/global-setup.ts).
 */
export function underProjectCI(): boolean {
  const value = (process.env.MCP_DISPATCH_CI ?? '').trim().toLowerCase()
  return value !== '' && value !== '0' && value !== 'false'
}
