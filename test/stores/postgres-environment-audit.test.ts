/**
 * The PostgreSQL token store under session settings a platform's database may have (per
 * connection, through the pool's `options`, not the server's configuration): another
 * `TimeZone`, `DateStyle`, `IntervalStyle`, `standard_conforming_strings`, a `search_path`
 * whose first schema holds tables of the store's names, and `default_transaction_isolation`
 * at `serializable` with instances racing on one token.
 */
import { type TokenService, type TokenServiceOptions, createMemoryAppStore, createMemoryInvalidationBus, createTokenService } from 'mcp-dispatch'
import { type PostgresTokenStore, createPostgresTokenStore } from 'mcp-dispatch/postgres'
import { afterAll, describe, expect, it } from 'vitest'
import { postgresUnavailable, randomSchemaName, usePostgres } from '../helpers/postgres.js'
import { describeTokenStoreConformance, makeTokenRecord } from './conformance.js'

const unavailable = await postgresUnavailable()

const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])
const service = (store: PostgresTokenStore, options: Partial<TokenServiceOptions> = {}): TokenService =>
  createTokenService({ store, apps, canUseServer: () => true, ...options })
const create = (tokens: TokenService, userId = 'u_env', name = 'env') => tokens.create({ userId, name, servers: ['app_1'], expiresInDays: 7 })

describe.skipIf(unavailable !== undefined)('PostgreSQL token store under a platform\'s session settings', () => {
  const postgres = usePostgres()
  const decoy = randomSchemaName()
  const odd = `-c TimeZone=Asia/Kathmandu -c DateStyle=SQL,DMY -c IntervalStyle=sql_standard -c standard_conforming_strings=off -c extra_float_digits=-15 -c search_path=${decoy},public`
  let oddPool: ReturnType<typeof postgres.openPool> | undefined
  const pool = async () => {
    if (oddPool) return oddPool
    // A schema first on the search_path, holding tables of the store's names made for something else.
    await postgres.pool.query(`CREATE SCHEMA "${decoy}"`)
    await postgres.pool.query(`CREATE TABLE "${decoy}".mcp_dispatch_api_tokens (id int)`)
    await postgres.pool.query(`CREATE TABLE "${decoy}".mcp_dispatch_api_tokens_resets (x int)`)
    return (oddPool = postgres.openPool({ max: 3, options: odd }))
  }
  const teardown = (store: unknown) => postgres.drop(store as PostgresTokenStore)
  afterAll(async () => {
    if (oddPool) await postgres.pool.query(`DROP SCHEMA IF EXISTS "${decoy}" CASCADE`)
  })

  describeTokenStoreConformance('postgres, odd session settings', async () => postgres.tokenStore({ pool: await pool() }), {
    teardown: async (store) => {
      await teardown(store)
    },
  })

  it('times round-trip to the millisecond, and an expiry decision is the same, whatever the session\'s TimeZone', async () => {
    const store = await postgres.tokenStore({ pool: await pool() })
    const { rows } = await (await pool()).query('SHOW TimeZone')
    expect(rows[0].TimeZone ?? rows[0].timezone).toBe('Asia/Kathmandu')
    const now = Date.UTC(2026, 2, 29, 1, 30, 0, 123) // a DST change in Europe, a +05:45 zone
    const record = makeTokenRecord({ createdAt: now, expiresAt: now + 1, lastUsedAt: now - 1 })
    await store.insert(record)
    expect(await store.get(record.id)).toEqual(record)
    expect(await store.countActiveByUser!(record.userId, now)).toBe(1)
    expect(await store.countActiveByUser!(record.userId, now + 1)).toBe(0)
  })
})

