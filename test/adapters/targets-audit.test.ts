/**
 * Request targets and headers at the edge, the same on every adapter and runtime: one table of
 * tricky targets (percent-escapes, dot segments, double slashes, queries, fragments, version
 * look-alikes, absolute-form and asterisk-form, a mount path, the metadata path's variants) and
 * headers (`Authorization` and `Mcp-Session-Id` twice or odd, `Host` odd or missing, long
 * fields), written as raw bytes over loopback to one dispatcher configuration served by:
 *
 * - the Express adapter (Express 5), at the host's root and mounted with `app.use('/mcp', …)`;
 * - the Fastify adapter, at the root and in an encapsulated context with `prefix: '/mcp'`;
 * - the Web adapter on `@hono/node-server`, with the `errorHandler` docs/adapters.md gives it;
 * - the Web adapter under Bun (`Bun.serve`) and Deno (`Deno.serve`), the binaries installed in
 *   test/runtimes (`npm ci --prefix test/runtimes`), importing the source tree (no build needed).
 *
 * Each answer is compared on what a client reads: status, the JSON-RPC error body (or the
 * handler's answer), `X-MCP-Version`, `X-MCP-Latest-Version`, `WWW-Authenticate` and `Allow`.
 * Where the Node adapters and the Web runtimes part by a documented decision (a Web runtime
 * resolves dot segments before the adapter sees the request; it refuses what it cannot make a
 * `Request` of), the case says which answer each gets; everything else must be identical, and
 * never a 5xx.
 */
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import * as http from 'node:http'
import { type AddressInfo, connect } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { getRequestListener } from '@hono/node-server'
import express from 'express'
import Fastify from 'fastify'
import * as lib from 'mcp-dispatch'
import { mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { frameworkErrors, mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import * as web from 'mcp-dispatch/web'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { underProjectCI } from '../helpers/ci.js'
import { spawnServing } from '../helpers/serving-process.js'

const SRC = fileURLToPath(new URL('../../src/', import.meta.url))
const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const installed = (path: string) => fileURLToPath(new URL(`../runtimes/node_modules/${path}`, import.meta.url))
const BUN = installed('.bin/bun')
const DENO = installed('@deno/linux-x64-glibc/deno')

/**
 * The one dispatcher configuration every server runs: weather with 1.0.0, 1.2.0, 2.0.0 and the
 * pre-release 2.1.0-rc.1 live; alice subscribed, her API token `secret` scoped to it. `root`
 * serves the host's root, `mounted` the same under `basePath: '/mcp'`. Plain JavaScript, passed
 * as source to Bun and Deno, so every runtime builds the very same thing.
 */
function createTargetsDispatchers(dispatch: typeof lib, secret: string) {
  const apps = dispatch.createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.2.0', '2.0.0', '2.1.0-rc.1'] }])
  const subscriptions = dispatch.createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
  const store = dispatch.createMemoryTokenStore()
  const now = Date.now()
  store.insert({
    id: '00000000-0000-4000-8000-000000000001',
    userId: 'alice',
    name: 'targets',
    tokenHash: dispatch.hashApiToken(secret),
    displayPrefix: dispatch.displayPrefix(secret),
    servers: ['app_weather'],
    allowedIps: null,
    expiresAt: now + 86_400_000,
    createdAt: now,
    lastUsedAt: null,
    revokedAt: null,
  })
  const tokens = dispatch.createTokenService({ store, apps, subscriptions })
  const options = { apps, subscriptions, tokens, authorizationServers: ['https://auth.example.test'] }
  return { root: dispatch.createDispatcher(options), mounted: dispatch.createDispatcher({ ...options, basePath: '/mcp' }) }
}

/** The App's answer on every server: the version it was handed. */
const served = (version: string) => JSON.stringify({ served: version })

// ---------------------------------------------------------------------------------------
// The servers.
// ---------------------------------------------------------------------------------------

type ServerName = 'express' | 'fastify' | 'hono' | 'bun' | 'deno'

interface Running {
  port: number
  stop(): Promise<void>
}

const SECRET = lib.generateApiToken()
/** What the adapters reported to `onError` (nothing, in these cases). */
const reported: string[] = []
const onError = (error: unknown, context: string) => void reported.push(`${context}: ${String(error)}`)

function listen(server: http.Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port)))
}
function stopServer(server: http.Server): Promise<void> {
  return new Promise((resolve) => {
    server.closeAllConnections()
    server.close(() => resolve())
  })
}

async function startExpress(): Promise<Running> {
  const { root, mounted } = createTargetsDispatchers(lib, SECRET)
  const app = express()
  app.disable('x-powered-by')
  const answer = (req: express.Request, res: express.Response) => {
    res.writeHead(200, { 'content-type': 'application/json' }).end(served(req.dispatchContext!.version))
  }
  app.use('/mcp', expressDispatch({ dispatcher: mounted, onError }), answer)
  app.use(expressDispatch({ dispatcher: root, onError }), answer)
  const server = http.createServer(app)
  return { port: await listen(server), stop: () => stopServer(server) }
}

