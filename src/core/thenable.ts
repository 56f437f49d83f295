/**
 * Telling the promises of other realms and libraries from answers.
 * @module
 */
import type { MaybePromise } from './stores.js'

/**
 * A promise that is not `instanceof Promise`: of another realm or library (Bluebird, a lazy
 * query, a test environment's Promise), or any thenable. Store answers (and the Web adapter's
 * handler answers) of that kind are adopted and awaited, never taken for the answer itself.
 * @internal
 */
export function isForeignThenable(value: unknown): boolean {
  return value !== null && typeof value === 'object' && !(value instanceof Promise) && typeof (value as { then?: unknown }).then === 'function'
}

/**
 * `value`, with another library's promise (a thenable that is not `instanceof Promise`) adopted
 * as a native one, so that one `instanceof Promise` tells a pending answer from a given one;
 * anything else as it is (an answer in hand costs no microtask). For every store and callback
 * answer that may be awaited.
 * @internal
 */
export function adoptThenable<T>(value: MaybePromise<T> | PromiseLike<T>): MaybePromise<T> {
  return isForeignThenable(value) ? Promise.resolve(value as PromiseLike<T>) : (value as MaybePromise<T>)
}

/**
 * What an observer (`onEvent`, `onStateChange`) answered: a promise, or any thenable (an `async`
 * callback sending to a metrics sink that is down), has its rejection ignored, as the
 * callback's throw is. Left unhandled, it would end a Node process.
 * @internal
 */
export function ignoreRejection(answer: unknown): void {
  if (answer === null || (typeof answer !== 'object' && typeof answer !== 'function')) return
  try {
    const then = (answer as { then?: unknown }).then
    if (typeof then === 'function') then.call(answer, undefined, () => {})
  } catch {
    // A thenable whose `then` throws has nothing pending to leave unhandled.
  }
}
