/**
 * The PostgreSQL token store and the token service under concurrency and faults, against a real
 * PostgreSQL (and a PgBouncer of this file's own in transaction mode, on 127.0.0.1:18150): two
 * instances racing lifecycle calls on one token, a password reset racing creations, uses
 * recorded while the service closes, backends ended mid-statement, a statement held on a lock
 * past `statement_timeout`, and an exhausted pool.
 */
import {
  StoreUnavailableError,
  type TokenService,
  type TokenServiceOptions,
  createMemoryAppStore,
  createMemoryInvalidationBus,
  createTokenService,
  hashApiToken,
} from 'mcp-dispatch'
import { type PostgresQueryable, type PostgresTokenStore, createPostgresTokenStore } from 'mcp-dispatch/postgres'
import { describe, expect, it, vi } from 'vitest'
import { startPgBouncer } from '../helpers/pgbouncer.js'
import { type TestPostgres, postgresUnavailable, randomSchemaName, usePostgres } from '../helpers/postgres.js'

const unavailable = await postgresUnavailable()
// Two server connections, fewer than the clients of the pools below, as a pooler has it.
const bouncer = unavailable === undefined ? await startPgBouncer(18150, 2) : undefined

const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])

function service(store: PostgresTokenStore, options: Partial<TokenServiceOptions> = {}): TokenService {
  return createTokenService({ store, apps, canUseServer: () => true, ...options })
}

const create = (tokens: TokenService, userId = 'u_audit', name = 'audit') =>
  tokens.create({ userId, name, servers: ['app_1'], expiresInDays: 7 })

/** A connection of its own (on `postgres`) holding `FOR UPDATE` on a token's row until `release`. */
async function lockRow(postgres: TestPostgres, store: PostgresTokenStore, id: string): Promise<{ release(): Promise<void> }> {
  const client = await postgres.openPool({ max: 1 }).connect()
  await client.query('BEGIN')
  await client.query(`SELECT 1 FROM ${store.table} WHERE id = $1 FOR UPDATE`, [id])
  return {
    async release() {
      await client.query('COMMIT')
      client.release()
    },
  }
}

