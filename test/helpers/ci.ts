/**
 * Whether the tests run under CI: `CI` set to anything but empty, `0` or `false` (`CI=true`
 * in this project's `.ci/run`, `CI=1` elsewhere). Under CI a suite whose service (Redis,
 * PostgreSQL, the conformance runners, the build) is missing fails instead of skipping.
 */
export function underCI(): boolean {
  const value = (process.env.CI ?? '').trim().toLowerCase()
  return value !== '' && value !== '0' && value !== 'false'
}
