/**
 * The dispatch headers on the wire, as Node writes them for the Express and Fastify adapters
 * (and the Web adapter on `@hono/node-server`): handed to Node's `_storeHeader` as lines after
 * the status line, not merged into the handler's headers (src/adapters/head.ts). Read with
 * `rawHeaders`, in wire order, so a header written twice shows twice.
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import Fastify from 'fastify'
import { type SessionPin, type SessionStore, createMemorySessionStore } from 'mcp-dispatch'
import { fromWebHandler as expressFromWeb, mcpDispatch, mcpDispatch as expressDispatch, routeByVersion as expressRoute } from 'mcp-dispatch/express'
import { fromWebHandler as fastifyFromWeb, mcpDispatch as fastifyDispatch, routeByVersion as fastifyRoute } from 'mcp-dispatch/fastify'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Fixture, HOST, createFixture, createGate, expressServers } from './helpers.js'
import { EXPRESS } from '../helpers/express.js'

const DISPATCH_NAMES = ['x-mcp-version', 'x-mcp-latest-version', 'ratelimit-policy', 'ratelimit']

interface WireAnswer {
  status: number
  statusMessage: string
  /** `[name (lower case), value]` in the order they came. */
  headers: [string, string][]
  body: string
}

function send(port: number, fixture: Fixture, path: string, headers: Record<string, string> = {}, agent?: http.Agent): Promise<WireAnswer> {
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: '127.0.0.1',
        port,
        method: 'POST',
        path,
        agent: agent ?? false,
        headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', ...headers },
      },
      (response) => {
        const chunks: Buffer[] = []
        response.on('data', (chunk: Buffer) => chunks.push(chunk))
        response.on('end', () => {
          const pairs: [string, string][] = []
          for (let i = 0; i < response.rawHeaders.length; i += 2) pairs.push([response.rawHeaders[i]!.toLowerCase(), response.rawHeaders[i + 1]!])
          resolve({ status: response.statusCode!, statusMessage: response.statusMessage!, headers: pairs, body: Buffer.concat(chunks).toString('utf8') })
        })
        response.on('error', reject)
      },
    )
    request.on('error', reject)
    request.end('{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
  })
}

/** Every value of header `name` in the answer, in wire order. */
const valuesOf = (answer: WireAnswer, name: string) => answer.headers.filter(([n]) => n === name).map(([, v]) => v)

/** Each dispatch header exactly once, with the version `version` (an App without a rate-limit policy has no RateLimit). */
function expectDispatchHeadersOnce(answer: WireAnswer, version: string, latest = '2.0.0') {
  expect(valuesOf(answer, 'x-mcp-version')).toEqual([version])
  expect(valuesOf(answer, 'x-mcp-latest-version')).toEqual([latest])
  for (const name of DISPATCH_NAMES) expect(valuesOf(answer, name).length, name).toBeLessThanOrEqual(1)
}

const { serve, closeAll } = expressServers()
afterAll(closeAll)

