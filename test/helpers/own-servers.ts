/**
 * A `redis-server` and a PostgreSQL cluster of a test file's own, on fixed loopback ports, that
 * the test may stop, kill, freeze and start again (the shared servers of the other files are
 * never touched), below Linux's ephemeral port range. Each is stopped after the file (`afterAll`) and on the process's exit, even
 * when a test failed midway.
 */
import { spawnSync } from 'node:child_process'
import { chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { afterAll } from 'vitest'
import { exited, redisProcesses } from './redis-processes.js'

export interface OwnRedis {
  readonly port: number
  readonly url: string
  /** Starts it (again) on its port, empty (no persistence), and waits until it answers. */
  start(): Promise<void>
  /** Sends `signal` and waits for the process to end (not for `SIGSTOP`/`SIGCONT`). */
  signal(signal: NodeJS.Signals): Promise<void>
}

/**
 * A `redis-server` on `127.0.0.1:port` (below Linux's ephemeral range), without persistence,
 * started now and ended after the test file: one of {@link redisProcesses}, which starts it
 * again while the port is still taken. Check {@link redisServerMissing} first.
 */
export async function startOwnRedis(port: number): Promise<OwnRedis> {
  const redis = redisProcesses('restart suite Redis', mkdtempSync(join(tmpdir(), 'mcp-dispatch-own-redis-')))
  afterAll(() => redis.stop())
  const own: OwnRedis = {
    port,
    url: `redis://127.0.0.1:${port}`,
    async start() {
      if (redis.processes.has(port)) throw new Error(`redis-server on ${port} is already running`)
      await redis.running(port, () => ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'])
    },
    async signal(signal) {
      const child = redis.processes.get(port)
      if (child === undefined) return
      child.kill(signal)
      if (signal === 'SIGSTOP' || signal === 'SIGCONT') return
      await exited(child)
      redis.processes.delete(port)
    },
  }
  await own.start()
  return own
}

/** The directory of PostgreSQL's programs (`initdb`, `pg_ctl`), or `undefined`. */
function postgresBin(): string | undefined {
  const root = '/usr/lib/postgresql'
  if (!existsSync(root)) return undefined
  const versions = readdirSync(root).sort((a, b) => Number(b) - Number(a))
  return versions.map((version) => join(root, version, 'bin')).find((bin) => existsSync(join(bin, 'pg_ctl')))
}

/** Why a PostgreSQL cluster cannot be started here, or `undefined`. */
export function ownPostgresMissing(): string | undefined {
  return postgresBin() === undefined ? 'PostgreSQL server programs are not installed (/usr/lib/postgresql/*/bin/pg_ctl)' : undefined
}

export interface OwnPostgres {
  readonly port: number
  /** `postgres://postgres@127.0.0.1:<port>/test` */
  readonly url: string
  /** `pg_ctl stop -m <mode>`: waits until the server is down. */
  stop(mode: 'smart' | 'fast' | 'immediate'): void
  /** `pg_ctl start`: waits until it accepts connections. */
  start(): void
  /** Sends `signal` to the postmaster and every process it started (`SIGSTOP`: frozen, connections up; `SIGCONT`). */
  signalAll(signal: 'SIGSTOP' | 'SIGCONT'): void
  /** Stops it (immediate) for good and removes its directory. */
  destroy(): void
}

/**
 * A PostgreSQL cluster of its own in a fresh directory, trust auth, listening on
 * `127.0.0.1:port`, with a database `test`; `settings` are `-c` settings of the server
 * (`max_connections=…`). Run as the `postgres` user when this process is root (initdb refuses
 * root).
 */
export async function startOwnPostgres(port: number, settings: readonly string[] = []): Promise<OwnPostgres> {
  const bin = postgresBin()
  if (bin === undefined) throw new Error(ownPostgresMissing())
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-own-pg-'))
  const root = process.getuid?.() === 0
  const as = (args: string[]) => (root ? ['runuser', ['-u', 'postgres', '--', ...args]] as const : [args[0]!, args.slice(1)] as const)
  const run = (args: string[]) => {
    const [command, rest] = as(args)
    const result = spawnSync(command, rest, { encoding: 'utf8', timeout: 30_000 })
    if (result.status !== 0) throw new Error(`${args.join(' ')} failed: ${result.stderr || result.stdout || result.error?.message}`)
  }
  if (root) {
    const { uid, gid } = userIds('postgres')
    chownSync(dir, uid, gid)
  }
  chmodSync(dir, 0o700)
  const data = join(dir, 'data')
  run([join(bin, 'initdb'), '-D', data, '-U', 'postgres', '--auth=trust', '--no-sync'])
  writeFileSync(join(dir, 'options'), '')
  const options = ['-p', String(port), '-k', dir, '-c', 'listen_addresses=127.0.0.1', '-c', 'fsync=off', ...settings.flatMap((s) => ['-c', s])].join(' ')
  let up = false
  const own: OwnPostgres = {
    port,
    url: `postgres://postgres@127.0.0.1:${port}/test`,
    start() {
      run([join(bin, 'pg_ctl'), '-D', data, '-l', join(dir, 'log'), '-o', options, '-w', '-t', '20', 'start'])
      up = true
    },
    stop(mode) {
      run([join(bin, 'pg_ctl'), '-D', data, '-m', mode, '-w', '-t', '20', 'stop'])
      up = false
    },
    signalAll(signal) {
      const postmaster = Number(readFileSync(join(data, 'postmaster.pid'), 'utf8').split('\n')[0])
      const children = spawnSync('pgrep', ['-P', String(postmaster)], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean).map(Number)
      for (const pid of [postmaster, ...children]) process.kill(pid, signal)
    },
    destroy() {
      if (up) {
        try {
          own.signalAll('SIGCONT')
        } catch {
          // Not running.
        }
        try {
          own.stop('immediate')
        } catch {
          // Already down (stopped by a test that failed before starting it again).
        }
      }
      rmSync(dir, { recursive: true, force: true })
    },
  }
  const onExit = () => own.destroy()
  process.once('exit', onExit)
  afterAll(() => {
    own.destroy()
    process.removeListener('exit', onExit)
  })
  own.start()
  const client = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:${port}/postgres` })
  await client.connect()
  await client.query('CREATE DATABASE test')
  await client.end()
  return own
}

function userIds(name: string): { uid: number; gid: number } {
  const line = spawnSync('id', ['-u', name], { encoding: 'utf8' }).stdout.trim()
  const group = spawnSync('id', ['-g', name], { encoding: 'utf8' }).stdout.trim()
  return { uid: Number(line), gid: Number(group) }
}
