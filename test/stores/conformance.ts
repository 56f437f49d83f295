/**
 * The shared store conformance suite (STYLE.md: "one shared test suite that every store
 * implementation must pass"). Every store implementation (memory, Redis, PostgreSQL) runs
 * these functions from its own test file:
 *
 * ```ts
 * describeTokenStoreConformance('redis', async () => createRedisTokenStore({ client }))
 * describeSessionStoreConformance('redis', ({ now }) => createRedisSessionStore({ client, now }))
 * ```
 *
 * Factories get a fresh {@link TestClock}; stores whose expiry depends on time must read it
 * (`now()`), so expiry is tested by moving the clock, never by sleeping. A store that cannot
 * take an injected clock passes `{ injectableClock: false }` and skips those cases.
 *
 * Every factory call must return a store with no data in it (a fresh instance, or a fresh
 * key prefix / schema), and `teardown` releases whatever the factory opened.
 * @module
 */
import { randomUUID } from 'node:crypto'
import { afterEach, describe, expect, it } from 'vitest'
// From the package's public name, so this file runs as it is in a project of your own.
import {
  DeployRefusedError,
  NotFoundError,
  hashApiToken,
  type ApiTokenRecord,
  type AppRecord,
  type AppStore,
  type CacheStore,
  type InvalidationBus,
  type InvalidationMessage,
  type MaybePromise,
  type RateLimitStore,
  type SessionPin,
  type SessionStore,
  type SubscriptionStore,
  type TokenStore,
} from 'mcp-dispatch'

/**
 * A token store in front of `inner` that counts `findByHash` calls: a lookup that does not
 * happen was served from a token service's cache.
 */
export function countingTokenStore(inner: TokenStore): { store: TokenStore; lookups: () => number } {
  let lookups = 0
  const store: TokenStore = {
    ...inner,
    findByHash(hash) {
      lookups++
      return inner.findByHash(hash)
    },
  }
  return { store, lookups: () => lookups }
}

/** A clock the test moves by hand. Epoch milliseconds. */
export interface TestClock {
  readonly now: () => number
  advance(ms: number): void
  set(ms: number): void
}

/** Starts a {@link TestClock} at a realistic epoch time (2023-11-14T22:13:20Z by default). */
export function createTestClock(start = 1_700_000_000_000): TestClock {
  let current = start
  return {
    now: () => current,
    advance(ms) {
      current += ms
    },
    set(ms) {
      current = ms
    },
  }
}

/** What a factory receives. */
export interface StoreFactoryContext {
  readonly clock: TestClock
  /** Shortcut for `clock.now`. */
  readonly now: () => number
}

/** Hooks and capabilities of a store under test. */
export interface ConformanceOptions<S> {
  /** Releases what the factory opened (connections, keys, tables). */
  teardown?: (store: S) => MaybePromise<void>
  /** `false` when expiry follows the real clock: the cases that move the clock are skipped. Default `true`. */
  injectableClock?: boolean
}

function harness<S>(factory: (context: StoreFactoryContext) => MaybePromise<S>, options: ConformanceOptions<S>) {
  const opened: S[] = []
  afterEach(async () => {
    for (const store of opened.splice(0)) await options.teardown?.(store)
  })
  return async (clock = createTestClock()) => {
    const store = await factory({ clock, now: clock.now })
    opened.push(store)
    return { store, clock }
  }
}

/** Tries to change a record the store gave out; the store's copy must not change. */
function tamper(record: ApiTokenRecord): void {
  const loose = record as unknown as Record<string, unknown>
  for (const change of [
    () => (loose.name = 'tampered'),
    () => (loose.revokedAt = 1),
    () => (record.servers as string[]).push('tampered'),
    () => (record.allowedIps as string[] | null)?.push('10.9.9.9'),
  ]) {
    try {
      change()
    } catch {
      // frozen: fine
    }
  }
}

// --- Tokens ------------------------------------------------------------------------------

const DAY = 86_400_000

/** A token record with unique id and hash; fields can be overridden. */
export function makeTokenRecord(overrides: Partial<ApiTokenRecord> = {}): ApiTokenRecord {
  const secret = `svc_${randomUUID()}`
  return {
    id: randomUUID(),
    userId: 'user_1',
    name: 'CI token',
    tokenHash: hashApiToken(secret),
    displayPrefix: secret.slice(0, 12),
    servers: ['app_1', 'app_2'],
    allowedIps: ['10.0.0.0/8'],
    expiresAt: 1_700_000_000_000 + 30 * DAY,
    createdAt: 1_700_000_000_000,
    lastUsedAt: null,
    revokedAt: null,
    ...overrides,
  }
}

function newSecretHash() {
  const secret = `svc_${randomUUID()}`
  return { tokenHash: hashApiToken(secret), displayPrefix: secret.slice(0, 12) }
}

/**
 * The {@link TokenStore} contract: CRUD by id and hash, atomic rotate with compare-and-swap,
 * idempotent revoke, revoke-all, batched touch.
 */
