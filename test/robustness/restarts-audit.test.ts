/**
 * Real infrastructure failures and recovery: a `redis-server` and PostgreSQL clusters of this
 * file's own (test/helpers/own-servers.ts: Redis on 127.0.0.1:19201, PostgreSQL on 19210 and,
 * with `max_connections=4`, 19211, PgBouncer in transaction mode on 19220) are stopped
 * (`SIGTERM`, `pg_ctl stop -m fast`), killed (`SIGKILL`, `-m immediate`), frozen (`SIGSTOP`)
 * and started again (Redis empty: no persistence) while traffic flows through the real pipeline
 * (the Web adapter served over HTTP, the token API, the MCP SDK's servers) on the Redis stores
 * (sessions, rate limit, invalidation bus; ioredis 6 and 5) and the PostgreSQL token store, set
 * up as docs/stores.md says. During an outage the answers are the documented ones (503, or
 * served for a rate limit failing open; never a 500, never a hang, never a revoked token
 * allowed past what docs/stores.md allows); once the server is back the instance recovers on
 * its own, nothing restarted. Skipped without `redis-server` or PostgreSQL's server programs.
 */
import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { Redis } from 'ioredis'
import { Redis as Redis5 } from 'ioredis5'
import pg from 'pg'
import type { InvalidationBus } from 'mcp-dispatch'
import { createPostgresTokenStore } from 'mcp-dispatch/postgres'
import {
  type RedisInvalidationBus,
  createRedisInvalidationBus,
  createRedisRateLimitStore,
  createRedisSessionStore,
} from 'mcp-dispatch/redis'
import { afterAll, describe, expect, it, vi } from 'vitest'
import { INITIALIZE } from '../helpers/platform.js'
import { underProjectCI } from '../helpers/ci.js'
import { type OwnPostgres, type OwnRedis, ownPostgresMissing, startOwnPostgres, startOwnRedis } from '../helpers/own-servers.js'
import { redisServerMissing } from '../helpers/redis.js'
import { startPgBouncer } from '../helpers/pgbouncer.js'
import { type Instance, startInstance as startPipelineInstance } from '../stores/postgres-pipeline-suite.js'

const missing = ownPostgresMissing() ?? redisServerMissing()
if (missing !== undefined && underProjectCI()) throw new Error(`redis-server and PostgreSQL's server programs are required under .ci/run (MCP_DISPATCH_CI): ${missing}`)
if (missing !== undefined) console.warn(`[restarts audit] skipped: ${missing}`)

// Started at the top of the file (their afterAll is the file's), stopped after it.
const postgres: OwnPostgres | undefined = missing === undefined ? await startOwnPostgres(19210) : undefined

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

interface InstanceOptions {
  pool: pg.Pool
  /** Redis stores (sessions, rate limit) on this client; none when left out. */
  redis?: Redis
  invalidations?: InvalidationBus
  cacheTtlMs?: number
  rateLimit?: number
  preparedStatements?: boolean
  lastUsedFlushMs?: number
}

/** The pipeline suite's instance (token API and the weather App's MCP), on the real clock, with Redis stores when given a client. */
function startInstance(options: InstanceOptions): Promise<Instance> {
  return startPipelineInstance({
    pool: options.pool,
    now: Date.now,
    ...(options.cacheTtlMs !== undefined && { cacheTtlMs: options.cacheTtlMs }),
    ...(options.invalidations !== undefined && { invalidations: options.invalidations }),
    ...(options.preparedStatements !== undefined && { preparedStatements: options.preparedStatements }),
    service: { storeTimeoutMs: 3_000, ...(options.lastUsedFlushMs !== undefined && { lastUsedFlushMs: options.lastUsedFlushMs }) },
    ...(options.redis !== undefined && {
      dispatcher: {
        sessions: createRedisSessionStore({ client: options.redis, prefix: 'restarts:', timeoutMs: 500 }),
        rateLimit: {
          store: createRedisRateLimitStore({ client: options.redis, prefix: 'restarts:', timeoutMs: 500 }),
          policy: () => ({ limit: options.rateLimit ?? 1_000, windowType: 'minute' as const }),
        },
      },
    }),
  })
}

/** The message of a reported error. */
const said = (error: unknown) => (error instanceof Error ? error.message : String(error))

