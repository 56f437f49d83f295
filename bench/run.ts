/**
 * `npm run bench`: the micro suite and the HTTP benchmarks, a Markdown report printed and
 * written to `bench/results/`. See docs/performance.md.
 *
 *   npm run bench                          # full run (about 10 minutes)
 *   npm run bench -- --quick               # smoke run: checks the harness, measures nothing
 *   npm run bench -- --only micro          # or --only http
 *   npm run bench -- --duration 20 --rounds 7 --connections 100
 *   npm run bench -- --frameworks fastify,hono --store memory
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { ROOT, buildBench } from './build.js'
import { runHttp } from './http.js'
import { describeMachine } from './machine.js'
import type { MicroReport } from './micro.js'
import { exited, isMessage, nextMessage, startNode } from './processes.js'
import { type BenchReport, isNoisy, renderReport, unjudgedTargets, replaceLatestSection } from './report.js'
import { FRAMEWORKS, type Framework } from './servers/catalog.js'
import { storeSetNames } from './stores.js'

const HELP = `usage: npm run bench -- [options]
  --quick               smoke run: short rounds, no docs update (numbers are not measurements)
  --only micro|http     run one part
  --duration <s>        seconds per measured HTTP run (default 10, quick 1)
  --rounds <n>          measured HTTP runs per server (default 5, quick 2)
  --warmup <s>          seconds of warm-up load per server (default 3, quick 0.5)
  --connections <n>     autocannon connections (default 100)
  --frameworks <list>   fastify,express,hono (default all)
  --store <name>        store set (default memory; known: ${storeSetNames().join(', ')})
  --no-write            print the report only
  --build-only          bundle the entries (for profiling) and print their paths`

function positive(name: string, value: string | undefined, fallback: number, integer = false): number {
  if (value === undefined) return fallback
  const n = Number(value)
  if (!Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n))) {
    throw new TypeError(`--${name} must be a positive ${integer ? 'whole number' : 'finite number'}, not ${JSON.stringify(value)}`)
  }
  return n
}

async function runMicroChild(bundle: string, quick: boolean, store: string): Promise<MicroReport> {
  // Its own process on core 0, like the servers: the figure is "on one core".
  const child = startNode(bundle, [...(quick ? ['--quick'] : []), '--store', store], '0')
  const message = await nextMessage(child, isMessage<{ type: 'micro'; report: MicroReport }>('micro'), 30 * 60_000)
  child.disconnect()
  await exited(child)
  return message.report
}

/** Puts the latest full report into docs/performance.md. */
function updateDocs(markdown: string): boolean {
  const file = join(ROOT, 'docs', 'performance.md')
  let text: string
  try {
    text = readFileSync(file, 'utf8')
  } catch {
    return false
  }
  const updated = replaceLatestSection(text, markdown)
  if (updated === undefined) return false
  writeFileSync(file, updated)
  return true
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      only: { type: 'string' },
      duration: { type: 'string' },
      rounds: { type: 'string' },
      warmup: { type: 'string' },
      connections: { type: 'string' },
      frameworks: { type: 'string' },
      store: { type: 'string', default: 'memory' },
      'no-write': { type: 'boolean', default: false },
      'build-only': { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  })
  if (values.help) {
    console.log(HELP)
    return
  }
  const quick = values.quick!
  const only = values.only
  if (only !== undefined && only !== 'micro' && only !== 'http') throw new Error('--only must be micro or http')
  const store = values.store!
  if (!storeSetNames().includes(store)) throw new Error(`unknown --store ${store}; known: ${storeSetNames().join(', ')}`)
  const duration = positive('duration', values.duration, quick ? 1 : 10)
  const rounds = positive('rounds', values.rounds, quick ? 2 : 5, true)
  const warmup = positive('warmup', values.warmup, quick ? 0.5 : 3)
  const connections = positive('connections', values.connections, 100, true)
  const frameworks = (values.frameworks?.split(',').map((f) => f.trim()) ?? FRAMEWORKS) as Framework[]
  for (const f of frameworks) if (!FRAMEWORKS.includes(f)) throw new Error(`unknown framework ${f}`)

  if (values['build-only']) {
    for (const [name, file] of Object.entries(await buildBench())) console.log(`${name}: ${file}`)
    return
  }
  const machine = describeMachine()
  const log = (line: string) => console.error(line)
  log(`building bench bundles…`)
  const bundles = await buildBench()

  let micro: MicroReport | undefined
  if (only !== 'http') {
    log(`micro suite${quick ? ' (quick)' : ''}…`)
    micro = await runMicroChild(bundles.micro, quick, store)
  }
  let http: BenchReport['http']
  if (only !== 'micro') {
    log(`HTTP: ${frameworks.join(', ')}; ${rounds} rounds × ${duration} s, ${connections} connections…`)
    http = await runHttp({ duration, rounds, warmup, connections, store, frameworks, bundles, log })
  }

  const date = new Date().toISOString().slice(0, 10)
  const settings = [
    only !== 'http' ? (quick ? 'micro 3 rounds × 50 ms' : 'micro 7 rounds × 300 ms after 1 s warm-up') : undefined,
    only !== 'micro'
      ? `HTTP ${rounds} rounds × ${duration} s per server, ${warmup} s warm-up, ${connections} connections, servers alternating`
      : undefined,
  ]
    .filter(Boolean)
    .join('; ')
  const report: BenchReport = { date, quick, machine, settings, store, micro, http }
  const markdown = renderReport(report)
  console.log(markdown)

  if (!values['no-write']) {
    const dir = join(ROOT, 'bench', 'results')
    mkdirSync(dir, { recursive: true })
    // Another store set is a side measurement: its own file, never the latest memory report.
    const shared = store === 'memory' ? '' : `-${store}`
    // A subset of the frameworks is a side measurement too: named by them, so the day's full run stays.
    const subset = FRAMEWORKS.every((f) => frameworks.includes(f)) ? '' : `-${frameworks.join('-')}`
    const name = quick ? `${date}${shared}-quick` : only ? `${date}${shared}-${only}` : `${date}${shared}${subset}`
    writeFileSync(join(dir, `${name}.md`), markdown)
    writeFileSync(join(dir, `${name}.json`), `${JSON.stringify(report, null, 2)}\n`)
    const written = [`bench/results/${name}.md`, `bench/results/${name}.json`]
    if (!quick && !only && store === 'memory') {
      const unjudged = unjudgedTargets(report)
      if (isNoisy(report)) {
        log('noisy run: bench/results/latest.md and docs/performance.md keep the last quiet run')
      } else if (unjudged.length > 0) {
        log(`not judged on every target (${unjudged.join('; ')}): bench/results/latest.md and docs/performance.md keep the last full run`)
      } else {
        writeFileSync(join(dir, 'latest.md'), markdown)
        written.push('bench/results/latest.md')
        if (updateDocs(markdown)) written.push('docs/performance.md')
      }
    }
    log(`written: ${written.join(', ')}`)
  }
}

main().catch((error: unknown) => {
  console.error(error)
  process.exit(1)
})
