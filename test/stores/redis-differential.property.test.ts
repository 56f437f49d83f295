/**
 * Differential model check of the stores that have an in-memory and a Redis implementation
 * (rate-limit counters, session pins, the TTL cache): the same random sequence of operations
 * runs against a reference model written from the interface doc comments (src/core/stores.ts)
 * and docs/stores.md, the memory store and the Redis store, and every answer is compared.
 *
 * Redis judges time by its own clock, so the sequences run well inside every TTL and window
 * (windows of 10 s and more, TTLs of a minute): what expiry does is the conformance suite's
 * (its clock cases run on the memory stores); here the memory stores run on a clock that stands
 * still, and the sequences probe what does not depend on time: counters across windows,
 * older-window requests, keys and ids at the edges, `set` of a live id, deletes, TTLs of 0 or less.
 */
import fc from 'fast-check'
import {
  type CacheStore,
  type RateLimitCount,
  type RateLimitStore,
  type SessionPin,
  type SessionStore,
  createMemoryCacheStore,
  createMemoryRateLimitStore,
  createMemorySessionStore,
} from 'mcp-dispatch'
import { createRedisCacheStore, createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
import { describe, expect, it } from 'vitest'
import { describeRedis } from '../helpers/redis.js'

const T0 = 1_700_000_040_000
const RUNS = Number(process.env.STORE_DIFF_RUNS ?? 50)

type Outcome = { ok: unknown } | { error: string }

async function outcome(call: () => unknown): Promise<Outcome> {
  try {
    return { ok: await call() }
  } catch (error) {
    return { error: (error as Error).name }
  }
}

// --- Rate-limit counters ------------------------------------------------------------------

/** Keys at the edges: empty, NUL, lone surrogates (which have no UTF-8), unicode, long. */
const RL_KEYS = ['', 'app\0user\0minute', '\0', '\uD800', '\uDC00', 'ü名🎉', 'k'.repeat(2_000)]
/** Each key's window (a key of the dispatcher names its window type, so one window per key). */
const RL_WINDOWS = [10_000, 60_000, 3_600_000, 86_400_000, 60_000, 10_000, 60_000]

type RlOp = { key: number; window: number }
const rlOp: fc.Arbitrary<RlOp> = fc.record({ key: fc.integer({ min: 0, max: RL_KEYS.length - 1 }), window: fc.integer({ min: -3, max: 3 }) })

/**
 * The contract of `RateLimitStore.increment`, every counter young (less than one window of the
 * store's time since its window started): the counter's own window counts on; an older window
 * counts against the counter's, answered `{ count, windowStart }`; a newer one starts it again
 * at 1. `keepsAside`: the store keeps the window a counter last replaced, and counts a request
 * of that window there, answered as a plain count (the Redis store; docs/stores.md).
 */
function rateLimitModel(keepsAside: boolean): RateLimitStore {
  const counters = new Map<string, { w: number; c: number; aside?: { w: number; c: number } }>()
  return {
    increment(key, windowStart) {
      const entry = counters.get(key)
      if (entry?.w === windowStart) return ++entry.c
      if (keepsAside && entry?.aside?.w === windowStart) return ++entry.aside.c
      if (entry && entry.w > windowStart) return { count: ++entry.c, windowStart: entry.w }
      counters.set(key, { w: windowStart, c: 1, ...(entry && { aside: { w: entry.w, c: entry.c } }) })
      return 1
    },
  }
}

const plainCount = (answer: number | RateLimitCount) => (typeof answer === 'number' ? answer : { ...answer })

// --- Session pins ---------------------------------------------------------------------------

const SESSION_IDS = ['s1', 's2', '', 'ü名🎉', 'id with spaces and "quotes"', 'x'.repeat(1_000), 'a\0b']
const PINS: readonly SessionPin[] = [
  { appId: 'app_1', version: '1.2.3', subject: 'user_1' },
  { appId: 'app_2', version: '2.0.0-rc.1+build.5', subject: 'user_2' },
  { appId: '', version: '', subject: '' },
  { appId: 'ü名🎉', version: '1.0.0', subject: 'Ünï 用户 🙂' },
  { appId: 'app_1', version: '1.2.3', subject: '\uD800 lone' },
]
const TTLS = [60_000, 120_000, 3_600_000, 86_400_000]

type SessionOp =
  | { op: 'set'; id: number; pin: number; ttl: number }
  | { op: 'get'; id: number; ttl: number }
  | { op: 'delete'; id: number }
const sessionId = fc.integer({ min: 0, max: SESSION_IDS.length - 1 })
const ttl = fc.constantFrom(...TTLS)
const sessionOp: fc.Arbitrary<SessionOp> = fc.oneof(
  fc.record({ op: fc.constant('set' as const), id: sessionId, pin: fc.integer({ min: 0, max: PINS.length - 1 }), ttl }),
  fc.record({ op: fc.constant('get' as const), id: sessionId, ttl }),
  fc.record({ op: fc.constant('delete' as const), id: sessionId }),
)

/** `SessionStore` as its doc comments give it, no time passing: set only a new id, get, delete. */
function sessionModel(): SessionStore {
  const pins = new Map<string, SessionPin>()
  return {
    get: (id) => pins.get(id),
    set(id, pin) {
      if (pins.has(id)) return false
      pins.set(id, { ...pin })
      return true
    },
    delete(id) {
      pins.delete(id)
    },
  }
}

async function applySession(store: SessionStore, o: SessionOp): Promise<Outcome> {
  const id = SESSION_IDS[o.id]!
  return outcome(() => {
    if (o.op === 'set') return store.set(id, { ...PINS[o.pin]! }, o.ttl)
    if (o.op === 'get') return Promise.resolve(store.get(id, o.ttl)).then((pin) => pin && { ...pin })
    return store.delete(id)
  })
}

// --- Cache ----------------------------------------------------------------------------------

const CACHE_KEYS = ['k1', 'k2', '', 'ü名🎉', 'x'.repeat(1_000)]
type CacheOp = { op: 'set'; key: number; value: object; ttl: number } | { op: 'get'; key: number } | { op: 'delete'; key: number }
const cacheKey = fc.integer({ min: 0, max: CACHE_KEYS.length - 1 })
/** An object as JSON carries it (what a cached validation is). */
const cacheValue = fc.json({ maxDepth: 2 }).map((json) => ({ v: JSON.parse(json) as unknown }))
const cacheOp: fc.Arbitrary<CacheOp> = fc.oneof(
  fc.record({ op: fc.constant('set' as const), key: cacheKey, value: cacheValue, ttl: fc.constantFrom(60_000, 120_000, 0, -1, -0.5, Number.NaN) }),
  fc.record({ op: fc.constant('get' as const), key: cacheKey }),
  fc.record({ op: fc.constant('delete' as const), key: cacheKey }),
)

/** `CacheStore` as its doc comment gives it, no time passing: a TTL of 0 or less stores nothing. */
function cacheModel(): CacheStore<object> {
  const values = new Map<string, object>()
  return {
    get: (key) => values.get(key),
    set(key, value, ttlMs) {
      if (ttlMs > 0) values.set(key, structuredClone(value))
    },
    delete(key) {
      values.delete(key)
    },
  }
}

async function applyCache(store: CacheStore<object>, o: CacheOp): Promise<Outcome> {
  const key = CACHE_KEYS[o.key]!
  return outcome(() => {
    if (o.op === 'set') return store.set(key, o.value, o.ttl)
    if (o.op === 'get') return Promise.resolve(store.get(key)).then((value) => value && structuredClone(value))
    return store.delete(key)
  })
}

async function compare<O>(stores: Record<string, (o: O) => Promise<Outcome>>, ops: readonly O[]): Promise<void> {
  const names = Object.keys(stores)
  for (const [n, o] of ops.entries()) {
    const outcomes: Record<string, Outcome> = {}
    for (const name of names) outcomes[name] = await stores[name]!(o)
    for (const name of names.slice(1)) {
      expect(outcomes[name], `op ${n} ${JSON.stringify(o)}: ${name} vs ${names[0]}`).toEqual(outcomes[names[0]!])
    }
  }
}

/**
 * The memory counters with the store's clock moving (forward, and back as a stepped clock does):
 * a request of an older window counts against a counter only while the counter is younger
 * than one window of the store's time (and a clock stepped back by a window or more ends it);
 * otherwise it starts the counter again in its own window (docs/stores.md, "Rate limit").
 */
describe('rate-limit counters, differential: model and memory, with the store\'s clock moving', () => {
  type Step = { key: number; window: number } | { advance: number }
  const step: fc.Arbitrary<Step> = fc.oneof(
    { weight: 4, arbitrary: rlOp },
    { weight: 1, arbitrary: fc.record({ advance: fc.constantFrom(1, 999, 1_000, 9_999, 10_000, 10_001, 60_000, -1, -10_000, -60_000) }) },
  )
  it('answer the same', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(step, { minLength: 20, maxLength: 40 }), async (steps) => {
        let clock = T0
        const memory = createMemoryRateLimitStore({ now: () => clock })
        const counters = new Map<string, { w: number; c: number; started: number }>()
        for (const [n, s] of steps.entries()) {
          if ('advance' in s) {
            clock += s.advance
            continue
          }
          const key = RL_KEYS[s.key]!
          const windowMs = RL_WINDOWS[s.key]!
          const windowStart = T0 + s.window * windowMs
          const entry = counters.get(key)
          let expected: number | RateLimitCount
          if (entry?.w === windowStart) expected = ++entry.c
          else if (entry && entry.w > windowStart && clock - entry.started < windowMs && clock - entry.started > -windowMs) {
            expected = { count: ++entry.c, windowStart: entry.w }
          } else {
            counters.set(key, { w: windowStart, c: 1, started: clock })
            expected = 1
          }
          expect(plainCount(await memory.increment(key, windowStart, windowMs)), `step ${n} ${JSON.stringify(s)}`).toEqual(expected)
        }
      }),
      { numRuns: RUNS * 10 },
    )
  })
})

