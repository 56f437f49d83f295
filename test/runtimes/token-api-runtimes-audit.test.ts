/**
 * The token API (`createTokenApi`) and the dispatch layer of one token service, served from one
 * fetch handler (`token-api-audit-app.ts`) on Bun, Deno and workerd, against the same handler on
 * Node (`@hono/node-server`), driven over loopback by raw requests:
 *
 * - the whole lifecycle through the API (create, list, get, edit, rotate by Bearer and by
 *   session, revoke) and the token's use on the MCP path before and after: every answer's status,
 *   body and headers (`Cache-Control`, `Location`, `WWW-Authenticate`, `Allow`, `Content-Length`)
 *   as on Node, byte for byte but for the ids, secrets and times each run draws;
 * - the protected-resource metadata (RFC 9728): its path forms, HEAD, methods, CORS, and the
 *   `resource` from the request's URL or from `baseUrl`;
 * - request bodies at and past the 16 KiB limit, of other content types, gzip-coded, not UTF-8, or cut short
 *   (a `Content-Length` the client does not send, a chunked body without its last chunk): a 4xx,
 *   or the connection closed, never a 5xx nor a line in `onError`, never a hang;
 * - on workerd, the `last_used_at` write of uses followed at once by a rotation, a revocation or
 *   an edit, kept alive by `waitUntil`.
 *
 * The servers import the source (src/, through `--sloppy-imports` on Deno, bundled by esbuild for
 * workerd), so what runs is the code under test, built or not. Ports: 18560 to 18563.
 * Missing runtimes are skipped as `web-runtimes.test.ts` skips them.
 */
import { existsSync } from 'node:fs'
import { connect } from 'node:net'
import { join } from 'node:path'
import { gzipSync } from 'node:zlib'
import { fileURLToPath } from 'node:url'
import { type ServerType, serve } from '@hono/node-server'
import * as lib from 'mcp-dispatch'
import * as web from 'mcp-dispatch/web'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { underProjectCI } from '../helpers/ci.js'
import { spawnServing } from '../helpers/serving-process.js'
import { withTestHost } from './app.js'
import { createAuditApp } from './token-api-audit-app.js'
import { bundleWorker, startWorkerd, workerdBinary } from './workerd.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const HERE = fileURLToPath(new URL('./', import.meta.url))
const installed = (path: string) => fileURLToPath(new URL(`./node_modules/${path}`, import.meta.url))
const SERVER = fileURLToPath(new URL('./token-api-audit-server.ts', import.meta.url))
const FLUSH_MS = 1_000
const PORTS = { node: 18560, bun: 18561, deno: 18562, workerd: 18563 } as const

interface Served {
  readonly port: number
  output(): string
  stop(): Promise<void>
}

/** workerd serving the audit app (from src/) at `port`; the Worker hands `waitUntil` to the variant that asks. */
async function startAuditWorkerd(port: number): Promise<Served> {
  const source = `
import { waitUntil } from 'cloudflare:workers'
import * as lib from ${JSON.stringify(join(ROOT, 'src/index.ts'))}
import * as web from ${JSON.stringify(join(ROOT, 'src/adapters/web/index.ts'))}
import { withTestHost } from ${JSON.stringify(join(HERE, 'app.ts'))}
import { createAuditApp } from ${JSON.stringify(join(HERE, 'token-api-audit-app.ts'))}
const plain = createAuditApp(lib, web, { lastUsedFlushMs: ${FLUSH_MS} })
const waiting = createAuditApp(lib, web, { lastUsedFlushMs: ${FLUSH_MS}, waitUntil })
// A dashboard whose session is read from what Cloudflare tells of the request (as one read from
// request.cf.tlsClientAuth behind mTLS), under /cf/api/tokens on any host, its Request untouched.
const byCf = lib.createTokenApi({
  tokens: lib.createTokenService({ store: lib.createMemoryTokenStore(), apps: lib.createMemoryAppStore([]), subscriptions: lib.createMemorySubscriptionStore([]) }),
  basePath: '/cf/api/tokens',
  authenticateSession: (request) => (request.cf?.clientIp ? { userId: 'alice' } : null),
  verifyCsrf: false,
})
export default {
  async fetch(request) {
    if (new URL(request.url).pathname.startsWith('/cf/')) return (await byCf(request)) ?? new Response(null, { status: 404 })
    const chosen = request.headers.get('x-test-variant') === 'wait-until' ? waiting : plain
    return chosen.serve(withTestHost(request), request.headers.get('cf-connecting-ip') ?? undefined)
  },
}
`
  return startWorkerd({ code: await bundleWorker({ source }), port })
}

/** The same app on Node, in this process (`@hono/node-server`, the socket's address). */
async function startNode(port: number): Promise<Served> {
  const app = createAuditApp(lib, web, { lastUsedFlushMs: FLUSH_MS })
  const server: ServerType = await new Promise((resolve) => {
    const s = serve(
      { port, hostname: '127.0.0.1', fetch: (request: Request, env: { incoming: { socket: { remoteAddress?: string } } }) => app.serve(withTestHost(request), env.incoming.socket.remoteAddress) },
      () => resolve(s),
    )
  })
  return { port, output: () => '', stop: () => new Promise((resolve) => server.close(() => resolve())) }
}

