/**
 * The proxy handler under load, back-pressure and broken framing, served by every adapter (the
 * Web adapter on `@hono/node-server`, Express 5 and 4, Fastify; HTTP/2 where the adapter serves
 * it) against real upstreams on loopback: raw Node servers, a raw socket for framing no Node
 * server writes, and an MCP SDK server (`StreamableHTTPServerTransport`). A slow reader holds a
 * fast upstream back (and the reverse for uploads) with bounded memory; a client gone from a
 * stream that is held back still ends the upstream request; 120 concurrent exchanges through one
 * proxy are each answered with their own body, on reused connections; an upstream that dies
 * mid-stream cuts the client's stream (never a clean end); and framing an upstream gets wrong
 * (1xx, trailers, two lengths, `Transfer-Encoding` with `Content-Length`, bytes past the length,
 * a 101) is a 502 or is relayed truthfully, never passed on ambiguous.
 */
import * as http from 'node:http'
import * as http2 from 'node:http2'
import * as net from 'node:net'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { generateKeyPair } from 'jose'
import { type DispatchContext, UpstreamError } from 'mcp-dispatch'
import { type IdentitySigner, type ProxyHandler, createIdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { z } from 'zod'
import { ADAPTER_KINDS, type Fixture, HOST, close, createFixture, listen, serveWebHandler } from './helpers.js'

const context: DispatchContext = {
  app: { id: 'app_weather', slug: 'weather', name: 'Weather' },
  identity: { subject: 'alice', method: 'oauth', clientId: 'client-1', scopes: ['openid'] },
  version: '2.0.0',
  latestVersion: '2.0.0',
  sessionId: undefined,
  baseUrl: `http://${HOST}`,
  rateLimit: undefined,
}

const UNAVAILABLE = '{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Upstream App unavailable","data":{"error":"upstream_unavailable"}}}'

/** What a proxy's upstream may hold in buffers (socket buffers both ways, a few stream chunks): far below what it would write unheld. */
const BOUNDED = 32 * 1024 * 1024

let signer: IdentitySigner
beforeAll(async () => {
  const { privateKey } = await generateKeyPair('ES256', { extractable: true })
  signer = createIdentitySigner({ issuer: 'https://platform.test', privateKey })
})

/** A proxy to `origin`'s `/mcp`, its `onError` reports collected in `errors`. */
function proxyTo(origin: string, errors: unknown[], options: { timeoutMs?: number; forwardHeaders?: string[] } = {}): ProxyHandler {
  return createProxyHandler({ upstream: () => `${origin}/mcp`, identity: signer, onError: (error) => errors.push(error), ...options })
}

/** Resolves once `value()` has stopped changing for `quietMs` (a stream held back by back-pressure). */
async function settled(value: () => number, quietMs = 100): Promise<number> {
  // Nothing moved yet (a host loaded past its cores may take longer than one quiet spell to
  // carry the request through): wait for the first bytes, up to 10 s, before judging quiet.
  const since = performance.now()
  while (value() === 0 && performance.now() - since < 10_000) await new Promise((resolve) => setTimeout(resolve, 10))
  let last = -1
  while (last !== value()) {
    last = value()
    await new Promise((resolve) => setTimeout(resolve, quietMs))
  }
  return last
}

/** A request head of alice's to `/v2` of the weather App. */
function head(fixture: Fixture, method: string, extra = ''): string {
  return `${method} /v2 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nAccept: application/json, text/event-stream\r\n${extra}\r\n`
}

/** A raw socket to `port` that collects what it reads (latin1) and tells when it closed. */
function rawClient(port: number) {
  const socket = net.connect(port, '127.0.0.1')
  const state = { text: '', closed: false }
  socket.setEncoding('latin1')
  socket.on('data', (data: string) => (state.text += data))
  socket.on('error', () => {})
  const closed = new Promise<void>((resolve) => socket.on('close', () => ((state.closed = true), resolve())))
  return { socket, state, closed }
}

/** An upstream on a raw socket: `answer` is called with the socket for each request head (bodies are not framed: send none, GET). */
async function rawUpstream(answer: (socket: net.Socket) => void) {
  const sockets = new Set<net.Socket>()
  let connections = 0
  const server = net.createServer((socket) => {
    connections++
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => {})
    let buffered = ''
    socket.setEncoding('latin1')
    socket.on('data', (data: string) => {
      buffered += data
      let end: number
      while ((end = buffered.indexOf('\r\n\r\n')) >= 0) {
        buffered = buffered.slice(end + 4)
        answer(socket)
      }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    origin: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    /** How many connections it has accepted. */
    connections: () => connections,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy()
        server.close(() => resolve())
      }),
  }
}

/** An SSE upstream that writes 16 KiB events as fast as its socket takes them; `written` counts the bytes it handed to Node. */
async function floodingUpstream() {
  const state = { written: 0, closed: false }
  const event = `data: ${'x'.repeat(16 * 1024 - 8)}\n\n`
  const server = http.createServer((_req, res) => {
    res.on('close', () => (state.closed = true))
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    const pump = () => {
      while (state.written < 512 * 1024 * 1024) {
        state.written += event.length
        if (!res.write(event)) {
          res.once('drain', pump)
          return
        }
      }
      res.end()
    }
    pump()
  })
  return { state, server, origin: `http://127.0.0.1:${await listen(server)}` }
}

/** An upstream that takes a request's first chunk and then reads nothing more; `received` counts what it took. */
async function stallingUpstream() {
  const state = { requests: 0 }
  const server = http.createServer((req) => {
    state.requests++
    req.on('error', () => {})
    req.once('data', () => req.pause())
  })
  return { state, server, origin: `http://127.0.0.1:${await listen(server)}` }
}

/** Writes `total` bytes of body to `socket` as fast as it takes them; answers how many it has written so far. */
function flood(socket: net.Socket, total: number, chunked: boolean): () => number {
  const chunk = Buffer.alloc(64 * 1024, 0x20)
  const framed = chunked ? Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')]) : chunk
  let sent = 0
  const pump = () => {
    while (sent < total && !socket.destroyed) {
      sent += chunk.length
      if (!socket.write(framed)) {
        socket.once('drain', pump)
        return
      }
    }
  }
  pump()
  return () => sent
}

describe('back-pressure through every adapter', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: a client that reads nothing holds a fast SSE upstream back (bounded), and once it goes the upstream request ends at once`, async () => {
      const upstream = await floodingUpstream()
      const fixture = createFixture()
      const errors: unknown[] = []
      const served = await serveWebHandler(kind, fixture, proxyTo(upstream.origin, errors))
      try {
        const client = rawClient(served.port)
        client.socket.once('data', () => client.socket.pause())
        client.socket.write(head(fixture, 'GET'))
        const written = await settled(() => upstream.state.written)
        expect(written).toBeGreaterThan(0)
        expect(written).toBeLessThan(BOUNDED)
        expect(upstream.state.closed).toBe(false)
        client.socket.destroy()
        await expect.poll(() => upstream.state.closed, { timeout: 1000, interval: 10 }).toBe(true)
        expect(errors).toEqual([])
      } finally {
        await served.close()
        await close(upstream.server)
      }
    })

    it(`${kind}: a large upload to an upstream that stops reading is held back at the client (bounded), with or without Content-Length`, async () => {
      const upstream = await stallingUpstream()
      const fixture = createFixture()
      const served = await serveWebHandler(kind, fixture, proxyTo(upstream.origin, [], { timeoutMs: 5000 }))
      try {
        for (const [i, chunked] of [false, true].entries()) {
          const total = 256 * 1024 * 1024
          const client = rawClient(served.port)
          client.socket.write(head(fixture, 'POST', `Content-Type: application/json\r\n${chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${total}`}\r\n`))
          const sent = flood(client.socket, total, chunked)
          // The upload reached the upstream, which reads none of it, before the flood is judged.
          await expect.poll(() => upstream.state.requests, { timeout: 10_000, interval: 10 }).toBe(i + 1)
          const taken = await settled(sent)
          expect(taken).toBeLessThan(BOUNDED)
          client.socket.destroy()
        }
        expect(upstream.state.requests).toBe(2)
      } finally {
        await served.close()
        await close(upstream.server)
      }
    })
  }
})

