/**
 * The token-management API (`createTokenApi`) as a platform mounts it: its `basePath`, the
 * methods of each path for every kind of caller (a Bearer one too), what a session learns about
 * tokens that are not its own, and the API behind Hono on `@hono/node-server` and behind Express.
 */
import * as http from 'node:http'
import { connect } from 'node:net'
import { getRequestListener } from '@hono/node-server'
import express from 'express'
import Fastify from 'fastify'
import { Hono } from 'hono'
import {
  ConfigurationError,
  type TokenApi,
  type TokenStore,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenApi,
  createTokenService,
} from 'mcp-dispatch'
import * as expressAdapter from 'mcp-dispatch/express'
import * as fastifyAdapter from 'mcp-dispatch/fastify'
import { describe, expect, it } from 'vitest'
import { close, listen, rawRequest } from './adapters/helpers.js'
import { CSRF, DASH_SESSION, createAuditStores } from './runtimes/token-api-audit-app.js'

const T0 = Date.UTC(2030, 0, 1, 0, 0, 30)
const DAY = 86_400_000
const MISSING = '00000000-0000-4000-8000-000000000000'

/** A token service on in-memory stores with a clock the test moves, and its API. */
function setup(options: { basePath?: string; hosts?: string[] } = {}, store: TokenStore = createMemoryTokenStore()) {
  let now = T0
  const { apps, subscriptions } = createAuditStores({ createMemoryAppStore, createMemorySubscriptionStore })
  const errors: unknown[] = []
  const tokens = createTokenService({ store, apps, subscriptions, now: () => now, onError: (error) => errors.push(error) })
  // `dash=<user>` is that user's session, `X-CSRF-Token: csrf-ok` its CSRF token.
  const api = createTokenApi({ tokens, ...DASH_SESSION, onError: (error) => errors.push(error), ...options })
  return { api, tokens, errors, advance: (ms: number) => (now += ms) }
}

interface Call {
  user?: string
  csrf?: boolean
  bearer?: string
  body?: unknown
}

/** A request to the API at `path` (under `/api/tokens`) as `user` (with the CSRF token unless told) or `bearer`. */
function request(method: string, path: string, call: Call = {}): Request {
  const headers: Record<string, string> = {}
  if (call.user !== undefined) headers.cookie = `dash=${call.user}`
  if (call.user !== undefined && call.csrf !== false) headers['x-csrf-token'] = CSRF
  if (call.bearer !== undefined) headers.authorization = `Bearer ${call.bearer}`
  if (call.body !== undefined) headers['content-type'] = 'application/json'
  return new Request(`http://dash.example.com/api/tokens${path}`, {
    method,
    headers,
    ...(call.body !== undefined && { body: JSON.stringify(call.body) }),
  })
}

async function answer(api: TokenApi, req: Request): Promise<{ status: number; headers: Headers; body: any }> {
  const response = await api(req)
  if (!response) throw new Error(`${req.method} ${req.url}: not the API's`)
  const text = await response.text()
  return { status: response.status, headers: response.headers, body: text === '' ? undefined : JSON.parse(text) }
}

async function create(api: TokenApi, user: string, body: Record<string, unknown> = {}): Promise<any> {
  const created = await answer(api, request('POST', '', { user, body: { name: 'CI', servers: ['app_weather'], expires_in_days: 30, ...body } }))
  expect(created.status).toBe(201)
  return created.body
}

describe('basePath', () => {
  it('refuses a basePath no request path can be, naming it (regression: accepted, and the API answered nothing at all)', () => {
    const { tokens } = setup()
    const base = { tokens, authenticateSession: () => null, verifyCsrf: false as const }
    for (const basePath of ['/api/jetons-é', '/api tokens', '/dashboard/../api/tokens', '/api/./tokens', '/api/tokens?v=1', '/api/tokens#list', '/api\\tokens']) {
      expect(() => createTokenApi({ ...base, basePath }), basePath).toThrow(ConfigurationError)
      try {
        createTokenApi({ ...base, basePath })
      } catch (error) {
        expect((error as ConfigurationError).option, basePath).toBe('basePath')
        expect((error as Error).message, basePath).toContain(JSON.stringify(basePath))
      }
    }
  })

  it('a basePath as requests carry it is taken, and answers: percent-encoded, any case, with a trailing slash or at the root', async () => {
    const { tokens } = setup()
    const base = { tokens, authenticateSession: () => ({ userId: 'alice' }), verifyCsrf: false as const }
    for (const [basePath, url] of [
      ['/api/jetons-%C3%A9', 'http://dash.example.com/api/jetons-é'],
      ['/Dashboard/API/tokens/', 'http://dash.example.com/Dashboard/API/tokens'],
      ['/', 'http://dash.example.com/'],
      ['/', 'http://dash.example.com'],
    ] as const) {
      const api = createTokenApi({ ...base, basePath })
      const response = await api(new Request(url))
      expect(response?.status, `${basePath} ${url}`).toBe(200)
      expect(await response!.json()).toEqual({ tokens: [] })
    }
  })
})