export function describeTokenStoreConformance(
  name: string,
  factory: (context: StoreFactoryContext) => MaybePromise<TokenStore>,
  options: ConformanceOptions<TokenStore> = {},
): void {
  describe(`TokenStore conformance: ${name}`, () => {
    const open = harness(factory, options)

    describe('insert and read', () => {
      it('finds an inserted record by id, by hash and by user', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        expect(await store.get(record.id)).toEqual(record)
        expect(await store.findByHash(record.tokenHash)).toEqual(record)
        expect(await store.listByUser(record.userId)).toEqual([record])
      })

      it('keeps null allowlists, empty fields and large times as they were', async () => {
        const { store } = await open()
        const record = makeTokenRecord({ allowedIps: null, servers: ['only'], expiresAt: 8_640_000_000_000_000 })
        await store.insert(record)
        expect(await store.get(record.id)).toEqual(record)
      })

      it('answers undefined or an empty list for what does not exist', async () => {
        const { store } = await open()
        expect(await store.get(randomUUID())).toBeUndefined()
        expect(await store.findByHash(hashApiToken('svc_nothing'))).toBeUndefined()
        expect(await store.listByUser('nobody')).toEqual([])
      })

      it('lists only the tokens of the user asked for', async () => {
        const { store } = await open()
        const mine = [makeTokenRecord({ userId: 'u1' }), makeTokenRecord({ userId: 'u1' })]
        const theirs = makeTokenRecord({ userId: 'u2' })
        for (const r of [...mine, theirs]) await store.insert(r)
        const listed = await store.listByUser('u1')
        expect([...listed].sort((a, b) => (a.id < b.id ? -1 : 1))).toEqual(
          [...mine].sort((a, b) => (a.id < b.id ? -1 : 1)),
        )
        expect(await store.listByUser('u2')).toEqual([theirs])
      })

      it('counts a user\'s active tokens, when it has countActiveByUser: not revoked (by itself or a reset), not expired at now', async () => {
        const { store } = await open()
        if (typeof store.countActiveByUser !== 'function') return
        const created = 1_700_000_000_000
        const at = created + DAY
        const records = [
          makeTokenRecord({ userId: 'u1', createdAt: created }),
          makeTokenRecord({ userId: 'u1', createdAt: created }),
          makeTokenRecord({ userId: 'u1', createdAt: created, revokedAt: created + 1 }),
          // Expired at `at` exactly: expired, as authentication reads it.
          makeTokenRecord({ userId: 'u1', createdAt: created, expiresAt: at }),
          makeTokenRecord({ userId: 'u2', createdAt: created }),
        ]
        for (const r of records) await store.insert(r)
        expect(await store.countActiveByUser('u1', at)).toBe(2)
        expect(await store.countActiveByUser('u1', at - 1)).toBe(3)
        expect(await store.countActiveByUser('u2', at)).toBe(1)
        expect(await store.countActiveByUser('nobody', at)).toBe(0)
        await store.revoke(records[0]!.id, at)
        expect(await store.countActiveByUser('u1', at)).toBe(1)
        await store.revokeAllForUser('u1', at + 1)
        expect(await store.countActiveByUser('u1', at + 1)).toBe(0)
        // A token the reset reaches though it was stored after it (a create racing the reset).
        await store.insert(makeTokenRecord({ userId: 'u1', createdAt: at }))
        expect(await store.countActiveByUser('u1', at + 2)).toBe(0)
        // One created after the reset counts.
        await store.insert(makeTokenRecord({ userId: 'u1', createdAt: at + 5 }))
        expect(await store.countActiveByUser('u1', at + 6)).toBe(1)
      })

      it('refuses a duplicate id or a duplicate hash', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        await expect(async () => store.insert({ ...makeTokenRecord(), id: record.id })).rejects.toThrow()
        await expect(async () => store.insert({ ...makeTokenRecord(), tokenHash: record.tokenHash })).rejects.toThrow()
        expect(await store.listByUser(record.userId)).toEqual([record])
      })

      it('keeps its own copy: changing the inserted object or a returned record changes nothing', async () => {
        const { store } = await open()
        const servers = ['app_1']
        const allowedIps = ['10.0.0.0/8']
        const record = makeTokenRecord({ servers, allowedIps })
        const expected = structuredClone(record)
        await store.insert(record)
        servers.push('app_evil')
        allowedIps.push('0.0.0.0/0')
        ;(record as unknown as Record<string, unknown>).name = 'changed'
        expect(await store.get(record.id)).toEqual(expected)
        tamper((await store.get(record.id))!)
        tamper((await store.findByHash(expected.tokenHash))!)
        expect(await store.get(record.id)).toEqual(expected)
      })
    })

    describe('update', () => {
      it('changes name, expiry and allowlist, and nothing else', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const updated = await store.update(record.id, {
          name: 'renamed',
          expiresAt: record.expiresAt + DAY,
          allowedIps: ['192.0.2.0/24', '::1'],
        })
        const expected = { ...record, name: 'renamed', expiresAt: record.expiresAt + DAY, allowedIps: ['192.0.2.0/24', '::1'] }
        expect(updated).toEqual(expected)
        expect(await store.get(record.id)).toEqual(expected)
        expect(await store.findByHash(record.tokenHash)).toEqual(expected)
      })

      it('changes only the fields given', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        expect(await store.update(record.id, { name: 'only the name' })).toEqual({ ...record, name: 'only the name' })
        expect(await store.update(record.id, {})).toEqual({ ...record, name: 'only the name' })
      })

      it('an allowlist of null removes the allowlist', async () => {
        const { store } = await open()
        const record = makeTokenRecord({ allowedIps: ['10.0.0.0/8'] })
        await store.insert(record)
        expect((await store.update(record.id, { allowedIps: null }))?.allowedIps).toBeNull()
        expect((await store.get(record.id))?.allowedIps).toBeNull()
      })

      it('keeps its own copy of a new allowlist', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const list = ['192.0.2.0/24']
        await store.update(record.id, { allowedIps: list })
        list.push('0.0.0.0/0')
        expect((await store.get(record.id))?.allowedIps).toEqual(['192.0.2.0/24'])
      })

      it('answers undefined for an unknown token', async () => {
        const { store } = await open()
        expect(await store.update(randomUUID(), { name: 'x' })).toBeUndefined()
      })

      it('answers undefined for a revoked token and leaves it as it was', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const revoked = await store.revoke(record.id, 1_700_000_000_500)
        expect(await store.update(record.id, { name: 'after revoke', expiresAt: record.expiresAt + DAY })).toBeUndefined()
        expect(await store.get(record.id)).toEqual(revoked)
      })

      it('with expectedExpiresAt: applies the patch when it matches the current expiry (compare-and-swap)', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const expected = { ...record, expiresAt: record.expiresAt - DAY }
        expect(await store.update(record.id, { expiresAt: expected.expiresAt }, record.expiresAt)).toEqual(expected)
        expect(await store.get(record.id)).toEqual(expected)
      })

      it('with expectedExpiresAt: refuses when the expiry has moved on, and changes nothing', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const moved = await store.update(record.id, { expiresAt: record.expiresAt + DAY })
        expect(await store.update(record.id, { expiresAt: record.expiresAt - DAY, name: 'undo' }, record.expiresAt)).toBeUndefined()
        expect(await store.get(record.id)).toEqual(moved)
      })
    })

    describe('rotate', () => {
      it('replaces hash and display prefix; id, owner, name, servers, expiry, allowlist stay', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const next = newSecretHash()
        const rotated = await store.rotate(record.id, next)
        const expected = { ...record, ...next }
        expect(rotated).toEqual(expected)
        expect(await store.get(record.id)).toEqual(expected)
        expect(await store.findByHash(next.tokenHash)).toEqual(expected)
        expect(await store.listByUser(record.userId)).toEqual([expected])
      })

      it('the old hash finds nothing at once', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        await store.rotate(record.id, newSecretHash())
        expect(await store.findByHash(record.tokenHash)).toBeUndefined()
      })

      it('with expectedHash: succeeds when it matches the current hash (compare-and-swap)', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const next = newSecretHash()
        expect(await store.rotate(record.id, next, record.tokenHash)).toEqual({ ...record, ...next })
      })

      it('with expectedHash: refuses when the hash has moved on, and changes nothing', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const first = newSecretHash()
        await store.rotate(record.id, first, record.tokenHash)
        const second = newSecretHash()
        expect(await store.rotate(record.id, second, record.tokenHash)).toBeUndefined()
        expect(await store.findByHash(second.tokenHash)).toBeUndefined()
        expect(await store.get(record.id)).toEqual({ ...record, ...first })
      })

      it('two concurrent rotations by the same secret: exactly one succeeds', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const attempts = Array.from({ length: 5 }, () => newSecretHash())
        const results = await Promise.all(
          attempts.map(async (next) => store.rotate(record.id, next, record.tokenHash)),
        )
        const winners = results.filter((r) => r !== undefined)
        expect(winners).toHaveLength(1)
        const current = await store.get(record.id)
        expect(current).toEqual(winners[0])
        for (const next of attempts) {
          const found = await store.findByHash(next.tokenHash)
          expect(found === undefined || found.tokenHash === current!.tokenHash).toBe(true)
        }
      })

      it('refuses a hash another token holds (revoked or not) with a TypeError, and changes neither token', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        const other = makeTokenRecord({ userId: 'someone-else' })
        const revoked = makeTokenRecord({ userId: 'someone-else' })
        for (const r of [record, other, revoked]) await store.insert(r)
        await store.revoke(revoked.id, 1_700_000_000_500)
        const revokedRecord = await store.get(revoked.id)
        for (const taken of [other, revoked]) {
          const next = { tokenHash: taken.tokenHash, displayPrefix: 'svc_taken000' }
          await expect(async () => store.rotate(record.id, next)).rejects.toThrow(TypeError)
          await expect(async () => store.rotate(record.id, next, record.tokenHash)).rejects.toThrow(/duplicate token hash/)
        }
        expect(await store.get(record.id)).toEqual(record)
        expect(await store.findByHash(record.tokenHash)).toEqual(record)
        expect(await store.findByHash(other.tokenHash)).toEqual(other)
        expect(await store.findByHash(revoked.tokenHash)).toEqual(revokedRecord)
        // Its own current hash is no collision.
        const same = { tokenHash: record.tokenHash, displayPrefix: 'svc_same0000' }
        expect(await store.rotate(record.id, same)).toEqual({ ...record, ...same })
      })

      it('answers undefined for an unknown or revoked token', async () => {
        const { store } = await open()
        expect(await store.rotate(randomUUID(), newSecretHash())).toBeUndefined()
        const record = makeTokenRecord()
        await store.insert(record)
        await store.revoke(record.id, 1_700_000_000_500)
        const next = newSecretHash()
        expect(await store.rotate(record.id, next)).toBeUndefined()
        expect(await store.rotate(record.id, newSecretHash(), record.tokenHash)).toBeUndefined()
        expect(await store.findByHash(next.tokenHash)).toBeUndefined()
        expect((await store.get(record.id))?.tokenHash).toBe(record.tokenHash)
      })
    })

    describe('revoke', () => {
      it('marks the token revoked at the given time; it stays findable by hash, as revoked', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        const revoked = await store.revoke(record.id, 1_700_000_000_500)
        expect(revoked).toEqual({ ...record, revokedAt: 1_700_000_000_500 })
        expect(await store.get(record.id)).toEqual(revoked)
        expect(await store.findByHash(record.tokenHash)).toEqual(revoked)
      })

      it('is idempotent: a second revoke keeps the first time', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        await store.revoke(record.id, 1_700_000_000_500)
        const again = await store.revoke(record.id, 1_700_000_009_999)
        expect(again?.revokedAt).toBe(1_700_000_000_500)
        expect((await store.get(record.id))?.revokedAt).toBe(1_700_000_000_500)
      })

      it('answers undefined for an unknown token', async () => {
        const { store } = await open()
        expect(await store.revoke(randomUUID(), 1)).toBeUndefined()
      })

      it('leaves a token expired at the given time as it is, and answers it (spec 3: expired is an end state)', async () => {
        const { store } = await open()
        const record = makeTokenRecord()
        await store.insert(record)
        // Expired from its expiresAt on (at >= expiresAt), the token service's boundary.
        expect(await store.revoke(record.id, record.expiresAt)).toEqual(record)
        expect(await store.revoke(record.id, record.expiresAt + DAY)).toEqual(record)
        expect(await store.get(record.id)).toEqual(record)
        expect(await store.findByHash(record.tokenHash)).toEqual(record)
        // A millisecond before it, the token is active and is revoked.
        const active = makeTokenRecord()
        await store.insert(active)
        expect((await store.revoke(active.id, active.expiresAt - 1))?.revokedAt).toBe(active.expiresAt - 1)
      })
    })

    describe('revokeAllForUser', () => {
      it('revokes every active token of the user and returns them; other users keep theirs', async () => {
        const { store } = await open()
        const a = makeTokenRecord({ userId: 'u1' })
        const b = makeTokenRecord({ userId: 'u1' })
        const already = makeTokenRecord({ userId: 'u1' })
        const other = makeTokenRecord({ userId: 'u2' })
        for (const r of [a, b, already, other]) await store.insert(r)
        await store.revoke(already.id, 1_700_000_000_100)

        const revoked = await store.revokeAllForUser('u1', 1_700_000_000_200)
        expect(revoked.map((r) => r.id).sort()).toEqual([a.id, b.id].sort())
        for (const r of revoked) expect(r.revokedAt).toBe(1_700_000_000_200)
        expect((await store.get(a.id))?.revokedAt).toBe(1_700_000_000_200)
        expect((await store.get(b.id))?.revokedAt).toBe(1_700_000_000_200)
        expect((await store.get(already.id))?.revokedAt).toBe(1_700_000_000_100)
        expect((await store.get(other.id))?.revokedAt).toBeNull()
      })

      it('a second call, or a user without tokens, revokes nothing', async () => {
        const { store } = await open()
        await store.insert(makeTokenRecord({ userId: 'u1' }))
        await store.revokeAllForUser('u1', 1)
        expect(await store.revokeAllForUser('u1', 2)).toEqual([])
        expect(await store.revokeAllForUser('nobody', 2)).toEqual([])
      })

      it('revoked tokens can no longer be rotated or edited', async () => {
        const { store } = await open()
        const record = makeTokenRecord({ userId: 'u1' })
        await store.insert(record)
        await store.revokeAllForUser('u1', 1)
        expect(await store.rotate(record.id, newSecretHash(), record.tokenHash)).toBeUndefined()
        expect(await store.update(record.id, { name: 'x' })).toBeUndefined()
      })

      it('a token created before the reset but inserted after it (a create racing a password reset) is revoked too', async () => {
        const { store } = await open()
        const at = 1_700_000_000_500
        expect(await store.revokeAllForUser('u1', at)).toEqual([])
        const raced = makeTokenRecord({ userId: 'u1', createdAt: at - 11 })
        // Created in the reset's millisecond: which came first cannot be told, so revoked too.
        const tied = makeTokenRecord({ userId: 'u1', createdAt: at })
        // Created after the reset's millisecond: a token of the new password.
        const after = makeTokenRecord({ userId: 'u1', createdAt: at + 1 })
        const other = makeTokenRecord({ userId: 'u2', createdAt: at - 11 })
        for (const r of [raced, tied]) {
          const stored = await store.insert(r)
          // A store that answers the stored record shows it revoked already.
          if (stored) expect(stored.revokedAt).toBe(at)
          expect((await store.findByHash(r.tokenHash))?.revokedAt).toBe(at)
        }
        for (const r of [after, other]) {
          const kept = await store.insert(r)
          if (kept) expect(kept.revokedAt).toBeNull()
        }
        expect((await store.findByHash(raced.tokenHash))?.revokedAt).toBe(at)
        expect((await store.get(raced.id))?.revokedAt).toBe(at)
        expect((await store.listByUser('u1')).find((r) => r.id === raced.id)?.revokedAt).toBe(at)
        expect(await store.rotate(raced.id, newSecretHash(), raced.tokenHash)).toBeUndefined()
        expect(await store.update(raced.id, { name: 'x' })).toBeUndefined()
        // Created after the reset (a new password, a new token), or by another user: untouched.
        expect((await store.get(after.id))?.revokedAt).toBeNull()
        expect((await store.get(other.id))?.revokedAt).toBeNull()
        expect(await store.update(after.id, { name: 'kept' })).toMatchObject({ name: 'kept', revokedAt: null })
      })
    })

    describe('revokeAllForUser and expired tokens (spec 3: expired is an end state)', () => {
      it('skips tokens expired at the reset, and does not return or count them', async () => {
        const { store } = await open()
        const at = 1_700_000_000_000 + 30 * DAY
        const active = makeTokenRecord({ userId: 'u1', expiresAt: at + 1 })
        const expiredNow = makeTokenRecord({ userId: 'u1', expiresAt: at })
        const expiredBefore = makeTokenRecord({ userId: 'u1', expiresAt: at - DAY })
        for (const r of [active, expiredNow, expiredBefore]) await store.insert(r)

        const revoked = await store.revokeAllForUser('u1', at)
        expect(revoked.map((r) => r.id)).toEqual([active.id])
        expect((await store.get(active.id))?.revokedAt).toBe(at)
        for (const r of [expiredNow, expiredBefore]) {
          expect(await store.get(r.id)).toEqual(r)
          expect(await store.findByHash(r.tokenHash)).toEqual(r)
        }
        expect((await store.listByUser('u1')).filter((r) => r.revokedAt === null).map((r) => r.id).sort()).toEqual(
          [expiredNow.id, expiredBefore.id].sort(),
        )
      })

      it('a token created before a recorded reset reads as revoked only if it had not expired by the reset', async () => {
        const { store } = await open()
        const at = 1_700_000_000_000 + 30 * DAY
        expect(await store.revokeAllForUser('u1', at)).toEqual([])
        // Both created before the reset, inserted after it (a create racing a password reset).
        const expiredBefore = makeTokenRecord({ userId: 'u1', expiresAt: at })
        const expiredAfter = makeTokenRecord({ userId: 'u1', expiresAt: at + 1 })
        const storedExpired = await store.insert(expiredBefore)
        if (storedExpired) expect(storedExpired.revokedAt).toBeNull()
        const storedRevoked = await store.insert(expiredAfter)
        if (storedRevoked) expect(storedRevoked.revokedAt).toBe(at)

        expect(await store.get(expiredBefore.id)).toEqual(expiredBefore)
        expect(await store.findByHash(expiredBefore.tokenHash)).toEqual(expiredBefore)
        expect((await store.listByUser('u1')).find((r) => r.id === expiredBefore.id)).toEqual(expiredBefore)
        // A revoke after the reset leaves the expired one expired too.
        expect(await store.revoke(expiredBefore.id, at + 5)).toEqual(expiredBefore)

        expect((await store.get(expiredAfter.id))?.revokedAt).toBe(at)
        expect((await store.findByHash(expiredAfter.tokenHash))?.revokedAt).toBe(at)
        expect((await store.listByUser('u1')).find((r) => r.id === expiredAfter.id)?.revokedAt).toBe(at)
        // Revoked by the reset: a later revoke keeps the reset's time.
        expect((await store.revoke(expiredAfter.id, at + 5))?.revokedAt).toBe(at)
      })

      it('a later reset, after the token expired, keeps the revocation an earlier reset made and does not count it', async () => {
        const { store } = await open()
        const first = 1_700_000_000_500
        expect(await store.revokeAllForUser('u1', first)).toEqual([])
        // Created before the first reset and inserted after it: revoked by that reset.
        const raced = makeTokenRecord({ userId: 'u1', createdAt: first - 11, expiresAt: first + 1_000 })
        await store.insert(raced)
        expect((await store.get(raced.id))?.revokedAt).toBe(first)
        // The second reset comes once the token's expiry has passed: revoked stays revoked.
        expect(await store.revokeAllForUser('u1', first + 2_000)).toEqual([])
        expect((await store.get(raced.id))?.revokedAt).toBe(first)
        expect((await store.findByHash(raced.tokenHash))?.revokedAt).toBe(first)
        expect((await store.listByUser('u1')).find((r) => r.id === raced.id)?.revokedAt).toBe(first)
      })
      it('an update that moves the expiry of a token the reset left expired past the reset: it reads as revoked at the reset from then on, and update answers it so', async () => {
        // A token the reset found expired stays so; an edit of its expiry that lands after the
        // reset (one sent before the old expiry, landing late, which the token service then
        // undoes) makes it a token created before the reset and expiring after it: revoked,
        // whenever it is updated or read (the reset's doc comment), not active until the undo.
        const { store } = await open()
        const created = 1_700_000_000_000
        const reset = created + 10
        const token = makeTokenRecord({ userId: 'u1', createdAt: created, expiresAt: reset })
        await store.insert(token)
        expect(await store.revokeAllForUser('u1', reset)).toEqual([])
        const updated = await store.update(token.id, { expiresAt: reset + 5 }, reset)
        expect(updated?.revokedAt).toBe(reset)
        expect((await store.get(token.id))?.revokedAt).toBe(reset)
        expect((await store.findByHash(token.tokenHash))?.revokedAt).toBe(reset)
        expect((await store.listByUser('u1')).find((r) => r.id === token.id)?.revokedAt).toBe(reset)
        if (store.countActiveByUser) expect(await store.countActiveByUser('u1', reset + 1)).toBe(0)
        // Revoked, it can no longer be edited (the token service's undo is refused) nor rotated.
        expect(await store.update(token.id, { expiresAt: reset }, reset + 5)).toBeUndefined()
        expect(await store.rotate(token.id, newSecretHash())).toBeUndefined()
        expect((await store.revoke(token.id, reset + 20))?.revokedAt).toBe(reset)
      })
    })

    describe('password resets and a token\'s own revocation', () => {
      it('a reset older than the one recorded (instances whose clocks differ) does not move the recorded reset back', async () => {
        const { store } = await open()
        const later = 1_700_000_002_000
        await store.revokeAllForUser('u1', later)
        await store.revokeAllForUser('u1', later - 1_000)
        // Created between the two resets, inserted after both: the later reset revokes it.
        const raced = makeTokenRecord({ userId: 'u1', createdAt: later - 500 })
        await store.insert(raced)
        expect((await store.get(raced.id))?.revokedAt).toBe(later)
      })

      it('a token revoked before a reset keeps its own revocation time: read, revoked again, or inserted revoked', async () => {
        const { store } = await open()
        const own = 1_700_000_000_500
        const record = makeTokenRecord({ userId: 'u1' })
        await store.insert(record)
        await store.revoke(record.id, own)
        await store.revokeAllForUser('u1', own + 1_000)
        expect((await store.get(record.id))?.revokedAt).toBe(own)
        expect((await store.revoke(record.id, own + 2_000))?.revokedAt).toBe(own)
        expect((await store.get(record.id))?.revokedAt).toBe(own)
        // A record inserted already revoked, created before that reset, keeps its time too.
        const inserted = makeTokenRecord({ userId: 'u1', revokedAt: own })
        await store.insert(inserted)
        expect((await store.get(inserted.id))?.revokedAt).toBe(own)
      })
    })

    describe('ids no record can have', () => {
      it('an id with a NUL or a lone surrogate names no token (not the one whose id has U+FFFD in its place): get, update, rotate and revoke answer undefined and change nothing', async () => {
        const { store } = await open()
        const record = makeTokenRecord({ id: `${randomUUID()}-\uFFFD` })
        await store.insert(record)
        for (const id of [record.id.replace('\uFFFD', '\uD800'), `${record.id}\u0000`, 'a\u0000b']) {
          const label = JSON.stringify(id)
          expect(await store.get(id), label).toBeUndefined()
          expect(await store.update(id, { name: 'renamed' }), label).toBeUndefined()
          expect(await store.rotate(id, newSecretHash()), label).toBeUndefined()
          expect(await store.revoke(id, 1_700_000_000_500), label).toBeUndefined()
        }
        expect(await store.get(record.id)).toEqual(record)
      })
    })

    describe('touch', () => {
      it('records last-used times in one batch', async () => {
        const { store } = await open()
        const a = makeTokenRecord()
        const b = makeTokenRecord()
        await store.insert(a)
        await store.insert(b)
        await store.touch(new Map([[a.id, 1_700_000_001_000], [b.id, 1_700_000_002_000]]))
        expect((await store.get(a.id))?.lastUsedAt).toBe(1_700_000_001_000)
        expect((await store.get(b.id))?.lastUsedAt).toBe(1_700_000_002_000)
        expect((await store.findByHash(a.tokenHash))?.lastUsedAt).toBe(1_700_000_001_000)
      })

      it('never moves a last-used time backwards', async () => {
        const { store } = await open()
        const a = makeTokenRecord()
        await store.insert(a)
        await store.touch(new Map([[a.id, 1_700_000_005_000]]))
        await store.touch(new Map([[a.id, 1_700_000_001_000]]))
        expect((await store.get(a.id))?.lastUsedAt).toBe(1_700_000_005_000)
      })

      it('changes nothing else, ignores unknown ids and accepts an empty batch', async () => {
        const { store } = await open()
        const a = makeTokenRecord()
        await store.insert(a)
        await store.touch(new Map())
        await store.touch(new Map([[randomUUID(), 1], [a.id, 1_700_000_001_000]]))
        expect(await store.get(a.id)).toEqual({ ...a, lastUsedAt: 1_700_000_001_000 })
      })
    })
  })
}

