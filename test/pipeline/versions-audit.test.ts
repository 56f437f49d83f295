/**
 * Version resolution and pinning as a checker written from the spec (section 9) and DESIGN.md
 * ("Versions", pipeline steps 1, 6 and 7) tests them, with real components: the Web adapter,
 * the official MCP SDK client and SDK servers (one per App version), the in-memory stores and
 * real Redis (random key prefixes, two dispatcher instances).
 *
 * - Step 1: which paths are versions, and the two 404 bodies of DESIGN's table
 *   (`not_found` before authentication, `version_not_found` with `requested` and `latest`).
 * - The deploy rule against an independent model written with `semver`.
 * - `X-MCP-Version` exact on every answer of the MCP layer, absent on every refusal of steps 1-6.
 * - Pins: resolved without `Mcp-Session-Id`, kept across deploys (a replaced patch included, at
 *   every URL of its line, its exact URL too), never served at another version's exact URL or
 *   another line, 404 for unknown ids and other users, ended by DELETE and by the idle TTL, shared
 *   between instances through Redis.
 * - `routeByVersion` with a function: a version without a handler yet is served once one appears
 *   (regression: a factory answering `null` was kept, and the version never served).
 */
import { randomUUID } from 'node:crypto'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import fc from 'fast-check'
import {
  DeployRefusedError,
  type DispatcherOptions,
  applyDeploy,
  compileVersions,
  createDispatcher,
  createMemoryAppStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  resolveVersion,
} from 'mcp-dispatch'
import { createRedisSessionStore } from 'mcp-dispatch/redis'
import { type WebMcpHandler, mcpDispatch, routeByVersion } from 'mcp-dispatch/web'
import semver from 'semver'
import { afterEach, describe, expect, it } from 'vitest'
import { buildScenarioServer, createWebMcpHandler } from '../adapters/mcp.js'
import { describeRedis } from '../helpers/redis.js'

const MCP_ACCEPT = 'application/json, text/event-stream'
const INITIALIZE = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'audit', version: '1.0.0' } },
})
const GET_VERSION = JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'get_version', arguments: {} } })

/** Apps (slug = id without `app_`), users and their API tokens; `alice` and `carol` on every App. */
async function setup(versions: Record<string, readonly string[]>, options: Partial<DispatcherOptions> = {}) {
  const apps = createMemoryAppStore(Object.entries(versions).map(([slug, v]) => ({ id: `app_${slug}`, slug, name: slug, versions: v })))
  const ids = Object.keys(versions).map((slug) => `app_${slug}`)
  const subscriptions = createMemorySubscriptionStore(['alice', 'carol'].flatMap((userId) => ids.map((appId) => ({ userId, appId, active: true }))))
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  const alice = (await tokens.create({ userId: 'alice', name: 'a', servers: ids, expiresInDays: 30 })).token
  const carol = (await tokens.create({ userId: 'carol', name: 'c', servers: ids, expiresInDays: 30 })).token
  const errors: Array<{ error: unknown; context: string }> = []
  const dispatcherOptions: DispatcherOptions = {
    apps,
    subscriptions,
    tokens,
    authorizationServers: ['https://auth.example.com'],
    onError: (error, context) => void errors.push({ error, context }),
    ...options,
  }
  return { apps, alice, carol, errors, dispatcherOptions }
}

type Fetch = (input: string | URL | Request, init?: RequestInit) => Promise<Response>

/** The Web adapter in front of one SDK server per App version (`get_version` answers it). */
function webStack(dispatcherOptions: DispatcherOptions): { fetch: Fetch; close(): Promise<void> } {
  const closers: Array<() => Promise<void>> = []
  const handle = mcpDispatch({
    dispatcher: createDispatcher(dispatcherOptions),
    handler: routeByVersion((app, version) => {
      const sessions = createWebMcpHandler(() => buildScenarioServer(app.slug, version))
      closers.push(sessions.close)
      return (request) => sessions.handle(request)
    }),
  })
  return {
    fetch: (input, init) => handle(new Request(input, init), { clientAddress: '127.0.0.1' }),
    async close() {
      for (const close of closers) await close()
    },
  }
}

