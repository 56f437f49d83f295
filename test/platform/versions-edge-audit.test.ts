/**
 * The unusual cases of version resolution, pinning and the version headers, through the
 * reference platform over real HTTP on 127.0.0.1 (a port of the system's choosing), with the official MCP
 * SDK client where a session is needed; checked against spec section 9, DESIGN.md ("Versions",
 * pipeline steps 1, 6 and 7) and docs/versions.md.
 *
 * - An App whose live versions are only pre-releases, and one with nothing live: what `/`,
 *   `/v1`, `/v1.2`, `/v1.2.3` and `/v1.2.3-beta.1` answer, and `X-MCP-Latest-Version` then.
 * - The newest live version a pre-release beside releases: the header names the latest release.
 * - A session pinned to a version a deploy withdraws (replaces), and a newer version deployed
 *   while pinned: the pin holds on every answer (POST, the 202 of a notification, the GET
 *   stream, DELETE, the App's own errors) while `X-MCP-Latest-Version` moves.
 * - Odd request targets, sent as raw bytes: a clear 4xx naming the problem, or the documented
 *   reading (encoded unreserved characters, one trailing slash, dot segments resolved by
 *   `@hono/node-server`), never 500 and never another version unannounced.
 * - No version header on any answer made before the version is resolved.
 */
import * as net from 'node:net'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Platform, type PlatformSeed, createPlatform } from '../../examples/platform/index.js'
import { type ServedFetch, createClock, localhostFetch, serveFetch, testSeed } from '../helpers/platform.js'

let platform: Platform
let served: ServedFetch
const errors: Array<{ error: unknown; context: string }> = []
let edge: string

/** The seed of the other platform tests, with an App of pre-releases only and one with nothing live. */
function seed(): PlatformSeed {
  const base = testSeed()
  return {
    ...base,
    apps: [
      ...base.apps,
      { id: 'app_pre', slug: 'pre', name: 'Pre', versions: ['1.2.3-beta.1', '2.0.0-rc.1'] },
      { id: 'app_empty', slug: 'empty', name: 'Empty', versions: [] },
      { id: 'app_odd', slug: 'odd', name: 'Odd', versions: ['1.0.0', '1.2.3', '2.0.0'] },
      { id: 'app_listen', slug: 'listen', name: 'Listen', versions: ['1.0.0', '1.1.0-rc.1'] },
    ],
    subscriptions: [
      ...(base.subscriptions ?? []),
      { userId: 'user_alice', appId: 'app_pre', active: true },
      { userId: 'user_alice', appId: 'app_empty', active: true },
      { userId: 'user_alice', appId: 'app_odd', active: true },
      { userId: 'user_alice', appId: 'app_listen', active: true },
    ],
    tokens: [
      ...(base.tokens ?? []),
      { name: 'edge', userId: 'user_alice', servers: ['app_weather', 'app_pre', 'app_empty', 'app_odd', 'app_listen'], expiresInDays: 30 },
    ],
  }
}

beforeAll(async () => {
  platform = createPlatform({ seed: seed(), now: createClock().now, onError: (error, context) => void errors.push({ error, context }) })
  edge = platform.tokens.edge!
  served = await serveFetch((request, info) => platform.fetch(request, info))
})
afterAll(async () => {
  await served?.close()
  await platform?.close()
  expect(errors).toEqual([])
})

const origin = (slug: string) => `http://${slug}.localhost:${served.port}`
const INIT = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'edge', version: '0.0.0' } },
}
const TOOLS_LIST = { jsonrpc: '2.0', id: 1, method: 'tools/list' }

interface Answer {
  status: number
  version: string | null
  latest: string | null
  body: string
}

async function read(response: Response): Promise<Answer> {
  return {
    status: response.status,
    version: response.headers.get('x-mcp-version'),
    latest: response.headers.get('x-mcp-latest-version'),
    body: await response.text(),
  }
}

