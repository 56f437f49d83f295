/**
 * The MCP features the full session of mcp-session.test.ts does not exercise, through every
 * adapter in front of the SDK's own transports (Node's behind Express and Fastify, the
 * web-standard one behind the Web adapter), each compared with the same server talked to
 * directly:
 * - a request the client cancels: the server's `extra.signal` aborts (the client's
 *   `notifications/cancelled` reached it);
 * - a tool call's SSE stream resumed with `Last-Event-ID`: the events after it are replayed,
 *   on a `GET` that carries the session's version;
 * - a stateless server in JSON-response mode (no session, no SSE): every answer is
 *   `application/json`, with the version headers.
 */
import { randomUUID } from 'node:crypto'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import Fastify from 'fastify'
import { mcpDispatch as expressDispatch, routeByVersion as expressRoutes } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch, routeByVersion as fastifyRoutes } from 'mcp-dispatch/fastify'
import { mcpDispatch as webDispatch, routeByVersion as webRoutes } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { z } from 'zod'
import { createSessionEventStore } from '../../examples/platform/event-store.js'
import { EXPRESS } from '../helpers/express.js'
import { serveFetch } from '../helpers/platform.js'
import { ADAPTER_KINDS, type AdapterKind, type Fixture, close, createFixture, isExpress, listen, loopbackFetch, readUntil } from './helpers.js'

type Mode = 'sessions' | 'stateless'

/** What the servers of one stack saw of the `wait` tool, by its `key`: started, cancelled. */
class Seen {
  private readonly slots = new Map<string, { promise: Promise<void>; resolve: () => void }>()
  private slot(what: string) {
    let slot = this.slots.get(what)
    if (slot === undefined) {
      let resolve!: () => void
      const promise = new Promise<void>((r) => (resolve = r))
      this.slots.set(what, (slot = { promise, resolve }))
    }
    return slot
  }
  /** Settles once the server runs (`started`) or is told to cancel (`cancelled`) the call of `key`. */
  when(event: 'started' | 'cancelled', key: string): Promise<void> {
    return this.slot(`${event}:${key}`).promise
  }
  mark(event: 'started' | 'cancelled', key: string): void {
    this.slot(`${event}:${key}`).resolve()
  }
}

/** The App version as an SDK server: `get_version`, `steps` (n progress notifications), `wait` (until cancelled). */
function buildServer(version: string, seen: Seen): McpServer {
  const server = new McpServer({ name: 'weather', version })
  server.registerTool('get_version', { inputSchema: {} }, async () => ({ content: [{ type: 'text', text: version }] }))
  server.registerTool('steps', { inputSchema: { n: z.number().int().min(1).max(10) } }, async ({ n }, extra) => {
    const token = extra._meta?.progressToken
    for (let i = 1; i <= n; i++) {
      if (token !== undefined) await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: n } })
    }
    return { content: [{ type: 'text', text: `${n} steps` }] }
  })
  server.registerTool('wait', { inputSchema: { key: z.string() } }, async ({ key }, extra) => {
    seen.mark('started', key)
    await new Promise<void>((resolve) => extra.signal.addEventListener('abort', () => resolve(), { once: true }))
    seen.mark('cancelled', key)
    return { content: [{ type: 'text', text: 'cancelled' }] }
  })
  return server
}

/** One version's handler on the SDK's Node transport: sessions with an event store, or stateless JSON. */
function nodeHandler(version: string, mode: Mode, seen: Seen) {
  const sessions = new Map<string, StreamableHTTPServerTransport>()
  return async (req: IncomingMessage, res: ServerResponse, body: unknown) => {
    if (mode === 'stateless') {
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true })
      await buildServer(version, seen).connect(transport)
      res.on('close', () => void transport.close())
      return transport.handleRequest(req, res, body)
    }
    const id = req.headers['mcp-session-id']
    let transport = typeof id === 'string' ? sessions.get(id) : undefined
    if (transport === undefined) {
      const created: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: createSessionEventStore(),
        onsessioninitialized: (sid) => void sessions.set(sid, created),
      })
      await buildServer(version, seen).connect(created)
      transport = created
    }
    return transport.handleRequest(req, res, body)
  }
}

