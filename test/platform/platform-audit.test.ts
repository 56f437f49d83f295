/**
 * The reference platform's session caps (examples/platform/mcp-app.ts, `createMcpAppHandler`)
 * under load: bursts of `initialize` past `maxSessions` and `maxSessionsPerCaller`, many
 * clients holding GET streams, and what a session closed for another answers (the MCP
 * transport's 404), in process and over real HTTP.
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterEach, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import { type CallerOf, buildAppServer, createMcpAppHandler } from '../../examples/platform/mcp-app.js'
import { type NodeSessionsOptions, createNodeSessions } from '../../examples/shared/demo.js'
import { INITIALIZE, type ServedPlatform, createTestPlatform, localhostFetch, mcpRequest, servePlatform } from '../helpers/platform.js'

const app = { id: 'app_w', slug: 'weather', name: 'Weather' }
const URL_V1 = 'http://weather.localhost/v1'
const PING = { jsonrpc: '2.0', id: 2, method: 'ping' } as const
const SESSION_NOT_FOUND = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Session not found', data: { error: 'session_not_found' } } }

const callerNamed = (subject: string): CallerOf => ({ subject, appId: app.id, version: '1.0.0' })

/** One App version's handler with the given caps, and small helpers around it. */
function appHandler(options: Parameters<typeof createMcpAppHandler>[1]) {
  const handler = createMcpAppHandler(() => buildAppServer(app, '1.0.0'), options)
  /** Opens a session (its answer read in full); the status and the session id. */
  const open = async (caller?: CallerOf) => {
    const answer = await handler(mcpRequest(URL_V1, { body: INITIALIZE }), caller)
    const text = await answer.text()
    return { status: answer.status, id: answer.headers.get('mcp-session-id'), retryAfter: answer.headers.get('retry-after'), text }
  }
  const ping = async (id: string, caller?: CallerOf) => {
    const answer = await handler(mcpRequest(URL_V1, { headers: { 'mcp-session-id': id }, body: PING }), caller)
    await answer.text()
    return answer.status
  }
  /** A GET stream held open on a session. */
  const stream = async (id: string, caller?: CallerOf) => {
    const answer = await handler(
      new Request(URL_V1, { headers: { accept: 'text/event-stream', 'mcp-session-id': id, 'mcp-protocol-version': '2025-06-18' } }),
      caller,
    )
    expect(answer.status).toBe(200)
    return answer
  }
  return { handler, open, ping, stream }
}

