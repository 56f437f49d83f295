/**
 * Step 5 against what a platform's own rate-limit store or policy may hand it: a count that
 * is not a count, a policy object changed while the counter answers, a limit past what the
 * `RateLimit` header fields can carry, a clock that steps back. Each is a served request
 * (fail open, logged) or a 503, never a 429 for everyone or a header out of the policy.
 */
import {
  type RateLimitPolicy,
  type RateLimitStore,
  createDispatcher,
  createMemoryAppStore,
  createMemoryRateLimitStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'
import { midMinute } from '../helpers/clock.js'
import { dispatchRequest } from '../helpers/dispatch-request.js'

const APP = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.2.3'] }

async function setup(options: {
  store?: RateLimitStore
  policy: () => RateLimitPolicy | Promise<RateLimitPolicy>
  failOpen?: boolean
  now?: () => number
  /** Called at each subscription lookup of the pipeline. */
  onSubscriptionLookup?: () => void
}) {
  const errors: Array<{ error: unknown; context: string }> = []
  const apps = createMemoryAppStore([APP])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: APP.id, active: true }])
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  const { token } = await tokens.create({ userId: 'user_1', name: 't', servers: [APP.id], expiresInDays: 30 })
  const looked = options.onSubscriptionLookup
  const dispatcher = createDispatcher({
    apps,
    subscriptions: looked ? { isActive: (userId, appId) => (looked(), subscriptions.isActive(userId, appId)) } : subscriptions,
    tokens,
    ...(options.now && { now: options.now }),
    rateLimit: {
      ...(options.store && { store: options.store }),
      policy: options.policy,
      ...(options.failOpen !== undefined && { failOpen: options.failOpen }),
    },
    onError: (error, context) => errors.push({ error, context }),
  })
  const decide = async () => {
    const decision = await dispatcher.decide(dispatchRequest('/v1', { authorization: `Bearer ${token}` }))
    return decision.type === 'dispatch'
      ? { status: 200, headers: decision.headers as Record<string, string | undefined>, body: undefined }
      : { status: decision.reply.status, headers: decision.reply.headers as Record<string, string | undefined>, body: decision.reply.body }
  }
  return { decide, errors, dispatcher, token }
}

const MINUTE = Object.freeze({ limit: 5, windowType: 'minute' as const })
const MINUTE_3 = Object.freeze({ limit: 3, windowType: 'minute' as const })

describe('rate limit: what the store answers', () => {
  const broken: Array<[string, unknown]> = [
    ['NaN', Number.NaN],
    ['undefined', undefined],
    ['null', null],
    ['0', 0],
    ['-3', -3],
    ['1.5', 1.5],
    // A decimal string or a bigint is a count (a driver's); other text and numbers are not.
    ['a string that is no decimal count', '2.0'],
    ['a string with a sign', '+2'],
    ['an empty string', ''],
    ['a bigint 0', 0n],
    ['Infinity', Number.POSITIVE_INFINITY],
  ]

  it.each(broken)('a count of %s is a failed store: served (fail open) and reported, not a 429 or a header out of the policy', async (_name, answer) => {
    for (const asPromise of [false, true]) {
      const store: RateLimitStore = { increment: () => (asPromise ? Promise.resolve(answer as number) : (answer as number)) }
      const { decide, errors } = await setup({ store, policy: () => MINUTE })
      const result = await decide()
      expect(result.status).toBe(200)
      expect(result.headers.ratelimit).toBeUndefined()
      expect(result.headers['x-mcp-version']).toBe('1.2.3')
      expect(errors).toHaveLength(1)
      expect(errors[0]!.context).toBe('rate-limit store failed; serving (failOpen)')
      expect(String(errors[0]!.error)).toMatch(/rate-limit store answered .*not a count >= 1/)
    }
  })

  it('with failOpen: false a broken count is a 503, like a store that threw or rejected, with no RateLimit fields (nothing was counted)', async () => {
    for (const increment of [() => Number.NaN, () => Promise.reject(new Error('counter down'))]) {
      const { decide, errors } = await setup({ store: { increment }, policy: () => MINUTE, failOpen: false })
      const result = await decide()
      expect(result.status).toBe(503)
      expect(result.headers['retry-after']).toMatch(/^\d+$/)
      expect(result.headers.ratelimit).toBeUndefined()
      expect(errors.map((e) => e.context)).toEqual(['rate-limit failed'])
    }
  })
})

