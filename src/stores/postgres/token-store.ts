/**
 * The PostgreSQL {@link TokenStore}: one table (and its resets), one statement per operation
 * but `insert`, which reads its record again.
 * @module
 */
import type { ApiTokenRecord, TokenStore } from '../../core/stores.js'
import { hasLoneSurrogate } from '../../core/text.js'
import { ConfigurationError, optionNames, refuseUnknownOptions } from '../../errors.js'
import {
  type PostgresTableOptions,
  type Statement,
  type TokenTableNames,
  migrationSql,
  tokenStatements,
  tokenTableNames,
} from './schema.js'

/** A query as the store sends it: node-postgres' query config. */
export interface PostgresQuery {
  /** SQL with `$1`, `$2`… placeholders. */
  readonly text: string
  /** Values of the placeholders. */
  readonly values?: unknown[]
  /** When set, the statement is prepared once per connection under this name, then reused. */
  readonly name?: string
}

/** What the store reads of a query result. */
export interface PostgresQueryResult {
  readonly rows: unknown[]
}

/**
 * What the store needs of a database client: node-postgres' `query(config)`. A `pg.Pool`
 * fits (recommended), as do `pg.Client` and clients that copy its API. Typed structurally,
 * so `mcp-dispatch/postgres` loads without `pg` installed and never imports it.
 *
 * The store relies on node-postgres' default type parsing of `text[]` (to `string[]`);
 * `bigint` columns may come back as strings, numbers or bigints.
 */
export interface PostgresQueryable {
  /** Runs one parameterized statement (`{ text, values }`, prepared once per connection when it has a `name`) and answers its rows (node-postgres' `query`). */
  query(query: PostgresQuery): Promise<PostgresQueryResult>
}

/** Options of {@link createPostgresTokenStore}. */
export interface PostgresTokenStoreOptions extends PostgresTableOptions {
  /** The client the store queries through, usually a `pg.Pool`. The store never ends it. */
  pool: PostgresQueryable
  /**
   * Run every statement as a named prepared statement (default `true`): each connection
   * parses and plans it once. Set `false` behind a pooler that does not carry prepared
   * statements across server connections (PgBouncer in transaction mode before 1.21, or
   * without `max_prepared_statements`): there the named statements fail, "prepared statement
   * … already exists" or "… does not exist", which the store rejects with a
   * `ConfigurationError` naming this option.
   */
  preparedStatements?: boolean | undefined
}

/** The PostgreSQL token store: a {@link TokenStore} that can create its own table. */
export interface PostgresTokenStore extends TokenStore {
  /** The table, schema-qualified and quoted as in SQL (`"public"."mcp_dispatch_api_tokens"`). */
  readonly table: string
  /**
   * Creates the schema (unless `public`), the table, its indexes and `<table>_resets` where they
   * do not exist, and rejects when tables already there are not what the store relies on: the
   * SQL of `postgresTokenStoreMigration`. Idempotent, and safe to run on every start from every
   * instance at once (serialized by an advisory lock).
   */
  migrate(): Promise<void>
}

/** A row as node-postgres returns it. */
interface TokenRow {
  id: string
  user_id: string
  name: string
  token_hash: string
  display_prefix: string
  servers: string[]
  allowed_ips: string[] | null
  expires_at: BigintValue
  created_at: BigintValue
  last_used_at: BigintValue | null
  revoked_at: BigintValue | null
}

/** A `bigint` column: a string by default in node-postgres, a number or bigint with a custom parser. */
type BigintValue = string | number | bigint

/** A frozen record from a row; each read builds its own, so callers get copies. */
function toRecord(row: TokenRow): ApiTokenRecord {
  return Object.freeze({
    id: row.id,
    userId: row.user_id,
    name: row.name,
    tokenHash: row.token_hash,
    displayPrefix: row.display_prefix,
    servers: Object.freeze(row.servers),
    allowedIps: row.allowed_ips === null ? null : Object.freeze(row.allowed_ips),
    expiresAt: Number(row.expires_at),
    createdAt: Number(row.created_at),
    lastUsedAt: row.last_used_at === null ? null : Number(row.last_used_at),
    revokedAt: row.revoked_at === null ? null : Number(row.revoked_at),
  })
}

/**
 * Whether an id can name a row: PostgreSQL refuses a NUL in text (an error, where the memory
 * store answers "no such token"), and pg sends a lone surrogate as U+FFFD (another id).
 */
function storable(id: string): boolean {
  return typeof id === 'string' && !id.includes('\0') && !hasLoneSurrogate(id)
}

/**
 * A unique violation (SQLSTATE 23505) on the token table, as the `TypeError` the in-memory
 * store throws for the same mistake (the PostgreSQL error as its `cause`); any other error
 * as it is, so an unreachable database reaches the caller (the dispatcher answers 503).
 */