/** The same on the SDK's web-standard transport. */
function webHandler(version: string, mode: Mode, seen: Seen) {
  const sessions = new Map<string, WebStandardStreamableHTTPServerTransport>()
  return async (request: Request) => {
    if (mode === 'stateless') {
      const transport = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true })
      await buildServer(version, seen).connect(transport)
      return transport.handleRequest(request)
    }
    const id = request.headers.get('mcp-session-id')
    let transport = id ? sessions.get(id) : undefined
    if (transport === undefined) {
      const created: WebStandardStreamableHTTPServerTransport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: createSessionEventStore(),
        onsessioninitialized: (sid) => void sessions.set(sid, created),
      })
      await buildServer(version, seen).connect(created)
      transport = created
    }
    return transport.handleRequest(request)
  }
}

interface Stack {
  url: string
  seen: Seen
  headers: Record<string, string>
  close(): Promise<void>
}

/** `kind` in front of the version's server, or (`direct`) the server alone on the Node transport. */
async function start(kind: AdapterKind | 'direct', mode: Mode, fixture: Fixture): Promise<Stack> {
  const seen = new Seen()
  const headers = { authorization: `Bearer ${fixture.tokens.alice}` }
  const onError = (error: unknown, context: string) => fixture.errors.push({ error, context })
  if (kind === 'direct') {
    const handle = nodeHandler('2.0.0', mode, seen)
    const server = http.createServer((req, res) => {
      let text = ''
      req.on('data', (chunk: Buffer) => (text += chunk.toString()))
      req.on('end', () => void handle(req, res, text ? JSON.parse(text) : undefined))
    })
    const port = await listen(server)
    return { url: `http://127.0.0.1:${port}/mcp`, seen, headers: {}, close: () => close(server) }
  }
  if (kind === 'web') {
    const served = await serveFetch(
      webDispatch({ dispatcher: fixture.dispatcher, onError, handler: webRoutes((_app, version) => webHandler(version, mode, seen)) }),
    )
    return { url: `http://weather.localhost:${served.port}/v2`, seen, headers, close: served.close }
  }
  if (isExpress(kind)) {
    const framework = EXPRESS[kind]
    const app = framework()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher, onError }))
    app.use(framework.json())
    app.use(
      expressRoutes((_app, version) => {
        const handle = nodeHandler(version, mode, seen)
        return (req, res) => handle(req, res, req.body)
      }),
    )
    const server = http.createServer(app)
    const port = await listen(server)
    return { url: `http://weather.localhost:${port}/v2`, seen, headers, close: () => close(server) }
  }
  const app = Fastify({ forceCloseConnections: true })
  await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError }))
  app.all(
    '/*',
    fastifyRoutes((_app, version) => {
      const handle = nodeHandler(version, mode, seen)
      return async (request, reply) => {
        reply.hijack()
        await handle(request.raw, reply.raw, request.body)
      }
    }),
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { url: `http://weather.localhost:${(app.server.address() as AddressInfo).port}/v2`, seen, headers, close: () => app.close() }
}

async function connect(stack: Stack): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const transport = new StreamableHTTPClientTransport(new URL(stack.url), { fetch: loopbackFetch, requestInit: { headers: stack.headers } })
  const client = new Client({ name: 'features', version: '1.0.0' })
  await client.connect(transport)
  return { client, transport }
}

/** The `id:` and `data:` of each event of an SSE text. */
function events(text: string): Array<{ id: string | undefined; data: string | undefined }> {
  return text
    .split(/\n\n/)
    .filter((block) => block.trim() !== '')
    .map((block) => ({ id: /^id: ?(.*)$/m.exec(block)?.[1], data: /^data: ?(.*)$/m.exec(block)?.[1] }))
}