async function startFastify(): Promise<Running> {
  const { root, mounted } = createTargetsDispatchers(lib, SECRET)
  const app = Fastify({ frameworkErrors, forceCloseConnections: true })
  const answer = async (request: { dispatchContext?: lib.DispatchContext }, reply: { header(n: string, v: string): unknown; send(b: Buffer): unknown }) => {
    reply.header('content-type', 'application/json')
    return reply.send(Buffer.from(served(request.dispatchContext!.version)))
  }
  // As docs/adapters.md wires them: each in an encapsulated context, the mounted one with its prefix.
  await app.register(async (scope) => {
    await scope.register(fastifyDispatch({ dispatcher: root, onError }))
    scope.all('/*', answer)
  })
  await app.register(
    async (scope) => {
      await scope.register(fastifyDispatch({ dispatcher: mounted, onError }))
      scope.all('/', answer)
      scope.all('/*', answer)
    },
    { prefix: '/mcp' },
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { port: (app.server.address() as AddressInfo).port, stop: () => app.close() }
}

/** The Web side of every runtime: `/mcp` and under to the mounted dispatcher, the rest to the root. */
function webServe(dispatch: typeof lib, adapter: typeof web, secret: string) {
  const { root, mounted } = createTargetsDispatchers(dispatch, secret)
  const handler = (_request: Request, context: lib.DispatchContext) =>
    new Response(JSON.stringify({ served: context.version }), { headers: { 'content-type': 'application/json' } })
  const atRoot = adapter.mcpDispatch({ dispatcher: root, handler })
  const underMount = adapter.mcpDispatch({ dispatcher: mounted, handler })
  return (request: Request, clientAddress: string | undefined) => {
    // Not `new URL(request.url)`: Deno hands on a URL of whatever `Host` came (`a b`), Bun a path alone without one.
    const path = /^(?:[a-z]+:\/\/[^/?#]*)?([^?#]*)/i.exec(request.url)![1]!
    return (path === '/mcp' || path.startsWith('/mcp/') ? underMount : atRoot)(request, { clientAddress })
  }
}

async function startHono(): Promise<Running> {
  const serve = webServe(lib, web, SECRET)
  // The Web adapter's errorHandler, for what @hono/node-server cannot make a Request of.
  const listener = getRequestListener((request, env: { incoming?: { socket?: { remoteAddress?: string } } }) => serve(request, env.incoming?.socket?.remoteAddress), {
    errorHandler: web.nodeServerErrorHandler,
  })
  const server = http.createServer(listener)
  return { port: await listen(server), stop: () => stopServer(server) }
}

/** Bun or Deno running the same Web side, from the source tree; it prints `{ port }` once it listens. */
async function startRuntime(name: 'bun' | 'deno', dir: string): Promise<Running> {
  const script = join(dir, `${name}-server.ts`)
  writeFileSync(
    script,
    `const dispatch = await import(${JSON.stringify(`${SRC}index.ts`)})
const adapter = await import(${JSON.stringify(`${SRC}adapters/web/index.ts`)})
const createTargetsDispatchers = ${createTargetsDispatchers.toString()}
const webServe = ${webServe.toString()}
const serve = webServe(dispatch, adapter, ${JSON.stringify(SECRET)})
const announce = (port) => console.log(JSON.stringify({ port }))
if (globalThis.Bun) announce(Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: (request, server) => serve(request, server.requestIP(request)?.address) }).port)
else Deno.serve({ port: 0, hostname: '127.0.0.1', onListen: ({ port }) => announce(port) }, (request, info) => serve(request, info.remoteAddr.hostname))
`,
  )
  const args = name === 'bun' ? ['run', script] : ['run', '--sloppy-imports', '--node-modules-dir=manual', '--allow-net', '--allow-read', '--allow-env', script]
  const served = await spawnServing(name === 'bun' ? BUN : DENO, args, ROOT)
  runtimeOutput.set(name, served.output)
  return { port: served.port, stop: served.stop }
}
const runtimeOutput = new Map<string, () => string>()

// ---------------------------------------------------------------------------------------
// A raw HTTP/1.1 client: the bytes as given, one request per connection.
// ---------------------------------------------------------------------------------------

/** What a client reads of an answer. */
interface Seen {
  status: number
  /** The JSON body, or the text when it is none, or `''`. */
  body: unknown
  version?: string
  latest?: string
  challenge?: string
  allow?: string
}

function parse(raw: Buffer, head: boolean): Seen | undefined {
  const end = raw.indexOf('\r\n\r\n')
  if (end === -1) return undefined
  const lines = raw.subarray(0, end).toString('latin1').split('\r\n')
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0]!)?.[1])
  if (!status) return undefined
  const headers: Record<string, string> = {}
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(':')
    headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim()
  }
  let body = raw.subarray(end + 4)
  if (head || status === 204 || status === 304) body = Buffer.alloc(0)
  else if (headers['transfer-encoding']?.includes('chunked')) {
    const parts: Buffer[] = []
    let at = 0
    for (;;) {
      const lineEnd = body.indexOf('\r\n', at)
      if (lineEnd === -1) return undefined
      const size = parseInt(body.subarray(at, lineEnd).toString('latin1'), 16)
      if (size === 0) break
      if (lineEnd + 2 + size > body.length) return undefined
      parts.push(body.subarray(lineEnd + 2, lineEnd + 2 + size))
      at = lineEnd + 2 + size + 2
    }
    body = Buffer.concat(parts)
  } else {
    const length = Number(headers['content-length'] ?? 0)
    if (body.length < length) return undefined
    body = body.subarray(0, length)
  }
  const text = body.toString('utf8')
  let parsed: unknown = text
  try {
    parsed = JSON.parse(text)
  } catch {
    // Not JSON (a runtime's own answer, or none): compared as text.
  }
  return {
    status,
    body: parsed,
    ...(headers['x-mcp-version'] !== undefined && { version: headers['x-mcp-version'] }),
    ...(headers['x-mcp-latest-version'] !== undefined && { latest: headers['x-mcp-latest-version'] }),
    ...(headers['www-authenticate'] !== undefined && { challenge: headers['www-authenticate'] }),
    ...(headers.allow !== undefined && { allow: headers.allow }),
  }
}

