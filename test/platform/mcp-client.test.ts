/**
 * The official MCP SDK client (`Client` + `StreamableHTTPClientTransport` with an
 * `Authorization` header) through the reference platform over real HTTP on 127.0.0.1
 * (issue 2, "How we will check it"; spec 9.2: a version is fixed per connection), and the MCP
 * features every App serves for the conformance suite (examples/platform/conformance-features.ts):
 * what the official runner (test/platform/conformance.test.ts) does not check itself (exact
 * payloads, the log level, resource updates, refused answers) or cannot reach here (resuming a
 * stream the server closed, which it only tries with protocol 2025-03-26).
 *
 * The SDK v2 client (`@modelcontextprotocol/client`, MCP 2026-07-28) connects too: the Apps
 * run SDK v1 servers, so it falls back to the 2025 handshake, through the dispatch layer.
 *
 * Node's `fetch` does not resolve `*.localhost` (it asks the system resolver) and drops a
 * hand-set `Host` header, so the transport gets `localhostFetch` (test/helpers), which maps
 * `*.localhost` to 127.0.0.1 the way browsers and curl do and keeps the real `Host`.
 */
import { Client as ClientV2, StreamableHTTPClientTransport as StreamableHTTPClientTransportV2 } from '@modelcontextprotocol/client'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  type ClientCapabilities,
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import {
  APP_TOOLS,
  INITIALIZE,
  MODERN_APP_TOOLS,
  type ServedPlatform,
  TOOLS_LIST,
  bodies,
  challenge,
  createTestPlatform,
  json,
  localhostFetch,
  servePlatform,
} from '../helpers/platform.js'

interface Seen {
  method: string
  status: number
  version: string | null
  latest: string | null
  /** The `Last-Event-ID` of a request that resumes a stream. */
  lastEventId?: string
}

interface Connection {
  client: Client
  transport: StreamableHTTPClientTransport
  /** Every HTTP exchange of this connection, in order. */
  seen: Seen[]
  /** What the `get_version` tool of the serving App says. */
  toolVersion(): Promise<string>
}

let platform: Platform
let served: ServedPlatform
let token: (name: string) => string
let errors: Array<{ error: unknown; context: string }>
let open: Client[]

beforeEach(async () => {
  ;({ platform, token, errors } = createTestPlatform())
  served = await servePlatform(platform)
  open = []
})
afterEach(async () => {
  await Promise.all(open.map((c) => c.close()))
  await served.close()
  await platform.close()
  expect(errors).toEqual([])
})

function transportFor(path: string, tokenName: string | undefined, seen: Seen[]): StreamableHTTPClientTransport {
  return new StreamableHTTPClientTransport(new URL(`${served.origin('weather')}${path}`), {
    ...(tokenName !== undefined && { requestInit: { headers: { Authorization: `Bearer ${token(tokenName)}` } } }),
    fetch: async (url, init) => {
      const response = await localhostFetch(url, init)
      const lastEventId = new Headers(init?.headers).get('last-event-id')
      seen.push({
        method: init?.method ?? 'GET',
        status: response.status,
        version: response.headers.get('x-mcp-version'),
        latest: response.headers.get('x-mcp-latest-version'),
        ...(lastEventId !== null && { lastEventId }),
      })
      return response
    },
  })
}

async function connect(path: string, tokenName = 'alice', capabilities: ClientCapabilities = {}): Promise<Connection> {
  const seen: Seen[] = []
  const transport = transportFor(path, tokenName, seen)
  const client = new Client({ name: 'e2e-client', version: '1.0.0' }, { capabilities })
  await client.connect(transport)
  open.push(client)
  return {
    client,
    transport,
    seen,
    async toolVersion() {
      const result = await client.callTool({ name: 'get_version', arguments: {} })
      return (result.structuredContent as { version: string }).version
    },
  }
}

