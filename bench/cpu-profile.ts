/**
 * Where the CPU time of a request goes, by function, JavaScript included: each HTTP benchmark
 * server runs with `--perf-basic-prof` (V8 writes `/tmp/perf-<pid>.map`, so `perf` can name
 * JIT-compiled functions), is loaded until the JIT has settled, then `perf record -g` is
 * attached to it for a fixed number of requests. The call stacks are summed per function,
 * inclusive (the function and everything it called) and self, in microseconds per request,
 * and every server after the first is compared with the first (the bare framework, say).
 *
 *   npm run bench:profile -- --servers fastify-bare,fastify-dispatch [--requests 50000] [--top 40]
 *
 * Unlike `bench:instructions` (callgrind; with `--by-function` it names functions too, and
 * exactly), this counts kernel time (socket writes, wake-ups) where `perf_event_paranoid`
 * allows it; unlike `npm run bench`, sampling costs the server time (a few percent at the
 * default 999 Hz, more with deep stacks), so use its figures to find where time goes, not as
 * throughput. Needs Linux `perf` (Debian: `apt-get install linux-perf`).
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { buildBench } from './build.js'
import { loadFixed } from './fixed-load.js'
import { frameName, growth } from './functions.js'
import { exited, isMessage, nextMessage } from './processes.js'
import { SERVERS, type ServerEntry, type ServerMessage } from './servers/catalog.js'

type Listening = Extract<ServerMessage, { type: 'listening' }>
type Unavailable = Extract<ServerMessage, { type: 'unavailable' }>

/** Samples per function of one server, over `requests` requests at `hz`. */
interface Profile {
  readonly entry: ServerEntry
  readonly requests: number
  readonly samples: number
  readonly inclusive: Map<string, number>
  readonly self: Map<string, number>
}

function load(port: number, token: string, hostname: string, amount: number) {
  return loadFixed(port, token, hostname, amount, 50)
}

/**
 * Sums `perf script -F ip,sym` output: one frame per line, leaf first, a blank line between
 * samples. A function counts once per sample in `inclusive` however often it recurs.
 */
function summarize(script: string): Pick<Profile, 'samples' | 'inclusive' | 'self'> {
  const inclusive = new Map<string, number>()
  const self = new Map<string, number>()
  let samples = 0
  let frames = new Set<string>()
  let leaf: string | undefined
  const flush = () => {
    if (leaf === undefined) return
    samples++
    self.set(leaf, (self.get(leaf) ?? 0) + 1)
    for (const frame of frames) inclusive.set(frame, (inclusive.get(frame) ?? 0) + 1)
    frames = new Set()
    leaf = undefined
  }
  for (const line of script.split('\n')) {
    const text = line.trim()
    if (text === '') {
      flush()
      continue
    }
    const space = text.indexOf(' ')
    const name = frameName(space === -1 ? text : text.slice(space + 1))
    leaf ??= name
    frames.add(name)
  }
  flush()
  return { samples, inclusive, self }
}

async function profile(serverBundle: string, entry: ServerEntry, requests: number, hz: number): Promise<Profile | string> {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-perf-'))
  // In the temporary folder: `--perf-basic-prof` also has V8 write its `isolate-*-v8.log` to
  // the working directory, which would litter the checkout.
  const child: ChildProcess = spawn(process.execPath, ['--perf-basic-prof', serverBundle, entry.id], {
    stdio: ['ignore', 'ignore', 'ignore', 'ipc'],
    cwd: dir,
  })
  const data = join(dir, 'perf.data')
  try {
    const first = await nextMessage(
      child,
      (m: unknown): m is Listening | Unavailable => isMessage<Listening>('listening')(m) || isMessage<Unavailable>('unavailable')(m),
    )
    if (first.type === 'unavailable') return first.reason
    const { port, token, hostname } = first
    // Warm-up on fresh connections, as bench:instructions does: the JIT settles on every path.
    for (const amount of [requests / 2, requests / 4, requests / 4]) await load(port, token, hostname, amount)
    const perf = spawn('perf', ['record', '-F', String(hz), '-g', '-p', String(child.pid), '-o', data], { stdio: 'ignore' })
    await new Promise((resolve) => setTimeout(resolve, 500))
    const result = await load(port, token, hostname, requests)
    perf.kill('SIGINT')
    await exited(perf)
    if (perf.exitCode !== 0 && perf.signalCode === null) return `perf record exited with ${perf.exitCode}`
    const script = spawnSync('perf', ['script', '-i', data, '-F', 'ip,sym'], { encoding: 'utf8', maxBuffer: 2 ** 31 - 1 })
    if (script.status !== 0) return `perf script failed: ${script.stderr.slice(0, 200)}`
    child.send({ type: 'close' })
    await exited(child)
    const failures = result.non2xx + result.errors + result.timeouts
    if (failures > 0) return `${failures} requests failed under load`
    return { entry, requests: result.requests.total, ...summarize(script.stdout) }
  } catch (error) {
    return (error as Error).message
  } finally {
    child.kill()
    // V8's symbol map of the server, written because of --perf-basic-prof.
    if (child.pid !== undefined) rmSync(join('/tmp', `perf-${child.pid}.map`), { force: true })
    rmSync(dir, { recursive: true, force: true })
  }
}

