/**
 * Bad input never gives a 500 (issue 2, "How we will check it"): every answer is a JSON-RPC
 * error with the right status, from the dispatch layer (before the MCP layer) or from the
 * MCP SDK handler (body problems), through the reference platform.
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import {
  CLIENT,
  INITIALIZE,
  type ServedPlatform,
  TOOLS_LIST,
  bodies,
  createTestPlatform,
  json,
  localhostFetch,
  mcpRequest,
  servePlatform,
  versionHeaders,
} from '../helpers/platform.js'

/** Asserts a JSON-RPC 2.0 error answer: the status, JSON, `id: null`, an integer code. */
async function expectRpcError(response: Response, status: number, code?: number): Promise<any> {
  expect(response.status).toBe(status)
  expect(response.headers.get('content-type')).toBe('application/json')
  const body = await json(response)
  expect(body).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: expect.any(Number), message: expect.any(String) } })
  expect(Number.isInteger(body.error.code)).toBe(true)
  if (code !== undefined) expect(body.error.code).toBe(code)
  return body
}

/** Body problems, answered by the MCP SDK handler of the resolved version. */
const BAD_BODIES: Array<[string, string, number, number]> = [
  ['an empty body', '', 400, -32700],
  ['a body that is not JSON', '{"jsonrpc": "2.0", "id": 1, method', 400, -32700],
  ['plain text', 'hello', 400, -32700],
  ['JSON null', 'null', 400, -32700],
  ['a JSON number', '42', 400, -32700],
  ['a JSON string', '"tools/list"', 400, -32700],
  ['an empty object', '{}', 400, -32700],
  ['an object without method', '{"jsonrpc":"2.0","id":1}', 400, -32700],
  ['JSON-RPC 1.0', '{"id":1,"method":"tools/list","params":[]}', 400, -32700],
  ['an empty batch array (regression: was 202 with no body)', '[]', 400, -32600],
  ['a batch of non-objects', '[1, 2, 3]', 400, -32700],
  ['a batch with a broken member', `[${JSON.stringify(TOOLS_LIST)}, {"jsonrpc":"2.0"}]`, 400, -32700],
  ['a batch with two initialize requests', JSON.stringify([INITIALIZE, { ...INITIALIZE, id: 9 }]), 400, -32600],
  ['a batch mixing initialize and a request', JSON.stringify([INITIALIZE, TOOLS_LIST]), 400, -32600],
  ['deeply nested arrays', '['.repeat(100_000), 400, -32700],
  // Every progress notification repeats it: 3 MB made one request stream 300 MB.
  [
    'a progress token longer than 256 characters',
    JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'count', arguments: { n: 100 }, _meta: { progressToken: 'p'.repeat(257) } } }),
    400,
    -32602,
  ],
  [
    'a batch with one such progress token',
    JSON.stringify([TOOLS_LIST, { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'count', _meta: { progressToken: 'p'.repeat(5_000) } } }]),
    400,
    -32602,
  ],
  ['lone surrogates (sent as U+FFFD)', '\udcff\udcfe', 400, -32700],
]

/** Authorization values that must give 401 and nothing else. */
const GARBAGE_AUTHORIZATION = [
  'Bearer',
  'Bearer ',
  'Bearer    ',
  'bearer',
  'Bearer two tokens',
  'Bearer svc_',
  'Bearer svc_!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!',
  `Bearer svc_${'A'.repeat(44)}`,
  `Bearer SVC_${'A'.repeat(44)}`,
  'Bearer null',
  'Bearer undefined',
  'Bearer ==',
  'Bearer a=b',
  'Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ1c2VyX2FsaWNlIn0.',
  'Bearer \u00e9\u00e8\u00e0',
  'Bearer\ttoken',
  'Basic',
  'Basic dXNlcjpwYXNz',
  'Digest username="alice"',
  'svc_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA',
  ',,,,',
  '"Bearer x"',
  `Bearer ${'a'.repeat(16 * 1024)}`,
  `Bearer svc_${'a'.repeat(16 * 1024)}`,
  `${'B'.repeat(16 * 1024)}`,
]

