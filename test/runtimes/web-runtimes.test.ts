/**
 * The Web adapter under the runtimes docs/adapters.md names besides Node: Bun, Deno and workerd
 * (Cloudflare Workers' runtime), each serving the platform of `test/runtimes/app.ts` (the built
 * package, dist/, in front of the MCP SDK's web-standard transport): Bun and Deno on their own
 * HTTP server (`server.ts`), workerd as a bundled Worker (`worker.ts`, `workerd.ts`), driven over
 * loopback by raw requests and by the official MCP SDK client. The same checks run on each;
 * `workerd.test.ts` adds what is particular to Workers.
 *
 * The binaries come from the npm packages `bun`, `deno` and `workerd`, installed in a package of
 * their own (`npm ci --prefix test/runtimes`, which `.ci/run` does); the servers import dist/, so
 * `npm run build` comes first. Where a runtime is missing, its suite is skipped, saying so; under
 * .ci/run (MCP_DISPATCH_CI=1) it fails.
 */
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { forbiddenReply, methodNotAllowedReply, paymentRequiredReply, rateLimitedReply, unauthorizedReply, versionNotFoundReply } from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { underProjectCI } from '../helpers/ci.js'
import { awayFromMinuteEnd } from '../helpers/clock.js'
import { spawnServing } from '../helpers/serving-process.js'
import { loopbackFetch } from '../oauth/helpers/oauth-client.js'
import type { RuntimeTokens } from './app.js'
import { bundleWorker, startWorkerd, workerdBinary } from './workerd.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const installed = (path: string) => fileURLToPath(new URL(`./node_modules/${path}`, import.meta.url))
const SERVER = fileURLToPath(new URL('./server.ts', import.meta.url))

/** A runtime serving the platform on 127.0.0.1. */
interface Served {
  readonly port: number
  /** What the runtime wrote on stderr (and, for workerd, stdout) so far. */
  output(): string
  stop(): Promise<void>
}

/** Bun or Deno running `server.ts`, which prints `{ port }` once it listens. */
const serveWith = (command: string, args: readonly string[]): Promise<Served> => spawnServing(command, [...args, SERVER], ROOT)

const RUNTIMES = {
  bun: { binary: installed('.bin/bun'), start: () => serveWith(installed('.bin/bun'), ['run']) },
  // The Linux x64 build, installed as an optional dependency (test/runtimes/package.json).
  deno: {
    binary: installed('@deno/linux-x64-glibc/deno'),
    start: () => serveWith(installed('@deno/linux-x64-glibc/deno'), ['run', '--sloppy-imports', '--allow-net', '--allow-read', '--allow-env']),
  },
  // The platform's binary of the `workerd` package (Linux, macOS, Windows on x64 and arm64).
  workerd: { binary: workerdBinary(), start: async () => startWorkerd({ code: await bundleWorker('./worker.ts') }) },
} as const satisfies Record<string, { binary: string | undefined; start(): Promise<Served> }>

const dist = existsSync(`${ROOT}dist/adapters/web/index.js`)
const missingFor = (runtime: keyof typeof RUNTIMES) => {
  const binary = RUNTIMES[runtime].binary
  return [
    ...(binary !== undefined && existsSync(binary) ? [] : [`${runtime} (npm ci --prefix test/runtimes)`]),
    ...(dist ? [] : ['dist/ (npm run build)']),
  ]
}
for (const runtime of Object.keys(RUNTIMES) as Array<keyof typeof RUNTIMES>) {
  const missing = missingFor(runtime)
  if (missing.length === 0) continue
  const message = `[web-runtimes] ${missing.join(' and ')} missing`
  if (underProjectCI()) throw new Error(`${message}: under .ci/run (MCP_DISPATCH_CI) this suite fails instead of skipping`)
  console.warn(`${message}; the suite on ${runtime} skipped`)
}

const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })

describe.each(Object.keys(RUNTIMES) as Array<keyof typeof RUNTIMES>)('the Web adapter on %s', (runtime) => {
  let served: Served | undefined
  let port: number
  let tokens: RuntimeTokens
  const skipped = missingFor(runtime).length > 0
  const test = it.skipIf(skipped)
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
    if (skipped) return
    served = await RUNTIMES[runtime].start()
    port = served.port
    tokens = (await (await loopbackFetch(`http://control.localhost:${port}/tokens`)).json()) as RuntimeTokens
  }, 30_000)

  afterAll(async () => {
    await served?.stop()
  })

  test('answers refusals with the dispatch layer\'s bytes: 401, 402, 403, 404 version_not_found, HEAD, 429', async () => {
    const expectReply = async (response: Response, reply: { status: number; headers: Record<string, string>; body: string | null }) => {
      expect(response.status).toBe(reply.status)
      expect(await response.text()).toBe(reply.body)
      for (const [name, value] of Object.entries(reply.headers)) expect(response.headers.get(name), name).toBe(value)
      expect(response.headers.get('x-mcp-version')).toBeNull()
    }
    await expectReply(await post(app('/v1')), unauthorizedReply({ resourceMetadataUrl: `${app('')}/.well-known/oauth-protected-resource` }))
    await expectReply(await post(app('/v1'), tokens.bob), paymentRequiredReply())
    // Alice subscribes to notes, but her token is not scoped to it.
    await expectReply(await post(app('/v1', 'notes'), tokens.alice), forbiddenReply())
    await expectReply(await post(app('/v3.0.0'), tokens.alice), versionNotFoundReply('3.0.0', '1.1.0'))
    // HEAD: GET's challenge, then 405 past the credential, without bodies.
    const head = (token?: string) => loopbackFetch(app('/v1'), { method: 'HEAD', ...(token !== undefined && { headers: { authorization: `Bearer ${token}` } }) })
    // Each with the length of GET's answer, as the Node adapters send it.
    const headReply = (reply: { status: number; headers: Record<string, string>; body: string | null }) => ({
      ...reply,
      headers: { ...reply.headers, 'content-length': String(Buffer.byteLength(reply.body!)) },
      body: '',
    })
    await expectReply(await head(), headReply(unauthorizedReply({ resourceMetadataUrl: `${app('')}/.well-known/oauth-protected-resource` })))
    await expectReply(await head(tokens.alice), headReply(methodNotAllowedReply('GET, POST, DELETE, OPTIONS')))

    // Both in one minute of the fixed window.
    await awayFromMinuteEnd()
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

  test('serves the protected-resource metadata and stamps the version headers on the App\'s answer', async () => {
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

  test('pins an MCP SDK client\'s session to its version across a deploy; new connections resolve anew; DELETE ends the pin', async () => {
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
    expect(served!.output()).toBe('')
  })
})
