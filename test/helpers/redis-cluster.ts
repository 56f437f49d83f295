/**
 * A real Redis Cluster for the tests of `mcp-dispatch/redis`: three masters on loopback, with
 * or without one replica each, started by the test file itself from `redis-server` (7.0 or
 * later, for `CLUSTER ADDSLOTSRANGE`), each a child process of the test process with its
 * config file in a temporary directory, and stopped (the directory removed) after the file,
 * so the process exits on its own. Without `redis-server` on the `PATH`: under `.ci/run` (`MCP_DISPATCH_CI=1`) the
 * importing test file fails (CI must provide it: `.ci/run` runs on a machine with Redis
 * installed); elsewhere the suites declared with {@link describeRedisCluster} are skipped, and
 * the reason is printed.
 *
 * The cluster is formed with `CLUSTER ADDSLOTSRANGE`, `CLUSTER MEET` and, for replicas,
 * `CLUSTER REPLICATE` (what `redis-cli --cluster create --cluster-replicas 1` sends), then
 * awaited until every node reports `cluster_state:ok`, knows every other, flags none failed
 * and lists every slot range with its replica (what ioredis reads, `CLUSTER SLOTS`), and every
 * replica's link to its master is up.
 *
 * With replicas, a master can fail over as in production: by hand ({@link
 * TestRedisCluster.failover}, `CLUSTER FAILOVER` on its replica, which loses nothing), or by
 * itself once a killed master has been unreachable for `cluster-node-timeout`
 * ({@link TestRedisCluster.awaitMaster}); {@link TestRedisCluster.restore} then puts every
 * node back in its first role, so the next test starts from the same layout.
 */
import { randomBytes } from 'node:crypto'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Cluster, Redis, type RedisOptions } from 'ioredis'
import { Cluster as Cluster5 } from 'ioredis5'
import { afterAll, describe } from 'vitest'
import { underProjectCI } from './ci.js'
import { IOREDIS_KINDS, type IoredisKind, type RedisTestContext } from './redis.js'
import { redisProcesses, redisServerLacking, startAll } from './redis-processes.js'

const missing = redisServerLacking([7, 0], 'the cluster helper needs 7.0 (CLUSTER ADDSLOTSRANGE)')
if (missing !== undefined && underProjectCI()) throw new Error(`A Redis Cluster is required under .ci/run (MCP_DISPATCH_CI): ${missing}`)
if (missing !== undefined) console.warn(`[redis cluster tests] skipped: ${missing}; install Redis 7 (apt-get install redis-server)`)

/** `true` when this machine can start a Redis Cluster. */
export const redisClusterAvailable = missing === undefined

const HASH_SLOTS = 16_384
/** `cluster-node-timeout` while {@link TestRedisCluster.holdFailovers} holds failovers off. */
const HELD_NODE_TIMEOUT_MS = 60_000

/** Options of {@link startRedisCluster}. */
export interface TestRedisClusterOptions {
  /**
   * The servers' `cluster-node-timeout`: how long a node may be unreachable before the others
   * mark it failed; then a master's replica is promoted (after an election of about half a
   * second more) or, with no replica, every master answers `CLUSTERDOWN` (every slot is
   * required). Default 15,000, Redis's own.
   */
  nodeTimeoutMs?: number
  /** One replica per master, on these ports: the replica on `replicaPorts[i]` copies the master on `ports[i]`. */
  replicaPorts?: readonly [number, number, number]
}