describe('through the platform in memory', () => {
  let platform: Platform
  let token: (name: string) => string
  let errors: Array<{ error: unknown; context: string }>

  beforeEach(() => {
    ;({ platform, token, errors } = createTestPlatform())
  })
  afterEach(async () => {
    await platform.close()
    expect(errors).toEqual([])
  })

  const send = (url: string, options: Parameters<typeof mcpRequest>[1] = {}) =>
    platform.fetch(mcpRequest(url, options), { clientAddress: CLIENT })

  it.each(BAD_BODIES)('%s: the SDK handler answers a JSON-RPC error', async (_name, rawBody, status, code) => {
    for (const path of ['/v1', '/']) {
      const response = await send(`http://weather.localhost${path}`, { token: token('alice'), rawBody })
      // The dispatch layer let it through (it never reads the body): the version headers show it.
      expect(versionHeaders(response).version).not.toBeNull()
      await expectRpcError(response, status, code)
    }
  })

  it('a body beyond the 4 MB limit is refused with 413 (regression: the platform parsed bodies itself, past the SDK limit)', async () => {
    const huge = JSON.stringify({ ...TOOLS_LIST, params: { pad: 'x'.repeat(5 * 1024 * 1024) } })
    await expectRpcError(await send('http://weather.localhost/v1', { token: token('alice'), rawBody: huge }), 413, -32000)
  })

  it('a progress token of 256 characters is served', async () => {
    const progressToken = 'p'.repeat(256)
    const response = await send('http://weather.localhost/v1', {
      token: token('alice'),
      body: { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'count', arguments: { n: 3 }, _meta: { progressToken } } },
    })
    expect(response.status).toBe(200)
    expect(await response.text()).toContain('counted to 3')
  })

  it('a batch of valid requests is served (JSON-RPC 2.0 batches), one answer per request', async () => {
    const response = await send('http://weather.localhost/v1', {
      token: token('alice'),
      body: [TOOLS_LIST, { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'get_version', arguments: {} } }],
    })
    expect(response.status).toBe(200)
    const answers = await json(response)
    expect(answers.map((a: { id: number }) => a.id).sort()).toEqual([1, 2])
  })

  it('a batch that names a protocol revision without batches (2025-06-18 and later) is a JSON-RPC 400 -32600 from the App', async () => {
    for (const revision of ['2025-06-18', '2025-11-25', '2025-06-18, 2025-06-18']) {
      const response = await send('http://weather.localhost/v1', { token: token('alice'), body: [TOOLS_LIST], headers: { 'mcp-protocol-version': revision } })
      expect(versionHeaders(response).version).not.toBeNull()
      await expectRpcError(response, 400, -32600)
    }
  })

  it('a body sent without a token is never read: 401', async () => {
    for (const [, rawBody] of BAD_BODIES) {
      const response = await send('http://weather.localhost/v1', { rawBody })
      expect(await expectRpcError(response, 401, -32001)).toEqual(bodies.unauthorized(false))
    }
  })

  it('a wrong Content-Type or Accept header is an SDK JSON-RPC error, or is tolerated', async () => {
    const wrongType = await send('http://weather.localhost/v1', { token: token('alice'), headers: { 'content-type': 'text/plain' } })
    await expectRpcError(wrongType, 415, -32000)
    // A bare curl (no Accept) gets its JSON answer: the platform serves one-shot requests as JSON.
    const noAccept = await send('http://weather.localhost/v1', { token: token('alice'), headers: { accept: '*/*' } })
    expect(noAccept.status).toBe(200)
  })

  it.each(GARBAGE_AUTHORIZATION.map((value) => [value.length > 60 ? `${value.slice(0, 40)}… (${value.length} chars)` : value, value]))(
    'Authorization %j: 401',
    async (_label, value) => {
      const response = await send('http://weather.localhost/v1', { headers: { authorization: value } })
      await expectRpcError(response, 401, -32001)
      expect(response.headers.get('www-authenticate')).toMatch(/^Bearer resource_metadata="http:\/\/weather\.localhost\/\.well-known\/oauth-protected-resource"/)
      expect(versionHeaders(response)).toEqual({ version: null, latest: null })
    },
  )

  it('8 KB of unrelated headers change nothing', async () => {
    const headers: Record<string, string> = {}
    for (let i = 0; i < 64; i++) headers[`x-noise-${i}`] = Math.random().toString(36).repeat(12).slice(0, 128)
    expect((await send('http://weather.localhost/v1', { token: token('alice'), headers })).status).toBe(200)
    await expectRpcError(await send('http://weather.localhost/v1', { headers }), 401, -32001)
  })

  it('a huge valid-looking Mcp-Session-Id or a malformed one is a 404 session, never a crash', async () => {
    for (const id of ['x'.repeat(300), 'abc', 'a b', '\u00ff', '-', '0'.repeat(256)]) {
      const response = await send('http://weather.localhost/v1', { token: token('alice'), headers: { 'mcp-session-id': id } })
      expect(await expectRpcError(response, 404)).toEqual(bodies.sessionNotFound)
    }
  })

  it('unknown hosts and paths are 404 JSON-RPC errors', async () => {
    for (const url of [
      'http://nope.localhost/v1',
      'http://-bad-.localhost/v1',
      `http://${'a'.repeat(63)}.localhost/v1`,
      'http://weather.localhost/v1.x',
      'http://weather.localhost/v1.1.x',
      'http://weather.localhost/v99999999999999999999',
      'http://weather.localhost/v1.2.3.4',
      'http://weather.localhost/%00',
      'http://weather.localhost/v1%2F',
      `http://weather.localhost/${'v1'.repeat(1000)}`,
      'http://weather.localhost/.well-known/oauth-protected-resource/v1.x',
    ]) {
      expect(await expectRpcError(await send(url, { token: token('alice') }), 404)).toEqual(bodies.notFound)
    }
  })

  it.each(['PUT', 'PATCH', 'PROPFIND'])('method %s: 405 with Allow, before authentication', async (method) => {
    for (const options of [{}, { token: token('alice') }]) {
      const request = new Request('http://weather.localhost/v1', {
        method,
        headers: options.token ? { authorization: `Bearer ${options.token}` } : {},
        body: '{}',
      })
      const response = await platform.fetch(request, { clientAddress: CLIENT })
      expect(response.headers.get('allow')).toBe('GET, POST, DELETE, OPTIONS')
      expect(await expectRpcError(response, 405, -32000)).toEqual(bodies.methodNotAllowed)
    }
  })

  it('HEAD gets GET\'s challenge without a credential (clients probe for WWW-Authenticate), and 405 past it, before the handler', async () => {
    // Clients probe the MCP URL with HEAD for WWW-Authenticate (Gemini CLI does, after a 401).
    const bare = await send('http://weather.localhost/v1', { method: 'HEAD' })
    expect(bare.status).toBe(401)
    expect(bare.headers.get('www-authenticate')).toBe('Bearer resource_metadata="http://weather.localhost/.well-known/oauth-protected-resource"')
    expect(await bare.text()).toBe('')
    const refused = await send('http://weather.localhost/v1', { method: 'HEAD', token: `svc_${'A'.repeat(44)}` })
    expect(refused.status).toBe(401)
    expect(refused.headers.get('www-authenticate')).toContain('error="invalid_token"')
    const served = await send('http://weather.localhost/v1', { method: 'HEAD', token: token('alice') })
    expect(served.status).toBe(405)
    expect(served.headers.get('allow')).toBe('GET, POST, DELETE, OPTIONS')
    expect(versionHeaders(served)).toEqual({ version: null, latest: null })
    expect(await served.text()).toBe('')
  })

  it('GET and DELETE without a session reach the handler, which refuses them as JSON-RPC errors', async () => {
    for (const method of ['GET', 'DELETE']) {
      await expectRpcError(await send('http://weather.localhost/v1', { token: token('alice'), method }), 405, -32000)
    }
  })
})

