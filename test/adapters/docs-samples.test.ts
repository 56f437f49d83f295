/**
 * The MCP handler samples of docs/adapters.md ("Your MCP handler: one SDK transport per
 * session") work as printed: the two code blocks are taken from the page, written to a module
 * and run, on the Web adapter (`webSessions`) and on Express 5 and 4 (`nodeSessions`), with two MCP SDK
 * clients each (a single transport per version would refuse the second) and an unknown session.
 * The Express wiring is the Express section's (no body parser: a malformed body is JSON-RPC
 * -32700, not Express's HTML error page). The `errorHandler` for `@hono/node-server` is taken
 * from the page too (regression: it answered a backslash path "Invalid Host header"). The
 * Fastify section's sample runs as printed too, beside a platform route of its own (the root
 * context's form answered such a route with the dispatch layer's 404). The one-shot sample runs
 * in front of the session samples on the Web adapter, Express and Fastify: a bare `tools/list`
 * (spec 4.1) is answered without a session.
 */
import { readFileSync } from 'node:fs'
import * as http from 'node:http'
import { type AddressInfo, connect } from 'node:net'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { getRequestListener } from '@hono/node-server'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import type { FastifyInstance } from 'fastify'
import type { AppRecord } from 'mcp-dispatch'
import * as expressAdapter from 'mcp-dispatch/express'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/web'
import { describe, expect, it, vi } from 'vitest'
import { buildAppServer } from '../../examples/platform/mcp-app.js'
import { createDemo } from '../../examples/shared/demo.js'
import { close, listen } from './helpers.js'
import { EXPRESS, EXPRESS_KINDS } from '../helpers/express.js'
import { codeBlocks, importBlock, importGenerated } from '../helpers/docs-samples.js'
import { localhostFetch } from '../helpers/platform.js'

interface Samples {
  webSessions(build: () => McpServer): (request: Request) => Promise<Response>
  nodeSessions(build: () => McpServer): (req: IncomingMessage, res: ServerResponse, body?: unknown) => Promise<void>
}

const root = new URL('../../', import.meta.url)

/** The `ts` code blocks of docs/adapters.md's section on MCP handlers, as one module. */
async function loadSamples(): Promise<Samples> {
  const blocks = codeBlocks('docs/adapters.md', '## Your MCP handler', '### One-shot requests')
  expect(blocks).toHaveLength(2)
  expect(blocks[0]).toContain('export function webSessions')
  expect(blocks[1]).toContain('export function nodeSessions')
  // Each block is a module of its own, with its imports, as a reader copies it.
  const modules = await Promise.all(blocks.map((block, i) => importGenerated<Partial<Samples>>(`adapters-sessions-${i}`, block)))
  return Object.assign({}, ...modules) as Samples
}