describe('rate limit: the policy', () => {
  it('an unfrozen policy changed in place while the counter answers: the decision and the headers keep what was checked', async () => {
    const plan = { limit: 2, windowType: 'minute' as RateLimitPolicy['windowType'] }
    let release!: () => void
    const counts = new Map<string, number>()
    const store: RateLimitStore = {
      increment: (key) =>
        new Promise((resolve) => {
          release = () => {
            const count = (counts.get(key) ?? 0) + 1
            counts.set(key, count)
            resolve(count)
          }
        }),
    }
    const { decide, errors } = await setup({ store, policy: () => plan })
    for (const [changed, expected] of [
      [Number.POSITIVE_INFINITY, { status: 200, ratelimit: '"minute";r=1;t=' }],
      [-1, { status: 200, ratelimit: '"minute";r=0;t=' }],
      [10, { status: 429, ratelimit: '"minute";r=0;t=' }],
    ] as const) {
      const pending = decide()
      await new Promise((r) => setImmediate(r))
      plan.limit = changed // the platform edits its plan object while the count is in flight
      release()
      const result = await pending
      expect(result.status).toBe(expected.status)
      expect(result.headers.ratelimit).toMatch(new RegExp(`^${expected.ratelimit}\\d+$`))
      expect(result.headers['ratelimit-policy']).toBe('"minute";q=2;w=60')
      if (result.status === 429) expect(JSON.parse(result.body!).error.data.limit).toBe(2)
      plan.limit = 2
    }
    expect(errors).toEqual([])
  })

  it('a frozen policy with a getter is read once per request, and checked', async () => {
    let reads = 0
    const policy = Object.freeze(
      Object.defineProperty({ windowType: 'minute' }, 'limit', { get: () => (++reads > 1 ? Number.NaN : 3), enumerable: true }),
    ) as RateLimitPolicy
    const { decide, errors } = await setup({ policy: () => policy })
    const first = await decide()
    expect(first.status).toBe(200)
    expect(first.headers['ratelimit-policy']).toBe('"minute";q=3;w=60')
    // Not remembered as checked: the next request reads NaN, and that policy is refused (503).
    const second = await decide()
    expect(second.status).toBe(503)
    expect(errors.map((e) => e.context)).toEqual(['rate-limit policy failed'])
  })

  it("a caller whose policy changes window (a plan changed) is counted on that window's counter: one per window, each kept", async () => {
    const keys: string[] = []
    const counters = createMemoryRateLimitStore()
    const store: RateLimitStore = { increment: (key, start, windowMs) => (keys.push(key), counters.increment(key, start, windowMs)) }
    const plans = [MINUTE, MINUTE, Object.freeze({ limit: 50, windowType: 'hour' as const }), MINUTE]
    let asked = 0
    const { decide, errors } = await setup({ store, policy: () => plans[asked++]!, now: midMinute() })
    const remaining = []
    for (let i = 0; i < plans.length; i++) remaining.push((await decide()).headers.ratelimit?.split(';')[1])
    // The hour's count starts at 1; the minute's goes on at 3.
    expect(remaining).toEqual(['r=4', 'r=3', 'r=49', 'r=2'])
    expect(new Set(keys).size).toBe(2)
    expect(keys[0]).toBe(keys[3])
    expect(keys[2]).not.toBe(keys[0])
    expect(errors).toEqual([])
  })

  it('a limit past 15 digits cannot be written as a structured-field integer: refused as a broken policy (503)', async () => {
    const { decide, errors } = await setup({ policy: () => ({ limit: 1e15, windowType: 'minute' }) })
    expect((await decide()).status).toBe(503)
    expect(String(errors[0]!.error)).toMatch(/integer limit from 0 to 999999999999999/)
    const { decide: atMost } = await setup({ policy: () => ({ limit: 999_999_999_999_999, windowType: 'minute' }) })
    expect((await atMost()).headers['ratelimit-policy']).toBe('"minute";q=999999999999999;w=60')
  })
})

