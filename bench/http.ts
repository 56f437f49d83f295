/**
 * HTTP benchmarks over loopback: for each framework, its bare server, the same handler behind
 * our adapter, and the anchor chain run as separate processes (pinned to core 0), and
 * autocannon loads them from another process (pinned to core 1). The servers of a framework
 * alternate (A B C, B C A, …) over several rounds, so slow drift of the machine spreads over
 * all of them; the report gives medians, spread and every ratio to the bare framework.
 */
import type { ChildProcess } from 'node:child_process'
import { request } from 'node:http'
import { BENCH_PATH, BENCH_VERSION, TOOLS_LIST_REQUEST, TOOLS_LIST_RESULT } from './fixture.js'
import type { LoadResult, LoadSpec } from './load.js'
import { exited, isMessage, loadCores, nextMessage, startNode } from './processes.js'
import { type Framework, type ServerEntry, type ServerMessage, SERVERS } from './servers/catalog.js'
import { type Spread, median, pairedRatios, spreadOf } from './stats.js'

/** Options of {@link runHttp}. */
export interface HttpOptions {
  /** Seconds per measured run. */
  readonly duration: number
  /** Measured runs per server. */
  readonly rounds: number
  /** Seconds of warm-up load per server before the rounds. */
  readonly warmup: number
  readonly connections: number
  readonly store: string
  readonly frameworks: readonly Framework[]
  /** Paths of the bundles (`build.ts`). */
  readonly bundles: { readonly server: string; readonly load: string }
  /** Progress lines. */
  readonly log: (line: string) => void
}

/** One server's row of the HTTP table. */
export interface HttpRow {
  readonly entry: ServerEntry
  /** Why it was not measured (adapter missing, preflight failed, crash). */
  readonly skipped?: string
  readonly runs: readonly LoadResult[]
  readonly requestsPerSec: number
  readonly spread: Spread | undefined
  /** Median over runs, ms. */
  readonly latencyP50: number
  readonly latencyP99: number
  /** Requests per second ÷ the bare server's (medians over the rounds). */
  readonly ratio: number | undefined
  /**
   * This server's requests per second ÷ the bare server's, round by round (both ran in the same
   * round, seconds apart): the paired ratios. Their median is what the targets are judged on,
   * and their spread tells whether the machine was quiet enough to judge at all.
   */
  readonly pairedRatios: readonly number[] | undefined
  /** Server CPU time per request, µs (median over runs): robust when the load generator is starved. */
  readonly cpuMicrosPerRequest: number
  /** The bare server's CPU per request ÷ this one's: the throughput ratio a CPU-bound server would show. */
  readonly cpuRatio: number | undefined
  /** Store calls per dispatched request (adapter rows). */
  readonly storeCallsPerRequest: number | undefined
  /** Responses that were not 2xx or not the fixed result, or connection errors, over all runs: must be 0. */
  readonly failures: number
}

interface RunningServer {
  readonly entry: ServerEntry
  readonly child: ChildProcess
  readonly port: number
  readonly token: string
  readonly hostname: string
}

type Listening = Extract<ServerMessage, { type: 'listening' }>
type Unavailable = Extract<ServerMessage, { type: 'unavailable' }>
type Stats = Extract<ServerMessage, { type: 'stats' }>

async function startServer(entry: ServerEntry, options: HttpOptions): Promise<RunningServer | string> {
  const child = startNode(options.bundles.server, [entry.id, '--store', options.store], '0')
  try {
    const first = await nextMessage(
      child,
      (m: unknown): m is Listening | Unavailable => isMessage<Listening>('listening')(m) || isMessage<Unavailable>('unavailable')(m),
      60_000,
    )
    if (first.type === 'unavailable') {
      await exited(child)
      return first.reason
    }
    return { entry, child, port: first.port, token: first.token, hostname: first.hostname }
  } catch (error) {
    child.kill()
    return `server failed to start: ${(error as Error).message}`
  }
}

function headersFor(server: RunningServer): Record<string, string> {
  return {
    host: `${server.hostname}:${server.port}`,
    authorization: `Bearer ${server.token}`,
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
  }
}

