import { describe, expect, it, vi } from 'vitest'
import type { SessionPin } from '../../src/core/stores.js'
import { ConfigurationError, DeployRefusedError } from '../../src/errors.js'
import {
  createMemoryAppStore,
  createMemoryCacheStore,
  createMemoryInvalidationBus,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
} from '../../src/stores/memory/index.js'
import {
  createTestClock,
  describeAppStoreConformance,
  describeCacheStoreConformance,
  describeInvalidationBusConformance,
  describeRateLimitStoreConformance,
  describeSessionStoreConformance,
  describeSubscriptionStoreConformance,
  describeTokenStoreConformance,
} from './conformance.js'

describeTokenStoreConformance('memory', () => createMemoryTokenStore())
describeSessionStoreConformance('memory', ({ now }) => createMemorySessionStore({ now }))
describeRateLimitStoreConformance('memory', ({ now }) => createMemoryRateLimitStore({ now }))
describeCacheStoreConformance('memory', ({ now }) => createMemoryCacheStore({ now }))
describeAppStoreConformance('memory', ({ apps }) => createMemoryAppStore(apps))
describeSubscriptionStoreConformance('memory', ({ subscriptions }) => createMemorySubscriptionStore(subscriptions))
describeInvalidationBusConformance('memory', () => createMemoryInvalidationBus())

