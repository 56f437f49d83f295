/**
 * The Web adapter under the runtimes docs/adapters.md names besides Node: Bun and Deno, each
 * serving `test/runtimes/server.ts` (the built package, dist/, in front of the MCP SDK's
 * web-standard transport) on its own HTTP server, driven over loopback by raw requests and by
 * the official MCP SDK client.
 *
 * The binaries come from the npm packages `bun` and `deno`, installed in a package of their own
 * (`npm ci --prefix test/runtimes`, which `.ci/run` does); the server imports dist/, so
 * `npm run build` comes first. Without either, the suite is skipped, saying so; under CI it fails.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { paymentRequiredReply, rateLimitedReply, unauthorizedReply, versionNotFoundReply } from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { underCI } from '../helpers/ci.js'
import { loopbackFetch } from '../oauth/helpers/oauth-client.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const installed = (path: string) => fileURLToPath(new URL(`./node_modules/${path}`, import.meta.url))
const SERVER = fileURLToPath(new URL('./server.ts', import.meta.url))
const RUNTIMES = {
  bun: [installed('.bin/bun'), ['run', SERVER]],
  // The Linux x64 build, installed as an optional dependency (test/runtimes/package.json).
  deno: [installed('@deno/linux-x64-glibc/deno'), ['run', '--allow-net', '--allow-read', '--allow-env', SERVER]],
} as const

const missing = [
  ...(Object.values(RUNTIMES).every(([binary]) => existsSync(binary)) ? [] : ['the runtimes (npm ci --prefix test/runtimes)']),
  ...(existsSync(`${ROOT}dist/adapters/web/index.js`) ? [] : ['dist/ (npm run build)']),
]
if (missing.length > 0) {
  const message = `[web-runtimes] ${missing.join(' and ')} missing`
  if (underCI()) throw new Error(`${message}: under CI this suite fails instead of skipping`)
  console.warn(`${message}; suite skipped`)
}

const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })

describe.skipIf(missing.length > 0).each(Object.keys(RUNTIMES) as Array<keyof typeof RUNTIMES>)('the Web adapter on %s', (runtime) => {
  let child: ChildProcess
  let port: number
  let tokens: { alice: string; bob: string }
  let errors = ''
  const app = (path: string, slug = 'weather') => `http://${slug}.localhost:${port}${path}`
  const post = (url: string, token?: string) =>
    loopbackFetch(url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        ...(token !== undefined && { authorization: `Bearer ${token}` }),
      },
      body: TOOLS_LIST,
    })

  beforeAll(async () => {
    const [command, args] = RUNTIMES[runtime]
    child = spawn(command, [...args], { cwd: ROOT, env: { ...process.env, NO_COLOR: '1' }, stdio: ['ignore', 'pipe', 'pipe'] })
    child.stderr!.on('data', (chunk: Buffer) => (errors += chunk.toString()))
    const announced = await new Promise<{ port: number; tokens: { alice: string; bob: string } }>((resolve, reject) => {
      let out = ''
      const timer = setTimeout(() => reject(new Error(`${runtime} did not start within 20 s: ${errors}`)), 20_000)
      child.stdout!.on('data', (chunk: Buffer) => {
        out += chunk.toString()
        const line = out.split('\n').find((l) => l.startsWith('{'))
        if (line === undefined) return
        clearTimeout(timer)
        resolve(JSON.parse(line))
      })
      child.on('exit', (code) => {
        clearTimeout(timer)
        reject(new Error(`${runtime} exited (${code}): ${errors}`))
      })
    })
    port = announced.port
    tokens = announced.tokens
  }, 30_000)

  afterAll(async () => {
    if (!child || child.exitCode !== null) return
    const exited = new Promise((resolve) => child.once('exit', resolve))
    child.kill('SIGKILL')
    await exited
  })

  it('answers refusals with the dispatch layer\'s bytes: 401, 402, 404 version_not_found, 429', async () => {
    const expectReply = async (response: Response, reply: { status: number; headers: Record<string, string>; body: string | null }) => {
      expect(response.status).toBe(reply.status)
      expect(await response.text()).toBe(reply.body)
      for (const [name, value] of Object.entries(reply.headers)) expect(response.headers.get(name), name).toBe(value)
      expect(response.headers.get('x-mcp-version')).toBeNull()
    }
    await expectReply(await post(app('/v1')), unauthorizedReply({ resourceMetadataUrl: `${app('')}/.well-known/oauth-protected-resource` }))
    await expectReply(await post(app('/v1'), tokens.bob), paymentRequiredReply())
    await expectReply(await post(app('/v3.0.0'), tokens.alice), versionNotFoundReply('3.0.0', '1.1.0'))

    expect((await post(app('/', 'busy'), tokens.alice)).status).toBe(200)
    const limited = await post(app('/', 'busy'), tokens.alice)
    expect(limited.status).toBe(429)
    const retryAfter = Number(limited.headers.get('retry-after'))
    expect(retryAfter).toBeGreaterThan(0)
    const body = (await limited.json()) as { error: { code: number; data: { limit: number; windowType: string; retryAfter: number } } }
    expect(body.error).toMatchObject({ code: -32000, data: { limit: 1, windowType: 'minute', retryAfter } })
    expect(JSON.stringify(body)).toBe(
      rateLimitedReply({ limit: 1, windowType: 'minute', resetAt: (body.error.data as unknown as { resetAt: number }).resetAt, retryAfter }).body,
    )
  })

  it('serves the protected-resource metadata and stamps the version headers on the App\'s answer', async () => {
    const metadata = await loopbackFetch(app('/.well-known/oauth-protected-resource'))
    expect(metadata.status).toBe(200)
    expect(await metadata.json()).toEqual({
      resource: app(''),
      authorization_servers: ['https://auth.example.test'],
      bearer_methods_supported: ['header'],
      scopes_supported: ['openid', 'profile', 'email'],
      resource_name: 'Weather',
    })
    const served = await post(app('/v1.0'), tokens.alice)
    expect(served.status).toBe(200)
    expect(served.headers.get('x-mcp-version')).toBe('1.0.0')
    expect(served.headers.get('x-mcp-latest-version')).toBe('1.1.0')
    expect(served.headers.get('ratelimit-policy')).toBe('"minute";q=1000;w=60')
    expect(((await served.json()) as { result: { tools: Array<{ name: string }> } }).result.tools.map((t) => t.name)).toEqual(['get_version'])
  })

  it('pins an MCP SDK client\'s session to its version across a deploy; new connections resolve anew; DELETE ends the pin', async () => {
    const seen: Array<{ version: string | null; latest: string | null }> = []
    const recording = async (input: string | URL, init?: RequestInit) => {
      const response = await loopbackFetch(input, init)
      seen.push({ version: response.headers.get('x-mcp-version'), latest: response.headers.get('x-mcp-latest-version') })
      return response
    }
    const connect = async (path: string) => {
      const client = new Client({ name: `${runtime}-test`, version: '1.0.0' })
      const transport = new StreamableHTTPClientTransport(new URL(app(path)), { fetch: recording, requestInit: { headers: { authorization: `Bearer ${tokens.alice}` } } })
      await client.connect(transport)
      return { client, transport }
    }
    const versionOf = async (client: Client) => {
      const result = (await client.callTool({ name: 'get_version', arguments: {} })) as { content: Array<{ text: string }> }
      return result.content[0]!.text
    }

    const first = await connect('/v1')
    expect(await versionOf(first.client)).toBe('1.1.0')
    const deployed = await loopbackFetch(`http://control.localhost:${port}/deploy`, { method: 'POST', body: JSON.stringify({ version: '1.1.1' }) })
    expect(await deployed.json()).toEqual({ live: ['1.0.0', '1.1.1'] })

    // The open session keeps 1.1.0 (replaced, no longer live); the answers say a newer one exists.
    expect(await versionOf(first.client)).toBe('1.1.0')
    expect(seen.at(-1)).toEqual({ version: '1.1.0', latest: '1.1.1' })
    const second = await connect('/v1')
    expect(await versionOf(second.client)).toBe('1.1.1')
    // An exact URL of the replaced patch is no longer live.
    expect(((await (await post(app('/v1.1.0'), tokens.alice)).json()) as { error: { data: unknown } }).error.data).toEqual({
      error: 'version_not_found',
      requested: '1.1.0',
      latest: '1.1.1',
    })

    const sessionId = first.transport.sessionId!
    await first.transport.terminateSession()
    const after = await loopbackFetch(app('/v1'), {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${tokens.alice}`, 'mcp-session-id': sessionId },
      body: TOOLS_LIST,
    })
    expect(after.status).toBe(404)
    expect(((await after.json()) as { error: { data: unknown } }).error.data).toEqual({ error: 'session_not_found' })
    await first.client.close()
    await second.client.close()
    expect(errors).toBe('')
  })
})
