/**
 * A client that leaves (its connection reset) while the dispatch layer waits on any one of its
 * stores: the App store, the token store, the subscription store, the rate-limit store, the
 * session store (step 6's lookup, a new session's pin). Each store call is held until the test
 * lets it go, and the client resets while the k-th one waits, for every k, on the Web adapter
 * (@hono/node-server) and on Express and Fastify (fromWebHandler). Afterwards nothing is
 * reported, no stream is left open for nobody, the dispatcher's intervals (session keep-alive,
 * credential re-checks) stop at their next tick without a store call, and the same request
 * sent again is served.
 */
import { connect } from 'node:net'
import {
  type AccessTokenValidator,
  type AppRecord,
  type Dispatcher,
  type RateLimitStore,
  type SessionStore,
  createDispatcher,
  createMemoryAppStore,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createOAuthValidator,
  createTokenService,
  displayPrefix,
  generateApiToken,
  hashApiToken,
} from 'mcp-dispatch'
import type { WebMcpHandler } from 'mcp-dispatch/web'
import { afterEach, describe, expect, it } from 'vitest'
import { type Fixture, HOST, serveWebHandler, serveWebWithoutOutgoing } from './helpers.js'

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const cleanups: Array<() => Promise<unknown> | void> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

/** Store calls held until let go while `armed`; each call's name is recorded. */
function gates() {
  const waiting: Array<{ name: string; go: () => void }> = []
  const calls: string[] = []
  let armed = false
  const gate = <A extends unknown[], R>(name: string, call: (...args: A) => R) =>
    (async (...args: A) => {
      calls.push(name)
      if (armed) await new Promise<void>((go) => waiting.push({ name, go }))
      return call(...args)
    }) as unknown as (...args: A) => R
  return { gate, waiting, calls, arm: (on: boolean) => void (armed = on) }
}

/** Interval timers the test fires itself: `live` those not cleared. */
function manualTimers() {
  const live = new Map<number, () => void>()
  let next = 1
  return {
    live,
    setInterval: (callback: () => void) => {
      const handle = next++
      live.set(handle, callback)
      return handle
    },
    clearInterval: (handle: unknown) => void live.delete(handle as number),
    tickAll: () => {
      for (const callback of [...live.values()]) callback()
    },
  }
}

const SESSION = 'a'.repeat(32)

function fixture(oauth?: AccessTokenValidator) {
  const g = gates()
  const timers = manualTimers()
  const innerApps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '2.0.0'] }])
  const apps = {
    ...innerApps,
    getAppBySlug: g.gate('apps.getAppBySlug', innerApps.getAppBySlug),
    getLiveVersions: g.gate('apps.getLiveVersions', innerApps.getLiveVersions),
  }
  const innerSubscriptions = createMemorySubscriptionStore([
    { userId: 'alice', appId: 'app_weather', active: true },
    { userId: 'user_alice', appId: 'app_weather', active: true },
  ])
  const ended = { subscription: false }
  const subscriptions = { isActive: g.gate('subscriptions.isActive', (userId: string, appId: string) => !ended.subscription && innerSubscriptions.isActive(userId, appId)) }
  const innerTokens = createMemoryTokenStore()
  const secret = generateApiToken()
  void innerTokens.insert({
    id: crypto.randomUUID(),
    userId: 'alice',
    name: 'CI',
    tokenHash: hashApiToken(secret),
    displayPrefix: displayPrefix(secret),
    servers: ['app_weather'],
    allowedIps: null,
    expiresAt: Date.now() + 86_400_000,
    createdAt: Date.now(),
    lastUsedAt: null,
    revokedAt: null,
  })
  const errors: Array<{ error: unknown; context: string }> = []
  const onError = (error: unknown, context: string) => void errors.push({ error, context })
  const tokenStore = { ...innerTokens, findByHash: g.gate('tokens.findByHash', innerTokens.findByHash) }
  const tokens = createTokenService({ store: tokenStore, apps: innerApps, subscriptions: innerSubscriptions, onError })
  const innerLimits = createMemoryRateLimitStore()
  const limits: RateLimitStore = { increment: g.gate('rateLimit.increment', innerLimits.increment.bind(innerLimits)) }
  const innerSessions = createMemorySessionStore()
  void innerSessions.set(SESSION, { appId: 'app_weather', version: '2.0.0', subject: 'alice' }, 3_600_000)
  const sessions: SessionStore = {
    get: g.gate('sessions.get', innerSessions.get.bind(innerSessions)),
    set: g.gate('sessions.set', innerSessions.set.bind(innerSessions)),
    delete: g.gate('sessions.delete', innerSessions.delete.bind(innerSessions)),
  }
  const dispatcher: Dispatcher = createDispatcher({
    apps,
    subscriptions,
    tokens,
    sessions,
    rateLimit: { policy: (_identity, _app: AppRecord) => ({ limit: 1000, windowType: 'minute' }), store: limits },
    timers,
    onError,
    ...(oauth && { oauth }),
  })
  cleanups.push(() => tokens.close())
  return { g, timers, dispatcher, errors, onError, secret, innerSessions, ended }
}