const RUNTIMES = {
  node: { binary: process.execPath, start: () => startNode(PORTS.node) },
  bun: { binary: installed('.bin/bun'), start: () => spawnServing(installed('.bin/bun'), ['run', SERVER, String(PORTS.bun), String(FLUSH_MS)], ROOT) },
  deno: {
    binary: installed('@deno/linux-x64-glibc/deno'),
    start: () =>
      spawnServing(installed('@deno/linux-x64-glibc/deno'), ['run', '--sloppy-imports', '--allow-net', '--allow-read', '--allow-env', SERVER, String(PORTS.deno), String(FLUSH_MS)], ROOT),
  },
  workerd: { binary: workerdBinary(), start: () => startAuditWorkerd(PORTS.workerd) },
} as const satisfies Record<string, { binary: string | undefined; start(): Promise<Served> }>
type Runtime = keyof typeof RUNTIMES
const missing = (runtime: Runtime) => {
  const binary = RUNTIMES[runtime].binary
  return binary === undefined || !existsSync(binary)
}
for (const runtime of Object.keys(RUNTIMES) as Runtime[]) {
  if (!missing(runtime)) continue
  const message = `[token-api-runtimes-audit] ${runtime} missing (npm ci --prefix test/runtimes)`
  if (underProjectCI()) throw new Error(`${message}: under .ci/run (MCP_DISPATCH_CI) this suite fails instead of skipping`)
  console.warn(`${message}; its suite skipped`)
}

interface Answer {
  /** 0: the connection closed (or `waitMs` passed) without an answer. */
  status: number
  headers: Record<string, string>
  body: string
  /** The head as it came, for HEAD answers. */
  raw: string
}

/**
 * One HTTP/1.1 exchange of raw bytes on a new connection: the first answer, read to its length
 * (or its last chunk, or the connection's end). `halfClose` ends the sending side once `bytes`
 * are out (the client sends no more, and waits for the answer).
 */
function exchange(port: number, bytes: string | Buffer, options: { halfClose?: boolean; waitMs?: number; head?: boolean } = {}): Promise<Answer> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1')
    let data = Buffer.alloc(0)
    let settled = false
    const finish = () => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      socket.destroy()
      const text = data.toString('latin1')
      const end = text.indexOf('\r\n\r\n')
      if (end === -1) return resolve({ status: 0, headers: {}, body: '', raw: text })
      const lines = text.slice(0, end).split('\r\n')
      const headers: Record<string, string> = {}
      for (const line of lines.slice(1)) {
        const colon = line.indexOf(':')
        headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim()
      }
      let body = data.subarray(end + 4)
      if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
        const parts: Buffer[] = []
        for (let at = 0; ; ) {
          const lineEnd = body.indexOf('\r\n', at)
          const size = parseInt(body.subarray(at, lineEnd).toString('latin1'), 16)
          if (lineEnd === -1 || !size) break
          parts.push(body.subarray(lineEnd + 2, lineEnd + 2 + size))
          at = lineEnd + 4 + size
        }
        body = Buffer.concat(parts)
      }
      resolve({ status: Number(lines[0]!.split(' ')[1]), headers, body: body.toString('utf8'), raw: text.slice(0, end) })
    }
    const timer = setTimeout(finish, options.waitMs ?? 10_000)
    socket.on('data', (chunk: Buffer) => {
      data = Buffer.concat([data, chunk])
      const text = data.toString('latin1')
      const end = text.indexOf('\r\n\r\n')
      if (end === -1) return
      if (options.head) return finish()
      const length = /\r\ncontent-length:\s*(\d+)/i.exec(text.slice(0, end))
      if (length && data.length >= end + 4 + Number(length[1])) finish()
      else if (/\r\ntransfer-encoding:\s*chunked/i.test(text.slice(0, end)) && text.endsWith('\r\n0\r\n\r\n')) finish()
      else if (!length && !/\r\ntransfer-encoding/i.test(text.slice(0, end)) && /^HTTP\/1\.1 (204|304)/.test(text)) finish()
    })
    socket.on('end', finish)
    socket.on('close', finish)
    socket.on('error', (error) => (data.length === 0 && !settled ? resolve({ status: 0, headers: {}, body: '', raw: String(error) }) : finish()))
    // A write the server cut off (it answered a body past the limit and closed: EPIPE) ends
    // nothing here: its answer, read already, is the one.
    socket.write(bytes, (error) => {
      if (!error && options.halfClose) socket.end()
    })
  })
}

