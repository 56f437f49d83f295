/**
 * The adapter examples (`examples/express`, `fastify`, `hono`, `fetch`) work: in process, the
 * official MCP SDK client runs a session through each; and each `server.ts` starts as
 * documented (`npx tsx examples/<x>/server.ts`) and answers an MCP request.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import * as http from 'node:http'
import { type AddressInfo, connect } from 'node:net'
import { fileURLToPath } from 'node:url'
import { serve } from '@hono/node-server'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { generateKeyPair } from 'jose'
import { invalidHostReply, serviceUnavailableReply, sessionNotFoundReply } from 'mcp-dispatch'
import { createIdentitySigner } from 'mcp-dispatch/proxy'
import { toResponse } from 'mcp-dispatch/web'
import { afterAll, describe, expect, it } from 'vitest'
import { createExpressExample } from '../../examples/express/app.js'
import { createFastifyExample } from '../../examples/fastify/app.js'
import { createFetchHandler } from '../../examples/fetch/handler.js'
import { createUpstreamApp } from '../../examples/fetch/upstream.js'
import { createHonoExample } from '../../examples/hono/app.js'
import { type CallerOf, buildAppServer } from '../../examples/platform/mcp-app.js'
import { type Demo, type NodeSessionsOptions, createDemo, createNodeSessions } from '../../examples/shared/demo.js'
import { INITIALIZE, TOOLS_LIST } from '../helpers/platform.js'
import { close, listen, rawRequest } from './helpers.js'

/** Sends a raw HTTP/1.x request head and reads what comes back until the server closes (5 s at most). */
function rawExchange(port: number, head: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let data = ''
    const socket = connect(port, '127.0.0.1', () => socket.write(head))
    socket.setEncoding('latin1')
    socket.on('data', (chunk: string) => (data += chunk))
    socket.on('end', () => resolve(data))
    socket.on('error', reject)
    socket.setTimeout(5_000, () => {
      socket.destroy()
      resolve(data)
    })
  })
}

interface Running {
  port: number
  close(): Promise<void>
}

async function serveFetch(fetch: (request: Request, env: any) => Response | Promise<Response>): Promise<Running> {
  let server!: ReturnType<typeof serve>
  const port = await new Promise<number>((resolve) => {
    server = serve({ fetch, port: 0, hostname: '127.0.0.1' }, (info: AddressInfo) => resolve(info.port))
  })
  return { port, close: () => close(server as unknown as http.Server) }
}

const starts: Record<string, (demo: Demo) => Promise<Running>> = {
  async express(demo) {
    const example = createExpressExample(demo)
    const server = http.createServer(example.app)
    const port = await listen(server)
    return { port, close: async () => (await example.close(), await close(server)) }
  },
  async fastify(demo) {
    const app = await createFastifyExample(demo)
    await app.listen({ port: 0, host: '127.0.0.1' })
    return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
  },
  async hono(demo) {
    const example = createHonoExample(demo)
    const running = await serveFetch(example.app.fetch)
    return { port: running.port, close: async () => (await example.close(), await running.close()) }
  },
  async fetch(demo) {
    const issuer = 'http://platform.localhost'
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    const signer = createIdentitySigner({ issuer, privateKey })
    // As server.ts: the App's own service first, then the handler that proxies to it.
    const app: { current?: ReturnType<typeof createUpstreamApp> } = {}
    const upstream = await serveFetch(async (request) => (app.current ? app.current.fetch(request) : toResponse(serviceUnavailableReply())))
    const upstreamOrigin = `http://127.0.0.1:${upstream.port}`
    const handler = createFetchHandler({
      dispatcher: demo.dispatcher,
      signer,
      upstream: (context) => `${upstreamOrigin}/mcp/${context.version}`,
    })
    const front = await serveFetch((request, env) => handler(request, { clientAddress: env.incoming?.socket?.remoteAddress, outgoing: env.outgoing }))
    app.current = createUpstreamApp({ jwks: `http://127.0.0.1:${front.port}/.well-known/jwks.json`, issuer, audience: upstreamOrigin })
    return {
      port: front.port,
      close: async () => {
        await app.current!.close()
        await front.close()
        await upstream.close()
      },
    }
  },
}

/** The App's own tools: the examples serve no fixtures of the MCP conformance suite. */
const OWN_TOOLS = ['count', 'echo', 'get_version']

