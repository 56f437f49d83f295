/**
 * Hono example: the Web adapter is a `(request) => Response` function, so Hono mounts it as
 * any fetch handler; the MCP SDK's web-standard transport serves each App version.
 *
 *   npx tsx examples/hono/server.ts
 */
import type { HttpBindings } from '@hono/node-server'
import { getConnInfo } from '@hono/node-server/conninfo'
import { Hono } from 'hono'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/web'
import { type McpAppHandler, buildAppServer, createMcpAppHandler } from '../platform/mcp-app.js'
import { type Demo, callerOf } from '../shared/demo.js'

/** Builds the Hono app; `close()` ends the open MCP sessions. */
export function createHonoExample(demo: Demo): { app: Hono<{ Bindings: HttpBindings }>; close(): Promise<void> } {
  const versions: McpAppHandler[] = []
  const mcp = mcpDispatch({
    dispatcher: demo.dispatcher,
    handler: routeByVersion((appRecord, version) => {
      // The App's own tools; sessions capped per caller (`maxSessionsPerCaller`), who is
      // named by the dispatch context.
      const handler = createMcpAppHandler(() => buildAppServer(appRecord, version, { conformance: false }))
      versions.push(handler)
      return (request, context) => handler(request, callerOf(context))
    }),
  })
  const app = new Hono<{ Bindings: HttpBindings }>()
  // The client address comes from the socket (`getConnInfo`), never from X-Forwarded-For.
  // `outgoing`: the dispatch headers go into Node's response head (faster; optional).
  app.all('*', (c) => mcp(c.req.raw, { clientAddress: getConnInfo(c).remote.address, outgoing: c.env.outgoing }))
  return { app, close: async () => void (await Promise.all(versions.map((v) => v.close()))) }
}