/** Two sessions in a row at `url`, each with its own SDK client; the version each saw. */
async function twoSessions(url: string, token: string): Promise<string[]> {
  const seen: string[] = []
  for (let i = 0; i < 2; i++) {
    const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${token}` } } })
    const client = new Client({ name: 'docs-samples', version: '1.0.0' })
    await client.connect(transport)
    const answer = await client.callTool({ name: 'get_version', arguments: {} })
    seen.push((answer.content as Array<{ text: string }>)[0]!.text)
    await transport.terminateSession()
    await client.close()
  }
  return seen
}

describe('docs/adapters.md: the MCP handler samples, as printed', () => {
  it('webSessions behind the Web adapter and nodeSessions behind Express: a session per client; an unknown one is 404 session_not_found', async () => {
    const { webSessions, nodeSessions } = await loadSamples()
    const demo = await createDemo()
    const handle = mcpDispatch({
      dispatcher: demo.dispatcher,
      handler: routeByVersion((app, version) => webSessions(() => buildAppServer(app, version))),
    })
    const web = http.createServer(getRequestListener((request) => handle(request, { clientAddress: '127.0.0.1' })))
    // As the Express section prints it, on Express 5 and 4: no body parser, the SDK transport reads the body.
    const nodes = EXPRESS_KINDS.map((kind) => {
      const app = EXPRESS[kind]()
      app.use(expressAdapter.mcpDispatch({ dispatcher: demo.dispatcher }))
      app.use(
        expressAdapter.routeByVersion((appRecord, version) => {
          const serve = nodeSessions(() => buildAppServer(appRecord, version))
          return (req, res) => serve(req, res)
        }),
      )
      return http.createServer(app)
    })
    const ports = [await listen(web), ...(await Promise.all(nodes.map((node) => listen(node))))]
    try {
      for (const port of ports) {
        expect(await twoSessions(`http://127.0.0.1:${port}/v1`, demo.token)).toEqual(['1.0.0', '1.0.0'])
        expect(await twoSessions(`http://127.0.0.1:${port}/`, demo.token)).toEqual(['2.0.0', '2.0.0'])
        // A body that is not JSON: JSON-RPC -32700 from the transport, never Express's HTML
        // page with a stack trace (what `express.json()` in front of it would give).
        const garbled = await fetch(`http://127.0.0.1:${port}/v1`, {
          method: 'POST',
          headers: { authorization: `Bearer ${demo.token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          body: '{"jsonrpc":',
        })
        expect(garbled.status).toBe(400)
        expect(garbled.headers.get('content-type')).toContain('application/json')
        expect(await garbled.json()).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32700 } })
        // Sessions only: a bare tools/list (spec 4.1) is the SDK's 400, as the page says.
        const bare = await fetch(`http://127.0.0.1:${port}/v1`, {
          method: 'POST',
          headers: { authorization: `Bearer ${demo.token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
        })
        expect(bare.status).toBe(400)
        expect(await bare.json()).toMatchObject({ error: { message: 'Bad Request: Server not initialized' } })
      }
      // A session the handler does not know (it restarted, say): the dispatch layer's own 404.
      const expected = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Session not found', data: { error: 'session_not_found' } } }
      const lost = { method: 'POST', headers: { 'mcp-session-id': 'gone', 'content-type': 'application/json' }, body: '{}' }
      const webAnswer = await webSessions(() => buildAppServer(demo.app, '1.0.0'))(new Request('http://127.0.0.1/v1', lost))
      expect(webAnswer.status).toBe(404)
      expect(await webAnswer.json()).toEqual(expected)
      const bare = http.createServer((req, res) => void nodeSessions(() => buildAppServer(demo.app, '1.0.0'))(req, res))
      try {
        const bareAnswer = await fetch(`http://127.0.0.1:${await listen(bare)}/v1`, lost)
        expect(bareAnswer.status).toBe(404)
        expect(await bareAnswer.json()).toEqual(expected)
      } finally {
        await close(bare)
      }
    } finally {
      await close(web)
      for (const node of nodes) await close(node)
    }
  })
})

type NodeHandler = (req: IncomingMessage, res: ServerResponse, body?: unknown) => Promise<void>

/** The one-shot sample of docs/adapters.md ("One-shot requests: a bare `tools/list`"). */
interface OneShotSample {
  webOneShot(build: () => McpServer, sessions: (request: Request) => Promise<Response>): (request: Request) => Promise<Response>
  nodeOneShot(build: () => McpServer, sessions: NodeHandler): NodeHandler
}

/**
 * An App version's server as the reference platform builds it, with one tool more, `wait`, which
 * answers only once its call is cancelled, and records that in `cancelled`.
 */
function withWait(build: () => McpServer, cancelled: { count: number; started: () => void }): () => McpServer {
  return () => {
    const server = build()
    server.registerTool('wait', { description: 'Answers once cancelled' }, async (extra) => {
      cancelled.started()
      await new Promise((resolve) => extra.signal.addEventListener('abort', resolve))
      cancelled.count++
      return { content: [] }
    })
    return server
  }
}

