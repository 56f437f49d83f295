/**
 * Fault injection: stores that throw, reject or hang, a handler that throws, a client that
 * goes away in the middle of an SSE stream, an authorization server that is down, slow or
 * failing. Each gets the status the design promises, through every adapter, and leaves no
 * timer or socket behind (the last test checks the handles of this process).
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { serve } from '@hono/node-server'
import { AuthorizationServerUnavailableError, type AccessTokenResult, type AccessTokenValidator, TooManyValidationsError, createOAuthValidator } from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest'
import { createPlatform } from '../../examples/platform/index.js'
import { startFakeUpstream } from '../oauth/helpers/fake-upstream.js'
import {
  type AdapterTarget,
  type Fixture,
  type RunningTarget,
  type StoreName,
  HOSTNAME,
  TOOLS_LIST,
  activeResources,
  adapterTargets,
  createFixture,
  jsonRpcError,
  leakedHandles,
  mcpHeaders,
  send,
  settles,
} from './support.js'

const targets = await adapterTargets()
const baseline = activeResources()

/** A deferred promise, resolved by the test. */
function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void
  const promise = new Promise<T>((r) => (resolve = r))
  return { promise, resolve }
}

function expectUnavailable(response: { status: number; headers: http.IncomingHttpHeaders; body: Buffer }) {
  expect(response.status).toBe(503)
  expect(response.headers['x-mcp-version']).toBeUndefined()
  expect(response.headers['retry-after']).toMatch(/^\d+$/)
  const error = jsonRpcError(response.body)
  expect(error).toMatchObject({ code: -32005, data: { error: 'temporarily_unavailable' } })
  return error!
}