/** The MCP handler: a GET stream open until its client goes, a POST that opens a session. */
function mcpHandler() {
  let open = 0
  let served = 0
  const handler: WebMcpHandler = (request) => {
    served++
    if (request.method === 'DELETE') return new Response(null, { status: 200 })
    if (request.method === 'POST' && request.headers.get('x-stream') === null) {
      return new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json', 'mcp-session-id': crypto.randomUUID().replaceAll('-', '') } })
    }
    let counted = true
    open++
    const stop = () => {
      if (counted) open--
      counted = false
    }
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new TextEncoder().encode(': open\n\n'))
      },
      cancel: stop,
    })
    request.signal.addEventListener('abort', stop)
    if (request.signal.aborted) stop()
    const sessionId = request.method === 'POST' ? crypto.randomUUID().replaceAll('-', '') : SESSION
    return new Response(body, { headers: { 'content-type': 'text/event-stream', 'mcp-session-id': sessionId } })
  }
  return { handler, open: () => open, served: () => served }
}

/** `web relayed`: the Web adapter without Node's response (Bun, Deno, Workers), its body relayed. */
type Kind = 'web' | 'web relayed' | 'express' | 'fastify'
const KINDS: readonly Kind[] = ['web', 'web relayed', 'express', 'fastify']

/** The dispatch layer of `kind` in front of `handler`, over `f`'s dispatcher. */
function serveKind(kind: Kind, f: { dispatcher: Dispatcher; onError: (error: unknown, context: string) => void; errors: unknown[] }, handler: WebMcpHandler) {
  const fixture = { dispatcher: f.dispatcher, onError: f.onError, errors: f.errors } as unknown as Fixture
  return kind === 'web relayed' ? serveWebWithoutOutgoing(fixture, handler) : serveWebHandler(kind, fixture, handler)
}

const REQUESTS = {
  'a GET stream of a session': (secret: string) =>
    `GET /v2 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${secret}\r\nAccept: text/event-stream\r\nMcp-Session-Id: ${SESSION}\r\n\r\n`,
  'a POST that opens a session': (secret: string) =>
    `POST /v2 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${secret}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`,
  'a POST answered with a stream that opens a session': (secret: string) =>
    `POST /v2 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${secret}\r\nAccept: application/json, text/event-stream\r\nX-Stream: 1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`,
} as const

/** Sends `raw`; resolves with what came back once `until` is in it (or the connection ended). */
function send(port: number, raw: string, until: string, leaveWhen?: () => boolean) {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => {})
  socket.write(raw)
  let text = ''
  socket.on('data', (chunk: Buffer) => (text += chunk.toString('latin1')))
  const answered = new Promise<string>((resolve) => {
    socket.on('data', () => text.includes(until) && resolve(text))
    socket.on('close', () => resolve(text))
  })
  return { socket, answered, leaveWhen }
}

/**
 * Lets every held call go until nothing more is asked for `quietTurns` turns of the event loop in
 * a row (5 ms each at least); answers how many were held. Counted in turns, not in time: after a
 * stall of a loaded host's event loop past 150 ms, the wait's timer came before the socket
 * events the stall had held back, and it ended with a call still to be asked, held for ever
 * after (the request sent again shared its lookup: 503, or on Fastify's long keep-alive a test
 * timed out).
 */
async function drain(g: ReturnType<typeof gates>, quietTurns = 30): Promise<number> {
  let held = 0
  for (let quiet = 0; quiet < quietTurns; ) {
    const next = g.waiting.shift()
    if (next === undefined) {
      await sleep(5)
      quiet++
      continue
    }
    held++
    next.go()
    quiet = 0
  }
  return held
}

/**
 * Lets the held store calls go one by one; the client resets its connection while the k-th
 * waits (the server sees the reset before that call answers). Answers how many calls it saw and
 * whether it reset (a request that makes fewer calls is answered first).
 */
