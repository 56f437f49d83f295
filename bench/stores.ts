/**
 * Store sets by name, so the same benchmark measures every store implementation:
 * `npm run bench -- --store memory`, `--store redis` (Redis at `REDIS_URL`, default
 * `redis://127.0.0.1:6379`), `--store postgres` (`POSTGRES_URL`). A store implementation
 * registers a factory here (`registerStoreSet(name, …)`) and is measured by the same harness.
 *
 * Every store of a set can be wrapped in a counting proxy: the benchmark reports store
 * round trips per request (for a remote store, one call is one network round trip).
 */
import { randomBytes, randomUUID } from 'node:crypto'
import type {
  AppStore,
  RateLimitStore,
  SessionStore,
  SubscriptionStore,
  TokenStore,
} from 'mcp-dispatch'
import {
  createMemoryAppStore,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
} from 'mcp-dispatch'
import { createPostgresTokenStore } from 'mcp-dispatch/postgres'
import { createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'

/** What a store set is seeded with before a benchmark. */
export interface StoreSeed {
  readonly apps: readonly { id: string; slug: string; name: string; versions: readonly string[] }[]
  readonly subscriptions: readonly { userId: string; appId: string; active: boolean }[]
}

/** The stores the dispatcher reads on a request. */
export interface StoreSet {
  readonly apps: AppStore
  readonly subscriptions: SubscriptionStore
  readonly tokens: TokenStore
  readonly sessions: SessionStore
  readonly rateLimit: RateLimitStore
  /** Releases connections (remote stores). */
  close?(): Promise<void>
}

/** Makes a seeded store set. May be async (a remote store connects and migrates). */
export type StoreSetFactory = (seed: StoreSeed) => StoreSet | Promise<StoreSet>

const factories = new Map<string, StoreSetFactory>()

/** Registers a store set under a name usable with `--store <name>`. */
export function registerStoreSet(name: string, factory: StoreSetFactory): void {
  factories.set(name, factory)
}

/** Names of the registered store sets. */
export function storeSetNames(): string[] {
  return [...factories.keys()]
}

/** Creates the store set registered as `name`; throws naming the known ones otherwise. */
export async function createStoreSet(name: string, seed: StoreSeed): Promise<StoreSet> {
  const factory = factories.get(name)
  if (!factory) throw new Error(`unknown store set ${JSON.stringify(name)}; known: ${storeSetNames().join(', ')}`)
  return factory(seed)
}

function memoryStores(seed: StoreSeed): StoreSet {
  return {
    apps: createMemoryAppStore(seed.apps),
    subscriptions: createMemorySubscriptionStore(seed.subscriptions),
    tokens: createMemoryTokenStore(),
    sessions: createMemorySessionStore(),
    rateLimit: createMemoryRateLimitStore(),
  }
}

registerStoreSet('memory', memoryStores)

/**
 * PostgreSQL tokens, memory for the rest. The database is `POSTGRES_URL` (default the local
 * test database); the table lives in a schema of its own for the run, dropped on close. `pg`
 * is loaded only when this set is chosen.
 */
registerStoreSet('postgres', async (seed) => {
  const { default: pg } = await import('pg')
  const pool = new pg.Pool({
    connectionString: process.env.POSTGRES_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
    max: 10,
    connectionTimeoutMillis: 5_000,
  })
  pool.on('error', (error) => console.error('[bench] idle PostgreSQL client failed:', error.message))
  const schema = `mcpd_bench_${randomBytes(6).toString('hex')}`
  const tokens = createPostgresTokenStore({ pool, schema })
  try {
    await tokens.migrate()
  } catch (error) {
    await pool.end()
    throw error
  }
  return {
    ...memoryStores(seed),
    tokens,
    async close() {
      try {
        await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
      } finally {
        await pool.end()
      }
    },
  }
})

// Redis for what instances share on the request path (session pins, rate-limit counters),
// memory for the rest. ioredis is loaded only when this set is asked for.
registerStoreSet('redis', async (seed) => {
  const { Redis } = await import('ioredis')
  const client = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 })
  await client.ping()
  const prefix = `mcp-dispatch-bench:${randomUUID()}:`
  return {
    ...memoryStores(seed),
    sessions: createRedisSessionStore({ client, prefix }),
    rateLimit: createRedisRateLimitStore({ client, prefix }),
    async close() {
      let cursor = '0'
      do {
        const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
        if (keys.length > 0) await client.del(...keys)
        cursor = next
      } while (cursor !== '0')
      await client.quit()
    },
  }
})

/** Calls per store, counted by {@link countRoundTrips}. */
export type RoundTripCounts = Record<string, number>

type Method = (a?: unknown, b?: unknown, c?: unknown, d?: unknown) => unknown

/**
 * Wraps every method of every store of a set so each call is counted under
 * `<store>.<method>`. The wrappers must cost next to nothing, since only the dispatch rows of
 * the HTTP table carry them: plain closures (no `Proxy`), a fixed arity (no rest array, no
 * `apply`; store methods take at most four arguments) and one counter cell each (no keyed
 * write into a dictionary per call). Measured: a few dozen instructions per call, where rest
 * arguments, `apply` and a keyed counter had cost about 500 (2,500 per request).
 */
export function countRoundTrips(set: StoreSet): {
  stores: StoreSet
  counts: RoundTripCounts
  total(): number
  reset(): void
} {
  const cells = new Map<string, { calls: number }>()
  const wrap = <T extends object>(storeName: string, store: T): T => {
    const wrapped: Record<string, unknown> = {}
    let proto: object | null = store
    const seen = new Set<string>()
    while (proto && proto !== Object.prototype) {
      for (const key of Object.getOwnPropertyNames(proto)) {
        if (seen.has(key) || key === 'constructor') continue
        seen.add(key)
        const value = (store as Record<string, unknown>)[key]
        if (typeof value !== 'function') {
          // Flags such as `SessionStore.synchronous` stay as they are.
          wrapped[key] = value
          continue
        }
        const method = value as Method
        const cell = { calls: 0 }
        cells.set(`${storeName}.${key}`, cell)
        wrapped[key] = (a?: unknown, b?: unknown, c?: unknown, d?: unknown) => {
          cell.calls++
          return method.call(store, a, b, c, d)
        }
      }
      proto = Object.getPrototypeOf(proto) as object | null
    }
    return wrapped as T
  }
  const stores: StoreSet = {
    apps: wrap('apps', set.apps),
    subscriptions: wrap('subscriptions', set.subscriptions),
    tokens: wrap('tokens', set.tokens),
    sessions: wrap('sessions', set.sessions),
    rateLimit: wrap('rateLimit', set.rateLimit),
    ...(set.close && { close: () => set.close!() }),
  }
  const counts: RoundTripCounts = {}
  return {
    stores,
    get counts() {
      for (const [label, cell] of cells) counts[label] = cell.calls
      return counts
    },
    total: () => [...cells.values()].reduce((sum, cell) => sum + cell.calls, 0),
    reset() {
      for (const cell of cells.values()) cell.calls = 0
    },
  }
}
