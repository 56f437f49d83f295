/**
 * `jsonRpcErrors` of the Express and Fastify adapters: a body the framework's JSON parser
 * refused, or a route that failed, is answered in JSON-RPC as the MCP SDK transport answers
 * such a body where no parser runs (the Web adapter's Apps), never with the framework's own
 * HTML page or error object, and never with the error's own text. Real Express 5 and 4,
 * Fastify, the dispatch layer in front and the SDK's Node transport behind, over loopback.
 */
import * as http from 'node:http'
import fastifyRateLimit from '@fastify/rate-limit'
import Fastify from 'fastify'
import { ConfigurationError } from 'mcp-dispatch'
import { jsonRpcErrors as expressErrors, mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { jsonRpcErrors as fastifyErrors, mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import { afterAll, describe, expect, it } from 'vitest'
import { EXPRESS, EXPRESS_KINDS } from '../helpers/express.js'
import { type HttpRecord, createFixture, expressServers, rawRequest } from './helpers.js'
import { buildScenarioServer, createNodeMcpHandler } from './mcp.js'

const SECRET = 'svc_notToBeSeenAnywhereInAnAnswer'
const INITIALIZE = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'test', version: '0' } },
})
const ACCEPT = 'application/json, text/event-stream'

const body = (code: number, message: string) => JSON.stringify({ jsonrpc: '2.0', id: null, error: { code, message } })
const PARSE_ERROR = body(-32700, 'Parse error: Invalid JSON')
const INTERNAL = body(-32603, 'Internal error')
const UNSUPPORTED = body(-32000, 'Unsupported Media Type: Content-Type must be application/json')

/** An answer of `jsonRpcErrors`: its status and exact body, JSON without a charset, no trace of the error's text. */
function expectAnswer(answer: HttpRecord, status: number, expected: string): void {
  expect({ status: answer.status, body: answer.body }).toEqual({ status, body: expected })
  expect(answer.headers['content-type']).toBe('application/json')
  expect(answer.headers['x-powered-by']).toBeUndefined()
  expect(JSON.stringify(answer)).not.toContain(SECRET)
}

/** A good body goes past `jsonRpcErrors` to the SDK transport, which opens a session. */
async function expectSdkServes(port: number, token: string): Promise<void> {
  const served = await post(port, token, INITIALIZE)
  expect(served.status).toBe(200)
  expect(served.headers['mcp-session-id']).toBeTruthy()
}

/** A request of alice's to `/v1` (dispatched: the answer carries the version). */
function post(port: number, token: string, payload: string, headers: Record<string, string> = {}) {
  return rawRequest(port, {
    path: '/v1',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: ACCEPT, ...headers },
    body: payload,
  })
}

