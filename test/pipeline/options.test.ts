/**
 * Options a platform can get wrong are refused when the object is created, with a
 * ConfigurationError naming the option, rather than accepted and misbehaving on every request
 * (an API that answers nothing, an unbounded store, every Origin refused).
 */
import {
  ConfigurationError,
  createDispatcher,
  createMemoryAppStore,
  createMemoryCacheStore,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenApi,
  createTokenService,
} from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'

/** The option a ConfigurationError names, or `undefined` when `create` succeeds. */
function refusedOption(create: () => unknown): string | undefined {
  try {
    create()
    return undefined
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigurationError)
    return (error as ConfigurationError).option
  }
}

const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
const subscriptions = createMemorySubscriptionStore([])
const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })

describe('options checked at creation', () => {
  it('the memory stores take a positive integer max (0 would be unbounded to lru-cache)', () => {
    for (const create of [createMemorySessionStore, createMemoryRateLimitStore, createMemoryCacheStore]) {
      for (const max of [0, -1, Number.NaN, 1.5, Number.POSITIVE_INFINITY]) expect(refusedOption(() => create({ max }))).toBe('max')
      expect(refusedOption(() => create({ max: 1 }))).toBeUndefined()
      expect(refusedOption(() => create())).toBeUndefined()
    }
  })

  it("the token API's basePath is a path starting with /", () => {
    const api = (basePath: unknown) => () =>
      createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: false, basePath: basePath as string })
    expect(refusedOption(api('api/tokens'))).toBe('basePath')
    expect(refusedOption(api(''))).toBe('basePath')
    expect(refusedOption(api(42))).toBe('basePath')
    expect(refusedOption(api('/dashboard/api/tokens/'))).toBeUndefined()
    expect(refusedOption(api('/'))).toBeUndefined()
  })

  it("the dispatcher's allowedOrigins is an array of origins, never a string taken as a set of characters", () => {
    const dispatcher = (allowedOrigins: unknown) => () =>
      createDispatcher({ apps, subscriptions, tokens, allowedOrigins: allowedOrigins as string[] })
    expect(refusedOption(dispatcher('https://app.example'))).toBe('allowedOrigins')
    expect(refusedOption(dispatcher([42]))).toBe('allowedOrigins')
    expect(refusedOption(dispatcher(['https://app.example']))).toBeUndefined()
  })
})