/** Cancellation, then a stream resumed with Last-Event-ID; what a client sees of both. */
async function sessionFeatures(stack: Stack): Promise<{ cancelled: boolean; replayed: string[]; replayVersion: string | null; callVersion: string | null }> {
  const { client, transport } = await connect(stack)
  try {
    // Cancelled by the client once the server is running it.
    const controller = new AbortController()
    const call = client.callTool({ name: 'wait', arguments: { key: 'one' } }, undefined, { signal: controller.signal }).catch((e: unknown) => e)
    await stack.seen.when('started', 'one')
    controller.abort('the user pressed stop')
    expect(await call).toBeInstanceOf(Error)
    // The server's signal aborts once the client's notifications/cancelled reaches it.
    let timer: ReturnType<typeof setTimeout> | undefined
    const cancelled = await Promise.race([
      stack.seen.when('cancelled', 'one').then(() => true),
      new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), 10_000))),
    ])
    clearTimeout(timer)

    // A tool call's stream, read to its end, then resumed from its second event.
    const base = {
      ...stack.headers,
      'mcp-session-id': transport.sessionId!,
      'mcp-protocol-version': transport.protocolVersion ?? '2025-11-25',
    }
    const posted = await loopbackFetch(stack.url, {
      method: 'POST',
      headers: { ...base, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'steps', arguments: { n: 3 }, _meta: { progressToken: 'p' } } }),
    })
    expect(posted.headers.get('content-type')).toMatch(/^text\/event-stream/)
    const sent = events(await posted.text()).filter((e) => e.data !== undefined && e.data !== '')
    expect(sent).toHaveLength(4) // three progress notifications and the result
    const resumed = await loopbackFetch(stack.url, { method: 'GET', headers: { ...base, accept: 'text/event-stream', 'last-event-id': sent[1]!.id! } })
    expect(resumed.status).toBe(200)
    const reader = resumed.body!.getReader()
    const replayedText = await readUntil(reader, '"id":7')
    await reader.cancel()
    const replayed = events(replayedText)
      .filter((e) => e.data !== undefined && e.data !== '')
      .map((e) => e.data!)
    return { cancelled, replayed, replayVersion: resumed.headers.get('x-mcp-version'), callVersion: posted.headers.get('x-mcp-version') }
  } finally {
    await transport.terminateSession().catch(() => {})
    await client.close()
  }
}

/** A stateless JSON-mode server: what the client gets, and the media type and version of each answer. */
async function statelessFeatures(stack: Stack): Promise<{ version: unknown; tools: string[]; answers: Array<[string | null, string | null]> }> {
  const answers: Array<[string | null, string | null]> = []
  const recording = async (input: string | URL | Request, init?: RequestInit) => {
    const response = await loopbackFetch(input, init)
    if ((init?.method ?? 'GET') === 'POST' && response.status === 200) {
      answers.push([response.headers.get('content-type')?.split(';')[0] ?? null, response.headers.get('x-mcp-version')])
    }
    return response
  }
  const transport = new StreamableHTTPClientTransport(new URL(stack.url), { fetch: recording, requestInit: { headers: stack.headers } })
  const client = new Client({ name: 'features', version: '1.0.0' })
  await client.connect(transport)
  try {
    const tools = (await client.listTools()).tools.map((t) => t.name).sort()
    const version = (await client.callTool({ name: 'get_version', arguments: {} })).content
    return { version, tools, answers }
  } finally {
    await client.close()
  }
}

describe('MCP features through every adapter, as directly', () => {
  it('directly: cancellation reaches the server, Last-Event-ID replays the rest, stateless JSON answers JSON', async () => {
    const fixture = createFixture()
    const sessions = await start('direct', 'sessions', fixture)
    try {
      const seen = await sessionFeatures(sessions)
      expect(seen.replayed.map((data) => JSON.parse(data).params?.progress ?? 'result')).toEqual([3, 'result'])
    } finally {
      await sessions.close()
    }
    const stateless = await start('direct', 'stateless', fixture)
    try {
      const seen = await statelessFeatures(stateless)
      expect(seen.answers.every(([type]) => type === 'application/json')).toBe(true)
    } finally {
      await stateless.close()
    }
  })

  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: a cancelled request reaches the server; a stream resumed with Last-Event-ID replays what followed, with the session's version`, async () => {
      const fixture = createFixture()
      const direct = await start('direct', 'sessions', fixture)
      const baseline = await sessionFeatures(direct).finally(() => direct.close())
      const stack = await start(kind, 'sessions', fixture)
      try {
        const seen = await sessionFeatures(stack)
        expect(seen.cancelled).toBe(true)
        expect(seen.replayed).toEqual(baseline.replayed)
        expect([seen.callVersion, seen.replayVersion]).toEqual(['2.0.0', '2.0.0'])
        expect(fixture.errors).toEqual([])
      } finally {
        await stack.close()
      }
    })

    it(`${kind}: a stateless server in JSON-response mode answers as directly, each answer JSON with the version headers`, async () => {
      const fixture = createFixture()
      const direct = await start('direct', 'stateless', fixture)
      const baseline = await statelessFeatures(direct).finally(() => direct.close())
      const stack = await start(kind, 'stateless', fixture)
      try {
        const seen = await statelessFeatures(stack)
        expect({ version: seen.version, tools: seen.tools }).toEqual({ version: baseline.version, tools: baseline.tools })
        expect(seen.answers.length).toBe(baseline.answers.length)
        expect(seen.answers.every(([type, version]) => type === 'application/json' && version === '2.0.0')).toBe(true)
        expect(fixture.errors).toEqual([])
      } finally {
        await stack.close()
      }
    })
  }
})