// --- Sessions ----------------------------------------------------------------------------

const PIN: SessionPin = { appId: 'app_1', version: '1.2.3', subject: 'user_1' }

/** The {@link SessionStore} contract: pins with an idle TTL that `get` restarts. */
export function describeSessionStoreConformance(
  name: string,
  factory: (context: StoreFactoryContext) => MaybePromise<SessionStore>,
  options: ConformanceOptions<SessionStore> = {},
): void {
  const clockTests = options.injectableClock !== false
  describe(`SessionStore conformance: ${name}`, () => {
    const open = harness(factory, options)

    it('returns what was set, and undefined for an unknown id', async () => {
      const { store } = await open()
      await store.set('s1', PIN, 60_000)
      expect(await store.get('s1', 60_000)).toEqual(PIN)
      expect(await store.get('unknown', 60_000)).toBeUndefined()
    })

    it('keeps sessions apart; a second set of a live id changes nothing and answers false (the session keeps its version and owner)', async () => {
      const { store } = await open()
      const other: SessionPin = { appId: 'app_2', version: '2.0.0-rc.1', subject: 'user_2' }
      expect(await store.set('s1', PIN, 60_000)).toBe(true)
      expect(await store.set('s2', other, 60_000)).toBe(true)
      expect(await store.get('s1', 60_000)).toEqual(PIN)
      expect(await store.get('s2', 60_000)).toEqual(other)
      expect(await store.set('s1', other, 60_000)).toBe(false)
      expect(await store.get('s1', 60_000)).toEqual(PIN)
      // The same pin set again is a second session under the id too (a handler that gave one id twice).
      expect(await store.set('s1', PIN, 60_000)).toBe(false)
      // Once it has ended, the id may pin a new session.
      await store.delete('s1')
      expect(await store.set('s1', other, 60_000)).toBe(true)
      expect(await store.get('s1', 60_000)).toEqual(other)
    })

    it.skipIf(!clockTests)('an expired pin does not keep its id: a new session may take it', async () => {
      const { store, clock } = await open()
      await store.set('s1', PIN, 1_000)
      clock.advance(1_001)
      const other: SessionPin = { appId: 'app_2', version: '2.0.0', subject: 'user_2' }
      expect(await store.set('s1', other, 1_000)).toBe(true)
      expect(await store.get('s1', 1_000)).toEqual(other)
    })

    it('delete ends the session; deleting an unknown id is fine', async () => {
      const { store } = await open()
      await store.set('s1', PIN, 60_000)
      await store.delete('s1')
      expect(await store.get('s1', 60_000)).toBeUndefined()
      await store.delete('never-existed')
    })

    it.skipIf(!clockTests)('expires after the idle TTL (injected clock)', async () => {
      const { store, clock } = await open()
      await store.set('s1', PIN, 1_000)
      clock.advance(999)
      expect(await store.get('s1', 1_000)).toEqual(PIN)
      clock.advance(1_002)
      expect(await store.get('s1', 1_000)).toBeUndefined()
    })

    it.skipIf(!clockTests)('an expired session stays expired, even when asked with a longer TTL', async () => {
      const { store, clock } = await open()
      await store.set('s1', PIN, 1_000)
      clock.advance(1_001)
      expect(await store.get('s1', 60_000)).toBeUndefined()
      clock.advance(1)
      expect(await store.get('s1', 60_000)).toBeUndefined()
    })

    it.skipIf(!clockTests)('get restarts the idle TTL', async () => {
      const { store, clock } = await open()
      await store.set('s1', PIN, 1_000)
      for (let i = 0; i < 5; i++) {
        clock.advance(800)
        expect(await store.get('s1', 1_000), `after ${(i + 1) * 800} ms`).toEqual(PIN)
      }
      clock.advance(1_001)
      expect(await store.get('s1', 1_000)).toBeUndefined()
    })

    it.skipIf(!clockTests)('expiry of one session leaves the others', async () => {
      const { store, clock } = await open()
      await store.set('short', PIN, 1_000)
      await store.set('long', PIN, 10_000)
      clock.advance(5_000)
      expect(await store.get('short', 1_000)).toBeUndefined()
      expect(await store.get('long', 10_000)).toEqual(PIN)
    })
  })
}

