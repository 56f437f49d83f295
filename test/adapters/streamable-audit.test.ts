/**
 * The finer points of the MCP Streamable HTTP transport (revisions 2025-03-26 to 2025-11-25)
 * through every adapter and through the proxy handler, each compared with the same SDK server
 * talked to directly (what mcp-session.test.ts and mcp-features.test.ts leave out):
 * - a server request on the standalone GET stream (an elicitation with no related request),
 *   answered by a POST of the client's that the session's pinned version serves (202, with the
 *   version headers), across a deploy;
 * - a POST stream the server closes mid-call (SEP-1699, 2025-11-25) and the GET stream it
 *   closes, each resumed by the SDK client with `GET` and `Last-Event-ID` at the pinned version,
 *   what was sent while they were closed replayed;
 * - the answers the transport leaves to the server, as the SDK gives them: a 2025-03-26 JSON-RPC
 *   batch, notifications or responses alone (202, no body), an `Accept` without both media
 *   types (406), an unsupported `MCP-Protocol-Version` (400), a second GET stream (409), a GET
 *   stream the client aborted and opens again (200, not the 409 of a stream never let go),
 *   `DELETE` (200) and the 404 of the session after it;
 * - over HTTP/2, a GET stream the client resets (RST_STREAM) is let go the same way.
 */
import { randomUUID } from 'node:crypto'
import * as http from 'node:http'
import * as http2 from 'node:http2'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import { ElicitRequestSchema, ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import Fastify from 'fastify'
import { generateKeyPair } from 'jose'
import { type SessionPin, type SessionStore, createMemorySessionStore } from 'mcp-dispatch'
import { mcpDispatch as expressDispatch, routeByVersion as expressRoutes } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch, routeByVersion as fastifyRoutes } from 'mcp-dispatch/fastify'
import { type IdentitySigner, createIdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { mcpDispatch as webDispatch, routeByVersion as webRoutes } from 'mcp-dispatch/web'
import { beforeAll, describe, expect, it } from 'vitest'
import { createSessionEventStore } from '../../examples/platform/event-store.js'
import { EXPRESS } from '../helpers/express.js'
import { serveFetch } from '../helpers/platform.js'
import { type Fixture, close, createFixture, listen, loopbackFetch, serveWebHandler } from './helpers.js'

const SESSION_NOT_FOUND = '{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}'

/**
 * The App version as an SDK server. `ask_on_get`: an elicitation with no related request, so
 * it goes on the GET stream; `poll`: closes its own POST stream (SEP-1699) before answering;
 * `close_get`: closes the GET stream, then notifies a tool-list change (sent while it is closed).
 */
function buildServer(version: string): McpServer {
  const server = new McpServer({ name: 'weather', version }, { capabilities: { tools: { listChanged: true } } })
  server.registerTool('get_version', { inputSchema: {} }, async () => ({ content: [{ type: 'text', text: version }] }))
  server.registerTool('ask_on_get', { inputSchema: {} }, async () => {
    const result = await server.server.elicitInput({
      message: 'Which city?',
      requestedSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    })
    return { content: [{ type: 'text', text: `${result.action}: ${String(result.content?.city)}` }] }
  })
  server.registerTool('poll', { inputSchema: {} }, async (_args, extra) => {
    extra.closeSSEStream?.()
    return { content: [{ type: 'text', text: extra.closeSSEStream ? 'answered after the stream closed' : 'no event store' }] }
  })
  server.registerTool('close_get', { inputSchema: {} }, async (_args, extra) => {
    extra.closeStandaloneSSEStream?.()
    server.sendToolListChanged()
    return { content: [{ type: 'text', text: 'GET stream closed' }] }
  })
  return server
}

/** The `retry` the servers send on their streams: the client reconnects this long after a stream closed. */
const RETRY_MS = 20

/** One version's sessions on the SDK's Node transport (Express, Fastify, the upstream of the proxy). */
function nodeSessions(version: string) {
  const sessions = new Map<string, StreamableHTTPServerTransport>()
  return async (req: IncomingMessage, res: ServerResponse, body?: unknown): Promise<void> => {
    const id = req.headers['mcp-session-id']
    if (typeof id === 'string') {
      const transport = sessions.get(id)
      if (transport) return transport.handleRequest(req, res, body)
      return void res.writeHead(404, { 'content-type': 'application/json' }).end(SESSION_NOT_FOUND)
    }
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      // Resumable: an event store of its own (the SDK's example InMemoryEventStore replays nothing
      // of the GET stream: it reads the stream id `_GET_stream` of an event id as '').
      eventStore: createSessionEventStore(),
      retryInterval: RETRY_MS,
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (sid) => void sessions.set(sid, transport),
      onsessionclosed: (sid) => void sessions.delete(sid),
    })
    await buildServer(version).connect(transport)
    await transport.handleRequest(req, res, body)
  }
}