describe('HTTP/2 client, HTTP/1.1 upstream', () => {
  const request = (fixture: Fixture, port: number, method: string): http2.OutgoingHttpHeaders => ({
    ':method': method,
    ':path': '/v2',
    ':authority': `${HOST}:${port}`,
    authorization: `Bearer ${fixture.tokens.alice}`,
    accept: 'application/json, text/event-stream',
    'content-type': 'application/json',
  })

  for (const kind of ['web', 'fastify'] as const) {
    it(`${kind}: a stream the client does not read holds the upstream back, and so does an upstream that stops reading an upload`, async () => {
      const flooding = await floodingUpstream()
      const stalling = await stallingUpstream()
      const fixture = createFixture()
      let target = flooding.origin
      const served = await serveWebHandler(kind, fixture, createProxyHandler({ upstream: () => `${target}/mcp`, identity: signer, timeoutMs: 5000, onError: () => {} }), { http2: true })
      const session = http2.connect(`http://127.0.0.1:${served.port}`)
      session.on('error', () => {})
      try {
        const down = session.request(request(fixture, served.port, 'GET'), { endStream: true })
        down.on('error', () => {})
        down.once('data', () => down.pause())
        const written = await settled(() => flooding.state.written)
        expect(written).toBeGreaterThan(0)
        expect(written).toBeLessThan(BOUNDED)
        down.close(http2.constants.NGHTTP2_CANCEL)
        await expect.poll(() => flooding.state.closed, { timeout: 1000, interval: 10 }).toBe(true)

        target = stalling.origin
        const up = session.request(request(fixture, served.port, 'POST'))
        up.on('error', () => {})
        const chunk = Buffer.alloc(64 * 1024, 0x20)
        let sent = 0
        const pump = () => {
          while (sent < 256 * 1024 * 1024 && !up.destroyed) {
            sent += chunk.length
            if (!up.write(chunk)) {
              up.once('drain', pump)
              return
            }
          }
        }
        pump()
        expect(await settled(() => sent)).toBeLessThan(BOUNDED)
        expect(stalling.state.requests).toBe(1)
        up.close(http2.constants.NGHTTP2_CANCEL)
      } finally {
        session.destroy()
        await served.close()
        await close(flooding.server)
        await close(stalling.server)
      }
    })
  }

  // Fastify's `fromWebHandler` (`writeWebResponse`) ended such a response with `res.destroy()`,
  // which on HTTP/2 is RST_STREAM with NO_ERROR, and Node's client read that as a whole answer
  // ('end', 11 bytes of a declared 100): regression, `cutResponse` resets it with INTERNAL_ERROR.
  for (const kind of ['web', 'fastify'] as const) {
    it(`${kind}: an upstream that dies mid-answer resets the client's stream with an error, never ends it as whole`, async () => {
      const upstream = await rawUpstream((socket) => {
        socket.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"jsonrpc":')
        setTimeout(() => socket.destroy(), 30)
      })
      const fixture = createFixture()
      const served = await serveWebHandler(kind, fixture, proxyTo(upstream.origin, []), { http2: true })
      const session = http2.connect(`http://127.0.0.1:${served.port}`)
      session.on('error', () => {})
      try {
        const stream = session.request(request(fixture, served.port, 'GET'), { endStream: true })
        let text = ''
        stream.setEncoding('utf8')
        stream.on('data', (data: string) => (text += data))
        const outcome = await new Promise<string>((resolve) => {
          stream.on('end', () => resolve('end'))
          stream.on('error', () => resolve('error'))
        })
        expect({ outcome, text }).toEqual({ outcome: 'error', text: '{"jsonrpc":' })
        expect(stream.rstCode).not.toBe(http2.constants.NGHTTP2_NO_ERROR)
      } finally {
        session.destroy()
        await served.close()
        await upstream.close()
      }
    })
  }
})