/** One request of the benchmark's, sent by hand: its status, headers and body, or why it failed. */
function ask(server: RunningServer, headers: Record<string, string>): Promise<{ status: number; headers: Record<string, unknown>; body: string } | string> {
  return new Promise((resolve) => {
    const req = request({ host: '127.0.0.1', port: server.port, method: 'POST', path: BENCH_PATH, headers }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => (body += chunk))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }))
    })
    req.on('error', (error) => resolve(`preflight failed: ${error.message}`))
    req.end(TOOLS_LIST_REQUEST)
  })
}

/**
 * Requests by hand before the load: the benchmark's gets the right status, body and version
 * header; and on a row that authenticates and limits (ours and the anchors), one without its
 * token gets 401 and the benchmark's carries rate-limit headers, so a row whose auth or limiter
 * is off never runs as if it did the work. Else the row is void.
 */
async function preflight(server: RunningServer): Promise<string | undefined> {
  const answer = await ask(server, headersFor(server))
  if (typeof answer === 'string') return answer
  if (answer.status !== 200) return `preflight answered ${answer.status}: ${answer.body.slice(0, 200)}`
  if (answer.body !== TOOLS_LIST_RESULT) return `preflight body differs: ${answer.body.slice(0, 200)}`
  if (server.entry.stack === 'dispatch' && answer.headers['x-mcp-version'] !== BENCH_VERSION) {
    return `preflight X-MCP-Version is ${String(answer.headers['x-mcp-version'])}, expected ${BENCH_VERSION}`
  }
  if (server.entry.stack === 'bare') return undefined
  if (!Object.keys(answer.headers).some((name) => name.includes('ratelimit'))) return 'preflight: no rate-limit header (is the limiter on?)'
  const { authorization: _, ...anonymous } = headersFor(server)
  const refused = await ask(server, anonymous)
  if (typeof refused === 'string') return refused
  return refused.status === 401 ? undefined : `preflight without a token answered ${refused.status}, not 401 (is authentication on?)`
}

/** One measured run: the load result and the server's CPU time per request during it. */
interface Run extends LoadResult {
  readonly cpuMicrosPerRequest: number
}

async function statsOf(server: RunningServer): Promise<Stats> {
  server.child.send({ type: 'stats' })
  return nextMessage(server.child, isMessage<Stats>('stats'), 10_000)
}

async function measuredLoad(server: RunningServer, seconds: number, options: HttpOptions): Promise<Run> {
  const before = await statsOf(server)
  const result = await load(server, seconds, options)
  const after = await statsOf(server)
  return { ...result, cpuMicrosPerRequest: (after.cpuMicros - before.cpuMicros) / Math.max(1, result.total) }
}

async function load(server: RunningServer, seconds: number, options: HttpOptions): Promise<LoadResult> {
  const cores = loadCores()
  const spec: LoadSpec = {
    url: `http://127.0.0.1:${server.port}${BENCH_PATH}`,
    connections: options.connections,
    duration: seconds,
    method: 'POST',
    headers: headersFor(server),
    body: TOOLS_LIST_REQUEST,
    // Every response of the load is checked, not only the preflight's.
    expectBody: TOOLS_LIST_RESULT,
    workers: cores.count,
  }
  const child = startNode(options.bundles.load, [JSON.stringify(spec)], cores.list)
  const message = await nextMessage(child, isMessage<{ type: 'load'; result: LoadResult }>('load'), (seconds + 60) * 1000)
  await exited(child)
  return message.result
}

async function stop(server: RunningServer): Promise<Stats | undefined> {
  let stats: Stats | undefined
  try {
    stats = await statsOf(server)
    server.child.send({ type: 'close' })
    await Promise.race([exited(server.child), new Promise((r) => setTimeout(r, 10_000).unref())])
  } finally {
    if (server.child.exitCode === null) server.child.kill()
  }
  return stats
}