/** A session with the SDK client: the version serving it, the tools, a call with progress. */
async function session(url: string, token: string) {
  const versions: Array<string | null> = []
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
    fetch: async (input, init) => {
      const response = await fetch(input, init)
      versions.push(response.headers.get('x-mcp-version'))
      return response
    },
  })
  const client = new Client({ name: 'examples-test', version: '1.0.0' })
  await client.connect(transport)
  const tools = (await client.listTools()).tools.map((t) => t.name).sort()
  const progress: number[] = []
  const counted = await client.callTool({ name: 'count', arguments: { n: 2 } }, undefined, { onprogress: (p) => progress.push(p.progress) })
  const version = await client.callTool({ name: 'get_version', arguments: {} })
  await transport.terminateSession()
  await client.close()
  return { tools, progress, counted: counted.content, version: version.content, headers: [...new Set(versions)] }
}

describe('adapter examples, in process', () => {
  for (const name of Object.keys(starts)) {
    it(`${name}: an MCP session through the example, with the version of the URL`, async () => {
      const demo = await createDemo()
      const running = await starts[name]!(demo)
      try {
        const base = `http://127.0.0.1:${running.port}`
        const refused = await fetch(`${base}/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })
        expect(refused.status).toBe(401)
        expect(refused.headers.get('www-authenticate')).toContain('resource_metadata=')

        const latest = await session(`${base}/`, demo.token)
        expect(latest.tools).toEqual(OWN_TOOLS)
        expect(latest.progress).toEqual([1, 2])
        expect(latest.counted).toEqual([{ type: 'text', text: 'counted to 2 (2.0.0)' }])
        expect(latest.version).toEqual([{ type: 'text', text: '2.0.0' }])
        expect(latest.headers).toEqual(['2.0.0'])

        const v1 = await session(`${base}/v1`, demo.token)
        expect(v1.version).toEqual([{ type: 'text', text: '1.0.0' }])
        expect(v1.headers).toEqual(['1.0.0'])

        // A body that is not JSON: a JSON-RPC error, never an HTML page or a 5xx.
        const garbled = await fetch(`${base}/v1`, {
          method: 'POST',
          headers: { authorization: `Bearer ${demo.token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          body: '{"jsonrpc":',
        })
        expect(garbled.status).toBe(400)
        expect(await garbled.json()).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32700 } })
        // An empty body under a JSON content type (a DELETE) is the transport's to judge: a
        // JSON-RPC answer, never the framework's own error object.
        const emptyDelete = await fetch(`${base}/v1`, {
          method: 'DELETE',
          headers: { authorization: `Bearer ${demo.token}`, 'content-type': 'application/json' },
        })
        expect(emptyDelete.status).toBeLessThan(500)
        expect(await emptyDelete.json()).toMatchObject({ jsonrpc: '2.0' })
        if (name === 'fetch') {
          // The JWKS the Apps verify with is read, never written: any other method is 405.
          const jwks = await fetch(`${base}/.well-known/jwks.json`)
          expect(jwks.status).toBe(200)
          expect((await jwks.json()).keys).toHaveLength(1)
          const head = await fetch(`${base}/.well-known/jwks.json`, { method: 'HEAD' })
          expect(head.status).toBe(200)
          expect(await head.text()).toBe('')
          for (const method of ['POST', 'PUT', 'DELETE', 'OPTIONS']) {
            const refusedJwks = await fetch(`${base}/.well-known/jwks.json`, { method })
            expect(refusedJwks.status, method).toBe(405)
            expect(refusedJwks.headers.get('allow')).toBe('GET, HEAD')
            expect(await refusedJwks.json()).toMatchObject({ jsonrpc: '2.0', error: { data: { error: 'method_not_allowed' } } })
          }
        }
      } finally {
        await running.close()
      }
    })
  }
})

/** A POST of `body` to `url` with the token, and the other headers given. */
function post(url: string, token: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  })
}

const BOTH = { accept: 'application/json, text/event-stream' }

/** An SDK client connected to `url`, with the status of every answer it got. */
async function connectClient(url: string, token: string) {
  const statuses: Array<{ method: string; status: number }> = []
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
    fetch: async (input, init) => {
      const response = await fetch(input, init)
      statuses.push({ method: init?.method ?? 'GET', status: response.status })
      return response
    },
  })
  const client = new Client({ name: 'examples-test', version: '1.0.0' })
  client.onerror = () => {} // the GET stream of a session the server closed
  await client.connect(transport)
  return { client, statuses }
}

