/**
 * The version switch every adapter's `routeByVersion` shares: which handler serves the App
 * version a request was dispatched to. Framework-free; each adapter wraps it in its own
 * handler type.
 * @internal
 * @module
 */
import type { AppRecord } from '../core/stores.js'
import { ConfigurationError } from '../errors.js'
import type { DispatchContext } from '../pipeline/dispatcher.js'

/**
 * The handlers of the live versions:
 * - an object keyed by exact version (`'1.2.3'`), or by `'<appId>@<version>'` when the
 *   platform serves several Apps (the App-qualified key wins);
 * - or a function `(app, version) => handler`, called once per App version, on the first
 *   request dispatched to it; its result is kept for later requests (`undefined` is not
 *   kept, so a handler may appear after a deploy).
 */
export type VersionRoutes<H> =
  | Readonly<Record<string, H>>
  | ((app: AppRecord, version: string) => H | undefined)

/** Finds the handler of a dispatched request, or `undefined` when the version has none. */
export type VersionRouter<H> = (context: DispatchContext) => H | undefined

/** @internal */
export function createVersionRouter<H>(routes: VersionRoutes<H>): VersionRouter<H> {
  if (typeof routes === 'function') {
    const handlers = new Map<string, H>()
    return (context) => {
      const key = `${context.app.id}@${context.version}`
      let handler = handlers.get(key)
      if (handler === undefined) {
        handler = routes(context.app, context.version)
        if (handler !== undefined) handlers.set(key, handler)
      }
      return handler
    }
  }
  if (routes === null || typeof routes !== 'object') {
    throw new ConfigurationError('routes', 'must be an object of handlers keyed by version, or a function')
  }
  const table = new Map<string, H>(Object.entries(routes))
  for (const [key, handler] of table) {
    if (typeof handler !== 'function') throw new ConfigurationError(`routes.${key}`, 'must be a handler function')
  }
  return (context) => table.get(`${context.app.id}@${context.version}`) ?? table.get(context.version)
}

