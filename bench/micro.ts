/**
 * Micro benchmarks: the core decision for one request, version resolution against
 * `semver.maxSatisfying`, token parse/verify, rate-limit math, and the Web adapter in
 * process. Run by `bench/run.ts` in a child process pinned to one core; runnable alone:
 *
 *   node --import tsx bench/micro.ts [--quick] [--store memory]
 */
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import {
  WINDOWS,
  checkApiTokenFormat,
  checkIpAllowlist,
  compileAllowlist,
  compileVersions,
  hashApiToken,
  hashesEqual,
  parseBearerToken,
  parseVersionPath,
  rateLimitDecision,
  rateLimitHeaders,
  resolveVersion,
  windowStart,
} from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import semver from 'semver'
import { type BenchFixture, TOOLS_LIST_REQUEST, TOOLS_LIST_RESULT, benchRequest, createBenchFixture } from './fixture.js'
import { type HarnessOptions, type MicroResult, consume, measure } from './harness.js'

/** Sizes of the live sets that version resolution is measured on. */
export const VERSION_SET_SIZES = [10, 100, 1000] as const

/** Version resolution against `semver.maxSatisfying` at one live-set size. */
export interface VersionComparison {
  readonly liveVersions: number
  readonly resolve: MicroResult
  readonly semver: MicroResult
  /** resolve ops/s ÷ semver ops/s. */
  readonly ratio: number
  /** Time to compile the live set once (per deploy, not per request). */
  readonly compile: MicroResult
}

/** Everything the micro suite measured. */
export interface MicroReport {
  readonly results: readonly MicroResult[]
  readonly versions: readonly VersionComparison[]
  /** Store calls per `decide` on the bench request, by store method. */
  readonly decisionRoundTrips: { readonly perRequest: number; readonly byMethod: Record<string, number> }
  readonly store: string
}

/** Names of the headline results, used by the report and the targets. */
export const MICRO = {
  decision: 'core decision: decide() with an API token, full pipeline, warm stores',
  webAdapter: 'Web adapter in process: Request → decide → handler → Response → text()',
  webBare: 'bare web handler in process: Request → handler → Response → text()',
} as const

/**
 * A live set of `n` versions that the deploy rule could produce: one live patch per minor,
 * spread over majors 1 to 10.
 */
export function liveSetOf(n: number): string[] {
  const majors = Math.min(10, Math.max(1, Math.round(n / 10)))
  const perMajor = Math.ceil(n / majors)
  const out: string[] = []
  for (let i = 0; i < n; i++) {
    const major = 1 + Math.floor(i / perMajor)
    const minor = i % perMajor
    out.push(`${major}.${minor}.${(minor * 7) % 10}`)
  }
  return out
}

/** Request paths and the equivalent semver ranges, cycled through by both sides. */
function queriesFor(live: readonly string[]): { paths: string[]; ranges: string[] } {
  const middle = semver.parse(live[Math.floor(live.length / 2)]!)!
  return {
    paths: ['/', `/v${middle.major}`, `/v${middle.major}.${middle.minor}`, `/v${middle.version}`],
    ranges: ['*', `${middle.major}.x`, `${middle.major}.${middle.minor}.x`, middle.version],
  }
}

async function measureVersions(harness: HarnessOptions): Promise<VersionComparison[]> {
  const out: VersionComparison[] = []
  for (const n of VERSION_SET_SIZES) {
    const live = liveSetOf(n)
    const index = compileVersions(live)
    const { paths, ranges } = queriesFor(live)
    // Both sides must give the same answers, or the comparison means nothing.
    for (let q = 0; q < paths.length; q++) {
      const ours = resolveVersion(index, parseVersionPath(paths[q]!)!)
      const theirs = semver.maxSatisfying(live, ranges[q]!)
      if (ours !== theirs) throw new Error(`resolution differs at ${n} versions for ${paths[q]}: ${ours} vs ${theirs}`)
    }
    let i = 0
    const resolve = await measure(
      `resolveVersion(parseVersionPath(path)), ${n} live versions`,
      () => resolveVersion(index, parseVersionPath(paths[i++ & 3]!)!),
      harness,
    )
    let j = 0
    const viaSemver = await measure(
      `semver.maxSatisfying(live, range), ${n} live versions`,
      () => semver.maxSatisfying(live, ranges[j++ & 3]!),
      harness,
    )
    const compile = await measure(`compileVersions(live), ${n} live versions (once per deploy)`, () => compileVersions(live), {
      ...harness,
      roundMs: Math.max(20, harness.roundMs / 2),
    })
    out.push({ liveVersions: n, resolve, semver: viaSemver, ratio: resolve.opsPerSec / viaSemver.opsPerSec, compile })
  }
  return out
}

