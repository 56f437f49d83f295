/**
 * One benchmark server in its own process: `node main.mjs <server-id> [--store memory]`.
 * Listens on 127.0.0.1 (ephemeral port), reports over IPC (`listening`, `unavailable`,
 * `stats`) and exits on `close`. Started by `bench/http.ts`; see `catalog.ts` for the ids.
 */
import type { AddressInfo } from 'node:net'
import type { Server } from 'node:http'
import { parseArgs } from 'node:util'
import { bearerAuth } from 'hono/bearer-auth'
import { InvalidTokenError } from '@modelcontextprotocol/sdk/server/auth/errors.js'
import { requireBearerAuth } from '@modelcontextprotocol/sdk/server/auth/middleware/bearerAuth.js'
import type { AuthInfo } from '@modelcontextprotocol/sdk/server/auth/types.js'
import fastifyRateLimit from '@fastify/rate-limit'
import { type HttpBindings, serve } from '@hono/node-server'
import express from 'express'
import { rateLimit as expressRateLimit } from 'express-rate-limit'
import Fastify from 'fastify'
import { Hono } from 'hono'
import { rateLimiter as honoRateLimiter } from 'hono-rate-limiter'
import type { Dispatcher } from 'mcp-dispatch'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { loadAdapters } from '../adapters.js'
import { type BenchFixture, BENCH_PATH, TOOLS_LIST_RESULT, createBenchFixture } from '../fixture.js'
import { type OrchestratorMessage, SERVERS, type ServerMessage } from './catalog.js'

const JSON_HEADERS = { 'content-type': 'application/json' } as const

/**
 * What every benchmark handler checks before answering, as the MCP SDK's Streamable HTTP
 * transport does: `Accept` lists JSON and SSE, the body is JSON. So each handler reads its
 * request headers like a real MCP handler (on `@hono/node-server` that builds the `Headers`
 * object; a bare handler that skipped it would leave the whole cost to the adapter's row).
 */
function acceptable(accept: string | null | undefined, contentType: string | null | undefined): boolean {
  return (
    !!accept &&
    accept.includes('application/json') &&
    accept.includes('text/event-stream') &&
    !!contentType &&
    contentType.startsWith('application/json')
  )
}
const NOT_ACCEPTABLE = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Not Acceptable' } })
const HIGH_LIMIT = 1_000_000_000
const WINDOW_MS = 60_000

interface Started {
  server: Server
}

/** The fixture's dispatcher, counting its decisions (for store round trips per request). */
function countingDispatcher(fixture: BenchFixture): { dispatcher: Dispatcher; decisions: () => number } {
  let decisions = 0
  const inner = fixture.dispatcher
  return {
    dispatcher: {
      basePath: inner.basePath,
      metadata: (app, baseUrl) => inner.metadata(app, baseUrl),
      decide(request) {
        decisions++
        return inner.decide(request)
      },
    },
    decisions: () => decisions,
  }
}

async function startExpress(stack: string, fixture: BenchFixture, dispatcher: Dispatcher): Promise<Started | string> {
  const app = express()
  app.disable('x-powered-by')
  const handler = (req: express.Request, res: express.Response) => {
    // As the MCP SDK's transport answers: on the raw response.
    if (!acceptable(req.headers.accept, req.headers['content-type'])) {
      res.writeHead(406, JSON_HEADERS)
      res.end(NOT_ACCEPTABLE)
      return
    }
    res.writeHead(200, JSON_HEADERS)
    res.end(TOOLS_LIST_RESULT)
  }
  if (stack === 'dispatch') {
    const { express: adapter, missing } = await loadAdapters()
    if (!adapter) return missing.express ?? 'adapter not available'
    app.use(adapter.mcpDispatch({ dispatcher }))
  } else if (stack === 'anchor') {
    const known = new Map<string, AuthInfo>([
      [fixture.token, { token: fixture.token, clientId: 'bench', scopes: [], expiresAt: Math.floor(Date.now() / 1000) + 86_400 }],
    ])
    app.use(
      requireBearerAuth({
        verifier: {
          async verifyAccessToken(token) {
            const info = known.get(token)
            if (!info) throw new InvalidTokenError('Invalid token')
            return info
          },
        },
        resourceMetadataUrl: 'http://bench.localhost/.well-known/oauth-protected-resource',
      }),
    )
    app.use(expressRateLimit({ windowMs: WINDOW_MS, limit: HIGH_LIMIT, standardHeaders: 'draft-8', legacyHeaders: false }))
  }
  app.use(express.json())
  app.post(BENCH_PATH, handler)
  const server = app.listen(0, '127.0.0.1')
  await new Promise<void>((resolve, reject) => server.once('listening', resolve).once('error', reject))
  return { server }
}