/** The same on the SDK's web-standard transport (the Web adapter). */
function webSessions(version: string) {
  const sessions = new Map<string, WebStandardStreamableHTTPServerTransport>()
  return async (request: Request): Promise<Response> => {
    const id = request.headers.get('mcp-session-id')
    if (id !== null) {
      const transport = sessions.get(id)
      if (transport) return transport.handleRequest(request)
      return new Response(SESSION_NOT_FOUND, { status: 404, headers: { 'content-type': 'application/json' } })
    }
    const transport: WebStandardStreamableHTTPServerTransport = new WebStandardStreamableHTTPServerTransport({
      eventStore: createSessionEventStore(), // resumable, as above
      retryInterval: RETRY_MS,
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (sid) => void sessions.set(sid, transport),
      onsessionclosed: (sid) => void sessions.delete(sid),
    })
    await buildServer(version).connect(transport)
    return transport.handleRequest(request)
  }
}

/** A session store that answers with promises, as Redis does (a new session's head is held for its pin). */
function asynchronousPins(): SessionStore {
  const memory = createMemorySessionStore()
  const later = <T>(value: T) => new Promise<T>((resolve) => setImmediate(resolve, value))
  return {
    get: (id, ttlMs) => later(memory.get(id, ttlMs) as SessionPin | undefined),
    set: (id, pin, ttlMs) => later(memory.set(id, pin, ttlMs) as boolean | void),
    delete: (id) => later(memory.delete(id) as void),
  }
}

const STACKS = [
  'web',
  'web (no outgoing)',
  'express',
  'express4',
  'fastify',
  'express (asynchronous pins)',
  'proxy (web)',
  'proxy (express)',
  'proxy (fastify)',
] as const
type StackKind = (typeof STACKS)[number] | 'direct'

interface Stack {
  url: string
  headers: Record<string, string>
  fixture: Fixture
  close(): Promise<void>
}

/** A server on 127.0.0.1 serving `nodeSessions` of each version at `/v/<version>/mcp` (the proxy's upstream, or the direct baseline). */
async function serveNodeSessions(): Promise<{ origin: string; close(): Promise<void> }> {
  const versions = new Map<string, ReturnType<typeof nodeSessions>>()
  const server = http.createServer((req, res) => {
    const version = /^\/v\/([^/]+)\/mcp$/.exec(req.url ?? '')?.[1]
    if (version === undefined) return void res.writeHead(404).end()
    let serve = versions.get(version)
    if (serve === undefined) versions.set(version, (serve = nodeSessions(version)))
    void serve(req, res)
  })
  return { origin: `http://127.0.0.1:${await listen(server)}`, close: () => close(server) }
}

let signer: IdentitySigner

beforeAll(async () => {
  const { privateKey } = await generateKeyPair('ES256', { extractable: true })
  signer = createIdentitySigner({ issuer: 'https://platform.test', privateKey })
})

