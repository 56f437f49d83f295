/**
 * The PostgreSQL token store against a real PostgreSQL: the shared conformance suite (with
 * named and with unnamed statements), the migration, option validation, what reaches the
 * database per call, concurrency between instances, and failures.
 */
import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import * as net from 'node:net'
import {
  type ApiTokenRecord,
  ConfigurationError,
  ConflictError,
  StoreUnavailableError,
  type TokenStore,
  createMemoryAppStore,
  createMemoryInvalidationBus,
  createTokenApi,
  createTokenService,
  hashApiToken,
} from 'mcp-dispatch'
import {
  DEFAULT_POSTGRES_TOKEN_TABLE,
  type PostgresQuery,
  type PostgresQueryable,
  type PostgresTokenStore,
  createPostgresTokenStore,
  postgresTokenStoreMigration,
} from 'mcp-dispatch/postgres'
import pg from 'pg'
import { describe, expect, it, vi } from 'vitest'
import { POSTGRES_URL, postgresUnavailable, randomSchemaName, unreachablePostgresUrl, usePostgres } from '../helpers/postgres.js'
import { describeTokenStoreConformance, makeTokenRecord } from './conformance.js'

const unavailable = await postgresUnavailable()

/** Wraps a client so every query it is sent is recorded (the database still answers). */
function recording(client: PostgresQueryable): { client: PostgresQueryable; queries: PostgresQuery[] } {
  const queries: PostgresQuery[] = []
  return {
    queries,
    client: {
      query(query) {
        queries.push(query)
        return client.query(query)
      },
    },
  }
}

/**
 * Inserts records in one statement, in the order given, so they lie in the table in that
 * order (what a scan by user meets first). The store inserts one record per statement.
 */
async function insertInOrder(pool: pg.Pool, store: PostgresTokenStore, records: readonly ApiTokenRecord[]): Promise<void> {
  const rows = records.map((r) => ({
    id: r.id,
    user_id: r.userId,
    name: r.name,
    token_hash: r.tokenHash,
    display_prefix: r.displayPrefix,
    servers: r.servers,
    allowed_ips: r.allowedIps,
    expires_at: r.expiresAt,
    created_at: r.createdAt,
    last_used_at: r.lastUsedAt,
    revoked_at: r.revokedAt,
  }))
  await pool.query(`INSERT INTO ${store.table} SELECT * FROM jsonb_populate_recordset(NULL::${store.table}, $1::jsonb)`, [
    JSON.stringify(rows),
  ])
}

/**
 * A TCP proxy to PostgreSQL on 127.0.0.1 that asks `decide` about each chunk a client sends:
 * `pass` it on; `drop-reply`: pass it on and drop the connection instead of the reply (a
 * failover or a pooler restart after COMMIT); `drop-client`: drop the client's connection at
 * once and hand the chunk to the server 300 ms later (a statement the server has, run after
 * its client is gone).
 */
async function startPostgresProxy(decide: (chunk: Buffer) => 'pass' | 'drop-reply' | 'drop-client') {
  const where = new URL(POSTGRES_URL)
  const sockets = new Set<net.Socket>()
  const proxy = net.createServer((client) => {
    const server = net.connect(Number(where.port || 5432), where.hostname)
    sockets.add(client).add(server)
    let cut = false
    const end = () => {
      client.destroy()
      server.destroy()
    }
    client.on('data', (chunk) => {
      const decision = decide(chunk)
      if (decision === 'pass') return void (cut || server.write(chunk))
      cut = true
      if (decision === 'drop-reply') return void server.write(chunk)
      client.destroy()
      setTimeout(() => server.write(chunk), 300)
    })
    // Once cut, the server's connection lives until it answers (the statement has run).
    server.on('data', (chunk) => (cut ? end() : client.write(chunk)))
    client.on('error', () => !cut && end()).on('close', () => !cut && end())
    server.on('error', end).on('close', end)
  })
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve))
  return {
    url: `postgres://${where.username}@127.0.0.1:${(proxy.address() as net.AddressInfo).port}${where.pathname}`,
    async close() {
      for (const socket of sockets) socket.destroy()
      await new Promise((resolve) => proxy.close(resolve))
    },
  }
}