const stacks: Array<{ close(): Promise<void> }> = []
afterEach(async () => {
  for (const s of stacks.splice(0)) await s.close()
})

interface Answer {
  status: number
  version: string | null
  latest: string | null
  sessionId: string | null
  body: string
}

async function send(fetch: Fetch, url: string, init: { token?: string | undefined; sessionId?: string; method?: string; body?: string } = {}): Promise<Answer> {
  const method = init.method ?? 'POST'
  const response = await fetch(url, {
    method,
    headers: {
      ...(init.token !== undefined && { authorization: `Bearer ${init.token}` }),
      ...(init.sessionId !== undefined && { 'mcp-session-id': init.sessionId }),
      'content-type': 'application/json',
      accept: MCP_ACCEPT,
    },
    ...(method === 'POST' && { body: init.body ?? INITIALIZE }),
  })
  return {
    status: response.status,
    version: response.headers.get('x-mcp-version'),
    latest: response.headers.get('x-mcp-latest-version'),
    sessionId: response.headers.get('mcp-session-id'),
    body: await response.text(),
  }
}

const NOT_FOUND = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Not found', data: { error: 'not_found' } } }
const SESSION_NOT_FOUND = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Session not found', data: { error: 'session_not_found' } } }
const versionNotFound = (requested: string, latest: string | null) => ({
  jsonrpc: '2.0',
  id: null,
  error: { code: -32004, message: 'Version not found', data: { error: 'version_not_found', requested, latest } },
})

/** A refusal of steps 1-6: JSON-RPC body as given, and no version header. */
function expectRefusal(answer: Answer, status: number, body: unknown): void {
  expect({ status: answer.status, version: answer.version, latest: answer.latest, body: JSON.parse(answer.body) as unknown }).toEqual({
    status,
    version: null,
    latest: null,
    body,
  })
}

/** The version an SDK server answered `get_version` with, from a JSON or SSE body. */
function toolVersion(body: string): string | undefined {
  const json = body.startsWith('{') ? body : /^data: (.*)$/m.exec(body)?.[1]
  return (JSON.parse(json ?? 'null') as { result?: { content?: Array<{ text?: string }> } } | null)?.result?.content?.[0]?.text
}