describe('memory stores: what only they do', () => {
  it('a now that is no function is refused when the store is made, naming now (regression: the session and cache stores took Date.now(), then threw at every use: every pin lost, every OAuth token asked about again)', () => {
    const makers = [
      (now: unknown) => createMemorySessionStore({ now: now as never }),
      (now: unknown) => createMemoryCacheStore({ now: now as never }),
      (now: unknown) => createMemoryRateLimitStore({ now: now as never }),
    ]
    for (const make of makers) {
      for (const now of [Date.now(), 'Date.now', null]) expect(() => make(now)).toThrow(new ConfigurationError('now', 'must be a function answering epoch ms'))
      expect(() => make(() => 1_000)).not.toThrow()
      expect(() => make(undefined)).not.toThrow()
    }
  })

  it('seeded App versions go through the versions rule', () => {
    const apps = createMemoryAppStore([
      { id: 'a1', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.0.1', '1.1.0', '2.0.0-rc.1'] },
    ])
    expect(apps.getLiveVersions('a1')).toEqual(['1.0.1', '1.1.0', '2.0.0-rc.1'])
    expect(() =>
      createMemoryAppStore([{ id: 'a1', slug: 'weather', name: 'Weather', versions: ['1.0.1', '1.0.0'] }]),
    ).toThrow(/1\.0\.1/)
  })

  it('addApp with a version the rule refuses adds nothing: the App can be added again (regression: added with part of its versions, then a duplicate)', () => {
    const apps = createMemoryAppStore()
    expect(() => apps.addApp({ id: 'a1', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.0.1', '1.0.0'] })).toThrow(DeployRefusedError)
    expect([apps.getApp('a1'), apps.getAppBySlug('weather'), apps.getLiveVersions('a1')]).toEqual([undefined, undefined, []])
    apps.addApp({ id: 'a1', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.0.1'] })
    expect(apps.getLiveVersions('a1')).toEqual(['1.0.1'])
  })

  it('addApp refuses a duplicate id or slug', () => {
    const apps = createMemoryAppStore([{ id: 'a1', slug: 'weather', name: 'Weather' }])
    expect(() => apps.addApp({ id: 'a1', slug: 'other', name: 'Other' })).toThrow(TypeError)
    expect(() => apps.addApp({ id: 'a2', slug: 'weather', name: 'Other' })).toThrow(TypeError)
    apps.addApp({ id: 'a2', slug: 'notes', name: 'Notes' })
    expect(apps.getAppBySlug('notes')).toEqual({ id: 'a2', slug: 'notes', name: 'Notes' })
  })

  it('addApp refuses, naming what is wrong, an App the dispatcher could never serve: a slug no Host leads to (upper case, an underscore: every request a 404, nothing said), no id, no name (regression: accepted)', () => {
    const apps = createMemoryAppStore()
    for (const slug of ['Notes_App', 'Weather', 'notes_app', '-notes', 'notes-', '', 'a'.repeat(64), 'wea.ther']) {
      expect(() => apps.addApp({ id: 'a1', slug, name: 'N' }), slug).toThrow(/slug must be a DNS label in lower case/)
    }
    expect(() => apps.addApp({ id: '', slug: 'notes', name: 'N' })).toThrow(/id must be a non-empty string/)
    expect(() => apps.addApp({ id: 'a1', slug: 'notes', name: null as never })).toThrow(/name must be a string/)
    expect(() => apps.addApp({ id: 'a1', slug: 'notes', name: 'N', versions: '1.0.0' as never })).toThrow(/versions must be an array/)
    expect(() => createMemoryAppStore(null as never)).toThrow('createMemoryAppStore takes an iterable of Apps (an array), got null')
    // Any iterable seeds it, as before.
    expect(createMemoryAppStore(new Set([{ id: 'a9', slug: 'set', name: 'S' }])).getAppBySlug('set')).toMatchObject({ id: 'a9' })
    // Nothing refused was added; a slug of 63 characters with inner hyphens is one.
    apps.addApp({ id: 'a1', slug: `n-${'a'.repeat(61)}`, name: 'N' })
    expect(apps.getAppBySlug(`n-${'a'.repeat(61)}`)).toMatchObject({ id: 'a1' })
  })

  it('setActive refuses what is no subscription: active not a boolean (a JavaScript "false" was taken for active), an empty user or App (regression: accepted)', () => {
    const subscriptions = createMemorySubscriptionStore()
    expect(() => subscriptions.setActive('u1', 'a1', 'false' as never)).toThrow(/active must be a boolean/)
    expect(() => subscriptions.setActive('', 'a1', true)).toThrow(/non-empty string/)
    expect(() => createMemorySubscriptionStore([{ userId: 'u1', appId: 'a1', active: 'false' as never }])).toThrow(/active must be a boolean/)
    expect(() => createMemorySubscriptionStore([null as never])).toThrow(/must be an object/)
    expect(() => createMemorySubscriptionStore({} as never)).toThrow('createMemorySubscriptionStore takes an iterable of subscriptions (an array), got object')
    expect(subscriptions.isActive('u1', 'a1')).toBe(false)
  })

  it('setActive turns a subscription on and off', () => {
    const subscriptions = createMemorySubscriptionStore()
    subscriptions.setActive('u1', 'a1', true)
    expect(subscriptions.isActive('u1', 'a1')).toBe(true)
    subscriptions.setActive('u1', 'a1', false)
    expect(subscriptions.isActive('u1', 'a1')).toBe(false)
    subscriptions.setActive('u2', 'a1', false)
    expect(subscriptions.isActive('u2', 'a1')).toBe(false)
  })

  it('the session store is bounded by max (least recently used go first)', () => {
    const sessions = createMemorySessionStore({ max: 2, now: createTestClock().now })
    const pin: SessionPin = { appId: 'a', version: '1.0.0', subject: 'u' }
    sessions.set('s1', pin, 60_000)
    sessions.set('s2', pin, 60_000)
    sessions.get('s1', 60_000)
    sessions.set('s3', pin, 60_000)
    expect(sessions.get('s2', 60_000)).toBeUndefined()
    expect(sessions.get('s1', 60_000)).toEqual(pin)
    expect(sessions.get('s3', 60_000)).toEqual(pin)
  })

  it('the session store holds at most maxPerSubject pins per user: a new one ends one of that user’s, never another user’s', () => {
    const clock = createTestClock()
    const sessions = createMemorySessionStore({ max: 4, maxPerSubject: 3, now: clock.now })
    const of = (subject: string): SessionPin => ({ appId: 'a', version: '1.0.0', subject })
    sessions.set('bob-1', of('bob'), 60_000)
    for (let i = 1; i <= 12; i++) {
      sessions.set(`alice-${i}`, of('alice'), 60_000)
      sessions.get(`alice-${i}`, 60_000) // used: the LRU order alone would now drop bob's pin
    }
    expect(sessions.get('bob-1', 60_000)).toEqual(of('bob'))
    expect(['alice-9', 'alice-10', 'alice-11', 'alice-12'].map((id) => sessions.get(id, 60_000) !== undefined)).toEqual([false, true, true, true])
    // A deleted pin and an expired one free their slots.
    sessions.delete('alice-10')
    sessions.set('alice-13', of('alice'), 1_000)
    expect(sessions.get('alice-11', 60_000)).toEqual(of('alice'))
    clock.advance(1_001)
    sessions.set('alice-13', of('alice'), 60_000) // the expired pin's id, taken again
    sessions.set('alice-14', of('alice'), 60_000)
    // alice-11 was used after alice-12: alice-12 was the least recently used.
    expect(['alice-11', 'alice-12', 'alice-13', 'alice-14'].map((id) => sessions.get(id, 60_000) !== undefined)).toEqual([true, false, true, true])
    expect(() => createMemorySessionStore({ maxPerSubject: 0 })).toThrow(/maxPerSubject/)
  })

  it('past maxPerSubject, a user’s expired pins go before its live ones, then its least recently used', () => {
    const clock = createTestClock()
    const sessions = createMemorySessionStore({ maxPerSubject: 3, now: clock.now })
    const pin: SessionPin = { appId: 'a', version: '1.0.0', subject: 'alice' }
    sessions.set('live', pin, 60_000)
    sessions.set('short-1', pin, 1_000)
    sessions.set('short-2', pin, 1_000)
    clock.advance(2_000)
    expect(sessions.get('live', 60_000)).toEqual(pin)
    sessions.set('new-1', pin, 60_000)
    sessions.set('new-2', pin, 60_000)
    expect(sessions.get('live', 60_000)).toEqual(pin) // used last: new-1 is now the least recent
    sessions.set('new-3', pin, 60_000)
    expect(['live', 'new-1', 'new-2', 'new-3'].map((id) => sessions.get(id, 60_000) !== undefined)).toEqual([true, false, true, true])
  })

  it('past maxPerSubject, a user’s expired pin goes before a live one it was used after', () => {
    const clock = createTestClock()
    const sessions = createMemorySessionStore({ maxPerSubject: 2, now: clock.now })
    const pin: SessionPin = { appId: 'a', version: '1.0.0', subject: 'alice' }
    sessions.set('live', pin, 60_000)
    sessions.set('short', pin, 1_000) // used after 'live': 'live' is the least recently used
    clock.advance(2_000)
    sessions.set('new', pin, 60_000)
    expect(['live', 'short', 'new'].map((id) => sessions.get(id, 60_000) !== undefined)).toEqual([true, false, true])
  })

  it('without a clock given, a rate-limit counter lives one window of the monotonic clock (as the Redis store judges its age, by its PTTL): no step of the wall clock ends it or stretches it', async () => {
    const W = 60_000
    const wall = vi.spyOn(Date, 'now')
    let monotonic = performance.now()
    const life = vi.spyOn(performance, 'now').mockImplementation(() => monotonic)
    try {
      const counters = createMemoryRateLimitStore()
      // Started while the wall clock ran an hour fast, stamped with that hour's window.
      wall.mockReturnValue(1_700_000_000_000 + 3_600_000)
      expect(counters.increment('k', 1_700_003_600_000, W)).toBe(1)
      // Corrected: requests stamped with older windows count against it (it was reset).
      wall.mockReturnValue(1_700_000_000_000)
      expect(counters.increment('k', 1_700_000_000_000, W)).toEqual({ count: 2, windowStart: 1_700_003_600_000 })
      // A window of the monotonic clock later, it has ended: the older window starts at 1.
      monotonic += W
      expect(counters.increment('k', 1_700_000_000_000, W)).toBe(1)
    } finally {
      wall.mockRestore()
      life.mockRestore()
    }
  })

  it('with a clock given, a rate-limit counter its clock has since stepped back by less than a window still counts; by exactly a window or more, it starts again', () => {
    const W = 60_000
    const clock = createTestClock(W + 10)
    const counters = createMemoryRateLimitStore({ now: clock.now })
    for (const key of ['a', 'b', 'c']) expect(counters.increment(key, W, W)).toBe(1)
    // One millisecond short of a window back: still the counter of [W, 2W).
    clock.set(11)
    expect(counters.increment('a', 0, W)).toEqual({ count: 2, windowStart: W })
    // Exactly a window back: the step is as long as the counter's life, it starts again.
    clock.set(10)
    expect(counters.increment('b', 0, W)).toBe(1)
    // Further back.
    clock.set(9)
    expect(counters.increment('c', 0, W)).toBe(1)
  })

  it('the rate-limit store is bounded by max', () => {
    const counters = createMemoryRateLimitStore({ max: 2, now: () => 10 })
    counters.increment('a', 0, 60_000)
    counters.increment('b', 0, 60_000)
    counters.increment('c', 0, 60_000)
    // 'a' was evicted: it starts again (fails open for the evicted key, bounded memory).
    expect(counters.increment('a', 0, 60_000)).toBe(1)
  })

  it('the rate-limit store evicts the least recently used counter, not a busy one (regression: a busy caller was reset)', () => {
    const counters = createMemoryRateLimitStore({ max: 2, now: () => 10 })
    counters.increment('a', 0, 60_000)
    counters.increment('b', 0, 60_000)
    counters.increment('a', 0, 60_000)
    expect(counters.increment('a', 0, 60_000)).toBe(3)
    counters.increment('c', 0, 60_000) // full: 'b', used least recently, goes
    expect(counters.increment('a', 0, 60_000)).toBe(4)
    expect(counters.increment('b', 0, 60_000)).toBe(1)
  })

  it('the rate-limit store sweeps ended windows by its clock, not by the window of the request that needs room (regression: a live day counter was reset)', () => {
    const clock = createTestClock(Date.UTC(2026, 10, 22, 12))
    const counters = createMemoryRateLimitStore({ max: 4, now: clock.now })
    const day = 86_400_000
    const midnight = Date.UTC(2026, 10, 22)
    for (let i = 0; i < 1000; i++) counters.increment('heavy', midnight, day)
    // Three per-second counters whose windows have ended.
    for (const key of ['s1', 's2', 's3']) counters.increment(key, clock.now() - 5_000, 1_000)
    // Full: a new day counter makes room. The ended ones go, the busy caller keeps its count.
    expect(counters.increment('new', midnight, day)).toBe(1)
    expect(counters.increment('heavy', midnight, day)).toBe(1001)
  })

  it('the rate-limit store sweeps a window that ends at this very millisecond (its end is not in it)', () => {
    const clock = createTestClock(1_000_000)
    const counters = createMemoryRateLimitStore({ max: 2, now: clock.now })
    counters.increment('busy', clock.now(), 60_000)
    counters.increment('ended', clock.now() - 1_000, 1_000) // [now - 1 s, now): ended now
    // Full: the ended counter goes, not the least recently used one.
    counters.increment('new', clock.now(), 60_000)
    expect(counters.increment('busy', clock.now(), 60_000)).toBe(2)
  })

  it('the rate-limit store sweeps a counter started again in a new window only once that window has ended: a busy caller keeps its count', () => {
    const W = 60_000
    const clock = createTestClock(10)
    const counters = createMemoryRateLimitStore({ max: 2, now: clock.now })
    counters.increment('busy', 0, W)
    clock.set(W + 10)
    expect(counters.increment('busy', W, W)).toBe(1) // started again: [W, 2W)
    counters.increment('other', W, W)
    expect(counters.increment('busy', W, W)).toBe(2) // used last: 'other' is the least recently used
    counters.increment('new', W, W) // full: nothing has ended, 'other' goes
    expect(counters.increment('busy', W, W)).toBe(3)
  })

  it('the rate-limit store makes room for a batch of new counters at once, least recently used first', () => {
    const now = () => 10
    const counters = createMemoryRateLimitStore({ max: 200, now }) // room is made for 2 at a time
    for (let i = 0; i < 200; i++) counters.increment(`k${i}`, 0, 60_000)
    for (let i = 2; i < 200; i++) counters.increment(`k${i}`, 0, 60_000) // k0 and k1 are the least recently used
    counters.increment('new', 0, 60_000) // full: k0 and k1 go together (one sweep for both)
    expect(counters.increment('k2', 0, 60_000)).toBe(3)
    expect(counters.increment('k199', 0, 60_000)).toBe(3)
    expect(counters.increment('new', 0, 60_000)).toBe(2)
    expect(counters.increment('k1', 0, 60_000)).toBe(1) // gone, and back without evicting anyone
    expect(counters.increment('k3', 0, 60_000)).toBe(3)
  })

  it('the cache store is bounded by max (least recently used go first)', () => {
    const cache = createMemoryCacheStore<{ v: number }>({ max: 2, now: createTestClock().now })
    cache.set('a', { v: 1 }, 60_000)
    cache.set('b', { v: 2 }, 60_000)
    cache.get('a')
    cache.set('c', { v: 3 }, 60_000)
    expect([cache.get('a'), cache.get('b'), cache.get('c')]).toEqual([{ v: 1 }, undefined, { v: 3 }])
  })

  it('the invalidation bus leaves no rejection of an async listener unhandled (which ends a Node process)', async () => {
    const unhandled: unknown[] = []
    const record = (reason: unknown) => void unhandled.push(reason)
    process.on('unhandledRejection', record)
    try {
      const bus = createMemoryInvalidationBus()
      const heard: string[] = []
      bus.subscribe(async () => {
        throw new Error('listener failed')
      })
      bus.subscribe((message) => void heard.push(message.kind))
      bus.publish({ kind: 'token', tokenHash: 'h' })
      await new Promise((resolve) => setImmediate(resolve))
      await new Promise((resolve) => setImmediate(resolve))
      expect(heard).toEqual(['token'])
      expect(unhandled).toEqual([])
    } finally {
      process.off('unhandledRejection', record)
    }
  })

  it('regression: a clock that starts at 0 still expires sessions and cache entries (lru-cache start time 0)', () => {
    const clock = createTestClock(0)
    const sessions = createMemorySessionStore({ now: clock.now })
    const cache = createMemoryCacheStore<{ v: number }>({ now: clock.now })
    sessions.set('s', { appId: 'a', version: '1.0.0', subject: 'u' }, 1_000)
    cache.set('k', { v: 1 }, 1_000)
    clock.advance(1_001)
    expect(sessions.get('s', 1_000)).toBeUndefined()
    expect(cache.get('k')).toBeUndefined()
  })

  it('TTL stores answer synchronously (no extra microtask on the hot path)', () => {
    const sessions = createMemorySessionStore()
    expect(sessions.get('x', 1000)).toBeUndefined()
    expect(createMemoryRateLimitStore().increment('k', 0, 60_000)).toBe(1)
    expect(createMemoryTokenStore().findByHash('h')).toBeUndefined()
  })
})
