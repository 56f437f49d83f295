/**
 * Instructions per request of each HTTP benchmark server, counted by callgrind: a figure
 * that does not move with the machine's load, unlike requests per second. `npm run bench` is
 * what the targets are judged on; this is how a change to the hot path is judged on a noisy
 * machine, and its ratios (bare ÷ this) track the throughput ratios closely.
 *
 *   npm run bench:instructions [-- --frameworks fastify,express,hono --requests 10000]
 *   npm run bench:instructions -- --servers express-bare,express-dispatch --keep /tmp/cg --no-write
 *   npm run bench:instructions -- --servers fastify-bare,fastify-dispatch --by-function --no-write
 *
 * Each server runs under `valgrind --tool=callgrind --separate-threads=yes` (its main
 * thread is counted; V8's background compiler and GC threads are not). The server is loaded
 * three times on fresh connections first, so that the JIT has settled on the code every
 * request takes (new connections alone make V8 recompile Node's stream code once), then the
 * counters are zeroed, a fixed number of requests is sent, and the counters are dumped.
 * Kernel work (socket writes) is not counted.
 *
 * With `--by-function`, each server also runs with `--perf-basic-prof`, so that V8 names its
 * JIT-compiled functions in `/tmp/perf-<pid>.map`, and the dump is summed per function (self
 * instructions per request, V8 builtins and Node's C++ by their symbols): every server is listed
 * against the bare server of its framework, largest increase first (`--top`, default 30). Exact
 * counts, unlike `bench:profile`'s samples, so a change of a few hundred instructions in one
 * function shows.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { ROOT, buildBench } from './build.js'
import { loadFixed } from './fixed-load.js'
import { callgrindSelfCosts, growth, perfMapLookup } from './functions.js'
import { exited, isMessage, nextMessage } from './processes.js'
import { FRAMEWORKS, type Framework, SERVERS, type ServerEntry, type ServerMessage } from './servers/catalog.js'

type Listening = Extract<ServerMessage, { type: 'listening' }>
type Unavailable = Extract<ServerMessage, { type: 'unavailable' }>

interface Counted {
  readonly entry: ServerEntry
  readonly instructions?: number
  readonly failures?: number
  readonly skipped?: string
  /** Self instructions per request by function (`--by-function`). */
  readonly functions?: Map<string, number>
}

function load(port: number, token: string, hostname: string, amount: number) {
  return loadFixed(port, token, hostname, amount, 8)
}

/**
 * Counts one server. With `keep`, its callgrind dump of the measured requests is copied to
 * `<keep>/<server id>.callgrind` (for `callgrind_annotate`: JIT-compiled JavaScript shows as
 * unnamed addresses, V8 builtins and Node's C++ by name), and with `byFunction` V8's map of
 * those addresses to `<keep>/<server id>.perf.map`. With `byFunction`, the server runs with
 * `--perf-basic-prof` and its self instructions per request are summed by function.
 */
async function count(serverBundle: string, entry: ServerEntry, requests: number, keep?: string, byFunction = false): Promise<Counted> {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-callgrind-'))
  const node = byFunction ? [process.execPath, '--perf-basic-prof'] : [process.execPath]
  const child: ChildProcess = spawn(
    'valgrind',
    ['--tool=callgrind', '--separate-threads=yes', `--callgrind-out-file=${join(dir, 'out')}`, ...node, serverBundle, entry.id],
    // In the temporary folder: `--perf-basic-prof` also has V8 write its `isolate-*-v8.log`
    // to the working directory, which would litter the checkout.
    { stdio: ['ignore', 'ignore', 'ignore', 'ipc'], cwd: dir },
  )
  // V8's symbol map (`--perf-basic-prof`), named by the process id: valgrind runs the server
  // in its own process.
  const perfMap = join('/tmp', `perf-${child.pid}.map`)
  try {
    const first = await nextMessage(
      child,
      (m: unknown): m is Listening | Unavailable => isMessage<Listening>('listening')(m) || isMessage<Unavailable>('unavailable')(m),
      300_000,
    )
    if (first.type === 'unavailable') return { entry, skipped: first.reason }
    const { port, token, hostname } = first
    for (const amount of [requests * 2, requests / 2, requests / 2]) await load(port, token, hostname, amount)
    spawnSync('callgrind_control', ['-z', String(child.pid)], { stdio: 'ignore' })
    const result = await load(port, token, hostname, requests)
    spawnSync('callgrind_control', ['-d', String(child.pid)], { stdio: 'ignore' })
    child.send({ type: 'close' })
    await exited(child)
    // The dump taken after zeroing, main thread: `out.1-01`.
    const file = readdirSync(dir).find((name) => /^out\.1-01$/.test(name))
    const dump = file ? readFileSync(join(dir, file), 'utf8') : undefined
    const total = dump ? /^(?:summary|totals): (\d+)/m.exec(dump)?.[1] : undefined
    if (total === undefined) return { entry, skipped: 'no callgrind dump was written' }
    if (keep !== undefined) {
      mkdirSync(keep, { recursive: true })
      copyFileSync(join(dir, file!), join(keep, `${entry.id}.callgrind`))
      if (byFunction) copyFileSync(perfMap, join(keep, `${entry.id}.perf.map`))
    }
    let functions: Map<string, number> | undefined
    if (byFunction) {
      const self = callgrindSelfCosts(dump!, perfMapLookup(readFileSync(perfMap, 'utf8')))
      functions = new Map([...self].map(([name, instructions]) => [name, instructions / result.requests.total]))
    }
    return {
      entry,
      instructions: Number(total) / result.requests.total,
      failures: result.non2xx + result.errors + result.timeouts,
      functions,
    }
  } catch (error) {
    return { entry, skipped: (error as Error).message }
  } finally {
    child.kill()
    rmSync(dir, { recursive: true, force: true })
    if (byFunction) rmSync(perfMap, { force: true })
  }
}