/** A request's bytes: `Connection: close`, a `Content-Length` for the body unless framed otherwise. */
function request(method: string, target: string, host: string, headers: Record<string, string> = {}, body?: string | Buffer): Buffer {
  const all: Record<string, string> = { host, connection: 'close', ...headers }
  if (body !== undefined && all['content-length'] === undefined && all['transfer-encoding'] === undefined) all['content-length'] = String(Buffer.byteLength(body))
  const head = `${method} ${target} HTTP/1.1\r\n${Object.entries(all)
    .map(([name, value]) => `${name}: ${value}`)
    .join('\r\n')}\r\n\r\n`
  return Buffer.concat([Buffer.from(head, 'latin1'), Buffer.from(body ?? '')])
}

/** What each run draws (secrets, ids, times) made constant, so two runtimes' answers compare. */
const normalized = (text: string) =>
  text
    .replace(/svc_[0-9A-Za-z]{44}/g, '<secret>')
    .replace(/svc_[0-9A-Za-z]{8}/g, '<prefix>')
    .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, '<id>')
    .replace(/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z/g, '<time>')
/** The fields compared: every one but the runtime's own (`Date`, `Connection`, `Keep-Alive`, framing). */
const OWN = new Set(['date', 'connection', 'keep-alive', 'server', 'transfer-encoding'])
/** An answer as compared: status, fields (sorted, normalized), body (normalized). */
function shown(answer: Answer): string {
  const fields = Object.entries(answer.headers)
    .filter(([name]) => !OWN.has(name))
    .map(([name, value]) => `${name}: ${normalized(value)}`)
    .sort()
  return [String(answer.status), ...fields, '', normalized(answer.body)].join('\n')
}

const COOKIE = { cookie: 'dash=alice', 'x-csrf-token': 'csrf-ok' }
const JSON_WRITE = { ...COOKIE, 'content-type': 'application/json' }
const CREATE = JSON.stringify({ name: 'ci', servers: ['app_weather'], expires_in_days: 7 })
const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
const MCP = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const METADATA = '/.well-known/oauth-protected-resource'
const bearer = (token: string) => ({ authorization: `Bearer ${token}` })
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** The lifecycle through the API, and the token's use on the MCP path: each step's answer, by name. */
async function lifecycle(port: number): Promise<Array<[string, Answer]>> {
  const steps: Array<[string, Answer]> = []
  const step = async (name: string, bytes: Buffer, options?: { head?: boolean }) => {
    const answer = await exchange(port, bytes, options)
    steps.push([name, answer])
    return answer
  }
  // The Worker's client address is Cloudflare's header (the others read the socket's, the same).
  const peer = { 'cf-connecting-ip': '127.0.0.1' }
  const api = (method: string, path: string, headers: Record<string, string> = {}, body?: string) => request(method, `/api/tokens${path}`, 'dash.localhost', { ...peer, ...headers }, body)
  const use = (token: string) => request('POST', '/v1', 'weather.localhost', { ...peer, ...MCP, ...bearer(token) }, TOOLS_LIST)

  await step('list without a session', api('GET', ''))
  const created = JSON.parse((await step('create', api('POST', '', JSON_WRITE, CREATE))).body) as { id: string; token: string }
  await step('create without CSRF', api('POST', '', { cookie: 'dash=alice', 'content-type': 'application/json' }, CREATE))
  await step('list', api('GET', '', COOKIE))
  await step('get', api('GET', `/${created.id}`, COOKIE))
  await step('get, another user', api('GET', `/${created.id}`, { cookie: 'dash=bob' }))
  await step('HEAD get', api('HEAD', `/${created.id}`, COOKIE), { head: true })
  await step('HEAD list without a session', api('HEAD', ''), { head: true })
  await step('OPTIONS', api('OPTIONS', '', { origin: 'https://dash.example' }))
  await step('PUT', api('PUT', `/${created.id}`, JSON_WRITE, '{}'))
  await step('use', use(created.token))
  await step('list by Bearer', api('GET', '', bearer(created.token)))
  await step('edit', api('PATCH', `/${created.id}`, JSON_WRITE, JSON.stringify({ name: 'renamed', allowed_ips: ['127.0.0.1', '::1'] })))
  await step('edit the servers', api('PATCH', `/${created.id}`, JSON_WRITE, JSON.stringify({ servers: ['app_notes'] })))
  await step('edit, camelCase', api('PATCH', `/${created.id}`, JSON_WRITE, JSON.stringify({ expiresAt: '2030-01-01T00:00:00Z' })))
  await step('rotate with a body', api('POST', `/${created.id}/rotate`, { ...bearer(created.token), 'content-type': 'application/json' }, '{"keep":true}'))
  await step('rotate by GET', api('GET', `/${created.id}/rotate`, bearer(created.token)))
  const rotated = JSON.parse((await step('rotate by Bearer', api('POST', `/${created.id}/rotate`, bearer(created.token)))).body) as { token: string }
  await step('use the rotated-away secret', use(created.token))
  await step('rotate by the rotated-away secret', api('POST', `/${created.id}/rotate`, bearer(created.token)))
  await step('use the new secret', use(rotated.token))
  await step('rotate another token by Bearer', api('POST', `/00000000-0000-4000-8000-000000000000/rotate`, bearer(rotated.token)))
  await step('rotate by session without CSRF', api('POST', `/${created.id}/rotate`, { cookie: 'dash=alice' }))
  const again = JSON.parse((await step('rotate by session', api('POST', `/${created.id}/rotate`, COOKIE))).body) as { token: string }
  await step('use the secret of the Bearer rotation', use(rotated.token))
  await step('use the session rotation\'s secret', use(again.token))
  await step('revoke', api('DELETE', `/${created.id}`, COOKIE))
  await step('use the revoked token', use(again.token))
  await step('rotate the revoked token by Bearer', api('POST', `/${created.id}/rotate`, bearer(again.token)))
  await step('rotate the revoked token by session', api('POST', `/${created.id}/rotate`, COOKIE))
  await step('edit the revoked token', api('PATCH', `/${created.id}`, JSON_WRITE, JSON.stringify({ name: 'x' })))
  await step('revoke again', api('DELETE', `/${created.id}`, COOKIE))
  await step('list at the end', api('GET', '', COOKIE))
  return steps
}

