/**
 * The token table: its names (validated, quoted), its migration and the statements the store
 * runs. Text only: nothing here talks to a database.
 * @module
 */
import { createHash } from 'node:crypto'
import { quoted } from '../../core/text.js'
import { ConfigurationError, optionNames, refuseUnknownOptions } from '../../errors.js'

/** Default schema of the token table. */
export const DEFAULT_POSTGRES_SCHEMA = 'public'
/** Default name of the token table. */
export const DEFAULT_POSTGRES_TOKEN_TABLE = 'mcp_dispatch_api_tokens'

/** Where the token table lives. Both names are plain lower-case SQL identifiers. */
export interface PostgresTableOptions {
  /**
   * Schema of the table; default `public`. Lower-case letters, digits and `_`, starting
   * with a letter or `_`, at most 63 characters, neither `information_schema` nor starting
   * with `pg_` (PostgreSQL's own).
   */
  schema?: string | undefined
  /**
   * Table name; default `mcp_dispatch_api_tokens`. Same characters as `schema`, at most 48
   * characters (its index names add up to 15 more, within PostgreSQL's 63).
   */
  table?: string | undefined
}

const IDENTIFIER = /^[a-z_][a-z0-9_]*$/

function checkIdentifier(option: string, value: unknown, maxLength: number): string {
  if (typeof value !== 'string' || !IDENTIFIER.test(value)) {
    throw new ConfigurationError(
      option,
      `must be a lower-case SQL identifier (letters a-z, digits, "_", not starting with a digit), got ${typeof value === 'string' ? quoted(value) : JSON.stringify(value)}`,
    )
  }
  if (value.length > maxLength) throw new ConfigurationError(option, `must be at most ${maxLength} characters`)
  return value
}

/** The validated, quoted names of one token table and of its indexes. @internal */
export interface TokenTableNames {
  readonly schema: string
  readonly table: string
  /** `"schema"."table"`, ready for SQL. */
  readonly qualified: string
  /** Unquoted index names, as PostgreSQL reports them in a unique violation. */
  readonly primaryKey: string
  readonly hashIndex: string
  readonly userIndex: string
  /** `"schema"."table_resets"`: each user's last password reset (`revokeAllForUser`). */
  readonly resets: string
  readonly resetsKey: string
}

/**
 * Validates `schema` and `table` and derives the names the migration and the statements use.
 * Identifiers are validated against a strict pattern and always double-quoted, so no option
 * can inject SQL. Throws {@link ConfigurationError}.
 * @internal
 */
export function tokenTableNames(options: PostgresTableOptions = {}): TokenTableNames {
  const schema = checkIdentifier('schema', options.schema ?? DEFAULT_POSTGRES_SCHEMA, 63)
  if (schema.startsWith('pg_') || schema === 'information_schema') {
    throw new ConfigurationError('schema', 'must not be "information_schema" or start with "pg_" (reserved by PostgreSQL)')
  }
  const table = checkIdentifier('table', options.table ?? DEFAULT_POSTGRES_TOKEN_TABLE, 48)
  return {
    schema,
    table,
    qualified: `"${schema}"."${table}"`,
    primaryKey: `${table}_pkey`,
    hashIndex: `${table}_token_hash_key`,
    userIndex: `${table}_user_id_idx`,
    resets: `"${schema}"."${table}_resets"`,
    resetsKey: `${table}_resets_pkey`,
  }
}

/**
 * The SQL that creates the token table and its indexes, and `<table>_resets` (each user's last
 * password reset: a token of the user created before it reads as revoked): idempotent (each
 * created only when missing, and what the store relies on checked, failing loudly otherwise: the
 * token table a table with every column of the store, its primary key on `id` and unique index
 * on `token_hash`, and the resets table's
 * primary key on `user_id` (text) and `reset_at` (bigint), so another store's token table of
 * that name is refused), one transaction when sent as one query, and serialized by an advisory lock so
 * instances that start together do not race on the catalog. Creates the schema too, unless
 * it is `public`. Times are `bigint` epoch milliseconds, exactly the numbers of
 * `ApiTokenRecord`; the allowlist is `text[]`, `NULL` for none.
 *
 * `createPostgresTokenStore(...).migrate()` runs exactly this; use the text directly to put it
 * in your own migration tool.
 *
 * @example
 * ```ts
 * import { writeFileSync } from 'node:fs'
 * import { postgresTokenStoreMigration } from 'mcp-dispatch/postgres'
 *
 * writeFileSync('migrations/001_mcp_dispatch_tokens.sql', postgresTokenStoreMigration({ schema: 'mcp' }))
 * ```
 *
 * @throws {ConfigurationError} with a `schema` or `table` that is no lower-case SQL identifier
 * (`information_schema` and `pg_…` refused), or an option it does not have (`shema`).
 */