/** Sends `bytes` on a new connection; the first complete answer (or `status: 0` when none came in 5 s). */
function send(port: number, bytes: string, head = false): Promise<Seen> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1')
    const chunks: Buffer[] = []
    let done = false
    const finish = (seen: Seen | undefined) => {
      if (done) return
      done = true
      clearTimeout(timer)
      socket.destroy()
      resolve(seen ?? { status: 0, body: Buffer.concat(chunks).toString('latin1') })
    }
    const timer = setTimeout(() => finish(undefined), 5_000)
    socket.on('error', () => finish(parse(Buffer.concat(chunks), head)))
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk)
      const seen = parse(Buffer.concat(chunks), head)
      if (seen) finish(seen)
    })
    socket.on('close', () => finish(parse(Buffer.concat(chunks), head)))
    socket.on('connect', () => socket.write(bytes))
  })
}

// ---------------------------------------------------------------------------------------
// The cases.
// ---------------------------------------------------------------------------------------

const HOST = 'weather.localhost'
const ORIGIN = `http://${HOST}`
const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })

/** Every answer a case may expect, as a client reads it. */
const LATEST = '2.0.0'
const SERVED = (version: string): Seen => ({ status: 200, body: { served: version }, version, latest: LATEST })
const rpcError = (status: number, code: number, message: string, data: object): Seen => ({ status, body: { jsonrpc: '2.0', id: null, error: { code, message, data } } })
const NOT_FOUND = rpcError(404, -32004, 'Not found', { error: 'not_found' })
const VERSION_NOT_FOUND = (requested: string) => rpcError(404, -32004, 'Version not found', { error: 'version_not_found', requested, latest: LATEST })
const SESSION_NOT_FOUND = rpcError(404, -32004, 'Session not found', { error: 'session_not_found' })
const INVALID_HOST = rpcError(400, -32600, 'Invalid Host header', { error: 'invalid_request', field: 'host' })
const CHALLENGE = (invalidToken: boolean, origin = ORIGIN): Seen => ({
  ...rpcError(401, -32001, 'Unauthorized', {
    error: 'unauthorized',
    description: invalidToken ? 'Authentication required: the bearer token is invalid, expired or revoked' : 'Authentication required: send Authorization: Bearer <token>',
  }),
  challenge: `Bearer resource_metadata="${origin}/.well-known/oauth-protected-resource"${invalidToken ? ', error="invalid_token"' : ''}`,
})
const METADATA = (resource: string): Seen => ({
  status: 200,
  body: { resource, authorization_servers: ['https://auth.example.test'], bearer_methods_supported: ['header'], scopes_supported: ['openid', 'profile', 'email'], resource_name: 'Weather' },
})
/** A runtime's own 400, before any handler: its body is the runtime's (Node's parser: none; Fastify's: its JSON). */
const RUNTIME_400: Seen = { status: 400, body: expect.anything() as unknown }

interface Case {
  name: string
  method?: string
  target: string
  /** `Host`; `null` for none. Default {@link HOST}. */
  host?: string | null
  /** `Authorization` fields; default one, `Bearer <alice's token>`. */
  authorization?: string[]
  fields?: Array<[string, string]>
  version?: '1.0' | '1.1'
  /** The answer on every server. */
  expect: Seen
  /** Where a server answers otherwise, by a documented difference of its runtime (docs/adapters.md). */
  except?: Partial<Record<ServerName, Seen>>
}

function bytesOf(c: Case): string {
  const method = c.method ?? 'POST'
  const lines = [`${method} ${c.target} HTTP/${c.version ?? '1.1'}`]
  const host = c.host === undefined ? HOST : c.host
  if (host !== null) lines.push(`Host: ${host}`)
  for (const value of c.authorization ?? [`Bearer ${SECRET}`]) lines.push(`Authorization: ${value}`)
  for (const [name, value] of c.fields ?? []) lines.push(`${name}: ${value}`)
  lines.push('Connection: close')
  const body = method === 'POST' ? TOOLS_LIST : ''
  if (method === 'POST') lines.push('Content-Type: application/json', 'Accept: application/json, text/event-stream', `Content-Length: ${body.length}`)
  return `${lines.join('\r\n')}\r\n\r\n${body}`
}

/** Web runtimes that resolve dot segments before the adapter sees the request (Deno hands the target on as sent). */
const resolvesDots = (seen: Seen): Partial<Record<ServerName, Seen>> => ({ hono: seen, bun: seen })

