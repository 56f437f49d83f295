/**
 * The identity a proxied App receives: a short-lived JWT signed by the platform (`jose`),
 * in place of the caller's credential, which is never forwarded (MCP authorization spec,
 * "Token Passthrough"). The platform publishes its public keys as a JWKS document (RFC 7517)
 * and Apps verify the token against it.
 * @module
 */
import {
  type CryptoKey,
  type JWK,
  type JWTPayload,
  type JWTVerifyGetKey,
  type KeyObject,
  SignJWT,
  calculateJwkThumbprint,
  createLocalJWKSet,
  createRemoteJWKSet,
  customFetch,
  errors,
  exportJWK,
  importJWK,
  jwtVerify,
} from 'jose'
import { ConfigurationError, JwksUnavailableError, UnauthorizedError } from '../../errors.js'
import type { DispatchContext } from '../../pipeline/dispatcher.js'

/** Default header carrying the identity JWT from the platform to a proxied App. */
export const IDENTITY_HEADER = 'x-mcp-identity'

/** JWT `typ` of identity tokens (RFC 8725 section 3.11: explicit typing). */
export const IDENTITY_TOKEN_TYPE = 'mcp-identity+jwt'

/** Default lifetime of an identity token, in seconds. */
export const DEFAULT_IDENTITY_TTL_SECONDS = 60

const ASYMMETRIC_ALGORITHMS = [
  'ES256',
  'ES384',
  'ES512',
  'EdDSA',
  'Ed25519',
  'RS256',
  'RS384',
  'RS512',
  'PS256',
  'PS384',
  'PS512',
] as const

/** A signing key: a Web Crypto key, a Node `KeyObject`, or a private JWK. */
export type IdentityKey = CryptoKey | KeyObject | JWK

/** A JWKS document (RFC 7517 section 5) holding public keys only. */
export interface IdentityJwks {
  keys: JWK[]
}

/** Claims of an identity token. */
export interface IdentityClaims extends JWTPayload {
  /** The platform (`issuer` option). */
  iss: string
  /** The caller: an API token's owner or the OAuth `sub`. */
  sub: string
  /** The upstream App (default: the origin of its MCP endpoint URL). */
  aud: string
  iat: number
  exp: number
  /** Unique per token, for Apps that refuse replays. */
  jti: string
  /** App id. */
  app: string
  /** The version the request was dispatched to. */
  ver: string
  /** How the caller authenticated to the platform. */
  method: 'api_token' | 'oauth'
  /** OAuth client id, when known (RFC 9068 section 2.2). */
  client_id?: string
  /** OAuth scopes, space-separated, when known (RFC 9068 section 2.2.3). */
  scope?: string
}

/** Options of {@link createIdentitySigner}. */
export interface IdentitySignerOptions {
  /** The platform's identifier, the `iss` of every token (a URL, e.g. `https://platform.example`). */
  issuer: string
  /** The private key that signs. Asymmetric only (EC, OKP or RSA). */
  privateKey: IdentityKey
  /**
   * The matching public key, for the JWKS. Needed only when the private key cannot be
   * exported (a non-extractable `CryptoKey`).
   */
  publicKey?: IdentityKey
  /** JWS algorithm. Default: from the key (P-256 `ES256`, Ed25519 `EdDSA`, RSA `RS256`…). */
  algorithm?: (typeof ASYMMETRIC_ALGORITHMS)[number]
  /** `kid` of the key. Default: its JWK thumbprint (RFC 7638). */
  keyId?: string
  /** Token lifetime in seconds, 1 to 3600. Default 60. */
  ttlSeconds?: number
  /** Public keys still published after a rotation, so tokens signed before it still verify. */
  previousKeys?: readonly JWK[]
  /** Clock, epoch ms. Default `Date.now`. */
  now?: () => number
}

/** Signs identity tokens and publishes their keys. Create with {@link createIdentitySigner}. */
export interface IdentitySigner {
  /** The `iss` of every token. */
  readonly issuer: string
  /** Signs the identity of a dispatched request for one upstream (`aud`). */
  sign(context: DispatchContext, audience: string): Promise<string>
  /**
   * The JWKS document to publish (public keys only), e.g. at
   * `https://platform.example/.well-known/jwks.json`.
   */
  jwks(): Promise<IdentityJwks>
}