describe('over real HTTP (@hono/node-server on 127.0.0.1)', () => {
  let platform: Platform
  let served: ServedPlatform
  let token: (name: string) => string

  beforeAll(async () => {
    ;({ platform, token } = createTestPlatform())
    served = await servePlatform(platform)
  })
  afterAll(async () => {
    await served.close()
    await platform.close()
  })

  const post = (url: string, headers: Record<string, string>, body: string) =>
    localhostFetch(url, {
      method: 'POST',
      headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', ...headers },
      body,
    })

  it('body problems: the same JSON-RPC errors as in memory', async () => {
    for (const [, rawBody, status, code] of BAD_BODIES) {
      await expectRpcError(await post(`${served.origin('weather')}/v1`, { authorization: `Bearer ${token('alice')}` }, rawBody), status, code)
    }
  })

  it('a 12 KB Authorization header is a 401 JSON-RPC error', async () => {
    const response = await post(`${served.origin('weather')}/v1`, { authorization: `Bearer ${'a'.repeat(12 * 1024)}` }, '{}')
    await expectRpcError(response, 401, -32001)
  })

  it("a 16 KB header block is refused by Node's HTTP parser itself (431), never a 500", async () => {
    // Node's default --max-http-header-size is 16 KB: the request never reaches the platform.
    const response = await post(`${served.origin('weather')}/v1`, { authorization: `Bearer ${'a'.repeat(16 * 1024)}` }, '{}')
    expect(response.status).toBe(431)
  })

  it('unknown host and bad path', async () => {
    const unknown = await post(`${served.origin('nope')}/v1`, { authorization: `Bearer ${token('alice')}` }, '{}')
    expect(await expectRpcError(unknown, 404)).toEqual(bodies.notFound)
    const badPath = await post(`${served.origin('weather')}/v1.x`, { authorization: `Bearer ${token('alice')}` }, '{}')
    expect(await expectRpcError(badPath, 404)).toEqual(bodies.notFound)
  })
})
