/**
 * The core decision on the paths a real client takes, not only the one `bench/micro.ts`
 * measures: each path in its own process (fresh inline caches), on warm in-memory stores,
 * timed with the micro harness and counted by callgrind.
 *
 *   node --import tsx bench/paths.ts [--paths api,session,...] [--no-count] [--no-time]
 *
 * It bundles itself with `bench/build.ts` (no `keepNames`) and runs the bundle on plain
 * `node`. Paths:
 *
 * - `api`: API token, no `Mcp-Session-Id`, no `Origin` (the micro suite's core decision);
 * - `session`: the same with the `Mcp-Session-Id` of a session pinned to the resolved version;
 * - `oauth`: an OAuth access token on the validator's warm cache (userinfo mode, an injected
 *   `fetch` that is called once, before the measured calls);
 * - `origin`: `api` plus `Origin: https://app.example`, with `allowedOrigins` configured;
 * - `refused401`: a well-formed API token that is not stored;
 * - `refused402`: a stored token whose owner's subscription is not active.
 *
 * Instructions: the path runs under `valgrind --tool=callgrind --separate-threads=yes`, warms
 * up, the counters are zeroed (`callgrind_control -z`), a fixed number of decisions run, and
 * the main thread's count is dumped (`callgrind_control -d`), as `bench/instructions.ts` does;
 * the median of `--repeat` runs (3). The counted process runs with V8's `--single-threaded`:
 * compilation and garbage collection then happen on the main thread, so their work is counted
 * and no longer depends on how valgrind schedules V8's helper threads (with them, the count of
 * the same path moved by up to 60 % from one run to the next). Node flags given to this script
 * are passed on to its children.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import {
  type Decision,
  type DispatchRequest,
  type MemorySubscriptionStore,
  createDispatcher,
  createOAuthValidator,
} from 'mcp-dispatch'
import { BENCH_APP, BENCH_USER, BENCH_VERSION, benchRequest, createBenchFixture } from './fixture.js'
import { consume, measure } from './harness.js'
import { median } from './stats.js'

export const PATHS = ['api', 'session', 'oauth', 'origin', 'refused401', 'refused402'] as const
type PathName = (typeof PATHS)[number]

const ORIGIN = 'https://app.example'
const SESSION_ID = 'bench-session-0123456789abcdef'
/** Opaque (not a JWT), not an API token: an OAuth access token to the dispatcher. */
const OAUTH_TOKEN = 'oat_Zm9vYmFyYmF6cXV4cXV1eGNvcmdlZ3JhdWx0Z2FycGx5d2FsZG8'

interface Prepared {
  decide(): ReturnType<ReturnType<typeof createDispatcher>['decide']>
  check(decision: Decision): string | undefined
  close(): Promise<void>
}

function withHeaders(request: DispatchRequest, extra: Record<string, string>): DispatchRequest {
  const headers: Record<string, string | undefined> = {}
  for (const name of ['authorization', 'content-type', 'accept']) headers[name] = request.headers.get(name) ?? undefined
  Object.assign(headers, extra)
  return { ...request, headers: { get: (name) => headers[name] } }
}

function dispatched(decision: Decision, test: (d: Extract<Decision, { type: 'dispatch' }>) => boolean): string | undefined {
  if (decision.type !== 'dispatch') return `not dispatched: ${decision.reply.status} ${decision.reply.body}`
  if (decision.context.version !== BENCH_VERSION) return `version ${decision.context.version}`
  return test(decision) ? undefined : 'unexpected dispatch'
}

function refused(status: number): (decision: Decision) => string | undefined {
  return (decision) => (decision.type === 'reply' && decision.reply.status === status ? undefined : `expected ${status}, got ${decision.type}`)
}

