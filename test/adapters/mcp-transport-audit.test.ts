/**
 * An audit of the dispatch layer against the MCP Streamable HTTP transport (revisions
 * 2025-06-18 and 2025-11-25: "Session Management", "Protocol Version Header", "Resumability",
 * the security warning on `Origin`), with the official SDK as client and as the server behind
 * each adapter (Web on `@hono/node-server`, Express 5 and 4, Fastify). What streamable-audit,
 * mcp-session and http-edges leave out:
 * - `Mcp-Session-Id` values no session can have (outside 0x21–0x7E, past 256 characters,
 *   empty, two fields): refused 404 without a pin lookup and without reaching the App; a valid
 *   id sent twice leaves its pin alone;
 * - the 404 of a session that ended (its pin gone, or the App forgot it), then the SDK client
 *   (1.x and `@modelcontextprotocol/client` 2.x; pins answered at once and with promises)
 *   connecting again: a new session, pinned to what `/` resolves to now;
 * - `MCP-Protocol-Version` reaches the App as sent; an unsupported one is the SDK's 400, and a
 *   `DELETE` it refuses ends no pin;
 * - a GET stream resumed with `Last-Event-ID` after a deploy that replaced the pinned patch:
 *   the pinned version, its headers, what was sent meanwhile replayed;
 * - `Origin`: without `allowedOrigins` a DNS-rebinding page gets no further than the 401 (no
 *   credential is ambient); with it, a refused origin is 403 before the App on every method,
 *   and the session stays;
 * - batches and notifications alone: one rate-limit unit per HTTP request, whatever it holds;
 *   the 202 carries the version and rate-limit headers;
 * - `Accept` on POST and GET: the SDK's own answers, never pre-empted.
 *
 * Servers listen on 127.0.0.1, on ports the system picks, each closed after its test.
 */
import { randomUUID } from 'node:crypto'
import * as http from 'node:http'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { connect } from 'node:net'
import type { AddressInfo } from 'node:net'
import { Client as ClientV2, SdkHttpError, StreamableHTTPClientTransport as StreamableHTTPClientTransportV2 } from '@modelcontextprotocol/client'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import Fastify from 'fastify'
import { type SessionPin, type SessionStore, createDispatcher, createMemorySessionStore } from 'mcp-dispatch'
import { mcpDispatch as expressDispatch, routeByVersion as expressRoutes } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch, routeByVersion as fastifyRoutes } from 'mcp-dispatch/fastify'
import { mcpDispatch as webDispatch, routeByVersion as webRoutes } from 'mcp-dispatch/web'
import { afterEach, describe, expect, it } from 'vitest'
import { createSessionEventStore } from '../../examples/platform/event-store.js'
import { EXPRESS } from '../helpers/express.js'
import { serveFetch } from '../helpers/platform.js'
import { ADAPTER_KINDS, ALLOWED_ORIGIN, type AdapterKind, type Fixture, HOST, close, createFixture, isExpress, listen, loopbackFetch } from './helpers.js'

const SESSION_NOT_FOUND = '{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}'

/** What the Apps saw: one entry per request that reached a handler, and the `MCP-Protocol-Version` each tool call carried. */
interface Seen {
  requests: Array<{ method: string; sessionId: string | undefined }>
  protocolVersions: Array<string | undefined>
  /** Forgets every session of every version (the App restarted). */
  forget(): void
}

function buildServer(version: string, seen: Seen): McpServer {
  const server = new McpServer({ name: 'weather', version }, { capabilities: { tools: { listChanged: true } } })
  server.registerTool('get_version', { inputSchema: {} }, async (_args, extra) => {
    const value = extra.requestInfo?.headers['mcp-protocol-version']
    seen.protocolVersions.push(Array.isArray(value) ? value.join(', ') : value)
    return { content: [{ type: 'text', text: version }] }
  })
  server.registerTool('announce', { inputSchema: {} }, async () => {
    server.sendToolListChanged()
    return { content: [{ type: 'text', text: 'announced' }] }
  })
  return server
}

