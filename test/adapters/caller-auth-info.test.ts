/**
 * The caller reaches the App's tools as the MCP SDK's `extra.authInfo`, handed to the SDK
 * transport with each request from the dispatch context (docs/adapters.md, "The caller in your
 * tools"): through the Express and Fastify adapters on the SDK's Node transport (`req.auth`),
 * and through the Web adapter on its web-standard transport (`handleRequest`'s `authInfo`).
 * The section's code block is taken from the page and run as printed. Two users' sessions call
 * at once, both calls in their tools together: each sees its own caller, and never a credential.
 */
import { randomUUID } from 'node:crypto'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { AuthInfo } from '@modelcontextprotocol/sdk/server/auth/types.js'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js'
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import type { CallToolResult, ServerNotification, ServerRequest } from '@modelcontextprotocol/sdk/types.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import express from 'express'
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify'
import type { DispatchContext } from 'mcp-dispatch'
import { mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { afterEach, describe, expect, it } from 'vitest'
import { type Fixture, close, createFixture, listen, loopbackFetch } from './helpers.js'
import { importBlock } from '../helpers/docs-samples.js'
import { serveFetch } from '../helpers/platform.js'

/** docs/adapters.md's sample of this section, taken from the page and run as printed. */
interface CallerSample {
  callerAuthInfo(context: DispatchContext): AuthInfo
  serveNode(transport: StreamableHTTPServerTransport, req: express.Request, res: express.Response): Promise<void>
  serveFastify(transport: StreamableHTTPServerTransport, request: FastifyRequest, reply: FastifyReply): Promise<void>
  serveWeb(transport: WebStandardStreamableHTTPServerTransport, request: Request, context: DispatchContext): Promise<Response>
  addWhoami(server: McpServer): void
}

const sample = await importBlock<CallerSample>('adapters-caller-auth-info', 'docs/adapters.md', '### The caller in your tools', '## Web (')

/**
 * Resolves for each call once `size` calls wait at it, then starts again: each round's calls of
 * both callers are in their tools at once, so a caller kept anywhere but in the request's own
 * `authInfo` (a variable the handler sets) would be the other's for one of them.
 */
function meeting(size: number): () => Promise<void> {
  const waiting: Array<() => void> = []
  return () =>
    new Promise<void>((resolve) => {
      waiting.push(resolve)
      if (waiting.length === size) for (const go of waiting.splice(0)) go()
    })
}
const bothIn = meeting(2)

type ToolCallback = (extra: RequestHandlerExtra<ServerRequest, ServerNotification>) => CallToolResult | Promise<CallToolResult>

/**
 * An App with the sample's `whoami`, and `authinfo`, which answers the whole `authInfo` its call
 * was handed; each runs once both callers' calls of the round are in (`bothIn`).
 */
function buildServer(): McpServer {
  const server = new McpServer({ name: 'notes', version: '1.0.0' })
  const meetFirst = (callback: ToolCallback): ToolCallback => async (extra) => (await bothIn(), callback(extra))
  const registering = {
    registerTool: (name: string, config: { description?: string }, callback: ToolCallback) => server.registerTool(name, config, meetFirst(callback)),
  }
  sample.addWhoami(registering as unknown as McpServer)
  registering.registerTool('authinfo', { description: 'The authInfo of this call' }, (extra) => ({
    content: [{ type: 'text', text: JSON.stringify(extra.authInfo ?? null) }],
  }))
  return server
}

/**
 * One SDK transport of `Kind` (the Node one or the web-standard one) per session, opened by a
 * request without a known session id.
 */
function sessionsOf<T extends Transport>(Kind: new (options: { sessionIdGenerator: () => string; onsessioninitialized: (sid: string) => void }) => T) {
  const sessions = new Map<string, T>()
  return {
    async find(id: string | null | undefined | string[]): Promise<T> {
      const known = typeof id === 'string' ? sessions.get(id) : undefined
      if (known) return known
      const transport = new Kind({ sessionIdGenerator: () => randomUUID(), onsessioninitialized: (sid) => void sessions.set(sid, transport) })
      await buildServer().connect(transport)
      return transport
    },
    close: () => Promise.all([...sessions.values()].map((transport) => transport.close())),
  }
}

interface Served {
  port: number
  close(): Promise<void>
}

const SERVE: Record<'express' | 'fastify' | 'web', (fixture: Fixture) => Promise<Served>> = {
  async express(fixture) {
    const sessions = sessionsOf(StreamableHTTPServerTransport)
    const app = express()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher, onError: fixture.onError }))
    app.use(express.json())
    app.use((req, res, next) => {
      sessions.find(req.headers['mcp-session-id']).then((transport) => sample.serveNode(transport, req, res)).catch(next)
    })
    const server = http.createServer(app)
    const port = await listen(server)
    return { port, close: async () => (await sessions.close(), await close(server)) }
  },
  async fastify(fixture) {
    const sessions = sessionsOf(StreamableHTTPServerTransport)
    const app = Fastify({ forceCloseConnections: true })
    await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError: fixture.onError }))
    app.all('/*', async (request, reply) => sample.serveFastify(await sessions.find(request.headers['mcp-session-id']), request, reply))
    await app.listen({ port: 0, host: '127.0.0.1' })
    return { port: (app.server.address() as AddressInfo).port, close: async () => (await sessions.close(), await app.close()) }
  },
  async web(fixture) {
    const sessions = sessionsOf(WebStandardStreamableHTTPServerTransport)
    const handle = webDispatch({
      dispatcher: fixture.dispatcher,
      onError: fixture.onError,
      handler: async (request, context) => sample.serveWeb(await sessions.find(request.headers.get('mcp-session-id')), request, context),
    })
    const served = await serveFetch((request, info) => handle(request, { clientAddress: info.clientAddress }))
    return { port: served.port, close: async () => (await sessions.close(), await served.close()) }
  },
}