describe('step 1 and 6: which URL gets which version, and the 404 bodies of DESIGN.md', () => {
  it('resolves the four patterns, tolerates one trailing slash, a query and encoded unreserved characters; the rest is not_found before authentication', async () => {
    const t = await setup({ weather: ['1.0.0', '1.2.2', '1.2.3', '1.3.0-rc.1', '2.0.0', '2.1.0-rc.1'] })
    const stack = webStack(t.dispatcherOptions)
    stacks.push(stack)
    // `null`: no credential.
    const at = (path: string, token: string | null = t.alice) => send(stack.fetch, `http://weather.localhost${path}`, { token: token ?? undefined })
    const served: Array<[string, string]> = [
      ['/', '2.0.0'],
      ['', '2.0.0'],
      ['/v1', '1.2.3'],
      ['/v1/', '1.2.3'],
      ['/v1.0', '1.0.0'],
      ['/v1.2', '1.2.3'],
      ['/v1.2.3', '1.2.3'],
      ['/v1.2.3/', '1.2.3'],
      ['/v1.3.0-rc.1', '1.3.0-rc.1'],
      ['/v2.1.0-rc.1/', '2.1.0-rc.1'],
      ['/v1?x=1', '1.2.3'],
      ['/v1.2/?a=%2F&b', '1.2.3'],
      ['/v%31', '1.2.3'],
      ['/v1%2E2', '1.2.3'],
      ['/%76%32', '2.0.0'],
    ]
    for (const [path, version] of served) {
      const answer = await at(path)
      expect({ path, status: answer.status, version: answer.version, latest: answer.latest }).toEqual({ path, status: 200, version, latest: '2.0.0' })
      // The SDK server of that very version answered (its `serverInfo.version`).
      expect(JSON.parse(/^data: (.*)$/m.exec(answer.body)![1]!).result.serverInfo.version).toBe(version)
    }
    const notFound = [
      '/v01', '/v1.02', '/v1.2.03', '/V1', '/v', '/v1.', '/v1..2', '/v1.2.3.4', '/v1.x', '/v1.2.3+build', '/v1.2.3-rc.1+b',
      '/v1.2.3-01', '/v1.2.3-', '/v9007199254740992', '/v1.9007199254740992', '/v1.2.9007199254740992', '/v99999999999999999999',
      '//', '//v1', '/v1//', '/v1/x', '/v1%2F', '/%2Fv1', '/v1;x', '/v%2531', '/latest', '/1.2.3', '/v-1', '/v1%20',
    ]
    for (const path of notFound) {
      // Before authentication: the same 404 with a token and without one.
      expectRefusal(await at(path), 404, NOT_FOUND)
      expectRefusal(await at(path, null), 404, NOT_FOUND)
    }
  })

  it('a version URL that matches nothing live is version_not_found, after authentication, with the selector as read and the latest release', async () => {
    const t = await setup({ weather: ['1.2.3', '1.3.0-rc.1', '2.0.0'], empty: [] })
    const stack = webStack(t.dispatcherOptions)
    stacks.push(stack)
    // `null`: no credential.
    const at = (path: string, token: string | null = t.alice, host = 'weather.localhost') => send(stack.fetch, `http://${host}${path}`, { token: token ?? undefined })
    const cases: Array<[string, string]> = [
      ['/v3', '3'],
      ['/v1.4', '1.4'],
      ['/v1.2.2', '1.2.2'],
      ['/v1.2.4', '1.2.4'],
      ['/v1.3', '1.3'], // only a pre-release is live in 1.3
      ['/v1.3.0', '1.3.0'],
      ['/v1.3.0-rc.2', '1.3.0-rc.2'],
      ['/v%33/', '3'],
      ['/v9007199254740991', '9007199254740991'],
      // Well formed, but no deploy makes a pre-release number past 2^53 - 1 live.
      ['/v1.2.3-rc.9007199254740993', '1.2.3-rc.9007199254740993'],
    ]
    for (const [path, requested] of cases) {
      expectRefusal(await at(path), 404, versionNotFound(requested, '2.0.0'))
      // Step 6 comes after authentication: without a credential, 401.
      expect((await at(path, null)).status).toBe(401)
    }
    expectRefusal(await at('/', t.alice, 'empty.localhost'), 404, versionNotFound('latest', null))
    expectRefusal(await at('/v1', t.alice, 'empty.localhost'), 404, versionNotFound('1', null))
  })

  it('only pre-releases live: none is picked by /, /v1 or /v1.0; each is served at its exact URL, and names the latest there', async () => {
    const t = await setup({ weather: ['1.0.0-rc.1', '2.0.0-beta.1'] })
    const stack = webStack(t.dispatcherOptions)
    stacks.push(stack)
    const at = (path: string) => send(stack.fetch, `http://weather.localhost${path}`, { token: t.alice })
    expectRefusal(await at('/'), 404, versionNotFound('latest', '2.0.0-beta.1'))
    expectRefusal(await at('/v1'), 404, versionNotFound('1', '2.0.0-beta.1'))
    expectRefusal(await at('/v1.0'), 404, versionNotFound('1.0', '2.0.0-beta.1'))
    const rc = await at('/v1.0.0-rc.1')
    expect([rc.status, rc.version, rc.latest]).toEqual([200, '1.0.0-rc.1', '2.0.0-beta.1'])
    // The release after its pre-release: the pre-release is retired, the release is latest.
    t.apps.deploy('app_weather', '1.0.0')
    expectRefusal(await at('/v1.0.0-rc.1'), 404, versionNotFound('1.0.0-rc.1', '1.0.0'))
    for (const path of ['/', '/v1', '/v1.0', '/v1.0.0']) {
      const answer = await at(path)
      expect([path, answer.status, answer.version, answer.latest]).toEqual([path, 200, '1.0.0', '1.0.0'])
    }
    const beta = await at('/v2.0.0-beta.1')
    expect([beta.status, beta.version, beta.latest]).toEqual([200, '2.0.0-beta.1', '1.0.0'])
  })
})