describe('adapter examples: what each serves', () => {
  for (const name of Object.keys(starts)) {
    it(`${name}: a live pre-release is served at its exact URL, and only there (regression: the fetch example's App service answered its path with a text 404)`, async () => {
      const demo = await createDemo()
      demo.apps.deploy(demo.app.id, '2.1.0-rc.1')
      const running = await starts[name]!(demo)
      try {
        const exact = await post(`http://127.0.0.1:${running.port}/v2.1.0-rc.1`, demo.token, TOOLS_LIST)
        expect(exact.status).toBe(200)
        expect(exact.headers.get('x-mcp-version')).toBe('2.1.0-rc.1')
        expect(((await exact.json()) as { result: { tools: unknown[] } }).result.tools.length).toBeGreaterThan(0)
        const broader = await post(`http://127.0.0.1:${running.port}/v2`, demo.token, TOOLS_LIST)
        expect(broader.status).toBe(200)
        expect(broader.headers.get('x-mcp-version')).toBe('2.0.0')
        await broader.body?.cancel()
      } finally {
        await running.close()
      }
    })

    it(`${name}: spec 4.1's bare tools/list (Authorization and Content-Type only) is answered 200 in JSON with the version headers, the App's own tools only (regression: Express and Fastify 406, and 400 "Server not initialized" given both media types; every example listed the conformance suite's 18 tools)`, async () => {
      const demo = await createDemo()
      const running = await starts[name]!(demo)
      try {
        // fetch() sends `Accept: */*`, as curl does; then both media types; then JSON alone.
        for (const headers of [{}, BOTH, { accept: 'application/json' }]) {
          const response = await post(`http://127.0.0.1:${running.port}/v1`, demo.token, TOOLS_LIST, headers)
          expect(response.status, JSON.stringify(headers)).toBe(200)
          expect(response.headers.get('content-type')).toBe('application/json')
          expect(response.headers.get('x-mcp-version')).toBe('1.0.0')
          expect(response.headers.get('x-mcp-latest-version')).toBe('2.0.0')
          expect(response.headers.get('mcp-session-id')).toBeNull()
          const answer = (await response.json()) as { id: number; result: { tools: Array<{ name: string }> } }
          expect(answer.id).toBe(1)
          expect(answer.result.tools.map((t) => t.name).sort()).toEqual(OWN_TOOLS)
        }
      } finally {
        await running.close()
      }
    })

    it(`${name}: a batch is answered with an array in one shot, one that gets a single response too (JSON-RPC 2.0 section 6; regression: Express and Fastify answered that one alone)`, async () => {
      const demo = await createDemo()
      const running = await starts[name]!(demo)
      try {
        const url = `http://127.0.0.1:${running.port}/v1`
        const ping = (id: number) => ({ jsonrpc: '2.0', id, method: 'ping' })
        for (const [batch, ids] of [[[ping(7)], [7]], [[ping(7), { jsonrpc: '2.0', method: 'notifications/initialized' }], [7]], [[ping(7), ping(8)], [7, 8]]] as const) {
          const response = await post(url, demo.token, batch, BOTH)
          expect(response.status).toBe(200)
          expect(response.headers.get('content-type')).toBe('application/json')
          expect(response.headers.get('x-mcp-version')).toBe('1.0.0')
          const answer = (await response.json()) as Array<{ id: number; result: unknown }>
          expect(Array.isArray(answer), JSON.stringify(answer)).toBe(true)
          expect(answer.map((a) => [a.id, a.result]).sort()).toEqual(ids.map((id) => [id, {}]))
        }
        // One request alone is one response alone.
        const single = await post(url, demo.token, ping(9), BOTH)
        expect(await single.json()).toEqual({ jsonrpc: '2.0', id: 9, result: {} })
      } finally {
        await running.close()
      }
    })

    it(`${name}: one caller's sessions are capped (100), its least recently used closed first (regression: Hono and fetch did not pass the caller to createMcpAppHandler; createNodeSessions had no cap per caller)`, async () => {
      const demo = await createDemo()
      const running = await starts[name]!(demo)
      const url = `http://127.0.0.1:${running.port}/v1`
      // Sessions with no answer open (no GET stream): both handlers close the least recently
      // used of them (createNodeSessions would keep one with a stream open: its own test below).
      const inSession = (id: string) => ({ ...BOTH, 'mcp-session-id': id, 'mcp-protocol-version': '2025-06-18' })
      try {
        const ids: string[] = []
        for (let i = 0; i < 101; i++) {
          const opened = await post(url, demo.token, INITIALIZE, BOTH)
          expect(opened.status).toBe(200)
          ids.push(opened.headers.get('mcp-session-id')!)
          await opened.text()
          if (i === 0) {
            const listed = await post(url, demo.token, TOOLS_LIST, inSession(ids[0]!))
            expect(listed.status).toBe(200)
            await listed.text()
          }
        }
        // The 101st session closed the first; the last is served.
        const lost = await post(url, demo.token, TOOLS_LIST, inSession(ids[0]!))
        expect(lost.status).toBe(404)
        await lost.text()
        const served = await post(url, demo.token, TOOLS_LIST, inSession(ids[100]!))
        expect(served.status).toBe(200)
        expect(await served.text()).toContain('get_version')
      } finally {
        await running.close()
      }
    })

    it(`${name}: a POST without Content-Type is the MCP SDK's 415, as on every example (regression: Fastify's own 415 answered -32600)`, async () => {
      const demo = await createDemo()
      const running = await starts[name]!(demo)
      try {
        const response = await fetch(`http://127.0.0.1:${running.port}/v1`, {
          method: 'POST',
          headers: { authorization: `Bearer ${demo.token}` },
          body: new Blob([JSON.stringify(TOOLS_LIST)]), // no type: no Content-Type
        })
        expect(response.status).toBe(415)
        expect(response.headers.get('content-type')).toBe('application/json')
        expect(await response.json()).toMatchObject({
          jsonrpc: '2.0',
          id: null,
          error: { code: -32000, message: 'Unsupported Media Type: Content-Type must be application/json' },
        })
      } finally {
        await running.close()
      }
    })
  }

  for (const name of ['express', 'fastify']) {
    it(`${name}: a body its parser refuses is answered as the SDK transport answers it, with Content-Type exactly application/json (regression: \`; charset=utf-8\`, -32600 for a body too large)`, async () => {
      const demo = await createDemo()
      const running = await starts[name]!(demo)
      try {
        const url = `http://127.0.0.1:${running.port}/v1`
        const garbled = await post(url, demo.token, '{"jsonrpc":', BOTH)
        expect(garbled.status).toBe(400)
        expect(garbled.headers.get('content-type')).toBe('application/json')
        expect(await garbled.json()).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error: Invalid JSON' } })
        const large = await post(url, demo.token, `"${'x'.repeat(4 * 1024 * 1024)}"`, BOTH)
        expect(large.status).toBe(413)
        expect(large.headers.get('content-type')).toBe('application/json')
        expect(await large.json()).toEqual({
          jsonrpc: '2.0',
          id: null,
          error: { code: -32000, message: 'Payload Too Large: Request body must not exceed 4194304 bytes' },
        })
      } finally {
        await running.close()
      }
    })
  }
})

