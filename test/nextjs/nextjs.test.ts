/**
 * The Web adapter in a real Next.js app (App Router route handlers, `next build` then
 * `next start`): test/nextjs/app/[[...path]]/route.ts hands every request to the built package
 * (dist/, through tsconfig.json's `paths`) in front of the MCP SDK's web-standard transport
 * (lib/platform.ts), with the wiring docs/adapters.md ("Next.js") shows; `/control/*` lets the
 * test deploy, release a held tool and read what the App and the route handler saw.
 *
 * Next.js is installed in a package of its own (`npm ci --prefix test/nextjs`, which `.ci/run`
 * does), and the app imports dist/, so `npm run build` comes first. Without either, the suite
 * is skipped, saying so; under .ci/run (MCP_DISPATCH_CI=1) it fails. `next build` runs once, in `beforeAll` (about 25 s
 * from clean on 2 cores, 6 to 10 s with its cache in .next/), and typechecks the app against
 * dist/'s types under test/nextjs/tsconfig.json; the root tsconfig.json leaves app/ and lib/ to
 * it (their extensionless imports are the bundler's, not NodeNext's).
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { createGunzip } from 'node:zlib'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  forbiddenReply,
  invalidHostReply,
  ipNotAllowedReply,
  methodNotAllowedReply,
  notFoundReply,
  paymentRequiredReply,
  rateLimitedReply,
  unauthorizedReply,
  versionNotFoundReply,
} from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { underProjectCI } from '../helpers/ci.js'
import { awayFromMinuteEnd } from '../helpers/clock.js'
import { freePort } from '../helpers/free-port.js'
import { localhostFetch } from '../helpers/platform.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const APP = fileURLToPath(new URL('./', import.meta.url))
const NEXT = fileURLToPath(new URL('./node_modules/next/dist/bin/next', import.meta.url))

const missing = [
  ...(existsSync(NEXT) ? [] : ['Next.js (npm ci --prefix test/nextjs)']),
  ...(existsSync(`${ROOT}dist/adapters/web/index.js`) ? [] : ['dist/ (npm run build)']),
]
if (missing.length > 0) {
  const message = `[nextjs] ${missing.join(' and ')} missing`
  if (underProjectCI()) throw new Error(`${message}: under .ci/run (MCP_DISPATCH_CI) this suite fails instead of skipping`)
  console.warn(`${message}; suite skipped`)
}

interface Tokens {
  alice: string
  bob: string
  /** Allowlisted for 198.51.100.7, an address no client of this test has. */
  allowlisted: string
  /** Allowlisted for 127.0.0.1. */
  loopback: string
}
interface State {
  tokens: Tokens
  observed: { aborted: number; streams: number; streamsEnded: number }
  moduleEvaluations: number
  /** What Next.js gave the control route handler: its `request.url` and headers. */
  seen: { url: string; headers: Record<string, string> }
}

const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
const INITIALIZE = JSON.stringify({
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'nextjs-test', version: '1.0.0' } },
})

/** Runs `next <args>` in test/nextjs, in a process group of its own (build workers included). */
function next(args: string[]): ChildProcess {
  return spawn(process.execPath, [NEXT, ...args], {
    cwd: APP,
    detached: true,
    // vitest sets NODE_ENV=test, which Next.js would build and serve with.
    env: { ...process.env, NODE_ENV: 'production', NEXT_TELEMETRY_DISABLED: '1', NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
}

/** Stops a process group started by {@link next}, and waits for its leader. */
async function stop(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return
  const exited = new Promise((resolve) => child.once('exit', resolve))
  try {
    process.kill(-child.pid!, 'SIGKILL')
  } catch {
    child.kill('SIGKILL')
  }
  await exited
}

/** A raw HTTP/1.1 request to 127.0.0.1, with the `Host` and headers given; the head as it came. */
function rawRequest(
  port: number,
  options: { host?: string; method?: string; path: string; headers?: Record<string, string>; body?: string | Buffer },
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: '127.0.0.1',
        port,
        method: options.method ?? 'POST',
        path: options.path,
        headers: { ...(options.host !== undefined && { host: options.host }), ...options.headers },
        agent: false,
      },
      (response) => {
        let body = ''
        response.setEncoding('utf8')
        response.on('data', (chunk: string) => (body += chunk))
        response.on('end', () => resolve({ status: response.statusCode!, headers: response.headers, body }))
      },
    )
    request.on('error', reject)
    request.end(options.body)
  })
}

