/**
 * HTTP fuzz through every adapter over loopback: thousands of requests with random methods,
 * paths (some in absolute form, `GET http://host/v1`, naming a host of their own), header sets (huge and non-ASCII values included), Authorization values and bodies
 * (empty, garbage, JSON, batches, huge). Every answer must be a well-formed JSON-RPC error
 * of the dispatch layer, the metadata document, a preflight, or the handler's own answer
 * stamped with the version headers: never a 5xx, never a hang, never a crash, and the heap
 * stays flat.
 *
 * The oracle works out from each request alone, in the order of the pipeline, what it must get:
 * the handler's answer at one version, or one refusal (401 before a version is looked for, 404
 * `not_found` only for an App or path that does not exist); the framework answers allowed in
 * between stand in for that one answer only. Bearer strings that are no API token go through a
 * real OAuth validator (`jwt` mode, against a JWKS on loopback), with signed access tokens among
 * them: for this App, another, expired, of another issuer, signed with an unpublished key.
 *
 * Deterministic: the cases come from a fixed fast-check seed (`FUZZ_SEED` to change it,
 * `FUZZ_CASES` for the number of cases per adapter).
 */
import * as http from 'node:http'
import fc from 'fast-check'
import { compileVersions, createOAuthValidator, parseVersionPath, resolveVersion } from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { underCI } from '../helpers/ci.js'
import {
  type AdapterTarget,
  type Fixture,
  type RawRequest,
  type RawResponse,
  type RunningTarget,
  APP,
  HANDLER_MARK,
  HOSTNAME,
  LATEST,
  LIVE,
  OTHER_APP,
  activeResources,
  adapterTargets,
  collectGarbage,
  createFixture,
  jsonRpcError,
  leakedHandles,
  send,
  startAuthorizationServer,
} from './support.js'
import { parseUrl } from '../../src/core/url.js'

const SEED = Number(process.env.FUZZ_SEED ?? 20_251_121)
const CASES = Number(process.env.FUZZ_CASES ?? 3000)
const CONCURRENCY = 16

const targets = await adapterTargets()
// Up for the whole file, and counted in the baseline: the fixtures' validators fetch its keys.
const authServer = await startAuthorizationServer()
const baseline = activeResources()
afterAll(() => authServer.close())

// --- OAuth access tokens ----------------------------------------------------------------

/** What a credential earns: the handler's answer, or the status of its refusal. */
type CredentialOutcome = 'serve' | 401 | 402 | 403

/** The fixture's `allowedOrigins`: a request with any other `Origin` to an App's version path is 403. */
const ALLOWED_ORIGINS = ['https://allowed.example', 'http://localhost:3000'] as const

/**
 * The App addresses (`baseUrl`): what a token's `aud` must name (the validator's default
 * audience). Without the port: the App address must not follow the `Host` a caller sends.
 */
const ADDRESS = { fuzz: `http://${APP.slug}.localhost`, other: `http://${OTHER_APP.slug}.localhost` }

/**
 * Signed access tokens, each with what it earns at the fuzz App and at the other App. alice is
 * subscribed to both, bob's subscription to the fuzz App is inactive, carol has none. Signed
 * on the real clock, which the validator reads (the dispatcher's is the fixture's, in 2030).
 */
const JWTS = new Map<string, { fuzz: CredentialOutcome; other: CredentialOutcome }>()
/** The OAuth client whose budget is 0 a minute (the fixture's `rateLimit.policy`). */
const LIMITED_CLIENT = 'limited-client'
/** Tokens of {@link LIMITED_CLIENT}: past the credential and the subscription, 429. */
const LIMITED = new Set<string>()
{
  const now = Math.floor(Date.now() / 1000)
  // Issued a minute before the validator first fetches the keys: a token of a key it lacks,
  // issued since that fetch, may be of a key rotated in meanwhile, and is answered 503 until a
  // refetch may show it (docs/oauth.md), which is not what these tokens are here to test.
  const live = { iat: now - 60, exp: now + 3600 }
  const jwt = async (fuzz: CredentialOutcome, other: CredentialOutcome, token: string | Promise<string>) => {
    JWTS.set(await token, { fuzz, other })
  }
  const sign = authServer.sign
  const alice = await sign({ sub: 'alice', aud: ADDRESS.fuzz, ...live })
  await jwt('serve', 401, alice)
  await jwt(401, 'serve', sign({ sub: 'alice', aud: ADDRESS.other, ...live }))
  await jwt('serve', 'serve', sign({ sub: 'alice', aud: [ADDRESS.other, ADDRESS.fuzz], ...live }))
  // Past the credential and the subscription, the rate limit: LIMITED_CLIENT's budget is 0.
  const limited = await sign({ sub: 'alice', aud: ADDRESS.fuzz, client_id: LIMITED_CLIENT, ...live })
  LIMITED.add(limited)
  await jwt('serve', 401, limited)
  // A version path of the App address names the App (docs/oauth.md, audience).
  await jwt('serve', 401, sign({ sub: 'alice', aud: `${ADDRESS.fuzz}/v1`, ...live }))
  // Past the credential, the subscription: 402 at the App the token is for.
  await jwt(402, 401, sign({ sub: 'bob', aud: ADDRESS.fuzz, ...live }))
  await jwt(401, 402, sign({ sub: 'carol', aud: ADDRESS.other, ...live }))
  // Refused whatever the App: expired, not yet valid, without exp, for another resource or a
  // look-alike host, of another issuer, typed as an ID token, signed with a key the JWKS does
  // not hold (under its key id, and under another), unsigned, and alice's signature on bob's claims.
  await jwt(401, 401, sign({ sub: 'alice', aud: ADDRESS.fuzz, iat: now - 7200, exp: now - 3600 }))
  await jwt(401, 401, sign({ sub: 'alice', aud: ADDRESS.fuzz, ...live, nbf: now + 1800 }))
  await jwt(401, 401, sign({ sub: 'alice', aud: ADDRESS.fuzz, iat: now - 60 }))
  await jwt(401, 401, sign({ sub: 'alice', aud: 'https://elsewhere.example', ...live }))
  await jwt(401, 401, sign({ sub: 'alice', aud: `${ADDRESS.fuzz}.evil.example`, ...live }))
  await jwt(401, 401, sign({ sub: 'alice', aud: ADDRESS.fuzz, ...live, iss: 'https://auth.example.com' }))
  await jwt(401, 401, sign({ sub: 'alice', aud: ADDRESS.fuzz, ...live }, { typ: 'id_token+jwt' }))
  await jwt(401, 401, sign({ sub: 'alice', aud: ADDRESS.fuzz, ...live }, { foreignKey: true }))
  await jwt(401, 401, sign({ sub: 'alice', aud: ADDRESS.fuzz, ...live }, { foreignKey: true, kid: 'unknown' }))
  const [header, payload] = alice.split('.')
  await jwt(401, 401, `${Buffer.from('{"alg":"none","typ":"at+jwt"}').toString('base64url')}.${payload}.`)
  const bob = await sign({ sub: 'bob', aud: ADDRESS.fuzz, ...live })
  await jwt(401, 401, `${header}.${bob.split('.')[1]}.${alice.split('.')[2]}`)
}