const PRIVATE_MEMBERS = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth', 'k', 'priv'] as const

function isJwk(key: unknown): key is JWK {
  return typeof key === 'object' && key !== null && typeof (key as { kty?: unknown }).kty === 'string'
}

function publicPart(jwk: JWK): JWK {
  const out: Record<string, unknown> = { ...jwk }
  for (const name of PRIVATE_MEMBERS) delete out[name]
  delete out.key_ops
  delete out.ext
  return out as JWK
}

/** What this module reads of a `node:crypto` `KeyObject`. */
interface NodeKeyObject {
  readonly asymmetricKeyType?: string
  readonly asymmetricKeyDetails?: { readonly namedCurve?: string }
}

/**
 * The signing algorithms a key can sign with, as far as can be seen without importing it
 * (a JWK's `kty` and `crv`, a `KeyObject`'s type and curve, a `CryptoKey`'s algorithm):
 * `undefined` when its kind cannot be seen, `[]` for a key no algorithm here signs with
 * (secp256k1, Ed448, X25519, an ECDH key).
 */
function algorithmsOf(key: IdentityKey): readonly string[] | undefined {
  let kty: string | undefined
  let crv: string | undefined
  if (isJwk(key)) {
    kty = key.kty
    crv = key.crv
  } else if (typeof (key as NodeKeyObject).asymmetricKeyType === 'string') {
    const object = key as NodeKeyObject
    const type = object.asymmetricKeyType
    const curve = object.asymmetricKeyDetails?.namedCurve
    kty = type === 'ec' ? 'EC' : type === 'rsa' || type === 'rsa-pss' ? 'RSA' : type === 'ed25519' ? 'OKP' : type
    crv = type === 'ed25519' ? 'Ed25519' : ({ prime256v1: 'P-256', secp384r1: 'P-384', secp521r1: 'P-521' } as Record<string, string>)[curve ?? ''] ?? curve
  } else {
    const algorithm = (key as { algorithm?: { name?: unknown; namedCurve?: unknown } }).algorithm
    const name = typeof algorithm?.name === 'string' ? algorithm.name : undefined
    if (name === undefined) return undefined
    kty = name === 'ECDSA' ? 'EC' : name === 'Ed25519' ? 'OKP' : name === 'RSASSA-PKCS1-v1_5' || name === 'RSA-PSS' ? 'RSA' : name
    crv = name === 'Ed25519' ? 'Ed25519' : typeof algorithm?.namedCurve === 'string' ? algorithm.namedCurve : undefined
  }
  if (kty === 'EC') return crv === 'P-256' ? ['ES256'] : crv === 'P-384' ? ['ES384'] : crv === 'P-521' ? ['ES512'] : []
  if (kty === 'OKP') return crv === 'Ed25519' ? ['EdDSA', 'Ed25519'] : []
  if (kty === 'RSA') return ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512']
  return []
}

function inferAlgorithm(jwk: JWK): string {
  if (jwk.kty === 'EC') {
    if (jwk.crv === 'P-256') return 'ES256'
    if (jwk.crv === 'P-384') return 'ES384'
    if (jwk.crv === 'P-521') return 'ES512'
  }
  if (jwk.kty === 'OKP' && jwk.crv === 'Ed25519') return 'EdDSA'
  if (jwk.kty === 'RSA') return 'RS256'
  throw new ConfigurationError('identity.privateKey', `has no signing algorithm this library knows (kty ${jwk.kty})`)
}

/**
 * Creates the signer of identity tokens. The key is imported on first use; misconfiguration
 * that can be seen without it (missing issuer, a symmetric or public-only JWK, a
 * non-extractable key without `publicKey`) throws a `ConfigurationError` here.
 *
 * @example
 * ```ts
 * const { privateKey } = await generateKeyPair('ES256', { extractable: true }) // from jose
 * const signer = createIdentitySigner({ issuer: 'https://platform.example', privateKey })
 * // Publish: GET /.well-known/jwks.json → Response.json(await signer.jwks())
 * ```
 */