async function resetWhileKthWaits(g: ReturnType<typeof gates>, client: ReturnType<typeof send>, k: number): Promise<{ seen: number; left: boolean }> {
  let seen = 0
  let left = false
  for (const deadline = Date.now() + 5_000; Date.now() < deadline; ) {
    const next = g.waiting.shift()
    if (next === undefined) {
      if (seen > k) break
      if (await Promise.race([client.answered.then(() => true), sleep(5).then(() => false)])) break
      continue
    }
    if (seen++ === k) {
      client.socket.resetAndDestroy()
      left = true
      await sleep(30)
    }
    next.go()
  }
  return { seen, left }
}

async function leaveAt(kind: Kind, what: keyof typeof REQUESTS, k: number): Promise<{ held: number; left: boolean }> {
  const f = fixture()
  const mcp = mcpHandler()
  const served = await serveKind(kind, f, mcp.handler)
  cleanups.push(() => served.close())
  f.g.arm(true)
  const client = send(served.port, REQUESTS[what](f.secret), what === 'a POST that opens a session' ? '"result"' : ': open')
  const { seen, left } = await resetWhileKthWaits(f.g, client, k)
  await drain(f.g)
  await client.answered
  if (!left) client.socket.destroy()
  await sleep(50)
  // No stream left open for nobody.
  expect(mcp.open(), `${kind}, k=${k}: open streams`).toBe(0)
  // The intervals stop at their next tick, asking no store.
  f.g.arm(false)
  const callsBefore = f.g.calls.length
  f.timers.tickAll()
  await sleep(20)
  f.timers.tickAll()
  await sleep(20)
  expect(f.timers.live.size, `${kind}, k=${k}: intervals left running`).toBe(0)
  expect(f.g.calls.slice(callsBefore), `${kind}, k=${k}: store calls for a client gone`).toEqual([])
  expect(f.errors, `${kind}, k=${k}: reported`).toEqual([])
  // The same request again is served.
  const again = send(served.port, REQUESTS[what](f.secret), what === 'a POST that opens a session' ? '"result"' : ': open')
  const text = await again.answered
  expect(text, `${kind}, k=${k}: the request sent again`).toMatch(/^HTTP\/1\.1 200 /)
  again.socket.destroy()
  await sleep(50)
  expect(mcp.open(), `${kind}, k=${k}: open streams after the retry`).toBe(0)
  f.timers.tickAll()
  f.timers.tickAll()
  expect(f.timers.live.size).toBe(0)
  expect(f.errors, `${kind}, k=${k}: reported`).toEqual([])
  return { held: seen, left }
}

describe('a client that leaves while the dispatch layer waits on any one store call', () => {
  for (const kind of KINDS) {
    for (const what of Object.keys(REQUESTS) as Array<keyof typeof REQUESTS>) {
      it(`${kind}: ${what}`, async () => {
        // Every k until the request completes with no call left to leave at.
        let k = 0
        for (;;) {
          const { left } = await leaveAt(kind, what, k)
          if (!left) break
          for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
          k++
        }
        expect(k).toBeGreaterThanOrEqual(5)
      })
    }
  }
})

describe('a client that leaves while the re-check of its open stream waits on a store', () => {
  for (const kind of KINDS) {
    it(`${kind}: the verdict that comes after (the subscription ended) closes nothing that throws, reports nothing, and stops the interval`, async () => {
      const f = fixture()
      const mcp = mcpHandler()
      const served = await serveKind(kind, f, mcp.handler)
      cleanups.push(() => served.close())
      const client = send(served.port, REQUESTS['a GET stream of a session'](f.secret), ': open')
      expect(await client.answered).toMatch(/^HTTP\/1\.1 200 /)
      expect(mcp.open()).toBe(1)
      // The re-check (and the keep-alive) sent, each held.
      f.g.arm(true)
      f.timers.tickAll()
      // Its token lookup answered; its subscription lookup held.
      while (!f.g.waiting.some((w) => w.name === 'subscriptions.isActive')) {
        await sleep(5)
        const i = f.g.waiting.findIndex((w) => w.name === 'tokens.findByHash')
        if (i !== -1) f.g.waiting.splice(i, 1)[0]!.go()
      }
      client.socket.resetAndDestroy()
      await sleep(30)
      f.ended.subscription = true
      await drain(f.g)
      expect(mcp.open()).toBe(0)
      f.g.arm(false)
      const callsBefore = f.g.calls.length
      f.timers.tickAll()
      f.timers.tickAll()
      await sleep(20)
      expect(f.timers.live.size).toBe(0)
      expect(f.g.calls.slice(callsBefore)).toEqual([])
      expect(f.errors).toEqual([])
    })
  }
})

