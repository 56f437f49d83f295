/**
 * A session whose response stays open (the GET stream a client holds for server messages) is
 * not idle: through every adapter, its pin outlives `sessionTtlMs` for as long as the stream
 * is open, so a request of the session an hour later still reaches the version it was pinned
 * to (spec 9.2.1: deploys during a connection do not affect it). Once the stream closes, the
 * idle TTL runs again. Found by a real-client audit: a browser client holding its GET stream
 * for over an hour got 404 `session_not_found` while the App still knew the session.
 *
 * Time: `Date` and `setInterval` are faked (the pins' clock and the dispatcher's keep-alive
 * timer); sockets run on real time.
 */
import { randomUUID } from 'node:crypto'
import * as http from 'node:http'
import { type Decision, type DispatchRequest, type SessionStore, createDispatcher, createMemorySessionStore } from 'mcp-dispatch'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { ADAPTER_KINDS, createFixture, mcpClientHeaders, serveWebHandler, serveWebWithoutOutgoing } from './helpers.js'

const HOUR = 3_600_000
const encoder = new TextEncoder()

/**
 * A stand-in MCP handler: a POST without a session opens one; a GET opens the session's
 * stream and keeps it open until `closeStreams()`; a POST in the session answers the version
 * it was dispatched to.
 */
function sessionHandler() {
  const streams = new Set<ReadableStreamDefaultController<Uint8Array>>()
  let lateArrived!: () => void
  const late = new Promise<void>((resolve) => (lateArrived = resolve))
  const handler = async (request: Request, context: { version: string; sessionId: string | undefined }) => {
    if (request.method === 'GET') {
      // `?late`: the head is written only once the client has gone (a slow handler).
      if (new URL(request.url).search === '?late') {
        const gone = new Promise((resolve) => request.signal.addEventListener('abort', resolve, { once: true }))
        lateArrived()
        await gone
      }
      let controller!: ReadableStreamDefaultController<Uint8Array>
      const body = new ReadableStream<Uint8Array>({
        start(c) {
          controller = c
          streams.add(c)
          c.enqueue(encoder.encode(': open\n\n'))
        },
        cancel() {
          streams.delete(controller)
        },
      })
      return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } })
    }
    await request.text()
    const headers: Record<string, string> = { 'content-type': 'application/json' }
    if (context.sessionId === undefined) headers['mcp-session-id'] = randomUUID()
    return new Response(JSON.stringify({ jsonrpc: '2.0', id: 1, result: { version: context.version } }), { status: 200, headers })
  }
  const closeStreams = () => {
    for (const c of streams) c.close()
    streams.clear()
  }
  return { handler, closeStreams, late }
}

function send(port: number, token: string, method: 'GET' | 'POST', sessionId?: string, path = '/') {
  return new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string; response: http.IncomingMessage }>(
    (resolve, reject) => {
      const request = http.request(
        {
          host: '127.0.0.1',
          port,
          method,
          path,
          headers: mcpClientHeaders(token, sessionId),
        },
        (response) => {
          if (method === 'GET' && response.statusCode === 200) {
            // A stream: answered once its head is here; the body stays open.
            resolve({ status: 200, headers: response.headers, body: '', response })
            return
          }
          let body = ''
          response.setEncoding('utf8')
          response.on('data', (chunk: string) => (body += chunk))
          response.on('end', () => resolve({ status: response.statusCode!, headers: response.headers, body, response }))
        },
      )
      request.on('error', reject)
      request.end(method === 'POST' ? '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' : undefined)
    },
  )
}

const VARIANTS = [...ADAPTER_KINDS, 'web (no outgoing)'] as const

/** The stand-in handler behind one variant, pins on the faked clock. */
async function serveVariant(variant: (typeof VARIANTS)[number]) {
  const fixture = createFixture({ sessions: createMemorySessionStore({ now: () => Date.now() }) })
  const { handler, closeStreams, late } = sessionHandler()
  const served =
    variant === 'web (no outgoing)' ? await serveWebWithoutOutgoing(fixture, handler) : await serveWebHandler(variant, fixture, handler)
  return { fixture, closeStreams, served, late }
}