function render(rows: readonly Counted[], requests: number): string {
  const lines = [
    `Instructions per request (callgrind, main thread), ${requests.toLocaleString('en-US')} requests per server after warm-up; Node ${process.version}.`,
    '',
    '| server | instructions / request | over bare | bare ÷ this | failures |',
    '| --- | --- | --- | --- | --- |',
  ]
  for (const framework of FRAMEWORKS) {
    const bare = rows.find((r) => r.entry.framework === framework && r.entry.stack === 'bare')?.instructions
    for (const row of rows.filter((r) => r.entry.framework === framework)) {
      if (row.instructions === undefined) {
        lines.push(`| ${row.entry.label} | not counted: ${row.skipped} | | | |`)
        continue
      }
      const over = bare === undefined ? '' : `+${Math.round(row.instructions - bare).toLocaleString('en-US')}`
      const ratio = bare === undefined ? '' : (bare / row.instructions).toFixed(2)
      lines.push(
        `| ${row.entry.label} | ${Math.round(row.instructions).toLocaleString('en-US')} | ${row.entry.stack === 'bare' ? '' : over} | ${ratio} | ${row.failures} |`,
      )
    }
  }
  return `${lines.join('\n')}\n`
}

/**
 * By function (`--by-function`): every server against the bare server of its framework, or
 * against the first server counted where that was not counted.
 */
function renderFunctions(rows: readonly Counted[], top: number): string {
  const counted = rows.filter((row) => row.functions !== undefined)
  const round = (n: number) => Math.round(n).toLocaleString('en-US')
  const lines: string[] = []
  for (const row of counted) {
    const base = counted.find((r) => r.entry.framework === row.entry.framework && r.entry.stack === 'bare') ?? counted[0]!
    if (base === row) continue
    lines.push(
      `${row.entry.label} against ${base.entry.label}, self instructions per request by function, largest increase first:`,
      '',
      `| + instructions | ${base.entry.id} | ${row.entry.id} | function |`,
      '| --- | --- | --- | --- |',
    )
    for (const f of growth(base.functions!, row.functions!, top)) {
      lines.push(`| ${round(f.other - f.base)} | ${round(f.base)} | ${round(f.other)} | \`${f.name.slice(0, 110)}\` |`)
    }
    lines.push('')
  }
  return lines.join('\n')
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      frameworks: { type: 'string', default: FRAMEWORKS.join(',') },
      requests: { type: 'string', default: '10000' },
      servers: { type: 'string' },
      keep: { type: 'string' },
      'by-function': { type: 'boolean', default: false },
      top: { type: 'string', default: '30' },
      'no-write': { type: 'boolean', default: false },
    },
  })
  if (spawnSync('valgrind', ['--version'], { stdio: 'ignore' }).status !== 0) {
    console.log('valgrind is not installed: nothing counted (Debian: apt-get install valgrind)')
    return
  }
  const frameworks = values.frameworks!.split(',') as Framework[]
  const requests = Number(values.requests)
  if (!Number.isInteger(requests) || requests < 100) throw new Error('--requests must be an integer >= 100')
  const top = Number(values.top)
  if (!Number.isInteger(top) || top < 1) throw new Error('--top must be a positive integer')
  const only = values.servers?.split(',')
  const unknown = only?.filter((id) => !SERVERS.some((s) => s.id === id))
  if (unknown?.length) throw new Error(`unknown server ${unknown.join(', ')}; known: ${SERVERS.map((s) => s.id).join(', ')}`)
  const bundles = await buildBench()
  const rows: Counted[] = []
  for (const entry of SERVERS.filter((s) => (only ? only.includes(s.id) : frameworks.includes(s.framework)))) {
    process.stdout.write(`counting ${entry.id} … `)
    const row = await count(bundles.server, entry, requests, values.keep, values['by-function'])
    rows.push(row)
    console.log(row.instructions === undefined ? `skipped: ${row.skipped}` : `${Math.round(row.instructions)} instructions/request`)
  }
  const table = render(rows, requests)
  console.log(`\n${table}`)
  if (values['by-function']) console.log(renderFunctions(rows, top))
  if (values['no-write']) return
  mkdirSync(join(ROOT, 'bench', 'results'), { recursive: true })
  writeFileSync(join(ROOT, 'bench', 'results', 'instructions.md'), `# Instructions per request\n\n${table}`)
}

main().catch((error: unknown) => {
  console.error(error)
  process.exit(1)
})
