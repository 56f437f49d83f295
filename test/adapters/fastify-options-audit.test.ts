/**
 * The Fastify adapter under the server options a platform sets (docs/adapters.md, Fastify):
 * defects an audit of `rewriteUrl`, the router options, `bodyLimit`, `return503OnClosing`,
 * hooks, `exposeHeadRoutes` and `trustProxy` found, on a real Fastify 5 server.
 */
import type { AddressInfo } from 'node:net'
import Fastify, { type FastifyReply, type FastifyRequest, type FastifyServerOptions } from 'fastify'
import { createTokenApi } from 'mcp-dispatch'
import { fromWebHandler, mcpDispatch, routeByVersion, serveTokenApi } from 'mcp-dispatch/fastify'
import { describe, expect, it } from 'vitest'
import { HOST, createFixture, loopbackFetch, rawRequest } from './helpers.js'
import { buildScenarioServer, createNodeMcpHandler, readVersion } from './mcp.js'

/** The dispatch plugin and one SDK transport per session of each version, on 127.0.0.1. */
async function startFastify(options: FastifyServerOptions) {
  const fixture = createFixture()
  const handlers: Array<ReturnType<typeof createNodeMcpHandler>> = []
  const app = Fastify({ forceCloseConnections: true, ...options })
  await app.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
  app.route({
    method: ['GET', 'POST', 'DELETE'],
    url: '/*',
    handler: routeByVersion((appRecord, version) => {
      const sessions = createNodeMcpHandler(() => buildScenarioServer(appRecord.slug, version))
      handlers.push(sessions)
      return async (request: FastifyRequest, reply: FastifyReply) => {
        reply.hijack()
        await sessions.handle(request.raw, reply.raw, request.body)
      }
    }),
  })
  await app.listen({ port: 0, host: '127.0.0.1' })
  return {
    port: (app.server.address() as AddressInfo).port,
    fixture,
    async close() {
      for (const sessions of handlers) await sessions.close()
      await app.close()
    },
  }
}

const initialize = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'audit', version: '1.0.0' } },
})

describe('fastify adapter under server options', () => {
  it('with a rewriteUrl that turns an absolute-form target into its path (docs/adapters.md\'s own), the target still names the App and the scheme, the Host field unread; a prefix-stripping rewrite still serves the SDK client (regression: the Host field named the App)', async () => {
    const served = await startFastify({
      rewriteUrl: (req) => {
        const url = req.url ?? '/'
        if (url.startsWith('/mcp/')) return url.slice('/mcp'.length)
        return url.startsWith('/') ? url : new URL(url).pathname
      },
    })
    try {
      const { tokens } = served.fixture
      const mcp = (token: string) => ({ authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' })
      // carol may use notes only: the target names weather, the Host notes.
      const carol = await rawRequest(served.port, { path: `http://${HOST}/v1`, host: 'notes.localhost', body: initialize, headers: mcp(tokens.carol) })
      expect([carol.status, carol.headers['x-mcp-version']]).toEqual([403, undefined])
      // weather serves 2.0.0, notes only 1.0.0.
      const alice = await rawRequest(served.port, { path: `http://${HOST}/v2`, host: 'notes.localhost', body: initialize, headers: mcp(tokens.alice) })
      expect([alice.status, alice.headers['x-mcp-version']]).toEqual([200, '2.0.0'])
      const metadata = await rawRequest(served.port, { method: 'GET', path: `https://${HOST}/.well-known/oauth-protected-resource`, host: 'notes.localhost' })
      expect([metadata.status, JSON.parse(metadata.body).resource]).toEqual([200, `https://${HOST}`])
      // An origin-form target the rewrite changed is dispatched as rewritten, its Host read.
      const auth = { authorization: `Bearer ${tokens.alice}` }
      expect(await readVersion(`http://${HOST}:${served.port}/mcp/v1`, { fetch: loopbackFetch, headers: auth })).toEqual([{ type: 'text', text: '1.0.0' }])
      expect(await readVersion(`http://${HOST}:${served.port}/v2`, { fetch: loopbackFetch, headers: auth })).toEqual([{ type: 'text', text: '2.0.0' }])
    } finally {
      await served.close()
    }
  })

  it('under the same rewriteUrl, the handler\'s Request reads the target the dispatcher read, scheme and host (regression: the Host field\'s, http), and a target of another scheme is refused as without the rewrite', async () => {
    const fixture = createFixture()
    const app = Fastify({ rewriteUrl: (req) => (req.url?.startsWith('/') ? req.url : new URL(req.url ?? '/', 'http://x').pathname) })
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.all('/*', fromWebHandler((request, context) => new Response(`${context.baseUrl} ${request.url}`)))
    await app.listen({ port: 0, host: '127.0.0.1' })
    try {
      const port = (app.server.address() as AddressInfo).port
      const headers = { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
      const served = await rawRequest(port, { path: `https://${HOST}/v1`, host: 'notes.localhost', body: initialize, headers })
      expect([served.status, served.body]).toEqual([200, `https://${HOST} https://${HOST}/v1`])
      const ftp = await rawRequest(port, { path: `ftp://${HOST}/v1`, host: HOST, body: initialize, headers })
      expect(ftp.status).toBe(404)
    } finally {
      await app.close()
    }
  })

  it('under the same rewriteUrl, the token API on its hosts serves a target naming its host whatever the Host field says, and one naming another host is its 404, as without the rewrite (regression: the Host field decided)', async () => {
    const fixture = createFixture()
    const app = Fastify({ rewriteUrl: (req) => (req.url?.startsWith('/') ? req.url : new URL(req.url ?? '/', 'http://x').pathname) })
    const api = createTokenApi({ tokens: fixture.dispatcherOptions.tokens, authenticateSession: () => null, verifyCsrf: () => true, hosts: ['api.localhost'] })
    await app.register(serveTokenApi(api))
    app.all('/*', async () => 'routes')
    await app.listen({ port: 0, host: '127.0.0.1' })
    try {
      const port = (app.server.address() as AddressInfo).port
      const ours = await rawRequest(port, { method: 'GET', path: 'http://api.localhost/api/tokens', host: HOST })
      expect([ours.status, ours.headers['content-type']]).toEqual([401, expect.stringContaining('application/json')])
      const theirs = await rawRequest(port, { method: 'GET', path: `http://${HOST}/api/tokens`, host: 'api.localhost' })
      expect([theirs.status, JSON.parse(theirs.body).error]).toEqual([404, 'not_found'])
    } finally {
      await app.close()
    }
  })
})