const CASES: Case[] = [
  // Version paths and their spellings (docs/versions.md).
  { name: '/', target: '/', expect: SERVED('2.0.0') },
  { name: '/v1', target: '/v1', expect: SERVED('1.2.0') },
  { name: '/%76%31: unreserved escapes are the characters', target: '/%76%31', expect: SERVED('1.2.0') },
  { name: '/v1%2E2 and /v1%2e2', target: '/v1%2E2', expect: SERVED('1.2.0') },
  { name: '/v1%2e2/', target: '/v1%2e2/', expect: SERVED('1.2.0') },
  { name: '/v1%2F: an escaped slash is no version path', target: '/v1%2F', expect: NOT_FOUND },
  { name: '/v1%2f', target: '/v1%2f', expect: NOT_FOUND },
  { name: '/v1/ (trailing slash tolerated)', target: '/v1/', expect: SERVED('1.2.0') },
  { name: '/v1.2/', target: '/v1.2/', expect: SERVED('1.2.0') },
  { name: '/v1.2.0/', target: '/v1.2.0/', expect: SERVED('1.2.0') },
  { name: '//v1', target: '//v1', expect: NOT_FOUND },
  { name: '/v1//', target: '/v1//', expect: NOT_FOUND },
  { name: '//', target: '//', expect: NOT_FOUND },
  { name: '/v1?x=1', target: '/v1?x=1', expect: SERVED('1.2.0') },
  { name: '/?v=2: a query never selects a version', target: '/?v=2', expect: SERVED('2.0.0') },
  { name: '/v1?/v2', target: '/v1?/v2', expect: SERVED('1.2.0') },
  { name: '/v1#frag', target: '/v1#frag', expect: SERVED('1.2.0') },
  { name: '/v1?x#y', target: '/v1?x#y', expect: SERVED('1.2.0') },
  { name: '/v1.2.3.4', target: '/v1.2.3.4', expect: NOT_FOUND },
  { name: '/v01 (leading zero)', target: '/v01', expect: NOT_FOUND },
  { name: '/v1.02', target: '/v1.02', expect: NOT_FOUND },
  { name: '/v1.2.00', target: '/v1.2.00', expect: NOT_FOUND },
  { name: '/v-1', target: '/v-1', expect: NOT_FOUND },
  { name: '/V1 (upper case)', target: '/V1', expect: NOT_FOUND },
  { name: '/v', target: '/v', expect: NOT_FOUND },
  { name: '/v1.', target: '/v1.', expect: NOT_FOUND },
  { name: '/v1.x', target: '/v1.x', expect: NOT_FOUND },
  { name: '/v 1 escaped', target: '/v%201', expect: NOT_FOUND },
  { name: '/v99999999999999999999 (past 2^53)', target: '/v99999999999999999999', expect: NOT_FOUND },
  { name: '/v9007199254740991 (2^53 - 1)', target: '/v9007199254740991', expect: VERSION_NOT_FOUND('9007199254740991') },
  { name: '/v9007199254740992 (2^53)', target: '/v9007199254740992', expect: NOT_FOUND },
  { name: '/v1.9007199254740992', target: '/v1.9007199254740992', expect: NOT_FOUND },
  { name: '/v3 (no live version)', target: '/v3', expect: VERSION_NOT_FOUND('3') },
  { name: '/v1.2.3-beta.1 (a pre-release, not live)', target: '/v1.2.3-beta.1', expect: VERSION_NOT_FOUND('1.2.3-beta.1') },
  { name: '/v2.1.0-rc.1 (a live pre-release, by its exact URL)', target: '/v2.1.0-rc.1', expect: { ...SERVED('2.1.0-rc.1'), latest: LATEST } },
  { name: '/v2.1 never picks the pre-release', target: '/v2.1', expect: VERSION_NOT_FOUND('2.1') },
  { name: '/v1.2.0-01 (a numeric pre-release with a leading zero)', target: '/v1.2.0-01', expect: NOT_FOUND },
  { name: '/v1.2.3+build (build metadata)', target: '/v1.2.3+build', expect: NOT_FOUND },
  { name: '/v1.2.0+build (build metadata of a live version)', target: '/v1.2.0+build', expect: NOT_FOUND },
  { name: '/v1.2.0%2Bbuild', target: '/v1.2.0%2Bbuild', expect: NOT_FOUND },
  { name: 'an Arabic-Indic digit, escaped (/v%D9%A1)', target: '/v%D9%A1', expect: NOT_FOUND },
  { name: 'a fullwidth digit, escaped (/v%EF%BC%91)', target: '/v%EF%BC%91', expect: NOT_FOUND },
  {
    name: 'an Arabic-Indic digit, raw UTF-8: Node\'s parser refuses it (docs/adapters.md, answerClientError)',
    target: '/v\u0661',
    expect: NOT_FOUND,
    except: { express: RUNTIME_400, fastify: RUNTIME_400, hono: RUNTIME_400 },
  },
  { name: `/v1/${'a'.repeat(300)}`, target: `/v1/${'a'.repeat(300)}`, expect: NOT_FOUND },
  // Dot segments: resolved where the runtime resolves them (@hono/node-server, Bun), never served raw elsewhere.
  { name: '/v1/../v2', target: '/v1/../v2', expect: NOT_FOUND, except: resolvesDots(SERVED('2.0.0')) },
  { name: '/./v1', target: '/./v1', expect: NOT_FOUND, except: resolvesDots(SERVED('1.2.0')) },
  { name: '/v2/%2E%2E/v1', target: '/v2/%2E%2E/v1', expect: NOT_FOUND, except: resolvesDots(SERVED('1.2.0')) },
  { name: '/v3/../v1', target: '/v3/../v1', expect: NOT_FOUND, except: resolvesDots(SERVED('1.2.0')) },
  // Absolute-form and asterisk-form targets.
  { name: 'absolute-form: the target\'s host, not the Host field (Bun builds the URL of the Host field)', target: `${ORIGIN}/v1`, host: 'other.localhost', expect: SERVED('1.2.0'), except: { bun: NOT_FOUND } },
  { name: 'absolute-form naming the same host', target: `${ORIGIN}/v1?x=1`, expect: SERVED('1.2.0') },
  {
    name: 'absolute-form https: the target\'s scheme in the App address (Bun takes the socket\'s)',
    target: `https://${HOST}/v3`,
    authorization: [],
    expect: CHALLENGE(false, `https://${HOST}`),
    except: { bun: CHALLENGE(false) },
  },
  { name: 'absolute-form without a path', target: ORIGIN, expect: SERVED('2.0.0') },
  { name: 'absolute-form with a query and no path', target: `${ORIGIN}?x=1`, expect: SERVED('2.0.0') },
  { name: 'absolute-form //v1', target: `${ORIGIN}//v1`, expect: NOT_FOUND },
  { name: 'absolute-form with dot segments', target: `${ORIGIN}/x/../v1`, expect: NOT_FOUND, except: resolvesDots(SERVED('1.2.0')) },
  {
    name: 'absolute-form HTTP:// (upper case): the App address in lower case (regression: Deno named HTTP://weather.localhost)',
    method: 'GET',
    target: `HTTP://${HOST}/.well-known/oauth-protected-resource`,
    authorization: [],
    expect: METADATA(ORIGIN),
    // @hono/node-server builds no Request of it (the errorHandler's 404).
    except: { hono: NOT_FOUND },
  },
  {
    name: 'absolute-form HTTP:// challenge (regression: Deno pointed resource_metadata at HTTP://…)',
    target: `HTTP://${HOST}/v1`,
    authorization: [],
    expect: CHALLENGE(false),
    except: { hono: NOT_FOUND },
  },
  {
    name: 'absolute-form ftp://: no path of an App (regression: Deno served it, resource ftp://weather.localhost)',
    method: 'GET',
    target: `ftp://${HOST}/.well-known/oauth-protected-resource`,
    authorization: [],
    expect: NOT_FOUND,
    except: { bun: RUNTIME_400 },
  },
  { name: 'absolute-form ftp:// to a version (regression: Deno served it)', target: `ftp://${HOST}/v1`, expect: NOT_FOUND, except: { bun: RUNTIME_400 } },
  { name: 'absolute-form ftp:// without a credential (regression: Deno challenged with ftp://…)', target: `ftp://${HOST}/v1`, authorization: [], expect: NOT_FOUND, except: { bun: RUNTIME_400 } },
  // The Node adapters take no host of such a target (the `Host` field is the host): one no URL holds is no 400 either.
  { name: 'absolute-form ftp:// with userinfo: 404 (regression: Deno answered 400 Invalid Host header)', target: `ftp://a@${HOST}/v1`, expect: NOT_FOUND, except: { bun: RUNTIME_400 } },
  { name: 'absolute-form ftp:// with a port past 65535: 404 (regression: Deno answered 400 Invalid Host header)', target: `ftp://${HOST}:99999/v1`, expect: NOT_FOUND, except: { bun: RUNTIME_400 } },
  { name: 'absolute-form ftp:// with an invalid Host field: 400', target: `ftp://${HOST}/v1`, host: 'a b', expect: INVALID_HOST, except: { bun: RUNTIME_400 } },
  {
    name: 'absolute-form with an invalid Host field: 400, RFC 9112 section 3.2 (regression: served on Express, Fastify, @hono/node-server and Deno)',
    target: `${ORIGIN}/v1`,
    host: 'a b',
    expect: INVALID_HOST,
  },
  { name: 'absolute-form with a Host field holding a path: 400', target: `${ORIGIN}/v1`, host: `${HOST}/x`, expect: INVALID_HOST },
  { name: 'absolute-form without a Host field (HTTP/1.1): Node\'s 400; Deno takes the target', target: `${ORIGIN}/v1`, host: null, expect: RUNTIME_400, except: { deno: SERVED('1.2.0') } },
  { name: 'asterisk-form POST *', target: '*', expect: NOT_FOUND, except: { bun: RUNTIME_400, deno: RUNTIME_400 } },
  { name: 'asterisk-form OPTIONS *', method: 'OPTIONS', target: '*', authorization: [], expect: NOT_FOUND, except: { bun: RUNTIME_400 } },
  // The mount: app.use('/mcp', …), a Fastify context with prefix '/mcp', basePath '/mcp'.
  { name: '/mcp', target: '/mcp', expect: SERVED('2.0.0') },
  { name: '/mcp/', target: '/mcp/', expect: SERVED('2.0.0') },
  { name: '/mcp/v1', target: '/mcp/v1', expect: SERVED('1.2.0') },
  { name: '/mcp/v1.2/', target: '/mcp/v1.2/', expect: SERVED('1.2.0') },
  { name: '/mcp/v1?x=1', target: '/mcp/v1?x=1', expect: SERVED('1.2.0') },
  { name: '/mcp/%76%31', target: '/mcp/%76%31', expect: SERVED('1.2.0') },
  { name: '/mcp/v3', target: '/mcp/v3', expect: VERSION_NOT_FOUND('3') },
  { name: '/mcp/v01', target: '/mcp/v01', expect: NOT_FOUND },
  { name: '/MCP/v1 (Express mounts without case; basePath is exact)', target: '/MCP/v1', expect: NOT_FOUND },
  { name: '/%6Dcp/v1 (an escaped mount is no mount)', target: '/%6Dcp/v1', expect: NOT_FOUND },
  { name: '/mcp%2Fv1', target: '/mcp%2Fv1', expect: NOT_FOUND },
  { name: '/mcpx/v1', target: '/mcpx/v1', expect: NOT_FOUND },
  { name: '//mcp/v1', target: '//mcp/v1', expect: NOT_FOUND },
  { name: '/mcp//v1', target: '/mcp//v1', expect: NOT_FOUND },
  { name: '/mcp/../v1', target: '/mcp/../v1', expect: NOT_FOUND, except: resolvesDots(SERVED('1.2.0')) },
  { name: '/mcp/v1 without a credential: the challenge names the mounted document', target: '/mcp/v1', authorization: [], expect: CHALLENGE(false, `${ORIGIN}/mcp`) },
  // The metadata document: its exact path only (docs/pipeline.md, CORS).
  { name: 'metadata', method: 'GET', target: '/.well-known/oauth-protected-resource', authorization: [], expect: METADATA(ORIGIN) },
  { name: 'metadata with a query', method: 'GET', target: '/.well-known/oauth-protected-resource?resource=x', authorization: [], expect: METADATA(ORIGIN) },
  { name: 'metadata with a fragment', method: 'GET', target: '/.well-known/oauth-protected-resource#x', authorization: [], expect: METADATA(ORIGIN) },
  { name: 'metadata, a Bearer token that is no token', method: 'GET', target: '/.well-known/oauth-protected-resource', authorization: ['Bearer nope'], expect: METADATA(ORIGIN) },
  { name: 'metadata/ (trailing slash)', method: 'GET', target: '/.well-known/oauth-protected-resource/', authorization: [], expect: NOT_FOUND },
  { name: 'metadata/v1 (no path-suffixed document)', method: 'GET', target: '/.well-known/oauth-protected-resource/v1', authorization: [], expect: NOT_FOUND },
  { name: 'metadata//', method: 'GET', target: '/.well-known//oauth-protected-resource', authorization: [], expect: NOT_FOUND },
  { name: 'metadata escaped (%2E)', method: 'GET', target: '/%2Ewell-known/oauth-protected-resource', authorization: [], expect: NOT_FOUND },
  { name: 'metadata HEAD', method: 'HEAD', target: '/.well-known/oauth-protected-resource', authorization: [], expect: { status: 200, body: '' } },
  { name: 'metadata POST', method: 'POST', target: '/.well-known/oauth-protected-resource', authorization: [], expect: { ...rpcError(405, -32000, 'Method not allowed', { error: 'method_not_allowed' }), allow: 'GET, HEAD, OPTIONS' } },
  { name: 'mounted metadata', method: 'GET', target: '/mcp/.well-known/oauth-protected-resource', authorization: [], expect: METADATA(`${ORIGIN}/mcp`) },
  { name: 'mounted metadata/', method: 'GET', target: '/mcp/.well-known/oauth-protected-resource/', authorization: [], expect: NOT_FOUND },
  { name: 'mounted metadata with a query', method: 'GET', target: '/mcp/.well-known/oauth-protected-resource?x', authorization: [], expect: METADATA(`${ORIGIN}/mcp`) },
  { name: 'mounted metadata HEAD', method: 'HEAD', target: '/mcp/.well-known/oauth-protected-resource', authorization: [], expect: { status: 200, body: '' } },
  { name: 'RFC 9728 path-inserted metadata of the mounted resource: none (docs/oauth.md)', method: 'GET', target: '/.well-known/oauth-protected-resource/mcp', authorization: [], expect: NOT_FOUND },
  // Authorization.
  { name: 'no Authorization', target: '/v1', authorization: [], expect: CHALLENGE(false) },
  { name: 'two Authorization fields, equal', target: '/v1', authorization: [`Bearer ${SECRET}`, `Bearer ${SECRET}`], expect: CHALLENGE(true) },
  { name: 'two Authorization fields, one empty', target: '/v1', authorization: [`Bearer ${SECRET}`, ''], expect: CHALLENGE(true) },
  { name: 'two Authorization fields, Basic first', target: '/v1', authorization: ['Basic dXNlcjpwYXNz', `Bearer ${SECRET}`], expect: CHALLENGE(true) },
  { name: 'bearer in lower case', target: '/v1', authorization: [`bearer ${SECRET}`], expect: SERVED('1.2.0') },
  { name: 'BEARER in upper case', target: '/v1', authorization: [`BEARER ${SECRET}`], expect: SERVED('1.2.0') },
  { name: 'several spaces after the scheme', target: '/v1', authorization: [`Bearer    ${SECRET}`], expect: SERVED('1.2.0') },
  { name: 'a tab after the scheme', target: '/v1', authorization: [`Bearer\t${SECRET}`], expect: CHALLENGE(true) },
  { name: 'a tab before the scheme (field whitespace)', target: '/v1', authorization: [`\tBearer ${SECRET}`], expect: SERVED('1.2.0') },
  { name: 'a tab after the token (field whitespace)', target: '/v1', authorization: [`Bearer ${SECRET}\t`], expect: SERVED('1.2.0') },
  { name: 'an empty Authorization', target: '/v1', authorization: [''], expect: CHALLENGE(false) },
  { name: 'Bearer alone', target: '/v1', authorization: ['Bearer'], expect: CHALLENGE(true) },
  { name: 'Basic', target: '/v1', authorization: ['Basic dXNlcjpwYXNz'], expect: CHALLENGE(false) },
  { name: 'a list of two tokens', target: '/v1', authorization: [`Bearer ${SECRET}, Bearer ${SECRET}`], expect: CHALLENGE(true) },
  { name: 'a 12 kB token', target: '/v1', authorization: [`Bearer ${'a'.repeat(12_000)}`], expect: CHALLENGE(true) },
  // Mcp-Session-Id.
  { name: 'two Mcp-Session-Id fields, equal', target: '/v1', fields: [['Mcp-Session-Id', 'abc'], ['Mcp-Session-Id', 'abc']], expect: SESSION_NOT_FOUND },
  { name: 'two Mcp-Session-Id fields, without a credential: the challenge first', target: '/v1', authorization: [], fields: [['Mcp-Session-Id', 'abc'], ['Mcp-Session-Id', 'def']], expect: CHALLENGE(false) },
  { name: 'an Mcp-Session-Id list', target: '/v1', fields: [['Mcp-Session-Id', 'a, b']], expect: SESSION_NOT_FOUND },
  { name: 'an empty Mcp-Session-Id', target: '/v1', fields: [['Mcp-Session-Id', '']], expect: SESSION_NOT_FOUND },
  // Host.
  { name: 'Host with a port', target: '/v1', host: `${HOST}:8080`, authorization: [], expect: CHALLENGE(false, `${ORIGIN}:8080`) },
  { name: 'Host with the default port', target: '/v1', host: `${HOST}:80`, authorization: [], expect: CHALLENGE(false) },
  { name: 'Host in upper case: the App address in lower case (regression: Deno named http://WEATHER.LOCALHOST)', target: '/v1', host: HOST.toUpperCase(), authorization: [], expect: CHALLENGE(false) },
  { name: 'Host in upper case with the default port', target: '/v1', host: `${HOST.toUpperCase()}:80`, authorization: [], expect: CHALLENGE(false) },
  { name: 'Host with an empty port (regression: Bun served it)', target: '/v1', host: `${HOST}:`, expect: INVALID_HOST },
  { name: 'Host with an escape the parser decodes (regression: Bun served it)', target: '/v1', host: 'weath%65r.localhost', expect: INVALID_HOST },
  { name: 'Host the parser rewrites to an IP (regression: Bun answered 404)', target: '/v1', host: '0x7f.1', expect: INVALID_HOST },
  { name: 'Host with a path (regression: Deno answered the 404 of its path)', target: '/v1', host: `${HOST}/x`, expect: INVALID_HOST },
  { name: 'Host with a path making a version path (regression: Deno served it at /v1)', target: '/', host: `${HOST}/v1`, expect: INVALID_HOST },
  { name: 'Host with userinfo', target: '/v1', host: `a@${HOST}`, expect: INVALID_HOST },
  { name: 'Host with a space', target: '/v1', host: `${HOST} x`, expect: INVALID_HOST },
  { name: 'Host with a port past 65535', target: '/v1', host: `${HOST}:99999`, expect: INVALID_HOST },
  { name: 'Host list', target: '/v1', host: `${HOST},other.localhost`, expect: INVALID_HOST },
  { name: 'two Host fields', target: '/v1', fields: [['Host', 'other.localhost']], expect: INVALID_HOST, except: { deno: RUNTIME_400 } },
  { name: 'Host with a trailing dot: no App', target: '/v1', host: `${HOST}.`, expect: NOT_FOUND },
  { name: 'Host of 300 characters: no App', target: '/v1', host: `${'a'.repeat(300)}.localhost`, expect: NOT_FOUND },
  { name: 'empty Host: no App (regression: Bun answered 400)', target: '/v1', host: '', expect: NOT_FOUND },
  { name: 'HTTP/1.0 without Host: no App (regression: Bun answered 400)', target: '/v1', host: null, version: '1.0', expect: NOT_FOUND },
  // Bun's URL without a host is the path alone: a `://` in it names no App (regression: Bun served `/x://weather.localhost/v1` as `/v1` of weather).
  { name: 'a path holding ://, empty Host (regression: Bun served it)', target: `/x://${HOST}/v1`, host: '', expect: NOT_FOUND },
  {
    name: 'the metadata under a path holding ://, HTTP/1.0 without Host (regression: Bun answered it, resource /x://weather.localhost)',
    method: 'GET',
    target: `/x://${HOST}/.well-known/oauth-protected-resource`,
    host: null,
    version: '1.0',
    authorization: [],
    expect: NOT_FOUND,
  },
  { name: 'HTTP/1.1 without Host: Node\'s 400; Deno takes its own address, no App', target: '/v1', host: null, expect: RUNTIME_400, except: { deno: NOT_FOUND } },
  // Long fields and targets, under Node's 16 KiB head.
  { name: 'a 15 kB field', target: '/v1', fields: [['X-Long', 'a'.repeat(15_000)]], expect: SERVED('1.2.0') },
  { name: 'a 15 kB query', target: `/v1?${'a'.repeat(15_000)}`, expect: SERVED('1.2.0') },
]