describe('rate limit: answers that are no policy, and options that cannot work', () => {
  it('undefined and null mean no limit; false, 0, NaN, \'\' or a number are a failed policy (503, reported, saying what came), never a silent "no limit"', async () => {
    for (const none of [undefined, null]) {
      const { decide, errors } = await setup({ policy: () => none as never })
      const served = await decide()
      expect(served.status).toBe(200)
      expect(served.headers.ratelimit).toBeUndefined()
      expect(errors).toEqual([])
    }
    for (const bad of [false, 0, Number.NaN, '', 5, 'x']) {
      const { decide, errors } = await setup({ policy: () => bad as never })
      expect((await decide()).status, String(bad)).toBe(503)
      expect(errors.map((e) => e.context)).toEqual(['rate-limit policy failed'])
      // Numbers as they came, anything else by its type.
      const said = typeof bad === 'number' ? String(bad) : typeof bad
      expect(String(errors[0]!.error)).toContain(`rateLimit.policy result must be an object { limit, windowType }, or undefined or null for no limit; got ${said}`)
    }
  })

  it('a clock that answers no time fails the count as a store does: served without the headers under failOpen, 503 without; reported either way', async () => {
    for (const clock of [Number.NaN, undefined, Number.POSITIVE_INFINITY]) {
      const open = await setup({ policy: () => MINUTE, now: () => clock as never })
      for (let i = 0; i < 7; i++) {
        const served = await open.decide()
        expect(served.status).toBe(200)
        expect(served.headers.ratelimit).toBeUndefined()
      }
      expect(open.errors).toHaveLength(7)
      expect(String(open.errors[0]!.error)).toMatch(/now\(\) answered .*not epoch ms/)
      const closed = await setup({ policy: () => MINUTE, now: () => clock as never, failOpen: false })
      expect((await closed.decide()).status).toBe(503)
    }
  })

  it('refuses when created a store without increment, a failOpen that is no boolean, a now that is no function', () => {
    const apps = createMemoryAppStore([APP])
    const subscriptions = createMemorySubscriptionStore([])
    const base = { apps, subscriptions, tokens: createTokenService({ store: createMemoryTokenStore(), apps, subscriptions }) }
    const policy = () => MINUTE
    expect(() => createDispatcher({ ...base, rateLimit: { policy, store: {} as never } })).toThrow(/rateLimit\.store.*increment/)
    expect(() => createDispatcher({ ...base, rateLimit: { policy, store: null as never } })).toThrow(/rateLimit\.store/)
    expect(() => createDispatcher({ ...base, rateLimit: { policy, failOpen: 'false' as never } })).toThrow(/rateLimit\.failOpen.*true or false/)
    expect(() => createDispatcher({ ...base, now: 5 as never })).toThrow(/"now" must be a function/)
    expect(() => createDispatcher({ ...base, rateLimit: { policy, store: createMemoryRateLimitStore(), failOpen: false } })).not.toThrow()
  })

  it('refuses when created a rateLimit whose policy is no function (not a 503 on every request)', () => {
    const apps = createMemoryAppStore([APP])
    const subscriptions = createMemorySubscriptionStore([])
    const base = { apps, subscriptions, tokens: createTokenService({ store: createMemoryTokenStore(), apps, subscriptions }) }
    for (const policy of [undefined, MINUTE, 'minute']) {
      expect(() => createDispatcher({ ...base, rateLimit: { policy } as never }), String(policy)).toThrow(/rateLimit\.policy.*must be a function/)
    }
  })
})

describe('rate limit: the default store and the clock', () => {
  it('a clock that ran an hour fast and was corrected does not lock the caller out for the hour', async () => {
    let at = Date.UTC(2026, 10, 22, 12, 0, 30)
    const { decide } = await setup({ policy: () => MINUTE, now: () => at })
    at += 3_600_000
    for (let i = 0; i < 5; i++) expect((await decide()).status).toBe(200)
    expect((await decide()).status).toBe(429)
    at -= 3_600_000 // corrected
    const after = await decide()
    expect(after.status).toBe(200)
    expect(after.headers.ratelimit).toBe('"minute";r=4;t=30')
  })
})

