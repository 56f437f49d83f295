/**
 * Differential model check of the token stores: the same random sequence of operations runs
 * against a reference model written from the `TokenStore` doc comments (src/core/stores.ts) and
 * docs/stores.md, the in-memory store and the PostgreSQL store, and every answer is compared.
 * The values are drawn from small pools, so ids, hashes, users and times collide: equal
 * timestamps, expiry exactly at `now` and at a reset, duplicate inserts, operations on revoked,
 * expired and unknown ids, empty strings, unicode, long ids, odd array entries.
 *
 * What the conformance suite (test/stores/conformance.ts) checks case by case, this checks over
 * sequences; the order of `listByUser` and `revokeAllForUser` is not part of the contract
 * (the token service sorts), so lists are compared as sets.
 */
import fc from 'fast-check'
import { type ApiTokenPatch, type ApiTokenRecord, type TokenStore, createMemoryTokenStore } from 'mcp-dispatch'
import type { PostgresTokenStore } from 'mcp-dispatch/postgres'
import { beforeAll, describe, expect, it } from 'vitest'
import { postgresUnavailable, usePostgres } from '../helpers/postgres.js'

const unavailable = await postgresUnavailable()

const T0 = 1_700_000_000_000
const IDS = ['t1', 't2', 't3', '', 'ü名🎉 id', 'x'.repeat(600)]
const USERS = ['u1', 'u2', '', 'Ünï 用户 🙂']
const HASHES = ['h1', 'h2', 'h3', 'h4', 'H1', '']
const NAMES = ['', 'CI token', 'ñame 🎉', 'a'.repeat(100), '  spaced  ', `quote'"\\`]
const SERVERS: readonly (readonly string[])[] = [[], ['app_1'], ['app_1', 'app_2'], ['NULL', '', 'a,b', '{x}', '"q"', 'back\\slash']]
const IPS: readonly (readonly string[] | null)[] = [null, [], ['10.0.0.0/8'], ['2001:DB8::1', '10.1.2.3/8']]

const time = fc.oneof(
  { weight: 10, arbitrary: fc.integer({ min: 0, max: 8 }).map((o) => T0 + o) },
  { weight: 1, arbitrary: fc.constantFrom(0, -1, Number.MAX_SAFE_INTEGER) },
)
const id = fc.constantFrom(...IDS)
const user = fc.constantFrom(...USERS)
const hash = fc.constantFrom(...HASHES)

type Op =
  | { op: 'insert'; record: ApiTokenRecord }
  | { op: 'get'; id: string }
  | { op: 'findByHash'; hash: string }
  | { op: 'listByUser'; user: string }
  | { op: 'countActiveByUser'; user: string; at: number }
  | { op: 'update'; id: string; patch: ApiTokenPatch; expected?: number }
  | { op: 'rotate'; id: string; hash: string; prefix: string; expected?: string }
  | { op: 'revoke'; id: string; at: number }
  | { op: 'revokeAllForUser'; user: string; at: number }
  | { op: 'touch'; entries: [string, number][] }

const record: fc.Arbitrary<ApiTokenRecord> = fc.record({
  id,
  userId: user,
  name: fc.constantFrom(...NAMES),
  tokenHash: hash,
  displayPrefix: fc.constantFrom('svc_abcdefgh', '', 'svc_ü名🎉'),
  servers: fc.constantFrom(...SERVERS),
  allowedIps: fc.constantFrom(...IPS),
  createdAt: time,
  expiresAt: time,
  lastUsedAt: fc.option(time, { freq: 4 }),
  revokedAt: fc.option(time, { freq: 4 }),
})

const patch: fc.Arbitrary<ApiTokenPatch> = fc.record(
  { name: fc.constantFrom(...NAMES), expiresAt: time, allowedIps: fc.constantFrom(...IPS) },
  { requiredKeys: [] },
)