describe('methods a path does not serve', () => {
  it('are 405 with the path\'s Allow for a Bearer caller too, as for a session or none (regression: 403, "may only rotate itself")', async () => {
    const { api } = setup()
    const own = await create(api, 'alice')
    for (const [method, path, allow] of [
      ['PUT', '', 'GET, HEAD, POST'],
      ['DELETE', '', 'GET, HEAD, POST'],
      ['OPTIONS', '', 'GET, HEAD, POST'],
      ['PUT', `/${own.id}`, 'GET, HEAD, PATCH, DELETE'],
      ['POST', `/${own.id}`, 'GET, HEAD, PATCH, DELETE'],
      ['OPTIONS', `/${own.id}`, 'GET, HEAD, PATCH, DELETE'],
      ['GET', `/${own.id}/rotate`, 'POST'],
    ] as const) {
      for (const call of [{ bearer: own.token }, { user: 'alice' }, {}] as Call[]) {
        const refused = await answer(api, request(method, path, call))
        expect([refused.status, refused.headers.get('allow'), refused.body.error], `${method} ${path} ${JSON.stringify(Object.keys(call))}`).toEqual([
          405,
          allow,
          'method_not_allowed',
        ])
      }
    }
    // A method the path serves is still refused to a Bearer caller (only its own rotation is its).
    const listed = await answer(api, request('GET', '', { bearer: own.token }))
    expect([listed.status, listed.body.error]).toEqual([403, 'forbidden'])
  })

  it('answer the same under serveTokenApi on Express, where a TRACE (which the adapter answers itself) already got the 405', async () => {
    const { api } = setup()
    const own = await create(api, 'alice')
    const app = express()
    app.use(expressAdapter.serveTokenApi(api))
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      for (const method of ['TRACE', 'PUT']) {
        const refused = await rawRequest(port, { method, path: `/api/tokens/${own.id}`, host: 'dash.example.com', headers: { authorization: `Bearer ${own.token}` } })
        expect([refused.status, refused.headers.allow, JSON.parse(refused.body).error], method).toEqual([405, 'GET, HEAD, PATCH, DELETE', 'method_not_allowed'])
      }
    } finally {
      await close(server)
    }
  })
})

