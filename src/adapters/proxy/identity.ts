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
  CompactSign,
  SignJWT,
  calculateJwkThumbprint,
  compactVerify,
  createLocalJWKSet,
  decodeProtectedHeader,
  errors,
  exportJWK,
  importJWK,
} from 'jose'
import { isFieldName } from '../../core/cors.js'
import { parseUrl } from '../../core/url.js'
import { checkAccessTokenClaims, issuedSince, peekJwtClaims } from '../../auth/jwt-claims.js'
import { jwtVerifyWithKeySet } from '../../auth/jwt-verify.js'
import { fetchLettingGo } from '../../fetch-let-go.js'
import { readTextUpTo } from '../../read-text.js'
import { withTimeout } from '../../timeout.js'
import { ConfigurationError, JwksUnavailableError, UnauthorizedError, optionNames, refuseUnknownOptions } from '../../errors.js'
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
  /** The public keys (JWKs). */
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

/**
 * A public key still published after a rotation, with the `kid` and `alg` its tokens carry
 * when the JWK does not hold them.
 */
export interface IdentityPreviousKey {
  /** The public JWK (private members, if any, are not published). */
  jwk: JWK
  /**
   * The `kid` the old signer put in its tokens: its `keyId` option. Default: the JWK's `kid`,
   * else its RFC 7638 thumbprint (the signer's own default).
   */
  keyId?: string | undefined
  /**
   * The `alg` the old signer put in its tokens: its `algorithm` option. Default: the JWK's
   * `alg`; else, for an EC key, the one of its curve; an RSA or Ed25519 key is published
   * without `alg` and verifies the tokens of any algorithm of its type.
   */
  algorithm?: (typeof ASYMMETRIC_ALGORITHMS)[number] | undefined
}

/** Options of {@link createIdentitySigner}. */
export interface IdentitySignerOptions {
  /**
   * The platform's identifier, the `iss` of every token: a non-empty string (RFC 7519
   * StringOrURI), by convention the platform's URL (`https://platform.example`). The verifier
   * compares it exactly.
   */
  issuer: string
  /**
   * The private key that signs. Asymmetric only: EC (P-256, P-384, P-521), Ed25519, or RSA of
   * 2048 bits or more.
   */
  privateKey: IdentityKey
  /**
   * The matching public key, for the JWKS. Needed only when the private key cannot be
   * exported (a non-extractable `CryptoKey`). It must be the private key's pair: the first
   * signature checks it.
   */
  publicKey?: IdentityKey | undefined
  /**
   * JWS algorithm. Default: a private JWK's `alg`, else from the key (P-256 `ES256`, Ed25519
   * `EdDSA`, RSA `RS256`, an RSA-PSS key `PS256`, a Web Crypto RSA key the one of its hash).
   */
  algorithm?: (typeof ASYMMETRIC_ALGORITHMS)[number] | undefined
  /** `kid` of the key. Default: a private JWK's `kid`, else its JWK thumbprint (RFC 7638). */
  keyId?: string | undefined
  /** Token lifetime in seconds, 1 to 3600. Default 60. */
  ttlSeconds?: number | undefined
  /**
   * Public keys still published after a rotation, so tokens signed before it still verify: a
   * JWK (its `kid` and `alg` members, when present, are those its tokens carry), or
   * `{ jwk, keyId, algorithm }` naming them (see {@link IdentityPreviousKey}). Each `kid` may
   * name one key a token can tell apart: a previous key with the `kid` of another key (the
   * signing key's own `keyId` included) of the same type and curve, unless the two have
   * different `alg`s of their own, is refused. The signing key listed again without its
   * `keyId` (plainly, or under its thumbprint) is published once.
   */
  previousKeys?: readonly (JWK | IdentityPreviousKey)[] | undefined
  /**
   * Clock, epoch ms: a function returning a finite number. Default `Date.now`. A value that is
   * not one (`NaN`, a string, a `Date`) makes `sign` reject with a `ConfigurationError`
   * rather than sign a token with no valid `iat` and `exp`.
   */
  now?: (() => number) | undefined
}

/** Signs identity tokens and publishes their keys. Create with {@link createIdentitySigner}. */
export interface IdentitySigner {
  /** The `iss` of every token. */
  readonly issuer: string
  /**
   * Signs the identity of a dispatched request for one upstream (`aud`). Rejects with a
   * `ConfigurationError` when the keys turn out unusable on first use (see
   * {@link createIdentitySigner}); the next call tries again.
   */
  sign(context: DispatchContext, audience: string): Promise<string>
  /**
   * The JWKS document to publish (public keys only), e.g. at
   * `https://platform.example/.well-known/jwks.json`. Awaiting it at start checks the keys as
   * the first `sign` would.
   */
  jwks(): Promise<IdentityJwks>
}

const PRIVATE_MEMBERS = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth', 'k', 'priv'] as const

/** The members of the RFC 7638 thumbprint, per key type: two keys with equal ones are one key. */
const THUMBPRINT_MEMBERS: Readonly<Record<string, readonly string[]>> = {
  EC: ['crv', 'kty', 'x', 'y'],
  OKP: ['crv', 'kty', 'x'],
  RSA: ['e', 'kty', 'n'],
}

const RSA_ALGORITHMS = ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512'] as const

/** The shortest RSA modulus `jose` signs or verifies with (RFC 7518 section 3.3). */
const MIN_RSA_BITS = 2048

function isJwk(key: unknown): key is JWK {
  return typeof key === 'object' && key !== null && typeof (key as { kty?: unknown }).kty === 'string'
}

/**
 * Refuses a JWK meant for another use than signatures: published with its own `use`, it would
 * verify none of the tokens it signed.
 */
function refuseOtherUse(jwk: JWK, option: string): void {
  if (jwk.use !== undefined && jwk.use !== 'sig') {
    throw new ConfigurationError(`${option}.use`, `is ${JSON.stringify(jwk.use)}: identity tokens are signatures ("sig", or no use)`)
  }
}

/**
 * The public members of `jwk` (those of its type's thumbprint) with its `kid`, `alg` and `use`:
 * nothing else of a key given to the signer reaches the published JWKS, neither a private member
 * nor one of the platform's own (a note, a vault path, a certificate chain).
 */
function publicPart(jwk: JWK): JWK {
  const source = jwk as Record<string, unknown>
  const out: Record<string, unknown> = {}
  for (const name of [...(THUMBPRINT_MEMBERS[jwk.kty ?? ''] ?? ['kty']), 'kid', 'alg', 'use']) {
    if (source[name] !== undefined) out[name] = source[name]
  }
  return out as JWK
}