describe('docs/adapters.md: the one-shot sample, as printed', () => {
  it('in front of webSessions (Web adapter), nodeSessions on Express 5 and 4 (express.json) and on Fastify: a bare tools/list is answered in JSON without a session, whatever Accept takes JSON; sessions still open; a body past 4 MiB is 413; a client gone cancels its tools', async () => {
    const { webSessions, nodeSessions } = await loadSamples()
    const { webOneShot, nodeOneShot } = await importBlock<OneShotSample>('adapters-one-shot', 'docs/adapters.md', '### One-shot requests', '### The caller in your tools')
    const demo = await createDemo()
    let started = () => {}
    const cancelled = { count: 0, started: () => started() }
    const handle = mcpDispatch({
      dispatcher: demo.dispatcher,
      handler: routeByVersion((app, version) => {
        const build = withWait(() => buildAppServer(app, version), cancelled)
        return webOneShot(build, webSessions(build))
      }),
    })
    const web = http.createServer(getRequestListener((request) => handle(request, { clientAddress: '127.0.0.1' })))
    // As the page says: express.json({ limit: '4mb' }) after mcpDispatch, req.body handed on,
    // jsonRpcErrors() last.
    const nodes = EXPRESS_KINDS.map((kind) => {
      const app = EXPRESS[kind]()
      app.use(expressAdapter.mcpDispatch({ dispatcher: demo.dispatcher }))
      app.use(EXPRESS[kind].json({ limit: '4mb' }))
      app.use(
        expressAdapter.routeByVersion((appRecord, version) => {
          const build = withWait(() => buildAppServer(appRecord, version), cancelled)
          const serve = nodeOneShot(build, nodeSessions(build))
          return (req, res) => serve(req, res, req.body)
        }),
      )
      app.use(expressAdapter.jsonRpcErrors())
      return http.createServer(app)
    })
    // The Fastify section's sample, its nodeSessions wrapped.
    const fastify = await (await loadFastifySample())(
      demo.dispatcher,
      (build) => nodeOneShot(build, nodeSessions(build)),
      (appRecord, version) => withWait(() => buildAppServer(appRecord, version), cancelled)(),
    )
    await fastify.listen({ port: 0, host: '127.0.0.1' })
    const ports = [await listen(web), ...(await Promise.all(nodes.map((node) => listen(node)))), (fastify.server.address() as AddressInfo).port]
    const post = (port: number, body: string, accept?: string, signal?: AbortSignal) =>
      fetch(`http://127.0.0.1:${port}/v1`, {
        method: 'POST',
        headers: { authorization: `Bearer ${demo.token}`, 'content-type': 'application/json', ...(accept !== undefined && { accept }) },
        body,
        ...(signal && { signal }),
      })
    const toolsList = (id: number, params?: object) => ({ jsonrpc: '2.0', id, method: 'tools/list', ...(params && { params }) })
    const initialize = { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'curl', version: '1' } } }
    try {
      for (const [i, port] of ports.entries()) {
        const server = ['web', ...EXPRESS_KINDS, 'fastify'][i]
        // undici's fetch sends `Accept: */*` unless told: the README's curl, and no Accept at all.
        for (const accept of [undefined, '*/*', 'application/json', 'application/*', 'text/html, application/json;q=0.5', 'APPLICATION/JSON ; charset=utf-8']) {
          const answer = await post(port, JSON.stringify(toolsList(7)), accept)
          expect(answer.status, `${server}, Accept ${accept}`).toBe(200)
          expect(answer.headers.get('content-type')).toContain('application/json')
          expect(answer.headers.get('mcp-session-id')).toBeNull()
          expect(answer.headers.get('x-mcp-version')).toBe('1.0.0')
          expect(answer.headers.get('x-mcp-latest-version')).toBe('2.0.0')
          const body = await answer.json()
          expect(body).toMatchObject({ jsonrpc: '2.0', id: 7 })
          expect(body.result.tools.map((tool: { name: string }) => tool.name)).toContain('get_version')
        }
        // A call of a tool, and a batch of two: answered in JSON, the batch in an array.
        const called = await post(port, JSON.stringify({ jsonrpc: '2.0', id: 'c', method: 'tools/call', params: { name: 'get_version', arguments: {} } }))
        expect(await called.json(), server).toMatchObject({ id: 'c', result: { content: [{ type: 'text', text: '1.0.0' }] } })
        const batch = await post(port, JSON.stringify([toolsList(1), toolsList(2)]))
        expect(batch.status).toBe(200)
        expect((await batch.json()).map((m: { id: number }) => m.id).sort()).toEqual([1, 2])
        // A notification alone is accepted with no body.
        const notified = await post(port, JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }))
        expect(notified.status, server).toBe(202)
        // Past Express's default parser limit (100 kB), within the SDK's: served.
        const large = await post(port, JSON.stringify(toolsList(4, { _meta: { pad: 'x'.repeat(200_000) } })))
        expect(large.status, server).toBe(200)
        // Past the SDK's 4 MiB: 413, never read whole into memory by the sample.
        const tooLarge = await post(port, JSON.stringify(toolsList(5, { _meta: { pad: 'x'.repeat(4 * 1024 * 1024) } })))
        expect(tooLarge.status, server).toBe(413)
        expect(await tooLarge.json()).toMatchObject({ jsonrpc: '2.0', error: {} })
        // A client that takes no JSON goes to the sessions: the SDK's 406 (a type that only
        // begins like JSON's too).
        for (const accept of ['text/html', 'application/json-seq']) {
          const refused = await post(port, JSON.stringify(toolsList(3)), accept)
          expect(refused.status, `${server}, Accept ${accept}`).toBe(406)
        }
        // Bad JSON: JSON-RPC -32700 (the SDK transport's, or jsonRpcErrors' behind a parser).
        const garbled = await post(port, '{"jsonrpc":', 'application/json')
        expect(garbled.status, server).toBe(400)
        expect(await garbled.json()).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32700 } })
        // initialize, alone or in a batch, opens a session; one per client.
        const opened = await post(port, JSON.stringify([initialize]), 'application/json, text/event-stream')
        expect(opened.status, server).toBe(200)
        expect(opened.headers.get('mcp-session-id'), server).toBeTruthy()
        await opened.body?.cancel()
        expect(await twoSessions(`http://127.0.0.1:${port}/v1`, demo.token), server).toEqual(['1.0.0', '1.0.0'])
        // A client gone before its answer: its tool's call is cancelled (the one-shot server closed).
        const before = cancelled.count
        const inTool = new Promise<void>((resolve) => (started = resolve))
        const leaving = new AbortController()
        const call = post(port, JSON.stringify({ jsonrpc: '2.0', id: 'w', method: 'tools/call', params: { name: 'wait', arguments: {} } }), undefined, leaving.signal)
        await inTool
        leaving.abort()
        await expect(call).rejects.toThrow()
        await vi.waitFor(() => expect(cancelled.count, server).toBe(before + 1), { timeout: 3000 })
      }
    } finally {
      await close(web)
      for (const node of nodes) await close(node)
      await fastify.close()
    }
  })
})