/** One version's sessions on the SDK's Node transport (Express, Fastify): the SDK examples' routing, resumable. */
function nodeSessions(version: string, seen: Seen, forgets: Array<() => void>) {
  const sessions = new Map<string, StreamableHTTPServerTransport>()
  forgets.push(() => sessions.clear())
  return async (req: IncomingMessage, res: ServerResponse, body?: unknown): Promise<void> => {
    const id = req.headers['mcp-session-id']
    seen.requests.push({ method: req.method!, sessionId: typeof id === 'string' ? id : undefined })
    if (typeof id === 'string') {
      const transport = sessions.get(id)
      if (transport) return transport.handleRequest(req, res, body)
      return void res.writeHead(404, { 'content-type': 'application/json' }).end(SESSION_NOT_FOUND)
    }
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      eventStore: createSessionEventStore(),
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (sid) => void sessions.set(sid, transport),
      onsessionclosed: (sid) => void sessions.delete(sid),
    })
    await buildServer(version, seen).connect(transport)
    await transport.handleRequest(req, res, body)
  }
}

/** The same on the SDK's web-standard transport (the Web adapter). */
function webSessions(version: string, seen: Seen, forgets: Array<() => void>) {
  const sessions = new Map<string, WebStandardStreamableHTTPServerTransport>()
  forgets.push(() => sessions.clear())
  return async (request: Request): Promise<Response> => {
    const id = request.headers.get('mcp-session-id')
    seen.requests.push({ method: request.method, sessionId: id ?? undefined })
    if (id !== null) {
      const transport = sessions.get(id)
      if (transport) return transport.handleRequest(request)
      return new Response(SESSION_NOT_FOUND, { status: 404, headers: { 'content-type': 'application/json' } })
    }
    const transport: WebStandardStreamableHTTPServerTransport = new WebStandardStreamableHTTPServerTransport({
      eventStore: createSessionEventStore(),
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (sid) => void sessions.set(sid, transport),
      onsessionclosed: (sid) => void sessions.delete(sid),
    })
    await buildServer(version, seen).connect(transport)
    return transport.handleRequest(request)
  }
}

/**
 * A session store whose lookups are counted (`gets`), so a test tells a refusal before the
 * lookup from one after it; `pins` mirrors what it holds. `asynchronous`: it answers with
 * promises, a turn later, as Redis does (adapters then hold a new session's head for its pin).
 */
function countedPins(asynchronous = false): SessionStore & { gets: string[]; pins: Map<string, SessionPin> } {
  const memory = createMemorySessionStore()
  const gets: string[] = []
  const pins = new Map<string, SessionPin>()
  const answer = <T>(value: T): T => (asynchronous ? (new Promise<T>((resolve) => setImmediate(resolve, value)) as unknown as T) : value)
  return {
    gets,
    pins,
    ...(!asynchronous && { synchronous: true }),
    get: (id, ttlMs) => {
      gets.push(id)
      return answer(memory.get(id, ttlMs) as SessionPin | undefined)
    },
    set: (id, pin, ttlMs) => {
      pins.set(id, pin)
      return answer(memory.set(id, pin, ttlMs) as boolean | void)
    },
    delete: (id) => {
      pins.delete(id)
      return answer(memory.delete(id) as void)
    },
  }
}

interface Stack {
  port: number
  /** `http://weather.localhost:<port>` */
  origin: string
  fixture: Fixture
  pins: ReturnType<typeof countedPins>
  seen: Seen
  close(): Promise<void>
}

type StackKind = AdapterKind | 'direct'

/**
 * The dispatch layer of `kind` in front of SDK servers (one per version), or `direct`: the
 * SDK server of 2.0.0 alone at every path (the baseline). `dispatcher` options override the
 * fixture's (a rate-limit policy).
 */
