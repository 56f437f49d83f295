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
  // 3. A body the parser refused (bad JSON, too large) is a JSON-RPC error, not Express's HTML
  //    page (which names files of the server).
  app.use((error: { status?: number; type?: string }, _req: express.Request, res: express.Response, next: express.NextFunction) => {
    if (res.headersSent) return next(error)
    const tooLarge = error.type === 'entity.too.large'
    const status = tooLarge ? 413 : error.status && error.status < 500 ? error.status : 500
    const code = error.type === 'entity.parse.failed' ? -32700 : -32600
    res.status(status).json({ jsonrpc: '2.0', id: null, error: { code, message: tooLarge ? 'Payload too large' : code === -32700 ? 'Parse error' : 'Invalid request' } })
  })
  return { app, close: async () => void (await Promise.all(versions.map((v) => v.close()))) }
}
