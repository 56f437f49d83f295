/**
 * A real Redis Cluster for the tests of `mcp-dispatch/redis`: three masters (no replicas) on
 * loopback, started by the test file itself from `redis-server` (7.0 or later, for
 * `CLUSTER ADDSLOTSRANGE`), each a child process of the test process with its config file in a
 * temporary directory, and stopped (the directory removed) after the file, so the process
 * exits on its own. Without `redis-server` on the `PATH`: under `CI` the importing test file
 * fails (CI must provide it: `.ci/run` runs on a machine with Redis installed); elsewhere the
 * suites declared with {@link describeRedisCluster} are skipped, and the reason is printed.
 *
 * The cluster is formed with `CLUSTER ADDSLOTSRANGE` and `CLUSTER MEET` (what
 * `redis-cli --cluster create` sends), then awaited until every node reports
 * `cluster_state:ok` and knows the other two.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Cluster, Redis, type RedisOptions } from 'ioredis'
import { Cluster as Cluster5 } from 'ioredis5'
import { afterAll, describe } from 'vitest'
import { underCI } from './ci.js'
import { IOREDIS_KINDS, type IoredisKind, type RedisTestContext } from './redis.js'

/** Why `redis-server` cannot start a cluster here, or `undefined` when it can. */
function redisServerMissing(): string | undefined {
  const version = spawnSync('redis-server', ['--version'], { encoding: 'utf8' })
  if (version.error) return `redis-server is not installed (${version.error.message})`
  const major = /v=(\d+)\./.exec(version.stdout)?.[1]
  if (major === undefined || Number(major) < 7) return `redis-server ${version.stdout.trim()} is too old: the cluster helper needs 7.0 (CLUSTER ADDSLOTSRANGE)`
  return undefined
}

const missing = redisServerMissing()
if (missing !== undefined && underCI()) throw new Error(`A Redis Cluster is required under CI: ${missing}`)
if (missing !== undefined) console.warn(`[redis cluster tests] skipped: ${missing}; install Redis 7 (apt-get install redis-server)`)

/** `true` when this machine can start a Redis Cluster. */
export const redisClusterAvailable = missing === undefined

const HASH_SLOTS = 16_384

/** A Redis Cluster of three masters, started by {@link startRedisCluster}. */
export interface TestRedisCluster {
  /** The masters' ports, in the order of their slot ranges (0–5460, 5461–10922, 10923–16383). */
  readonly ports: readonly number[]
  /** The startup nodes for an ioredis `Cluster`. */
  readonly nodes: ReadonlyArray<{ host: string; port: number }>
  /** A plain connection to one node (not cluster-aware), disconnected on {@link stop}. */
  node(port: number): Redis
  /**
   * A hash tag (`{t12}`) whose slot the master on `port` serves now: every key holding it lands
   * on that master (a store given a prefix with it keeps all its keys there).
   */
  hashTagOn(port: number): Promise<string>
  /** Ends the node on `port` at once (`SIGKILL`), as a crashed server ends. */
  kill(port: number): Promise<void>
  /**
   * Starts the node on `port` again after {@link kill}, empty (no persistence) but with its node
   * id and slots, and waits until every node reports `cluster_state:ok` again.
   */
  restart(port: number): Promise<void>
  /** Ends every node still running and removes the directory of their config files. */
  stop(): Promise<void>
}