async function start(kind: StackKind, overrides: Partial<Parameters<typeof createDispatcher>[0]> = {}, asynchronousPins = false): Promise<Stack> {
  const pins = countedPins(asynchronousPins)
  const base = createFixture({ sessions: pins })
  const fixture: Fixture = { ...base, dispatcher: createDispatcher({ ...base.dispatcherOptions, ...overrides }) }
  const forgets: Array<() => void> = []
  const seen: Seen = { requests: [], protocolVersions: [], forget: () => forgets.forEach((f) => f()) }
  const onError = (error: unknown, context: string) => fixture.errors.push({ error, context })
  const done = (port: number, close: () => Promise<void>): Stack => ({ port, origin: `http://${HOST}:${port}`, fixture, pins, seen, close })
  if (kind === 'direct') {
    const serve = nodeSessions('2.0.0', seen, forgets)
    const server = http.createServer((req, res) => void serve(req, res))
    return done(await listen(server), () => close(server))
  }
  if (kind === 'web') {
    const dispatch = webDispatch({ dispatcher: fixture.dispatcher, onError, handler: webRoutes((_app, version) => webSessions(version, seen, forgets)) })
    const served = await serveFetch(dispatch)
    return done(served.port, served.close)
  }
  if (isExpress(kind)) {
    const app = EXPRESS[kind]()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher, onError }))
    app.use(
      expressRoutes((_app, version) => {
        const serve = nodeSessions(version, seen, forgets)
        return (req, res) => serve(req, res)
      }),
    )
    const server = http.createServer(app)
    return done(await listen(server), () => close(server))
  }
  const app = Fastify({ forceCloseConnections: true })
  await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError }))
  app.all(
    '/*',
    fastifyRoutes((_app, version) => {
      const serve = nodeSessions(version, seen, forgets)
      return async (request, reply) => {
        reply.hijack()
        await serve(request.raw, reply.raw, request.body)
      }
    }),
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  return done((app.server.address() as AddressInfo).port, () => app.close())
}

const BOTH = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const PROTOCOL = '2025-11-25'
const INITIALIZE = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'raw', version: '1.0.0' } },
}