/** A POST of a JSON-RPC message (default `tools/list`) over HTTP. */
async function post(slug: string, path: string, options: { sessionId?: string; body?: unknown; raw?: string; token?: string | null; accept?: string } = {}) {
  const headers: Record<string, string> = { 'content-type': 'application/json', accept: options.accept ?? 'application/json, text/event-stream' }
  if (options.token !== null) headers.authorization = `Bearer ${options.token ?? edge}`
  if (options.sessionId !== undefined) {
    headers['mcp-session-id'] = options.sessionId
    headers['mcp-protocol-version'] = '2025-06-18'
  }
  return read(await localhostFetch(`${origin(slug)}${path}`, { method: 'POST', headers, body: options.raw ?? JSON.stringify(options.body ?? TOOLS_LIST) }))
}

const versionNotFound = (requested: string, latest: string | null) => ({
  jsonrpc: '2.0',
  id: null,
  error: { code: -32004, message: 'Version not found', data: { error: 'version_not_found', requested, latest } },
})
const NOT_FOUND = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Not found', data: { error: 'not_found' } } }
const SESSION_NOT_FOUND = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Session not found', data: { error: 'session_not_found' } } }

/** A refusal of the dispatch layer (steps 1-6): that body, and no version header. */
function expectRefusal(answer: Answer, status: number, body: unknown, what = ''): void {
  expect({ what, status: answer.status, version: answer.version, latest: answer.latest, body: JSON.parse(answer.body) as unknown }).toEqual({
    what,
    status,
    version: null,
    latest: null,
    body,
  })
}

/** The JSON-RPC message of a JSON or one-message SSE body. */
function message(body: string): any {
  const data = body.startsWith('{') ? body : /^data: (.*)$/m.exec(body)?.[1]
  return JSON.parse(data ?? 'null')
}

/** The version that served a `tools/list` (its `get_version` description names it). */
function listedVersion(body: string): string | undefined {
  const tools = (message(body) as { result?: { tools?: Array<{ name: string; description?: string }> } }).result?.tools
  return /\(([^()]+)\)\.?$/.exec(tools?.find((t) => t.name === 'get_version')?.description ?? '')?.[1]
}

interface Seen {
  method: string
  status: number
  version: string | null
  latest: string | null
  contentType: string | null
}