/** A Redis Cluster of three masters, with or without a replica each, started by {@link startRedisCluster}. */
export interface TestRedisCluster {
  /**
   * The first masters' ports, in the order of their slot ranges (0–5461, 5462–10923,
   * 10924–16383); after a failover (until {@link restore}), {@link masters} tells which
   * node serves each range.
   */
  readonly ports: readonly number[]
  /** The replicas' ports (`replicaPorts[i]` copies `ports[i]`); empty without replicas. */
  readonly replicaPorts: readonly number[]
  /** The startup nodes for an ioredis `Cluster`: the first masters (ioredis finds the replicas by itself). */
  readonly nodes: ReadonlyArray<{ host: string; port: number }>
  /** A plain connection to one node (not cluster-aware), disconnected on {@link stop}. */
  node(port: number): Redis
  /**
   * A hash tag (`{t12}`) whose slot the master on `port` serves now: every key holding it lands
   * on that master (a store given a prefix with it keeps all its keys there).
   */
  hashTagOn(port: number): Promise<string>
  /** The port of the master serving each slot range now, in the order of {@link ports}, as a running node tells (`CLUSTER SLOTS`). */
  masters(): Promise<number[]>
  /**
   * Waits until the replica of the master on `port` has every write the master has
   * (`INFO replication`: its offset at the master's): what a master killed then has written is
   * not lost with it (Redis replicates asynchronously).
   */
  replicated(port: number): Promise<void>
  /** Ends the node on `port` at once (`SIGKILL`), as a crashed server ends. */
  kill(port: number): Promise<void>
  /**
   * Stops the node on `port` (`SIGSTOP`) as a hung server or a network partition holds it: its
   * connections stay open and nothing is answered, to clients or to the other nodes, until
   * {@link resume} (or {@link kill}, {@link stop}).
   */
  hang(port: number): void
  /** Lets the node on `port` run again after {@link hang} (`SIGCONT`). */
  resume(port: number): void
  /**
   * Raises `cluster-node-timeout` on every running node to 60 s, until {@link releaseFailovers}
   * or {@link restore}: a node {@link hang} stops for a moment is then not failed over, however
   * far a loaded machine stretches the moment past the configured timeout.
   */
  holdFailovers(): Promise<void>
  /**
   * Puts `cluster-node-timeout` back on every running node after {@link holdFailovers}: call it
   * once the node hung meanwhile is resumed (a node still hung is skipped; {@link restore}
   * puts it back on every node in any case).
   */
  releaseFailovers(): Promise<void>
  /**
   * Starts the node on `port` again after {@link kill}, empty (no persistence) but with its node
   * id and slots (a master whose replica was promoted meanwhile comes back as that one's
   * replica), and waits until the cluster is whole again (see the module's comment).
   */
  restart(port: number): Promise<void>
  /**
   * A manual failover: `CLUSTER FAILOVER` on the replica on `replicaPort`, which waits until it
   * has every write of its master, then takes its slots (the master becomes its replica). Waits
   * until every running node names it as the master of the range, and answers how long that
   * took, in ms.
   */
  failover(replicaPort: number): Promise<number>
  /**
   * Waits (up to `ms`) until every running node names the node on `port` as the master of a
   * slot range and reports `cluster_state:ok`: a replica promoted by the cluster itself after
   * its master was killed. Answers how long it waited, in ms.
   */
  awaitMaster(port: number, ms?: number): Promise<number>
  /**
   * Waits (up to `ms`) until the node on `port` itself reports the master role (`ROLE`): the
   * moment a replica won its election and took its master's slots, which the other nodes hear
   * of only later ({@link awaitMaster}). Answers how long it waited, in ms.
   */
  awaitSelfPromoted(port: number, ms?: number): Promise<number>
  /**
   * Puts the cluster back as it was started: every killed node started again, and every first
   * master that is now a replica made master again by a manual failover; then waits until the
   * cluster is whole.
   */
  restore(): Promise<void>
  /** Ends every node still running and removes the directory of their config files. */
  stop(): Promise<void>
}


/** The master of each slot range, as `CLUSTER SLOTS` answers: `[[from, to, [host, port, id], …replicas], …]`. */
type SlotRanges = Array<[number, number, ...Array<[string, number, string]>]>

/**
 * Starts `redis-server` processes in cluster mode on `ports`, and on `replicaPorts` when given
 * (127.0.0.1, no persistence), and forms a cluster of three masters with the hash slots split
 * evenly, each with its replica when there are replicas.
 */
