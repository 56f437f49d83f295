/**
 * The decision's two speeds: on stores that answer synchronously it is returned at once
 * (no promise); a store that answers with a promise turns it into a promise of the same
 * decision. Failures, synchronous or not, are a 503 naming the store, never a throw.
 */
import {
  type ApiTokenRecord,
  type AppStore,
  type DispatchRequest,
  type RateLimitStore,
  type SessionStore,
  type SubscriptionStore,
  type TokenStore,
  createDispatcher,
  createMemoryAppStore,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  logError,
} from 'mcp-dispatch'
import { describe, expect, it, onTestFinished, vi } from 'vitest'
import { midMinute } from '../helpers/clock.js'
import { dispatchRequest } from '../helpers/dispatch-request.js'

const APP = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.2.3', '2.0.0'] }
const POLICY = Object.freeze({ limit: 100, windowType: 'minute' as const })

async function setup(
  wrap: {
    apps?: (s: AppStore) => AppStore
    subscriptions?: (s: SubscriptionStore) => SubscriptionStore
    tokens?: (s: TokenStore) => TokenStore
    rateLimit?: (s: RateLimitStore) => RateLimitStore
    sessions?: (s: SessionStore) => SessionStore
  } = {},
) {
  const errors: Array<{ error: unknown; context: string }> = []
  const rawApps = createMemoryAppStore([APP])
  const rawSubscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: APP.id, active: true }])
  const rawTokens = createMemoryTokenStore()
  const tokens = createTokenService({ store: wrap.tokens?.(rawTokens) ?? rawTokens, apps: rawApps, subscriptions: rawSubscriptions })
  const { token } = await tokens.create({ userId: 'user_1', name: 't', servers: [APP.id], expiresInDays: 30 })
  const dispatcher = createDispatcher({
    apps: wrap.apps?.(rawApps) ?? rawApps,
    subscriptions: wrap.subscriptions?.(rawSubscriptions) ?? rawSubscriptions,
    tokens,
    sessions: wrap.sessions?.(createMemorySessionStore()) ?? createMemorySessionStore(),
    // The tests read r across requests: on the wall clock a minute could turn between two.
    now: midMinute(),
    rateLimit: { store: wrap.rateLimit?.(createMemoryRateLimitStore()) ?? createMemoryRateLimitStore(), policy: () => POLICY },
    onError: (error, context) => errors.push({ error, context }),
  })
  return { dispatcher, token, errors, tokens, rawTokens }
}

function request(token: string | undefined, path = '/v1'): DispatchRequest {
  return dispatchRequest(path, token ? { authorization: `Bearer ${token}` } : {})
}

describe('decide on synchronous stores', () => {
  it('returns the dispatch decision itself, not a promise, with the version and rate-limit headers', async () => {
    const { dispatcher, token } = await setup()
    const decision = dispatcher.decide(request(token))
    expect(decision).not.toBeInstanceOf(Promise)
    if (decision instanceof Promise || decision.type !== 'dispatch') throw new Error('expected a dispatch decision')
    expect(decision.context.version).toBe('1.2.3')
    expect(decision.context.latestVersion).toBe('2.0.0')
    expect(decision.context.identity).toMatchObject({ subject: 'user_1', method: 'api_token' })
    expect(decision.headers).toEqual({
      'x-mcp-version': '1.2.3',
      'x-mcp-latest-version': '2.0.0',
      'ratelimit-policy': '"minute";q=100;w=60',
      ratelimit: expect.stringMatching(/^"minute";r=99;t=\d+$/),
    })
    expect(decision.synchronousPins).toBe(true)
    // complete() is a method of the decision and answers synchronously on a memory store.
    expect(decision.complete({ status: 200, sessionId: 'session-1' })).toBeUndefined()
  })

  it('counts every request of a token against one budget, request after request', async () => {
    const { dispatcher, token } = await setup()
    const remaining: string[] = []
    for (let i = 0; i < 3; i++) {
      const decision = dispatcher.decide(request(token))
      if (decision instanceof Promise || decision.type !== 'dispatch') throw new Error('expected a dispatch decision')
      remaining.push(decision.headers.ratelimit!.split(';')[1]!)
    }
    expect(remaining).toEqual(['r=99', 'r=98', 'r=97'])
  })

  it('answers refusals at once too: 401 without a token, 404 for an unknown version line', async () => {
    const { dispatcher, token } = await setup()
    const missing = dispatcher.decide(request(undefined))
    expect(missing).not.toBeInstanceOf(Promise)
    expect(missing).toMatchObject({ type: 'reply', reply: { status: 401 } })
    const unknown = dispatcher.decide(request(token, '/v7'))
    expect(unknown).toMatchObject({ type: 'reply', reply: { status: 404 } })
  })
})

