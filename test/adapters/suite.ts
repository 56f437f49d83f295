/**
 * The behavioural suite every adapter must pass (Web, Express, Fastify): the same cases, the
 * same expected answers. Each adapter file builds its server around the same "probe" MCP
 * handler and hands the suite an {@link AdapterTarget}; requests go in memory where the
 * framework allows (`Request` objects, `fastify.inject`) and over loopback HTTP otherwise and
 * for streaming.
 *
 * The probe handler, written natively for each framework, answers:
 * - by default 200 `application/json` `{ version, latest, app, subject, sessionId, method, body }`
 *   with `x-probe: yes` and its own `x-mcp-version: 0.0.0-handler` (the dispatch header must win);
 * - `x-test-session: <id>`: also `Mcp-Session-Id: <id>` (a new session, as the SDK assigns it);
 * - `x-test-throw: 1`: throws (on Express and Fastify after setting its headers, and
 *   `Content-Encoding: gzip`, none of which the 502 may carry);
 * - `x-test-stream: 1`: `text/event-stream`, `data: one`, then waits for the gate, `data: two`.
 * It is routed with `routeByVersion`, with no handler for the App `other`.
 */
import {
  type Reply,
  type SessionStore,
  type TrustProxy,
  createMemorySessionStore,
  forbiddenReply,
  ipNotAllowedReply,
  jsonRpcErrorReply,
  methodNotAllowedReply,
  originNotAllowedReply,
  notFoundReply,
  paymentRequiredReply,
  rateLimitDecision,
  rateLimitHeaders,
  rateLimitedReply,
  sessionNotFoundReply,
  unauthorizedReply,
  versionNotFoundReply,
} from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  ALLOWED_ORIGIN,
  HOST,
  type Fixture,
  type Gate,
  type HttpRecord,
  T0,
  type TestRequest,
  createFixture,
  createGate,
  loopbackFetch,
  rawRequest,
  readUntil,
} from './helpers.js'

/** What the probe handler reads from the test: the gate of the next streaming response. */
export interface ProbeState {
  gate: Gate
}

/** A running adapter around the probe handler. */
export interface AdapterTarget {
  /** Sends a request: in memory where the framework allows, else over loopback HTTP. */
  request(request: TestRequest & { clientAddress?: string }): Promise<HttpRecord>
  /** The loopback port of the same server. */
  readonly port: number
  close(): Promise<void>
}

/** Starts an adapter on a fixture. */
export type StartAdapter = (options: { fixture: Fixture; probe: ProbeState; trustProxy?: TrustProxy }) => Promise<AdapterTarget>

/** Exact body of the probe's `body` echo and the other fields, parsed. */
interface ProbeBody {
  version: string
  latest: string
  app: string
  subject: string
  sessionId: string | null
  method: string
  body: string
}

export const BASE_URL = 'http://weather.localhost'
export const METADATA_URL = `${BASE_URL}/.well-known/oauth-protected-resource`
export const ALLOWED_METHODS = 'GET, POST, DELETE, OPTIONS'
export const EXPOSE_HEADERS =
  'WWW-Authenticate, Mcp-Session-Id, X-MCP-Version, X-MCP-Latest-Version, Retry-After, RateLimit, RateLimit-Policy, Allow'

const TOOLS_LIST = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
const json = { 'content-type': 'application/json' }
const bearer = (token: string) => ({ authorization: `Bearer ${token}` })

/** The 429 of the busy App (limit 1 per minute) at the fixed clock, for the second request. */
export function busyRateLimited(): Reply {
  const policy = { limit: 1, windowType: 'minute' as const }
  const result = rateLimitDecision(2, policy, T0 + 30_000, T0)
  return rateLimitedReply(result, rateLimitHeaders(result))
}

/** Headers an HTTP stack adds on its own, not part of what an adapter writes. */
const TRANSPORT_HEADERS = new Set(['date', 'connection', 'keep-alive', 'content-length', 'transfer-encoding'])

