/**
 * An audit of the Express (5 and 4) and Fastify 5 adapters as a platform wires them into an
 * existing app, with the MCP SDK's `StreamableHTTPServerTransport` behind them, over real
 * sockets on 127.0.0.1: a connection reused after a refusal that left its body unread, the
 * headers a handler (or a rate limiter of the platform's) set before the dispatch headers, the
 * platform's own error middleware and hooks beside the adapter's, and a body parser or none.
 * What the client receives is read from the raw bytes, so a field sent twice shows.
 */
import type * as http from 'node:http'
import { type AddressInfo, connect } from 'node:net'
import Fastify, { type FastifyInstance } from 'fastify'
import { createDispatcher } from 'mcp-dispatch'
import { mcpDispatch as expressDispatch, routeByVersion as expressRoute } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch, routeByVersion as fastifyRoute } from 'mcp-dispatch/fastify'
import { afterAll, describe, expect, it } from 'vitest'
import { EXPRESS, EXPRESS_KINDS } from '../helpers/express.js'
import { HOST, createFixture, expressServers } from './helpers.js'
import { buildScenarioServer, createNodeMcpHandler } from './mcp.js'

const INITIALIZED = (text: string) => text.includes('"protocolVersion":"2025-06-18"')

const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'audit', version: '1' } },
})

/**
 * Writes `parts` on one connection (a pause between them, so a body arrives after its head was
 * answered) and answers every byte the server sent until it closed the connection (or `done`).
 */
function exchange(port: number, parts: string[], done: (text: string) => boolean = () => false, gapMs = 5): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1')
    let text = ''
    const timer = setTimeout(() => {
      socket.destroy()
      resolve(`${text}<timed out>`)
    }, 5000)
    socket.setEncoding('latin1')
    socket.on('data', (chunk: string) => {
      text += chunk
      // An SSE answer keeps the connection open (the SDK sets \`Connection: keep-alive\`).
      if (done(text)) socket.destroy()
    })
    socket.on('close', () => {
      clearTimeout(timer)
      resolve(text)
    })
    socket.on('error', reject)
    socket.on('connect', async () => {
      for (const part of parts) {
        socket.write(part)
        await new Promise((r) => setTimeout(r, gapMs))
      }
    })
  })
}

/** The responses in `text`: status and head lines (lower-cased names) of each. */
function heads(text: string): Array<{ status: number; fields: string[] }> {
  return [...text.matchAll(/HTTP\/1\.1 (\d{3})[^\r]*\r\n([\s\S]*?)\r\n\r\n/g)].map((m) => ({
    status: Number(m[1]),
    fields: m[2]!.split('\r\n').map((line) => line.toLowerCase()),
  }))
}

const named = (fields: string[], name: string) => fields.filter((line) => line.startsWith(`${name}:`))

