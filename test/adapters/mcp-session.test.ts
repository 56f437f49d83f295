/**
 * Nothing of MCP is lost on the way: the official SDK client runs a full session (initialize,
 * tools/list, progress notifications over SSE, an elicitation answered by the client, the GET
 * stream, DELETE) against SDK servers through each adapter, and through the proxy handler
 * (served by each adapter) to SDK servers running as their own services. Every session sees
 * exactly what a direct session sees, and a deploy during the session does not move it.
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import express from 'express'
import Fastify from 'fastify'
import { generateKeyPair } from 'jose'
import { mcpDispatch as expressDispatch, routeByVersion as expressRoutes } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch, routeByVersion as fastifyRoutes } from 'mcp-dispatch/fastify'
import {
  type IdentitySigner,
  type VerifiedIdentity,
  createIdentitySigner,
  createIdentityVerifier,
  createProxyHandler,
} from 'mcp-dispatch/proxy'
import { mcpDispatch as webDispatch, routeByVersion as webRoutes } from 'mcp-dispatch/web'
import { beforeAll, describe, expect, it } from 'vitest'
import {
  ADAPTER_KINDS,
  type AdapterKind,
  type Fixture,
  type Served,
  close,
  createFixture,
  isExpress,
  listen,
  loopbackFetch,
  serveWebHandler,
} from './helpers.js'
import {
  type ScenarioResult,
  buildScenarioServer,
  createNodeMcpHandler,
  createWebMcpHandler,
  readVersion,
  runScenario,
} from './mcp.js'
import { EXPRESS } from '../helpers/express.js'
import { serveFetch } from '../helpers/platform.js'

const ISSUER = 'https://platform.test'

function withoutExchanges(result: ScenarioResult): Omit<ScenarioResult, 'exchanges'> {
  const { exchanges: _exchanges, ...rest } = result
  return rest
}

/** Serves a web handler (`@hono/node-server`), the client address from the socket. */
async function serveWeb(handle: (request: Request, info: { clientAddress?: string }) => Promise<Response>): Promise<Served> {
  const served = await serveFetch(handle)
  return { port: served.port, close: served.close }
}

/** SDK servers, one per version, in front of which each adapter puts the dispatch layer. */
async function startLocal(kind: AdapterKind, fixture: Fixture): Promise<Served> {
  const closers: Array<() => Promise<void>> = []
  const onError = (error: unknown, context: string) => fixture.errors.push({ error, context })
  let stack: Served
  if (kind === 'web') {
    const handle = webDispatch({
      dispatcher: fixture.dispatcher,
      onError,
      handler: webRoutes((app, version) => {
        const sessions = createWebMcpHandler(() => buildScenarioServer(app.slug, version))
        closers.push(sessions.close)
        return (request) => sessions.handle(request)
      }),
    })
    stack = await serveWeb(handle)
  } else if (isExpress(kind)) {
    const framework = EXPRESS[kind]
    const app = framework()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher, onError }))
    app.use(framework.json())
    app.use(
      expressRoutes((appRecord, version) => {
        const sessions = createNodeMcpHandler(() => buildScenarioServer(appRecord.slug, version))
        closers.push(sessions.close)
        return (req, res) => sessions.handle(req, res, req.body)
      }),
    )
    const server = http.createServer(app)
    stack = { port: await listen(server), close: () => close(server) }
  } else {
    const app = Fastify({ forceCloseConnections: true })
    await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError }))
    app.all(
      '/*',
      fastifyRoutes((appRecord, version) => {
        const sessions = createNodeMcpHandler(() => buildScenarioServer(appRecord.slug, version))
        closers.push(sessions.close)
        return async (request, reply) => {
          reply.hijack()
          await sessions.handle(request.raw, reply.raw, request.body)
        }
      }),
    )
    await app.listen({ port: 0, host: '127.0.0.1' })
    stack = { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
  }
  return {
    port: stack.port,
    async close() {
      for (const c of closers) await c()
      await stack.close()
    },
  }
}

/** Upstream App services: one SDK server per version at `/v/<version>/mcp`, behind identity checks. */
interface Upstream extends Served {
  origin: string
  identities: VerifiedIdentity[]
  /** `Authorization` headers the upstream received (must stay empty). */
  authorizations: Array<string | undefined>
}

