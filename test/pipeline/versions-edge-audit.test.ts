/**
 * Versions withdrawn outright while a session is pinned to them, through the dispatcher and the
 * Web adapter with the official MCP SDK client and SDK servers (one per App version): an
 * `AppStore` of the platform's own may take a version out of its live set without a deploy
 * replacing it (a rollback, an App withdrawn), which the in-memory store's `deploy` never does.
 *
 * Spec 9.2 rule 1: the version of a connection is fixed for its whole life; 9.3: both headers on
 * every valid MCP response, `X-MCP-Latest-Version` the latest deployed version. docs/versions.md:
 * with nothing live, a pinned session reads its own version as the latest.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  type AppStore,
  applyDeploy,
  createDispatcher,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/web'
import { afterEach, describe, expect, it } from 'vitest'
import { buildScenarioServer, createWebMcpHandler } from '../adapters/mcp.js'

/** An App store of a platform's own: `withdraw` takes a version out of the live set. */
function ownAppStore(initial: readonly string[]) {
  const app = Object.freeze({ id: 'app_notes', slug: 'notes', name: 'Notes' })
  let live: readonly string[] = Object.freeze([...initial])
  const store: AppStore & { withdraw(version: string): void } = {
    getApp: (id) => (id === app.id ? app : undefined),
    getAppBySlug: (slug) => (slug === app.slug ? app : undefined),
    getLiveVersions: (id) => (id === app.id ? live : []),
    deploy(_id, version) {
      live = Object.freeze(applyDeploy(live, version))
      return live
    },
    withdraw(version) {
      live = Object.freeze(live.filter((v) => v !== version))
    },
  }
  return store
}

const closers: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const close of closers.splice(0)) await close()
})

async function stack(initial: readonly string[]) {
  const apps = ownAppStore(initial)
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_notes', active: true }])
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  const token = (await tokens.create({ userId: 'alice', name: 'a', servers: ['app_notes'], expiresInDays: 30 })).token
  const errors: unknown[] = []
  const handle = mcpDispatch({
    dispatcher: createDispatcher({ apps, subscriptions, tokens, authorizationServers: ['https://auth.example.com'], onError: (e) => void errors.push(e) }),
    // The handlers stay: a withdrawn version's sessions go on (spec 9.2 rule 1).
    handler: routeByVersion((app, version) => {
      const sessions = createWebMcpHandler(() => buildScenarioServer(app.slug, version))
      closers.push(sessions.close)
      return (request) => sessions.handle(request)
    }),
  })
  const fetch = (input: string | URL | Request, init?: RequestInit) => handle(new Request(input, init), { clientAddress: '127.0.0.1' })
  return { apps, token, errors, fetch }
}

type Seen = [method: string, status: number, version: string | null, latest: string | null]

async function connect(s: Awaited<ReturnType<typeof stack>>, path: string) {
  const seen: Seen[] = []
  const transport = new StreamableHTTPClientTransport(new URL(`http://notes.localhost${path}`), {
    fetch: async (input, init) => {
      const response = await s.fetch(input, init)
      seen.push([init?.method ?? 'GET', response.status, response.headers.get('x-mcp-version'), response.headers.get('x-mcp-latest-version')])
      return response
    },
    requestInit: { headers: { authorization: `Bearer ${s.token}` } },
  })
  const client = new Client({ name: 'edge-audit', version: '1.0.0' })
  await client.connect(transport)
  closers.push(() => client.close())
  const version = async () => ((await client.callTool({ name: 'get_version', arguments: {} })).content as Array<{ text: string }>)[0]!.text
  return { client, transport, seen, version }
}

async function post(s: Awaited<ReturnType<typeof stack>>, path: string) {
  const response = await s.fetch(`http://notes.localhost${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } } }),
  })
  return { status: response.status, version: response.headers.get('x-mcp-version'), latest: response.headers.get('x-mcp-latest-version'), body: await response.text() }
}

const versionNotFound = (requested: string, latest: string | null) =>
  JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Version not found', data: { error: 'version_not_found', requested, latest } } })

describe('a version withdrawn outright while a session is pinned to it', () => {
  it('the session keeps it at every URL of its line; the latest is what is live; new connections resolve without it', async () => {
    const s = await stack(['1.0.0', '1.2.3', '2.0.0'])
    const c = await connect(s, '/v1')
    expect(await c.version()).toBe('1.2.3')
    s.apps.withdraw('1.2.3')
    s.apps.deploy('app_notes', '2.1.0')
    expect(await c.version()).toBe('1.2.3')
    expect(c.seen.at(-1)).toEqual(['POST', 200, '1.2.3', '2.1.0'])
    // New connections: /v1 now reaches 1.0.0; the withdrawn minor and exact URL are 404.
    expect(await post(s, '/v1')).toMatchObject({ status: 200, version: '1.0.0', latest: '2.1.0' })
    expect(await post(s, '/v1.2')).toEqual({ status: 404, version: null, latest: null, body: versionNotFound('1.2', '2.1.0') })
    expect(await post(s, '/v1.2.3')).toEqual({ status: 404, version: null, latest: null, body: versionNotFound('1.2.3', '2.1.0') })
    await c.transport.terminateSession()
    expect(c.seen.at(-1)).toEqual(['DELETE', 200, '1.2.3', '2.1.0'])
    expect(c.seen.every(([, status, version]) => status < 300 && version === '1.2.3')).toBe(true)
    expect(s.errors).toEqual([])
  })

  it('a rollback (the latest withdrawn) leaves its sessions on it; the latest header names what is live, lower than their version', async () => {
    const s = await stack(['1.2.3', '2.0.0'])
    const c = await connect(s, '/')
    expect(await c.version()).toBe('2.0.0')
    s.apps.withdraw('2.0.0')
    expect(await c.version()).toBe('2.0.0')
    expect(c.seen.at(-1)).toEqual(['POST', 200, '2.0.0', '1.2.3'])
    expect(await post(s, '/')).toMatchObject({ status: 200, version: '1.2.3', latest: '1.2.3' })
    expect(s.errors).toEqual([])
  })

  it('nothing live any more: the session goes on and reads its own version as the latest; new connections are 404 with latest null', async () => {
    const s = await stack(['1.2.3'])
    const c = await connect(s, '/v1.2')
    s.apps.withdraw('1.2.3')
    expect(await c.version()).toBe('1.2.3')
    expect(c.seen.at(-1)).toEqual(['POST', 200, '1.2.3', '1.2.3'])
    expect(await post(s, '/')).toEqual({ status: 404, version: null, latest: null, body: versionNotFound('latest', null) })
    await c.transport.terminateSession()
    expect(c.seen.at(-1)).toEqual(['DELETE', 200, '1.2.3', '1.2.3'])
    expect(s.errors).toEqual([])
  })

  it('only a pre-release left live: the session of a withdrawn release reads that pre-release as the latest', async () => {
    const s = await stack(['1.2.3', '2.0.0-rc.1'])
    const c = await connect(s, '/v1')
    s.apps.withdraw('1.2.3')
    expect(await c.version()).toBe('1.2.3')
    expect(c.seen.at(-1)).toEqual(['POST', 200, '1.2.3', '2.0.0-rc.1'])
    expect(await post(s, '/')).toEqual({ status: 404, version: null, latest: null, body: versionNotFound('latest', '2.0.0-rc.1') })
    expect(s.errors).toEqual([])
  })
})