/** Raw requests of one caller to `stack` at `path`. */
function caller(stack: Stack, path = '/', token = stack.fixture.tokens.alice) {
  return async (method: string, headers: Record<string, string>, body?: unknown, signal?: AbortSignal) =>
    loopbackFetch(`${stack.origin}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...headers },
      ...(body !== undefined && { body: JSON.stringify(body) }),
      ...(signal && { signal }),
    })
}

/** Opens a 2025-11-25 session with `initialize` and `notifications/initialized`; answers its id. */
async function openSession(stack: Stack, path = '/'): Promise<string> {
  const send = caller(stack, path)
  const opened = await send('POST', BOTH, INITIALIZE)
  expect(opened.status).toBe(200)
  await opened.text()
  const id = opened.headers.get('mcp-session-id')!
  expect(id).toBeTruthy()
  const initialized = await send('POST', { ...BOTH, 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL }, { jsonrpc: '2.0', method: 'notifications/initialized' })
  expect(initialized.status).toBe(202)
  return id
}

/** A request written byte for byte on its own connection (header values Node's client refuses); the status line and head. */
function rawExchange(port: number, head: string): Promise<{ status: number; head: string; body: string }> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1')
    let received = Buffer.alloc(0)
    socket.on('data', (chunk: Buffer) => {
      received = Buffer.concat([received, chunk])
      const text = received.toString('latin1')
      const end = text.indexOf('\r\n\r\n')
      if (end === -1) return
      const length = /\r\ncontent-length: *(\d+)/i.exec(text.slice(0, end))
      if (length && received.length - end - 4 < Number(length[1])) return
      socket.destroy()
      resolve({ status: Number(text.slice(9, 12)), head: text.slice(0, end).toLowerCase(), body: text.slice(end + 4) })
    })
    socket.on('error', reject)
    socket.write(head, 'latin1')
  })
}

/** The servers of the running test, closed after it (so the port range is never exhausted). */
const stacks: Stack[] = []
afterEach(async () => {
  for (const stack of stacks.splice(0)) await stack.close()
})

describe('Mcp-Session-Id values no session can have: 404 session_not_found, no pin lookup, the App never asked', () => {
  const IDS: Array<[string, string[]]> = [
    ['a space inside', ['ab cd']],
    ['a tab inside', ['ab\tcd']],
    ['a Latin-1 byte', ['s\xe9ance']],
    ['257 characters', ['a'.repeat(257)]],
    ['8,000 characters', ['a'.repeat(8_000)]],
    ['empty', ['']],
    ['two fields', ['abc', 'def']],
  ]

  for (const kind of ADAPTER_KINDS) {
    it(`${kind}`, async () => {
      const stack = await start(kind)
      stacks.push(stack)
      const id = await openSession(stack)
      const before = { requests: stack.seen.requests.length, gets: stack.pins.gets.length }
      for (const [what, values] of IDS) {
        for (const method of ['POST', 'GET', 'DELETE']) {
          const body = method === 'POST' ? JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'ping' }) : ''
          const answer = await rawExchange(
            stack.port,
            `${method} / HTTP/1.1\r\nHost: ${HOST}:${stack.port}\r\nAuthorization: Bearer ${stack.fixture.tokens.alice}\r\n` +
              `Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n` +
              values.map((value) => `Mcp-Session-Id: ${value}\r\n`).join('') +
              `Content-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
          )
          expect([what, method, answer.status, JSON.parse(answer.body).error.data]).toEqual([what, method, 404, { error: 'session_not_found' }])
          expect(answer.head).not.toContain('x-mcp-version')
        }
      }
      // DEL (0x7f) is not even a field value: Node's parser answers 400 before any adapter runs.
      const del = await rawExchange(stack.port, `POST / HTTP/1.1\r\nHost: ${HOST}:${stack.port}\r\nMcp-Session-Id: ab\x7fcd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`)
      expect([del.status, del.head.includes('x-mcp-version')]).toEqual([400, false])
      // None reached the App, and none was looked up (nothing of that shape is ever pinned).
      expect(stack.seen.requests.length).toBe(before.requests)
      expect(stack.pins.gets.length).toBe(before.gets)
      // 256 visible characters can be an id: looked up, unknown, 404; still not the App's to answer.
      const long = 'b'.repeat(256)
      const send = caller(stack)
      const unknown = await send('POST', { ...BOTH, 'mcp-session-id': long }, { jsonrpc: '2.0', id: 3, method: 'ping' })
      expect([unknown.status, (await unknown.json()).error.data]).toEqual([404, { error: 'session_not_found' }])
      expect(stack.pins.gets.at(-1)).toBe(long)
      expect(stack.seen.requests.length).toBe(before.requests)
      // The live session's id sent twice (joined "id, id" by every adapter, as by Node and fetch): refused, its pin kept.
      const twice = await rawExchange(
        stack.port,
        `POST / HTTP/1.1\r\nHost: ${HOST}:${stack.port}\r\nAuthorization: Bearer ${stack.fixture.tokens.alice}\r\n` +
          `Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: ${id}\r\nMcp-Session-Id: ${id}\r\n` +
          `MCP-Protocol-Version: ${PROTOCOL}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
      )
      expect(twice.status).toBe(404)
      const after = await send('POST', { ...BOTH, 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL }, { jsonrpc: '2.0', id: 4, method: 'ping' })
      expect([after.status, after.headers.get('x-mcp-version')]).toEqual([200, '2.0.0'])
      await after.text()
      expect(stack.fixture.errors).toEqual([])
    })
  }
})

describe('a session that ended answers 404; the SDK client connects again and gets a new session, pinned to what `/` resolves to now', () => {
  /** The SDK client of `sdk` (1.x, or `@modelcontextprotocol/client` 2.x) connected to `/`; its HTTP exchanges go to `log`. */
  async function connectClient(sdk: 'v1' | 'v2', stack: Stack, log: Array<[string, number, string | null]>) {
    const options = {
      fetch: async (input: string | URL | Request, init?: RequestInit) => {
        const response = await loopbackFetch(input, init)
        log.push([init?.method ?? 'GET', response.status, response.headers.get('x-mcp-version')])
        return response
      },
      requestInit: { headers: { authorization: `Bearer ${stack.fixture.tokens.alice}` } },
    }
    const url = new URL(`${stack.origin}/`)
    if (sdk === 'v1') {
      const transport = new StreamableHTTPClientTransport(url, options)
      const client = new Client({ name: 'transport-audit', version: '1.0.0' })
      await client.connect(transport)
      return { sessionId: () => transport.sessionId, callTool: (name: string) => client.callTool({ name, arguments: {} }), terminate: () => transport.terminateSession(), close: () => client.close() }
    }
    const transport = new StreamableHTTPClientTransportV2(url, options)
    const client = new ClientV2({ name: 'transport-audit', version: '1.0.0' })
    await client.connect(transport)
    return { sessionId: () => transport.sessionId, callTool: (name: string) => client.callTool({ name, arguments: {} }), terminate: () => transport.terminateSession(), close: () => client.close() }
  }

  /** The HTTP status of the error a client's call rejected with (`StreamableHTTPError` of 1.x, `SdkHttpError` of 2.x). */
  function statusOf(error: unknown): number | undefined {
    if (error instanceof StreamableHTTPError) return error.code
    if (error instanceof SdkHttpError) return error.status
    return undefined
  }

  const CASES = [
    ...(['v1', 'v2'] as const).map((sdk) => ({ sdk, pins: 'synchronous' })),
    { sdk: 'v1', pins: 'asynchronous' },
  ] as const
  for (const { sdk, pins } of CASES) {
    for (const kind of ADAPTER_KINDS) {
      for (const how of ['its pin expired', 'the App forgot it'] as const) {
        it(`SDK ${sdk}, ${kind}, ${pins} pins: ${how}`, async () => {
          const stack = await start(kind, {}, pins === 'asynchronous')
          stacks.push(stack)
          const log: Array<[string, number, string | null]> = []
          const first = await connectClient(sdk, stack, log)
          const firstId = first.sessionId()!
          expect(stack.pins.pins.get(firstId)?.version).toBe('2.0.0')
          stack.fixture.apps.deploy('app_weather', '2.1.0')
          expect((await first.callTool('get_version')).content).toEqual([{ type: 'text', text: '2.0.0' }])
          if (how === 'its pin expired') await stack.pins.delete(firstId)
          else stack.seen.forget()
          const refused = await first.callTool('get_version').then(
            () => undefined,
            (error: unknown) => error,
          )
          expect(statusOf(refused)).toBe(404)
          // The App's own 404 (JSON) ended the pin too: the next request is the dispatch layer's.
          expect(stack.pins.pins.has(firstId)).toBe(false)
          await first.close()
          // What an application does on that 404 (neither client does it by itself).
          const second = await connectClient(sdk, stack, log)
          const secondId = second.sessionId()!
          expect(secondId).not.toBe(firstId)
          expect(stack.pins.pins.get(secondId)?.version).toBe('2.1.0')
          expect((await second.callTool('get_version')).content).toEqual([{ type: 'text', text: '2.1.0' }])
          stack.fixture.apps.deploy('app_weather', '2.2.0')
          expect((await second.callTool('get_version')).content).toEqual([{ type: 'text', text: '2.1.0' }])
          await second.terminate()
          await second.close()
          expect(stack.pins.pins.size).toBe(0)
          // Every answer of the App carried its session's version; the dispatch layer's 404s carried none.
          const refusals = log.filter(([, status]) => status === 404)
          expect(refusals.length).toBeGreaterThanOrEqual(1)
          expect(refusals.every(([, , version]) => version === null || (how === 'the App forgot it' && version === '2.0.0'))).toBe(true)
          expect(log.filter(([, status]) => status < 300).every(([, , version]) => version === '2.0.0' || version === '2.1.0')).toBe(true)
          expect(stack.fixture.errors).toEqual([])
        })
      }
    }
  }
})

describe('MCP-Protocol-Version: passed to the App as sent, validated by the App alone', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}`, async () => {
      const stack = await start(kind)
      stacks.push(stack)
      const id = await openSession(stack)
      const send = caller(stack)
      const call = (protocol: string | undefined) =>
        send('POST', { ...BOTH, 'mcp-session-id': id, ...(protocol !== undefined && { 'mcp-protocol-version': protocol }) }, {
          jsonrpc: '2.0',
          id: 5,
          method: 'tools/call',
          params: { name: 'get_version', arguments: {} },
        })
      for (const protocol of [PROTOCOL, '2025-06-18', '2025-03-26', undefined]) {
        const answer = await call(protocol)
        expect([protocol, answer.status, answer.headers.get('x-mcp-version')]).toEqual([protocol, 200, '2.0.0'])
        await answer.text()
      }
      expect(stack.seen.protocolVersions).toEqual([PROTOCOL, '2025-06-18', '2025-03-26', undefined])
      // Unsupported or malformed: the SDK's 400, with the version headers (an answer of the App).
      for (const protocol of ['1999-01-01', 'not-a-version', '2025-11-25, 2025-06-18']) {
        const answer = await call(protocol)
        const body = (await answer.json()) as { error: { code: number; message: string } }
        expect([protocol, answer.status, body.error.code, answer.headers.get('x-mcp-version')]).toEqual([protocol, 400, -32000, '2.0.0'])
        expect(body.error.message).toContain('Unsupported protocol version')
      }
      // A GET and a DELETE the SDK refuses for it: 400, and the DELETE ended nothing.
      for (const method of ['GET', 'DELETE']) {
        const answer = await send(method, { accept: 'text/event-stream', 'mcp-session-id': id, 'mcp-protocol-version': '1999-01-01' })
        expect([method, answer.status, answer.headers.get('x-mcp-version')]).toEqual([method, 400, '2.0.0'])
        await answer.text()
      }
      expect(stack.pins.pins.has(id)).toBe(true)
      const still = await call(PROTOCOL)
      expect([still.status, still.headers.get('x-mcp-version')]).toEqual([200, '2.0.0'])
      await still.text()
      // DELETE with a supported version ends both.
      const deleted = await send('DELETE', { 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL })
      expect([deleted.status, deleted.headers.get('x-mcp-version')]).toEqual([200, '2.0.0'])
      expect(stack.pins.pins.has(id)).toBe(false)
      expect(stack.fixture.errors).toEqual([])
    })
  }
})