async function prepare(path: PathName): Promise<Prepared> {
  const fixture = await createBenchFixture({ store: 'memory' })
  const base = benchRequest(fixture)
  const options = fixture.dispatcherOptions
  const close = () => fixture.close()
  switch (path) {
    case 'api':
      return { decide: () => fixture.dispatcher.decide(base), check: (d) => dispatched(d, (x) => x.context.sessionId === undefined), close }
    case 'session': {
      const first = await fixture.dispatcher.decide(base)
      if (first.type !== 'dispatch') throw new Error('session: the first request was not dispatched')
      await first.complete({ status: 200, sessionId: SESSION_ID })
      const request = withHeaders(base, { 'mcp-session-id': SESSION_ID })
      return {
        decide: () => fixture.dispatcher.decide(request),
        check: (d) => dispatched(d, (x) => x.context.sessionId === SESSION_ID),
        close,
      }
    }
    case 'oauth': {
      let upstreamCalls = 0
      const oauth = createOAuthValidator({
        issuer: 'https://auth.example.com',
        userinfoEndpoint: 'https://auth.example.com/userinfo',
        // Long enough for a slow run under valgrind: every measured call is a cache hit.
        cacheTtlMs: 6 * 3_600_000,
        fetch: async () => {
          upstreamCalls++
          return new Response(JSON.stringify({ sub: BENCH_USER }), { status: 200, headers: { 'content-type': 'application/json' } })
        },
      })
      const dispatcher = createDispatcher({ ...options, oauth })
      const request = withHeaders(base, { authorization: `Bearer ${OAUTH_TOKEN}` })
      return {
        decide: () => dispatcher.decide(request),
        check: (d) =>
          upstreamCalls !== 1 ? `${upstreamCalls} upstream calls` : dispatched(d, (x) => x.context.identity.method === 'oauth'),
        close,
      }
    }
    case 'origin': {
      const dispatcher = createDispatcher({ ...options, allowedOrigins: [ORIGIN] })
      const request = withHeaders(base, { origin: ORIGIN })
      return {
        decide: () => dispatcher.decide(request),
        check: (d) => dispatched(d, (x) => x.headers['access-control-allow-origin'] === ORIGIN),
        close,
      }
    }
    case 'refused401': {
      // Well-formed (prefix, length, checksum), never stored: a token of another service set.
      const other = await createBenchFixture({ store: 'memory' })
      const request = withHeaders(base, { authorization: `Bearer ${other.token}` })
      await other.close()
      return { decide: () => fixture.dispatcher.decide(request), check: refused(401), close }
    }
    case 'refused402': {
      const subscriptions = options.subscriptions as MemorySubscriptionStore
      subscriptions.setActive('user_lapsed', BENCH_APP.id, true)
      const created = await fixture.tokenService.create({
        userId: 'user_lapsed',
        name: 'lapsed',
        servers: [BENCH_APP.id],
        expiresInDays: 90,
        allowedIps: ['127.0.0.0/8', '::1/128'],
      })
      subscriptions.setActive('user_lapsed', BENCH_APP.id, false)
      const request = withHeaders(base, { authorization: `Bearer ${created.token}` })
      return { decide: () => fixture.dispatcher.decide(request), check: refused(402), close }
    }
  }
}

/** Runs `n` decisions: a plain loop when they are synchronous, awaited otherwise. */
async function run(prepared: Prepared, n: number, async: boolean): Promise<void> {
  let last: unknown
  if (async) for (let i = 0; i < n; i++) last = await prepared.decide()
  else for (let i = 0; i < n; i++) last = prepared.decide()
  consume(last)
}

async function ready(path: PathName): Promise<{ prepared: Prepared; async: boolean }> {
  const prepared = await prepare(path)
  const first = prepared.decide()
  const async = first instanceof Promise
  const problem = prepared.check(await first)
  if (problem) throw new Error(`${path}: ${problem}`)
  return { prepared, async }
}

/** Child: times one path with the micro harness. */
async function timeChild(path: PathName): Promise<void> {
  const { prepared, async } = await ready(path)
  const result = await measure(path, () => prepared.decide(), { warmupMs: 1500, rounds: 9, roundMs: 300 })
  const problem = prepared.check(await prepared.decide())
  if (problem) throw new Error(`${path} after timing: ${problem}`)
  await prepared.close()
  process.send!({ nsPerOp: result.nsPerOp, spread: result.spread.percent, async })
}

/** Child under callgrind: warms up, then runs `n` decisions between the parent's zero and dump. */
async function countChild(path: PathName, warm: number, n: number): Promise<void> {
  const { prepared, async } = await ready(path)
  await run(prepared, warm, async)
  const go = new Promise<void>((resolve) => process.once('message', () => resolve()))
  process.send!('ready')
  await go
  await run(prepared, n, async)
  const problem = prepared.check(await prepared.decide())
  process.send!(problem ?? 'done')
  await new Promise<void>((resolve) => process.once('message', () => resolve()))
  await prepared.close()
  process.disconnect()
}

/**
 * Runs one path for `seconds`, for `node --cpu-prof` (`node --cpu-prof <bundle> profile session 3`;
 * summarize with `bench/profile-summary.ts`).
 */
async function profileChild(path: PathName, seconds: number): Promise<void> {
  const { prepared, async } = await ready(path)
  const end = Date.now() + seconds * 1000
  let n = 0
  while (Date.now() < end) {
    await run(prepared, 10_000, async)
    n += 10_000
  }
  await prepared.close()
  console.log(`${path}: ${n} decisions in ${seconds} s (profiling overhead included)`)
}

function message(child: ChildProcess, timeoutMs: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('child timed out')), timeoutMs)
    child.once('message', (m) => {
      clearTimeout(timer)
      resolve(m)
    })
    child.once('exit', (code) => {
      clearTimeout(timer)
      reject(new Error(`child exited with ${code}`))
    })
  })
}

