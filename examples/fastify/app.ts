/**
 * Fastify example: the dispatch plugin in front of the MCP SDK's Node transport, which writes
 * to `reply.raw` once the reply is hijacked; one SDK server per App version.
 *
 *   npx tsx examples/fastify/server.ts
 */
import Fastify, { type FastifyInstance } from 'fastify'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/fastify'
import { buildAppServer } from '../platform/mcp-app.js'
import { type Demo, type NodeSessions, createNodeSessions } from '../shared/demo.js'

/** Builds the Fastify app; closing it ends the open MCP sessions. */
export async function createFastifyExample(demo: Demo): Promise<FastifyInstance> {
  const versions: NodeSessions[] = []
  const app = Fastify({ forceCloseConnections: true })
  await app.register(mcpDispatch({ dispatcher: demo.dispatcher }))
  app.all(
    '/*',
    routeByVersion((appRecord, version) => {
      const sessions = createNodeSessions(() => buildAppServer(appRecord, version))
      versions.push(sessions)
      return async (request, reply) => {
        reply.hijack() // the SDK transport writes the response (SSE streams included) itself
        await sessions.handle(request.raw, reply.raw, request.body)
      }
    }),
  )
  app.addHook('onClose', async () => void (await Promise.all(versions.map((v) => v.close()))))
  return app
}