describe('createMcpAppHandler: the session caps hold under a burst', () => {
  const handlers: Array<{ close(): Promise<void> }> = []
  afterEach(async () => {
    await Promise.all(handlers.splice(0).map((h) => h.close()))
  })

  for (const callers of ['no caller', 'a caller each'] as const) {
    it(`maxSessions holds exactly under a burst of concurrent initializes (${callers}): the slots left are taken, the rest get 503 with Retry-After, each session served answers (regression: 8 sessions open past maxSessions 3)`, async () => {
      const h = appHandler({ maxSessions: 3 })
      handlers.push(h.handler)
      const opened = await Promise.all(Array.from({ length: 8 }, (_, i) => h.open(callers === 'no caller' ? undefined : callerNamed(`user_${i}`))))
      expect(h.handler.sessionCount()).toBeLessThanOrEqual(3)
      const served = opened.filter((o) => o.status === 200)
      expect(served).toHaveLength(3)
      for (const o of opened.filter((x) => x.status !== 200)) {
        expect(o.status).toBe(503)
        expect(o.retryAfter).toBe('1')
        expect(o.id).toBeNull()
        expect(JSON.parse(o.text)).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Too many sessions being opened (3)' } })
      }
      for (const o of served) expect(await h.ping(o.id!)).toBe(200)
      // Once opened, they are sessions like any other: the next initialize closes the least recently used.
      expect((await h.open()).status).toBe(200)
      expect(h.handler.sessionCount()).toBe(3)
    })
  }

  it('a burst at maxSessions with quiet sessions to spare: every initialize is served, each closing a quiet session; no GET stream is cut and the count stays exact (regression: 7 open past maxSessions 5)', async () => {
    const h = appHandler({ maxSessions: 5 })
    handlers.push(h.handler)
    const streaming = [(await h.open()).id!, (await h.open()).id!]
    const streams = await Promise.all(streaming.map((id) => h.stream(id)))
    const quiet = [(await h.open()).id!, (await h.open()).id!, (await h.open()).id!]
    for (const id of quiet) expect(await h.ping(id)).toBe(200) // used after the streaming ones: more recently
    const burst = await Promise.all([h.open(), h.open(), h.open()])
    expect(burst.map((o) => o.status)).toEqual([200, 200, 200])
    expect(h.handler.sessionCount()).toBe(5)
    for (const id of quiet) expect(await h.ping(id)).toBe(404)
    for (const id of streaming) expect(await h.ping(id)).toBe(200)
    for (const o of burst) expect(await h.ping(o.id!)).toBe(200)
    for (const s of streams) await s.body!.cancel()
  })

  it('a caller at its own cap closes its own least recently used session, not another user\'s, when the version is full too (regression: the other user\'s session was closed as well)', async () => {
    const h = appHandler({ maxSessions: 3, maxSessionsPerCaller: 2 })
    handlers.push(h.handler)
    const alice = callerNamed('user_alice')
    const bob = callerNamed('user_bob')
    const bobs = (await h.open(bob)).id!
    await new Promise((resolve) => setTimeout(resolve, 2)) // bob's is the least recently used of all
    const first = (await h.open(alice)).id!
    await new Promise((resolve) => setTimeout(resolve, 2))
    const second = (await h.open(alice)).id!
    await new Promise((resolve) => setTimeout(resolve, 2))
    const third = await h.open(alice)
    expect(third.status).toBe(200)
    expect(await h.ping(bobs, bob)).toBe(200)
    expect(await h.ping(first, alice)).toBe(404)
    expect(await h.ping(second, alice)).toBe(200)
    expect(await h.ping(third.id!, alice)).toBe(200)
    expect(h.handler.sessionCount()).toBe(3)
  })

  it('a refused initialize closes no session for its slot: with every slot of the version being opened, the open ones are kept (regression: a third session opened past maxSessions 2)', async () => {
    // The servers connect only once released: every slot is a session being opened.
    let release!: () => void
    const released = new Promise<void>((resolve) => (release = resolve))
    let slow = true
    const handler = createMcpAppHandler(
      () => {
        const server = buildAppServer(app, '1.0.0')
        if (slow) {
          const connect = server.connect.bind(server)
          server.connect = async (transport) => (await released, connect(transport))
        }
        return server
      },
      { maxSessions: 2 },
    )
    handlers.push(handler)
    const pending = [handler(mcpRequest(URL_V1, { body: INITIALIZE })), handler(mcpRequest(URL_V1, { body: INITIALIZE }))]
    await new Promise((resolve) => setTimeout(resolve, 20))
    slow = false
    const refused = await handler(mcpRequest(URL_V1, { body: INITIALIZE }))
    expect(refused.status).toBe(503)
    await refused.text()
    release()
    const ids: string[] = []
    for (const answer of await Promise.all(pending)) {
      expect(answer.status).toBe(200)
      ids.push(answer.headers.get('mcp-session-id')!)
      await answer.text()
    }
    for (const id of ids) {
      const pinged = await handler(mcpRequest(URL_V1, { headers: { 'mcp-session-id': id }, body: PING }))
      expect(pinged.status).toBe(200)
      await pinged.text()
    }
  })

  it('memory stays bounded: 300 sessions opened one after another by one caller and by many leave at most the caps open, every closed one 404', async () => {
    const h = appHandler({ maxSessions: 50, maxSessionsPerCaller: 10 })
    handlers.push(h.handler)
    const alice = callerNamed('user_alice')
    const ids: string[] = []
    for (let i = 0; i < 150; i++) {
      const o = await h.open(alice)
      expect(o.status).toBe(200)
      ids.push(o.id!)
      expect(h.handler.sessionCount()).toBeLessThanOrEqual(10)
    }
    for (let i = 0; i < 150; i++) {
      const o = await h.open(callerNamed(`user_${i}`))
      expect(o.status).toBe(200)
      expect(h.handler.sessionCount()).toBeLessThanOrEqual(50)
    }
    expect(h.handler.sessionCount()).toBe(50)
    for (const id of ids.slice(0, 140)) expect(await h.ping(id, alice)).toBe(404)
  })
})

