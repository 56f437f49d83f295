/**
 * Telling the promises of other realms and libraries from answers.
 * @module
 */

/**
 * A promise that is not `instanceof Promise`: of another realm or library (Bluebird, a lazy
 * query, a test environment's Promise), or any thenable. Store answers (and the Web adapter's
 * handler answers) of that kind are adopted and awaited, never taken for the answer itself.
 * @internal
 */
export function isForeignThenable(value: unknown): boolean {
  return value !== null && typeof value === 'object' && !(value instanceof Promise) && typeof (value as { then?: unknown }).then === 'function'
}