/** A raw MCP POST on an existing session (what a client that lost track would send). */
function postOnSession(path: string, sessionId: string, tokenName: string, body: unknown = TOOLS_LIST) {
  return localhostFetch(`${served.origin('weather')}${path}`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${token(tokenName)}`,
      accept: 'application/json, text/event-stream',
      'content-type': 'application/json',
      'mcp-session-id': sessionId,
      'mcp-protocol-version': '2025-06-18',
    },
    body: JSON.stringify(body),
  })
}

describe('connecting at every URL pattern (spec 9.1)', () => {
  it.each([
    ['/', '2.0.0'],
    ['/v1', '1.1.1'],
    ['/v1.1', '1.1.1'],
    ['/v1.1.1', '1.1.1'],
    ['/v1.0', '1.0.0'],
    ['/v2', '2.0.0'],
  ])('%s: lists tools, calls one, and sees %s everywhere', async (path, version) => {
    const c = await connect(path)
    expect(c.client.getServerVersion()).toMatchObject({ name: 'weather', version })
    const { tools } = await c.client.listTools()
    expect(tools.map((t) => t.name).sort()).toEqual(APP_TOOLS)
    expect(tools.find((t) => t.name === 'get_version')?.description).toContain(`(${version})`)
    expect(await c.toolVersion()).toBe(version)
    const echo = await c.client.callTool({ name: 'echo', arguments: { text: 'hi' } })
    expect(echo.content).toEqual([{ type: 'text', text: `hi (from weather ${version})` }])
    // Every response of the connection (POSTs, the GET stream) carries both headers.
    expect(c.seen.length).toBeGreaterThanOrEqual(5)
    for (const exchange of c.seen) {
      expect(exchange.status).toBeLessThan(300)
      expect(exchange).toMatchObject({ version, latest: '2.0.0' })
    }
    expect(c.transport.sessionId).toEqual(expect.any(String))
  })

  it('progress notifications stream through the dispatch layer (SSE, unbuffered)', async () => {
    const c = await connect('/v1')
    const progress: number[] = []
    const result = await c.client.callTool({ name: 'count', arguments: { n: 5 } }, undefined, {
      onprogress: (p) => progress.push(p.progress),
    })
    expect(progress).toEqual([1, 2, 3, 4, 5])
    expect(result.content).toEqual([{ type: 'text', text: 'counted to 5 (1.1.1)' }])
  })

  it('an exact version that is not live refuses the connection with 404', async () => {
    const seen: Seen[] = []
    const client = new Client({ name: 'e2e-client', version: '1.0.0' })
    await expect(client.connect(transportFor('/v1.1.0', 'alice', seen))).rejects.toMatchObject({ code: 404 })
    expect(seen[0]).toEqual({ method: 'POST', status: 404, version: null, latest: null })
  })

  it('without a token the connection is refused with 401 and the metadata challenge', async () => {
    const client = new Client({ name: 'e2e-client', version: '1.0.0' })
    const seen: Seen[] = []
    const error = await client.connect(transportFor('/v1', undefined, seen)).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(StreamableHTTPError)
    expect(error).toMatchObject({ code: 401 })
    const raw = await localhostFetch(`${served.origin('weather')}/v1`, { method: 'POST', body: '{}' })
    expect(raw.headers.get('www-authenticate')).toBe(
      challenge('weather', false).replace('weather.localhost', `weather.localhost:${served.port}`),
    )
  })
})

describe('a deploy during a session (spec 9.2 rules 1 and 2)', () => {
  it('does not change the version of an open session; a new session sees the new one', async () => {
    const old = await connect('/v1')
    expect(await old.toolVersion()).toBe('1.1.1')

    platform.deploy('app_weather', '1.1.2') // replaces 1.1.1: it is no longer live
    platform.deploy('app_weather', '2.1.0')

    // The open session keeps 1.1.1, and is told that a newer version exists.
    expect(await old.toolVersion()).toBe('1.1.1')
    expect((await old.client.listTools()).tools.find((t) => t.name === 'echo')?.description).toContain('1.1.1')
    expect(old.seen.at(-1)).toMatchObject({ status: 200, version: '1.1.1', latest: '2.1.0' })

    const fresh = await connect('/v1')
    expect(fresh.client.getServerVersion()?.version).toBe('1.1.2')
    expect(await fresh.toolVersion()).toBe('1.1.2')
    expect(fresh.seen.at(-1)).toMatchObject({ version: '1.1.2', latest: '2.1.0' })
    expect(await (await connect('/')).toolVersion()).toBe('2.1.0')

    // Both sessions keep answering side by side.
    expect(await old.toolVersion()).toBe('1.1.1')
    expect(await fresh.toolVersion()).toBe('1.1.2')
  })

  it('a session opened at an exact URL keeps it after that version stops being live; new sessions there get 404', async () => {
    const exact = await connect('/v1.1.1')
    platform.deploy('app_weather', '1.1.2')
    expect(await exact.toolVersion()).toBe('1.1.1')
    const client = new Client({ name: 'e2e-client', version: '1.0.0' })
    await expect(client.connect(transportFor('/v1.1.1', 'alice', []))).rejects.toMatchObject({ code: 404 })
  })
})

describe('clients that send no Accept, or */* (spec 4.1 lists no Accept; curl sends */*)', () => {
  for (const accept of [undefined, '*/*']) {
    it(`${accept ?? 'no Accept'}: initialize opens a session, whose requests and GET stream are served`, async () => {
      const post = (body: unknown, sessionId?: string) =>
        localhostFetch(`${served.origin('weather')}/v1`, {
          method: 'POST',
          headers: {
            authorization: `Bearer ${token('alice')}`,
            'content-type': 'application/json',
            ...(accept && { accept }),
            ...(sessionId && { 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }),
          },
          body: JSON.stringify(body),
        })
      const opened = await post(INITIALIZE)
      expect(opened.status).toBe(200)
      expect(opened.headers.get('x-mcp-version')).toBe('1.1.1')
      const sessionId = opened.headers.get('mcp-session-id')!
      expect(sessionId).toBeTruthy()
      await opened.text()
      const listed = await post(TOOLS_LIST, sessionId)
      expect(listed.status).toBe(200)
      expect(await listed.text()).toContain('get_version')
      const controller = new AbortController()
      const stream = await localhostFetch(`${served.origin('weather')}/v1`, {
        headers: {
          authorization: `Bearer ${token('alice')}`,
          'mcp-session-id': sessionId,
          'mcp-protocol-version': '2025-06-18',
          ...(accept && { accept }),
        },
        signal: controller.signal,
      })
      expect(stream.status).toBe(200)
      expect(stream.headers.get('content-type')).toContain('text/event-stream')
      controller.abort()
      await stream.body?.cancel().catch(() => {})
    })
  }
})

describe('a request in a session with an MCP-Protocol-Version the session cannot take', () => {
  it('gets the 2025 transport\'s 400 naming the versions it supports (not the 2026 leg\'s missing-_meta error)', async () => {
    const post = (body: unknown, headers: Record<string, string> = {}) =>
      localhostFetch(`${served.origin('weather')}/v1`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token('alice')}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
        body: JSON.stringify(body),
      })
    const opened = await post(INITIALIZE)
    const sessionId = opened.headers.get('mcp-session-id')!
    await opened.text()
    for (const claimed of ['2099-01-01', 'garbage']) {
      const answer = await post(TOOLS_LIST, { 'mcp-session-id': sessionId, 'mcp-protocol-version': claimed })
      expect(answer.status, claimed).toBe(400)
      const error = (await answer.json()).error
      expect(error.message, claimed).toContain(`Unsupported protocol version: ${claimed}`)
      expect(error.message, claimed).toContain('2025-06-18')
    }
    // The session is still served with a version it takes.
    const listed = await post(TOOLS_LIST, { 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' })
    expect(listed.status).toBe(200)
  })
})

describe('JSON-RPC batches: served under MCP 2025-03-26 only (2025-06-18 removed them)', () => {
  const post = (body: unknown, headers: Record<string, string> = {}) =>
    localhostFetch(`${served.origin('weather')}/v1`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token('alice')}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
      body: JSON.stringify(body),
    })
  const BATCH = [TOOLS_LIST, { jsonrpc: '2.0', id: 2, method: 'ping' }]
  const refused = { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Invalid Request: JSON-RPC batches are not part of MCP 2025-06-18 and later' } }

  for (const revision of ['2025-03-26', '2025-06-18', '2025-11-25']) {
    it(`a session that negotiated ${revision}: a batch without MCP-Protocol-Version is judged by that revision, as with it`, async () => {
      const opened = await post({ ...INITIALIZE, params: { ...INITIALIZE.params, protocolVersion: revision } })
      expect(opened.status).toBe(200)
      expect(await opened.text()).toContain(`"protocolVersion":"${revision}"`)
      const sessionId = opened.headers.get('mcp-session-id')!
      const initialized = await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, { 'mcp-session-id': sessionId, 'mcp-protocol-version': revision })
      expect(initialized.status).toBe(202)
      const forms: Array<Record<string, string>> = [{ 'mcp-session-id': sessionId }, { 'mcp-session-id': sessionId, 'mcp-protocol-version': revision }]
      for (const headers of forms) {
        const answer = await post(BATCH, headers)
        if (revision === '2025-03-26') {
          expect(answer.status).toBe(200)
          const text = await answer.text()
          expect(text).toContain('get_version')
          expect(text).toContain('"id":2')
        } else {
          expect(answer.status).toBe(400)
          expect(await answer.json()).toEqual(refused)
        }
      }
    })
  }

  it('without a session and without MCP-Protocol-Version, a batch is taken for 2025-03-26 and served', async () => {
    const answer = await post(BATCH)
    expect(answer.status).toBe(200)
    expect(await answer.text()).toContain('get_version')
    const later = await post(BATCH, { 'mcp-protocol-version': '2025-06-18' })
    expect(later.status).toBe(400)
    expect(await later.json()).toEqual(refused)
  })

  it('a batch that gets one response gets it in an array (JSON-RPC 2.0 section 6; the SDK transport answered it alone)', async () => {
    for (const batch of [[{ jsonrpc: '2.0', id: 7, method: 'ping' }], [{ jsonrpc: '2.0', id: 7, method: 'ping' }, { jsonrpc: '2.0', method: 'notifications/initialized' }]]) {
      const answer = await post(batch)
      expect(answer.status).toBe(200)
      expect(answer.headers.get('content-type')).toMatch(/^application\/json/)
      expect(answer.headers.get('x-mcp-version')).toBe('1.1.1')
      expect(await answer.json()).toEqual([{ jsonrpc: '2.0', id: 7, result: {} }])
    }
    // A single request is still answered with a single response.
    const single = await post({ jsonrpc: '2.0', id: 8, method: 'ping' })
    expect(await single.json()).toEqual({ jsonrpc: '2.0', id: 8, result: {} })
  })
})

describe('session pins (DESIGN.md "Versions")', () => {
  it('DELETE ends the session: its id is then unknown (404)', async () => {
    const c = await connect('/v1')
    const sessionId = c.transport.sessionId!
    expect((await postOnSession('/v1', sessionId, 'alice')).status).toBe(200)
    await c.transport.terminateSession()
    expect(c.seen.at(-1)).toMatchObject({ method: 'DELETE', status: 200 })
    const after = await postOnSession('/v1', sessionId, 'alice')
    expect(after.status).toBe(404)
    expect(await json(after)).toEqual(bodies.sessionNotFound)
  })

  it('a session id presented by another identity is 404, and the owner keeps the session', async () => {
    const c = await connect('/v1')
    const stolen = await postOnSession('/v1', c.transport.sessionId!, 'carol')
    expect(stolen.status).toBe(404)
    expect(stolen.headers.get('x-mcp-version')).toBeNull()
    expect(await json(stolen)).toEqual(bodies.sessionNotFound)
    expect(await c.toolVersion()).toBe('1.1.1')
  })

  it('another token of the same owner may continue the session (identity is the user)', async () => {
    const c = await connect('/v1', 'alice')
    const response = await postOnSession('/v1', c.transport.sessionId!, 'alice-all')
    expect(response.status).toBe(200)
    expect(response.headers.get('x-mcp-version')).toBe('1.1.1')
  })

  it('an unknown session id is 404', async () => {
    const response = await postOnSession('/v1', '1f7c1a52-0000-4000-8000-000000000000', 'alice')
    expect(response.status).toBe(404)
    expect(await json(response)).toEqual(bodies.sessionNotFound)
  })

  it('a session is bound to the version line of its URL: a /v1 session used at /v2 is 404', async () => {
    const c = await connect('/v1')
    const response = await postOnSession('/v2', c.transport.sessionId!, 'alice')
    expect(response.status).toBe(404)
    expect(await json(response)).toEqual(bodies.sessionNotFound)
  })

  it('a session pinned to a pre-release is served only at its exact URL: /, /v2 and /v2.1 refuse it (404)', async () => {
    platform.deploy('app_weather', '2.1.0-rc.1')
    const rc = await connect('/v2.1.0-rc.1')
    expect(await rc.toolVersion()).toBe('2.1.0-rc.1')
    for (const path of ['/', '/v2', '/v2.1']) {
      const response = await postOnSession(path, rc.transport.sessionId!, 'alice')
      expect(response.status).toBe(404)
      expect(await json(response)).toEqual(bodies.sessionNotFound)
    }
    expect((await postOnSession('/v2.1.0-rc.1', rc.transport.sessionId!, 'alice')).status).toBe(200)
  })

  it('localhostFetch, handed a signal already aborted, rejects as fetch does (it once crashed the process)', async () => {
    await expect(localhostFetch(`${served.origin('weather')}/v1`, { signal: AbortSignal.abort() })).rejects.toMatchObject({ name: 'AbortError' })
  })

  it('revoking the token ends access at once, even inside an open session', async () => {
    const c = await connect('/v1', 'alice-week')
    expect(await c.toolVersion()).toBe('1.1.1')
    const id = (await platform.tokenService.list('user_alice')).find((t) => t.name === 'alice-week')!.id
    await platform.tokenService.revoke('user_alice', id)
    await expect(c.toolVersion()).rejects.toMatchObject({ code: 401 })
    expect(c.seen.at(-1)).toEqual({ method: 'POST', status: 401, version: null, latest: null })
  })
})

describe('the MCP features of the conformance suite', () => {
  describe('content tools', () => {
    it('answer with the documented content of each type', async () => {
      const { client } = await connect('/v1')
      expect((await client.callTool({ name: 'test_simple_text' })).content).toEqual([
        { type: 'text', text: 'This is a simple text response for testing.' },
      ])
      const [image] = (await client.callTool({ name: 'test_image_content' })).content as Array<{ data: string; mimeType: string }>
      expect(image!.mimeType).toBe('image/png')
      expect(Buffer.from(image!.data, 'base64').subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))
      const [audio] = (await client.callTool({ name: 'test_audio_content' })).content as Array<{ data: string; mimeType: string }>
      expect(audio!.mimeType).toBe('audio/wav')
      const wav = Buffer.from(audio!.data, 'base64')
      expect([wav.toString('latin1', 0, 4), wav.toString('latin1', 8, 12), wav.readUInt32LE(4)]).toEqual(['RIFF', 'WAVE', wav.length - 8])
      expect(await client.callTool({ name: 'test_error_handling' })).toMatchObject({
        isError: true,
        content: [{ type: 'text', text: expect.stringContaining('This tool intentionally returns an error for testing') }],
      })
    })
  })

  describe('a stream the server closes mid-call (SEP-1699)', () => {
    it('is resumed with GET and Last-Event-ID through the dispatch layer, and the result is replayed', async () => {
      const { client, seen } = await connect('/v1')
      // Without the replay the result would never come: fail in seconds, not at the test timeout.
      const result = await client.callTool({ name: 'test_reconnection' }, undefined, { timeout: 10_000 })
      expect(result.content).toEqual([{ type: 'text', text: 'Reconnection test completed.' }])
      const resumed = seen.find((e) => e.method === 'GET' && e.lastEventId !== undefined)
      expect(resumed).toMatchObject({ status: 200, version: '1.1.1' })
    })
  })

  describe('logging', () => {
    it('sends the tool log messages at or above the level the client set', async () => {
      const { client } = await connect('/v1')
      const logged: string[] = []
      client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => void logged.push(`${n.params.level}: ${n.params.data}`))
      await client.callTool({ name: 'test_tool_with_logging' })
      expect(logged).toEqual(['info: Tool execution started', 'info: Tool processing data', 'info: Tool execution completed'])
      logged.length = 0
      await client.setLoggingLevel('warning')
      await client.callTool({ name: 'test_tool_with_logging' })
      expect(logged).toEqual([])
    })
  })

  describe('resource subscriptions', () => {
    it('notify a subscriber of an update until it unsubscribes', async () => {
      const { client } = await connect('/v1')
      const updated: string[] = []
      client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void updated.push(n.params.uri))
      await client.subscribeResource({ uri: 'test://watched-resource' })
      await client.callTool({ name: 'update_watched_resource', arguments: { text: 'second' } })
      expect(updated).toEqual(['test://watched-resource'])
      expect((await client.readResource({ uri: 'test://watched-resource' })).contents).toEqual([
        { uri: 'test://watched-resource', mimeType: 'text/plain', text: 'second' },
      ])
      await client.unsubscribeResource({ uri: 'test://watched-resource' })
      await client.callTool({ name: 'update_watched_resource', arguments: { text: 'third' } })
      expect(updated).toHaveLength(1)
    })

    it('refuse a resource that cannot be subscribed to', async () => {
      const { client } = await connect('/v1')
      await expect(client.subscribeResource({ uri: 'test://static-text' })).rejects.toMatchObject({ code: -32602 })
    })
  })

  describe('requests to the client during a tool call', () => {
    it('sampling: the client answer is used; a client without the capability gets a tool error', async () => {
      const { client } = await connect('/v1', 'alice', { sampling: {} })
      const prompts: unknown[] = []
      client.setRequestHandler(CreateMessageRequestSchema, (request) => {
        prompts.push(request.params.messages)
        return { role: 'assistant', content: { type: 'text', text: 'sunny' }, model: 'test-model' }
      })
      expect((await client.callTool({ name: 'test_sampling', arguments: { prompt: 'Weather?' } })).content).toEqual([
        { type: 'text', text: 'LLM response: sunny' },
      ])
      expect(prompts).toEqual([[{ role: 'user', content: { type: 'text', text: 'Weather?' } }]])

      const { client: plain } = await connect('/v1')
      expect(await plain.callTool({ name: 'test_sampling', arguments: { prompt: 'Weather?' } })).toMatchObject({ isError: true })
    })

    it('elicitation: an accepted answer is returned; one that does not match the schema is refused', async () => {
      const { client } = await connect('/v1', 'alice', { elicitation: {} })
      let answer: Record<string, string> = { username: 'alice', email: 'alice@example.com' }
      client.setRequestHandler(ElicitRequestSchema, () => ({ action: 'accept', content: answer }))
      expect((await client.callTool({ name: 'test_elicitation', arguments: { message: 'Who are you?' } })).content).toEqual([
        { type: 'text', text: 'User response: action=accept, content={"username":"alice","email":"alice@example.com"}' },
      ])
      answer = { username: 'alice' }
      expect(await client.callTool({ name: 'test_elicitation', arguments: { message: 'Who are you?' } })).toMatchObject({
        isError: true,
        content: [{ type: 'text', text: expect.stringContaining('does not match requested schema') }],
      })
    })
  })
})

describe('the SDK v2 client (@modelcontextprotocol/client): MCP 2026-07-28 where it asks for it, 2025 otherwise', () => {
  type Mode = 'auto' | { pin: string } | undefined

  /** Connects a v2 client at `path`, recording every exchange's method, status and version headers. */
  async function connectV2(path: string, mode: Mode) {
    const seen: Array<{ method: string | null; protocol: string | null; status: number; version: string | null; latest: string | null }> = []
    const client = new ClientV2({ name: 'e2e-client-v2', version: '1.0.0' }, mode ? { versionNegotiation: { mode } } : undefined)
    const transport = new StreamableHTTPClientTransportV2(new URL(`${served.origin('weather')}${path}`), {
      requestInit: { headers: { Authorization: `Bearer ${token('alice')}` } },
      fetch: async (url, init) => {
        const response = await localhostFetch(url, init)
        const headers = new Headers(init?.headers)
        seen.push({
          method: headers.get('mcp-method'),
          protocol: headers.get('mcp-protocol-version'),
          status: response.status,
          version: response.headers.get('x-mcp-version'),
          latest: response.headers.get('x-mcp-latest-version'),
        })
        return response
      },
    })
    await client.connect(transport)
    return { client, seen }
  }

  it('legacy (its default): the 2025 handshake, every tool, the version headers on every answer', async () => {
    const { client, seen } = await connectV2('/v1', undefined)
    try {
      expect(client.getServerVersion()).toMatchObject({ name: 'weather', version: '1.1.1' })
      expect((await client.listTools()).tools.map((t) => t.name).sort()).toEqual(APP_TOOLS)
      const result = await client.callTool({ name: 'get_version', arguments: {} })
      expect((result.structuredContent as { version: string }).version).toBe('1.1.1')
    } finally {
      await client.close()
    }
    expect(seen.length).toBeGreaterThanOrEqual(4)
    for (const exchange of seen) expect(exchange).toMatchObject({ version: '1.1.1', latest: '2.0.0' })
    expect(seen.filter((e) => e.status >= 300)).toHaveLength(0)
    expect(seen.some((e) => e.protocol === '2026-07-28')).toBe(false)
  })

  it.each([
    ['auto: its server/discover probe is answered, so it speaks 2026-07-28', 'auto' as const, '/v1', '1.1.1'],
    ['pinned to 2026-07-28, at /v1', { pin: '2026-07-28' }, '/v1', '1.1.1'],
    ['pinned to 2026-07-28, at /', { pin: '2026-07-28' }, '/', '2.0.0'],
    ['pinned to 2026-07-28, at an exact version', { pin: '2026-07-28' }, '/v1.0.0', '1.0.0'],
  ])('%s: the App serves it per request, with the version headers on every answer', async (_label, mode, path, version) => {
    const { client, seen } = await connectV2(path, mode)
    try {
      expect(client.getServerVersion()).toMatchObject({ name: 'weather', version })
      expect((await client.listTools()).tools.map((t) => t.name).sort()).toEqual(MODERN_APP_TOOLS)
      const result = await client.callTool({ name: 'get_version', arguments: {} })
      expect(result.structuredContent).toEqual({ app: 'weather', version })
      expect(await client.callTool({ name: 'echo', arguments: { text: 'hi' } })).toMatchObject({
        content: [{ type: 'text', text: `hi (from weather ${version})` }],
      })
      // Progress notifications stream back on the answer of the call, through the dispatch layer.
      const progress: number[] = []
      const counted = await client.callTool({ name: 'count', arguments: { n: 3 } }, { onprogress: (p) => progress.push(p.progress) })
      expect(counted).toMatchObject({ content: [{ type: 'text', text: `counted to 3 (${version})` }] })
      expect(progress).toEqual([1, 2, 3])
    } finally {
      await client.close()
    }
    const calls = seen.filter((e) => e.method === 'tools/call')
    expect(calls).toHaveLength(3)
    for (const exchange of seen) expect(exchange).toMatchObject({ status: 200, version, latest: '2.0.0' })
    for (const exchange of calls) expect(exchange.protocol).toBe('2026-07-28')
  })

  it('a 2026-07-28 request without a token is refused by the dispatch layer before the App (401 with the challenge)', async () => {
    const response = await localhostFetch(`${served.origin('weather')}/v1`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': '2026-07-28',
        'mcp-method': 'tools/list',
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
    })
    expect(response.status).toBe(401)
    expect(response.headers.get('www-authenticate')).toBe(
      `Bearer resource_metadata="${served.origin('weather')}/.well-known/oauth-protected-resource"`,
    )
    expect(response.headers.get('x-mcp-version')).toBeNull()
  })
})