async function measureTokens(fixture: BenchFixture, harness: HarnessOptions): Promise<MicroResult[]> {
  const token = fixture.token
  const stored = hashApiToken(token)
  const header = `Bearer ${token}`
  const allowlist = compileAllowlist(['127.0.0.0/8', '::1/128'])
  // Addresses in turn: checkIpAllowlist keeps the last address it parsed, and one address
  // measured again and again would measure only that memo.
  const addresses = ['127.0.0.1', '127.0.0.2', '::1', '127.9.8.7']
  let turn = 0
  return [
    await measure('parseBearerToken(Authorization)', () => parseBearerToken(header), harness),
    await measure('checkApiTokenFormat (prefix, length, base62, CRC32)', () => checkApiTokenFormat(token), harness),
    await measure('hashApiToken (SHA-256 hex)', () => hashApiToken(token), harness),
    await measure('token verify: hashApiToken + hashesEqual (constant-time compare)', () => hashesEqual(hashApiToken(token), stored), harness),
    await measure('checkIpAllowlist (compiled, 2 ranges; 4 addresses in turn)', () => checkIpAllowlist(addresses[turn++ & 3]!, allowlist), harness),
    await measure('tokenService.authenticate (format, hash, lookup, state; warm store)', () => fixture.tokenService.authenticate(token), harness),
  ]
}

async function measureRateLimit(harness: HarnessOptions): Promise<MicroResult> {
  const policy = { limit: 600, windowType: 'minute' } as const
  let now = 1_700_000_000_000
  let count = 0
  return measure(
    'rate-limit math: windowStart + rateLimitDecision + rateLimitHeaders',
    () => {
      now += 7
      const start = windowStart(now, WINDOWS.minute)
      const result = rateLimitDecision((count = (count % 700) + 1), policy, start + WINDOWS.minute, now)
      return rateLimitHeaders(result)
    },
    harness,
  )
}

async function measureWeb(fixture: BenchFixture, harness: HarnessOptions): Promise<MicroResult[]> {
  const url = `http://${fixture.hostname}/v1`
  const headers = {
    authorization: `Bearer ${fixture.token}`,
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
  }
  const info = { clientAddress: '127.0.0.1' }
  const handler = async (request: Request) => {
    consume(await request.text())
    return new Response(TOOLS_LIST_RESULT, { headers: { 'content-type': 'application/json' } })
  }
  const dispatch = mcpDispatch({ dispatcher: fixture.dispatcher, handler })
  const check = await dispatch(new Request(url, { method: 'POST', headers, body: TOOLS_LIST_REQUEST }), info)
  if (check.status !== 200 || check.headers.get('x-mcp-version') !== '1.2.3') {
    throw new Error(`web adapter check failed: ${check.status} ${await check.text()}`)
  }
  return [
    await measure(
      MICRO.webBare,
      async () => (await handler(new Request(url, { method: 'POST', headers, body: TOOLS_LIST_REQUEST }))).text(),
      harness,
    ),
    await measure(
      MICRO.webAdapter,
      async () => (await dispatch(new Request(url, { method: 'POST', headers, body: TOOLS_LIST_REQUEST }), info)).text(),
      harness,
    ),
  ]
}

/** Runs the micro suite. */
export async function runMicro(options: { quick: boolean; store: string }): Promise<MicroReport> {
  const harness: HarnessOptions = options.quick
    ? { warmupMs: 100, rounds: 3, roundMs: 50 }
    : { warmupMs: 1000, rounds: 7, roundMs: 300 }
  const fixture = await createBenchFixture({ store: options.store })
  const request = benchRequest(fixture)
  const check = await fixture.dispatcher.decide(request)
  if (check.type !== 'dispatch' || check.context.version !== '1.2.3') {
    throw new Error(`bench fixture does not dispatch: ${JSON.stringify(check.type === 'reply' ? check.reply : check.context.version)}`)
  }

  const results: MicroResult[] = []
  results.push(await measure(MICRO.decision, () => fixture.dispatcher.decide(request), harness))
  results.push(
    await measure(
      'core decision, rejected: malformed API token (401, no store lookup)',
      (() => {
        const bad = { ...request, headers: { get: (n: string) => (n === 'authorization' ? 'Bearer svc_notavalidtoken' : undefined) } }
        return () => fixture.dispatcher.decide(bad)
      })(),
      harness,
    ),
  )
  results.push(...(await measureTokens(fixture, harness)))
  results.push(await measureRateLimit(harness))
  results.push(...(await measureWeb(fixture, harness)))
  const versions = await measureVersions(harness)
  await fixture.close()

  // Round trips: a separate, counted pipeline, so the timed runs above carry no counting wrappers.
  const counted = await createBenchFixture({ store: options.store, count: true })
  const countedRequest = benchRequest(counted)
  const n = 1000
  for (let i = 0; i < n; i++) await counted.dispatcher.decide(countedRequest)
  const byMethod: Record<string, number> = {}
  for (const [key, value] of Object.entries(counted.counts ?? {})) if (value > 0) byMethod[key] = value / n
  const decisionRoundTrips = { perRequest: counted.totalStoreCalls() / n, byMethod }
  await counted.close()

  return { results, versions, decisionRoundTrips, store: options.store }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: { quick: { type: 'boolean', default: false }, store: { type: 'string', default: 'memory' } },
  })
  process.once('disconnect', () => process.exit(0)) // the orchestrator went away
  const report = await runMicro({ quick: values.quick!, store: values.store! })
  if (process.send) process.send({ type: 'micro', report })
  else console.log(JSON.stringify(report, null, 2))
}