describe('adapter examples: the Express and Fastify examples\' sessions (createNodeSessions)', () => {
  it('a session they lost (swept, closed) gets the dispatch layer\'s own 404 session_not_found, as docs/adapters.md\'s nodeSessions does (regression: their own -32000 body)', async () => {
    const sessions = createNodeSessions(() => {
      throw new Error('no session is opened here')
    })
    const server = http.createServer((req, res) => void sessions.handle(req, res))
    const port = await listen(server)
    try {
      const res = await rawRequest(port, { path: '/v1', headers: { 'mcp-session-id': 'lost', 'content-type': 'application/json' }, body: '{}' })
      const expected = sessionNotFoundReply()
      expect(res.status).toBe(expected.status)
      expect(res.headers['content-type']).toBe('application/json')
      expect(res.body).toBe(expected.body)
    } finally {
      await sessions.close()
      await close(server)
    }
  })
})

describe('adapter examples: createNodeSessions keeps a session with an open stream', () => {
  it('a session whose GET stream is open is not idle; one without is closed once idle past idleMs (regression: idleness counted requests only)', async () => {
    let clock = Date.UTC(2030, 0, 1)
    const sessions = createNodeSessions(() => buildAppServer({ slug: 'weather', name: 'Weather' }, '1.0.0', { conformance: false }), {
      idleMs: 60_000,
      now: () => clock,
    })
    const server = http.createServer(async (req, res) => {
      const chunks: Buffer[] = []
      for await (const chunk of req) chunks.push(chunk as Buffer)
      const text = Buffer.concat(chunks).toString('utf8')
      await sessions.handle(req, res, text === '' ? undefined : JSON.parse(text), { subject: 'alice', appId: 'app_weather', version: '1.0.0' })
    })
    const port = await listen(server)
    const url = `http://127.0.0.1:${port}/`
    const streaming = await connectClient(url, 'unused')
    try {
      // The SDK client opens its GET stream once initialized.
      for (let i = 0; i < 100 && !streaming.statuses.some((s) => s.method === 'GET' && s.status === 200); i++) await new Promise((r) => setTimeout(r, 10))
      expect(streaming.statuses).toContainEqual({ method: 'GET', status: 200 })
      const quiet = await post(url, 'unused', INITIALIZE, BOTH)
      const quietId = quiet.headers.get('mcp-session-id')!
      await quiet.text()
      clock += 120_000
      // Opening a session closes the idle ones: the quiet one, not the one with a stream open.
      await (await post(url, 'unused', INITIALIZE, BOTH)).text()
      expect((await streaming.client.listTools()).tools.map((t) => t.name).sort()).toEqual(OWN_TOOLS)
      const lost = await post(url, 'unused', TOOLS_LIST, { ...BOTH, 'mcp-session-id': quietId, 'mcp-protocol-version': '2025-06-18' })
      expect(lost.status).toBe(404)
      expect(await lost.text()).toBe(sessionNotFoundReply().body)
      expect(sessions.sessionCount()).toBe(2)
    } finally {
      await streaming.client.close()
      await sessions.close()
      await close(server)
    }
  })
})