/** The thumbprint members of `jwk`, as one string; `undefined` when one is missing. */
function membersOf(jwk: JWK): string | undefined {
  const names = THUMBPRINT_MEMBERS[jwk.kty ?? '']
  const values = names?.map((name) => (jwk as Record<string, unknown>)[name])
  return values?.every((value) => typeof value === 'string') ? JSON.stringify(values) : undefined
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}

/** What this module reads of a `node:crypto` `KeyObject`. */
interface NodeKeyObject {
  readonly type: string
  readonly asymmetricKeyType?: string
  readonly asymmetricKeyDetails?: {
    readonly namedCurve?: string
    readonly modulusLength?: number
    readonly hashAlgorithm?: string
  }
  export(options: { format: 'jwk' }): JWK
  readonly toCryptoKey?: unknown
}

/** What can be seen of a key without importing it. */
interface KeyFacts {
  readonly type: 'private' | 'public' | 'secret'
  readonly kty: string
  readonly crv: string | undefined
  /** The algorithms it signs with, the default first; `[]` when none here does (secp256k1, Ed448, X25519, ECDH, RSA-OAEP). */
  readonly algorithms: readonly string[]
  /** Of an RSA key, in bits. */
  readonly modulusLength: number | undefined
  /** Its public members, when they can be had without waiting (a JWK, a `KeyObject`). */
  readonly publicJwk: JWK | undefined
  /** An `rsa-pss` `KeyObject`. */
  readonly rsaPssKeyObject: boolean
  /** A `KeyObject` Node exports no JWK of (rsa-pss): its public key cannot be published. */
  readonly noJwkExport: boolean
}

const NIST_CURVES: Readonly<Record<string, string>> = { prime256v1: 'P-256', secp384r1: 'P-384', secp521r1: 'P-521' }
const HASH_SIZES: Readonly<Record<string, string>> = { 'sha-256': '256', sha256: '256', 'sha-384': '384', sha384: '384', 'sha-512': '512', sha512: '512' }

function algorithmsOf(kty: string, crv: string | undefined): readonly string[] {
  if (kty === 'EC') return crv === 'P-256' ? ['ES256'] : crv === 'P-384' ? ['ES384'] : crv === 'P-521' ? ['ES512'] : []
  if (kty === 'OKP') return crv === 'Ed25519' ? ['EdDSA', 'Ed25519'] : []
  if (kty === 'RSA') return RSA_ALGORITHMS
  return []
}

/**
 * The facts of a JWK, a `KeyObject` (type, curve, modulus, the hash an RSA-PSS key is bound
 * to) or a `CryptoKey` (its algorithm: an RSA `CryptoKey` signs with one hash only);
 * `undefined` for anything else.
 */
function factsOf(key: unknown): KeyFacts | undefined {
  if (isJwk(key)) {
    const kty = key.kty!
    return {
      type: kty === 'oct' ? 'secret' : typeof key.d === 'string' ? 'private' : 'public',
      kty,
      crv: key.crv,
      algorithms: algorithmsOf(kty, key.crv),
      // Unpadded base64url: 6 bits a character, rounded down to whole bytes.
      modulusLength: kty === 'RSA' && typeof key.n === 'string' ? Math.floor((key.n.length * 6) / 8) * 8 : undefined,
      publicJwk: kty === 'oct' ? undefined : publicPart(key),
      rsaPssKeyObject: false,
      noJwkExport: false,
    }
  }
  if (typeof key !== 'object' || key === null) return undefined
  const tag = (key as { [Symbol.toStringTag]?: unknown })[Symbol.toStringTag]
  if (tag === 'KeyObject') {
    const object = key as NodeKeyObject
    if (object.type === 'secret') {
      return { type: 'secret', kty: 'oct', crv: undefined, algorithms: [], modulusLength: undefined, publicJwk: undefined, rsaPssKeyObject: false, noJwkExport: false }
    }
    const type = object.asymmetricKeyType ?? ''
    const details = object.asymmetricKeyDetails ?? {}
    const kty = type === 'ec' ? 'EC' : type === 'rsa' || type === 'rsa-pss' ? 'RSA' : type === 'ed25519' ? 'OKP' : type
    const curve = details.namedCurve
    const crv = type === 'ed25519' ? 'Ed25519' : curve === undefined ? undefined : (NIST_CURVES[curve] ?? curve)
    // An RSA-PSS key signs with PS* only, and with the one hash it may be bound to.
    const hash = details.hashAlgorithm === undefined ? undefined : HASH_SIZES[details.hashAlgorithm]
    const algorithms =
      type === 'rsa-pss'
        ? details.hashAlgorithm === undefined
          ? ['PS256', 'PS384', 'PS512']
          : hash
            ? [`PS${hash}`]
            : []
        : algorithmsOf(kty, crv)
    let publicJwk: JWK | undefined
    try {
      publicJwk = publicPart(object.export({ format: 'jwk' }))
    } catch {
      // Node exports no JWK of some key types (rsa-pss); jose's exportJWK would fail the same way.
    }
    return {
      type: object.type === 'public' ? 'public' : 'private',
      kty,
      crv,
      algorithms,
      modulusLength: details.modulusLength,
      publicJwk,
      rsaPssKeyObject: type === 'rsa-pss',
      noJwkExport: publicJwk === undefined,
    }
  }
  const algorithm = (key as { algorithm?: { name?: unknown; namedCurve?: unknown; hash?: unknown; modulusLength?: unknown } }).algorithm
  const name = typeof algorithm?.name === 'string' ? algorithm.name : undefined
  if (name === undefined) return undefined
  const type = (key as { type?: unknown }).type
  const hashName = typeof algorithm!.hash === 'string' ? algorithm!.hash : (algorithm!.hash as { name?: unknown } | undefined)?.name
  const hash = typeof hashName === 'string' ? HASH_SIZES[hashName.toLowerCase()] : undefined
  const kty = name === 'ECDSA' ? 'EC' : name === 'Ed25519' ? 'OKP' : name === 'RSASSA-PKCS1-v1_5' || name === 'RSA-PSS' ? 'RSA' : name
  const crv = name === 'Ed25519' ? 'Ed25519' : typeof algorithm!.namedCurve === 'string' ? algorithm!.namedCurve : undefined
  return {
    type: type === 'secret' ? 'secret' : type === 'public' ? 'public' : 'private',
    kty,
    crv,
    // A Web Crypto RSA key is bound to its scheme and hash: one algorithm.
    algorithms:
      name === 'RSASSA-PKCS1-v1_5' ? (hash ? [`RS${hash}`] : []) : name === 'RSA-PSS' ? (hash ? [`PS${hash}`] : []) : algorithmsOf(kty, crv),
    modulusLength: typeof algorithm!.modulusLength === 'number' ? algorithm!.modulusLength : undefined,
    publicJwk: undefined,
    rsaPssKeyObject: false,
    noJwkExport: false,
  }
}

