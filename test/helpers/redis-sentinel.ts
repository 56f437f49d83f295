/**
 * A real Redis Sentinel deployment for the tests of `mcp-dispatch/redis`: a primary, one
 * replica and three sentinels (quorum 2) on loopback, started by the test file itself from
 * `redis-server` (6.2 or later, for `GETEX`; `redis-server --sentinel` runs the sentinels),
 * each a child process of the test process with its files in a temporary directory, and
 * stopped (the directory removed) after the file, so the process exits on its own. Without
 * `redis-server` on the `PATH`: under `.ci/run` (`MCP_DISPATCH_CI=1`) the importing test file
 * fails (CI must provide it, as for the Redis Clusters: test/helpers/redis-cluster.ts);
 * elsewhere the suites declared with {@link describeRedisSentinel} are skipped, and the
 * reason is printed.
 *
 * The deployment is awaited until every sentinel names the same primary, lists its replica
 * (not flagged down) and knows the two other sentinels, and the replica's link to the primary
 * is up ({@link TestRedisSentinel.settled}): only then can the sentinels agree on a failover.
 * The sentinels mark a primary down after `downAfterMs` (1 s here, 30 s by default) and fail
 * it over by themselves once two agree; {@link TestRedisSentinel.failover} asks them to at
 * once (`SENTINEL FAILOVER`, which, unlike Redis's own `FAILOVER`, does not stop the writes
 * on the old primary first: Sentinel promotes the replica, then turns the old primary into its
 * replica).
 *
 * A sentinel whose own timer was held up more than 2 s (a loaded machine, a clock that jumped)
 * enters TILT mode: it keeps pinging but acts on nothing, its flags frozen (a node it saw
 * down stays flagged down though it answers again), for 30 s by default. Here TILT lasts
 * {@link TILT_MS} (`SENTINEL DEBUG tilt-period`, Redis 7.0 or later), so one stall of the CI
 * machine costs the tests a few seconds, not a deployment that does not settle in time; and a
 * deployment that does not settle names each sentinel's TILT state and last log lines.
 */
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import { describe } from 'vitest'
import { underProjectCI } from './ci.js'
import { type IoredisKind, redisServerMissing } from './redis.js'
import { redisProcesses, startAll } from './redis-processes.js'

const HOST = '127.0.0.1'
/** How long a sentinel stays in TILT mode here (see the file's comment): two of its 1 s pings. */
const TILT_MS = 2_000

const missing = redisServerMissing()
if (missing !== undefined && underProjectCI()) throw new Error(`Redis Sentinel is required under .ci/run (MCP_DISPATCH_CI): ${missing}`)
if (missing !== undefined) console.warn(`[redis sentinel tests] skipped: ${missing}; install Redis 6.2 or later (apt-get install redis-server)`)

/** `true` when this machine can start a Redis Sentinel deployment. */
export const redisSentinelAvailable = missing === undefined

/** Where {@link startRedisSentinel} starts its processes, and how fast its sentinels act. */
export interface TestRedisSentinelOptions {
  /** The first primary's port. */
  primary: number
  /** Its replica's port. */
  replica: number
  /** The three sentinels' ports. */
  sentinels: readonly [number, number, number]
  /** The name the sentinels monitor the primary under. Default `primary`. */
  name?: string
  /** `sentinel down-after-milliseconds`: how long a primary may not answer before a sentinel marks it down. Default 1,000. */
  downAfterMs?: number
  /**
   * `sentinel failover-timeout`: how long a failover may take; a sentinel that voted for
   * another's failover starts none of its own within twice this. Default 2,000.
   */
  failoverTimeoutMs?: number
}

/** A primary, its replica and three sentinels, started by {@link startRedisSentinel}. */
export interface TestRedisSentinel {
  /** The name the sentinels monitor the primary under (ioredis' `name`). */
  readonly name: string
  /** The sentinels, for ioredis' `sentinels`. */
  readonly sentinels: ReadonlyArray<{ host: string; port: number }>
  /** The two data nodes' ports: the first primary's, then its replica's. */
  readonly ports: readonly [number, number]
  /** A plain connection to one process (data node or sentinel), disconnected on {@link stop}. */
  node(port: number): Redis
  /** The primary's port as the first sentinel that answers names it (`SENTINEL GET-MASTER-ADDR-BY-NAME`). */
  primary(): Promise<number>
  /**
   * Waits until every sentinel names the same primary, lists the other data node (when it runs)
   * as its replica, not flagged down, and knows the two other sentinels, and that node reports
   * its link to the primary up.
   * Answers the primary's port.
   */
  settled(ms?: number): Promise<number>
  /** `SENTINEL FAILOVER <name>`, on the first sentinel: a failover now, without agreement. */
  failover(): Promise<void>
  /**
   * Watches for the node on `port` to become the primary, from now: `promoted`, when it
   * reports the master role itself (`ROLE`), and `named`, when a sentinel first names it as
   * the primary (when clients asking that sentinel are sent to it), each `performance.now()`.
   * Its polling ends (both rejected) on {@link restore} or {@link stop}: a test that failed
   * leaves none behind.
   */
  watchPromotion(port: number, ms?: number): { promoted: Promise<number>; named: Promise<number> }
  /** Ends the data node on `port` at once (`SIGKILL`), as a crashed server ends. */
  kill(port: number): Promise<void>
  /** Stops the data node on `port` (`SIGSTOP`), as a hung server stops: its connections stay up, unanswered. */
  hang(port: number): void
  /** Lets a node {@link hang} stopped go on (`SIGCONT`). */
  resume(port: number): void
  /**
   * Puts the deployment back in order after a test, with the primary Sentinel names now: a data
   * node hung is resumed first (`SIGCONT`), a data node killed is started again as its replica,
   * and one still acting as a primary beside it (the old primary after a `SENTINEL FAILOVER` or
   * a hang) is made its replica at once (Sentinel itself does so only 8 s after the switch: it
   * waits four of its 2 s publish periods, a constant); then waits until {@link settled}. Answers the primary's port.
   */
  restore(): Promise<number>
  /** Ends every process still running and removes their directory. */
  stop(): Promise<void>
}


