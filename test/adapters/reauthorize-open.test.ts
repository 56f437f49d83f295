/**
 * A response that stays open (the GET stream an MCP client holds for server messages) does not
 * outlive the access that opened it: through every adapter, the dispatcher checks its credential
 * again every `reauthorizeEveryMs`, and ends it once the token is revoked (a password reset
 * included), rotated away or expired, or its subscription has ended (spec 3: revocation takes
 * effect within 10 minutes; afterwards the token reaches nothing). A check that cannot tell (the
 * token store down) leaves it open. Found by an audit: a GET stream opened before a password
 * reset stayed open for 31 days, receiving what the App pushed.
 *
 * Time: `Date` and `setInterval` are faked (the tokens' clock and the dispatcher's timers);
 * sockets run on real time.
 */
import { randomUUID } from 'node:crypto'
import * as http from 'node:http'
import {
  type AccessTokenResult,
  type AccessTokenValidator,
  ConfigurationError,
  StoreUnavailableError,
  type DispatcherOptions,
  createDispatcher,
  createMemoryAppStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import express from 'express'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { openWith } from './open-response.js'
import { ADAPTER_KINDS, type Fixture, T0, close, listen, mcpClientHeaders, serveWebHandler, serveWebWithoutOutgoing } from './helpers.js'
import { buildScenarioServer, createNodeMcpHandler } from './mcp.js'

const MINUTE = 60_000
const DAY = 86_400_000
const encoder = new TextEncoder()

/**
 * A stand-in MCP handler: a POST without a session opens one; a GET opens the session's stream
 * and keeps it open; `open` counts the handler's streams not yet cancelled.
 */
function streamingHandler() {
  let open = 0
  const handler = async (request: Request, context: { sessionId: string | undefined }) => {
    if (request.method === 'GET') {
      let cancelled = false
      const body = new ReadableStream<Uint8Array>({
        start(c) {
          open++
          c.enqueue(encoder.encode(': open\n\n'))
        },
        cancel() {
          if (!cancelled) open--
          cancelled = true
        },
      })
      return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } })
    }
    await request.text()
    const headers: Record<string, string> = { 'content-type': 'application/json' }
    if (context.sessionId === undefined) headers['mcp-session-id'] = randomUUID()
    return new Response('{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}', { status: 200, headers })
  }
  return { handler, open: () => open }
}

/** A dispatcher on in-memory stores on the faked clock, and alice's two tokens. */
async function createSetup(extra: Partial<DispatcherOptions> = {}) {
  const now = () => Date.now()
  const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
  const store = createMemoryTokenStore()
  const errors: Fixture['errors'] = []
  const onError = (error: unknown, context: string) => errors.push({ error, context })
  const tokens = createTokenService({ store, apps, subscriptions, now, onError })
  const first = await tokens.create({ userId: 'alice', name: 'laptop', servers: ['app_weather'], expiresInDays: 7 })
  const second = await tokens.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 30 })
  const dispatcherOptions: DispatcherOptions = {
    apps,
    subscriptions,
    tokens,
    sessions: createMemorySessionStore({ now }),
    now,
    onError,
    reauthorizeEveryMs: MINUTE,
    ...extra,
  }
  const fixture = { dispatcher: createDispatcher(dispatcherOptions), dispatcherOptions, apps, tokens: {}, errors } as unknown as Fixture
  return { fixture, tokens, store, subscriptions, first, second, errors }
}

interface Answer {
  status: number
  headers: http.IncomingHttpHeaders
  body: string
  /** For a stream: resolves once the response has ended, closed or failed. */
  ended: Promise<void>
  isEnded(): boolean
  response: http.IncomingMessage
}

