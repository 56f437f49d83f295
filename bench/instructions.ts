/**
 * Instructions per request of each HTTP benchmark server, counted by callgrind: a figure
 * that does not move with the machine's load, unlike requests per second. `npm run bench` is
 * what the targets are judged on; this is how a change to the hot path is judged on a noisy
 * machine, and its ratios (bare ÷ this) track the throughput ratios closely.
 *
 *   npm run bench:instructions [-- --frameworks fastify,express,hono --requests 10000]
 *   npm run bench:instructions -- --servers express-bare,express-dispatch --keep /tmp/cg --no-write
 *
 * Each server runs under `valgrind --tool=callgrind --separate-threads=yes` (its main
 * thread is counted; V8's background compiler and GC threads are not). The server is loaded
 * three times on fresh connections first, so that the JIT has settled on the code every
 * request takes (new connections alone make V8 recompile Node's stream code once), then the
 * counters are zeroed, a fixed number of requests is sent, and the counters are dumped.
 * Kernel work (socket writes) is not counted.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { ROOT, buildBench } from './build.js'
import { loadFixed } from './fixed-load.js'
import { exited, isMessage, nextMessage } from './processes.js'
import { FRAMEWORKS, type Framework, SERVERS, type ServerEntry, type ServerMessage } from './servers/catalog.js'

type Listening = Extract<ServerMessage, { type: 'listening' }>
type Unavailable = Extract<ServerMessage, { type: 'unavailable' }>

interface Counted {
  readonly entry: ServerEntry
  readonly instructions?: number
  readonly failures?: number
  readonly skipped?: string
}

function load(port: number, token: string, hostname: string, amount: number) {
  return loadFixed(port, token, hostname, amount, 8)
}

/**
 * Counts one server. With `keep`, its callgrind dump of the measured requests is copied to
 * `<keep>/<server id>.callgrind` (for `callgrind_annotate`; JIT-compiled JavaScript shows as
 * unnamed addresses, V8 builtins and Node's C++ by name).
 */
async function count(serverBundle: string, entry: ServerEntry, requests: number, keep?: string): Promise<Counted> {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-callgrind-'))
  const child: ChildProcess = spawn(
    'valgrind',
    ['--tool=callgrind', '--separate-threads=yes', `--callgrind-out-file=${join(dir, 'out')}`, process.execPath, serverBundle, entry.id],
    { stdio: ['ignore', 'ignore', 'ignore', 'ipc'] },
  )
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
    const total = file ? /^(?:summary|totals): (\d+)/m.exec(readFileSync(join(dir, file), 'utf8'))?.[1] : undefined
    if (total === undefined) return { entry, skipped: 'no callgrind dump was written' }
    if (keep !== undefined) {
      mkdirSync(keep, { recursive: true })
      copyFileSync(join(dir, file!), join(keep, `${entry.id}.callgrind`))
    }
    return {
      entry,
      instructions: Number(total) / result.requests.total,
      failures: result.non2xx + result.errors + result.timeouts,
    }
  } catch (error) {
    return { entry, skipped: (error as Error).message }
  } finally {
    child.kill()
    rmSync(dir, { recursive: true, force: true })
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

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      frameworks: { type: 'string', default: FRAMEWORKS.join(',') },
      requests: { type: 'string', default: '10000' },
      servers: { type: 'string' },
      keep: { type: 'string' },
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
  const only = values.servers?.split(',')
  const unknown = only?.filter((id) => !SERVERS.some((s) => s.id === id))
  if (unknown?.length) throw new Error(`unknown server ${unknown.join(', ')}; known: ${SERVERS.map((s) => s.id).join(', ')}`)
  const bundles = await buildBench()
  const rows: Counted[] = []
  for (const entry of SERVERS.filter((s) => (only ? only.includes(s.id) : frameworks.includes(s.framework)))) {
    process.stdout.write(`counting ${entry.id} … `)
    const row = await count(bundles.server, entry, requests, values.keep)
    rows.push(row)
    console.log(row.instructions === undefined ? `skipped: ${row.skipped}` : `${Math.round(row.instructions)} instructions/request`)
  }
  const table = render(rows, requests)
  console.log(`\n${table}`)
  if (values['no-write']) return
  mkdirSync(join(ROOT, 'bench', 'results'), { recursive: true })
  writeFileSync(join(ROOT, 'bench', 'results', 'instructions.md'), `# Instructions per request\n\n${table}`)
}

main().catch((error: unknown) => {
  console.error(error)
  process.exit(1)
})