describe('many exchanges at once through one proxy', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: 120 concurrent SSE exchanges, held open together, each answered with its own body; a second wave reuses the upstream connections`, async () => {
      const N = 120
      let connections = 0
      let waiting: Array<() => void> = []
      // Answers only once all N requests are in: they are all open at once, none queued behind another.
      const upstream = http.createServer(async (req, res) => {
        const chunks: Buffer[] = []
        for await (const chunk of req) chunks.push(chunk as Buffer)
        await new Promise<void>((resolve) => {
          waiting.push(resolve)
          if (waiting.length === N) {
            for (const release of waiting) release()
            waiting = []
          }
        })
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.write(`event: message\ndata: ${Buffer.concat(chunks).toString('utf8')}\n\n`)
        setImmediate(() => res.end(`data: end ${String(req.headers['x-request-n'])}\n\n`))
      })
      upstream.on('connection', () => connections++)
      const origin = `http://127.0.0.1:${await listen(upstream)}`
      const fixture = createFixture()
      const errors: unknown[] = []
      const served = await serveWebHandler(kind, fixture, proxyTo(origin, errors, { forwardHeaders: ['x-request-n'] }))
      const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity })
      const ask = (n: number) =>
        new Promise<{ status: number; body: string }>((resolve, reject) => {
          const body = JSON.stringify({ jsonrpc: '2.0', id: n, method: 'tools/call', params: { name: 'echo', arguments: { n } } })
          const headers = {
            host: HOST,
            authorization: `Bearer ${fixture.tokens.alice}`,
            'content-type': 'application/json',
            accept: 'application/json, text/event-stream',
            'content-length': String(Buffer.byteLength(body)),
            'x-request-n': String(n),
          }
          const outgoing = http.request({ host: '127.0.0.1', port: served.port, method: 'POST', path: '/v2', agent, headers }, (incoming) => {
            let text = ''
            incoming.setEncoding('utf8')
            incoming.on('data', (data: string) => (text += data))
            incoming.on('end', () => resolve({ status: incoming.statusCode!, body: text }))
            incoming.on('error', reject)
          })
          outgoing.on('error', reject)
          outgoing.end(body)
        })
      try {
        for (let wave = 0; wave < 2; wave++) {
          const answers = await Promise.all(Array.from({ length: N }, (_, n) => ask(n)))
          answers.forEach((answer, n) => {
            expect(answer).toEqual({
              status: 200,
              body: `event: message\ndata: {"jsonrpc":"2.0","id":${n},"method":"tools/call","params":{"name":"echo","arguments":{"n":${n}}}}\n\ndata: end ${n}\n\n`,
            })
          })
        }
        // The second wave on the first wave's connections: at most N, but for the few a host
        // loaded past its cores lets idle out between the waves (124 of 240 seen so).
        expect(connections).toBeLessThanOrEqual(N + N / 10)
        expect(errors).toEqual([])
      } finally {
        agent.destroy()
        await served.close()
        await close(upstream)
      }
    })
  }
})