export function postgresTokenStoreMigration(options: PostgresTableOptions = {}): string {
  if (options === null || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, optionNames<PostgresTableOptions>({ schema: true, table: true }), 'postgresTokenStoreMigration')
  return migrationSql(tokenTableNames(options))
}

/** {@link postgresTokenStoreMigration} for names already validated. @internal */
export function migrationSql(names: TokenTableNames): string {
  const { schema, qualified } = names
  // The schema's lock first (tables of one new schema, migrated together, would both create
  // it), then the table's; the schema is created only when missing, so a role with CREATE on
  // an existing schema, and none on the database, can migrate.
  const createSchema =
    schema === 'public'
      ? ''
      : `SELECT pg_advisory_xact_lock(hashtext('mcp-dispatch-schema:${schema}'));
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = '${schema}') THEN CREATE SCHEMA "${schema}"; END IF;
END $$;
`
  return `-- mcp-dispatch API-token store (schema version 2: the resets table). Idempotent.
${createSchema}SELECT pg_advisory_xact_lock(hashtext('mcp-dispatch:${qualified}'));
CREATE TABLE IF NOT EXISTS ${qualified} (
  id              text     NOT NULL,
  user_id         text     NOT NULL,
  name            text     NOT NULL,
  token_hash      text     NOT NULL,  -- SHA-256 or HMAC-SHA-256 hex of the secret, never the secret
  display_prefix  text     NOT NULL,  -- first 12 characters of the secret
  servers         text[]   NOT NULL,  -- App ids, fixed at creation
  allowed_ips     text[],             -- addresses and CIDR ranges as entered; NULL: no allowlist
  expires_at      bigint   NOT NULL,  -- epoch milliseconds
  created_at      bigint   NOT NULL,
  last_used_at    bigint,
  revoked_at      bigint,
  CONSTRAINT "${names.primaryKey}" PRIMARY KEY (id)
);
-- The last password reset of each user (revokeAllForUser): a token created before it or in its
-- millisecond (created_at <= reset_at) is revoked, even one whose INSERT landed after the
-- reset's UPDATE.
CREATE TABLE IF NOT EXISTS ${names.resets} (
  user_id   text    NOT NULL,
  reset_at  bigint  NOT NULL,  -- epoch milliseconds
  CONSTRAINT "${names.resetsKey}" PRIMARY KEY (user_id)
);
DO $$
DECLARE
  tbl oid := '${qualified}'::regclass;
  resets oid := '${names.resets}'::regclass;
  missing text;
BEGIN
  -- A relation of that name made for something else (a view, or a table short of a column, made
  -- by hand): named here, rather than by the first statement that meets the gap ("column
  -- user_id does not exist", "cannot create index on relation").
  IF (SELECT relkind FROM pg_class WHERE oid = tbl) NOT IN ('r', 'p') THEN
    RAISE EXCEPTION 'mcp-dispatch: % is not a table: it is not the token store''s', '${qualified}';
  END IF;
  SELECT string_agg(c, ', ' ORDER BY n) INTO missing FROM unnest(ARRAY[${COLUMNS.map((c) => `'${c}'`).join(', ')}]) WITH ORDINALITY AS t(c, n)
  WHERE NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = tbl AND attname = c AND attnum > 0 AND NOT attisdropped);
  IF missing IS NOT NULL THEN
    RAISE EXCEPTION 'mcp-dispatch: table % lacks columns %: it is not the token store''s (another table of that name, or one made by hand)', '${qualified}', missing;
  END IF;
  -- Only when missing: CREATE INDEX, even IF NOT EXISTS, takes a SHARE lock on the table, and
  -- waiting for it behind an open write would queue every write of every instance on start.
  IF to_regclass('"${schema}"."${names.hashIndex}"') IS NULL THEN
    CREATE UNIQUE INDEX "${names.hashIndex}" ON ${qualified} (token_hash);
  END IF;
  IF to_regclass('"${schema}"."${names.userIndex}"') IS NULL THEN
    CREATE INDEX "${names.userIndex}" ON ${qualified} (user_id);
  END IF;
  -- What the store relies on, checked whatever created it (a relation of the same name, a
  -- table made by hand): a primary key on id and a unique index on token_hash alone.
  IF NOT EXISTS (
    SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = tbl AND a.attnum = i.indkey[0]
    WHERE i.indrelid = tbl AND i.indisprimary AND i.indnatts = 1 AND a.attname = 'id'
  ) THEN
    RAISE EXCEPTION 'mcp-dispatch: table % has no primary key on id', '${qualified}';
  END IF;
  IF NOT EXISTS (
    SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = tbl AND a.attnum = i.indkey[0]
    WHERE i.indrelid = tbl AND i.indisunique AND i.indnatts = 1 AND i.indpred IS NULL AND a.attname = 'token_hash'
  ) THEN
    RAISE EXCEPTION 'mcp-dispatch: table % has no unique index on token_hash (is "%" taken by another relation?)', '${qualified}', '${names.hashIndex}';
  END IF;
  -- The resets table likewise: one of its name made for something else (the token table of a
  -- store whose table is named so) would fail every call of this store.
  IF NOT EXISTS (
    SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = resets AND a.attnum = i.indkey[0]
    WHERE i.indrelid = resets AND i.indisprimary AND i.indnatts = 1 AND a.attname = 'user_id' AND a.atttypid = 'text'::regtype
  ) OR NOT EXISTS (
    SELECT 1 FROM pg_attribute
    WHERE attrelid = resets AND attname = 'reset_at' AND atttypid = 'int8'::regtype AND attnum > 0 AND NOT attisdropped
  ) THEN
    RAISE EXCEPTION 'mcp-dispatch: table % has no primary key on user_id (text) and column reset_at (bigint) (is it the token table of another store?)', '${names.resets}';
  END IF;
END $$;
`
}