describe("another user's token is answered as one that does not exist, and is left as it was", () => {
  it('GET, PATCH (valid or not), rotate and DELETE: the same 404 as for a missing id, whatever its state', async () => {
    const { api, tokens, advance } = setup()
    const active = await create(api, 'bob', { expires_in_days: 90 })
    const revoked = await create(api, 'bob')
    expect((await answer(api, request('DELETE', `/${revoked.id}`, { user: 'bob' }))).status).toBe(200)
    const expired = await create(api, 'bob', { expires_in_days: 7 })
    advance(8 * DAY)
    const before = await tokens.list('bob')
    expect(before.map((t) => t.status).sort()).toEqual(['active', 'expired', 'revoked'])

    const createdAt = Date.parse(active.created_at)
    const calls: Array<[string, string, Call['body']]> = [
      ['GET', '', undefined],
      ['PATCH', '', { name: 'taken over' }],
      // Past its 90 days, and in the past: a check against the token would tell it exists.
      ['PATCH', '', { expires_at: new Date(createdAt + 91 * DAY).toISOString() }],
      ['PATCH', '', { expires_at: new Date(createdAt).toISOString() }],
      ['PATCH', '', { allowed_ips: ['10.0.0.1/8'] }],
      ['POST', '/rotate', undefined],
      ['DELETE', '', undefined],
    ]
    const missing = []
    for (const [method, suffix, body] of calls) {
      missing.push(await answer(api, request(method, `/${MISSING}${suffix}`, { user: 'alice', body })))
    }
    for (const id of [active.id, revoked.id, expired.id]) {
      for (const [i, [method, suffix, body]] of calls.entries()) {
        const refused = await answer(api, request(method, `/${id}${suffix}`, { user: 'alice', body }))
        expect([refused.status, refused.body], `${method} ${suffix} ${id}`).toEqual([missing[i]!.status, missing[i]!.body])
        expect(refused.status, `${method} ${suffix}`).toBe(404)
      }
    }
    // Nothing of Bob's changed, the secret he holds included.
    expect(await tokens.list('bob')).toEqual(before)
    expect((await tokens.authenticate(active.token)).ok).toBe(true)
  })

  it("costs the store the same reads as a missing id, in any case of the UUID: no existence oracle by time (regression: found at the first read, someone else's was answered a read or two sooner)", async () => {
    let reads = 0
    const inner = createMemoryTokenStore()
    const counted = new Proxy(inner, {
      get: (target, key) =>
        key === 'get'
          ? (id: string) => {
              reads++
              return target.get(id)
            }
          : Reflect.get(target, key),
    })
    const { api } = setup({}, counted)
    const bobs = await create(api, 'bob')
    const calls: Array<[string, string, Call['body']]> = [
      ['GET', '', undefined],
      ['PATCH', '', { name: 'taken over' }],
      ['POST', '/rotate', undefined],
      ['DELETE', '', undefined],
    ]
    const readsOf = async (method: string, path: string, body: Call['body']) => {
      reads = 0
      const refused = await answer(api, request(method, path, { user: 'alice', body }))
      expect(refused.status, `${method} ${path}`).toBe(404)
      return reads
    }
    for (const [method, suffix, body] of calls) {
      for (const spell of [(id: string) => id, (id: string) => id.toUpperCase()]) {
        // An id missing with letters in it, as Bob's has: the reads follow the spellings of an id.
        const missing = await readsOf(method, `/${spell('abcdef00-0000-4000-8000-00000000000f')}${suffix}`, body)
        const theirs = await readsOf(method, `/${spell(bobs.id)}${suffix}`, body)
        expect(theirs, `${method} ${spell(bobs.id)}${suffix}`).toBe(missing)
        expect(missing).toBeGreaterThan(0)
      }
    }
    // Bob's own token is still found in either case, and was left as it was.
    const own = await answer(api, request('GET', `/${bobs.id.toUpperCase()}`, { user: 'bob' }))
    expect([own.status, own.body.id, own.body.name, own.body.status]).toEqual([200, bobs.id, 'CI', 'active'])
  })
})

/** The raw text of an HTTP exchange over loopback (`Connection: close`). */
function exchange(port: number, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.end(text))
    let out = ''
    socket.setEncoding('latin1')
    socket.on('data', (data: string) => (out += data))
    socket.on('end', () => resolve(out))
    socket.on('error', reject)
  })
}