async function timePath(self: string, path: PathName): Promise<{ nsPerOp: number; spread: number; async: boolean }> {
  const child = spawn(process.execPath, [...process.execArgv, self, 'time-child', path], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const result = (await message(child, 120_000)) as { nsPerOp: number; spread: number; async: boolean }
  child.kill()
  return result
}

async function countPath(self: string, path: PathName, warm: number, n: number): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-paths-'))
  const child = spawn(
    'valgrind',
    ['--tool=callgrind', '--separate-threads=yes', `--callgrind-out-file=${join(dir, 'out')}`, process.execPath, '--single-threaded', ...process.execArgv, self, 'count-child', path, String(warm), String(n)],
    { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] },
  )
  try {
    if ((await message(child, 900_000)) !== 'ready') throw new Error('no ready')
    spawnSync('callgrind_control', ['-z', String(child.pid)], { stdio: 'ignore' })
    child.send('go')
    const done = await message(child, 900_000)
    spawnSync('callgrind_control', ['-d', String(child.pid)], { stdio: 'ignore' })
    if (done !== 'done') throw new Error(`${path}: ${String(done)}`)
    child.send('exit')
    await new Promise((resolve) => child.once('exit', resolve))
    const file = readdirSync(dir).find((name) => /^out\.1-01$/.test(name))
    const total = file ? /^(?:summary|totals): (\d+)/m.exec(readFileSync(join(dir, file), 'utf8'))?.[1] : undefined
    if (total === undefined) throw new Error(`${path}: no callgrind dump`)
    return Number(total) / n
  } finally {
    child.kill()
    rmSync(dir, { recursive: true, force: true })
  }
}

async function main(): Promise<void> {
  const self = fileURLToPath(import.meta.url)
  const [mode, ...rest] = process.argv.slice(2)
  if (mode === 'time-child') return timeChild(rest[0] as PathName)
  if (mode === 'count-child') return countChild(rest[0] as PathName, Number(rest[1]), Number(rest[2]))
  if (mode === 'profile') return profileChild(rest[0] as PathName, Number(rest[1] ?? 3))
  if (!self.endsWith('.mjs')) {
    // Under tsx: bundle without keepNames and run the bundle.
    const { buildBench } = await import('./build.js')
    const bundle = (await buildBench()).paths
    const child = spawn(process.execPath, [bundle, ...process.argv.slice(2)], { stdio: 'inherit' })
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve))
    process.exitCode = code ?? 1
    return
  }
  const { values } = parseArgs({
    options: {
      paths: { type: 'string', default: PATHS.join(',') },
      'no-count': { type: 'boolean', default: false },
      'no-time': { type: 'boolean', default: false },
      warm: { type: 'string', default: '100000' },
      n: { type: 'string', default: '50000' },
      // JIT timing under valgrind makes a count an outlier now and then: the median of several.
      repeat: { type: 'string', default: '3' },
    },
  })
  const paths = values.paths!.split(',') as PathName[]
  const rows: { path: PathName; ns?: number; spread?: number; async?: boolean; instructions?: number; counts?: number[] }[] = []
  for (const path of paths) {
    const row: (typeof rows)[number] = { path }
    if (!values['no-time']) Object.assign(row, await timePath(self, path).then((t) => ({ ns: t.nsPerOp, spread: t.spread, async: t.async })))
    if (!values['no-count']) {
      const counts: number[] = []
      for (let r = 0; r < Number(values.repeat); r++) counts.push(await countPath(self, path, Number(values.warm), Number(values.n)))
      row.counts = counts.map(Math.round)
      row.instructions = median(counts)
    }
    console.log(JSON.stringify(row))
    rows.push(row)
  }
  const api = rows.find((r) => r.path === 'api')
  console.log(`\nNode ${process.version}\n`)
  console.log('| path | instructions / decision | × api | ns / decision (spread) | × api | promise |')
  console.log('| --- | --- | --- | --- | --- | --- |')
  for (const r of rows) {
    const ix = api?.instructions && r.instructions ? (r.instructions / api.instructions).toFixed(2) : ''
    const tx = api?.ns && r.ns ? (r.ns / api.ns).toFixed(2) : ''
    console.log(
      `| ${r.path} | ${r.instructions === undefined ? '' : Math.round(r.instructions).toLocaleString('en-US')} | ${ix} | ${
        r.ns === undefined ? '' : `${Math.round(r.ns)} (±${r.spread!.toFixed(0)} %)`
      } | ${tx} | ${r.async === undefined ? '' : r.async ? 'yes' : 'no'} |`,
    )
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url) || process.argv[1]?.endsWith('paths.mjs')) {
  main().catch((error: unknown) => {
    console.error(error)
    process.exit(1)
  })
}