// --- generators -------------------------------------------------------------------------

const COMMON_METHODS = ['GET', 'POST', 'DELETE', 'OPTIONS', 'HEAD', 'PUT', 'PATCH']
// Every method Node's parser accepts, but CONNECT (a tunnel, not a request).
const ALL_METHODS = http.METHODS.filter((m) => m !== 'CONNECT')

const URL_CHARS = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&\'()*+,;=:@/%?#[]'
const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/'
const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
const B64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'

const stringOf = (alphabet: string, min: number, max: number) =>
  fc.array(fc.constantFrom(...alphabet.split('')), { minLength: min, maxLength: max }).map((a) => a.join(''))

/** Header values Node sends and accepts: tab, printable ASCII, and the Latin-1 range 0x80–0xFF. */
const headerValue = (max: number) =>
  fc
    .array(fc.oneof({ weight: 6, arbitrary: fc.integer({ min: 0x20, max: 0x7e }) }, fc.integer({ min: 0x80, max: 0xff }), fc.constant(9)), {
      maxLength: max,
    })
    .map((codes) => String.fromCharCode(...codes).trim())

const pathArb = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.constantFrom(
      '/',
      '/v1',
      '/v1/',
      '/v1.1',
      '/v1.2',
      '/v1.2.3',
      '/v1.2.0',
      '/v2',
      '/v2.0.0',
      '/v2.1.0-rc.1',
      '/v3',
      '/v0',
      '/.well-known/oauth-protected-resource',
      '/.well-known/oauth-protected-resource/v1',
      '/.well-known/oauth-protected-resource/v9.9',
    ),
  },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      '/v01',
      '/v1.x',
      '/V1',
      '/v1.2.3+build.1',
      '/v99999999999999999999',
      '/v1.2.3.4',
      '//',
      '/..',
      '/%2e%2e/v1',
      '/v1/../v2',
      '/v1?x=1&y=%00',
      '/v1#fragment',
      '/%76%31',
      '/v1%2F',
      '/.well-known/oauth-protected-resource/',
      '/.well-known/%6fauth-protected-resource',
      `/${'v1.'.repeat(400)}`,
    ),
  },
  { weight: 2, arbitrary: stringOf(URL_CHARS, 0, 200).map((s) => `/${s}`) },
  { weight: 1, arbitrary: stringOf(URL_CHARS, 1000, 4000).map((s) => `/${s}`) },
)

function authorizationArb(f: Fixture) {
  const t = f.tokens
  return fc.oneof(
    { weight: 8, arbitrary: fc.constant(`Bearer ${t.valid}`) },
    {
      weight: 4,
      arbitrary: fc.constantFrom(
        `bearer ${t.valid}`,
        `Bearer  ${t.valid}`,
        `BEARER ${t.valid} `,
        `Bearer ${t.revoked}`,
        `Bearer ${t.rotatedOld}`,
        `Bearer ${t.rotated}`,
        `Bearer ${t.expired}`,
        `Bearer ${t.otherApp}`,
        `Bearer ${t.unsubscribed}`,
        `Bearer ${t.testNetOnly}`,
        `Bearer ${t.loopbackOnly}`,
        `Bearer ${t.valid}x`,
        `Bearer ${t.valid.slice(0, -1)}`,
        'Bearer',
        'Bearer ',
        'Basic dXNlcjpwYXNzd29yZA==',
        'Digest username="x"',
        `Bearer ${'A'.repeat(9000)}`,
        `Bearer svc_${'A'.repeat(44)}`,
      ),
    },
    { weight: 2, arbitrary: stringOf(BASE62, 44, 44).map((s) => `Bearer svc_${s}`) },
    { weight: 2, arbitrary: stringOf(B64, 1, 300).map((s) => `Bearer ${s}`) },
    // OAuth access tokens, through the validator: signed ones in every state, and made-up
    // JWTs (a real header, then random claims and signature).
    { weight: 4, arbitrary: fc.constantFrom(...JWTS.keys()).map((s) => `Bearer ${s}`) },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.constantFrom(...[...JWTS.keys()].map((s) => s.split('.')[0]!)), stringOf(B64URL, 0, 300), stringOf(B64URL, 0, 90))
        .map(([header, payload, signature]) => `Bearer ${header}.${payload}.${signature}`),
    },
    { weight: 2, arbitrary: headerValue(200) },
  )
}