/** A POST head on HTTP/1.1. */
function post(options: { token?: string; host?: string; target?: string; length?: number; chunked?: boolean; extra?: Record<string, string>; close?: boolean }): string {
  const lines = [`POST ${options.target ?? '/v1'} HTTP/1.1`, `Host: ${options.host ?? HOST}`, 'Content-Type: application/json', 'Accept: application/json, text/event-stream']
  if (options.token) lines.push(`Authorization: Bearer ${options.token}`)
  for (const [name, value] of Object.entries(options.extra ?? {})) lines.push(`${name}: ${value}`)
  lines.push(options.chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${options.length ?? 0}`)
  if (options.close) lines.push('Connection: close')
  return `${lines.join('\r\n')}\r\n\r\n`
}

/** The metadata document, on the same connection, closing it. */
const METADATA = `GET /.well-known/oauth-protected-resource HTTP/1.1\r\nHost: ${HOST}\r\nConnection: close\r\n\r\n`

/** A refused POST whose body (200 kB, or chunked) arrives after its 401, then the next request on the connection. */
async function expectConnectionReusedAfterRefusal(port: number): Promise<void> {
  const body = `{"pad":"${'x'.repeat(200_000)}"}`
  for (const parts of [
    [post({ length: body.length }), body.slice(0, 1000), body.slice(1000), METADATA],
    [post({ chunked: true }), `${(1000).toString(16)}\r\n${body.slice(0, 1000)}\r\n`, `${(body.length - 1000).toString(16)}\r\n${body.slice(1000)}\r\n0\r\n\r\n`, METADATA],
  ]) {
    const text = await exchange(port, parts)
    expect(heads(text).map((h) => h.status)).toEqual([401, 200])
    // The second answer is the metadata document, not a parse of the first request's body.
    expect(text).toContain(`"resource":"http://${HOST}"`)
  }
}

/** `initialize` at an absolute-form target of an upper- or mixed-case scheme is served (200). */
async function expectServedUnderUpperCaseScheme(port: number, token: string, path = '/v1'): Promise<void> {
  for (const scheme of ['HTTP', 'Https']) {
    const text = await exchange(port, [post({ token, target: `${scheme}://${HOST}${path}`, length: INIT.length, close: true }), INIT], INITIALIZED)
    expect(heads(text)[0]!.status, scheme).toBe(200)
    expect(text, scheme).toContain('"protocolVersion":"2025-06-18"')
  }
}

