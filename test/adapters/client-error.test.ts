/**
 * `answerClientError`: what Node's HTTP parser refuses before any handler runs gets Node's own
 * status with a JSON-RPC error body, on each adapter's server as docs/adapters.md wires it
 * (`server.on('clientError', …)` for Express and `@hono/node-server`, Fastify's
 * `clientErrorHandler` option), written byte for byte on raw sockets.
 */
import { EventEmitter } from 'node:events'
import * as http from 'node:http'
import { type AddressInfo, connect } from 'node:net'
import { getRequestListener } from '@hono/node-server'
import Fastify from 'fastify'
import { answerClientError as expressAnswer, answerExpectationFailed as expressExpect, mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { answerClientError as fastifyAnswer, answerExpectationFailed as fastifyExpect, mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import { answerClientError, answerExpectationFailed, mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { EXPRESS } from '../helpers/express.js'
import { type Fixture, type Gate, HOST, close, createFixture, createGate, listen } from './helpers.js'

const BAD_REQUEST = { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Malformed HTTP request', data: { error: 'invalid_request' } } }
const TOO_LARGE = {
  jsonrpc: '2.0',
  id: null,
  error: { code: -32600, message: 'Request header fields too large', data: { error: 'invalid_request', field: 'headers' } },
}
const TIMEOUT = { jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Request timeout', data: { error: 'request_timeout' } } }
const EXPECTATION_FAILED = {
  jsonrpc: '2.0',
  id: null,
  error: { code: -32600, message: 'Expectation failed', data: { error: 'invalid_request', field: 'expect' } },
}

/**
 * Writes `data` on a new connection to `port`, piece by piece: a string is written, a number is
 * a pause of that many milliseconds, `{ seen }` waits until what came back holds `seen`, a
 * function is called.
 * Resolves with what came back once the connection closed, or after `timeoutMs`.
 */
function exchange(port: number, data: Array<string | number | { seen: string } | (() => void)>, timeoutMs = 3_000): Promise<{ raw: string; closed: boolean }> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1')
    let raw = ''
    let closed = false
    const done = () => {
      clearTimeout(timer)
      socket.destroy()
      resolve({ raw, closed })
    }
    const timer = setTimeout(done, timeoutMs)
    socket.on('data', (chunk: Buffer) => (raw += chunk.toString('latin1')))
    socket.on('error', () => {})
    socket.on('close', () => {
      closed = true
      done()
    })
    void (async () => {
      for (const piece of data) {
        if (typeof piece === 'function') piece()
        else if (typeof piece === 'number') await new Promise((r) => setTimeout(r, piece))
        else if (typeof piece === 'object') while (!raw.includes(piece.seen) && !socket.destroyed) await new Promise((r) => setTimeout(r, 5))
        else if (!socket.destroyed) socket.write(piece)
      }
    })()
  })
}

/** The status, headers (lower case) and JSON body of the one answer in `raw`. */
function answer(raw: string): { status: number; headers: Record<string, string>; body: unknown } {
  const end = raw.indexOf('\r\n\r\n')
  const [statusLine, ...lines] = raw.slice(0, end).split('\r\n')
  const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]))
  const body = raw.slice(end + 4)
  expect(Number(headers['content-length'])).toBe(Buffer.byteLength(body))
  return { status: Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine!)?.[1]), headers, body: JSON.parse(body) }
}

interface Target {
  port: number
  close(): Promise<void>
}

// Each server times a head out after 300 ms, checked every 50 ms, so the 408 comes quickly.
const TIMEOUTS = { headersTimeout: 300, requestTimeout: 600, connectionsCheckingInterval: 50 }

// Each route starts its answer at once and ends it when `streaming` opens: a response in flight.
const targets: Record<'web' | 'express' | 'express4' | 'fastify', (fixture: Fixture, streaming: Gate) => Promise<Target>> = {
  async web(fixture, streaming) {
    // As examples/platform/server.ts serves it: @hono/node-server's listener on a Node server.
    const handle = webDispatch({
      dispatcher: fixture.dispatcher,
      handler: () =>
        new Response(
          new ReadableStream({
            start(controller) {
              controller.enqueue(new TextEncoder().encode('data: one\n\n'))
              void streaming.wait().then(() => {
                try {
                  controller.close()
                } catch {
                  // Cancelled by now where the connection was closed under it.
                }
              })
            },
          }),
          { headers: { 'content-type': 'text/event-stream' } },
        ),
    })
    const listener = getRequestListener(
      (request, env: { incoming?: { socket?: { remoteAddress?: string } }; outgoing?: unknown }) =>
        handle(request, { clientAddress: env.incoming?.socket?.remoteAddress, outgoing: env.outgoing }),
      { hostname: '127.0.0.1' },
    )
    const server = http.createServer(TIMEOUTS, listener)
    server.on('clientError', answerClientError)
    server.on('checkExpectation', answerExpectationFailed)
    return { port: await listen(server), close: () => close(server) }
  },
  express: (fixture, streaming) => serveExpress('express', fixture, streaming),
  express4: (fixture, streaming) => serveExpress('express4', fixture, streaming),
  async fastify(fixture, streaming) {
    const app = Fastify({ forceCloseConnections: true, clientErrorHandler: fastifyAnswer, http: TIMEOUTS })
    app.server.on('checkExpectation', fastifyExpect)
    await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
    app.post('/*', async (_request, reply) => {
      reply.hijack()
      reply.raw.writeHead(200, { 'content-type': 'text/event-stream' })
      reply.raw.write('data: one\n\n')
      await streaming.wait()
      reply.raw.end()
    })
    await app.listen({ port: 0, host: '127.0.0.1' })
    return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
  },
}

