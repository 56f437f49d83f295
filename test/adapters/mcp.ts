/**
 * The MCP side of the adapter tests: an SDK server with one tool per MCP feature the adapters
 * must carry, session handlers for the SDK's Node and web-standard transports, and a full
 * client session (official SDK client) that records what it saw.
 */
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import { ElicitRequestSchema, ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import { expect } from 'vitest'
import { z } from 'zod'

/**
 * An App version as an SDK server. Tools: `get_version`; `count` (a progress notification per
 * step, on the POST's SSE stream); `ask` (an elicitation request to the client, answered on a
 * separate POST); `announce` (a `tools/list_changed` notification, on the GET stream).
 */
export function buildScenarioServer(slug: string, version: string): McpServer {
  const server = new McpServer({ name: slug, version }, { capabilities: { logging: {}, tools: { listChanged: true } } })
  server.registerTool('get_version', { description: 'The version serving this session', inputSchema: {} }, async () => ({
    content: [{ type: 'text', text: version }],
  }))
  server.registerTool(
    'count',
    { description: 'Counts to n with progress', inputSchema: { n: z.number().int().min(1).max(20) } },
    async ({ n }, extra) => {
      const token = extra._meta?.progressToken
      for (let i = 1; i <= n; i++) {
        if (token !== undefined) {
          await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: n } })
        }
      }
      return { content: [{ type: 'text', text: `counted to ${n}` }] }
    },
  )
  server.registerTool(
    'ask',
    { description: 'Asks the client a question (elicitation)', inputSchema: { question: z.string() } },
    async ({ question }, extra) => {
      const result = await server.server.elicitInput(
        {
          message: question,
          requestedSchema: { type: 'object', properties: { answer: { type: 'string' } }, required: ['answer'] },
        },
        { relatedRequestId: extra.requestId },
      )
      return { content: [{ type: 'text', text: `${result.action}: ${String(result.content?.answer)}` }] }
    },
  )
  server.registerTool('announce', { description: 'Notifies a tool-list change', inputSchema: {} }, async () => {
    server.sendToolListChanged()
    return { content: [{ type: 'text', text: 'announced' }] }
  })
  return server
}

const SESSION_NOT_FOUND = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } })
const NO_SESSION = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Session required' } })

/** Sessions of one App version on the SDK's Node transport (`StreamableHTTPServerTransport`). */
export interface NodeMcpHandler {
  handle(req: IncomingMessage, res: ServerResponse, parsedBody?: unknown): Promise<void>
  close(): Promise<void>
}

export function createNodeMcpHandler(build: () => McpServer): NodeMcpHandler {
  const sessions = new Map<string, StreamableHTTPServerTransport>()
  return {
    async handle(req, res, parsedBody) {
      const id = req.headers['mcp-session-id']
      if (typeof id === 'string') {
        const transport = sessions.get(id)
        if (!transport) {
          res.writeHead(404, { 'content-type': 'application/json' }).end(SESSION_NOT_FOUND)
          return
        }
        await transport.handleRequest(req, res, parsedBody)
        return
      }
      if (req.method !== 'POST') {
        res.writeHead(400, { 'content-type': 'application/json' }).end(NO_SESSION)
        return
      }
      const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => {
          sessions.set(sid, transport)
        },
        onsessionclosed: (sid) => {
          sessions.delete(sid)
        },
      })
      await build().connect(transport)
      await transport.handleRequest(req, res, parsedBody)
    },
    async close() {
      await Promise.all([...sessions.values()].map((t) => t.close()))
      sessions.clear()
    },
  }
}

/** Sessions of one App version on the SDK's web-standard transport. */
export interface WebMcpSessions {
  handle(request: Request): Promise<Response>
  close(): Promise<void>
}

export function createWebMcpHandler(build: () => McpServer): WebMcpSessions {
  const sessions = new Map<string, WebStandardStreamableHTTPServerTransport>()
  return {
    async handle(request) {
      const id = request.headers.get('mcp-session-id')
      if (id) {
        const transport = sessions.get(id)
        if (!transport) return new Response(SESSION_NOT_FOUND, { status: 404, headers: { 'content-type': 'application/json' } })
        return transport.handleRequest(request)
      }
      if (request.method !== 'POST') {
        return new Response(NO_SESSION, { status: 400, headers: { 'content-type': 'application/json' } })
      }
      const transport: WebStandardStreamableHTTPServerTransport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => {
          sessions.set(sid, transport)
        },
        onsessionclosed: (sid) => {
          sessions.delete(sid)
        },
      })
      await build().connect(transport)
      return transport.handleRequest(request)
    },
    async close() {
      await Promise.all([...sessions.values()].map((t) => t.close()))
      sessions.clear()
    },
  }
}

/** One HTTP exchange the client made, as it saw it. */
export interface Exchange {
  method: string
  status: number
  version: string | null
  latest: string | null
  /** Media type of the response (`text/event-stream` for streamed answers). */
  contentType: string | null
}

/** What a full session saw; everything but `exchanges` must match a direct session. */
export interface ScenarioResult {
  server: { name: string; version: string } | undefined
  tools: string[]
  counted: unknown
  progress: number[]
  asked: unknown
  elicitations: string[]
  listChanged: boolean
  version: unknown
  /** Status of a request with the session id after DELETE. */
  afterDelete: number
  exchanges: Exchange[]
}

