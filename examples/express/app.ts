/**
 * Express example: the dispatch middleware in front of the MCP SDK's Node transport, one SDK
 * server per App version (`routeByVersion`).
 *
 *   npx tsx examples/express/server.ts
 */
import express from 'express'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/express'
import { buildAppServer } from '../platform/mcp-app.js'
import { type Demo, type NodeSessions, createNodeSessions } from '../shared/demo.js'

/** Builds the Express app; `close()` ends the open MCP sessions. */
export function createExpressExample(demo: Demo): { app: express.Express; close(): Promise<void> } {
  const versions: NodeSessions[] = []
  const app = express()
  app.disable('x-powered-by')
  // 1. The dispatch layer, first: rejections are answered before any body is read.
  app.use(mcpDispatch({ dispatcher: demo.dispatcher }))
  // 2. Then the body parser and the MCP handler of the version the request was dispatched to.
  app.use(express.json({ limit: '4mb' }))
  app.use(
    routeByVersion((appRecord, version) => {
      const sessions = createNodeSessions(() => buildAppServer(appRecord, version))
      versions.push(sessions)
      return (req, res) => sessions.handle(req, res, req.body)
    }),
  )
  return { app, close: async () => void (await Promise.all(versions.map((v) => v.close()))) }
}
