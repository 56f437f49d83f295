/**
 * What the tests of MCP 2026-07-28 through the dispatch layer share: an App version of that
 * revision (the official SDK v2 `createMcpHandler` in strict modern mode: 2025-era traffic is
 * refused, and a request whose `Mcp-Method`, `Mcp-Name` or `Mcp-Param-{name}` headers are
 * missing or disagree with the body gets 400 `HeaderMismatch`, -32020), and each adapter on
 * loopback in front of a web-standard handler.
 */
import type * as http from 'node:http'
import { McpServer, createMcpHandler } from '@modelcontextprotocol/server'
import express from 'express'
import Fastify, { type FastifyInstance } from 'fastify'
import { fromWebHandler as expressFromWeb, mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { fromWebHandler as fastifyFromWeb, mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import { type WebMcpHandler, mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import * as z from 'zod'
import { serveFetch } from '../helpers/platform.js'
import { type Fixture, close } from './helpers.js'

/** The protocol revision these Apps speak. */
export const MODERN = '2026-07-28'

/**
 * A strict 2026-07-28 App version. Tools: `forecast`, whose `region` argument the client mirrors
 * into `Mcp-Param-Region` (`x-mcp-header`), answering `<version>:<city>@<region>`; and
 * `test_simple_text`, which the conformance runner's scenarios call.
 */
export function createModernApp(version: string): { fetch(request: Request): Promise<Response> } {
  return createMcpHandler(
    () => {
      const server = new McpServer({ name: 'weather', version })
      server.registerTool(
        'forecast',
        {
          description: `Forecast (version ${version})`,
          inputSchema: z.object({ region: z.string().meta({ 'x-mcp-header': 'Region' }), city: z.string() }),
        },
        async ({ region, city }) => ({ content: [{ type: 'text', text: `${version}:${city}@${region}` }] }),
      )
      server.registerTool('test_simple_text', { description: 'One text block' }, async () => ({
        content: [{ type: 'text', text: 'This is a simple text response for testing.' }],
      }))
      return server
    },
    { legacy: 'reject' },
  )
}

/** A server on 127.0.0.1 with the dispatch layer in front of a handler. */
export interface Target {
  port: number
  close(): Promise<void>
}

export type Serve = (fixture: Fixture, handler: WebMcpHandler) => Promise<Target>

export async function serveWeb(fixture: Fixture, handler: WebMcpHandler): Promise<Target> {
  const dispatch = webDispatch({ dispatcher: fixture.dispatcher, handler })
  const served = await serveFetch((request, info) => dispatch(request, info))
  return { port: served.port, close: served.close }
}

export async function serveExpress(fixture: Fixture, handler: WebMcpHandler): Promise<Target> {
  const app = express()
  app.use(expressDispatch({ dispatcher: fixture.dispatcher }))
  app.all('/{*path}', expressFromWeb(handler))
  const server: http.Server = app.listen(0, '127.0.0.1')
  await new Promise((resolve) => server.once('listening', resolve))
  const port = (server.address() as { port: number }).port
  return { port, close: () => close(server) }
}

export async function serveFastify(fixture: Fixture, handler: WebMcpHandler): Promise<Target> {
  const app: FastifyInstance = Fastify()
  await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
  // The body streams through unread, as docs/adapters.md recommends for web handlers.
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', (_request, _payload, done) => done(null))
  app.all('/*', fastifyFromWeb(handler))
  await app.listen({ port: 0, host: '127.0.0.1' })
  const port = (app.server.address() as { port: number }).port
  return { port, close: () => app.close() }
}

export const ADAPTERS: Array<[string, Serve]> = [
  ['web', serveWeb],
  ['express', serveExpress],
  ['fastify', serveFastify],
]
