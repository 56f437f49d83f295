/**
 * Step 5 end to end, from an audit against spec section 7 (the 429 body), DESIGN.md (the
 * `RateLimit` / `RateLimit-Policy` fields of draft-ietf-httpapi-ratelimit-headers, fail open
 * and log) and docs/pipeline.md (the counter key is App, user, window type):
 *
 * - the 429 as the spec shows it, `Retry-After` and the `t` of `RateLimit` naming one instant;
 * - the limits at the edges (0, `MAX_RATE_LIMIT`) and the window's first and last millisecond;
 * - one App's traffic never spends another App's budget, nor one user's another user's;
 * - two dispatchers on one Redis, bursting at once, never serve more than the limit; the
 *   counter expires, and its key holds no secret;
 * - a counter store that fails is served (fail open) and logged: every failure to an `onError`
 *   given, but not a stderr line per request from the default logger (regression: a Redis that
 *   was down wrote one line per request).
 */
import {
  type DispatchRequest,
  MAX_RATE_LIMIT,
  type RateLimitPolicy,
  type RateLimitStore,
  createDispatcher,
  createMemoryAppStore,
  createMemoryRateLimitStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { createRedisRateLimitStore } from 'mcp-dispatch/redis'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { midMinute } from '../helpers/clock.js'
import { dispatchRequest } from '../helpers/dispatch-request.js'
import { describeRedis } from '../helpers/redis.js'

const WEATHER = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.2.3'] }
const NEWS = { id: 'app_news', slug: 'news', name: 'News', versions: ['2.0.0'] }
// 2030-01-01T00:00:20.250Z: 20.25 s into a minute.
const T = Date.UTC(2030, 0, 1, 0, 0, 20, 250)

interface Answer {
  status: number
  headers: Record<string, string | undefined>
  body: { jsonrpc: string; id: null; error: { code: number; message: string; data?: Record<string, unknown> } } | undefined
}

interface PlatformOptions {
  policy: (app: { id: string }) => RateLimitPolicy | undefined
  now?: () => number
  failOpen?: boolean
  /** `false`: no `onError` (the default logger). */
  onError?: false
}

/**
 * A platform with two Apps; `user_1` holds a token for both and a second one for Weather,
 * `user_2` one for Weather. `instance(store)` makes a dispatcher (an instance behind the load
 * balancer) on the shared token service, counting in `store` (default: its own memory store).
 */
async function platform(options: PlatformOptions) {
  const errors: Array<{ error: unknown; context: string }> = []
  const apps = createMemoryAppStore([WEATHER, NEWS])
  const subscriptions = createMemorySubscriptionStore([
    { userId: 'user_1', appId: WEATHER.id, active: true },
    { userId: 'user_1', appId: NEWS.id, active: true },
    { userId: 'user_2', appId: WEATHER.id, active: true },
  ])
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  const both = await tokens.create({ userId: 'user_1', name: 'both', servers: [WEATHER.id, NEWS.id], expiresInDays: 30 })
  const weatherOnly = await tokens.create({ userId: 'user_1', name: 'weather', servers: [WEATHER.id], expiresInDays: 30 })
  const otherUser = await tokens.create({ userId: 'user_2', name: 'other', servers: [WEATHER.id], expiresInDays: 30 })
  const instance = (store?: RateLimitStore) => {
    const dispatcher = createDispatcher({
      apps,
      subscriptions,
      tokens,
      // OAuth access tokens `oauth-<user>` and `oauth-<user>.<n>` (another token of the same user), accepted for that user.
      oauth: { validate: (token) => Promise.resolve(token.startsWith('oauth-') ? { active: true as const, info: { subject: token.slice(6).split('.')[0]! } } : { active: false as const, reason: 'unknown token' }) },
      authorizationServers: ['https://auth.example.com'],
      ...(options.now && { now: options.now }),
      rateLimit: {
        ...(store && { store }),
        policy: (_identity, app) => options.policy(app),
        ...(options.failOpen !== undefined && { failOpen: options.failOpen }),
      },
      ...(options.onError !== false && { onError: (error: unknown, context: string) => void errors.push({ error, context }) }),
    })
    return async (app: typeof WEATHER | typeof NEWS = WEATHER, token = both.token): Promise<Answer> => {
      const request: DispatchRequest = {
        ...dispatchRequest(app === NEWS ? '/v2' : '/v1', { authorization: `Bearer ${token}` }),
        host: `${app.slug}.example.com`,
        origin: `https://${app.slug}.example.com`,
      }
      const decision = await dispatcher.decide(request)
      return decision.type === 'dispatch'
        ? { status: 200, headers: { ...decision.headers }, body: undefined }
        : { status: decision.reply.status, headers: { ...decision.reply.headers }, body: JSON.parse(decision.reply.body!) as Answer['body'] }
    }
  }
  return { instance, errors, tokens: { both: both.token, weatherOnly: weatherOnly.token, otherUser: otherUser.token } }
}

const perMinute = (limit: number): RateLimitPolicy => Object.freeze({ limit, windowType: 'minute' })

describe('rate limit: the 429 and the RateLimit fields', () => {
  it('the 429 is the spec section 7 body, with Retry-After and the RateLimit t naming the same instant, and no version headers', async () => {
    const { instance } = await platform({ policy: () => perMinute(2), now: () => T })
    const decide = instance()
    const served = [await decide(), await decide()]
    expect(served.map((a) => [a.status, a.headers.ratelimit, a.headers['ratelimit-policy']])).toEqual([
      [200, '"minute";r=1;t=40', '"minute";q=2;w=60'],
      [200, '"minute";r=0;t=40', '"minute";q=2;w=60'],
    ])
    const refused = await decide()
    expect(refused.status).toBe(429)
    expect(refused.body).toEqual({
      jsonrpc: '2.0',
      id: null,
      error: { code: -32000, message: 'Rate limit exceeded', data: { limit: 2, resetAt: Date.UTC(2030, 0, 1, 0, 1) / 1000, retryAfter: 40, windowType: 'minute' } },
    })
    expect(refused.headers).toMatchObject({
      'content-type': 'application/json',
      'retry-after': '40',
      'ratelimit-policy': '"minute";q=2;w=60',
      ratelimit: '"minute";r=0;t=40',
    })
    expect(refused.headers['x-mcp-version']).toBeUndefined()
    expect(refused.headers['x-mcp-latest-version']).toBeUndefined()
  })

  it('limit 0 refuses the first request (r=0, t at least 1 in the window\'s last millisecond); MAX_RATE_LIMIT is written whole', async () => {
    const lastMs = Date.UTC(2030, 0, 1, 0, 0, 59, 999)
    const none = await platform({ policy: () => perMinute(0), now: () => lastMs })
    const refused = await none.instance()()
    expect(refused.status).toBe(429)
    expect(refused.headers).toMatchObject({ 'retry-after': '1', ratelimit: '"minute";r=0;t=1', 'ratelimit-policy': '"minute";q=0;w=60' })
    expect(refused.body?.error.data).toEqual({ limit: 0, resetAt: Date.UTC(2030, 0, 1, 0, 1) / 1000, retryAfter: 1, windowType: 'minute' })

    const most = await platform({ policy: () => perMinute(MAX_RATE_LIMIT), now: () => lastMs })
    const served = await most.instance()()
    expect(served.status).toBe(200)
    expect(served.headers['ratelimit-policy']).toBe('"minute";q=999999999999999;w=60')
    expect(served.headers.ratelimit).toBe('"minute";r=999999999999998;t=1')
  })

  it('a window ends at its last millisecond: the next one starts a whole budget, told as a whole window', async () => {
    let now = Date.UTC(2030, 0, 1, 0, 0, 0)
    const { instance } = await platform({ policy: () => perMinute(1), now: () => now })
    const decide = instance()
    expect((await decide()).headers.ratelimit).toBe('"minute";r=0;t=60')
    now += 59_999
    const refused = await decide()
    expect([refused.status, refused.headers['retry-after']]).toEqual([429, '1'])
    now += 1
    const served = await decide()
    expect([served.status, served.headers.ratelimit]).toEqual([200, '"minute";r=0;t=60'])
  })
})

describe('rate limit: options refused when made', () => {
  it('a memory counter store with a now that is no function (regression: it threw at every count, and every request was served without a limit)', async () => {
    for (const now of [Date.now(), 'Date.now', null]) {
      expect(() => createMemoryRateLimitStore({ now: now as never })).toThrow('mcp-dispatch: option "now" must be a function answering epoch ms')
    }
    expect(() => createMemoryRateLimitStore({ now: () => T, max: 10 })).not.toThrow()
    expect(() => createMemoryRateLimitStore({ max: 2.5 })).toThrow('mcp-dispatch: option "max" must be an integer from 1 to 16777216')
  })
})

describe('rate limit: whose budget a request spends', () => {
  it('one App\'s traffic never spends another App\'s budget, nor one user\'s another\'s; two tokens of one user share the user\'s', async () => {
    const { instance, tokens } = await platform({ policy: () => perMinute(1), now: () => T })
    const decide = instance()
    expect((await decide(WEATHER)).status).toBe(200)
    expect((await decide(WEATHER)).status).toBe(429)
    expect((await decide(NEWS)).status).toBe(200)
    expect((await decide(WEATHER, tokens.otherUser)).status).toBe(200)
    expect((await decide(WEATHER, tokens.weatherOnly)).status).toBe(429)
    expect((await decide(NEWS)).status).toBe(429)
  })

  it('the same for OAuth callers: their budget is per App and per user', async () => {
    const { instance } = await platform({ policy: () => perMinute(1), now: () => T })
    const decide = instance()
    expect((await decide(WEATHER, 'oauth-user_1')).status).toBe(200)
    expect((await decide(WEATHER, 'oauth-user_1')).status).toBe(429)
    // Another access token of the same user: the same budget.
    expect((await decide(WEATHER, 'oauth-user_1.2')).status).toBe(429)
    expect((await decide(NEWS, 'oauth-user_1')).status).toBe(200)
    expect((await decide(WEATHER, 'oauth-user_2')).status).toBe(200)
    expect((await decide(NEWS, 'oauth-user_1')).status).toBe(429)
  })
})

describe('rate limit: the default logger while the counter store fails (fail open)', () => {
  afterEach(() => {
    vi.restoreAllMocks()
  })

  /**
   * The default logger's lines (stderr, silenced), and a monotonic clock the test moves
   * (`clock.elapsed`, ms), which the dispatcher's throttle reads. It starts at a whole
   * millisecond, so `start + elapsed` is exact: from a fractional `performance.now()`,
   * 20,000 - 10,000 came out just under 10 s.
   */
  function stderrOnMonotonicClock() {
    const lines = vi.spyOn(console, 'error').mockImplementation(() => {})
    const clock = { elapsed: 0 }
    const start = Math.floor(performance.now())
    vi.spyOn(performance, 'now').mockImplementation(() => start + clock.elapsed)
    return { lines, clock }
  }

  /** A store that fails while `down.now` is true, else counts in memory. */
  function flakyStore() {
    const memory = createMemoryRateLimitStore()
    const down = { now: true }
    const store: RateLimitStore = {
      increment: (key, start, windowMs) => (down.now ? Promise.reject(new Error('ECONNREFUSED')) : memory.increment(key, start, windowMs)),
    }
    return { store, down }
  }

  it('writes one line for a stretch of failures, not one per request; how many went unlogged when the store counts again (regression: a line per request)', async () => {
    const { lines, clock } = stderrOnMonotonicClock()
    const { store, down } = flakyStore()
    // The window on a clock held mid-minute: on the wall clock one could begin between the counts.
    const { instance } = await platform({ policy: () => perMinute(100), now: midMinute(), onError: false })
    const decide = instance(store)
    const statuses = []
    for (let i = 0; i < 50; i++) statuses.push((await decide()).status)
    expect(statuses).toEqual(Array(50).fill(200))
    expect(lines.mock.calls).toEqual([['[mcp-dispatch] rate-limit store failed; serving (failOpen): Error: ECONNREFUSED']])
    down.now = false
    // Counting again within 10 s of the line: nothing yet (a line per 10 s at most).
    expect((await decide()).headers.ratelimit).toMatch(/^"minute";r=99;t=\d+$/)
    expect(lines).toHaveBeenCalledTimes(1)
    clock.elapsed = 10_000
    expect((await decide()).headers.ratelimit).toMatch(/^"minute";r=98;t=\d+$/)
    expect(lines.mock.calls.slice(1)).toEqual([
      ['[mcp-dispatch] rate-limit store recovered: Error: the rate-limit store counts again; 49 more requests were served without a count since the last line (cause: Error)'],
    ])
    // Counting on, nothing more is written; the next outage after a quiet 10 s is at its first failure.
    await decide()
    expect(lines).toHaveBeenCalledTimes(2)
    clock.elapsed = 20_000
    down.now = true
    expect((await decide()).status).toBe(200)
    expect(lines.mock.calls).toHaveLength(3)
    expect(lines.mock.calls[2]![0]).toBe('[mcp-dispatch] rate-limit store failed; serving (failOpen): Error: ECONNREFUSED')
  })

  it('a store failing every other request (a Cluster shard down, timeouts under load): still at most a line per 10 s (regression: a line per failure)', async () => {
    const { lines, clock } = stderrOnMonotonicClock()
    const { store, down } = flakyStore()
    const { instance } = await platform({ policy: () => perMinute(1_000), onError: false })
    const decide = instance(store)
    for (let i = 0; i < 100; i++) {
      down.now = i % 2 === 0
      expect((await decide()).status).toBe(200)
    }
    expect(lines).toHaveBeenCalledTimes(1)
    clock.elapsed = 10_000
    for (let i = 0; i < 4; i++) {
      down.now = i % 2 === 0
      await decide()
    }
    // The failure 10 s on names the 49 not written since; the success after it is within 10 s of it.
    expect(lines.mock.calls.map(([line]) => line as string)).toEqual([
      '[mcp-dispatch] rate-limit store failed; serving (failOpen): Error: ECONNREFUSED',
      '[mcp-dispatch] rate-limit store failed; serving (failOpen); 49 more served without a count since the last line: Error: ECONNREFUSED',
    ])
  })

  it('during a long outage, a line per 10 seconds names the requests served since the last', async () => {
    const { lines, clock } = stderrOnMonotonicClock()
    const { store } = flakyStore()
    const { instance } = await platform({ policy: () => perMinute(100), onError: false })
    const decide = instance(store)
    for (let i = 0; i < 5; i++) await decide()
    clock.elapsed = 9_999
    await decide()
    expect(lines).toHaveBeenCalledTimes(1)
    clock.elapsed = 10_000
    await decide()
    expect(lines.mock.calls.map(([line]) => line as string)).toEqual([
      '[mcp-dispatch] rate-limit store failed; serving (failOpen): Error: ECONNREFUSED',
      '[mcp-dispatch] rate-limit store failed; serving (failOpen); 5 more served without a count since the last line: Error: ECONNREFUSED',
    ])
  })

  it('an outage that starts and ends within 10 s of the last line: the line after it names the kind of its last failure (regression: only a count, its error never written)', async () => {
    const { lines, clock } = stderrOnMonotonicClock()
    class ReplyError extends Error {
      override name = 'ReplyError'
    }
    const memory = createMemoryRateLimitStore()
    let failure: Error | undefined = new Error('ECONNREFUSED')
    const store: RateLimitStore = {
      increment: (key, begin, windowMs) => (failure ? Promise.reject(failure) : memory.increment(key, begin, windowMs)),
    }
    const { instance } = await platform({ policy: () => perMinute(1_000), onError: false })
    const decide = instance(store)
    for (let i = 0; i < 3; i++) await decide()
    failure = undefined
    clock.elapsed = 10_000
    await decide()
    expect(lines).toHaveBeenCalledTimes(2)
    // Another outage, 5 s after the line that said the store counts again, over within 5 s.
    clock.elapsed = 15_000
    failure = new ReplyError('CLUSTERDOWN The cluster is down')
    for (let i = 0; i < 3; i++) await decide()
    failure = undefined
    clock.elapsed = 17_000
    await decide()
    expect(lines).toHaveBeenCalledTimes(2)
    clock.elapsed = 20_000
    await decide()
    expect(lines.mock.calls.slice(2).map(([line]) => line as string)).toEqual([
      '[mcp-dispatch] rate-limit store recovered: Error: the rate-limit store counts again; 3 more requests were served without a count since the last line (cause: ReplyError)',
    ])
  })

  it('an onError given hears every failure, each request its own report', async () => {
    const lines = vi.spyOn(console, 'error').mockImplementation(() => {})
    const { store } = flakyStore()
    const { instance, errors } = await platform({ policy: () => perMinute(100) })
    const decide = instance(store)
    for (let i = 0; i < 5; i++) expect((await decide()).status).toBe(200)
    expect(errors.map((e) => e.context)).toEqual(Array(5).fill('rate-limit store failed; serving (failOpen)'))
    expect(lines).not.toHaveBeenCalled()
  })

  it('failOpen: false is a 503 with Retry-After (never a 500), for each request', async () => {
    const { store } = flakyStore()
    const { instance, errors } = await platform({ policy: () => perMinute(100), failOpen: false })
    const decide = instance(store)
    for (let i = 0; i < 2; i++) {
      const refused = await decide()
      expect(refused.status).toBe(503)
      expect(refused.headers['retry-after']).toBe('1')
      expect(refused.body?.error).toEqual({ code: -32005, message: 'Service unavailable', data: { error: 'temporarily_unavailable', retryAfter: 1 } })
    }
    expect(errors.map((e) => e.context)).toEqual(['rate-limit failed', 'rate-limit failed'])
  })
})

describeRedis('rate limit on Redis, end to end', (redis) => {
  afterEach(() => {
    vi.restoreAllMocks()
  })

  it('two dispatchers bursting at once on one Redis serve the limit and no more, each remaining count told once', async () => {
    const prefix = redis.prefix()
    // Held mid-minute: on the wall clock a minute turning during the burst would serve more than 25.
    const { instance } = await platform({ policy: () => perMinute(25), now: midMinute() })
    const a = instance(createRedisRateLimitStore({ client: redis.connect(), prefix }))
    const b = instance(createRedisRateLimitStore({ client: redis.connect(), prefix }))
    const answers = await Promise.all(Array.from({ length: 80 }, (_, i) => (i % 2 === 0 ? a : b)()))
    const served = answers.filter((answer) => answer.status === 200)
    expect(served).toHaveLength(25)
    expect(answers.filter((answer) => answer.status === 429)).toHaveLength(55)
    const remaining = served.map((answer) => Number(/;r=(\d+);/.exec(answer.headers.ratelimit!)![1])).sort((x, y) => x - y)
    expect(remaining).toEqual(Array.from({ length: 25 }, (_, i) => i))
  })

  it('an instance whose clock is behind, across a window\'s start, counts in the shared window and is told its end', async () => {
    const prefix = redis.prefix()
    const at = Date.UTC(2030, 0, 1, 0, 1, 0, 300)
    const ahead = await platform({ policy: () => perMinute(3), now: () => at })
    const behind = await platform({ policy: () => perMinute(3), now: () => at - 2_500 })
    const a = ahead.instance(createRedisRateLimitStore({ client: redis.connect(), prefix }))
    const b = behind.instance(createRedisRateLimitStore({ client: redis.connect(), prefix }))
    // Same App and user id on both platforms: one counter.
    const answers = [await a(), await b(), await a(), await b()]
    expect(answers.map((answer) => [answer.status, answer.headers.ratelimit])).toEqual([
      [200, '"minute";r=2;t=60'],
      [200, '"minute";r=1;t=60'],
      [200, '"minute";r=0;t=60'],
      [429, '"minute";r=0;t=60'],
    ])
    // Told by its own clock: at most one window from its now (the counter, started by the
    // other instance's first request, counts older windows for one window of Redis's time), not a window that
    // ended 2.5 s ago by its clock (t=1) nor the other clock's end plus the skew.
    expect(answers[3]!.headers['retry-after']).toBe('60')
    expect(answers[3]!.body?.error.data).toMatchObject({ limit: 3, retryAfter: 60, resetAt: Math.ceil((at - 2_500 + 60_000) / 1000) })
  })

  it('keys are per App, user and window, expire within one window and a minute, and hold no token', async () => {
    const prefix = redis.prefix()
    // Held mid-minute: on the wall clock a minute turning between the first two would serve the second.
    const { instance, tokens } = await platform({ policy: (app) => (app.id === NEWS.id ? { limit: 5, windowType: 'hour' } : perMinute(1)), now: midMinute() })
    const decide = instance(createRedisRateLimitStore({ client: redis.client, prefix }))
    expect((await decide(WEATHER)).status).toBe(200)
    expect((await decide(WEATHER)).status).toBe(429)
    expect((await decide(NEWS)).status).toBe(200)
    expect((await decide(WEATHER, tokens.otherUser)).status).toBe(200)
    const keys = (await redis.keys()).filter((key) => key.startsWith(prefix))
    expect(keys).toEqual([`${prefix}rl:app_news\0user_1\0hour`, `${prefix}rl:app_weather\0user_1\0minute`, `${prefix}rl:app_weather\0user_2\0minute`])
    const ttls = await Promise.all(keys.map((key) => redis.client.pttl(key)))
    expect(ttls[0]).toBeGreaterThan(3_560_000)
    expect(ttls[0]).toBeLessThanOrEqual(3_660_000)
    for (const ttl of ttls.slice(1)) expect(ttl > 60_000 && ttl <= 120_000).toBe(true)
    for (const key of keys) {
      const stored = JSON.stringify([key, await redis.client.hgetall(key)])
      for (const token of Object.values(tokens)) {
        expect(stored).not.toContain(token)
        expect(stored).not.toContain(token.slice(12))
      }
    }
  })

  it('a Redis that is down: served at once after one deadline, one stderr line from the default logger (regression: one per request)', async () => {
    const lines = vi.spyOn(console, 'error').mockImplementation(() => {})
    const client = await redis.connectUnreachable()
    const { instance } = await platform({ policy: () => perMinute(3), onError: false })
    const decide = instance(createRedisRateLimitStore({ client, prefix: redis.prefix(), timeoutMs: 150 }))
    const began = performance.now()
    const statuses = []
    for (let i = 0; i < 20; i++) statuses.push((await decide()).status)
    expect(statuses).toEqual(Array(20).fill(200))
    // One deadline (the stall breaker), not twenty.
    expect(performance.now() - began).toBeLessThan(150 * 5)
    expect(lines).toHaveBeenCalledTimes(1)
    expect(String(lines.mock.calls[0]![0])).toMatch(/^\[mcp-dispatch\] rate-limit store failed; serving \(failOpen\): Error: Redis script rate-limit increment did not answer within 150 ms/)
  })
})