describe('behind Hono on @hono/node-server', () => {
  it('on its hosts only (by Host), HEAD without a body, ids percent-encoded or with a trailing slash, a chunked body past the limit refused with nothing created', async () => {
    const { api, tokens } = setup({ hosts: ['dash.example.com'] })
    const app = new Hono()
    app.use('*', async (c, next) => {
      const answered = await api(c.req.raw)
      if (answered) return answered
      await next()
    })
    app.all('*', (c) => c.json({ app: true }))
    const server = http.createServer(getRequestListener(app.fetch))
    const port = await listen(server)
    try {
      const cookie = 'dash=alice'
      const created = await rawRequest(port, {
        method: 'POST',
        path: '/api/tokens',
        host: 'DASH.example.com:8443',
        headers: { cookie, 'x-csrf-token': CSRF, 'content-type': 'application/json' },
        body: JSON.stringify({ name: 'hono', servers: ['app_weather'], expires_in_days: 7 }),
      })
      expect([created.status, created.headers['cache-control']]).toEqual([201, 'no-store'])
      const { id, token } = JSON.parse(created.body)
      expect(created.headers.location).toBe(`/api/tokens/${id}`)
      // An App host's request under the path is not the API's: the App's routes answer it.
      const elsewhere = await rawRequest(port, { method: 'GET', path: '/api/tokens', host: 'weather.example.com', headers: { cookie } })
      expect(JSON.parse(elsewhere.body)).toEqual({ app: true })
      // An absolute-form target: @hono/node-server builds the URL of it and keeps the Host
      // field, which decides, as for `next start` (docs/api-tokens.md); the Node adapters read
      // the target's authority instead (test/adapters/token-api-node.test.ts).
      const absolute = await rawRequest(port, { method: 'GET', path: 'http://weather.example.com/api/tokens', host: 'dash.example.com', headers: { cookie } })
      expect([absolute.status, JSON.parse(absolute.body).tokens?.length]).toEqual([200, 1])
      const absoluteThere = await rawRequest(port, { method: 'GET', path: 'http://dash.example.com/api/tokens', host: 'weather.example.com', headers: { cookie } })
      expect(JSON.parse(absoluteThere.body)).toEqual({ app: true })

      const encoded = await rawRequest(port, { method: 'GET', path: `/api/tokens/${id.replaceAll('-', '%2D')}/`, host: 'dash.example.com', headers: { cookie } })
      expect([encoded.status, JSON.parse(encoded.body).id]).toEqual([200, id])
      expect(encoded.body).not.toContain(token)

      const head = await exchange(port, `HEAD /api/tokens/${id} HTTP/1.1\r\nHost: dash.example.com\r\nCookie: ${cookie}\r\nConnection: close\r\n\r\n`)
      expect(head).toMatch(/^HTTP\/1\.1 200 /)
      expect(head).toMatch(/\r\ncache-control: no-store\r\n/i)
      expect(head.slice(head.indexOf('\r\n\r\n') + 4)).toBe('')

      // 16 KiB and one more chunk, no Content-Length: refused as it streams in.
      const chunked = await exchange(
        port,
        `POST /api/tokens HTTP/1.1\r\nHost: dash.example.com\r\nCookie: ${cookie}\r\nX-CSRF-Token: ${CSRF}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n` +
          `4000\r\n${' '.repeat(0x4000)}\r\n2\r\n{}\r\n0\r\n\r\n`,
      )
      expect(chunked).toMatch(/^HTTP\/1\.1 400 /)
      expect(JSON.parse(chunked.slice(chunked.indexOf('\r\n\r\n') + 4))).toEqual({ error: 'invalid_request', message: 'body: must be at most 16384 bytes', field: 'body' })
      expect((await tokens.list('alice')).map((t) => t.id)).toEqual([id])
    } finally {
      await close(server)
    }
  })
})

