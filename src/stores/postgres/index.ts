/**
 * PostgreSQL stores (`mcp-dispatch/postgres`): the API-token store shared by every instance,
 * and its SQL migration (DESIGN.md "Stores").
 *
 * The module never imports a database client: hand it a node-postgres `Pool` (the optional
 * peer dependency `pg`), or any client with the same `query(config)` method
 * ({@link PostgresQueryable}).
 *
 * - {@link createPostgresTokenStore}: the `TokenStore`, with `migrate()`.
 * - {@link postgresTokenStoreMigration}: the SQL of the migration, for your own migration tool.
 *
 * Table layout, indexes, queries per request, pool settings and failure behaviour:
 * `docs/stores.md`, section "PostgreSQL".
 *
 * @example
 * ```ts
 * import pg from 'pg'
 * import { createTokenService } from 'mcp-dispatch'
 * import { createPostgresTokenStore } from 'mcp-dispatch/postgres'
 *
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, connectionTimeoutMillis: 2_000 })
 * pool.on('error', (error) => console.error('idle PostgreSQL client failed', error))
 * const store = createPostgresTokenStore({ pool, schema: 'mcp' })
 * await store.migrate()
 * // Every request reads the table; to cache records (`cacheTtlMs`), also give `invalidations`:
 * // the Redis bus every instance hears (`createRedisInvalidationBus` of mcp-dispatch/redis).
 * const tokens = createTokenService({ store, apps, subscriptions })
 * ```
 * @module
 */

export {
  DEFAULT_POSTGRES_SCHEMA,
  DEFAULT_POSTGRES_TOKEN_TABLE,
  postgresTokenStoreMigration,
} from './schema.js'
export type { PostgresTableOptions } from './schema.js'
export { createPostgresTokenStore } from './token-store.js'
export type {
  PostgresQuery,
  PostgresQueryResult,
  PostgresQueryable,
  PostgresTokenStore,
  PostgresTokenStoreOptions,
} from './token-store.js'
