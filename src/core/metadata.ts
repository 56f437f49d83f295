/**
 * OAuth 2.0 protected-resource metadata (RFC 9728; spec 2.2 and 4.2).
 * @module
 */
import { isHttpUrl, issuerProblem } from '../auth/discovery.js'
import { ConfigurationError, optionNames, refuseUnknownOptions } from '../errors.js'
import { SCOPE_TOKEN } from './reply.js'

/** The protected-resource metadata document (spec 2.2). */
export interface ProtectedResourceMetadata {
  /** The App address, `{base_url}`: the resource the tokens are for (RFC 9728 section 2). */
  resource: string
  /**
   * Issuer identifiers of the authorization servers that issue tokens for the App. Absent when
   * there is none (API tokens only): RFC 9728 section 3.2 has parameters with zero values
   * omitted, and strict clients refuse a document with an empty list.
   */
  authorization_servers?: string[]
  /** How a token is sent: `["header"]` only (the `Authorization` header, RFC 6750 section 2.1). */
  bearer_methods_supported: string[]
  /**
   * The scopes clients may ask for (spec 2.2: `openid`, `profile`, `email` by default). Absent
   * for a `scopesSupported` of `[]` (RFC 9728 section 3.2, as `authorization_servers`).
   */
  scopes_supported?: string[]
  /** Human-readable name of the App, when it has one. */
  resource_name?: string
}

/** Options of {@link buildProtectedResourceMetadata}. */
export interface ProtectedResourceMetadataOptions {
  /** The App address, `{base_url}` (spec 2.2 `resource`). */
  resource: string
  /** Issuer URLs of the authorization servers for the App; `[]` leaves `authorization_servers` out (RFC 9728 section 3.2). */
  authorizationServers: readonly string[]
  /** Defaults to `['openid', 'profile', 'email']` (spec 2.2); `[]` leaves `scopes_supported` out. */
  scopesSupported?: readonly string[] | undefined
  /**
   * Human-readable name of the App (RFC 9728 `resource_name`, a string). `null` (a name from an
   * App store's nullable column) is left out of the document, and so is anything but a string
   * the dispatcher reads from an App record (`buildProtectedResourceMetadata` refuses it): a
   * `"resource_name": null` makes MCP clients refuse the whole document (the MCP SDK's schema
   * takes a string or nothing), so none of them could sign in to the App.
   */
  resourceName?: string | null | undefined
}

const METADATA_OPTIONS = optionNames<ProtectedResourceMetadataOptions>({ resource: true, authorizationServers: true, scopesSupported: true, resourceName: true })

/** Why a `scopesSupported` is refused. @internal */
export const SCOPES_REFUSED =
  'must be an array of scope names (RFC 6749 section 3.3: printable ASCII, no spaces, double quotes or backslashes), such as ["openid", "mcp:tools"]'

/** Scopes listed when the platform configures none (spec 2.2). */
export const DEFAULT_SCOPES_SUPPORTED = Object.freeze(['openid', 'profile', 'email'])

/**
 * Builds the document served at `{base_url}/.well-known/oauth-protected-resource`.
 *
 * @example
 * ```ts
 * buildProtectedResourceMetadata({ resource: 'https://weather.example.com', authorizationServers: ['https://auth.example.com'] })
 * // { resource: 'https://weather.example.com', authorization_servers: ['https://auth.example.com'],
 * //   bearer_methods_supported: ['header'], scopes_supported: ['openid', 'profile', 'email'] }
 * ```
 *
 * @throws {ConfigurationError} naming the option, for a `resource` that is not an absolute
 * http(s) URL without a fragment (RFC 9728 section 1.2), an `authorizationServers` that is not
 * an array of issuer identifiers (RFC 8414 section 2: http(s) URLs with no query, fragment,
 * credentials, space or control character), or a `scopesSupported` that is not an array of
 * scope names (RFC 6749 section 3.3), a `resourceName` that is neither a string nor absent, or an
 * option it does not know (`scopes_supported`, the document's own name, would be ignored). A
 * string given for an array would otherwise be published letter by letter, and clients would be
 * sent to sign in nowhere.
 */
export function buildProtectedResourceMetadata(options: ProtectedResourceMetadataOptions): ProtectedResourceMetadata {
  if (options === null || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  // `scopes_supported` or `resource_name` (the document's names) would be dropped without a word.
  refuseUnknownOptions(options, METADATA_OPTIONS, 'buildProtectedResourceMetadata')
  const { resource, authorizationServers, scopesSupported, resourceName } = options
  if (!isHttpUrl(resource) || resource.includes('#')) {
    throw new ConfigurationError('resource', 'must be an absolute http(s) URL without a fragment (RFC 9728 section 1.2): the App address')
  }
  if (!Array.isArray(authorizationServers)) throw new ConfigurationError('authorizationServers', 'must be an array of issuer URLs')
  checkIssuers(authorizationServers)
  if (scopesSupported !== undefined) checkedScopes(scopesSupported)
  if (resourceName != null && typeof resourceName !== 'string') throw new ConfigurationError('resourceName', 'must be a string (the App\'s name), or absent')
  return metadataDocument(options)
}

/**
 * Refuses an entry of `authorizationServers` that is no issuer identifier (RFC 8414 section 2),
 * named by index, never quoted: what is wrong with it may be a password or a query's secret (a
 * URL with a port past 65535 does not parse, password and all).
 * @internal
 */
export function checkIssuers(servers: readonly unknown[]): void {
  for (const [i, url] of servers.entries()) {
    const refused = issuerProblem(url)
    if (refused !== undefined) throw new ConfigurationError(`authorizationServers.${i}`, `is no issuer identifier (RFC 8414 section 2): it ${refused}`)
  }
}

/**
 * A copy of a `scopesSupported`, checked (RFC 6749 section 3.3: each a scope-token): what was
 * checked is what is served, whatever the caller does with its array later. @internal
 */
export function checkedScopes(given: unknown): string[] {
  if (!Array.isArray(given)) throw new ConfigurationError('scopesSupported', SCOPES_REFUSED)
  const scopes = Array.from(given as unknown[])
  if (scopes.some((scope) => typeof scope !== 'string' || !SCOPE_TOKEN.test(scope))) throw new ConfigurationError('scopesSupported', SCOPES_REFUSED)
  return scopes as string[]
}

/**
 * {@link buildProtectedResourceMetadata} without its checks, for the dispatcher, whose options
 * were checked when it was made. @internal
 */
export function metadataDocument(options: ProtectedResourceMetadataOptions): ProtectedResourceMetadata {
  // RFC 9728 section 3.2: "Parameters with zero values MUST be omitted from the response"; a
  // present but empty list makes strict clients refuse the whole document. Members keep the
  // document's order either way.
  const servers = options.authorizationServers
  const scopes = options.scopesSupported ?? DEFAULT_SCOPES_SUPPORTED
  const doc: ProtectedResourceMetadata = {
    resource: options.resource,
    ...(servers.length > 0 && { authorization_servers: [...servers] }),
    bearer_methods_supported: ['header'],
    ...(scopes.length > 0 && { scopes_supported: [...scopes] }),
  }
  // A string only: the dispatcher passes the App record's `name` as the store answered it.
  if (typeof options.resourceName === 'string') doc.resource_name = options.resourceName
  return doc
}

/** Path of the metadata document under an App (spec 4.2). */
export const PROTECTED_RESOURCE_METADATA_PATH = '/.well-known/oauth-protected-resource'
