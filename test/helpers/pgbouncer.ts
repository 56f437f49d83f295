/**
 * A real PgBouncer in transaction mode in front of the test PostgreSQL (`POSTGRES_URL`), for
 * the tests of `mcp-dispatch/postgres` behind it: started by the test file from the
 * `pgbouncer` binary (Debian's package: `apt-get install pgbouncer`), with its config and
 * auth file in a temporary directory (trust auth, the URL's database and user), as the
 * `postgres` user when the tests run as root (PgBouncer refuses root), and stopped after the
 * file, so the process exits on its own. Without `pgbouncer` on the `PATH` (or in
 * `/usr/sbin`): under `.ci/run` (`MCP_DISPATCH_CI=1`) the importing test file fails (`.ci/run` installs it); elsewhere
 * {@link startPgBouncer} answers `undefined`, the suites skip, and the reason is printed.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { afterAll } from 'vitest'
import { underProjectCI } from './ci.js'
import { POSTGRES_URL } from './postgres.js'

/** The `pgbouncer` binary: on the `PATH`, or where Debian puts it (`/usr/sbin`, not on every user's `PATH`). */
function findPgBouncer(): { binary: string } | { missing: string } {
  for (const binary of ['pgbouncer', '/usr/sbin/pgbouncer']) {
    const version = spawnSync(binary, ['--version'], { encoding: 'utf8' })
    if (!version.error) return { binary }
  }
  return { missing: 'pgbouncer is not installed' }
}

/** A PgBouncer started by {@link startPgBouncer}. */
export interface TestPgBouncer {
  /** `postgres://<user>@127.0.0.1:<port>/<database>`: the test database through PgBouncer. */
  readonly url: string
  /** Its version line (`PgBouncer 1.18.0`). */
  readonly version: string
  /** Stops it now (it is stopped after the test file anyway). */
  stop(): Promise<void>
}

/** Where a {@link startPgBouncer} points, and settings of its `[pgbouncer]` section. */
export interface PgBouncerOptions {
  /** The PostgreSQL it pools; default `POSTGRES_URL`. */
  upstream?: string
  /** Lines added to its `[pgbouncer]` section (`server_login_retry = 1`). */
  settings?: readonly string[]
}

/**
 * Starts PgBouncer on 127.0.0.1:`port` in transaction mode (`pool_mode = transaction`, at
 * most `poolSize` server connections) in front of `POSTGRES_URL`, and stops it after the test
 * file (an `afterAll` of the file: call this at its top level). `undefined` when PgBouncer is
 * not installed, outside CI.
 */
export async function startPgBouncer(port: number, poolSize = 4, options: PgBouncerOptions = {}): Promise<TestPgBouncer | undefined> {
  const found = findPgBouncer()
  if ('missing' in found) {
    if (underProjectCI()) throw new Error(`PgBouncer is required under .ci/run (MCP_DISPATCH_CI): ${found.missing} (apt-get install -y pgbouncer)`)
    console.warn(`[pgbouncer tests] skipped: ${found.missing}; install it (apt-get install pgbouncer)`)
    return undefined
  }
  const upstream = new URL(options.upstream ?? POSTGRES_URL)
  const database = upstream.pathname.slice(1)
  const user = decodeURIComponent(upstream.username || 'postgres')
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-pgbouncer-'))
  // Readable by the `postgres` user PgBouncer switches to when started as root.
  chmodSync(dir, 0o755)
  const file = (name: string, text: string) => {
    writeFileSync(join(dir, name), text)
    chmodSync(join(dir, name), 0o644)
    return join(dir, name)
  }
  const authFile = file('userlist.txt', `"${user}" ""\n`)
  const config = file(
    'pgbouncer.ini',
    [
      '[databases]',
      `${database} = host=${upstream.hostname} port=${upstream.port || 5432} dbname=${database}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${authFile}`,
      'pool_mode = transaction',
      `default_pool_size = ${poolSize}`,
      'max_client_conn = 200',
      ...(options.settings ?? []),
      '',
    ].join('\n'),
  )
  const root = process.getuid?.() === 0
  const child: ChildProcess = spawn(found.binary, [...(root ? ['-u', 'postgres'] : []), config], { stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  const keep = (chunk: Buffer) => void (output = (output + chunk.toString()).slice(-2_000))
  child.stdout!.on('data', keep)
  child.stderr!.on('data', keep)
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  let stopped: Promise<void> | undefined
  const stop = () => (stopped ??= stopNow())
  const stopNow = async () => {
    process.removeListener('exit', killOnExit)
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
    await exited
    rmSync(dir, { recursive: true, force: true })
  }
  const killOnExit = () => child.kill('SIGKILL')
  process.once('exit', killOnExit)
  afterAll(stop)

  const url = `postgres://${encodeURIComponent(user)}@127.0.0.1:${port}/${database}`
  const deadline = performance.now() + 5_000
  for (;;) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1_000 })
    try {
      await client.connect()
      const { rows } = await client.query('SELECT 1 AS one')
      if (rows[0]?.one === 1) break
    } catch (error) {
      if (child.exitCode !== null || performance.now() > deadline) {
        await stop()
        throw new Error(`PgBouncer did not start on port ${port}: ${(error as Error).message} (${output.trim().split('\n').pop() ?? 'no output'})`)
      }
      await new Promise((resolve) => setTimeout(resolve, 50))
    } finally {
      await client.end().catch(() => {})
    }
  }
  const version = spawnSync(found.binary, ['--version'], { encoding: 'utf8' }).stdout.split('\n')[0] ?? ''
  return { url, version, stop }
}