describe.each(EXPRESS_KINDS)('%s: jsonRpcErrors', (kind) => {
  const express = EXPRESS[kind]
  const { serve, closeAll } = expressServers()
  afterAll(closeAll)

  async function start() {
    const fixture = createFixture()
    const reported: Array<{ error: unknown; context: string }> = []
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const app = express()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher }))
    app.use(express.json({ limit: 1000 }))
    app.use((req: http.IncomingMessage & { body?: { method?: string } }, res: http.ServerResponse, next: (error?: unknown) => void) => {
      const method = req.body?.method
      if (method === 'throw') throw new Error(`the database said no to ${SECRET}`)
      if (method === 'forbidden') return next(Object.assign(new Error(SECRET), { status: 403 }))
      if (method === 'unavailable') return next(Object.assign(new Error(SECRET), { status: 500 }))
      // Another body parser's refusal: a SyntaxError with status 400 and no type express.json() names.
      if (method === 'syntax') return next(Object.assign(new SyntaxError(SECRET), { status: 400 }))
      if (method === 'half') {
        res.writeHead(200, { 'content-type': 'text/plain' })
        res.write('partial ')
        return next(new Error(SECRET))
      }
      return sessions.handle(req, res, req.body)
    })
    app.use(expressErrors({ onError: (error, context) => reported.push({ error, context }) }))
    // What jsonRpcErrors passes on, to Express's own handling.
    const passedOn: unknown[] = []
    app.use((error: unknown, _req: http.IncomingMessage, _res: http.ServerResponse, next: (error?: unknown) => void) => {
      passedOn.push(error)
      next(error)
    })
    const port = await serve(app)
    return { port, token: fixture.tokens.alice, reported, passedOn, close: () => sessions.close() }
  }

  it('answers a body express.json() refused as the SDK transport would (bad JSON 400 -32700, past the limit 413 naming it, an unsupported charset 415), after the dispatch layer let it through; a good body reaches the SDK', async () => {
    const { port, token, reported, close } = await start()
    try {
      const garbled = await post(port, token, `{"jsonrpc":"2.0","id":1,"method":"${SECRET}"`)
      expectAnswer(garbled, 400, PARSE_ERROR)
      expect(garbled.headers['x-mcp-version']).toBe('1.0.0')
      expectAnswer(await post(port, token, `"${'x'.repeat(1000)}"`), 413, body(-32000, 'Payload Too Large: Request body must not exceed 1000 bytes'))
      expectAnswer(await post(port, token, INITIALIZE, { 'content-type': 'application/json; charset=koi8-r' }), 415, UNSUPPORTED)
      // JSON that strict mode refuses (no object or array): the SDK transport's words for it,
      // which a platform without a parser gives (regression: "Invalid JSON").
      for (const scalar of ['42', '"x"', 'null', ' true ']) expectAnswer(await post(port, token, scalar), 400, body(-32700, 'Parse error: Invalid JSON-RPC message'))
      expect(reported).toEqual([])
      await expectSdkServes(port, token)
    } finally {
      await close()
    }
  })

  it('a route that fails is 500 -32603 without its text, told to onError, with a status of 500 too; one with a client status gets that status with -32600, a SyntaxError of status 400 the parse error, neither told; one after the head was sent ends the connection, passed on to Express untold', async () => {
    const { port, token, reported, passedOn, close } = await start()
    try {
      expectAnswer(await post(port, token, '{"method":"throw"}'), 500, INTERNAL)
      expect(reported).toHaveLength(1)
      expect(reported[0]!.context).toBe('error handler')
      expect(String(reported[0]!.error)).toContain('the database said no')
      expectAnswer(await post(port, token, '{"method":"forbidden"}'), 403, body(-32600, 'Invalid Request'))
      expect(reported).toHaveLength(1)
      // An error of status 500 is the server's too: the same 500, told to onError.
      expectAnswer(await post(port, token, '{"method":"unavailable"}'), 500, INTERNAL)
      expect(reported).toHaveLength(2)
      // A SyntaxError of status 400 is a body no parser could read: the parse error, not told.
      expectAnswer(await post(port, token, '{"method":"syntax"}'), 400, PARSE_ERROR)
      expect(reported).toHaveLength(2)
      // Express's own handling of an error after the head: the connection is destroyed.
      await expect(post(port, token, '{"method":"half"}')).rejects.toThrow()
      // Passed on to Express (next(error)), not answered nor told by jsonRpcErrors; the errors
      // it answered were not.
      expect(reported).toHaveLength(2)
      expect(passedOn).toEqual([new Error(SECRET)])
    } finally {
      await close()
    }
  })

  it('the dispatch layer still answers first: an unauthenticated bad body is its 401, not a parse error', async () => {
    const { port, close } = await start()
    try {
      const answer = await rawRequest(port, { path: '/v1', headers: { 'content-type': 'application/json' }, body: '{' })
      expect(answer.status).toBe(401)
      expect(answer.headers['www-authenticate']).toMatch(/^Bearer /)
    } finally {
      await close()
    }
  })
})