/** The `errorHandler` for `@hono/node-server` that docs/adapters.md prints, as one module. */
async function loadErrorHandlerSample(): Promise<{ listener: http.RequestListener }> {
  const page = readFileSync(new URL('docs/adapters.md', root), 'utf8')
  const block = [...page.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!.replace(/^ {2}/gm, '')).find((b) => b.includes('errorHandler'))
  expect(block).toBeDefined()
  const source = `${block}\nexport { listener }\n`.replace('getRequestListener(app.fetch', 'getRequestListener((globalThis as unknown as { docsApp: { fetch: (r: Request) => Promise<Response> } }).docsApp.fetch')
  return importGenerated<{ listener: http.RequestListener }>('adapters-error-handler', source)
}

describe('docs/adapters.md: the @hono/node-server errorHandler, as printed', () => {
  it('a backslash path or a target that is no path is 404 not_found (as on the Node adapters), not "Invalid Host header", whatever the Host; a bad Host is 400 host; an upper-case Host is served; an empty one is 404', async () => {
    const demo = await createDemo()
    const handle = mcpDispatch({ dispatcher: demo.dispatcher, handler: () => new Response('served') })
    ;(globalThis as unknown as { docsApp: unknown }).docsApp = { fetch: (request: Request) => handle(request, { clientAddress: '127.0.0.1' }) }
    const { listener } = await loadErrorHandlerSample()
    const server = http.createServer(listener)
    const port = await listen(server)
    const send = (host: string, path: string, method = 'POST') =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const request = http.request({ host: '127.0.0.1', port, method, path, headers: { host, authorization: `Bearer ${demo.token}` }, agent: false }, (res) => {
          let body = ''
          res.setEncoding('utf8').on('data', (c: string) => (body += c)).on('end', () => resolve({ status: res.statusCode!, body }))
        })
        request.on('error', reject).end()
      })
    const notFound = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Not found', data: { error: 'not_found' } } }
    const badHost = { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Invalid Host header', data: { error: 'invalid_request', field: 'host' } } }
    try {
      const backslash = await send('weather.localhost', '/v1\\x')
      expect([backslash.status, JSON.parse(backslash.body)]).toEqual([404, notFound])
      const star = await send('weather.localhost', '*', 'OPTIONS')
      expect([star.status, JSON.parse(star.body)]).toEqual([404, notFound])
      // The same two behind a Host the URL parser has to read, and in absolute form: still the
      // target's fault (regression: 400 "Invalid Host header").
      for (const [host, path, method] of [
        ['weather.localhost:80', '*', 'OPTIONS'],
        ['weather.localhost', 'http://weather.localhost/v1\\x', 'POST'],
      ] as const) {
        const answer = await send(host, path, method)
        expect([answer.status, JSON.parse(answer.body)], `${method} ${path} (Host ${host})`).toEqual([404, notFound])
      }
      const absoluteBadHost = await send('weather.localhost', 'http://weather.localhost:99999/v1')
      expect([absoluteBadHost.status, JSON.parse(absoluteBadHost.body)]).toEqual([400, badHost])
      for (const host of ['weather.localhost:99999', 'a@weather.localhost']) {
        const answer = await send(host, '/v1')
        expect([answer.status, JSON.parse(answer.body)]).toEqual([400, badHost])
      }
      expect(await send('WEATHER.localhost', '/v1')).toEqual({ status: 200, body: 'served' })
      // An empty Host names no App: 404, as the page says of the Web adapter, not a bad Host.
      // (Raw: Node's client would send its own Host for an empty one.)
      const empty = await new Promise<string>((resolve, reject) => {
        let answer = ''
        const socket = connect(port, '127.0.0.1', () => socket.end('GET /.well-known/oauth-protected-resource HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n'))
        socket.setEncoding('utf8').on('data', (chunk: string) => (answer += chunk)).on('end', () => resolve(answer)).on('error', reject)
      })
      expect(empty.split('\r\n')[0]).toBe('HTTP/1.1 404 Not Found')
      expect(JSON.parse(empty.slice(empty.indexOf('\r\n\r\n') + 4))).toEqual(notFound)
    } finally {
      await close(server)
    }
  })
})