describe.each(targets.map((t) => [t.name, t] as const))('faults through the %s adapter', (_name, target: AdapterTarget) => {
  let fixture: Fixture
  let running: RunningTarget

  beforeAll(async () => {
    // Hung stores give up after 100 ms here (default 5 s; the in-memory tests below check that).
    fixture = await createFixture({ faults: true, dispatcher: { storeTimeoutMs: 100 } })
    running = await target.start({ dispatcher: fixture.dispatcher, onError: fixture.onError })
  })
  afterEach(() => {
    for (const name of Object.keys(fixture.faults.modes) as StoreName[]) fixture.faults.modes[name] = 'ok'
    fixture.faults.release()
    fixture.errors.length = 0
  })
  afterAll(async () => {
    await running?.close()
    await fixture?.close()
  })

  const post = (extra: Record<string, string> = {}, token = fixture.tokens.valid) =>
    send(running.port, { method: 'POST', path: '/v1', headers: mcpHeaders(running.port, token, extra), body: TOOLS_LIST })

  const storeFaults: Array<[StoreName, 'throw' | 'reject' | 'hang', string]> = [
    ['apps', 'throw', 'apps failed'],
    ['apps', 'reject', 'apps failed'],
    ['apps', 'hang', 'apps failed'],
    ['tokens', 'throw', 'token failed'],
    ['tokens', 'reject', 'token failed'],
    ['tokens', 'hang', 'token failed'],
    ['subscriptions', 'throw', 'subscriptions failed'],
    ['subscriptions', 'reject', 'subscriptions failed'],
    ['subscriptions', 'hang', 'subscriptions failed'],
    ['sessions', 'throw', 'sessions failed'],
    ['sessions', 'reject', 'sessions failed'],
    ['sessions', 'hang', 'sessions failed'],
  ]

  it.each(storeFaults)('a %s store that fails by "%s" gives 503, never a silent allow, and then recovers', async (store, fault, context) => {
    fixture.faults.modes[store] = fault
    // The session store is read only for requests of a session.
    const response = await post(store === 'sessions' ? { 'mcp-session-id': 'session-1' } : {})
    expectUnavailable(response)
    expect(fixture.errors.map((e) => e.context)).toContain(context)
    expect(response.headers['x-robustness-handler']).toBeUndefined()

    fixture.faults.modes[store] = 'ok'
    fixture.faults.release() // late answers of the hung calls go nowhere
    const healthy = await post()
    expect(healthy.status).toBe(200)
    expect(healthy.headers['x-mcp-version']).toBe('1.2.3')
  })

  it.each(['throw', 'reject', 'hang'] as const)('a rate-limit store that fails by "%s" serves (fail open) and reports it', async (fault) => {
    fixture.faults.modes.rateLimit = fault
    const response = await post()
    expect(response.status).toBe(200)
    expect(response.headers['x-mcp-version']).toBe('1.2.3')
    expect(response.headers.ratelimit).toBeUndefined()
    expect(fixture.errors.map((e) => e.context)).toEqual(['rate-limit store failed; serving (failOpen)'])
  })

  it('a handler that throws gives 502 with a JSON-RPC body and no detail, reported to onError', async () => {
    const response = await post({ 'x-robustness-throw': '1' })
    expect(response.status).toBe(502)
    expect(jsonRpcError(response.body)).toEqual({ code: -32603, message: 'App handler failed', data: { error: 'handler_error' } })
    expect(response.body.toString()).not.toContain('injected')
    expect(fixture.errors.map((e) => e.context)).toEqual(['handler'])
    expect((await post()).status).toBe(200)
  })

  it('a client that goes away mid-stream closes the stream and its socket; the server keeps serving', async () => {
    const before = running.state.streamsClosed
    const { status, version, firstEvent } = await new Promise<{ status?: number; version: unknown; firstEvent: string }>((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port: running.port,
          method: 'POST',
          path: '/v1',
          agent: false,
          headers: mcpHeaders(running.port, fixture.tokens.valid, { 'x-robustness-sse': '1' }),
        },
        (res) => {
          res.on('error', () => {}) // "aborted": we are the ones going away
          res.once('data', (chunk: Buffer) => {
            resolve({ status: res.statusCode, version: res.headers['x-mcp-version'], firstEvent: chunk.toString() })
            req.destroy() // the client disappears without reading further
          })
        },
      )
      req.on('error', (error) => (error.message === 'socket hang up' ? undefined : reject(error)))
      req.end(TOOLS_LIST)
    })
    expect([status, version]).toEqual([200, '1.2.3'])
    expect(firstEvent).toMatch(/^data: 0/)
    expect(await settles(() => running.state.streamsClosed === before + 1 && running.state.streamsOpen === 0)).toBe(true)
    expect(await settles(async () => (await running.connections()) === 0)).toBe(true)
    const next = await post()
    expect(next.status).toBe(200)
  })

  it('an authorization server that is down gives 503 with Retry-After; a rejected token 401', async () => {
    const oauth: AccessTokenValidator = {
      async validate(token) {
        if (token === 'down') throw new AuthorizationServerUnavailableError(30)
        return { active: false, reason: 'inactive' }
      },
    }
    const local = await createFixture({ oauth })
    const server = await target.start({ dispatcher: local.dispatcher, onError: local.onError })
    try {
      const down = await send(server.port, { method: 'POST', path: '/v1', headers: mcpHeaders(server.port, 'down'), body: TOOLS_LIST })
      const error = expectUnavailable(down)
      expect(down.headers['retry-after']).toBe('30')
      expect(error).toEqual({
        code: -32005,
        message: 'Authorization server unavailable',
        data: { error: 'temporarily_unavailable', retryAfter: 30 },
      })
      const rejected = await send(server.port, { method: 'POST', path: '/v1', headers: mcpHeaders(server.port, 'nope'), body: TOOLS_LIST })
      expect(rejected.status).toBe(401)
      expect(rejected.headers['www-authenticate']).toContain('error="invalid_token"')
    } finally {
      await server.close()
      await local.close()
    }
  })
})

