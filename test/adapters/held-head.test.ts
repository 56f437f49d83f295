/**
 * The response head through the Node adapters when something other than the MCP handler works
 * on the response too, on the synchronous memory store and on an asynchronous one (the memory
 * store answering with promises, as Redis does), where a new session's head is held until its
 * pin is stored. Found by an audit of the adapters' response handling:
 *
 * - `compression()` after `mcpDispatch` (it wraps `write`, `end` and `writeHead` and keeps the
 *   ones it found): the held head was written twice (the MCP SDK client could not connect),
 *   and with `on-headers` before `mcpDispatch` (morgan, response-time, express-session) the
 *   memory store threw "Cannot set headers after they are sent" out of the gzip stream;
 * - a handler failing after its held head (`next(err)`): Express's final handler wrote its own
 *   error page into the same response;
 * - a head Node refuses (a header value outside Latin-1, a status out of range): the error
 *   answer that followed had no dispatch headers, and the session id of the refused head was
 *   pinned although the client never got it.
 */
import * as http from 'node:http'
import { createRequire } from 'node:module'
import { connect } from 'node:net'
import { gunzipSync } from 'node:zlib'
import compression from 'compression'
import type express from 'express'
import Fastify from 'fastify'
import { type SessionStore, createMemorySessionStore } from 'mcp-dispatch'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch, routeByVersion as fastifyRoutes } from 'mcp-dispatch/fastify'
import { afterAll, describe, expect, it } from 'vitest'
import { ALLOWED_ORIGIN, type Fixture, HOST, close as closeServer, createFixture, expressServers, listen, loopbackFetch, rawRequest, within } from './helpers.js'
import { buildScenarioServer, createNodeMcpHandler, readVersion } from './mcp.js'
import { EXPRESS, EXPRESS_KINDS } from '../helpers/express.js'

/** `on-headers` (installed with `compression`; it has no types of its own). */
const onHeaders = createRequire(import.meta.url)('on-headers') as (res: http.ServerResponse, listener: () => void) => void

/**
 * The memory store answering with promises after a few milliseconds, as a Redis round trip: a
 * pin is written when its answer comes, and a lookup reads at once (another instance's, on its
 * own connection), so an answer sent before its pin is stored names a session the next request
 * does not find.
 */
function promisedSessions(): SessionStore {
  const memory = createMemorySessionStore()
  const later = <T>(call: () => T) => new Promise<T>((resolve) => setTimeout(() => resolve(call()), 50))
  return {
    get: (id, ttl) => {
      const pin = memory.get(id, ttl)
      return later(() => pin as never)
    },
    set: (id, pin, ttl) => later(() => memory.set(id, pin, ttl) as never),
    delete: (id) => later(() => memory.delete(id) as never),
  }
}

/** The memory store as it is, and answering with promises (where new sessions are held). */
const STORES = {
  memory: () => createFixture(),
  promised: () => createFixture({ sessions: promisedSessions() }),
} as const

const tools = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
const json = { 'content-type': 'application/json' }
const bearer = (fixture: Fixture) => ({ authorization: `Bearer ${fixture.tokens.alice}` })
const errorsOf = (fixture: Fixture) => fixture.errors.map((e) => `${e.context}: ${(e.error as Error).message}`)

const { serve, closeAll } = expressServers()
afterAll(closeAll)

/**
 * A middleware whose `writeHead` hook sets a header and writes the head through the prototype,
 * past the `writeHead` it replaced (what a hook that does not chain does).
 */
const writesHeadItself: express.RequestHandler = (_req, res, next) => {
  res.writeHead = function (this: http.ServerResponse, ...args: unknown[]) {
    this.setHeader('x-after', '1')
    return (http.ServerResponse.prototype.writeHead as (...rest: unknown[]) => http.ServerResponse).apply(this, args)
  } as typeof res.writeHead
  next()
}

/**
 * A request that opens a session (its handler answers `{"ok":true}` with the id), then one of
 * that session: both 200 `{"ok":true}`, so the pin was stored before the first answer went out,
 * and nothing reported. Answers the first.
 */
async function servedAndPinned(port: number, fixture: Fixture, sessionId: string) {
  const answer = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })
  expect(answer).toMatchObject({ status: 200, body: '{"ok":true}' })
  const next = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture), 'mcp-session-id': sessionId }, body: tools })
  expect(next).toMatchObject({ status: 200, body: '{"ok":true}' })
  expect(errorsOf(fixture)).toEqual([])
  return answer
}

/** `mcpDispatch` reporting to `fixture.errors`. */
const dispatchOf = (fixture: Fixture) => mcpDispatch({ dispatcher: fixture.dispatcher, onError: (error, context) => fixture.errors.push({ error, context }) })