beforeEach(() => {
  vi.useFakeTimers({ toFake: ['Date', 'setInterval', 'clearInterval'] })
})

/**
 * The keep-alive's timer stops at its first tick that finds no open response (once the server
 * has seen the stream end: up to 5 s on a loaded machine, not vi.waitFor's default 1 s).
 */
async function keepAliveStops() {
  await vi.waitFor(
    async () => {
      await vi.advanceTimersByTimeAsync(HOUR / 3)
      expect(vi.getTimerCount()).toBe(0)
    },
    { timeout: 5_000 },
  )
}

/** The session's pin is gone once the idle TTL has passed with nothing open. */
async function expectGoneAfterIdle(port: number, token: string, sessionId: string) {
  await vi.advanceTimersByTimeAsync(HOUR + 1)
  const gone = await send(port, token, 'POST', sessionId)
  expect(gone.status).toBe(404)
  expect(JSON.parse(gone.body).error.data).toEqual({ error: 'session_not_found' })
}
afterEach(() => {
  vi.useRealTimers()
})

describe('a session with an open stream keeps its pin past the idle TTL', () => {
  for (const variant of VARIANTS) {
    it(`${variant}: pinned for as long as the stream is open, idle TTL again once it closes`, async () => {
      const { fixture, closeStreams, served } = await serveVariant(variant)
      try {
        const token = fixture.tokens.alice
        const opened = await send(served.port, token, 'POST')
        expect(opened.status).toBe(200)
        const sessionId = opened.headers['mcp-session-id'] as string
        expect(JSON.parse(opened.body).result.version).toBe('2.0.0')
        const stream = await send(served.port, token, 'GET', sessionId)
        expect(stream.status).toBe(200)

        // A deploy, then three hours with the stream open and no request.
        fixture.apps.deploy('app_weather', '2.1.0')
        await vi.advanceTimersByTimeAsync(3 * HOUR)
        const later = await send(served.port, token, 'POST', sessionId)
        expect(later.status).toBe(200)
        expect(later.headers['x-mcp-version']).toBe('2.0.0')
        expect(JSON.parse(later.body).result.version).toBe('2.0.0')

        // The stream ends: the pin is idle from then on, and goes after the idle TTL.
        closeStreams()
        await new Promise<void>((resolve) => stream.response.on('end', resolve).resume())
        await keepAliveStops()
        await expectGoneAfterIdle(served.port, token, sessionId)
        expect(fixture.errors).toEqual([])
      } finally {
        closeStreams()
        await served.close()
      }
    })
  }
})

describe('a client that leaves its stream', () => {
  for (const variant of VARIANTS) {
    it(`${variant}: the keep-alive ends with the stream, and the pin goes after the idle TTL`, async () => {
      const { fixture, closeStreams, served } = await serveVariant(variant)
      try {
        const token = fixture.tokens.alice
        const opened = await send(served.port, token, 'POST')
        const sessionId = opened.headers['mcp-session-id'] as string
        const stream = await send(served.port, token, 'GET', sessionId)
        expect(vi.getTimerCount()).toBe(2) // the keep-alive, and the check of open responses (reauthorizeEveryMs)
        stream.response.destroy()
        await keepAliveStops()
        await expectGoneAfterIdle(served.port, token, sessionId)
      } finally {
        closeStreams()
        await served.close()
      }
    })

    it(`${variant}: a stream whose client left before its head keeps nothing`, async () => {
      const { fixture, closeStreams, served, late } = await serveVariant(variant)
      try {
        const token = fixture.tokens.alice
        const opened = await send(served.port, token, 'POST')
        const sessionId = opened.headers['mcp-session-id'] as string
        // The client gives up before the handler answers; the handler answers a stream anyway.
        const request = http.request({
          host: '127.0.0.1',
          port: served.port,
          method: 'GET',
          path: '/?late',
          headers: { host: 'weather.localhost', authorization: `Bearer ${token}`, accept: 'text/event-stream', 'mcp-session-id': sessionId },
        })
        request.on('error', () => {})
        request.end()
        await late
        request.destroy()
        await keepAliveStops()
        await expectGoneAfterIdle(served.port, token, sessionId)
      } finally {
        closeStreams()
        await served.close()
      }
    })
  }
})