describe.each(EXPRESS_KINDS)('%s adapter, audit', (kind) => {
  const express = EXPRESS[kind]
  const { serve, closeAll } = expressServers()
  afterAll(closeAll)

  it('a connection reused after a refusal whose body (by length or chunked) was never read serves the next request intact', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher }))
    await expectConnectionReusedAfterRefusal(await serve(app))
  })

  it('X-MCP-Version and RateLimit go out once, the dispatch layer\'s, over those the handler (or a rate limiter of the platform\'s before the middleware) set', async () => {
    // One request a minute on the busy App: a fresh fixture (budget) for each form.
    for (const form of ['object', 'array']) {
      const fixture = createFixture()
      const app = express()
      app.use((_req, res, next) => {
        // As express-rate-limit's standard headers (draft 7) would.
        res.setHeader('RateLimit', 'limit=100, remaining=99, reset=60')
        res.setHeader('RateLimit-Policy', '100;w=60')
        next()
      })
      app.use(expressDispatch({ dispatcher: fixture.dispatcher }))
      app.use(
        expressRoute(() => (_req, res) => {
          res.setHeader('X-MCP-Version', 'mine')
          if (form === 'array') res.writeHead(200, ['Content-Type', 'application/json', 'x-mcp-version', 'mine', 'RATELIMIT', 'mine']).end('{}')
          else res.writeHead(200, { 'content-type': 'application/json', 'X-MCP-Version': 'mine', ratelimit: 'mine' }).end('{}')
        }),
      )
      const port = await serve(app)
      const [head] = heads(await exchange(port, [post({ token: fixture.tokens.aliceBusy, host: 'busy.localhost', length: 2, close: true }), '{}']))
      expect(head!.status, form).toBe(200)
      expect(named(head!.fields, 'x-mcp-version'), form).toEqual(['x-mcp-version: 1.0.0'])
      expect(named(head!.fields, 'ratelimit'), form).toEqual(['ratelimit: "minute";r=0;t=30'])
      expect(named(head!.fields, 'ratelimit-policy'), form).toEqual(['ratelimit-policy: "minute";q=1;w=60'])
    }
  })

  it("the platform's error middleware after the adapter: a handler's next(error) reaches it (with the dispatch headers); a throw or rejection is the 502 and onError; an answer after the client left reports nothing", async () => {
    const fixture = createFixture()
    const heard: string[] = []
    const app = express()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher, onError: (error, context) => heard.push(`${context}: ${(error as Error).message}`) }))
    let late: Promise<void> | undefined
    app.use(
      expressRoute(() => (req, res, next) => {
        const mode = req.headers['x-mode']
        if (mode === 'throw') throw new Error('thrown')
        if (mode === 'reject') return Promise.reject(new Error('rejected'))
        if (mode === 'next') return next(new Error('passed on'))
        late = new Promise((resolve) =>
          req.socket.once('close', () =>
            setTimeout(() => {
              res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
              resolve()
            }, 10),
          ),
        )
      }),
    )
    app.use((error: Error, _req: http.IncomingMessage, res: http.ServerResponse, _next: unknown) => {
      res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ platform: error.message }))
    })
    const port = await serve(app)
    const ask = (mode: string) => exchange(port, [post({ token: fixture.tokens.alice, length: 2, close: true, extra: { 'X-Mode': mode } }), '{}'])
    const passed = await ask('next')
    expect(heads(passed)[0]!.status).toBe(500)
    expect(named(heads(passed)[0]!.fields, 'x-mcp-version')).toEqual(['x-mcp-version: 1.0.0'])
    expect(passed).toContain('{"platform":"passed on"}')
    for (const mode of ['throw', 'reject']) {
      const failed = await ask(mode)
      expect(heads(failed)[0]!.status, mode).toBe(502)
      expect(failed, mode).toContain('"data":{"error":"handler_error"}')
    }
    expect(heard).toEqual(['handler: thrown', 'handler: rejected'])
    // The client goes away before the handler answers.
    const socket = connect(port, '127.0.0.1')
    socket.on('error', () => {})
    socket.on('connect', () => socket.write(`${post({ token: fixture.tokens.alice, length: 2, extra: { 'X-Mode': 'late' } })}{}`))
    await expect.poll(() => late !== undefined).toBe(true)
    socket.destroy()
    await late
    expect(heard).toEqual(['handler: thrown', 'handler: rejected'])
  })

  it('behind express.json(), the SDK transport handed req.body serves initialize; without a parser, a large body (3 MB) and a chunked one reach it unread, and one that is not JSON is its -32700, never a 500', async () => {
    const fixture = createFixture()
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const parsed = express()
    parsed.use(express.json())
    parsed.use(expressDispatch({ dispatcher: fixture.dispatcher }))
    parsed.use(expressRoute(() => (req, res) => sessions.handle(req, res, (req as { body?: unknown }).body)))
    const raw = express()
    raw.use(expressDispatch({ dispatcher: fixture.dispatcher }))
    raw.use(expressRoute(() => (req, res) => sessions.handle(req, res)))
    try {
      const initialized = (text: string) => {
        expect(heads(text)[0]!.status).toBe(200)
        expect(named(heads(text)[0]!.fields, 'mcp-session-id')).toHaveLength(1)
        expect(text).toContain('"protocolVersion":"2025-06-18"')
      }
      initialized(await exchange(await serve(parsed), [post({ token: fixture.tokens.alice, length: INIT.length, close: true }), INIT], INITIALIZED))
      const rawPort = await serve(raw)
      const large = JSON.stringify({ ...JSON.parse(INIT), params: { ...JSON.parse(INIT).params, _meta: { pad: 'x'.repeat(3_000_000) } } })
      initialized(await exchange(rawPort, [post({ token: fixture.tokens.alice, length: large.length, close: true }), large], INITIALIZED))
      const chunks = [INIT.slice(0, 40), INIT.slice(40)].map((c) => `${c.length.toString(16)}\r\n${c}\r\n`)
      initialized(await exchange(rawPort, [post({ token: fixture.tokens.alice, chunked: true, close: true }), ...chunks, '0\r\n\r\n'], INITIALIZED))
      const bad = await exchange(rawPort, [post({ token: fixture.tokens.alice, length: 4, close: true }), '{bad'])
      expect(heads(bad)[0]!.status).toBe(400)
      expect(bad).toContain('"code":-32700')
    } finally {
      await sessions.close()
    }
  })
  it('an absolute-form target whose scheme is not lower case (HTTP://, Https://) reaches the SDK transport as http(s)://, and is served (regression: @hono/node-server under the transport answered an empty 400, after the caller was authenticated and charged)', async () => {
    const fixture = createFixture()
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const app = express()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher }))
    app.use(expressRoute(() => (req, res) => sessions.handle(req, res)))
    // Mounted as docs/adapters.md shows: Express's router writes the target again, from the
    // scheme it read before the adapter, as it leaves and enters the mount (regression: the
    // handler got HTTP:// back).
    const mounted = express()
    mounted.use('/mcp', expressDispatch({ dispatcher: createDispatcher({ ...fixture.dispatcherOptions, basePath: '/mcp' }) }), expressRoute(() => (req, res) => sessions.handle(req, res)))
    try {
      await expectServedUnderUpperCaseScheme(await serve(app), fixture.tokens.alice)
      await expectServedUnderUpperCaseScheme(await serve(mounted), fixture.tokens.alice, '/mcp/v1')
    } finally {
      await sessions.close()
    }
  })
})