/** An official SDK client at `slug` + `path`, every HTTP exchange recorded. */
async function connect(slug: string, path: string) {
  const seen: Seen[] = []
  const transport = new StreamableHTTPClientTransport(new URL(`${origin(slug)}${path}`), {
    requestInit: { headers: { Authorization: `Bearer ${edge}` } },
    fetch: async (url, init) => {
      const response = await localhostFetch(url, init)
      seen.push({
        method: init?.method ?? 'GET',
        status: response.status,
        version: response.headers.get('x-mcp-version'),
        latest: response.headers.get('x-mcp-latest-version'),
        contentType: response.headers.get('content-type'),
      })
      return response
    },
  })
  const client = new Client({ name: 'edge-audit', version: '1.0.0' })
  await client.connect(transport)
  const toolVersion = async () => ((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent as { version: string }).version
  return { client, transport, seen, toolVersion, sessionId: transport.sessionId! }
}

/** Waits until the SDK client's GET stream has been answered (it opens it after `initialized`). */
async function untilGetStream(seen: Seen[]): Promise<Seen> {
  for (let i = 0; i < 200; i++) {
    const get = seen.find((s) => s.method === 'GET')
    if (get) return get
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  throw new Error('the SDK client opened no GET stream')
}

describe('an App with only pre-releases live, and one with nothing live', () => {
  it('/, /v1, /v1.2 and /v1.2.3 are 404 version_not_found naming the highest pre-release as latest; the pre-release is served at its exact URL only', async () => {
    for (const [path, requested] of [
      ['/', 'latest'],
      ['/v1', '1'],
      ['/v1.2', '1.2'],
      ['/v1.2.3', '1.2.3'],
      ['/v2', '2'],
      ['/v2.0', '2.0'],
      ['/v2.0.0', '2.0.0'],
      ['/v1.2.3-beta.2', '1.2.3-beta.2'],
    ] as const) {
      expectRefusal(await post('pre', path), 404, versionNotFound(requested, '2.0.0-rc.1'), path)
    }
    for (const [path, version] of [
      ['/v1.2.3-beta.1', '1.2.3-beta.1'],
      ['/v1.2.3-beta.1/', '1.2.3-beta.1'],
      ['/v2.0.0-rc.1', '2.0.0-rc.1'],
    ] as const) {
      const answer = await post('pre', path)
      // Every valid MCP response carries both headers (spec 9.3): with no release live, the
      // latest is the highest pre-release (docs/versions.md).
      expect({ path, status: answer.status, version: answer.version, latest: answer.latest, served: listedVersion(answer.body) }).toEqual({
        path,
        status: 200,
        version,
        latest: '2.0.0-rc.1',
        served: version,
      })
    }
  })

  it('nothing live: every version URL is 404 version_not_found with latest null, after authentication', async () => {
    for (const [path, requested] of [
      ['/', 'latest'],
      ['/v1', '1'],
      ['/v1.2', '1.2'],
      ['/v1.2.3', '1.2.3'],
      ['/v1.2.3-beta.1', '1.2.3-beta.1'],
    ] as const) {
      expectRefusal(await post('empty', path), 404, versionNotFound(requested, null), path)
      expect((await post('empty', path, { token: null })).status).toBe(401)
    }
    // The SDK client's connection is refused with the 404, and no session is left behind.
    const client = new Client({ name: 'edge-audit', version: '1.0.0' })
    const transport = new StreamableHTTPClientTransport(new URL(`${origin('empty')}/v1`), {
      requestInit: { headers: { Authorization: `Bearer ${edge}` } },
      fetch: localhostFetch,
    })
    await expect(client.connect(transport)).rejects.toMatchObject({ code: 404 })
  })

  it('a release deployed after them: it is the latest, / and /v1 reach it, the retired pre-release is 404 and the other stays at its exact URL', async () => {
    // On its own App, so the other tests keep theirs.
    platform.deploy('app_odd', '2.1.0-rc.1')
    const pre = await post('odd', '/v2.1.0-rc.1')
    // The newest live version is a pre-release: the header names the latest release.
    expect([pre.status, pre.version, pre.latest, listedVersion(pre.body)]).toEqual([200, '2.1.0-rc.1', '2.0.0', '2.1.0-rc.1'])
    for (const path of ['/', '/v2', '/v2.1']) {
      const answer = await post('odd', path)
      if (path === '/v2.1') {
        expectRefusal(answer, 404, versionNotFound('2.1', '2.0.0'), path)
        continue
      }
      expect([path, answer.status, answer.version, answer.latest]).toEqual([path, 200, '2.0.0', '2.0.0'])
    }
  })
})

describe('a session pinned while its version is withdrawn and a newer one deployed (spec 9.2 rule 1, 9.3)', () => {
  it('keeps its version on every answer (POST, 202, GET stream, the App\'s errors, DELETE) while X-MCP-Latest-Version moves; then 404 without headers', async () => {
    const c = await connect('weather', '/v1')
    expect(await c.toolVersion()).toBe('1.1.1')
    await untilGetStream(c.seen)

    platform.deploy('app_weather', '1.1.2') // withdraws 1.1.1: no longer live
    platform.deploy('app_weather', '2.1.0')
    expect(await c.toolVersion()).toBe('1.1.1')

    // The same session, by hand: at every URL of its line, its withdrawn exact URL included.
    for (const path of ['/', '/v1', '/v1.1', '/v1.1.1', '/v1.1.1/']) {
      const answer = await post('weather', path, { sessionId: c.sessionId })
      expect([path, answer.status, answer.version, answer.latest, listedVersion(answer.body)]).toEqual([path, 200, '1.1.1', '2.1.0', '1.1.1'])
    }
    // Never another version's exact URL, nor another line: 404 before the MCP layer.
    for (const path of ['/v1.1.2', '/v1.0', '/v2', '/v2.1.0']) {
      expectRefusal(await post('weather', path, { sessionId: c.sessionId }), 404, SESSION_NOT_FOUND, path)
    }
    // A new connection resolves against the live set: the withdrawn exact URL is 404.
    expectRefusal(await post('weather', '/v1.1.1'), 404, versionNotFound('1.1.1', '2.1.0'))
    const fresh = await post('weather', '/v1', { body: INIT })
    expect([fresh.status, fresh.version, fresh.latest]).toEqual([200, '1.1.2', '2.1.0'])

    // The App's own errors after version resolution carry both headers: a parse error, a
    // request the transport does not accept.
    const parseError = await post('weather', '/v1', { sessionId: c.sessionId, raw: '{oops' })
    expect([parseError.status, parseError.version, parseError.latest, message(parseError.body).error.code]).toEqual([400, '1.1.1', '2.1.0', -32700])
    const notAcceptable = await post('weather', '/v1', { sessionId: c.sessionId, accept: 'text/plain' })
    expect([notAcceptable.status, notAcceptable.version, notAcceptable.latest]).toEqual([406, '1.1.1', '2.1.0'])

    // A GET stream opened after the deploys: the pinned version, the new latest.
    const stream = new AbortController()
    const get = await localhostFetch(`${origin('weather')}/v1`, {
      headers: { authorization: `Bearer ${edge}`, accept: 'text/event-stream', 'mcp-session-id': c.sessionId, 'mcp-protocol-version': '2025-06-18' },
      signal: stream.signal,
    })
    // The SDK client holds the session's stream already: the App answers 409 (one per session),
    // still an answer of the MCP layer.
    expect([get.status, get.headers.get('x-mcp-version'), get.headers.get('x-mcp-latest-version')]).toEqual([409, '1.1.1', '2.1.0'])
    stream.abort()
    await get.body?.cancel().catch(() => {})

    await c.transport.terminateSession()
    await c.client.close()

    // Every exchange of the SDK client: the initialize, the 202 of `notifications/initialized`,
    // the GET stream, the tool calls and the DELETE; each names 1.1.1; the latest moved.
    const kinds = c.seen.map((s) => `${s.method} ${s.status}`)
    expect(kinds).toEqual(expect.arrayContaining(['POST 200', 'POST 202', 'GET 200', 'DELETE 200']))
    for (const s of c.seen) expect({ ...s, contentType: undefined }).toMatchObject({ version: '1.1.1', latest: expect.stringMatching(/^2\.(0|1)\.0$/) })
    const get200 = c.seen.find((s) => s.method === 'GET')!
    expect([get200.status, get200.contentType, get200.latest]).toEqual([200, 'text/event-stream', '2.0.0'])
    expect(c.seen.at(-1)).toMatchObject({ method: 'DELETE', status: 200, version: '1.1.1', latest: '2.1.0' })

    // Once ended: refused before the MCP layer, no version header.
    expectRefusal(await post('weather', '/v1', { sessionId: c.sessionId }), 404, SESSION_NOT_FOUND)
  })

  it('a session opened at a pre-release keeps it after the release retires it, at its exact URL only; the latest moves to the release', async () => {
    const c = await connect('pre', '/v1.2.3-beta.1')
    expect(await c.toolVersion()).toBe('1.2.3-beta.1')
    expect(c.seen[0]).toMatchObject({ status: 200, version: '1.2.3-beta.1', latest: '2.0.0-rc.1' })

    platform.deploy('app_pre', '2.0.0-rc.2') // a newer pre-release: the latest moves to it
    expect(await c.toolVersion()).toBe('1.2.3-beta.1')
    expect(c.seen.at(-1)).toMatchObject({ version: '1.2.3-beta.1', latest: '2.0.0-rc.2' })

    platform.deploy('app_pre', '1.2.3') // the release retires 1.2.3-beta.1, and is the latest now
    expect(await c.toolVersion()).toBe('1.2.3-beta.1')
    expect(c.seen.at(-1)).toMatchObject({ version: '1.2.3-beta.1', latest: '1.2.3' })

    // No line holds a pre-release: its session is not served at /, /v1 or /v1.2.
    for (const path of ['/', '/v1', '/v1.2', '/v1.2.3']) {
      expectRefusal(await post('pre', path, { sessionId: c.sessionId }), 404, SESSION_NOT_FOUND, path)
    }
    expectRefusal(await post('pre', '/v1.2.3-beta.1'), 404, versionNotFound('1.2.3-beta.1', '1.2.3'))
    const release = await post('pre', '/')
    expect([release.status, release.version, release.latest]).toEqual([200, '1.2.3', '1.2.3'])
    await c.transport.terminateSession()
    expect(c.seen.at(-1)).toMatchObject({ method: 'DELETE', status: 200, version: '1.2.3-beta.1', latest: '1.2.3' })
    await c.client.close()
  })
})

/** Sends a request target as raw bytes (no client normalizes it) and reads the answer. */
function rawPost(slug: string, target: string): Promise<Answer> {
  const body = JSON.stringify(TOOLS_LIST)
  return new Promise((resolve, reject) => {
    const socket = net.connect(served.port, '127.0.0.1')
    let data = Buffer.alloc(0)
    socket.on('data', (chunk: Buffer) => (data = Buffer.concat([data, chunk])))
    socket.on('error', reject)
    socket.on('close', () => {
      const text = data.toString('utf8')
      const [head = '', ...rest] = text.split('\r\n\r\n')
      const header = (name: string) => new RegExp(`^${name}: (.*)$`, 'im').exec(head)?.[1]?.trim() ?? null
      let payload = rest.join('\r\n\r\n')
      // Chunked bodies: the chunk sizes out.
      if (/^transfer-encoding: chunked$/im.test(head)) payload = payload.replace(/(?:^|\r\n)[0-9a-f]+\r\n/gi, '')
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1]), version: header('x-mcp-version'), latest: header('x-mcp-latest-version'), body: payload.trim() })
    })
    socket.write(
      `POST ${target} HTTP/1.1\r\nHost: ${slug}.localhost:${served.port}\r\nAuthorization: Bearer ${edge}\r\n` +
        `Content-Type: application/json\r\nAccept: application/json\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    )
  })
}

describe('odd version path segments, sent as raw bytes (App odd: 1.0.0, 1.2.3, 2.0.0)', () => {
  it('each is the documented version, or a 404 that names the problem: not_found before authentication, version_not_found after; never 500', async () => {
    const notFound = [
      '/v01', '/v1.02', '/v1.2.03', '/V1', '/V1.2.3', '/v1.', '/v1..2', '/v.1', '/v1.2.3.4', '/v1.2.3+build', '/v1.2.3%2Bbuild',
      '/v1.2.3-rc.1+b', '/v-1', '/v+1', '/v1.2.3-', '/v1.2.3-01', '/v1.2.3-beta..1', '/v', '/v1.x', '/latest', '/1.2.3',
      '/v9007199254740992', '/v1.9007199254740992', '/v1.2.9007199254740992', '/v99999999999999999999999999',
      '/v1e3', '/v0x1', '/v1%2E', '/v1%2e%2e2', '/v1%2F', '/v%2531', '/v1%252E2', '/v1%', '/v1%zz', '/v1%20', '/v1;x',
      '//', '//v1', '/v1//', '/v1/mcp', '/v1.2.3/x', '/v1/v2', `/v1.2.3-${'a'.repeat(130)}`,
    ]
    for (const target of notFound) {
      expectRefusal(await rawPost('odd', target), 404, NOT_FOUND, target)
    }
    // Well formed, nothing live matches: after authentication, the selector as read.
    const notLive: Array<[string, string]> = [
      ['/v3', '3'],
      ['/v0', '0'],
      ['/v1.3', '1.3'],
      ['/v1.2.4', '1.2.4'],
      ['/v1.2.3-beta.1', '1.2.3-beta.1'],
      ['/v1.2.3-BETA', '1.2.3-BETA'],
      ['/v9007199254740991', '9007199254740991'],
      ['/v1.2.3-rc.9007199254740993', '1.2.3-rc.9007199254740993'],
      ['/v%33/', '3'],
      ['/v1.2.3%2D1', '1.2.3-1'],
    ]
    for (const [target, requested] of notLive) {
      expectRefusal(await rawPost('odd', target), 404, versionNotFound(requested, '2.0.0'), target)
    }
    // Served, as docs/versions.md and docs/adapters.md have it: one trailing slash, encoded
    // unreserved characters, a query; `@hono/node-server` (the platform's server) resolves dot
    // segments before the dispatch layer reads the path, so `/v1/..` is `/`.
    const servedAt: Array<[string, string]> = [
      ['/', '2.0.0'],
      ['/v1', '1.2.3'],
      ['/v1/', '1.2.3'],
      ['/v1.2/', '1.2.3'],
      ['/v1.2.3/', '1.2.3'],
      ['/v1%2E2', '1.2.3'],
      ['/v1%2e2%2e3', '1.2.3'],
      ['/%76%31', '1.2.3'],
      ['/v1?x=%2F', '1.2.3'],
      ['/v1.0', '1.0.0'],
      ['/v1/..', '2.0.0'],
      ['/v1/%2e%2e', '2.0.0'],
      ['/v1/../v2', '2.0.0'],
      ['/./v1', '1.2.3'],
      ['http://odd.localhost/v1.0.0', '1.0.0'],
    ]
    for (const [target, version] of servedAt) {
      const answer = await rawPost('odd', target)
      expect({ target, status: answer.status, version: answer.version, latest: answer.latest, served: listedVersion(answer.body) }).toEqual({
        target,
        status: 200,
        version,
        latest: '2.0.0',
        served: version,
      })
    }
    // Not a request target at all: 400 before the pipeline, no version header.
    for (const target of ['/v1\\', '*']) {
      const answer = await rawPost('odd', target)
      expect({ target, status: answer.status, version: answer.version, latest: answer.latest }).toEqual({ target, status: 400, version: null, latest: null })
    }
  })
})

describe('no version header before the version is resolved (DESIGN.md step 7)', () => {
  it('401, 403, 404, 405, a preflight and HEAD carry none, whatever the URL and session id', async () => {
    const { sessionId } = await connect('weather', '/v1')
    const sessioned = { 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
    const cases: Array<[string, RequestInit, number]> = [
      ['/v1', { method: 'POST', headers: { ...sessioned, 'content-type': 'application/json' }, body: '{}' }, 401],
      ['/v1', { method: 'POST', headers: { ...sessioned, authorization: `Bearer ${platform.tokens['alice-notes']}`, 'content-type': 'application/json' }, body: '{}' }, 403],
      ['/v1', { method: 'POST', headers: { ...sessioned, authorization: `Bearer ${edge}`, origin: 'http://evil.example', 'content-type': 'application/json' }, body: '{}' }, 403],
      ['/v01', { method: 'POST', headers: { ...sessioned, authorization: `Bearer ${edge}`, 'content-type': 'application/json' }, body: '{}' }, 404],
      ['/v2', { method: 'POST', headers: { ...sessioned, authorization: `Bearer ${edge}`, 'content-type': 'application/json' }, body: '{}' }, 404],
      ['/v1', { method: 'POST', headers: { 'mcp-session-id': 'unknown-session', authorization: `Bearer ${edge}`, 'content-type': 'application/json' }, body: '{}' }, 404],
      ['/v1', { method: 'PUT', headers: { ...sessioned, authorization: `Bearer ${edge}` }, body: '{}' }, 405],
      ['/v1', { method: 'HEAD', headers: { ...sessioned, authorization: `Bearer ${edge}` } }, 405],
      ['/v1', { method: 'OPTIONS', headers: { origin: 'http://localhost:3000', 'access-control-request-method': 'POST' } }, 204],
    ]
    for (const [path, init, status] of cases) {
      const response = await localhostFetch(`${origin('weather')}${path}`, init)
      await response.body?.cancel()
      expect({ path, method: init.method, status: response.status, version: response.headers.get('x-mcp-version'), latest: response.headers.get('x-mcp-latest-version') }).toEqual({
        path,
        method: init.method,
        status,
        version: null,
        latest: null,
      })
    }
  })
})

const MODERN = '2026-07-28'

/** A 2026-07-28 request over HTTP: the envelope in `_meta`, the headers mirroring the body. */
function modern(slug: string, path: string, method: string, params: Record<string, unknown> = {}) {
  return localhostFetch(`${origin(slug)}${path}`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${edge}`,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': MODERN,
      'mcp-method': method,
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method,
      params: {
        ...params,
        _meta: {
          'io.modelcontextprotocol/protocolVersion': MODERN,
          'io.modelcontextprotocol/clientInfo': { name: 'edge', version: '1.0.0' },
          'io.modelcontextprotocol/clientCapabilities': {},
        },
      },
    }),
  })
}

