/**
 * The reference platform's MCP 2026-07-28 leg (examples/platform/mcp-app.ts,
 * conformance-features-modern.ts) in process, request by request: what its multi-round-trip
 * state is bound to, logging on request, what reaches which leg, and the end of an App version.
 */
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import { createSessionEventStore } from '../../examples/platform/event-store.js'
import { type CallerOf, buildAppServer, createMcpAppHandler } from '../../examples/platform/mcp-app.js'
import { type TestClock, createTestPlatform, json, mcpRequest } from '../helpers/platform.js'

const MODERN = '2026-07-28'

let platform: Platform
let clock: TestClock
let token: (name: string) => string
let errors: Array<{ error: unknown; context: string }>

beforeEach(() => {
  ;({ platform, clock, token, errors } = createTestPlatform())
})
afterEach(async () => {
  await platform.close()
})

/** A 2026-07-28 request: the envelope in `_meta`, and the headers mirroring the body. */
function modern(url: string, secret: string, method: string, params: Record<string, unknown>, meta: Record<string, unknown> = {}): Request {
  const name = typeof params.name === 'string' ? params.name : undefined
  return mcpRequest(url, {
    token: secret,
    headers: { 'mcp-protocol-version': MODERN, 'mcp-method': method, ...(name !== undefined && { 'mcp-name': name }) },
    body: {
      jsonrpc: '2.0',
      id: 1,
      method,
      params: {
        ...params,
        _meta: {
          'io.modelcontextprotocol/protocolVersion': MODERN,
          'io.modelcontextprotocol/clientInfo': { name: 'test', version: '1.0.0' },
          'io.modelcontextprotocol/clientCapabilities': { elicitation: {} },
          ...meta,
        },
      },
    },
  })
}

/** Reads a JSON or SSE answer: its JSON-RPC messages. */
async function messages(response: Response): Promise<any[]> {
  const text = await response.text()
  if (!(response.headers.get('content-type') ?? '').includes('text/event-stream')) return [JSON.parse(text)]
  return text
    .split('\n')
    .filter((line) => line.startsWith('data:'))
    .map((line) => JSON.parse(line.slice(5)))
}

async function call(url: string, secret: string, name: string, extra: Record<string, unknown> = {}, meta?: Record<string, unknown>) {
  const response = await platform.fetch(modern(url, secret, 'tools/call', { name, arguments: {}, ...extra }, meta))
  const all = await messages(response)
  return { status: response.status, version: response.headers.get('x-mcp-version'), final: all.at(-1), all }
}

const accept = (content: Record<string, unknown>) => ({ action: 'accept', content })

describe('multi-round-trip state is bound to the caller, the App and the version', () => {
  async function secondRound(url: string) {
    const first = await call(url, token('alice-all'), 'test_input_required_result_multi_round')
    expect(first.final.result).toMatchObject({ resultType: 'input_required', inputRequests: { step1: expect.any(Object) } })
    const second = await call(url, token('alice-all'), 'test_input_required_result_multi_round', {
      inputResponses: { step1: accept({ name: 'Alice' }) },
      requestState: first.final.result.requestState,
    })
    expect(second.final.result).toMatchObject({ resultType: 'input_required', inputRequests: { step2: expect.any(Object) } })
    return second.final.result.requestState as string
  }
  const finish = (url: string, secret: string, state: string) =>
    call(url, secret, 'test_input_required_result_multi_round', { inputResponses: { step2: accept({ color: 'blue' }) }, requestState: state })

  it('completes where it was minted', async () => {
    const state = await secondRound('http://weather.localhost/v1.0.0')
    expect((await finish('http://weather.localhost/v1.0.0', token('alice-all'), state)).final.result.content[0].text).toBe('Alice likes blue.')
  })

  it.each([
    ['another user', 'http://weather.localhost/v1.0.0', 'carol'],
    ['another App', 'http://notes.localhost/v1', 'alice-all'],
    ['another version', 'http://weather.localhost/v2', 'alice-all'],
  ])('replayed by %s: refused (-32602) before the tool runs (regression: it completed)', async (_label, url, who) => {
    const state = await secondRound('http://weather.localhost/v1.0.0')
    const replay = await finish(url, token(who), state)
    expect(replay.final.error).toMatchObject({ code: -32602 })
  })
})

