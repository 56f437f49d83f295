/**
 * The full dispatch pipeline as the benchmarks run it: one App with a few live versions, one
 * subscribed user, one API token with an IP allowlist, a rate limit high enough never to
 * refuse, all on a named store set. Used in process (micro) and in the HTTP server processes.
 */
import {
  type DispatchRequest,
  type Dispatcher,
  type DispatcherOptions,
  type RateLimitPolicy,
  type TokenService,
  createDispatcher,
  createTokenService,
} from 'mcp-dispatch'
import { type RoundTripCounts, type StoreSet, countRoundTrips, createStoreSet } from './stores.js'

export const BENCH_APP = { id: 'app_bench', slug: 'bench', name: 'Bench' } as const
export const BENCH_USER = 'user_bench'
/** Live versions of the bench App; `/v1` resolves to 1.2.3. */
export const BENCH_VERSIONS = ['1.0.0', '1.1.0', '1.2.3', '2.0.0'] as const
export const BENCH_PATH = '/v1'
export const BENCH_VERSION = '1.2.3'
/** Never refuses during a benchmark, but is counted like any limit. */
export const BENCH_POLICY: RateLimitPolicy = Object.freeze({ limit: 1_000_000_000, windowType: 'minute' })

/** The fixed JSON-RPC `tools/list` request every HTTP benchmark sends. */
export const TOOLS_LIST_REQUEST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
/** The fixed `tools/list` result every benchmark handler answers. */
export const TOOLS_LIST_RESULT = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  result: {
    tools: [
      {
        name: 'get_forecast',
        description: 'Returns the weather forecast for a city.',
        inputSchema: {
          type: 'object',
          properties: { city: { type: 'string' }, days: { type: 'integer', minimum: 1, maximum: 7 } },
          required: ['city'],
        },
      },
    ],
  },
})

/** Options of {@link createBenchFixture}. */
export interface BenchFixtureOptions {
  /** Store set name (`memory`, later `redis`, `postgres`). */
  store: string
  /** Count store calls (round trips). */
  count?: boolean
}

/** A ready pipeline for benchmarks. */
export interface BenchFixture {
  readonly dispatcher: Dispatcher
  /** The token service of the pipeline. */
  readonly tokenService: TokenService
  /** The options the dispatcher was made from, for adapters that take options. */
  readonly dispatcherOptions: DispatcherOptions
  /** A valid API token of {@link BENCH_USER} for the bench App. */
  readonly token: string
  /** `bench.localhost`, the host that selects the bench App. */
  readonly hostname: string
  /** Store calls since the last `resetCounts()`, when counting. */
  readonly counts: RoundTripCounts | undefined
  totalStoreCalls(): number
  resetCounts(): void
  close(): Promise<void>
}

/** Builds the bench pipeline on the named store set. */
export async function createBenchFixture(options: BenchFixtureOptions): Promise<BenchFixture> {
  const raw: StoreSet = await createStoreSet(options.store, {
    apps: [{ ...BENCH_APP, versions: BENCH_VERSIONS }],
    subscriptions: [{ userId: BENCH_USER, appId: BENCH_APP.id, active: true }],
  })
  const counting = options.count ? countRoundTrips(raw) : undefined
  const stores = counting?.stores ?? raw
  const tokens = createTokenService({ store: stores.tokens, apps: stores.apps, subscriptions: stores.subscriptions })
  const created = await tokens.create({
    userId: BENCH_USER,
    name: 'bench',
    servers: [BENCH_APP.id],
    expiresInDays: 90,
    allowedIps: ['127.0.0.0/8', '::1/128'],
  })
  const dispatcherOptions: DispatcherOptions = {
    apps: stores.apps,
    subscriptions: stores.subscriptions,
    tokens,
    sessions: stores.sessions,
    rateLimit: { store: stores.rateLimit, policy: () => BENCH_POLICY },
    authorizationServers: ['https://auth.example.com'],
  }
  const dispatcher = createDispatcher(dispatcherOptions)
  counting?.reset()
  return {
    dispatcher,
    tokenService: tokens,
    dispatcherOptions,
    token: created.token,
    hostname: `${BENCH_APP.slug}.localhost`,
    get counts() {
      return counting?.counts
    },
    totalStoreCalls: () => counting?.total() ?? 0,
    resetCounts: () => counting?.reset(),
    async close() {
      await tokens.close()
      await raw.close?.()
    },
  }
}

/** A {@link DispatchRequest} for the bench App, headers looked up in a plain object. */
export function benchRequest(fixture: BenchFixture, path = BENCH_PATH): DispatchRequest {
  const headers: Record<string, string> = {
    authorization: `Bearer ${fixture.token}`,
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
  }
  return {
    method: 'POST',
    path,
    host: fixture.hostname,
    origin: `http://${fixture.hostname}`,
    headers: { get: (name) => headers[name] },
    clientAddress: '127.0.0.1',
  }
}
