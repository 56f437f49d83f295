/**
 * The three adapters around the suite's probe handler (see `suite.ts`), written natively for
 * each framework: Web (`Request` in memory, `@hono/node-server` on loopback), Express 5 and 4
 * (loopback only: Express has no in-memory injection) and Fastify (`fastify.inject`, and loopback).
 */
import * as http from 'node:http'
import { PassThrough } from 'node:stream'
import Fastify from 'fastify'
import { type ExpressMcpHandler, mcpDispatch as expressDispatch, routeByVersion as expressRoutes } from 'mcp-dispatch/express'
import { type FastifyMcpHandler, mcpDispatch as fastifyDispatch, routeByVersion as fastifyRoutes } from 'mcp-dispatch/fastify'
import { type WebMcpHandler, mcpDispatch as webDispatch, routeByVersion as webRoutes } from 'mcp-dispatch/web'
import { HOST, close, listen, rawRequest, recordResponse } from './helpers.js'
import type { ProbeState, StartAdapter } from './suite.js'
import { EXPRESS, type ExpressModule } from '../helpers/express.js'
import { serveFetch } from '../helpers/platform.js'

const encoder = new TextEncoder()

/** The suite's probe handler, web-standard. */
export function webProbe(probe: ProbeState): WebMcpHandler {
  return async (request, context) => {
    if (request.headers.get('x-test-throw')) throw new Error('probe failed')
    const headers = new Headers({
      'x-probe': 'yes',
      'x-mcp-version': '0.0.0-handler',
      vary: 'Accept-Encoding',
      'access-control-expose-headers': 'X-Probe',
    })
    const session = request.headers.get('x-test-session')
    if (session) headers.set('mcp-session-id', session)
    if (request.headers.get('x-test-stream')) {
      headers.set('content-type', 'text/event-stream')
      const gate = probe.gate
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          controller.enqueue(encoder.encode('data: one\n\n'))
          void gate.wait().then(() => {
            controller.enqueue(encoder.encode('data: two\n\n'))
            controller.close()
          })
        },
      })
      return new Response(stream, { headers })
    }
    headers.set('content-type', 'application/json')
    const body = await request.text()
    return new Response(
      JSON.stringify({
        version: context.version,
        latest: context.latestVersion,
        app: context.app.id,
        subject: context.identity.subject,
        sessionId: context.sessionId ?? null,
        method: request.method,
        body,
      }),
      { headers },
    )
  }
}

/** The Web adapter around the probe, as both Web targets serve it. */
function webProbeHandle({ fixture, probe, trustProxy }: Parameters<StartAdapter>[0]) {
  return webDispatch({
    dispatcher: fixture.dispatcher,
    ...(trustProxy !== undefined && { trustProxy }),
    onError: (error, context) => fixture.errors.push({ error, context }),
    handler: webRoutes((app) => (app.id === 'app_other' ? undefined : webProbe(probe))),
  })
}

export const startWeb: StartAdapter = async (options) => {
  const handle = webProbeHandle(options)
  // Loopback without `outgoing`: the headers go on the `Response` (the path of other runtimes).
  const served = await serveFetch((request, info) => handle(request, { clientAddress: info.clientAddress }))
  return {
    port: served.port,
    async request(r) {
      const method = r.method ?? 'POST'
      const request = new Request(`http://${r.host ?? HOST}${r.path ?? '/'}`, {
        method,
        headers: r.headers ?? {},
        ...(r.body !== undefined && { body: r.body as BodyInit }),
      })
      return recordResponse(await handle(request, { clientAddress: r.clientAddress ?? '127.0.0.1' }))
    },
    close: served.close,
  }
}

/**
 * The Web adapter on `@hono/node-server` with `info.outgoing`: the dispatch headers go into
 * Node's response head, and the handler's `Response` passes through untouched. Every request
 * over loopback HTTP.
 */
export const startWebOnNode: StartAdapter = async (options) => {
  const served = await serveFetch(webProbeHandle(options))
  return { port: served.port, request: (r) => rawRequest(served.port, r), close: served.close }
}

