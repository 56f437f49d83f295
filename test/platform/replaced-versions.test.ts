/**
 * The reference platform lets go of what a deploy replaced once nothing uses it (found by a soak
 * with heap snapshots: every replaced version kept its handler, about 8 kB, and its abandoned
 * sessions, about 100 kB each, for the life of the process, because idle sessions were only
 * swept by requests that reached their version). A session pinned to the replaced version is
 * served while it is used; once idle past 30 minutes it is closed by the sweep timer, and the
 * version's handler goes; the session then gets the dispatch layer's 404 `session_not_found`.
 */
import { afterEach, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import { CLIENT, INITIALIZE, MINUTE, TOOLS_LIST, createTestPlatform, mcpRequest } from '../helpers/platform.js'

const WEATHER = 'http://weather.localhost'

let running: Platform | undefined
afterEach(async () => {
  await running?.close()
  running = undefined
})

/** Waits (real time) until `check` holds, the sweep timers having had their turns. */
async function eventually(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 200 && !check(); i++) await new Promise((resolve) => setTimeout(resolve, 10))
  expect(check(), what).toBe(true)
}

describe('versions a deploy replaced', () => {
  it('keep their handler while a pinned session uses them, and lose it, with the session, once idle', async () => {
    const { platform, clock, token } = createTestPlatform({ sweepEveryMs: 5 })
    running = platform
    const call = (sessionId?: string, body: unknown = TOOLS_LIST) =>
      platform.fetch(
        mcpRequest(`${WEATHER}/v1.1`, {
          token: token('alice'),
          body,
          headers: sessionId ? { 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' } : {},
        }),
        { clientAddress: CLIENT },
      )

    const opened = await call(undefined, INITIALIZE)
    expect(opened.status).toBe(200)
    expect(opened.headers.get('x-mcp-version')).toBe('1.1.1')
    const sessionId = opened.headers.get('mcp-session-id')!
    await opened.text()
    // Abandoned by its client (no DELETE); a second session is closed properly.
    const other = await call(undefined, INITIALIZE)
    const otherId = other.headers.get('mcp-session-id')!
    await other.text()
    const closed = await platform.fetch(
      mcpRequest(`${WEATHER}/v1.1`, { method: 'DELETE', token: token('alice'), headers: { 'mcp-session-id': otherId } }),
      { clientAddress: CLIENT },
    )
    expect(closed.status).toBe(200)

    expect(platform.deploy('app_weather', '1.1.2')).toEqual(['1.0.0', '1.1.2', '2.0.0'])
    expect(platform.servedVersions('app_weather')).toEqual(['1.0.0', '1.1.1', '1.1.2', '2.0.0'])

    // Still in use: pinned, served by 1.1.1, through several sweeps.
    clock.advance(10 * MINUTE)
    await new Promise((resolve) => setTimeout(resolve, 50))
    const pinned = await call(sessionId)
    expect(pinned.status).toBe(200)
    expect(pinned.headers.get('x-mcp-version')).toBe('1.1.1')
    await pinned.text()
    expect(platform.servedVersions('app_weather')).toContain('1.1.1')

    // Then left: past the 30 minutes of idleness no request reaches 1.1.1, yet its session is
    // closed and its handler dropped; live versions keep theirs, used or not.
    clock.advance(31 * MINUTE)
    await eventually(() => !platform.servedVersions('app_weather').includes('1.1.1'), 'the replaced version’s handler is dropped')
    expect(platform.servedVersions('app_weather')).toEqual(['1.0.0', '1.1.2', '2.0.0'])
    expect(platform.servedVersions('app_notes')).toEqual(['0.9.0', '1.0.0'])

    const gone = await call(sessionId)
    expect(gone.status).toBe(404)
    expect(((await gone.json()) as { error: { data: { error: string } } }).error.data.error).toBe('session_not_found')
    // New sessions at /v1.1 go to the live patch.
    const fresh = await call(undefined, INITIALIZE)
    expect(fresh.headers.get('x-mcp-version')).toBe('1.1.2')
    await fresh.text()
  })

  it('refuses a sweep period that is not a whole number of milliseconds a timer can wait', () => {
    for (const sweepEveryMs of [0, -1, 0.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 31]) {
      expect(() => createTestPlatform({ sweepEveryMs }), String(sweepEveryMs)).toThrow(/sweepEveryMs must be a whole number of milliseconds from 1 to 2147483647/)
    }
  })
})