// --- Rate-limit counters -----------------------------------------------------------------

/** The {@link RateLimitStore} contract: atomic counters per key and fixed window. */
export function describeRateLimitStoreConformance(
  name: string,
  factory: (context: StoreFactoryContext) => MaybePromise<RateLimitStore>,
  options: ConformanceOptions<RateLimitStore> = {},
): void {
  describe(`RateLimitStore conformance: ${name}`, () => {
    const open = harness(factory, options)
    const W = 60_000
    const start = 1_700_000_040_000 - (1_700_000_040_000 % W)

    it('counts 1, 2, 3 within a window', async () => {
      const { store } = await open()
      expect(await store.increment('k', start, W)).toBe(1)
      expect(await store.increment('k', start, W)).toBe(2)
      expect(await store.increment('k', start, W)).toBe(3)
    })

    it('keeps keys apart', async () => {
      const { store } = await open()
      await store.increment('a', start, W)
      await store.increment('a', start, W)
      expect(await store.increment('b', start, W)).toBe(1)
      expect(await store.increment('a', start, W)).toBe(3)
    })

    it('keeps apart keys that differ only in lone surrogates, or in a NUL, whatever the bytes they are stored as (regression: Redis wrote U+FFFD for each, one counter for two users)', async () => {
      const { store } = await open()
      const keys = ['app\0user-\uD800\0minute', 'app\0user-\uDC00\0minute', 'app\0user-\uFFFD\0minute', '\0"app\\u0000user-\\ud800\\u0000minute"']
      for (const key of keys) expect(await store.increment(key, start, W), JSON.stringify(key)).toBe(1)
      expect(await store.increment(keys[0]!, start, W)).toBe(2)
    })

    it('starts again at 1 in a new window', async () => {
      const { store, clock } = await open()
      clock.set(start + 10)
      for (let i = 0; i < 5; i++) await store.increment('k', start, W)
      clock.set(start + W + 10)
      expect(await store.increment('k', start + W, W)).toBe(1)
      expect(await store.increment('k', start + W, W)).toBe(2)
      clock.set(start + 5 * W)
      expect(await store.increment('k', start + 5 * W, W)).toBe(1)
    })

    it('a request stamped with an older window counts against the current one, and says which (clock skew between instances)', async () => {
      const { store, clock } = await open()
      clock.set(start + W + 10)
      expect(await store.increment('k', start + W, W)).toBe(1)
      expect(await store.increment('k', start, W)).toEqual({ count: 2, windowStart: start + W })
      expect(await store.increment('k', start + W, W)).toBe(3)
    })

    it('never moves a counter back, however far behind the request is: two instances skewed by windows share one budget', async () => {
      const { store, clock } = await open()
      clock.set(start + 3 * W + 10)
      // Instance A is 2.5 windows ahead of B; they alternate.
      const answers = []
      for (let i = 0; i < 3; i++) {
        answers.push(await store.increment('k', start + 3 * W, W))
        answers.push(await store.increment('k', start, W))
      }
      expect(answers).toEqual([1, { count: 2, windowStart: start + 3 * W }, 3, { count: 4, windowStart: start + 3 * W }, 5, { count: 6, windowStart: start + 3 * W }])
    })

    if (options.injectableClock !== false) {
      it('a counter ahead of the requests lives one window of the store’s time, then starts again', async () => {
        const { store, clock } = await open()
        clock.set(start + 10)
        expect(await store.increment('k', start + 20 * W, W)).toBe(1)
        clock.advance(W - 20)
        expect(await store.increment('k', start, W)).toEqual({ count: 2, windowStart: start + 20 * W })
        clock.advance(20)
        expect(await store.increment('k', start, W)).toBe(1)
      })

      it('a counter started by a clock that has since stepped back starts again: no lockout for the size of the step', async () => {
        const { store, clock } = await open()
        // The clock ran an hour fast for one request, then was corrected.
        clock.set(start + 60 * W + 10)
        for (let i = 0; i < 5; i++) await store.increment('k', start + 60 * W, W)
        clock.set(start + 10)
        expect(await store.increment('k', start, W)).toBe(1)
        expect(await store.increment('k', start, W)).toBe(2)
      })

      it('a clock stepped back a second across a window\'s start counts against the counter it started, and so does the same clock caught up: no second budget', async () => {
        const { store, clock } = await open()
        clock.set(start + W + 500)
        for (let i = 1; i <= 3; i++) expect(await store.increment('k', start + W, W)).toBe(i)
        // Stepped back 1 s (NTP): its requests are stamped with the window before.
        clock.set(start + W - 500)
        expect(await store.increment('k', start, W)).toEqual({ count: 4, windowStart: start + W })
        // Caught up: the counter's own window again.
        clock.set(start + W + 500)
        expect(await store.increment('k', start + W, W)).toBe(5)
      })
    }

    it('a counter started again in a new window lives one window from then: a request of an older window still counts against it', async () => {
      const { store, clock } = await open()
      clock.set(start + W + 10)
      expect(await store.increment('k', start + W, W)).toBe(1)
      clock.set(start + 2 * W + 10)
      expect(await store.increment('k', start + 2 * W, W)).toBe(1)
      // An instance two windows behind (not the window just replaced), a moment later.
      clock.set(start + 2 * W + 20)
      expect(await store.increment('k', start, W)).toEqual({ count: 2, windowStart: start + 2 * W })
    })

    it('is atomic: concurrent increments give every count exactly once', async () => {
      const { store } = await open()
      const counts = (await Promise.all(Array.from({ length: 50 }, async () => store.increment('k', start, W)))) as number[]
      expect([...counts].sort((a, b) => a - b)).toEqual(Array.from({ length: 50 }, (_, i) => i + 1))
    })

    it('keys are opaque: separators and odd characters do not collide', async () => {
      const { store } = await open()
      const keys = ['u1:app', 'u1', 'u1:app:', ':u1:app', 'u1\u0000app', 'ü1:app']
      for (const key of keys) expect(await store.increment(key, start, W)).toBe(1)
    })
  })
}