/** The metadata document's requests, by name. */
function metadataRequests(): Array<[string, Buffer, { head?: boolean }?]> {
  return [
    ['GET', request('GET', METADATA, 'weather.localhost')],
    ['GET, Host with a port and upper case', request('GET', METADATA, 'WEATHER.localhost:8080')],
    ['GET, Host with the default port', request('GET', METADATA, 'weather.localhost:80')],
    ['GET, a query', request('GET', `${METADATA}?x=1`, 'weather.localhost')],
    ['GET with Origin', request('GET', METADATA, 'weather.localhost', { origin: 'https://client.example' })],
    ['GET with a bad Bearer', request('GET', METADATA, 'weather.localhost', bearer('svc_nothing'))],
    ['GET, X-Forwarded-Proto untrusted', request('GET', METADATA, 'weather.localhost', { 'x-forwarded-proto': 'https' })],
    ['GET, baseUrl', request('GET', METADATA, 'weather.fixed.localhost')],
    ['HEAD', request('HEAD', METADATA, 'weather.localhost'), { head: true }],
    ['preflight', request('OPTIONS', METADATA, 'weather.localhost', { origin: 'https://client.example', 'access-control-request-method': 'GET' })],
    ['OPTIONS', request('OPTIONS', METADATA, 'weather.localhost')],
    ['POST', request('POST', METADATA, 'weather.localhost', { 'content-type': 'application/json' }, '{}')],
    ['DELETE', request('DELETE', METADATA, 'weather.localhost')],
    ['trailing slash', request('GET', `${METADATA}/`, 'weather.localhost')],
    ['path suffix', request('GET', `${METADATA}/v1`, 'weather.localhost')],
    ['percent-encoded', request('GET', '/.well-known/oauth-protected-resourc%65', 'weather.localhost')],
    ['unknown App', request('GET', METADATA, 'nowhere.localhost')],
    ['the 401 that points at it', request('POST', '/v1', 'weather.localhost', MCP, TOOLS_LIST)],
    ['the 401 that points at it, baseUrl', request('POST', '/v1', 'weather.fixed.localhost', MCP, TOOLS_LIST)],
  ]
}

const padded = (bytes: number) => `${CREATE.slice(0, -1)}${' '.repeat(bytes - CREATE.length)}}`
const chunk = (text: string) => `${Buffer.byteLength(text).toString(16)}\r\n${text}\r\n`
/** Bodies the API refuses or takes, each answered whole. */
function bodyRequests(): Array<[string, Buffer]> {
  const create = (headers: Record<string, string>, body?: string | Buffer) => request('POST', '/api/tokens', 'dash.localhost', headers, body)
  return [
    ['16 KiB exactly', create(JSON_WRITE, padded(16_384))],
    ['16 KiB and a byte', create(JSON_WRITE, padded(16_385))],
    // (Not far larger: a runtime that closes without reading what it refused may reset the
    // connection under a client still sending, and the client then loses the answer.)
    ['100 KB', create(JSON_WRITE, padded(100_000))],
    ['a Content-Length of a megabyte, no body sent', create({ ...JSON_WRITE, 'content-length': String(1 << 20) })],
    ['chunked', create({ ...JSON_WRITE, 'transfer-encoding': 'chunked' }, `${chunk(CREATE)}0\r\n\r\n`)],
    ['chunked past the limit', create({ ...JSON_WRITE, 'transfer-encoding': 'chunked' }, `${chunk(padded(10_000))}${chunk(' '.repeat(10_000))}0\r\n\r\n`)],
    ['text/plain', create({ ...COOKIE, 'content-type': 'text/plain' }, CREATE)],
    ['no Content-Type', create(COOKIE, CREATE)],
    ['a form', create({ ...COOKIE, 'content-type': 'application/x-www-form-urlencoded' }, 'name=ci')],
    ['application/json-seq', create({ ...COOKIE, 'content-type': 'application/json-seq' }, CREATE)],
    ['a charset', create({ ...COOKIE, 'content-type': 'application/json; charset=utf-8' }, CREATE)],
    ['not UTF-8', create(JSON_WRITE, Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x7d]))],
    ['UTF-8 cut in a character', create(JSON_WRITE, Buffer.from([0x7b, 0x22, 0xe2, 0x82]))],
    ['not JSON', create(JSON_WRITE, '{"name":')],
    ['empty', create(JSON_WRITE, '')],
    ['a JSON array', create(JSON_WRITE, '[]')],
    ['a byte order mark', create(JSON_WRITE, `\ufeff${CREATE}`)],
    // No runtime decodes a request body for the handler: refused naming the header on each.
    ['gzip', create({ ...JSON_WRITE, 'content-encoding': 'gzip' }, gzipSync(CREATE))],
    ['an edit past the limit', request('PATCH', '/api/tokens/00000000-0000-4000-8000-000000000000', 'dash.localhost', JSON_WRITE, `{"name":"x"${' '.repeat(16_400)}}`)],
    ['a rotation with a body past the limit', request('POST', '/api/tokens/00000000-0000-4000-8000-000000000000/rotate', 'dash.localhost', COOKIE, ' '.repeat(16_385))],
  ]
}

