/**
 * The seam for OAuth access tokens (spec 5.1). The dispatcher hands every bearer credential
 * that does not carry the API-token prefix to an {@link AccessTokenValidator}.
 * @module
 */

/** What a validator learned about an accepted access token. */
export interface AccessTokenInfo {
  /** The user the token belongs to (OIDC `sub`); the identity used for 402 and rate limits. */
  readonly subject: string
  /** OAuth client the token was issued to, when known. */
  readonly clientId?: string | undefined
  /** Scopes granted, when known. */
  readonly scopes?: readonly string[] | undefined
  /** Expiry, epoch ms, when known. */
  readonly expiresAt?: number | undefined
}

/** Result of {@link AccessTokenValidator.validate}: refusals are values. */
export type AccessTokenResult =
  | { readonly active: true; readonly info: AccessTokenInfo }
  | { readonly active: false; readonly reason: string }

/**
 * Where a token is presented: what an audience / resource-indicator check (RFC 8707, MCP
 * authorization) compares the token's audience with.
 */
export interface AccessTokenContext {
  /** The App address the request went to (`{base_url}`, the metadata `resource`). */
  readonly resource: string
  /** The App's id. */
  readonly appId: string
  /**
   * The client's address as the dispatcher resolved it (`trustProxy`), when known: what a
   * per-client budget of upstream validations counts by.
   */
  readonly clientAddress?: string | undefined
}

/**
 * Validates OAuth access tokens. Throws `AuthorizationServerUnavailableError` (503) when it
 * cannot decide because the authorization server is unhealthy, and
 * `TooManyValidationsError` (429) when the client has spent its budget of upstream
 * validations; never throws for a bad token.
 * `context` names the App the token is presented to; validators that check audiences use it.
 * The dispatcher answers 503 to a call of a validator of your own that has not settled after
 * 30 seconds; `createOAuthValidator`'s keep their own deadline and are not timed.
 */
export interface AccessTokenValidator {
  /**
   * Whether `token` is active, and whose: `{ active: true, info }`, or `{ active: false,
   * reason }` for a token that is not (401). Throws only when it cannot decide (see above).
   */
  validate(token: string, context?: AccessTokenContext): Promise<AccessTokenResult>
  /**
   * `true` when the validator checks tokens' audiences against `context.resource`, the App
   * address (in `userinfo` mode, those of JWTs): `createOAuthValidator` sets it for its default audience in `jwt` and
   * `introspection` modes, and for any `audience` function (it is handed `resource`; one that
   * does not read it is counted all the same). That check is only as good as the address:
   * `createDispatcher` then refuses to be
   * built with the default `resolveApp` and no `baseUrl`, since the address would come from
   * the `Host` header a caller chooses (a token issued to `weather.evil.example` would pass at
   * the weather App when sent with that `Host`).
   */
  readonly checksAppAddress?: boolean | undefined
  /**
   * The authorization server whose tokens it accepts (`createOAuthValidator`'s `issuer`):
   * what the dispatcher names in the metadata's `authorization_servers` when given no
   * `authorizationServers` of its own.
   */
  readonly issuer?: string | undefined
}

/**
 * Validators that keep a deadline of their own (`createOAuthValidator`'s: its retries, then
 * 503): the dispatcher does not time their calls. It does time any other validator's, so one
 * that never settles does not hold a request for ever. Internal, not exported by the package.
 */
const ownDeadlines = new WeakSet<object>()

/** Marks `validator` as keeping its own deadline; returns it. */
export function keepingOwnDeadline<T extends AccessTokenValidator>(validator: T): T {
  ownDeadlines.add(validator)
  return validator
}

/** Whether `validator` keeps its own deadline ({@link keepingOwnDeadline}). */
export function keepsOwnDeadline(validator: AccessTokenValidator): boolean {
  return ownDeadlines.has(validator)
}

/**
 * How long the dispatcher waits for a validator of the platform's own (one that
 * `createOAuthValidator` did not make) before it answers 503: longer than the built-in
 * validator's whole deadline with its defaults (10 s of retries and a 5 s call).
 */
export const FOREIGN_VALIDATOR_DEADLINE_MS = 30_000
