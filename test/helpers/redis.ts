/**
 * Real Redis for the tests of `mcp-dispatch/redis`, at `REDIS_URL` (default
 * `redis://127.0.0.1:6379`). Importing this module checks that Redis answers, once per
 * process: per test file in vitest.config.ts's `isolated` project, per worker in its `shared`
 * one. When it does not: under `CI` the importing test file fails (CI must provide Redis);
 * elsewhere the suites declared with {@link describeRedis} are skipped, and the reason is
 * printed once per process.
 *
 * Every suite runs once per ioredis major ({@link IOREDIS_KINDS}), with its own clients and
 * random key prefixes; after the suite, every key under those prefixes is deleted and every
 * client is disconnected, so the process exits on its own.
 */
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis, type RedisOptions } from 'ioredis'
import { Redis as Redis5 } from 'ioredis5'
import type { InvalidationMessage } from 'mcp-dispatch'
import type { RedisInvalidationBus } from 'mcp-dispatch/redis'
import { afterAll, describe } from 'vitest'
import { underCI } from './ci.js'
import { redisServerLacking } from './redis-processes.js'

/**
 * The ioredis majors the Redis stores are tested on: the peer dependency takes
 * `^5.4.0 || ^6.0.0`. `ioredis` is ioredis 6; `ioredis5` is ioredis 5, installed as the dev
 * dependency `ioredis5` (`npm:ioredis@^5`). ioredis 5 is typed here as ioredis 6: the surface
 * the tests use (commands, `duplicate`, `status`, events, `disconnect`) is the same on both;
 * that ioredis 5's own types fit the stores is checked in test/stores/redis.test.ts.
 */
export const IOREDIS = { ioredis: Redis, ioredis5: Redis5 as unknown as typeof Redis } as const

/** `ioredis` (ioredis 6) or `ioredis5`. */
export type IoredisKind = keyof typeof IOREDIS
export const IOREDIS_KINDS: readonly IoredisKind[] = ['ioredis', 'ioredis5']

/** Where the tests find Redis. */
export const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379'

/** Why Redis cannot be used, or `undefined` when it answers (and has `GETEX`: Redis 6.2+). */
async function probe(): Promise<string | undefined> {
  const client = new Redis(REDIS_URL, {
    lazyConnect: true,
    connectTimeout: 1_000,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: () => null,
  })
  // The first connection error says why (ECONNREFUSED…); the rejection only "Connection is closed".
  let cause: Error | undefined
  client.on('error', (error: Error) => (cause ??= error))
  try {
    await client.connect()
    const info = await client.info('server')
    const version = /redis_version:(\d+)\.(\d+)/.exec(info)
    if (version && (Number(version[1]) < 6 || (Number(version[1]) === 6 && Number(version[2]) < 2))) {
      return `Redis ${version[1]}.${version[2]} is too old: the session store needs GETEX (6.2+)`
    }
    return undefined
  } catch (error) {
    return (cause ?? (error as Error)).message || String(error)
  } finally {
    client.disconnect()
  }
}

const unavailable = await probe()
if (unavailable !== undefined && underCI()) {
  throw new Error(`Redis at ${REDIS_URL} is required under CI: ${unavailable}`)
}
if (unavailable !== undefined) {
  console.warn(`[redis tests] skipped: Redis at ${REDIS_URL} cannot be used (${unavailable}); start one or set REDIS_URL`)
}

/** `true` when Redis answered at `REDIS_URL`. */
export const redisAvailable = unavailable === undefined

/** What a Redis suite works with. */
export interface RedisTestContext {
  /** The ioredis major this run of the suite opens its clients with. */
  readonly kind: IoredisKind
  /** A client of `REDIS_URL`, opened on first use, disconnected after the suite. */
  readonly client: Redis
  /** Opens another client (of `url`, default `REDIS_URL`), disconnected after the suite. */
  connect(options?: RedisOptions, url?: string): Redis
  /**
   * A client of a loopback port where nothing listens, on ioredis' defaults (commands wait in
   * the offline queue while it reconnects, without end); its error events are ignored.
   */
  connectUnreachable(): Promise<Redis>
  /** A fresh random key prefix (`mcp-dispatch-test:<hex>:`); its keys are deleted after the suite. */
  prefix(): string
  /** Keys under the prefixes handed out so far, sorted. */
  keys(): Promise<string[]>
}