describe.skipIf(unavailable !== undefined)('PostgreSQL token store under concurrency and faults', () => {
  const postgres = usePostgres()

  it('a use recorded while close() writes the last batch is written too, not dropped without a word (regression: close cleared its timer)', async () => {
    const store = await postgres.tokenStore()
    const errors: string[] = []
    const tokens = service(store, { onError: (_e, context) => errors.push(context) })
    const a = await create(tokens)
    const b = await create(tokens)
    await tokens.authenticate(a.token)
    // The last write waits on a lock on a's row; b is used meanwhile (a request still served
    // while the platform drains): `close()` takes its batch at once, so no wait is needed.
    const lock = await lockRow(postgres, store, a.id)
    const closing = tokens.close()
    expect((await tokens.authenticate(b.token)).ok).toBe(true)
    await lock.release()
    await closing
    const stored = await store.get(b.id)
    expect({ lastUsedAt: stored?.lastUsedAt ?? null, errors }).toMatchObject({ lastUsedAt: expect.any(Number), errors: [] })
  })

  /**
   * `store` with its `touch` calls logged (the ids of each batch, and `end` as each settles) and
   * held while `hold()` has not been released; `fail` makes them fail once released.
   */
  function heldTouches(store: PostgresTokenStore) {
    const log: string[] = []
    let gate: Promise<void> | undefined
    const state = { fail: false }
    const held: PostgresTokenStore = {
      ...store,
      async touch(batch) {
        log.push([...batch.keys()].join(','))
        try {
          await gate
          if (state.fail) throw new Error('touch failed')
          await store.touch(batch)
        } finally {
          log.push('end')
        }
      },
    }
    const hold = () => {
      let release!: () => void
      gate = new Promise<void>((resolve) => (release = resolve))
      return () => {
        gate = undefined
        release()
      }
    }
    return { store: held, log, state, hold }
  }
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

  it('uses while close() writes: one whose timer fires during its last write is written once, before close() resolves; one recorded during the write of that one is written too, by close() or by its timer', async () => {
    const store = await postgres.tokenStore()
    const touches = heldTouches(store)
    const errors: string[] = []
    // The service's clock stands still, so each use here waits for its timer (or close()): a
    // use `lastUsedFlushMs` after the last write is otherwise written at once. Creating the
    // three tokens took longer than that (30 to 200 ms): a's use was written at once, unheld,
    // close() waited for that write alone and resolved before b was used, and b's write was one
    // of a use after close(), which close() does not wait for (one run in four failed on a host
    // loaded past its cores, where b's write was still running after `await closing`).
    const clock = Date.now()
    const tokens = service(touches.store, { lastUsedFlushMs: 30, now: () => clock, onError: (_e, context) => errors.push(context) })
    const [a, b, c] = [await create(tokens), await create(tokens), await create(tokens)]
    await tokens.authenticate(a.token)
    let release = touches.hold()
    const closing = tokens.close()
    expect(touches.log).toEqual([a.id]) // close()'s own write, held
    await sleep(10)
    await tokens.authenticate(b.token)
    await sleep(60) // b's timer fires while a's write is held
    release = (release(), touches.hold())
    await expect.poll(() => touches.log, { timeout: 5_000, interval: 5 }).toEqual([a.id, 'end', b.id])
    await tokens.authenticate(c.token)
    release()
    await closing
    // b's write has ended; c's may be in flight (close() writes it, or its timer does).
    expect(touches.log.slice(0, 4)).toEqual([a.id, 'end', b.id, 'end'])
    expect((await store.get(b.id))?.lastUsedAt).toEqual(expect.any(Number))
    await expect.poll(() => touches.log, { timeout: 5_000, interval: 10 }).toEqual([a.id, 'end', b.id, 'end', c.id, 'end'])
    expect((await store.get(c.id))?.lastUsedAt).toEqual(expect.any(Number))
    expect(errors).toEqual([])
  })

  it('close()\'s last write failing: reported once, and neither it nor the uses recorded while it ran are written again (no timer left)', async () => {
    const store = await postgres.tokenStore()
    const touches = heldTouches(store)
    const errors: string[] = []
    // b's timer (300 ms) must not fire before close() has seen a's write fail: on a host loaded
    // past its cores, one of 20 ms did, and wrote b (a use written, not retried: no defect). The
    // clock stands still: a's use, 300 ms after the service began (slow creations), would be
    // written at once, before the hold (see the test above).
    const clock = Date.now()
    const tokens = service(touches.store, { lastUsedFlushMs: 300, now: () => clock, onError: (_e, context) => errors.push(context) })
    const [a, b] = [await create(tokens), await create(tokens)]
    await tokens.authenticate(a.token)
    const release = touches.hold()
    touches.state.fail = true
    const closing = tokens.close()
    expect(touches.log).toEqual([a.id])
    await sleep(10)
    await tokens.authenticate(b.token)
    release()
    await closing
    await sleep(400) // past b's timer, had it been kept
    expect({ log: touches.log, errors }).toEqual({ log: [a.id, 'end'], errors: ['last_used_at flush'] })
  })

  it('two instances, one rotating and one revoking the token at once: the revocation holds for both secrets on both instances, and a rotation that lost is told 409, no secret', async () => {
    const base = await postgres.tokenStore()
    const invalidations = createMemoryInvalidationBus()
    const options = { cacheTtlMs: 600_000, invalidations }
    const a = service(base, options)
    const b = service(createPostgresTokenStore({ pool: postgres.openPool({ max: 2 }), schema: base.schema }), options)
    try {
      for (let round = 0; round < 6; round++) {
        const made = await create(a)
        for (const tokens of [a, b]) expect((await tokens.authenticate(made.token)).ok).toBe(true) // cached on both
        const [rotated, revoked] = await Promise.allSettled([
          round % 2 === 0 ? a.rotate(made.id, { kind: 'session', userId: 'u_audit' }) : a.rotate(made.id, { kind: 'token', token: made.token }),
          b.revoke('u_audit', made.id),
        ])
        expect(revoked).toMatchObject({ status: 'fulfilled', value: { status: 'revoked' } })
        const secrets = [made.token]
        if (rotated.status === 'fulfilled') secrets.push(rotated.value.token)
        else expect([401, 409]).toContain((rotated.reason as { status: number }).status)
        for (const tokens of [a, b]) for (const secret of secrets) expect((await tokens.authenticate(secret)).ok, `round ${round}`).toBe(false)
        expect(await base.get(made.id)).toMatchObject({ revokedAt: expect.any(Number) })
      }
    } finally {
      await Promise.all([a.close(), b.close()])
    }
  })

  it('two instances, one editing the allowlist and one rotating at once: both land, and both instances judge the new secret by the new allowlist', async () => {
    const base = await postgres.tokenStore()
    const invalidations = createMemoryInvalidationBus()
    const options = { cacheTtlMs: 600_000, invalidations }
    const a = service(base, options)
    const b = service(createPostgresTokenStore({ pool: postgres.openPool({ max: 2 }), schema: base.schema }), options)
    try {
      for (let round = 0; round < 6; round++) {
        const made = await create(a)
        const [edited, rotated] = await Promise.all([
          a.update('u_audit', made.id, { allowedIps: ['10.0.0.0/8'] }),
          b.rotate(made.id, { kind: 'session', userId: 'u_audit' }),
        ])
        expect(edited.allowed_ips).toEqual(['10.0.0.0/8'])
        for (const tokens of [b, a]) {
          const auth = await tokens.authenticate(rotated.token)
          expect(auth.ok && auth.record.allowedIps, `round ${round}`).toEqual(['10.0.0.0/8'])
          expect((await tokens.authenticate(made.token)).ok).toBe(false)
        }
      }
    } finally {
      await Promise.all([a.close(), b.close()])
    }
  })

  it('a password reset on one instance while another creates tokens of the user: every token created before the reset (or in its millisecond) is revoked, whatever its create answered', async () => {
    const base = await postgres.tokenStore()
    const a = service(createPostgresTokenStore({ pool: postgres.openPool({ max: 4 }), schema: base.schema }))
    const b = service(base)
    try {
      const creations = Promise.allSettled(
        Array.from({ length: 24 }, (_, i) => new Promise((resolve) => setTimeout(resolve, i * 3)).then(() => create(a, 'u_reset', `racing ${i}`))),
      )
      await new Promise((resolve) => setTimeout(resolve, 30))
      const revoked = await b.revokeAllForUser('u_reset')
      const outcomes = await creations
      const { rows } = await postgres.pool.query(`SELECT reset_at FROM ${base.table.replace(/"$/, '_resets"')} WHERE user_id = 'u_reset'`)
      const resetAt = Number(rows[0].reset_at)
      for (const outcome of outcomes) {
        if (outcome.status === 'rejected') expect(outcome.reason).toMatchObject({ status: 409, code: 'ERR_TOKEN_INACTIVE' })
        else {
          const createdAt = Date.parse(outcome.value.created_at)
          expect((await a.authenticate(outcome.value.token)).ok).toBe(createdAt > resetAt)
        }
      }
      const listed = await b.list('u_reset')
      for (const view of listed) expect(view.status).toBe(Date.parse(view.created_at) > resetAt ? 'active' : 'revoked')
      expect(revoked).toBeLessThanOrEqual(listed.length)
    } finally {
      await Promise.all([a.close(), b.close()])
    }
  })

  it('a backend ended mid-statement (pg_terminate_backend): 503 at once, and the next calls on the same pool work; idle backends ended alike', async () => {
    const name = randomSchemaName().replace('mcpd_test_', 'mcpd_app_')
    const pool = postgres.openPool({ max: 2, application_name: name })
    const base = await postgres.tokenStore()
    const tokens = service(createPostgresTokenStore({ pool, schema: base.schema }), { storeTimeoutMs: 500 })
    const terminate = () => postgres.pool.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1', [name])
    try {
      // Connected first: a loaded host may take longer than storeTimeoutMs to open a connection.
      await pool.query('SELECT 1')
      const made = await create(tokens)
      const lock = await lockRow(postgres, base, made.id)
      const started = Date.now()
      // Its failure held at once: it comes while terminate() is awaited, before any check of it
      // (a rejection with no handler yet is reported as unhandled, and fails the run).
      const rotating = tokens.rotate(made.id, { kind: 'session', userId: 'u_audit' }).catch((error: unknown) => error)
      await new Promise((resolve) => setTimeout(resolve, 100))
      await terminate()
      expect(await rotating).toBeInstanceOf(StoreUnavailableError)
      expect(Date.now() - started).toBeLessThan(2_000)
      await lock.release()
      // The rotation never landed: the old secret still works, and the token rotates now.
      expect((await tokens.authenticate(made.token)).ok).toBe(true)
      // Every backend of the pool ended while idle: the pool drops them and connects anew.
      await terminate()
      await vi.waitFor(() => expect(pool.totalCount).toBe(0), { timeout: 3_000, interval: 10 })
      const rotated = await tokens.rotate(made.id, { kind: 'session', userId: 'u_audit' })
      expect((await tokens.authenticate(rotated.token)).ok).toBe(true)
      expect((await tokens.authenticate(made.token)).ok).toBe(false)
    } finally {
      await tokens.close()
    }
  })

  it('a statement held on a lock past the pool\'s statement_timeout: 503 within it, the rotation not landed, and the token rotates once the lock is gone', async () => {
    const base = await postgres.tokenStore()
    const errors: string[] = []
    // The pool's every statement is bounded (the calls that must succeed too): 1 s, room for a
    // loaded host's backend; below storeTimeoutMs, so the 503 is PostgreSQL's cancel.
    const pool = postgres.openPool({ max: 2, statement_timeout: 1_000 })
    const tokens = service(createPostgresTokenStore({ pool, schema: base.schema }), { storeTimeoutMs: 3_000, onError: (_e, context) => errors.push(context) })
    try {
      // Connected first: a loaded host may take longer than storeTimeoutMs to open a connection.
      await pool.query('SELECT 1')
      const made = await create(tokens)
      const lock = await lockRow(postgres, base, made.id)
      const started = Date.now()
      await expect(tokens.rotate(made.id, { kind: 'token', token: made.token })).rejects.toBeInstanceOf(StoreUnavailableError)
      // PostgreSQL's cancel at 1 s, not the store deadline at 3 s.
      expect(Date.now() - started).toBeLessThan(2_500)
      await lock.release()
      expect((await tokens.authenticate(made.token)).ok).toBe(true)
      const rotated = await tokens.rotate(made.id, { kind: 'token', token: made.token })
      expect((await tokens.authenticate(rotated.token)).ok).toBe(true)
      expect(errors).toEqual([])
    } finally {
      await tokens.close()
    }
  })

  it('an exhausted pool (its one connection held by a statement waiting on a lock): calls fail 503 at storeTimeoutMs, and a rotation that lands after its 503 is undone', async () => {
    const base = await postgres.tokenStore()
    const pool = postgres.openPool({ max: 1 })
    // The rotations sent, as they settle: the late one, then its undo.
    const rotations: Promise<unknown>[] = []
    const watched: PostgresQueryable = {
      query(query) {
        const answer = pool.query(query)
        if (query.name?.endsWith('_rotate')) rotations.push(answer.catch(() => {}))
        return answer
      },
    }
    const errors: string[] = []
    const tokens = service(createPostgresTokenStore({ pool: watched, schema: base.schema }), { storeTimeoutMs: 300, onError: (_e, context) => errors.push(context) })
    try {
      // Connected first: a loaded host may take longer than storeTimeoutMs to open a connection.
      await pool.query('SELECT 1')
      const made = await create(tokens)
      const lock = await lockRow(postgres, base, made.id)
      const started = Date.now()
      await expect(tokens.rotate(made.id, { kind: 'session', userId: 'u_audit' })).rejects.toBeInstanceOf(StoreUnavailableError)
      await expect(tokens.list('u_audit')).rejects.toBeInstanceOf(StoreUnavailableError)
      expect(Date.now() - started).toBeLessThan(2_000)
      await lock.release()
      // The rotation lands late; its caller holds the old secret, which is put back.
      await expect.poll(() => rotations.length, { timeout: 3_000, interval: 20 }).toBe(2)
      await Promise.all(rotations)
      expect((await base.get(made.id))?.tokenHash).toBe(hashApiToken(made.token))
      expect((await tokens.authenticate(made.token)).ok).toBe(true)
      expect(await tokens.list('u_audit')).toHaveLength(1)
      expect(errors).toEqual([])
    } finally {
      await tokens.close()
    }
  })
})

