/**
 * The adapter examples (`examples/express`, `fastify`, `hono`, `fetch`) work: in process, the
 * official MCP SDK client runs a session through each; and each `server.ts` starts as
 * documented (`npx tsx examples/<x>/server.ts`) and answers an MCP request.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { fileURLToPath } from 'node:url'
import { serve } from '@hono/node-server'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { generateKeyPair } from 'jose'
import { invalidHostReply, sessionNotFoundReply } from 'mcp-dispatch'
import { createIdentitySigner } from 'mcp-dispatch/proxy'
import { afterAll, describe, expect, it } from 'vitest'
import { createExpressExample } from '../../examples/express/app.js'
import { createFastifyExample } from '../../examples/fastify/app.js'
import { createFetchHandler } from '../../examples/fetch/handler.js'
import { createUpstreamApp } from '../../examples/fetch/upstream.js'
import { createHonoExample } from '../../examples/hono/app.js'
import { type Demo, createDemo, createNodeSessions } from '../../examples/shared/demo.js'
import { APP_TOOLS, INITIALIZE } from '../helpers/platform.js'
import { close, listen, rawRequest } from './helpers.js'

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
    let upstreamOrigin = ''
    const handler = createFetchHandler({
      dispatcher: demo.dispatcher,
      signer,
      upstream: (context) => `${upstreamOrigin}/mcp/${context.version}`,
    })
    const front = await serveFetch((request, env) => handler(request, { clientAddress: env.incoming?.socket?.remoteAddress }))
    const app: { current?: ReturnType<typeof createUpstreamApp> } = {}
    const upstream = await serveFetch((request) => app.current!.fetch(request))
    upstreamOrigin = `http://127.0.0.1:${upstream.port}`
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
        expect(latest.tools).toEqual(APP_TOOLS)
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
      // @hono/node-server the errorHandler of docs/adapters.md), never an empty body.
      const badHost = await rawRequest(Number(started.port), { path: '/v1', host: 'we ather', headers: { authorization: `Bearer ${started.token}` } })
      expect([badHost.status, badHost.body]).toEqual([400, invalidHostReply().body])
      const exited = new Promise((resolve) => child.once('exit', resolve))
      child.kill('SIGTERM')
      await exited
    })
  }

  /** Runs `examples/<name>/server.ts` to its end; its exit code and stderr. */
  async function runToExit(name: string, port: string): Promise<{ code: number | null; stderr: string }> {
    const child = spawn(process.execPath, ['--import', 'tsx', `examples/${name}/server.ts`], {
      cwd: root,
      env: { ...process.env, PORT: port },
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    children.push(child)
    let stderr = ''
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')))
    // 'close', not 'exit': stderr may still hold unread output at 'exit'.
    const [code] = (await once(child, 'close')) as [number | null]
    return { code, stderr }
  }

  for (const name of Object.keys(starts)) {
    it(`${name}: a port taken ends server.ts with one line naming it on stderr, exit 1 (regression: a stack trace)`, async () => {
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

  it('a PORT that is no port number is named on stderr, exit 2', async () => {
    const { code, stderr } = await runToExit('express', '80a')
    expect(code).toBe(2)
    expect(stderr).toMatch(/^PORT: must be a port number \(0: any free port\), got "80a"$/m)
    expect(stderr).not.toMatch(/^\s+at /m)
  })
})
