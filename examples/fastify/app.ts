/**
 * Fastify example: the dispatch plugin in front of the MCP SDK's Node transport, which writes
 * to `reply.raw` once the reply is hijacked; one SDK server per App version.
 *
 *   npx tsx examples/fastify/server.ts
 */
import Fastify, { type FastifyInstance } from 'fastify'
import { answerClientError, frameworkErrors, mcpDispatch, routeByVersion } from 'mcp-dispatch/fastify'
import { buildAppServer } from '../platform/mcp-app.js'
import { type Demo, type NodeSessions, createNodeSessions } from '../shared/demo.js'

/** Builds the Fastify app; closing it ends the open MCP sessions. */
export async function createFastifyExample(demo: Demo): Promise<FastifyInstance> {
  const versions: NodeSessions[] = []
  // `frameworkErrors`: a target Fastify cannot decode (`/v1%zz`) is the JSON-RPC 404 the other
  // adapters give, not Fastify's own 400 error object; `answerClientError`: what Node's parser
  // refuses (a malformed request, a head past 16 KiB) gets a JSON-RPC body too.
  const app = Fastify({ forceCloseConnections: true, bodyLimit: 4 * 1024 * 1024, frameworkErrors, clientErrorHandler: answerClientError })
  await app.register(mcpDispatch({ dispatcher: demo.dispatcher }))
  // Fastify's JSON parser, but an empty body (a DELETE that names a JSON content type) is no
  // body, for the MCP transport to judge; and a body it refuses (bad JSON, too large) is a
  // JSON-RPC error, not Fastify's own error object.
  const parseJson = app.getDefaultJsonParser('error', 'error')
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) =>
    body === '' ? done(null, undefined) : parseJson(request, body as string, done),
  )
  app.setErrorHandler((error: { statusCode?: number; code?: string }, _request, reply) => {
    const tooLarge = error.code === 'FST_ERR_CTP_BODY_TOO_LARGE'
    const status = tooLarge ? 413 : error.statusCode && error.statusCode < 500 ? error.statusCode : 500
    const code = error.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || error instanceof SyntaxError ? -32700 : -32600
    const message = tooLarge ? 'Payload too large' : code === -32700 ? 'Parse error' : status < 500 ? 'Invalid request' : 'Internal error'
    return reply.code(status).send({ jsonrpc: '2.0', id: null, error: { code: status < 500 ? code : -32603, message } })
  })
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
