/**
 * The API-token lifecycle across two instances sharing a real PostgreSQL token store, each with
 * the token cache on and its own Redis invalidation bus (one shared prefix): pepper rotation,
 * expiry at the exact millisecond, a password reset racing creations and rotations on the other
 * instance, `maxActiveTokensPerUser` under concurrent creations from both, `last_used_at` from
 * both, and revocation with the bus up, down and silent.
 */
import { randomBytes } from 'node:crypto'
import { Redis } from 'ioredis'
import {
  type TokenService,
  type TokenServiceOptions,
  createMemoryAppStore,
  createTokenService,
  generateApiToken,
  hashApiToken,
} from 'mcp-dispatch'
import { type PostgresTokenStore, createPostgresTokenStore } from 'mcp-dispatch/postgres'
import { type RedisInvalidationBus, createRedisInvalidationBus } from 'mcp-dispatch/redis'
import { afterAll, describe, expect, it } from 'vitest'
import { midMinute } from '../helpers/clock.js'
import { postgresUnavailable, usePostgres } from '../helpers/postgres.js'
import { REDIS_URL, redisAvailable, scanKeys } from '../helpers/redis.js'

const unavailable = await postgresUnavailable()
const DAY_MS = 86_400_000
const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

describe.skipIf(unavailable !== undefined || !redisAvailable)('token lifecycle across two instances (PostgreSQL, cache, Redis bus)', () => {
  const postgres = usePostgres()
  const clients: Redis[] = []
  const prefixes: string[] = []
  const closers: Array<() => Promise<unknown>> = []
  afterAll(async () => {
    for (const close of closers.splice(0).reverse()) await close().catch(() => {})
    const cleaner = new Redis(REDIS_URL)
    for (const prefix of prefixes) {
      const keys = await scanKeys(cleaner, `${prefix}*`)
      if (keys.length > 0) await cleaner.del(...keys)
    }
    cleaner.disconnect()
    for (const client of clients) client.disconnect()
  })

  const newPrefix = () => {
    const prefix = `mcp-dispatch-test:tla-${randomBytes(6).toString('hex')}:`
    prefixes.push(prefix)
    return prefix
  }

  async function bus(prefix: string, onError: (e: unknown, c: string) => void, extra: { heartbeatMs?: number | false } = {}): Promise<RedisInvalidationBus> {
    const client = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 })
    client.on('error', () => {})
    clients.push(client)
    const invalidations = createRedisInvalidationBus({ client, prefix, onError, ...extra })
    closers.push(() => invalidations.close())
    await invalidations.ready(5_000)
    return invalidations
  }

  interface Pair {
    readonly storeA: PostgresTokenStore & { readonly schema: string }
    readonly storeB: PostgresTokenStore
    readonly prefix: string
    readonly errors: Array<{ instance: string; context: string; error: unknown }>
    instance(name: string, store: PostgresTokenStore, options?: Partial<TokenServiceOptions>, busOptions?: { heartbeatMs?: number | false; prefix?: string }): Promise<TokenService>
  }

  /** A shared schema, and a factory of instances on it (each its own pool and bus). */
  async function shared(): Promise<Pair> {
    const storeA = await postgres.tokenStore()
    const storeB = createPostgresTokenStore({ pool: postgres.openPool({ max: 4 }), schema: storeA.schema })
    const prefix = newPrefix()
    const errors: Pair['errors'] = []
    return {
      storeA,
      storeB,
      prefix,
      errors,
      async instance(name, store, options = {}, busOptions = {}) {
        const onError = (error: unknown, context: string) => errors.push({ instance: name, context, error })
        const invalidations = await bus(busOptions.prefix ?? prefix, onError, busOptions)
        const tokens = createTokenService({ store, apps, canUseServer: () => true, cacheTtlMs: 600_000, invalidations, onError, ...options })
        closers.push(() => tokens.close())
        return tokens
      },
    }
  }

  const create = (tokens: TokenService, userId: string, name = 'audit', expiresInDays: 7 | 30 | 90 = 7) =>
    tokens.create({ userId, name, servers: ['app_1'], expiresInDays })
  const reason = async (tokens: TokenService, token: string) => {
    const auth = await tokens.authenticate(token)
    return auth.ok ? 'ok' : auth.reason
  }

  describe('pepper rotation', () => {
    it('tokens stored under the old pepper keep working on both instances after the change, are not rewritten, move on rotation, and stop once the old pepper is dropped; no pepper in any error', async () => {
      const pair = await shared()
      const OLD = `old-pepper-${randomBytes(16).toString('hex')}`
      const NEW = `new-pepper-${randomBytes(16).toString('hex')}`
      const a1 = await pair.instance('a1', pair.storeA, { pepper: OLD })
      const b1 = await pair.instance('b1', pair.storeB, { pepper: OLD })
      const t1 = await create(a1, 'u_pepper', 'one')
      const t2 = await create(b1, 'u_pepper', 'two')
      const t3 = await create(a1, 'u_pepper', 'three')
      expect((await pair.storeA.get(t1.id))?.tokenHash).toBe(hashApiToken(t1.token, OLD))
      await Promise.all([a1.close(), b1.close()])

      // Second rollout: the new pepper current, the old one previous.
      const a2 = await pair.instance('a2', pair.storeA, { pepper: NEW, previousPeppers: [OLD] })
      const b2 = await pair.instance('b2', pair.storeB, { pepper: NEW, previousPeppers: [OLD] })
      for (const tokens of [a2, b2]) for (const t of [t1, t2, t3]) expect(await reason(tokens, t.token)).toBe('ok')
      // Twice: the second from each cache (under the stored hash).
      for (const tokens of [a2, b2]) for (const t of [t1, t2, t3]) expect(await reason(tokens, t.token)).toBe('ok')
      // Not rewritten (docs: nothing is rewritten on the way).
      expect((await pair.storeB.get(t1.id))?.tokenHash).toBe(hashApiToken(t1.token, OLD))

      // A rotation on A moves t1 to the new pepper; B, which cached it under the old hash, drops it.
      const rotated = await a2.rotate(t1.id, { kind: 'token', token: t1.token })
      expect((await pair.storeA.get(t1.id))?.tokenHash).toBe(hashApiToken(rotated.token, NEW))
      for (const tokens of [a2, b2]) {
        expect(await reason(tokens, t1.token)).toBe('unknown')
        expect(await reason(tokens, rotated.token)).toBe('ok')
      }
      // A revocation on B of a token cached on A under the old hash: refused on A at once.
      await b2.revoke('u_pepper', t2.id)
      for (const tokens of [a2, b2]) expect(await reason(tokens, t2.token)).toBe('revoked')
      // A session rotation on B of t3 (cached on both under the old hash).
      const r3 = await b2.rotate(t3.id, { kind: 'session', userId: 'u_pepper' })
      for (const tokens of [a2, b2]) {
        expect(await reason(tokens, t3.token)).toBe('unknown')
        expect(await reason(tokens, r3.token)).toBe('ok')
      }
      const t4 = await create(a2, 'u_pepper', 'four')
      // An instance of the first rollout still running (old pepper current, the new one previous)
      // beside them: each finds what the other stores.
      const mid = await pair.instance('mid', pair.storeB, { pepper: OLD, previousPeppers: [NEW] })
      expect(await reason(mid, t4.token)).toBe('ok')
      const r4 = await mid.rotate(t4.id, { kind: 'token', token: t4.token })
      expect((await pair.storeA.get(t4.id))?.tokenHash).toBe(hashApiToken(r4.token, OLD))
      for (const tokens of [a2, b2, mid]) {
        expect(await reason(tokens, t4.token)).toBe('unknown')
        expect(await reason(tokens, r4.token)).toBe('ok')
      }
      const r4b = await a2.rotate(t4.id, { kind: 'token', token: r4.token })
      await mid.close()
      await Promise.all([a2.close(), b2.close()])

      // The old pepper dropped: a token still stored under it stops working, as documented;
      // those under the new one work.
      const t5stored = await (async () => {
        const a = await pair.instance('a-old', pair.storeA, { pepper: OLD })
        const t = await create(a, 'u_pepper', 'five')
        await a.close()
        return t
      })()
      const a3 = await pair.instance('a3', pair.storeA, { pepper: NEW })
      const b3 = await pair.instance('b3', pair.storeB, { pepper: NEW })
      for (const tokens of [a3, b3]) {
        expect(await reason(tokens, t5stored.token)).toBe('unknown')
        expect(await reason(tokens, rotated.token)).toBe('ok')
        expect(await reason(tokens, r3.token)).toBe('ok')
        expect(await reason(tokens, r4b.token)).toBe('ok')
      }
      // The dashboard still lists t5 as active (documented): its owner rotates it by session.
      const listed = await b3.list('u_pepper')
      expect(listed.find((v) => v.id === t5stored.id)?.status).toBe('active')
      const r5 = await b3.rotate(t5stored.id, { kind: 'session', userId: 'u_pepper' })
      for (const tokens of [a3, b3]) expect(await reason(tokens, r5.token)).toBe('ok')

      // No pepper in a configuration error either.
      for (const bad of [{ pepper: NEW, previousPeppers: [NEW] }, { pepper: NEW, previousPeppers: [OLD, OLD] }, { pepper: NEW, previousPeppers: [''] }]) {
        let thrown: unknown
        try {
          createTokenService({ store: pair.storeA, apps, canUseServer: () => true, ...bad })
        } catch (error) {
          thrown = error
        }
        expect(thrown).toBeInstanceOf(Error)
        const text = `${String(thrown)} ${JSON.stringify(thrown)} ${(thrown as Error).stack ?? ''}`
        expect(text).not.toContain(NEW)
        expect(text).not.toContain(OLD)
      }
      for (const { error, context } of pair.errors) {
        const text = `${context} ${String(error)} ${(error as Error | undefined)?.stack ?? ''}`
        expect(text).not.toContain(NEW)
        expect(text).not.toContain(OLD)
      }
    })

    it('a live token still stored under the old pepper is not held up by made-up tokens from its address (unknownTokenBudget), as a live token under the current pepper is not, cached or not', async () => {
      const pair = await shared()
      const OLD = `old-pepper-${randomBytes(16).toString('hex')}`
      const NEW = `new-pepper-${randomBytes(16).toString('hex')}`
      const before = await pair.instance('before', pair.storeA, { pepper: OLD })
      const olds = [await create(before, 'u_budget', 'old 1'), await create(before, 'u_budget', 'old 2')]
      await before.close()
      const unknownTokenBudget = { limit: 3, windowType: 'minute' as const }
      // The budget's window on a clock held mid-minute: on the wall clock a minute turning after
      // the second or third made-up token would give a fresh budget, and none be refused.
      const now = midMinute()
      for (const cacheTtlMs of [600_000, 0]) {
        const old = olds.shift()!
        const a = await pair.instance(`a${cacheTtlMs}`, pair.storeA, { pepper: NEW, previousPeppers: [OLD], unknownTokenBudget, cacheTtlMs, now })
        const b = await pair.instance(`b${cacheTtlMs}`, pair.storeB, { pepper: NEW, previousPeppers: [OLD], unknownTokenBudget, cacheTtlMs, now })
        const current = await create(a, 'u_budget', `current ${cacheTtlMs}`)
        const address = '203.0.113.9'
        for (const tokens of [a, b]) {
          // Both seen live from this address first.
          expect((await tokens.authenticate(old.token, address)).ok).toBe(true)
          expect((await tokens.authenticate(current.token, address)).ok).toBe(true)
          // Someone at the same address spends its budget on made-up tokens.
          let refused = 0
          for (let i = 0; i < 5; i++) {
            try {
              await tokens.authenticate(generateApiToken(), address)
            } catch (error) {
              expect(error).toMatchObject({ status: 429 })
              refused++
            }
          }
          expect(refused).toBeGreaterThan(0)
          expect((await tokens.authenticate(current.token, address)).ok).toBe(true)
          let auth: unknown
          try {
            auth = (await tokens.authenticate(old.token, address)).ok
          } catch (error) {
            auth = error
          }
          expect(auth, `cacheTtlMs ${cacheTtlMs}`).toBe(true)
        }
        // Revoked on one instance: refused on both at once, and again (not from a stale record).
        await b.revoke('u_budget', old.id)
        for (const tokens of [a, b, a, b]) expect(await reason(tokens, old.token)).toBe('revoked')
        await Promise.all([a.close(), b.close()])
      }
    })
  })

  describe('expiry at the exact millisecond (injected clock)', () => {
    it('validation, list, get, rotate, revoke and the count agree at expires_at - 1, expires_at and + 1, on both instances, with the record cached', async () => {
      const pair = await shared()
      let clock = Date.UTC(2026, 0, 1)
      const now = () => clock
      const a = await pair.instance('a', pair.storeA, { now, maxActiveTokensPerUser: 2 })
      const b = await pair.instance('b', pair.storeB, { now, maxActiveTokensPerUser: 2 })
      const created = await create(a, 'u_exp')
      const expiresAt = Date.parse(created.expires_at)
      expect(expiresAt).toBe(clock + 7 * DAY_MS)
      clock += DAY_MS
      const spare = await create(b, 'u_exp', 'spare')
      // Cached on both.
      for (const tokens of [a, b]) expect(await reason(tokens, created.token)).toBe('ok')

      clock = expiresAt - 1
      for (const tokens of [a, b]) {
        expect(await reason(tokens, created.token)).toBe('ok')
        expect((await tokens.get('u_exp', created.id)).status).toBe('active')
      }
      await expect(a.create({ userId: 'u_exp', name: 'third', servers: ['app_1'], expiresInDays: 7 })).rejects.toMatchObject({ status: 409 })

      clock = expiresAt
      for (const tokens of [a, b]) {
        expect(await reason(tokens, created.token)).toBe('expired')
        expect((await tokens.get('u_exp', created.id)).status).toBe('expired')
        expect((await tokens.list('u_exp')).find((v) => v.id === created.id)?.status).toBe('expired')
      }
      await expect(b.rotate(created.id, { kind: 'session', userId: 'u_exp' })).rejects.toMatchObject({ status: 409, name: 'TokenInactiveError' })
      await expect(a.rotate(created.id, { kind: 'token', token: created.token })).rejects.toMatchObject({ status: 401 })
      await expect(b.update('u_exp', created.id, { name: 'renamed' })).rejects.toMatchObject({ status: 409 })
      expect(await b.revoke('u_exp', created.id)).toMatchObject({ status: 'expired' })
      expect((await pair.storeA.get(created.id))?.revokedAt).toBeNull()
      // Not counted: a new token fits under the bound of 2.
      const third = await a.create({ userId: 'u_exp', name: 'third', servers: ['app_1'], expiresInDays: 7 })
      expect(third.id).toBeTruthy()
      clock = expiresAt + 1
      for (const tokens of [a, b]) expect(await reason(tokens, created.token)).toBe('expired')
      // The reset leaves it expired.
      expect(await a.revokeAllForUser('u_exp')).toBe(2)
      expect((await pair.storeB.get(created.id))?.revokedAt).toBeNull()
      for (const tokens of [a, b]) expect(await reason(tokens, spare.token)).toBe('revoked')
      expect(pair.errors).toEqual([])
    })

    it('revoke at expires_at - 1 revokes; a rotation by the token itself at expires_at - 1 keeps the expiry', async () => {
      const pair = await shared()
      let clock = Date.UTC(2026, 1, 1)
      const now = () => clock
      const a = await pair.instance('a', pair.storeA, { now })
      const b = await pair.instance('b', pair.storeB, { now })
      const one = await create(a, 'u_exp2', 'one')
      const two = await create(a, 'u_exp2', 'two')
      for (const tokens of [a, b]) expect(await reason(tokens, one.token)).toBe('ok')
      clock = Date.parse(one.expires_at) - 1
      expect(await b.revoke('u_exp2', one.id)).toMatchObject({ status: 'revoked' })
      for (const tokens of [a, b]) expect(await reason(tokens, one.token)).toBe('revoked')
      const rotated = await b.rotate(two.id, { kind: 'token', token: two.token })
      expect(rotated.expires_at).toBe(two.expires_at)
      for (const tokens of [a, b]) expect(await reason(tokens, rotated.token)).toBe('ok')
      clock++
      for (const tokens of [a, b]) expect(await reason(tokens, rotated.token)).toBe('expired')
    })
  })

  describe('rotation landing at the expiry', () => {
    it('a rotation read at expires_at - 1 whose write lands at expires_at hands out no dead secret: 409 token_inactive to the owner, 401 to the token itself; neither secret works on either instance', async () => {
      const pair = await shared()
      let clock = Date.UTC(2026, 4, 1)
      const now = () => clock
      let landAt: number | undefined
      // The clock reaches the expiry while the rotation is on its way to the store.
      const late: PostgresTokenStore = {
        ...pair.storeB,
        rotate(id, next, expected) {
          if (landAt !== undefined) clock = landAt
          return pair.storeB.rotate(id, next, expected)
        },
      }
      const a = await pair.instance('a', pair.storeA, { now })
      const b = await pair.instance('b', late, { now })
      for (const by of ['session', 'token'] as const) {
        clock = Date.UTC(2026, 4, 1)
        landAt = undefined
        const t = await create(a, 'u_rot_exp', by)
        for (const tokens of [a, b]) expect(await reason(tokens, t.token)).toBe('ok')
        const expiresAt = Date.parse(t.expires_at)
        clock = expiresAt - 1
        landAt = expiresAt
        const answer = await (by === 'session' ? b.rotate(t.id, { kind: 'session', userId: 'u_rot_exp' }) : b.rotate(t.id, { kind: 'token', token: t.token })).then(
          (value) => value,
          (error: unknown) => error,
        )
        expect(answer, by).toMatchObject(by === 'session' ? { status: 409, name: 'TokenInactiveError' } : { status: 401 })
        // The old secret was replaced (the write landed): unknown now, never accepted.
        for (const tokens of [a, b]) expect(await reason(tokens, t.token)).not.toBe('ok')
        expect((await a.get('u_rot_exp', t.id)).status).toBe('expired')
      }
    })
  })

  describe('password reset racing the other instance', () => {
    it('no token created (answered) before the reset, nor rotated meanwhile, survives on either instance; one created during it is revoked or began after it', async () => {
      const pair = await shared()
      const a = await pair.instance('a', pair.storeA)
      const b = await pair.instance('b', pair.storeB)
      for (let round = 0; round < 3; round++) {
        const user = `u_reset_${round}`
        const before = await Promise.all(Array.from({ length: 8 }, (_, i) => create(i % 2 ? a : b, user, `before ${i}`)))
        for (const tokens of [a, b]) for (const t of before) expect(await reason(tokens, t.token)).toBe('ok')
        // B rotates and creates while A resets.
        const rotations = before.slice(0, 4).map((t, i) =>
          i % 2 ? b.rotate(t.id, { kind: 'session', userId: user }) : b.rotate(t.id, { kind: 'token', token: t.token }),
        )
        const during = Array.from({ length: 8 }, (_, i) => create(b, user, `during ${i}`))
        const reset = a.revokeAllForUser(user)
        const [rotated, made] = await Promise.all([Promise.allSettled(rotations), Promise.allSettled(during), reset])
        const resetAt = Number(
          (await postgres.pool.query(`SELECT reset_at FROM "${pair.storeA.schema}"."mcp_dispatch_api_tokens_resets" WHERE user_id = $1`, [user])).rows[0].reset_at,
        )
        for (const tokens of [a, b]) {
          for (const t of before) expect(await reason(tokens, t.token), t.name).not.toBe('ok')
          for (const r of rotated) if (r.status === 'fulfilled') expect(await reason(tokens, r.value.token)).not.toBe('ok')
          for (const m of made) {
            if (m.status === 'rejected') {
              expect(m.reason).toMatchObject({ status: 409 })
              continue
            }
            const created = Date.parse(m.value.created_at)
            const auth = await reason(tokens, m.value.token)
            if (created <= resetAt) expect(auth, `${m.value.name} created ${created} reset ${resetAt}`).not.toBe('ok')
          }
        }
        for (const v of await b.list(user)) if (v.status === 'active') expect(Date.parse(v.created_at)).toBeGreaterThan(resetAt)
      }
    })
  })

  describe('maxActiveTokensPerUser', () => {
    it('concurrent creations of one user on both instances never leave more active tokens than the bound', async () => {
      const pair = await shared()
      const a = await pair.instance('a', pair.storeA, { maxActiveTokensPerUser: 3 })
      const b = await pair.instance('b', pair.storeB, { maxActiveTokensPerUser: 3 })
      for (let round = 0; round < 5; round++) {
        const user = `u_cap_${round}`
        const results = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => create(i % 2 ? a : b, user, `cap ${i}`)))
        const listed = await a.list(user)
        const active = listed.filter((v) => v.status === 'active')
        expect(active.length, `round ${round}`).toBeLessThanOrEqual(3)
        expect(active.length, `round ${round}`).toBeGreaterThan(0)
        for (const r of results) if (r.status === 'rejected') expect(r.reason).toMatchObject({ status: 409, name: 'ConflictError' })
        // Every secret handed out works on both instances; the tokens refused after their insert are revoked.
        const kept = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []))
        expect(kept.map((k) => k.id).sort()).toEqual(active.map((v) => v.id).sort())
        for (const tokens of [a, b]) for (const k of kept) expect(await reason(tokens, k.token)).toBe('ok')
        expect(listed.filter((v) => v.status !== 'active').every((v) => v.status === 'revoked')).toBe(true)
      }
    })
  })

  describe('last_used_at', () => {
    it('uses on both instances: close() of both writes everything, and an older flush landing late never moves it back', async () => {
      const pair = await shared()
      let clock = Date.UTC(2026, 2, 1)
      const now = () => clock
      const a = await pair.instance('a', pair.storeA, { now, lastUsedFlushMs: 3_600_000 })
      const b = await pair.instance('b', pair.storeB, { now, lastUsedFlushMs: 3_600_000 })
      const one = await create(a, 'u_used', 'one')
      const two = await create(a, 'u_used', 'two')
      clock += 1_000
      await a.authenticate(one.token) // A: one at +1000
      clock += 1_000
      await b.authenticate(one.token) // B: one at +2000
      await b.authenticate(two.token)
      clock += 1_000
      await a.authenticate(two.token) // A: two at +3000
      const t0 = Date.UTC(2026, 2, 1)
      // B's newer use of one lands first, then A's older one.
      await b.flush()
      await a.flush()
      expect((await pair.storeA.get(one.id))?.lastUsedAt).toBe(t0 + 2_000)
      expect((await pair.storeA.get(two.id))?.lastUsedAt).toBe(t0 + 3_000)
      // Pending uses at close: written by close() of each.
      clock += 1_000
      await a.authenticate(one.token)
      await b.authenticate(two.token)
      expect((await a.get('u_used', one.id)).last_used_at).toBe(new Date(t0 + 4_000).toISOString())
      await Promise.all([a.close(), b.close()])
      expect((await pair.storeB.get(one.id))?.lastUsedAt).toBe(t0 + 4_000)
      expect((await pair.storeB.get(two.id))?.lastUsedAt).toBe(t0 + 4_000)
      expect(pair.errors).toEqual([])
    })
  })

  describe('revocation seen by the other instance', () => {
    it('bus up: at once; bus silent (a bus that hears nothing, no heartbeat to notice): within cacheTtlMs, never at it', async () => {
      const pair = await shared()
      let clock = Date.UTC(2026, 3, 1)
      const now = () => clock
      const a = await pair.instance('a', pair.storeA, { now, cacheTtlMs: 60_000 })
      const b = await pair.instance('b', pair.storeB, { now, cacheTtlMs: 60_000 })
      // C hears nothing of A and B (a bus of another prefix), with no heartbeat to notice.
      const c = await pair.instance('c', pair.storeB, { now, cacheTtlMs: 60_000 }, { prefix: newPrefix(), heartbeatMs: false })
      const t = await create(a, 'u_rev', 'one')
      for (const tokens of [a, b, c]) expect(await reason(tokens, t.token)).toBe('ok')
      clock += 1_000
      await a.revoke('u_rev', t.id)
      expect(await reason(b, t.token)).toBe('revoked')
      expect(await reason(c, t.token)).toBe('ok') // cached, allowed within the TTL
      clock += 60_000 - 1_000 - 1
      expect(await reason(c, t.token)).toBe('ok')
      clock += 1
      expect(await reason(c, t.token)).toBe('revoked')
    })

    it('bus down (B\'s subscriber connection lost): B serves nothing from its cache, so a revocation on A is refused on B at once; once B hears again, what it cached before is gone', async () => {
      const pair = await shared()
      const a = await pair.instance('a', pair.storeA)
      const onError = (error: unknown, context: string) => pair.errors.push({ instance: 'b', context, error })
      const client = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 })
      client.on('error', () => {})
      clients.push(client)
      const subscriber = new Redis(REDIS_URL, { retryStrategy: () => null })
      subscriber.on('error', () => {})
      clients.push(subscriber)
      const invalidations = createRedisInvalidationBus({ client, subscriber, prefix: pair.prefix, onError })
      closers.push(() => invalidations.close())
      await invalidations.ready(5_000)
      const b = createTokenService({ store: pair.storeB, apps, canUseServer: () => true, cacheTtlMs: 600_000, invalidations, onError })
      closers.push(() => b.close())
      const t = await create(a, 'u_down', 'one')
      const u = await create(a, 'u_down', 'two')
      for (const tokens of [a, b]) for (const x of [t, u]) expect(await reason(tokens, x.token)).toBe('ok')
      subscriber.disconnect()
      await expect.poll(() => invalidations.listening, { timeout: 2_000, interval: 10 }).toBe(false)
      await a.revoke('u_down', t.id)
      expect(await reason(b, t.token)).toBe('revoked')
      expect(await reason(b, u.token)).toBe('ok')
      // Revoked while B was deaf; B hears again: its cache held u before, and must not serve it now.
      await a.revoke('u_down', u.id)
      await subscriber.connect()
      await expect.poll(() => invalidations.listening, { timeout: 5_000, interval: 10 }).toBe(true)
      expect(await reason(b, u.token)).toBe('revoked')
    })

    it('a lookup in flight on B when the revocation is reported does not put the active record back in B\'s cache', async () => {
      const pair = await shared()
      let hold: Promise<void> | undefined
      let reached!: () => void
      const arrived = new Promise<void>((resolve) => (reached = resolve))
      const slowB: PostgresTokenStore = {
        ...pair.storeB,
        async findByHash(hash) {
          const record = await pair.storeB.findByHash(hash)
          if (hold) {
            reached()
            await hold
          }
          return record
        },
      }
      const a = await pair.instance('a', pair.storeA)
      const b = await pair.instance('b', slowB)
      const t = await create(a, 'u_inflight', 'one')
      let release!: () => void
      hold = new Promise<void>((resolve) => (release = resolve))
      const pending = b.authenticate(t.token)
      await arrived
      await a.revoke('u_inflight', t.id)
      // The message reaches B (its bus delivers it) while the read of the active row is held.
      await sleep(200)
      hold = undefined
      release()
      expect((await pending).ok).toBe(true) // read before the revocation: answered as read
      expect(await reason(b, t.token)).toBe('revoked')
    })
  })
})