/**
 * Asserts an answer is exactly a dispatch-layer reply: status, body byte for byte, every
 * header of the reply, no other header (beyond what HTTP itself adds), no version header.
 */
export function expectReply(record: HttpRecord, reply: Reply): void {
  expect(record.status).toBe(reply.status)
  expect(record.body).toBe(reply.body ?? '')
  const own = Object.fromEntries(Object.entries(record.headers).filter(([name]) => !TRANSPORT_HEADERS.has(name)))
  expect(own).toEqual(reply.headers)
  if (record.headers['content-length'] !== undefined) {
    expect(Number(record.headers['content-length'])).toBe(Buffer.byteLength(reply.body ?? ''))
  }
  expect(record.headers['x-mcp-version']).toBeUndefined()
}

/**
 * `reply` as a request without `Origin` gets it when it is a 404 or a 405, which a cache may
 * store: saying it varies by `Origin` (the dispatcher adds it with CORS on).
 */
export function cacheable(reply: Reply): Reply {
  return { ...reply, headers: { ...reply.headers, vary: 'Origin' } }
}

/** The Express and Fastify adapters' answer to a `Host` that is not just an authority (docs/adapters.md). */
const INVALID_HOST_REPLY = jsonRpcErrorReply(400, {
  code: -32600,
  message: 'Invalid Host header',
  data: { error: 'invalid_request', field: 'host' },
})

/** The rejection cases; each request gets exactly `reply` from every adapter. */
export function rejectionCases(fixture: Fixture): Array<{ name: string; request: TestRequest; reply: Reply }> {
  const t = fixture.tokens
  return [
    {
      name: '401 without a credential',
      request: { path: '/v1', headers: json, body: TOOLS_LIST },
      reply: unauthorizedReply({ resourceMetadataUrl: METADATA_URL }),
    },
    {
      name: '401 for an unknown API token',
      request: { path: '/v1', headers: { ...json, ...bearer(`svc_${'A'.repeat(44)}`) }, body: TOOLS_LIST },
      reply: unauthorizedReply({ resourceMetadataUrl: METADATA_URL, invalidToken: true }),
    },
    {
      name: '401 on a GET stream without a credential',
      request: { method: 'GET', path: '/', headers: { accept: 'text/event-stream', 'mcp-session-id': 'abc' } },
      reply: unauthorizedReply({ resourceMetadataUrl: METADATA_URL }),
    },
    {
      name: '402 without an active subscription',
      request: { path: '/v1', headers: { ...json, ...bearer(t.bob) }, body: TOOLS_LIST },
      reply: paymentRequiredReply(),
    },
    {
      name: '403 for a token not scoped to the App',
      request: { path: '/v1', headers: { ...json, ...bearer(t.aliceOther) }, body: TOOLS_LIST },
      reply: forbiddenReply(),
    },
    {
      name: '403 outside the IP allowlist',
      request: { path: '/v1', headers: { ...json, ...bearer(t.ipLimited), 'x-forwarded-for': '203.0.113.5' }, body: TOOLS_LIST },
      reply: ipNotAllowedReply(),
    },
    {
      name: '403 for an Origin that is not allowed',
      request: { path: '/v1', headers: { ...json, ...bearer(t.alice), origin: 'https://evil.example' }, body: TOOLS_LIST },
      reply: originNotAllowedReply(),
    },
    {
      name: '404 for an unknown App',
      request: { host: 'nowhere.localhost', path: '/v1', headers: { ...json, ...bearer(t.alice) }, body: TOOLS_LIST },
      reply: cacheable(notFoundReply()),
    },
    {
      name: '404 for a path that is not a version',
      request: { path: '/v1/tools', headers: { ...json, ...bearer(t.alice) }, body: TOOLS_LIST },
      reply: cacheable(notFoundReply()),
    },
    {
      name: '404 for an exact version that is not live',
      request: { path: '/v3.0.0', headers: { ...json, ...bearer(t.alice) }, body: TOOLS_LIST },
      reply: cacheable(versionNotFoundReply('3.0.0', '2.0.0')),
    },
    {
      name: '404 for an unknown session',
      request: { path: '/', headers: { ...json, ...bearer(t.alice), 'mcp-session-id': 'no-such-session' }, body: TOOLS_LIST },
      reply: cacheable(sessionNotFoundReply()),
    },
    {
      name: '404 without CORS headers (but Vary: Origin) for an unknown path asked from an Origin that is not allowed',
      request: { path: '/zz', headers: { ...json, ...bearer(t.alice), origin: 'https://evil.example' }, body: TOOLS_LIST },
      reply: { ...notFoundReply(), headers: { ...notFoundReply().headers, vary: 'Origin' } },
    },
    {
      name: '405 for a method the endpoint does not serve',
      request: { method: 'PUT', path: '/v1', headers: { ...json, ...bearer(t.alice) }, body: TOOLS_LIST },
      reply: cacheable(methodNotAllowedReply(ALLOWED_METHODS)),
    },
  ]
}