/** A POST asking for gzip, its body gunzipped; rejects when no complete answer came within 3 s. */
function gzipRequest(port: number, fixture: Fixture): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no complete answer in 3 s')), 3000)
    const request = http.request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1', agent: false, headers: { host: HOST, ...json, ...bearer(fixture), 'accept-encoding': 'gzip' } },
      (response) => {
        const chunks: Buffer[] = []
        response.on('data', (chunk: Buffer) => chunks.push(chunk))
        response.on('end', () => {
          clearTimeout(timer)
          try {
            resolve({ status: response.statusCode!, headers: response.headers, body: gunzipSync(Buffer.concat(chunks)).toString('utf8') })
          } catch (error) {
            reject(error as Error)
          }
        })
        response.on('error', reject)
      },
    )
    request.on('error', reject)
    request.end(tools)
  })
}

/** The bytes a client gets for one request on its own connection, until the server closes it. */
function rawExchange(port: number, fixture: Fixture): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1')
    let received = ''
    socket.on('data', (chunk) => (received += chunk.toString('latin1')))
    socket.on('close', () => resolve(received))
    socket.on('error', () => {})
    socket.write(
      `POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${tools.length}\r\nConnection: close\r\n\r\n${tools}`,
    )
  })
}

describe.each(EXPRESS_KINDS)('%s: compression() and on-headers around mcpDispatch: the held head is written once, wrappers installed later stay', (kind) => {
  const express = EXPRESS[kind]
  for (const [store, fixtureFor] of Object.entries(STORES)) {
    it(`${store} store: the MCP SDK client connects through mcpDispatch, express.json() and compression(), and reads its version`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      app.use(express.json())
      app.use(compression())
      const handlers: Array<ReturnType<typeof createNodeMcpHandler>> = []
      app.use(
        routeByVersion((appRecord, version) => {
          const handler = createNodeMcpHandler(() => buildScenarioServer(appRecord.slug, version))
          handlers.push(handler)
          return (req, res) => handler.handle(req, res, req.body)
        }),
      )
      const port = await serve(app)
      try {
        const content = await readVersion(`http://${HOST}:${port}/`, { fetch: loopbackFetch, headers: bearer(fixture) })
        expect(content).toEqual([{ type: 'text', text: '2.0.0' }])
        expect(errorsOf(fixture)).toEqual([])
      } finally {
        for (const handler of handlers) await handler.close()
      }
    })

    it(`${store} store: on-headers before mcpDispatch and compression() after it: a gzip body, nothing thrown`, async () => {
      const fixture = fixtureFor()
      const thrown: unknown[] = []
      const onThrown = (error: unknown) => thrown.push(error)
      process.on('uncaughtException', onThrown)
      try {
        const app = express()
        app.use((_req, res, next) => {
          onHeaders(res, () => {}) // what morgan, response-time and express-session do
          next()
        })
        app.use(dispatchOf(fixture))
        app.use(compression())
        const result = { tools: Array.from({ length: 100 }, (_, i) => ({ name: `tool${i}` })) }
        app.use(routeByVersion(() => (_req, res) => void res.json({ jsonrpc: '2.0', id: 1, result })))
        const answer = await gzipRequest(await serve(app), fixture)
        expect(answer.status).toBe(200)
        expect(answer.headers['content-encoding']).toBe('gzip')
        expect(answer.headers['x-mcp-version']).toBe('1.0.0')
        expect(JSON.parse(answer.body)).toEqual({ jsonrpc: '2.0', id: 1, result })
        await new Promise((resolve) => setTimeout(resolve, 20))
        expect(thrown).toEqual([])
        expect(errorsOf(fixture)).toEqual([])
      } finally {
        process.off('uncaughtException', onThrown)
      }
    })

    it(`${store} store: compression() after mcpDispatch and a handler whose first call is flushHeaders(): a gzip body under the gzip header`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      app.use(compression())
      const result = { tools: Array.from({ length: 100 }, (_, i) => ({ name: `tool${i}` })) }
      app.use(
        routeByVersion(() => (_req, res) => {
          res.statusCode = 200
          res.setHeader('content-type', 'application/json')
          res.setHeader('mcp-session-id', `flushed-${store}-${kind}`) // a new session: its head is held on an asynchronous store
          res.flushHeaders()
          res.write(JSON.stringify({ jsonrpc: '2.0', id: 1 }).slice(0, -1))
          res.end(`,"result":${JSON.stringify(result)}}`)
        }),
      )
      const answer = await gzipRequest(await serve(app), fixture)
      expect(answer.status).toBe(200)
      expect(answer.headers['content-encoding']).toBe('gzip')
      expect(answer.headers['x-mcp-version']).toBe('1.0.0')
      expect(answer.headers['mcp-session-id']).toBe(`flushed-${store}-${kind}`)
      expect(JSON.parse(answer.body)).toEqual({ jsonrpc: '2.0', id: 1, result })
      expect(errorsOf(fixture)).toEqual([])
    })

    it(`${store} store: a writeHead hook after mcpDispatch that writes the head itself (past the one it replaced): the dispatch headers are in it and the session is pinned`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      app.use(writesHeadItself)
      app.use(
        routeByVersion(() => (_req, res) => {
          res.setHeader('content-type', 'application/json')
          res.setHeader('mcp-session-id', `hooked-${store}-${kind}`)
          res.end('{"ok":true}')
        }),
      )
      const port = await serve(app)
      const answer = await servedAndPinned(port, fixture, `hooked-${store}-${kind}`)
      expect(answer.headers).toMatchObject({ 'x-after': '1', 'x-mcp-version': '1.0.0', 'mcp-session-id': `hooked-${store}-${kind}` })
    })

    it(`${store} store: the handler's own writeHead through such a hook (past mcpDispatch's wrapper): answered and pinned, never a connection cut`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      app.use(writesHeadItself)
      const sessionId = `explicit-${store}-${kind}`
      app.use(routeByVersion(() => (_req, res) => void res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': sessionId }).end('{"ok":true}')))
      const port = await serve(app)
      const answer = await servedAndPinned(port, fixture, sessionId)
      expect(answer.headers).toMatchObject({ 'x-after': '1', 'mcp-session-id': sessionId })
    })

    it(`${store} store: a status set after the first write is too late, as without a hold: the head has the status of that write, and so has the pin`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      const sessionId = `late-status-${store}-${kind}`
      app.use(
        routeByVersion(() => (_req, res) => {
          res.setHeader('content-type', 'application/json')
          res.setHeader('mcp-session-id', sessionId)
          res.write('{"ok":')
          res.statusCode = 404
          res.end('true}')
        }),
      )
      const port = await serve(app)
      const answer = await servedAndPinned(port, fixture, sessionId)
      expect(answer.headers['x-mcp-version']).toBe('1.0.0')
    })

    it(`${store} store: a status past 599, which Node writes (it takes 100 to 999), is answered as written, with the dispatch headers, never refused as out of range`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      app.use(routeByVersion(() => (_req, res) => void res.writeHead(799, { 'content-type': 'application/json', 'mcp-session-id': `s799-${store}-${kind}` }).end('{"ok":true}')))
      const port = await serve(app)
      const answer = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })
      expect(answer).toMatchObject({ status: 799, body: '{"ok":true}' })
      expect(answer.headers['x-mcp-version']).toBe('1.0.0')
      expect(errorsOf(fixture)).toEqual([])
    })

    it(`${store} store: a head with a field of no name, given to writeHead after setHeader (Node skips it there), is answered as Node writes it, never refused`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      app.use(
        routeByVersion(() => (_req, res) => {
          res.setHeader('content-type', 'application/json')
          res.writeHead(200, { '': 'nameless', 'mcp-session-id': `nameless-${store}-${kind}` }).end('{"ok":true}')
        }),
      )
      const port = await serve(app)
      const answer = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })
      expect(answer).toMatchObject({ status: 200, body: '{"ok":true}' })
      expect(answer.headers['x-mcp-version']).toBe('1.0.0')
      expect(Object.values(answer.headers)).not.toContain('nameless')
      expect(errorsOf(fixture)).toEqual([])
    })

    it(`${store} store: a reason phrase set after the first write is too late, as without a hold: the head has the phrase of that write`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      app.use(
        routeByVersion(() => (_req, res) => {
          res.statusMessage = 'Fine'
          res.setHeader('content-type', 'application/json')
          res.setHeader('mcp-session-id', `late-reason-${store}-${kind}`)
          res.write('{"ok":')
          res.statusMessage = 'Changed Later'
          res.end('true}')
        }),
      )
      const port = await serve(app)
      const answer = await new Promise<{ status: number; reason: string; body: string }>((resolve, reject) => {
        const body = Buffer.from(tools)
        const request = http.request(
          { host: '127.0.0.1', port, method: 'POST', path: '/v1', agent: false, headers: { host: HOST, ...json, ...bearer(fixture), 'content-length': body.length } },
          (response) => {
            let text = ''
            response.setEncoding('utf8')
            response.on('data', (chunk: string) => (text += chunk))
            response.on('end', () => resolve({ status: response.statusCode!, reason: response.statusMessage!, body: text }))
            response.on('error', reject)
          },
        )
        request.on('error', reject)
        request.end(body)
      })
      expect(answer).toEqual({ status: 200, reason: 'Fine', body: '{"ok":true}' })
    })

    it(`${store} store: an end wrapper after mcpDispatch that makes the head Node's way when _header is unset (express-session's): answered whole and pinned`, async () => {
      const fixture = fixtureFor()
      const app = express()
      app.use(dispatchOf(fixture))
      app.use((_req, res, next) => {
        // What express-session's `end` does before it writes its cookie and ends.
        const end = res.end
        res.end = function (this: http.ServerResponse & { _header?: unknown; _implicitHeader(): void }, ...args: unknown[]) {
          if (!this._header) this._implicitHeader()
          return (end as (...rest: unknown[]) => unknown).apply(this, args)
        } as typeof res.end
        next()
      })
      const sessionId = `implicit-header-${store}-${kind}`
      app.use(
        routeByVersion(() => (_req, res) => {
          res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': sessionId })
          res.write('{"ok":')
          res.end('true}')
        }),
      )
      const port = await serve(app)
      const answer = await servedAndPinned(port, fixture, sessionId)
      expect(answer.headers['x-mcp-version']).toBe('1.0.0')
    })

    it(`${store} store: a write and end wrapper installed after mcpDispatch sees every call (on-headers before it)`, async () => {
      const fixture = fixtureFor()
      const seen: string[] = []
      const app = express()
      app.use((_req, res, next) => {
        onHeaders(res, () => {})
        next()
      })
      app.use(dispatchOf(fixture))
      app.use((_req, res, next) => {
        const { write, end } = res
        res.write = function (this: unknown, chunk: unknown, ...rest: unknown[]) {
          seen.push(`write ${String(chunk)}`)
          return (write as (...args: unknown[]) => boolean).call(this, chunk, ...rest)
        } as typeof res.write
        res.end = function (this: unknown, chunk?: unknown, ...rest: unknown[]) {
          seen.push(`end ${String(chunk)}`)
          return (end as (...args: unknown[]) => unknown).call(this, chunk, ...rest)
        } as typeof res.end
        next()
      })
      app.use(
        routeByVersion(() => (_req, res) => {
          res.setHeader('content-type', 'application/json')
          res.setHeader('mcp-session-id', `wrapped-${store}`)
          res.write('{"ok":')
          res.end('true}')
        }),
      )
      const answer = await rawRequest(await serve(app), { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })
      expect(answer).toMatchObject({ status: 200, body: '{"ok":true}' })
      expect(answer.headers['mcp-session-id']).toBe(`wrapped-${store}`)
      expect(seen).toEqual(['write {"ok":', 'end true}'])
      expect(errorsOf(fixture)).toEqual([])
    })

    it(`${store} store: after its head, a response reports headersSent and refuses a second writeHead and setHeader, as Node does`, async () => {
      const fixture = fixtureFor()
      const seen: unknown[] = []
      const app = express()
      app.use(dispatchOf(fixture))
      app.use(
        routeByVersion(() => (_req, res) => {
          res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': `twice-${store}` })
          seen.push(res.headersSent)
          for (const again of [() => res.writeHead(500), () => res.setHeader('x-late', '1')]) {
            try {
              again()
              seen.push('accepted')
            } catch (error) {
              seen.push((error as { code?: string }).code)
            }
          }
          res.end('{"ok":true}')
        }),
      )
      const port = await serve(app)
      const answer = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })
      expect(answer).toMatchObject({ status: 200, body: '{"ok":true}' })
      expect(answer.headers['x-late']).toBeUndefined()
      expect(seen).toEqual([true, 'ERR_HTTP_HEADERS_SENT', 'ERR_HTTP_HEADERS_SENT'])
      expect(errorsOf(fixture)).toEqual([])
      // The session was pinned, and its next request is served.
      const next = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture), 'mcp-session-id': `twice-${store}` }, body: tools })
      expect(next.body).toBe('{"ok":true}')
    })
  }
})