async function startFastify(stack: string, fixture: BenchFixture, dispatcher: Dispatcher): Promise<Started | string> {
  const app = Fastify({ logger: false })
  if (stack === 'dispatch') {
    const { fastify: adapter, missing } = await loadAdapters()
    if (!adapter) return missing.fastify ?? 'adapter not available'
    await app.register(adapter.mcpDispatch({ dispatcher }))
  } else if (stack === 'anchor') {
    await app.register(fastifyRateLimit, { max: HIGH_LIMIT, timeWindow: WINDOW_MS })
    const known = new Set([fixture.token])
    app.addHook('onRequest', async (request, reply) => {
      const header = request.headers.authorization
      if (!header || !header.startsWith('Bearer ') || !known.has(header.slice(7))) {
        return reply
          .code(401)
          .header('www-authenticate', 'Bearer error="invalid_token"')
          .send({ error: 'invalid_token' })
      }
      return undefined
    })
  }
  app.post(BENCH_PATH, async (request, reply) =>
    acceptable(request.headers.accept, request.headers['content-type'])
      ? reply.headers(JSON_HEADERS).send(TOOLS_LIST_RESULT)
      : reply.code(406).headers(JSON_HEADERS).send(NOT_ACCEPTABLE),
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { server: app.server }
}

async function startHono(stack: string, fixture: BenchFixture, dispatcher: Dispatcher): Promise<Started> {
  const app = new Hono<{ Bindings: HttpBindings }>()
  if (stack === 'dispatch') {
    const mcp = webDispatch({
      dispatcher,
      handler: async (request) => {
        if (!acceptable(request.headers.get('accept'), request.headers.get('content-type'))) {
          return new Response(NOT_ACCEPTABLE, { status: 406, headers: JSON_HEADERS })
        }
        await request.json()
        return new Response(TOOLS_LIST_RESULT, { headers: JSON_HEADERS })
      },
    })
    app.all('/*', (c) => mcp(c.req.raw, { clientAddress: c.env.incoming.socket.remoteAddress, outgoing: c.env.outgoing }))
  } else {
    if (stack === 'anchor') {
      app.use(BENCH_PATH, bearerAuth({ token: fixture.token }))
      app.use(
        BENCH_PATH,
        honoRateLimiter({
          windowMs: WINDOW_MS,
          limit: HIGH_LIMIT,
          standardHeaders: 'draft-7',
          keyGenerator: (c) => c.req.header('authorization') ?? '',
        }),
      )
    }
    app.post(BENCH_PATH, async (c) => {
      if (!acceptable(c.req.header('accept'), c.req.header('content-type'))) return c.body(NOT_ACCEPTABLE, 406, JSON_HEADERS)
      await c.req.json()
      return c.body(TOOLS_LIST_RESULT, 200, JSON_HEADERS)
    })
  }
  const server = await new Promise<Server>((resolve) => {
    const s = serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' }, () => resolve(s as Server))
  })
  return { server }
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { store: { type: 'string', default: 'memory' } },
  })
  const send = (message: ServerMessage) => process.send?.(message)
  const entry = SERVERS.find((s) => s.id === positionals[0])
  if (!entry) throw new Error(`unknown server ${JSON.stringify(positionals[0])}; known: ${SERVERS.map((s) => s.id).join(', ')}`)
  const fixture = await createBenchFixture({ store: values.store!, count: true })
  const { dispatcher, decisions } = countingDispatcher(fixture)
  const start = { express: startExpress, fastify: startFastify, hono: startHono }[entry.framework]
  const started = await start(entry.stack, fixture, dispatcher)
  if (typeof started === 'string') {
    send({ type: 'unavailable', reason: started })
    await fixture.close()
    process.disconnect?.()
    return
  }
  const { server } = started
  // Serves until told to stop; keep-alive connections of the load generator are closed then.
  process.on('message', (message: OrchestratorMessage) => {
    if (message.type === 'stats') {
      const byMethod: Record<string, number> = {}
      for (const [key, value] of Object.entries(fixture.counts ?? {})) if (value > 0) byMethod[key] = value
      const cpu = process.cpuUsage()
      send({
        type: 'stats',
        decisions: decisions(),
        storeCalls: fixture.totalStoreCalls(),
        byMethod,
        cpuMicros: cpu.user + cpu.system,
      })
    } else if (message.type === 'close') {
      server.closeAllConnections?.()
      server.close(() => {
        void fixture.close().finally(() => process.exit(0))
      })
    }
  })
  fixture.resetCounts()
  const port = (server.address() as AddressInfo).port
  if (process.send) {
    // The orchestrator went away (Ctrl-C): do not linger as an orphan server.
    process.once('disconnect', () => process.exit(0))
    send({ type: 'listening', port, token: fixture.token, hostname: fixture.hostname })
  } else {
    // Standalone (profiling: `node --cpu-prof server.mjs <id>`), stopped with Ctrl-C.
    console.log(`${entry.id} on http://127.0.0.1:${port}${BENCH_PATH}`)
    // Every handler wants both MCP media types in `Accept` (406 without), as the load sends them.
    console.log(
      `  -H 'host: ${fixture.hostname}' -H 'authorization: Bearer ${fixture.token}' -H 'content-type: application/json' -H 'accept: application/json, text/event-stream'`,
    )
    const stop = () => server.close(() => process.exit(0))
    process.once('SIGINT', stop)
    process.once('SIGTERM', stop)
  }
}

main().catch((error: unknown) => {
  console.error(error)
  process.exit(1)
})