function send(port: number, token: string, method: 'GET' | 'POST', sessionId?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: '127.0.0.1',
        port,
        method,
        path: '/',
        headers: mcpClientHeaders(token, sessionId),
      },
      (response) => {
        let done = false
        const ended = new Promise<void>((settle) => {
          const end = () => {
            done = true
            settle()
          }
          response.on('end', end).on('close', end).on('error', end)
        })
        let body = ''
        response.setEncoding('utf8')
        response.on('data', (chunk: string) => (body += chunk))
        const answer = { status: response.statusCode!, headers: response.headers, ended, isEnded: () => done, response, get body() { return body } }
        if (method === 'GET' && response.statusCode === 200) resolve(answer)
        else void ended.then(() => resolve(answer))
      },
    )
    request.on('error', reject)
    request.end(method === 'POST' ? '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' : undefined)
  })
}

const VARIANTS = [...ADAPTER_KINDS, 'web (no outgoing)'] as const

async function serveVariant(variant: (typeof VARIANTS)[number], fixture: Fixture) {
  const { handler, open } = streamingHandler()
  const served = variant === 'web (no outgoing)' ? await serveWebWithoutOutgoing(fixture, handler) : await serveWebHandler(variant, fixture, handler)
  return { served, open }
}

/** A session opened with `token`, and its GET stream. */
async function openStream(port: number, token: string) {
  const opened = await send(port, token, 'POST')
  expect(opened.status).toBe(200)
  const sessionId = opened.headers['mcp-session-id'] as string
  const stream = await send(port, token, 'GET', sessionId)
  expect(stream.status).toBe(200)
  expect(stream.headers['x-mcp-version']).toBe('1.0.0')
  return { sessionId, stream }
}

/** Lets the sockets carry what the last check did (real time; the checks' timers are faked). */
async function settle() {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setTimeout(resolve, 20))
}

beforeEach(() => {
  vi.useFakeTimers({ toFake: ['Date', 'setInterval', 'clearInterval'] })
  vi.setSystemTime(T0)
})

afterEach(() => {
  vi.useRealTimers()
})