describe.each(Object.keys(SERVE) as Array<keyof typeof SERVE>)('the caller in the tools, through the %s adapter', (kind) => {
  const opened: Array<{ close(): Promise<void> }> = []
  afterEach(async () => {
    await Promise.all(opened.splice(0).map((item) => item.close()))
  })

  it("each call's tool sees its own caller as authInfo, two users' sessions calling at once, and no credential", async () => {
    const fixture = createFixture()
    const served = await SERVE[kind](fixture)
    opened.push(served)
    const connect = async (token: string) => {
      const client = new Client({ name: 'caller-test', version: '1.0.0' })
      const transport = new StreamableHTTPClientTransport(new URL(`http://notes.localhost:${served.port}/v1`), {
        fetch: loopbackFetch,
        requestInit: { headers: { authorization: `Bearer ${token}` } },
      })
      await client.connect(transport)
      opened.push(client)
      return client
    }
    const callers = { alice: await connect(fixture.tokens.alice), carol: await connect(fixture.tokens.carol) }
    const answers: Array<{ subject: 'alice' | 'carol'; tool: string; text: string }> = []
    for (const tool of ['whoami', 'authinfo', 'whoami', 'authinfo']) {
      // alice's request, then carol's, both in their tools at once (bothIn).
      const round = (['alice', 'carol'] as const).map((subject) =>
        callers[subject].callTool({ name: tool }).then((result) => ({ subject, tool, text: (result.content as Array<{ text: string }>)[0]!.text })),
      )
      answers.push(...(await Promise.all(round)))
    }
    expect(answers).toHaveLength(8)
    for (const { subject, tool, text } of answers) {
      for (const secret of Object.values(fixture.tokens)) expect(text).not.toContain(secret)
      if (tool === 'whoami') {
        expect(text).toBe(subject)
        continue
      }
      expect(JSON.parse(text)).toEqual({
        token: '',
        clientId: '',
        scopes: [],
        extra: { subject, method: 'api_token', appId: 'app_notes', version: '1.0.0' },
      })
    }
    expect(fixture.errors).toEqual([])
  })
})