/** A call of the token API as alice, bounded: a hung request fails the test, it is not waited for. */
async function asAlice(instance: Instance, method: string, path: string, body?: unknown): Promise<{ status: number; json: any; ms: number }> {
  const started = performance.now()
  const response = await fetch(`${instance.origin}/api/tokens${path}`, {
    method,
    headers: { cookie: 'session=alice', 'x-csrf-token': 'csrf-alice', 'content-type': 'application/json' },
    ...(body !== undefined && { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(10_000),
  })
  const text = await response.text()
  return { status: response.status, json: text ? JSON.parse(text) : undefined, ms: performance.now() - started }
}

/**
 * An MCP `initialize` with `token` (it opens a session: its pin is written), or with a
 * `sessionId` a `tools/list` in that session (its pin is read), or with `null` a `tools/list`
 * outside any session (no pin: the App answers 400 once the pipeline let it through); bounded.
 */
async function initialize(instance: Instance, token: string, sessionId?: string | null): Promise<{ status: number; session: string | null; body: string; ms: number; ratelimit: string | null }> {
  const started = performance.now()
  const response = await fetch(`${instance.origin}/v1`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${token}`,
      accept: 'application/json, text/event-stream',
      'content-type': 'application/json',
      ...(typeof sessionId === 'string' && { 'mcp-session-id': sessionId }),
    },
    body: JSON.stringify(sessionId === undefined ? INITIALIZE : { jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    signal: AbortSignal.timeout(10_000),
  })
  const body = await response.text()
  return { status: response.status, session: response.headers.get('mcp-session-id'), body, ms: performance.now() - started, ratelimit: response.headers.get('ratelimit') }
}

async function createToken(instance: Instance): Promise<{ id: string; token: string }> {
  const made = await asAlice(instance, 'POST', '', { name: `t${Math.random()}`, servers: ['app_weather'], expires_in_days: 7 })
  expect(made.status, JSON.stringify(made.json)).toBe(201)
  return { id: made.json.id, token: made.json.token }
}

/** A pool as docs/stores.md "Pool setup" has it, on `url`; its idle clients' errors kept. */
function documentedPool(url: string, idleErrors: string[], config: pg.PoolConfig = {}): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max: 4, connectionTimeoutMillis: 2_000, statement_timeout: 2_000, query_timeout: 3_000, ...config })
  pool.on('error', (error) => void idleErrors.push(error.message))
  return pool
}

describe.runIf(missing === undefined)('PostgreSQL restarted under traffic', () => {
  const pools: pg.Pool[] = []
  afterAll(async () => {
    await Promise.all(pools.map((pool) => pool.end().catch(() => {})))
  })

  for (const mode of ['fast', 'immediate'] as const) {
    it(`pg_ctl stop -m ${mode}, then start: 503 while down (never a 500 or a hang), and the same pool serves lookups and creations again on its own`, { timeout: 60_000 }, async () => {
      if (postgres === undefined) throw new Error(missing)
      const idleErrors: string[] = []
      const pool = documentedPool(postgres.url, idleErrors)
      pools.push(pool)
      await createPostgresTokenStore({ pool }).migrate()
      const instance = await startInstance({ pool })
      try {
        const made = await createToken(instance)
        expect((await initialize(instance, made.token)).status).toBe(200)
        // Every client of the pool opened and idle: a lookup each, at once.
        await Promise.all(Array.from({ length: 4 }, () => initialize(instance, made.token)))

        postgres.stop(mode)
        const down: Array<{ status: number; ms: number }> = []
        for (let i = 0; i < 5; i++) {
          const answer = await initialize(instance, made.token)
          down.push({ status: answer.status, ms: answer.ms })
          const created = await asAlice(instance, 'POST', '', { name: `down${i}`, servers: ['app_weather'], expires_in_days: 7 })
          down.push({ status: created.status, ms: created.ms })
        }
        expect(down.map((d) => d.status)).toEqual(Array(10).fill(503))
        for (const d of down) expect(d.ms).toBeLessThan(4_000)

        postgres.start()
        const back = performance.now()
        await vi.waitFor(async () => expect((await initialize(instance, made.token)).status).toBe(200), { timeout: 5_000, interval: 50 })
        const recoveredMs = performance.now() - back
        expect(recoveredMs).toBeLessThan(5_000)
        const again = await createToken(instance)
        expect((await initialize(instance, again.token)).status).toBe(200)
        // Every pooled client works again (none left broken in the pool).
        const answers = await Promise.all(Array.from({ length: 8 }, () => initialize(instance, again.token)))
        expect(answers.map((a) => a.status)).toEqual(Array(8).fill(200))
        expect(instance.errors.filter((e) => e.context !== 'token failed' && e.context !== 'token api')).toEqual([])
      } finally {
        await instance.close()
      }
    })
  }
})

const redisServer: OwnRedis | undefined = missing === undefined ? await startOwnRedis(19201) : undefined

/** Two instances (A, B) on the own Redis and PostgreSQL, each with its client and bus, as docs/stores.md sets them up. */
/** Both majors the peer dependency takes (ioredis 5 typed as 6, as test/helpers/redis.ts does). */
const CLIENTS = { 'ioredis 6': Redis, 'ioredis 5': Redis5 as unknown as typeof Redis } as const

async function twoInstances(options: { rateLimit?: number; kind?: keyof typeof CLIENTS } = {}) {
  if (postgres === undefined || redisServer === undefined) throw new Error(missing)
  const idleErrors: string[] = []
  const pool = documentedPool(postgres.url, idleErrors)
  await createPostgresTokenStore({ pool }).migrate()
  const made: Array<{ name: string; client: Redis; bus: RedisInvalidationBus; busErrors: string[]; instance: Instance }> = []
  for (const name of ['A', 'B']) {
    const client = new CLIENTS[options.kind ?? 'ioredis 6'](redisServer.url, { maxRetriesPerRequest: 1, socketTimeout: 5_000, keepAlive: 30_000 })
    client.on('error', () => {})
    const busErrors: string[] = []
    const bus = createRedisInvalidationBus({ client, prefix: 'restarts:', onError: (error, context) => void busErrors.push(`${context}: ${(error as Error).message}`) })
    await bus.ready(5_000)
    const instance = await startInstance({ pool, redis: client, invalidations: bus, cacheTtlMs: 60_000, ...(options.rateLimit !== undefined && { rateLimit: options.rateLimit }) })
    made.push({ name, client, bus, busErrors, instance })
  }
  const [a, b] = made as [(typeof made)[0], (typeof made)[0]]
  return {
    a,
    b,
    pool,
    idleErrors,
    async close() {
      for (const one of made) {
        await one.instance.close()
        await one.bus.close()
        one.client.disconnect()
      }
      await pool.end()
    },
  }
}

for (const kind of Object.keys(CLIENTS) as Array<keyof typeof CLIENTS>)
describe.runIf(missing === undefined)(`Redis stopped, killed or frozen under traffic, then back (empty: no persistence), ${kind}`, () => {
  for (const how of ['SIGTERM', 'SIGKILL'] as const) {
    it(`${how}, down 2 s, started again empty: documented answers while down; on its own after, counts, pins and invalidations work again`, { timeout: 30_000 }, async () => {
      const { a, b, close } = await twoInstances({ kind })
      try {
        const [t1, t2, t3] = [await createToken(a.instance), await createToken(a.instance), await createToken(a.instance)]
        const opened = await initialize(a.instance, t1.token)
        expect(opened.status).toBe(200)
        expect(opened.ratelimit).toMatch(/r=\d+/)
        for (const t of [t1, t2, t3]) expect((await initialize(a.instance, t.token)).status).toBe(200) // cached on A

        await redisServer!.signal(how)
        await vi.waitFor(() => expect(a.bus.listening).toBe(false), { timeout: 3_000, interval: 10 })
        // Down: a request outside a session reaches the App (the rate limit fails open, no
        // RateLimit field: the App's 400), a session's request 503, an initialize 503 (its pin
        // cannot be written), a token revoked on B meanwhile refused on A (its cache is off).
        const served = await initialize(a.instance, t1.token, null)
        expect([served.status, served.ratelimit]).toEqual([400, null])
        expect((await initialize(a.instance, t1.token)).status).toBe(503)
        expect(served.ms).toBeLessThan(2_000)
        const pinned = await initialize(a.instance, t1.token, opened.session!)
        expect(pinned.status).toBe(503)
        const revoked = await asAlice(b.instance, 'DELETE', `/${t2.id}`)
        expect(revoked.status).toBe(200)
        expect((await initialize(a.instance, t2.token, null)).status).toBe(401)
        await sleep(2_000)

        await redisServer!.start()
        const back = performance.now()
        // Counting again, and both buses listening, within ioredis' reconnect delay.
        await vi.waitFor(async () => expect((await initialize(a.instance, t1.token)).ratelimit).toMatch(/r=\d+/), { timeout: 8_000, interval: 50 })
        // Both buses listening and both command connections up: each instance's two connections
        // reconnect on their own backoff, and a revocation made while B's command connection is
        // still away reaches A only at the token service's next round (0.5 to 1 s later,
        // docs/stores.md "Invalidation across instances"), not at once.
        await vi.waitFor(() => expect([a.bus.listening, b.bus.listening, a.client.status, b.client.status]).toEqual([true, true, 'ready', 'ready']), { timeout: 8_000, interval: 10 })
        expect(performance.now() - back).toBeLessThan(8_000)
        // The pin went with Redis: the client's session is 404 (it initializes again).
        expect((await initialize(a.instance, t1.token, opened.session!)).status).toBe(404)
        // t3, read into A's cache again now that it listens, revoked on B: refused on A at once.
        expect((await initialize(a.instance, t3.token)).status).toBe(200)
        expect((await initialize(a.instance, t3.token)).status).toBe(200)
        expect((await asAlice(b.instance, 'DELETE', `/${t3.id}`)).status).toBe(200)
        expect((await initialize(a.instance, t3.token)).status).toBe(401)
        expect((await initialize(a.instance, t2.token)).status).toBe(401)
      } finally {
        await close()
        if (redisServer !== undefined && !(await redisUp())) await redisServer.start()
      }
    })
  }

  for (const freezeMs of [6_000, 13_000])
  it(`SIGSTOP for ${freezeMs / 1000} s, then SIGCONT: a token revoked on B meanwhile is refused on A once its heartbeat judged the silence, and after`, { timeout: 30_000 }, async () => {
    const { a, b, close } = await twoInstances({ kind })
    try {
      const [t1, t2, t3] = [await createToken(a.instance), await createToken(a.instance), await createToken(a.instance)]
      for (const t of [t1, t2, t3]) expect((await initialize(a.instance, t.token)).status).toBe(200)
      const opened = await initialize(a.instance, t1.token)

      await redisServer!.signal('SIGSTOP')
      const frozen = performance.now()
      const revoking = asAlice(b.instance, 'DELETE', `/${t2.id}`)
      const answers: Array<{ at: number; t1: number; t2: number; ms: number; session: number }> = []
      while (performance.now() - frozen < freezeMs) {
        const one = await initialize(a.instance, t1.token, null)
        const two = await initialize(a.instance, t2.token, null)
        const session = await initialize(a.instance, t1.token, opened.session!)
        answers.push({ at: Math.round(performance.now() - frozen), t1: one.status, t2: two.status, ms: Math.round(Math.max(one.ms, two.ms, session.ms)), session: session.status })
        await sleep(100)
      }
      const revokedAnswer = await revoking
      await redisServer!.signal('SIGCONT')
      const thawed = performance.now()
      await vi.waitFor(async () => expect((await initialize(a.instance, t1.token)).ratelimit).toMatch(/r=\d+/), { timeout: 8_000, interval: 50 })
      await vi.waitFor(() => expect([a.bus.listening, b.bus.listening, a.client.status, b.client.status]).toEqual([true, true, 'ready', 'ready']), { timeout: 8_000, interval: 10 })
      expect(performance.now() - thawed).toBeLessThan(8_000)
      // B's revocation, waiting in its rounds, reached A; its answer came at its publish deadline.
      expect([revokedAnswer.status, revokedAnswer.ms < 3_000]).toEqual([200, true])
      expect((await initialize(a.instance, t1.token, opened.session!)).status).toBe(200) // the pin survived the freeze
      expect((await initialize(a.instance, t2.token)).status).toBe(401)
      expect((await initialize(a.instance, t3.token)).status).toBe(200)
      expect((await asAlice(b.instance, 'DELETE', `/${t3.id}`)).status).toBe(200)
      expect((await initialize(a.instance, t3.token)).status).toBe(401)
      // Never a 500, and nothing waited for the dispatcher's own deadline.
      for (const answer of answers) {
        expect([answer.t1, answer.session]).toEqual([400, 503])
        expect(answer.ms).toBeLessThan(2_000)
      }
      // Refused from the moment A judged the silence (docs/stores.md: 2 to 4.5 s after the hang began).
      const late = answers.filter((answer) => answer.at > 4_500)
      expect(late.map((answer) => answer.t2)).toEqual(late.map(() => 401))
      expect(new Set(answers.map((answer) => answer.t2))).toEqual(new Set([400, 401]))
    } finally {
      await redisServer!.signal('SIGCONT')
      await close()
    }
  })
})

async function redisUp(): Promise<boolean> {
  const client = new Redis(redisServer!.url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null })
  client.on('error', () => {})
  try {
    await client.connect()
    await client.ping()
    return true
  } catch {
    return false
  } finally {
    client.disconnect()
  }
}

describe.runIf(missing === undefined)('PostgreSQL down while tokens are cached (a Redis bus listening)', () => {
  it('cached tokens are served through the outage, their uses are written once it is back, and nothing hangs', { timeout: 30_000 }, async () => {
    if (postgres === undefined || redisServer === undefined) throw new Error(missing)
    const idleErrors: string[] = []
    const pool = documentedPool(postgres.url, idleErrors)
    await createPostgresTokenStore({ pool }).migrate()
    const client = new Redis(redisServer.url, { maxRetriesPerRequest: 1, socketTimeout: 5_000 })
    client.on('error', () => {})
    const bus = createRedisInvalidationBus({ client, prefix: 'restarts-cached:' })
    await bus.ready(5_000)
    const instance = await startInstance({ pool, redis: client, invalidations: bus, cacheTtlMs: 60_000, lastUsedFlushMs: 300 })
    try {
      const made = await createToken(instance)
      const opened = await initialize(instance, made.token)
      expect(opened.status).toBe(200)
      await sleep(600)
      const before = (await pool.query('SELECT last_used_at FROM public.mcp_dispatch_api_tokens WHERE id = $1', [made.id])).rows[0].last_used_at
      postgres.stop('fast')
      const usedAt = Date.now()
      const during = await initialize(instance, made.token, opened.session!)
      expect(during.status).toBe(200)
      await sleep(1_000) // a flush or two fail meanwhile
      expect(instance.errors.map((e) => e.context)).toContain('last_used_at flush')
      postgres.start()
      await vi.waitFor(async () => {
        const row = (await pool.query('SELECT last_used_at FROM public.mcp_dispatch_api_tokens WHERE id = $1', [made.id])).rows[0]
        expect(Number(row.last_used_at)).toBeGreaterThanOrEqual(usedAt - 5)
      }, { timeout: 5_000, interval: 100 })
      expect(Number(before)).toBeLessThan(usedAt)
    } finally {
      await instance.close()
      await bus.close()
      client.disconnect()
      await pool.end()
    }
  })
})

describe.runIf(missing === undefined)('PostgreSQL out of connections (max_connections reached)', () => {
  it('every lookup and creation answers 503 at once while the server refuses connections, and all is served once one is free', { timeout: 30_000 }, async () => {
    const small = await startOwnPostgres(19211, ['max_connections=4', 'superuser_reserved_connections=0'])
    const idleErrors: string[] = []
    const setup = new pg.Pool({ connectionString: small.url, max: 1 })
    await createPostgresTokenStore({ pool: setup }).migrate()
    await setup.end()
    const pool = documentedPool(small.url, idleErrors)
    const instance = await startInstance({ pool })
    const hogs: pg.Client[] = []
    try {
      const made = await createToken(instance)
      // The pool's one connection idle; the others taken by clients of other instances.
      await pool.query('SELECT 1')
      expect(pool.totalCount).toBe(1)
      await pool.end().catch(() => {})
      const fresh = documentedPool(small.url, idleErrors)
      const again = await startInstance({ pool: fresh })
      try {
        for (let i = 0; i < 4; i++) {
          const hog = new pg.Client({ connectionString: small.url })
          await hog.connect()
          hogs.push(hog)
        }
        const answers = await Promise.all(Array.from({ length: 6 }, () => initialize(again, made.token, null)))
        for (const answer of answers) {
          expect(answer.status).toBe(503)
          expect(answer.ms).toBeLessThan(3_000)
        }
        const created = await asAlice(again, 'POST', '', { name: 'full', servers: ['app_weather'], expires_in_days: 7 })
        expect(created.status).toBe(503)
        await hogs.pop()!.end()
        await vi.waitFor(async () => expect((await initialize(again, made.token, null)).status).toBe(400), { timeout: 5_000, interval: 50 })
        expect((await asAlice(again, 'POST', '', { name: 'free', servers: ['app_weather'], expires_in_days: 7 })).status).toBe(201)
      } finally {
        await again.close()
        await fresh.end()
      }
    } finally {
      await instance.close()
      await Promise.all(hogs.map((hog) => hog.end().catch(() => {})))
      small.destroy()
    }
  })
})

describe.runIf(missing === undefined)('PostgreSQL restarted behind PgBouncer (transaction mode)', () => {
  // PgBouncer connects again only `server_login_retry` (15 s by default) after a failed attempt:
  // as installed it serves again up to that long after PostgreSQL is back (docs/stores.md).
  for (const { settings, backWithinMs } of [{ settings: [], backWithinMs: 20_000 }, { settings: ['server_login_retry = 1'], backWithinMs: 2_500 }]) {
    it(`preparedStatements: false, PgBouncer ${settings.join(', ') || 'as installed'}: 503 while PostgreSQL is down, never a hang, and served again within ${backWithinMs / 1000} s once it is back`, { timeout: 40_000 }, async () => {
      if (postgres === undefined) throw new Error(missing)
      const bouncer = await startPgBouncer(19220, 2, { upstream: postgres.url, settings })
      if (bouncer === undefined) return
      const idleErrors: string[] = []
      // As docs/stores.md has it behind PgBouncer: no statement_timeout on the pool.
      const pool = new pg.Pool({ connectionString: bouncer.url, max: 4, connectionTimeoutMillis: 2_000, query_timeout: 3_000 })
      pool.on('error', (error) => void idleErrors.push(error.message))
      const store = createPostgresTokenStore({ pool, preparedStatements: false })
      await store.migrate()
      const instance = await startInstance({ pool, preparedStatements: false })
      try {
        const made = await createToken(instance)
        expect((await initialize(instance, made.token, null)).status).toBe(400)
        postgres.stop('fast')
        for (let i = 0; i < 4; i++) {
          const answer = await initialize(instance, made.token, null)
          expect(answer.status).toBe(503)
          expect(answer.ms).toBeLessThan(4_000) // query_timeout, then at once
        }
        postgres.start()
        const back = performance.now()
        await vi.waitFor(async () => {
          const answer = await initialize(instance, made.token, null)
          expect(answer.ms).toBeLessThan(4_000)
          expect(answer.status).toBe(400)
        }, { timeout: backWithinMs, interval: 100 })
        expect(performance.now() - back).toBeLessThan(backWithinMs)
        expect((await asAlice(instance, 'POST', '', { name: 'after', servers: ['app_weather'], expires_in_days: 7 })).status).toBe(201)
      } finally {
        await instance.close()
        await pool.end()
        await bouncer.stop()
      }
    })
  }
})

describe.runIf(missing === undefined)('PostgreSQL stopped (immediate) in the middle of a burst of creations and lookups', () => {
  it('every answer is 201, 400 (the App: served) or 503 (never a 500, never a hang); a token left active that no caller got is reported, naming it, as one to revoke', { timeout: 40_000 }, async () => {
    if (postgres === undefined) throw new Error(missing)
    const idleErrors: string[] = []
    const pool = documentedPool(postgres.url, idleErrors, { max: 8 })
    await createPostgresTokenStore({ pool }).migrate()
    const instance = await startInstance({ pool })
    try {
      const made = await createToken(instance)
      const given = new Set<string>([made.id])
      const statuses: number[] = []
      const burst = Array.from({ length: 40 }, async (_, i) => {
        await sleep(i * 5)
        if (i % 2 === 0) {
          const created = await asAlice(instance, 'POST', '', { name: `burst${i}`, servers: ['app_weather'], expires_in_days: 7 })
          statuses.push(created.status)
          if (created.status === 201) given.add(created.json.id)
        } else statuses.push((await initialize(instance, made.token, null)).status)
      })
      await sleep(150)
      postgres.stop('immediate')
      await Promise.all(burst)
      postgres.start()
      await vi.waitFor(async () => expect((await initialize(instance, made.token, null)).status).toBe(400), { timeout: 5_000, interval: 50 })
      // The second pass of what must be put right comes storeTimeoutMs (3 s) after each failure.
      await sleep(3_500)
      // This test's (the table is the file's): the first token and the burst's.
      const active = (await pool.query("SELECT id FROM public.mcp_dispatch_api_tokens WHERE user_id = $1 AND revoked_at IS NULL AND (id = $2 OR name LIKE 'burst%')", ['alice', made.id])).rows.map((row) => row.id as string)
      const orphans = active.filter((id) => !given.has(id))
      expect(new Set(statuses.filter((s) => ![201, 400, 503].includes(s)))).toEqual(new Set())
      // A token stored for a caller told 503 is revoked (or was never stored), or reported
      // naming it under the context docs/pipeline.md gives for a token to revoke.
      const reported = instance.errors.filter((e) => /may have been created/.test(said(e.error)))
      for (const e of reported) expect(e.context).toBe('token store write whose caller was told 503')
      for (const id of orphans) expect(reported.map((e) => said(e.error)).join('\n')).toContain(id)
    } finally {
      await instance.close()
      await pool.end()
    }
  })
})


/**
 * The pool set up by the lines of a doc comment's `@example` (the `new pg.Pool(…)` line and
 * any `pool.on(…)` line after it), run in a process of its own against `url`; `alive()` says
 * whether that process still runs.
 */
async function examplePool(file: string, url: string): Promise<{ setup: string; alive(): boolean; kill(): Promise<void> }> {
  const source = readFileSync(fileURLToPath(new URL(`../../${file}`, import.meta.url)), 'utf8')
  const example = /@example\n \* ```ts\n([\s\S]*?)\n \* ```/.exec(source.slice(source.indexOf('export function createPostgresTokenStore') - 2_500))
  const lines = (example?.[1] ?? '').split('\n').map((line) => line.replace(/^ \* ?/, ''))
  const setup = lines.filter((line) => /^const pool = new pg\.Pool\(|^pool\.on\(/.test(line)).join('\n')
  expect(setup).toMatch(/new pg\.Pool/)
  const child = spawn(process.execPath, ['--input-type=module', '-e', `import pg from 'pg'\n${setup}\nawait pool.query('SELECT 1')\nconsole.log('ready')\nsetInterval(() => {}, 1_000)`], {
    cwd: fileURLToPath(new URL('../..', import.meta.url)),
    env: { ...process.env, DATABASE_URL: url },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  child.stdout.on('data', (chunk: Buffer) => void (output += chunk.toString()))
  child.stderr.on('data', (chunk: Buffer) => void (output += chunk.toString()))
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  await vi.waitFor(() => expect(output).toContain('ready'), { timeout: 10_000, interval: 20 })
  return {
    setup,
    alive: () => child.exitCode === null && child.signalCode === null,
    async kill() {
      child.kill('SIGKILL')
      await exited
    },
  }
}

describe.runIf(missing === undefined)('the pool of the doc comments, through a PostgreSQL restart', () => {
  it("createPostgresTokenStore's @example sets up a pool whose process survives PostgreSQL stopping (regression: no pool.on('error'), so the idle client's error ended the process)", { timeout: 30_000 }, async () => {
    if (postgres === undefined) throw new Error(missing)
    const example = await examplePool('src/stores/postgres/token-store.ts', postgres.url)
    try {
      postgres.stop('fast')
      await sleep(1_000)
      expect(example.alive(), `the process of:\n${example.setup}`).toBe(true)
    } finally {
      postgres.start()
      await example.kill()
    }
  })
})

describe.runIf(missing === undefined)('PostgreSQL frozen (SIGSTOP on every process of the cluster), then thawed', () => {
  it('lookups and creations answer 503 within the deadlines while frozen; once thawed, all is served, and a creation that lands late leaves no token active that no caller got, unreported', { timeout: 40_000 }, async () => {
    if (postgres === undefined) throw new Error(missing)
    const idleErrors: string[] = []
    const pool = documentedPool(postgres.url, idleErrors)
    await createPostgresTokenStore({ pool }).migrate()
    const instance = await startInstance({ pool })
    try {
      const made = await createToken(instance)
      await Promise.all(Array.from({ length: 4 }, () => initialize(instance, made.token, null)))
      postgres.signalAll('SIGSTOP')
      const answers = await Promise.all([
        initialize(instance, made.token, null),
        asAlice(instance, 'POST', '', { name: 'frozen-1', servers: ['app_weather'], expires_in_days: 7 }),
        asAlice(instance, 'POST', '', { name: 'frozen-2', servers: ['app_weather'], expires_in_days: 7 }),
      ])
      postgres.signalAll('SIGCONT')
      // query_timeout (3 s) for the lookup and the first creation; the second waited for the
      // first (one creation of a user at a time per instance), then its own store deadline.
      for (const answer of answers) {
        expect(answer.status).toBe(503)
        expect(answer.ms).toBeLessThan(7_000)
      }
      await vi.waitFor(async () => expect((await initialize(instance, made.token, null)).status).toBe(400), { timeout: 5_000, interval: 50 })
      // The second pass of what must be put right: storeTimeoutMs (3 s) after each failure.
      await sleep(4_000)
      const rows = (await pool.query("SELECT id, name, revoked_at FROM public.mcp_dispatch_api_tokens WHERE user_id = $1 AND name LIKE 'frozen-%'", ['alice'])).rows
      const reported = instance.errors.filter((e) => /may have been created/.test(said(e.error)))
      for (const row of rows.filter((row) => row.revoked_at === null)) expect(reported.map((e) => said(e.error)).join('\n')).toContain(row.id)
      const answersAfter = await Promise.all(Array.from({ length: 8 }, () => initialize(instance, made.token, null)))
      expect(answersAfter.map((a) => a.status)).toEqual(Array(8).fill(400))
    } finally {
      await instance.close()
      await pool.end()
    }
  })
})

describe.runIf(missing === undefined)('Redis refusing connections (maxclients reached) after the instances lost theirs', () => {
  it('documented answers while every reconnection is refused, and all works again once Redis takes connections', { timeout: 30_000 }, async () => {
    const { a, b, close } = await twoInstances()
    const admin = new Redis(redisServer!.url)
    admin.on('error', () => {})
    try {
      const [t1, t2] = [await createToken(a.instance), await createToken(a.instance)]
      const opened = await initialize(a.instance, t1.token)
      for (const t of [t1, t2]) expect((await initialize(a.instance, t.token, null)).status).toBe(400)
      // Only the admin connection is left, and Redis takes no other.
      await admin.config('SET', 'maxclients', '1')
      await admin.call('CLIENT', 'KILL', 'SKIPME', 'yes')
      await vi.waitFor(() => expect(a.bus.listening).toBe(false), { timeout: 3_000, interval: 10 })
      await sleep(500)
      expect((await asAlice(b.instance, 'DELETE', `/${t2.id}`)).status).toBe(200)
      const served = await initialize(a.instance, t1.token, null)
      expect([served.status, served.ratelimit, served.ms < 2_000]).toEqual([400, null, true])
      expect((await initialize(a.instance, t1.token, opened.session!)).status).toBe(503)
      expect((await initialize(a.instance, t2.token, null)).status).toBe(401)
      await admin.config('SET', 'maxclients', '10000')
      await vi.waitFor(() => expect([a.bus.listening, b.bus.listening, a.client.status, b.client.status]).toEqual([true, true, 'ready', 'ready']), { timeout: 10_000, interval: 10 })
      expect((await initialize(a.instance, t1.token, null)).ratelimit).toMatch(/r=\d+/)
      expect((await initialize(a.instance, t1.token, opened.session!)).status).toBe(200)
      expect((await initialize(a.instance, t2.token, null)).status).toBe(401)
      expect((await initialize(a.instance, t1.token, null)).status).toBe(400)
      expect((await asAlice(b.instance, 'DELETE', `/${t1.id}`)).status).toBe(200)
      expect((await initialize(a.instance, t1.token, null)).status).toBe(401)
    } finally {
      await admin.config('SET', 'maxclients', '10000').catch(() => {})
      admin.disconnect()
      await close()
    }
  })
})

describe.runIf(missing === undefined)("B's command connection back after its subscriber (each reconnects on its own backoff)", () => {
  it('a token revoked on B while its command connection is away is refused on A as soon as that connection is ready again, not at the next round of the backoff (regression: up to seconds later)', { timeout: 30_000 }, async () => {
    if (postgres === undefined || redisServer === undefined) throw new Error(missing)
    const pool = documentedPool(postgres.url, [])
    await createPostgresTokenStore({ pool }).migrate()
    // B's command connection reconnects 3.05 s after it is lost, as ioredis' backoff has it
    // after an outage (up to 2 s on ioredis 5, 5 s on 6); its subscriber stays up. The token
    // service's rounds come 0.5 to 1 s after the failure, then 1 to 2 s after that one, then 2
    // to 4 s: the second is before B is ready again, the third at least 0.4 s after.
    const clientA = new Redis(redisServer.url, { maxRetriesPerRequest: 1 })
    const clientB = new Redis(redisServer.url, { maxRetriesPerRequest: 1, retryStrategy: () => 3_050 })
    const admin = new Redis(redisServer.url)
    for (const client of [clientA, clientB, admin]) client.on('error', () => {})
    const busA = createRedisInvalidationBus({ client: clientA, prefix: 'restarts-lag:' })
    const busB = createRedisInvalidationBus({ client: clientB, prefix: 'restarts-lag:' })
    await Promise.all([busA.ready(5_000), busB.ready(5_000)])
    const a = await startInstance({ pool, invalidations: busA, cacheTtlMs: 60_000 })
    const b = await startInstance({ pool, invalidations: busB, cacheTtlMs: 60_000 })
    try {
      const made = await createToken(a)
      expect((await initialize(a, made.token, null)).status).toBe(400) // cached on A
      await admin.call('CLIENT', 'KILL', 'ID', String(await clientB.call('CLIENT', 'ID')))
      await vi.waitFor(() => expect(clientB.status).not.toBe('ready'), { timeout: 2_000, interval: 1 })
      expect((await asAlice(b, 'DELETE', `/${made.id}`)).status).toBe(200)
      expect(busB.listening).toBe(true)
      await vi.waitFor(() => expect(clientB.status).toBe('ready'), { timeout: 6_000, interval: 1 })
      const ready = performance.now()
      await vi.waitFor(async () => expect((await initialize(a, made.token, null)).status).toBe(401), { timeout: 6_000, interval: 10 })
      // Under 1.5 s however loaded the machine: the next round came 1.9 to 2.7 s after it.
      expect(performance.now() - ready).toBeLessThan(1_500)
    } finally {
      await a.close()
      await b.close()
      await Promise.all([busA.close(), busB.close()])
      for (const client of [clientA, clientB, admin]) client.disconnect()
      await pool.end()
    }
  })
})
