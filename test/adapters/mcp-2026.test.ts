/**
 * MCP 2026-07-28 (stateless Streamable HTTP with request metadata headers) through the dispatch
 * layer, with the official SDK v2 on both sides: `@modelcontextprotocol/client` pinned to
 * 2026-07-28, and `@modelcontextprotocol/server`'s `createMcpHandler` in strict modern mode,
 * which answers 400 (`HeaderMismatch`) to a request whose `Mcp-Method`, `Mcp-Name` or
 * `Mcp-Param-{name}` headers are missing or disagree with the body.
 *
 * Each adapter (Web, Express, Fastify) serves the versions in process, and through the proxy
 * handler to upstream Apps on loopback. Every answer carries the version headers of the URL's
 * version; the proxied Apps get the request metadata headers and never the caller's token.
 */
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client'
import { generateKeyPair } from 'jose'
import { type ProxyHandler, createProxyHandler } from 'mcp-dispatch/proxy'
import { type WebMcpHandler, routeByVersion } from 'mcp-dispatch/web'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type ServedFetch, serveFetch } from '../helpers/platform.js'
import { ADAPTER_KINDS, type Fixture, HOST, createFixture, loopbackFetch, serveWebHandler } from './helpers.js'
import { MODERN, createModernApp } from './mcp-2026.js'

const VERSIONS = ['1.0.0', '2.0.0'] as const

/** What a proxied upstream App saw of one request. */
interface Seen {
  version: string
  headers: Record<string, string>
}

/** Connects an SDK v2 client pinned to 2026-07-28, recording the version headers of every answer. */
async function connect(url: string, token: string) {
  const answers: Array<{ status: number; version: string | null; latest: string | null }> = []
  const record = async (input: string | URL | Request, init?: RequestInit) => {
    const response = await loopbackFetch(input, init)
    answers.push({
      status: response.status,
      version: response.headers.get('x-mcp-version'),
      latest: response.headers.get('x-mcp-latest-version'),
    })
    return response
  }
  const client = new Client({ name: 'mcp-2026-test', version: '1.0.0' }, { versionNegotiation: { mode: { pin: MODERN } } })
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: record,
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  })
  await client.connect(transport)
  return { client, answers }
}