describe('a request of a session through on-headers before mcpDispatch: its answer does not wait for the pin to be deleted', () => {
  it.each(EXPRESS_KINDS)('%s: a DELETE is answered while the session store is still deleting', async (kind) => {
    const memory = createMemorySessionStore()
    let release!: () => void
    const deleting = new Promise<void>((resolve) => (release = resolve))
    let deleted = false
    const sessions: SessionStore = {
      get: async (id, ttl) => memory.get(id, ttl) as never,
      set: async (id, pin, ttl) => memory.set(id, pin, ttl) as never,
      delete: async (id) => {
        await deleting
        deleted = true
        return memory.delete(id) as never
      },
    }
    const fixture = createFixture({ sessions })
    const app = EXPRESS[kind]()
    app.use((_req, res, next) => {
      onHeaders(res, () => {})
      next()
    })
    app.use(dispatchOf(fixture))
    app.use(routeByVersion(() => (req, res) => void res.writeHead(200, { 'content-type': 'application/json', ...(req.method === 'POST' && { 'mcp-session-id': 'to-delete' }) }).end('{}')))
    const port = await serve(app)
    try {
      expect((await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })).status).toBe(200)
      const answer = await rawRequest(port, { method: 'DELETE', path: '/v1', headers: { ...bearer(fixture), 'mcp-session-id': 'to-delete' } })
      expect(answer.status).toBe(200)
      // Answered before the delete (not after storeTimeoutMs gave up waiting for it, reported).
      expect(deleted).toBe(false)
      expect(errorsOf(fixture)).toEqual([])
    } finally {
      release()
    }
    await deleting
  })
})