/** Runs the whole suite against one adapter. */
export function describeAdapter(name: string, start: StartAdapter): void {
  describe(`${name} adapter`, () => {
    let fixture: Fixture
    let target: AdapterTarget
    let trusting: AdapterTarget
    const probe: ProbeState = { gate: createGate() }

    beforeAll(async () => {
      fixture = createFixture()
      target = await start({ fixture, probe })
      trusting = await start({ fixture, probe, trustProxy: ['127.0.0.1', '::1', '::ffff:127.0.0.1'] })
    })
    afterAll(async () => {
      await target?.close()
      await trusting?.close()
    })

    describe('rejections: exactly the dispatch layer reply', () => {
      // The fixture is created in beforeAll; the cases are named statically.
      const names = rejectionCases(createFixture()).map((c) => c.name)
      for (const [i, caseName] of names.entries()) {
        it(caseName, async () => {
          const c = rejectionCases(fixture)[i]!
          expectReply(await target.request(c.request), c.reply)
        })
      }

      it('429 after the limit, with Retry-After and RateLimit headers', async () => {
        const request = { host: 'busy.localhost', path: '/', headers: { ...json, ...bearer(fixture.tokens.aliceBusy) }, body: TOOLS_LIST }
        const first = await target.request(request)
        expect(first.status).toBe(200)
        expect(first.headers['ratelimit']).toBe('"minute";r=0;t=30')
        expectReply(await target.request(request), busyRateLimited())
      })

      it('a rejection of a browser request carries the CORS headers', async () => {
        const res = await target.request({ path: '/v1', headers: { ...json, origin: ALLOWED_ORIGIN }, body: TOOLS_LIST })
        expectReply(res, {
          ...unauthorizedReply({ resourceMetadataUrl: METADATA_URL }),
          headers: {
            ...unauthorizedReply({ resourceMetadataUrl: METADATA_URL }).headers,
            'access-control-allow-origin': ALLOWED_ORIGIN,
            'access-control-expose-headers': EXPOSE_HEADERS,
            vary: 'Origin',
          },
        })
      })
    })

    describe('answers of the dispatch layer itself', () => {
      it('serves the protected-resource metadata without a credential', async () => {
        const res = await target.request({ method: 'GET', path: '/.well-known/oauth-protected-resource' })
        expect(res.status).toBe(200)
        expect(JSON.parse(res.body)).toEqual({
          resource: BASE_URL,
          authorization_servers: ['https://auth.example.com'],
          bearer_methods_supported: ['header'],
          scopes_supported: ['openid', 'profile', 'email'],
          resource_name: 'Weather',
        })
        expect(res.headers['cache-control']).toBe('public, max-age=3600')
        expect(res.headers['access-control-allow-origin']).toBe('*')
        expect(res.headers['x-mcp-version']).toBeUndefined()
        // HEAD: the same fields and the GET body's length (RFC 9110 section 9.3.2), no body.
        const head = await target.request({ method: 'HEAD', path: '/.well-known/oauth-protected-resource' })
        expect(head.status).toBe(200)
        expect(head.body).toBe('')
        expect(head.headers['cache-control']).toBe('public, max-age=3600')
        expect(head.headers['content-type']).toBe('application/json')
        expect(head.headers['content-length']).toBe(String(Buffer.byteLength(res.body)))
      })

      it('answers a CORS preflight', async () => {
        const res = await target.request({
          method: 'OPTIONS',
          path: '/v1',
          headers: { origin: ALLOWED_ORIGIN, 'access-control-request-method': 'POST' },
        })
        expect(res.status).toBe(204)
        expect(res.body).toBe('')
        expect(res.headers['access-control-allow-origin']).toBe(ALLOWED_ORIGIN)
        expect(res.headers['access-control-allow-methods']).toBe(ALLOWED_METHODS)
        expect(res.headers.allow).toBe(ALLOWED_METHODS)
        expect(res.headers['access-control-allow-headers']).toContain('Mcp-Session-Id')
        expect(res.headers.vary).toBe('Origin')
      })

      it('allows the MCP 2026-07-28 request headers in a preflight, and the Mcp-Param-* ones asked for', async () => {
        const res = await target.request({
          method: 'OPTIONS',
          path: '/v1',
          headers: {
            origin: ALLOWED_ORIGIN,
            'access-control-request-method': 'POST',
            'access-control-request-headers': 'authorization, mcp-method, mcp-name, Mcp-Param-Region, x-other',
          },
        })
        expect(res.status).toBe(204)
        const allowed = res.headers['access-control-allow-headers']!.toLowerCase().split(', ')
        for (const name of ['authorization', 'mcp-method', 'mcp-name', 'mcp-param-region']) expect(allowed).toContain(name)
        expect(allowed).not.toContain('x-other')
        expect(res.headers.vary).toBe('Origin, Access-Control-Request-Headers')
      })
    })

    describe('dispatched requests', () => {
      it('reach the handler of the resolved version with the body untouched, and carry the version headers', async () => {
        const body = 'plain text, not even JSON'
        const res = await target.request({
          path: '/v1',
          headers: { 'content-type': 'text/plain', ...bearer(fixture.tokens.alice) },
          body,
        })
        expect(res.status).toBe(200)
        expect(res.headers['x-probe']).toBe('yes')
        expect(res.headers['x-mcp-version']).toBe('1.0.0') // the dispatch header wins over the handler's
        expect(res.headers['x-mcp-latest-version']).toBe('2.0.0')
        expect(JSON.parse(res.body) as ProbeBody).toEqual({
          version: '1.0.0',
          latest: '2.0.0',
          app: 'app_weather',
          subject: 'alice',
          sessionId: null,
          method: 'POST',
          body,
        })
      })

      it('answers HEAD with GET\'s challenge without a credential, 405 past it, never a body and never the handler', async () => {
        const challenge = unauthorizedReply({ resourceMetadataUrl: METADATA_URL })
        const bare = await target.request({ method: 'HEAD', path: '/v1', headers: { accept: 'text/event-stream' } })
        expect(bare.status).toBe(401)
        expect(bare.headers['www-authenticate']).toBe(challenge.headers['www-authenticate'])
        expect(bare.headers['x-mcp-version']).toBeUndefined()
        expect(bare.body).toBe('')
        // The length of GET's answer, on every adapter.
        expect(bare.headers['content-length']).toBe(String(Buffer.byteLength(challenge.body!)))
        const refused = await target.request({ method: 'HEAD', path: '/v1', headers: bearer(`svc_${'A'.repeat(44)}`) })
        expect(refused.status).toBe(401)
        expect(refused.headers['www-authenticate']).toContain('error="invalid_token"')
        expect(refused.body).toBe('')
        // Past the credential (allowlist and scope included): 405, from the dispatch layer.
        const outside = await target.request({ method: 'HEAD', path: '/v1', headers: bearer(fixture.tokens.aliceOther) })
        expect(outside.status).toBe(403)
        const allowed = await target.request({ method: 'HEAD', path: '/v1', headers: bearer(fixture.tokens.alice) })
        expect(allowed.status).toBe(405)
        expect(allowed.headers.allow).toBe(ALLOWED_METHODS)
        expect(allowed.headers['x-probe']).toBeUndefined()
        expect(allowed.headers['x-mcp-version']).toBeUndefined()
        expect(allowed.body).toBe('')
        expect(allowed.headers['content-length']).toBe(String(Buffer.byteLength(methodNotAllowedReply(ALLOWED_METHODS).body!)))
      })

      it('a path with dot segments is never approved as one path and routed as another', async () => {
        // Sent raw over loopback (Fastify's inject would resolve the path before the adapter).
        for (const path of ['/x/../v1', '/%2e/v1', '/v2.0.0/..', '/x/%2e%2e/v1', '/v1/.']) {
          const res = await rawRequest(target.port, { path, headers: { ...json, ...bearer(fixture.tokens.alice) }, body: TOOLS_LIST })
          if (name.startsWith('web')) {
            // The runtime (@hono/node-server) resolves it before the adapter, and the handler sees that URL.
            expect(res.status, path).toBe(200)
          } else {
            // Express and Fastify route the raw path: the dispatcher reads it raw too, and it is no version path.
            expectReply(res, cacheable(notFoundReply()))
          }
        }
      })

      // A Web adapter gets a `Request` whose URL the runtime already parsed (or refused): only
      // the Node adapters read a raw Host.
      it.skipIf(name.startsWith('web'))('refuses a Host that is not just an authority (400), never building the App address from it', async () => {
        for (const host of ['weather.localhost/x', 'evil@weather.localhost', 'weather.localhost:99999', 'weather.localhost?x', 'weather.localhost,notes.localhost', 'weather"x.localhost', 'weather{x}.localhost']) {
          const res = await target.request({ host, path: '/v1', headers: json, body: TOOLS_LIST })
          expect(res.status, host).toBe(400)
          expect(res.body, host).not.toContain('.well-known')
          expectReply(res, INVALID_HOST_REPLY)
        }
        // Hosts a URL holds reach the App, at the address the URL parser gives (as on the Web adapter).
        for (const host of ['weather.localhost:80', 'WEATHER.localhost']) {
          const res = await target.request({ host, path: '/v1', headers: json, body: TOOLS_LIST })
          expectReply(res, unauthorizedReply({ resourceMetadataUrl: 'http://weather.localhost/.well-known/oauth-protected-resource' }))
        }
      })

      it('resolves the versionless path to the latest version', async () => {
        const res = await target.request({ path: '/', headers: { ...json, ...bearer(fixture.tokens.alice) }, body: TOOLS_LIST })
        expect(res.headers['x-mcp-version']).toBe('2.0.0')
        expect((JSON.parse(res.body) as ProbeBody).version).toBe('2.0.0')
      })

      it('adds the CORS headers for an allowed Origin', async () => {
        const res = await target.request({
          path: '/v2',
          headers: { ...json, ...bearer(fixture.tokens.alice), origin: ALLOWED_ORIGIN },
          body: TOOLS_LIST,
        })
        expect(res.status).toBe(200)
        expect(res.headers['access-control-allow-origin']).toBe(ALLOWED_ORIGIN)
        // The dispatch layer's Vary and exposed headers join the handler's (regression: they replaced them).
        expect(res.headers.vary).toBe('Accept-Encoding, Origin')
        expect(res.headers['access-control-expose-headers']?.toLowerCase()).toBe(`x-probe, ${EXPOSE_HEADERS.toLowerCase()}`)
        const plain = await target.request({ path: '/v2', headers: { ...json, ...bearer(fixture.tokens.alice) }, body: TOOLS_LIST })
        expect(plain.headers.vary).toBe('Accept-Encoding')
        expect(plain.headers['access-control-expose-headers']?.toLowerCase()).toBe('x-probe')
      })

      // Node adapters only: the Web adapter gets the URL its runtime built, and Fastify's router
      // routes no absolute-form target by itself (docs/adapters.md: its rewriteUrl option).
      it.runIf(name.startsWith('express'))('takes an absolute-form request target (RFC 9112 3.2.2): its host and path, not the Host header', async () => {
        const res = await target.request({
          path: `http://${HOST}/v1`,
          host: 'elsewhere.example',
          headers: { ...json, ...bearer(fixture.tokens.alice) },
          body: TOOLS_LIST,
        })
        expect(res.status).toBe(200)
        expect(res.headers['x-mcp-version']).toBe('1.0.0')
      })

      it('answers 502 (JSON-RPC) when the handler throws', async () => {
        const res = await target.request({
          path: '/v1',
          headers: { ...json, ...bearer(fixture.tokens.alice), 'x-test-throw': '1', origin: ALLOWED_ORIGIN },
          body: TOOLS_LIST,
        })
        expect(res.status).toBe(502)
        // The same headers on every adapter: a browser client can read its 502 (regression:
        // the Web adapter's had neither the version nor the CORS headers).
        expect(res.headers['x-mcp-version']).toBe('1.0.0')
        expect(res.headers['access-control-allow-origin']).toBe(ALLOWED_ORIGIN)
        expect(res.headers['access-control-expose-headers']).toBe(EXPOSE_HEADERS)
        expect(JSON.parse(res.body)).toEqual({
          jsonrpc: '2.0',
          id: null,
          error: { code: -32603, message: 'App handler failed', data: { error: 'handler_error' } },
        })
        expect(fixture.errors.some((e) => e.context === 'handler' && (e.error as Error).message === 'probe failed')).toBe(true)
      })

      it('answers 404 version_not_served for a live version routeByVersion has no handler for', async () => {
        const res = await target.request({
          host: 'other.localhost',
          path: '/',
          headers: { ...json, ...bearer(fixture.tokens.aliceOther) },
          body: TOOLS_LIST,
        })
        expect(res.status).toBe(404)
        expect(JSON.parse(res.body)).toEqual({
          jsonrpc: '2.0',
          id: null,
          error: { code: -32004, message: 'Version not served', data: { error: 'version_not_served', version: '1.0.0' } },
        })
        expect(res.headers['x-mcp-version']).toBe('1.0.0')
        // Without Origin, Vary: Origin as on the dispatch layer's other 404s (a cache may keep
        // one); with it, the CORS headers and Vary once.
        expect(res.headers.vary).toBe('Origin')
        const cors = await target.request({
          host: 'other.localhost',
          path: '/',
          headers: { ...json, ...bearer(fixture.tokens.aliceOther), origin: ALLOWED_ORIGIN },
          body: TOOLS_LIST,
        })
        expect(cors.status).toBe(404)
        expect(cors.headers.vary).toBe('Origin')
        expect(cors.headers['access-control-allow-origin']).toBe(ALLOWED_ORIGIN)
      })

      it.runIf(!name.startsWith('web'))('a Vary the platform set before the adapter ran is joined, not replaced, on its refusals and on the router\'s 404', async () => {
        const platformVary = { 'x-test-vary': 'Accept-Language' }
        const notServed = await target.request({
          host: 'other.localhost',
          path: '/',
          headers: { ...json, ...bearer(fixture.tokens.aliceOther), ...platformVary },
          body: TOOLS_LIST,
        })
        expect(notServed.status).toBe(404)
        expect(notServed.headers.vary).toBe('Accept-Language, Origin')
        const withOrigin = await target.request({
          host: 'other.localhost',
          path: '/',
          headers: { ...json, ...bearer(fixture.tokens.aliceOther), ...platformVary, origin: ALLOWED_ORIGIN },
          body: TOOLS_LIST,
        })
        expect(withOrigin.headers.vary).toBe('Accept-Language, Origin')
        // A refusal of the dispatch layer itself (an unknown path: 404 with Vary: Origin).
        const refused = await target.request({ path: '/nowhere', headers: { ...json, ...platformVary }, body: TOOLS_LIST })
        expect(refused.status).toBe(404)
        expect(refused.headers.vary).toBe('Accept-Language, Origin')
      })

      it.runIf(!name.startsWith('web'))('the names the platform exposed before the adapter ran stay exposed on its refusals, joined (regression: replaced, so a browser could not read the platform\'s X-Request-Id on a 401)', async () => {
        const refused = await target.request({ path: '/v1', headers: { ...json, origin: ALLOWED_ORIGIN, 'x-test-expose': 'X-Request-Id' }, body: TOOLS_LIST })
        expect(refused.status).toBe(401)
        const exposed = String(refused.headers['access-control-expose-headers']).split(', ')
        expect(exposed[0]).toBe('X-Request-Id')
        expect(exposed).toContain('WWW-Authenticate')
        expect(exposed).toContain('Mcp-Session-Id')
      })
    })

    describe('client address', () => {
      const ipRequest = () => ({
        path: '/v1',
        headers: { ...json, ...bearer(fixture.tokens.ipLimited), 'x-forwarded-for': '203.0.113.5' },
        body: TOOLS_LIST,
      })

      it('ignores X-Forwarded-For by default (the socket address is outside the allowlist)', async () => {
        expect((await target.request(ipRequest())).status).toBe(403)
      })

      it('reads X-Forwarded-For from a trusted proxy', async () => {
        const res = await trusting.request(ipRequest())
        expect(res.status).toBe(200)
        expect((JSON.parse(res.body) as ProbeBody).subject).toBe('alice')
      })
    })

    describe('session pinning', () => {
      const notes = { host: 'notes.localhost' }

      it('keeps a session on its version across a deploy, through POST, GET and DELETE', async () => {
        const alice = bearer(fixture.tokens.alice)
        const sessionId = `session-${name}-${crypto.randomUUID()}`
        const opened = await target.request({
          ...notes,
          path: '/',
          headers: { ...json, ...alice, 'x-test-session': sessionId },
          body: TOOLS_LIST,
        })
        expect(opened.status).toBe(200)
        expect(opened.headers['mcp-session-id']).toBe(sessionId)
        expect(opened.headers['x-mcp-version']).toBe('1.0.0')

        fixture.apps.deploy('app_notes', '1.1.0')
        const newest = '1.1.0'

        const inSession = await target.request({ ...notes, path: '/', headers: { ...json, ...alice, 'mcp-session-id': sessionId }, body: TOOLS_LIST })
        expect(inSession.status).toBe(200)
        expect(inSession.headers['x-mcp-version']).toBe('1.0.0')
        expect(inSession.headers['x-mcp-latest-version']).toBe(newest)
        expect(JSON.parse(inSession.body) as ProbeBody).toMatchObject({ version: '1.0.0', sessionId })

        const stream = await target.request({
          ...notes,
          method: 'GET',
          path: '/',
          headers: { ...alice, accept: 'text/event-stream', 'mcp-session-id': sessionId },
        })
        expect(stream.headers['x-mcp-version']).toBe('1.0.0')

        const fresh = await target.request({ ...notes, path: '/', headers: { ...json, ...alice }, body: TOOLS_LIST })
        expect(fresh.headers['x-mcp-version']).toBe(newest)

        const ended = await target.request({ ...notes, method: 'DELETE', path: '/', headers: { ...alice, 'mcp-session-id': sessionId } })
        expect(ended.status).toBe(200)
        expect(ended.headers['x-mcp-version']).toBe('1.0.0')

        expectReply(
          await target.request({ ...notes, path: '/', headers: { ...json, ...alice, 'mcp-session-id': sessionId }, body: TOOLS_LIST }),
          cacheable(sessionNotFoundReply()),
        )
      })

      it('holds the answer that opens a session until its pin is stored', async () => {
        const gate = createGate()
        let setStarted!: () => void
        const started = new Promise<void>((resolve) => (setStarted = resolve))
        const memory = createMemorySessionStore()
        const sessions: SessionStore = {
          get: (id, ttl) => memory.get(id, ttl),
          delete: (id) => memory.delete(id),
          async set(id, pin, ttl) {
            setStarted()
            await gate.wait() // a slow shared store (Redis)
            await memory.set(id, pin, ttl)
          },
        }
        const slow = createFixture({ sessions })
        const slowTarget = await start({ fixture: slow, probe })
        try {
          const sessionId = `session-${name}-${crypto.randomUUID()}`
          let answered = false
          const opening = slowTarget
            .request({ ...notes, path: '/', headers: { ...json, ...bearer(slow.tokens.alice), 'x-test-session': sessionId }, body: TOOLS_LIST })
            .then((res) => ((answered = true), res))
          await started
          // A whole request through the same server and back: an answer not held would be here by now.
          await slowTarget.request({ method: 'GET', path: '/.well-known/oauth-protected-resource' })
          expect(answered).toBe(false)
          gate.open()
          const opened = await opening
          expect(opened.headers['mcp-session-id']).toBe(sessionId)
          const next = await slowTarget.request({
            ...notes,
            path: '/',
            headers: { ...json, ...bearer(slow.tokens.alice), 'mcp-session-id': sessionId },
            body: TOOLS_LIST,
          })
          expect(next.status).toBe(200)
          expect(next.headers['x-mcp-version']).toBe('1.0.0')
        } finally {
          await slowTarget.close()
        }
      })

      it('refuses a session pinned to another identity (404)', async () => {
        const sessionId = `session-${name}-${crypto.randomUUID()}`
        const opened = await target.request({
          ...notes,
          path: '/',
          headers: { ...json, ...bearer(fixture.tokens.alice), 'x-test-session': sessionId },
          body: TOOLS_LIST,
        })
        expect(opened.status).toBe(200)
        expectReply(
          await target.request({
            ...notes,
            path: '/',
            headers: { ...json, ...bearer(fixture.tokens.carol), 'mcp-session-id': sessionId },
            body: TOOLS_LIST,
          }),
          cacheable(sessionNotFoundReply()),
        )
      })

      it('pins the version of an exact URL only to that URL', async () => {
        const sessionId = `session-${name}-${crypto.randomUUID()}`
        const alice = bearer(fixture.tokens.alice)
        await target.request({ path: '/v1.0.0', headers: { ...json, ...alice, 'x-test-session': sessionId }, body: TOOLS_LIST })
        const other = await target.request({ path: '/v2.0.0', headers: { ...json, ...alice, 'mcp-session-id': sessionId }, body: TOOLS_LIST })
        expectReply(other, cacheable(sessionNotFoundReply()))
      })
    })

    describe('streaming over loopback HTTP', () => {
      it('passes an SSE response through unbuffered, with the version headers', async () => {
        probe.gate = createGate()
        const response = await loopbackFetch(`http://weather.localhost:${target.port}/v2`, {
          method: 'POST',
          headers: { ...json, ...bearer(fixture.tokens.alice), accept: 'text/event-stream', 'x-test-stream': '1' },
          body: TOOLS_LIST,
        })
        expect(response.status).toBe(200)
        expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/)
        expect(response.headers.get('x-mcp-version')).toBe('2.0.0')
        const reader = response.body!.getReader()
        // The first event arrives while the handler is still waiting: nothing holds it back.
        expect(await readUntil(reader, 'data: one')).toContain('data: one')
        probe.gate.open()
        expect(await readUntil(reader, 'data: two')).toContain('data: two')
        await reader.cancel()
      })
    })
  })
}