export function createIdentitySigner(options: IdentitySignerOptions): IdentitySigner {
  if (!options || typeof options.issuer !== 'string' || options.issuer === '') {
    throw new ConfigurationError('identity.issuer', 'must be a non-empty string')
  }
  const { issuer, privateKey } = options
  if (!privateKey || typeof privateKey !== 'object') throw new ConfigurationError('identity.privateKey', 'is required')
  if (isJwk(privateKey)) {
    if (privateKey.kty === 'oct') throw new ConfigurationError('identity.privateKey', 'must be asymmetric (EC, OKP or RSA)')
    if (typeof privateKey.d !== 'string') throw new ConfigurationError('identity.privateKey', 'must be a private JWK (with "d")')
  } else if ((privateKey as { type?: unknown }).type === 'secret') {
    throw new ConfigurationError('identity.privateKey', 'must be asymmetric (EC, OKP or RSA)')
  }
  if (!options.publicKey && (privateKey as { extractable?: unknown }).extractable === false) {
    throw new ConfigurationError('identity.publicKey', 'is required when the private key is not extractable')
  }
  if (options.algorithm !== undefined && !ASYMMETRIC_ALGORITHMS.includes(options.algorithm)) {
    throw new ConfigurationError('identity.algorithm', `must be one of ${ASYMMETRIC_ALGORITHMS.join(', ')}`)
  }
  // Seen now rather than at the first request (where every request would be a 502).
  const allowed = algorithmsOf(privateKey)
  if (allowed?.length === 0) {
    throw new ConfigurationError('identity.privateKey', 'must be an EC key on P-256, P-384 or P-521, an Ed25519 key, or an RSA key')
  }
  if (allowed && options.algorithm !== undefined && !allowed.includes(options.algorithm)) {
    throw new ConfigurationError('identity.algorithm', `${options.algorithm} does not fit the key (it signs with ${allowed.join(', ')})`)
  }
  const ttl = options.ttlSeconds ?? DEFAULT_IDENTITY_TTL_SECONDS
  if (!Number.isSafeInteger(ttl) || ttl < 1 || ttl > 3600) {
    throw new ConfigurationError('identity.ttlSeconds', 'must be an integer from 1 to 3600')
  }
  const previous = (options.previousKeys ?? []).map((key, i) => {
    if (!isJwk(key)) throw new ConfigurationError(`identity.previousKeys.${i}`, 'must be a JWK')
    return publicPart(key)
  })
  const now = options.now ?? Date.now

  let loaded: Promise<{ key: CryptoKey | KeyObject; alg: string; kid: string; jwks: IdentityJwks }> | undefined
  function load() {
    loaded ??= (async () => {
      const source = options.publicKey ?? privateKey
      const exported = isJwk(source) ? source : await exportJWK(source as CryptoKey | KeyObject)
      const publicJwk = publicPart(exported)
      const alg = options.algorithm ?? (isJwk(privateKey) ? privateKey.alg : undefined) ?? inferAlgorithm(publicJwk)
      const kid = options.keyId ?? (isJwk(privateKey) ? privateKey.kid : undefined) ?? (await calculateJwkThumbprint(publicJwk))
      const key = isJwk(privateKey) ? ((await importJWK(privateKey, alg)) as CryptoKey) : (privateKey as CryptoKey | KeyObject)
      // A previous key exported without `kid` or `alg` (jose's `exportJWK` gives neither) gets the
      // ones it signed with by default (the thumbprint, the algorithm of its curve), so tokens
      // signed before the switch still find their key.
      const published = await Promise.all(
        previous.map(async (jwk) => ({
          ...jwk,
          alg: jwk.alg ?? inferAlgorithm(jwk),
          kid: jwk.kid ?? (await calculateJwkThumbprint(jwk)),
          use: jwk.use ?? 'sig',
        })),
      )
      return { key, alg, kid, jwks: { keys: [{ ...publicJwk, alg, kid, use: 'sig' }, ...published] } }
    })()
    return loaded
  }

  return {
    issuer,
    async sign(context, audience) {
      const { key, alg, kid } = await load()
      const iat = Math.floor(now() / 1000)
      const identity = context.identity
      const claims: Record<string, unknown> = {
        app: context.app.id,
        ver: context.version,
        method: identity.method,
      }
      if (identity.clientId !== undefined) claims.client_id = identity.clientId
      if (identity.scopes !== undefined) claims.scope = identity.scopes.join(' ')
      return new SignJWT(claims)
        .setProtectedHeader({ alg, kid, typ: IDENTITY_TOKEN_TYPE })
        .setIssuer(issuer)
        .setSubject(identity.subject)
        .setAudience(audience)
        .setIssuedAt(iat)
        .setExpirationTime(iat + ttl)
        .setJti(crypto.randomUUID())
        .sign(key)
    },
    async jwks() {
      const { jwks } = await load()
      return { keys: jwks.keys.map((k) => ({ ...k })) }
    },
  }
}

