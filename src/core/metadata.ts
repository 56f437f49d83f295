/**
 * OAuth 2.0 protected-resource metadata (RFC 9728; spec 2.2 and 4.2).
 * @module
 */

/** The protected-resource metadata document (spec 2.2). */
export interface ProtectedResourceMetadata {
  /** The App address, `{base_url}`: the resource the tokens are for (RFC 9728 section 2). */
  resource: string
  /** Issuer identifiers of the authorization servers that issue tokens for the App. */
  authorization_servers: string[]
  /** How a token is sent: `["header"]` only (the `Authorization` header, RFC 6750 section 2.1). */
  bearer_methods_supported: string[]
  /** The scopes clients may ask for (spec 2.2: `openid`, `profile`, `email` by default). */
  scopes_supported: string[]
  /** Human-readable name of the App, when it has one. */
  resource_name?: string
}

/** Options of {@link buildProtectedResourceMetadata}. */
export interface ProtectedResourceMetadataOptions {
  /** The App address, `{base_url}` (spec 2.2 `resource`). */
  resource: string
  /** Issuer URLs of the authorization servers for the App. */
  authorizationServers: readonly string[]
  /** Defaults to `['openid', 'profile', 'email']` (spec 2.2). */
  scopesSupported?: readonly string[] | undefined
  /**
   * Human-readable name of the App (RFC 9728 `resource_name`, a string). Anything but a string
   * (a `null` name from an App store's nullable column) is left out of the document: a
   * `"resource_name": null` makes MCP clients refuse the whole document (the MCP SDK's schema
   * takes a string or nothing), so none of them could sign in to the App.
   */
  resourceName?: string | undefined
}

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
 */
export function buildProtectedResourceMetadata(options: ProtectedResourceMetadataOptions): ProtectedResourceMetadata {
  const doc: ProtectedResourceMetadata = {
    resource: options.resource,
    authorization_servers: [...options.authorizationServers],
    bearer_methods_supported: ['header'],
    scopes_supported: [...(options.scopesSupported ?? DEFAULT_SCOPES_SUPPORTED)],
  }
  // A string only: the dispatcher passes the App record's `name` as the store answered it.
  if (typeof options.resourceName === 'string') doc.resource_name = options.resourceName
  return doc
}

/** Path of the metadata document under an App (spec 4.2). */
export const PROTECTED_RESOURCE_METADATA_PATH = '/.well-known/oauth-protected-resource'