/**
 * The deploy rule as DESIGN.md states it, written independently with `semver`: per minor one
 * release, and at most one pre-release above it; a release replaces the release of its minor
 * and the pre-releases at or below it; a pre-release replaces the pre-release of its minor; a
 * deploy not above what its minor holds is refused.
 */
function modelDeploy(live: readonly string[], version: string): string[] | 'refused' {
  const next = semver.parse(version)!
  const sameMinor = (v: string) => semver.major(v) === next.major && semver.minor(v) === next.minor
  const others = live.filter((v) => !sameMinor(v))
  const release = live.find((v) => sameMinor(v) && semver.prerelease(v) === null)
  const pre = live.find((v) => sameMinor(v) && semver.prerelease(v) !== null)
  if (release !== undefined && semver.lte(version, release)) return 'refused'
  let kept: string[]
  if (next.prerelease.length > 0) {
    if (pre !== undefined && semver.lte(version, pre)) return 'refused'
    kept = release === undefined ? [] : [release]
  } else {
    kept = pre !== undefined && semver.gt(pre, version) ? [pre] : []
  }
  return [...others, ...kept, version].sort(semver.compare)
}

describe('the deploy rule against a semver model', () => {
  it('every deploy sequence: the same live set or the same refusal, and resolution picks what semver ranges pick among releases', () => {
    const version = fc
      .tuple(fc.nat(2), fc.nat(2), fc.nat(4), fc.constantFrom('', '', '-rc.1', '-rc.2', '-rc.10', '-beta', '-alpha.1', '-0', '-1', '-rc.1.a'))
      .map(([major, minor, patch, pre]) => `${major}.${minor}.${patch}${pre}`)
    fc.assert(
      fc.property(fc.array(version, { maxLength: 14 }), (sequence) => {
        let live: string[] = []
        for (const v of sequence) {
          const expected = modelDeploy(live, v)
          if (expected === 'refused') {
            expect(() => applyDeploy(live, v)).toThrow(DeployRefusedError)
            continue
          }
          live = applyDeploy(live, v)
          expect(live).toEqual(expected)
          const index = compileVersions(live)
          const releases = live.filter((x) => semver.prerelease(x) === null)
          expect(index.latest).toBe(releases.length > 0 ? semver.maxSatisfying(releases, '*') : (live.at(-1) ?? null))
          expect(resolveVersion(index, { kind: 'latest' })).toBe(semver.maxSatisfying(releases, '*'))
          for (const major of [0, 1, 2]) {
            expect(resolveVersion(index, { kind: 'major', major })).toBe(semver.maxSatisfying(releases, `${major}.x`))
            for (const minor of [0, 1, 2]) {
              expect(resolveVersion(index, { kind: 'minor', major, minor })).toBe(semver.maxSatisfying(releases, `${major}.${minor}.x`))
            }
          }
          for (const x of live) expect(resolveVersion(index, { kind: 'exact', version: x })).toBe(x)
        }
      }),
      { numRuns: 3000 },
    )
  })

  it('a refusal names the live version it is not above', () => {
    expect(() => applyDeploy(['1.2.3'], '1.2.3')).toThrow(/1\.2\.3 is live in 1\.2/)
    expect(() => applyDeploy(['1.2.3'], '1.2.2')).toThrow(/1\.2\.3 is live in 1\.2/)
    expect(() => applyDeploy(['1.2.3'], '1.2.3-rc.1')).toThrow(/1\.2\.3 is live in 1\.2/)
    expect(() => applyDeploy(['1.2.3', '1.2.5-rc.2'], '1.2.5-rc.1')).toThrow(/1\.2\.5-rc\.2 is live in 1\.2/)
    expect(() => applyDeploy(['1.2.3'], '1.2.4+build')).toThrow(DeployRefusedError)
  })
})

