/**
 * Upgrading in place: what an earlier version of the library left in PostgreSQL and Redis, read
 * by this one. Platforms upgrade the package while their tables and Redis keys stay. The state is
 * written here as the earlier versions wrote it (their migration, rows and values copied from
 * them). (Tokens of builds before the checksum covered the prefix, as DESIGN.md has it, are
 * malformed: those builds were never released.)
 */
import { createHash } from 'node:crypto'
import {
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createTokenService,
  generateApiToken,
  hashApiToken,
} from 'mcp-dispatch'
import { createPostgresTokenStore } from 'mcp-dispatch/postgres'
import { createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
import pg from 'pg'
import { afterAll, describe, expect, it } from 'vitest'
import { POSTGRES_URL, postgresUnavailable, randomSchemaName, usePostgres } from '../helpers/postgres.js'
import { describeRedis } from '../helpers/redis.js'

const unavailable = await postgresUnavailable()

const DAY = 86_400_000
/** The token table as schema version 1 (before the resets table) created it. */
function versionOneMigration(schema: string, table: string): string {
  return `CREATE SCHEMA "${schema}";
CREATE TABLE "${schema}"."${table}" (
  id text NOT NULL, user_id text NOT NULL, name text NOT NULL, token_hash text NOT NULL,
  display_prefix text NOT NULL, servers text[] NOT NULL, allowed_ips text[],
  expires_at bigint NOT NULL, created_at bigint NOT NULL, last_used_at bigint, revoked_at bigint,
  CONSTRAINT "${table}_pkey" PRIMARY KEY (id)
);
CREATE UNIQUE INDEX "${table}_token_hash_key" ON "${schema}"."${table}" (token_hash);
CREATE INDEX "${table}_user_id_idx" ON "${schema}"."${table}" (user_id);`
}

describe.skipIf(unavailable !== undefined)('a PostgreSQL table and tokens of an earlier version', () => {
  const postgres = usePostgres()
  const schemas: string[] = []
  afterAll(async () => {
    for (const schema of schemas) await postgres.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
  })

  it('migrate() upgrades the version-1 table in place, idempotently, and every token its users hold still authenticates, lists, rotates and revokes', async () => {
    const schema = randomSchemaName()
    schemas.push(schema)
    const table = 'mcp_dispatch_api_tokens'
    await postgres.pool.query(versionOneMigration(schema, table))
    const held = [generateApiToken(), generateApiToken(), generateApiToken(), generateApiToken()]
    const now = Date.now()
    const rows = held.map((token, i) => ({
      id: `tok_${i}`,
      token,
      allowed: i === 1 ? ['10.0.0.0/8'] : null,
      revoked: i === 3 ? now - 1_000 : null,
    }))
    for (const row of rows) {
      await postgres.pool.query(
        `INSERT INTO "${schema}"."${table}" VALUES ($1, 'alice', $2, $3, $4, $5, $6, $7, $8, NULL, $9)`,
        [row.id, `token ${row.id}`, hashApiToken(row.token), row.token.slice(0, 12), ['app_1'], row.allowed, now + 30 * DAY, now - DAY, row.revoked],
      )
    }

    const store = createPostgresTokenStore({ pool: postgres.pool, schema })
    await store.migrate()
    await store.migrate()
    const tables = await postgres.pool.query<{ table_name: string }>(
      `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name`,
      [schema],
    )
    expect(tables.rows.map((r) => r.table_name)).toEqual([table, `${table}_resets`])
    const { rows: kept } = await postgres.pool.query(`SELECT count(*)::int AS n FROM "${schema}"."${table}"`)
    expect(kept[0].n).toBe(held.length)

    const apps = createMemoryAppStore([{ id: 'app_1', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_1', active: true }])
    const tokens = createTokenService({ store, apps, subscriptions })
    try {
      for (const [i, token] of held.slice(0, 3).entries()) {
        const result = await tokens.authenticate(token, '10.1.2.3')
        expect(result, `token ${i}`).toMatchObject({ ok: true, record: { id: `tok_${i}` } })
      }
      expect(await tokens.authenticate(held[3]!)).toEqual({ ok: false, reason: 'revoked' })
      await tokens.flush()
      expect((await tokens.list('alice')).map((t) => [t.id, t.status])).toEqual([
        ['tok_0', 'active'],
        ['tok_1', 'active'],
        ['tok_2', 'active'],
        ['tok_3', 'revoked'],
      ])
      // A headless client rotates its own token with the secret it holds.
      const rotated = await tokens.rotate('tok_0', { kind: 'token', token: held[0]! })
      expect(await tokens.authenticate(rotated.token)).toMatchObject({ ok: true, record: { id: 'tok_0' } })
      expect(await tokens.authenticate(held[0]!)).toEqual({ ok: false, reason: 'unknown' })
      expect((await tokens.revoke('alice', 'tok_2')).status).toBe('revoked')
      expect(await tokens.authenticate(held[2]!)).toEqual({ ok: false, reason: 'revoked' })
      expect(await tokens.revokeAllForUser('alice')).toBe(2)
      expect(await tokens.authenticate(held[1]!, '10.1.2.3')).toEqual({ ok: false, reason: 'revoked' })
    } finally {
      await tokens.close()
    }
  })

  it('a store of this version and one of an earlier version share a connection (two copies of the package in one process, one pool): their statements are prepared under names of their own', async () => {
    const store = await postgres.tokenStore()
    const now = Date.now()
    const record = {
      id: 'tok_1', userId: 'alice', name: 'one', tokenHash: hashApiToken(generateApiToken()), displayPrefix: 'svc_abcdefgh',
      servers: ['app_1'], allowedIps: null, expiresAt: now + DAY, createdAt: now, lastUsedAt: null, revokedAt: null,
    }
    await store.insert(record)
    const client = new pg.Client({ connectionString: POSTGRES_URL })
    await client.connect()
    try {
      // The earlier version's statements (version 1: no resets table) under its names: a digest
      // of the table's name alone.
      const table = `"${store.schema}"."mcp_dispatch_api_tokens"`
      const columns = 'id, user_id, name, token_hash, display_prefix, servers, allowed_ips, expires_at, created_at, last_used_at, revoked_at'
      const earlierName = `mcp_dispatch_${createHash('sha256').update(table).digest('hex').slice(0, 12)}`
      await client.query({ name: `${earlierName}_find_by_hash`, text: `SELECT ${columns} FROM ${table} WHERE token_hash = $1`, values: [record.tokenHash] })
      await client.query({ name: `${earlierName}_get`, text: `SELECT ${columns} FROM ${table} WHERE id = $1`, values: [record.id] })
      // Before, node-postgres refused the other text under the same name: 503 on every lookup.
      const current = createPostgresTokenStore({ pool: client, schema: store.schema })
      expect(await current.findByHash(record.tokenHash)).toEqual(record)
      expect(await current.get(record.id)).toEqual(record)
      // And the earlier version's statements still run on that connection.
      const { rows } = await client.query({ name: `${earlierName}_find_by_hash`, text: `SELECT ${columns} FROM ${table} WHERE token_hash = $1`, values: [record.tokenHash] })
      expect(rows.map((r: { id: string }) => r.id)).toEqual([record.id])
    } finally {
      await client.end()
    }
  })
})

describeRedis('Redis values of an earlier version', (redis) => {
  it('a session pin written before pins carried their write id (`w`) is read, kept and ended by the session store', async () => {
    const prefix = redis.prefix()
    await redis.client.set(`${prefix}session:s1`, JSON.stringify({ appId: 'app_1', version: '1.0.0', subject: 'alice' }), 'PX', 60_000)
    const sessions = createRedisSessionStore({ client: redis.client, prefix })
    expect(await sessions.get('s1', 60_000)).toEqual({ appId: 'app_1', version: '1.0.0', subject: 'alice' })
    expect(await sessions.set('s1', { appId: 'app_1', version: '2.0.0', subject: 'alice' }, 60_000)).toBe(false)
    expect(await sessions.get('s1', 60_000)).toEqual({ appId: 'app_1', version: '1.0.0', subject: 'alice' })
    await sessions.delete('s1')
    expect(await sessions.get('s1', 60_000)).toBeUndefined()
  })

  it('a rate-limit counter written before it kept the window it replaced (`{ w, c }`, a TTL of one window) counts on', async () => {
    const prefix = redis.prefix()
    const window = Math.floor(Date.now() / 60_000) * 60_000
    const key = `app_1\u0000alice\u0000minute`
    await redis.client.hset(`${prefix}rl:${key}`, 'w', String(window), 'c', '7')
    await redis.client.pexpire(`${prefix}rl:${key}`, 60_000)
    const counters = createRedisRateLimitStore({ client: redis.client, prefix })
    expect(await counters.increment(key, window, 60_000)).toBe(8)
    expect(await counters.increment(key, window + 60_000, 60_000)).toBe(1)
    expect(await counters.increment(key, window, 60_000)).toBe(9)
  })
})