describe('fastify adapter, audit', () => {
  const apps: FastifyInstance[] = []
  afterAll(async () => {
    for (const app of apps.splice(0)) await app.close()
  })
  async function start(app: FastifyInstance): Promise<number> {
    apps.push(app)
    await app.listen({ port: 0, host: '127.0.0.1' })
    return (app.server.address() as AddressInfo).port
  }

  it('a connection reused after a refusal whose body (by length or chunked) was never read serves the next request intact', async () => {
    const app = Fastify()
    await app.register(fastifyDispatch({ dispatcher: createFixture().dispatcher }))
    app.all('/*', async () => ({}))
    await expectConnectionReusedAfterRefusal(await start(app))
  })

  it("X-MCP-Version and RateLimit go out once, the dispatch layer's, over those set with reply.header and on reply.raw", async () => {
    for (const form of ['send', 'hijack']) {
      const fixture = createFixture()
      const app = Fastify()
      await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
      app.all(
        '/*',
        fastifyRoute(() => async (_request, reply) => {
          if (form === 'hijack') {
            reply.hijack()
            reply.raw.setHeader('RateLimit', 'mine')
            reply.raw.writeHead(200, { 'content-type': 'application/json', 'X-MCP-Version': 'mine' }).end('{}')
            return
          }
          reply.header('X-MCP-Version', 'mine').header('RateLimit', 'mine')
          return { ok: true }
        }),
      )
      const port = await start(app)
      const [head] = heads(await exchange(port, [post({ token: fixture.tokens.aliceBusy, host: 'busy.localhost', length: 2, close: true }), '{}']))
      expect(head!.status, form).toBe(200)
      expect(named(head!.fields, 'x-mcp-version'), form).toEqual(['x-mcp-version: 1.0.0'])
      expect(named(head!.fields, 'ratelimit'), form).toEqual(['ratelimit: "minute";r=0;t=30'])
    }
  })

  it("the platform's own onRequest hooks: one before the plugin that answers keeps its answer (no dispatch headers, no decision); one after it answers with the dispatch headers, through reply.send or a hijacked reply.raw", async () => {
    const fixture = createFixture()
    const app = Fastify()
    app.addHook('onRequest', async (request, reply) => {
      if (request.headers['x-deny'] === 'before') return reply.code(403).send({ own: 'before' })
    })
    await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
    app.addHook('onRequest', async (request, reply) => {
      if (request.headers['x-deny'] === 'after') return reply.code(403).send({ own: 'after' })
      if (request.headers['x-deny'] === 'hijack') {
        reply.hijack()
        reply.raw.writeHead(418, { 'content-type': 'text/plain' }).end('own')
      }
    })
    app.all('/*', async (request) => ({ version: request.dispatchContext?.version }))
    const port = await start(app)
    const ask = (deny: string, token?: string) => exchange(port, [post({ token, length: 2, close: true, extra: { 'X-Deny': deny } }), '{}'])
    const before = await ask('before')
    expect(heads(before)[0]!.status).toBe(403)
    expect(named(heads(before)[0]!.fields, 'x-mcp-version')).toEqual([])
    expect(before).toContain('{"own":"before"}')
    // No token: the plugin's 401 comes before the platform's later hook.
    expect(heads(await ask('after'))[0]!.status).toBe(401)
    for (const [deny, status] of [['after', 403], ['hijack', 418]] as const) {
      const text = await ask(deny, fixture.tokens.alice)
      expect(heads(text)[0]!.status, deny).toBe(status)
      expect(named(heads(text)[0]!.fields, 'x-mcp-version'), deny).toEqual(['x-mcp-version: 1.0.0'])
    }
    expect(await ask('none', fixture.tokens.alice)).toContain('{"version":"1.0.0"}')
  })

  it('with the body left unread (a catch-all parser), the SDK transport gets it as sent: large (3 MB) or chunked, and one that is not JSON is its -32700; a hijacked handler that throws is the 502 and onError', async () => {
    const fixture = createFixture()
    const heard: string[] = []
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const app = Fastify()
    app.removeAllContentTypeParsers()
    app.addContentTypeParser('*', (_request, _payload, done) => done(null))
    await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError: (error, context) => heard.push(`${context}: ${(error as Error).message}`) }))
    app.all(
      '/*',
      fastifyRoute(() => async (request, reply) => {
        reply.hijack()
        if (request.headers['x-mode'] === 'throw') throw new Error('thrown after hijack')
        await sessions.handle(request.raw, reply.raw, request.body)
      }),
    )
    const port = await start(app)
    try {
      const initialized = (text: string) => {
        expect(heads(text)[0]!.status).toBe(200)
        expect(text).toContain('"protocolVersion":"2025-06-18"')
      }
      const large = JSON.stringify({ ...JSON.parse(INIT), params: { ...JSON.parse(INIT).params, _meta: { pad: 'x'.repeat(3_000_000) } } })
      initialized(await exchange(port, [post({ token: fixture.tokens.alice, length: large.length, close: true }), large], INITIALIZED))
      const chunks = [INIT.slice(0, 40), INIT.slice(40)].map((c) => `${c.length.toString(16)}\r\n${c}\r\n`)
      initialized(await exchange(port, [post({ token: fixture.tokens.alice, chunked: true, close: true }), ...chunks, '0\r\n\r\n'], INITIALIZED))
      const bad = await exchange(port, [post({ token: fixture.tokens.alice, length: 4, close: true }), '{bad'])
      expect(heads(bad)[0]!.status).toBe(400)
      expect(bad).toContain('"code":-32700')
      const thrown = await exchange(port, [post({ token: fixture.tokens.alice, length: 2, close: true, extra: { 'X-Mode': 'throw' } }), '{}'])
      expect(heads(thrown)[0]!.status).toBe(502)
      expect(named(heads(thrown)[0]!.fields, 'x-mcp-version')).toEqual(['x-mcp-version: 1.0.0'])
      expect(heard).toEqual(['handler: thrown after hijack'])
    } finally {
      await sessions.close()
    }
  })
  it('an absolute-form target whose scheme is not lower case (HTTP://, Https://) reaches the SDK transport as http(s)://, and is served (regression: an empty 400 after the caller was authenticated and charged)', async () => {
    const fixture = createFixture()
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const app = Fastify()
    app.removeAllContentTypeParsers()
    app.addContentTypeParser('*', (_request, _payload, done) => done(null))
    await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
    app.all(
      '/*',
      fastifyRoute(() => async (request, reply) => {
        reply.hijack()
        await sessions.handle(request.raw, reply.raw)
      }),
    )
    const port = await start(app)
    try {
      await expectServedUnderUpperCaseScheme(port, fixture.tokens.alice)
    } finally {
      await sessions.close()
    }
  })
})