describeRedis('stores, differential: model, memory and Redis', (redis) => {
  it('rate-limit counters: the same counts and windows, across windows, older windows and odd keys', async () => {
    const memoryClock = () => T0
    await fc.assert(
      fc.asyncProperty(fc.array(rlOp, { minLength: 20, maxLength: 40 }), async (ops) => {
        const stores = {
          model: rateLimitModel(false),
          memory: createMemoryRateLimitStore({ now: memoryClock }),
          'model (keeps the window replaced)': rateLimitModel(true),
          redis: createRedisRateLimitStore({ client: redis.client, prefix: redis.prefix() }),
        }
        const increment = (store: RateLimitStore) => (o: RlOp) => {
          const windowMs = RL_WINDOWS[o.key]!
          return outcome(async () => plainCount(await store.increment(RL_KEYS[o.key]!, T0 + o.window * windowMs, windowMs)))
        }
        await compare({ model: increment(stores.model), memory: increment(stores.memory) }, ops)
        await compare({ model: increment(stores['model (keeps the window replaced)']), redis: increment(stores.redis) }, ops)
      }),
      { numRuns: RUNS },
    )
  }, 60_000)

  it('session pins: the same pins, set only for a new id, deleted, at odd ids and pins', async () => {
    let clock = T0
    await fc.assert(
      fc.asyncProperty(fc.array(sessionOp, { minLength: 20, maxLength: 40 }), async (ops) => {
        const model = sessionModel()
        const memory = createMemorySessionStore({ now: () => clock })
        const store = createRedisSessionStore({ client: redis.client, prefix: redis.prefix() })
        await compare(
          {
            model: (o: SessionOp) => applySession(model, o),
            memory: (o: SessionOp) => applySession(memory, o),
            redis: (o: SessionOp) => applySession(store, o),
          },
          ops,
        )
        clock += 1
      }),
      { numRuns: RUNS },
    )
  }, 60_000)

  it('cache: the same values, a TTL of 0 or less storing nothing, with and without the local cache', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(cacheOp, { minLength: 20, maxLength: 40 }), async (ops) => {
        const model = cacheModel()
        const memory = createMemoryCacheStore<object>({ now: () => T0 })
        const local = createRedisCacheStore<object>({ client: redis.client, prefix: redis.prefix() })
        const remote = createRedisCacheStore<object>({ client: redis.client, prefix: redis.prefix(), localTtlMs: 0 })
        await compare(
          {
            model: (o: CacheOp) => applyCache(model, o),
            memory: (o: CacheOp) => applyCache(memory, o),
            'redis (local cache)': (o: CacheOp) => applyCache(local, o),
            'redis (no local cache)': (o: CacheOp) => applyCache(remote, o),
          },
          ops,
        )
      }),
      { numRuns: RUNS },
    )
  }, 60_000)
})