// --- Cache -------------------------------------------------------------------------------

/** The {@link CacheStore} contract: values by key with a TTL. */
export function describeCacheStoreConformance(
  name: string,
  factory: (context: StoreFactoryContext) => MaybePromise<CacheStore<{ subject: string; n: number }>>,
  options: ConformanceOptions<CacheStore<{ subject: string; n: number }>> = {},
): void {
  const clockTests = options.injectableClock !== false
  describe(`CacheStore conformance: ${name}`, () => {
    const open = harness(factory, options)

    it('returns what was set, undefined for an unknown key, and deletes', async () => {
      const { store } = await open()
      await store.set('k1', { subject: 'u1', n: 1 }, 60_000)
      expect(await store.get('k1')).toEqual({ subject: 'u1', n: 1 })
      expect(await store.get('k2')).toBeUndefined()
      await store.delete('k1')
      expect(await store.get('k1')).toBeUndefined()
      await store.delete('never-existed')
    })

    it('a second set replaces the value', async () => {
      const { store } = await open()
      await store.set('k', { subject: 'u1', n: 1 }, 60_000)
      await store.set('k', { subject: 'u2', n: 2 }, 60_000)
      expect(await store.get('k')).toEqual({ subject: 'u2', n: 2 })
    })

    it('a TTL of zero or less stores nothing', async () => {
      const { store } = await open()
      await store.set('zero', { subject: 'u', n: 0 }, 0)
      await store.set('negative', { subject: 'u', n: 0 }, -5)
      expect(await store.get('zero')).toBeUndefined()
      expect(await store.get('negative')).toBeUndefined()
    })

    it.skipIf(!clockTests)('expires after the TTL (injected clock), and get does not extend it', async () => {
      const { store, clock } = await open()
      await store.set('k', { subject: 'u1', n: 1 }, 1_000)
      clock.advance(500)
      expect(await store.get('k')).toEqual({ subject: 'u1', n: 1 })
      clock.advance(499)
      expect(await store.get('k')).toEqual({ subject: 'u1', n: 1 })
      clock.advance(2)
      expect(await store.get('k')).toBeUndefined()
    })

    it.skipIf(!clockTests)('each key keeps its own TTL', async () => {
      const { store, clock } = await open()
      await store.set('short', { subject: 'a', n: 1 }, 1_000)
      await store.set('long', { subject: 'b', n: 2 }, 300_000)
      clock.advance(60_000)
      expect(await store.get('short')).toBeUndefined()
      expect(await store.get('long')).toEqual({ subject: 'b', n: 2 })
      clock.advance(240_001)
      expect(await store.get('long')).toBeUndefined()
    })
  })
}