/** The demo App version's own server (no conformance fixtures). */
const buildWeather = () => buildAppServer({ slug: 'weather', name: 'Weather' }, '1.0.0', { conformance: false })
const ALICE = { subject: 'alice', appId: 'app_weather', version: '1.0.0' }

/**
 * `createNodeSessions(build, options)` on a loopback server, each request handed its parsed
 * body and `caller` (none: `undefined`).
 */
async function serveNodeSessions(options: NodeSessionsOptions, caller: CallerOf | undefined = ALICE, build = buildWeather) {
  const sessions = createNodeSessions(build, options)
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    const text = Buffer.concat(chunks).toString('utf8')
    await sessions.handle(req, res, text === '' ? undefined : JSON.parse(text), caller)
  })
  const port = await listen(server)
  return {
    sessions,
    url: `http://127.0.0.1:${port}/`,
    close: async () => (await sessions.close(), await close(server)),
  }
}

/** Opens a session with a raw `initialize`: its id, once its answer is read. */
async function openSession(url: string): Promise<string> {
  const opened = await post(url, 'unused', INITIALIZE, BOTH)
  expect(opened.status).toBe(200)
  await opened.text()
  return opened.headers.get('mcp-session-id')!
}

const inSession = (id: string) => ({ ...BOTH, 'mcp-session-id': id, 'mcp-protocol-version': '2025-06-18' })