describe('the dispatch headers on the wire (Express adapter, Node writing the head)', () => {
  const fixture = createFixture()
  let parked: http.ServerResponse | undefined
  const parkedGate = createGate()
  let port = 0

  beforeAll(async () => {
    const app = EXPRESS.express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher, onError: (error, context) => fixture.errors.push({ error, context }) }))
    app.post(/.*/, (req, res) => {
      switch (req.headers['x-case']) {
        case 'set-header':
          // The handler's own values of dispatch headers, set before the head: the dispatch layer's win.
          res.setHeader('X-MCP-Version', '0.0.0-handler')
          res.setHeader('x-probe', 'yes')
          res.end('set')
          return
        case 'write-head':
          res.writeHead(201, { 'content-type': 'text/plain', 'x-probe': 'yes' })
          res.end('written')
          return
        case 'reason':
          res.writeHead(200, 'Fine', { 'x-probe': 'yes' })
          res.end('reason')
          return
        case 'array':
          res.writeHead(200, ['x-probe', 'yes', 'X-MCP-Latest-Version', '0.0.0-handler'])
          res.end('array')
          return
        case 'park':
          parked = res
          parkedGate.open()
          return
        case 'nested': {
          // Node's writeHead of this response calls setHeader for each header it is given
          // (once one was set before): the parked response's head is written from inside it.
          res.setHeader('x-probe', 'yes')
          const own = res.setHeader.bind(res)
          let first = true
          res.setHeader = (name: string, value: number | string | readonly string[]) => {
            if (first) {
              first = false
              parked!.end('parked')
            }
            return own(name, value)
          }
          res.writeHead(200, { 'x-late': 'yes' })
          res.end('nested')
          return
        }
        default:
          res.json({ version: req.dispatchContext!.version })
      }
    })
    port = await serve(app)
  })

  it('writes each dispatch header once, keeps the handler’s headers and the framing, on a kept-alive connection', async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    try {
      const first = await send(port, fixture, '/v1', {}, agent)
      const second = await send(port, fixture, '/v2', {}, agent)
      expect(first.status).toBe(200)
      expect(JSON.parse(first.body)).toEqual({ version: '1.0.0' })
      expectDispatchHeadersOnce(first, '1.0.0')
      // Right after the status line: Node took them as head lines, not through its merge,
      // which would have put them after those the handler set (Express's content-type…).
      expect(first.headers.slice(0, 2).map(([name]) => name)).toEqual(['x-mcp-version', 'x-mcp-latest-version'])
      expect(valuesOf(first, 'content-type')).toEqual(['application/json; charset=utf-8'])
      expect(valuesOf(first, 'content-length')).toEqual([String(Buffer.byteLength(first.body))])
      expect(valuesOf(first, 'date')).toHaveLength(1)
      expect(valuesOf(first, 'connection')).toEqual(['keep-alive'])
      expect(JSON.parse(second.body)).toEqual({ version: '2.0.0' })
      expectDispatchHeadersOnce(second, '2.0.0')
    } finally {
      agent.destroy()
    }
    expect(fixture.errors).toEqual([])
  })

  it.each([
    { name: 'a dispatch header set with setHeader (replaced)', case: 'set-header', path: '/v1', status: 200, body: 'set', kept: ['x-probe', 'yes'] },
    { name: 'a dispatch header in writeHead’s array (replaced)', case: 'array', path: '/v1', status: 200, body: 'array', kept: ['x-probe', 'yes'] },
    { name: 'writeHead’s headers', case: 'write-head', path: '/v2', status: 201, body: 'written', kept: ['content-type', 'text/plain'] },
    { name: 'a reason phrase', case: 'reason', path: '/v1', status: 200, body: 'reason', kept: ['x-probe', 'yes'], statusMessage: 'Fine' },
  ])('stamps a head written with $name', async ({ case: name, path, status, body, kept, statusMessage }) => {
    const answer = await send(port, fixture, path, { 'x-case': name })
    expect(answer.status).toBe(status)
    if (statusMessage !== undefined) expect(answer.statusMessage).toBe(statusMessage)
    expect(answer.body).toBe(body)
    expectDispatchHeadersOnce(answer, path === '/v1' ? '1.0.0' : '2.0.0')
    expect(valuesOf(answer, kept[0]!)).toEqual([kept[1]])
  })

  it('gives each of two heads written one inside the other its own dispatch headers', async () => {
    const parkedAnswer = send(port, fixture, '/v1', { 'x-case': 'park' })
    await parkedGate.wait()
    const nested = await send(port, fixture, '/v2', { 'x-case': 'nested' })
    const outer = await parkedAnswer
    expect(outer.body).toBe('parked')
    expectDispatchHeadersOnce(outer, '1.0.0')
    expect(nested.body).toBe('nested')
    expectDispatchHeadersOnce(nested, '2.0.0')
    expect(valuesOf(nested, 'x-late')).toEqual(['yes'])
    expect(fixture.errors).toEqual([])
  })
})