/** Reads SSE events from a stream until `count` events with an id came; answers them. */
async function readEvents(response: Response, count: number): Promise<Array<{ id: string; data: string }>> {
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let text = ''
  const events: Array<{ id: string; data: string }> = []
  while (events.length < count) {
    const { done, value } = await reader.read()
    if (done) break
    text += decoder.decode(value, { stream: true })
    let end: number
    while ((end = text.indexOf('\n\n')) !== -1) {
      const block = text.slice(0, end)
      text = text.slice(end + 2)
      const id = /^id: ?(.*)$/m.exec(block)?.[1]
      const data = /^data: ?(.*)$/m.exec(block)?.[1]
      if (id !== undefined && data) events.push({ id, data })
    }
  }
  await reader.cancel()
  return events
}

describe('a GET stream resumed with Last-Event-ID after a deploy that replaced the pinned patch: the pinned version, with its headers', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}`, async () => {
      const stack = await start(kind)
      stacks.push(stack)
      const id = await openSession(stack)
      const send = caller(stack)
      const inSession = { ...BOTH, 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL }
      const stream = { accept: 'text/event-stream', 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL }
      const announce = async (n: number) => {
        const answer = await send('POST', inSession, { jsonrpc: '2.0', id: n, method: 'tools/call', params: { name: 'announce', arguments: {} } })
        expect(answer.status).toBe(200)
        await answer.text()
      }
      const opened = await send('GET', stream)
      expect([opened.status, opened.headers.get('x-mcp-version'), opened.headers.get('x-mcp-latest-version')]).toEqual([200, '2.0.0', '2.0.0'])
      const events = readEvents(opened, 1)
      await announce(10)
      const [first] = await events
      expect(first!.data).toContain('notifications/tools/list_changed')
      // The stream is gone; meanwhile the App notifies again, and a deploy replaces 2.0.0.
      let released = false
      for (const deadline = Date.now() + 3_000; !released && Date.now() < deadline; ) {
        await announce(11)
        const probe = await send('GET', stream)
        released = probe.status === 200
        if (released) await probe.body!.cancel()
        else await probe.text()
      }
      stack.fixture.apps.deploy('app_weather', '2.0.1')
      expect(await stack.fixture.apps.getLiveVersions('app_weather')).not.toContain('2.0.0')
      // Through `/`, `/v2` (whose line holds the pin) and the pinned version's own exact URL, no
      // longer live; the exact URL of another version is 404.
      for (const path of ['/', '/v2', '/v2.0.0']) {
        const resumed = await caller(stack, path)('GET', { ...stream, 'last-event-id': first!.id })
        expect([path, resumed.status, resumed.headers.get('x-mcp-version'), resumed.headers.get('x-mcp-latest-version')]).toEqual([path, 200, '2.0.0', '2.0.1'])
        const replayed = await readEvents(resumed, 1)
        expect(replayed[0]!.data).toContain('notifications/tools/list_changed')
        expect(replayed[0]!.id).not.toBe(first!.id)
      }
      const elsewhere = await caller(stack, '/v2.0.1')('GET', { ...stream, 'last-event-id': first!.id })
      expect([elsewhere.status, (await elsewhere.json()).error.data, elsewhere.headers.get('x-mcp-version')]).toEqual([404, { error: 'session_not_found' }, null])
      expect(stack.pins.pins.get(id)?.version).toBe('2.0.0')
      expect(stack.fixture.errors).toEqual([])
    })
  }
})

describe('Origin', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: without allowedOrigins, a DNS-rebinding page (its own name, resolved to this server) gets no further than the 401: it has no credential to send`, async () => {
      const stack = await start(kind, { allowedOrigins: undefined })
      stacks.push(stack)
      const before = stack.seen.requests.length
      // The attacker's name chosen so the default resolveApp finds the App (first label = slug).
      const host = `weather.rebind.example:${stack.port}`
      for (const method of ['POST', 'GET', 'DELETE']) {
        const answer = await rawExchange(
          stack.port,
          `${method} / HTTP/1.1\r\nHost: ${host}\r\nOrigin: http://${host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n` +
            `Content-Length: ${method === 'POST' ? 2 : 0}\r\nConnection: close\r\n\r\n${method === 'POST' ? '{}' : ''}`,
        )
        expect([method, answer.status]).toEqual([method, 401])
        expect(answer.head).toContain('www-authenticate: bearer resource_metadata=')
      }
      expect(stack.seen.requests.length).toBe(before)
    })

    it(`${kind}: with allowedOrigins, a refused Origin is 403 before the App on every method of a live session, which goes on`, async () => {
      const stack = await start(kind)
      stacks.push(stack)
      const id = await openSession(stack)
      const send = caller(stack)
      const before = stack.seen.requests.length
      for (const origin of ['https://evil.example', `http://${HOST}:${stack.port}`, 'null', `${ALLOWED_ORIGIN}, https://evil.example`]) {
        for (const method of ['POST', 'GET', 'DELETE']) {
          const answer = await send(method, { ...BOTH, origin, 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL }, method === 'POST' ? { jsonrpc: '2.0', id: 6, method: 'ping' } : undefined)
          const body = (await answer.json()) as { error: { data: unknown } }
          expect([origin, method, answer.status, body.error.data, answer.headers.get('x-mcp-version')]).toEqual([origin, method, 403, { error: 'origin_not_allowed' }, null])
        }
      }
      expect(stack.seen.requests.length).toBe(before)
      const allowed = await send('POST', { ...BOTH, origin: ALLOWED_ORIGIN, 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL }, { jsonrpc: '2.0', id: 7, method: 'ping' })
      expect([allowed.status, allowed.headers.get('x-mcp-version'), allowed.headers.get('access-control-allow-origin')]).toEqual([200, '2.0.0', ALLOWED_ORIGIN])
      await allowed.text()
      expect(stack.pins.pins.has(id)).toBe(true)
    })
  }
})