/** Options of {@link createIdentityVerifier}. */
export interface IdentityVerifierOptions {
  /**
   * The platform's JWKS: its http(s) URL (fetched and cached by `jose`), or the document
   * itself. When the URL cannot be fetched, verification throws a {@link JwksUnavailableError}
   * (answer 503), not an `UnauthorizedError`.
   */
  jwks: string | URL | IdentityJwks
  /** The platform's `iss`. */
  issuer: string
  /** What this App expects as `aud` (by default the platform uses the origin of the App's URL). */
  audience: string | readonly string[]
  /**
   * The App (or Apps) this service is: the token's `app` claim must be one of them. Required,
   * since the audience alone is the upstream's origin: Apps served from one origin, or a
   * platform that routes a version of another App here by mistake, would otherwise hand this
   * App callers who were only admitted to another.
   */
  appId: string | readonly string[]
  /**
   * Header to read from a `Request`, `Headers` or a Node request (an HTTP field name, RFC 9110
   * section 5.1). Default `x-mcp-identity`.
   */
  header?: string
  /** Clock skew tolerated, in seconds: a finite number, 0 or more. Default 5. */
  clockToleranceSeconds?: number
  /**
   * The longest lifetime accepted, in seconds: a token whose `exp` is more than this after its
   * `iat`, that was issued more than this (plus the tolerance) ago, or whose `iat` is in the
   * future beyond the tolerance, is refused. Default 3600, the longest `ttlSeconds` a signer
   * issues; an App whose platform signs with the default 60 may set 60.
   */
  maxTokenAgeSeconds?: number
  /** Clock, epoch ms. Default `Date.now`. */
  now?: () => number
  /** `fetch` used to get a remote JWKS. Default the global one. */
  fetch?: typeof fetch
}

/** A verified identity, as an App sees the caller. */
export interface VerifiedIdentity {
  /** The caller (user id). */
  readonly subject: string
  /** The App id. */
  readonly appId: string
  /** The version the platform dispatched the request to. */
  readonly version: string
  /** How the caller authenticated to the platform. */
  readonly method: 'api_token' | 'oauth'
  /** OAuth client id, when known. */
  readonly clientId?: string
  /** OAuth scopes, when known. */
  readonly scopes?: readonly string[]
  /** Expiry of the token, epoch ms. */
  readonly expiresAt: number
  /** All claims, as verified. */
  readonly claims: IdentityClaims
}

/**
 * A Node request (`http.IncomingMessage`, and so Express's `req` and Fastify's `request.raw`
 * or `request`): its headers as a plain object, names in lower case.
 */
export interface NodeRequestLike {
  readonly headers: Readonly<Record<string, string | readonly string[] | undefined>>
}

/**
 * Verifies the identity of a request: a web `Request`, `Headers`, a Node request (Express,
 * Fastify, `node:http`) or the JWT itself. Create with {@link createIdentityVerifier}.
 */