describe('the 2026-07-28 tools', () => {
  it('test_logging_tool logs only when the request sets a log level (regression: never, no logging capability)', async () => {
    const quiet = await call('http://weather.localhost/v1', token('alice'), 'test_logging_tool')
    expect(quiet.all.filter((m) => m.method === 'notifications/message')).toEqual([])
    const loud = await call('http://weather.localhost/v1', token('alice'), 'test_logging_tool', {}, { 'io.modelcontextprotocol/logLevel': 'debug' })
    expect(loud.all.filter((m) => m.method === 'notifications/message')).toHaveLength(2)
    expect(loud.final.result.content[0].text).toBe('Logged two messages.')
  })

  it('test_input_required_result_capabilities asks no form elicitation of a client that can only do URL mode', async () => {
    const urlOnly = await call('http://weather.localhost/v1', token('alice'), 'test_input_required_result_capabilities', {}, {
      'io.modelcontextprotocol/clientCapabilities': { elicitation: { url: {} }, sampling: {} },
    })
    expect(urlOnly.status).toBe(200)
    expect(Object.keys(urlOnly.final.result.inputRequests)).toEqual(['greeting'])
  })

  it('answers the client gives are checked: roots that are not roots, a sampling answer without text, are asked again', async () => {
    const caps = { 'io.modelcontextprotocol/clientCapabilities': { roots: {}, sampling: {} } }
    for (const roots of [[null], [5, { uri: { a: 1 } }]]) {
      const again = await call('http://weather.localhost/v1', token('alice'), 'test_input_required_result_list_roots', {
        inputResponses: { client_roots: { roots } },
      }, caps)
      expect(again.final.result).toMatchObject({ resultType: 'input_required' })
    }
    const noText = await call('http://weather.localhost/v1', token('alice'), 'test_input_required_result_sampling', {
      inputResponses: { capital_question: { role: 'assistant', model: 'm', content: { type: 'text' } } },
    }, caps)
    expect(noText.final.result).toMatchObject({ resultType: 'input_required' })
  })
})

/** A 2025 `initialize` at the weather App's /v1: its answer carries the new session's id. */
const initialize = (secret: string) =>
  platform.fetch(
    mcpRequest('http://weather.localhost/v1', {
      token: secret,
      body: { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } } },
    }),
  )
/** A `ping` on a session. */
const ping = (secret: string, session: string) =>
  platform.fetch(mcpRequest('http://weather.localhost/v1', { token: secret, headers: { 'mcp-session-id': session }, body: { jsonrpc: '2.0', id: 2, method: 'ping' } }))
/** A 2026-07-28 `subscriptions/listen`: an open SSE stream, or the refusal. */
const listen = (secret: string) =>
  platform.fetch(modern('http://weather.localhost/v1', secret, 'subscriptions/listen', { notifications: { toolsListChanged: true } }))

/** The JSON-RPC messages of an SSE stream, read until `count` arrived or `waitMs` passed; the stream is then cancelled. */
async function frames(response: Response, count: number, waitMs: number): Promise<any[]> {
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  const seen: any[] = []
  let buffered = ''
  const deadline = Date.now() + waitMs
  while (seen.length < count) {
    const left = deadline - Date.now()
    if (left <= 0) break
    let timer: NodeJS.Timeout | undefined
    const next = await Promise.race([reader.read(), new Promise<null>((resolve) => (timer = setTimeout(resolve, left, null)))])
    clearTimeout(timer)
    if (next === null || next.done) break
    buffered += decoder.decode(next.value, { stream: true })
    const lines = buffered.split('\n')
    buffered = lines.pop()!
    for (const line of lines) if (line.startsWith('data:')) seen.push(JSON.parse(line.slice(5)))
  }
  await reader.cancel()
  return seen
}