/** What a server answered to the case, as `{ server: Seen }`. */
async function askAll(c: Case): Promise<Record<ServerName, Seen>> {
  const entries = await Promise.all([...servers].map(async ([name, server]) => [name, await send(server.port, bytesOf(c), c.method === 'HEAD')] as const))
  return Object.fromEntries(entries) as Record<ServerName, Seen>
}

const servers = new Map<ServerName, Running>()
let dir: string | undefined

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'targets-audit-'))
  const runtimes = (['bun', 'deno'] as const).filter((name) => {
    if (existsSync(name === 'bun' ? BUN : DENO)) return true
    const message = `[targets-audit] ${name} missing (npm ci --prefix test/runtimes)`
    if (underProjectCI()) throw new Error(`${message}: under .ci/run (MCP_DISPATCH_CI) this suite fails instead of skipping`)
    console.warn(`${message}; its column skipped`)
    return false
  })
  const started = await Promise.all([startExpress(), startFastify(), startHono(), ...runtimes.map((name) => startRuntime(name, dir!))])
  for (const [i, name] of (['express', 'fastify', 'hono', ...runtimes] as const).entries()) servers.set(name, started[i]!)
}, 30_000)

afterAll(async () => {
  for (const server of servers.values()) await server.stop()
  if (dir) rmSync(dir, { recursive: true, force: true })
})