async function readText(req: http.IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

/** The suite's probe handler, written the Express way. */
export function expressProbe(probe: ProbeState): ExpressMcpHandler {
  return async (req, res) => {
    res.setHeader('x-probe', 'yes')
    res.setHeader('vary', 'Accept-Encoding')
    res.setHeader('access-control-expose-headers', 'X-Probe')
    const session = req.headers['x-test-session']
    if (typeof session === 'string') res.setHeader('mcp-session-id', session)
    if (req.headers['x-test-throw']) {
      res.setHeader('content-encoding', 'gzip') // about to stream a gzip body
      throw new Error('probe failed')
    }
    if (req.headers['x-test-stream']) {
      // Headers through writeHead's argument: the dispatch headers must still win.
      res.writeHead(200, { 'content-type': 'text/event-stream', 'x-mcp-version': '0.0.0-handler' })
      res.write('data: one\n\n')
      await probe.gate.wait()
      res.end('data: two\n\n')
      return
    }
    res.setHeader('x-mcp-version', '0.0.0-handler')
    const body = await readText(req)
    const context = req.dispatchContext!
    res.json({
      version: context.version,
      latest: context.latestVersion,
      app: context.app.id,
      subject: context.identity.subject,
      sessionId: context.sessionId ?? null,
      method: req.method,
      body,
    })
  }
}

/** The Express adapter around the probe, on the Express module given (5 or 4). */
function expressTarget(express: ExpressModule): StartAdapter {
  return async ({ fixture, probe, trustProxy }) => {
    // Express's defaults, X-Powered-By included: the rejections must still be the Web adapter's bytes.
    const app = express()
    // A platform's middleware ahead of the adapter that sets a `Vary` of its own, and names of
    // its own in `Access-Control-Expose-Headers` (`cors({ exposedHeaders })`).
    app.use((req, res, next) => {
      const vary = req.headers['x-test-vary']
      if (typeof vary === 'string') res.setHeader('vary', vary)
      const expose = req.headers['x-test-expose']
      if (typeof expose === 'string') res.setHeader('access-control-expose-headers', expose)
      next()
    })
    app.use(
      expressDispatch({
        dispatcher: fixture.dispatcher,
        ...(trustProxy !== undefined && { trustProxy }),
        onError: (error, context) => fixture.errors.push({ error, context }),
      }),
    )
    app.use(expressRoutes((appRecord) => (appRecord.id === 'app_other' ? undefined : expressProbe(probe))))
    const server = http.createServer(app)
    const port = await listen(server)
    return {
      port,
      request: (r) => rawRequest(port, r),
      close: () => close(server),
    }
  }
}

export const startExpress: StartAdapter = expressTarget(EXPRESS.express)
export const startExpress4: StartAdapter = expressTarget(EXPRESS.express4)

/** The suite's probe handler, written the Fastify way (`reply.send`, a stream for SSE). */
export function fastifyProbe(probe: ProbeState): FastifyMcpHandler {
  return async (request, reply) => {
    reply.header('x-probe', 'yes').header('x-mcp-version', '0.0.0-handler').header('vary', 'Accept-Encoding')
    reply.header('access-control-expose-headers', 'x-probe')
    const session = request.headers['x-test-session']
    if (typeof session === 'string') reply.header('mcp-session-id', session)
    if (request.headers['x-test-throw']) {
      reply.raw.setHeader('content-encoding', 'gzip') // on the raw response too
      throw new Error('probe failed')
    }
    if (request.headers['x-test-stream']) {
      const out = new PassThrough()
      out.write('data: one\n\n')
      void probe.gate.wait().then(() => out.end('data: two\n\n'))
      return reply.header('content-type', 'text/event-stream').send(out)
    }
    const context = request.dispatchContext!
    const body = typeof request.body === 'string' ? request.body : request.body === undefined ? '' : JSON.stringify(request.body)
    return reply.header('content-type', 'application/json').send(
      JSON.stringify({
        version: context.version,
        latest: context.latestVersion,
        app: context.app.id,
        subject: context.identity.subject,
        sessionId: context.sessionId ?? null,
        method: request.method,
        body,
      }),
    )
  }
}

export const startFastify: StartAdapter = async ({ fixture, probe, trustProxy }) => {
  const app = Fastify()
  // A platform's hook ahead of the adapter's that sets a `Vary` of its own, and names of its
  // own in `Access-Control-Expose-Headers` (`@fastify/cors`' `exposedHeaders`).
  app.addHook('onRequest', (request, reply, done) => {
    const vary = request.headers['x-test-vary']
    if (typeof vary === 'string') reply.header('vary', vary)
    const expose = request.headers['x-test-expose']
    if (typeof expose === 'string') reply.header('access-control-expose-headers', expose)
    done()
  })
  await app.register(
    fastifyDispatch({
      dispatcher: fixture.dispatcher,
      ...(trustProxy !== undefined && { trustProxy }),
      onError: (error, context) => fixture.errors.push({ error, context }),
    }),
  )
  app.all('/*', fastifyRoutes((appRecord) => (appRecord.id === 'app_other' ? undefined : fastifyProbe(probe))))
  await app.listen({ port: 0, host: '127.0.0.1' })
  const address = app.server.address()
  const port = typeof address === 'object' && address ? address.port : 0
  return {
    port,
    async request(r) {
      const res = await app.inject({
        method: (r.method ?? 'POST') as 'POST',
        url: r.path ?? '/',
        headers: { host: r.host ?? HOST, ...r.headers },
        remoteAddress: r.clientAddress ?? '127.0.0.1',
        ...(r.body !== undefined && { payload: r.body }),
      })
      const headers: Record<string, string> = {}
      for (const [name, value] of Object.entries(res.headers)) {
        if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : String(value)
      }
      return { status: res.statusCode, headers, body: res.body }
    },
    close: () => app.close(),
  }
}