/** Microseconds per request that `samples` samples stand for. */
function micros(samples: number | undefined, p: Profile, hz: number): number {
  return ((samples ?? 0) / hz / p.requests) * 1e6
}

function render(profiles: readonly Profile[], hz: number, top: number): string {
  const [base, ...others] = profiles
  const lines: string[] = [
    `CPU time per request by function (perf, ${hz} Hz, --perf-basic-prof), Node ${process.version}. ` +
      'Inclusive: the function and what it called; µs per request, sampling overhead included.',
    '',
    '| server | requests | µs / request (all sampled) | ratio to first |',
    '| --- | --- | --- | --- |',
  ]
  for (const p of profiles) {
    const total = micros(p.samples, p, hz)
    lines.push(`| ${p.entry.label} | ${p.requests.toLocaleString('en-US')} | ${total.toFixed(1)} | ${(micros(base!.samples, base!, hz) / total).toFixed(2)} |`)
  }
  for (const p of others) {
    for (const kind of ['inclusive', 'self'] as const) {
      // Inclusive: the frames under which nearly everything runs (the event loop, the HTTP
      // parser) grow with any change and name none; leave out those above half of either row.
      const kept = (name: string) =>
        kind === 'self' || ((base!.inclusive.get(name) ?? 0) <= base!.samples / 2 && (p.inclusive.get(name) ?? 0) <= p.samples / 2)
      const perRequest = (of: Profile) => new Map([...of[kind]].filter(([name]) => kept(name)).map(([name, n]) => [name, micros(n, of, hz)]))
      const rows = growth(perRequest(base!), perRequest(p), top)
      lines.push(
        '',
        `${p.entry.label} against ${base!.entry.label}, ${kind} time, largest increase first` +
          (kind === 'inclusive' ? ' (frames above half of either row left out):' : ':'),
        '',
        `| + µs | ${base!.entry.id} | ${p.entry.id} | function |`,
        '| --- | --- | --- | --- |',
      )
      for (const row of rows) lines.push(`| ${(row.other - row.base).toFixed(2)} | ${row.base.toFixed(2)} | ${row.other.toFixed(2)} | \`${row.name.slice(0, 110)}\` |`)
    }
  }
  return `${lines.join('\n')}\n`
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      servers: { type: 'string', default: 'fastify-bare,fastify-dispatch' },
      requests: { type: 'string', default: '50000' },
      hz: { type: 'string', default: '999' },
      top: { type: 'string', default: '30' },
      out: { type: 'string' },
    },
  })
  if (spawnSync('perf', ['--version'], { stdio: 'ignore' }).status !== 0) {
    console.log('perf is not installed: nothing profiled (Debian: apt-get install linux-perf)')
    return
  }
  const requests = Number(values.requests)
  const hz = Number(values.hz)
  const top = Number(values.top)
  if (!Number.isInteger(requests) || requests < 1000) throw new Error('--requests must be an integer >= 1000')
  if (!Number.isInteger(hz) || hz < 1 || hz > 20_000) throw new Error('--hz must be an integer from 1 to 20000')
  if (!Number.isInteger(top) || top < 1) throw new Error('--top must be a positive integer')
  const ids = values.servers!.split(',')
  const entries = ids.map((id) => {
    const entry = SERVERS.find((s) => s.id === id)
    if (!entry) throw new Error(`unknown server ${id}; known: ${SERVERS.map((s) => s.id).join(', ')}`)
    return entry
  })
  const bundles = await buildBench()
  const profiles: Profile[] = []
  for (const entry of entries) {
    process.stdout.write(`profiling ${entry.id} … `)
    const result = await profile(bundles.server, entry, requests, hz)
    if (typeof result === 'string') {
      console.log(`skipped: ${result}`)
      continue
    }
    profiles.push(result)
    console.log(`${result.samples.toLocaleString('en-US')} samples`)
  }
  if (profiles.length === 0) return
  const table = render(profiles, hz, top)
  console.log(`\n${table}`)
  if (values.out) writeFileSync(values.out, `# CPU profile\n\n${table}`)
}

main().catch((error: unknown) => {
  console.error(error)
  process.exit(1)
})