async function start(kind: StackKind): Promise<Stack> {
  const fixture = createFixture(kind === 'express (asynchronous pins)' ? { sessions: asynchronousPins() } : {})
  const headers = { authorization: `Bearer ${fixture.tokens.alice}` }
  const onError = (error: unknown, context: string) => fixture.errors.push({ error, context })
  const at = (port: number, close: () => Promise<void>): Stack => ({ url: `http://weather.localhost:${port}/v2`, headers, fixture, close })
  if (kind === 'direct') {
    const served = await serveNodeSessions()
    return { url: `${served.origin}/v/2.0.0/mcp`, headers: {}, fixture, close: served.close }
  }
  if (kind === 'web' || kind === 'web (no outgoing)') {
    const dispatch = webDispatch({ dispatcher: fixture.dispatcher, onError, handler: webRoutes((_app, version) => webSessions(version)) })
    const served = await serveFetch((request, info) =>
      dispatch(request, kind === 'web' ? info : { clientAddress: info.clientAddress }),
    )
    return at(served.port, served.close)
  }
  if (kind.startsWith('proxy')) {
    const upstream = await serveNodeSessions()
    const proxy = createProxyHandler({ upstream: (context) => `${upstream.origin}/v/${context.version}/mcp`, identity: signer, onError })
    const served = await serveWebHandler(/\((\w+)\)/.exec(kind)![1] as 'web' | 'express' | 'fastify', fixture, proxy)
    return at(served.port, async () => {
      await served.close()
      await upstream.close()
    })
  }
  if (kind !== 'fastify') {
    const app = EXPRESS[kind === 'express4' ? 'express4' : 'express']()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher, onError }))
    app.use(
      expressRoutes((_app, version) => {
        const serveSessions = nodeSessions(version)
        return (req, res) => serveSessions(req, res)
      }),
    )
    const server = http.createServer(app)
    return at(await listen(server), () => close(server))
  }
  const app = Fastify({ forceCloseConnections: true })
  await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError }))
  app.all(
    '/*',
    fastifyRoutes((_app, version) => {
      const serveSessions = nodeSessions(version)
      return async (request, reply) => {
        reply.hijack()
        await serveSessions(request.raw, reply.raw, request.body)
      }
    }),
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  return at((app.server.address() as AddressInfo).port, () => app.close())
}

/** One HTTP exchange of the SDK client: `answer` marks a POST that carried the client's answer to a server request. */
interface Exchange {
  method: string
  status: number
  version: string | null
  lastEventId: string | null
  answer: boolean
}

interface ClientRun {
  asked: unknown
  polled: unknown
  closed: unknown
  listChanged: boolean
  version: unknown
  exchanges: Exchange[]
  clientErrors: unknown[]
}

/**
 * The SDK client (protocol 2025-11-25) through `stack`: the elicitation on the GET stream, the
 * POST stream closed and resumed, the GET stream closed and resumed; a deploy right after
 * `initialize`, which the session must not see.
 */
async function runClient(stack: Stack, afterInitialize: () => void): Promise<ClientRun> {
  const exchanges: Exchange[] = []
  let getOpened!: () => void
  const getOpen = new Promise<void>((resolve) => (getOpened = resolve))
  const transport = new StreamableHTTPClientTransport(new URL(stack.url), {
    fetch: async (input, init) => {
      const response = await loopbackFetch(input, init)
      const method = init?.method ?? 'GET'
      const sent = typeof init?.body === 'string' ? (JSON.parse(init.body) as { method?: unknown; result?: unknown }) : undefined
      exchanges.push({
        method,
        status: response.status,
        version: response.headers.get('x-mcp-version'),
        lastEventId: new Headers(init?.headers).get('last-event-id'),
        answer: sent !== undefined && sent.method === undefined && sent.result !== undefined,
      })
      if (method === 'GET' && response.status === 200) getOpened()
      return response
    },
    requestInit: { headers: stack.headers },
  })
  const client = new Client({ name: 'streamable-audit', version: '1.0.0' }, { capabilities: { elicitation: { form: {} } } })
  client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { city: 'Lisbon' } }))
  let listChanged!: () => void
  const changed = new Promise<boolean>((resolve) => (listChanged = () => resolve(true)))
  client.setNotificationHandler(ToolListChangedNotificationSchema, async () => listChanged())
  const clientErrors: unknown[] = []
  client.onerror = (error) => clientErrors.push(error)
  await client.connect(transport)
  try {
    afterInitialize()
    // The elicitation goes on the GET stream: the client opens it on its own after initialize.
    await getOpen
    const options = { timeout: 5_000 }
    const asked = (await client.callTool({ name: 'ask_on_get', arguments: {} }, undefined, options)).content
    const polled = (await client.callTool({ name: 'poll', arguments: {} }, undefined, options)).content
    const closed = (await client.callTool({ name: 'close_get', arguments: {} }, undefined, options)).content
    let timer: ReturnType<typeof setTimeout> | undefined
    const notified = await Promise.race([changed, new Promise<false>((resolve) => (timer = setTimeout(resolve, 5_000, false)))])
    clearTimeout(timer)
    const version = (await client.callTool({ name: 'get_version', arguments: {} }, undefined, options)).content
    await transport.terminateSession()
    return { asked, polled, closed, listChanged: notified, version, exchanges, clientErrors }
  } finally {
    await client.close()
  }
}

