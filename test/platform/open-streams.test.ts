/**
 * The reference platform: an MCP session's `GET` stream opened with an API token ends once the
 * token no longer reaches the App (a password reset, its expiry), so the session can idle and be
 * closed. Found by an audit: such a stream stayed open 31 days after the reset, past the
 * token's expiry, and the App kept its session, pushing what it sent to whoever held it.
 *
 * Real time for the checks (`reauthorizeEveryMs: 50`); the platform's clock for expiry.
 */
import { describe, expect, it } from 'vitest'
import { CLIENT, DAY, INITIALIZE, createTestPlatform, devSignIn, mcpRequest } from '../helpers/platform.js'

const URL_ = 'http://weather.localhost/'
const PROTOCOL = '2025-06-18'

async function openSession(platform: ReturnType<typeof createTestPlatform>['platform'], secret: string) {
  const opened = await platform.fetch(mcpRequest(URL_, { token: secret, body: INITIALIZE }), { clientAddress: CLIENT })
  await opened.text()
  expect(opened.status).toBe(200)
  const sessionId = opened.headers.get('mcp-session-id')!
  const headers = { 'mcp-session-id': sessionId, 'mcp-protocol-version': PROTOCOL }
  const initialized = await platform.fetch(mcpRequest(URL_, { token: secret, body: { jsonrpc: '2.0', method: 'notifications/initialized' }, headers }), {
    clientAddress: CLIENT,
  })
  await initialized.text()
  const stream = await platform.fetch(new Request(URL_, { headers: { authorization: `Bearer ${secret}`, accept: 'text/event-stream', ...headers } }), {
    clientAddress: CLIENT,
  })
  expect(stream.status).toBe(200)
  expect(stream.headers.get('content-type')).toMatch(/^text\/event-stream/)
  return { sessionId, headers, reader: stream.body!.getReader() }
}

/** Reads until the stream ends; `true` when it did. */
async function readToEnd(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<boolean> {
  for (;;) {
    const chunk = await reader.read()
    if (chunk.done) return true
  }
}

describe('the reference platform ends the open streams of a token that no longer passes', () => {
  it('a GET stream opened before a password reset ends; another user\'s goes on', async () => {
    const { platform, token, errors } = createTestPlatform({ reauthorizeEveryMs: 50 })
    try {
      const secret = token('alice')
      const { headers, reader } = await openSession(platform, secret)
      const other = await openSession(platform, token('carol'))

      const session = await devSignIn(platform, 'user_alice')
      const reset = await platform.fetch(
        new Request('http://api.localhost/dev/password-reset', { method: 'POST', headers: { cookie: session.cookie, 'x-csrf-token': session.csrfToken } }),
      )
      expect(reset.status).toBe(200)
      expect((await reset.json()).revoked).toBeGreaterThan(0)

      // Ended by the dispatcher's next check (a hang here is the bug: the test times out).
      expect(await readToEnd(reader)).toBe(true)
      // Another user's stream goes on.
      const still = await Promise.race([other.reader.read().then(() => 'read'), new Promise((resolve) => setTimeout(() => resolve('open'), 300))])
      expect(still).toBe('open')
      const after = await platform.fetch(mcpRequest(URL_, { token: secret, headers }), { clientAddress: CLIENT })
      expect(after.status).toBe(401)
      expect(errors).toEqual([])
    } finally {
      await platform.close()
    }
  })

  it('an expired token\'s stream ends at the first check after its expiry', async () => {
    const { platform, clock, token } = createTestPlatform({ reauthorizeEveryMs: 50 })
    try {
      const { reader } = await openSession(platform, token('alice'))
      clock.advance(91 * DAY)
      expect(await readToEnd(reader)).toBe(true)
    } finally {
      await platform.close()
    }
  })
})