const COLUMNS = [
  'id',
  'user_id',
  'name',
  'token_hash',
  'display_prefix',
  'servers',
  'allowed_ips',
  'expires_at',
  'created_at',
  'last_used_at',
  'revoked_at',
] as const

/** A statement of the store: its text and the name it is prepared under. @internal */
export interface Statement {
  readonly name: string
  readonly text: string
}

/** The statements of the token store, one per operation. @internal */
export type TokenStatements = Record<
  'insert' | 'findByHash' | 'get' | 'listByUser' | 'countActiveByUser' | 'update' | 'rotate' | 'revoke' | 'revokeAllForUser' | 'touch',
  Statement
>

/**
 * Every statement the store runs, for one table. Statement names carry a digest of the
 * statement's text (the table's name in it), so stores on different tables can share a pool (a
 * prepared statement is per connection and per name), and so can the stores of two versions of
 * this library on one table (a process holding two copies of the package), whose statements of
 * one operation differ: under one name, node-postgres refused the second text on a connection
 * that had prepared the first ("Prepared statements must be unique"), every such call 503. Writes that lock several rows (`touch`, `revokeAllForUser`) lock
 * them in id order, so two of them running at once on other instances cannot deadlock.
 * @internal
 */
export function tokenStatements(names: TokenTableNames): TokenStatements {
  const t = names.qualified
  const columns = COLUMNS.join(', ')
  const returning = COLUMNS.map((c) => `t.${c}`).join(', ')
  // A token is revoked by its own revocation or by a password reset of its user after its
  // creation or in its millisecond: read here, after both committed, so a create racing a reset
  // cannot escape it (its INSERT may land after the reset's UPDATE, which then never saw it).
  // Not one that had expired by the reset (`reset_at >= expires_at`): expired is an end state
  // (spec 3).
  const resetAt = `(SELECT r.reset_at FROM ${names.resets} AS r
    WHERE r.user_id = t.user_id AND r.reset_at >= t.created_at AND r.reset_at < t.expires_at)`
  const read = COLUMNS.map((c) => (c === 'revoked_at' ? `COALESCE(t.revoked_at, ${resetAt}) AS revoked_at` : `t.${c}`)).join(', ')
  const live = `t.revoked_at IS NULL AND ${resetAt} IS NULL`
  // The same, in a statement over the rows of one user ($1): the reset is read by a subquery
  // that names no row (an InitPlan, run once per use), not once per row. Per row, a password
  // reset of a user with 50,000 revoked tokens (a create-and-revoke loop) took 2 s on a million
  // rows, past a 2 s statement_timeout, and the live token stayed active (a storage audit).
  const userReset = `(SELECT r.reset_at FROM ${names.resets} AS r WHERE r.user_id = $1)`
  const userResetAt = `(CASE WHEN ${userReset} >= t.created_at AND ${userReset} < t.expires_at THEN ${userReset} END)`
  const userRead = COLUMNS.map((c) => (c === 'revoked_at' ? `COALESCE(t.revoked_at, ${userResetAt}) AS revoked_at` : `t.${c}`)).join(', ')
  const statement = (operation: string, text: string): Statement => {
    const normalized = text.replace(/\s+/g, ' ').trim()
    const digest = createHash('sha256').update(normalized).digest('hex').slice(0, 12)
    return { name: `mcp_dispatch_${digest}_${operation}`, text: normalized }
  }
  return {
    insert: statement(
      'insert',
      `INSERT INTO ${t} AS t (${columns})
       VALUES ($1, $2, $3, $4, $5, $6::text[], $7::text[], $8, $9, $10, $11)
       RETURNING ${read}`,
    ),
    findByHash: statement('find_by_hash', `SELECT ${read} FROM ${t} AS t WHERE t.token_hash = $1`),
    get: statement('get', `SELECT ${read} FROM ${t} AS t WHERE t.id = $1`),
    listByUser: statement('list_by_user', `SELECT ${userRead} FROM ${t} AS t WHERE t.user_id = $1 ORDER BY t.created_at, t.id`),
    // A count, not the rows: a user's revoked and expired tokens stay (the dashboard lists them).
    countActiveByUser: statement(
      'count_active',
      `SELECT count(*)::int AS n FROM ${t} AS t WHERE t.user_id = $1 AND t.expires_at > $2 AND t.revoked_at IS NULL AND ${userResetAt} IS NULL`,
    ),
    // $4 says whether the allowlist changes: NULL is a value of it ("no allowlist"). $6, when
    // set, is the expiry the row must still have (compare-and-swap, as `rotate`). Answered as
    // it reads from then on: a new expiry past a reset that found the token expired (an edit
    // landing late, after the old expiry) makes it revoked by that reset.
    update: statement(
      'update',
      `UPDATE ${t} AS t
       SET name = COALESCE($2, t.name),
           expires_at = COALESCE($3, t.expires_at),
           allowed_ips = CASE WHEN $4::boolean THEN $5::text[] ELSE t.allowed_ips END
       WHERE t.id = $1 AND ${live} AND ($6::bigint IS NULL OR t.expires_at = $6)
       RETURNING ${read}`,
    ),
    // Compare-and-swap in one statement: under READ COMMITTED a concurrent rotation waits for
    // the row lock, then re-checks the WHERE clause against the committed row and finds the
    // hash moved on.
    rotate: statement(
      'rotate',
      `UPDATE ${t} AS t
       SET token_hash = $2, display_prefix = $3
       WHERE t.id = $1 AND ${live} AND ($4::text IS NULL OR t.token_hash = $4)
       RETURNING ${returning}`,
    ),
    // A token expired at $2 (`expires_at <= $2`) is answered as it is, unrevoked: expired is an
    // end state (spec 3). One a recorded reset revokes keeps that reset's time.
    revoke: statement(
      'revoke',
      `UPDATE ${t} AS t
       SET revoked_at = COALESCE(t.revoked_at, ${resetAt}, CASE WHEN t.expires_at > $2 THEN $2 END)
       WHERE t.id = $1
       RETURNING ${returning}`,
    ),
    // Revokes the tokens active at $2 and returns them. Only the user's last reset is recorded,
    // so a token that the previous one revokes on read (its INSERT landed after that reset's
    // UPDATE) gets that reset's time written now, expired by $2 or not: once the reset moves on
    // it would read as not revoked. It was revoked already, so it is not returned. The reset's
    // own write is not seen by the rest of the statement: `prior` is the previous reset. The
    // UPDATE finds the locked rows by primary key (`= ANY(ARRAY(…))`): joined on the CTE alone,
    // it was planned from the user's estimated rows as a scan of the whole table.
    revokeAllForUser: statement(
      'revoke_all_for_user',
      `WITH reset AS (
         INSERT INTO ${names.resets} AS r (user_id, reset_at) VALUES ($1, $2)
         ON CONFLICT (user_id) DO UPDATE SET reset_at = GREATEST(r.reset_at, EXCLUDED.reset_at)
       ), locked AS MATERIALIZED (
         SELECT t.id, ${userResetAt} AS prior FROM ${t} AS t
         WHERE t.user_id = $1 AND t.revoked_at IS NULL AND (t.expires_at > $2 OR ${userResetAt} IS NOT NULL)
         ORDER BY t.id FOR UPDATE
       ), revoked AS (
         UPDATE ${t} AS t SET revoked_at = COALESCE(locked.prior, $2)
         FROM locked WHERE t.id = ANY(ARRAY(SELECT id FROM locked)) AND t.id = locked.id AND t.revoked_at IS NULL
         RETURNING ${returning}, locked.prior
       )
       SELECT ${COLUMNS.join(', ')} FROM revoked WHERE prior IS NULL`,
    ),
    touch: statement(
      'touch',
      `WITH batch AS MATERIALIZED (
         SELECT s.id, b.at FROM ${t} AS s
         JOIN unnest($1::text[], $2::bigint[]) AS b(id, at) ON b.id = s.id
         WHERE s.last_used_at IS NULL OR s.last_used_at < b.at
         ORDER BY s.id FOR UPDATE OF s
       )
       UPDATE ${t} AS t SET last_used_at = batch.at
       FROM batch WHERE t.id = batch.id AND (t.last_used_at IS NULL OR t.last_used_at < batch.at)`,
    ),
  }
}