describe.skipIf(unavailable !== undefined)('PostgreSQL token store with default_transaction_isolation = serializable', () => {
  const postgres = usePostgres()
  const serializable = '-c default_transaction_isolation=serializable'

  it('two instances, one rotating and one revoking the token at once: the revocation lands and holds, a rotation that lost is told 409 (or 401), as under READ COMMITTED: never a 503 for a serialization failure', async () => {
    const base = await postgres.tokenStore({ pool: postgres.openPool({ max: 2, options: serializable }) })
    const invalidations = createMemoryInvalidationBus()
    const errors: string[] = []
    const options = { cacheTtlMs: 600_000, invalidations, onError: (_e: unknown, context: string) => errors.push(context) }
    const a = service(base, options)
    const b = service(createPostgresTokenStore({ pool: postgres.openPool({ max: 2, options: serializable }), schema: base.schema }), options)
    const outcomes: string[] = []
    try {
      for (let round = 0; round < 10; round++) {
        const made = await create(a)
        const [rotated, revoked] = await Promise.allSettled([a.rotate(made.id, { kind: 'token', token: made.token }), b.revoke('u_env', made.id)])
        outcomes.push(`${rotated.status === 'fulfilled' ? 200 : (rotated.reason as { status: number }).status}/${revoked.status === 'fulfilled' ? 200 : (revoked.reason as { status: number }).status}`)
        expect(revoked, `round ${round}`).toMatchObject({ status: 'fulfilled', value: { status: 'revoked' } })
        const secrets = [made.token]
        if (rotated.status === 'fulfilled') secrets.push(rotated.value.token)
        else expect([401, 409], `round ${round}`).toContain((rotated.reason as { status: number }).status)
        for (const tokens of [a, b]) for (const secret of secrets) expect((await tokens.authenticate(secret)).ok, `round ${round}`).toBe(false)
      }
    } finally {
      await Promise.all([a.close(), b.close()])
    }
    expect({ outcomes: outcomes.filter((o) => o.includes('503')), errors }).toEqual({ outcomes: [], errors: [] })
  })

  it('a revocation racing the last_used_at flush of another instance lands (the flush too)', async () => {
    const base = await postgres.tokenStore({ pool: postgres.openPool({ max: 2, options: serializable }) })
    const errors: string[] = []
    const options = { onError: (_e: unknown, context: string) => errors.push(context) }
    const a = service(base, options)
    const b = service(createPostgresTokenStore({ pool: postgres.openPool({ max: 2, options: serializable }), schema: base.schema }), options)
    try {
      for (let round = 0; round < 10; round++) {
        const made = await create(a)
        const at = Date.now()
        // The flush as the service sends it (touch), and the owner's revocation at once.
        const [touched, revoked] = await Promise.allSettled([base.touch(new Map([[made.id, at]])), b.revoke('u_env', made.id)])
        expect({ round, touched: touched.status, revoked: revoked.status === 'fulfilled' ? revoked.value.status : String(revoked.reason) }).toEqual({ round, touched: 'fulfilled', revoked: 'revoked' })
      }
    } finally {
      await Promise.all([a.close(), b.close()])
    }
    expect(errors).toEqual([])
  })

  it('rotations racing on one token by its secret: exactly one wins; the others 409 or 401 (the secret moved on), as under READ COMMITTED, never 503', async () => {
    const base = await postgres.tokenStore({ pool: postgres.openPool({ max: 4, options: serializable }) })
    const a = service(base)
    const made = await create(a)
    const results = await Promise.allSettled(Array.from({ length: 4 }, () => a.rotate(made.id, { kind: 'token', token: made.token })))
    const statuses = results.map((r) => (r.status === 'fulfilled' ? 200 : (r.reason as { status: number }).status))
    expect(statuses.filter((s) => s === 200)).toHaveLength(1)
    expect(statuses.filter((s) => s !== 200 && s !== 401 && s !== 409)).toEqual([])
    await a.close()
  })

  it('a password reset while another instance creates tokens: the reset lands, and every token created before it (or in its millisecond) is revoked, whatever its create answered (201 or 409, never 503)', async () => {
    const base = await postgres.tokenStore({ pool: postgres.openPool({ max: 4, options: serializable }) })
    const a = service(createPostgresTokenStore({ pool: postgres.openPool({ max: 4, options: serializable }), schema: base.schema }))
    const b = service(base)
    let resetError: unknown
    try {
      const creations = Promise.allSettled(
        Array.from({ length: 24 }, (_, i) => new Promise((resolve) => setTimeout(resolve, i * 3)).then(() => create(a, 'u_reset', `racing ${i}`))),
      )
      await new Promise((resolve) => setTimeout(resolve, 30))
      await b.revokeAllForUser('u_reset').catch((error: unknown) => (resetError = error))
      const outcomes = await creations
      expect(resetError, String((resetError as { cause?: { code?: string; message?: string } } | undefined)?.cause?.code) + " " + String((resetError as { cause?: Error } | undefined)?.cause?.message)).toBeUndefined()
      const { rows } = await postgres.pool.query(`SELECT reset_at FROM ${base.table.replace(/"$/, '_resets"')} WHERE user_id = 'u_reset'`)
      const resetAt = Number(rows[0].reset_at)
      for (const outcome of outcomes) {
        if (outcome.status === 'rejected') expect([409]).toContain((outcome.reason as { status: number }).status)
        // One created in the instant after the reset's time, before its statement ran (sent again
        // after a serialization failure, or waiting for a connection), is revoked too: the safe
        // side, as under READ COMMITTED.
        else if (Date.parse(outcome.value.created_at) <= resetAt) expect((await a.authenticate(outcome.value.token)).ok).toBe(false)
      }
    } finally {
      await Promise.all([a.close(), b.close()])
    }
  })
})
