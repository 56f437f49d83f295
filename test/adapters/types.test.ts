/**
 * Type test: the request decorations of the Express and Fastify adapters are typed, and the
 * handler types of the three adapters and the proxy fit together. These assertions are checked
 * by `tsc --noEmit` (the project's typecheck); at run time they are no-ops.
 */
import type { Request as ExpressRequest, RequestHandler } from 'express'
import type { Http2Server, Http2ServerRequest, Http2ServerResponse } from 'node:http2'
import Fastify, { type FastifyInstance, type FastifyPluginAsync, type FastifyReply, type FastifyRequest, type RouteGenericInterface } from 'fastify'
import { type DispatchContext, type Identity, type TokenApi, type TokenService, createTokenApi } from 'mcp-dispatch'
import * as expressAdapter from 'mcp-dispatch/express'
import * as fastifyAdapter from 'mcp-dispatch/fastify'
import { type ProxyHandler, createProxyHandler } from 'mcp-dispatch/proxy'
import * as webAdapter from 'mcp-dispatch/web'
import { describe, expectTypeOf, it } from 'vitest'

describe('request decorations', () => {
  it('Express: req.dispatchContext is a DispatchContext (absent where the middleware did not run)', () => {
    expectTypeOf<ExpressRequest['dispatchContext']>().toEqualTypeOf<DispatchContext | undefined>()
    expectTypeOf(expressAdapter.getDispatchContext).returns.toEqualTypeOf<DispatchContext>()
    expressAdapter.routeByVersion((app, version) => {
      expectTypeOf(app.id).toEqualTypeOf<string>()
      expectTypeOf(version).toEqualTypeOf<string>()
      return (req, res) => {
        expectTypeOf(req.dispatchContext).toEqualTypeOf<DispatchContext | undefined>()
        expectTypeOf(req.dispatchContext!.identity).toEqualTypeOf<Identity>()
        expectTypeOf(req.dispatchContext!.version).toEqualTypeOf<string>()
        // @ts-expect-error the context is read-only
        req.dispatchContext!.version = '9.9.9'
        // @ts-expect-error no such field
        void req.dispatchContext!.token
        res.end()
      }
    })
  })

  it('Fastify: request.dispatchContext is a DispatchContext (undefined where the plugin did not run)', () => {
    expectTypeOf<FastifyRequest['dispatchContext']>().toEqualTypeOf<DispatchContext | undefined>()
    // A request of any Fastify server: HTTP/1, and HTTP/2 through `http2: true`.
    expectTypeOf<FastifyRequest>().toMatchTypeOf<Parameters<typeof fastifyAdapter.getDispatchContext>[0]>()
    expectTypeOf<FastifyRequest<RouteGenericInterface, Http2Server, Http2ServerRequest>>().toMatchTypeOf<Parameters<typeof fastifyAdapter.getDispatchContext>[0]>()
    expectTypeOf(fastifyAdapter.getDispatchContext).returns.toEqualTypeOf<DispatchContext>()
    fastifyAdapter.routeByVersion(() => async (request: FastifyRequest, reply: FastifyReply) => {
      expectTypeOf(request.dispatchContext).toEqualTypeOf<DispatchContext | undefined>()
      expectTypeOf(request.dispatchContext?.latestVersion).toEqualTypeOf<string | undefined>()
      // @ts-expect-error the context is read-only
      request.dispatchContext!.app = { id: 'x', slug: 'x', name: 'x' }
      return reply.send()
    })
    // Unannotated, a handler is typed for an HTTP/1 server.
    fastifyAdapter.routeByVersion((app, version) => {
      expectTypeOf(app.id).toEqualTypeOf<string>()
      expectTypeOf(version).toEqualTypeOf<string>()
      return (request, reply) => {
        expectTypeOf(request).toEqualTypeOf<FastifyRequest>()
        expectTypeOf(reply).toEqualTypeOf<FastifyReply>()
        return reply.send()
      }
    })
  })

  it('Fastify over HTTP/2 (`http2: true`): routeByVersion takes handlers typed for that server', () => {
    type H2Request = FastifyRequest<RouteGenericInterface, Http2Server, Http2ServerRequest>
    type H2Reply = FastifyReply<RouteGenericInterface, Http2Server, Http2ServerRequest, Http2ServerResponse>
    const h2: fastifyAdapter.FastifyMcpHandler<H2Request, H2Reply> = async (request, reply) => {
      expectTypeOf(request.raw).toEqualTypeOf<Http2ServerRequest>()
      expectTypeOf(request.dispatchContext).toEqualTypeOf<DispatchContext | undefined>()
      return reply.send()
    }
    expectTypeOf(fastifyAdapter.routeByVersion(() => h2)).toEqualTypeOf<fastifyAdapter.FastifyRouteHandler>()
    fastifyAdapter.routeByVersion({ 'app_weather@1.0.0': h2 })
    fastifyAdapter.routeByVersion(() => async (request: H2Request, reply: H2Reply) => reply.code(200).send(request.raw.authority))
    // A handler of something else is still refused.
    // @ts-expect-error not a route handler
    fastifyAdapter.routeByVersion(() => 'not a handler')
  })

  it('Fastify over HTTP/2 (`http2: true`): frameworkErrors is a frameworkErrors option of that server (regression: typed for HTTP/1 only, TS2769)', () => {
    // Checked by the compiler only (never called).
    const servers = () => [
      Fastify({ frameworkErrors: fastifyAdapter.frameworkErrors }),
      Fastify({ http2: true, frameworkErrors: fastifyAdapter.frameworkErrors }),
      Fastify({ http2: true, https: { allowHTTP1: true }, frameworkErrors: fastifyAdapter.frameworkErrors }),
    ]
    expectTypeOf(servers).toBeFunction()
  })
})