describe('request targets and headers: the same answer on Express, Fastify, and the Web adapter on @hono/node-server, Bun and Deno', () => {
  it.each(CASES.map((c) => [c.name, c] as const))('%s', async (_name, c) => {
    const all = await askAll(c)
    for (const [name, seen] of Object.entries(all) as Array<[ServerName, Seen]>) {
      expect(seen, name).toEqual(c.except?.[name] ?? c.expect)
      expect(seen.status, name).toBeLessThan(500)
    }
  })

  it('reported nothing, and the runtimes wrote nothing on stderr', () => {
    expect(reported).toEqual([])
    for (const [name, output] of runtimeOutput) expect(output(), name).toBe('')
  })
})

/**
 * The Web adapter given `request.url` as Deno and Bun hand it on (Node's `Request` normalizes
 * it before any adapter could see it): runs wherever the suite runs, with or without those runtimes.
 */
describe('the Web adapter reads a URL as the runtimes hand it on', () => {
  const { root } = createTargetsDispatchers(lib, SECRET)
  const handle = web.mcpDispatch({ dispatcher: root, onError, handler: (_request, context) => Response.json({ served: context.version }) })
  /** A request as a runtime builds it: its `url` unparsed. */
  const asHandedOn = (url: string, headers: Record<string, string> = {}) =>
    ({ url, method: 'GET', headers: new Headers(headers), bodyUsed: false, body: null }) as unknown as Request
  const metadata = '/.well-known/oauth-protected-resource'

  it('a scheme other than http(s) is no App address: 404 not_found (regression: Deno served ftp://…)', async () => {
    // The URL's authority is none of the App's: one no URL holds is no 400 (regression: Deno answered 400 to ftp://a@…).
    for (const url of [`ftp://${HOST}${metadata}`, `ws://${HOST}${metadata}`, `file://${HOST}${metadata}`, `ftp://a@${HOST}${metadata}`, `ftp://${HOST}:99999${metadata}`, `file://${metadata}`]) {
      const response = await handle(asHandedOn(url, { host: HOST }))
      expect(response.status, url).toBe(404)
      expect(await response.json(), url).toEqual(NOT_FOUND.body)
    }
    // The `Host` field is the host there, as on the Node adapters: one with an invalid value is 400.
    for (const field of ['a b', `${HOST}/v1`, `a@${HOST}`]) {
      const refused = await handle(asHandedOn(`ftp://${HOST}${metadata}`, { host: field }))
      expect(refused.status, field).toBe(400)
      expect(await refused.json(), field).toEqual(INVALID_HOST.body)
    }
  })

  it('the scheme in any case names the App address in lower case (regression: resource HTTP://…)', async () => {
    for (const url of [`HTTP://${HOST}${metadata}`, `Https://${HOST}${metadata}`]) {
      const response = await handle(asHandedOn(url, { host: HOST }))
      expect(((await response.json()) as { resource: string }).resource, url).toBe(`${url.slice(0, url.indexOf(':')).toLowerCase()}://${HOST}`)
    }
  })

  it('a Host field no URL holds is 400 beside the host the URL names (regression: Deno answered the path the field held, Bun served what its parser made of it)', async () => {
    for (const field of [`${HOST}/v1`, `${HOST}:`, 'weath%65r.localhost', '0x7f.1', 'a b', `${HOST}, other.localhost`]) {
      const response = await handle(asHandedOn(`${ORIGIN}${metadata}`, { host: field }))
      expect(response.status, field).toBe(400)
      expect(await response.json(), field).toEqual(INVALID_HOST.body)
    }
    // Deno keeps the Host's case and a default port in the URL: the App address has neither (regression: WEATHER.LOCALHOST).
    for (const url of [`http://${HOST.toUpperCase()}${metadata}`, `http://${HOST.toUpperCase()}:80${metadata}`]) {
      const response = await handle(asHandedOn(url, { host: url.slice(7, url.indexOf('/', 7)) }))
      expect(((await response.json()) as { resource: string }).resource, url).toBe(ORIGIN)
    }
    // Another host that is one (an absolute-form target; Next.js's own address in the URL) is no conflict.
    expect((await handle(asHandedOn(`${ORIGIN}${metadata}`, { host: 'other.localhost:8080' }))).status).toBe(200)
  })

  it('a URL without a host (Bun\'s, when the Host is missing, empty or unparsable): 404 without a Host field, 400 with one (regression: 400 for all)', async () => {
    expect((await handle(asHandedOn(metadata))).status).toBe(404)
    expect((await handle(asHandedOn(metadata, { host: '' }))).status).toBe(404)
    const refused = await handle(asHandedOn(metadata, { host: `a@${HOST}` }))
    expect(refused.status).toBe(400)
    expect(await refused.json()).toEqual(INVALID_HOST.body)
  })
})