describe('rate limit: instances whose clocks disagree, sharing one store', () => {
  /** Two dispatchers on one counter store; `b` runs `skewMs` behind `a`. */
  async function instances(policy: RateLimitPolicy, skewMs: number, at: () => number) {
    const apps = createMemoryAppStore([APP])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: APP.id, active: true }])
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
    const { token } = await tokens.create({ userId: 'user_1', name: 't', servers: [APP.id], expiresInDays: 30 })
    const store = createMemoryRateLimitStore({ now: at })
    const make = (now: () => number) =>
      createDispatcher({ apps, subscriptions, tokens, now, rateLimit: { store, policy: () => policy } })
    const request = dispatchRequest('/v1', { authorization: `Bearer ${token}` })
    const decideOn = (dispatcher: ReturnType<typeof make>) => async () => {
      const decision = await dispatcher.decide(request)
      return decision.type === 'dispatch'
        ? { status: 200, headers: decision.headers as Record<string, string | undefined> }
        : { status: decision.reply.status, headers: decision.reply.headers as Record<string, string | undefined>, body: JSON.parse(decision.reply.body!) }
    }
    return { a: decideOn(make(at)), b: decideOn(make(() => at() - skewMs)) }
  }

  it('the instance behind is told when the shared window really ends, not a second after its own window ended', async () => {
    const now = Date.UTC(2030, 0, 1, 0, 1, 0) + 300
    const { a, b } = await instances(MINUTE_3, 1_000, () => now)
    for (let i = 0; i < 3; i++) expect((await a()).status).toBe(200)
    const refusedA = await a()
    const refusedB = await b()
    expect(refusedB.status).toBe(429)
    // b learns the shared window's end, not its own window's (a second after it began, by its
    // clock): about a minute, as a, never more than one window.
    const waitA = Number(refusedA.headers['retry-after'])
    const waitB = Number(refusedB.headers['retry-after'])
    expect(waitA).toBe(60)
    expect(waitB).toBeGreaterThanOrEqual(waitA)
    expect(waitB).toBeLessThanOrEqual(60)
    expect(refusedB.body.error.data.retryAfter).toBe(waitB)
    expect(refusedB.headers.ratelimit).toBe(`"minute";r=0;t=${waitB}`)
    expect(Math.abs(refusedB.body.error.data.resetAt - refusedA.body.error.data.resetAt)).toBeLessThanOrEqual(1)
  })

  it('an instance an hour fast: the others are told to wait at most one window, not the hour', async () => {
    const now = Date.UTC(2030, 0, 1, 0, 1, 0) + 300
    const { a, b } = await instances(MINUTE_3, -3_600_000, () => now) // b is an hour ahead
    for (let i = 0; i < 3; i++) expect((await b()).status).toBe(200)
    const refused = await a()
    expect(refused.status).toBe(429)
    expect(Number(refused.headers['retry-after'])).toBeLessThanOrEqual(60)
    expect(refused.body.error.data.resetAt).toBeLessThanOrEqual(Math.ceil((now + 60_000) / 1000))
  })

  it('instances skewed by more than a window share one budget instead of resetting each other’s counter', async () => {
    const now = Date.UTC(2030, 0, 1, 0, 1, 0) + 300
    const { a, b } = await instances({ limit: 5, windowType: 'second' }, 2_500, () => now)
    const statuses = []
    for (let i = 0; i < 20; i++) statuses.push((await (i % 2 === 0 ? a : b)()).status)
    expect(statuses.filter((s) => s === 200)).toHaveLength(5)
  })
})

describe('HEAD on an MCP path', () => {
  it('is answered after authentication (405), spending no rate-limit unit and asking no subscription', async () => {
    let increments = 0
    let asked = 0
    const store: RateLimitStore = { increment: () => ++increments }
    const { dispatcher, token, decide } = await setup({ store, policy: () => MINUTE, onSubscriptionLookup: () => asked++ })
    const head = (headers: Record<string, string>) => dispatcher.decide({ ...dispatchRequest('/v1', headers), method: 'HEAD' })
    const bare = await head({})
    expect(bare.type === 'reply' && bare.reply.status).toBe(401)
    expect(bare.type === 'reply' && bare.reply.headers['www-authenticate']).toBe('Bearer resource_metadata="https://weather.example.com/.well-known/oauth-protected-resource"')
    const past = await head({ authorization: `Bearer ${token}` })
    expect(past.type === 'reply' && past.reply.status).toBe(405)
    expect(past.type === 'reply' && past.reply.headers.allow).toBe('GET, POST, DELETE, OPTIONS')
    expect({ increments, asked }).toEqual({ increments: 0, asked: 0 })
    // The same token on POST: the subscription is asked and the request counted.
    expect((await decide()).status).toBe(200)
    expect({ increments, asked }).toEqual({ increments: 1, asked: 1 })
  })
})