export interface ScenarioOptions {
  fetch: (input: string | URL | Request, init?: RequestInit) => Promise<Response>
  headers?: Record<string, string>
  /** Runs right after `initialize` (a deploy during the session). */
  afterInitialize?: () => unknown
}

/**
 * A full MCP session with the official SDK client: initialize, tools/list, a tool call with
 * progress over SSE, an elicitation answered by the client, a notification on the GET
 * stream, DELETE; then the old session id is refused.
 */
export async function runScenario(url: string, options: ScenarioOptions): Promise<ScenarioResult> {
  const exchanges: Exchange[] = []
  let streamOpened!: () => void
  const getStream = new Promise<void>((resolve) => (streamOpened = resolve))
  const recordingFetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const response = await options.fetch(input, init)
    const method = init?.method ?? 'GET'
    exchanges.push({
      method,
      status: response.status,
      version: response.headers.get('x-mcp-version'),
      latest: response.headers.get('x-mcp-latest-version'),
      contentType: response.headers.get('content-type')?.split(';')[0] ?? null,
    })
    if (method === 'GET' && response.status === 200) streamOpened()
    return response
  }
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: recordingFetch,
    requestInit: { headers: options.headers ?? {} },
  })
  const client = new Client({ name: 'adapter-test', version: '1.0.0' }, { capabilities: { elicitation: { form: {} } } })
  const elicitations: string[] = []
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    elicitations.push(request.params.message)
    return { action: 'accept', content: { answer: 'forty-two' } }
  })
  let listChanged!: () => void
  const changed = new Promise<void>((resolve) => (listChanged = resolve))
  client.setNotificationHandler(ToolListChangedNotificationSchema, async () => listChanged())

  await client.connect(transport)
  const sessionId = transport.sessionId
  await options.afterInitialize?.()
  const tools = (await client.listTools()).tools.map((t) => t.name).sort()
  const progress: number[] = []
  const counted = await client.callTool({ name: 'count', arguments: { n: 3 } }, undefined, {
    onprogress: (p) => progress.push(p.progress),
  })
  const asked = await client.callTool({ name: 'ask', arguments: { question: 'What is the answer?' } })
  await getStream
  await client.callTool({ name: 'announce', arguments: {} })
  await changed
  const version = await client.callTool({ name: 'get_version', arguments: {} })
  await transport.terminateSession()
  await client.close()

  const after = await options.fetch(url, {
    method: 'POST',
    headers: {
      ...options.headers,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': sessionId ?? '',
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 99, method: 'tools/list' }),
  })
  await after.body?.cancel()

  return {
    server: client.getServerVersion() && { name: client.getServerVersion()!.name, version: client.getServerVersion()!.version },
    tools,
    counted,
    progress,
    asked,
    elicitations,
    listChanged: true,
    version,
    afterDelete: after.status,
    exchanges,
  }
}

/** A one-shot session that only reads the version serving it. */
export async function readVersion(url: string, options: Omit<ScenarioOptions, 'afterInitialize'>): Promise<unknown> {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: options.fetch,
    requestInit: { headers: options.headers ?? {} },
  })
  const client = new Client({ name: 'adapter-test', version: '1.0.0' })
  await client.connect(transport)
  const result = await client.callTool({ name: 'get_version', arguments: {} })
  await transport.terminateSession()
  await client.close()
  return result.content
}

/**
 * A session of the SDK client against an App whose route takes `POST` only: the client's `GET`
 * stream gets the framework's not-found 404 (or, the MCP handler serving as the not-found
 * handler, its stream), and the session must go on (the dispatcher ends a pin on the MCP
 * handler's 404 only). Answers each exchange as `[method, status, version, content type]` and
 * the tools listed after the `GET`.
 */
async function sessionPastRefusedStream(url: string, options: Omit<ScenarioOptions, 'afterInitialize'>) {
  const seen: Array<[string, number, string | null, string | null]> = []
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: async (input, init) => {
      const response = await options.fetch(input, init)
      seen.push([init?.method ?? 'GET', response.status, response.headers.get('x-mcp-version'), response.headers.get('content-type')])
      return response
    },
    requestInit: { headers: options.headers ?? {} },
  })
  const client = new Client({ name: 'adapter-test', version: '1.0.0' })
  client.onerror = () => {} // the GET stream's 404
  try {
    await client.connect(transport)
    const deadline = Date.now() + 5_000
    while (!seen.some(([method]) => method === 'GET') && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10))
    const tools = (await client.listTools()).tools.map((tool) => tool.name)
    return { seen, tools }
  } finally {
    await client.close()
  }
}

/**
 * {@link sessionPastRefusedStream} at `url`, expecting the session to go on: tools listed, the
 * `GET` answered `getStatus` with version 1.0.0 and a `Content-Type` matching `getType`, every
 * `POST` a success of version 1.0.0.
 */
export async function expectSessionGoesOn(
  url: string,
  options: Omit<ScenarioOptions, 'afterInitialize'>,
  getStatus: number,
  getType: RegExp,
): Promise<void> {
  const { seen, tools } = await sessionPastRefusedStream(url, options)
  expect(tools.length).toBeGreaterThan(0)
  expect(seen.find(([method]) => method === 'GET')).toEqual(['GET', getStatus, '1.0.0', expect.stringMatching(getType)])
  expect(seen.filter(([method]) => method === 'POST').every(([, status, version]) => status < 300 && version === '1.0.0')).toBe(true)
}
