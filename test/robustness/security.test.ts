/**
 * Security checks:
 * - no secret (API token or OAuth access token) in any log line, `onError` report, thrown
 *   error or dispatch-layer answer, across every token state and failure path;
 * - secrets are compared in constant time on the authentication path (observed, not read
 *   from the source: see the test for how);
 * - `X-Forwarded-For` is ignored unless the platform configures trusted proxies, through
 *   every adapter, and the framework's own proxy setting does not change that.
 */
import { inspect } from 'node:util'
import * as crypto from 'node:crypto'
import {
  type AccessTokenValidator,
  AuthorizationServerUnavailableError,
  generateApiToken,
  hashApiToken,
  hashesEqual,
} from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { afterAll, afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import * as apiTokenModule from '../../src/core/api-token.js'
import { createPlatform } from '../../examples/platform/index.js'
import {
  API_TOKEN_PATTERN,
  HOSTNAME,
  TOOLS_LIST,
  adapterTargets,
  createFixture,
  jsonRpcError,
  mcpHeaders,
  send,
  textsOf,
} from './support.js'

// Observe the comparisons without changing them: both mocks call the real functions.
vi.mock(import('node:crypto'), async (importOriginal) => {
  const actual = await importOriginal()
  return { ...actual, timingSafeEqual: vi.fn(actual.timingSafeEqual) }
})
vi.mock(import('../../src/core/api-token.js'), async (importOriginal) => {
  const actual = await importOriginal()
  return { ...actual, hashesEqual: vi.fn(actual.hashesEqual) }
})

const targets = await adapterTargets()

describe('no secret in logs, errors or answers', () => {
  const captured: string[] = []
  const consoleMethods = ['log', 'info', 'warn', 'error', 'debug', 'trace'] as const

  beforeEach(() => {
    for (const method of consoleMethods) {
      vi.spyOn(console, method).mockImplementation((...args: unknown[]) => {
        captured.push(args.map((a) => (typeof a === 'string' ? a : inspect(a, { depth: 6 }))).join(' '))
      })
    }
  })
  afterEach(() => {
    vi.restoreAllMocks()
  })

  it('a busy run with tokens in every state, OAuth tokens and failing stores leaks none of them', async () => {
    const oauthTokens = Array.from({ length: 8 }, (_, i) => `oauth.${crypto.randomBytes(24).toString('base64url')}.${i}`)
    // Accepts the first two, rejects two, reports an outage for two, fails like a bug for two.
    const oauth: AccessTokenValidator = {
      async validate(token) {
        const i = oauthTokens.indexOf(token)
        if (i < 2) return { active: true, info: { subject: 'alice', clientId: 'client-1' } }
        if (i < 4) return { active: false, reason: 'inactive' }
        if (i < 6) throw new AuthorizationServerUnavailableError(5)
        throw new Error('unexpected answer from the authorization server')
      },
    }
    const fixture = await createFixture({ faults: true, oauth })
    const apiTokens = [...Object.values(fixture.tokens), generateApiToken(), `svc_${'x'.repeat(10)}`]
    const secrets = [...apiTokens, ...oauthTokens]
    const seen: string[] = [] // answers and thrown errors, scanned with the logs
    const reports: string[] = []
    const onError = (error: unknown, context: string) => {
      fixture.onError(error, context)
      reports.push(context, ...textsOf(error), inspect(error, { depth: 6 }))
    }

    seen.push(...(await driveAdapters(fixture, secrets, onError)))

    // The token service's own refusals, as thrown errors.
    for (const token of apiTokens) {
      for (const attempt of [
        () => fixture.tokenService.rotate('no-such-id', { kind: 'token', token }),
        () => fixture.tokenService.rotate('no-such-id', { kind: 'token', token, clientAddress: '198.51.100.1' }),
      ]) {
        await attempt().then(
          () => undefined,
          (error: unknown) => seen.push(...textsOf(error), inspect(error, { depth: 6 })),
        )
      }
    }
    await fixture.close()

    // The token-management API of the reference platform, Bearer rotation with every token.
    const platform = createPlatform({
      seed: {
        apps: [{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }],
        users: [{ id: 'alice' }],
        subscriptions: [{ userId: 'alice', appId: 'app_weather', active: true }],
        tokens: [{ name: 'alice', userId: 'alice', servers: ['app_weather'], expiresInDays: 30 }],
      },
      onError,
    })
    const own = platform.tokens.alice!
    secrets.push(own)
    const created = await platform.tokenService.create({ userId: 'alice', name: 'x', servers: ['app_weather'], expiresInDays: 7 })
    await platform.tokenService.revoke('alice', created.id)
    secrets.push(created.token)
    for (const token of [...apiTokens, created.token, own.slice(0, -1), `${own}0`]) {
      const response = await platform.fetch(
        new Request(`http://api.localhost/api/tokens/${created.id}/rotate`, { method: 'POST', headers: { authorization: `Bearer ${token}` } }),
        { clientAddress: '127.0.0.1' },
      )
      expect(response.status).toBeGreaterThanOrEqual(400)
      seen.push(await response.text(), ...[...response.headers.values()])
    }
    await platform.close()

    // What the dispatcher and the token service reported (store outages, the validator's
    // failures), as handed to their onError: errors whole, causes and all.
    const serviceReports = fixture.errors.flatMap((e) => [e.context, ...textsOf(e.error), inspect(e.error, { depth: 6 })])
    expect(fixture.errors.length).toBeGreaterThan(100)
    const texts = [...captured, ...reports, ...serviceReports, ...seen]
    expect(texts.length).toBeGreaterThan(1000)
    expect(reports.length).toBeGreaterThan(0) // the failure paths did report
    expect(leaksOf(texts, secrets)).toEqual([])
  })

  it('a dispatch decision, inspected or serialized as a logger would, shows no credential: the request it holds is private (regression: util.inspect printed its Authorization header)', async () => {
    const fixture = await createFixture()
    const token = fixture.tokens.valid
    const decision = await fixture.dispatcher.decide({
      method: 'POST',
      path: '/v1',
      host: HOSTNAME,
      origin: `http://${HOSTNAME}`,
      headers: new Headers({ authorization: `Bearer ${token}` }),
      clientAddress: '127.0.0.1',
    })
    if (decision.type !== 'dispatch') throw new Error(`expected a dispatch, got ${JSON.stringify(decision.reply)}`)
    const shown = [inspect(decision, { depth: Infinity, showHidden: true }), JSON.stringify(decision), String(decision), inspect(decision.context, { depth: Infinity })]
    expect(shown.filter((text) => text.includes(token.slice(4, 20)))).toEqual([])
    await fixture.close()
  })

  it('with no onError anywhere, the default logger prints no secret to stderr', async () => {
    const oauthTokens = Array.from({ length: 4 }, (_, i) => `oauth.${crypto.randomBytes(24).toString('base64url')}.${i}`)
    const oauth: AccessTokenValidator = {
      async validate(token) {
        if (oauthTokens.indexOf(token) < 2) throw new AuthorizationServerUnavailableError(5)
        throw new Error('unexpected answer from the authorization server')
      },
    }
    const fixture = await createFixture({ faults: true, oauth, defaultLogger: true })
    const secrets = [...Object.values(fixture.tokens), generateApiToken(), ...oauthTokens]
    const seen = await driveAdapters(fixture, secrets, undefined)
    await fixture.close()
    expect(fixture.errors).toEqual([]) // everything went to the default logger
    const logged = captured.filter((line) => line.startsWith('[mcp-dispatch] '))
    expect(logged.length).toBeGreaterThan(100)
    expect(leaksOf([...captured, ...seen], secrets)).toEqual([])
  })
})

/** Texts naming any of `secrets`, or any API token: the first five. */
function leaksOf(texts: string[], secrets: string[]): string[] {
  return texts.filter((text) => API_TOKEN_PATTERN.test(text) || secrets.some((secret) => text.includes(secret))).slice(0, 5)
}

/**
 * Every adapter in turn, with its stores healthy, throwing and rejecting: each secret presented
 * plain, to a handler that throws, and with an unknown session. Answers' bodies and headers.
 */
async function driveAdapters(
  fixture: Awaited<ReturnType<typeof createFixture>>,
  secrets: string[],
  onError: ((error: unknown, context: string) => void) | undefined,
): Promise<string[]> {
  const seen: string[] = []
  for (const target of targets) {
    const running = await target.start({ dispatcher: fixture.dispatcher, onError })
    try {
      const faultModes = ['ok', 'throw', 'reject'] as const
      for (const fault of faultModes) {
        fixture.faults.modes.tokens = fault
        fixture.faults.modes.subscriptions = fault === 'ok' ? 'ok' : 'throw'
        for (const token of secrets) {
          const extras: Array<Record<string, string>> = [{}, { 'x-robustness-throw': '1' }, { 'mcp-session-id': 'unknown-session' }]
          for (const extra of extras) {
            const response = await send(running.port, {
              method: 'POST',
              path: '/v1',
              headers: mcpHeaders(running.port, token, extra),
              body: TOOLS_LIST,
            })
            seen.push(response.body.toString(), ...Object.values(response.headers).map(String))
          }
        }
      }
      fixture.faults.modes.tokens = 'ok'
      fixture.faults.modes.subscriptions = 'ok'
    } finally {
      await running.close()
    }
  }
  return seen
}

describe('constant-time comparison of secrets', () => {
  const spiedHashesEqual = vi.mocked(apiTokenModule.hashesEqual)
  const spiedTimingSafeEqual = vi.mocked(crypto.timingSafeEqual)

  afterEach(() => {
    spiedHashesEqual.mockClear()
    spiedTimingSafeEqual.mockClear()
  })

  /**
   * `hashesEqual` must do the same work wherever two digests first differ. Without timing
   * anything: count the characters it reads from instrumented strings (a String object whose
   * `charCodeAt` counts), or, if it delegates to `crypto.timingSafeEqual`, see that call.
   */
  function workOf(a: string, b: string): { reads: number; timingSafeEqualCalls: number } {
    let reads = 0
    const counted = (s: string) =>
      Object.assign(new String(s), {
        charCodeAt(index: number) {
          reads++
          return s.charCodeAt(index)
        },
      }) as unknown as string
    const before = spiedTimingSafeEqual.mock.calls.length
    hashesEqual(counted(a), counted(b))
    return { reads, timingSafeEqualCalls: spiedTimingSafeEqual.mock.calls.length - before }
  }

  it('hashesEqual does the same work whether digests differ at the first character, the last, or not at all', () => {
    const digest = hashApiToken(generateApiToken())
    const first = `${digest[0] === 'a' ? 'b' : 'a'}${digest.slice(1)}`
    const last = `${digest.slice(0, -1)}${digest.endsWith('a') ? 'b' : 'a'}`
    const work = [workOf(digest, first), workOf(digest, last), workOf(digest, digest)]
    const constantTime = work.every((w) => w.timingSafeEqualCalls === 1) || work.every((w) => w.reads === 2 * digest.length)
    expect(constantTime, JSON.stringify(work)).toBe(true)
    // And it still answers correctly.
    expect([hashesEqual(digest, first), hashesEqual(digest, last), hashesEqual(digest, digest)]).toEqual([false, false, true])
  })

  it('the authentication path compares the stored hash with hashesEqual, on every request', async () => {
    const fixture = await createFixture()
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: async () => new Response('{}', { headers: { 'content-type': 'application/json' } }),
    })
    const request = (token: string) =>
      handle(
        new Request(`http://${HOSTNAME}/v1`, { method: 'POST', headers: mcpHeaders(0, token, { host: HOSTNAME }), body: TOOLS_LIST }),
        { clientAddress: '127.0.0.1' },
      )
    spiedHashesEqual.mockClear()
    expect((await request(fixture.tokens.valid)).status).toBe(200)
    expect((await request(fixture.tokens.revoked)).status).toBe(401)
    expect(spiedHashesEqual).toHaveBeenCalledTimes(2)
    for (const [stored, presented] of spiedHashesEqual.mock.calls) {
      expect(stored).toHaveLength(64)
      expect(presented).toHaveLength(64)
    }
    expect(spiedHashesEqual.mock.calls[0]).toEqual([hashApiToken(fixture.tokens.valid), hashApiToken(fixture.tokens.valid)])
    await fixture.close()
  })

  it("the reference platform's CSRF check goes through crypto.timingSafeEqual", async () => {
    const platform = createPlatform({
      seed: { apps: [{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }], users: [{ id: 'alice' }] },
      onError: () => {},
    })
    const signIn = await platform.fetch(
      new Request('http://api.localhost/dev/session', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ userId: 'alice' }),
      }),
    )
    const { csrfToken } = (await signIn.json()) as { csrfToken: string }
    const cookie = signIn.headers.get('set-cookie')!.split(';')[0]!
    spiedTimingSafeEqual.mockClear()
    const forged = `${csrfToken[0] === 'A' ? 'B' : 'A'}${csrfToken.slice(1)}`
    const response = await platform.fetch(
      new Request('http://api.localhost/api/tokens', {
        method: 'POST',
        headers: { cookie, 'x-csrf-token': forged, 'content-type': 'application/json' },
        body: JSON.stringify({ name: 'x', servers: ['app_weather'], expires_in_days: 7 }),
      }),
    )
    expect(response.status).toBe(403)
    expect(spiedTimingSafeEqual).toHaveBeenCalledTimes(1)
    expect(spiedTimingSafeEqual.mock.results[0]).toEqual({ type: 'return', value: false })
    // As long as the token in characters, longer in bytes (a byte past 0x7f is two in UTF-8):
    // a mismatch, 403, on the token API and the password reset, never a throw (a 503).
    const wide = `\u00e9${csrfToken.slice(1)}`
    expect(signIn.headers.get('cache-control')).toBe('no-store')
    for (const [path, init] of [
      ['/api/tokens', { method: 'POST', body: JSON.stringify({ name: 'x', servers: ['app_weather'], expires_in_days: 7 }) }],
      ['/dev/password-reset', { method: 'POST' }],
    ] as const) {
      const refused = await platform.fetch(
        new Request(`http://api.localhost${path}`, { ...init, headers: { cookie, 'x-csrf-token': wide, 'content-type': 'application/json' } }),
      )
      expect([path, refused.status, ((await refused.json()) as { error: string }).error]).toEqual([path, 403, 'csrf_failed'])
    }
    await platform.close()
  })

  it("the reference platform's development endpoints read at most 16 KiB of body", async () => {
    const platform = createPlatform({
      seed: { apps: [{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }], users: [{ id: 'alice' }] },
      onError: () => {},
    })
    let pulled = 0
    // A body that never ends: refused once past the limit, the rest never read.
    const endless = new ReadableStream<Uint8Array>({
      pull(controller) {
        pulled += 1024
        controller.enqueue(new Uint8Array(1024).fill(0x61))
      },
    })
    for (const path of ['/dev/session', '/dev/deploy']) {
      const body = path === '/dev/session' ? endless : JSON.stringify({ app: 'weather', version: `1.0.${'1'.repeat(20_000)}` })
      const response = await platform.fetch(
        new Request(`http://api.localhost${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, duplex: 'half' } as RequestInit),
      )
      expect([path, response.status, await response.json()]).toEqual([path, 400, { error: 'invalid_request', message: 'body: must be at most 16384 bytes', field: 'body' }])
    }
    expect(pulled).toBeLessThan(64 * 1024)
    await platform.close()
  })
})

describe.each(targets.map((t) => [t.name, t] as const))('X-Forwarded-For through the %s adapter', (_name, target) => {
  let fixture: Awaited<ReturnType<typeof createFixture>>
  const running: Array<{ close(): Promise<void> }> = []

  afterAll(async () => {
    for (const r of running) await r.close()
    await fixture?.close()
  })

  async function statusOf(trustProxy: false | number | string[] | undefined, token: string, headers: Record<string, string>, frameworkTrustsProxy = false) {
    fixture ??= await createFixture()
    const server = await target.start({
      dispatcher: fixture.dispatcher,
      onError: fixture.onError,
      ...(trustProxy !== undefined && { trustProxy }),
      frameworkTrustsProxy,
    })
    running.push(server)
    const response = await send(server.port, { method: 'POST', path: '/v1', headers: mcpHeaders(server.port, token, headers), body: TOOLS_LIST })
    if (response.status === 403) expect(jsonRpcError(response.body)?.data).toEqual({ error: 'ip_not_allowed' })
    return response.status
  }

  it('is ignored by default: the socket address decides', async () => {
    fixture ??= await createFixture()
    const { testNetOnly, loopbackOnly } = fixture.tokens
    expect(await statusOf(undefined, testNetOnly, { 'x-forwarded-for': '203.0.113.9' })).toBe(403)
    expect(await statusOf(undefined, loopbackOnly, { 'x-forwarded-for': '203.0.113.9' })).toBe(200)
    expect(await statusOf(false, testNetOnly, { 'x-forwarded-for': '203.0.113.9' })).toBe(403)
  })

  it("is ignored even when the framework's own proxy setting trusts everyone", async () => {
    fixture ??= await createFixture()
    expect(await statusOf(undefined, fixture.tokens.testNetOnly, { 'x-forwarded-for': '203.0.113.9' }, true)).toBe(403)
    expect(await statusOf(undefined, fixture.tokens.loopbackOnly, { 'x-forwarded-for': '203.0.113.9' }, true)).toBe(200)
  })

  it.each([[['127.0.0.1/32']], [1]] as const)('is used when the socket peer is a trusted proxy (trustProxy %j)', async (trust) => {
    fixture ??= await createFixture()
    const trustProxy = typeof trust === 'number' ? trust : [...trust]
    const { testNetOnly, loopbackOnly } = fixture.tokens
    expect(await statusOf(trustProxy, testNetOnly, { 'x-forwarded-for': '203.0.113.9' })).toBe(200)
    expect(await statusOf(trustProxy, loopbackOnly, { 'x-forwarded-for': '203.0.113.9' })).toBe(403)
    expect(await statusOf(trustProxy, loopbackOnly, {})).toBe(200)
    // Only X-Forwarded-For is read: Forwarded and X-Real-IP never are.
    expect(await statusOf(trustProxy, testNetOnly, { forwarded: 'for=203.0.113.9', 'x-real-ip': '203.0.113.9' })).toBe(403)
  })

  it('a trusted-proxy list does not trust a forged hop before an untrusted one', async () => {
    fixture ??= await createFixture()
    // The client (10.9.9.9, not trusted) claims to be 203.0.113.9; only the trusted hop is skipped.
    const status = await statusOf(['127.0.0.1/32'], fixture.tokens.testNetOnly, { 'x-forwarded-for': '203.0.113.9, 10.9.9.9' })
    expect(status).toBe(403)
  })
})
