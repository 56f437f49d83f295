/**
 * What is particular to Cloudflare Workers, run in workerd (their runtime; `workerd.ts`): the
 * platform of `app.ts` as a Worker (`worker.ts`), in front of a real authorization server
 * (oidc-provider on 127.0.0.1, reached through a proxy the test slows down or stops), driven from
 * this process. `web-runtimes.test.ts` runs the checks shared with Bun and Deno.
 *
 * - Loading: the root entry imports `node:crypto`, so it needs `nodejs_compat`; the Web adapter
 *   alone does not.
 * - Timers: Workers run a request's timers only while the request lives. The validator's own
 *   (call timeouts, retry waits) work; those that outlive a request (the token service's
 *   coalesced `last_used_at` write, the session keep-alive) need `waitUntil` or another request.
 * - Promises across requests: a promise whose work a request started never settles once that
 *   request has ended (workerd rejects it in the others, with compatibility dates from
 *   2024-10-14). The validator's single flight, discovery and key set are shared that way.
 *
 * The Worker's platform comes twice: as a Worker gets it by default, and with `waitUntil` of
 * `cloudflare:workers` handed to the library (`X-Test-Variant: wait-until`).
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { OAuthValidatorEvent } from 'mcp-dispatch'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { underProjectCI } from '../helpers/ci.js'
import { type FakeUpstream, proxyTo, startFakeUpstream } from '../oauth/helpers/fake-upstream.js'
import { type FetchLike, loopbackFetch, obtainAccessToken } from '../oauth/helpers/oauth-client.js'
import type { RuntimeTokens } from './app.js'
import { type Workerd, bundleWorker, startWorkerd, workerdBinary } from './workerd.js'

const binary = workerdBinary()
const missing = [
  ...(binary !== undefined && existsSync(binary) ? [] : ['workerd (npm ci --prefix test/runtimes)']),
  ...(existsSync(fileURLToPath(new URL('../../dist/adapters/web/index.js', import.meta.url))) ? [] : ['dist/ (npm run build)']),
]
if (missing.length > 0) {
  const message = `[workerd] ${missing.join(' and ')} missing`
  if (underProjectCI()) throw new Error(`${message}: under .ci/run (MCP_DISPATCH_CI) this suite fails instead of skipping`)
  console.warn(`${message}; suite skipped`)
}

const SESSION_TTL_MS = 900
/**
 * The token service's lastUsedFlushMs: the last_used_at test's second use must come within it of
 * the first to be left to the timer (20 ms later on a quiet machine, past 300 ms on a loaded one).
 */
const FLUSH_MS = 1_500
const JWKS_MAX_AGE_MS = 300
/**
 * The userinfo call's deadline: well past the 300 ms the tests hold userinfo answers for, so that
 * a loaded machine does not time the held call out and retry it (one more userinfo call counted).
 */
const OAUTH_TIMEOUT_MS = 1_000
const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** `fetch` to the Worker: `*.localhost` over loopback, to the platform with `waitUntil` when `variant` says so. */
const variantFetch =
  (variant?: 'wait-until'): FetchLike =>
  (input, init) => {
    if (variant === undefined) return loopbackFetch(input, init)
    const headers = new Headers(init?.headers)
    headers.set('x-test-variant', variant)
    return loopbackFetch(input, { ...init, headers })
  }

