/**
 * A 404 of a request in a session ends the session's pin only when it is the MCP handler's
 * `Session not found` (JSON): a framework's not-found for a method no route takes (Express's
 * HTML page, Hono's text) leaves it, and so does one an adapter marks as no handler's (`null`).
 * An adapter of the platform's own that says nothing of the type keeps the rule of before: any
 * 404 ends it.
 */
import { type DispatchOutcome, type DispatchRequest, createDispatcher } from 'mcp-dispatch'
import { describe, expect, it, vi } from 'vitest'
import { createFixture } from '../adapters/helpers.js'

/** A POST to /v1 of weather.localhost with `token`, in session `sessionId` if given. */
function request(token: string, sessionId?: string): DispatchRequest {
  const headers = new Headers({ authorization: `Bearer ${token}`, ...(sessionId && { 'mcp-session-id': sessionId }) })
  return { method: 'POST', path: '/v1', host: 'weather.localhost', origin: 'http://weather.localhost', headers, clientAddress: '127.0.0.1' }
}

describe('a 404 in a session, by its Content-Type', () => {
  /** Opens a session `id`, answers a request of it with `outcome`, then answers whether the pin is still there. */
  async function pinAfter(id: string, outcome: Omit<DispatchOutcome, 'sessionId'>): Promise<boolean> {
    const fixture = createFixture()
    const opened = await fixture.dispatcher.decide(request(fixture.tokens.alice))
    if (opened.type !== 'dispatch') throw new Error('not dispatched')
    await opened.complete({ status: 200, sessionId: id })
    const inSession = await fixture.dispatcher.decide(request(fixture.tokens.alice, id))
    if (inSession.type !== 'dispatch') throw new Error('the session was not pinned')
    await inSession.complete({ ...outcome, sessionId: null })
    const after = await fixture.dispatcher.decide(request(fixture.tokens.alice, id))
    if (after.type === 'dispatch') return true
    expect(after.reply.status).toBe(404)
    return false
  }

  it.each([
    ['application/json', false],
    ['application/json; charset=utf-8', false],
    ['Application/JSON', false],
    ['application/problem+json', false],
    [undefined, false],
    ['text/html; charset=utf-8', true],
    ['text/plain;charset=UTF-8', true],
    ['application/jsonx', true],
    ['text/json-ish', true],
    [null, true],
  ] as const)('Content-Type %s: pin kept %s', async (contentType, kept) => {
    const outcome = contentType === undefined ? { status: 404 } : { status: 404, contentType }
    expect(await pinAfter('s1', outcome)).toBe(kept)
  })

  it('another status leaves the pin, whatever its type', async () => {
    expect(await pinAfter('s1', { status: 400, contentType: 'application/json' })).toBe(true)
    expect(await pinAfter('s1', { status: 500 })).toBe(true)
  })
})

describe("the default session store's clock", () => {
  it('times the idle TTL on the monotonic clock: a wall clock stepped forward past sessionTtlMs ends no pin (regression: every pin ended)', async () => {
    vi.useFakeTimers({ toFake: ['Date'] })
    try {
      const fixture = createFixture()
      // No clock given: the dispatcher's default stores, on their default clocks.
      const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, now: undefined })
      const opened = await dispatcher.decide(request(fixture.tokens.alice))
      if (opened.type !== 'dispatch') throw new Error('not dispatched')
      await opened.complete({ status: 200, sessionId: 's1' })
      // NTP stepping a clock that was hours behind (the default sessionTtlMs is an hour).
      vi.setSystemTime(Date.now() + 3 * 60 * 60_000)
      const later = await dispatcher.decide(request(fixture.tokens.alice, 's1'))
      expect(later.type).toBe('dispatch')
    } finally {
      vi.useRealTimers()
    }
  })
})

describe('sessionTtlMs', () => {
  it("is a new session's idle lifetime from the answer that opened it: served within it, 404 session_not_found past it", async () => {
    const fixture = createFixture()
    let at = Date.now()
    const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, now: () => at, sessionTtlMs: 10 * 60_000 })
    for (const [idle, expected] of [
      [10 * 60_000 - 1, 'dispatch'],
      [10 * 60_000 + 1, 'reply'],
    ] as const) {
      const id = `s-${idle}`
      const opened = await dispatcher.decide(request(fixture.tokens.alice))
      if (opened.type !== 'dispatch') throw new Error('not dispatched')
      await opened.complete({ status: 200, sessionId: id })
      at += idle
      const later = await dispatcher.decide(request(fixture.tokens.alice, id))
      expect(later.type, String(idle)).toBe(expected)
      if (later.type === 'reply') {
        expect(later.reply.status).toBe(404)
        expect(JSON.parse(String(later.reply.body)).error.data).toEqual({ error: 'session_not_found' })
      }
    }
  })
})