describe("README's integration sample, as printed", () => {
  it('runs: an MCP SDK client with an API token reaches each version through it, and a version not live is 404', async () => {
    const readme = readFileSync(new URL('README.md', root), 'utf8')
    const section = readme.slice(readme.indexOf('## Integration in 20 lines'))
    const block = /```ts\n([\s\S]*?)```/.exec(section)![1]!
    // The block as a module, plus what a reader's server adds: a token to call it with.
    const sample = await importGenerated<{ fetch: (request: Request) => Promise<Response>; tokens: import('mcp-dispatch').TokenService }>(
      'readme-integration',
      `${block}\nexport { tokens }\n`,
    )
    const made = await sample.tokens.create({ userId: 'u1', name: 'ci', servers: ['app_1'], expiresInDays: 7 })
    const server = http.createServer(getRequestListener((request) => sample.fetch(request)))
    const port = await listen(server)
    try {
      const seen: Record<string, string> = {}
      for (const path of ['/', '/v1.0', '/v1.0.0']) {
        // `weather.localhost` on loopback, as the README's quick start reaches it from Node.
        const transport = new StreamableHTTPClientTransport(new URL(`http://weather.localhost:${port}${path}`), {
          requestInit: { headers: { authorization: `Bearer ${made.token}` } },
          fetch: localhostFetch,
        })
        const client = new Client({ name: 'readme', version: '1.0.0' })
        await client.connect(transport)
        const result = await client.callTool({ name: 'get_version', arguments: {} })
        seen[path] = (result.content as Array<{ text: string }>)[0]!.text
        await client.close()
      }
      expect(seen).toEqual({ '/': '1.1.0', '/v1.0': '1.0.0', '/v1.0.0': '1.0.0' })
      const gone = await sample.fetch(new Request('http://weather.localhost/v1.0.1', { method: 'POST', headers: { authorization: `Bearer ${made.token}` }, body: '{}' }))
      expect(gone.status).toBe(404)
      expect((await gone.json()).error.data).toMatchObject({ error: 'version_not_found' })
    } finally {
      await close(server)
    }
  })
})

