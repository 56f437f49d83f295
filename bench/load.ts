/**
 * The load generator, in its own process (pinned to another core than the server where the
 * machine allows): runs autocannon once and reports over IPC. Started by `bench/http.ts`:
 *
 *   node load.mjs '<LoadSpec as JSON>'
 */
import autocannon from 'autocannon'

/** One load run. */
export interface LoadSpec {
  readonly url: string
  readonly connections: number
  /** Seconds. */
  readonly duration: number
  readonly method: 'POST'
  readonly headers: Record<string, string>
  readonly body: string
  /** autocannon worker threads (one per load-generator core); 1 runs in the main thread. */
  readonly workers: number
  /** The body every response must have: any other is counted in `mismatches`. */
  readonly expectBody?: string
}

/** What one load run measured. */
export interface LoadResult {
  /** Mean requests per second over the run. */
  readonly requestsPerSec: number
  readonly total: number
  /** Milliseconds. */
  readonly latencyP50: number
  readonly latencyP99: number
  readonly non2xx: number
  readonly errors: number
  readonly timeouts: number
  /** Responses whose body was not the expected one (absent from runs recorded before it was counted). */
  readonly mismatches?: number
  readonly statusCodes: Record<string, number>
}

async function main(): Promise<void> {
  const spec = JSON.parse(process.argv[2] ?? '') as LoadSpec
  const result = await autocannon({
    url: spec.url,
    connections: spec.connections,
    duration: spec.duration,
    method: spec.method,
    headers: spec.headers,
    body: spec.body,
    pipelining: 1,
    ...(spec.expectBody !== undefined && { expectBody: spec.expectBody }),
    ...(spec.workers > 1 && { workers: spec.workers }),
  })
  const statusCodes: Record<string, number> = {}
  for (const [code, stat] of Object.entries(result.statusCodeStats ?? {})) statusCodes[code] = Number(stat.count)
  const out: LoadResult = {
    requestsPerSec: result.requests.total / result.duration,
    total: result.requests.total,
    latencyP50: result.latency.p50,
    latencyP99: result.latency.p99,
    non2xx: result.non2xx,
    errors: result.errors,
    timeouts: result.timeouts,
    mismatches: result.mismatches ?? 0,
    statusCodes,
  }
  if (process.send) process.send({ type: 'load', result: out }, () => process.exit(0))
  else console.log(JSON.stringify(out))
}

main().catch((error: unknown) => {
  console.error(error)
  process.exit(1)
})