describe.runIf(bouncer !== undefined)('PostgreSQL token store behind PgBouncer (transaction mode) under concurrency and faults', () => {
  const postgres = usePostgres(bouncer?.url)
  const direct = usePostgres()

  it('with preparedStatements false, two instances of many clients on two server connections create, rotate, revoke and flush at once without an error', async () => {
    const base = await postgres.tokenStore({ preparedStatements: false })
    const invalidations = createMemoryInvalidationBus()
    const errors: unknown[] = []
    const options = { cacheTtlMs: 600_000, invalidations, onError: (e: unknown) => errors.push(e) }
    const stores = [0, 1].map(() => createPostgresTokenStore({ pool: postgres.openPool({ max: 6 }), schema: base.schema, preparedStatements: false }))
    const [a, b] = stores.map((store) => service(store, options)) as [TokenService, TokenService]
    try {
      const outcomes = await Promise.allSettled(
        Array.from({ length: 12 }, async (_, i) => {
          const [one, other] = i % 2 === 0 ? [a, b] : [b, a]
          const made = await create(one, `u_bouncer_${i % 3}`)
          expect((await other.authenticate(made.token)).ok).toBe(true)
          const rotated = await other.rotate(made.id, { kind: 'token', token: made.token })
          expect((await one.authenticate(made.token)).ok).toBe(false)
          expect((await one.authenticate(rotated.token)).ok).toBe(true)
          await one.flush()
          if (i % 4 === 0) await other.revoke(`u_bouncer_${i % 3}`, made.id)
        }),
      )
      expect(outcomes.filter((outcome) => outcome.status === 'rejected')).toEqual([])
      expect(await b.revokeAllForUser('u_bouncer_1')).toBe(3)
      expect(errors).toEqual([])
    } finally {
      await Promise.all([a.close(), b.close()])
    }
  })

  it('the server connections behind PgBouncer ended (pg_terminate_backend), idle and mid-statement: 503, never a 500 or an allow, and the next calls work', async () => {
    const name = randomSchemaName().replace('mcpd_test_', 'mcpd_app_')
    const base = await postgres.tokenStore({ preparedStatements: false })
    const pool = postgres.openPool({ max: 3, application_name: name })
    const tokens = service(createPostgresTokenStore({ pool, schema: base.schema, preparedStatements: false }), { storeTimeoutMs: 500 })
    // PgBouncer hands the client's application_name to the server connection it runs on.
    const terminate = () => direct.pool.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1', [name])
    try {
      const made = await create(tokens)
      const lock = await lockRow(direct, base, made.id)
      // Its failure held at once, as above.
      const rotating = tokens.rotate(made.id, { kind: 'session', userId: 'u_audit' }).catch((error: unknown) => error)
      await new Promise((resolve) => setTimeout(resolve, 100))
      expect((await terminate()).rowCount).toBeGreaterThan(0)
      expect(await rotating).toBeInstanceOf(StoreUnavailableError)
      await lock.release()
      await terminate()
      const outcomes = await Promise.allSettled(Array.from({ length: 6 }, () => tokens.authenticate(made.token)))
      for (const outcome of outcomes) {
        if (outcome.status === 'rejected') expect(outcome.reason).toBeInstanceOf(StoreUnavailableError)
        else expect(outcome.value.ok).toBe(true)
      }
      await expect.poll(async () => (await tokens.authenticate(made.token)).ok, { timeout: 3_000, interval: 50 }).toBe(true)
      const rotated = await tokens.rotate(made.id, { kind: 'session', userId: 'u_audit' })
      expect((await tokens.authenticate(rotated.token)).ok).toBe(true)
    } finally {
      await tokens.close()
    }
  })
})