describe('an App store answering a live set with a version that is none', () => {
  it('is a 503 reported with the App and getLiveVersions named, so the row to mend is found', async () => {
    const { dispatcher, token, errors } = await setup({ apps: (s) => ({ ...s, getLiveVersions: () => ['1.0.0', 'v1.2.0'] }) })
    expect(dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 503 } })
    expect(errors).toHaveLength(1)
    expect((errors[0]!.error as Error).message).toBe('mcp-dispatch: the App store\'s getLiveVersions("app_weather") answered not a semantic version: "v1.2.0"')
    const none = await setup({ apps: (s) => ({ ...s, getLiveVersions: () => null as never }) })
    expect(none.dispatcher.decide(request(none.token))).toMatchObject({ type: 'reply', reply: { status: 503 } })
    expect(none.errors[0]!.error).toMatchObject({ name: 'TypeError', message: 'mcp-dispatch: the App store\'s getLiveVersions("app_weather") answered null, not an array of versions' })
  })
})

describe('decide on asynchronous stores', () => {
  it('returns a promise of the same decision when a store answers with a promise', async () => {
    const { dispatcher, token } = await setup({
      subscriptions: (s) => ({ ...s, isActive: async (userId, appId) => s.isActive(userId, appId) }),
    })
    const pending = dispatcher.decide(request(token))
    expect(pending).toBeInstanceOf(Promise)
    const decision = await pending
    expect(decision).toMatchObject({ type: 'dispatch', context: { version: '1.2.3' } })
  })

  it('a promise of another realm, or any thenable, is waited for, never taken for the answer (regression: a 402 was skipped)', async () => {
    const { runInNewContext } = await import('node:vm')
    const ForeignPromise = runInNewContext('Promise') as PromiseConstructor
    const answers: Array<(active: boolean) => unknown> = [
      (active) => ForeignPromise.resolve(active),
      (active) => ({ then: (resolve: (v: boolean) => void) => resolve(active) }),
    ]
    for (const answer of answers) {
      for (const active of [false, true]) {
        const { dispatcher, token } = await setup({ subscriptions: (s) => ({ ...s, isActive: () => answer(active) as never }) })
        const decision = await dispatcher.decide(request(token))
        expect(decision).toMatchObject(active ? { type: 'dispatch' } : { type: 'reply', reply: { status: 402 } })
      }
    }
    // A rejecting thenable is a store failure (503), not an answer.
    const rejecting = { then: (_: unknown, reject: (e: Error) => void) => reject(new Error('db down')) }
    const { dispatcher, token } = await setup({ subscriptions: (s) => ({ ...s, isActive: () => rejecting as never }) })
    expect(await dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 503 } })
  })

  it('a session store answering writes with a lazy thenable (it runs when asked for its result) has them run: the pin is stored, and ended (regression: never run, every later request 404)', async () => {
    const lazy = <T>(run: () => T | PromiseLike<T>): PromiseLike<T> => ({ then: (resolve, reject) => Promise.resolve().then(run).then(resolve, reject) })
    const ran: string[] = []
    const { dispatcher, token } = await setup({
      sessions: (s) => ({
        ...s,
        // Its writes answer later: it no longer says it answers synchronously.
        synchronous: false,
        set: (...args) => lazy(() => (ran.push('set'), s.set(...args))) as never,
        delete: (id) => lazy(() => (ran.push('delete'), s.delete(id))) as never,
      }),
    })
    const opened = await dispatcher.decide(request(token))
    if (opened.type !== 'dispatch') throw new Error('expected a dispatch decision')
    await opened.complete({ status: 200, sessionId: 'session-lazy' })
    const inSession = (method: string) => ({ ...dispatchRequest('/v1', { authorization: `Bearer ${token}`, 'mcp-session-id': 'session-lazy' }), method })
    const next = await dispatcher.decide(inSession('POST'))
    expect(next).toMatchObject({ type: 'dispatch', context: { sessionId: 'session-lazy', version: '1.2.3' } })
    const ended = await dispatcher.decide(inSession('DELETE'))
    if (ended.type !== 'dispatch') throw new Error('expected a dispatch decision')
    await ended.complete({ status: 200, sessionId: undefined })
    expect(ran).toEqual(['set', 'delete'])
    expect(await dispatcher.decide(inSession('POST'))).toMatchObject({ type: 'reply', reply: { status: 404 } })
  })

  it('a rate-limit counter answered by a thenable is awaited: the headers carry its count', async () => {
    const { dispatcher, token } = await setup({
      rateLimit: (s) => ({ increment: (...args) => ({ then: (resolve: (n: number) => void) => resolve(s.increment(...args) as number) }) as never }),
    })
    const first = await dispatcher.decide(request(token))
    const second = await dispatcher.decide(request(token))
    expect(first).toMatchObject({ type: 'dispatch', headers: { ratelimit: expect.stringContaining('r=99;') } })
    expect(second).toMatchObject({ type: 'dispatch', headers: { ratelimit: expect.stringContaining('r=98;') } })
  })

  it('a subscription store answering anything but true refuses (402); an answer that is no boolean is reported, named by its type', async () => {
    for (const [odd, named] of [[1, '1'], ['true', 'string'], [{}, 'object'], [null, 'null'], [undefined, 'undefined']] as const) {
      const { dispatcher, token, errors } = await setup({ subscriptions: (s) => ({ ...s, isActive: () => odd as never }) })
      expect(await dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 402 } })
      expect(errors.map((e) => [e.context, (e.error as Error).message])).toEqual([
        ['subscriptions answer', `mcp-dispatch: the subscription store's isActive answered ${named}, not a boolean: refused (402)`],
      ])
    }
    const { dispatcher, token, errors } = await setup({ subscriptions: (s) => ({ ...s, isActive: () => false }) })
    expect(await dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 402 } })
    expect(errors).toEqual([])
  })

  it('a live record of a type ApiTokenRecord does not allow is a 503 naming the token and the field, never an access the stored token does not grant', async () => {
    const expiry = 'is no finite number of epoch milliseconds (read a bigint column with Number())'
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ expiresAt: Number.NaN }, `expiresAt (NaN) ${expiry}`],
      [{ expiresAt: '2001-01-01T00:00:00Z' }, `expiresAt (string) ${expiry}`],
      [{ expiresAt: '1800000000000' }, `expiresAt (string) ${expiry}`],
      [{ expiresAt: undefined }, `expiresAt (undefined) ${expiry}`],
      [{ servers: '["app_weather_pro"]' }, 'servers (string) is no array of App ids'],
      [{ allowedIps: undefined }, 'allowedIps (undefined) is neither null (no allowlist) nor an array (give null for a missing one)'],
      [{ allowedIps: '203.0.113.7' }, 'allowedIps (string) is neither null (no allowlist) nor an array (give null for a missing one)'],
      // An owner mapped under another name: every such token would be one user's (regression:
      // one user's token used another's session, unreported).
      [{ userId: undefined }, 'userId (undefined) is no non-empty string (the owner: every token without one would be one user\'s, sharing sessions and counters)'],
      [{ userId: 42 }, 'userId (42) is no non-empty string (the owner: every token without one would be one user\'s, sharing sessions and counters)'],
      // A bytea column read as a Buffer matched no hash, and a revokedAt left out read as
      // revoked: 401s telling clients to drop their tokens, unreported.
      [{ tokenHash: Buffer.from('00', 'hex') }, 'tokenHash (object) is no string (read a bytea column as hex text)'],
      [{ revokedAt: undefined }, 'revokedAt (undefined) is neither null (live) nor the time of the revocation'],
    ]
    for (const [odd, wrong] of cases) {
      const { dispatcher, token, errors, tokens } = await setup({
        tokens: (s) => ({ ...s, findByHash: (hash) => {
          const found = s.findByHash(hash) as ApiTokenRecord | undefined
          return found && ({ ...found, ...odd } as ApiTokenRecord)
        } }),
      })
      const { id } = (await tokens.list('user_1'))[0]!
      expect(await dispatcher.decide(request(token)), JSON.stringify(odd)).toMatchObject({ type: 'reply', reply: { status: 503 } })
      expect(errors.map((e) => e.context)).toEqual(['token failed'])
      expect(((errors[0]!.error as Error).cause as Error).message).toBe(`mcp-dispatch: the token store answered a record for token ${id} whose ${wrong}`)
      expect(String((errors[0]!.error as Error).cause)).not.toContain('app_weather_pro')
    }
    // An entry of servers that is no string (a SQL array's NULL) grants nothing: the App is out of scope.
    const holed = await setup({
      tokens: (s) => ({ ...s, findByHash: (hash) => {
        const found = s.findByHash(hash) as ApiTokenRecord | undefined
        return found && ({ ...found, servers: [null, 1] } as unknown as ApiTokenRecord)
      } }),
    })
    expect(await holed.dispatcher.decide(request(holed.token))).toMatchObject({ type: 'reply', reply: { status: 403 } })
    expect(holed.errors).toEqual([])
    // Expired as stored (a Date a store left unmapped compares as its time): refused, not a failure.
    const { dispatcher, token, errors } = await setup({
      tokens: (s) => ({ ...s, findByHash: (hash) => {
        const found = s.findByHash(hash) as ApiTokenRecord | undefined
        return found && ({ ...found, expiresAt: new Date(0) } as unknown as ApiTokenRecord)
      } }),
    })
    expect(await dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 401 } })
    expect(errors).toEqual([])
  })

  it('a rate-limit answer that cannot be read is the store\'s failure: served (failOpen) and reported as such', async () => {
    const { dispatcher, token, errors } = await setup({
      rateLimit: (s) => ({ ...s, increment: () => ({ get count(): number { throw new Error('unreadable') }, windowStart: 0 }) }),
    })
    expect(await dispatcher.decide(request(token))).toMatchObject({ type: 'dispatch' })
    expect(errors.map((e) => [e.context, (e.error as Error).message])).toEqual([['rate-limit store failed; serving (failOpen)', 'unreadable']])
  })

  it('a store that throws a value whose prototype cannot be read (a revoked Proxy) is a 503, reported; the default logger writes it too', async () => {
    const revoked = Proxy.revocable({}, {})
    revoked.revoke()
    const { dispatcher, token, errors } = await setup({ subscriptions: (s) => ({ ...s, isActive: () => { throw revoked.proxy } }) })
    expect(await dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 503 } })
    expect(errors.map((e) => e.context)).toEqual(['subscriptions failed'])
    const written = vi.spyOn(console, 'error').mockImplementation(() => {})
    onTestFinished(() => void written.mockRestore())
    logError(revoked.proxy, 'subscriptions failed')
    expect(written.mock.calls).toEqual([['[mcp-dispatch] subscriptions failed: a thrown object that cannot be read']])
  })

  it('an App store that changes its live array in place is compiled again when the length changed (a version pushed, or spliced out)', async () => {
    const live = ['1.0.0', '1.2.3']
    const { dispatcher, token } = await setup({ apps: (s) => ({ ...s, getLiveVersions: () => live }) })
    expect(dispatcher.decide(request(token, '/'))).toMatchObject({ type: 'dispatch', context: { version: '1.2.3' } })
    live.push('2.0.0')
    expect(dispatcher.decide(request(token, '/'))).toMatchObject({ type: 'dispatch', context: { version: '2.0.0' } })
    live.splice(live.indexOf('2.0.0'), 1)
    expect(dispatcher.decide(request(token, '/v2'))).toMatchObject({ type: 'reply', reply: { status: 404 } })
  })

  it('an App record without a string id is a 503 reported as apps failed, never an App every scope misses (403) or served', async () => {
    for (const [id, named] of [[undefined, 'undefined'], [7, '7'], ['', 'empty']] as const) {
      const { dispatcher, token, errors } = await setup({ apps: (s) => ({ ...s, getAppBySlug: (slug) => ({ ...s.getAppBySlug(slug), id }) as never }) })
      expect(dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 503 } })
      expect(errors.map((e) => [e.context, (e.error as Error).message])).toEqual([
        ['apps failed', `mcp-dispatch: the App store answered an App record whose id is ${named}, not a non-empty string`],
      ])
    }
  })

  it('an App store answering an array with a hole is a 503 naming the store', async () => {
    // eslint-disable-next-line no-sparse-arrays
    const { dispatcher, token, errors } = await setup({ apps: (s) => ({ ...s, getLiveVersions: () => ['1.0.0', , '1.2.3'] as string[] }) })
    expect(dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 503 } })
    expect((errors[0]!.error as Error).message).toBe('mcp-dispatch: the App store\'s getLiveVersions("app_weather") answered an array that holds something other than version strings (such as a hole)')
  })

  it('turns a rejecting store into a 503 that names it, never a rejection', async () => {
    const { dispatcher, token, errors } = await setup({
      apps: (s) => ({ ...s, getLiveVersions: () => Promise.reject(new Error('db down')) }),
    })
    const decision = await dispatcher.decide(request(token))
    expect(decision).toMatchObject({ type: 'reply', reply: { status: 503 } })
    expect(errors.map((e) => e.context)).toEqual(['apps failed'])
  })

  const boom = () => {
    throw new Error('boom')
  }
  it.each([
    {
      where: 'apps, in a synchronous stretch that follows an asynchronous step',
      wrap: { apps: (s: AppStore): AppStore => ({ ...s, getAppBySlug: async (slug) => s.getAppBySlug(slug), getLiveVersions: boom }) },
      context: 'apps failed',
    },
    {
      where: 'subscriptions, in a wholly synchronous decision',
      wrap: { subscriptions: (s: SubscriptionStore): SubscriptionStore => ({ ...s, isActive: boom }) },
      context: 'subscriptions failed',
    },
  ])('names the store that threw synchronously: $where', async ({ wrap, context }) => {
    const { dispatcher, token, errors } = await setup(wrap)
    const decision = await dispatcher.decide(request(token))
    expect(decision).toMatchObject({ type: 'reply', reply: { status: 503 } })
    expect(errors.map((e) => e.context)).toEqual([context])
  })
})

describe('token checksum', () => {
  it('refuses a token with a wrong checksum without asking the store, and a known token is still checked by the store', async () => {
    let lookups = 0
    const { dispatcher, token, tokens } = await setup({
      tokens: (s) => ({
        ...s,
        findByHash: (hash) => {
          lookups++
          return s.findByHash(hash)
        },
      }),
    })
    const last = token.at(-1)!
    const corrupted = token.slice(0, -1) + (last === 'A' ? 'B' : 'A')
    expect(dispatcher.decide(request(corrupted))).toMatchObject({ type: 'reply', reply: { status: 401 } })
    expect(lookups).toBe(0)
    expect(dispatcher.decide(request(token))).toMatchObject({ type: 'dispatch' })
    expect(lookups).toBe(1)
    // Revoked: the store answers, the known-good hash does not let it through.
    const [listed] = await tokens.list('user_1')
    await tokens.revoke('user_1', listed!.id)
    expect(dispatcher.decide(request(token))).toMatchObject({ type: 'reply', reply: { status: 401 } })
    expect(lookups).toBe(2)
  })
})