const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 6, arbitrary: record.map((r): Op => ({ op: 'insert', record: r })) },
  { weight: 2, arbitrary: id.map((i): Op => ({ op: 'get', id: i })) },
  { weight: 2, arbitrary: hash.map((h): Op => ({ op: 'findByHash', hash: h })) },
  { weight: 2, arbitrary: user.map((u): Op => ({ op: 'listByUser', user: u })) },
  { weight: 2, arbitrary: fc.tuple(user, time).map(([u, at]): Op => ({ op: 'countActiveByUser', user: u, at })) },
  {
    weight: 3,
    arbitrary: fc
      .tuple(id, patch, fc.option(time, { nil: undefined }))
      .map(([i, p, e]): Op => (e === undefined ? { op: 'update', id: i, patch: p } : { op: 'update', id: i, patch: p, expected: e })),
  },
  {
    weight: 3,
    arbitrary: fc
      .tuple(id, hash, fc.option(hash, { nil: undefined }))
      .map(([i, h, e]): Op => (e === undefined ? { op: 'rotate', id: i, hash: h, prefix: 'svc_rotated_' } : { op: 'rotate', id: i, hash: h, prefix: 'svc_rotated_', expected: e })),
  },
  { weight: 3, arbitrary: fc.tuple(id, time).map(([i, at]): Op => ({ op: 'revoke', id: i, at })) },
  { weight: 2, arbitrary: fc.tuple(user, time).map(([u, at]): Op => ({ op: 'revokeAllForUser', user: u, at })) },
  {
    weight: 2,
    arbitrary: fc.uniqueArray(fc.tuple(id, time), { selector: ([i]) => i, maxLength: 3 }).map((entries): Op => ({ op: 'touch', entries })),
  },
)

/**
 * The reference model, from the doc comments of `TokenStore`: the stored records, and each
 * user's last (greatest) password reset. A token of the user created at or before that reset
 * and expiring after it reads as revoked at it (inserted, read, updated or rotated); a reset
 * older than the one recorded does not move it back; `revokeAllForUser` first writes the
 * previous reset's revocations into the records it reaches (only the last reset is kept).
 */
function createModel(): TokenStore {
  const byId = new Map<string, ApiTokenRecord>()
  const resets = new Map<string, number>()
  const effective = (r: ApiTokenRecord): ApiTokenRecord => {
    if (r.revokedAt !== null) return r
    const reset = resets.get(r.userId)
    return reset !== undefined && reset >= r.createdAt && reset < r.expiresAt ? { ...r, revokedAt: reset } : r
  }
  const holder = (h: string) => [...byId.values()].find((r) => r.tokenHash === h)
  return {
    insert(r) {
      if (byId.has(r.id)) throw new TypeError('duplicate token id')
      if (holder(r.tokenHash)) throw new TypeError('duplicate token hash')
      byId.set(r.id, { ...r })
      return effective(byId.get(r.id)!)
    },
    findByHash(h) {
      const r = holder(h)
      return r && effective(r)
    },
    get(i) {
      const r = byId.get(i)
      return r && effective(r)
    },
    listByUser: (u) => [...byId.values()].filter((r) => r.userId === u).map(effective),
    countActiveByUser: (u, at) => [...byId.values()].map(effective).filter((r) => r.userId === u && r.revokedAt === null && r.expiresAt > at).length,
    update(i, p, expected) {
      const stored = byId.get(i)
      if (!stored || effective(stored).revokedAt !== null) return undefined
      if (expected !== undefined && stored.expiresAt !== expected) return undefined
      const next = {
        ...stored,
        ...(p.name !== undefined && { name: p.name }),
        ...(p.expiresAt !== undefined && { expiresAt: p.expiresAt }),
        ...(p.allowedIps !== undefined && { allowedIps: p.allowedIps }),
      }
      byId.set(i, next)
      return effective(next)
    },
    rotate(i, next, expected) {
      const stored = byId.get(i)
      if (!stored || effective(stored).revokedAt !== null) return undefined
      if (expected !== undefined && stored.tokenHash !== expected) return undefined
      const other = holder(next.tokenHash)
      if (other && other.id !== i) throw new TypeError('duplicate token hash')
      const rotated = { ...stored, ...next }
      byId.set(i, rotated)
      return effective(rotated)
    },
    revoke(i, at) {
      const stored = byId.get(i)
      if (!stored) return undefined
      const current = effective(stored)
      if (current.revokedAt !== null || at >= current.expiresAt) {
        byId.set(i, current)
        return current
      }
      const revoked = { ...current, revokedAt: at }
      byId.set(i, revoked)
      return revoked
    },
    revokeAllForUser(u, at) {
      const out: ApiTokenRecord[] = []
      for (const [i, stored] of byId) {
        if (stored.userId !== u) continue
        const current = effective(stored)
        byId.set(i, current)
      }
      resets.set(u, Math.max(resets.get(u) ?? at, at))
      for (const [i, stored] of byId) {
        if (stored.userId !== u || stored.revokedAt !== null || stored.expiresAt <= at) continue
        const revoked = { ...stored, revokedAt: at }
        byId.set(i, revoked)
        out.push(revoked)
      }
      return out
    },
    touch(lastUsed) {
      for (const [i, at] of lastUsed) {
        const stored = byId.get(i)
        if (stored && (stored.lastUsedAt === null || stored.lastUsedAt < at)) byId.set(i, { ...stored, lastUsedAt: at })
      }
    },
  }
}

