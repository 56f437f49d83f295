/**
 * `redis-server` processes a test file starts on loopback ports of its own (the Redis Clusters
 * of test/helpers/redis-cluster.ts, the Sentinel deployments of test/helpers/redis-sentinel.ts):
 * each a child process, its last output kept for error messages, with one plain connection per
 * port for the helpers' own commands, all ended (`SIGKILL`) and their directory removed by
 * `stop`, and ended too when the test process exits without it (a crash).
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { rmSync } from 'node:fs'
import { Redis } from 'ioredis'
import { afterAll } from 'vitest'

/**
 * Why `redis-server` cannot serve a helper here (not installed, or older than `minimum`, a
 * `[major, minor]`, for `why`), or `undefined` when it can.
 */
export function redisServerLacking(minimum: readonly [number, number], why: string): string | undefined {
  const version = spawnSync('redis-server', ['--version'], { encoding: 'utf8' })
  if (version.error) return `redis-server is not installed (${version.error.message})`
  const [, major, minor] = /v=(\d+)\.(\d+)\./.exec(version.stdout) ?? []
  if (major === undefined || Number(major) < minimum[0] || (Number(major) === minimum[0] && Number(minor) < minimum[1])) {
    return `redis-server ${version.stdout.trim()} is too old: ${why}`
  }
  return undefined
}

/**
 * Starts one of a helper's setups for each spec, all at once, and stops them after the test
 * file (an `afterAll` of the file); the first failure to start is thrown, once every setup
 * that did start will be stopped.
 */
export async function startAll<Spec, Setup extends { stop(): Promise<void> }>(specs: readonly Spec[], start: (spec: Spec) => Promise<Setup>): Promise<Setup[]> {
  const started = await Promise.allSettled(specs.map(start))
  const setups = started.flatMap((result) => (result.status === 'fulfilled' ? [result.value] : []))
  afterAll(() => Promise.all(setups.map((setup) => setup.stop())))
  const failed = started.find((result) => result.status === 'rejected')
  if (failed) throw failed.reason
  return setups
}

/**
 * Answers once `check` is true (a check that throws is false), polling every 20 ms; rejects
 * after `ms` with `<label>: <what> within <ms> ms`, or, polling no more, once `signal` is
 * aborted.
 */
export async function until(label: string, what: string | (() => string), ms: number, check: () => Promise<boolean>, signal?: AbortSignal): Promise<void> {
  const deadline = performance.now() + ms
  for (;;) {
    if (signal?.aborted) throw new Error(`${label}: ${typeof what === 'string' ? what : what()}: stopped`)
    if (await check().catch(() => false)) return
    if (performance.now() > deadline) throw new Error(`${label}: ${typeof what === 'string' ? what : what()} within ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

/** Resolves once `child` has exited (at once when it has). */
export function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise<void>((resolve) => child.once('exit', () => resolve()))
}

/** The processes of one test helper (see the file's comment). */
export interface RedisProcesses {
  /** {@link until}, its messages starting with the helper's label. */
  until(what: string | (() => string), ms: number, check: () => Promise<boolean>, signal?: AbortSignal): Promise<void>
  /** The running processes by port; a port a test ended is removed. */
  readonly processes: Map<number, ChildProcess>
  /**
   * The plain connection to the process on `port`, made on first use: it reconnects every
   * 50 ms (a restarted process is found again), and its commands fail at once while it is down.
   */
  node(port: number): Redis
  /**
   * Starts `redis-server args()` for `port` (in `dir`) and waits until it answers. One that
   * could not listen (another program on the port, one of a previous run still closing) is
   * started again, every 250 ms for up to 15 s: the tests' ports lie below Linux's ephemeral
   * range (32768–60999), so no client socket of this machine takes them for long.
   */
  running(port: number, args: () => string[]): Promise<void>
  /** Ends the process on `port` at once (`SIGKILL`), as a crashed server ends; nothing if none runs there. */
  kill(port: number): Promise<void>
  /** The last `n` lines the process on `port` printed (its log), for error messages. */
  lastLines(port: number, n: number): string
  /** Ends every process, closes the connections, removes `dir`. */
  stop(): Promise<void>
}

/** Processes whose files go in `dir`; `label` starts their error messages ("Redis Cluster"). */
export function redisProcesses(label: string, dir: string): RedisProcesses {
  const processes = new Map<number, ChildProcess>()
  const output = new Map<number, string>()
  const connections = new Map<number, Redis>()
  const node = (port: number) => {
    let connection = connections.get(port)
    if (!connection) {
      connection = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0, retryStrategy: () => 50 })
      connection.on('error', () => {})
      connections.set(port, connection)
    }
    return connection
  }
  const lastLines = (port: number, n: number) => output.get(port)?.trim().split('\n').slice(-n).join('\n') || 'no output'
  const lastLine = (port: number) => lastLines(port, 1)
  const launch = (port: number, args: string[]) => {
    const child = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'], cwd: dir })
    output.set(port, '')
    const keep = (chunk: Buffer) => output.set(port, (output.get(port)! + chunk.toString()).slice(-2_000))
    child.stdout!.on('data', keep)
    child.stderr!.on('data', keep)
    child.once('error', (error) => keep(Buffer.from(`\n${error.message}`)))
    processes.set(port, child)
    return child
  }
  // A test process that ends without its afterAll (a crash) does not leave servers behind.
  const killOnExit = () => processes.forEach((child) => child.kill('SIGKILL'))
  process.once('exit', killOnExit)
  return {
    until: (what, ms, check, signal) => until(label, what, ms, check, signal),
    processes,
    node,
    async running(port, args) {
      for (let attempt = 1; ; attempt++) {
        const child = launch(port, args())
        const gone = exited(child).then(() => true)
        const answering = until(label, () => `node ${port} did not answer (${lastLine(port)})`, 5_000, async () => {
          if (child.exitCode !== null) return true
          return (await node(port).ping()) === 'PONG'
        })
        await Promise.race([gone, answering])
        if (child.exitCode === null && child.signalCode === null) return
        processes.delete(port)
        if (attempt === 60) throw new Error(`${label}: node ${port} could not start (${lastLine(port)})`)
        await new Promise((resolve) => setTimeout(resolve, 250))
      }
    },
    lastLines,
    async kill(port) {
      const child = processes.get(port)
      if (!child) return
      child.kill('SIGKILL')
      await exited(child)
      processes.delete(port)
    },
    async stop() {
      process.removeListener('exit', killOnExit)
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
    },
  }
}