export async function startRedisCluster(
  ports: readonly [number, number, number],
  { nodeTimeoutMs = 15_000, replicaPorts }: TestRedisClusterOptions = {},
): Promise<TestRedisCluster> {
  const replicas = replicaPorts ?? []
  const everyPort = [...ports, ...replicas]
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-cluster-'))
  const { until, processes, node, running: start, kill, stop: stopAll } = redisProcesses('Redis Cluster', dir)
  // Nodes stopped by `hang`: running, but they answer nothing, so none is asked anything.
  const hung = new Set<number>()
  const answering = (port: number) => processes.has(port) && !hung.has(port)
  /**
   * Starts the node of `port` (again: it keeps its node id and slots in its config file) and
   * waits until it answers. The cluster bus ports (10,000 above the tests' 17201–17229) lie
   * below Linux's ephemeral range too.
   */
  const running = (port: number) =>
    start(port, () => [
      '--port', String(port),
      '--bind', '127.0.0.1',
      '--cluster-enabled', 'yes',
      '--cluster-config-file', join(dir, `nodes-${port}.conf`),
      '--cluster-node-timeout', String(nodeTimeoutMs),
      '--dir', dir,
      '--save', '',
      '--appendonly', 'no',
      // A replica (re)joining is sent the master's data at once, not after Redis's default 5 s
      // wait for more replicas to join the same transfer.
      '--repl-diskless-sync-delay', '0',
      '--daemonize', 'no',
    ])
  /** Waits until every node knows every other. */
  const met = async () => {
    for (const port of everyPort) {
      await until('the nodes did not meet', 10_000, async () =>
        String(await node(port).call('CLUSTER', 'INFO')).includes(`cluster_known_nodes:${everyPort.length}`),
      )
    }
  }
  /**
   * Waits until the cluster is whole: on every node, the cluster ok with all nodes known and
   * none flagged failed, and three slot ranges each with its replica; every replica's link to
   * its master up.
   */
  const formed = async () => {
    for (const port of everyPort) {
      let seen = ''
      await until(() => `the cluster did not form (node ${port}: ${seen})`, 15_000, async () => {
        const admin = node(port)
        const info = String(await admin.call('CLUSTER', 'INFO'))
        // <id> <ip:port@bus> <flags> …, flags such as `slave,fail` or `master,fail?`
        const failed = String(await admin.call('CLUSTER', 'NODES'))
          .split('\n')
          .filter((line) => line.split(' ')[2]?.split(',').some((flag) => flag === 'fail' || flag === 'fail?'))
        const ranges = (await admin.call('CLUSTER', 'SLOTS')) as SlotRanges
        const replication = String(await admin.call('INFO', 'replication'))
        seen = `${/cluster_state:\w+/.exec(info)?.[0]}, ${failed.length} failed, ranges ${ranges.map((range) => range.length - 2).join('/')}`
        return (
          info.includes('cluster_state:ok') &&
          info.includes(`cluster_known_nodes:${everyPort.length}`) &&
          failed.length === 0 &&
          ranges.length === 3 &&
          ranges.every((range) => range.length === 3 + (replicas.length > 0 ? 1 : 0)) &&
          (!replication.includes('role:slave') || replication.includes('master_link_status:up'))
        )
      })
    }
  }
  /** A running node to ask about the cluster. */
  const anyRunningPort = () => {
    const port = everyPort.find(answering)
    if (port === undefined) throw new Error('Redis Cluster: no node is running')
    return port
  }
  const anyRunning = () => node(anyRunningPort())
  /** The port of the master of each slot range, in slot order, as the node on `port` has it. */
  const mastersAsSeenBy = async (port: number) => {
    const ranges = (await node(port).call('CLUSTER', 'SLOTS')) as SlotRanges
    return ranges.sort(([a], [b]) => a - b).map(([, , master]) => master![1])
  }
  // When the masters last voted in an election (a failover by hand or by the cluster): a master
  // votes for no other replica of the same master within twice `cluster-node-timeout` of it
  // (Redis's "can't vote about this master before …"), and a manual failover not voted for
  // times out after 5 s without a retry.
  let votedAt = Number.NEGATIVE_INFINITY
  /** Waits until every running node names `port` as a master, and the cluster ok. */
  const awaitMaster = async (port: number, ms = 15_000) => {
    const started = performance.now()
    for (const other of everyPort.filter(answering)) {
      await until(`node ${port} did not become a master`, Math.max(1, ms - (performance.now() - started)), async () => {
        const info = String(await node(other).call('CLUSTER', 'INFO'))
        return info.includes('cluster_state:ok') && (await mastersAsSeenBy(other)).includes(port)
      })
    }
    votedAt = performance.now()
    return performance.now() - started
  }
  /** Sets `cluster-node-timeout` on every node running and not hung. */
  const nodeTimeout = async (ms: number) => {
    await Promise.all(everyPort.filter((port) => processes.has(port) && !hung.has(port)).map((port) => node(port).call('CONFIG', 'SET', 'cluster-node-timeout', String(ms))))
  }
  const awaitSelfPromoted = async (port: number, ms = 15_000) => {
    const started = performance.now()
    await until(`node ${port} did not take the master role`, ms, async () => ((await node(port).call('ROLE')) as [string])[0] === 'master')
    return performance.now() - started
  }
  try {
    await Promise.all(everyPort.map((port) => running(port)))
    const admins = ports.map((port) => node(port))
    const third = Math.floor(HASH_SLOTS / 3)
    const ranges = [
      [0, third],
      [third + 1, 2 * third + 1],
      [2 * third + 2, HASH_SLOTS - 1],
    ] as const
    for (const [i, admin] of admins.entries()) await admin.call('CLUSTER', 'ADDSLOTSRANGE', ranges[i]![0], ranges[i]![1])
    for (const port of everyPort.slice(1)) await admins[0]!.call('CLUSTER', 'MEET', '127.0.0.1', port)
    if (replicas.length > 0) {
      await met()
      for (const [i, port] of replicas.entries()) {
        const masterId = String(await admins[i]!.call('CLUSTER', 'MYID'))
        await node(port).call('CLUSTER', 'REPLICATE', masterId)
      }
    }
    await formed()
  } catch (error) {
    await stopAll()
    throw error
  }

  return {
    ports,
    replicaPorts: replicas,
    nodes: ports.map((port) => ({ host: '127.0.0.1', port })),
    node,
    async hashTagOn(port) {
      const admin = anyRunning()
      const ranges = (await admin.call('CLUSTER', 'SLOTS')) as SlotRanges
      for (let i = 0; ; i++) {
        const slot = Number(await admin.call('CLUSTER', 'KEYSLOT', `t${i}`))
        if (ranges.some(([from, to, master]) => master![1] === port && slot >= from && slot <= to)) return `{t${i}}`
      }
    },
    masters: () => mastersAsSeenBy(anyRunningPort()),
    async replicated(port) {
      let seen = ''
      await until(() => `the replica of ${port} did not catch up (${seen})`, 5_000, async () => {
        seen = String(await node(port).call('INFO', 'replication'))
        const offset = Number(/master_repl_offset:(\d+)/.exec(seen)?.[1])
        const replicas = [...seen.matchAll(/^slave\d+:.*offset=(\d+)/gm)].map(([, at]) => Number(at))
        return replicas.length > 0 && replicas.every((at) => at >= offset)
      })
    },
    async kill(port) {
      await kill(port)
      hung.delete(port)
    },
    hang(port) {
      if (processes.get(port)?.kill('SIGSTOP')) hung.add(port)
    },
    resume(port) {
      processes.get(port)?.kill('SIGCONT')
      hung.delete(port)
    },
    holdFailovers: () => nodeTimeout(HELD_NODE_TIMEOUT_MS),
    releaseFailovers: () => nodeTimeout(nodeTimeoutMs),
    async restart(port) {
      if (processes.has(port)) return
      await running(port)
      await formed()
    },
    async failover(replicaPort) {
      const lockedFor = votedAt + 2 * nodeTimeoutMs + 100 - performance.now()
      if (lockedFor > 0) await new Promise((resolve) => setTimeout(resolve, lockedFor))
      const started = performance.now()
      await node(replicaPort).call('CLUSTER', 'FAILOVER')
      await awaitMaster(replicaPort)
      return performance.now() - started
    },
    awaitMaster,
    awaitSelfPromoted,
    async restore() {
      for (const port of hung) processes.get(port)?.kill('SIGCONT')
      hung.clear()
      // After holdFailovers in a test that failed before releaseFailovers; cheap otherwise.
      await nodeTimeout(nodeTimeoutMs)
      for (const port of everyPort) if (!processes.has(port)) await running(port)
      await formed()
      const now = await mastersAsSeenBy(ports[0]!)
      for (const [i, port] of ports.entries()) {
        if (now[i] === port) continue
        // TAKEOVER: no election, so no wait for the masters' votes (nothing is written meanwhile,
        // and the replica's link is up: it has every write).
        await node(port).call('CLUSTER', 'FAILOVER', 'TAKEOVER')
        const votes = votedAt
        await awaitMaster(port)
        votedAt = votes
      }
      await formed()
    },
    stop: stopAll,
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
  /**
   * Opens another `Cluster` client (ioredis `redisOptions`: `options`; startup nodes: `nodes`,
   * default the cluster's), disconnected after the suite.
   */
  connectCluster(options?: RedisOptions, nodes?: ReadonlyArray<{ host: string; port: number }>): Cluster
}

/** A key prefix of this run whose keys all land on the master on `port` (a hash tag: `…:{t3}:`). */
export async function prefixOn(redis: RedisClusterTestContext, port: number): Promise<string> {
  return `${redis.prefix()}${await redis.cluster.hashTagOn(port)}:`
}

/**
 * Starts a Redis Cluster on each set of ports (or of ports and options), all at once, and stops them after the test file
 * (an `afterAll` of the file): call it at the top level of the file, before its tests open
 * connections, whose local ports, drawn from the same ephemeral range, could otherwise take a
 * node's port. `undefined` when `redis-server` is missing (the suites skip, see above).
 */
export async function startRedisClusters(
  specs: ReadonlyArray<readonly [number, number, number] | ({ ports: readonly [number, number, number] } & TestRedisClusterOptions)>,
): Promise<TestRedisCluster[] | undefined> {
  if (!redisClusterAvailable) return undefined
  return startAll(specs, (spec) => ('ports' in spec ? startRedisCluster(spec.ports, spec) : startRedisCluster(spec)))
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
        const connectCluster = (redisOptions: RedisOptions = {}, nodes = cluster().nodes) => {
          const client = new ClusterClient([...nodes], { redisOptions })
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