/** Answers once `check` is true, polling every 20 ms; rejects after `ms` with `what`. */
async function until(what: string | (() => string), ms: number, check: () => Promise<boolean>): Promise<void> {
  const deadline = performance.now() + ms
  for (;;) {
    if (await check().catch(() => false)) return
    if (performance.now() > deadline) throw new Error(`Redis Cluster: ${typeof what === 'string' ? what : what()} within ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

/**
 * Starts three `redis-server` processes in cluster mode on `ports` (127.0.0.1, no persistence)
 * and forms a cluster of three masters with the hash slots split evenly. `nodeTimeoutMs` is the
 * servers' `cluster-node-timeout`: how long a master may be unreachable before the others
 * mark it failed (and, with every slot required, stop serving: `CLUSTERDOWN`).
 */
export async function startRedisCluster(ports: readonly [number, number, number], nodeTimeoutMs = 15_000): Promise<TestRedisCluster> {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-cluster-'))
  const processes = new Map<number, ChildProcess>()
  const output = new Map<number, string>()
  const connections = new Map<number, Redis>()
  // One plain connection per node, reconnecting every 50 ms (a restarted node is found again);
  // its commands fail at once while it is down.
  const node = (port: number) => {
    let connection = connections.get(port)
    if (!connection) {
      connection = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0, retryStrategy: () => 50 })
      connection.on('error', () => {})
      connections.set(port, connection)
    }
    return connection
  }
  const exited = (child: ChildProcess) =>
    child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise<void>((resolve) => child.once('exit', () => resolve()))
  const stopAll = async () => {
    for (const connection of connections.values()) connection.disconnect()
    connections.clear()
    await Promise.all(
      [...processes.values()].map((child) => {
        child.kill('SIGKILL')
        return exited(child)
      }),
    )
    processes.clear()
    rmSync(dir, { recursive: true, force: true })
  }
  /** Starts the node of `port` (again: it keeps its node id and slots in its config file). */
  const launch = (port: number) => {
    const child = spawn(
      'redis-server',
      [
        '--port', String(port),
        '--bind', '127.0.0.1',
        '--cluster-enabled', 'yes',
        '--cluster-config-file', join(dir, `nodes-${port}.conf`),
        '--cluster-node-timeout', String(nodeTimeoutMs),
        '--dir', dir,
        '--save', '',
        '--appendonly', 'no',
        '--daemonize', 'no',
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    )
    output.set(port, '')
    const keep = (chunk: Buffer) => output.set(port, (output.get(port)! + chunk.toString()).slice(-2_000))
    child.stdout!.on('data', keep)
    child.stderr!.on('data', keep)
    processes.set(port, child)
    return child
  }
  /**
   * Starts the node of `port` and waits until it answers. The tests' ports (17201–17209) and their
   * cluster bus ports (10,000 above) lie below Linux's ephemeral range (32768–60999), so no client
   * socket of this machine takes them; a node that could not listen all the same (another program
   * on the port, one of a previous run still closing) is started again, every 250 ms for up to 15 s.
   */
  const running = async (port: number) => {
    for (let attempt = 1; ; attempt++) {
      const child = launch(port)
      const gone = exited(child).then(() => true)
      const answering = until(() => `node ${port} did not answer (${lastLine(port)})`, 5_000, async () => {
        if (child.exitCode !== null) return true
        return (await node(port).ping()) === 'PONG'
      })
      await Promise.race([gone, answering])
      if (child.exitCode === null && child.signalCode === null) return
      processes.delete(port)
      if (attempt === 60) throw new Error(`Redis Cluster: node ${port} could not start (${lastLine(port)})`)
      await new Promise((resolve) => setTimeout(resolve, 250))
    }
  }
  const lastLine = (port: number) => output.get(port)?.trim().split('\n').pop() ?? 'no output'
  /** Waits until every node reports the cluster ok, with all nodes known. */
  const formed = async () => {
    for (const port of ports) {
      await until('the nodes did not form a cluster', 10_000, async () => {
        const info = String(await node(port).call('CLUSTER', 'INFO'))
        return info.includes('cluster_state:ok') && info.includes(`cluster_known_nodes:${ports.length}`)
      })
    }
  }
  // A test process that ends without its afterAll (a crash) does not leave servers behind.
  const killOnExit = () => processes.forEach((child) => child.kill('SIGKILL'))
  process.once('exit', killOnExit)

  try {
    await Promise.all(ports.map((port) => running(port)))
    const admins = ports.map((port) => node(port))
    const third = Math.floor(HASH_SLOTS / 3)
    const ranges = [
      [0, third],
      [third + 1, 2 * third + 1],
      [2 * third + 2, HASH_SLOTS - 1],
    ] as const
    for (const [i, admin] of admins.entries()) await admin.call('CLUSTER', 'ADDSLOTSRANGE', ranges[i]![0], ranges[i]![1])
    for (const port of ports.slice(1)) await admins[0]!.call('CLUSTER', 'MEET', '127.0.0.1', port)
    await formed()
  } catch (error) {
    await stopAll()
    process.removeListener('exit', killOnExit)
    throw error
  }

  const admin = node(ports[0]!)
  return {
    ports,
    nodes: ports.map((port) => ({ host: '127.0.0.1', port })),
    node,
    async hashTagOn(port) {
      // [[from, to, [host, port, id], …replicas], …]
      const ranges = (await admin.call('CLUSTER', 'SLOTS')) as Array<[number, number, [string, number, string]]>
      for (let i = 0; ; i++) {
        const slot = Number(await admin.call('CLUSTER', 'KEYSLOT', `t${i}`))
        if (ranges.some(([from, to, [, owner]]) => owner === port && slot >= from && slot <= to)) return `{t${i}}`
      }
    },
    async kill(port) {
      const child = processes.get(port)
      if (!child) return
      child.kill('SIGKILL')
      await exited(child)
      processes.delete(port)
    },
    async restart(port) {
      if (processes.has(port)) return
      await running(port)
      await formed()
    },
    async stop() {
      process.removeListener('exit', killOnExit)
      await stopAll()
    },
  }
}

/** The `Cluster` class of each ioredis major (ioredis 5's typed as ioredis 6's: the same surface). */
export const IOREDIS_CLUSTER = { ioredis: Cluster, ioredis5: Cluster5 as unknown as typeof Cluster } as const

/** Every key matching `pattern` on every master of `cluster` (`SCAN` runs on one node only). */
export async function scanClusterKeys(cluster: Cluster, pattern: string): Promise<string[]> {
  const found: string[] = []
  for (const master of cluster.nodes('master')) {
    let cursor = '0'
    do {
      const [next, batch] = await master.scan(cursor, 'MATCH', pattern, 'COUNT', 1000)
      cursor = next
      found.push(...batch)
    } while (cursor !== '0')
  }
  return found
}

/** What a cluster suite works with: the {@link RedisTestContext} of a single Redis, on the cluster. */
export interface RedisClusterTestContext extends RedisTestContext {
  /** The cluster this run works on, started before the suite. */
  readonly cluster: TestRedisCluster
  /** A `Cluster` client of this run's ioredis major, typed as a `Cluster`. */
  readonly clusterClient: Cluster
  /** Opens another `Cluster` client (ioredis `redisOptions`: `options`), disconnected after the suite. */
  connectCluster(options?: RedisOptions): Cluster
}

/**
 * Starts a Redis Cluster on each set of ports, all at once, and stops them after the test file
 * (an `afterAll` of the file): call it at the top level of the file, before its tests open
 * connections, whose local ports, drawn from the same ephemeral range, could otherwise take a
 * node's port. `undefined` when `redis-server` is missing (the suites skip, see above).
 */
export async function startRedisClusters(
  portSets: ReadonlyArray<readonly [number, number, number]>,
  nodeTimeoutMs?: number,
): Promise<TestRedisCluster[] | undefined> {
  if (!redisClusterAvailable) return undefined
  const started = await Promise.allSettled(portSets.map((ports) => startRedisCluster(ports, nodeTimeoutMs)))
  const clusters = started.flatMap((result) => (result.status === 'fulfilled' ? [result.value] : []))
  afterAll(() => Promise.all(clusters.map((cluster) => cluster.stop())))
  const failed = started.find((result) => result.status === 'rejected')
  if (failed) throw failed.reason
  return clusters
}

/**
 * A `describe` on `cluster` (skipped when it is `undefined`: no `redis-server`) that runs
 * `body` once per ioredis major (`name (ioredis 6)`, `name (ioredis 5)`) with a context whose
 * clients are `Cluster` clients of that major, each with random key prefixes deleted
 * afterwards. The context fits the suites written for a single Redis ({@link RedisTestContext}):
 * `client` and `connect()` are `Cluster` clients typed as `Redis`, since the suites only send
 * them commands (`get`, `exists`, `pttl`…), the same methods on both.
 */
export function describeRedisCluster(
  name: string,
  started: TestRedisCluster | undefined,
  body: (redis: RedisClusterTestContext) => void,
  options: { kinds?: readonly IoredisKind[] } = {},
): void {
  describe.runIf(started !== undefined)(name, () => {
    for (const kind of options.kinds ?? IOREDIS_KINDS) {
      describe(`${name} (ioredis ${kind === 'ioredis5' ? 5 : 6})`, () => {
        const ClusterClient = IOREDIS_CLUSTER[kind]
        const clients: Cluster[] = []
        const prefixes: string[] = []
        let main: Cluster | undefined
        const cluster = () => started!
        const connectCluster = (redisOptions: RedisOptions = {}) => {
          const client = new ClusterClient([...cluster().nodes], { redisOptions })
          clients.push(client)
          return client
        }
        const context: RedisClusterTestContext = {
          kind,
          get cluster() {
            return cluster()
          },
          get clusterClient() {
            return (main ??= connectCluster())
          },
          get client() {
            return context.clusterClient as unknown as Redis
          },
          connectCluster,
          connect: (redisOptions) => connectCluster(redisOptions) as unknown as Redis,
          connectUnreachable: () => Promise.reject(new Error('connectUnreachable: not on a cluster')),
          prefix() {
            const prefix = `mcp-dispatch-test:${randomBytes(8).toString('hex')}:`
            prefixes.push(prefix)
            return prefix
          },
          async keys() {
            const all = await Promise.all(prefixes.map((p) => scanClusterKeys(context.clusterClient, `${p}*`)))
            return all.flat().sort()
          },
        }
        afterAll(async () => {
          // Keys of a test that ended a node may be out of reach: they go with the cluster.
          if (prefixes.length > 0) {
            const keys = await context.keys().catch(() => [])
            for (const key of keys) await context.clusterClient.del(key).catch(() => {})
          }
          for (const client of clients) client.disconnect()
        })
        body(context)
      })
    }
  })
}