/** A plain copy of a record (frozen arrays as arrays), or of a list of them sorted by id. */
function plain(value: unknown): unknown {
  if (Array.isArray(value)) {
    return value
      .map((r) => plain(r) as ApiTokenRecord)
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
  }
  if (value === undefined || value === null || typeof value !== 'object') return value
  const r = value as ApiTokenRecord
  return { ...r, servers: [...r.servers], allowedIps: r.allowedIps === null ? null : [...r.allowedIps] }
}

type Outcome = { ok: unknown } | { error: string }

async function apply(store: TokenStore, o: Op): Promise<Outcome> {
  try {
    const answer = await (async () => {
      switch (o.op) {
        case 'insert':
          return store.insert(o.record)
        case 'get':
          return store.get(o.id)
        case 'findByHash':
          return store.findByHash(o.hash)
        case 'listByUser':
          return store.listByUser(o.user)
        case 'countActiveByUser':
          return store.countActiveByUser!(o.user, o.at)
        case 'update':
          return store.update(o.id, o.patch, o.expected)
        case 'rotate':
          return store.rotate(o.id, { tokenHash: o.hash, displayPrefix: o.prefix }, o.expected)
        case 'revoke':
          return store.revoke(o.id, o.at)
        case 'revokeAllForUser':
          return store.revokeAllForUser(o.user, o.at)
        case 'touch':
          return store.touch(new Map(o.entries))
      }
    })()
    return { ok: plain(answer) }
  } catch (error) {
    return { error: error instanceof TypeError ? 'TypeError' : `${(error as Error).name}: ${(error as Error).message}` }
  }
}

/** The state of every pool id and user, read at the end of a sequence. */
async function snapshot(store: TokenStore): Promise<unknown> {
  const out: Record<string, unknown> = {}
  for (const i of IDS) out[`get ${i.slice(0, 20)}`] = plain(await store.get(i))
  for (const h of HASHES) out[`hash ${h}`] = plain(await store.findByHash(h))
  for (const u of USERS) out[`list ${u}`] = plain(await store.listByUser(u))
  for (const u of USERS) for (const at of [T0, T0 + 4, T0 + 8]) out[`count ${u} ${at}`] = await store.countActiveByUser!(u, at)
  return out
}

async function run(stores: Record<string, TokenStore>, ops: readonly Op[]): Promise<void> {
  const names = Object.keys(stores)
  for (const [n, o] of ops.entries()) {
    const outcomes: Record<string, Outcome> = {}
    for (const name of names) outcomes[name] = await apply(stores[name]!, o)
    for (const name of names.slice(1)) {
      expect(outcomes[name], `op ${n} ${JSON.stringify(o)}: ${name} vs ${names[0]}`).toEqual(outcomes[names[0]!])
    }
  }
  const first = await snapshot(stores[names[0]!]!)
  for (const name of names.slice(1)) expect(await snapshot(stores[name]!), `final state: ${name} vs ${names[0]}`).toEqual(first)
}

const RUNS = Number(process.env.STORE_DIFF_RUNS ?? 60)

describe('token stores, differential: model and memory', () => {
  it('answer the same to random sequences of operations', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 20, maxLength: 40 }), async (ops) => {
        await run({ model: createModel(), memory: createMemoryTokenStore() }, ops)
      }),
      { numRuns: RUNS * 5 },
    )
  })
})

describe.skipIf(unavailable !== undefined)('token stores, differential: model, memory and PostgreSQL', () => {
  const postgres = usePostgres()
  let store: PostgresTokenStore & { readonly schema: string }
  beforeAll(async () => {
    store = await postgres.tokenStore()
  })
  const fresh = async () => {
    await postgres.pool.query(`TRUNCATE ${store.table}, "${store.schema}"."mcp_dispatch_api_tokens_resets"`)
    return store
  }

  it('answer the same to random sequences of operations', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 20, maxLength: 40 }), async (ops) => {
        await run({ model: createModel(), memory: createMemoryTokenStore(), postgres: await fresh() }, ops)
      }),
      { numRuns: RUNS },
    )
  }, 120_000)
})