describe('an open stream whose credential no longer passes is ended', () => {
  for (const variant of VARIANTS) {
    it(`${variant}: a revoked token's stream ends at the next check; another token's stays open`, async () => {
      const { fixture, tokens, first, second, errors } = await createSetup()
      const { served, open } = await serveVariant(variant, fixture)
      try {
        const revoked = await openStream(served.port, first.token)
        const kept = await openStream(served.port, second.token)
        expect(open()).toBe(2)
        // Checks that pass leave both open.
        await vi.advanceTimersByTimeAsync(3 * MINUTE)
        await settle()
        expect(revoked.stream.isEnded()).toBe(false)
        expect(kept.stream.isEnded()).toBe(false)

        await tokens.revoke('alice', first.id)
        await vi.advanceTimersByTimeAsync(MINUTE)
        await revoked.stream.ended
        // The handler's stream ended with it (nothing left open for a client that is gone).
        await vi.waitFor(() => expect(open()).toBe(1))
        expect(kept.stream.isEnded()).toBe(false)
        expect((await send(served.port, first.token, 'POST', revoked.sessionId)).status).toBe(401)
        expect((await send(served.port, second.token, 'POST', kept.sessionId)).status).toBe(200)
        expect(errors).toEqual([])
      } finally {
        await served.close()
      }
    })
  }

  it('a password reset ends every stream of the user; a rotation ends the old secret\'s', async () => {
    const { fixture, tokens, first, second } = await createSetup()
    const { served, open } = await serveVariant('express', fixture)
    try {
      const a = await openStream(served.port, first.token)
      const rotated = await tokens.rotate(first.id, { kind: 'session', userId: 'alice' })
      const b = await openStream(served.port, rotated.token)
      const c = await openStream(served.port, second.token)
      await vi.advanceTimersByTimeAsync(MINUTE)
      await a.stream.ended
      await settle()
      expect(b.stream.isEnded()).toBe(false)
      expect(c.stream.isEnded()).toBe(false)
      expect(await tokens.revokeAllForUser('alice')).toBe(2)
      await vi.advanceTimersByTimeAsync(MINUTE)
      await Promise.all([b.stream.ended, c.stream.ended])
      await vi.waitFor(() => expect(open()).toBe(0))
    } finally {
      await served.close()
    }
  })

  it('an expired token\'s stream ends at the first check after its expiry', async () => {
    const { fixture, first, second } = await createSetup()
    const { served } = await serveVariant('fastify', fixture)
    try {
      const weekly = await openStream(served.port, first.token)
      const monthly = await openStream(served.port, second.token)
      vi.setSystemTime(T0 + 7 * DAY + 1)
      await vi.advanceTimersByTimeAsync(MINUTE)
      await weekly.stream.ended
      await settle()
      expect(monthly.stream.isEnded()).toBe(false)
    } finally {
      await served.close()
    }
  })

  it('an ended subscription ends the stream', async () => {
    const { fixture, subscriptions, first } = await createSetup()
    const { served } = await serveVariant('web', fixture)
    try {
      const opened = await openStream(served.port, first.token)
      subscriptions.setActive('alice', 'app_weather', false)
      await vi.advanceTimersByTimeAsync(MINUTE)
      await opened.stream.ended
      expect((await send(served.port, first.token, 'POST', opened.sessionId)).status).toBe(402)
    } finally {
      await served.close()
    }
  })

  it('a check that cannot tell (the token store down) leaves the stream open, and is reported once per check', async () => {
    const { fixture, store, first, errors } = await createSetup()
    const { served } = await serveVariant('web (no outgoing)', fixture)
    try {
      const opened = await openStream(served.port, first.token)
      const findByHash = store.findByHash.bind(store)
      // Rejected, as a database's client does (a promise of the store: the path a wrapper took).
      store.findByHash = () => Promise.reject(new Error('token store down'))
      await vi.advanceTimersByTimeAsync(2 * MINUTE)
      await settle()
      expect(opened.stream.isEnded()).toBe(false)
      expect(errors.map((e) => e.context)).toEqual(['re-checking the credential of open responses', 're-checking the credential of open responses'])
      // What failed, as a logger reads it: the store's error, not the wrapper it travelled in
      // (the default logger wrote `[object Object]`).
      for (const { error } of errors) {
        expect(error).toBeInstanceOf(StoreUnavailableError)
        expect(((error as Error).cause as Error).message).toBe('token store down')
      }
      // Nothing of the token in what is reported.
      expect(JSON.stringify(errors.map((e) => String(e.error)))).not.toContain(first.token)
      store.findByHash = findByHash
      await vi.advanceTimersByTimeAsync(MINUTE)
      await settle()
      expect(opened.stream.isEnded()).toBe(false)
    } finally {
      await served.close()
    }
  })

  it('an OAuth token the validator no longer accepts ends its stream; one it cannot check for now does not', async () => {
    let answer: AccessTokenResult | Error = { active: true, info: { subject: 'alice' } }
    const seen: string[] = []
    const oauth: AccessTokenValidator = {
      validate: async (token, context) => {
        seen.push(`${token} ${context?.resource}`)
        if (answer instanceof Error) throw answer
        return answer
      },
    }
    const { fixture, errors } = await createSetup({ oauth, authorizationServers: ['https://auth.example.com'] })
    const { served } = await serveVariant('express4', fixture)
    try {
      const opened = await openStream(served.port, 'oauth-access-token')
      answer = new Error('authorization server down')
      await vi.advanceTimersByTimeAsync(MINUTE)
      await settle()
      expect(opened.stream.isEnded()).toBe(false)
      expect(errors.map((e) => e.context)).toEqual(['re-checking the credential of open responses'])
      // The token, answered for another user, is no longer this stream's.
      answer = { active: true, info: { subject: 'mallory' } }
      await vi.advanceTimersByTimeAsync(MINUTE)
      await opened.stream.ended
      expect(seen.at(-1)).toBe('oauth-access-token http://weather.localhost')
    } finally {
      await served.close()
    }
  })

  it('an answer that is neither of a validator\'s two, or of a token service\'s, ends the stream and is reported (regression: active: \'false\' kept it open as accepted; a falsy one, if thrown on, kept it open for ever)', async () => {
    for (const odd of [{ active: 'false', info: { subject: 'alice' } }, { active: 0 }, { active: true, info: { subject: '' } }]) {
      let answer: unknown = { active: true, info: { subject: 'alice' } }
      const oauth: AccessTokenValidator = { validate: async () => answer as AccessTokenResult }
      const { fixture, errors } = await createSetup({ oauth, authorizationServers: ['https://auth.example.com'] })
      const { served } = await serveVariant('web', fixture)
      try {
        const opened = await openStream(served.port, 'oauth-access-token')
        answer = odd
        await vi.advanceTimersByTimeAsync(MINUTE)
        await opened.stream.ended
        expect(errors.map((e) => e.context), JSON.stringify(odd)).toEqual(['oauth answer'])
      } finally {
        await served.close()
      }
    }
    for (const ok of ['false', 0]) {
      let odd = false
      const { fixture, tokens, first, errors } = await createSetup()
      // A token service of the platform's own around the library's, whose verdict turns odd.
      const wrapped = {
        ...tokens,
        prefix: tokens.prefix,
        authenticate: (token: string, address?: string) => {
          const auth = tokens.authenticate(token, address)
          return odd ? ({ ...(auth as object), ok } as never) : auth
        },
      }
      const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, tokens: wrapped })
      const { served } = await serveVariant('web', { ...fixture, dispatcher } as Fixture)
      try {
        const opened = await openStream(served.port, first.token)
        odd = true
        await vi.advanceTimersByTimeAsync(MINUTE)
        await opened.stream.ended
        expect(errors.map((e) => e.context), String(ok)).toEqual(['token answer'])
      } finally {
        await served.close()
      }
    }
  })

  it('an OAuth token the validator still accepts keeps its stream open, check after check, until its subscription ends', async () => {
    let checks = 0
    const oauth: AccessTokenValidator = {
      validate: async () => {
        checks++
        return { active: true, info: { subject: 'alice' } }
      },
    }
    const { fixture, subscriptions, errors } = await createSetup({ oauth, authorizationServers: ['https://auth.example.com'] })
    const { served, open } = await serveVariant('express', fixture)
    try {
      const opened = await openStream(served.port, 'oauth-access-token')
      const opening = checks
      await vi.advanceTimersByTimeAsync(3 * MINUTE)
      await settle()
      expect(opened.stream.isEnded()).toBe(false)
      expect(checks - opening).toBe(3)
      subscriptions.setActive('alice', 'app_weather', false)
      await vi.advanceTimersByTimeAsync(MINUTE)
      await opened.stream.ended
      await vi.waitFor(() => expect(open()).toBe(0))
      expect(errors).toEqual([])
    } finally {
      await served.close()
    }
  })

  it('reauthorizeEveryMs: false checks nothing again', async () => {
    const { fixture, tokens, first } = await createSetup({ reauthorizeEveryMs: false })
    const { served } = await serveVariant('web', fixture)
    try {
      const opened = await openStream(served.port, first.token)
      await tokens.revoke('alice', first.id)
      await vi.advanceTimersByTimeAsync(10 * MINUTE)
      await settle()
      expect(opened.stream.isEnded()).toBe(false)
    } finally {
      await served.close()
    }
  })
})