describe('a handler that fails after its head: the framework never answers into the held response', () => {
  for (const [store, fixtureFor] of Object.entries(STORES)) {
    for (const [kind, how, fail] of [
      ...EXPRESS_KINDS.map((kind) => [kind, 'next', (next: express.NextFunction) => next(new Error('after head'))] as const),
      // Express 4 does not catch the rejection of an async handler (no answer at all: Express's own behaviour).
      ['express', 'rejected', () => Promise.reject(new Error('after head'))] as const,
    ]) {
      const what = how === 'next' ? 'next(err)' : 'a rejected async handler'
      it(`${store} store, ${kind}, ${what}: Express's final handler closes the connection, with no error page of its own`, async () => {
        const fixture = fixtureFor()
        const app = EXPRESS[kind]()
        app.set('env', 'test') // the final handler logs nothing
        app.use(dispatchOf(fixture))
        app.use((_req, res, next) => {
          res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': `failed-${store}-${how}` })
          res.write('{"partial":')
          return fail(next)
        })
        const received = await rawExchange(await serve(app), fixture)
        expect(received).not.toContain('Internal Server Error')
        expect(received).not.toContain('<!DOCTYPE html>')
        expect(received.match(/HTTP\/1\.1 /g)?.length ?? 0).toBeLessThanOrEqual(1)
      })
    }

    it(`${store} store: a Fastify route that writes reply.raw without hijacking is answered once, with no failure`, async () => {
      const fixture = fixtureFor()
      const app = Fastify({ forceCloseConnections: true })
      await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError: (error, context) => fixture.errors.push({ error, context }) }))
      app.all(
        '/*',
        fastifyRoutes(() => async (_request, reply) => {
          reply.raw.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': `raw-${store}` })
          reply.raw.end('{"ok":true}')
        }),
      )
      await app.listen({ port: 0, host: '127.0.0.1' })
      try {
        const port = (app.server.address() as { port: number }).port
        const answer = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })
        expect(answer).toMatchObject({ status: 200, body: '{"ok":true}' })
        expect(answer.headers['mcp-session-id']).toBe(`raw-${store}`)
        expect(answer.headers['x-mcp-version']).toBe('1.0.0')
        await new Promise((resolve) => setTimeout(resolve, 20))
        expect(errorsOf(fixture)).toEqual([])
      } finally {
        await app.close()
      }
    })
  }
})