describe('an upstream that dies mid-answer, on the wire', () => {
  // `@hono/node-server` logs the failed body of a response with `console.error` (the proxy's
  // `onError` hears it too): kept out of the test output.
  const logged = vi.spyOn(console, 'error').mockImplementation(() => {})
  afterAll(() => logged.mockRestore())
  const answers = {
    chunked: 'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n7\r\ndata: 1\r\n',
    length: 'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"jsonrpc":',
  }
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: the client's connection closes with the answer cut (no last chunk, short of its length), and onError hears it`, async () => {
      for (const [framing, answer] of Object.entries(answers)) {
        const upstream = await rawUpstream((socket) => {
          socket.write(answer)
          setTimeout(() => socket.destroy(), 30)
        })
        const fixture = createFixture()
        const errors: unknown[] = []
        const served = await serveWebHandler(kind, fixture, proxyTo(upstream.origin, errors))
        try {
          const client = rawClient(served.port)
          client.socket.write(head(fixture, 'POST', 'Content-Type: application/json\r\nContent-Length: 2\r\n') + '{}')
          await client.closed
          const body = client.state.text.slice(client.state.text.indexOf('\r\n\r\n') + 4)
          expect(client.state.text, framing).toMatch(/^HTTP\/1\.1 200 /)
          if (framing === 'chunked') expect(body).toBe('7\r\ndata: 1\r\n')
          else expect(body).toBe('{"jsonrpc":')
          expect(errors.map((error) => (error as Error).message)).toEqual(['Upstream App failed after its response head'])
          // Told once, by the proxy: the adapter, which sees the body fail, does not tell it again.
          expect(fixture.errors).toEqual([])
        } finally {
          await served.close()
          await upstream.close()
        }
      }
    })
  }
})