describe('a session (official SDK client) keeps its version', () => {
  it('across deploys that replace its patch: every answer of the MCP layer names it, at every URL of its line; other exact versions and lines are session_not_found', async () => {
    const t = await setup({ notes: ['1.0.0', '2.0.0'] })
    const stack = webStack(t.dispatcherOptions)
    stacks.push(stack)
    const seen: Array<[string, number, string | null, string | null]> = []
    const transport = new StreamableHTTPClientTransport(new URL('http://notes.localhost/v1'), {
      fetch: async (input, init) => {
        const response = await stack.fetch(input, init)
        seen.push([init?.method ?? 'GET', response.status, response.headers.get('x-mcp-version'), response.headers.get('x-mcp-latest-version')])
        return response
      },
      requestInit: { headers: { authorization: `Bearer ${t.alice}` } },
    })
    const client = new Client({ name: 'audit', version: '1.0.0' })
    await client.connect(transport)
    const sessionId = transport.sessionId!
    expect(sessionId).toBeTruthy()
    // The GET stream is open before the deploys (the SDK client opens it after `initialized`).
    const deadline = Date.now() + 5_000
    while (!seen.some(([method]) => method === 'GET') && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5))
    t.apps.deploy('app_notes', '1.0.1') // replaces the pinned 1.0.0
    t.apps.deploy('app_notes', '1.1.0')
    t.apps.deploy('app_notes', '2.1.0')
    const result = await client.callTool({ name: 'get_version', arguments: {} })
    expect(result.content).toEqual([{ type: 'text', text: '1.0.0' }])
    // Every exchange of the session: its version; the latest as it was at that moment.
    expect(seen.map(([method, status, version]) => [method, status < 300, version])).toEqual(seen.map(([method]) => [method, true, '1.0.0']))
    expect(seen.at(-1)![3]).toBe('2.1.0')

    const inSession = (path: string, token = t.alice, method = 'POST') =>
      send(stack.fetch, `http://notes.localhost${path}`, { token, sessionId, method, body: GET_VERSION })
    for (const path of ['/', '/v1', '/v1/', '/v1.0', '/v1.0.0']) {
      const answer = await inSession(path)
      expect([path, answer.status, answer.version, answer.latest, toolVersion(answer.body)]).toEqual([path, 200, '1.0.0', '2.1.0', '1.0.0'])
    }
    // An exact URL never serves another version, and another line does not hold the pin.
    for (const path of ['/v1.0.1', '/v1.1', '/v1.1.0', '/v2', '/v2.0.0', '/v2.1.0', '/v1.0.0-rc.1']) {
      expectRefusal(await inSession(path), 404, SESSION_NOT_FOUND)
    }
    // A new connection to the replaced patch: version_not_found.
    expectRefusal(await send(stack.fetch, 'http://notes.localhost/v1.0.0', { token: t.alice }), 404, versionNotFound('1.0.0', '2.1.0'))
    // Another user, an unknown id: 404; another user's DELETE does not end the session.
    expectRefusal(await inSession('/v1', t.carol), 404, SESSION_NOT_FOUND)
    expectRefusal(await inSession('/v1', t.carol, 'DELETE'), 404, SESSION_NOT_FOUND)
    expectRefusal(await send(stack.fetch, 'http://notes.localhost/v1', { token: t.alice, sessionId: randomUUID(), body: GET_VERSION }), 404, SESSION_NOT_FOUND)
    expect((await inSession('/v1')).version).toBe('1.0.0')
    // DELETE at a URL of another line does not end it either; at its own, it does.
    expectRefusal(await inSession('/v2', t.alice, 'DELETE'), 404, SESSION_NOT_FOUND)
    await transport.terminateSession()
    expect(seen.at(-1)!.slice(0, 3)).toEqual(['DELETE', 200, '1.0.0'])
    expectRefusal(await inSession('/v1'), 404, SESSION_NOT_FOUND)
    await client.close()
    expect(t.errors).toEqual([])
  })

  it('a session opened at a pre-release keeps it after the release retired it, at its exact URL only', async () => {
    const t = await setup({ notes: ['2.0.0', '2.1.0-rc.1'] })
    const stack = webStack(t.dispatcherOptions)
    stacks.push(stack)
    const opened = await send(stack.fetch, 'http://notes.localhost/v2.1.0-rc.1', { token: t.alice })
    expect([opened.status, opened.version, opened.latest]).toEqual([200, '2.1.0-rc.1', '2.0.0'])
    const sessionId = opened.sessionId!
    t.apps.deploy('app_notes', '2.1.0')
    const inSession = (path: string) => send(stack.fetch, `http://notes.localhost${path}`, { token: t.alice, sessionId, body: GET_VERSION })
    const answer = await inSession('/v2.1.0-rc.1')
    expect([answer.status, answer.version, answer.latest, toolVersion(answer.body)]).toEqual([200, '2.1.0-rc.1', '2.1.0', '2.1.0-rc.1'])
    for (const path of ['/', '/v2', '/v2.1', '/v2.1.0']) expectRefusal(await inSession(path), 404, SESSION_NOT_FOUND)
  })

  it('a request without Mcp-Session-Id resolves anew: stateless requests follow deploys, and a new session is pinned to what its URL resolves to then', async () => {
    const t = await setup({ notes: ['1.0.0'] })
    const stack = webStack(t.dispatcherOptions)
    stacks.push(stack)
    const first = await send(stack.fetch, 'http://notes.localhost/v1', { token: t.alice })
    t.apps.deploy('app_notes', '1.1.0')
    const second = await send(stack.fetch, 'http://notes.localhost/v1', { token: t.alice })
    expect([first.version, second.version]).toEqual(['1.0.0', '1.1.0'])
    expect(toolVersion((await send(stack.fetch, 'http://notes.localhost/v1', { token: t.alice, sessionId: first.sessionId!, body: GET_VERSION })).body)).toBe('1.0.0')
    expect(toolVersion((await send(stack.fetch, 'http://notes.localhost/v1', { token: t.alice, sessionId: second.sessionId!, body: GET_VERSION })).body)).toBe('1.1.0')
  })

  it('the idle TTL ends the pin; a request of the session restarts it', async () => {
    let clock = 1_000_000
    const now = () => clock
    const t = await setup({ notes: ['1.0.0'] }, { sessions: createMemorySessionStore({ now }), sessionTtlMs: 60_000 })
    const stack = webStack(t.dispatcherOptions)
    stacks.push(stack)
    const opened = await send(stack.fetch, 'http://notes.localhost/v1', { token: t.alice })
    const inSession = () => send(stack.fetch, 'http://notes.localhost/v1', { token: t.alice, sessionId: opened.sessionId!, body: GET_VERSION })
    clock += 59_000
    expect((await inSession()).status).toBe(200)
    clock += 59_000 // 118 s after the opening, 59 s after the last request
    expect((await inSession()).status).toBe(200)
    clock += 60_001
    expectRefusal(await inSession(), 404, SESSION_NOT_FOUND)
  })
})