describe('adapter examples: createNodeSessions, its caps and sweeps as createMcpAppHandler\'s', () => {
  it('a session still being opened is never closed for another: with every slot of the caller opening, a second initialize is answered 429 as createMcpAppHandler answers it (regression: both got 200, and the first id answered 404)', async () => {
    // The first session's server connects only once the second initialize has been answered.
    let second!: () => void
    const secondAnswered = new Promise<void>((resolve) => (second = resolve))
    let builds = 0
    const build = () => {
      const server = buildWeather()
      if (builds++ === 0) {
        const connect = server.connect.bind(server)
        server.connect = async (transport) => (await secondAnswered, connect(transport))
      }
      return server
    }
    const running = await serveNodeSessions({ maxSessionsPerCaller: 1 }, ALICE, build)
    try {
      const first = post(running.url, 'unused', INITIALIZE, BOTH)
      while (builds === 0) await new Promise((r) => setTimeout(r, 5))
      const refused = await post(running.url, 'unused', INITIALIZE, BOTH)
      second()
      expect(refused.status).toBe(429)
      expect(refused.headers.get('retry-after')).toBe('1')
      expect(refused.headers.get('content-type')).toBe('application/json')
      expect(await refused.json()).toEqual({
        jsonrpc: '2.0',
        id: null,
        error: { code: -32000, message: 'Too many sessions being opened for this caller (1)' },
      })
      const opened = await first
      expect(opened.status).toBe(200)
      const id = opened.headers.get('mcp-session-id')!
      await opened.text()
      const served = await post(running.url, 'unused', TOOLS_LIST, inSession(id))
      expect(served.status).toBe(200)
      expect(await served.text()).toContain('get_version')
      expect(running.sessions.sessionCount()).toBe(1)
      // Opened, it is the caller's least recently used again: the next initialize closes it.
      const next = await openSession(running.url)
      expect((await post(running.url, 'unused', TOOLS_LIST, inSession(id))).status).toBe(404)
      expect((await post(running.url, 'unused', TOOLS_LIST, inSession(next))).status).toBe(200)
    } finally {
      second()
      await running.close()
    }
  })

  for (const [cap, caller] of [
    [{ maxSessionsPerCaller: 2 }, ALICE],
    [{ maxSessions: 2 }, undefined],
  ] as const) {
    it(`past ${Object.keys(cap)[0]}, the least recently used session with no answer open is closed, not one whose GET stream is open (regression: the stream was cut, its session closed)`, async () => {
      const running = await serveNodeSessions(cap, caller)
      const streaming = await connectClient(running.url, 'unused')
      try {
        // The SDK client opens its GET stream once initialized: its session is the least recently used from now on.
        for (let i = 0; i < 100 && !streaming.statuses.some((s) => s.method === 'GET' && s.status === 200); i++) await new Promise((r) => setTimeout(r, 10))
        expect(streaming.statuses).toContainEqual({ method: 'GET', status: 200 })
        const quiet = await openSession(running.url)
        const listed = await post(running.url, 'unused', TOOLS_LIST, inSession(quiet))
        expect(listed.status).toBe(200)
        await listed.text()
        const third = await openSession(running.url)
        expect(running.sessions.sessionCount()).toBe(2)
        expect((await streaming.client.listTools()).tools.map((t) => t.name).sort()).toEqual(OWN_TOOLS)
        expect(streaming.statuses.filter((s) => s.method === 'GET')).toEqual([{ method: 'GET', status: 200 }])
        const lost = await post(running.url, 'unused', TOOLS_LIST, inSession(quiet))
        expect(lost.status).toBe(404)
        expect(await lost.text()).toBe(sessionNotFoundReply().body)
        expect((await post(running.url, 'unused', TOOLS_LIST, inSession(third))).status).toBe(200)
        // Every session left has an answer open: the least recently used goes, the cap holds.
        const stream = await fetch(running.url, { headers: { ...inSession(third), accept: 'text/event-stream' } })
        expect(stream.status).toBe(200)
        const fourth = await openSession(running.url)
        expect(running.sessions.sessionCount()).toBe(2)
        await expect(streaming.client.listTools()).rejects.toThrow()
        expect((await post(running.url, 'unused', TOOLS_LIST, inSession(fourth))).status).toBe(200)
        await stream.body?.cancel()
      } finally {
        await streaming.client.close()
        await running.close()
      }
    })
  }

  it('idle sessions are closed every sweepEveryMs, with no request coming (regression: only an initialize closed them, so a version no one opened sessions of kept them for ever)', async () => {
    let clock = Date.UTC(2030, 0, 1)
    const running = await serveNodeSessions({ idleMs: 60_000, now: () => clock, sweepEveryMs: 20 })
    try {
      const id = await openSession(running.url)
      await new Promise((r) => setTimeout(r, 60))
      expect(running.sessions.sessionCount()).toBe(1)
      clock += 120_000
      for (let i = 0; i < 100 && running.sessions.sessionCount() > 0; i++) await new Promise((r) => setTimeout(r, 10))
      expect(running.sessions.sessionCount()).toBe(0)
      expect((await post(running.url, 'unused', TOOLS_LIST, inSession(id))).status).toBe(404)
    } finally {
      await running.close()
    }
    expect(() => createNodeSessions(buildWeather, { sweepEveryMs: 0 })).toThrow(TypeError)
  })

  it('Accept is honoured with its weights (RFC 9110 section 12.5.1): none, or JSON accepted, is served in one shot; JSON refused (q=0, or not listed) is the SDK transport\'s 406 (regression: any Accept was answered, `*/*;q=0` read as both types)', async () => {
    const running = await serveNodeSessions({})
    try {
      for (const accept of [undefined, '*/*', 'application/*', 'application/json', 'text/html, application/json;q=0.5', BOTH.accept]) {
        const response = await fetch(running.url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...(accept === undefined ? {} : { accept }) },
          body: JSON.stringify(TOOLS_LIST),
        })
        expect(response.status, String(accept)).toBe(200)
        expect(response.headers.get('content-type')).toBe('application/json')
        expect(await response.text()).toContain('get_version')
      }
      for (const accept of ['text/html', '*/*;q=0', 'application/json;q=0, */*', 'text/event-stream', 'image/*, application/json; q=0']) {
        const response = await post(running.url, 'unused', TOOLS_LIST, { accept })
        expect(response.status, accept).toBe(406)
        expect(await response.json()).toMatchObject({ jsonrpc: '2.0', error: { code: -32000, message: expect.stringContaining('Not Acceptable') } })
      }
      // A session's answers may be either type: both must be accepted.
      for (const accept of ['*/*;q=0', 'application/json', 'text/*, application/json;q=0']) {
        const response = await post(running.url, 'unused', INITIALIZE, { accept })
        expect(response.status, accept).toBe(406)
        await response.text()
      }
      for (const accept of ['*/*', 'application/*, text/*;q=0.1', 'application/json, text/event-stream']) {
        const response = await post(running.url, 'unused', INITIALIZE, { accept })
        expect(response.status, accept).toBe(200)
        await response.text()
      }
    } finally {
      await running.close()
    }
  })

  it('a type named with q=0 is refused though named (the SDK transport reads names only), and a refused initialize closes no session for its slot (regression: served, and the caller\'s session closed first)', async () => {
    const running = await serveNodeSessions({ maxSessionsPerCaller: 1 }, ALICE)
    try {
      const kept = await openSession(running.url)
      for (const accept of ['text/event-stream, application/json;q=0', 'application/json, text/event-stream;q=0']) {
        const initialize = await post(running.url, 'unused', INITIALIZE, { accept })
        expect(initialize.status, accept).toBe(406)
        await initialize.text()
      }
      const oneShot = await post(running.url, 'unused', TOOLS_LIST, { accept: 'text/event-stream, application/json;q=0' })
      expect(oneShot.status).toBe(406)
      await oneShot.text()
      const stream = await fetch(running.url, { headers: { ...inSession(kept), accept: 'application/json, text/event-stream;q=0' } })
      expect(stream.status).toBe(406)
      await stream.text()
      expect((await post(running.url, 'unused', TOOLS_LIST, inSession(kept))).status).toBe(200)
    } finally {
      await running.close()
    }
  })
})