const KEY_KINDS = 'an EC key on P-256, P-384 or P-521, an Ed25519 key, or an RSA key'

/**
 * Why `jose` cannot sign with `key`, an rsa-pss `KeyObject`, under `alg` (`PS256`…), or
 * `undefined` when it can. `jose` signs with a `KeyObject` through `KeyObject.toCryptoKey`
 * (Node 22.10 or later), else through its JWK, which Node does not export for rsa-pss keys; and
 * Node's Web Crypto takes no rsa-pss `KeyObject` either (22 and 24: `DataError: Invalid key
 * type`), so the conversion `jose` will make is tried here, as it makes it, rather than assumed
 * from the method's presence.
 */
function rsaPssKeyObjectUnusable(key: NodeKeyObject, alg: string): string | undefined {
  const toCryptoKey = key.toCryptoKey as ((algorithm: object, extractable: boolean, usages: string[]) => unknown) | undefined
  if (typeof toCryptoKey !== 'function') return 'no KeyObject.toCryptoKey, before Node 22.10'
  try {
    toCryptoKey.call(key, { name: 'RSA-PSS', hash: `SHA-${alg.slice(2)}` }, false, ['sign'])
    return undefined
  } catch (error) {
    return `Node's Web Crypto does not take it: ${messageOf(error)}`
  }
}

/** One key of the JWKS, as far as it is known. */
interface PublishedKey {
  /** Public members, without `kid` and `alg` (`undefined` for the current key until loaded). */
  readonly jwk: JWK | undefined
  readonly kty: string
  readonly crv: string | undefined
  /** `undefined` until known (a thumbprint, computed when loaded). */
  readonly kid: string | undefined
  /** Whether `kid` was given rather than the thumbprint. */
  readonly kidGiven: boolean
  readonly alg: string | undefined
  /** {@link membersOf} the key, when known. */
  readonly members: string | undefined
  readonly use: string | undefined
  /** The option that gave it, for errors. */
  readonly option: string
}

/** A previous key as the signer publishes it, checked. */
function previousKeyOf(entry: unknown, option: string): PublishedKey {
  const wrapper = isJwk(entry) ? undefined : (entry as IdentityPreviousKey | undefined)
  const jwk = wrapper === undefined ? entry : typeof wrapper === 'object' && wrapper !== null ? wrapper.jwk : undefined
  const jwkOption = wrapper === undefined ? option : `${option}.jwk`
  if (!isJwk(jwk)) throw new ConfigurationError(option, 'must be a public JWK, or { jwk, keyId, algorithm }')
  const facts = factsOf(jwk)!
  if (facts.type === 'secret') throw new ConfigurationError(jwkOption, `must be a public key (${KEY_KINDS}), not a secret`)
  if (facts.algorithms.length === 0) throw new ConfigurationError(jwkOption, `must be ${KEY_KINDS}`)
  const members = membersOf(jwk)
  if (members === undefined) throw new ConfigurationError(jwkOption, `lacks a member of its key type (${THUMBPRINT_MEMBERS[facts.kty]!.join(', ')})`)
  if (facts.modulusLength !== undefined && facts.modulusLength < MIN_RSA_BITS) {
    throw new ConfigurationError(jwkOption, `is a ${facts.modulusLength}-bit RSA key: at least ${MIN_RSA_BITS} bits (RFC 7518 section 3.3)`)
  }
  const kidOption = wrapper?.keyId !== undefined ? `${option}.keyId` : `${jwkOption}.kid`
  const kid: unknown = wrapper?.keyId ?? jwk.kid
  if (kid !== undefined && (typeof kid !== 'string' || kid === '')) throw new ConfigurationError(kidOption, 'must be a non-empty string')
  refuseOtherUse(jwk, jwkOption)
  const algOption = wrapper?.algorithm !== undefined ? `${option}.algorithm` : `${jwkOption}.alg`
  const alg: unknown = wrapper?.algorithm ?? jwk.alg
  if (alg !== undefined && (typeof alg !== 'string' || !facts.algorithms.includes(alg))) {
    throw new ConfigurationError(algOption, `${String(alg)} does not fit the key (it signs with ${facts.algorithms.join(', ')})`)
  }
  const published = publicPart(jwk)
  delete published.kid
  delete published.alg
  delete published.use
  return {
    jwk: published,
    kty: facts.kty,
    crv: facts.crv,
    kid: kid as string | undefined,
    kidGiven: kid !== undefined,
    // The curve says an EC key's algorithm. An RSA or Ed25519 key's is not known: a made-up one
    // would refuse the tokens it signed (RS256 for PS256 ones), so none is published.
    alg: (alg as string | undefined) ?? (facts.kty === 'EC' ? facts.algorithms[0] : undefined),
    members,
    use: jwk.use,
    option,
  }
}

/**
 * The keys to publish, the current one first. Two keys a token cannot tell apart (one `kid`,
 * one key type and curve, the same or no `alg`) are refused: `jose` would refuse every token
 * of that `kid` (`ERR_JWKS_MULTIPLE_MATCHING_KEYS`). A previous key given the `kid` the
 * signing key is given is refused whatever it is (a rotation that kept a fixed `keyId`, or the
 * signing key listed again), so it is seen when created even for a `CryptoKey`. The signing
 * key listed again under its thumbprint, and a previous key listed twice, are published once.
 * What is not known yet (a thumbprint, the members of a `CryptoKey`) is decided when loaded.
 */
function publishable(current: PublishedKey, previous: readonly PublishedKey[]): PublishedKey[] {
  const kept = [current]
  for (const entry of previous) {
    const same = (other: PublishedKey) => entry.members !== undefined && entry.members === other.members
    const clash =
      entry.kid === undefined
        ? undefined
        : kept.find(
            (other) =>
              other.kid === entry.kid &&
              other.kty === entry.kty &&
              other.crv === entry.crv &&
              (other.alg === undefined || entry.alg === undefined || other.alg === entry.alg),
          )
    const named = clash === current && current.kidGiven && entry.kidGiven
    if (!named && same(current) && (!entry.kidGiven || entry.kid === current.kid)) continue
    if (!named && clash && same(clash)) continue
    if (named || (clash && clash.members !== undefined && entry.members !== undefined)) {
      const holder = clash === current ? `the signing key (${clash.option})` : clash!.option
      throw new ConfigurationError(
        entry.option,
        `has kid ${JSON.stringify(entry.kid)}, as ${holder} does: jose would refuse every token of that kid. ` +
          'Give a new key a new keyId; the signing key itself needs no previousKeys entry',
      )
    }
    kept.push(entry)
  }
  return kept
}