// --- Apps and live versions --------------------------------------------------------------

/** Apps a factory must create, with no live versions. */
export const CONFORMANCE_APPS: readonly AppRecord[] = Object.freeze([
  Object.freeze({ id: 'app_weather', slug: 'weather', name: 'Weather' }),
  Object.freeze({ id: 'app_notes', slug: 'notes', name: 'Notes' }),
])

/** The {@link AppStore} contract: lookups by id and slug, and atomic deploys by the versions rule. */
export function describeAppStoreConformance(
  name: string,
  factory: (context: StoreFactoryContext & { apps: readonly AppRecord[] }) => MaybePromise<AppStore>,
  options: ConformanceOptions<AppStore> & {
    /** `false` when `getLiveVersions` cannot return the same array while nothing changed. Default `true`. */
    stableLiveVersions?: boolean
  } = {},
): void {
  describe(`AppStore conformance: ${name}`, () => {
    const open = harness((context) => factory({ ...context, apps: CONFORMANCE_APPS }), options)
    const [weather, notes] = CONFORMANCE_APPS as [AppRecord, AppRecord]

    it('finds Apps by id and by slug', async () => {
      const { store } = await open()
      expect(await store.getApp(weather.id)).toEqual(weather)
      expect(await store.getAppBySlug('notes')).toEqual(notes)
      expect(await store.getApp('app_unknown')).toBeUndefined()
      expect(await store.getAppBySlug('unknown')).toBeUndefined()
      expect(await store.getAppBySlug(weather.id)).toBeUndefined()
    })

    it('an App starts with no live versions', async () => {
      const { store } = await open()
      expect(await store.getLiveVersions(weather.id)).toEqual([])
    })

    it('deploy applies the versions rule and returns the new live set', async () => {
      const { store } = await open()
      expect(await store.deploy(weather.id, '1.0.0')).toEqual(['1.0.0'])
      expect(await store.deploy(weather.id, '1.1.0')).toEqual(['1.0.0', '1.1.0'])
      expect(await store.deploy(weather.id, '1.0.1')).toEqual(['1.0.1', '1.1.0'])
      expect(await store.deploy(weather.id, '2.0.0-rc.1')).toEqual(['1.0.1', '1.1.0', '2.0.0-rc.1'])
      expect(await store.getLiveVersions(weather.id)).toEqual(['1.0.1', '1.1.0', '2.0.0-rc.1'])
    })

    it('a refused deploy throws DeployRefusedError and leaves the live set as it was', async () => {
      const { store } = await open()
      await store.deploy(weather.id, '1.0.5')
      await expect(async () => store.deploy(weather.id, '1.0.4')).rejects.toThrow(DeployRefusedError)
      await expect(async () => store.deploy(weather.id, '1.0.5')).rejects.toThrow(DeployRefusedError)
      await expect(async () => store.deploy(weather.id, 'not-a-version')).rejects.toThrow(DeployRefusedError)
      expect(await store.getLiveVersions(weather.id)).toEqual(['1.0.5'])
    })

    it('deploying to an unknown App throws NotFoundError', async () => {
      const { store } = await open()
      await expect(async () => store.deploy('app_unknown', '1.0.0')).rejects.toThrow(NotFoundError)
    })

    it('Apps have separate live sets', async () => {
      const { store } = await open()
      await store.deploy(weather.id, '1.0.0')
      await store.deploy(notes.id, '3.0.0')
      expect(await store.getLiveVersions(weather.id)).toEqual(['1.0.0'])
      expect(await store.getLiveVersions(notes.id)).toEqual(['3.0.0'])
    })

    it('concurrent deploys of the same version: exactly one succeeds', async () => {
      const { store } = await open()
      await store.deploy(weather.id, '1.0.0')
      const results = await Promise.allSettled(
        Array.from({ length: 5 }, async () => store.deploy(weather.id, '1.0.1')),
      )
      expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1)
      for (const r of results) if (r.status === 'rejected') expect(r.reason).toBeInstanceOf(DeployRefusedError)
      expect(await store.getLiveVersions(weather.id)).toEqual(['1.0.1'])
    })

    it.skipIf(options.stableLiveVersions === false)(
      'getLiveVersions returns the same array until the next deploy (the compiled index is cached by identity)',
      async () => {
        const { store } = await open()
        await store.deploy(weather.id, '1.0.0')
        const first = await store.getLiveVersions(weather.id)
        expect(await store.getLiveVersions(weather.id)).toBe(first)
        await store.deploy(weather.id, '1.0.1')
        const second = await store.getLiveVersions(weather.id)
        expect(second).not.toBe(first)
        expect(first).toEqual(['1.0.0'])
      },
    )
  })
}