describe('MCP 2026-07-28 clients and Apps through the dispatch layer (SDK v2)', () => {
  let fixture: Fixture
  const upstreams = new Map<string, ServedFetch>()
  const seen: Seen[] = []
  let proxy: ProxyHandler
  let inProcess: WebMcpHandler

  beforeAll(async () => {
    fixture = createFixture()
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    const upstreamUrls: Record<string, string> = {}
    for (const version of VERSIONS) {
      const app = createModernApp(version)
      const served = await serveFetch((request) => {
        const headers: Record<string, string> = {}
        request.headers.forEach((value, name) => {
          if (name.startsWith('mcp-') || name === 'authorization') headers[name] = value
        })
        seen.push({ version, headers })
        return app.fetch(request)
      })
      upstreams.set(version, served)
      upstreamUrls[version] = `http://127.0.0.1:${served.port}/mcp`
    }
    proxy = createProxyHandler({ upstream: upstreamUrls, appId: 'app_weather', identity: { issuer: 'https://platform.test', privateKey } })
    const local = Object.fromEntries(VERSIONS.map((v) => [v, createModernApp(v)]))
    inProcess = routeByVersion(Object.fromEntries(VERSIONS.map((v) => [v, (request: Request) => local[v]!.fetch(request)])), {
      appId: 'app_weather',
    })
  })

  afterAll(async () => {
    for (const served of upstreams.values()) await served.close()
  })

  describe.each(ADAPTER_KINDS)('%s adapter', (kind) => {
    for (const mode of ['in process', 'proxied'] as const) {
      it(`${mode}: a pinned 2026-07-28 client lists and calls tools at /v1 and /, with the version headers on every answer`, async () => {
        const target = await serveWebHandler(kind, fixture, mode === 'proxied' ? proxy : inProcess)
        const before = seen.length
        try {
          for (const [path, version] of [
            ['/v1', '1.0.0'],
            ['/', '2.0.0'],
          ] as const) {
            const { client, answers } = await connect(`http://${HOST}:${target.port}${path}`, fixture.tokens.alice)
            try {
              const { tools } = await client.listTools()
              expect(tools.map((t) => t.name)).toEqual(['forecast', 'test_simple_text'])
              expect(tools[0]!.description).toBe(`Forecast (version ${version})`)
              const result = await client.callTool({ name: 'forecast', arguments: { region: 'eu-west-3', city: 'Paris' } })
              expect(result.content).toEqual([{ type: 'text', text: `${version}:Paris@eu-west-3` }])
              expect(answers.length).toBeGreaterThanOrEqual(3) // server/discover, tools/list, tools/call
              for (const answer of answers) expect(answer).toEqual({ status: 200, version, latest: '2.0.0' })
            } finally {
              await client.close()
            }
          }
        } finally {
          await target.close()
        }
        const proxied = seen.slice(before)
        if (mode === 'in process') {
          expect(proxied).toEqual([])
          return
        }
        // The upstream of each version got the request metadata headers, never the caller's token.
        expect(proxied.map((s) => [s.version, s.headers['mcp-method']])).toEqual([
          ['1.0.0', 'server/discover'],
          ['1.0.0', 'tools/list'],
          ['1.0.0', 'tools/call'],
          ['2.0.0', 'server/discover'],
          ['2.0.0', 'tools/list'],
          ['2.0.0', 'tools/call'],
        ])
        for (const call of proxied.filter((s) => s.headers['mcp-method'] === 'tools/call')) {
          expect(call.headers).toEqual({
            'mcp-protocol-version': MODERN,
            'mcp-method': 'tools/call',
            'mcp-name': 'forecast',
            'mcp-param-region': 'eu-west-3',
          })
        }
        for (const request of proxied) expect(request.headers.authorization).toBeUndefined()
      })
    }
  })

  it('the proxied App still refuses a call whose mirrored argument lost its header (the check is the App’s, and it works)', async () => {
    const target = await serveWebHandler('web', fixture, proxy)
    try {
      const body = JSON.stringify({
        jsonrpc: '2.0',
        id: 7,
        method: 'tools/call',
        params: {
          name: 'forecast',
          arguments: { region: 'eu-west-3', city: 'Paris' },
          _meta: {
            'io.modelcontextprotocol/protocolVersion': MODERN,
            'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1.0.0' },
            'io.modelcontextprotocol/clientCapabilities': {},
          },
        },
      })
      const response = await loopbackFetch(`http://${HOST}:${target.port}/v1`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${fixture.tokens.alice}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          'mcp-protocol-version': MODERN,
          'mcp-method': 'tools/call',
          'mcp-name': 'forecast',
        },
        body,
      })
      expect(response.status).toBe(400)
      expect(response.headers.get('x-mcp-version')).toBe('1.0.0')
      expect(((await response.json()) as { error: { code: number } }).error.code).toBe(-32020)
    } finally {
      await target.close()
    }
  })

  it('a browser preflight for a 2026-07-28 tool call is allowed every header the client sends', async () => {
    const target = await serveWebHandler('web', fixture, proxy)
    try {
      const response = await loopbackFetch(`http://${HOST}:${target.port}/v1`, {
        method: 'OPTIONS',
        headers: {
          origin: 'https://allowed.example',
          'access-control-request-method': 'POST',
          'access-control-request-headers': 'authorization,content-type,mcp-method,mcp-name,mcp-param-region,mcp-protocol-version',
        },
      })
      expect(response.status).toBe(204)
      const allowed = (response.headers.get('access-control-allow-headers') ?? '').toLowerCase().split(/\s*,\s*/)
      for (const name of ['authorization', 'content-type', 'mcp-method', 'mcp-name', 'mcp-param-region', 'mcp-protocol-version']) {
        expect(allowed).toContain(name)
      }
      expect(response.headers.get('vary')).toBe('Origin, Access-Control-Request-Headers')
    } finally {
      await target.close()
    }
  })
})