function toJwk(key: PublishedKey): JWK {
  return { ...key.jwk, ...(key.alg !== undefined && { alg: key.alg }), kid: key.kid!, use: key.use ?? 'sig' }
}

const PROBE = new TextEncoder().encode('mcp-dispatch identity key check')

/**
 * The clock of `option`: `Date.now` when not given; else the function, checked to be one now and
 * to give a finite number at each reading. A clock that answers `NaN` or a string would make
 * `jose` refuse with an obscure error, or sign a token issued at 1970 (a string read as 0 s), or
 * make a verifier compare `exp` with `NaN`: a misconfiguration, said as one.
 */
function clockOf(now: unknown, option: string): () => number {
  if (now === undefined) return Date.now
  if (typeof now !== 'function') throw new ConfigurationError(option, 'must be a function returning epoch milliseconds')
  return () => {
    const value: unknown = now()
    if (typeof value !== 'number' || !Number.isFinite(value)) {
      const said = typeof value === 'number' ? String(value) : `a value of type ${typeof value}`
      throw new ConfigurationError(option, `must return a finite number of epoch milliseconds; it returned ${said}`)
    }
    return value
  }
}

const IDENTITY_SIGNER_OPTIONS = optionNames<IdentitySignerOptions>({ issuer: true, privateKey: true, publicKey: true, algorithm: true, keyId: true, ttlSeconds: true, previousKeys: true, now: true })

/**
 * Creates the signer of identity tokens. Misconfiguration that can be seen without importing
 * the key throws a `ConfigurationError` here: a missing issuer; a symmetric key, a public key
 * given as `privateKey`, a JWK whose `key_ops` leave out `sign`; a key no algorithm here signs
 * with (secp256k1, Ed448, X25519), an `algorithm` (or a private JWK's `alg`) that does not fit
 * it, an RSA key under 2048 bits, an rsa-pss `KeyObject` where `jose` cannot sign with one
 * or as the key to publish (Node exports no JWK of it); a `publicKey` of another key type, or
 * not the pair of a private key whose public part can be read; a non-extractable key without
 * `publicKey`; a `previousKeys` entry that is not a public EC, Ed25519 or RSA key, or that has
 * the `kid` of another key of its type and curve (the signing key's `keyId` included) that no
 * `alg` of its own tells apart; a `now` that is not a function
 * (one that returns anything but a finite number makes that `sign` reject with a
 * `ConfigurationError`). The rest is checked on first use (the first `sign` or `jwks`), by
 * signing a probe and verifying it with the published key: a key that does not sign, a
 * `publicKey` that is not its pair, or a thumbprint `kid` shared with another key rejects with
 * a `ConfigurationError`, and the next call tries again. Await `jwks()` at start to see it then.
 *
 * @example
 * ```ts
 * const { privateKey } = await generateKeyPair('ES256', { extractable: true }) // from jose
 * const signer = createIdentitySigner({ issuer: 'https://platform.example', privateKey })
 * await signer.jwks() // checks the key now rather than at the first request
 * // Publish: GET /.well-known/jwks.json → Response.json(await signer.jwks())
 * ```
 */