/**
 * A reverse proxy on 127.0.0.1, as nginx with `proxy_set_header Host $host` and
 * `X-Forwarded-For $proxy_add_x_forwarded_for`: passes the Host on and appends the peer's
 * address to `X-Forwarded-For`.
 */
async function startProxy(target: number): Promise<{ port: number; close(): Promise<void> }> {
  const server = http.createServer((incoming, outgoing) => {
    const forwardedFor = incoming.headers['x-forwarded-for']
    const headers = { ...incoming.headers, 'x-forwarded-for': `${forwardedFor ? `${String(forwardedFor)}, ` : ''}${incoming.socket.remoteAddress}` }
    const upstream = http.request({ host: '127.0.0.1', port: target, method: incoming.method, path: incoming.url, headers, agent: false }, (answer) => {
      outgoing.writeHead(answer.statusCode!, answer.headers)
      answer.pipe(outgoing)
    })
    upstream.on('error', () => outgoing.destroy())
    incoming.pipe(upstream)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        server.closeAllConnections()
      }),
  }
}

/** Resolves with the value, or with `'pending'` when it takes longer than `ms`. */
const within = <T>(promise: Promise<T>, ms: number): Promise<T | 'pending'> =>
  Promise.race([promise, new Promise<'pending'>((resolve) => setTimeout(() => resolve('pending'), ms))])

