/**
 * What an App's slug may be: one DNS label in lower case, so `{slug}.localhost` is a host name.
 * The seed's check and `npm run forward`'s share it.
 * @module
 */
export const APP_SLUG = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/

/** The slug no App may have: `api.{domain}` is the token API's host. */
export const RESERVED_SLUG = 'api'
