/**
 * Fastify example: the dispatch plugin in front of the MCP SDK's Node transport, which writes
 * to `reply.raw` once the reply is hijacked; one SDK server per App version.
 *
 *   npx tsx examples/fastify/server.ts
 */
import Fastify, { type FastifyInstance } from 'fastify'
import { answerClientError, frameworkErrors, getDispatchContext, jsonRpcErrors, mcpDispatch, routeByVersion } from 'mcp-dispatch/fastify'
import { buildAppServer } from '../platform/mcp-app.js'
import { BODY_LIMIT, type Demo, type NodeSessions, callerOf, createNodeServer, createNodeSessions } from '../shared/demo.js'

/** Builds the Fastify app; closing it ends the open MCP sessions. */
export async function createFastifyExample(demo: Demo): Promise<FastifyInstance> {
  const versions: NodeSessions[] = []
  // `frameworkErrors`: a target Fastify cannot decode (`/v1%zz`) is the JSON-RPC 404 the other
  // adapters give, not Fastify's own 400 error object; `answerClientError`: what Node's parser
  // refuses (a malformed request, a head past 16 KiB) gets a JSON-RPC body too, and so does
  // what Node refuses itself (no `Host`, an unknown `Expect`: `createNodeServer`).
  const app = Fastify({
    forceCloseConnections: true,
    bodyLimit: BODY_LIMIT,
    frameworkErrors,
    clientErrorHandler: answerClientError,
    serverFactory: (handler) => createNodeServer(handler),
  })
  // `Expect: 100-continue`: `100 Continue` once the dispatch layer let the request through.
  app.server.on('checkContinue', (req, res) => app.server.emit('request', req, res))
  await app.register(mcpDispatch({ dispatcher: demo.dispatcher }))
  // Fastify's JSON parser, but an empty body (a DELETE that names a JSON content type) is no
  // body, for the MCP transport to judge, as is a body of another type or of none (the SDK's
  // 415, as on the other examples, not Fastify's); and a body it refuses (bad JSON, too large)
  // is a JSON-RPC error, not Fastify's own error object.
  const parseJson = app.getDefaultJsonParser('error', 'error')
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) =>
    body === '' ? done(null, undefined) : parseJson(request, body as string, done),
  )
  app.addContentTypeParser('*', (_request, _payload, done) => done(null, undefined))
  app.setErrorHandler(jsonRpcErrors())
  app.all(
    '/*',
    routeByVersion((appRecord, version) => {
      // The App's own tools, sessions capped per caller (the dispatch context's identity).
      const sessions = createNodeSessions(() => buildAppServer(appRecord, version, { conformance: false }))
      versions.push(sessions)
      return async (request, reply) => {
        reply.hijack() // the SDK transport writes the response (SSE streams included) itself
        await sessions.handle(request.raw, reply.raw, request.body, callerOf(getDispatchContext(request)))
      }
    }),
  )
  app.addHook('onClose', async () => void (await Promise.all(versions.map((v) => v.close()))))
  return app
}