describe('the platform over HTTP: one caller past its 100 sessions, with GET streams open', () => {
  let platform: Platform
  let served: ServedPlatform
  afterEach(async () => {
    await served?.close()
    await platform?.close()
  })

  it('each new session closes the quiet one, never a client\'s open GET stream nor another user\'s session; the closed one answers 404 session_not_found (the App\'s answer with the version headers, then the dispatch layer\'s without); nothing answers 500', async () => {
    const made = createTestPlatform()
    platform = made.platform
    served = await servePlatform(platform)
    const url = `${served.origin('weather')}/v1`
    const statuses: number[] = []
    const post = async (secret: string, body: unknown, session?: string) => {
      const answer = await localhostFetch(url, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${secret}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          ...(session && { 'mcp-session-id': session, 'mcp-protocol-version': '2025-06-18' }),
        },
        body: JSON.stringify(body),
      })
      statuses.push(answer.status)
      return answer
    }
    const open = async (secret: string) => {
      const answer = await post(secret, INITIALIZE)
      expect(answer.status).toBe(200)
      await answer.text()
      const id = answer.headers.get('mcp-session-id')!
      await (await post(secret, { jsonrpc: '2.0', method: 'notifications/initialized' }, id)).text()
      return id
    }
    const alice = made.token('alice')
    const carol = made.token('carol')
    const carols = await open(carol) // the least recently used of all, another user's

    // 99 sessions of alice, each with its GET stream open, read in the background.
    const streams: Array<{ id: string; ended: boolean; abort: AbortController }> = []
    for (let i = 0; i < 99; i++) {
      const id = await open(alice)
      const abort = new AbortController()
      const answer = await localhostFetch(url, {
        headers: { authorization: `Bearer ${alice}`, accept: 'text/event-stream', 'mcp-session-id': id, 'mcp-protocol-version': '2025-06-18' },
        signal: abort.signal,
      })
      expect(answer.status).toBe(200)
      const entry = { id, ended: false, abort }
      streams.push(entry)
      void (async () => {
        const reader = answer.body!.getReader()
        try {
          while (!(await reader.read()).done);
        } catch {
          // aborted at the end of the test
        }
        entry.ended = true
      })()
    }
    try {
      // Five more, one after another: each closes the quiet session before it (alice's 100th), never a stream.
      let quiet = await open(alice)
      for (let i = 0; i < 5; i++) {
        const next = await open(alice)
        const first = await post(alice, PING, quiet)
        expect(first.status).toBe(404)
        expect(await first.json()).toEqual(SESSION_NOT_FOUND)
        expect(first.headers.get('x-mcp-version')).toBe('1.1.1')
        const again = await post(alice, PING, quiet)
        expect(again.status).toBe(404)
        expect(await again.json()).toEqual(SESSION_NOT_FOUND)
        expect(again.headers.get('x-mcp-version')).toBeNull()
        quiet = next
      }
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(streams.filter((s) => s.ended).map((s) => s.id)).toEqual([])
      for (const s of streams.slice(0, 5)) expect((await post(alice, PING, s.id)).status).toBe(200)
      expect((await post(alice, PING, quiet)).status).toBe(200)
      expect((await post(carol, PING, carols)).status).toBe(200)
      expect(statuses.filter((status) => status >= 500)).toEqual([])
    } finally {
      for (const s of streams) s.abort.abort()
    }
  }, 30_000)
})

describe('createNodeSessions (the Express and Fastify examples): least recently used, as createMcpAppHandler reads it', () => {
  /** `createNodeSessions` on a loopback server, each request handed its parsed body and no caller. */
  async function serve(options: NodeSessionsOptions) {
    const sessions = createNodeSessions(() => buildAppServer(app, '1.0.0', { conformance: false }), options)
    const server = http.createServer(async (req, res) => {
      const chunks: Buffer[] = []
      for await (const chunk of req) chunks.push(chunk as Buffer)
      const text = Buffer.concat(chunks).toString('utf8')
      await sessions.handle(req, res, text === '' ? undefined : JSON.parse(text))
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`
    const post = (body: unknown, session?: string) =>
      fetch(url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          ...(session && { 'mcp-session-id': session, 'mcp-protocol-version': '2025-06-18' }),
        },
        body: JSON.stringify(body),
      })
    const open = async () => {
      const answer = await post(INITIALIZE)
      expect(answer.status).toBe(200)
      await answer.text()
      return answer.headers.get('mcp-session-id')!
    }
    const ping = async (id: string) => {
      const answer = await post(PING, id)
      await answer.text()
      return answer.status
    }
    const close = async () => {
      await sessions.close()
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    }
    return { sessions, url, open, ping, close }
  }

  it('a session whose GET stream just ended was in use until then: a new session closes one quiet for longer, not it (regression: it was closed, taken as used when its stream began)', async () => {
    const running = await serve({ maxSessions: 2 })
    try {
      const streamed = await running.open()
      const abort = new AbortController()
      const stream = await fetch(running.url, {
        headers: { accept: 'text/event-stream', 'mcp-session-id': streamed, 'mcp-protocol-version': '2025-06-18' },
        signal: abort.signal,
      })
      expect(stream.status).toBe(200)
      const quiet = await running.open()
      expect(await running.ping(quiet)).toBe(200)
      await new Promise((resolve) => setTimeout(resolve, 20))
      abort.abort() // the stream ends now: the streamed session is the most recently used
      await stream.body?.cancel().catch(() => {})
      await new Promise((resolve) => setTimeout(resolve, 50))
      const third = await running.open()
      expect(running.sessions.sessionCount()).toBe(2)
      expect(await running.ping(quiet)).toBe(404)
      expect(await running.ping(streamed)).toBe(200)
      expect(await running.ping(third)).toBe(200)
    } finally {
      await running.close()
    }
  })
})
