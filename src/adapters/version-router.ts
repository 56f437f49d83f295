/**
 * The version switch every adapter's `routeByVersion` shares: which handler serves the App
 * version a request was dispatched to. Framework-free; each adapter wraps it in its own
 * handler type.
 * Not an entry point: the adapters' entries export what users need of it.
 * @module
 */
import type { AppRecord } from '../core/stores.js'
import { isExactVersion } from '../core/versions.js'
import { ConfigurationError, optionNames, refuseUnknownOptions } from '../errors.js'
import type { DispatchContext } from '../pipeline/dispatcher.js'

/**
 * The handlers of the live versions:
 * - an object keyed by `'<appId>@<version>'`, or by exact version (`'1.2.3'`) for the App
 *   named by the `appId` option (an App-qualified key wins);
 * - or a function `(app, version) => handler`, called once per App version, on the first
 *   request dispatched to it; its result is kept for later requests (`undefined` or `null`
 *   is not kept, so a handler may appear after a deploy).
 */
export type VersionRoutes<H> =
  | Readonly<Record<string, H>>
  | ((app: AppRecord, version: string) => H | null | undefined)

/** Options of every adapter's `routeByVersion`. */
export interface RouteByVersionOptions {
  /**
   * The App whose versions a table's bare version keys (`'1.4.2'`) name. Required when the
   * table has such keys: a dispatcher serves every App of the platform, and without it the
   * callers of every App that has a version of that number would reach this handler. Keys of
   * the form `'<appId>@<version>'`, and a function, need none.
   */
  appId?: string | undefined
}

/** Finds the handler of a dispatched request, or `undefined` when the version has none. */
export type VersionRouter<H> = (context: DispatchContext) => H | undefined

const ROUTE_BY_VERSION_OPTIONS = optionNames<RouteByVersionOptions>({ appId: true })

/** @internal */
export function createVersionRouter<H>(routes: VersionRoutes<H>, options: RouteByVersionOptions = {}): VersionRouter<H> {
  if (options === null || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, ROUTE_BY_VERSION_OPTIONS, 'routeByVersion')
  if (typeof routes === 'function') {
    const handlers = new Map<string, H>()
    return (context) => {
      const key = `${context.app.id}@${context.version}`
      let handler = handlers.get(key)
      if (handler === undefined) {
        // `null` is "none yet" too (a JavaScript factory's `map.get(v) ?? null`): kept, the
        // version would answer version_not_served for ever, its handler never asked again.
        handler = routes(context.app, context.version) ?? undefined
        if (handler !== undefined) handlers.set(key, handler)
      }
      return handler
    }
  }
  if (routes === null || typeof routes !== 'object') {
    throw new ConfigurationError('routes', 'must be an object of handlers keyed by version, or a function')
  }
  // Its entries are no own properties: read as an object, it would route nothing, every request
  // a 404 with no error.
  if (routes instanceof Map) {
    throw new ConfigurationError('routes', 'must be a plain object of handlers keyed by version, or a function, not a Map (give Object.fromEntries(map), or a function that reads the Map)')
  }
  const table = new Map<string, H>(Object.entries(routes))
  if (table.size === 0) throw new ConfigurationError('routes', 'has no handler: every request would be answered version_not_served')
  for (const [key, handler] of table) {
    if (typeof handler !== 'function') throw new ConfigurationError(`routes.${key}`, 'must be a handler function')
  }
  return versionTable(table, options.appId, 'routes', 'handler')
}

/**
 * Looks a dispatched request up in a table keyed by `'<appId>@<version>'`, or by bare version
 * for the App `appId` (the App-qualified key wins). Bare keys without `appId` are a
 * `ConfigurationError` on `option`: they would serve every App that has such a version.
 * @internal
 */
export function versionTable<V>(table: ReadonlyMap<string, V>, appId: string | undefined, option: string, what: string): VersionRouter<V> {
  if (appId !== undefined && (typeof appId !== 'string' || appId === '')) {
    throw new ConfigurationError('appId', 'must be a non-empty App id')
  }
  for (const key of table.keys()) {
    // A key no dispatched request can match would answer version_not_served for ever.
    const at = key.lastIndexOf('@')
    const app = key.slice(0, at)
    if ((at !== -1 && (app === '' || app.trim() !== app)) || !isExactVersion(key.slice(at + 1))) {
      throw new ConfigurationError(
        option,
        `key ${JSON.stringify(key)} is neither "<appId>@<version>" nor an exact version ("1.4.2", as deployed: no "v", no spaces)`,
      )
    }
  }
  const bare = [...table.keys()].filter((key) => !key.includes('@'))
  if (bare.length > 0 && appId === undefined) {
    throw new ConfigurationError(
      option,
      `keys ${bare.map((k) => JSON.stringify(k)).join(', ')} name no App: give appId (the App they belong to) or key them "<appId>@<version>", so callers of another App with the same version are never sent to this ${what}`,
    )
  }
  return (context) =>
    table.get(`${context.app.id}@${context.version}`) ?? (context.app.id === appId ? table.get(context.version) : undefined)
}
