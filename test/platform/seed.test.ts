import { describe, expect, it, onTestFinished, vi } from 'vitest'
import { createPlatform } from '../../examples/platform/index.js'

const base = {
  apps: [{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }],
  users: [{ id: 'u1' }],
  subscriptions: [{ userId: 'u1', appId: 'app_w', active: true }],
}

/** A `tools/list` of the seeded token `t` at `url`, from `clientAddress`. */
function asToken(platform: ReturnType<typeof createPlatform>, url: string, clientAddress: string): Promise<Response> {
  return platform.fetch(
    new Request(url, {
      method: 'POST',
      headers: { authorization: `Bearer ${platform.tokens.t}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    }),
    { clientAddress },
  )
}

describe('reference platform seed validation', () => {
  it('refuses an allowlist entry that is not an address or CIDR range, naming it', () => {
    const seed = { ...base, tokens: [{ name: 't', userId: 'u1', servers: ['app_w'], expiresInDays: 7 as const, allowedIps: ['10.0.0.1/33'] }] }
    expect(() => createPlatform({ seed })).toThrow(/allowedIps entry 0 .*prefix length/)
  })

  it('refuses an empty allowlist as the token API does, instead of serving the token from every address (regression)', async () => {
    const token = { name: 't', userId: 'u1', servers: ['app_w'], expiresInDays: 7 as const }
    expect(() => createPlatform({ seed: { ...base, tokens: [{ ...token, allowedIps: [] }] } })).toThrow(
      new TypeError('seed token "t": allowedIps must name at least one address or CIDR range (null removes the allowlist)'),
    )
    expect(() => createPlatform({ seed: { ...base, tokens: [{ ...token, allowedIps: Array(101).fill('10.0.0.1') }] } })).toThrow(
      new TypeError('seed token "t": allowedIps at most 100 entries'),
    )
    expect(() => createPlatform({ seed: { ...base, tokens: [{ ...token, expiresInDays: 14 as never }] } })).toThrow(
      new TypeError('seed tokens.0.expiresInDays: must be 7, 30 or 90'),
    )
    // null, or no allowedIps, is no allowlist: served from anywhere.
    const platform = createPlatform({ seed: { ...base, tokens: [{ ...token, allowedIps: null }] } })
    try {
      const response = await asToken(platform, 'http://weather.localhost/v1', '203.0.113.7')
      expect(response.status).toBe(200)
    } finally {
      await platform.close()
    }
  })

  it('names the field of a seed the schema refuses, in one line (not zod\'s dump)', () => {
    const seed = { ...base, apps: [{ id: 'app_w', slug: 'Bad Slug', name: 'Weather', versions: ['1.0.0'] }] }
    expect(() => createPlatform({ seed })).toThrow(new TypeError('seed apps.0.slug: must be a DNS label in lower case'))
    expect(() => createPlatform({ seed: { ...base, apps: 5 } as never })).toThrow(/^seed apps: /)
  })

  it('refuses a domain that is no host name, a now or onError that is no function, an option it does not have, naming the option (regression: every request a 404, or a raw TypeError; a misspelt option taken)', async () => {
    for (const domain of ['', 'localhost:8787', '.localhost', 'localhost.', 'http://example.com', 'a..b', 123]) {
      expect(() => createPlatform({ seed: base, domain: domain as string }), String(domain)).toThrow(/^domain: must be a host name without port or scheme/)
    }
    expect(() => createPlatform({ seed: base, now: 5 as never })).toThrow(new TypeError('now: must be a function answering epoch milliseconds'))
    expect(() => createPlatform({ seed: base, onError: 'log' as never })).toThrow(new TypeError('onError: must be a function'))
    // A misspelt option, which would leave its default in silence (regression: taken).
    expect(() => createPlatform({ seed: base, sweepEverMs: 5, trustproxy: 1 } as never)).toThrow(/^"sweepEverMs", "trustproxy": not an option of createPlatform \(seed, now, domain, .*reauthorizeEveryMs\)$/)
    expect(() => createPlatform(null as never)).toThrow(new TypeError('options: must be an object with a seed'))
    // Any case is taken, as a Host header's.
    const platform = createPlatform({ seed: { ...base, tokens: [{ name: 't', userId: 'u1', servers: ['app_w'], expiresInDays: 7 }] }, domain: 'Apps.Example.COM' })
    try {
      const response = await asToken(platform, 'http://weather.apps.example.com/', '127.0.0.1')
      expect([response.status, response.headers.get('x-mcp-version')]).toEqual([200, '1.0.0'])
    } finally {
      await platform.close()
    }
  })

  it('without now, a wall clock stepped forward past the session TTL (NTP, a resumed VM) ends no session: the library times its spans on a monotonic clock (regression: the platform gave it Date.now, and the pin expired)', async () => {
    // The wall clock (Date) is the test's from here, the monotonic one (performance.now) real.
    vi.useFakeTimers({ toFake: ['Date'], now: Date.now() })
    onTestFinished(() => void vi.useRealTimers())
    const platform = createPlatform({ seed: { ...base, tokens: [{ name: 't', userId: 'u1', servers: ['app_w'], expiresInDays: 7 }] } })
    const send = (body: unknown, session?: string) =>
      platform.fetch(
        new Request('http://weather.localhost/v1', {
          method: 'POST',
          headers: {
            authorization: `Bearer ${platform.tokens.t}`,
            'content-type': 'application/json',
            accept: 'application/json, text/event-stream',
            ...(session && { 'mcp-session-id': session, 'mcp-protocol-version': '2025-06-18' }),
          },
          body: JSON.stringify(body),
        }),
        { clientAddress: '127.0.0.1' },
      )
    try {
      const opened = await send({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'clock', version: '0.0.0' } } })
      expect(opened.status).toBe(200)
      await opened.text()
      const session = opened.headers.get('mcp-session-id')!
      vi.setSystemTime(Date.now() + 2 * 3_600_000) // past the dispatcher's default idle TTL of an hour
      const answer = await send({ jsonrpc: '2.0', id: 1, method: 'ping' }, session)
      expect([answer.status, answer.headers.get('x-mcp-version')]).toEqual([200, '1.0.0'])
      expect(await answer.text()).toContain('"result":{}')
    } finally {
      await platform.close()
    }
  })

  it('refuses the slug reserved for the token API host', () => {
    const seed = { ...base, apps: [{ id: 'app_a', slug: 'api', name: 'API', versions: ['1.0.0'] }] }
    expect(() => createPlatform({ seed })).toThrow(/reserved/)
  })

  it('refuses a deploy sequence the versions rule refuses', () => {
    const seed = { ...base, apps: [{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.1', '1.0.0'] }] }
    expect(() => createPlatform({ seed })).toThrow(/1\.0\.0/)
  })

  it('names the App version a deploy refuses', () => {
    const seed = { ...base, apps: [{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.0', 'banana'] }] }
    expect(() => createPlatform({ seed })).toThrow(/apps\.0\.versions\.1 \(weather\)/)
  })

  it('refuses a misspelt key instead of dropping it (an allowlist or a limit must never go missing silently)', () => {
    const token = { name: 't', userId: 'u1', servers: ['app_w'], expiresInDays: 7 as const }
    expect(() => createPlatform({ seed: { ...base, tokens: [{ ...token, allowedIPs: ['10.0.0.0/8'] }] } as never })).toThrow(/allowedIPs/)
    expect(() => createPlatform({ seed: { ...base, apps: [{ ...base.apps[0]!, rateLimit: 5 }] } as never })).toThrow(/rateLimit/)
  })

  it('refuses subscriptions of unknown users or Apps, and two tokens of one name', () => {
    expect(() => createPlatform({ seed: { ...base, subscriptions: [{ userId: 'nobody', appId: 'app_w', active: true }] } })).toThrow(/subscriptions\.0: unknown user/)
    expect(() => createPlatform({ seed: { ...base, subscriptions: [{ userId: 'u1', appId: 'app_x', active: true }] } })).toThrow(/subscriptions\.0: unknown App/)
    const token = { name: 't', userId: 'u1', servers: ['app_w'], expiresInDays: 7 as const }
    expect(() => createPlatform({ seed: { ...base, tokens: [token, token] } })).toThrow(/used twice/)
  })

  it('names tokens as the token API would, Object.prototype names included (regression: refused as used twice)', async () => {
    const names = ['toString', 'constructor', 'hasOwnProperty', '__proto__']
    const platform = createPlatform({ seed: { ...base, tokens: names.map((name) => ({ name, userId: 'u1', servers: ['app_w'], expiresInDays: 7 as const })) } })
    try {
      expect(Object.keys(platform.tokens).sort()).toEqual([...names].sort())
      for (const name of names) expect(platform.tokens[name]).toMatch(/^svc_[A-Za-z0-9]{44}$/)
      expect(Object.getPrototypeOf(platform.tokens)).toBeNull()
    } finally {
      await platform.close()
    }
  })

  it('refuses a limit the rate limiter refuses, an upstream that is not http(s), two Apps of one id or slug, and subscriptions that disagree', () => {
    const app = base.apps[0]!
    expect(() => createPlatform({ seed: { ...base, apps: [{ ...app, rateLimitPerMinute: 1e15 }] } })).toThrow(/rateLimitPerMinute/)
    expect(() => createPlatform({ seed: { ...base, apps: [{ ...app, rateLimitPerMinute: 999_999_999_999_999 }] } })).not.toThrow()
    expect(() => createPlatform({ seed: { ...base, apps: [{ ...app, versions: [{ version: '1.0.0', upstream: 'ftp://files.example/mcp' }] }] } })).toThrow(
      /http\(s\) URL/,
    )
    expect(() => createPlatform({ seed: { ...base, apps: [{ ...app, versions: [{ version: '1.0.0', upstream: 'http://u:p@127.0.0.1:9/mcp' }] }] } })).toThrow(
      /must not carry credentials/,
    )
    expect(() => createPlatform({ seed: { ...base, apps: [app, { ...app, slug: 'other' }] } })).toThrow(/apps\.1\.id: "app_w" is used twice/)
    expect(() => createPlatform({ seed: { ...base, apps: [app, { ...app, id: 'app_o' }] } })).toThrow(/apps\.1\.slug: "weather" is used twice/)
    const twice = [...base.subscriptions, { userId: 'u1', appId: 'app_w', active: false }]
    expect(() => createPlatform({ seed: { ...base, subscriptions: twice } })).toThrow(/subscriptions\.1: u1 on app_w is already listed as active/)
    expect(() => createPlatform({ seed: { ...base, subscriptions: [...base.subscriptions, ...base.subscriptions] } })).not.toThrow()
  })

  it('refuses a deploy whose upstream is not an http(s) URL before the version goes live', async () => {
    const platform = createPlatform({ seed: base })
    try {
      for (const upstream of ['not a url', 'ftp://files.example/mcp', 'http://user:secret@127.0.0.1:9/mcp']) {
        expect(() => platform.deploy('app_w', '2.0.0', upstream)).toThrow(/upstream/)
      }
      // Not live: the versionless URL still serves 1.0.0.
      expect(platform.deploy('app_w', '1.1.0')).toEqual(['1.0.0', '1.1.0'])
    } finally {
      await platform.close()
    }
  })

  it('refuses a token for an unknown user or App', () => {
    expect(() => createPlatform({ seed: { ...base, tokens: [{ name: 't', userId: 'nobody', servers: ['app_w'], expiresInDays: 7 as const }] } })).toThrow(/unknown user/)
    expect(() => createPlatform({ seed: { ...base, tokens: [{ name: 't', userId: 'u1', servers: ['app_x'], expiresInDays: 7 as const }] } })).toThrow(/unknown App/)
  })

  it('holds seeded token names to the token API\'s name rules', () => {
    const token = (name: string) => ({ ...base, tokens: [{ name, userId: 'u1', servers: ['app_w'], expiresInDays: 7 as const }] })
    expect(() => createPlatform({ seed: token('ci\nfake log line') })).toThrow(/name must not contain control characters/)
    expect(() => createPlatform({ seed: token('evil\u202Etxt.exe') })).toThrow(/bidirectional/)
    expect(() => createPlatform({ seed: token('x'.repeat(101)) })).toThrow(/at most 100/)
    expect(() => createPlatform({ seed: token(' ci ') })).toThrow(/spaces around it/)
    expect(() => createPlatform({ seed: token('ci deploy') })).not.toThrow()
  })
})