describe('framing an upstream gets wrong', () => {
  /** The proxy's answer to a GET, against an upstream writing `raw`. */
  async function through(raw: string | ((socket: net.Socket) => void)) {
    const upstream = await rawUpstream(typeof raw === 'string' ? (socket) => socket.write(raw) : raw)
    const errors: unknown[] = []
    try {
      const response = await proxyTo(upstream.origin, errors, { timeoutMs: 2000 })(new Request(`http://${HOST}/v2`), context)
      const headers: Record<string, string> = {}
      response.headers.forEach((value, name) => (headers[name] = value))
      const body = await response.text().catch((error: unknown) => `(cut: ${(error as Error).message})`)
      return { status: response.status, headers, body, errors }
    } finally {
      await upstream.close()
    }
  }

  it('a 103 Early Hints before the answer is not passed on, and the answer is', async () => {
    const answer = await through('HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}')
    expect(answer).toMatchObject({ status: 200, headers: { 'content-type': 'application/json', 'content-length': '2' }, body: '{}', errors: [] })
    expect(answer.headers.link).toBeUndefined()
  })

  it('a chunked answer with trailers: the body passes, neither Trailer nor the trailer fields do', async () => {
    const answer = await through('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n2\r\n{}\r\n0\r\nX-Checksum: abc\r\n\r\n')
    expect(answer).toMatchObject({ status: 200, body: '{}', errors: [] })
    expect(Object.keys(answer.headers).sort()).toEqual(['content-type'])
  })

  it('ambiguous lengths (two Content-Length fields, alike or not, a list, Transfer-Encoding beside Content-Length) and a 101 nobody asked for are a 502, reported, never relayed', async () => {
    const heads = [
      'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}',
      'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}abc',
      'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2, 2\r\n\r\n{}',
      'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n',
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nframes',
    ]
    for (const raw of heads) {
      const answer = await through(raw)
      expect({ status: answer.status, body: answer.body }, raw).toEqual({ status: 502, body: UNAVAILABLE })
      expect(answer.errors, raw).toEqual([expect.any(UpstreamError)])
    }
  })

  it('bytes past Content-Length are not relayed, and the connection they came on is not used again', async () => {
    let requests = 0
    const upstream = await rawUpstream((socket) => {
      requests++
      if (requests === 1) {
        // A response queued ahead for the next request on this connection.
        socket.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{"pwn":1}')
      } else socket.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"n":2}')
    })
    const errors: unknown[] = []
    const proxy = proxyTo(upstream.origin, errors)
    try {
      const ask = async () => {
        const response = await proxy(new Request(`http://${HOST}/v2`), context)
        return { status: response.status, body: await response.text() }
      }
      expect(await ask()).toEqual({ status: 200, body: '{}' })
      await new Promise((resolve) => setTimeout(resolve, 20))
      expect(await ask()).toEqual({ status: 200, body: '{"n":2}' })
      expect(requests).toBe(2)
      expect(upstream.connections()).toBe(2)
      expect(errors).toEqual([])
    } finally {
      await upstream.close()
    }
  })

  it('an answer short of its Content-Length, then a close, is a cut stream reported to onError', async () => {
    const answer = await through((socket) => {
      socket.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a":1')
      setTimeout(() => socket.destroy(), 20)
    })
    expect(answer.status).toBe(200)
    expect(answer.body).toMatch(/^\(cut: /)
    expect(answer.errors.map((error) => (error as Error).message)).toEqual(['Upstream App failed after its response head'])
  })
})

