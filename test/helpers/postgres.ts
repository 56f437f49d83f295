/**
 * A real PostgreSQL for the tests: `POSTGRES_URL`, default
 * `postgres://postgres@127.0.0.1:5432/test` (trust auth). Every store gets a schema of its
 * own with a random name, dropped afterwards, so each factory call starts empty and test
 * files can run in parallel; every pool is ended after the file, so the process exits on its
 * own.
 *
 * ```ts
 * const unavailable = await postgresUnavailable()
 * describe.skipIf(unavailable !== undefined)('…', () => {
 *   const postgres = usePostgres()
 *   it('…', async () => {
 *     const store = await postgres.tokenStore()
 *   })
 * })
 * ```
 */
import { randomBytes } from 'node:crypto'
import * as net from 'node:net'
import pg from 'pg'
import { afterAll } from 'vitest'
import {
  type PostgresTokenStore,
  type PostgresTokenStoreOptions,
  createPostgresTokenStore,
} from 'mcp-dispatch/postgres'
import { underCI } from './ci.js'

/** Where the test database is. */
export const POSTGRES_URL = process.env.POSTGRES_URL ?? 'postgres://postgres@127.0.0.1:5432/test'

/**
 * `undefined` when PostgreSQL answers; otherwise why not, printed so a skipped suite says so.
 * Under `CI=true` an unreachable PostgreSQL throws instead: in CI these tests must run.
 */
export async function postgresUnavailable(): Promise<string | undefined> {
  const client = new pg.Client({ connectionString: POSTGRES_URL, connectionTimeoutMillis: 3_000 })
  try {
    await client.connect()
    await client.query('SELECT 1')
    return undefined
  } catch (error) {
    const where = new URL(POSTGRES_URL)
    const reason = `PostgreSQL at ${where.host}${where.pathname} is unreachable (${error instanceof Error ? error.message : String(error)})`
    if (underCI()) throw new Error(`${reason}; under CI, so the PostgreSQL tests fail instead of skipping`)
    console.warn(`[postgres] ${reason}: PostgreSQL tests skipped (set POSTGRES_URL; under CI=true they fail)`)
    return reason
  } finally {
    await client.end().catch(() => {})
  }
}

/** A PostgreSQL URL on a loopback port nothing listens on (connections are refused at once). */
export async function unreachablePostgresUrl(): Promise<string> {
  const server = net.createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  await new Promise((resolve) => server.close(resolve))
  return `postgres://postgres@127.0.0.1:${port}/test`
}

/** A fresh schema name: `mcpd_test_` and 12 random hex digits. */
export function randomSchemaName(): string {
  return `mcpd_test_${randomBytes(6).toString('hex')}`
}

/** Pools and schemas of one test file, released after it. */
export interface TestPostgres {
  /** The file's shared pool (4 connections), opened on first use. */
  readonly pool: pg.Pool
  /** Another pool (another instance, or a broken one), ended after the file. */
  openPool(config?: pg.PoolConfig): pg.Pool
  /** A migrated token store in a schema of its own. `options.pool` defaults to {@link pool}. */
  tokenStore(options?: Partial<PostgresTokenStoreOptions>): Promise<PostgresTokenStore & { readonly schema: string }>
  /** Drops the schema of a store made by {@link tokenStore}. */
  drop(store: PostgresTokenStore): Promise<void>
}

/**
 * Opens PostgreSQL for a test file (or a `describe` block) and registers an `afterAll` that
 * drops every schema still there and ends every pool. `url`: where, default `POSTGRES_URL`
 * (PgBouncer in front of it, in test/stores/pgbouncer.test.ts).
 */
export function usePostgres(url = POSTGRES_URL): TestPostgres {
  const pools: pg.Pool[] = []
  const schemas = new Set<string>()
  const schemaOf = new WeakMap<PostgresTokenStore, string>()
  let shared: pg.Pool | undefined
  const dropSchema = (schema: string) => context.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)

  const context: TestPostgres = {
    get pool() {
      return (shared ??= context.openPool({ max: 4 }))
    },
    openPool(config = {}) {
      const pool = new pg.Pool({ connectionString: url, connectionTimeoutMillis: 5_000, ...config })
      // An idle client that fails (a test ends its backend) must not crash the test process.
      pool.on('error', () => {})
      pools.push(pool)
      return pool
    },
    async tokenStore(options = {}) {
      const schema = randomSchemaName()
      schemas.add(schema)
      const store = createPostgresTokenStore({ pool: context.pool, schema, ...options })
      await store.migrate()
      schemaOf.set(store, schema)
      return Object.assign(store, { schema })
    },
    async drop(store) {
      const schema = schemaOf.get(store)
      if (schema === undefined) return
      schemas.delete(schema)
      await dropSchema(schema)
    },
  }

  afterAll(async () => {
    try {
      if (schemas.size > 0) for (const schema of schemas) await dropSchema(schema)
    } finally {
      schemas.clear()
      await Promise.all(pools.splice(0).map((pool) => (pool.ended ? undefined : pool.end())))
    }
  })
  return context
}