describe('a pinned version that is not a version', () => {
  /** An Express server in front of a handler answering `reached`, its pins read from `sessions`. */
  async function servePinned(sessions: SessionStore) {
    const fixture = createFixture({ sessions })
    const app = EXPRESS.express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher, onError: (error, context) => fixture.errors.push({ error, context }) }))
    app.post(/.*/, (_req, res) => {
      res.end('reached')
    })
    return { fixture, port: await serve(app) }
  }

  it('ends the session (404) and is reported: a session store’s pin with CR LF in its version injects no header', async () => {
    // A platform's session store answering a pin whose version holds a line break (a bug, or
    // data written by something else): the `/` selector accepts any pin not a pre-release.
    const memory = createMemorySessionStore()
    let pin: SessionPin = { appId: 'app_weather', version: '1.0.0\r\nInjected: yes', subject: 'alice' }
    const sessions: SessionStore = { synchronous: true, get: () => pin, set: (id, p, ttl) => memory.set(id, p, ttl), delete: (id) => memory.delete(id) }
    const { fixture, port } = await servePinned(sessions)
    const answer = await send(port, fixture, '/', { 'mcp-session-id': 'session-1' })
    expect(answer.status).toBe(404)
    expect(JSON.parse(answer.body)).toMatchObject({ error: { code: -32004, message: 'Session not found', data: { error: 'session_not_found' } } })
    expect(answer.headers.some(([name, value]) => name === 'injected' || value.includes('Injected'))).toBe(false)
    expect(fixture.errors.map((e) => e.context)).toEqual(['session store'])
    expect(String((fixture.errors[0]!.error as Error).message)).toContain('not a semantic version')

    // A pin of a version replaced since (no longer live) is still served: only the form is checked.
    pin = { ...pin, version: '1.0.1' }
    const replaced = await send(port, fixture, '/', { 'mcp-session-id': 'session-1' })
    expect(replaced.status).toBe(200)
    expect(replaced.body).toBe('reached')
    expectDispatchHeadersOnce(replaced, '1.0.1')
    expect(fixture.errors).toHaveLength(1)
  })

  it('whatever its form and the URL it is sent to: 404 session_not_found and reported, never a 503 or a silent 404 (regression)', async () => {
    let version: unknown
    const sessions: SessionStore = {
      synchronous: true,
      get: () => ({ appId: 'app_weather', version, subject: 'alice' }) as SessionPin,
      set: () => true,
      delete: () => undefined,
    }
    const { fixture, port } = await servePinned(sessions)
    // A version that is no string (503 "version.indexOf is not a function" before), and ones
    // that the line check refused before the form was looked at (a 404 nobody heard of).
    const cases: Array<[unknown, string]> = [
      [123, '/'],
      [null, '/v1'],
      [{ major: 1 }, '/v1.0'],
      ['garbage', '/v1'],
      ['v1.0.0', '/v1'],
      ['1.0.0-rc.1+b', '/v1.0.0-rc.1'],
      ['01.0.0', '/v1'],
    ]
    for (const [pinned, path] of cases) {
      version = pinned
      fixture.errors.length = 0
      const answer = await send(port, fixture, path, { 'mcp-session-id': 'session-1' })
      const what = `${JSON.stringify(pinned)} at ${path}`
      expect(answer.status, what).toBe(404)
      expect(JSON.parse(answer.body), what).toMatchObject({ error: { data: { error: 'session_not_found' } } })
      expect(fixture.errors.map((e) => e.context), what).toEqual(['session store'])
      expect(String((fixture.errors[0]!.error as Error).message), what).toContain('not a semantic version')
    }
    // A well-formed pin of another line is a plain 404: the session is not this URL's.
    version = '2.0.0'
    fixture.errors.length = 0
    const other = await send(port, fixture, '/v1', { 'mcp-session-id': 'session-1' })
    expect(other.status).toBe(404)
    expect(fixture.errors).toEqual([])
  })
})

describe("the adapters' own 502 after a handler failed", () => {
  it('has the reason phrase of 502, not one the handler set or a refused writeHead left (regression: "502 OK", "502 All Good")', async () => {
    const failures: Record<string, (res: http.ServerResponse) => never> = {
      // Node sets statusMessage before it checks the header values.
      'refused-head': (res) => {
        res.writeHead(200, { 'x-bad': 'a\u0001b' })
        throw new Error('unreachable')
      },
      'own-reason': (res) => {
        res.statusMessage = 'All Good'
        throw new Error('handler failed')
      },
    }
    const fixture = createFixture()
    const onError = (error: unknown, context: string) => fixture.errors.push({ error, context })
    const express = EXPRESS.express()
    express.use(expressDispatch({ dispatcher: fixture.dispatcher, onError }))
    express.use('/v1', expressRoute(() => (req, res) => failures[req.headers['x-case'] as string]!(res)))
    express.use(expressFromWeb(() => new Response('x', { headers: { 'x-bad': 'a\u0001b' } })))
    const fastify = Fastify()
    await fastify.register(fastifyDispatch, { dispatcher: fixture.dispatcher, onError })
    fastify.all('/v1', fastifyRoute(() => (request) => failures[request.headers['x-case'] as string]!(request.raw as never)))
    fastify.all('/v2', fastifyFromWeb(() => new Response('x', { headers: { 'x-bad': 'a\u0001b' } })))
    await fastify.listen({ port: 0, host: '127.0.0.1' })
    try {
      const ports = { express: await serve(express), fastify: (fastify.server.address() as AddressInfo).port }
      for (const [adapter, port] of Object.entries(ports)) {
        for (const [path, headers] of [['/v1', { 'x-case': 'refused-head' }], ['/v1', { 'x-case': 'own-reason' }], ['/v2', {}]] as const) {
          const answer = await send(port, fixture, path, headers)
          const what = `${adapter} ${path} ${JSON.stringify(headers)}`
          expect([answer.status, answer.statusMessage], what).toEqual([502, 'Bad Gateway'])
          expect(JSON.parse(answer.body), what).toMatchObject({ error: { data: { error: 'handler_error' } } })
        }
      }
    } finally {
      await fastify.close()
    }
  })
})