describe('a client that leaves its DELETE of a session at any store call', () => {
  const request = (secret: string) => `DELETE /v2 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${secret}\r\nMcp-Session-Id: ${SESSION}\r\n\r\n`
  for (const kind of KINDS) {
    it(`${kind}: the pin ends when the handler ended the session, and stays when it did not; nothing reported`, async () => {
      for (let k = 0; ; k++) {
        const f = fixture()
        const mcp = mcpHandler()
        const served = await serveKind(kind, f, mcp.handler)
        cleanups.push(() => served.close())
        f.g.arm(true)
        const client = send(served.port, request(f.secret), '\r\n\r\n')
        const { left } = await resetWhileKthWaits(f.g, client, k)
        await drain(f.g)
        await client.answered
        client.socket.destroy()
        await sleep(30)
        const pin = await f.innerSessions.get(SESSION, 3_600_000)
        expect(pin === undefined, `${kind}, k=${k}: pin ended (served ${mcp.served()})`).toBe(mcp.served() > 0)
        expect(f.errors, `${kind}, k=${k}`).toEqual([])
        f.g.arm(false)
        f.timers.tickAll()
        f.timers.tickAll()
        expect(f.timers.live.size).toBe(0)
        for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
        if (!left) break
      }
    })
  }
})

describe('an OAuth validation shared by requests whose clients leave (single flight)', () => {
  const ISSUER = 'https://auth.example.com'
  /** An authorization server whose every answer waits for the test; `asked` lists the paths. */
  function upstream() {
    const g = gates()
    g.arm(true)
    const asked: string[] = []
    const answer = g.gate('fetch', (url: string) => {
      if (url.endsWith('/.well-known/openid-configuration')) return Response.json({ issuer: ISSUER, userinfo_endpoint: `${ISSUER}/userinfo` })
      if (url.endsWith('/userinfo')) return Response.json({ sub: 'user_alice' })
      return new Response('not found', { status: 404 })
    })
    const fetch = ((input: string | URL | Request) => {
      const url = String(input instanceof Request ? input.url : input)
      asked.push(new URL(url).pathname)
      return answer(url)
    }) as unknown as typeof globalThis.fetch
    return { g, fetch, asked }
  }
  const request = `POST /v2 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer opaque-access-token\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`

  for (const kind of KINDS) {
    for (const leaving of ['one of two', 'both'] as const) {
      it(`${kind}: ${leaving} leave while it waits on discovery, then on userinfo: the call goes on, once, and its answer serves the one left and the next`, async () => {
        for (const stage of ['openid-configuration', 'userinfo']) {
          const server = upstream()
          const f = fixture(createOAuthValidator({ issuer: ISSUER, fetch: server.fetch, retry: { attempts: 1 } }))
          const mcp = mcpHandler()
          const served = await serveKind(kind, f, mcp.handler)
          cleanups.push(() => served.close())
          const a = send(served.port, request, '"result"')
          const b = send(served.port, request, '"result"')
          // Let the discovery through when the userinfo call is the one to leave at.
          for (;;) {
            await sleep(5)
            const next = server.g.waiting[0]
            if (next === undefined) continue
            if (server.asked.at(-1)!.endsWith(stage)) break
            server.g.waiting.shift()!.go()
          }
          a.socket.resetAndDestroy()
          if (leaving === 'both') b.socket.resetAndDestroy()
          await sleep(30)
          await drain(server.g)
          const kept = await (leaving === 'both' ? Promise.resolve('') : b.answered)
          if (leaving === 'one of two') expect(kept, `${kind}, ${stage}`).toMatch(/^HTTP\/1\.1 200 /)
          await a.answered
          b.socket.destroy()
          // One discovery and one userinfo call, whoever left; the next request is served from the cache.
          expect(server.asked).toEqual(['/.well-known/openid-configuration', '/userinfo'])
          const c = send(served.port, request, '"result"')
          expect(await c.answered).toMatch(/^HTTP\/1\.1 200 /)
          c.socket.destroy()
          expect(server.asked).toEqual(['/.well-known/openid-configuration', '/userinfo'])
          expect(f.errors).toEqual([])
          for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
        }
      })
    }
  }
})