describe('adapter examples, as documented: npx tsx examples/<x>/server.ts', () => {
  const children: ChildProcess[] = []
  afterAll(async () => {
    for (const child of children) {
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve))
        child.kill('SIGTERM')
        await exited
      }
    }
  })

  const root = fileURLToPath(new URL('../../', import.meta.url))

  for (const name of Object.keys(starts)) {
    it(`${name}: server.ts starts and serves an initialize with the printed token`, async () => {
      const child = spawn(process.execPath, ['--import', 'tsx', `examples/${name}/server.ts`], {
        cwd: root,
        env: { ...process.env, PORT: '0' },
        stdio: ['ignore', 'pipe', 'pipe'],
      })
      children.push(child)
      let output = ''
      const started = await new Promise<{ port: string; token: string }>((resolve, reject) => {
        child.stdout!.on('data', (chunk: Buffer) => {
          output += chunk.toString('utf8')
          const port = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(output)?.[1]
          const token = /Bearer (svc_[A-Za-z0-9]+)/.exec(output)?.[1]
          if (port && token) resolve({ port, token })
        })
        child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')))
        child.once('exit', (code) => reject(new Error(`exited with ${code}: ${output}`)))
      })
      const response = await fetch(`http://127.0.0.1:${started.port}/v1`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${started.token}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
        },
        body: JSON.stringify(INITIALIZE),
      })
      expect(response.status).toBe(200)
      expect(response.headers.get('x-mcp-version')).toBe('1.0.0')
      expect(response.headers.get('mcp-session-id')).toBeTruthy()
      expect(await response.text()).toContain('"serverInfo"')
      // A Host no URL can hold: the JSON-RPC 400 on every example (the Hono and fetch ones give
      // @hono/node-server the Web adapter's nodeServerErrorHandler), never an empty body.
      const badHost = await rawRequest(Number(started.port), { path: '/v1', host: 'we ather', headers: { authorization: `Bearer ${started.token}` } })
      expect([badHost.status, badHost.body]).toEqual([400, invalidHostReply().body])
      // What Node refuses itself, answered in JSON-RPC (regression: Node's empty 400 and 417):
      // an HTTP/1.1 request without Host, and an Expect other than 100-continue.
      const noHost = await rawExchange(Number(started.port), 'POST /v1 HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n')
      expect(noHost).toMatch(/^HTTP\/1\.1 400 /)
      expect(noHost.endsWith(`\r\n\r\n${invalidHostReply().body}`)).toBe(true)
      const expectation = await rawExchange(
        Number(started.port),
        'POST /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: x-unknown\r\nContent-Length: 0\r\nConnection: close\r\n\r\n',
      )
      expect(expectation).toMatch(/^HTTP\/1\.1 417 [^]*"field":"expect"/)
      if (name !== 'fetch') {
        // `Expect: 100-continue` with a refused token: the 401, never `100 Continue` first (the
        // fetch example's handler passes no `outgoing`, so Node sends its 100 there).
        const refused = await rawExchange(
          Number(started.port),
          'POST /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer svc_refused\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n',
        )
        expect(refused).toMatch(/^HTTP\/1\.1 401 /)
      }
      const exited = new Promise((resolve) => child.once('exit', resolve))
      child.kill('SIGTERM')
      await exited
    })
  }

  /** Runs `examples/<name>/server.ts` to its end (or for 25 s at most: a cold start on a loaded host is slow); its exit code, stdout and stderr. */
  async function runToExit(name: string, port: string, env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
    const child = spawn(process.execPath, ['--import', 'tsx', `examples/${name}/server.ts`], {
      cwd: root,
      env: { ...process.env, PORT: port, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    children.push(child)
    let stdout = ''
    let stderr = ''
    child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')))
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')))
    const timer = setTimeout(() => child.kill('SIGTERM'), 25_000)
    // 'close', not 'exit': stderr may still hold unread output at 'exit'.
    const [code] = (await once(child, 'close')) as [number | null]
    clearTimeout(timer)
    return { code, stdout, stderr }
  }

  for (const name of Object.keys(starts)) {
    it(`${name}: a port taken ends server.ts with one line naming it on stderr, exit 1 (regression: a stack trace)`, { timeout: 60_000 }, async () => {
      const taken = http.createServer()
      const port = await listen(taken)
      try {
        const { code, stderr } = await runToExit(name, String(port))
        expect(code).toBe(1)
        // That line, and no stack trace (a line of the runtime's own, a warning, is not this
        // test's business).
        expect(stderr).toMatch(new RegExp(`^PORT: cannot listen on 127\\.0\\.0\\.1:${port}: .*EADDRINUSE`, 'm'))
        expect(stderr).not.toMatch(/^\s+at /m)
      } finally {
        await close(taken)
      }
    })
  }

  it('fetch: the App\'s own service starts first, on UPSTREAM_PORT; a port taken ends server.ts with one line naming it, before the front server listens (regression: the front first, the upstream on any port and a stack trace)', { timeout: 60_000 }, async () => {
    const takenFront = http.createServer()
    const takenUpstream = http.createServer()
    const [front, upstream] = [await listen(takenFront), await listen(takenUpstream)]
    try {
      const { code, stdout, stderr } = await runToExit('fetch', String(front), { UPSTREAM_PORT: String(upstream) })
      expect(code).toBe(1)
      expect(stderr).toMatch(new RegExp(`^UPSTREAM_PORT: cannot listen on 127\\.0\\.0\\.1:${upstream}: .*EADDRINUSE`, 'm'))
      expect(stderr).not.toMatch(/^PORT:/m)
      expect(stderr).not.toMatch(/^\s+at /m)
      expect(stdout).toBe('')
    } finally {
      await close(takenFront)
      await close(takenUpstream)
    }
  })

  it('a PORT that is no port number is named on stderr, exit 2', { timeout: 60_000 }, async () => {
    const { code, stderr } = await runToExit('express', '80a')
    expect(code).toBe(2)
    expect(stderr).toMatch(/^PORT: must be a port number \(0: any free port\), got "80a"$/m)
    expect(stderr).not.toMatch(/^\s+at /m)
  })
})