describe.skipIf(missing.length > 0)('the Web adapter in workerd (Cloudflare Workers)', () => {
  let code: string
  let worker: Workerd
  let auth: DevAuthServer
  let jwtAuth: DevAuthServer
  let upstream: FakeUpstream
  /** How long the proxy holds userinfo and JWKS answers; `hang`: never answers. */
  const delay: { me: number | 'hang'; jwks: number } = { me: 0, jwks: 0 }

  const url = (path: string, host = 'weather.localhost') => `http://${host}:${worker.port}${path}`
  const call = (path: string, options: { host?: string; token?: string; variant?: 'wait-until'; headers?: Record<string, string> } = {}) =>
    variantFetch(options.variant)(url(path, options.host), {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        ...(options.token !== undefined && { authorization: `Bearer ${options.token}` }),
        ...options.headers,
      },
      body: TOOLS_LIST,
    })
  const control = async <T>(path: string, variant?: 'wait-until') =>
    (await (await variantFetch(variant)(url(path, 'control.localhost'))).json()) as T
  const events = (variant?: 'wait-until') => control<OAuthValidatorEvent[]>('/events', variant)
  /** A new access token of `server`, obtained by the MCP SDK's client from the App at `host`. */
  const newToken = async (host = 'weather.localhost') => (await obtainAccessToken(url('/v1', host), loopbackFetch)).accessToken
  const until = async (condition: () => boolean, what: string) => {
    for (let waited = 0; !condition(); waited += 10) {
      if (waited > 5_000) throw new Error(`waited 5 s for ${what}`)
      await sleep(10)
    }
  }

  beforeAll(async () => {
    auth = await startDevAuthServer({ accounts: ['user_alice'] })
    jwtAuth = await startDevAuthServer({ accounts: ['user_alice'], resourceIndicators: { accessTokenFormat: 'jwt' } })
    upstream = await startFakeUpstream()
    upstream.route('/me', async (request) => {
      if (delay.me === 'hang') return 'hang'
      await sleep(delay.me)
      return proxyTo(auth.userinfoEndpoint)(request)
    })
    upstream.route('/jwks', async (request) => {
      await sleep(delay.jwks)
      return proxyTo(`${jwtAuth.issuer}/jwks`)(request)
    })
    code = await bundleWorker('./worker.ts')
    worker = await startWorkerd({
      code,
      bindings: {
        ISSUER: auth.issuer,
        USERINFO_ENDPOINT: `${upstream.url}/me`,
        OAUTH_TIMEOUT_MS: String(OAUTH_TIMEOUT_MS),
        JWT_ISSUER: jwtAuth.issuer,
        JWKS_URL: `${upstream.url}/jwks`,
        JWKS_MAX_AGE_MS: String(JWKS_MAX_AGE_MS),
        LAST_USED_FLUSH_MS: String(FLUSH_MS),
        SESSION_TTL_MS: String(SESSION_TTL_MS),
      },
    })
  }, 30_000)

  afterAll(async () => {
    await worker?.stop()
    await upstream?.close()
    await auth?.close()
    await jwtAuth?.close()
  })

  it('loads the root entry only with nodejs_compat (implied from 2026-08-04); mcp-dispatch/web loads without it', async () => {
    await expect(startWorkerd({ code, compatibilityDate: '2026-08-03' })).rejects.toThrow('No such module "node:crypto"')

    const flagged = await startWorkerd({ code, compatibilityDate: '2026-08-03', compatibilityFlags: ['nodejs_compat'] })
    try {
      const tokens = (await (await loopbackFetch(`http://control.localhost:${flagged.port}/tokens`)).json()) as RuntimeTokens
      const served = await loopbackFetch(`http://weather.localhost:${flagged.port}/v1`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${tokens.alice}` },
        body: TOOLS_LIST,
      })
      expect(served.status).toBe(200)
    } finally {
      await flagged.stop()
    }

    const webOnly = await startWorkerd({
      code: await bundleWorker({
        source: `import { mcpDispatch, routeByVersion, toResponse } from 'mcp-dispatch/web'
          export default { fetch: () => toResponse({ status: 200, headers: {}, body: typeof mcpDispatch + ' ' + typeof routeByVersion }) }`,
      }),
      compatibilityDate: '2026-08-03',
    })
    try {
      expect(await (await fetch(`http://127.0.0.1:${webOnly.port}/`)).text()).toBe('function function')
    } finally {
      await webOnly.stop()
    }
  })

  it('answers HEAD with GET\'s fields and the length of its body, without the body', async () => {
    for (const path of ['/.well-known/oauth-protected-resource', '/v1']) {
      const get = await loopbackFetch(url(path))
      const body = await get.text()
      const head = await loopbackFetch(url(path), { method: 'HEAD' })
      expect(head.status, path).toBe(get.status)
      expect(await head.text(), path).toBe('')
      expect(head.headers.get('content-type'), path).toBe('application/json')
      expect(head.headers.get('content-length'), path).toBe(String(Buffer.byteLength(body)))
    }
  })

  describe('OAuth, userinfo mode', () => {
    it('shares one userinfo call between concurrent first requests, then answers from the cache', async () => {
      const token = await newToken()
      await events()
      const before = upstream.count('/me')
      delay.me = 300
      const statuses = await Promise.all(Array.from({ length: 5 }, async () => (await call('/v1', { token })).status))
      expect(statuses).toEqual([200, 200, 200, 200, 200])
      expect(upstream.count('/me') - before).toBe(1)
      expect((await events()).filter((e) => e.type === 'joined')).toHaveLength(4)

      delay.me = 0
      expect((await call('/v1', { token })).status).toBe(200)
      expect(upstream.count('/me') - before).toBe(1)
      expect(await events()).toEqual([{ type: 'cache-hit', active: true }])
    })

    it('serves the requests that joined a validation whose first request ended before it did, and every request after', async () => {
      const token = await newToken()
      delay.me = 300
      const before = upstream.count('/me')
      // The first request starts the validation and is answered (504, by the test Worker) before
      // it ends: its request is over, and the userinfo call it made with it.
      const first = call('/v1', { token, headers: { 'x-test-answer-within': '100' } })
      await until(() => upstream.count('/me') > before, 'the userinfo call')
      const joined = call('/v1', { token })
      expect((await first).status).toBe(504)
      expect((await joined).status).toBe(200)
      expect((await call('/v1', { token })).status).toBe(200)
      // The joined request validated again, once.
      expect(upstream.count('/me') - before).toBe(2)
      delay.me = 0
    })

    it('with waitUntil, the validation outlives its first request and the joined ones share it', async () => {
      const token = await newToken()
      delay.me = 300
      const before = upstream.count('/me')
      const first = call('/v1', { token, variant: 'wait-until', headers: { 'x-test-answer-within': '100' } })
      await until(() => upstream.count('/me') > before, 'the userinfo call')
      const joined = call('/v1', { token, variant: 'wait-until' })
      expect((await first).status).toBe(504)
      expect((await joined).status).toBe(200)
      expect(upstream.count('/me') - before).toBe(1)
      delay.me = 0
    })

    it('times out a userinfo call that does not answer, within the request: 503 with Retry-After', async () => {
      const token = await newToken()
      delay.me = 'hang'
      const started = Date.now()
      const refused = await call('/v1', { token })
      expect(refused.status).toBe(503)
      expect(refused.headers.get('retry-after')).not.toBeNull()
      expect(((await refused.json()) as { error: { data: { error: string } } }).error.data.error).toBe('temporarily_unavailable')
      // Two calls of at most OAUTH_TIMEOUT_MS each, within the deadline of twice that.
      expect(Date.now() - started).toBeLessThan(2 * OAUTH_TIMEOUT_MS + 1_000)
      expect((await events()).filter((e) => e.type === 'retry').length).toBeGreaterThanOrEqual(1)
      delay.me = 0
    })
  })

  describe('OAuth, jwt mode (jose, the JWKS through node:crypto and WebCrypto)', () => {
    const JWT_HOST = 'weather.jwt.localhost'

    /** The token with another `kid` in its header: a key the issuer would have rotated in. */
    const withUnknownKid = (token: string) => {
      const [header, ...rest] = token.split('.')
      const decoded = JSON.parse(Buffer.from(header!, 'base64url').toString()) as Record<string, unknown>
      return [Buffer.from(JSON.stringify({ ...decoded, kid: 'rotated-in' })).toString('base64url'), ...rest].join('.')
    }

    it('verifies access tokens locally; a token naming a key the set lacks waits for the refetch, which a background one cut short leaves free', async () => {
      const token = await newToken(JWT_HOST)
      const before = upstream.count('/jwks')
      expect((await call('/v1', { host: JWT_HOST, token })).status).toBe(200)
      expect(upstream.count('/jwks') - before).toBe(1)

      // Past their age, the keys are refetched in the background: the request that started it
      // answers at once, and the refetch ends with it (workerd may not even have sent it).
      delay.jwks = 200
      await sleep(JWKS_MAX_AGE_MS + 50)
      await events()
      expect((await call('/v1', { host: JWT_HOST, token: await newToken(JWT_HOST) })).status).toBe(200)
      await sleep(JWKS_MAX_AGE_MS + 50)
      expect((await events()).filter((e) => e.type === 'upstream')).toEqual([])
      // A token naming a key not in the set (one the issuer would have rotated in) waits for a
      // refetch, which its own request makes: refused for its key (401), not 503, and not
      // refused before the key set was asked again.
      const asked = upstream.count('/jwks')
      const refused = await call('/v1', { host: JWT_HOST, token: withUnknownKid(token) })
      expect(refused.status).toBe(401)
      expect(upstream.count('/jwks') - asked).toBe(1)
      expect((await events()).filter((e) => e.type === 'upstream')).toMatchObject([{ endpoint: 'jwks', outcome: 'ok' }])
      delay.jwks = 0
      expect((await call('/v1', { host: JWT_HOST, token })).status).toBe(200)
    })

    it('with waitUntil, keys past their age are refetched in the background', async () => {
      expect((await call('/v1', { host: JWT_HOST, token: await newToken(JWT_HOST), variant: 'wait-until' })).status).toBe(200)
      delay.jwks = 200
      await sleep(JWKS_MAX_AGE_MS + 50)
      await events('wait-until')
      const before = upstream.count('/jwks')
      expect((await call('/v1', { host: JWT_HOST, token: await newToken(JWT_HOST), variant: 'wait-until' })).status).toBe(200)
      await until(() => upstream.count('/jwks') > before, 'the background refetch')
      // Reported once its answer (held 200 ms by the proxy) is in: waited for, not slept on.
      const reported: OAuthValidatorEvent[] = []
      await vi.waitFor(
        async () => {
          reported.push(...(await events('wait-until')))
          expect(reported.filter((e) => e.type === 'upstream')).toMatchObject([{ endpoint: 'jwks', outcome: 'ok' }])
        },
        { timeout: 5_000, interval: 50 },
      )
      delay.jwks = 0
    })
  })

  describe('timers that outlive a request', () => {
    it('writes last_used_at without a request after it only with waitUntil; by default, at the next request', async () => {
      for (const variant of [undefined, 'wait-until'] as const) {
        const tokens = await control<RuntimeTokens>('/tokens', variant)
        const lastUsed = async () => (await control<{ lastUsedAt: number | null }>('/last-used', variant)).lastUsedAt
        // A use, written at once (the last write is long past) or not; then one within
        // lastUsedFlushMs of it, which sets the timer.
        expect((await call('/v1', { token: tokens.alice, variant })).status).toBe(200)
        await sleep(20)
        const second = Date.now()
        expect((await call('/v1', { token: tokens.alice, variant })).status).toBe(200)
        await sleep(FLUSH_MS + 200)
        if (variant === 'wait-until') {
          // Written by the timer waitUntil kept alive (FLUSH_MS after the first use), however late it ran.
          await vi.waitFor(async () => expect(await lastUsed()).toBeGreaterThanOrEqual(second), { timeout: 5_000, interval: 50 })
        } else {
          // The timer was the request's, and ended with it; the next use writes.
          expect(await lastUsed() ?? 0).toBeLessThan(second)
          expect((await call('/v1', { token: tokens.alice })).status).toBe(200)
          expect(await lastUsed()).toBeGreaterThanOrEqual(second)
        }
      }
    })

    it('keeps the pin of a session whose GET stream is open past the idle TTL', async () => {
      const tokens = await control<RuntimeTokens>('/tokens')
      const client = new Client({ name: 'workerd-test', version: '1.0.0' })
      const transport = new StreamableHTTPClientTransport(new URL(url('/v1')), {
        fetch: loopbackFetch,
        requestInit: { headers: { authorization: `Bearer ${tokens.alice}` } },
      })
      await client.connect(transport)
      try {
        // No request of the session for longer than its TTL; its GET stream stays open.
        await sleep(SESSION_TTL_MS * 2)
        const result = (await client.callTool({ name: 'get_version', arguments: {} })) as { content: Array<{ text: string }> }
        expect(result.content[0]!.text).toBe('1.1.0')
      } finally {
        await transport.terminateSession().catch(() => {})
        await client.close()
      }
    })
  })

  it('wrote nothing on stderr', () => {
    expect(worker.output()).toBe('')
  })
})