/** The Fastify section's sample of docs/adapters.md, as a function of what it leaves to the reader. */
async function loadFastifySample(): Promise<(
  dispatcher: unknown,
  nodeSessions: Samples['nodeSessions'],
  buildServer: (app: AppRecord, version: string) => McpServer,
) => Promise<FastifyInstance>> {
  const page = readFileSync(new URL('docs/adapters.md', root), 'utf8')
  const section = page.slice(page.indexOf('## Fastify'))
  const block = /```ts\n([\s\S]*?)```/.exec(section)![1]!
  const lines = block.split('\n')
  const imports = lines.filter((line) => line.startsWith('import '))
  const body = lines.filter((line) => !line.startsWith('import '))
  const source = `${imports.join('\n')}\nexport async function build(dispatcher: any, nodeSessions: any, buildServer: any) {\n${body.join('\n')}\nreturn app\n}\n`
  return (await importGenerated<{ build: never }>('adapters-fastify', source)).build
}

describe('docs/adapters.md: the Fastify sample, as printed', () => {
  it('serves the Apps from its context and leaves the platform\'s own route alone; Fastify\'s body errors are JSON-RPC errors, and an empty JSON DELETE ends its session', async () => {
    const { nodeSessions } = await loadSamples()
    const build = await loadFastifySample()
    const demo = await createDemo()
    const app = await build(demo.dispatcher, nodeSessions, (appRecord, version) => buildAppServer(appRecord, version))
    await app.listen({ port: 0, host: '127.0.0.1' })
    const base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
    try {
      expect(await twoSessions(`${base}/v1`, demo.token)).toEqual(['1.0.0', '1.0.0'])
      expect(await twoSessions(`${base}/`, demo.token)).toEqual(['2.0.0', '2.0.0'])
      // The platform's route: its own answer, no dispatch layer (no 401, no version headers).
      const health = await fetch(`${base}/health`)
      expect(health.status).toBe(200)
      expect(await health.json()).toEqual({ ok: true })
      expect(health.headers.get('x-mcp-latest-version')).toBeNull()
      // Every other path is the dispatch layer's: the metadata, and its 404 for an unknown path.
      expect((await fetch(`${base}/.well-known/oauth-protected-resource`)).status).toBe(200)
      const unknown = await fetch(`${base}/nope`, { method: 'POST' })
      expect(unknown.status).toBe(404)
      expect((await unknown.json()).error.data).toEqual({ error: 'not_found' })
      const headers = { authorization: `Bearer ${demo.token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
      // Bad JSON: JSON-RPC -32700, not Fastify's error object.
      const garbled = await fetch(`${base}/v1`, { method: 'POST', headers, body: '{"jsonrpc":' })
      expect(garbled.status).toBe(400)
      expect(await garbled.json()).toMatchObject({ jsonrpc: '2.0', error: { code: -32700 } })
      // No Content-Type: the SDK transport's 415, as on the other adapters.
      const untyped = await fetch(`${base}/v1`, { method: 'POST', headers: { authorization: headers.authorization, accept: headers.accept }, body: 'x' })
      expect(untyped.status).toBe(415)
      // A DELETE with the JSON type and no body (one header set for every request) ends the session.
      const opened = await fetch(`${base}/v1`, {
        method: 'POST',
        headers,
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'curl', version: '1' } } }),
      })
      expect(opened.status).toBe(200)
      const session = opened.headers.get('mcp-session-id')!
      await opened.body?.cancel()
      const ended = await fetch(`${base}/v1`, { method: 'DELETE', headers: { ...headers, 'mcp-session-id': session } })
      expect(ended.status).toBe(200)
      const after = await fetch(`${base}/v1`, {
        method: 'POST',
        headers: { ...headers, 'mcp-session-id': session, 'mcp-protocol-version': '2025-06-18' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }),
      })
      expect(after.status).toBe(404)
    } finally {
      await app.close()
    }
  })
})