function duplicateError(error: unknown, names: TokenTableNames, id: string): unknown {
  const pgError = error as { code?: unknown; constraint?: unknown } | null
  if (typeof pgError !== 'object' || pgError === null || pgError.code !== '23505') return error
  if (pgError.constraint === names.hashIndex) return new TypeError('duplicate token hash', { cause: error })
  if (pgError.constraint === names.primaryKey) return new TypeError(`duplicate token id ${id}`, { cause: error })
  return new TypeError(`duplicate token (${String(pgError.constraint)})`, { cause: error })
}

/**
 * PostgreSQL's answer to a named statement on a connection it does not belong to: "prepared
 * statement … already exists" (42P05: another client prepared it on this server connection)
 * or "… does not exist" (26000: it was prepared on another). Either means the connection is
 * shared between clients, as PgBouncer in transaction mode shares it, and is told as the
 * option to change, the PostgreSQL error as its `cause`; any other error as it is.
 */
function sharedConnectionError(error: unknown, statement: Statement): unknown {
  const code = (error as { code?: unknown } | null)?.code
  if (code !== '42P05' && code !== '26000') return error
  return new ConfigurationError(
    'preparedStatements',
    `is true, but PostgreSQL answered "${(error as Error).message}" (${code}) for the store's named statement ${statement.name}: ` +
      'the connection is shared with other clients, as behind PgBouncer in transaction mode (before 1.21, or without ' +
      'max_prepared_statements); set preparedStatements: false',
    { cause: error },
  )
}

/**
 * Whether PostgreSQL rolled the statement back for a concurrent one: a serialization failure
 * (40001) or a deadlock (40P01). Every statement of the store is a transaction of its own, so one
 * so rolled back changed nothing and is sent again. Under `default_transaction_isolation` at
 * `repeatable read` or `serializable` (a platform's setting, on the role or the database), a
 * statement that meets a row another committed since its snapshot (a revocation racing a
 * rotation or a `last_used_at` flush) fails with 40001 where READ COMMITTED waits and re-reads;
 * sent once, the revocation was answered 503 and a rotation that lost 503 rather than 409.
 */
function rolledBackForAnother(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code
  return code === '40001' || code === '40P01'
}

/**
 * Tries of a statement PostgreSQL rolls back for a concurrent one ({@link rolledBackForAnother}).
 * Five, a few milliseconds apart, were not always enough: a password reset among two dozen
 * creations of its user under `serializable` was rolled back five times in a row on a loaded
 * machine, and answered 503.
 */
const SERIALIZATION_ATTEMPTS = 10
/** Most milliseconds of the random pause before a statement is sent again. */
const SERIALIZATION_PAUSE_MAX_MS = 100

const POSTGRES_TOKEN_STORE_OPTIONS = optionNames<PostgresTokenStoreOptions>({ pool: true, schema: true, table: true, preparedStatements: true })

/**
 * Creates the API-token store on PostgreSQL (DESIGN.md "Stores"). Construction checks the
 * options and does not connect; run `migrate()` (or the SQL of `postgresTokenStoreMigration`
 * in your own migration tool) before first use.
 *
 * Every operation is one statement, so each is atomic on its own, but `insert`, which reads
 * the record again in a second (a password reset that committed while the INSERT ran is not
 * in its snapshot, and must not be answered as active): `findByHash` (the hot
 * path) is one lookup on the unique hash index; `rotate` with `expectedHash` is a
 * compare-and-swap (`UPDATE … WHERE token_hash = $expected RETURNING …`), and so is `update`
 * with `expectedExpiresAt` (on `expires_at`); `revoke` keeps the
 * first revocation time; `touch` writes a whole batch in one statement and never moves
 * `last_used_at` backwards. A duplicate id or hash throws a `TypeError`; database errors
 * (unreachable, timeouts) reject as they are, which the token service turns into 503.
 *
 * @example
 * ```ts
 * import pg from 'pg'
 * import { createTokenService } from 'mcp-dispatch'
 * import { createPostgresTokenStore } from 'mcp-dispatch/postgres'
 *
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, connectionTimeoutMillis: 2_000 })
 * // Without a listener, an idle client's error (PostgreSQL restarted) ends the process.
 * pool.on('error', (error) => console.error('idle PostgreSQL client failed', error))
 * const store = createPostgresTokenStore({ pool })
 * await store.migrate()
 * // Every request reads the table; to cache records (`cacheTtlMs`), also give `invalidations`:
 * // the Redis bus every instance hears (`createRedisInvalidationBus` of mcp-dispatch/redis).
 * const tokens = createTokenService({ store, apps, subscriptions })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} without a `pool` (one with `query(config)`), or with a
 * `preparedStatements` that is not a boolean or a `schema` or `table` that is no lower-case SQL
 * identifier (`information_schema` and `pg_…` refused). A store call on a connection shared
 * behind PgBouncer with `preparedStatements: true` rejects with one too.
 */