describe('rate limit: refusals after the count', () => {
  it('a 404 of step 6 (no such version, no such session) spends a unit and says so in its RateLimit fields, as the successes do (regression: none, so the client\'s last r was wrong)', async () => {
    const { dispatcher, token } = await setup({ policy: () => MINUTE, now: midMinute() })
    const answer = async (path: string, headers: Record<string, string> = {}) => {
      const decision = await dispatcher.decide(dispatchRequest(path, { authorization: `Bearer ${token}`, ...headers }))
      return decision.type === 'dispatch' ? { status: 200, headers: decision.headers } : { status: decision.reply.status, headers: decision.reply.headers }
    }
    const served = await answer('/v1')
    expect(served.headers.ratelimit).toMatch(/^"minute";r=4;t=\d+$/)
    for (const [path, headers, r] of [
      ['/v9', {}, 3],
      ['/v1.2.4', {}, 2],
      ['/v1', { 'mcp-session-id': 'nobody' }, 1],
      ['/v1', { 'mcp-session-id': 'not visible\u0001' }, 0],
    ] as const) {
      const refused = await answer(path, headers)
      expect(refused.status, path).toBe(404)
      expect(refused.headers['ratelimit-policy'], path).toBe('"minute";q=5;w=60')
      expect(refused.headers.ratelimit, path).toMatch(new RegExp(`^"minute";r=${r};t=\\d+$`))
    }
    expect((await answer('/v1')).status).toBe(429)
  })
})

describe('rate limit: failures after the count', () => {
  it('a 503 of a store step 6 needs, and the 503 that replaces the answer of a session whose pin could not be stored, carry the RateLimit fields of the unit they spent', async () => {
    const apps = createMemoryAppStore([APP])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: APP.id, active: true }])
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
    const { token } = await tokens.create({ userId: 'user_1', name: 't', servers: [APP.id], expiresInDays: 30 })
    let liveFails = false
    const dispatcher = createDispatcher({
      apps: { ...apps, getAppBySlug: (slug) => apps.getAppBySlug(slug), getLiveVersions: (id) => (liveFails ? Promise.reject(new Error('apps down')) : apps.getLiveVersions(id)) },
      subscriptions,
      tokens,
      sessions: { get: () => Promise.resolve(undefined), set: () => Promise.reject(new Error('pins down')), delete: () => Promise.resolve() },
      now: midMinute(),
      rateLimit: { policy: () => MINUTE },
      onError: () => {},
    })
    const decide = () => dispatcher.decide(dispatchRequest('/v1', { authorization: `Bearer ${token}` }))
    const opened = await decide()
    if (opened.type !== 'dispatch') throw new Error('not dispatched')
    const replaced = await opened.complete({ status: 200, sessionId: 's1' })
    expect(replaced).toMatchObject({ status: 503, headers: { 'retry-after': '1', 'ratelimit-policy': '"minute";q=5;w=60' } })
    expect((replaced as { headers: Record<string, string> }).headers.ratelimit).toMatch(/^"minute";r=4;t=\d+$/)
    liveFails = true
    const failed = await decide()
    if (failed.type !== 'reply') throw new Error('dispatched')
    expect(failed.reply.status).toBe(503)
    expect(failed.reply.headers.ratelimit).toMatch(/^"minute";r=3;t=\d+$/)

    // Every step synchronous (the memory stores) and the live versions throwing: the same.
    const throwing = createDispatcher({
      apps: { ...apps, getLiveVersions: () => { throw new Error('apps down') } },
      subscriptions,
      tokens,
      now: midMinute(),
      rateLimit: { policy: () => MINUTE },
      onError: () => {},
    })
    const synchronous = throwing.decide(dispatchRequest('/v1', { authorization: `Bearer ${token}` }))
    expect(synchronous).not.toBeInstanceOf(Promise)
    if ((synchronous as Awaited<typeof synchronous>).type !== 'reply') throw new Error('dispatched')
    const reply = (synchronous as Extract<Awaited<typeof synchronous>, { type: 'reply' }>).reply
    expect(reply.status).toBe(503)
    expect(reply.headers.ratelimit).toMatch(/^"minute";r=4;t=\d+$/)
  })
})
