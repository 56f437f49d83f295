/**
 * reauthorizeEveryMs: the cases an audit of the open-response checks found (each failed before its fix).
 * Timers of the checks are injected (`timers`), so each tick is fired by hand.
 */
import {
  type DispatcherOptions,
  type DispatcherTimers,
  type SessionStore,
  createDispatcher,
  createMemoryAppStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import express from 'express'
import * as http from 'node:http'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { manualTimers } from '../helpers/manual-timers.js'
import { close, listen } from './helpers.js'
import { openWith } from './open-response.js'

const encoder = new TextEncoder()
const turn = () => new Promise<void>((resolve) => setImmediate(resolve))

/** A handler's event stream: one message written, then open; of session `sessionId` if given. */
function streamAnswer(data: string, sessionId?: string): Response {
  return new Response(new ReadableStream({ start: (c) => c.enqueue(encoder.encode(`event: message\ndata: ${data}\n\n`)) }), {
    status: 200,
    headers: { 'content-type': 'text/event-stream', ...(sessionId && { 'mcp-session-id': sessionId }) },
  })
}

/** A client's POST of `method` with `token`, answerable as JSON or an event stream. */
function post(token: string, method: string, params: object = {}): Request {
  return new Request('http://weather.example.com/', {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
  })
}

async function setup(subscriptionsOverride?: (base: ReturnType<typeof createMemorySubscriptionStore>) => DispatcherOptions['subscriptions']) {
  const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const subs = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
  const store = createMemoryTokenStore()
  const errors: Array<{ error: unknown; context: string }> = []
  const onError = (error: unknown, context: string) => void errors.push({ error, context })
  const tokens = createTokenService({ store, apps, subscriptions: subs, onError })
  const first = await tokens.create({ userId: 'alice', name: 'laptop', servers: ['app_weather'], expiresInDays: 7 })
  let lookups = 0
  const findByHash = store.findByHash.bind(store)
  let hangNext = false
  store.findByHash = (hash: string) => {
    lookups++
    if (hangNext) {
      hangNext = false
      // A read that never answers: on Workers, I/O (and the timeout's timer) of a request that
      // has ended never settles.
      return new Promise(() => {}) as never
    }
    return findByHash(hash)
  }
  const m = manualTimers({ tickMs: 60_000 })
  const options: DispatcherOptions = {
    apps,
    subscriptions: subscriptionsOverride ? subscriptionsOverride(subs) : subs,
    tokens,
    onError,
    timers: m.timers,
    // The dispatcher's clock moves with the injected timers: a tick is one re-check period.
    now: m.now,
    reauthorizeEveryMs: 60_000,
  }
  return {
    options,
    subs,
    tokens,
    first,
    errors,
    m,
    lookups: () => lookups,
    resetLookups: () => void (lookups = 0),
    hangNextLookup: () => void (hangNext = true),
  }
}

/**
 * A scheduler that answers no handle (`undefined`): `clearInterval` cannot tell which interval
 * to stop, so every interval it was given keeps being called by `fire`, which then lets
 * promises settle. The stores answer at once and the clock stands still: a stopped interval
 * that still worked would send a second check (or read) in the same tick, not find the first
 * pending.
 */
function unstoppableTimers() {
  const callbacks: Array<() => void> = []
  const cleared: unknown[] = []
  const timers: DispatcherTimers = {
    setInterval: (callback) => void callbacks.push(callback),
    clearInterval: (handle) => void cleared.push(handle),
  }
  const fire = async () => {
    for (const callback of callbacks) callback()
    for (let i = 0; i < 5; i++) await turn()
  }
  return { timers, callbacks, cleared, fire }
}

/** `sessions`, counting its reads (a keep-alive restarts a pin's idle TTL with one). */
function countingReads(sessions: SessionStore) {
  let reads = 0
  const store: SessionStore = {
    get: (id, ttlMs) => (reads++, sessions.get(id, ttlMs)),
    set: (id, pin, ttlMs) => sessions.set(id, pin, ttlMs),
    delete: (id) => sessions.delete(id),
  }
  return { store, reads: () => reads, resetReads: () => void (reads = 0) }
}

/** The token lookups and pin reads of one firing of every interval `fire` holds. */
async function countsOfATick(s: { resetLookups(): void; lookups(): number }, sessions: ReturnType<typeof countingReads>, fire: () => Promise<void>) {
  s.resetLookups()
  sessions.resetReads()
  await fire()
  return { lookups: s.lookups(), reads: sessions.reads() }
}

function pinned(ids: string[]): SessionStore {
  const sessions = createMemorySessionStore()
  for (const id of ids) sessions.set(id, { appId: 'app_weather', version: '1.0.0', subject: 'alice' }, 3_600_000)
  return sessions
}

/** On Workers (a timer per response): two session streams `a` and `b` opened with one token, one group. */
async function twoStreamsOnWorkers() {
  vi.stubGlobal('navigator', { userAgent: 'Cloudflare-Workers' })
  const s = await setup()
  const dispatcher = createDispatcher({ ...s.options, sessions: pinned(['s-1', 's-2']), sessionTtlMs: 100 * 86_400_000 })
  return { s, a: await openWith(dispatcher, s.first.token, 's-1'), b: await openWith(dispatcher, s.first.token, 's-2') }
}

afterEach(() => {
  vi.unstubAllGlobals()
  vi.useRealTimers()
})

describe('the open-response checks (reauthorizeEveryMs), audited', () => {
  it('Web adapter: a new session whose pin could not be stored (the 503) leaves no check behind', async () => {
    const s = await setup()
    // An asynchronous store that is down (Redis): the new session's answer becomes a 503.
    const down: SessionStore = {
      get: async () => undefined,
      set: async () => {
        throw new Error('store down')
      },
      delete: async () => {},
    }
    const dispatcher = createDispatcher({ ...s.options, sessions: down })
    const handle = webDispatch({
      dispatcher,
      handler: async () => streamAnswer('{}', 'sess-1'),
    })
    const response = await handle(post(s.first.token, 'initialize'), { clientAddress: '203.0.113.7' })
    expect(response.status).toBe(503)
    s.resetLookups()
    for (let i = 0; i < 3; i++) await s.m.tick()
    // No response is open: nothing is checked, and the check's timer has stopped.
    expect(s.lookups()).toBe(0)
    expect(s.m.active.size).toBe(0)
  })

  it('custom timers whose handle is undefined (clearInterval cannot stop them): one interval per kind while responses are open, and those stopped do nothing more; one token check and one pin read per tick', async () => {
    const s = await setup()
    const { timers, callbacks, cleared, fire } = unstoppableTimers()
    const sessions = countingReads(pinned(['s-1', 's-2', 's-3']))
    const dispatcher = createDispatcher({ ...s.options, timers, sessions: sessions.store })
    const a = await openWith(dispatcher, s.first.token, 's-1')
    const b = await openWith(dispatcher, s.first.token, 's-2')
    // The sessions' keep-alive and the credential checks: two intervals, not one per response.
    expect(callbacks).toHaveLength(2)
    expect(await countsOfATick(s, sessions, fire)).toEqual({ lookups: 1, reads: 2 })
    a.end()
    b.end()
    await fire()
    // Nothing open: each interval stopped itself.
    expect(cleared).toEqual([undefined, undefined])
    const c = await openWith(dispatcher, s.first.token, 's-3')
    expect(callbacks).toHaveLength(4)
    // The stopped intervals, still called, do nothing: c's token is looked up, and its pin
    // read, once a tick.
    expect(await countsOfATick(s, sessions, fire)).toEqual({ lookups: 1, reads: 1 })
    await s.tokens.revoke('alice', s.first.id)
    await fire()
    expect(c.closedBy()).toBe('dispatcher')
  })

  it('Workers, custom timers whose handle is undefined: the timers of a response that has ended do nothing more when called', async () => {
    vi.stubGlobal('navigator', { userAgent: 'Cloudflare-Workers' })
    const s = await setup()
    const { timers, callbacks, fire } = unstoppableTimers()
    const sessions = countingReads(pinned(['s-1', 's-2']))
    // A keep-alive every 20 ms of a clock that stands still: no restart is skipped as recent.
    const dispatcher = createDispatcher({ ...s.options, timers, sessions: sessions.store, sessionTtlMs: 60 })
    const a = await openWith(dispatcher, s.first.token, 's-1')
    const b = await openWith(dispatcher, s.first.token, 's-2')
    // Each response's keep-alive and credential check.
    expect(callbacks).toHaveLength(4)
    a.end()
    // b's own check and pin read only (a's timers, still called, are stopped).
    expect(await countsOfATick(s, sessions, fire)).toEqual({ lookups: 1, reads: 1 })
    b.end()
  })

  it('Workers: a check lost with the request that sent it is never retried; the other response of its group is never checked again', async () => {
    const { s, a, b } = await twoStreamsOnWorkers()
    // a's timer fires first; its check's lookup is lost when a's request ends.
    s.hangNextLookup()
    await s.m.tick()
    a.end()
    await s.tokens.revoke('alice', s.first.id)
    for (let i = 0; i < 5; i++) await s.m.tick()
    // Five intervals after the revocation, b is still open.
    expect(b.closedBy()).toBe('dispatcher')
  })

  it('Workers: the responses of a group, each with a timer of its own, send one check at a time, not one each; each failure is reported', async () => {
    const { s, a, b } = await twoStreamsOnWorkers()
    // A timer of one response is not the timer for all: every failure of it is reported, not the
    // first only.
    const authenticate = s.tokens.authenticate
    s.tokens.authenticate = () => {
      throw new Error('token store down')
    }
    const failures = () => s.errors.filter((e) => e.context === 're-checking the credential of open responses').length
    await s.m.tick()
    expect(failures()).toBe(2)
    await s.m.tick()
    expect(failures()).toBe(4)
    s.tokens.authenticate = authenticate
    s.resetLookups()
    // Both timers fire in the same interval: the second finds the first one's check unanswered.
    s.hangNextLookup()
    await s.m.tick()
    expect(s.lookups()).toBe(1)
    expect([a.closedBy(), b.closedBy()]).toEqual([undefined, undefined])
    a.end()
    b.end()
  })

  it('a verdict read before a newer stream was authorized does not end that stream', async () => {
    let holdNext = false
    let release: (() => void) | undefined
    const s = await setup((subs) => ({
      isActive(userId: string, appId: string) {
        const answer = subs.isActive(userId, appId)
        if (!holdNext) return answer
        holdNext = false
        // The store read now, its answer arriving a moment later.
        return new Promise<boolean>((resolve) => (release = () => resolve(answer as boolean)))
      },
    }))
    const dispatcher = createDispatcher({ ...s.options, sessions: pinned(['s-1', 's-2']) })
    const a = await openWith(dispatcher, s.first.token, 's-1')
    // The subscription lapses; the check reads that (slowly).
    s.subs.setActive('alice', 'app_weather', false)
    holdNext = true
    await s.m.tick()
    expect(release).toBeDefined()
    // The user renews; a new stream is opened and authorized (subscription active).
    s.subs.setActive('alice', 'app_weather', true)
    const b = await openWith(dispatcher, s.first.token, 's-2')
    release!()
    for (let i = 0; i < 5; i++) await turn()
    expect(a.closedBy()).toBe('dispatcher') // lapsed when read: fine
    expect(b.closedBy()).toBeUndefined() // authorized after that read, with an active subscription
  })

  it('Node: close() of a session response with a Content-Length body leaves the client waiting for bytes that never come (not a complete answer)', async () => {
    const s = await setup()
    const dispatcher = createDispatcher({ ...s.options, sessions: pinned(['s-1']) })
    const app = express()
    app.use(expressDispatch({ dispatcher }))
    // A long answer of a known length (a proxied App's large tool result, relayed chunk by chunk).
    app.use((_req, res) => {
      const start = '{"jsonrpc":"2.0","id":1,"result":{"text":"'
      const rest = '"}}'
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(start.length + 50 + rest.length) })
      res.write(start)
      // The rest comes 300 ms later.
      setTimeout(() => res.end('a'.repeat(50) + rest), 300)
    })
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const outcome = await new Promise<string>((resolve, reject) => {
        const request = http.request(
          {
            host: '127.0.0.1',
            port,
            method: 'POST',
            path: '/',
            headers: { host: 'weather.localhost', authorization: `Bearer ${s.first.token}`, 'mcp-session-id': 's-1', 'content-type': 'application/json' },
          },
          (response) => {
            response.on('data', () => {})
            response.on('end', () => resolve('ended'))
            response.on('aborted', () => resolve('aborted'))
            response.on('error', () => resolve('error'))
            void (async () => {
              await s.tokens.revoke('alice', s.first.id)
              await s.m.tick()
              // Whatever the dispatcher does (let the answer finish, or cut it), the client must
              // not be left waiting on a connection the server takes for done.
              setTimeout(() => resolve('still waiting'), 1_500)
            })()
          },
        )
        request.on('error', reject)
        request.end('{"jsonrpc":"2.0","id":1,"method":"tools/call"}')
      })
      expect(outcome).not.toBe('still waiting')
    } finally {
      await close(server)
    }
  })

  it('a long tool call answered as an event stream outside a session (a stateless App) is never checked again', async () => {
    const s = await setup()
    const dispatcher = createDispatcher({ ...s.options })
    const handle = webDispatch({
      dispatcher,
      // A stateless MCP server (no Mcp-Session-Id): a tool call whose answer streams progress.
      handler: async () => streamAnswer('{"progress":1}'),
    })
    const response = await handle(post(s.first.token, 'tools/call', { name: 'long' }), { clientAddress: '203.0.113.7' })
    expect(response.status).toBe(200)
    const reader = response.body!.getReader()
    await reader.read()
    await s.tokens.revoke('alice', s.first.id)
    for (let i = 0; i < 3; i++) await s.m.tick()
    const next = await Promise.race([reader.read().then((r) => (r.done ? 'ended' : 'chunk')), new Promise((r) => setTimeout(() => r('still open'), 500))])
    expect(next).toBe('ended')
  })

  it('Web adapter: a check that fails while a new session\'s pin is still being stored ends the stream once it goes out', async () => {
    const s = await setup()
    // An asynchronous session store (Redis) whose write of the new pin is slow.
    const memory = createMemorySessionStore()
    let store: (() => void) | undefined
    const slow: SessionStore = {
      get: async (id, ttl) => memory.get(id, ttl),
      set: (id, pin, ttl) =>
        new Promise<void>((resolve) => {
          store = () => {
            memory.set(id, pin, ttl)
            resolve()
          }
        }),
      delete: async (id) => memory.delete(id),
    }
    const dispatcher = createDispatcher({ ...s.options, sessions: slow })
    const handle = webDispatch({
      dispatcher,
      handler: async () => streamAnswer('{}', 'sess-1'),
    })
    const answered = handle(post(s.first.token, 'initialize'), { clientAddress: '203.0.113.7' })
    for (let i = 0; i < 5; i++) await turn()
    expect(store).toBeDefined()
    // The token is revoked, and the check reads so, before the pin is stored.
    await s.tokens.revoke('alice', s.first.id)
    await s.m.tick()
    store!()
    const response = await answered
    expect(response.status).toBe(200)
    const reader = response.body!.getReader()
    const read = async () => {
      const next = await Promise.race([reader.read(), new Promise<'still open'>((r) => setTimeout(() => r('still open'), 500))])
      return next === 'still open' ? next : next.done ? 'ended' : 'chunk'
    }
    // What the handler had written may go out; then the stream ends.
    let next = await read()
    if (next === 'chunk') next = await read()
    expect(next).toBe('ended')
  })
})