// --- Subscriptions -----------------------------------------------------------------------

/** The {@link SubscriptionStore} contract. The factory seeds the subscriptions it is given. */
export function describeSubscriptionStoreConformance(
  name: string,
  factory: (
    context: StoreFactoryContext & { subscriptions: readonly { userId: string; appId: string; active: boolean }[] },
  ) => MaybePromise<SubscriptionStore>,
  options: ConformanceOptions<SubscriptionStore> = {},
): void {
  describe(`SubscriptionStore conformance: ${name}`, () => {
    const subscriptions = [
      { userId: 'u1', appId: 'a1', active: true },
      { userId: 'u1', appId: 'a2', active: false },
      { userId: 'u2', appId: 'a2', active: true },
    ]
    const open = harness((context) => factory({ ...context, subscriptions }), options)

    it('answers true only for an active subscription of that user to that App', async () => {
      const { store } = await open()
      expect(await store.isActive('u1', 'a1')).toBe(true)
      expect(await store.isActive('u1', 'a2')).toBe(false)
      expect(await store.isActive('u2', 'a2')).toBe(true)
      expect(await store.isActive('u2', 'a1')).toBe(false)
      expect(await store.isActive('nobody', 'a1')).toBe(false)
      expect(await store.isActive('u1', 'unknown')).toBe(false)
    })
  })
}