describe('a deploy and the subscriptions/listen streams of 2026-07-28 clients', () => {
  it('a deploy that moves /v1 to another version tells the listen streams of the version it left that the lists changed; a version whose addresses stayed hears nothing', async () => {
    const atV1 = await listen(token('alice')) // /v1: 1.1.1
    const atV2 = await platform.fetch(modern('http://weather.localhost/v2', token('carol'), 'subscriptions/listen', { notifications: { toolsListChanged: true, promptsListChanged: true } }))
    expect([atV1.headers.get('x-mcp-version'), atV2.headers.get('x-mcp-version')]).toEqual(['1.1.1', '2.0.0'])
    platform.deploy('app_weather', '1.2.0') // /v1 is 1.2.0 now; /, /v2 and /v1.1 stay where they were
    const [heard, quiet] = await Promise.all([frames(atV1, 2, 5_000), frames(atV2, 2, 300)])
    expect(heard.map((m) => m.method)).toEqual(['notifications/subscriptions/acknowledged', 'notifications/tools/list_changed'])
    // On the stream it asked for, named by its subscription id, as the SDK stamps it.
    expect(heard[1].params._meta['io.modelcontextprotocol/subscriptionId']).toBe(heard[0].params._meta['io.modelcontextprotocol/subscriptionId'])
    expect(quiet.map((m) => m.method)).toEqual(['notifications/subscriptions/acknowledged'])
    // The client lists again at /v1 and gets the new version's tools.
    const listed = await platform.fetch(modern('http://weather.localhost/v1', token('alice'), 'tools/list', {}))
    expect(listed.headers.get('x-mcp-version')).toBe('1.2.0')
  })
})

describe('what one caller may hold of an App version', () => {

  it('at most 16 open subscriptions/listen streams per caller; another caller is not held up; a closed stream frees its slot', async () => {
    const open = await Promise.all(Array.from({ length: 16 }, () => listen(token('alice'))))
    for (const response of open) expect(response.headers.get('content-type')).toContain('text/event-stream')
    const refused = await listen(token('alice'))
    expect(refused.status).toBe(200)
    expect(await refused.json()).toMatchObject({ jsonrpc: '2.0', error: { code: -32603, message: expect.stringContaining('this caller') } })
    const carol = await listen(token('carol'))
    expect(carol.headers.get('content-type')).toContain('text/event-stream')
    await open[0]!.body!.cancel()
    const again = await listen(token('alice'))
    expect(again.headers.get('content-type')).toContain('text/event-stream')
    for (const response of [carol, again, ...open.slice(1)]) await response.body!.cancel()
  })

  it('endStreams (what a stop does first) ends the open subscriptions/listen streams, freeing their slots, and nothing else: sessions go on, and new streams open', async () => {
    const session = (await initialize(token('alice'))).headers.get('mcp-session-id')!
    const open = await Promise.all(Array.from({ length: 16 }, () => listen(token('alice'))))
    for (const response of open) expect(response.headers.get('content-type')).toContain('text/event-stream')
    platform.endStreams()
    // Each body ends (text() settles), after the acknowledgement it had.
    for (const response of open) expect(await response.text()).toContain('notifications/subscriptions/acknowledged')
    expect((await ping(token('alice'), session)).status).toBe(200)
    const again = await Promise.all(Array.from({ length: 16 }, () => listen(token('alice'))))
    for (const response of again) expect(response.headers.get('content-type')).toContain('text/event-stream')
    for (const response of again) await response.body!.cancel()
  })

  it('endStreams ends a listen stream that lived through a full garbage collection (regression: the request handed to the SDK, which links the ender to the signal the SDK keeps through a weak reference, was collected, and the stream never ended)', async () => {
    setFlagsFromString('--expose_gc')
    const gc = runInNewContext('gc') as () => void
    const open = await listen(token('alice'))
    expect(open.headers.get('content-type')).toContain('text/event-stream')
    // Weak references hold until the turn that made them ends: collected from a later one.
    for (let i = 0; i < 3; i++) {
      await new Promise((resolve) => setImmediate(resolve))
      gc()
    }
    platform.endStreams()
    let timer: NodeJS.Timeout | undefined
    const ended = await Promise.race([open.text(), new Promise<null>((resolve) => (timer = setTimeout(resolve, 5_000, null)))])
    clearTimeout(timer)
    expect(ended, 'the stream did not end').toContain('notifications/subscriptions/acknowledged')
  })

  it('at most 100 open sessions per caller: one more closes that caller\'s least recently used, and no one else\'s', async () => {
    const carolSession = (await initialize(token('carol'))).headers.get('mcp-session-id')!
    const alice: string[] = []
    for (let i = 0; i < 100; i++) {
      alice.push((await initialize(token('alice'))).headers.get('mcp-session-id')!)
      clock.advance(1) // the platform's clock: each session is used at a time of its own
    }
    expect((await ping(token('alice'), alice[0]!)).status).toBe(200) // the first, used again: no longer the least recent
    expect((await initialize(token('alice'))).status).toBe(200) // the 101st closes alice's least recently used
    // The session the App closed gets the dispatch layer's answer for an unknown session, at once.
    const evicted = await ping(token('alice'), alice[1]!)
    expect(evicted.status).toBe(404)
    expect(await evicted.json()).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Session not found', data: { error: 'session_not_found' } } })
    expect((await ping(token('alice'), alice[0]!)).status).toBe(200)
    expect((await ping(token('alice'), alice[99]!)).status).toBe(200)
    expect((await ping(token('carol'), carolSession)).status).toBe(200)
  })
})