describe('fastify: jsonRpcErrors', () => {
  async function start() {
    const fixture = createFixture()
    const reported: Array<{ error: unknown; context: string }> = []
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const app = Fastify({ bodyLimit: 1000 })
    await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
    app.setErrorHandler(fastifyErrors({ onError: (error, context) => reported.push({ error, context }) }))
    app.post('/*', async (request, reply) => {
      const method = (request.body as { method?: string } | undefined)?.method
      if (method === 'throw') throw new Error(`the database said no to ${SECRET}`)
      if (method === 'forbidden') throw Object.assign(new Error(SECRET), { statusCode: 403 })
      reply.hijack()
      await sessions.handle(request.raw, reply.raw, request.body)
    })
    await app.listen({ port: 0, host: '127.0.0.1' })
    const port = (app.server.address() as { port: number }).port
    return {
      port,
      token: fixture.tokens.alice,
      reported,
      close: async () => {
        await sessions.close()
        await app.close()
      },
    }
  }

  it('answers a body Fastify refused as the SDK transport would (bad JSON or an empty JSON body 400 -32700, past bodyLimit 413 naming it, a type no parser takes 415); a good body reaches the SDK', async () => {
    const { port, token, reported, close } = await start()
    try {
      const garbled = await post(port, token, `{"method":"${SECRET}"`)
      expectAnswer(garbled, 400, PARSE_ERROR)
      expect(garbled.headers['x-mcp-version']).toBe('1.0.0')
      expectAnswer(await post(port, token, ''), 400, PARSE_ERROR)
      expectAnswer(await post(port, token, '{"__proto__":{"polluted":true}}'), 400, PARSE_ERROR)
      expectAnswer(await post(port, token, `"${'x'.repeat(1000)}"`), 413, body(-32000, 'Payload Too Large: Request body must not exceed 1000 bytes'))
      expectAnswer(await post(port, token, INITIALIZE, { 'content-type': 'application/xml' }), 415, UNSUPPORTED)
      expect(reported).toEqual([])
      await expectSdkServes(port, token)
    } finally {
      await close()
    }
  })

  it('a route that fails is 500 -32603 without its text, told to onError; one with a client status gets that status with -32600', async () => {
    const { port, token, reported, close } = await start()
    try {
      expectAnswer(await post(port, token, '{"method":"throw"}'), 500, INTERNAL)
      expect(reported.map((r) => r.context)).toEqual(['error handler'])
      expect(String(reported[0]!.error)).toContain('the database said no')
      expectAnswer(await post(port, token, '{"method":"forbidden"}'), 403, body(-32600, 'Invalid Request'))
      expect(reported).toHaveLength(1)
    } finally {
      await close()
    }
  })
})

describe('fastify: @fastify/rate-limit in front, as docs/adapters.md runs it', () => {
  it('a hook of the context, added before the plugin, counts the requests the dispatch layer refuses; its 429 keeps Retry-After and reads as the dispatcher\'s own (regression: -32600 Invalid Request)', async () => {
    const fixture = createFixture()
    const app = Fastify()
    try {
      await app.register(fastifyRateLimit, { global: false })
      app.addHook('onRequest', app.rateLimit({ max: 2, timeWindow: 60_000 }))
      await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
      app.setErrorHandler(fastifyErrors())
      app.post('/*', async () => ({ jsonrpc: '2.0', id: 1, result: {} }))
      await app.listen({ port: 0, host: '127.0.0.1' })
      const port = (app.server.address() as { port: number }).port
      const anonymous = () => rawRequest(port, { path: '/v1', headers: { 'content-type': 'application/json', accept: ACCEPT }, body: INITIALIZE })
      for (let i = 0; i < 2; i++) expect((await anonymous()).status).toBe(401)
      const limited = await anonymous()
      expectAnswer(limited, 429, body(-32000, 'Rate limit exceeded'))
      expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0)
    } finally {
      await app.close()
    }
  })
})

describe('jsonRpcErrors options', () => {
  it.each([
    ['express', expressErrors],
    ['fastify', fastifyErrors],
  ] as const)('%s: an unknown option or an onError that is no function is a ConfigurationError naming it', (_name, jsonRpcErrors) => {
    expect(() => jsonRpcErrors({ onerror: () => {} } as never)).toThrow(ConfigurationError)
    expect(() => jsonRpcErrors({ onerror: () => {} } as never)).toThrow(/onerror.*did you mean "onError"/)
    expect(() => jsonRpcErrors({ onError: 'log' } as never)).toThrow(/onError/)
    expect(() => jsonRpcErrors('x' as never)).toThrow(ConfigurationError)
    expect(typeof jsonRpcErrors()).toBe('function')
  })
})