export type IdentityVerifier = (input: Request | Headers | NodeRequestLike | string | null | undefined) => Promise<VerifiedIdentity>

/** The longest lifetime the verifier accepts by default: the longest `ttlSeconds` a signer issues. */
const DEFAULT_MAX_TOKEN_AGE_SECONDS = 3600

/** An HTTP field name (RFC 9110 section 5.1): one or more `tchar`. */
const FIELD_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/

/** The identity token of `input`, `null` when it carries none. */
function tokenOf(input: unknown, header: string): string | null {
  if (typeof input === 'string') return input
  if (input === null || input === undefined) return null
  if (input instanceof Headers) return input.get(header)
  const headers = typeof input === 'object' ? (input as { headers?: unknown }).headers : undefined
  if (headers instanceof Headers || typeof (headers as Headers | undefined)?.get === 'function') {
    return (headers as Headers).get(header)
  }
  if (typeof headers === 'object' && headers !== null) {
    // Node joins repeated custom headers with ", " (as `Headers.get` does); a list is joined the same way.
    const value = (headers as Record<string, unknown>)[header]
    if (typeof value === 'string') return value
    if (Array.isArray(value)) return value.join(', ')
    return null
  }
  throw new TypeError('mcp-dispatch: verifyIdentity expects a Request, Headers, a Node request (with headers) or the JWT')
}

/**
 * Whether an error of the remote JWKS is about getting it (network, timeout, not 200, not a
 * JWKS, keys that do not import) rather than about the token (no key of its `kid` and `alg`,
 * an algorithm the set has no key for).
 */
function isRetrievalFailure(error: unknown): boolean {
  return !(
    error instanceof errors.JWKSNoMatchingKey ||
    error instanceof errors.JWKSMultipleMatchingKeys ||
    error instanceof errors.JOSENotSupported
  )
}

/**
 * Creates the verifier an App uses to read who is calling through the platform. It checks
 * the signature against the platform's JWKS, `typ`, `iss`, `aud`, `exp`, the token's age and
 * lifetime (`maxTokenAgeSeconds`), the claims every identity token has (`jti`, non-empty
 * `sub` and `ver`, `method` one of `api_token` and `oauth`), and that the `app` claim names
 * this App (`appId`). A missing or invalid token throws an {@link UnauthorizedError} (answer
 * 401); a JWKS URL that cannot be fetched throws a {@link JwksUnavailableError} (answer 503).
 *
 * @example
 * ```ts
 * import { JwksUnavailableError, UnauthorizedError } from 'mcp-dispatch'
 * import { createIdentityVerifier } from 'mcp-dispatch/proxy'
 * const verifyIdentity = createIdentityVerifier({
 *   jwks: 'https://platform.example/.well-known/jwks.json',
 *   issuer: 'https://platform.example',
 *   audience: 'https://weather.internal:3000',
 *   appId: 'app_weather',
 * })
 * // a web Request, Headers, a Node/Express request, or the JWT
 * const { subject, version } = await verifyIdentity(request)
 * // UnauthorizedError → 401; JwksUnavailableError → 503
 * ```
 * @throws {ConfigurationError} with a missing `issuer`, `audience` or `appId`, a `jwks` that is
 * neither an http(s) URL nor a JWKS document, a `header` that is not an HTTP field name, or a
 * `clockToleranceSeconds` / `maxTokenAgeSeconds` that is not a finite number (0 or more / more
 * than 0).
 */