// --- Invalidations -----------------------------------------------------------------------

/** The {@link InvalidationBus} contract: every subscriber gets every message until it unsubscribes. */
export function describeInvalidationBusConformance(
  name: string,
  factory: (context: StoreFactoryContext) => MaybePromise<InvalidationBus>,
  options: ConformanceOptions<InvalidationBus> = {},
): void {
  describe(`InvalidationBus conformance: ${name}`, () => {
    const open = harness(factory, options)
    const message = (n: number): InvalidationMessage => ({ kind: 'token', tokenHash: `hash_${n}` })
    const next = (bus: InvalidationBus) =>
      new Promise<{ message: InvalidationMessage; stop: () => void }>((resolve) => {
        const stop = bus.subscribe((m) => resolve({ message: m, stop }))
      })

    it('delivers a published message to every subscriber', async () => {
      const { store: bus } = await open()
      const a = next(bus)
      const b = next(bus)
      await bus.publish(message(1))
      expect((await a).message).toEqual(message(1))
      expect((await b).message).toEqual(message(1))
      ;(await a).stop()
      ;(await b).stop()
    })

    it('stops delivering after unsubscribe', async () => {
      const { store: bus } = await open()
      const seen: InvalidationMessage[] = []
      const stop = bus.subscribe((m) => seen.push(m))
      await bus.publish(message(1))
      const witness = next(bus)
      await bus.publish(message(2))
      await witness
      stop()
      const later = next(bus)
      await bus.publish(message(3))
      await later
      expect(seen).toEqual([message(1), message(2)])
      ;(await later).stop()
      ;(await witness).stop()
    })

    it('declares its publish deadline, if it has one, as milliseconds the token service can wait (0 to 2^31 - 1)', async () => {
      const { store: bus } = await open()
      const declared: unknown = bus.publishTimeoutMs
      if (declared === undefined) return
      expect(typeof declared).toBe('number')
      expect(declared).toBeGreaterThanOrEqual(0)
      expect(declared).toBeLessThanOrEqual(2 ** 31 - 1)
      // Within it (and the token service's second of slack) on a quiet channel.
      const began = performance.now()
      await bus.publish(message(1))
      expect(performance.now() - began).toBeLessThanOrEqual((declared as number) + 1_000)
    })
  })
}