describe.skipIf(unavailable !== undefined)('PostgreSQL token store', () => {
  const postgres = usePostgres()
  const teardown = (store: TokenStore) => postgres.drop(store as PostgresTokenStore)

  describeTokenStoreConformance('postgres', () => postgres.tokenStore(), { teardown })
  describeTokenStoreConformance(
    'postgres, unnamed statements (PgBouncer transaction mode)',
    () => postgres.tokenStore({ preparedStatements: false }),
    { teardown },
  )

  describe('migration', () => {
    it('creates the table, its unique hash index and its user index; a second run changes nothing', async () => {
      const store = await postgres.tokenStore()
      const record = makeTokenRecord()
      await store.insert(record)
      await store.migrate()
      expect(await store.get(record.id)).toEqual(record)

      const columns = await postgres.pool.query(
        `SELECT column_name, data_type, is_nullable FROM information_schema.columns
         WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position`,
        [store.schema, DEFAULT_POSTGRES_TOKEN_TABLE],
      )
      expect(columns.rows.map((c) => `${c.column_name} ${c.data_type} ${c.is_nullable}`)).toEqual([
        'id text NO',
        'user_id text NO',
        'name text NO',
        'token_hash text NO',
        'display_prefix text NO',
        'servers ARRAY NO',
        'allowed_ips ARRAY YES',
        'expires_at bigint NO',
        'created_at bigint NO',
        'last_used_at bigint YES',
        'revoked_at bigint YES',
      ])
      const indexes = await postgres.pool.query(
        'SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname',
        [store.schema],
      )
      expect(indexes.rows.map((i) => i.indexdef.replace(/ ON \S+ USING/, ' ON t USING'))).toEqual([
        'CREATE UNIQUE INDEX mcp_dispatch_api_tokens_pkey ON t USING btree (id)',
        'CREATE UNIQUE INDEX mcp_dispatch_api_tokens_resets_pkey ON t USING btree (user_id)',
        'CREATE UNIQUE INDEX mcp_dispatch_api_tokens_token_hash_key ON t USING btree (token_hash)',
        'CREATE INDEX mcp_dispatch_api_tokens_user_id_idx ON t USING btree (user_id)',
      ])
      // Beside it, each user's last password reset.
      const resets = await postgres.pool.query(
        `SELECT column_name, data_type, is_nullable FROM information_schema.columns
         WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position`,
        [store.schema, `${DEFAULT_POSTGRES_TOKEN_TABLE}_resets`],
      )
      expect(resets.rows.map((c) => `${c.column_name} ${c.data_type} ${c.is_nullable}`)).toEqual(['user_id text NO', 'reset_at bigint NO'])
    })

    it('instances that migrate at the same moment all succeed (advisory lock)', async () => {
      const schema = randomSchemaName()
      const pool = postgres.openPool({ max: 6 })
      const stores = Array.from({ length: 6 }, () => createPostgresTokenStore({ pool, schema }))
      try {
        const results = await Promise.allSettled(stores.map((s) => s.migrate()))
        expect(results.filter((r) => r.status === 'rejected')).toEqual([])
        const record = makeTokenRecord()
        await stores[0]!.insert(record)
        expect(await stores[5]!.findByHash(record.tokenHash)).toEqual(record)
      } finally {
        await postgres.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
      }
    })

    it('instances that migrate one table of the public schema at the same moment all succeed (the table\'s advisory lock: public takes no schema lock)', async () => {
      const table = randomSchemaName().replace('mcpd_test_', 'mcpd_public_')
      const pool = postgres.openPool({ max: 6 })
      const drop = () => postgres.pool.query(`DROP TABLE IF EXISTS public."${table}", public."${table}_resets"`)
      try {
        for (let round = 0; round < 3; round++) {
          const stores = Array.from({ length: 6 }, () => createPostgresTokenStore({ pool, table }))
          const results = await Promise.allSettled(stores.map((s) => s.migrate()))
          expect(results.filter((r) => r.status === 'rejected')).toEqual([])
          await drop()
        }
      } finally {
        await drop()
      }
    })

    it('tables of one new schema migrated at the same moment all succeed (the schema is created once)', async () => {
      const schema = randomSchemaName()
      const pool = postgres.openPool({ max: 8 })
      try {
        for (let round = 0; round < 3; round++) {
          const stores = Array.from({ length: 8 }, (_, i) => createPostgresTokenStore({ pool, schema, table: `t${round}_${i % 2}` }))
          const results = await Promise.allSettled(stores.map((s) => s.migrate()))
          expect(results.filter((r) => r.status === 'rejected')).toEqual([])
          await postgres.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
        }
      } finally {
        await postgres.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
      }
    })

    it('a role with CREATE on the existing schema, and none on the database, can migrate', async () => {
      const schema = randomSchemaName()
      const role = schema.replace('mcpd_test_', 'mcpd_role_')
      await postgres.pool.query(`CREATE SCHEMA "${schema}"`)
      await postgres.pool.query(`CREATE ROLE ${role} LOGIN`)
      try {
        await postgres.pool.query(`REVOKE CREATE ON DATABASE "${new URL(POSTGRES_URL).pathname.slice(1)}" FROM ${role}`)
        await postgres.pool.query(`GRANT USAGE, CREATE ON SCHEMA "${schema}" TO ${role}`)
        const url = new URL(POSTGRES_URL)
        url.username = role
        const pool = postgres.openPool({ connectionString: url.href, max: 1 })
        const store = createPostgresTokenStore({ pool, schema })
        await store.migrate()
        await store.migrate()
        const record = makeTokenRecord()
        await store.insert(record)
        expect(await store.findByHash(record.tokenHash)).toEqual(record)
        await pool.end()
      } finally {
        await postgres.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
        await postgres.pool.query(`DROP OWNED BY ${role}`)
        await postgres.pool.query(`DROP ROLE ${role}`)
      }
    })

    it('is exported as SQL text: the default names, no CREATE SCHEMA for public', () => {
      const sql = postgresTokenStoreMigration()
      expect(sql).toContain('CREATE TABLE IF NOT EXISTS "public"."mcp_dispatch_api_tokens"')
      expect(sql).not.toContain('CREATE SCHEMA')
      const custom = postgresTokenStoreMigration({ schema: 'mcp', table: 'api_tokens' })
      expect(custom).toContain(`IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'mcp') THEN CREATE SCHEMA "mcp"; END IF;`)
      expect(custom).toContain('CREATE UNIQUE INDEX "api_tokens_token_hash_key" ON "mcp"."api_tokens" (token_hash);')
    })

    it('a relation that holds the name of the unique hash index makes migrate fail loudly, not leave hashes unchecked (regression)', async () => {
      const squatter = await postgres.tokenStore({ table: 'tok_token_hash_key' })
      const store = createPostgresTokenStore({ pool: postgres.pool, schema: squatter.schema, table: 'tok' })
      await expect(store.migrate()).rejects.toThrow(/unique index on token_hash/)
    })

    it("a table that holds the name of the resets table (another store's token table) makes migrate fail loudly, not every call after it (regression)", async () => {
      const squatter = await postgres.tokenStore({ table: 'tok_resets' })
      const store = createPostgresTokenStore({ pool: postgres.pool, schema: squatter.schema, table: 'tok' })
      await expect(store.migrate()).rejects.toThrow(`table "${squatter.schema}"."tok_resets" has no primary key on user_id (text) and column reset_at (bigint)`)
      // A resets table made by hand without its key, or with another type of time, is refused the same way.
      const client = await postgres.pool.connect()
      try {
        await client.query(`CREATE TABLE "${squatter.schema}"."bare_resets" (user_id text NOT NULL, reset_at bigint NOT NULL)`)
        await client.query(`CREATE TABLE "${squatter.schema}"."dated_resets" (user_id text PRIMARY KEY, reset_at timestamptz NOT NULL)`)
      } finally {
        client.release()
      }
      for (const table of ['bare', 'dated']) {
        await expect(createPostgresTokenStore({ pool: postgres.pool, schema: squatter.schema, table }).migrate(), table).rejects.toThrow(/no primary key on user_id \(text\) and column reset_at \(bigint\)/)
      }
    })

    it('a token table made by hand without what the store relies on (a primary key on id alone; a unique index on token_hash alone, for every row) makes migrate fail loudly', async () => {
      const { schema } = await postgres.tokenStore()
      const columns = `id text NOT NULL, user_id text NOT NULL, name text NOT NULL, token_hash text NOT NULL,
        display_prefix text NOT NULL, servers text[] NOT NULL, allowed_ips text[], expires_at bigint NOT NULL,
        created_at bigint NOT NULL, last_used_at bigint, revoked_at bigint`
      const client = await postgres.pool.connect()
      try {
        await client.query(`CREATE TABLE "${schema}"."nokey" (${columns})`)
        await client.query(`CREATE TABLE "${schema}"."widekey" (${columns}, PRIMARY KEY (id, user_id))`)
        await client.query(`CREATE TABLE "${schema}"."partial" (${columns}, PRIMARY KEY (id))`)
        await client.query(`CREATE UNIQUE INDEX "partial_token_hash_key" ON "${schema}"."partial" (token_hash) WHERE revoked_at IS NULL`)
        await client.query(`CREATE TABLE "${schema}"."widehash" (${columns}, PRIMARY KEY (id))`)
        await client.query(`CREATE UNIQUE INDEX "widehash_token_hash_key" ON "${schema}"."widehash" (token_hash, user_id)`)
      } finally {
        client.release()
      }
      for (const table of ['nokey', 'widekey']) {
        await expect(createPostgresTokenStore({ pool: postgres.pool, schema, table }).migrate(), table).rejects.toThrow(`table "${schema}"."${table}" has no primary key on id`)
      }
      for (const table of ['partial', 'widehash']) {
        await expect(createPostgresTokenStore({ pool: postgres.pool, schema, table }).migrate(), table).rejects.toThrow(/has no unique index on token_hash/)
      }
    })

    it('a table of that name short of the store\'s columns (another relation, one made by hand) makes migrate fail naming the columns it lacks, not the first statement that met the gap (regression: column "user_id" does not exist, from the index step)', async () => {
      const { schema } = await postgres.tokenStore()
      const client = await postgres.pool.connect()
      try {
        await client.query(`CREATE TABLE "${schema}"."older" (id text PRIMARY KEY, token_hash text NOT NULL)`)
        await client.query(`ALTER TABLE "${schema}"."older" ADD COLUMN name text, ADD COLUMN servers text[]`)
        await client.query(`ALTER TABLE "${schema}"."older" DROP COLUMN servers`)
      } finally {
        client.release()
      }
      await expect(createPostgresTokenStore({ pool: postgres.pool, schema, table: 'older' }).migrate()).rejects.toThrow(
        `table "${schema}"."older" lacks columns user_id, display_prefix, servers, allowed_ips, expires_at, created_at, last_used_at, revoked_at: it is not the token store's`,
      )
      // A view of the store's very columns is no table (an index cannot be made on it).
      const client2 = await postgres.pool.connect()
      try {
        await client2.query(
          `CREATE VIEW "${schema}"."aview" AS SELECT ''::text AS id, ''::text AS user_id, ''::text AS name, ''::text AS token_hash, ''::text AS display_prefix, '{}'::text[] AS servers, NULL::text[] AS allowed_ips, 0::bigint AS expires_at, 0::bigint AS created_at, NULL::bigint AS last_used_at, NULL::bigint AS revoked_at`,
        )
      } finally {
        client2.release()
      }
      await expect(createPostgresTokenStore({ pool: postgres.pool, schema, table: 'aview' }).migrate()).rejects.toThrow(`"${schema}"."aview" is not a table: it is not the token store's`)
    })

    it('a second run waits for no table lock: an open write elsewhere does not hold up a start (regression)', async () => {
      const store = await postgres.tokenStore()
      const writer = await postgres.pool.connect()
      try {
        await writer.query('BEGIN')
        await writer.query(`INSERT INTO "${store.schema}"."${DEFAULT_POSTGRES_TOKEN_TABLE}" (id, user_id, name, token_hash, display_prefix, servers, expires_at, created_at)
          VALUES ('w1', 'u', 'n', 'h-open-write', 'svc_', '{a}', 1, 1)`)
        const other = postgres.openPool({ max: 1 })
        const again = createPostgresTokenStore({ pool: other, schema: store.schema })
        const client = await other.connect()
        // A lock wait would end in this error; a migration that takes no table lock never meets it.
        await client.query("SET lock_timeout = '1s'")
        client.release()
        await expect(again.migrate()).resolves.toBeUndefined()
      } finally {
        await writer.query('ROLLBACK')
        writer.release()
      }
    })

    it('a custom table name in the same schema makes a second, separate store on the same pool', async () => {
      const first = await postgres.tokenStore()
      const second = createPostgresTokenStore({ pool: postgres.pool, schema: first.schema, table: 'other_tokens' })
      await second.migrate()
      const record = makeTokenRecord()
      await first.insert(record)
      await second.insert(record)
      await second.revoke(record.id, 5)
      expect((await first.findByHash(record.tokenHash))?.revokedAt).toBeNull()
      expect((await second.findByHash(record.tokenHash))?.revokedAt).toBe(5)
      expect(second.table).toBe(`"${first.schema}"."other_tokens"`)
    })
  })

  describe('options', () => {
    const pool = { query: async () => ({ rows: [] }) }

    it.each([
      ['schema', 'x"; DROP TABLE users; --'],
      ['schema', 'Tokens'],
      ['schema', '1tokens'],
      ['schema', ''],
      ['schema', 'pg_catalog'],
      ['schema', 'information_schema'],
      ['schema', 'a'.repeat(64)],
      ['table', 'tokens; DROP TABLE users'],
      ['table', 'my-tokens'],
      ['table', 'a'.repeat(49)],
      ['table', 42],
    ])('refuses %s %j with a ConfigurationError naming it', (option, value) => {
      let thrown: unknown
      try {
        createPostgresTokenStore({ pool, [option]: value })
      } catch (error) {
        thrown = error
      }
      expect(thrown).toBeInstanceOf(ConfigurationError)
      expect(thrown).toMatchObject({ code: 'ERR_INVALID_OPTION', option })
      expect(() => postgresTokenStoreMigration({ [option]: value })).toThrow(ConfigurationError)
    })

    it('refuses a missing pool, one without query, and a non-boolean preparedStatements', () => {
      expect(() => createPostgresTokenStore(undefined as never)).toThrow(ConfigurationError)
      expect(() => createPostgresTokenStore({} as never)).toThrow(/option "pool"/)
      expect(() => createPostgresTokenStore({ pool: {} as never })).toThrow(/option "pool"/)
      expect(() => createPostgresTokenStore({ pool, preparedStatements: 'no' as never })).toThrow(/option "preparedStatements"/)
    })

    it('accepts the longest names and underscores', async () => {
      const schema = `mcpd_test_${'s'.repeat(53)}`
      const store = createPostgresTokenStore({ pool: postgres.pool, schema, table: `_${'t'.repeat(47)}` })
      try {
        await store.migrate()
        const record = makeTokenRecord()
        await store.insert(record)
        await expect(store.insert({ ...makeTokenRecord(), tokenHash: record.tokenHash })).rejects.toThrow('duplicate token hash')
      } finally {
        await postgres.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
      }
    })
  })

  describe('queries', () => {
    it('findByHash is one named statement on the hash index, prepared once per connection', async () => {
      const store = await postgres.tokenStore()
      const record = makeTokenRecord()
      await store.insert(record)
      const client = new pg.Client({ connectionString: POSTGRES_URL })
      await client.connect()
      try {
        const { client: counted, queries } = recording(client)
        const onOneConnection = createPostgresTokenStore({ pool: counted, schema: store.schema })
        expect(await onOneConnection.findByHash(record.tokenHash)).toEqual(record)
        expect(await onOneConnection.findByHash(record.tokenHash)).toEqual(record)
        expect(queries).toHaveLength(2)
        expect(queries[0]).toMatchObject({ name: expect.stringMatching(/^mcp_dispatch_[0-9a-f]{12}_find_by_hash$/), values: [record.tokenHash] })
        expect(queries[0]!.text).toMatch(/ WHERE t\.token_hash = \$1$/)

        const prepared = await client.query('SELECT name FROM pg_prepared_statements')
        expect(prepared.rows).toEqual([{ name: queries[0]!.name }])
        await client.query('SET enable_seqscan = off')
        const plan = await client.query(`EXPLAIN (COSTS OFF) EXECUTE ${queries[0]!.name}('${record.tokenHash}')`)
        expect(plan.rows[0]['QUERY PLAN']).toMatch(/Index Scan using mcp_dispatch_api_tokens_token_hash_key/)
      } finally {
        await client.end()
      }
    })

    it('the statements over one user read its reset once and reach the rows a reset revokes by key (regression: a reset of a user with 50,000 revoked tokens took 2 s on a million rows, past a 2 s statement_timeout, and left its live token active)', async () => {
      const base = await postgres.tokenStore()
      const now = Date.now()
      // A user who made and revoked many tokens, beside others: as the audit's table, smaller.
      const revoked = Array.from({ length: 3_000 }, (_, i) => ({ ...makeTokenRecord({ userId: 'heavy' }), revokedAt: now - 1_000 - i }))
      const others = Array.from({ length: 3_000 }, (_, i) => makeTokenRecord({ userId: `user_${i % 300}` }))
      await insertInOrder(postgres.pool, base, [...revoked, ...others, makeTokenRecord({ userId: 'heavy' })])
      await postgres.pool.query(`ANALYZE ${base.table}`)
      const { client, queries } = recording(postgres.pool)
      const store = createPostgresTokenStore({ pool: client, schema: base.schema, preparedStatements: false })
      await store.listByUser('heavy')
      await store.countActiveByUser!('heavy', now)
      await store.revokeAllForUser('heavy', now) // its plan is read below, before the reset it wrote matters
      expect(queries).toHaveLength(3)
      const planOf = async (query: PostgresQuery) =>
        (await postgres.pool.query({ text: `EXPLAIN (COSTS OFF) ${query.text}`, values: query.values as unknown[] })).rows.map((row) => row['QUERY PLAN'] as string).join('\n')
      for (const query of queries) {
        const plan = await planOf(query)
        // A correlated subquery is a SubPlan, run once per row; the user's reset is an InitPlan, run once.
        expect(plan, query.text).not.toMatch(/SubPlan/)
        expect(plan, query.text).toMatch(/InitPlan/)
      }
      const reset = await planOf(queries[2]!)
      expect(reset).toMatch(/Index Cond: \(id = ANY \(\$\d+\)\)/)
      expect(reset).not.toMatch(/Seq Scan on mcp_dispatch_api_tokens/)
      expect(await base.countActiveByUser!('heavy', now)).toBe(0)
    })

    it('with preparedStatements false, no statement is named', async () => {
      const base = await postgres.tokenStore()
      const { client, queries } = recording(postgres.pool)
      const store = createPostgresTokenStore({ pool: client, schema: base.schema, preparedStatements: false })
      const record = makeTokenRecord()
      await store.insert(record)
      await store.findByHash(record.tokenHash)
      await store.touch(new Map([[record.id, 1]]))
      expect(queries).toHaveLength(4) // insert reads the record again
      expect(queries.map((q) => q.text.split(' ')[0])).toEqual(['INSERT', 'SELECT', 'SELECT', 'WITH'])
      for (const query of queries) expect(query.name).toBeUndefined()
    })

    it('touch writes a whole batch in one statement, and an empty batch sends nothing', async () => {
      const base = await postgres.tokenStore()
      const records = Array.from({ length: 50 }, () => makeTokenRecord())
      for (const r of records) await base.insert(r)
      const { client, queries } = recording(postgres.pool)
      const store = createPostgresTokenStore({ pool: client, schema: base.schema })
      await store.touch(new Map())
      expect(queries).toHaveLength(0)
      await store.touch(new Map(records.map((r, i) => [r.id, 1_700_000_000_000 + i])))
      expect(queries).toHaveLength(1)
      const stored = await base.listByUser('user_1')
      expect(stored.map((r) => r.lastUsedAt).sort()).toEqual(records.map((_, i) => 1_700_000_000_000 + i).sort())
    })
  })

  describe('records', () => {
    it('allowlists come back exactly as they went in (no normalisation of addresses or ranges)', async () => {
      const store = await postgres.tokenStore()
      const allowedIps = ['10.1.2.3/8', '2001:DB8::1', '::ffff:192.0.2.1', '192.0.2.7', '2001:db8:0:0::/64', 'x"y\\z, {}']
      const record = makeTokenRecord({ allowedIps, servers: ['app "quoted"', 'app,comma', 'NULL'] })
      await store.insert(record)
      expect(await store.findByHash(record.tokenHash)).toEqual(record)
      const empty = makeTokenRecord({ allowedIps: [], servers: [] })
      await store.insert(empty)
      expect(await store.get(empty.id)).toEqual(empty)
    })

    it('times are numbers whatever the pool parses bigint into', async () => {
      const base = await postgres.tokenStore()
      const pool = postgres.openPool({
        max: 1,
        types: { getTypeParser: ((oid: number, format?: string) => (oid === 20 ? BigInt : pg.types.getTypeParser(oid, format as never))) as never },
      })
      const store = createPostgresTokenStore({ pool, schema: base.schema })
      const record = makeTokenRecord({ lastUsedAt: 1_700_000_000_001, revokedAt: 1_700_000_000_002 })
      await store.insert(record)
      const read = await store.get(record.id)
      expect(read).toEqual(record)
      expect(typeof read!.expiresAt).toBe('number')
    })

    it('the retention DELETE of docs/stores.md removes only tokens revoked or expired before its cutoff; every other token is served, listed and edited as before', async () => {
      const store = await postgres.tokenStore()
      const day = 86_400_000
      let now = Date.UTC(2026, 0, 1)
      const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])
      const service = createTokenService({ store, apps, canUseServer: () => true, now: () => now })
      const make = (name: string, expiresInDays: 7 | 30 | 90) => service.create({ userId: 'u_retained', name, servers: ['app_1'], expiresInDays })
      const expiredLongAgo = await make('expired long ago', 7)
      const revokedLongAgo = await make('revoked long ago', 90)
      await service.revoke('u_retained', revokedLongAgo.id)
      const kept = await make('kept', 90)
      now += 60 * day
      const expiredLately = await make('expired lately', 7)
      const revokedLately = await make('revoked lately', 90)
      now += 20 * day
      await service.revoke('u_retained', revokedLately.id)
      // Used on 1 March: its last-used time is pending when the rows go.
      expect((await service.authenticate(kept.token)).ok).toBe(true)

      // The statement as docs/stores.md gives it, on this test's table, with a retention of 30 days.
      const docs = readFileSync(new URL('../../docs/stores.md', import.meta.url), 'utf8')
      const statement = /```sql\n(?:--.*\n)*(DELETE FROM "public"\."mcp_dispatch_api_tokens" .*);\n```/.exec(docs)?.[1]
      expect(statement, 'the retention DELETE in docs/stores.md').toBeDefined()
      const cutoff = now - 30 * day
      // Run until it deletes no row, as the docs say.
      const batch = () => postgres.pool.query(statement!.replaceAll('"public"."mcp_dispatch_api_tokens"', store.table), [cutoff])
      expect((await batch()).rowCount).toBe(2)
      expect((await batch()).rowCount).toBe(0)

      await service.flush()
      // Two were created in the same millisecond: their order is not given.
      expect((await service.list('u_retained')).map((t) => [t.name, t.status]).sort()).toEqual([
        ['expired lately', 'expired'],
        ['kept', 'active'],
        ['revoked lately', 'revoked'],
      ])
      // Another instance, which never saw them: a deleted token is unknown, 401 as it was.
      const other = createTokenService({ store, apps, canUseServer: () => true, now: () => now })
      for (const gone of [expiredLongAgo, revokedLongAgo]) expect(await other.authenticate(gone.token)).toEqual({ ok: false, reason: 'unknown' })
      expect(await other.authenticate(expiredLately.token)).toEqual({ ok: false, reason: 'expired' })
      expect(await other.authenticate(revokedLately.token)).toEqual({ ok: false, reason: 'revoked' })
      expect((await other.authenticate(kept.token)).ok).toBe(true)
      expect((await store.get(kept.id))?.lastUsedAt).toBe(now)
      await expect(service.rotate(revokedLongAgo.id, { kind: 'session', userId: 'u_retained' })).rejects.toMatchObject({ status: 404 })
      expect((await service.update('u_retained', kept.id, { name: 'still here' })).name).toBe('still here')
      await Promise.all([service.close(), other.close()])
    })

    it('user ids the database would not keep as given (a lone surrogate pg stores as U+FFFD, NUL; for a new token, longer than an index entry) are refused by the token service as input, so two users never share tokens (regression: one listed the other’s; 503 for ever)', async () => {
      const store = await postgres.tokenStore()
      const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])
      const service = createTokenService({ store, apps, canUseServer: () => true, now: () => Date.UTC(2026, 0, 1) })
      const create = (userId: string) => service.create({ userId, name: 'odd', servers: ['app_1'], expiresInDays: 7 })
      for (const userId of ['user-\uD800', 'user-\uDC00', 'user-\u0000']) {
        const label = JSON.stringify(userId)
        await expect(create(userId), label).rejects.toMatchObject({ status: 400, field: 'userId' })
        await expect(service.list(userId), label).rejects.toMatchObject({ status: 400, field: 'userId' })
      }
      await expect(create('u'.repeat(256))).rejects.toMatchObject({ status: 400, field: 'userId' })
      // Well-formed ids, the longest included, and astral characters: each user sees its own.
      const longest = 'u'.repeat(255)
      const mine = await create(longest)
      const emoji = await create('user-\u{1F600}')
      expect((await service.list(longest)).map((t) => t.id)).toEqual([mine.id])
      expect((await service.list('user-\u{1F600}')).map((t) => t.id)).toEqual([emoji.id])
      await expect(service.get('user-\uD83D', emoji.id)).rejects.toMatchObject({ status: 400, field: 'userId' })
      await service.close()
    })

    it('token ids and user ids the database cannot take name nothing: 404 for the id, 0 revoked for the user, as on the memory store (regression: 503 for ever)', async () => {
      const store = await postgres.tokenStore()
      const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])
      const service = createTokenService({ store, apps, canUseServer: () => true, now: () => Date.UTC(2026, 0, 1) })
      const mine = await service.create({ userId: 'u1', name: 'mine', servers: ['app_1'], expiresInDays: 7 })
      for (const id of [`${mine.id}\u0000`, 'a\u0000b', 'a\uD800']) {
        const label = JSON.stringify(id)
        await expect(service.get('u1', id), label).rejects.toMatchObject({ status: 404 })
        await expect(service.update('u1', id, { name: 'x' }), label).rejects.toMatchObject({ status: 404 })
        await expect(service.revoke('u1', id), label).rejects.toMatchObject({ status: 404 })
        await expect(service.rotate(id, { kind: 'session', userId: 'u1' }), label).rejects.toMatchObject({ status: 404 })
      }
      // A password reset for a user id longer than an index entry holds (random, so it does
      // not compress below the bound): no token can be theirs.
      const huge = randomBytes(6_000).toString('base64')
      expect(await service.revokeAllForUser(huge)).toBe(0)
      expect((await service.get('u1', mine.id)).status).toBe('active')
      await service.close()
      // A table without the user_id index (made by hand) can hold such a user's token: then
      // the reset fails as it is, never answered as if it had revoked nothing.
      const bare = await postgres.tokenStore()
      await postgres.pool.query(`DROP INDEX "${bare.schema}"."mcp_dispatch_api_tokens_user_id_idx"`)
      await bare.insert(makeTokenRecord({ userId: huge }))
      const held = createTokenService({ store: bare, apps, canUseServer: () => true, now: () => Date.UTC(2026, 0, 1) })
      await expect(held.revokeAllForUser(huge)).rejects.toMatchObject({ status: 503 })
      await held.close()
    })

    it('records are frozen', async () => {
      const store = await postgres.tokenStore()
      const record = makeTokenRecord()
      await store.insert(record)
      const read = (await store.get(record.id))!
      expect(Object.isFrozen(read) && Object.isFrozen(read.servers) && Object.isFrozen(read.allowedIps)).toBe(true)
    })
  })

  describe('errors', () => {
    it('a statement rolled back for a concurrent one (40001, 40P01) is sent again, up to 10 times; any other failure at once; a retry refused as in an aborted transaction (25P02: a pool that is one client inside a transaction of the platform\'s) rejects with the first failure', async () => {
      const failure = (code: string) => Object.assign(new Error(`failure ${code}`), { code })
      const answering = (...failures: string[]) => {
        const sent: string[] = []
        const pool = {
          query: async () => {
            const code = failures[sent.length]
            sent.push(code ?? 'answered')
            if (code !== undefined) throw failure(code)
            return { rows: [] }
          },
        }
        return { store: createPostgresTokenStore({ pool }), sent }
      }
      const retried = answering('40001', '40P01')
      expect(await retried.store.get('t')).toBeUndefined()
      expect(retried.sent).toEqual(['40001', '40P01', 'answered'])
      const nine = answering(...Array<string>(9).fill('40001'))
      expect(await nine.store.get('t')).toBeUndefined()
      expect(nine.sent).toHaveLength(10)
      const lost = answering(...Array<string>(11).fill('40001'))
      await expect(lost.store.get('t')).rejects.toMatchObject({ code: '40001' })
      expect(lost.sent).toHaveLength(10)
      const other = answering('23505')
      await expect(other.store.get('t')).rejects.toMatchObject({ code: '23505' })
      expect(other.sent).toEqual(['23505'])
      const aborted = answering('40001', '25P02')
      await expect(aborted.store.get('t')).rejects.toMatchObject({ message: 'failure 40001' })
    })

    it('a duplicate id or hash is a TypeError naming it, with the PostgreSQL error as its cause', async () => {
      const store = await postgres.tokenStore()
      const record = makeTokenRecord()
      await store.insert(record)
      const byId = await Promise.resolve(store.insert({ ...makeTokenRecord(), id: record.id })).catch((e: unknown) => e)
      expect(byId).toBeInstanceOf(TypeError)
      expect(byId).toMatchObject({ message: `duplicate token id ${record.id}`, cause: { code: '23505' } })
      const byHash = await Promise.resolve(store.insert({ ...makeTokenRecord(), tokenHash: record.tokenHash })).catch((e: unknown) => e)
      expect(byHash).toBeInstanceOf(TypeError)
      expect(byHash).toMatchObject({ message: 'duplicate token hash', cause: { code: '23505' } })
    })

    it('a rotation onto a hash already in use is refused and changes nothing', async () => {
      const store = await postgres.tokenStore()
      const a = makeTokenRecord()
      const b = makeTokenRecord()
      await store.insert(a)
      await store.insert(b)
      await expect(store.rotate(a.id, { tokenHash: b.tokenHash, displayPrefix: 'svc_xxxxxxxx' })).rejects.toThrow(
        'duplicate token hash',
      )
      expect(await store.get(a.id)).toEqual(a)
    })

    it('an unreachable database rejects every call with the connection error, never an empty answer', async () => {
      const pool = postgres.openPool({ connectionString: await unreachablePostgresUrl(), connectionTimeoutMillis: 500 })
      const store = createPostgresTokenStore({ pool })
      const record = makeTokenRecord()
      const calls: Array<() => Promise<unknown>> = [
        () => store.migrate(),
        () => Promise.resolve(store.insert(record)),
        () => Promise.resolve(store.findByHash(record.tokenHash)),
        () => Promise.resolve(store.get(record.id)),
        () => Promise.resolve(store.listByUser('user_1')),
        () => Promise.resolve(store.countActiveByUser!('user_1', 1)),
        () => Promise.resolve(store.update(record.id, { name: 'x' })),
        () => Promise.resolve(store.rotate(record.id, { tokenHash: 'h', displayPrefix: 'p' })),
        () => Promise.resolve(store.revoke(record.id, 1)),
        () => Promise.resolve(store.revokeAllForUser('user_1', 1)),
        () => Promise.resolve(store.touch(new Map([[record.id, 1]]))),
      ]
      for (const call of calls) {
        const error = await call().then(
          () => undefined,
          (e: unknown) => e,
        )
        expect(error).toMatchObject({ code: 'ECONNREFUSED' })
      }
    })
  })

  it('a store never migrated: the token service answers 503, and the default log line says to run migrate() and names the table looked for', async () => {
    const schema = randomSchemaName()
    const lines: string[] = []
    const spy = vi.spyOn(console, 'error').mockImplementation((line: string) => void lines.push(line))
    try {
      for (const store of [
        // `public` is there, the table is not; then neither the schema nor the table.
        createPostgresTokenStore({ pool: postgres.pool, table: schema.replace('mcpd_test_', 'never_') }),
        createPostgresTokenStore({ pool: postgres.pool, schema }),
      ]) {
        const apps = createMemoryAppStore([{ id: 'app_1', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
        const tokens = createTokenService({ store, apps, canUseServer: () => true })
        await expect(tokens.list('user_1')).rejects.toBeInstanceOf(StoreUnavailableError)
        // The token API's answer and its default log line, as an operator meets them.
        const api = createTokenApi({ tokens, authenticateSession: () => ({ userId: 'user_1' }), verifyCsrf: false })
        const answer = await api(new Request('http://platform.example/api/tokens'))
        expect(answer?.status).toBe(503)
      }
    } finally {
      spy.mockRestore()
    }
    // PostgreSQL answers a table of a missing schema as a missing table too (42P01).
    expect(lines).toHaveLength(2)
    for (const line of lines) expect(line).toContain(`(cause: error 42P01: PostgreSQL undefined_table: a table is missing (the token store's: run its migrate()`)
    // The table looked for, from PostgreSQL's wording of it (the rest of its messages is not
    // printed): an operator who gave the wrong schema or table sees which.
    expect(lines[0]).toContain(`; looked for: "public.${schema.replace('mcpd_test_', 'never_')}"`)
    expect(lines[1]).toContain(`; looked for: "${schema}.${DEFAULT_POSTGRES_TOKEN_TABLE}"`)
  })

  it('at run time the store needs only SELECT, INSERT and UPDATE on its two tables (and USAGE on the schema)', async () => {
    const owner = await postgres.tokenStore()
    const role = randomSchemaName().replace('mcpd_test_', 'mcpd_role_')
    await postgres.pool.query(`CREATE ROLE ${role} LOGIN`)
    try {
      await postgres.pool.query(`GRANT USAGE ON SCHEMA "${owner.schema}" TO ${role}`)
      await postgres.pool.query(`GRANT SELECT, INSERT, UPDATE ON ${owner.table}, ${owner.table.replace(/"$/, '_resets"')} TO ${role}`)
      const url = new URL(POSTGRES_URL)
      url.username = role
      const pool = postgres.openPool({ connectionString: url.href, max: 2 })
      const store = createPostgresTokenStore({ pool, schema: owner.schema })
      const record = makeTokenRecord()
      await store.insert(record)
      await store.touch(new Map([[record.id, 1_700_000_000_100]]))
      await store.update(record.id, { name: 'renamed' })
      const next = { tokenHash: makeTokenRecord().tokenHash, displayPrefix: 'svc_rotated_' }
      expect(await store.rotate(record.id, next, record.tokenHash)).toMatchObject(next)
      expect(await store.revokeAllForUser(record.userId, 1_700_000_000_200)).toHaveLength(1)
      expect(await store.revoke(record.id, 1_700_000_000_300)).toMatchObject({ revokedAt: 1_700_000_000_200 })
      expect(await store.listByUser(record.userId)).toHaveLength(1)
      await expect(store.migrate()).rejects.toMatchObject({ code: '42501' })
      await pool.end()
    } finally {
      await postgres.pool.query(`DROP OWNED BY ${role}`)
      await postgres.pool.query(`DROP ROLE ${role}`)
    }
  })

  describe('instances at once', () => {
    it('concurrent touch batches over the same tokens, in opposite orders, neither deadlock nor move times back', async () => {
      const base = await postgres.tokenStore()
      const records = Array.from({ length: 200 }, () => makeTokenRecord())
      for (const r of records) await base.insert(r)
      // Two instances, each with its own connections.
      const a = createPostgresTokenStore({ pool: postgres.openPool({ max: 3 }), schema: base.schema })
      const b = createPostgresTokenStore({ pool: postgres.openPool({ max: 3 }), schema: base.schema })
      const forward = records.map((r) => r.id)
      const backward = [...forward].reverse()
      const rounds = Array.from({ length: 10 }, (_, round) => [
        a.touch(new Map(forward.map((id, i) => [id, 1_700_000_000_000 + round * 1000 + i]))),
        b.touch(new Map(backward.map((id, i) => [id, 1_700_000_000_000 + round * 1000 + (999 - i)]))),
      ])
      const results = await Promise.allSettled(rounds.flat())
      expect(results.filter((r) => r.status === 'rejected')).toEqual([])
      const last = 1_700_000_000_000 + 9 * 1000
      const stored = await base.listByUser('user_1')
      for (const record of stored) {
        const i = forward.indexOf(record.id)
        const j = backward.indexOf(record.id)
        expect(record.lastUsedAt).toBe(Math.max(last + i, last + 999 - j))
      }
    })

    it('a password reset that commits while an INSERT runs (not in its snapshot) is seen by the insert: the record comes back revoked (regression: it came back active)', async () => {
      const base = await postgres.tokenStore()
      const other = createPostgresTokenStore({ pool: postgres.openPool({ max: 1 }), schema: base.schema })
      const record = makeTokenRecord({ userId: 'u_racing' })
      // The reset commits after the INSERT's statement (and its RETURNING) ran, before the
      // store answers: under READ COMMITTED, as a reset on another instance may.
      const racing = createPostgresTokenStore({
        schema: base.schema,
        pool: {
          async query(query) {
            const result = await postgres.pool.query(query)
            if (/_insert$/.test(query.name ?? '')) await other.revokeAllForUser('u_racing', record.createdAt + 1)
            return result
          },
        },
      })
      expect(await racing.insert(record)).toMatchObject({ id: record.id, revokedAt: record.createdAt + 1 })
      expect(await base.get(record.id)).toMatchObject({ revokedAt: record.createdAt + 1 })
    })

    it('two instances rotating one token at once (two dashboard tabs; the token itself and its owner): one 200 with the live secret, the other 409 and no secret', async () => {
      const base = await postgres.tokenStore()
      const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])
      const invalidations = createMemoryInvalidationBus()
      const options = { apps, canUseServer: () => true, cacheTtlMs: 600_000, invalidations }
      // Each instance's swap waits until both have read the token: the two are truly at once.
      let arrived = 0
      let bothRead!: () => void
      let barrier = Promise.resolve()
      const atOnce = (store: PostgresTokenStore): PostgresTokenStore => ({
        ...store,
        async rotate(id, secret, expected) {
          if (++arrived === 2) bothRead()
          await barrier
          return store.rotate(id, secret, expected)
        },
      })
      const a = createTokenService({ ...options, store: atOnce(base) })
      const b = createTokenService({
        ...options,
        store: atOnce(createPostgresTokenStore({ pool: postgres.openPool({ max: 2 }), schema: base.schema })),
      })
      try {
        for (let round = 0; round < 6; round++) {
          const created = await a.create({ userId: 'u_tabs', name: `tabs ${round}`, servers: ['app_1'], expiresInDays: 7 })
          const bySelf = round % 2 === 1
          arrived = 0
          barrier = new Promise<void>((resolve) => (bothRead = resolve))
          const results = await Promise.allSettled([
            a.rotate(created.id, { kind: 'session', userId: 'u_tabs' }),
            bySelf
              ? b.rotate(created.id, { kind: 'token', token: created.token, clientAddress: undefined })
              : b.rotate(created.id, { kind: 'session', userId: 'u_tabs' }),
          ])
          const won = results.filter((r) => r.status === 'fulfilled')
          expect(won, `round ${round}`).toHaveLength(1)
          const lost = (results.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason
          expect(lost, `round ${round}`).toBeInstanceOf(ConflictError)
          const live = (won[0] as PromiseFulfilledResult<{ token: string }>).value.token
          for (const service of [a, b]) {
            expect((await service.authenticate(live)).ok).toBe(true)
            expect((await service.authenticate(created.token)).ok).toBe(false)
          }
        }
      } finally {
        await Promise.all([a.close(), b.close()])
      }
    })

    it('a connection lost after a rotation or revocation committed (the reply never arrives): 503, the rotation is undone and the revocation reaches the other instance at once', async () => {
      const base = await postgres.tokenStore()
      // Once armed, the next rotation or revocation goes through and the connection is dropped
      // instead of its reply (a failover or a pooler restart after COMMIT).
      let armed = false
      const proxy = await startPostgresProxy((chunk) => {
        if (!armed || !/_(rotate|revoke)\b/.test(chunk.toString('latin1'))) return 'pass'
        armed = false
        return 'drop-reply'
      })
      try {
        const proxied = postgres.openPool({ connectionString: proxy.url, max: 2 })
        const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])
        const invalidations = createMemoryInvalidationBus()
        const onError = vi.fn()
        const options = { apps, canUseServer: () => true, cacheTtlMs: 600_000, invalidations }
        const a = createTokenService({ ...options, store: createPostgresTokenStore({ pool: proxied, schema: base.schema }), onError })
        const b = createTokenService({ ...options, store: base })
        try {
          const made = () => a.create({ userId: 'u_cut', name: 'cut', servers: ['app_1'], expiresInDays: 7 })
          const byToken = await made()
          const byOwner = await made()
          const revoked = await made()
          for (const t of [byToken, byOwner, revoked]) expect((await b.authenticate(t.token)).ok).toBe(true) // cached on B

          const cut = (call: Promise<unknown>) => {
            armed = true
            return expect(call).rejects.toBeInstanceOf(StoreUnavailableError)
          }
          await cut(a.rotate(byToken.id, { kind: 'token', token: byToken.token, clientAddress: undefined }))
          await cut(a.rotate(byOwner.id, { kind: 'session', userId: 'u_cut' }))
          await cut(a.revoke('u_cut', revoked.id))

          // The callers still hold the old secrets, and those work on both instances (a
          // headless client that retries is not locked out); the rotation can be done again.
          for (const t of [byToken, byOwner]) {
            expect((await base.get(t.id))?.tokenHash).toBe(hashApiToken(t.token))
            for (const service of [a, b]) expect((await service.authenticate(t.token)).ok).toBe(true)
          }
          const again = await a.rotate(byToken.id, { kind: 'token', token: byToken.token, clientAddress: undefined })
          expect((await b.authenticate(again.token)).ok).toBe(true)
          expect((await b.authenticate(byToken.token)).ok).toBe(false)
          // The revocation committed: B refuses the token now, not after cacheTtlMs.
          expect(await b.authenticate(revoked.token)).toEqual({ ok: false, reason: 'revoked' })
          expect(onError).not.toHaveBeenCalled()
        } finally {
          await Promise.all([a.close(), b.close()])
        }
      } finally {
        await proxy.close()
      }
    })

    it('a write whose connection is lost with the statement sent, and that the server runs and commits later (as one waiting on a lock does): the rotation is undone and the created token revoked by the second pass (regression: the first found nothing, and the late commit locked the client out)', async () => {
      const base = await postgres.tokenStore()
      // Once armed, the client's connection is dropped as soon as the next rotation or insert is
      // sent, and the server gets that statement 300 ms later (it still has it, and commits it
      // once the lock it waits on is released).
      let armed = false
      const proxy = await startPostgresProxy((chunk) => {
        if (!armed || !/_(rotate|insert)\b/.test(chunk.toString('latin1'))) return 'pass'
        armed = false
        return 'drop-client'
      })
      try {
        const proxied = postgres.openPool({ connectionString: proxy.url, max: 2 })
        const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One' }])
        const onError = vi.fn()
        // Room for a loaded host: with 1 s, a clean-clone CI run saw the first pass's revoke time
        // out (reported) before the second pass revoked the token.
        const storeTimeoutMs = 2_000
        const service = createTokenService({
          apps,
          canUseServer: () => true,
          store: createPostgresTokenStore({ pool: proxied, schema: base.schema }),
          storeTimeoutMs,
          onError,
        })
        try {
          const made = () => service.create({ userId: 'u_late', name: 'late', servers: ['app_1'], expiresInDays: 7 })
          const byToken = await made()
          const cut = (call: Promise<unknown>) => {
            armed = true
            return expect(call).rejects.toBeInstanceOf(StoreUnavailableError)
          }
          await cut(service.rotate(byToken.id, { kind: 'token', token: byToken.token, clientAddress: undefined }))
          await cut(service.create({ userId: 'u_late', name: 'lost', servers: ['app_1'], expiresInDays: 7 }))
          // The late commits land; then the second pass, storeTimeoutMs after the first, puts them right.
          await vi.waitFor(async () => expect((await base.get(byToken.id))?.tokenHash).not.toBe(hashApiToken(byToken.token)), {
            timeout: 3_000,
            interval: 20,
          })
          await vi.waitFor(
            async () => {
              expect((await base.get(byToken.id))?.tokenHash).toBe(hashApiToken(byToken.token))
              const lost = (await base.listByUser('u_late')).find((r) => r.name === 'lost')
              expect(lost?.revokedAt ?? null).not.toBeNull()
            },
            { timeout: 4 * storeTimeoutMs, interval: 50 },
          )
          expect((await service.authenticate(byToken.token)).ok).toBe(true)
          expect(onError).not.toHaveBeenCalled()
        } finally {
          await service.close()
        }
      } finally {
        await proxy.close()
      }
    })

    it('revokeAllForUser and touch on the same tokens at once: no deadlock, all revoked, every time recorded', async () => {
      const base = await postgres.tokenStore()
      const other = createPostgresTokenStore({ pool: postgres.openPool({ max: 4 }), schema: base.schema })
      const users = Array.from({ length: 12 }, (_, n) => `u_busy_${n}`)
      // Inserted in descending id order: a scan by user meets them in the opposite order of ids.
      const records = users
        .flatMap((userId) => Array.from({ length: 300 }, () => makeTokenRecord({ userId })))
        .sort((a, b) => (a.id < b.id ? 1 : -1))
      await insertInOrder(postgres.pool, base, records)
      // Both pools connected beforehand, so the writes really overlap.
      await Promise.all([base, base, base, base, other, other, other, other].map((s) => s.get('warm-up')))
      const results = await Promise.allSettled(
        users.flatMap((userId) => [
          other.touch(new Map(records.filter((r) => r.userId === userId).map((r) => [r.id, 1_700_000_000_900]))),
          base.revokeAllForUser(userId, 1_700_000_000_500),
        ]),
      )
      expect(results.filter((r) => r.status === 'rejected')).toEqual([])
      for (const result of results.filter((_, i) => i % 2 === 1)) expect(result).toMatchObject({ value: { length: 300 } })
      for (const userId of users) {
        for (const r of await base.listByUser(userId)) {
          expect(r).toMatchObject({ revokedAt: 1_700_000_000_500, lastUsedAt: 1_700_000_000_900 })
        }
      }
    })
  })
})