describe.each(targets.map((t) => [t.name, t] as const))('an authorization server on loopback through the %s adapter (real timers, real sockets)', (_name, target: AdapterTarget) => {
  it('answering 500, hanging, or down: 503 with Retry-After each time, never 500 or a silent allow; served once it answers again; nothing left behind (checked at the end of the file)', async () => {
    const server = await startFakeUpstream()
    const oauth = createOAuthValidator({
      issuer: server.url,
      userinfoEndpoint: `${server.url}/userinfo`,
      // A deadline that outlasts the connection and each attempt's arrival (counted below) on a
      // loaded machine, and a budget that holds both attempts at it.
      timeoutMs: 500,
      retry: { attempts: 2, baseDelayMs: 5, deadlineMs: 5_000 },
      // Every fault here is met by the retries, not by a breaker already open.
      breaker: { failureThreshold: 100 },
      rejectionTtlMs: 0,
    })
    const local = await createFixture({ oauth })
    const running = await target.start({ dispatcher: local.dispatcher, onError: local.onError })
    const call = (token: string) => send(running.port, { method: 'POST', path: '/v1', headers: mcpHeaders(running.port, token), body: TOOLS_LIST })
    try {
      server.route('/userinfo', { status: 500 })
      expectUnavailable(await call('token-500'))
      expect(server.count('/userinfo')).toBe(2) // retried once

      server.route('/userinfo', 'hang')
      expectUnavailable(await call('token-slow'))
      expect(server.count('/userinfo')).toBe(4)
      // The validator gave up on its requests: none is still held open upstream.
      expect(await settles(() => server.hanging === 0)).toBe(true)

      await server.stop()
      expectUnavailable(await call('token-down'))
      await server.start()

      server.route('/userinfo', (request) =>
        request.headers.authorization === 'Bearer token-good' ? { status: 200, body: { sub: 'alice' } } : { status: 401 },
      )
      const served = await call('token-good')
      expect(served.status).toBe(200)
      expect(served.headers['x-mcp-version']).toBe('1.2.3')
      const refused = await call('token-bad')
      expect(refused.status).toBe(401)
      expect(refused.headers['www-authenticate']).toContain('error="invalid_token"')
    } finally {
      await running.close()
      await local.close()
      await server.close()
    }
  })
})