async function startUpstream(signer: IdentitySigner): Promise<Upstream> {
  const identities: VerifiedIdentity[] = []
  const authorizations: Array<string | undefined> = []
  const versions = new Map<string, ReturnType<typeof createNodeMcpHandler>>()
  const app = express()
  const server = http.createServer(app)
  const port = await listen(server)
  const origin = `http://127.0.0.1:${port}`
  const verify = createIdentityVerifier({ jwks: await signer.jwks(), issuer: ISSUER, audience: origin, appId: 'app_weather' })
  app.use(async (req, res, next) => {
    authorizations.push(req.headers.authorization)
    try {
      identities.push(await verify(req.get('x-mcp-identity')))
      next()
    } catch {
      res.status(401).json({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Unauthorized' } })
    }
  })
  app.use(express.json())
  app.all('/v/:version/mcp', (req, res) => {
    const version = String(req.params.version)
    let sessions = versions.get(version)
    if (!sessions) versions.set(version, (sessions = createNodeMcpHandler(() => buildScenarioServer('weather', version))))
    void sessions.handle(req, res, req.body)
  })
  return {
    port,
    origin,
    identities,
    authorizations,
    async close() {
      for (const s of versions.values()) await s.close()
      await close(server)
    },
  }
}

/** The dispatch layer of `kind` in front of the proxy handler. */
async function startProxied(kind: AdapterKind, fixture: Fixture, upstream: Upstream, signer: IdentitySigner): Promise<Served> {
  const onError = (error: unknown, context: string) => fixture.errors.push({ error, context })
  const proxy = createProxyHandler({
    upstream: (context) => `${upstream.origin}/v/${context.version}/mcp`,
    identity: signer,
    onError,
  })
  return serveWebHandler(kind, fixture, proxy)
}

describe('a full MCP session through every adapter and through the proxy handler', () => {
  let direct: ScenarioResult
  let signer: IdentitySigner

  beforeAll(async () => {
    // The baseline: the same SDK server, talked to directly, no dispatch layer.
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '2.0.0'))
    const server = http.createServer((req, res) => void sessions.handle(req, res))
    const port = await listen(server)
    direct = await runScenario(`http://127.0.0.1:${port}/mcp`, { fetch: loopbackFetch })
    await sessions.close()
    await close(server)
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    signer = createIdentitySigner({ issuer: ISSUER, privateKey })
  })

  it('the direct session exercised every feature', () => {
    expect(direct.tools).toEqual(['announce', 'ask', 'count', 'get_version'])
    expect(direct.progress).toEqual([1, 2, 3])
    expect(direct.elicitations).toEqual(['What is the answer?'])
    expect(direct.asked).toEqual({ content: [{ type: 'text', text: 'accept: forty-two' }] })
    expect(direct.version).toEqual({ content: [{ type: 'text', text: '2.0.0' }] })
    expect(direct.exchanges.some((e) => e.method === 'GET' && e.status === 200 && e.contentType === 'text/event-stream')).toBe(true)
    // tools/call answers stream (progress, the elicitation request) as SSE.
    expect(direct.exchanges.filter((e) => e.contentType === 'text/event-stream').length).toBeGreaterThanOrEqual(4)
    expect(direct.exchanges.some((e) => e.method === 'DELETE' && e.status === 200)).toBe(true)
    expect(direct.afterDelete).toBe(404)
  })

  /** What every dispatched session must show besides the direct results. */
  function expectPinned(result: ScenarioResult): void {
    expect(withoutExchanges(result)).toEqual(withoutExchanges(direct))
    // The same HTTP exchanges, with the same statuses and media types (SSE where the server
    // streamed): the POSTs and the DELETE in order; the GET stream, which the client opens
    // beside them, in whatever place it was answered.
    const shape = (r: ScenarioResult, get: boolean) =>
      r.exchanges.filter((e) => (e.method === 'GET') === get).map((e) => [e.method, e.status, e.contentType])
    expect(shape(result, false)).toEqual(shape(direct, false))
    expect(shape(result, true)).toEqual(shape(direct, true))
    for (const exchange of result.exchanges) expect(exchange.version).toBe('2.0.0')
    expect(result.exchanges[0]!.latest).toBe('2.0.0')
    expect(result.exchanges.at(-1)).toMatchObject({ method: 'DELETE', status: 200, version: '2.0.0', latest: '2.1.0' })
    expect(result.exchanges.filter((e) => e.method === 'GET')).toHaveLength(1)
  }

  for (const kind of ADAPTER_KINDS) {
    it(`${kind} adapter: same results as a direct session; a deploy during it does not move it`, async () => {
      const fixture = createFixture()
      const stack = await startLocal(kind, fixture)
      try {
        const url = `http://weather.localhost:${stack.port}/`
        const headers = { authorization: `Bearer ${fixture.tokens.alice}` }
        const result = await runScenario(url, {
          fetch: loopbackFetch,
          headers,
          afterInitialize: () => fixture.apps.deploy('app_weather', '2.1.0'),
        })
        expectPinned(result)
        // A new session resolves again: the deployed version.
        expect(await readVersion(url, { fetch: loopbackFetch, headers })).toEqual([{ type: 'text', text: '2.1.0' }])
        expect(fixture.errors).toEqual([])
      } finally {
        await stack.close()
      }
    })

    it(`${kind} adapter + proxy handler: same results, the identity as a signed JWT, never the caller's token`, async () => {
      const fixture = createFixture()
      const upstream = await startUpstream(signer)
      const stack = await startProxied(kind, fixture, upstream, signer)
      try {
        const url = `http://weather.localhost:${stack.port}/v2`
        const headers = { authorization: `Bearer ${fixture.tokens.alice}` }
        const result = await runScenario(url, {
          fetch: loopbackFetch,
          headers,
          afterInitialize: () => fixture.apps.deploy('app_weather', '2.1.0'),
        })
        expectPinned(result)
        expect(await readVersion(url, { fetch: loopbackFetch, headers })).toEqual([{ type: 'text', text: '2.1.0' }])

        expect(upstream.authorizations.length).toBeGreaterThan(5)
        expect(upstream.authorizations.every((a) => a === undefined)).toBe(true)
        const session = upstream.identities.slice(0, result.exchanges.length)
        for (const identity of session) {
          expect(identity).toMatchObject({ subject: 'alice', appId: 'app_weather', version: '2.0.0', method: 'api_token' })
          expect(identity.claims.iss).toBe(ISSUER)
          expect(identity.claims.aud).toBe(upstream.origin)
          expect(identity.claims.exp - identity.claims.iat).toBe(60)
        }
        // The new connection reached 2.1.0 with its own identity. Not `at(-1)`: a late request
        // of the ended session (the SDK client's GET stream reconnecting) may still arrive.
        expect(upstream.identities.slice(session.length).some((identity) => identity.version === '2.1.0')).toBe(true)
        expect(upstream.identities.every((identity) => identity.version === '2.0.0' || identity.version === '2.1.0')).toBe(true)
        expect(fixture.errors).toEqual([])
      } finally {
        await stack.close()
        await upstream.close()
      }
    })
  }
})