describe('every adapter exports the same names', () => {
  it('mcpDispatch, routeByVersion, getDispatchContext', () => {
    expectTypeOf(webAdapter.mcpDispatch).toBeFunction()
    expectTypeOf(expressAdapter.mcpDispatch).returns.toEqualTypeOf<RequestHandler>()
    // Fastify's: a factory of the plugin, and the plugin itself (`app.register(mcpDispatch, options)`).
    const factory: (options: fastifyAdapter.FastifyDispatchOptions) => FastifyPluginAsync = fastifyAdapter.mcpDispatch
    expectTypeOf(factory).toBeFunction()
    // Checked by the compiler only (never called).
    const registered = (app: FastifyInstance, dispatcher: webAdapter.WebDispatchOptions['dispatcher']) => {
      void app.register(fastifyAdapter.mcpDispatch, { dispatcher, trustProxy: 1 })
      // @ts-expect-error the dispatcher is required
      void app.register(fastifyAdapter.mcpDispatch, { trustProxy: 1 })
    }
    expectTypeOf(registered).toBeFunction()
    expectTypeOf(webAdapter.routeByVersion).toBeFunction()
    expectTypeOf(expressAdapter.routeByVersion).returns.toEqualTypeOf<RequestHandler>()
    expectTypeOf(fastifyAdapter.routeByVersion).toBeFunction()
    expectTypeOf(webAdapter.getDispatchContext).parameter(0).toEqualTypeOf<Request>()
  })

  it('the proxy handler is a handler of every adapter', () => {
    const proxy = createProxyHandler({ upstream: { 'app_x@1.0.0': 'http://127.0.0.1:9/mcp' }, identity: { issuer: 'https://p.example', privateKey: { kty: 'EC', crv: 'P-256', d: 'x' } } })
    expectTypeOf(proxy).toEqualTypeOf<ProxyHandler>()
    expectTypeOf(proxy).toMatchTypeOf<webAdapter.WebMcpHandler>()
    expectTypeOf(proxy).toMatchTypeOf<expressAdapter.ExpressWebHandler>()
    expectTypeOf(proxy).toMatchTypeOf<fastifyAdapter.FastifyWebHandler>()
  })
})

describe('routeByVersion factories', () => {
  it('a factory may answer null or undefined for a version without a handler yet, as docs/adapters.md says (regression: null was TS2322)', () => {
    // Checked by the compiler only (never called).
    const wire = (web: Map<string, webAdapter.WebMcpHandler>, express: Map<string, expressAdapter.ExpressMcpHandler>, fastify: Map<string, fastifyAdapter.FastifyMcpHandler>) => [
      webAdapter.routeByVersion((_app, version) => web.get(version) ?? null),
      expressAdapter.routeByVersion((_app, version) => express.get(version) ?? null),
      fastifyAdapter.routeByVersion((_app, version) => fastify.get(version) ?? null),
      webAdapter.routeByVersion((_app, version) => web.get(version)),
    ]
    expectTypeOf(wire).toBeFunction()
  })
})

describe('token API', () => {
  it('authenticateSession may answer null, undefined or false for no session, as docs/api-tokens.md says (regression: only null type-checked, TS2322)', () => {
    // Checked by the compiler only (never called).
    const make = (tokens: TokenService, sessions: Map<string, { userId: string; csrf: string }>) => [
      createTokenApi({ tokens, authenticateSession: (request) => sessions.get(request.headers.get('cookie') ?? ''), verifyCsrf: (_request, session) => session.csrf !== '' }),
      createTokenApi({ tokens, authenticateSession: async () => undefined, verifyCsrf: false }),
      createTokenApi({ tokens, authenticateSession: (request) => request.headers.has('cookie') && { userId: 'u1' }, verifyCsrf: false }),
      createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: false }),
      // A session without its user is still refused.
      // @ts-expect-error no userId
      createTokenApi({ tokens, authenticateSession: () => ({ id: 'u1' }), verifyCsrf: false }),
    ]
    expectTypeOf(make).returns.items.toEqualTypeOf<TokenApi>()
  })
})