describe('a head Node refuses: the answer that follows carries the dispatch headers, and its session id is not pinned', () => {
  const browser = (fixture: Fixture) => ({ ...json, ...bearer(fixture), origin: ALLOWED_ORIGIN })

  function expectDispatchHeaders(answer: { headers: Record<string, string> }) {
    expect(answer.headers['x-mcp-version']).toBe('1.0.0')
    expect(answer.headers['x-mcp-latest-version']).toBe('2.0.0')
    expect(answer.headers['access-control-allow-origin']).toBe(ALLOWED_ORIGIN)
    expect(answer.headers['mcp-session-id']).toBeUndefined()
  }

  async function expectNotPinned(port: number, fixture: Fixture, sessionId: string) {
    const next = await rawRequest(port, { path: '/v1', headers: { ...browser(fixture), 'mcp-session-id': sessionId }, body: tools })
    expect(next.status).toBe(404)
    expect(JSON.parse(next.body).error.data).toEqual({ error: 'session_not_found' })
  }

  const refused = {
    'a header value outside Latin-1': (res: http.ServerResponse, sessionId: string) =>
      res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': sessionId, 'x-tool-name': '天気' }),
    'a status out of range': (res: http.ServerResponse, sessionId: string) =>
      res.writeHead(1000, { 'content-type': 'application/json', 'mcp-session-id': sessionId }),
  }

  for (const [store, fixtureFor] of Object.entries(STORES)) {
    for (const [what, writeRefusedHead] of Object.entries(refused)) {
      it.each(EXPRESS_KINDS)(`${store} store, %s, ${what}: routeByVersion's 502, and the handler's own fallback`, async (kind) => {
        const fixture = fixtureFor()
        const app = EXPRESS[kind]()
        app.use(dispatchOf(fixture))
        app.use(
          routeByVersion(() => (req, res) => {
            const sessionId = String(req.headers['x-test-session'])
            if (!req.headers['x-test-fallback']) {
              writeRefusedHead(res, sessionId).end('{}')
              return
            }
            try {
              writeRefusedHead(res, sessionId)
            } catch {
              res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":"fallback"}')
            }
          }),
        )
        const port = await serve(app)
        const failed = await rawRequest(port, { path: '/v1', headers: { ...browser(fixture), 'x-test-session': `502-${store}` }, body: tools })
        expect(failed.status).toBe(502)
        expect(JSON.parse(failed.body).error.message).toBe('App handler failed')
        expectDispatchHeaders(failed)
        await expectNotPinned(port, fixture, `502-${store}`)

        const fallback = await rawRequest(port, {
          path: '/v1',
          headers: { ...browser(fixture), 'x-test-session': `fallback-${store}`, 'x-test-fallback': '1' },
          body: tools,
        })
        expect(fallback).toMatchObject({ status: 500, body: '{"error":"fallback"}' })
        expectDispatchHeaders(fallback)
        await expectNotPinned(port, fixture, `fallback-${store}`)
      })
    }

    it.each(EXPRESS_KINDS)(`${store} store, %s, a reason phrase with CR LF (it would split the head): routeByVersion's 502, never the phrase, never a connection cut after the pin`, async (kind) => {
      const fixture = fixtureFor()
      const app = EXPRESS[kind]()
      app.use(dispatchOf(fixture))
      app.use(
        routeByVersion(() => (req, res) => {
          res.writeHead(200, 'OK\r\nX-Injected: 1', { 'content-type': 'application/json', 'mcp-session-id': String(req.headers['x-test-session']) }).end('{}')
        }),
      )
      const port = await serve(app)
      const failed = await rawRequest(port, { path: '/v1', headers: { ...browser(fixture), 'x-test-session': `reason-${store}` }, body: tools })
      expect(failed.status).toBe(502)
      expect(JSON.parse(failed.body).error.message).toBe('App handler failed')
      expect(failed.headers['x-injected']).toBeUndefined()
      expectDispatchHeaders(failed)
      await expectNotPinned(port, fixture, `reason-${store}`)
    })

    it.each(EXPRESS_KINDS)(`${store} store, %s, a status out of range set before an implicit head (end first): routeByVersion's 502, never a connection left without an answer`, async (kind) => {
      const fixture = fixtureFor()
      const app = EXPRESS[kind]()
      app.use(dispatchOf(fixture))
      app.use(
        routeByVersion(() => (req, res) => {
          res.statusCode = 1000
          res.setHeader('content-type', 'application/json')
          res.setHeader('mcp-session-id', String(req.headers['x-test-session']))
          res.end('{}')
        }),
      )
      const port = await serve(app)
      const failed = await rawRequest(port, { path: '/v1', headers: { ...browser(fixture), 'x-test-session': `implicit-${store}` }, body: tools })
      expect(failed.status).toBe(502)
      expectDispatchHeaders(failed)
      await expectNotPinned(port, fixture, `implicit-${store}`)
    })

    it.each(EXPRESS_KINDS)(`${store} store, %s, a status out of range and compression() after mcpDispatch: a plain 502, not one through the gzip stream compression made of the refused head`, async (kind) => {
      const fixture = fixtureFor()
      const app = EXPRESS[kind]()
      app.use(dispatchOf(fixture))
      app.use(compression())
      const big = JSON.stringify({ tools: Array.from({ length: 200 }, (_, i) => ({ name: `tool${i}` })) })
      app.use(
        routeByVersion(() => (req, res) => {
          res.statusCode = 1000
          res.setHeader('content-type', 'application/json')
          res.setHeader('mcp-session-id', String(req.headers['x-test-session']))
          res.end(big)
        }),
      )
      const port = await serve(app)
      const failed = await rawRequest(port, {
        path: '/v1',
        headers: { ...browser(fixture), 'accept-encoding': 'gzip', 'x-test-session': `gz-${store}` },
        body: tools,
      })
      expect(failed.status).toBe(502)
      expect(failed.headers['content-encoding']).toBeUndefined()
      expect(JSON.parse(failed.body).error.message).toBe('App handler failed')
      expectDispatchHeaders(failed)
      await expectNotPinned(port, fixture, `gz-${store}`)
    })

    it(`${store} store, Fastify, a header value outside Latin-1 through reply.send: routeByVersion's 502`, async () => {
      const fixture = fixtureFor()
      const app = Fastify({ forceCloseConnections: true })
      await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError: (error, context) => fixture.errors.push({ error, context }) }))
      app.all(
        '/*',
        fastifyRoutes(() => async (request, reply) =>
          reply.header('x-tool-name', '天気').header('mcp-session-id', String(request.headers['x-test-session'])).send({ ok: true }),
        ),
      )
      await app.listen({ port: 0, host: '127.0.0.1' })
      try {
        const port = (app.server.address() as { port: number }).port
        const failed = await rawRequest(port, { path: '/v1', headers: { ...browser(fixture), 'x-test-session': `f502-${store}` }, body: tools })
        expect(failed.status).toBe(502)
        expect(JSON.parse(failed.body)).toMatchObject({ jsonrpc: '2.0', error: { message: 'App handler failed' } })
        expectDispatchHeaders(failed)
        expect(failed.headers['x-tool-name']).toBeUndefined()
        await expectNotPinned(port, fixture, `f502-${store}`)
      } finally {
        await app.close()
      }
    })
  }
})