describe('the SDK client: server requests on the GET stream, and streams the server closes, resumed', () => {
  let direct: ClientRun

  beforeAll(async () => {
    const stack = await start('direct')
    direct = await runClient(stack, () => {}).finally(() => stack.close())
  })

  it('directly: every feature exercised (the baseline)', () => {
    expect(direct).toMatchObject({
      asked: [{ type: 'text', text: 'accept: Lisbon' }],
      polled: [{ type: 'text', text: 'answered after the stream closed' }],
      closed: [{ type: 'text', text: 'GET stream closed' }],
      listChanged: true,
      version: [{ type: 'text', text: '2.0.0' }],
      clientErrors: [],
    })
    // The client's answer to the elicitation: a POST of its own, accepted with 202.
    expect(direct.exchanges.filter((e) => e.answer).map((e) => [e.method, e.status])).toEqual([['POST', 202]])
    // Both streams resumed with Last-Event-ID: the POST stream of `poll`, and the GET stream.
    expect(direct.exchanges.filter((e) => e.method === 'GET' && e.lastEventId !== null && e.status === 200).length).toBeGreaterThanOrEqual(2)
  })

  for (const kind of STACKS) {
    it(`${kind}: as directly, every exchange at the session's version though a deploy came between`, async () => {
      const stack = await start(kind)
      try {
        const run = await runClient(stack, () => stack.fixture.apps.deploy('app_weather', '2.1.0'))
        const { exchanges, ...seen } = run
        const { exchanges: _directExchanges, ...baseline } = direct
        expect(seen).toEqual(baseline)
        // The answer to the server's request reached the pinned version: 202, with its headers.
        expect(exchanges.filter((e) => e.answer).map((e) => [e.method, e.status, e.version])).toEqual([['POST', 202, '2.0.0']])
        const resumed = exchanges.filter((e) => e.method === 'GET' && e.lastEventId !== null)
        expect(resumed.length).toBeGreaterThanOrEqual(2)
        expect(resumed.every((e) => e.status === 200)).toBe(true)
        expect(exchanges.filter((e) => e.version !== '2.0.0')).toEqual([])
        expect(exchanges.at(-1)).toMatchObject({ method: 'DELETE', status: 200 })
        expect(stack.fixture.errors).toEqual([])
      } finally {
        await stack.close()
      }
    })
  }
})

/** One raw exchange: what the client saw, reduced to what must match the SDK's own answer. */
interface Seen {
  step: string
  status: number
  contentType: string | null
  /** The JSON body, or the `data` of each SSE event (session ids and UUIDs blanked). */
  body: string
  version: string | null
}

const BOTH = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const PROTOCOL = '2025-03-26'
const INITIALIZE = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'raw', version: '1.0.0' } },
}

/**
 * The raw exchanges whose answers the transport leaves to the server, in one 2025-03-26
 * session. The dispatch layer answers only for a session that has ended (its own 404).
 */