describe('the Web adapter, a handler that answers a body it locked', () => {
  it('gets 502 and keeps no session open', async () => {
    const fixture = createFixture({ sessions: createMemorySessionStore({ now: () => Date.now() }) })
    const handler = async (request: Request) => {
      await request.text()
      const body = new ReadableStream<Uint8Array>({ start: (c) => c.enqueue(encoder.encode(': x\n\n')) })
      body.getReader() // locked: nobody can read it any more
      return new Response(body, { headers: { 'content-type': 'text/event-stream', 'mcp-session-id': randomUUID() } })
    }
    const served = await serveWebWithoutOutgoing(fixture, handler)
    try {
      const answer = await send(served.port, fixture.tokens.alice, 'POST')
      expect(answer.status).toBe(502)
      expect(fixture.errors.map((e) => e.context)).toEqual(['handler'])
      await keepAliveStops()
    } finally {
      await served.close()
    }
  })
})

describe('the keep-alive, in the dispatcher', () => {
  /** A response that ends when the test says (`end()`); `whenClosed` as an adapter gives it. */
  function response() {
    const listeners: Array<() => void> = []
    let ended = false
    return {
      whenClosed: (listener: () => void) => (ended ? listener() : void listeners.push(listener)),
      end() {
        ended = true
        for (const listener of listeners.splice(0)) listener()
      },
    }
  }

  function setup(wrap: (store: SessionStore) => SessionStore = (store) => store, options: { storeTimeoutMs?: number } = {}) {
    const fixture = createFixture()
    const store = createMemorySessionStore({ now: () => Date.now() })
    const calls = { get: 0 }
    const counted: SessionStore = {
      ...store,
      get: (id, ttl) => {
        calls.get++
        return store.get(id, ttl)
      },
    }
    const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, ...options, now: () => Date.now(), sessions: wrap(counted) })
    const request = (sessionId?: string, method = 'POST'): DispatchRequest => ({
      method,
      path: '/',
      host: 'weather.localhost',
      origin: 'http://weather.localhost',
      headers: new Headers({ authorization: `Bearer ${fixture.tokens.alice}`, ...(sessionId && { 'mcp-session-id': sessionId }) }),
      clientAddress: '127.0.0.1',
    })
    const decide = async (sessionId?: string, method?: string) => (await dispatcher.decide(request(sessionId, method))) as Decision
    const dispatched = async (sessionId?: string, method?: string) => {
      const decision = await decide(sessionId, method)
      if (decision.type !== 'dispatch') throw new Error(`not dispatched: ${decision.reply.status}`)
      return decision
    }
    /** Opens session `id`, and a GET stream of it that stays open until its `end()`. */
    const openWithStream = async (id: string) => {
      ;(await dispatched()).complete({ status: 200, sessionId: id })
      const stream = response()
      ;(await dispatched(id, 'GET')).complete({ status: 200, sessionId: undefined, whenClosed: stream.whenClosed })
      return stream
    }
    return { fixture, calls, decide, dispatched, openWithStream }
  }

  it('restarts the idle TTL when a long stream ends, so the pin lasts the TTL after it', async () => {
    const { decide, openWithStream } = setup()
    const stream = await openWithStream('s-1')
    // Open 50 minutes (restarts at 20 and 40), then ended: idle from the end.
    await vi.advanceTimersByTimeAsync(50 * 60_000)
    stream.end()
    await vi.advanceTimersByTimeAsync(59 * 60_000)
    expect(vi.getTimerCount()).toBe(0)
    expect((await decide('s-1')).type).toBe('dispatch')
    await vi.advanceTimersByTimeAsync(HOUR + 1)
    expect((await decide('s-1')).type).toBe('reply')
  })

  it('a head that comes late after the lookup (a long tool call) keeps the pin from the lookup: restarted at once past a third of the TTL, and at its end (from a race audit: the pin was lost)', async () => {
    const { calls, decide, dispatched, openWithStream } = setup()
    await openWithStream('s-other') // the keep-alive's timer runs: its ticks come every 20 minutes
    ;(await dispatched()).complete({ status: 200, sessionId: 's-late' })
    // Out of step with the ticks (at 20, 40, 60… minutes), so none restarts the pin in time by chance.
    await vi.advanceTimersByTimeAsync(15 * 60_000)
    // Looked up now; its answer's head comes 50 minutes later, and stays open.
    const late = await dispatched('s-late')
    await vi.advanceTimersByTimeAsync(50 * 60_000)
    const open = response()
    late.complete({ status: 200, sessionId: undefined, whenClosed: open.whenClosed })
    // 15 minutes on (65 after the lookup, a tick between): the pin is there, the stream open.
    // (Counted from the head, or with no restart at it, the pin went at 60.)
    await vi.advanceTimersByTimeAsync(15 * 60_000)
    expect((await decide('s-late')).type).toBe('dispatch')
    open.end()

    // JSON answers: head and end together, 50 or 15 minutes after the lookup, or 30 seconds
    // (within the slack, a minute: no store call, the pin kept from the lookup). The TTL runs
    // from the head, not from the lookup.
    for (const [id, minutes] of [['s-json', 50], ['s-soon-json', 15]] as const) {
      ;(await dispatched()).complete({ status: 200, sessionId: id })
      const looked = await dispatched(id)
      await vi.advanceTimersByTimeAsync(minutes * 60_000)
      const answered = response()
      looked.complete({ status: 200, sessionId: undefined, whenClosed: answered.whenClosed })
      answered.end()
      await vi.advanceTimersByTimeAsync(58 * 60_000)
      expect((await decide(id)).type, id).toBe('dispatch')
    }
    ;(await dispatched()).complete({ status: 200, sessionId: 's-quick' })
    const quick = await dispatched('s-quick')
    await vi.advanceTimersByTimeAsync(30_000)
    const before = calls.get
    const quickAnswered = response()
    quick.complete({ status: 200, sessionId: undefined, whenClosed: quickAnswered.whenClosed })
    quickAnswered.end()
    expect(calls.get).toBe(before)
  })

  it('a response that ends a minute or more after the pin was last kept restarts its TTL; one that ends sooner costs no store call', async () => {
    const { calls, openWithStream } = setup()
    const sooner = await openWithStream('s-soon')
    await vi.advanceTimersByTimeAsync(60_000 - 1)
    let before = calls.get
    sooner.end()
    expect(calls.get).toBe(before)
    const later = await openWithStream('s-later')
    await vi.advanceTimersByTimeAsync(60_000)
    before = calls.get
    later.end()
    expect(calls.get).toBe(before + 1)
  })

  it("an adapter that tells of a response's end twice ends it once: the session's other open response still keeps the pin", async () => {
    const { decide, dispatched, openWithStream } = setup()
    const long = await openWithStream('s-twice')
    const listeners: Array<() => void> = []
    ;(await dispatched('s-twice', 'GET')).complete({ status: 200, sessionId: undefined, whenClosed: (listener) => void listeners.push(listener) })
    for (const listener of listeners) {
      listener()
      listener()
    }
    await vi.advanceTimersByTimeAsync(2 * HOUR)
    expect((await decide('s-twice')).type).toBe('dispatch')
    long.end()
  })

  it('the answer that opens a session keeps its new pin while it stays open (an initialize answered as a long event stream)', async () => {
    const { decide, dispatched } = setup()
    const opening = response()
    await (await dispatched()).complete({ status: 200, sessionId: 's-init', whenClosed: opening.whenClosed })
    await vi.advanceTimersByTimeAsync(2 * HOUR)
    expect((await decide('s-init')).type).toBe('dispatch')
    opening.end()
  })

  it('keeps the pin while any response of the session is open; a short one costs no store call', async () => {
    const { calls, decide, dispatched, openWithStream } = setup()
    const long = await openWithStream('s-2')
    const before = calls.get
    const short = response()
    ;(await dispatched('s-2')).complete({ status: 200, sessionId: undefined, whenClosed: short.whenClosed })
    short.end()
    expect(calls.get).toBe(before + 1) // the request's own lookup, nothing at its end
    await vi.advanceTimersByTimeAsync(2 * HOUR)
    expect((await decide('s-2')).type).toBe('dispatch')
    long.end()
    await vi.advanceTimersByTimeAsync(HOUR / 3)
    expect(vi.getTimerCount()).toBe(0)
  })

  it('where timers end with their request (Workers), each open response keeps its pin with a timer of its own', async () => {
    // Workers' timers of a request never fire once it has ended: one timer for all, set by a
    // short response's request, would stop with it and leave a long stream's pin to expire.
    vi.stubGlobal('navigator', { userAgent: 'Cloudflare-Workers' })
    try {
      const { decide, dispatched, openWithStream } = setup()
      const long = await openWithStream('s-6')
      expect(vi.getTimerCount()).toBe(1)
      const short = response()
      ;(await dispatched('s-6')).complete({ status: 200, sessionId: undefined, whenClosed: short.whenClosed })
      expect(vi.getTimerCount()).toBe(2)
      short.end()
      expect(vi.getTimerCount()).toBe(1)
      await vi.advanceTimersByTimeAsync(2 * HOUR)
      expect((await decide('s-6')).type).toBe('dispatch')
      long.end()
      expect(vi.getTimerCount()).toBe(0)
    } finally {
      vi.unstubAllGlobals()
    }
  })

  it('where timers end with their request (Workers), a TTL restart lost with its request is sent again at the next tick, and the pin kept (regression: the session\'s other responses never restarted it)', async () => {
    // On Workers a restart sent from a request that then ends never settles: its timeout's timer
    // never fires. Here the store does not answer one restart, and its timeout is far away.
    vi.stubGlobal('navigator', { userAgent: 'Cloudflare-Workers' })
    try {
      let hangNext = false
      const { decide, calls, openWithStream } = setup(
        (store) => ({
          ...store,
          get: (id, ttl) => {
            if (!hangNext) return store.get(id, ttl)
            hangNext = false
            return new Promise<never>(() => {})
          },
        }),
        { storeTimeoutMs: 24 * HOUR },
      )
      const long = await openWithStream('s-7')
      const before = calls.get
      hangNext = true
      // The first restart (at a third of the hour-long TTL) is lost; the next ones must go out.
      await vi.advanceTimersByTimeAsync(2 * HOUR)
      expect(calls.get - before).toBeGreaterThan(2)
      expect((await decide('s-7')).type).toBe('dispatch')
      long.end()
    } finally {
      vi.unstubAllGlobals()
    }
  })

  it('where timers end with their request (Workers), the responses of a session send one restart at a time, and every failure of their timers is reported', async () => {
    vi.stubGlobal('navigator', { userAgent: 'Cloudflare-Workers' })
    try {
      let mode: 'fast' | 'slow' | 'failing' = 'fast'
      let restarts = 0
      // What a slow store has not answered yet: it answers when the test says so.
      const unanswered: Array<() => void> = []
      const { fixture, decide, dispatched, openWithStream } = setup((store) => ({
        ...store,
        get: (id, ttl) => {
          restarts++
          if (mode === 'failing') throw new Error('session store down')
          if (mode === 'fast') return store.get(id, ttl)
          return new Promise((resolve) => void unanswered.push(() => resolve(store.get(id, ttl))))
        },
      }))
      const first = await openWithStream('s-9')
      const second = response()
      ;(await dispatched('s-9', 'GET')).complete({ status: 200, sessionId: undefined, whenClosed: second.whenClosed })
      mode = 'slow'
      restarts = 0
      // Both responses' timers fire together: the second finds the first one's restart unanswered.
      await vi.advanceTimersByTimeAsync(HOUR / 3)
      expect(restarts).toBe(1)
      for (const answer of unanswered.splice(0)) answer()
      mode = 'failing'
      await vi.advanceTimersByTimeAsync(HOUR / 3)
      await vi.advanceTimersByTimeAsync(HOUR / 3)
      mode = 'fast'
      expect(fixture.errors.map((e) => e.context)).toEqual(Array(4).fill('session store (keeping the pins of open responses)'))
      expect((await decide('s-9')).type).toBe('dispatch')
      first.end()
      second.end()
    } finally {
      vi.unstubAllGlobals()
    }
  })

  it('a response already ended when it is reported keeps nothing', async () => {
    const { decide, dispatched } = setup()
    ;(await dispatched()).complete({ status: 200, sessionId: 's-4' })
    const gone = response()
    gone.end()
    ;(await dispatched('s-4', 'GET')).complete({ status: 200, sessionId: undefined, whenClosed: gone.whenClosed })
    await vi.advanceTimersByTimeAsync(HOUR + 1)
    expect((await decide('s-4')).type).toBe('reply')
    expect(vi.getTimerCount()).toBe(0)
  })

  it('a restart that fails is retried at the next tick, in time; one report per tick', async () => {
    let failing = 0
    const { fixture, decide, openWithStream } = setup((store) => ({
      ...store,
      get: (id, ttl) => {
        if (failing > 0) {
          failing--
          throw new Error('session store down')
        }
        return store.get(id, ttl)
      },
    }))
    const stream = await openWithStream('s-5')
    await openWithStream('s-6')
    failing = 2 // the first tick: both restarts fail
    await vi.advanceTimersByTimeAsync(2 * HOUR)
    expect((await decide('s-5')).type).toBe('dispatch')
    expect(fixture.errors.map((e) => e.context)).toEqual(['session store (keeping the pins of open responses)'])
    stream.end()
  })

  it('a store that answers with its own thenable (a lazy query) is kept alive too', async () => {
    let queries = 0
    const { decide, openWithStream } = setup((store) => ({
      ...store,
      get: (id, ttl) => {
        // Runs only when someone calls `then`, like a query builder.
        const lazy = { then: (resolve: (pin: unknown) => unknown) => (queries++, resolve(store.get(id, ttl))) }
        return lazy as unknown as ReturnType<SessionStore['get']>
      },
    }))
    const stream = await openWithStream('s-7')
    const before = queries
    await vi.advanceTimersByTimeAsync(2 * HOUR)
    expect(queries).toBeGreaterThan(before)
    expect((await decide('s-7')).type).toBe('dispatch')
    stream.end()
  })

  it('a restart at the end of a response that fails is reported, even right after a failed tick', async () => {
    let failing = false
    const { fixture, openWithStream } = setup((store) => ({
      ...store,
      get: (id, ttl) => {
        if (failing) throw new Error('session store down')
        return store.get(id, ttl)
      },
    }))
    const stream = await openWithStream('s-8')
    failing = true
    await vi.advanceTimersByTimeAsync(HOUR / 3)
    stream.end()
    expect(fixture.errors.map((e) => e.context)).toEqual([
      'session store (keeping the pins of open responses)',
      'session store (keeping the pin of a response that ended)',
    ])
  })

  it('a DELETE or a refused request keeps nothing; a session ended while its stream is open stays ended', async () => {
    const { decide, dispatched, openWithStream } = setup()
    const stream = await openWithStream('s-3')
    ;(await dispatched('s-3', 'DELETE')).complete({ status: 200, sessionId: undefined, whenClosed: response().whenClosed })
    await vi.advanceTimersByTimeAsync(HOUR)
    expect((await decide('s-3')).type).toBe('reply')
    stream.end()
    await vi.advanceTimersByTimeAsync(HOUR / 3)
    expect(vi.getTimerCount()).toBe(0)
  })

  it('a pin found gone at a tick is kept no more: no store call for it at the next ticks, and the timer stops, though its stream is still open', async () => {
    const { calls, dispatched, openWithStream } = setup()
    const stream = await openWithStream('s-gone')
    ;(await dispatched('s-gone', 'DELETE')).complete({ status: 200, sessionId: undefined })
    const before = calls.get
    await vi.advanceTimersByTimeAsync(HOUR / 3)
    expect(calls.get).toBe(before + 1)
    await vi.advanceTimersByTimeAsync(HOUR)
    expect(calls.get).toBe(before + 1)
    expect(vi.getTimerCount()).toBe(0)
    stream.end()
  })
})