/** Every key matching `pattern`, by `SCAN` (never `KEYS`: others may share this Redis). */
export async function scanKeys(client: Redis, pattern: string): Promise<string[]> {
  const found: string[] = []
  let cursor = '0'
  do {
    const [next, batch] = await client.scan(cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = next
    found.push(...batch)
  } while (cursor !== '0')
  return found
}

/**
 * A `describe` that runs only when Redis is available, once per ioredis major (`name (ioredis
 * 6)`, `name (ioredis 5)`), each with a {@link RedisTestContext} whose clients are of that
 * major; keys and clients are cleaned up after it.
 */
export function describeRedis(name: string, body: (redis: RedisTestContext) => void): void {
  for (const kind of IOREDIS_KINDS) describeRedisOn(kind, name, body)
}

function describeRedisOn(kind: IoredisKind, name: string, body: (redis: RedisTestContext) => void): void {
  const RedisClient = IOREDIS[kind]
  describe.runIf(redisAvailable)(`${name} (ioredis ${kind === 'ioredis5' ? 5 : 6})`, () => {
    const clients: Redis[] = []
    const prefixes: string[] = []
    let main: Redis | undefined
    const connect = (options: RedisOptions = {}, url = REDIS_URL) => {
      const client = new RedisClient(url, options)
      clients.push(client)
      return client
    }
    const context: RedisTestContext = {
      kind,
      get client() {
        return (main ??= connect())
      },
      connect,
      async connectUnreachable() {
        const server = createServer()
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
        const { port } = server.address() as { port: number }
        await new Promise<void>((resolve) => server.close(() => resolve()))
        // `disconnectTimeout`: on disconnect, ioredis waits that long (2 s by default, with a
        // timer of its own) for the socket to close, which one that never opened does not.
        const client = connect({ disconnectTimeout: 10 }, `redis://127.0.0.1:${port}`)
        client.on('error', () => {})
        return client
      },
      prefix() {
        const prefix = `mcp-dispatch-test:${randomBytes(8).toString('hex')}:`
        prefixes.push(prefix)
        return prefix
      },
      async keys() {
        const all = await Promise.all(prefixes.map((p) => scanKeys(context.client, `${p}*`)))
        return all.flat().sort()
      },
    }
    afterAll(async () => {
      if (prefixes.length > 0) {
        const keys = await context.keys()
        for (let i = 0; i < keys.length; i += 500) await context.client.del(...keys.slice(i, i + 500))
      }
      for (const client of clients) client.disconnect()
    })
    body(context)
  })
}

/**
 * The next message of `kind` (default `token`) `bus` delivers to a listener (which then
 * unsubscribes).
 */
export function nextInvalidation(bus: RedisInvalidationBus, kind: InvalidationMessage['kind'] = 'token'): Promise<InvalidationMessage> {
  return new Promise((resolve) => {
    const stop = bus.subscribe((message) => {
      if (message.kind !== kind) return
      stop()
      resolve(message)
    })
  })
}

/**
 * Holds `client`'s connection as a hung Redis would: a `BLPOP` on the empty list `key` blocks
 * it, and Redis answers nothing sent after it on that connection (the socket stays up, the
 * status `ready`) until `release` pushes to the list from `other`. Only this connection is
 * held, never the other clients of a shared Redis, as `CLIENT PAUSE` would hold them.
 */
export function holdConnection(client: Redis, other: Redis, key: string): { release(): Promise<void> } {
  const blocked = client.blpop(key, 0).catch(() => null)
  return {
    async release() {
      await other.lpush(key, 'go')
      await blocked
    },
  }
}

/**
 * Why `redis-server` cannot be started here (missing, or older than 6.2, which the stores
 * need), or `undefined` when it can (for {@link startPrivateRedis} and the Sentinel helper).
 */
export function redisServerMissing(): string | undefined {
  return redisServerLacking([6, 2], 'the stores need GETEX (6.2 or later)')
}

/**
 * A Redis of the calling test's own, for what must not reach the shared one at `REDIS_URL`
 * (a `SCRIPT FLUSH` there costs every test file running alongside a NOSCRIPT and an EVAL
 * within its deadlines): `redis-server` started as a child process on a Unix socket in a
 * temporary directory (no port to collide with), without persistence, listening once this
 * resolves, given `args` besides (`--rename-command GETEX ""`). Connect to it with the ioredis
 * option `path`; `stop` ends it and removes the directory.
 */
export async function startPrivateRedis(args: readonly string[] = []): Promise<{ readonly path: string; stop(): Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-redis-'))
  const path = join(dir, 'redis.sock')
  const child = spawn('redis-server', ['--port', '0', '--unixsocket', path, '--dir', dir, '--save', '', '--appendonly', 'no', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  const keep = (chunk: Buffer) => void (output = (output + chunk.toString()).slice(-2_000))
  child.stdout.on('data', keep)
  child.stderr.on('data', keep)
  // A spawn that fails (ENOENT, EACCES) ends the wait below with its error, not the worker.
  let spawnError: Error | undefined
  child.once('error', (error) => void (spawnError = error))
  const exited = new Promise<void>((resolve) => {
    child.once('exit', () => resolve())
    child.once('error', () => resolve())
  })
  // A test process that ends without stopping it (a crash) does not leave it behind.
  const killOnExit = () => child.kill('SIGKILL')
  process.once('exit', killOnExit)
  const stop = async () => {
    process.removeListener('exit', killOnExit)
    if (spawnError === undefined && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL')
      await exited
    }
    rmSync(dir, { recursive: true, force: true })
  }
  // Listening once its socket file is there (polled every 20 ms, for up to 5 s).
  for (const deadline = performance.now() + 5_000; !existsSync(path); ) {
    if (spawnError !== undefined || child.exitCode !== null || child.signalCode !== null || performance.now() > deadline) {
      await stop()
      const last = spawnError?.message ?? (output.trim().split('\n').pop() || 'no output')
      throw new Error(`redis-server did not start on ${path} (${last})`)
    }
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  return { path, stop }
}
