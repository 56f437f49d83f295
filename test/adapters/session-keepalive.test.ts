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
import { EventEmitter } from 'node:events'
import * as http from 'node:http'
import { type Decision, type DispatchRequest, createDispatcher, createMemorySessionStore } from 'mcp-dispatch'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { serveFetch } from '../helpers/platform.js'
import { ADAPTER_KINDS, type Fixture, type Served, createFixture, serveWebHandler } from './helpers.js'

const HOUR = 3_600_000
const encoder = new TextEncoder()

/**
 * A stand-in MCP handler: a POST without a session opens one; a GET opens the session's
 * stream and keeps it open until `closeStreams()`; a POST in the session answers the version
 * it was dispatched to.
 */
function sessionHandler() {
  const streams = new Set<ReadableStreamDefaultController<Uint8Array>>()
  const handler = async (request: Request, context: { version: string; sessionId: string | undefined }) => {
    if (request.method === 'GET') {
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
  return { handler, closeStreams }
}

function send(port: number, token: string, method: 'GET' | 'POST', sessionId?: string) {
  return new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string; response: http.IncomingMessage }>(
    (resolve, reject) => {
      const request = http.request(
        {
          host: '127.0.0.1',
          port,
          method,
          path: '/',
          headers: {
            host: 'weather.localhost',
            authorization: `Bearer ${token}`,
            accept: 'application/json, text/event-stream',
            'content-type': 'application/json',
            ...(sessionId && { 'mcp-session-id': sessionId }),
          },
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

/** The Web adapter on a runtime without Node's response (`outgoing` not given): the body is relayed. */
async function serveWebWithoutOutgoing(fixture: Fixture, handler: Parameters<typeof webDispatch>[0]['handler']): Promise<Served> {
  const dispatch = webDispatch({ dispatcher: fixture.dispatcher, handler, onError: (error, context) => fixture.errors.push({ error, context }) })
  const served = await serveFetch((request, info) => dispatch(request, { clientAddress: info.clientAddress }))
  return { port: served.port, close: served.close }
}

const VARIANTS = [...ADAPTER_KINDS, 'web (no outgoing)'] as const

/** The stand-in handler behind one variant, pins on the faked clock. */
async function serveVariant(variant: (typeof VARIANTS)[number]) {
  const fixture = createFixture({ sessions: createMemorySessionStore({ now: () => Date.now() }) })
  const { handler, closeStreams } = sessionHandler()
  const served =
    variant === 'web (no outgoing)' ? await serveWebWithoutOutgoing(fixture, handler) : await serveWebHandler(variant, fixture, handler)
  return { fixture, closeStreams, served }
}

beforeEach(() => {
  vi.useFakeTimers({ toFake: ['Date', 'setInterval', 'clearInterval'] })
})
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
        await vi.waitFor(() => expect(vi.getTimerCount()).toBe(0))
        await vi.advanceTimersByTimeAsync(HOUR - 60_000)
        expect((await send(served.port, token, 'POST', sessionId)).status).toBe(200)
        await vi.advanceTimersByTimeAsync(HOUR + 1)
        const gone = await send(served.port, token, 'POST', sessionId)
        expect(gone.status).toBe(404)
        expect(JSON.parse(gone.body).error.data).toEqual({ error: 'session_not_found' })
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
    it(`${variant}: the keep-alive ends with the stream`, async () => {
      const { fixture, closeStreams, served } = await serveVariant(variant)
      try {
        const opened = await send(served.port, fixture.tokens.alice, 'POST')
        const stream = await send(served.port, fixture.tokens.alice, 'GET', opened.headers['mcp-session-id'] as string)
        expect(vi.getTimerCount()).toBe(1)
        stream.response.destroy()
        await vi.waitFor(() => expect(vi.getTimerCount()).toBe(0))
      } finally {
        closeStreams()
        await served.close()
      }
    })
  }
})

describe('the keep-alive, in the dispatcher', () => {
  function setup() {
    const fixture = createFixture()
    const dispatcher = createDispatcher({
      ...fixture.dispatcherOptions,
      now: () => Date.now(),
      sessions: createMemorySessionStore({ now: () => Date.now() }),
    })
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
    /** Opens session `id`, and a GET stream of it that stays open until its `close`. */
    const openWithStream = async (id: string) => {
      ;(await dispatched()).complete({ status: 200, sessionId: id })
      const stream = new EventEmitter()
      ;(await dispatched(id, 'GET')).complete({ status: 200, sessionId: undefined, response: stream })
      return stream
    }
    return { fixture, decide, dispatched, openWithStream }
  }

  it('restarts the idle TTL when a long stream closes, so the pin lasts the TTL after it', async () => {
    const { decide, openWithStream } = setup()
    const stream = await openWithStream('s-1')
    // Open 50 minutes (one restart at 30), then closed: idle from the close.
    await vi.advanceTimersByTimeAsync(50 * 60_000)
    stream.emit('close')
    stream.emit('close') // a second close changes nothing
    expect(vi.getTimerCount()).toBe(0)
    await vi.advanceTimersByTimeAsync(59 * 60_000)
    expect((await decide('s-1')).type).toBe('dispatch')
  })

  it('keeps the pin while any of several responses of the session is open; a short one costs no store call', async () => {
    const { decide, dispatched, openWithStream } = setup()
    const long = await openWithStream('s-2')
    const short = new EventEmitter()
    ;(await dispatched('s-2')).complete({ status: 200, sessionId: undefined, response: short })
    short.emit('close')
    expect(vi.getTimerCount()).toBe(1)
    await vi.advanceTimersByTimeAsync(2 * HOUR)
    expect((await decide('s-2')).type).toBe('dispatch')
    long.emit('close')
    expect(vi.getTimerCount()).toBe(0)
  })

  it('a DELETE or a refused request keeps nothing; a session ended while its stream is open stays ended', async () => {
    const { decide, dispatched, openWithStream } = setup()
    const stream = await openWithStream('s-3')
    ;(await dispatched('s-3', 'DELETE')).complete({ status: 200, sessionId: undefined, response: new EventEmitter() })
    await vi.advanceTimersByTimeAsync(HOUR)
    const after = await decide('s-3')
    expect(after.type).toBe('reply')
    stream.emit('close')
    expect(vi.getTimerCount()).toBe(0)
  })
})