describe('a request body whose stream fails while it is read', () => {
  /** A create whose body's stream hands over its first bytes, then fails with `error`. */
  function failing(error: unknown, signal?: AbortSignal): Request {
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new TextEncoder().encode('{"name":"CI",'))
      },
      pull(controller) {
        controller.error(error)
      },
    })
    const headers = { cookie: 'dash=alice', 'x-csrf-token': CSRF, 'content-type': 'application/json' }
    return new Request('http://dash.example.com/api/tokens', { method: 'POST', headers, body, duplex: 'half', ...(signal && { signal }) } as RequestInit)
  }
  /** An error of a class `name`, named so, as Deno's (`Deno.errors.BadResource`). */
  const named = (name: string, message: string) => Object.assign(new ({ [name]: class extends Error {} }[name]!)(message), { name })

  it('is 400 naming body, and nothing for onError, when the runtime says the client\'s connection ended (each runtime\'s error, as measured)', async () => {
    const aborted = new AbortController()
    aborted.abort()
    const cuts: Array<[string, unknown, AbortSignal?]> = [
      // Deno 2 (a half-closed connection; a reset one), whose errors are classes of their name.
      ['deno, half-closed', named('BadResource', 'Cannot read request body as underlying resource unavailable')],
      ['deno, reset', named('Http', 'unexpected EOF while reading HTTP/1 body')],
      // workerd, both ways.
      ['workerd', new Error('Network connection lost.')],
      // The Node adapters' stream, @hono/node-server's, Next.js's: the request ended early.
      ['node, aborted', Object.assign(new Error('aborted'), { code: 'ECONNRESET' })],
      ['node, premature close', Object.assign(new Error('Premature close'), { code: 'ERR_STREAM_PREMATURE_CLOSE' })],
      // Bun (when it hands such a body over at all), whose request's signal has aborted.
      ['bun', new DOMException('The connection was closed.', 'AbortError'), aborted.signal],
    ]
    for (const [name, error, signal] of cuts) {
      const { api, errors, tokens } = setup()
      const refused = await answer(api, failing(error, signal))
      expect([refused.status, refused.body?.field], name).toEqual([400, 'body'])
      expect(refused.body.message, name).toBe('body: was cut short: the connection ended before the whole body arrived')
      expect(errors, name).toEqual([])
      expect(await tokens.list('alice'), name).toEqual([])
    }
  })

  it('cut short on Node (Express, Fastify, @hono/node-server; half-closed, chunked without its last chunk, reset): nothing for onError, nothing created', async () => {
    const headers = 'Host: dash.example.com\r\nCookie: dash=alice\r\nX-CSRF-Token: csrf-ok\r\nContent-Type: application/json\r\n'
    const cuts: Array<[string, string, 'half' | 'reset']> = [
      ['a Content-Length not sent whole', `POST /api/tokens HTTP/1.1\r\n${headers}Content-Length: 200\r\n\r\n{"name":"CI",`, 'half'],
      ['chunked without its last chunk', `POST /api/tokens HTTP/1.1\r\n${headers}Transfer-Encoding: chunked\r\n\r\nc\r\n{"name":"CI",\r\n`, 'half'],
      ['a rotation reset mid-body', `POST /api/tokens/${MISSING}/rotate HTTP/1.1\r\n${headers}Content-Length: 50\r\n\r\n{`, 'reset'],
      ['a create reset mid-body', `POST /api/tokens HTTP/1.1\r\n${headers}Content-Length: 200\r\n\r\n{"name":"CI",`, 'reset'],
    ]
    const servers: Record<string, (api: TokenApi) => Promise<http.Server>> = {
      async express(api) {
        const app = express()
        app.use(expressAdapter.serveTokenApi(api))
        return http.createServer(app)
      },
      async fastify(api) {
        let made: http.Server | undefined
        const app = Fastify({ serverFactory: (handler) => (made = http.createServer(handler)) })
        await app.register(fastifyAdapter.serveTokenApi(api))
        await app.ready()
        return made!
      },
      async hono(api) {
        return http.createServer(getRequestListener(async (request: Request) => (await api(request)) ?? new Response(null, { status: 404 })))
      },
    }
    for (const [platform, serve] of Object.entries(servers)) {
      const { api, errors, tokens } = setup()
      const server = await serve(api)
      const port = await listen(server)
      try {
        for (const [name, bytes, end] of cuts) {
          await new Promise<void>((resolve) => {
            const socket = connect(port, '127.0.0.1', () => {
              socket.write(bytes)
              setTimeout(() => (end === 'half' ? socket.end() : socket.resetAndDestroy()), 100)
            })
            socket.on('error', () => {})
            socket.on('data', () => {})
            socket.on('close', () => resolve())
            setTimeout(() => socket.destroy(), 3_000)
          })
          await new Promise((resolve) => setTimeout(resolve, 100))
          expect(errors, `${platform}: ${name}`).toEqual([])
        }
        expect(await tokens.list('alice'), platform).toEqual([])
      } finally {
        await close(server)
      }
    }
  })

  it('is 503, reported to onError, when it failed for the server: a platform\'s stream in front, not the client (regression: 400 "the connection ended", unreported)', async () => {
    for (const error of [
      // A platform's own stream in front of the API (a body spooled to storage, a decoding
      // TransformStream with a bug), and an AbortError of the platform's own, not the request's.
      new Error('spool: read failed'),
      new TypeError("Cannot read properties of undefined (reading 'byteLength')"),
      new DOMException('The operation was aborted.', 'AbortError'),
    ]) {
      const { api, errors, tokens } = setup()
      const failed = await answer(api, failing(error))
      expect([failed.status, failed.body?.error, failed.headers.get('retry-after')], String(error)).toEqual([503, 'temporarily_unavailable', '1'])
      expect(errors, String(error)).toEqual([error])
      expect(await tokens.list('alice'), String(error)).toEqual([])
    }
  })
})