describe('createMcpAppHandler wired as a plain handler', () => {
  it('takes a DispatchContext second argument (routeByVersion wiring) as no caller, not as one subject every user shares', async () => {
    const app = { id: 'app_w', slug: 'weather', name: 'Weather' }
    const handler = createMcpAppHandler(() => buildAppServer(app, '1.0.0'), { maxSessionsPerCaller: 1 })
    try {
      const context = (subject: string) => ({ identity: { subject, method: 'api_token' }, app, version: '1.0.0' }) as unknown as CallerOf
      const open = async (subject: string) => {
        const body = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } } }
        return (await handler(mcpRequest('http://weather.localhost/v1', { body }), context(subject))).headers.get('mcp-session-id')!
      }
      const first = await open('alice')
      await open('bob')
      const pinged = await handler(mcpRequest('http://weather.localhost/v1', { headers: { 'mcp-session-id': first }, body: { jsonrpc: '2.0', id: 2, method: 'ping' } }))
      expect(pinged.status).toBe(200) // bob's session did not close alice's
    } finally {
      await handler.close()
    }
  })
})

describe('what a session and a request may hold', () => {
  const app = { id: 'app_w', slug: 'weather', name: 'Weather' }

  it('past a cap, the least recently used session with no answer streaming is closed, not one whose GET stream is open; maxSessions holds exactly (regression: the stream cut; one session over)', async () => {
    const initialize = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } } }
    for (const [options, subject] of [
      [{ maxSessionsPerCaller: 2 }, 'alice'],
      [{ maxSessions: 2 }, undefined],
    ] as const) {
      const handler = createMcpAppHandler(() => buildAppServer(app, '1.0.0'), options)
      try {
        const caller = subject && { subject, appId: app.id, version: '1.0.0' }
        const open = async () => (await handler(mcpRequest('http://weather.localhost/v1', { body: initialize }), caller)).headers.get('mcp-session-id')!
        const ping = async (id: string) => {
          const answer = await handler(mcpRequest('http://weather.localhost/v1', { headers: { 'mcp-session-id': id }, body: { jsonrpc: '2.0', id: 2, method: 'ping' } }), caller)
          await answer.text()
          return answer.status
        }
        const streaming = await open()
        const stream = await handler(
          new Request('http://weather.localhost/v1', { headers: { accept: 'text/event-stream', 'mcp-session-id': streaming, 'mcp-protocol-version': '2025-06-18' } }),
          caller,
        )
        expect(stream.status).toBe(200)
        const quiet = await open()
        expect(await ping(quiet)).toBe(200)
        const third = await open()
        expect(handler.sessionCount(), JSON.stringify(options)).toBe(2)
        expect(await ping(quiet), JSON.stringify(options)).toBe(404)
        expect(await ping(streaming), JSON.stringify(options)).toBe(200)
        expect(await ping(third)).toBe(200)
        await stream.body?.cancel()
      } finally {
        await handler.close()
      }
    }
  })

  it('a session idle past idleMs is closed even when no other session opens (404 session_not_found); one with an open stream is not idle', async () => {
    let clock = Date.UTC(2030, 0, 1)
    const handler = createMcpAppHandler(() => buildAppServer(app, '1.0.0'), { idleMs: 30 * 60_000, now: () => clock })
    try {
      const caller = { subject: 'alice', appId: app.id, version: '1.0.0' }
      const body = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } } }
      const open = async () => (await handler(mcpRequest('http://weather.localhost/v1', { body }), caller)).headers.get('mcp-session-id')!
      // Read to the end, as a client reads an answer (an answer still streaming keeps its session).
      const ping = async (id: string) => {
        const answer = await handler(mcpRequest('http://weather.localhost/v1', { headers: { 'mcp-session-id': id }, body: { jsonrpc: '2.0', id: 2, method: 'ping' } }), caller)
        return { status: answer.status, body: await answer.text() }
      }
      const idle = await open()
      const streaming = await open()
      expect((await ping(idle)).status).toBe(200)
      // A GET stream held open on the second session.
      const stream = await handler(
        new Request('http://weather.localhost/v1', { headers: { accept: 'text/event-stream', 'mcp-session-id': streaming, 'mcp-protocol-version': '2025-06-18' } }),
        caller,
      )
      expect(stream.status).toBe(200)

      clock += 30 * 60_000 + 1
      const late = await ping(idle)
      expect(late.status).toBe(404)
      expect(JSON.parse(late.body).error.data).toEqual({ error: 'session_not_found' })
      expect((await ping(streaming)).status).toBe(200)

      // Once its stream is gone and it is left alone for idleMs, the sweep of any request closes it.
      await stream.body!.cancel()
      clock += 30 * 60_000 + 1
      await (await handler(mcpRequest('http://weather.localhost/v1', { body: { jsonrpc: '2.0', id: 3, method: 'tools/list' } }), caller)).text()
      expect(handler.sessionCount()).toBe(0)
    } finally {
      await handler.close()
    }
  })

  it('a POST body that trickles in gets 408 at bodyTimeoutMs, and its stream is let go', async () => {
    const handler = createMcpAppHandler(() => buildAppServer(app, '1.0.0'), { bodyTimeoutMs: 200 })
    try {
      let cancelled = false
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          controller.enqueue(new TextEncoder().encode('{"jsonrpc":"2.0",')) // and then nothing
        },
        cancel() {
          cancelled = true
        },
      })
      const request = new Request('http://weather.localhost/v1', {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body,
        duplex: 'half',
      } as RequestInit)
      const response = await handler(request)
      expect(response.status).toBe(408)
      expect(response.headers.get('connection')).toBe('close')
      expect(await response.json()).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32000 } })
      expect(cancelled).toBe(true)
    } finally {
      await handler.close()
    }
  })

  it('a session keeps at most maxChars of events for resuming; one larger alone is kept as a place only', async () => {
    const store = createSessionEventStore({ maxChars: 1_000 })
    const streamOf = (id: string) => store.getStreamIdForEventId!(id)
    const message = (i: number) => ({ jsonrpc: '2.0' as const, id: i, result: { text: 'x'.repeat(300) } })
    const ids: string[] = []
    for (let i = 0; i < 10; i++) ids.push(await store.storeEvent('stream-1', message(i)))
    // About 340 characters each: the last two fit; older ones can no longer be resumed from.
    expect(await streamOf(ids[9]!)).toBe('stream-1')
    expect(await streamOf(ids[8]!)).toBe('stream-1')
    expect(await streamOf(ids[6]!)).toBeUndefined()
    const replayed: unknown[] = []
    await store.replayEventsAfter(ids[8]!, { send: async (_id, m) => void replayed.push(m) })
    expect(replayed).toEqual([message(9)])
    // One event larger than the budget is not kept, only its place: its stream resumes after
    // it, and nothing before it can be resumed from (that could not give the large one back).
    const big = await store.storeEvent('stream-1', { jsonrpc: '2.0', id: 99, result: { text: 'y'.repeat(5_000) } })
    expect(await streamOf(big)).toBe('stream-1')
    expect(await streamOf(ids[9]!)).toBeUndefined()
    await expect(store.replayEventsAfter(ids[9]!, { send: async () => {} })).rejects.toThrow(/Unknown event id/)
    const after = await store.storeEvent('stream-1', message(100))
    const resumed: unknown[] = []
    await store.replayEventsAfter(big, { send: async (_id, m) => void resumed.push(m) })
    expect(resumed).toEqual([message(100)])
    expect(await streamOf(after)).toBe('stream-1')
    // The place holds none of the large event's characters: two events of 340 fit beside it,
    // a third pushes out the oldest entry, the place.
    await store.storeEvent('stream-1', message(101))
    expect(await streamOf(big)).toBe('stream-1')
    await store.storeEvent('stream-1', message(102))
    expect(await streamOf(big)).toBeUndefined()
  })
})