function skippedRow(entry: ServerEntry, reason: string): HttpRow {
  return {
    entry,
    skipped: reason,
    runs: [],
    requestsPerSec: Number.NaN,
    spread: undefined,
    latencyP50: Number.NaN,
    latencyP99: Number.NaN,
    ratio: undefined,
    pairedRatios: undefined,
    cpuMicrosPerRequest: Number.NaN,
    cpuRatio: undefined,
    storeCallsPerRequest: undefined,
    failures: 0,
  }
}

/** Runs the HTTP benchmarks of every selected framework. */
export async function runHttp(options: HttpOptions): Promise<HttpRow[]> {
  const rows: HttpRow[] = []
  for (const framework of options.frameworks) {
    const entries = SERVERS.filter((s) => s.framework === framework)
    const running: RunningServer[] = []
    const skipped = new Map<string, string>()
    for (const entry of entries) {
      const started = await startServer(entry, options)
      if (typeof started === 'string') {
        skipped.set(entry.id, started)
        continue
      }
      const problem = await preflight(started)
      if (problem) {
        skipped.set(entry.id, problem)
        await stop(started)
        continue
      }
      running.push(started)
    }
    const runs = new Map<string, Run[]>(running.map((s) => [s.entry.id, []]))
    const stats = new Map<string, Stats | undefined>()
    try {
      for (const server of running) {
        options.log(`  warm-up ${server.entry.id} (${options.warmup} s)`)
        await load(server, options.warmup, options)
      }
      for (let round = 0; round < options.rounds; round++) {
        // Rotate the order each round: A B C, B C A, C A B, …
        const order = running.map((_, i) => running[(i + round) % running.length]!)
        for (const server of order) {
          const result = await measuredLoad(server, options.duration, options)
          runs.get(server.entry.id)!.push(result)
          options.log(
            `  round ${round + 1}/${options.rounds} ${server.entry.id}: ${Math.round(result.requestsPerSec).toLocaleString('en-US')} req/s, p99 ${result.latencyP99} ms, ${result.cpuMicrosPerRequest.toFixed(1)} µs CPU/request${result.non2xx + result.errors + (result.mismatches ?? 0) > 0 ? `, ${result.non2xx} non-2xx, ${Math.max(0, (result.mismatches ?? 0) - result.non2xx)} 2xx of another body, ${result.errors} errors` : ''}`,
          )
        }
      }
    } finally {
      for (const server of running) stats.set(server.entry.id, await stop(server))
    }

    const bare = running.find((s) => s.entry.stack === 'bare')
    const bareRounds = bare ? runs.get(bare.entry.id)!.map((r) => r.requestsPerSec) : []
    const bareRps = bare ? median(bareRounds) : Number.NaN
    const bareCpu = bare ? median(runs.get(bare.entry.id)!.map((r) => r.cpuMicrosPerRequest)) : Number.NaN
    for (const entry of entries) {
      const reason = skipped.get(entry.id)
      if (reason !== undefined) {
        rows.push(skippedRow(entry, reason))
        continue
      }
      const results = runs.get(entry.id)!
      const rps = results.map((r) => r.requestsPerSec)
      const s = stats.get(entry.id)
      const requestsPerSec = median(rps)
      const cpuMicrosPerRequest = median(results.map((r) => r.cpuMicrosPerRequest))
      rows.push({
        entry,
        runs: results,
        requestsPerSec,
        spread: spreadOf(rps),
        latencyP50: median(results.map((r) => r.latencyP50)),
        latencyP99: median(results.map((r) => r.latencyP99)),
        ratio: entry.stack === 'bare' ? 1 : bare ? requestsPerSec / bareRps : undefined,
        pairedRatios: bare ? pairedRatios(rps, bareRounds) : undefined,
        cpuMicrosPerRequest,
        cpuRatio: entry.stack === 'bare' ? 1 : bare ? bareCpu / cpuMicrosPerRequest : undefined,
        storeCallsPerRequest: entry.stack === 'dispatch' && s && s.decisions > 0 ? s.storeCalls / s.decisions : undefined,
        // A non-2xx answer's body is no fixed result either: counted once.
        failures: results.reduce((n, r) => n + r.errors + Math.max(r.non2xx, r.mismatches ?? 0), 0),
      })
    }
  }
  return rows
}