describe.skipIf(missing.length > 0)('the Web adapter in a Next.js app (next build, next start)', () => {
  let server: ChildProcess | undefined
  let port: number
  let tokens: Tokens
  let output = ''
  const app = (path: string, slug = 'weather') => `http://${slug}.localhost:${port}${path}`
  const state = async (): Promise<State> => (await fetch(`http://127.0.0.1:${port}/control/state`)).json() as Promise<State>
  const mcpHeaders = (token?: string, more: Record<string, string> = {}) => ({
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    ...(token !== undefined && { authorization: `Bearer ${token}` }),
    ...more,
  })
  const post = (url: string, token?: string, body = TOOLS_LIST) =>
    localhostFetch(url, { method: 'POST', headers: mcpHeaders(token), body })
  /** A session opened with raw requests: `initialize`, then `notifications/initialized`. */
  const openSession = async (path = '/v1') => {
    const opened = await post(app(path), tokens.alice, INITIALIZE)
    expect(opened.status).toBe(200)
    await opened.text()
    const sessionId = opened.headers.get('mcp-session-id')!
    const headers = mcpHeaders(tokens.alice, { 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' })
    const initialized = await localhostFetch(app(path), {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
    })
    expect(initialized.status).toBe(202)
    return headers
  }
  const callTool = (headers: Record<string, string>, name: string, init: RequestInit = {}, path = '/v1') =>
    localhostFetch(app(path), {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name, arguments: {} } }),
      ...init,
    })
  /** Reads `stream` until `text` has come, or fails after `ms`. */
  const readUntil = async (reader: ReadableStreamDefaultReader<Uint8Array>, text: string, ms = 10_000) => {
    let seen = ''
    const decoder = new TextDecoder()
    const deadline = Date.now() + ms
    while (!seen.includes(text)) {
      const chunk = await within(reader.read(), deadline - Date.now())
      if (chunk === 'pending' || chunk.done) throw new Error(`"${text}" did not come; read: ${seen}`)
      seen += decoder.decode(chunk.value, { stream: true })
    }
    return seen
  }
  const waitFor = async (check: (s: State) => boolean, what: string) => {
    for (let i = 0; i < 100; i++) {
      const s = await state()
      if (check(s)) return s
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    throw new Error(`${what}: ${JSON.stringify((await state()).observed)}`)
  }

  beforeAll(async () => {
    const started = Date.now()
    const build = next(['build'])
    let log = ''
    build.stdout!.on('data', (chunk: Buffer) => (log += chunk.toString()))
    build.stderr!.on('data', (chunk: Buffer) => (log += chunk.toString()))
    const code = await new Promise<number | null>((resolve) => build.once('exit', resolve))
    if (code !== 0) throw new Error(`next build failed (${code}):\n${log}`)
    console.info(`[nextjs] next build took ${((Date.now() - started) / 1000).toFixed(1)} s`)

    port = await freePort()
    server = next(['start', '--hostname', '127.0.0.1', '--port', String(port)])
    server.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()))
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`next start did not start within 20 s: ${output}`)), 20_000)
      server!.stdout!.on('data', (chunk: Buffer) => {
        output += chunk.toString()
        if (!output.includes('Ready')) return
        clearTimeout(timer)
        resolve()
      })
      server!.once('exit', (exit) => {
        clearTimeout(timer)
        reject(new Error(`next start exited (${exit}): ${output}`))
      })
    })
    tokens = (await state()).tokens
  }, 300_000)

  afterAll(async () => {
    await stop(server)
  })

  it('Next.js gives a route handler its own address as request.url, and keeps a client\'s X-Forwarded-For and X-Forwarded-Host', async () => {
    const direct = await rawRequest(port, {
      method: 'GET',
      host: `weather.localhost:${port}`,
      path: '/control/state',
      headers: { 'x-forwarded-for': '198.51.100.7', 'x-forwarded-host': `busy.localhost:${port}` },
    })
    const { seen } = JSON.parse(direct.body) as State
    // Not the Host the client sent, nor even the bind address: what the default wiring would
    // take for the App's host (every App 404), hence `info.host`.
    expect(seen.url).toBe(`http://localhost:${port}/control/state`)
    expect(seen.headers.host).toBe(`weather.localhost:${port}`)
    // Next adds X-Forwarded-* only where the client sent none: so a client talking to Next
    // directly chooses them, and only a proxy's own hop can be trusted.
    expect(seen.headers['x-forwarded-for']).toBe('198.51.100.7')
    expect(seen.headers['x-forwarded-host']).toBe(`busy.localhost:${port}`)
    const plain = JSON.parse((await rawRequest(port, { method: 'GET', host: `weather.localhost:${port}`, path: '/control/state' })).body) as State
    expect(plain.seen.headers['x-forwarded-for']).toBe('127.0.0.1')
  })

  it('answers refusals with the dispatch layer\'s bytes: 401, 402, 403, 404 version_not_found and not_found, 405, 429', async () => {
    const expectReply = async (response: Response, reply: { status: number; headers: Record<string, string>; body: string | null }) => {
      expect(response.status).toBe(reply.status)
      expect(await response.text()).toBe(reply.body)
      for (const [name, value] of Object.entries(reply.headers)) expect(response.headers.get(name), name).toBe(value)
      expect(response.headers.get('x-mcp-version')).toBeNull()
    }
    await expectReply(await post(app('/v1')), unauthorizedReply({ resourceMetadataUrl: `${app('')}/.well-known/oauth-protected-resource` }))
    await expectReply(await post(app('/v1'), tokens.bob), paymentRequiredReply())
    await expectReply(await post(app('/v1', 'busy'), tokens.bob), forbiddenReply())
    await expectReply(await post(app('/v3.0.0'), tokens.alice), versionNotFoundReply('3.0.0', '1.1.0'))
    await expectReply(await post(app('/v1', 'nowhere'), tokens.alice), notFoundReply())
    await expectReply(await localhostFetch(app('/v1'), { method: 'PUT', headers: mcpHeaders(tokens.alice), body: TOOLS_LIST }), methodNotAllowedReply('GET, POST, DELETE, OPTIONS'))
    // HEAD (Next.js answers it with the GET export): GET's challenge, then 405, without bodies.
    const headOf = (reply: { status: number; headers: Record<string, string> }) => ({ ...reply, body: '' })
    await expectReply(await localhostFetch(app('/v1'), { method: 'HEAD' }), headOf(unauthorizedReply({ resourceMetadataUrl: `${app('')}/.well-known/oauth-protected-resource` })))
    await expectReply(await localhostFetch(app('/v1'), { method: 'HEAD', headers: { authorization: `Bearer ${tokens.alice}` } }), headOf(methodNotAllowedReply('GET, POST, DELETE, OPTIONS')))

    // Both in one minute of the fixed window.
    await awayFromMinuteEnd()
    expect((await post(app('/', 'busy'), tokens.alice)).status).toBe(200)
    const limited = await post(app('/', 'busy'), tokens.alice)
    expect(limited.status).toBe(429)
    const retryAfter = Number(limited.headers.get('retry-after'))
    expect(retryAfter).toBeGreaterThan(0)
    const body = (await limited.json()) as { error: { code: number; data: { limit: number; windowType: string; retryAfter: number; resetAt: number } } }
    expect(body.error).toMatchObject({ code: -32000, data: { limit: 1, windowType: 'minute', retryAfter } })
    expect(JSON.stringify(body)).toBe(rateLimitedReply({ limit: 1, windowType: 'minute', resetAt: body.error.data.resetAt, retryAfter }).body)
  })

  it('serves the protected-resource metadata of the App the Host names, and stamps the version headers on the App\'s answer', async () => {
    const metadata = await localhostFetch(app('/.well-known/oauth-protected-resource'))
    expect(metadata.status).toBe(200)
    expect(metadata.headers.get('cache-control')).toBe('public, max-age=3600')
    expect(await metadata.json()).toEqual({
      resource: app(''),
      authorization_servers: ['https://auth.example.test'],
      bearer_methods_supported: ['header'],
      scopes_supported: ['openid', 'profile', 'email'],
      resource_name: 'Weather',
    })
    // `/v1/` as on the other adapters (skipTrailingSlashRedirect), not a 308 to `/v1`.
    const slash = await post(app('/v1/'), tokens.alice)
    expect(slash.status).toBe(200)
    expect(slash.headers.get('x-mcp-version')).toBe('1.1.0')
    await slash.text()
    const served = await post(app('/v1.0'), tokens.alice)
    expect(served.status).toBe(200)
    expect(served.headers.get('x-mcp-version')).toBe('1.0.0')
    expect(served.headers.get('x-mcp-latest-version')).toBe('1.1.0')
    expect(served.headers.get('ratelimit-policy')).toBe('"minute";q=1000;w=60')
    expect(((await served.json()) as { result: { tools: Array<{ name: string }> } }).result.tools.map((t) => t.name)).toEqual([
      'get_version',
      'wait_for_release',
      'notify',
    ])
  })

  it('the App is the Host\'s: a client\'s X-Forwarded-Host picks no other App; a Host no URL can hold is 400', async () => {
    const spoofed = await rawRequest(port, {
      method: 'GET',
      host: `weather.localhost:${port}`,
      path: '/.well-known/oauth-protected-resource',
      headers: { 'x-forwarded-host': `busy.localhost:${port}` },
    })
    expect(JSON.parse(spoofed.body).resource).toBe(app(''))
    const invalid = invalidHostReply()
    for (const host of [`weather.localhost:99999`, `a@weather.localhost:${port}`, 'weather.1']) {
      const res = await rawRequest(port, { host, path: '/v1', headers: mcpHeaders(tokens.alice), body: TOOLS_LIST })
      expect(res.status, host).toBe(invalid.status)
      expect(res.body, host).toBe(invalid.body)
    }
  })

  it('client address: behind a proxy that appends the peer to X-Forwarded-For, an IP allowlist holds against a client\'s own X-Forwarded-For', async () => {
    const proxy = await startProxy(port)
    try {
      const through = (token: string, forwardedFor?: string) =>
        rawRequest(proxy.port, {
          host: `weather.localhost:${port}`,
          path: '/v1',
          headers: mcpHeaders(token, forwardedFor === undefined ? {} : { 'x-forwarded-for': forwardedFor }),
          body: TOOLS_LIST,
        })
      const forged = await through(tokens.allowlisted, '198.51.100.7')
      expect(forged.status).toBe(403)
      expect(forged.body).toBe(ipNotAllowedReply().body)
      expect((await through(tokens.loopback)).status).toBe(200)
      expect((await through(tokens.loopback, '198.51.100.7')).status).toBe(200)
    } finally {
      await proxy.close()
    }
    // Straight to Next, without a forged header, Next's own X-Forwarded-For is the socket's.
    expect((await post(app('/v1'), tokens.allowlisted)).status).toBe(403)
    expect((await post(app('/v1'), tokens.loopback)).status).toBe(200)
  })

  it('pins an MCP SDK client\'s session to its version across a deploy; new connections resolve anew; DELETE ends the pin', async () => {
    const seen: Array<{ version: string | null; latest: string | null }> = []
    const recording = async (input: string | URL | Request, init?: RequestInit) => {
      const response = await localhostFetch(input, init)
      seen.push({ version: response.headers.get('x-mcp-version'), latest: response.headers.get('x-mcp-latest-version') })
      return response
    }
    const connect = async (path: string) => {
      const client = new Client({ name: 'nextjs-test', version: '1.0.0' })
      const transport = new StreamableHTTPClientTransport(new URL(app(path)), {
        fetch: recording,
        requestInit: { headers: { authorization: `Bearer ${tokens.alice}` } },
      })
      await client.connect(transport)
      return { client, transport }
    }
    const versionOf = async (client: Client) => {
      const result = (await client.callTool({ name: 'get_version', arguments: {} })) as { content: Array<{ text: string }> }
      return result.content[0]!.text
    }

    const first = await connect('/v1')
    expect(await versionOf(first.client)).toBe('1.1.0')
    const deployed = await fetch(`http://127.0.0.1:${port}/control/deploy`, { method: 'POST', body: JSON.stringify({ version: '1.1.1' }) })
    expect(await deployed.json()).toEqual({ live: ['1.0.0', '1.1.1'] })

    expect(await versionOf(first.client)).toBe('1.1.0')
    expect(seen.at(-1)).toEqual({ version: '1.1.0', latest: '1.1.1' })
    const second = await connect('/v1')
    expect(await versionOf(second.client)).toBe('1.1.1')

    const sessionId = first.transport.sessionId!
    await first.transport.terminateSession()
    const after = await localhostFetch(app('/v1'), {
      method: 'POST',
      headers: mcpHeaders(tokens.alice, { 'mcp-session-id': sessionId }),
      body: TOOLS_LIST,
    })
    expect(after.status).toBe(404)
    expect(((await after.json()) as { error: { data: unknown } }).error.data).toEqual({ error: 'session_not_found' })
    await first.client.close()
    await second.client.close()
  })

  it('a tool answering by event stream streams through, gzip asked or not: its first event comes while the tool still runs', async () => {
    const headers = await openSession()
    const call = await callTool(headers, 'wait_for_release')
    expect(call.headers.get('content-type')).toBe('text/event-stream')
    expect(call.headers.get('x-mcp-version')).toBe('1.1.1')
    const reader = call.body!.getReader()
    await readUntil(reader, '"waiting"')
    await fetch(`http://127.0.0.1:${port}/control/release`, { method: 'POST' })
    await readUntil(reader, '"released"')

    // Asked for gzip (as Node's fetch asks), Next.js 16 leaves an event stream alone; were it
    // to compress one, it flushes each chunk.
    const asked = await new Promise<http.IncomingMessage>((resolve, reject) => {
      const request = http.request(
        { host: '127.0.0.1', port, method: 'POST', path: '/v1', headers: { ...headers, host: `weather.localhost:${port}`, 'accept-encoding': 'gzip' }, agent: false },
        resolve,
      )
      request.on('error', reject)
      request.end(JSON.stringify({ jsonrpc: '2.0', id: 8, method: 'tools/call', params: { name: 'wait_for_release', arguments: {} } }))
    })
    const decoded = asked.headers['content-encoding'] === 'gzip' ? asked.pipe(createGunzip()) : asked
    const gzipReader = (Readable.toWeb(decoded) as ReadableStream<Uint8Array>).getReader()
    await readUntil(gzipReader, '"waiting"')
    await fetch(`http://127.0.0.1:${port}/control/release`, { method: 'POST' })
    await readUntil(gzipReader, '"released"')
  })

  it('the SDK\'s GET stream: Next.js sends its head with its first event; an App that opens it with a comment gets it out at once', async () => {
    const headers = await openSession()
    const get = (path: string, h: Record<string, string>) => localhostFetch(app(path), { method: 'GET', headers: { ...h, accept: 'text/event-stream' } })
    const held = get('/v1', headers)
    expect(await within(held, 1_500)).toBe('pending')
    // A notification of no request goes on the GET stream, and its head with it.
    const notified = await callTool(headers, 'notify')
    await notified.text()
    const stream = await held
    expect(stream.status).toBe(200)
    expect(stream.headers.get('x-mcp-version')).toBe('1.1.1')
    await readUntil(stream.body!.getReader(), 'notifications/tools/list_changed')

    const other = await openSession('/v1?open-stream')
    const opened = await within(get('/v1?open-stream', other), 5_000)
    expect(opened).not.toBe('pending')
    const reader = (opened as Response).body!.getReader()
    await readUntil(reader, ': open')
    await (await callTool(other, 'notify', {}, '/v1?open-stream')).text()
    await readUntil(reader, 'notifications/tools/list_changed')
    await reader.cancel()
  })

  it('hands the handler the request body untouched, with a Content-Length or chunked', async () => {
    const bytes = randomBytes(1 << 20)
    const digest = createHash('sha256').update(bytes).digest('hex')
    const whole = await rawRequest(port, {
      host: `weather.localhost:${port}`,
      path: '/v1',
      headers: mcpHeaders(tokens.alice, { 'content-type': 'application/octet-stream', 'x-test-echo': '1' }),
      body: bytes,
    })
    expect(JSON.parse(whole.body)).toEqual({ length: bytes.length, sha256: digest })
    const chunked = await new Promise<string>((resolve, reject) => {
      const request = http.request(
        {
          host: '127.0.0.1',
          port,
          method: 'POST',
          path: '/v1',
          headers: { ...mcpHeaders(tokens.alice, { 'x-test-echo': '1' }), host: `weather.localhost:${port}` },
          agent: false,
        },
        (response) => {
          let text = ''
          response.on('data', (chunk: Buffer) => (text += chunk.toString()))
          response.on('end', () => resolve(text))
        },
      )
      request.on('error', reject)
      for (let offset = 0; offset < bytes.length; offset += 100_000) request.write(bytes.subarray(offset, offset + 100_000))
      request.end()
    })
    expect(JSON.parse(chunked)).toEqual({ length: bytes.length, sha256: digest })
  })

  it('a client that goes away aborts request.signal and cancels the event stream', async () => {
    const headers = await openSession()
    const before = (await state()).observed
    const leaving = new AbortController()
    const call = await callTool(headers, 'wait_for_release', { signal: leaving.signal })
    await readUntil(call.body!.getReader(), '"waiting"')
    leaving.abort()
    await waitFor((s) => s.observed.aborted > before.aborted, 'request.signal did not abort')
    await waitFor((s) => s.observed.streams - s.observed.streamsEnded <= before.streams - before.streamsEnded, 'the stream was not cancelled')
    await fetch(`http://127.0.0.1:${port}/control/release`, { method: 'POST' })
  })

  it('next start evaluates the platform module once, for every route that imports it', async () => {
    expect((await state()).moduleEvaluations).toBe(1)
    expect(output).not.toMatch(/error/i)
  })
})