async function rawSession(stack: Stack): Promise<Seen[]> {
  const seen: Seen[] = []
  let sessionId: string | null = null
  const send = async (step: string, method: string, headers: Record<string, string>, body?: unknown, keepOpen = false) => {
    const controller = new AbortController()
    const response = await loopbackFetch(stack.url, {
      method,
      headers: { ...stack.headers, ...(sessionId !== null && { 'mcp-session-id': sessionId }), ...headers },
      ...(body !== undefined && { body: JSON.stringify(body) }),
      signal: controller.signal,
    })
    const contentType = response.headers.get('content-type')
    let text = ''
    // Of a GET stream only the head is read (then it is left, or kept open). A POST's stream ends with its answers.
    if (method === 'GET' && response.status === 200) {
      if (!keepOpen) controller.abort()
    }
    else if (contentType?.startsWith('text/event-stream')) {
      text = (await response.text())
        .split('\n')
        .filter((line) => line.startsWith('data: ') && line.length > 6)
        .join('|')
    } else text = await response.text()
    seen.push({
      step,
      status: response.status,
      contentType,
      body: text.replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, 'UUID'),
      version: response.headers.get('x-mcp-version'),
    })
    return { response, controller }
  }
  await send('initialize, Accept: application/json', 'POST', { ...BOTH, accept: 'application/json' }, INITIALIZE)
  await send('initialize, Accept: text/event-stream', 'POST', { ...BOTH, accept: 'text/event-stream' }, INITIALIZE)
  sessionId = (await send('initialize', 'POST', BOTH, INITIALIZE)).response.headers.get('mcp-session-id')
  const inSession = { ...BOTH, 'mcp-protocol-version': PROTOCOL }
  await send('notifications/initialized', 'POST', inSession, { jsonrpc: '2.0', method: 'notifications/initialized' })
  await send('a batch of requests', 'POST', inSession, [
    { jsonrpc: '2.0', id: 2, method: 'ping' },
    { jsonrpc: '2.0', id: 3, method: 'tools/list' },
  ])
  await send('a batch of notifications', 'POST', inSession, [{ jsonrpc: '2.0', method: 'notifications/roots/list_changed' }])
  await send('a response alone', 'POST', inSession, { jsonrpc: '2.0', id: 'from-the-server', result: {} })
  await send('a POST, Accept: application/json', 'POST', { ...inSession, accept: 'application/json' }, { jsonrpc: '2.0', id: 4, method: 'ping' })
  await send('no MCP-Protocol-Version', 'POST', BOTH, { jsonrpc: '2.0', id: 5, method: 'ping' })
  await send('an unsupported MCP-Protocol-Version', 'POST', { ...BOTH, 'mcp-protocol-version': '1999-01-01' }, { jsonrpc: '2.0', id: 6, method: 'ping' })
  const stream = { 'mcp-protocol-version': PROTOCOL, accept: 'text/event-stream' }
  await send('a GET, Accept: application/json', 'GET', { ...stream, accept: 'application/json' })
  const first = await send('the GET stream', 'GET', stream, undefined, true)
  await send('a second GET stream', 'GET', stream)
  // The client leaves its stream: the server must let it go (a new one is 200, not 409).
  first.controller.abort()
  let reopened: Seen | undefined
  for (const deadline = Date.now() + 3_000; Date.now() < deadline; await new Promise((resolve) => setTimeout(resolve, 20))) {
    await send('the GET stream, opened again after the client aborted it', 'GET', stream)
    reopened = seen.pop()
    if (reopened!.status !== 409) break
  }
  seen.push(reopened!)
  await send('DELETE', 'DELETE', { 'mcp-protocol-version': PROTOCOL })
  await send('a POST after DELETE', 'POST', inSession, { jsonrpc: '2.0', id: 7, method: 'ping' })
  await send('a GET after DELETE', 'GET', stream)
  return seen
}

describe('raw 2025-03-26 exchanges: the answers the transport leaves to the server are the SDK\'s', () => {
  let direct: Seen[]
  const ENDED = ['a POST after DELETE', 'a GET after DELETE']

  beforeAll(async () => {
    const stack = await start('direct')
    direct = await rawSession(stack).finally(() => stack.close())
  })

  it('directly: the SDK\'s answers (the baseline)', () => {
    const statuses = Object.fromEntries(direct.map((s) => [s.step, s.status]))
    expect(statuses).toEqual({
      'initialize, Accept: application/json': 406,
      'initialize, Accept: text/event-stream': 406,
      initialize: 200,
      'notifications/initialized': 202,
      'a batch of requests': 200,
      'a batch of notifications': 202,
      'a response alone': 202,
      'a POST, Accept: application/json': 406,
      'no MCP-Protocol-Version': 200,
      'an unsupported MCP-Protocol-Version': 400,
      'a GET, Accept: application/json': 406,
      'the GET stream': 200,
      'a second GET stream': 409,
      'the GET stream, opened again after the client aborted it': 200,
      DELETE: 200,
      'a POST after DELETE': 404,
      'a GET after DELETE': 404,
    })
    // Both answers of the batch, in one stream; the 202s without a body.
    expect(direct.find((s) => s.step === 'a batch of requests')!.body).toMatch(/"id":2.*\|.*"id":3/)
    expect(direct.filter((s) => s.status === 202).every((s) => s.body === '' && s.contentType === null)).toBe(true)
  })

  for (const kind of STACKS) {
    it(`${kind}: the same status, media type and body, with the version headers; the dispatch layer's 404 once the session ended`, async () => {
      const stack = await start(kind)
      try {
        const seen = await rawSession(stack)
        expect(seen.map((s) => s.step)).toEqual(direct.map((s) => s.step))
        for (const [i, s] of seen.entries()) {
          if (ENDED.includes(s.step)) {
            // The pin ended with the DELETE: refused before the App, without version headers.
            expect([s.status, JSON.parse(s.body).error.data, s.version]).toEqual([404, { error: 'session_not_found' }, null])
          } else {
            const { version, ...answer } = s
            const { version: _, ...directAnswer } = direct[i]!
            expect(answer).toEqual(directAnswer)
            expect(version, s.step).toBe('2.0.0')
          }
        }
        expect(stack.fixture.errors).toEqual([])
      } finally {
        await stack.close()
      }
    })
  }
})