describeRedis('pins shared through Redis', (redis) => {
  /** The instances' `sessionTtlMs`, on real time. */
  const IDLE_TTL_MS = 3_000
  it('a session opened on one instance keeps its version on another after deploys; other users, DELETE and the idle TTL as on one', async () => {
    const t = await setup({ notes: ['1.0.0', '2.0.0'] })
    const prefix = redis.prefix()
    /** An instance: its own dispatcher on the shared Redis; a stateless handler that answers its version. */
    const instance = () =>
      mcpDispatch({
        dispatcher: createDispatcher({ ...t.dispatcherOptions, sessions: createRedisSessionStore({ client: redis.client, prefix }), sessionTtlMs: IDLE_TTL_MS }),
        handler: (request, context) =>
          Response.json(
            { jsonrpc: '2.0', id: 7, result: { content: [{ type: 'text', text: context.version }] } },
            { headers: request.headers.has('mcp-session-id') ? {} : { 'mcp-session-id': randomUUID() } },
          ),
      })
    const [a, b] = [instance(), instance()]
    const on = (handle: typeof a): Fetch => (input, init) => handle(new Request(input, init), { clientAddress: '127.0.0.1' })
    const opened = await send(on(a), 'http://notes.localhost/v1', { token: t.alice })
    expect(opened.version).toBe('1.0.0')
    const sessionId = opened.sessionId!
    t.apps.deploy('app_notes', '1.0.1')
    t.apps.deploy('app_notes', '2.1.0')
    const onB = (path: string, token = t.alice, method = 'POST') => send(on(b), `http://notes.localhost${path}`, { token, sessionId, method, body: GET_VERSION })
    for (const path of ['/', '/v1', '/v1.0', '/v1.0.0']) {
      const answer = await onB(path)
      expect([path, answer.status, answer.version, answer.latest, toolVersion(answer.body)]).toEqual([path, 200, '1.0.0', '2.1.0', '1.0.0'])
    }
    for (const path of ['/v1.0.1', '/v2']) expectRefusal(await onB(path), 404, SESSION_NOT_FOUND)
    expectRefusal(await onB('/v1', t.carol), 404, SESSION_NOT_FOUND)
    // DELETE on B ends it on A.
    expect((await onB('/v1', t.alice, 'DELETE')).status).toBe(200)
    expectRefusal(await send(on(a), 'http://notes.localhost/v1', { token: t.alice, sessionId, body: GET_VERSION }), 404, SESSION_NOT_FOUND)
    // The idle TTL (kept by Redis): restarted by a request on A (the request on B comes past the
    // first TTL), ended past it. Each next request comes 0.6 of it later: a loaded host's stall
    // of over a second still leaves it within the TTL.
    const other = (await send(on(b), 'http://notes.localhost/v1', { token: t.alice })).sessionId!
    await new Promise((resolve) => setTimeout(resolve, 0.6 * IDLE_TTL_MS))
    expect((await send(on(a), 'http://notes.localhost/v1', { token: t.alice, sessionId: other, body: GET_VERSION })).status).toBe(200)
    await new Promise((resolve) => setTimeout(resolve, 0.6 * IDLE_TTL_MS))
    expect((await send(on(b), 'http://notes.localhost/v1', { token: t.alice, sessionId: other, body: GET_VERSION })).status).toBe(200)
    await new Promise((resolve) => setTimeout(resolve, IDLE_TTL_MS + 1_000))
    expectRefusal(await send(on(a), 'http://notes.localhost/v1', { token: t.alice, sessionId: other, body: GET_VERSION }), 404, SESSION_NOT_FOUND)
    expect(t.errors).toEqual([])
  })
})