/** The methods of the JSON-RPC messages of an SSE stream, read for `waitMs`; the stream is then cancelled. */
async function heard(response: Response, waitMs: number): Promise<string[]> {
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let text = ''
  const deadline = Date.now() + waitMs
  while (Date.now() < deadline) {
    let timer: NodeJS.Timeout | undefined
    const next = await Promise.race([reader.read(), new Promise<null>((resolve) => (timer = setTimeout(resolve, deadline - Date.now(), null)))])
    clearTimeout(timer)
    if (next === null || next.done) break
    text += decoder.decode(next.value, { stream: true })
    if (text.includes('list_changed')) break
  }
  await reader.cancel().catch(() => {})
  return [...text.matchAll(/^data: (.*)$/gm)].map((m) => (JSON.parse(m[1]!) as { method?: string }).method ?? '')
}

describe('a deploy that retires a version, and the 2026-07-28 subscriptions/listen streams at its exact URL', () => {
  it('a retired pre-release\'s streams are told the lists changed, as a retired release\'s are (regression: they heard nothing, their URL 404)', async () => {
    const listen = (path: string) => modern('listen', path, 'subscriptions/listen', { notifications: { toolsListChanged: true } })
    const pre = await listen('/v1.1.0-rc.1')
    const release = await listen('/v1.0.0')
    expect([pre.status, pre.headers.get('x-mcp-version'), release.status, release.headers.get('x-mcp-version')]).toEqual([200, '1.1.0-rc.1', 200, '1.0.0'])
    platform.deploy('app_listen', '1.1.0-rc.2') // retires 1.1.0-rc.1; no address of 1.0.0 moves
    const [preHeard, releaseHeard] = await Promise.all([heard(pre, 3_000), heard(release, 300)])
    expect(preHeard).toEqual(['notifications/subscriptions/acknowledged', 'notifications/tools/list_changed'])
    expect(releaseHeard).toEqual(['notifications/subscriptions/acknowledged'])
    // Its client lists again at its URL: the version is gone.
    const listed = await modern('listen', '/v1.1.0-rc.1', 'tools/list')
    expectRefusal(await read(listed), 404, versionNotFound('1.1.0-rc.1', '1.0.0'))
  })

  it('a pre-release retired by a release of its minor is told once; a later deploy that does not touch it tells it nothing', async () => {
    platform.deploy('app_listen', '1.2.0-rc.1')
    const stream = await modern('listen', '/v1.2.0-rc.1', 'subscriptions/listen', { notifications: { toolsListChanged: true } })
    expect([stream.status, stream.headers.get('x-mcp-version')]).toEqual([200, '1.2.0-rc.1'])
    const reader = stream.body!.getReader()
    const decoder = new TextDecoder()
    let text = ''
    /** Reads the stream for `waitMs`, or until it has held `count` list_changed notifications. */
    const readFor = async (waitMs: number, count: number) => {
      const deadline = Date.now() + waitMs
      while (Date.now() < deadline && text.split('list_changed').length - 1 < count) {
        let timer: NodeJS.Timeout | undefined
        const next = await Promise.race([reader.read(), new Promise<null>((resolve) => (timer = setTimeout(resolve, deadline - Date.now(), null)))])
        clearTimeout(timer)
        if (next === null || next.done) break
        text += decoder.decode(next.value, { stream: true })
      }
      return [...text.matchAll(/^data: (.*)$/gm)].map((m) => (JSON.parse(m[1]!) as { method?: string }).method ?? '')
    }
    try {
      platform.deploy('app_listen', '1.2.0') // its release: retires 1.2.0-rc.1
      expect(await readFor(3_000, 1)).toEqual(['notifications/subscriptions/acknowledged', 'notifications/tools/list_changed'])
      platform.deploy('app_listen', '3.0.0') // `/` moves; 1.2.0-rc.1 was no longer live before it
      expect(await readFor(500, 2)).toEqual(['notifications/subscriptions/acknowledged', 'notifications/tools/list_changed'])
    } finally {
      await reader.cancel().catch(() => {})
    }
  })
})