export function createIdentityVerifier(options: IdentityVerifierOptions): IdentityVerifier {
  if (!options || typeof options.issuer !== 'string' || options.issuer === '') {
    throw new ConfigurationError('issuer', 'must be a non-empty string')
  }
  const audience = typeof options.audience === 'string' ? [options.audience] : [...(options.audience ?? [])]
  if (audience.length === 0 || audience.some((a) => typeof a !== 'string' || a === '')) {
    throw new ConfigurationError('audience', 'must be a non-empty string or list of strings')
  }
  const appIds = new Set(typeof options.appId === 'string' ? [options.appId] : [...(options.appId ?? [])])
  if (appIds.size === 0 || [...appIds].some((a) => typeof a !== 'string' || a === '')) {
    throw new ConfigurationError('appId', 'must name the App (or Apps) this service is: a non-empty string or list of strings')
  }
  if (options.header !== undefined && (typeof options.header !== 'string' || !FIELD_NAME.test(options.header))) {
    throw new ConfigurationError('header', 'must be an HTTP header name')
  }
  const header = (options.header ?? IDENTITY_HEADER).toLowerCase()
  const now = options.now
  const tolerance = options.clockToleranceSeconds ?? 5
  if (typeof tolerance !== 'number' || !Number.isFinite(tolerance) || tolerance < 0) {
    throw new ConfigurationError('clockToleranceSeconds', 'must be a finite number of seconds, 0 or more')
  }
  const maxTokenAge = options.maxTokenAgeSeconds ?? DEFAULT_MAX_TOKEN_AGE_SECONDS
  if (typeof maxTokenAge !== 'number' || !Number.isFinite(maxTokenAge) || maxTokenAge <= 0) {
    throw new ConfigurationError('maxTokenAgeSeconds', 'must be a finite number of seconds, more than 0')
  }
  let keys: JWTVerifyGetKey
  const source = options.jwks
  if (typeof source === 'string' || source instanceof URL) {
    if (!URL.canParse(String(source))) throw new ConfigurationError('jwks', 'must be a URL or a JWKS document')
    const url = new URL(String(source))
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ConfigurationError('jwks', 'must be an http(s) URL')
    const remote = createRemoteJWKSet(url, options.fetch ? { [customFetch]: options.fetch } : {})
    // An outage must not look like a forgery: the App answers 503 to the one, 401 to the other.
    keys = async (protectedHeader, token) => {
      try {
        return await remote(protectedHeader, token)
      } catch (error) {
        throw isRetrievalFailure(error) ? new JwksUnavailableError({ cause: error }) : error
      }
    }
  } else if (source && Array.isArray(source.keys)) {
    keys = createLocalJWKSet({ keys: source.keys })
  } else {
    throw new ConfigurationError('jwks', 'must be a URL or a JWKS document')
  }

  return async function verifyIdentity(input) {
    const token = tokenOf(input, header)
    if (!token) throw new UnauthorizedError('Missing identity token')
    let payload: JWTPayload
    try {
      ;({ payload } = await jwtVerify(token, keys, {
        issuer: options.issuer,
        audience,
        typ: IDENTITY_TOKEN_TYPE,
        algorithms: [...ASYMMETRIC_ALGORITHMS],
        clockTolerance: tolerance,
        maxTokenAge,
        requiredClaims: ['sub', 'exp', 'iat', 'jti', 'app', 'ver', 'method'],
        ...(now && { currentDate: new Date(now()) }),
      }))
    } catch (error) {
      if (error instanceof JwksUnavailableError) throw error
      throw new UnauthorizedError('Invalid identity token')
    }
    const claims = payload as IdentityClaims
    if (
      !isNonEmptyString(claims.sub) ||
      !isNonEmptyString(claims.ver) ||
      !isNonEmptyString(claims.jti) ||
      typeof claims.app !== 'string' ||
      (claims.method !== 'api_token' && claims.method !== 'oauth') ||
      // `maxTokenAge` bounds the age; this bounds the lifetime a token claims for itself.
      claims.exp - claims.iat > maxTokenAge
    ) {
      throw new UnauthorizedError('Invalid identity token')
    }
    if (!appIds.has(claims.app)) {
      throw new UnauthorizedError('Identity token is for another App')
    }
    return {
      subject: claims.sub,
      appId: claims.app,
      version: claims.ver,
      method: claims.method,
      ...(typeof claims.client_id === 'string' && { clientId: claims.client_id }),
      ...(typeof claims.scope === 'string' && { scopes: claims.scope.split(' ').filter(Boolean) }),
      expiresAt: claims.exp * 1000,
      claims,
    }
  }
}

function isNonEmptyString(value: unknown): value is string {
  return typeof value === 'string' && value !== ''
}