describe('routeByVersion with a function', () => {
  it('a version the factory has no handler for yet (undefined or null) is served once it has one (regression: null was kept, the version never served)', async () => {
    const t = await setup({ notes: ['1.0.0'] })
    const registry = new Map<string, WebMcpHandler>()
    let calls = 0
    const handle = mcpDispatch({
      dispatcher: createDispatcher(t.dispatcherOptions),
      handler: routeByVersion((_app, version) => {
        calls++
        // A JavaScript factory (or one typed loosely) answering "none yet" with null.
        return (registry.get(version) ?? null) as unknown as WebMcpHandler | undefined
      }),
    })
    const fetch: Fetch = (input, init) => handle(new Request(input, init), { clientAddress: '127.0.0.1' })
    const before = await send(fetch, 'http://notes.localhost/v1', { token: t.alice })
    expect([before.status, JSON.parse(before.body).error.data]).toEqual([404, { error: 'version_not_served', version: '1.0.0' }])
    registry.set('1.0.0', () => new Response('served', { headers: { 'content-type': 'text/plain' } }))
    const after = await send(fetch, 'http://notes.localhost/v1', { token: t.alice })
    expect([after.status, after.version, after.body]).toEqual([200, '1.0.0', 'served'])
    // Once found, kept: the factory is not asked again.
    const calledBefore = calls
    await send(fetch, 'http://notes.localhost/v1', { token: t.alice })
    expect(calls).toBe(calledBefore)
  })
})