describe('batches and notifications alone: one rate-limit unit per HTTP request, whatever it holds', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}`, async () => {
      const stack = await start(kind, { rateLimit: { policy: () => ({ limit: 4, windowType: 'minute' }) } })
      stacks.push(stack)
      const send = caller(stack)
      const opened = await send('POST', BOTH, { ...INITIALIZE, params: { ...INITIALIZE.params, protocolVersion: '2025-03-26' } })
      await opened.text()
      const id = opened.headers.get('mcp-session-id')!
      expect(opened.headers.get('ratelimit')).toBe('"minute";r=3;t=30')
      const inSession = { ...BOTH, 'mcp-session-id': id, 'mcp-protocol-version': '2025-03-26' }
      const seen = async (body: unknown) => {
        const answer = await send('POST', inSession, body)
        const text = await answer.text()
        return { status: answer.status, text, version: answer.headers.get('x-mcp-version'), ratelimit: answer.headers.get('ratelimit') }
      }
      const initialized = await seen({ jsonrpc: '2.0', method: 'notifications/initialized' })
      expect(initialized).toEqual({ status: 202, text: '', version: '2.0.0', ratelimit: '"minute";r=2;t=30' })
      const batch = await seen([
        { jsonrpc: '2.0', id: 2, method: 'ping' },
        { jsonrpc: '2.0', id: 3, method: 'tools/list' },
        { jsonrpc: '2.0', id: 4, method: 'ping' },
      ])
      expect([batch.status, batch.version, batch.ratelimit]).toEqual([200, '2.0.0', '"minute";r=1;t=30'])
      expect(batch.text).toMatch(/"id":2[\s\S]*"id":3[\s\S]*"id":4/)
      const notifications = await seen([
        { jsonrpc: '2.0', method: 'notifications/roots/list_changed' },
        { jsonrpc: '2.0', method: 'notifications/roots/list_changed' },
      ])
      expect(notifications).toEqual({ status: 202, text: '', version: '2.0.0', ratelimit: '"minute";r=0;t=30' })
      const limited = await send('POST', inSession, { jsonrpc: '2.0', id: 5, method: 'ping' })
      expect([limited.status, limited.headers.get('x-mcp-version'), (await limited.json()).error.code]).toEqual([429, null, -32000])
      expect(stack.fixture.errors).toEqual([])
    })
  }
})

describe('Accept on POST and GET: the SDK\'s answers, the dispatch layer adding only its headers', () => {
  const POSTS = [
    'application/json, text/event-stream',
    'text/event-stream, application/json',
    'application/json;q=0.9, text/event-stream;q=0.1',
    'application/json',
    'text/event-stream',
    '*/*',
    'application/*, text/*',
    'text/html',
    '',
  ]
  const GETS = ['text/event-stream', 'text/event-stream;q=0.5', 'application/json, text/event-stream', 'application/json', '*/*', '']

  async function answers(stack: Stack): Promise<Array<[string, number, string | null]>> {
    const id = await openSession(stack)
    const send = caller(stack)
    const out: Array<[string, number, string | null]> = []
    for (const accept of POSTS) {
      const answer = await send('POST', { 'content-type': 'application/json', 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL, ...(accept && { accept }) }, { jsonrpc: '2.0', id: 8, method: 'ping' })
      await answer.text()
      out.push([`POST ${accept}`, answer.status, answer.headers.get('x-mcp-version')])
    }
    for (const accept of GETS) {
      const answer = await send('GET', { 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL, ...(accept && { accept }) })
      out.push([`GET ${accept}`, answer.status, answer.headers.get('x-mcp-version')])
      // A stream opened is let go before the next (else the next GET is the SDK's 409).
      if (answer.status === 200) {
        await answer.body!.cancel()
        for (const deadline = Date.now() + 3_000; Date.now() < deadline; ) {
          const probe = await send('GET', { accept: 'text/event-stream', 'mcp-session-id': id, 'mcp-protocol-version': PROTOCOL })
          if (probe.status === 200) {
            await probe.body!.cancel()
            break
          }
          await probe.text()
        }
        await new Promise((resolve) => setTimeout(resolve, 20))
      } else await answer.text()
    }
    return out
  }

  let direct: Array<[string, number, string | null]>
  it('directly (the baseline)', async () => {
    const stack = await start('direct')
    stacks.push(stack)
    direct = await answers(stack)
    expect(direct.filter(([, status]) => status === 406).length).toBeGreaterThan(3)
  })

  for (const kind of ADAPTER_KINDS) {
    it(`${kind}`, async () => {
      const stack = await start(kind)
      stacks.push(stack)
      const seen = await answers(stack)
      expect(seen.map(([step, status]) => [step, status])).toEqual(direct.map(([step, status]) => [step, status]))
      expect(seen.every(([, , version]) => version === '2.0.0')).toBe(true)
      expect(stack.fixture.errors).toEqual([])
    })
  }
})