describe('a client asking to upgrade (WebSocket)', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: the upstream gets a plain GET, no Upgrade, Connection or Sec-WebSocket-* fields, and its answer comes back as an HTTP answer`, async () => {
      let seen: http.IncomingHttpHeaders | undefined
      const upstream = http.createServer((req, res) => {
        seen = req.headers
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.end('data: hello\n\n')
      })
      const origin = `http://127.0.0.1:${await listen(upstream)}`
      const fixture = createFixture()
      const served = await serveWebHandler(kind, fixture, proxyTo(origin, []))
      try {
        const client = rawClient(served.port)
        client.socket.write(
          head(fixture, 'GET', 'Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n'),
        )
        await expect.poll(() => client.state.text.includes('data: hello'), { timeout: 2000, interval: 10 }).toBe(true)
        client.socket.destroy()
        expect(client.state.text).toMatch(/^HTTP\/1\.1 200 /)
        expect(client.state.text.toLowerCase()).not.toContain('upgrade')
        expect(Object.keys(seen!).filter((name) => name === 'upgrade' || name.startsWith('sec-websocket'))).toEqual([])
        expect(seen!.connection).not.toMatch(/upgrade/i)
      } finally {
        await served.close()
        await close(upstream)
      }
    })
  }
})

describe('several MB of body to an MCP SDK upstream', () => {
  /** A stateless SDK server with an `echo` tool that answers the length of its text. */
  async function sdkUpstream() {
    const server = http.createServer(async (req, res) => {
      const mcp = new McpServer({ name: 'upstream', version: '2.0.0' })
      mcp.registerTool('echo', { inputSchema: { text: z.string() } }, async ({ text }) => ({ content: [{ type: 'text', text: String(text.length) }] }))
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined })
      res.on('close', () => void transport.close())
      await mcp.connect(transport)
      await transport.handleRequest(req, res)
    })
    return { server, origin: `http://127.0.0.1:${await listen(server)}` }
  }

  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: 3 MB is served, with or without Content-Length; 6 MB gets the SDK's own 413, not a 502`, async () => {
      const upstream = await sdkUpstream()
      const fixture = createFixture()
      const errors: unknown[] = []
      const served = await serveWebHandler(kind, fixture, proxyTo(upstream.origin, errors))
      const call = (size: number, chunked: boolean) =>
        new Promise<{ status: number; body: string }>((resolve, reject) => {
          const body = JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x'.repeat(size) } } })
          const headers: Record<string, string> = {
            host: HOST,
            authorization: `Bearer ${fixture.tokens.alice}`,
            'content-type': 'application/json',
            accept: 'application/json, text/event-stream',
            'mcp-protocol-version': '2025-06-18',
          }
          if (!chunked) headers['content-length'] = String(Buffer.byteLength(body))
          const outgoing = http.request({ host: '127.0.0.1', port: served.port, method: 'POST', path: '/v2', agent: false, headers }, (incoming) => {
            let text = ''
            incoming.setEncoding('utf8')
            incoming.on('data', (data: string) => (text += data))
            incoming.on('end', () => resolve({ status: incoming.statusCode!, body: text }))
            incoming.on('error', reject)
          })
          outgoing.on('error', reject)
          if (chunked) for (let at = 0; at < body.length; at += 256 * 1024) outgoing.write(body.slice(at, at + 256 * 1024))
          outgoing.end(chunked ? undefined : body)
        })
      try {
        for (const chunked of [false, true]) {
          const served3 = await call(3_000_000, chunked)
          expect(served3.status).toBe(200)
          expect(served3.body).toContain('"content":[{"type":"text","text":"3000000"}]')
          const refused = await call(6_000_000, chunked)
          expect(refused.status).toBe(413)
          expect(JSON.parse(refused.body)).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32000 } })
        }
        expect(errors).toEqual([])
      } finally {
        await served.close()
        await close(upstream.server)
      }
    })
  }
})
