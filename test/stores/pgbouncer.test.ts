/**
 * The PostgreSQL token store behind a real PgBouncer in transaction mode (started by this
 * file on 127.0.0.1:17210 in front of the test PostgreSQL: test/helpers/pgbouncer.ts), where
 * consecutive statements of one client may run on different server connections: the shared
 * conformance suite and the pipeline suite with `preparedStatements: false`; the default
 * named statements, which fail there, told as the option to change; the migration's
 * transaction-scoped advisory locks, from instances starting at once; and a pool with
 * `statement_timeout`, which PgBouncer refuses at connect.
 */
import { ConfigurationError, type TokenStore } from 'mcp-dispatch'
import { type PostgresTokenStore, createPostgresTokenStore } from 'mcp-dispatch/postgres'
import { describe, expect, it } from 'vitest'
import { startPgBouncer } from '../helpers/pgbouncer.js'
import { postgresUnavailable, randomSchemaName, usePostgres } from '../helpers/postgres.js'
import { describeTokenStoreConformance, makeTokenRecord } from './conformance.js'
import { postgresPipelineSuite } from './postgres-pipeline-suite.js'

const unavailable = await postgresUnavailable()
// Four server connections: fewer than the clients of a pool, as a pooler has it.
const bouncer = unavailable === undefined ? await startPgBouncer(17210, 4) : undefined

describe.runIf(bouncer !== undefined)('PostgreSQL token store behind PgBouncer in transaction mode', () => {
  const postgres = usePostgres(bouncer?.url)
  const teardown = (store: TokenStore) => postgres.drop(store as PostgresTokenStore)

  describeTokenStoreConformance('postgres through PgBouncer (transaction mode), preparedStatements: false', () => postgres.tokenStore({ preparedStatements: false }), {
    teardown,
  })

  describe('through the pipeline, preparedStatements: false', () => {
    postgresPipelineSuite(postgres, { preparedStatements: false })
  })

  it('with the default preparedStatements (true), named statements fail as the server connections change hands, and the store names the option to set (regression: a bare 42P05 "already exists")', async () => {
    const store = await postgres.tokenStore()
    const records = Array.from({ length: 40 }, (_, i) => makeTokenRecord({ id: `tok_${i}`, tokenHash: `hash_${i}` }))
    const pool = postgres.openPool({ max: 8 })
    const named = createPostgresTokenStore({ pool, schema: store.schema })
    const outcomes = await Promise.allSettled(records.map(async (record) => {
      await named.insert(record)
      await named.findByHash(record.tokenHash)
    }))
    const failures = outcomes.flatMap((outcome) => (outcome.status === 'rejected' ? [outcome.reason as Error] : []))
    // Eight clients sharing four server connections: most calls land on a connection that
    // another client prepared the statement on (42P05), or not this one (26000).
    expect(failures.length).toBeGreaterThan(0)
    for (const failure of failures) {
      expect(failure).toBeInstanceOf(ConfigurationError)
      expect(failure).toMatchObject({ option: 'preparedStatements', cause: { code: expect.stringMatching(/^(42P05|26000)$/) } })
      expect(failure.message).toMatch(/PgBouncer in transaction mode .* set preparedStatements: false$/)
    }
  })

  it('instances migrating at once: the migration runs as one transaction on one server connection, its advisory locks held for it', async () => {
    const schema = randomSchemaName()
    const pool = postgres.openPool({ max: 6 })
    const stores = Array.from({ length: 6 }, () => createPostgresTokenStore({ pool, schema, preparedStatements: false }))
    try {
      const results = await Promise.allSettled(stores.map((store) => store.migrate()))
      expect(results.filter((result) => result.status === 'rejected')).toEqual([])
      const record = makeTokenRecord()
      await stores[0]!.insert(record)
      expect(await stores[5]!.findByHash(record.tokenHash)).toEqual(record)
    } finally {
      await postgres.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
    }
  })

  it('a pool with statement_timeout cannot connect: PgBouncer refuses it as a startup parameter', async () => {
    const pool = postgres.openPool({ statement_timeout: 2_000 })
    await expect(pool.query('SELECT 1')).rejects.toThrow('unsupported startup parameter: statement_timeout')
  })
})