const jsonRpc = (method: string, id: unknown = 1, params?: unknown) =>
  JSON.stringify({ jsonrpc: '2.0', id, method, ...(params !== undefined && { params }) })

const bodyArb = fc.oneof(
  { weight: 3, arbitrary: fc.constant<string | Uint8Array | null>(null) },
  { weight: 1, arbitrary: fc.constant('') },
  {
    weight: 4,
    arbitrary: fc.constantFrom(
      jsonRpc('tools/list'),
      jsonRpc('initialize', 0, { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'fuzz', version: '0' } }),
      `[${jsonRpc('tools/list', 1)},${jsonRpc('ping', 2)}]`,
      '[]',
      '{}',
      'null',
      '{"jsonrpc":',
      '{"jsonrpc":"2.0","id":{"a":[1,2,{}]},"method":7}',
      `${'['.repeat(5000)}${']'.repeat(5000)}`,
      JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'x', arguments: { s: '\u0000\ud800' } } }),
    ),
  },
  { weight: 2, arbitrary: fc.uint8Array({ maxLength: 4000 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', maxLength: 2000 }) },
  // Huge bodies, now and then: 256 KB to 1 MB.
  { weight: 1, arbitrary: fc.integer({ min: 256 * 1024, max: 1024 * 1024 }).map((n) => new Uint8Array(n).fill(0x61)) },
)

const RESERVED = new Set(['host', 'content-length', 'transfer-encoding', 'connection', 'upgrade', 'expect', 'te', 'trailer', 'keep-alive', 'proxy-connection', 'http2-settings'])

/** A well-formed MCP request with a working token: most of these reach the handler. */
function wellFormedArb(f: Fixture, port: number): fc.Arbitrary<RawRequest> {
  return fc
    .record({
      method: fc.constantFrom('POST', 'POST', 'POST', 'GET', 'DELETE'),
      path: fc.constantFrom('/', '/v1', '/v1.1', '/v1.2', '/v1.2.3', '/v2', '/v2.0.0', '/v2.1.0-rc.1', '/v1/'),
      token: fc.constantFrom(f.tokens.valid, f.tokens.rotated, f.tokens.loopbackOnly, ...[...JWTS].filter(([, earns]) => earns.fuzz === 'serve').map(([t]) => t)),
      extra: fc.array(fc.tuple(stringOf('abcdefghijklmnopqrstuvwxyz', 1, 12).map((s) => `x-${s}`), headerValue(300)), { maxLength: 4 }),
      body: bodyArb,
    })
    .map(({ method, path, token, extra, body }) => ({
      method,
      path,
      headers: [
        ['host', `${HOSTNAME}:${port}`],
        ['authorization', `Bearer ${token}`],
        ['content-type', 'application/json'],
        ['accept', 'application/json, text/event-stream'],
        ...extra,
      ] as Array<[string, string]>,
      body: method === 'POST' ? body : null,
    }))
}

function requestArb(f: Fixture, port: number): fc.Arbitrary<RawRequest> {
  return fc.oneof({ weight: 3, arbitrary: wellFormedArb(f, port) }, { weight: 7, arbitrary: randomRequestArb(f, port) })
}

function randomRequestArb(f: Fixture, port: number): fc.Arbitrary<RawRequest> {
  const knownHeader = fc.tuple(
    fc.constantFrom('origin', 'access-control-request-method', 'mcp-session-id', 'x-forwarded-for', 'content-type', 'accept', 'mcp-protocol-version', 'last-event-id', 'cookie', 'user-agent', 'forwarded', 'x-real-ip'),
    fc.oneof(
      headerValue(120),
      fc.constantFrom(
        'https://evil.example',
        'null',
        ...ALLOWED_ORIGINS,
        'HTTPS://ALLOWED.EXAMPLE',
        'https://allowed.example/',
        'http://localhost:3000:3000',
        '203.0.113.7, 10.0.0.1',
        '127.0.0.1',
        'not-an-ip, ::1',
        'application/json',
        'text/event-stream',
        'application/json, text/event-stream',
        '2025-06-18',
        '3f1b2c4d-0000-4000-8000-000000000000',
      ),
    ),
  )
  const randomHeader = fc.tuple(
    stringOf('abcdefghijklmnopqrstuvwxyz0123456789-', 1, 30)
      .map((s) => `x-${s}`)
      .filter((name) => !RESERVED.has(name)),
    headerValue(400),
  )
  const hugeHeader = fc.tuple(fc.constant('x-huge'), headerValue(8000))
  const hostArb = fc.oneof(
    { weight: 9, arbitrary: fc.constant(`${HOSTNAME}:${port}`) },
    // The other App on its own, often enough that tokens are tried at the App they are not for.
    { weight: 1, arbitrary: fc.constant(`${OTHER_APP.slug}.localhost`) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(`FUZZ.LOCALHOST:${port}`, 'other.localhost', 'unknown.localhost', 'fuzz', 'localhost', '127.0.0.1', '[::1]:1', 'a.b.c.d.e.f'),
    },
  )
  return fc
    .record({
      method: fc.oneof({ weight: 4, arbitrary: fc.constantFrom(...COMMON_METHODS) }, { weight: 1, arbitrary: fc.constantFrom(...ALL_METHODS) }),
      path: pathArb,
      host: hostArb,
      // One request in eight in absolute form (`POST http://fuzz.localhost:port/v1`): the target
      // names the App, whatever the Host field says.
      absolute: fc.oneof({ weight: 7, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: hostArb }),
      authorization: fc.option(authorizationArb(f), { freq: 8 }),
      headers: fc.array(fc.oneof({ weight: 4, arbitrary: knownHeader }, { weight: 4, arbitrary: randomHeader }, { weight: 1, arbitrary: hugeHeader }), {
        maxLength: 6,
      }),
      body: bodyArb,
    })
    .map(({ method, path, host, absolute, authorization, headers, body }) => {
      if (absolute !== null) path = `http://${absolute}${path}`
      const list: Array<[string, string]> = [['host', host]]
      if (authorization !== null) list.push(['authorization', authorization])
      // The head stays under Node's 16 KB limit, so every request reaches the adapter.
      let size = list.reduce((n, [name, value]) => n + name.length + value.length, 0)
      for (const [name, value] of headers) {
        if (size + name.length + value.length > 12_000) continue
        size += name.length + value.length
        list.push([name, value])
      }
      return { method, path, headers: list, body }
    })
}

// --- the oracle -------------------------------------------------------------------------

const LIVE_INDEX = compileVersions(LIVE)
/** The other App of the fixture (`other.localhost`), reachable with the token scoped to it. */
const OTHER_LIVE = ['1.0.0'] as const
const OTHER_INDEX = compileVersions(OTHER_LIVE)

/**
 * What the fixed paths serve, written out (not worked out by the library's own parser and
 * resolver, as a random path's is): a fuzz App with 1.0.0, 1.1.0, 1.2.3 (1.2.0 replaced),
 * 2.0.0 and 2.1.0-rc.1 live, and the other App with 1.0.0; `null`: served by no version.
 */
const SERVES: Record<'fuzz' | 'other', Record<string, string | null>> = {
  fuzz: {
    '/': '2.0.0',
    '/v1': '1.2.3',
    '/v1/': '1.2.3',
    '/v1.1': '1.1.0',
    '/v1.2': '1.2.3',
    '/v1.2.3': '1.2.3',
    '/v2': '2.0.0',
    '/v2.0.0': '2.0.0',
    '/v2.1.0-rc.1': '2.1.0-rc.1',
    '/v1.2.0': null,
    '/v3': null,
    '/v0': null,
  },
  other: { '/': '1.0.0', '/v1': '1.0.0', '/v1/': '1.0.0', '/v1.1': null, '/v1.2.3': null, '/v2': null, '/v2.1.0-rc.1': null },
}

/** {@link SERVES} of the App a request was dispatched to. */
function servesOf(request: RawRequest): Record<string, string | null> {
  return SERVES[hostOf(request).startsWith(`${OTHER_APP.slug}.localhost`) ? 'other' : 'fuzz']
}

/** The App a request was dispatched to, by its `Host`: the other App's, or the fuzz App's. */
function appOf(request: RawRequest): { live: readonly string[]; index: typeof LIVE_INDEX; latest: string } {
  return hostOf(request).startsWith(`${OTHER_APP.slug}.localhost`)
    ? { live: OTHER_LIVE, index: OTHER_INDEX, latest: '1.0.0' }
    : { live: LIVE, index: LIVE_INDEX, latest: LATEST }
}

/** An absolute-form target as the fuzz writes one: `http://`, a host, an origin-form path. */
const ABSOLUTE_FORM = /^http:\/\/([^/?#]*)(\/.*)$/s

/**
 * The host a request names, lower case: an absolute-form target's (RFC 9112 section 3.2.2: the
 * `Host` field is then ignored), else its `Host` field's.
 */
function hostOf(request: RawRequest): string {
  const absolute = ABSOLUTE_FORM.exec(request.path)
  if (absolute) return absolute[1]!.toLowerCase()
  const entries = Array.isArray(request.headers) ? request.headers : Object.entries(request.headers)
  return entries.find(([name]) => name.toLowerCase() === 'host')?.[1]?.toLowerCase() ?? ''
}

/** Whether find-my-way refuses `target`'s path (before its query or fragment) as a bad URL: `decodeURI` throws on it. */
function badlyEscaped(target: string): boolean {
  try {
    decodeURI(target.split(/[?#]/, 1)[0]!)
    return false
  } catch {
    return true
  }
}

/** The origin-form target of a request: its path and query (those of an absolute-form target). */
function pathOf(request: RawRequest): string {
  return ABSOLUTE_FORM.exec(request.path)?.[2] ?? request.path
}

/** The value of a request's header fields of `name`, each. */
function fieldsOf(request: RawRequest, name: string): string[] {
  const entries = Array.isArray(request.headers) ? request.headers : Object.entries(request.headers)
  return entries.filter(([field]) => field.toLowerCase() === name).map(([, value]) => value)
}

/**
 * What the pipeline must make of a request's credential, told from the fixture's tokens, not
 * by the library's parser: `serve` (the handler may answer), or the status of its refusal
 * (spec 7: 401 unknown, revoked, expired or rotated away; 402 no subscription; 403 outside the
 * allowlist or the token's Apps). The client is always 127.0.0.1, and `X-Forwarded-For` is
 * never trusted here, so the loopback-only token serves and the TEST-NET one never does. An
 * OAuth access token earns what {@link JWTS} says; any other bearer string is refused.
 */
function credentialOutcome(f: Fixture, request: RawRequest): CredentialOutcome {
  const entries = Array.isArray(request.headers) ? request.headers : Object.entries(request.headers)
  const fields = entries.filter(([name]) => name.toLowerCase() === 'authorization').map(([, value]) => value)
  if (fields.length !== 1) return 401
  const parts = fields[0]!.trim().split(/ +/)
  if (parts.length !== 2 || parts[0]!.toLowerCase() !== 'bearer') return 401
  const t = f.tokens
  // Every token but `otherApp` is scoped to the fuzz App only: 403 at the other one.
  const atOtherApp = hostOf(request).startsWith(`${OTHER_APP.slug}.localhost`)
  switch (parts[1]) {
    case t.valid:
    case t.rotated:
    case t.loopbackOnly:
      return atOtherApp ? 403 : 'serve'
    case t.otherApp:
      return atOtherApp ? 'serve' : 403
    case t.unsubscribed:
      return atOtherApp ? 403 : 402
    case t.testNetOnly:
      return 403
    default:
      // Made up, malformed, revoked, expired, rotated away, or an OAuth token.
      return JWTS.get(parts[1]!)?.[atOtherApp ? 'other' : 'fuzz'] ?? 401
  }
}

/** The token of a request's one `Authorization: Bearer` field, as the fixture's tokens are told apart. */
function bearerOf(request: RawRequest): string | undefined {
  return fieldsOf(request, 'authorization')[0]?.trim().split(/ +/)[1]
}

/** The one answer a request must get: the handler's, at this version, or this refusal. */
type Expected = { readonly serve: string } | { readonly status: number; readonly error?: string }

const NOT_FOUND: Expected = { status: 404, error: 'not_found' }
const ORIGIN_NOT_ALLOWED: Expected = { status: 403, error: 'origin_not_allowed' }

/**
 * Whether a request's `Origin` is refused by the fixture's `allowedOrigins`: present (fields
 * joined, as every adapter reads them) and not exactly one of the list, an empty one included.
 */
function originRefused(request: RawRequest): boolean {
  const values = fieldsOf(request, 'origin')
  return values.length > 0 && !(ALLOWED_ORIGINS as readonly string[]).includes(values.map((v) => v.replace(/^[ \t]+|[ \t]+$/g, '')).join(', '))
}
const METADATA_PATH = '/.well-known/oauth-protected-resource'

/** A CORS preflight as the dispatcher tells one: `OPTIONS` with an `Origin` and an `Access-Control-Request-Method`. */
function preflight(request: RawRequest): boolean {
  const present = (name: string) => {
    const values = fieldsOf(request, name)
    // Several fields are joined (`a, b`): never empty.
    return values.length > 1 || (values.length === 1 && values[0]!.trim() !== '')
  }
  return request.method === 'OPTIONS' && present('origin') && present('access-control-request-method')
}

/**
 * The answer a request must get, worked out from the request alone, step by step in the order
 * of the pipeline (DESIGN.md, docs/pipeline.md): the App of the host it names (an absolute-form
 * target's, else its `Host`'s), the metadata path, the version path (404 `not_found` for no App
 * or no such path, before anything else; a CORS preflight there gets its 204, or 403 for an
 * `Origin` not allowed), the `Origin` (403 `origin_not_allowed` for one outside the fixture's
 * `allowedOrigins`, whatever the method), the method
 * (a preflight, 405 before authentication; `HEAD` is authenticated, then 405), the credential
 * (401, 403, 402 before any version is looked for), the rate limit (429 for the one OAuth client
 * whose budget is 0, none reached for any other), a session id (no random one is pinned: 404
 * `session_not_found`), then the version (404 `version_not_found`, or served).
 *
 * What else may refuse such a request does not here, by construction: heads stay under Node's
 * 16 KB, and every host sent is one a URL holds. Only the frameworks' own answers stand in, and only for the answer
 * due ({@link FRAMEWORK_STANDS_IN}).
 */
function expectedAnswer(f: Fixture, target: AdapterTarget, request: RawRequest): Expected {
  // Fastify's router refuses an absolute-form target holding a fragment (`http://host/v1#x`:
  // RFC 9112's absolute-form has none) before any hook, as it does a bad escape; the adapter's
  // `frameworkErrors` answers it 404 (docs/adapters.md). Express and Web runtimes drop the fragment.
  if (target.name === 'fastify' && ABSOLUTE_FORM.test(request.path) && request.path.includes('#')) return NOT_FOUND
  // Its answer to a bad escape in the path (`%zz`, `%ff`: no `decodeURI`) is that 404 for a
  // CORS preflight too: no decision is made, so none of the preflight's 204 or 403 (docs/adapters.md).
  if (target.name === 'fastify' && badlyEscaped(pathOf(request))) return NOT_FOUND
  // The default `resolveApp`: the first label of the host.
  const slug = /^([^.]+)\./.exec(hostOf(request))?.[1]
  const app = slug === APP.slug ? 'fuzz' : slug === OTHER_APP.slug ? 'other' : undefined
  // What answers a path no App serves: 404, or for a CORS preflight its 204 (docs/pipeline.md:
  // a browser then reads the 404 itself, with its CORS headers).
  const notFound = preflight(request) ? (originRefused(request) ? ORIGIN_NOT_ALLOWED : { status: 204 }) : NOT_FOUND
  if (app === undefined) return notFound
  // The Web adapter's runtime (@hono/node-server) builds a WHATWG URL of the target, so its path
  // comes resolved (`/v1/../v2` is `/v2`, `/%2e%2e/v1` is `/v1`); the Node adapters take it as sent.
  const path = target.name === 'web' ? new URL(`${ADDRESS.fuzz}${pathOf(request)}`).pathname : pathOf(request).split(/[?#]/, 1)[0]!
  const method = request.method
  if (path.startsWith(METADATA_PATH)) {
    if (path !== METADATA_PATH) return notFound
    return method === 'GET' || method === 'HEAD' ? { status: 200 } : method === 'OPTIONS' ? { status: 204 } : { status: 405, error: 'method_not_allowed' }
  }
  const selector = parseVersionPath(path)
  if (!selector) return notFound
  // Before the method and the credential, whatever the method (docs/pipeline.md, "Origin and DNS
  // rebinding"); the metadata above is public to every origin.
  if (originRefused(request)) return ORIGIN_NOT_ALLOWED
  if (method === 'OPTIONS') return { status: 204 }
  if (method !== 'POST' && method !== 'GET' && method !== 'DELETE' && method !== 'HEAD') return { status: 405, error: 'method_not_allowed' }
  const credential = credentialOutcome(f, request)
  // HEAD gets GET's refusal of the credential, and past it 405: no subscription asked.
  if (method === 'HEAD') return { status: credential === 401 || credential === 403 ? credential : 405 }
  if (credential !== 'serve') return { status: credential }
  // Step 5, before the session and the version: LIMITED_CLIENT's tokens are over their budget
  // of 0 (the fixture's `rateLimit`).
  if (LIMITED.has(bearerOf(request) ?? '')) return { status: 429 }
  if (fieldsOf(request, 'mcp-session-id').length > 0) return { status: 404, error: 'session_not_found' }
  // The version the paths of the table serve as written, others as the resolver finds them.
  const written = SERVES[app]
  const version = path in written ? (written[path] ?? null) : resolveVersion(appOf(request).index, selector)
  return version === null ? { status: 404, error: 'version_not_found' } : { serve: version }
}

/**
 * The frameworks' own answers (`AdapterTarget.frameworkAnswer`), and the one answer of the
 * dispatch layer each may stand in for: Express's final-handler 404 for a target it routes to
 * no middleware, a path no App serves; Fastify's 415, after `onRequest` let the request
 * through, for the handler's answer. Anywhere else it would hide a refusal (or an answer) that
 * the dispatch layer owed.
 */
const FRAMEWORK_STANDS_IN: Record<string, (expected: Expected) => boolean> = {
  'express-final-handler-404': (expected) => 'status' in expected && expected.status === 404 && expected.error === 'not_found',
  FST_ERR_CTP_INVALID_MEDIA_TYPE: (expected) => 'serve' in expected,
}

const describeExpected = (expected: Expected) => ('serve' in expected ? `the handler's answer at ${expected.serve}` : `${expected.status}${expected.error ? ` ${expected.error}` : ''}`)

/** Why an answer is wrong, or `undefined` when it is one the design allows. */
function judge(f: Fixture, target: AdapterTarget, request: RawRequest, response: RawResponse): string | undefined {
  const { status, headers, body } = response
  if (status >= 500) return `status ${status}`
  const credential = credentialOutcome(f, request)
  const expected = expectedAnswer(f, target, request)
  // An answer about the credential must be the one its token earns, whatever else was sent (a
  // 403 for the Origin aside: a HEAD's carries no body to tell it by).
  const originRefusal = 'status' in expected && expected.error === 'origin_not_allowed'
  if (status === 401 || status === 402 || (status === 403 && !originRefusal && jsonRpcError(body)?.data?.error !== 'origin_not_allowed')) {
    if (credential !== status) return `${status} for a credential that earns ${credential}`
  }
  const bearer = bearerOf(request)
  if (bearer !== undefined && (JWTS.has(bearer) || bearer.startsWith('eyJ'))) {
    const seen = 'serve' in expected ? 'served' : expected.status
    oauthAnswers.set(seen, (oauthAnswers.get(seen) ?? 0) + 1)
  }
  const own = target.frameworkAnswer?.(response, request)
  if (own !== undefined) {
    if (!FRAMEWORK_STANDS_IN[own]?.(expected)) return `the framework's ${own} where the request must get ${describeExpected(expected)}`
    frameworkAnswers.set(own, (frameworkAnswers.get(own) ?? 0) + 1)
    return undefined
  }
  const headOnly = request.method === 'HEAD'
  // The one answer due, from the request alone: the handler's at its version, or that refusal.
  const answered = headers[HANDLER_MARK] === '1'
  if ('serve' in expected) {
    if (!answered) return `${status} ${String(jsonRpcError(body)?.data?.error ?? '')} where the handler must answer at ${expected.serve}`
    if (headers['x-mcp-version'] !== expected.serve) return `X-MCP-Version ${String(headers['x-mcp-version'])} for ${request.path}, expected ${expected.serve}`
  } else {
    if (answered || status !== expected.status) return `${answered ? 'the handler answered' : status} where the dispatch layer must answer ${describeExpected(expected)}`
    if (expected.error !== undefined && !headOnly && jsonRpcError(body)?.data?.error !== expected.error) {
      return `${String(jsonRpcError(body)?.data?.error)} where the dispatch layer must answer ${describeExpected(expected)}`
    }
    if (status === 401) {
      // RFC 6750 section 3.1: a bearer token refused is `invalid_token`; no credential, no error code.
      const challenge = String(headers['www-authenticate'])
      const authorization = fieldsOf(request, 'authorization')
      if (/^bearer /i.test(authorization[0]?.trim() ?? '') && !challenge.includes('error="invalid_token"')) return `a refused bearer token without invalid_token: ${challenge}`
      if (authorization.length === 0 && challenge.includes('error=')) return `an error code without a credential: ${challenge}`
    }
  }
  if (answered) {
    // The handler's own answer: only for a credential that earns it, with the versions the
    // pipeline resolved.
    if (credential !== 'serve') return `the handler answered a credential that earns ${credential}`
    if (status !== 200) return `handler answered ${status}`
    const version = headers['x-mcp-version']
    const app = appOf(request)
    if (typeof version !== 'string' || !app.live.includes(version)) return `X-MCP-Version ${String(version)}`
    // The version the URL asks for (no session reaches the handler here: random ids are refused),
    // as written, or as a WHATWG URL normalizes it (`/v1/../v2` is `/v2` to the Web adapter's runtime).
    const asked = pathOf(request)
    const normalized = parseUrl(asked, 'http://fuzz.localhost')?.pathname ?? ''
    const wanted = [asked.split(/[?#]/, 1)[0]!, normalized].map((path) => {
      const selector = parseVersionPath(path)
      return selector && resolveVersion(app.index, selector)
    })
    if (!wanted.includes(version)) return `X-MCP-Version ${version} for ${request.path}, expected ${wanted.join(' or ')}`
    const written = servesOf(request)
    if (asked in written && version !== written[asked]) return `X-MCP-Version ${version} for ${request.path}, written ${String(written[asked])}`
    if (headers['x-mcp-latest-version'] !== app.latest) return `X-MCP-Latest-Version ${String(headers['x-mcp-latest-version'])}`
    if (headOnly) return undefined
    const parsed = JSON.parse(body.toString()) as { result?: { handled?: boolean; version?: string } }
    if (parsed.result?.handled !== true || parsed.result.version !== version) return 'handler body differs from the version header'
    return undefined
  }
  // Answered by the dispatch layer: never the version headers.
  if (headers['x-mcp-version'] !== undefined) return 'X-MCP-Version on a dispatch-layer answer'
  if (status === 204) return body.length === 0 ? undefined : 'a 204 with a body'
  if (headOnly) return body.length === 0 ? undefined : 'a HEAD answer with a body'
  if (!String(headers['content-type']).startsWith('application/json')) return `content-type ${String(headers['content-type'])}`
  if (status === 200) {
    const doc = JSON.parse(body.toString()) as { resource?: unknown }
    // The App's one metadata document, at its one path (as written, or as a WHATWG URL
    // normalizes it on the Web adapter's runtime); never a path-suffixed variant.
    const paths = [pathOf(request).split(/[?#]/, 1)[0], parseUrl(pathOf(request), 'http://fuzz.localhost')?.pathname]
    if (!paths.includes('/.well-known/oauth-protected-resource')) return `200 at ${request.path}, neither handler nor metadata`
    return typeof doc.resource === 'string' && !new URL(doc.resource).pathname.slice(1) ? undefined : `metadata resource ${String(doc.resource)}`
  }
  const error = jsonRpcError(body)
  if (!error) return `not a JSON-RPC error body: ${body.toString().slice(0, 120)}`
  if (status === 401 && !String(headers['www-authenticate']).startsWith('Bearer resource_metadata=')) return '401 without the challenge'
  if (status === 429) {
    // Spec section 7: Retry-After, and the data of the limit hit (a budget of 0 a minute here).
    const data = error.data as { limit?: unknown; retryAfter?: unknown; windowType?: unknown } | undefined
    if (!/^[1-9][0-9]*$/.test(String(headers['retry-after'])) || data?.retryAfter !== Number(headers['retry-after'])) return `429 with Retry-After ${String(headers['retry-after'])}`
    if (data.limit !== 0 || data.windowType !== 'minute' || error.code !== -32000 || error.message !== 'Rate limit exceeded') return `429 data ${JSON.stringify(error)}`
  }
  // A path written as served is never "no such version" (the other way round from the check
  // of the handler's answers above).
  if (error.data?.error === 'version_not_found' && typeof servesOf(request)[pathOf(request)] === 'string') {
    return `version_not_found for ${request.path}, written as served`
  }
  return undefined
}

/** Framework answers seen (see `AdapterTarget.frameworkAnswer`), by name. */
const frameworkAnswers = new Map<string, number>()
/** What the requests with an OAuth access token (or a made-up JWT) were due: `served`, or the refusal's status. */
const oauthAnswers = new Map<string | number, number>()
/** Statuses seen, by status. */
const statuses = new Map<number, number>()

/** Runs `cases` with `CONCURRENCY` requests in flight; returns the failures. */
async function runCases(f: Fixture, target: AdapterTarget, port: number, cases: readonly RawRequest[], agent: http.Agent): Promise<string[]> {
  const failures: string[] = []
  let next = 0
  const describeCase = (r: RawRequest) =>
    `${r.method} ${r.path.slice(0, 200)} headers=${JSON.stringify(r.headers).slice(0, 200)} body=${
      r.body == null ? 'none' : `${typeof r.body === 'string' ? 'string' : 'bytes'}(${r.body.length})`
    }`
  const worker = async () => {
    while (next < cases.length) {
      const request = cases[next++]!
      try {
        const response = await send(port, request, agent)
        statuses.set(response.status, (statuses.get(response.status) ?? 0) + 1)
        const problem = judge(f, target, request, response)
        if (problem) failures.push(`${problem}: ${describeCase(request)} → ${response.status} ${response.body.toString().slice(0, 160)}`)
      } catch (error) {
        failures.push(`${(error as Error).message}: ${describeCase(request)}`)
      }
    }
  }
  await Promise.all(Array.from({ length: CONCURRENCY }, worker))
  return failures
}

describe.each(targets.map((t) => [t.name, t] as const))('HTTP fuzz through the %s adapter', (_name, target) => {
  let fixture: Fixture
  let running: RunningTarget
  let agent: http.Agent
  let cases: RawRequest[]

  beforeAll(async () => {
    // Bearer strings that are no API token go to a real validator, which fetches the JWKS from
    // the loopback authorization server and verifies signatures, audience (the App address,
    // pinned by `baseUrl`), issuer, expiry and type.
    fixture = await createFixture({
      oauth: createOAuthValidator({ issuer: authServer.issuer, mode: 'jwt', jwks: authServer.jwksUri }),
      dispatcher: {
        baseUrl: (_request, app) => ADDRESS[app.slug === OTHER_APP.slug ? 'other' : 'fuzz'],
        allowedOrigins: [...ALLOWED_ORIGINS],
        // The OAuth client LIMITED_CLIENT has a budget of nothing: each of its requests that
        // reaches the rate limit is its 429, whatever the order the cases run in.
        rateLimit: { policy: (identity) => (identity.clientId === LIMITED_CLIENT ? { limit: 0, windowType: 'minute' } : undefined) },
      },
    })
    running = await target.start({ dispatcher: fixture.dispatcher, onError: fixture.onError })
    agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY })
    cases = fc.sample(requestArb(fixture, running.port), { seed: SEED, numRuns: CASES })
  })

  afterAll(async () => {
    agent?.destroy()
    await running?.close()
    await fixture?.close()
  })

  it(`answers each of ${CASES} random requests with its one right answer (the handler's at its version, or the refusal due); never 5xx, never a hang (seed ${SEED})`, async () => {
    statuses.clear()
    oauthAnswers.clear()
    const failures = await runCases(fixture, target, running.port, cases, agent)
    expect(failures.slice(0, 10), `${failures.length} bad answers`).toEqual([])
    // The fuzz is not all noise: a good share reached the handler, and every kind of answer happened.
    expect(running.state.handled).toBeGreaterThan(CASES / 10)
    expect([...statuses.keys()].sort()).toEqual(expect.arrayContaining([200, 204, 401, 402, 403, 404, 405, 429]))
    // And the OAuth validator's every answer: tokens served, refused (401) and unsubscribed (402).
    expect([...oauthAnswers.keys()]).toEqual(expect.arrayContaining(['served', 401, 402]))
    // Requests refused for their Origin, and requests in absolute form, each a few dozen at least.
    const refusedOrigin = cases.filter((c) => (expectedAnswer(fixture, target, c) as { error?: string }).error === 'origin_not_allowed')
    expect(refusedOrigin.length).toBeGreaterThan(CASES / 300)
    expect(cases.filter((c) => ABSOLUTE_FORM.test(c.path)).length).toBeGreaterThan(CASES / 20)
    expect(fixture.errors).toEqual([])
    frameworkAnswers.clear()
  })

  it('keeps the heap and its buffers flat: repeating the same cases does not grow them', async () => {
    const slice = cases.slice(0, Math.min(cases.length, 600))
    expect(await runCases(fixture, target, running.port, slice, agent)).toEqual([])
    const gc = collectGarbage()
    // The heap and the memory of buffers outside it (a request body kept as a Buffer moves
    // `heapUsed` by a few hundred bytes, `arrayBuffers` by its size). Without a GC to call (a
    // runtime that refuses --expose-gc), only a coarse bound on RSS.
    const measure = async () => {
      if (!gc) return process.memoryUsage().rss
      // A buffer's memory is given back once the turn that collected it has ended.
      for (let i = 0; i < 2; i++) {
        collectGarbage()
        await new Promise((resolve) => setImmediate(resolve))
      }
      const { heapUsed, arrayBuffers } = process.memoryUsage()
      return heapUsed + arrayBuffers
    }
    const before = await measure()
    for (let i = 0; i < 2; i++) expect(await runCases(fixture, target, running.port, slice, agent)).toEqual([])
    const grown = (await measure()) - before
    // Two more passes of the same 600 requests, megabyte bodies among them: a body, or
    // anything of its size, kept fails this.
    expect(grown, `${gc ? 'heap and buffers' : 'RSS'} grew by ${(grown / 2 ** 20).toFixed(2)} MiB`).toBeLessThan((gc ? 4 : 64) * 2 ** 20)
    if (!gc) return

    // Then small bytes kept per request: 600 requests without the huge bodies, six passes.
    // The heap and buffers after each move by a few hundred KiB either way; compared as the mean of the
    // first two samples and of the last two, four passes (2,400 requests) apart, anything
    // kept per request over about 330 bytes fails this (a copy of the URL and headers, about
    // 600 bytes, did: 1.4 MiB).
    const small = cases.filter((c) => c.body == null || c.body.length < 64 * 1024).slice(0, 600)
    expect(await runCases(fixture, target, running.port, small, agent)).toEqual([])
    const samples = [await measure()]
    for (let i = 0; i < 5; i++) {
      expect(await runCases(fixture, target, running.port, small, agent)).toEqual([])
      samples.push(await measure())
    }
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length
    const kept = mean(samples.slice(-2)) - mean(samples.slice(0, 2))
    const shown = samples.map((x) => ((x - samples[0]!) / 2 ** 10).toFixed(0)).join(' ')
    expect(kept, `heap and buffers grew by ${(kept / 2 ** 20).toFixed(2)} MiB over four passes (KiB after each: ${shown})`).toBeLessThan(0.75 * 2 ** 20)
  })
})

describe('the adapters fuzzed', () => {
  it('are all four under CI: an adapter whose import broke is a failure there, not a smaller fuzz', () => {
    if (underCI()) expect(targets.map((t) => t.name)).toEqual(['web', 'express', 'express4', 'fastify'])
    else expect(targets.map((t) => t.name)).toContain('web')
  })
})

describe('nothing leaks', () => {
  it('leaves no socket, server or timer of the fuzz behind', async () => {
    expect(await leakedHandles(baseline)).toEqual({})
  })
})