describe('the per-caller caps hold against a burst (slots are taken before the first await)', () => {
  it('60 concurrent subscriptions/listen from one caller: 16 streams, 44 refused', async () => {
    const all = await Promise.all(
      Array.from({ length: 60 }, () => listen(token('alice'))),
    )
    const streams = all.filter((r) => (r.headers.get('content-type') ?? '').includes('text/event-stream'))
    expect(streams).toHaveLength(16)
    for (const r of all) await r.body?.cancel()
  })

  it('250 concurrent initialize from one caller: at most 100 of its sessions are open at once, and another caller\'s is untouched', async () => {
    const carol = (await initialize(token('carol'))).headers.get('mcp-session-id')!
    const burst = await Promise.all(Array.from({ length: 250 }, () => initialize(token('alice'))))
    const ids = burst.map((r) => r.headers.get('mcp-session-id')).filter((id): id is string => id !== null)
    const alive = (await Promise.all(ids.map(async (id) => (await ping(token('alice'), id)).status))).filter((status) => status === 200)
    expect(alive.length).toBeLessThanOrEqual(100)
    expect(alive.length).toBeGreaterThan(0)
    // Refused ones are told when to try again.
    for (const refused of burst.filter((r) => r.status === 429)) expect(refused.headers.get('retry-after')).toBe('1')
    expect((await ping(token('carol'), carol)).status).toBe(200)
  })
})

describe('routing between the two legs', () => {
  it('a batch holding a 2026-07-28 message goes to the 2026 server, which refuses it (no batches in that revision)', async () => {
    const request = modern('http://weather.localhost/v1', token('alice'), 'tools/call', { name: 'echo', arguments: { text: 'hi' } })
    const batch = [JSON.parse(await request.text())]
    const response = await platform.fetch(mcpRequest('http://weather.localhost/v1', { token: token('alice'), body: batch }))
    const answer = await json(response)
    expect(JSON.stringify(answer)).not.toContain('hi (from weather')
    expect(JSON.stringify(answer)).toContain('-32600')
  })

  it('after close, both legs answer 503', async () => {
    await platform.close()
    const legacy = await platform.fetch(mcpRequest('http://weather.localhost/v1', { token: token('alice') }))
    const modernAnswer = await platform.fetch(modern('http://weather.localhost/v1', token('alice'), 'tools/list', {}))
    expect([legacy.status, modernAnswer.status]).toEqual([503, 503])
    expect(errors).toEqual([])
  })
})