/** Bodies the client cuts short and then waits for the answer: the `Content-Length` not sent whole, a chunked body without its last chunk. */
function cutShortRequests(): Array<[string, Buffer]> {
  return [
    ['a create whose Content-Length is not sent whole', request('POST', '/api/tokens', 'dash.localhost', { ...JSON_WRITE, 'content-length': '200' }, CREATE)],
    ['a chunked create without its last chunk', request('POST', '/api/tokens', 'dash.localhost', { ...JSON_WRITE, 'transfer-encoding': 'chunked' }, chunk(CREATE))],
    ['an edit whose Content-Length is not sent whole', request('PATCH', '/api/tokens/00000000-0000-4000-8000-000000000000', 'dash.localhost', { ...JSON_WRITE, 'content-length': '50' }, '{"name"')],
    ['a rotation whose Content-Length is not sent whole', request('POST', '/api/tokens/00000000-0000-4000-8000-000000000000/rotate', 'dash.localhost', { ...COOKIE, 'content-length': '10' }, '{')],
  ]
}

const reference: { lifecycle?: string[]; metadata?: string[]; bodies?: string[] } = {}

describe.each(Object.keys(RUNTIMES) as Runtime[])('the token API and the metadata on %s', (runtime) => {
  let served: Served | undefined
  const test = it.skipIf(missing(runtime))
  const port = PORTS[runtime]
  const errors = async () => JSON.parse((await exchange(port, request('GET', '/errors', 'control.localhost'))).body) as string[]

  beforeAll(async () => {
    if (missing(runtime)) return
    // Node's answers, the reference, come first.
    if (runtime !== 'node' && reference.lifecycle === undefined) throw new Error('the Node suite runs first')
    served = await RUNTIMES[runtime].start()
  }, 60_000)

  afterAll(async () => {
    await served?.stop()
  })

  test('answers the whole token lifecycle as the docs say, and as on Node byte for byte', async () => {
    const steps = await lifecycle(port)
    const answers = steps.map(([name, answer]) => `${name}\n${shown(answer)}`)
    const byName = new Map(steps)
    const at = (name: string) => byName.get(name)!
    // What docs/api-tokens.md says of them, on every runtime.
    for (const [name, answer] of steps) {
      if (name.startsWith('use')) continue
      expect(answer.headers['cache-control'], name).toBe('no-store')
      expect(answer.headers['content-type'], name).toBe('application/json')
    }
    expect(at('create').status).toBe(201)
    expect(at('create').headers.location).toBe(`/api/tokens/${(JSON.parse(at('create').body) as { id: string }).id}`)
    expect(at('list without a session').headers['www-authenticate']).toBe('Bearer')
    expect([at('create without CSRF').status, JSON.parse(at('create without CSRF').body).error]).toEqual([403, 'csrf_failed'])
    expect([at('get, another user').status, JSON.parse(at('get, another user').body).error]).toEqual([404, 'not_found'])
    expect([at('HEAD get').status, at('HEAD get').body]).toEqual([200, ''])
    // RFC 9110 section 8.6: a HEAD's Content-Length, when sent, is its GET's.
    for (const [head, get] of [['HEAD get', 'get'], ['HEAD list without a session', 'list without a session']] as const) {
      const length = at(head).headers['content-length']
      if (length !== undefined) expect(length, head).toBe(String(Buffer.byteLength(at(get).body)))
    }
    expect([at('OPTIONS').status, at('OPTIONS').headers.allow, at('OPTIONS').headers['access-control-allow-origin']]).toEqual([405, 'GET, HEAD, POST', undefined])
    expect([at('PUT').status, at('PUT').headers.allow]).toEqual([405, 'GET, HEAD, PATCH, DELETE'])
    expect([at('use').status, at('use').headers['x-mcp-version']]).toEqual([200, '1.0.0'])
    expect([at('list by Bearer').status, JSON.parse(at('list by Bearer').body).error]).toEqual([403, 'forbidden'])
    expect(JSON.parse(at('edit the servers').body)).toEqual({ error: 'invalid_request', message: 'servers: cannot be changed after creation', field: 'servers' })
    expect(JSON.parse(at('edit, camelCase').body)).toEqual({ error: 'invalid_request', message: 'expiresAt: is not a known field', field: 'expiresAt' })
    expect([at('rotate with a body').status, JSON.parse(at('rotate with a body').body).field]).toEqual([400, 'body'])
    expect([at('rotate by GET').status, at('rotate by GET').headers.allow]).toEqual([405, 'POST'])
    const rotation = JSON.parse(at('rotate by Bearer').body) as Record<string, unknown>
    expect(at('rotate by Bearer').status).toBe(200)
    expect(Object.keys(rotation)).toEqual(['token', 'id', 'name', 'prefix', 'expires_at', 'allowed_ips', 'scopes', 'created_at'])
    expect(rotation).toMatchObject({ name: 'renamed', allowed_ips: ['127.0.0.1', '::1'], prefix: (rotation.token as string).slice(0, 12) })
    expect((rotation.token as string).length).toBe(48)
    for (const name of ['use the rotated-away secret', 'use the secret of the Bearer rotation', 'use the revoked token']) {
      expect([at(name).status, at(name).headers['www-authenticate']], name).toEqual([401, 'Bearer resource_metadata="http://weather.localhost/.well-known/oauth-protected-resource", error="invalid_token"'])
      expect(at(name).headers['x-mcp-version'], name).toBeUndefined()
    }
    for (const name of ['rotate by the rotated-away secret', 'rotate the revoked token by Bearer']) {
      expect([at(name).status, at(name).headers['www-authenticate']], name).toEqual([401, 'Bearer error="invalid_token"'])
    }
    expect(at('use the new secret').status).toBe(200)
    expect(at('use the session rotation\'s secret').status).toBe(200)
    expect([at('rotate another token by Bearer').status, JSON.parse(at('rotate another token by Bearer').body).error]).toEqual([403, 'forbidden'])
    expect(JSON.parse(at('revoke').body)).toMatchObject({ status: 'revoked' })
    expect(at('revoke again').status).toBe(200)
    expect([at('rotate the revoked token by session').status, JSON.parse(at('rotate the revoked token by session').body).error]).toEqual([409, 'token_inactive'])
    expect([at('edit the revoked token').status, JSON.parse(at('edit the revoked token').body).error]).toEqual([409, 'token_inactive'])
    const listed = JSON.parse(at('list at the end').body) as { tokens: Array<{ status: string; last_used_at: string | null }> }
    expect(listed.tokens.map((t) => t.status)).toEqual(['revoked'])
    expect(listed.tokens[0]!.last_used_at).not.toBeNull()

    if (runtime === 'node') reference.lifecycle = answers
    else expect(answers).toEqual(reference.lifecycle)
    expect(await errors()).toEqual([])
  })

  test('serves the protected-resource metadata as on Node: its path forms, HEAD, methods, CORS, the resource from the URL or baseUrl', async () => {
    const answers: string[] = []
    const byName = new Map<string, Answer>()
    for (const [name, bytes, options] of metadataRequests()) {
      const answer = await exchange(port, bytes, options)
      byName.set(name, answer)
      answers.push(`${name}\n${shown(answer)}`)
    }
    const at = (name: string) => byName.get(name)!
    const document = (resource: string) => ({
      resource,
      authorization_servers: ['https://auth.example.test'],
      bearer_methods_supported: ['header'],
      scopes_supported: ['openid', 'profile', 'email'],
      resource_name: 'Weather',
    })
    expect(JSON.parse(at('GET').body)).toEqual(document('http://weather.localhost'))
    expect(at('GET').headers).toMatchObject({ 'cache-control': 'public, max-age=3600', 'access-control-allow-origin': '*', 'content-type': 'application/json' })
    expect(at('GET').headers['access-control-expose-headers']).toContain('WWW-Authenticate')
    expect(JSON.parse(at('GET, Host with a port and upper case').body).resource).toBe('http://weather.localhost:8080')
    expect(JSON.parse(at('GET, Host with the default port').body).resource).toBe('http://weather.localhost')
    expect(JSON.parse(at('GET, X-Forwarded-Proto untrusted').body).resource).toBe('http://weather.localhost')
    expect(JSON.parse(at('GET, baseUrl').body)).toEqual(document('https://weather.apps.example.com'))
    expect(JSON.parse(at('GET with a bad Bearer').body)).toEqual(document('http://weather.localhost'))
    expect([at('HEAD').status, at('HEAD').headers['content-length']]).toEqual([200, String(Buffer.byteLength(at('GET').body))])
    expect([at('preflight').status, at('preflight').headers['access-control-allow-methods'], at('preflight').headers.allow]).toEqual([204, 'GET, HEAD, OPTIONS', 'GET, HEAD, OPTIONS'])
    for (const name of ['POST', 'DELETE']) expect([at(name).status, at(name).headers.allow], name).toEqual([405, 'GET, HEAD, OPTIONS'])
    for (const name of ['trailing slash', 'path suffix', 'percent-encoded', 'unknown App']) expect(at(name).status, name).toBe(404)
    expect(at('the 401 that points at it').headers['www-authenticate']).toBe(`Bearer resource_metadata="http://weather.localhost${METADATA}"`)
    expect(at('the 401 that points at it, baseUrl').headers['www-authenticate']).toBe(`Bearer resource_metadata="https://weather.apps.example.com${METADATA}"`)

    if (runtime === 'node') reference.metadata = answers
    else expect(answers).toEqual(reference.metadata)
    expect(await errors()).toEqual([])
  })

  test('answers bodies at and past the limit, of other types or not UTF-8, with a clear 4xx (or 201), as on Node', async () => {
    const answers: string[] = []
    for (const [name, bytes] of bodyRequests()) {
      const started = Date.now()
      const answer = await exchange(port, bytes, { waitMs: 5_000 })
      expect(answer.status, name).toBeGreaterThanOrEqual(200)
      expect(answer.status, name).toBeLessThan(500)
      expect(Date.now() - started, name).toBeLessThan(5_000)
      answers.push(`${name}\n${shown(answer)}`)
    }
    expect(answers[0]).toMatch(/^16 KiB exactly\n201\n/)
    for (const answer of answers.slice(1, 4)) expect(answer).toContain('{"error":"invalid_request","message":"body: must be at most 16384 bytes","field":"body"}')
    expect(answers.find((answer) => answer.startsWith('gzip\n'))).toMatch(/^gzip\n400\n[^]*"field":"content-encoding"/)

    if (runtime === 'node') reference.bodies = answers
    else expect(answers).toEqual(reference.bodies)
    expect(await errors()).toEqual([])
  })

  test('answers a body the client cut short with a 4xx (or closes), never a 5xx, and reports nothing to onError', async () => {
    const count = async () => (JSON.parse((await exchange(port, request('GET', '/api/tokens', 'dash.localhost', COOKIE))).body) as { tokens: unknown[] }).tokens.length
    const before = await count()
    for (const [name, bytes] of cutShortRequests()) {
      const started = Date.now()
      const answer = await exchange(port, bytes, { halfClose: true, waitMs: 5_000 })
      expect(Date.now() - started, name).toBeLessThan(5_000)
      // Closed without an answer (Bun), Node's own 400 (its parser's), or the API's 400.
      if (answer.status !== 0) {
        expect(answer.status, `${name}: ${answer.body}`).toBeGreaterThanOrEqual(400)
        expect(answer.status, `${name}: ${answer.body}`).toBeLessThan(500)
      }
    }
    // A client that went away mid-body after all (no half-close: the socket reset).
    const socket = connect(port, '127.0.0.1')
    await new Promise<void>((resolve) => socket.once('connect', resolve))
    socket.write(request('POST', '/api/tokens', 'dash.localhost', { ...JSON_WRITE, 'content-length': '500' }, CREATE))
    await sleep(200)
    socket.resetAndDestroy()
    await sleep(300)
    expect(await errors()).toEqual([])
    // Nothing was created by them.
    expect(await count()).toBe(before)
  })

  test('passes MCP bodies (large, of another type, not JSON, cut short) to the App untouched: its 4xx, never a 5xx of the dispatch layer', async () => {
    const token = (JSON.parse((await exchange(port, request('POST', '/api/tokens', 'dash.localhost', JSON_WRITE, CREATE))).body) as { token: string }).token
    const mcp = (headers: Record<string, string>, body?: string | Buffer) => request('POST', '/v1', 'weather.localhost', { ...bearer(token), ...headers }, body)
    const list = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: { _meta: { pad: ' '.repeat(1 << 20) } } })
    const answers: Array<[string, Answer]> = []
    for (const [name, bytes] of [
      ['a megabyte', mcp(MCP, list)],
      ['text/plain', mcp({ ...MCP, 'content-type': 'text/plain' }, TOOLS_LIST)],
      ['not JSON', mcp(MCP, '{"jsonrpc":')],
      ['not UTF-8', mcp(MCP, Buffer.from([0x7b, 0xff, 0x7d]))],
    ] as const) {
      answers.push([name, await exchange(port, bytes, { waitMs: 5_000 })])
    }
    const shownAnswers = answers.map(([name, answer]) => `${name} ${answer.status} ${answer.headers['x-mcp-version']}`)
    expect(shownAnswers).toEqual(['a megabyte 200 1.0.0', 'text/plain 415 1.0.0', 'not JSON 400 1.0.0', 'not UTF-8 400 1.0.0'])
    for (const bytes of [mcp({ ...MCP, 'content-length': '500' }, TOOLS_LIST), mcp({ ...MCP, 'transfer-encoding': 'chunked' }, chunk(TOOLS_LIST))]) {
      const answer = await exchange(port, bytes, { halfClose: true, waitMs: 5_000 })
      if (answer.status !== 0) expect(answer.status, answer.body).toBeLessThan(500)
    }
    expect(await errors()).toEqual([])
  })

  if (runtime === 'workerd') {
    test('answers a HEAD as its GET to hooks that read request.cf (regression: the HEAD\'s Request, rebuilt from its URL and headers, had no cf: 401 where GET is 200)', async () => {
      const get = await exchange(port, request('GET', '/cf/api/tokens', 'dash.localhost'))
      const head = await exchange(port, request('HEAD', '/cf/api/tokens', 'dash.localhost'), { head: true })
      expect([get.status, get.body]).toEqual([200, '{"tokens":[]}'])
      expect([head.status, head.headers['content-length']]).toEqual([200, String(Buffer.byteLength(get.body))])
    })
  }

  if (runtime === 'workerd') {
    test('writes last_used_at with waitUntil though a rotation, a revocation or an edit follows the uses at once', async () => {
      const call = (bytes: Buffer) => exchange(port, bytes)
      const variant = { 'x-test-variant': 'wait-until' }
      for (const then of ['rotate by Bearer', 'rotate by session', 'revoke', 'edit'] as const) {
        const created = JSON.parse((await call(request('POST', '/api/tokens', 'dash.localhost', { ...JSON_WRITE, ...variant }, CREATE))).body) as { id: string; token: string }
        const use = () => call(request('POST', '/v1', 'weather.localhost', { ...MCP, ...variant, ...bearer(created.token) }, TOOLS_LIST))
        expect((await use()).status).toBe(200)
        await sleep(30)
        const second = Date.now()
        expect((await use()).status).toBe(200)
        const path = `/api/tokens/${created.id}`
        const followed =
          then === 'rotate by Bearer'
            ? await call(request('POST', `${path}/rotate`, 'dash.localhost', { ...variant, ...bearer(created.token) }))
            : then === 'rotate by session'
              ? await call(request('POST', `${path}/rotate`, 'dash.localhost', { ...COOKIE, ...variant }))
              : then === 'revoke'
                ? await call(request('DELETE', path, 'dash.localhost', { ...COOKIE, ...variant }))
                : await call(request('PATCH', path, 'dash.localhost', { ...JSON_WRITE, ...variant }, '{"name":"edited"}'))
        expect(followed.status, then).toBe(200)
        // No request after it: the write is the timer's, which waitUntil kept.
        await vi.waitFor(
          async () => {
            const stored = JSON.parse((await call(request('GET', `/stored?id=${created.id}`, 'control.localhost', variant))).body) as { lastUsedAt: number | null }
            expect(stored.lastUsedAt ?? 0, then).toBeGreaterThanOrEqual(second)
          },
          { timeout: FLUSH_MS + 5_000, interval: 100 },
        )
      }
      expect(JSON.parse((await call(request('GET', '/errors', 'control.localhost', variant))).body)).toEqual([])
    })
  }

  if (runtime === 'workerd') {
    test('sends an invalidation whose publish failed again, with waitUntil, though no request follows', async () => {
      const call = (bytes: Buffer) => exchange(port, bytes)
      const variant = { 'x-test-variant': 'wait-until' }
      const created = JSON.parse((await call(request('POST', '/api/tokens', 'dash.localhost', { ...JSON_WRITE, ...variant }, CREATE))).body) as { id: string; token: string }
      const useOther = () => call(request('POST', '/v1', 'weather.other.localhost', { ...MCP, ...variant, ...bearer(created.token) }, TOOLS_LIST))
      // The other instance caches the token.
      expect((await useOther()).status).toBe(200)
      expect((await call(request('POST', '/fail-publish?n=1', 'control.localhost', variant))).status).toBe(200)
      expect((await call(request('DELETE', `/api/tokens/${created.id}`, 'dash.localhost', { ...COOKIE, ...variant }))).status).toBe(200)
      // No request to the revoking instance after it: the resend (0.5 to 1 s later) is its timer's
      // (awaited without a deadline of its own: a loaded host runs it late).
      await vi.waitFor(async () => expect((await useOther()).status).toBe(401), { timeout: 10_000, interval: 250 })
      expect(JSON.parse((await call(request('GET', '/errors', 'control.localhost', variant))).body)).toEqual([expect.stringMatching(/^invalidation publish: /)])
    })
  }

  test('wrote nothing on stderr', () => {
    expect(served?.output() ?? '').toBe('')
  })
})