describe('faults in memory (Web adapter, fake timers: no waiting)', () => {
  const request = (token: string, extra: Record<string, string> = {}) =>
    new Request(`http://${HOSTNAME}/v1`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${token}`, ...extra },
      body: TOOLS_LIST,
    })
  const info = { clientAddress: '127.0.0.1' }
  const ok = async () => new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json' } })

  afterEach(() => {
    vi.useRealTimers()
  })

  it('a hung store gives 503 after the default 5 s, and a store that answers clears its timer', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] })
    const fixture = await createFixture({ faults: true })
    const handle = mcpDispatch({ dispatcher: fixture.dispatcher, handler: ok })
    fixture.faults.modes.subscriptions = 'hang'
    let settled = false
    const pending = handle(request(fixture.tokens.valid), info).finally(() => (settled = true))
    await vi.advanceTimersByTimeAsync(4_999)
    expect(settled).toBe(false)
    await vi.advanceTimersByTimeAsync(1)
    const response = await pending
    expect(response.status).toBe(503)
    expect(fixture.errors.map((e) => [e.context, (e.error as Error).message])).toEqual([
      ['subscriptions failed', 'subscriptions did not answer within 5000 ms'],
    ])
    // A store that answers, late or on time, leaves no timer running.
    fixture.faults.release()
    fixture.faults.modes.subscriptions = 'reject'
    await handle(request(fixture.tokens.valid), info)
    fixture.faults.modes.subscriptions = 'ok'
    expect((await handle(request(fixture.tokens.valid), info)).status).toBe(200)
    // The one timer left is the token service's coalesced last_used_at write; it goes with it.
    expect(vi.getTimerCount()).toBe(1)
    await fixture.tokenService.flush()
    expect(vi.getTimerCount()).toBe(0)
    await fixture.close()
  })

  it('a hung session store delays the answer that opens a session by the timeout at most: the store\'s 503 goes instead (the session could not be pinned), and is reported', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] })
    const fixture = await createFixture({ faults: true, dispatcher: { storeTimeoutMs: 1_000 } })
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: async () => new Response('{}', { headers: { 'content-type': 'application/json', 'mcp-session-id': 'session-new' } }),
    })
    fixture.faults.modes.sessions = 'hang'
    const pending = handle(request(fixture.tokens.valid), info)
    await vi.advanceTimersByTimeAsync(1_000)
    const response = await pending
    expect(response.status).toBe(503)
    expect(response.headers.get('retry-after')).toBe('1')
    expect(response.headers.get('mcp-session-id')).toBeNull()
    expect(response.headers.get('x-mcp-version')).toBeNull()
    expect(((await response.json()) as { error: { data: unknown } }).error.data).toMatchObject({ error: 'temporarily_unavailable' })
    expect(fixture.errors.map((e) => e.context)).toEqual(['session store'])
    fixture.faults.release()
    await fixture.close()
  })

  it('a handler that throws synchronously or rejects gives 502', async () => {
    const fixture = await createFixture()
    for (const handler of [
      () => {
        throw new Error('sync')
      },
      () => Promise.reject(new Error('async')),
    ]) {
      const handle = mcpDispatch({ dispatcher: fixture.dispatcher, handler, onError: fixture.onError })
      const response = await handle(request(fixture.tokens.valid), info)
      expect(response.status).toBe(502)
      // The gateway's answer names the version it tried, as on Express and Fastify.
      expect(response.headers.get('x-mcp-version')).toBe('1.2.3')
    }
    expect(fixture.errors.map((e) => e.context)).toEqual(['handler', 'handler'])
    await fixture.close()
  })

  it('an authorization server that is slow holds the request until it answers (up to 30 s for a validator of the platform\'s own)', async () => {
    const calls: Array<{ resolve: (value: AccessTokenResult) => void }> = []
    const oauth: AccessTokenValidator = {
      validate() {
        const d = deferred<AccessTokenResult>()
        calls.push(d)
        return d.promise
      },
    }
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] })
    const fixture = await createFixture({ oauth })
    const handle = mcpDispatch({ dispatcher: fixture.dispatcher, handler: ok })
    let settled = false
    // The dispatcher waits for a validator of the platform's own up to 30 s (then 503, below).
    const slow = handle(request('oauth-access-token'), info).finally(() => (settled = true))
    await vi.advanceTimersByTimeAsync(8_000)
    expect(settled).toBe(false)
    calls[0]!.resolve({ active: true, info: { subject: 'alice' } })
    const served = await slow
    expect(served.status).toBe(200)
    expect(served.headers.get('x-mcp-version')).toBe('1.2.3')
    expect(vi.getTimerCount()).toBe(0)
    await fixture.close()
  })

  it('a validator that fails unexpectedly (a bug, not an outage) gives 503, never 500 or a silent allow', async () => {
    const oauth: AccessTokenValidator = {
      async validate() {
        throw new TypeError('validator bug')
      },
    }
    const fixture = await createFixture({ oauth })
    const handle = mcpDispatch({ dispatcher: fixture.dispatcher, handler: ok })
    const response = await handle(request('oauth-access-token'), info)
    expect(response.status).toBe(503)
    expect(await response.json()).toMatchObject({ error: { code: -32005, message: 'Service unavailable' } })
    await fixture.close()
  })

  it('a validator of the platform\'s own that never settles gives 503 after 30 s, reported; it does not hold the request for ever', async () => {
    const oauth: AccessTokenValidator = { validate: () => new Promise<AccessTokenResult>(() => {}) }
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] })
    const fixture = await createFixture({ oauth })
    const handle = mcpDispatch({ dispatcher: fixture.dispatcher, handler: ok })
    let settled = false
    const pending = handle(request('oauth-access-token'), info).finally(() => (settled = true))
    await vi.advanceTimersByTimeAsync(29_999)
    expect(settled).toBe(false)
    await vi.advanceTimersByTimeAsync(1)
    const response = await pending
    expect(response.status).toBe(503)
    expect(response.headers.get('retry-after')).toBe('1')
    expect(response.headers.get('x-mcp-version')).toBeNull()
    expect(fixture.errors.map((e) => [e.context, (e.error as Error).message])).toEqual([
      ['oauth failed', 'the OAuth validator did not answer within 30000 ms'],
    ])
    expect(vi.getTimerCount()).toBe(0)
    await fixture.close()
  })

  it('a retryAfter of a validator of the platform\'s own that is no whole number of seconds goes out as one, at least 1 (503 and 429)', async () => {
    const cases: Array<[number | undefined, string]> = [[Number.NaN, '1'], [undefined, '1'], [0, '1'], [-3, '1'], [0.5, '1'], [2.2, '3'], [Infinity, '1'], [30, '30']]
    /** The answer to an OAuth request whose validator (of the platform's own) throws `error`. */
    const answerWhenThrown = async (error: Error) => {
      const fixture = await createFixture({
        oauth: {
          async validate() {
            throw error
          },
        },
      })
      const response = await mcpDispatch({ dispatcher: fixture.dispatcher, handler: ok })(request('oauth-access-token'), info)
      await fixture.close()
      return { status: response.status, headers: response.headers, body: await response.json() }
    }
    for (const [given, sent] of cases) {
      const unavailable = await answerWhenThrown(new AuthorizationServerUnavailableError(given as number))
      expect(unavailable.status, String(given)).toBe(503)
      expect(unavailable.headers.get('retry-after'), String(given)).toBe(sent)
      expect(unavailable.body, String(given)).toMatchObject({ error: { code: -32005, data: { retryAfter: Number(sent) } } })
      // Its 429 (a client budget of its own), in the body and both headers.
      const spent = await answerWhenThrown(
        new TooManyValidationsError({ limit: 60, resetAt: 1_800_000_000, retryAfter: given as number, windowType: 'minute' }),
      )
      expect(spent.status, String(given)).toBe(429)
      expect(spent.headers.get('retry-after'), String(given)).toBe(sent)
      expect(spent.headers.get('ratelimit'), String(given)).toBe(`"unverified";r=0;t=${sent}`)
      expect(spent.body, String(given)).toMatchObject({ error: { code: -32000, data: { retryAfter: Number(sent) } } })
    }
  })
})

describe('a client that drops the MCP SDK GET stream (reference platform over loopback)', () => {
  it('can open the stream again at once: the server released the first one', async () => {
    const platform = createPlatform({
      seed: {
        apps: [{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }],
        users: [{ id: 'alice' }],
        subscriptions: [{ userId: 'alice', appId: 'app_weather', active: true }],
        tokens: [{ name: 'alice', userId: 'alice', servers: ['app_weather'], expiresInDays: 30 }],
      },
      onError: () => {},
    })
    const server = await new Promise<http.Server>((resolve) => {
      const s: http.Server = serve(
        {
          port: 0,
          hostname: '127.0.0.1',
          fetch: (req: Request, env: { incoming?: { socket?: { remoteAddress?: string } } }) =>
            platform.fetch(req, { clientAddress: env.incoming?.socket?.remoteAddress }),
        },
        () => resolve(s),
      ) as http.Server
    })
    const port = (server.address() as AddressInfo).port
    const headers = {
      host: `weather.localhost:${port}`,
      authorization: `Bearer ${platform.tokens.alice}`,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': '2025-06-18',
    }
    try {
      const init = await send(port, {
        method: 'POST',
        path: '/v1',
        headers,
        body: JSON.stringify({
          jsonrpc: '2.0',
          id: 0,
          method: 'initialize',
          params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'robustness', version: '0' } },
        }),
      })
      expect(init.status).toBe(200)
      const sessionId = String(init.headers['mcp-session-id'])
      const sessionHeaders = { ...headers, 'mcp-session-id': sessionId }
      await send(port, { method: 'POST', path: '/v1', headers: sessionHeaders, body: '{"jsonrpc":"2.0","method":"notifications/initialized"}' })

      const openStream = () =>
        new Promise<number>((resolve, reject) => {
          const req = http.request({ host: '127.0.0.1', port, method: 'GET', path: '/v1', agent: false, headers: sessionHeaders }, (res) => {
            resolve(res.statusCode ?? 0)
            res.on('error', () => {})
            res.resume()
            setImmediate(() => req.destroy()) // gone, as a client that crashes
          })
          req.on('error', (error) => (error.message === 'socket hang up' ? undefined : reject(error)))
          req.end()
        })
      expect(await openStream()).toBe(200)
      // The SDK allows one GET stream per session (409 otherwise): a second one at once shows
      // the first was torn down when its client went away.
      let second = 0
      expect(await settles(async () => (second = await openStream()) === 200, 50)).toBe(true)
      expect(second).toBe(200)
      const del = await send(port, { method: 'DELETE', path: '/v1', headers: sessionHeaders })
      expect(del.status).toBe(200)
    } finally {
      server.closeAllConnections()
      await new Promise<void>((resolve) => server.close(() => resolve()))
      await platform.close()
    }
  })
})

describe('nothing leaks', () => {
  it('leaves no socket, server or timer of its own behind', async () => {
    expect(await leakedHandles(baseline)).toEqual({})
  })
})