async function serveExpress(kind: 'express' | 'express4', fixture: Fixture, streaming: Gate): Promise<Target> {
  const app = EXPRESS[kind]()
  app.disable('x-powered-by')
  app.use(expressDispatch({ dispatcher: fixture.dispatcher }))
  app.post('/v1', (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: one\n\n')
    void streaming.wait().then(() => res.end())
  })
  const server = http.createServer(TIMEOUTS, app)
  server.on('clientError', expressAnswer)
  server.on('checkExpectation', expressExpect)
  return { port: await listen(server), close: () => close(server) }
}

for (const [name, start] of Object.entries(targets)) {
  describe(`answerClientError on ${name}`, () => {
    let fixture: Fixture
    let target: Target
    const streaming = createGate()
    beforeAll(async () => {
      fixture = createFixture()
      target = await start(fixture, streaming)
    })
    afterAll(async () => {
      streaming.open()
      await target.close()
    })

    it('answers a request Node cannot parse with 400 and a JSON-RPC body, and closes', async () => {
      const requests = [
        `FOO /v1 HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`, // no such method
        'GARBAGE\r\n\r\n', // no request line
        `POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nBad Header\r\n\r\n`, // a field without a colon
        // Both framings: a smuggling attempt (RFC 9112 section 6.3).
        `POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
      ]
      for (const request of requests) {
        const { raw, closed } = await exchange(target.port, [request])
        const refused = answer(raw)
        expect(refused.status, request).toBe(400)
        expect(refused.headers['content-type']).toBe('application/json')
        expect(refused.headers.connection).toBe('close')
        expect(refused.body).toEqual(BAD_REQUEST)
        expect(closed).toBe(true)
      }
    })

    it('answers a head past Node’s 16 KiB limit with 431 and a JSON-RPC body', async () => {
      for (const request of [`POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nX-Big: ${'a'.repeat(17_000)}\r\n\r\n`, `GET /${'a'.repeat(70_000)} HTTP/1.1\r\n`]) {
        const { raw, closed } = await exchange(target.port, [request])
        const refused = answer(raw)
        expect(refused.status).toBe(431)
        expect(refused.body).toEqual(TOO_LARGE)
        expect(closed).toBe(true)
      }
    })

    it('answers a head that never ends with 408 and a JSON-RPC body, never echoing what came', async () => {
      const { raw, closed } = await exchange(target.port, [`POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer svc_secret`], 3_000)
      const refused = answer(raw)
      expect(refused.status).toBe(408)
      expect(refused.body).toEqual(TIMEOUT)
      expect(raw).not.toContain('svc_secret')
      expect(closed).toBe(true)
    })

    it('answers an expectation other than 100-continue with 417 and a JSON-RPC body (answerExpectationFailed), never reaching the handler', async () => {
      const request = `POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nExpect: 999-odd\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`
      const { raw } = await exchange(target.port, [request])
      const refused = answer(raw)
      expect(refused.status).toBe(417)
      expect(refused.headers['content-type']).toBe('application/json')
      expect(refused.body).toEqual(EXPECTATION_FAILED)
      expect(raw).not.toContain('data: one')
      expect(raw).not.toContain(fixture.tokens.alice)
    })

    it('answers a request that timed out behind an answer under way at once, as Node does: it is never served after that answer', async () => {
      const good = `POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`
      // The second head never ends: past headersTimeout (300 ms) Node refuses it. Its answer
      // cannot go behind the stream's head, so the connection closes with the stream cut.
      const { raw, closed } = await exchange(target.port, [good, { seen: 'data: one' }, `POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\n`], 2_000)
      expect(closed).toBe(true)
      expect(raw.match(/HTTP\/1\.1 /g)).toHaveLength(1)
      expect(raw).toMatch(/^HTTP\/1\.1 200 /)
    })

    // The last test of each target: it opens `streaming`, which ends every answer from then on.
    it('answers a malformed request pipelined behind answers under way after them, in order, and closes', async () => {
      const good = `POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`
      // The garbage arrives in two pieces, so Node's parser refuses it twice.
      const { raw, closed } = await exchange(target.port, [good, good, { seen: 'data: one' }, 'GARBAGE\r\n\r\n', 100, 'more\r\n', 100, () => streaming.open()])
      const answers = raw.split(/(?=HTTP\/1\.1 \d{3} )/)
      expect(answers.map((a) => a.slice(0, 12))).toEqual(['HTTP/1.1 200', 'HTTP/1.1 200', 'HTTP/1.1 400'])
      // Both streams went out whole (chunked to their last chunk) before the refusal.
      for (const served of answers.slice(0, 2)) expect(served).toMatch(/data: one\n\n\r\n0\r\n\r\n$/)
      expect(answer(answers[2]!).body).toEqual(BAD_REQUEST)
      expect(closed).toBe(true)
      // The server served on.
      const next = await exchange(target.port, [`FOO / HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`])
      expect(answer(next.raw).status).toBe(400)
    })
  })
}

describe('answerClientError on a socket', () => {
  /** A socket's record of what was done to it. */
  const socket = (state: { writable?: boolean; destroyed?: boolean; headersSent?: boolean; throws?: boolean } = {}) => {
    const done = { written: [] as string[], destroyed: 0 }
    return {
      done,
      socket: {
        writable: state.writable ?? true,
        destroyed: state.destroyed ?? false,
        ...(state.headersSent !== undefined && { _httpMessage: { headersSent: state.headersSent } }),
        write(data: string) {
          if (state.throws) throw new Error('EPIPE')
          done.written.push(data)
        },
        destroy() {
          done.destroyed++
        },
      },
    }
  }
  const error = (code?: string) => Object.assign(new Error('parse error'), code === undefined ? {} : { code })

  it('writes nothing to a reset, destroyed or unwritable socket, or behind a response under way, and destroys it', () => {
    for (const [state, code] of [
      [{}, 'ECONNRESET'],
      [{ destroyed: true }, 'HPE_INVALID_METHOD'],
      [{ writable: false }, 'HPE_INVALID_METHOD'],
      [{ headersSent: true }, 'HPE_INVALID_METHOD'],
      [{ throws: true }, 'HPE_INVALID_METHOD'],
    ] as const) {
      const { socket: s, done } = socket(state)
      answerClientError(error(code), s)
      expect(done.written, JSON.stringify(state)).toEqual([])
      expect(done.destroyed).toBe(1)
    }
  })

  it('answers a response not yet started, and an error without a code, with 400', () => {
    for (const [state, e] of [[{ headersSent: false }, error('HPE_INVALID_METHOD')], [{}, error()], [{}, undefined]] as const) {
      const { socket: s, done } = socket(state)
      answerClientError(e as Error, s)
      expect(done.written).toHaveLength(1)
      expect(answer(done.written[0]!).body).toEqual(BAD_REQUEST)
      expect(done.destroyed).toBe(1)
    }
  })

  it('answers after the answers ahead of it end, once, and not at all where the connection closed first', () => {
    // A response to a request that came whole, under way; Node hands the socket the next one on finish.
    const response = () => Object.assign(new EventEmitter(), { headersSent: true, req: { complete: true } })
    const first = response()
    const second = response()
    const { socket: s, done } = socket()
    Object.assign(s, { _httpMessage: first })
    answerClientError(error('HPE_INVALID_METHOD'), s)
    answerClientError(error('HPE_INVALID_METHOD'), s) // the rest of the request, refused again
    expect(done).toEqual({ written: [], destroyed: 0 })
    Object.assign(s, { _httpMessage: second })
    first.emit('finish')
    first.emit('close')
    expect(done).toEqual({ written: [], destroyed: 0 })
    Object.assign(s, { _httpMessage: null })
    second.emit('finish')
    expect(done.written).toHaveLength(1)
    expect(answer(done.written[0]!).body).toEqual(BAD_REQUEST)
    expect(done.destroyed).toBe(1)
    second.emit('close')
    expect(done.written).toHaveLength(1)

    // The client went away: the response closes, the socket with it.
    const third = response()
    const gone = socket({ destroyed: true })
    Object.assign(gone.socket, { _httpMessage: third })
    gone.socket.destroyed = false
    answerClientError(error('HPE_INVALID_METHOD'), gone.socket)
    gone.socket.destroyed = true
    third.emit('close')
    expect(gone.done).toEqual({ written: [], destroyed: 1 })
  })

  it('abandons an answer whose own request was malformed: nothing behind its head, and the socket destroyed', () => {
    const { socket: s, done } = socket()
    Object.assign(s, { _httpMessage: Object.assign(new EventEmitter(), { headersSent: true, req: { complete: false } }) })
    answerClientError(error('HPE_INVALID_CHUNK_SIZE'), s)
    expect(done).toEqual({ written: [], destroyed: 1 })
  })

  it('the chunk-extension limit answers 413', () => {
    const { socket: s, done } = socket()
    answerClientError(error('HPE_CHUNK_EXTENSIONS_OVERFLOW'), s)
    expect(answer(done.written[0]!).status).toBe(413)
  })

  it('is the same function on every adapter subpath', () => {
    expect(expressAnswer).toBe(answerClientError)
    expect(fastifyAnswer).toBe(answerClientError)
  })
})