export function createPostgresTokenStore(options: PostgresTokenStoreOptions): PostgresTokenStore {
  if (typeof options !== 'object' || options === null) throw new ConfigurationError('pool', 'is required')
  refuseUnknownOptions(options, POSTGRES_TOKEN_STORE_OPTIONS, 'createPostgresTokenStore', (key) =>
    ['connectionString', 'host', 'port', 'user', 'password', 'database', 'client'].includes(key)
      ? 'the store takes a pool the platform made, not its settings: pool: new pg.Pool({ connectionString }) (docs/stores.md)'
      : undefined,
  )
  const { pool } = options
  if (typeof pool !== 'object' || pool === null || typeof pool.query !== 'function') {
    throw new ConfigurationError('pool', 'must be a pg Pool, or another client with its query(config) method')
  }
  const prepared = options.preparedStatements ?? true
  if (typeof prepared !== 'boolean') throw new ConfigurationError('preparedStatements', 'must be a boolean')
  const names = tokenTableNames(options)
  const statements = tokenStatements(names)
  const migration = migrationSql(names)

  const send = async (statement: Statement, values: unknown[]) => {
    if (!prepared) return pool.query({ text: statement.text, values })
    try {
      return await pool.query({ name: statement.name, text: statement.text, values })
    } catch (error) {
      throw sharedConnectionError(error, statement)
    }
  }
  const run = async (statement: Statement, values: unknown[]) => {
    let rolledBack: unknown
    for (let attempt = 1; ; attempt++) {
      try {
        return await send(statement, values)
      } catch (error) {
        // A `pool` that is one client inside a transaction of the platform's: the transaction
        // is aborted (25P02) once a statement failed, and the first failure is the one to tell.
        if (rolledBack !== undefined && (error as { code?: unknown } | null)?.code === '25P02') throw rolledBack
        if (attempt >= SERIALIZATION_ATTEMPTS || !rolledBackForAnother(error)) throw error
        rolledBack ??= error
        // A pause, random, so that statements that met once (a password reset among a user's
        // creations) do not meet again in step; its ceiling doubles from 5 ms to 100 ms, so a
        // statement that keeps meeting others waits for them to end (the token service's
        // deadline bounds it all).
        await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(SERIALIZATION_PAUSE_MAX_MS, 5 * 2 ** (attempt - 1))))
      }
    }
  }
  const one = async (statement: Statement, values: unknown[]) => {
    const { rows } = await run(statement, values)
    return rows.length === 0 ? undefined : toRecord(rows[0] as TokenRow)
  }
  const all = async (statement: Statement, values: unknown[]) =>
    (await run(statement, values)).rows.map((row) => toRecord(row as TokenRow))

  return {
    table: names.qualified,
    async migrate() {
      // No values: the simple query protocol, so the statements run as one transaction.
      await pool.query({ text: migration })
    },
    async insert(record) {
      let inserted: ApiTokenRecord | undefined
      try {
        inserted = await one(statements.insert, [
          record.id,
          record.userId,
          record.name,
          record.tokenHash,
          record.displayPrefix,
          record.servers,
          record.allowedIps,
          record.expiresAt,
          record.createdAt,
          record.lastUsedAt,
          record.revokedAt,
        ])
      } catch (error) {
        throw duplicateError(error, names, record.id)
      }
      // RETURNING reads with the INSERT's snapshot (READ COMMITTED), which misses a password
      // reset of the user that committed while the INSERT ran; a second statement sees it, so
      // such a create is told its token is revoked rather than handed a dead secret.
      if (inserted === undefined || inserted.revokedAt !== null) return inserted
      return (await one(statements.get, [record.id])) ?? inserted
    },
    findByHash: (tokenHash) => one(statements.findByHash, [tokenHash]),
    get: async (id) => (storable(id) ? one(statements.get, [id]) : undefined),
    listByUser: (userId) => all(statements.listByUser, [userId]),
    countActiveByUser: async (userId, at) => ((await run(statements.countActiveByUser, [userId, at])).rows[0] as { n: number }).n,
    update: async (id, patch, expectedExpiresAt) =>
      storable(id) ? one(statements.update, [
        id,
        patch.name ?? null,
        patch.expiresAt ?? null,
        patch.allowedIps !== undefined,
        patch.allowedIps ?? null,
        expectedExpiresAt ?? null,
      ]) : undefined,
    async rotate(id, next, expectedHash) {
      if (!storable(id)) return undefined
      try {
        return await one(statements.rotate, [id, next.tokenHash, next.displayPrefix, expectedHash ?? null])
      } catch (error) {
        throw duplicateError(error, names, id)
      }
    },
    revoke: async (id, at) => (storable(id) ? one(statements.revoke, [id, at]) : undefined),
    async revokeAllForUser(userId, at) {
      try {
        return await all(statements.revokeAllForUser, [userId, at])
      } catch (error) {
        // A user id past what an index entry holds (program_limit_exceeded, on the resets
        // table's key) owns no token: the token table's index on user_id has the same bound
        // (checked all the same: a table managed by hand may lack that index).
        const pgError = error as { code?: unknown; constraint?: unknown } | null
        if (pgError?.code === '54000' && pgError.constraint === names.resetsKey && (await all(statements.listByUser, [userId])).length === 0) return []
        throw error
      }
    },
    async touch(lastUsed) {
      if (lastUsed.size === 0) return
      await run(statements.touch, [[...lastUsed.keys()], [...lastUsed.values()]])
    },
  }
}