describe('an end wrapper of a later middleware that throws', () => {
  it.each(EXPRESS_KINDS)('%s: an end that threw ended nothing: routeByVersion\'s 502 goes out, never a connection left without an answer', async (kind) => {
    const fixture = createFixture()
    const app = EXPRESS[kind]()
    app.use(dispatchOf(fixture))
    app.use((_req: http.IncomingMessage, res: http.ServerResponse, next: () => void) => {
      // Fails once (the handler's end), then passes on (the 502's).
      const end = res.end
      let failed = false
      res.end = function failingOnce(this: http.ServerResponse, ...args: unknown[]) {
        if (!failed) {
          failed = true
          throw new Error('end wrapper failed')
        }
        return (end as (...rest: unknown[]) => http.ServerResponse).apply(this, args)
      } as typeof res.end
      next()
    })
    app.use(
      routeByVersion(() => (_req, res) => {
        res.setHeader('content-type', 'application/json')
        res.end('{"ok":true}')
      }),
    )
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const answer = await within(rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools }), 5_000, 'an answer')
      expect(answer.status).toBe(502)
      expect(JSON.parse(answer.body).error.message).toBe('App handler failed')
    } finally {
      await closeServer(server)
    }
  })
})

describe('a new session whose pin cannot be stored: the store\'s 503 instead of the answer that opened it (an asynchronous store), or the answer and a report (a store declared synchronous)', () => {
  const INITIALIZE = JSON.stringify({
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'held-head-test', version: '1.0.0' } },
  })
  /** A session store whose writes fail: with a promise (as Redis down), by throwing while declared synchronous, or by throwing while not. */
  const failingSessions = (how: 'rejects' | 'throws' | 'throws, not declared synchronous'): SessionStore => {
    const memory = createMemorySessionStore()
    if (how === 'throws') return { synchronous: true, get: (id, ttl) => memory.get(id, ttl), set: () => { throw new Error('pin store down') }, delete: (id) => memory.delete(id) }
    return {
      get: (id, ttl) => Promise.resolve(memory.get(id, ttl)),
      set:
        how === 'rejects'
          ? () => new Promise((_resolve, reject) => setTimeout(() => reject(new Error('pin store down')), 20))
          : () => {
              throw new Error('pin store down')
            },
      delete: (id) => Promise.resolve(memory.delete(id)),
    }
  }
  /** What the platform sets before the dispatch layer: its CORS and a request id. */
  const PLATFORM = { 'access-control-allow-origin': ALLOWED_ORIGIN, 'x-request-id': 'r1' }
  const initialize = (port: number, fixture: Fixture) =>
    rawRequest(port, {
      path: '/v1',
      headers: { ...json, ...bearer(fixture), accept: 'application/json, text/event-stream' },
      body: INITIALIZE,
    })

  async function serveSdk(kind: (typeof EXPRESS_KINDS)[number] | 'fastify', fixture: Fixture, around: boolean) {
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const onError = (error: unknown, context: string) => fixture.errors.push({ error, context })
    if (kind === 'fastify') {
      const app = Fastify({ forceCloseConnections: true })
      app.addHook('onRequest', async (_request, reply) => void reply.headers(PLATFORM))
      await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError }))
      app.route({
        method: ['GET', 'POST', 'DELETE'],
        url: '/*',
        handler: fastifyRoutes(() => async (request, reply) => {
          reply.hijack()
          await sessions.handle(request.raw, reply.raw, request.body)
        }),
      })
      await app.listen({ port: 0, host: '127.0.0.1' })
      return { port: (app.server.address() as { port: number }).port, close: async () => (await sessions.close(), await app.close()) }
    }
    const app = EXPRESS[kind]()
    app.use((_req, res, next) => {
      for (const [name, value] of Object.entries(PLATFORM)) res.setHeader(name, value)
      next()
    })
    if (around) app.use((_req, res, next) => (onHeaders(res, () => res.setHeader('x-on-headers', '1')), next()))
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher, onError }))
    if (around) app.use(compression({ threshold: 0 }))
    app.use(routeByVersion(() => (req: http.IncomingMessage, res: http.ServerResponse) => sessions.handle(req, res)))
    // Served with Express's defaults, X-Powered-By on (`serve` turns it off): the 503 must drop it.
    const server = http.createServer(app)
    const port = await listen(server)
    return { port, close: async () => (await sessions.close(), await closeServer(server)) }
  }

  it.each(EXPRESS_KINDS)('%s, a store whose write rejects, the head taken past mcpDispatch\'s wrapper by a writeHead hook that does not chain: Node has the head, so the answer goes out whole and onError is told, never a connection cut', async (kind) => {
    const fixture = createFixture({ sessions: failingSessions('rejects') })
    const app = EXPRESS[kind]()
    app.use(dispatchOf(fixture))
    app.use(writesHeadItself)
    app.use(
      routeByVersion(() => (_req, res) => {
        res.setHeader('content-type', 'application/json')
        res.setHeader('mcp-session-id', `past-${kind}`)
        res.end('{"ok":true}')
      }),
    )
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const answer = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })
      expect(answer).toMatchObject({ status: 200, body: '{"ok":true}' })
      expect(answer.headers).toMatchObject({ 'x-after': '1', 'x-mcp-version': '1.0.0' })
      // No wait: the end of the answer is held until the pin's write settled, and its failure
      // is told (pinFailed) before the answer is released.
      expect(errorsOf(fixture)).toEqual(['session store: pin store down'])
    } finally {
      await closeServer(server)
    }
  })

  it.each([
    ...EXPRESS_KINDS.map((kind) => [kind, false, 'rejects'] as const),
    ...EXPRESS_KINDS.map((kind) => [kind, true, 'rejects'] as const),
    ['fastify', false, 'rejects'] as const,
    ['express', false, 'throws, not declared synchronous'] as const,
    ['fastify', false, 'throws, not declared synchronous'] as const,
  ])('%s (on-headers and compression around it: %s), a store whose write %s: 503 temporarily_unavailable with Retry-After and the platform\'s headers, no session id, the SDK handler\'s answer dropped without an error, and onError told', async (kind, around, how) => {
    const fixture = createFixture({ sessions: failingSessions(how) })
    const served = await serveSdk(kind, fixture, around)
    try {
      const answer = await initialize(served.port, fixture)
      expect(answer.status).toBe(503)
      expect(JSON.parse(answer.body)).toMatchObject({ error: { code: -32005, data: { error: 'temporarily_unavailable' } } })
      expect(answer.headers['retry-after']).toBe('1')
      expect(answer.headers['mcp-session-id']).toBeUndefined()
      expect(answer.headers['x-mcp-version']).toBeUndefined()
      expect(answer.headers['content-encoding']).toBeUndefined()
      for (const [name, value] of Object.entries(PLATFORM)) expect(answer.headers[name], name).toBe(value)
      expect(answer.headers['x-powered-by']).toBeUndefined()
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(errorsOf(fixture)).toEqual(['session store: pin store down'])
    } finally {
      await served.close()
    }
  })

  it.each(EXPRESS_KINDS)('%s: a store declared synchronous that throws, whose answer never waits for its pin: the answer goes out, reported, on-headers before mcpDispatch or not (the same either way)', async (kind) => {
    for (const around of [false, true]) {
      const fixture = createFixture({ sessions: failingSessions('throws') })
      const served = await serveSdk(kind, fixture, around)
      try {
        const answer = await initialize(served.port, fixture)
        expect(answer.status, String(around)).toBe(200)
        expect(answer.headers['mcp-session-id'], String(around)).toBeDefined()
        expect(errorsOf(fixture), String(around)).toEqual(['session store: pin store down'])
      } finally {
        await served.close()
      }
    }
  })

  it('a handler that waits for its write and end callbacks is not left waiting once its answer is replaced', async () => {
    const fixture = createFixture({ sessions: failingSessions('rejects') })
    const app = EXPRESS.express()
    app.use(dispatchOf(fixture))
    let finished: (outcome: unknown) => void
    const handlerDone = new Promise((resolve) => (finished = resolve))
    app.use(async (_req: http.IncomingMessage, res: http.ServerResponse) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'mcp-session-id': 'waits' })
      const wrote = await new Promise((resolve) => res.write('data: 1\n\n', (error) => resolve(error ? (error as { code?: string }).code : 'written')))
      await new Promise<void>((resolve) => res.end(resolve))
      finished(wrote)
    })
    const port = await serve(app)
    const answer = await rawRequest(port, { path: '/v1', headers: { ...json, ...bearer(fixture) }, body: tools })
    expect(answer.status).toBe(503)
    expect(await within(handlerDone, 2_000, 'the handler, left waiting')).toBe('ERR_STREAM_DESTROYED')
  })
})