export function createIdentitySigner(options: IdentitySignerOptions): IdentitySigner {
  if (options !== null && typeof options === 'object') refuseUnknownOptions(options, IDENTITY_SIGNER_OPTIONS, 'createIdentitySigner (the proxy\'s identity)', undefined, 'identity.')
  if (!options || typeof options.issuer !== 'string' || options.issuer === '') {
    throw new ConfigurationError('identity.issuer', 'must be a non-empty string')
  }
  const { issuer, privateKey } = options
  if (typeof privateKey === 'string' && privateKey !== '') {
    // A PEM or a JWK's JSON straight from an environment variable: not "missing".
    throw new ConfigurationError('identity.privateKey', "must be a key, not a string: import a PEM first (jose's importPKCS8, or createPrivateKey of node:crypto), or JSON.parse a JWK")
  }
  if (!privateKey || typeof privateKey !== 'object') throw new ConfigurationError('identity.privateKey', 'is required')
  const facts = factsOf(privateKey)
  if (facts === undefined) throw new ConfigurationError('identity.privateKey', 'must be a CryptoKey, a KeyObject or a private JWK')
  if (facts.type === 'secret') throw new ConfigurationError('identity.privateKey', 'must be asymmetric (EC, OKP or RSA)')
  if (facts.type === 'public') {
    throw new ConfigurationError(
      'identity.privateKey',
      isJwk(privateKey) ? 'must be a private JWK (with "d")' : 'is a public key: give the private key (and, when it cannot be exported, publicKey)',
    )
  }
  if (isJwk(privateKey) && privateKey.key_ops !== undefined && !(Array.isArray(privateKey.key_ops) && privateKey.key_ops.includes('sign'))) {
    throw new ConfigurationError('identity.privateKey', 'has "key_ops" without "sign"')
  }
  if (isJwk(privateKey)) refuseOtherUse(privateKey, 'identity.privateKey')
  if (isJwk(options.publicKey)) refuseOtherUse(options.publicKey, 'identity.publicKey')
  if (!options.publicKey && (privateKey as { extractable?: unknown }).extractable === false) {
    throw new ConfigurationError('identity.publicKey', 'is required when the private key is not extractable')
  }
  if (options.algorithm !== undefined && !ASYMMETRIC_ALGORITHMS.includes(options.algorithm)) {
    throw new ConfigurationError('identity.algorithm', `must be one of ${ASYMMETRIC_ALGORITHMS.join(', ')}`)
  }
  // Seen now rather than at the first request (where every request would be a 502).
  const allowed = facts.algorithms
  if (allowed.length === 0) throw new ConfigurationError('identity.privateKey', `must be ${KEY_KINDS}`)
  if (options.algorithm !== undefined && !allowed.includes(options.algorithm)) {
    throw new ConfigurationError('identity.algorithm', `${options.algorithm} does not fit the key (it signs with ${allowed.join(', ')})`)
  }
  const jwkAlg: unknown = isJwk(privateKey) ? privateKey.alg : undefined
  if (options.algorithm === undefined && jwkAlg !== undefined && (typeof jwkAlg !== 'string' || !allowed.includes(jwkAlg))) {
    throw new ConfigurationError('identity.privateKey', `has "alg" ${JSON.stringify(jwkAlg)}, which does not fit the key (it signs with ${allowed.join(', ')})`)
  }
  const alg = options.algorithm ?? (jwkAlg as string | undefined) ?? allowed[0]!
  if (facts.modulusLength !== undefined && facts.modulusLength < MIN_RSA_BITS) {
    throw new ConfigurationError('identity.privateKey', `is a ${facts.modulusLength}-bit RSA key: at least ${MIN_RSA_BITS} bits (RFC 7518 section 3.3)`)
  }
  if (facts.rsaPssKeyObject) {
    const unusable = rsaPssKeyObjectUnusable(privateKey as NodeKeyObject, alg)
    if (unusable !== undefined) {
      throw new ConfigurationError(
        'identity.privateKey',
        `is an rsa-pss KeyObject, which jose cannot sign with on this runtime (${unusable}): give a Web Crypto RSA-PSS CryptoKey, or an rsa KeyObject with algorithm PS256`,
      )
    }
  }
  let publicFacts: KeyFacts | undefined
  if (options.publicKey !== undefined) {
    publicFacts = factsOf(options.publicKey)
    if (publicFacts === undefined || publicFacts.type === 'secret') {
      throw new ConfigurationError('identity.publicKey', 'must be a CryptoKey, a KeyObject or a JWK: the public key of privateKey')
    }
    const mismatch =
      publicFacts.kty !== facts.kty ||
      publicFacts.crv !== facts.crv ||
      (publicFacts.publicJwk !== undefined && facts.publicJwk !== undefined && membersOf(publicFacts.publicJwk) !== membersOf(facts.publicJwk))
    if (mismatch) throw new ConfigurationError('identity.publicKey', 'is not the public key of privateKey: the JWKS would verify none of its tokens')
  }
  const publicOption = options.publicKey ? 'identity.publicKey' : 'identity.privateKey'
  if ((publicFacts ?? facts).noJwkExport) {
    throw new ConfigurationError(publicOption, 'is a KeyObject of which Node exports no JWK (rsa-pss), so the JWKS cannot hold it: give publicKey as a JWK or a CryptoKey')
  }
  const keyId: unknown = options.keyId ?? (isJwk(privateKey) ? privateKey.kid : undefined)
  if (keyId !== undefined && (typeof keyId !== 'string' || keyId === '')) {
    throw new ConfigurationError(options.keyId !== undefined ? 'identity.keyId' : 'identity.privateKey.kid', 'must be a non-empty string')
  }
  const ttl = options.ttlSeconds ?? DEFAULT_IDENTITY_TTL_SECONDS
  if (!Number.isSafeInteger(ttl) || ttl < 1 || ttl > 3600) {
    throw new ConfigurationError('identity.ttlSeconds', 'must be an integer from 1 to 3600')
  }
  if (options.previousKeys !== undefined && !Array.isArray(options.previousKeys)) {
    throw new ConfigurationError('identity.previousKeys', 'must be an array')
  }
  const previous = (options.previousKeys ?? []).map((key, i) => previousKeyOf(key, `identity.previousKeys.${i}`))
  const knownPublic = (publicFacts ?? facts).publicJwk
  const current: PublishedKey = {
    jwk: undefined,
    kty: facts.kty,
    crv: facts.crv,
    kid: keyId as string | undefined,
    kidGiven: keyId !== undefined,
    alg,
    members: knownPublic && membersOf(knownPublic),
    use: 'sig',
    option: options.keyId !== undefined ? 'identity.keyId' : 'identity.privateKey',
  }
  // What can be told of the kids now (those given, of keys whose members are known).
  publishable(current, previous)
  const now = clockOf(options.now, 'identity.now')

  type Loaded = { key: CryptoKey | KeyObject; kid: string; jwks: IdentityJwks }
  async function prepare(): Promise<Loaded> {
    const source = options.publicKey ?? privateKey
    let publicJwk: JWK
    try {
      publicJwk = publicPart(isJwk(source) ? source : await exportJWK(source as CryptoKey | KeyObject))
    } catch (cause) {
      throw new ConfigurationError(publicOption, `cannot be exported as a JWK for the JWKS (${messageOf(cause)}): give publicKey as a JWK or an extractable CryptoKey`, { cause })
    }
    let key: CryptoKey | KeyObject
    let probe: string
    try {
      if (isJwk(privateKey)) {
        // `key_ops` has "sign" (checked); Web Crypto refuses a private key imported for more.
        const { key_ops: _ops, ...jwk } = privateKey
        key = (await importJWK(jwk, alg)) as CryptoKey
      } else {
        key = privateKey as CryptoKey | KeyObject
      }
      probe = await new CompactSign(PROBE).setProtectedHeader({ alg }).sign(key)
    } catch (cause) {
      throw new ConfigurationError('identity.privateKey', `cannot sign with ${alg}: ${messageOf(cause)}`, { cause })
    }
    try {
      await compactVerify(probe, await importJWK(publicJwk, alg))
    } catch (cause) {
      throw new ConfigurationError(
        publicOption,
        options.publicKey
          ? 'is not the public key of privateKey: the JWKS would verify none of its tokens'
          : `gives a public key that verifies none of its signatures (${messageOf(cause)})`,
        { cause },
      )
    }
    const kid = current.kid ?? (await calculateJwkThumbprint(publicJwk))
    const published = publicPart(publicJwk)
    delete published.kid
    delete published.alg
    delete published.use
    const loadedCurrent: PublishedKey = { ...current, jwk: published, kid, members: membersOf(publicJwk) }
    const loadedPrevious = await Promise.all(
      previous.map(async (entry) => (entry.kid !== undefined ? entry : { ...entry, kid: await calculateJwkThumbprint(entry.jwk!) })),
    )
    return { key, kid, jwks: { keys: publishable(loadedCurrent, loadedPrevious).map(toJwk) } }
  }

  let loading: Promise<Loaded> | undefined
  function load(): Promise<Loaded> {
    if (!loading) {
      const attempt = prepare()
      loading = attempt
      // A failure is not kept: the next call tries again (and, when the keys are at fault,
      // rejects again with the same ConfigurationError).
      attempt.catch(() => {
        if (loading === attempt) loading = undefined
      })
    }
    return loading
  }

  return {
    issuer,
    async sign(context, audience) {
      const { key, kid } = await load()
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
   * The platform's JWKS: its http(s) URL, or the document itself. A URL is fetched on first
   * use, again when its keys are ten minutes old (the keys in hand serving meanwhile), and for
   * a `kid` they lack, at most once per 30 s from the last attempt on the monotonic clock; keys
   * in hand stay in use while it cannot be fetched (5 s and 1 MiB at most, no redirect
   * followed), and a key of it that does not import is a 503 and a refetch. With none in hand,
   * verification throws a {@link JwksUnavailableError} (answer 503), not an `UnauthorizedError`;
   * so does a token of a `kid` the keys lack issued since the last fetch began (its key may be
   * new). A document must hold at least one key, and public keys only: an entry with a private
   * member (`d`, or RSA's `p`, `q`…) or a symmetric (`oct`) key is refused when the verifier is created (that key would be a secret of the platform's,
   * copied to an App).
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
  header?: string | undefined
  /**
   * Clock skew tolerated, in seconds: a number from 0 to 300. Default 5. It lengthens the life
   * of every token (a 60 s token is accepted up to this long after its `exp`), so it is bounded:
   * a skew of more than five minutes is a clock to fix (NTP), not one to tolerate.
   */
  clockToleranceSeconds?: number | undefined
  /**
   * The longest lifetime accepted, in seconds: a token whose `exp` is more than this after its
   * `iat`, that was issued more than this (plus the tolerance) ago, or whose `iat` is in the
   * future beyond the tolerance, is refused. Default 3600, the longest `ttlSeconds` a signer
   * issues; an App whose platform signs with the default 60 may set 60.
   */
  maxTokenAgeSeconds?: number | undefined
  /**
   * Clock, epoch ms: a function returning a finite number. Default `Date.now`. A value that is
   * not one makes verification throw a `ConfigurationError` (not the 401 of a bad token).
   * Given, it also times a remote JWKS's 30 s between fetches and its keys' age, which the
   * monotonic clock times otherwise.
   */
  now?: (() => number) | undefined
  /**
   * `fetch` used to get a remote JWKS, called with the URL and an `init` (`redirect: 'manual'`,
   * a `signal`). Default the global one.
   */
  fetch?: typeof fetch | undefined
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
export interface IdentityNodeRequest {
  readonly headers: Readonly<Record<string, string | readonly string[] | undefined>>
}

/**
 * Verifies the identity of a request: a web `Request`, `Headers`, a Node request (Express,
 * Fastify, `node:http`) or the JWT itself. Create with {@link createIdentityVerifier}.
 */
export type IdentityVerifier = (input: Request | Headers | IdentityNodeRequest | string | null | undefined) => Promise<VerifiedIdentity>

/** The longest lifetime the verifier accepts by default: the longest `ttlSeconds` a signer issues. */
const DEFAULT_MAX_TOKEN_AGE_SECONDS = 3600

/** The most clock skew the verifier tolerates, in seconds (`clockToleranceSeconds`). */
const MAX_CLOCK_TOLERANCE_SECONDS = 300

/**
 * The keys of a JWKS document given to the verifier, checked: at least one, each a JWK, and
 * public (RFC 7517 section 5). Errors name the entry and the member, never a value: a private
 * key's members are secrets, and this message may reach a log.
 */
function publicKeysOf(keys: readonly unknown[]): JWK[] {
  if (keys.length === 0) throw new ConfigurationError('jwks', "has no keys: give the platform's JWKS (signer.jwks()) or its URL")
  return keys.map((key, i) => {
    const option = `jwks.keys.${i}`
    if (!isJwk(key)) throw new ConfigurationError(option, 'must be a JWK (an object with "kty")')
    if (key.kty === 'oct') {
      throw new ConfigurationError(option, 'is a symmetric ("oct") key: identity tokens are signed with asymmetric keys, and a JWKS holds public keys only')
    }
    const secret = PRIVATE_MEMBERS.filter((name) => (key as Record<string, unknown>)[name] !== undefined)
    if (secret.length > 0) {
      throw new ConfigurationError(
        option,
        `is a private key (it has ${secret.map((name) => JSON.stringify(name)).join(', ')}): a JWKS holds public keys only; give the platform's published JWKS (signer.jwks())`,
      )
    }
    return key
  })
}

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

/** How long fetched keys are used before they are fetched again (while the JWKS answers). */
const JWKS_MAX_AGE_MS = 600_000
/** The JWKS is fetched at most once per this time, counted from the last attempt, answered or not. */
const JWKS_COOLDOWN_MS = 30_000
/** How long a fetch of the JWKS may take, its body included. */
const JWKS_TIMEOUT_MS = 5_000
/** The largest JWKS taken (a platform's holds a few keys of a few hundred bytes). */
const JWKS_MAX_BYTES = 1024 * 1024

/**
 * The platform's JWKS at `url`, as a key set for `jwtVerify`. Fetched on first use, again once
 * the keys are ten minutes old (in the background: the keys in hand serve meanwhile), and for a
 * token whose `kid` the keys do not hold (a rotation), at most once per 30 s counted from the
 * last attempt whether it was answered or not, so an outage or a stream of made-up `kid`s costs
 * one fetch per 30 s. Keys in hand stay in use while the JWKS cannot be fetched; with none in
 * hand, verification fails with {@link JwksUnavailableError} (503). A token of an unknown `kid`
 * issued since the last fetch began is a 503 too, not a 401: its key may have been published
 * since, and the client's retry, once the 30 s allow a fetch, will find it. A fetched key that
 * cannot be used (one that does not import) is a 503 and is fetched again once the 30 s allow.
 * A fetch takes at most 5 s (whatever the `fetch` given does with its signal) and 1 MiB,
 * follows no redirect, and must answer 200 with a JWKS of public keys. Its timing runs on
 * `lifeClock` (the monotonic clock, unless the verifier was given `now`); `wall` (epoch ms)
 * dates the keys against tokens' `iat`.
 */
function remoteKeySet(
  url: URL,
  fetchImpl: (input: URL, init: RequestInit) => Promise<Response>,
  wall: () => number,
  lifeClock: () => number,
  toleranceSeconds: number,
): JWTVerifyGetKey {
  /** The keys in hand: when fetched, on `lifeClock` and on the wall clock. */
  let held: { getKey: JWTVerifyGetKey; fetchedAt: number; fetchedAtWall: number } | undefined
  /** Set when a key in hand could not be used: fetched again as soon as the cooldown allows. */
  let suspect = false
  let lastAttempt: number | undefined
  let lastFailure: unknown
  let pending: Promise<void> | undefined

  async function fetchKeys(controller: AbortController, startedAt: number, startedAtWall: number): Promise<void> {
    const response = await fetchLettingGo(fetchImpl, url, { redirect: 'manual', headers: { accept: 'application/jwk-set+json, application/json' } }, controller)
    if (response.status !== 200) {
      void response.body?.cancel().catch(() => {})
      throw new Error(`JWKS answered ${response.status}`)
    }
    const text = await readTextUpTo(response, JWKS_MAX_BYTES)
    if (text === null) throw new Error(`JWKS larger than ${JWKS_MAX_BYTES} bytes`)
    // Timed out meanwhile: keys read too late never replace those in hand.
    controller.signal.throwIfAborted()
    const document: unknown = JSON.parse(text)
    const listed = document !== null && typeof document === 'object' ? (document as { keys?: unknown }).keys : undefined
    if (!Array.isArray(listed)) throw new Error('JWKS answer has no "keys" list')
    let keys: JWK[]
    try {
      // No private or symmetric key, and at least one key: as a JWKS given as a document.
      keys = publicKeysOf(listed)
    } catch (cause) {
      throw new Error(`JWKS answer is no JWKS of public keys: ${messageOf(cause)}`, { cause })
    }
    held = { getKey: createLocalJWKSet({ keys }), fetchedAt: startedAt, fetchedAtWall: startedAtWall }
  }

  /** Fetches the JWKS (one fetch for every caller meanwhile); a failure keeps the keys in hand. */
  function refresh(): Promise<void> {
    if (pending) return pending
    // Read here, so a clock that answers no time throws its ConfigurationError to the caller and
    // leaves no attempt behind. The keys are dated from the attempt's start: a token issued while
    // it ran is one issued since.
    const startedAt = lifeClock()
    const startedAtWall = wall()
    lastAttempt = startedAt
    pending = (async () => {
      // Not a step before `pending` holds this attempt, which the `finally` below clears.
      await null
      const controller = new AbortController()
      try {
        // The deadline settles the attempt even for a `fetch` of the platform's that ignores its
        // signal; the abort below then ends the fetch, and keys read too late are not taken.
        await withTimeout(fetchKeys(controller, startedAt, startedAtWall), JWKS_TIMEOUT_MS, 'JWKS fetch')
        lastFailure = undefined
        suspect = false
      } catch (error) {
        lastFailure = error
      } finally {
        controller.abort()
        pending = undefined
      }
    })()
    return pending
  }

  /** Whether `span` has passed since `from` (on a clock that stepped back before `from`: it has). */
  const passed = (from: number, span: number) => {
    const since = lifeClock() - from
    return since >= span || since < 0
  }
  /** Whether the cooldown since the last attempt is over. */
  const mayFetch = () => lastAttempt === undefined || passed(lastAttempt, JWKS_COOLDOWN_MS)
  /** Waits for the fetch under way, or for one of its own when the cooldown allows. */
  const fetchIfAllowed = async () => {
    if (pending) await pending
    else if (mayFetch()) await refresh()
  }

  return async (protectedHeader, token) => {
    if (held === undefined) await fetchIfAllowed()
    else if ((suspect || passed(held.fetchedAt, JWKS_MAX_AGE_MS)) && mayFetch()) {
      // Due a refresh: the keys in hand serve this token meanwhile.
      void refresh()
    }
    // An outage must not look like a forgery: the App answers 503 to the one, 401 to the other.
    if (held === undefined) throw new JwksUnavailableError({ cause: lastFailure })
    try {
      return await held.getKey(protectedHeader, token)
    } catch (error) {
      if (error instanceof errors.JWKSMultipleMatchingKeys || error instanceof errors.JOSENotSupported) throw error
      if (!(error instanceof errors.JWKSNoMatchingKey)) {
        // A key of the set that cannot be used (it does not import): the JWKS is at fault.
        suspect = true
        throw new JwksUnavailableError({ cause: error })
      }
      // A key the set lacks: fetched for (or the fetch under way awaited) when the cooldown
      // allows. Still lacking, a token issued since the keys were fetched may be a new key's.
      await fetchIfAllowed()
      try {
        return await held.getKey(protectedHeader, token)
      } catch (again) {
        const claims = typeof token.payload === 'string' ? peekJwtClaims(`${token.protected ?? ''}.${token.payload}.${token.signature}`) : undefined
        if (again instanceof errors.JWKSNoMatchingKey && issuedSince(claims?.iat, held.fetchedAtWall, toleranceSeconds * 1000)) {
          throw new JwksUnavailableError({ cause: lastFailure ?? again })
        }
        throw again
      }
    }
  }
}


const IDENTITY_VERIFIER_OPTIONS = optionNames<IdentityVerifierOptions>({ issuer: true, jwks: true, audience: true, header: true, appId: true, clockToleranceSeconds: true, maxTokenAgeSeconds: true, fetch: true, now: true })

/**
 * Creates the verifier an App uses to read who is calling through the platform. It checks
 * the signature against the platform's JWKS, `typ`, `iss`, `aud`, `exp`, the token's age and
 * lifetime (`maxTokenAgeSeconds`), the claims every identity token has (`jti`, non-empty
 * `sub` and `ver`, `method` one of `api_token` and `oauth`), and that the `app` claim names
 * this App (`appId`). A missing or invalid token throws an {@link UnauthorizedError} (answer
 * 401); a JWKS URL that cannot be fetched throws a {@link JwksUnavailableError} (answer 503),
 * unless the token's own claims or header, read unverified, refuse it (then the 401 it would
 * get anyway).
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
 * neither an http(s) URL nor a JWKS document, a JWKS document with no keys, an entry that is
 * not a JWK, a private key (`d`, …) or a symmetric (`oct`) key, a `header` that is not an HTTP
 * field name, a `clockToleranceSeconds` that is not a number from 0 to 300, a
 * `maxTokenAgeSeconds` that is not a finite number more than 0, or a `now` or `fetch` that is
 * not a function. Verification throws one (rather than the 401 of a bad token) when `now` returns
 * anything but a finite number.
 */
export function createIdentityVerifier(options: IdentityVerifierOptions): IdentityVerifier {
  if (options !== null && typeof options === 'object') refuseUnknownOptions(options, IDENTITY_VERIFIER_OPTIONS, 'createIdentityVerifier')
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
  if (options.header !== undefined && (typeof options.header !== 'string' || !isFieldName(options.header))) {
    throw new ConfigurationError('header', 'must be an HTTP header name')
  }
  const header = (options.header ?? IDENTITY_HEADER).toLowerCase()
  const now = clockOf(options.now, 'now')
  const tolerance = options.clockToleranceSeconds ?? 5
  // NaN and the infinities fail the comparisons.
  if (typeof tolerance !== 'number' || !(tolerance >= 0 && tolerance <= MAX_CLOCK_TOLERANCE_SECONDS)) {
    throw new ConfigurationError('clockToleranceSeconds', `must be a number of seconds from 0 to ${MAX_CLOCK_TOLERANCE_SECONDS}`)
  }
  const maxTokenAge = options.maxTokenAgeSeconds ?? DEFAULT_MAX_TOKEN_AGE_SECONDS
  if (typeof maxTokenAge !== 'number' || !Number.isFinite(maxTokenAge) || maxTokenAge <= 0) {
    throw new ConfigurationError('maxTokenAgeSeconds', 'must be a finite number of seconds, more than 0')
  }
  let keys: JWTVerifyGetKey
  const source = options.jwks
  if (typeof source === 'string' || source instanceof URL) {
    const url = parseUrl(String(source))
    if (url === undefined) throw new ConfigurationError('jwks', 'must be a URL or a JWKS document')
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ConfigurationError('jwks', 'must be an http(s) URL')
    // Not quoted: fetch refuses such a URL on every call, and its error, quoting it, would
    // put the password in every log line of the App's failures.
    if (url.username !== '' || url.password !== '') {
      throw new ConfigurationError('jwks', 'must hold no user name or password (fetch refuses such a URL); give credentials through a fetch of your own')
    }
    if (options.fetch !== undefined && typeof options.fetch !== 'function') throw new ConfigurationError('fetch', 'must be a function')
    // Timed on the monotonic clock, unless a clock is given (a test's, which then times it too).
    const lifeClock = options.now === undefined ? () => performance.now() : now
    keys = remoteKeySet(url, options.fetch ?? ((input, init) => fetch(input, init)), now, lifeClock, tolerance)
  } else if (source && Array.isArray(source.keys)) {
    keys = createLocalJWKSet({ keys: publicKeysOf(source.keys) })
  } else {
    throw new ConfigurationError('jwks', 'must be a URL or a JWKS document')
  }

  /** Why verified claims are refused (the message of the 401), or `undefined`. */
  const claimsRefusal = (claims: IdentityClaims): string | undefined => {
    if (
      !isNonEmptyString(claims.sub) ||
      !isNonEmptyString(claims.ver) ||
      !isNonEmptyString(claims.jti) ||
      typeof claims.app !== 'string' ||
      (claims.method !== 'api_token' && claims.method !== 'oauth') ||
      // `maxTokenAge` bounds the age; this bounds the lifetime a token claims for itself.
      !(claims.exp - claims.iat <= maxTokenAge)
    ) {
      return 'Invalid identity token'
    }
    if (!appIds.has(claims.app)) return 'Identity token is for another App'
    return undefined
  }

  /**
   * Whether a token would be refused whatever key signed it, read unverified: its header and
   * claims fail a check that needs no key (`kid`, `b64`, `typ`, `alg`, `iss`, `aud`, `exp`,
   * `nbf`, its age, an `iat` to come, a claim missing). A forged token naming a key the JWKS
   * lacks, or sent while the JWKS cannot be fetched, gets the 401 it would get anyway, not the
   * 503 (retry) that a key published since, or an outage, is worth.
   */
  const refusedWhateverTheKey = (token: string, at: Date): boolean => {
    const claims = peekJwtClaims(token)
    if (claims === undefined) return true
    let protectedHeader: ReturnType<typeof decodeProtectedHeader>
    try {
      protectedHeader = decodeProtectedHeader(token)
    } catch {
      return true
    }
    // Whole seconds, as jose reads the clock.
    const seconds = Math.floor(at.getTime() / 1000)
    const { typ, alg, kid, b64 } = protectedHeader
    return (
      // No key, fetched or to come, answers a `kid` that is not a string (RFC 7515 section
      // 4.1.4) or is empty (the signer gives none), and no JWT has an unencoded payload (RFC
      // 7797 section 7): a retry cannot help these, so they are not the 503 of a new key.
      (kid !== undefined && (typeof kid !== 'string' || kid === '')) ||
      b64 === false ||
      typeof typ !== 'string' ||
      mediaType(typ) !== mediaType(IDENTITY_TOKEN_TYPE) ||
      typeof alg !== 'string' ||
      !(ASYMMETRIC_ALGORITHMS as readonly string[]).includes(alg) ||
      typeof claims.exp !== 'number' ||
      typeof claims.iat !== 'number' ||
      // `iss`, `exp`, `nbf` and `aud` as the OAuth validator reads them (its audience match is
      // the looser of the two: a token it passes may still be a 503, never a false 401).
      checkAccessTokenClaims(claims, { issuer: options.issuer, requireIssuer: true, now: seconds * 1000, clockToleranceMs: tolerance * 1000, audience }) !== undefined ||
      seconds - claims.iat - tolerance > maxTokenAge ||
      seconds - claims.iat < -tolerance ||
      claimsRefusal(claims as IdentityClaims) !== undefined
    )
  }

  return async function verifyIdentity(input) {
    const token = tokenOf(input, header)
    if (!token) throw new UnauthorizedError('Missing identity token')
    // Read before `jwtVerify`, so a broken clock is its ConfigurationError, not a 401.
    const currentDate = new Date(now())
    let payload: JWTPayload
    try {
      payload = await jwtVerifyWithKeySet(token, keys, {
        issuer: options.issuer,
        audience,
        typ: IDENTITY_TOKEN_TYPE,
        algorithms: [...ASYMMETRIC_ALGORITHMS],
        clockTolerance: tolerance,
        maxTokenAge,
        requiredClaims: ['sub', 'exp', 'iat', 'jti', 'app', 'ver', 'method'],
        currentDate,
      })
    } catch (error) {
      // A clock that answered no time (checked before, and again by the key set) is the
      // platform's mistake, said as such, not the 401 of a bad token.
      if (error instanceof ConfigurationError) throw error
      if (error instanceof JwksUnavailableError && !refusedWhateverTheKey(token, currentDate)) throw error
      throw new UnauthorizedError('Invalid identity token')
    }
    const claims = payload as IdentityClaims
    const refusal = claimsRefusal(claims)
    if (refusal !== undefined) throw new UnauthorizedError(refusal)
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

/** A `typ` as JOSE compares it: lower case, `application/` understood (RFC 7515 section 4.1.9). */
function mediaType(typ: string): string {
  const lower = typ.toLowerCase()
  return lower.includes('/') ? lower : `application/${lower}`
}

function isNonEmptyString(value: unknown): value is string {
  return typeof value === 'string' && value !== ''
}