describe('HTTP/2: a GET stream the client resets (RST_STREAM) is let go, and the session goes on', () => {
  for (const kind of ['web', 'fastify'] as const) {
    it(`${kind}`, async () => {
      const fixture = createFixture()
      const served = await serveWebHandler(kind, fixture, webRoutes((_app, version) => webSessions(version)), { http2: true })
      const session = http2.connect(`http://127.0.0.1:${served.port}`)
      session.on('error', () => {})
      /** A request on the session: answered at its head for a GET stream (left open), else at its end. */
      const ask = (headers: http2.OutgoingHttpHeaders, body?: string) =>
        new Promise<{ status: number; headers: http2.IncomingHttpHeaders; body: string; stream: http2.ClientHttp2Stream }>((resolve, reject) => {
          const stream = session.request({
            ':method': body === undefined ? 'GET' : 'POST',
            ':path': '/v2',
            ':authority': `weather.localhost:${served.port}`,
            authorization: `Bearer ${fixture.tokens.alice}`,
            ...headers,
          })
          let text = ''
          let head: http2.IncomingHttpHeaders = {}
          stream.setEncoding('utf8')
          stream.on('response', (h) => {
            head = h
            if (body === undefined && h[':status'] === 200) resolve({ status: 200, headers: h, body: '', stream })
          })
          stream.on('data', (chunk: string) => (text += chunk))
          stream.on('error', reject)
          stream.on('end', () => resolve({ status: Number(head[':status']), headers: head, body: text, stream }))
          stream.end(body)
        })
      try {
        const initialized = await ask(BOTH, JSON.stringify({ ...INITIALIZE, params: { ...INITIALIZE.params, protocolVersion: '2025-11-25' } }))
        expect([initialized.status, initialized.headers['x-mcp-version']]).toEqual([200, '2.0.0'])
        const inSession = { 'mcp-session-id': String(initialized.headers['mcp-session-id']), 'mcp-protocol-version': '2025-11-25' }
        const first = await ask({ ...inSession, accept: 'text/event-stream' })
        expect([first.status, first.headers['x-mcp-version']]).toEqual([200, '2.0.0'])
        first.stream.close(http2.constants.NGHTTP2_CANCEL)
        let again = await ask({ ...inSession, accept: 'text/event-stream' })
        for (const deadline = Date.now() + 3_000; again.status === 409 && Date.now() < deadline; ) {
          await new Promise((resolve) => setTimeout(resolve, 20))
          again = await ask({ ...inSession, accept: 'text/event-stream' })
        }
        expect([again.status, again.headers['x-mcp-version']]).toEqual([200, '2.0.0'])
        again.stream.close(http2.constants.NGHTTP2_CANCEL)
        const listed = await ask({ ...BOTH, ...inSession }, JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }))
        expect([listed.status, listed.headers['x-mcp-version']]).toEqual([200, '2.0.0'])
        expect(listed.body).toContain('"ask_on_get"')
        expect(fixture.errors).toEqual([])
      } finally {
        session.destroy()
        await served.close()
      }
    })
  }
})