describe('the official MCP SDK, client and server (its Node transport behind Express)', () => {
  it('the client\'s GET stream ends once its token is revoked; what the server sends later reaches nobody, and the process goes on', async () => {
    const { fixture, tokens, first } = await createSetup()
    const servers: McpServer[] = []
    const mcp = createNodeMcpHandler(() => {
      const server = buildScenarioServer('weather', '1.0.0')
      servers.push(server)
      return server
    })
    const app = express()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher, onError: (error, context) => fixture.errors.push({ error, context }) }))
    app.all('/', (req, res) => void mcp.handle(req, res))
    const server = http.createServer(app)
    const port = await listen(server)
    const answers: Array<{ method: string; status: number }> = []
    let streamOpened!: () => void
    const streaming = new Promise<void>((resolve) => (streamOpened = resolve))
    const transport = new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/`), {
      requestInit: { headers: { authorization: `Bearer ${first.token}`, host: 'weather.localhost' } },
      // The SDK's fetch, with the Host the App is found by (fetch may not set it).
      fetch: async (input, init) => {
        const url = new URL(String(input))
        const response = await new Promise<Response>((resolve, reject) => {
          const headers = Object.fromEntries(new Headers(init?.headers).entries())
          const request = http.request({ host: '127.0.0.1', port: url.port, method: init?.method ?? 'GET', path: url.pathname, headers: { ...headers, host: 'weather.localhost' } }, (incoming) => {
            const body = new ReadableStream<Uint8Array>({
              start(controller) {
                incoming.on('data', (chunk: Buffer) => controller.enqueue(new Uint8Array(chunk)))
                incoming.on('end', () => controller.close())
                incoming.on('error', (error) => controller.error(error))
              },
              cancel: () => void incoming.destroy(),
            })
            const responseHeaders = new Headers()
            for (const [name, value] of Object.entries(incoming.headers)) if (typeof value === 'string') responseHeaders.set(name, value)
            const status = incoming.statusCode!
            resolve(new Response(status === 202 || status === 204 ? null : body, { status, headers: responseHeaders }))
          })
          request.on('error', reject)
          request.end(typeof init?.body === 'string' ? init.body : undefined)
        })
        answers.push({ method: init?.method ?? 'GET', status: response.status })
        if ((init?.method ?? 'GET') === 'GET' && response.status === 200) streamOpened()
        return response
      },
    })
    const client = new Client({ name: 'reauthorize-test', version: '1.0.0' })
    let changes = 0
    client.setNotificationHandler(ToolListChangedNotificationSchema, async () => void changes++)
    const transportErrors: unknown[] = []
    try {
      await client.connect(transport)
      transport.onerror = (error) => transportErrors.push(error)
      await streaming
      await client.callTool({ name: 'announce', arguments: {} })
      await vi.waitFor(() => expect(changes).toBe(1))

      await tokens.revokeAllForUser('alice')
      await vi.advanceTimersByTimeAsync(MINUTE)
      // The server's side of the stream is gone: the SDK's transport heard its response close.
      await vi.waitFor(() => expect(answers.filter((a) => a.method === 'GET').some((a) => a.status === 401)).toBe(true), { timeout: 5_000 })
      servers[0]!.sendToolListChanged()
      await settle()
      expect(changes).toBe(1)
      await expect(client.listTools()).rejects.toThrow(/401|Unauthorized/)
      expect(fixture.errors).toEqual([])
    } finally {
      await client.close().catch(() => {})
      await mcp.close()
      await close(server)
    }
  })
})

/** A dispatcher, with `extra` options, whose sessions s-1, s-2 and s-3 of alice are pinned to 1.0.0 of Weather. */
async function withSessions(extra: Partial<DispatcherOptions> = {}) {
  const setup = await createSetup()
  const sessions = createMemorySessionStore({ now: () => Date.now() })
  for (const id of ['s-1', 's-2', 's-3']) sessions.set(id, { appId: 'app_weather', version: '1.0.0', subject: 'alice' }, 3_600_000)
  const dispatcher = createDispatcher({ ...setup.fixture.dispatcherOptions, sessions, ...extra })
  return { ...setup, dispatcher }
}

describe('the dispatcher, as an adapter of its own drives it', () => {
  it('responses that share a credential and address are checked once per interval, and end together', async () => {
    const { dispatcher, store, tokens, first } = await withSessions()
    const a = await openWith(dispatcher, first.token, 's-1')
    const b = await openWith(dispatcher, first.token, 's-2')
    let lookups = 0
    const findByHash = store.findByHash.bind(store)
    store.findByHash = (hash) => (lookups++, findByHash(hash))
    await vi.advanceTimersByTimeAsync(MINUTE)
    expect(lookups).toBe(1)
    b.end()
    await tokens.revoke('alice', first.id)
    await vi.advanceTimersByTimeAsync(MINUTE)
    expect(a.closedBy()).toBe('dispatcher')
    expect(b.closedBy()).toBe('client')
  })

  it('an address taken off the token\'s allowlist ends the responses opened from it', async () => {
    const { dispatcher, tokens, first } = await withSessions()
    const inside = await openWith(dispatcher, first.token, 's-1', '203.0.113.7')
    const outside = await openWith(dispatcher, first.token, 's-2', '198.51.100.9')
    await tokens.update('alice', first.id, { allowedIps: ['203.0.113.0/24'] })
    await vi.advanceTimersByTimeAsync(MINUTE)
    expect(outside.closedBy()).toBe('dispatcher')
    expect(inside.closedBy()).toBeUndefined()
  })

  it('a subscription store that answers a truthy value other than true (the string "true") at a check ends the responses: only true keeps them', async () => {
    const { dispatcher, first, subscriptions } = await withSessions()
    let answer: unknown = true
    const isActive = subscriptions.isActive.bind(subscriptions)
    subscriptions.isActive = (userId, appId) => (answer === true ? isActive(userId, appId) : (answer as boolean))
    const response = await openWith(dispatcher, first.token, 's-1')
    answer = 'true'
    await vi.advanceTimersByTimeAsync(MINUTE)
    expect(response.closedBy()).toBe('dispatcher')
  })

  it('where timers end with their request (Workers), each open response is checked by a timer of its own', async () => {
    vi.stubGlobal('navigator', { userAgent: 'Cloudflare-Workers' })
    try {
      const { dispatcher, tokens, first } = await withSessions({ sessionTtlMs: 100 * 24 * 3_600_000 })
      const a = await openWith(dispatcher, first.token, 's-1')
      // Its pin's keep-alive and its check, each of its own.
      expect(vi.getTimerCount()).toBe(2)
      const b = await openWith(dispatcher, first.token, 's-2')
      expect(vi.getTimerCount()).toBe(4)
      b.end()
      expect(vi.getTimerCount()).toBe(2)
      await tokens.revoke('alice', first.id)
      await vi.advanceTimersByTimeAsync(MINUTE)
      expect(a.closedBy()).toBe('dispatcher')
      expect(vi.getTimerCount()).toBe(0)
    } finally {
      vi.unstubAllGlobals()
    }
  })
})

describe('reauthorizeEveryMs', () => {
  it('is a positive number of milliseconds a timer takes, or false', async () => {
    const { fixture } = await createSetup()
    for (const bad of [0, -1, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 31, '60000', true]) {
      expect(() => createDispatcher({ ...fixture.dispatcherOptions, reauthorizeEveryMs: bad as never })).toThrow(ConfigurationError)
      expect(() => createDispatcher({ ...fixture.dispatcherOptions, reauthorizeEveryMs: bad as never })).toThrow(/reauthorizeEveryMs/)
    }
    expect(() => createDispatcher({ ...fixture.dispatcherOptions, reauthorizeEveryMs: false })).not.toThrow()
    expect(() => createDispatcher({ ...fixture.dispatcherOptions, reauthorizeEveryMs: 1 })).not.toThrow()
  })

  it('defaults to a minute: a revoked token\'s response ends at the first check, a minute after it opened', async () => {
    // The fixture's interval taken out: the dispatcher's own default.
    const { dispatcher, tokens, first } = await withSessions({ reauthorizeEveryMs: undefined })
    const response = await openWith(dispatcher, first.token, 's-1')
    await tokens.revoke('alice', first.id)
    await vi.advanceTimersByTimeAsync(MINUTE - 1)
    expect(response.closedBy()).toBeUndefined()
    await vi.advanceTimersByTimeAsync(1)
    expect(response.closedBy()).toBe('dispatcher')
  })

  it('the check\'s timer stops once no response is open', async () => {
    const { fixture, first } = await createSetup({ sessionTtlMs: 100 * 24 * 3_600_000 })
    const { served } = await serveVariant('express', fixture)
    try {
      const opened = await openStream(served.port, first.token)
      // The keep-alive's timer and the check's.
      expect(vi.getTimerCount()).toBe(2)
      opened.stream.response.destroy()
      await vi.waitFor(
        async () => {
          await vi.advanceTimersByTimeAsync(MINUTE)
          expect(vi.getTimerCount()).toBe(1)
        },
        { timeout: 5_000 },
      )
    } finally {
      await served.close()
    }
  })
})
