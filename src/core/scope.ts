/**
 * The API-token scope check (spec 5.2: "A token cannot reach an App outside its scope even if
 * the owner subscribes to it"). Pure: no store, no clock.
 * @module
 */

/**
 * Whether a token scoped to `servers` (the App ids fixed at its creation) may reach the App
 * `appId`: exactly one of them, compared as given (ids are opaque: no case folding, no
 * trimming). A refusal is the dispatcher's 403 -32003 with no data (spec 7). `servers` that
 * are no array (a scope left as JSON text, `'["app_weather_admin"]'`) reach nothing: a string's
 * own `includes` would let in every App whose id is part of it.
 *
 * @example
 * ```ts
 * checkScope(['app_weather'], 'app_weather') // true
 * checkScope(['app_weather'], 'app_notes') // false: 403, even if the owner subscribes to it
 * ```
 */
export function checkScope(servers: readonly string[], appId: string): boolean {
  return Array.isArray(servers) && servers.includes(appId)
}