/** `SENTINEL REPLICAS|SENTINELS|MASTER` answers a flat `[field, value, …]` list per instance. */
const fields = (flat: unknown): Record<string, string> => {
  const list = flat as string[]
  const record: Record<string, string> = {}
  for (let i = 0; i + 1 < list.length; i += 2) record[list[i]!] = list[i + 1]!
  return record
}

/**
 * Shortens the sentinel's TILT mode to {@link TILT_MS} (see the file's comment); nothing on
 * Redis 6.2, which has no `SENTINEL DEBUG`.
 */
async function shortTilt(sentinel: Redis): Promise<void> {
  try {
    await sentinel.call('SENTINEL', 'DEBUG', 'tilt-period', String(TILT_MS))
  } catch (error) {
    if (!/unknown (sentinel )?subcommand/i.test(String(error))) throw error
  }
}

/**
 * Starts the primary, its replica and the three sentinels (127.0.0.1, no persistence) and
 * waits until they are settled ({@link TestRedisSentinel.settled}).
 */
export async function startRedisSentinel({
  primary,
  replica,
  sentinels,
  name = 'primary',
  downAfterMs = 1_000,
  failoverTimeoutMs = 2_000,
}: TestRedisSentinelOptions): Promise<TestRedisSentinel> {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-sentinel-'))
  const { until, processes, node, running, kill, lastLines, stop: stopAll } = redisProcesses('Redis Sentinel', dir)
  const dataNode = (port: number, replicaOf?: number) => [
    '--port', String(port),
    '--bind', HOST,
    '--dir', dir,
    '--save', '',
    '--appendonly', 'no',
    // A replica (re)joining is sent the primary's data at once, not after a 5 s wait for others.
    '--repl-diskless-sync-delay', '0',
    '--daemonize', 'no',
    ...(replicaOf === undefined ? [] : ['--replicaof', HOST, String(replicaOf)]),
  ]
  // Sentinel rewrites its config file (what it learns, epochs): one writable file each, written
  // afresh before each start.
  const sentinelConfig = (port: number) => {
    const file = join(dir, `sentinel-${port}.conf`)
    writeFileSync(
      file,
      [
        `port ${port}`,
        `bind ${HOST}`,
        `dir ${dir}`,
        `sentinel monitor ${name} ${HOST} ${primary} 2`,
        `sentinel down-after-milliseconds ${name} ${downAfterMs}`,
        `sentinel failover-timeout ${name} ${failoverTimeoutMs}`,
        `sentinel parallel-syncs ${name} 1`,
        '',
      ].join('\n'),
    )
    return [file, '--sentinel']
  }

  const ports = [primary, replica] as const
  /** The data nodes {@link TestRedisSentinel.hang} stopped. */
  const hung = new Set<number>()
  /** Aborted (and replaced) by restore and stop: ends the polling of watchPromotion. */
  let watching = new AbortController()
  const endWatches = () => {
    watching.abort()
    watching = new AbortController()
  }
  const sentinelNodes = sentinels.map((port) => ({ host: HOST, port }))
  const primaryPort = async () => {
    let lastError: unknown
    for (const { port } of sentinelNodes) {
      try {
        const address = (await node(port).call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', name)) as [string, string] | null
        if (address) return Number(address[1])
      } catch (error) {
        lastError = error
      }
    }
    throw new Error(`Redis Sentinel: no sentinel names a primary for ${name} (${String(lastError)})`)
  }
  /** `, in TILT mode` when the sentinel on `port` is in it (see the file's comment). */
  const tilt = async (port: number) => (/^sentinel_tilt:1\b/m.test(String(await node(port).call('INFO', 'sentinel'))) ? ', in TILT mode' : '')
  const settled = async (ms = 20_000) => {
    let seen = ''
    /** The sentinel `seen` is about, for its log lines in the error. */
    let seenOn: number | undefined
    let settledOn = 0
    const why = () => `the deployment did not settle (${seen})${seenOn === undefined ? '' : `; the last lines sentinel ${seenOn} logged:\n${lastLines(seenOn, 8)}\n`}`
    await until(why, ms, async () => {
      seenOn = undefined
      const named = new Set<number>()
      for (const port of sentinels) {
        const sentinel = node(port)
        seenOn = port
        let master: Record<string, string>, replicas: Array<Record<string, string>>, peers: unknown[]
        try {
          master = fields(await sentinel.call('SENTINEL', 'MASTER', name))
          replicas = ((await sentinel.call('SENTINEL', 'REPLICAS', name)) as unknown[]).map(fields)
          peers = (await sentinel.call('SENTINEL', 'SENTINELS', name)) as unknown[]
        } catch (error) {
          seen = `sentinel ${port}: ${String(error)}`
          return false
        }
        const at = Number(master.port)
        const other = ports.find((p) => p !== at)!
        const expected = processes.has(other) ? [other] : []
        const known = replicas.filter((r) => r.flags === 'slave').map((r) => Number(r.port))
        seen = `sentinel ${port}: primary ${at} (${master.flags}), replicas not flagged down [${known.join(',')}], ${peers.length} peers${await tilt(port)}`
        if (master.flags !== 'master' || peers.length !== 2 || expected.some((p) => !known.includes(p))) return false
        named.add(at)
      }
      seenOn = undefined
      if (named.size !== 1) return false
      const at = [...named][0]!
      const other = ports.find((p) => p !== at)!
      if (((await node(at).call('ROLE')) as [string])[0] !== 'master') return false
      // The replica's own view of its link (the sentinels read it by INFO only every 10 s).
      if (processes.has(other)) {
        const [role, , of, state] = (await node(other).call('ROLE')) as [string, string, number, string]
        seen = `${other}: ${role} of ${of}, ${state}`
        if (role !== 'slave' || of !== at || state !== 'connected') return false
      }
      settledOn = at
      return true
    })
    return settledOn
  }

  try {
    await running(primary, () => dataNode(primary))
    await running(replica, () => dataNode(replica, primary))
    await until('the replica did not sync', 10_000, async () => String(await node(replica).call('INFO', 'replication')).includes('master_link_status:up'))
    await Promise.all(sentinels.map((port) => running(port, () => sentinelConfig(port))))
    await Promise.all(sentinels.map((port) => shortTilt(node(port))))
    await settled()
  } catch (error) {
    await stopAll()
    throw error
  }

  return {
    name,
    sentinels: sentinelNodes,
    ports,
    node,
    primary: primaryPort,
    settled,
    async failover() {
      await node(sentinels[0]).call('SENTINEL', 'FAILOVER', name)
    },
    watchPromotion(port, ms = 15_000) {
      const { signal } = watching
      const promoted = until(
        `${port} did not take the master role`,
        ms,
        async () => ((await node(port).call('ROLE')) as [string])[0] === 'master',
        signal,
      ).then(() => performance.now())
      const named = until(
        `no sentinel named ${port} the primary`,
        ms,
        async () => {
          const answers = await Promise.all(
            sentinels.map((sentinel) => (node(sentinel).call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', name) as Promise<[string, string]>).catch(() => null)),
          )
          return answers.some((address) => address !== null && Number(address[1]) === port)
        },
        signal,
      ).then(() => performance.now())
      promoted.catch(() => {})
      named.catch(() => {})
      return { promoted, named }
    },
    kill,
    hang(port) {
      processes.get(port)!.kill('SIGSTOP')
      hung.add(port)
    },
    resume(port) {
      processes.get(port)?.kill('SIGCONT')
      hung.delete(port)
    },
    async restore() {
      endWatches()
      for (const port of hung) processes.get(port)?.kill('SIGCONT')
      hung.clear()
      const at = await primaryPort()
      for (const port of ports) {
        if (port === at) continue
        if (!processes.has(port)) await running(port, () => dataNode(port, at))
        else {
          const [role, , of] = (await node(port).call('ROLE')) as [string, string?, number?]
          if (role !== 'slave' || of !== at) await node(port).call('REPLICAOF', HOST, String(at))
        }
      }
      return settled()
    },
    async stop() {
      endWatches()
      await stopAll()
    },
  }
}

/**
 * Starts a Sentinel deployment for each set of options, all at once, and stops them after the
 * test file (an `afterAll` of the file): call it at the top level of the file, before its
 * tests open connections. `undefined` when `redis-server` is missing (the suites skip, see
 * above).
 */
export async function startRedisSentinels(specs: readonly TestRedisSentinelOptions[]): Promise<TestRedisSentinel[] | undefined> {
  if (!redisSentinelAvailable) return undefined
  return startAll(specs, startRedisSentinel)
}

/**
 * A `describe` on `deployment` (skipped when it is `undefined`: no `redis-server`) named for
 * the ioredis major `kind` (`name (ioredis 6)`, `name (ioredis 5)`).
 */
export function describeRedisSentinel(name: string, kind: IoredisKind, deployment: TestRedisSentinel | undefined, body: (sentinel: TestRedisSentinel) => void): void {
  describe.runIf(deployment !== undefined)(`${name} (ioredis ${kind === 'ioredis5' ? 5 : 6})`, () => body(deployment!))
}
