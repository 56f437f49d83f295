/** Renders benchmark results as Markdown, with the targets of issue 5 judged in one place. */
import type { HttpRow } from './http.js'
import type { MachineInfo } from './machine.js'
import type { MicroResult } from './harness.js'
import { MICRO, type MicroReport } from './micro.js'
import { formatNs, formatRate, formatRatio, median } from './stats.js'

/** Everything one run produced. */
export interface BenchReport {
  readonly date: string
  readonly quick: boolean
  readonly machine: MachineInfo
  readonly settings: string
  readonly store: string
  readonly micro: MicroReport | undefined
  readonly http: readonly HttpRow[] | undefined
}

/** One target of issue 5 and how the run did against it. */
export interface TargetResult {
  readonly name: string
  readonly goal: string
  readonly measured: string
  readonly met: boolean | undefined
  /**
   * Not judged because the machine was not the run's alone: the rounds disagreed more than
   * {@link NOISE_LIMIT} allows (for a micro target: and the goal lay between them), an HTTP
   * ratio's rounds lay on both sides of its goal more than {@link STRADDLE_LIMIT} apart, or too
   * few of its rounds had the bare server busy {@link BUSY_LIMIT} of the time.
   */
  readonly noisy?: boolean
}

/**
 * The largest disagreement between the rounds of an HTTP ratio that still lets a run judge a
 * target: half the range of the paired ratios, as a share of their median. Past it the
 * machine was busy with something else (on a shared host, the same bare server has measured
 * 15,000 and 30,000 requests per second in one run), and the verdict would be noise.
 */
export const NOISE_LIMIT = 0.1

/**
 * The least rounds an HTTP ratio is judged on: one or two give no spread to tell noise by (one
 * round's ratio has no range at all, and would always be judged).
 */
export const MIN_JUDGED_ROUNDS = 3

/**
 * A round is judged only when the bare server of its ratio was busy at least this share of the
 * round (server CPU time ÷ wall time): less busy, it waited on the load generator, or another
 * process had its core, which caps the rows alike and pushes their ratio toward 1. The bare
 * server only: a row of ours waits on its store on the Redis and PostgreSQL store sets, which is
 * the cost being measured.
 */
export const BUSY_LIMIT = 0.95

/**
 * How far apart rounds may be when they lie on both sides of a goal: past it, a quieter round
 * or a busier one would have given the other verdict (the micro targets' rule, at half the
 * {@link NOISE_LIMIT}).
 */
export const STRADDLE_LIMIT = NOISE_LIMIT / 2

/** How busy the server was in each round of a row: CPU time ÷ wall time (`NaN` where not recorded). */
export function busyShares(row: HttpRow): number[] {
  return row.runs.map((run) => ((run as { cpuMicrosPerRequest?: number }).cpuMicrosPerRequest ?? Number.NaN) * run.requestsPerSec / 1e6)
}

/** Whether a round's busy share lets it be judged: at least {@link BUSY_LIMIT}, or not recorded. */
const busyEnough = (share: number) => !(share < BUSY_LIMIT)

/** A measurement summed up from its rounds: the median, and the least and most a round gave. */
interface Rounds {
  readonly median: number
  readonly min: number
  readonly max: number
}

/** The paired ratios of an HTTP row (see `HttpRow.pairedRatios`), summed up. */
export interface PairedSummary extends Rounds {
  /** Half the range ÷ the median. */
  readonly noise: number
}

/** Median, range and noise of a row's paired ratios; `undefined` when there are none. */
export function pairedSummary(row: HttpRow): PairedSummary | undefined {
  const ratios = row.pairedRatios
  if (!ratios || ratios.length === 0 || !ratios.every(Number.isFinite)) return undefined
  const rounds = { median: median(ratios), min: Math.min(...ratios), max: Math.max(...ratios) }
  return { ...rounds, noise: noiseOf(rounds) }
}

/** How far rounds disagree: half their range over their median (what {@link NOISE_LIMIT} bounds). */
function noiseOf(rounds: Rounds): number {
  return rounds.median > 0 ? (rounds.max - rounds.min) / 2 / rounds.median : Number.POSITIVE_INFINITY
}

/**
 * A noise as a percentage: whole past {@link NOISE_LIMIT}, unless that would round it down to
 * the limit itself (10.2 % shows as 10.2, never as the ±10 % it exceeds); with one decimal at or
 * below it (a straddle's, ±7.0 %).
 */
function percent(noise: number): string {
  const whole = Math.round(noise * 100)
  return whole <= NOISE_LIMIT * 100 ? (noise * 100).toFixed(1) : String(whole)
}

/** Version resolution counts as flat when 1,000 live versions keep this share of the 10-version rate. */
export const FLAT_THRESHOLD = 0.75

/**
 * `a ÷ b` of two micro results measured apart: their medians' quotient, and the range the rounds
 * allow (a's slowest over b's fastest to a's fastest over b's slowest).
 */
function quotient(a: MicroResult, b: MicroResult): Rounds {
  return { median: a.opsPerSec / b.opsPerSec, min: a.spread.min / b.spread.max, max: a.spread.max / b.spread.min }
}

/**
 * Judges a micro target on the median of its rounds, unless the rounds disagree by more than
 * {@link NOISE_LIMIT} (half their range over the median) and the goal lies within what they
 * measured: then a quieter round or a busier one would have given the other verdict, and the
 * target is not judged. A goal outside the range is judged however noisy the rounds (5,000×
 * `semver` against a goal of 1,000× stands whatever the spread).
 */
function roundsTarget(name: string, goal: { goal: number; text: string }, rounds: Rounds, format: (x: number) => string): TargetResult {
  const range = `${format(rounds.median)} (rounds ${format(rounds.min)}–${format(rounds.max)})`
  const noise = noiseOf(rounds)
  if (noise > NOISE_LIMIT && rounds.min < goal.goal && goal.goal <= rounds.max) {
    const spread = `±${percent(noise)} %`
    return { name, goal: goal.text, measured: `${range}: rounds disagree by ${spread}`, met: undefined, noisy: true }
  }
  return { name, goal: goal.text, measured: range, met: rounds.median >= goal.goal }
}

/** Judges the targets of issue 5 on a run. */
export function judgeTargets(report: BenchReport): TargetResult[] {
  const out: TargetResult[] = []
  // Judged on the median of the paired (round by round) ratios, on three rounds or more, without
  // those where the bare server was not busy, and only when the rounds agree and do not straddle
  // the goal.
  const ratioTarget = (name: string, id: string, goal: number) => {
    const row = report.http?.find((r) => r.entry.id === id)
    // A ratio to a bare server that failed requests is no ratio to a bare server.
    const bare = row && report.http?.find((r) => r.entry.framework === row.entry.framework && r.entry.stack === 'bare')
    const failed = row && (row.failures > 0 ? 'failed requests' : bare && bare.failures > 0 ? `failed requests (${bare.entry.label})` : undefined)
    const paired = row && !row.skipped && failed === undefined ? pairedSummary(row) : undefined
    if (!paired || !row || !bare) {
      const measured = row?.skipped ?? (row ? (failed ?? 'no bare server to compare') : 'not measured')
      out.push({ name, goal: `≥ ${goal.toFixed(2)}`, measured, met: undefined })
      return
    }
    // Near the goal, three decimals, and a miss rounded down: never printed as the goal it missed.
    const near = (x: number) => (Math.abs(x - goal) < 0.005 ? (x < goal ? Math.floor(x * 1000) / 1000 : x).toFixed(3) : formatRatio(x))
    const range = `${near(paired.median)} (rounds ${formatRatio(paired.min)}–${formatRatio(paired.max)})`
    const rounds = row.pairedRatios!.length
    if (rounds < MIN_JUDGED_ROUNDS) {
      out.push({ name, goal: `≥ ${goal.toFixed(2)}`, measured: `${range}: ${rounds} round${rounds === 1 ? '' : 's'}, too few to judge (at least ${MIN_JUDGED_ROUNDS})`, met: undefined })
      return
    }
    // Rounds where the bare server waited (on the load generator, or for its core) say nothing
    // of the servers.
    const bareBusy = busyShares(bare)
    const kept = row.pairedRatios!.filter((_, i) => busyEnough(bareBusy[i] ?? Number.NaN))
    const idle = rounds - kept.length
    if (idle > 0 && kept.length < MIN_JUDGED_ROUNDS) {
      const least = Math.min(...bareBusy.filter(Number.isFinite))
      out.push({
        name,
        goal: `≥ ${goal.toFixed(2)}`,
        measured: `${range}: the bare server busy under ${BUSY_LIMIT} of the time in ${idle} of ${rounds} rounds (down to ${least.toFixed(2)}: the load generator, or another process, had the core)`,
        met: undefined,
        noisy: true,
      })
      return
    }
    const judged = idle === 0 ? paired : pairedSummary({ ...row, pairedRatios: kept })!
    const judgedRange =
      idle === 0 ? range : `${near(judged.median)} (rounds ${formatRatio(judged.min)}–${formatRatio(judged.max)}, ${kept.length} of ${rounds}: in the others the bare server was busy under ${BUSY_LIMIT})`
    const straddles = judged.min < goal && goal <= judged.max && judged.noise > STRADDLE_LIMIT
    if (judged.noise > NOISE_LIMIT || straddles) {
      const spread = `±${percent(judged.noise)} %`
      const why = straddles && judged.noise <= NOISE_LIMIT ? `rounds on both sides of the goal, ${spread} apart` : `rounds disagree by ${spread}`
      out.push({ name, goal: `≥ ${goal.toFixed(2)}`, measured: `${judgedRange}: ${why}`, met: undefined, noisy: true })
      return
    }
    out.push({ name, goal: `≥ ${goal.toFixed(2)}`, measured: judgedRange, met: judged.median >= goal })
  }
  ratioTarget('Fastify adapter, full pipeline ÷ bare Fastify', 'fastify-dispatch', 0.9)
  ratioTarget('Web adapter on @hono/node-server ÷ bare Hono', 'hono-dispatch', 0.85)
  ratioTarget('Express adapter, full pipeline ÷ bare Express', 'express-dispatch', 0.95)

  const versions = report.micro?.versions
  const at10 = versions?.find((v) => v.liveVersions === 10)
  const at1000 = versions?.find((v) => v.liveVersions === 1000)
  if (at10 && at1000) {
    out.push(
      roundsTarget(
        'version resolution independent of the number of live versions (1,000 ÷ 10)',
        { goal: FLAT_THRESHOLD, text: `≥ ${FLAT_THRESHOLD}` },
        quotient(at1000.resolve, at10.resolve),
        formatRatio,
      ),
    )
    out.push(
      roundsTarget(
        'version resolution ÷ semver.maxSatisfying at 1,000 versions',
        { goal: 1000, text: '≥ 1,000×' },
        quotient(at1000.resolve, at1000.semver),
        (x) => `${formatRate(x)}×`,
      ),
    )
  } else {
    out.push({ name: 'version resolution flat, ≥ 1,000× semver.maxSatisfying', goal: '', measured: 'not measured', met: undefined })
  }
  const decision = report.micro?.results.find((r) => r.name === MICRO.decision)
  const decisionName = 'core decision on one core'
  if (decision) {
    const rounds = { median: decision.opsPerSec, min: decision.spread.min, max: decision.spread.max }
    out.push(roundsTarget(decisionName, { goal: 500_000, text: '≥ 500,000/s' }, rounds, (x) => `${formatRate(x)}/s`))
  } else {
    out.push({ name: decisionName, goal: '≥ 500,000/s', measured: 'not measured', met: undefined })
  }
  return out
}

/**
 * `semver.maxSatisfying` over 1,000 live versions on the machine issue 5's targets were set on,
 * in calls a second ("about 3,000 calls/s"). The same call, measured in every run, tells how fast
 * the run's machine is against that one.
 */
export const ISSUE_SEMVER_AT_1000 = 3_000

/** A run's machine against the machine of issue 5 (see {@link machineSpeed}). */
export interface MachineSpeed {
  /** `semver.maxSatisfying` at 1,000 versions, calls a second in this run. */
  readonly semverAt1000: number
  /** This machine's speed over the issue's: `semverAt1000` ÷ {@link ISSUE_SEMVER_AT_1000}. */
  readonly speed: number
  /** The core decision's median divided by `speed`: its rate at the issue machine's speed. */
  readonly decisionScaled: number | undefined
}

/**
 * How fast the run's machine ran `semver.maxSatisfying` at 1,000 versions against the issue's
 * machine, and the core decision scaled to that machine's speed. The core decision's target is
 * absolute (500,000 a second on one core), so a slow machine (a shared host on a busy day ran
 * both at a third of their usual speed, with steady rounds) misses it however fast the code is;
 * the scale says which it was. Rough (one workload's speed stands for another's), printed beside
 * the targets, never judged. `undefined` without the in-process suite.
 */
export function machineSpeed(report: BenchReport): MachineSpeed | undefined {
  const at1000 = report.micro?.versions.find((v) => v.liveVersions === 1000)
  if (!at1000 || !(at1000.semver.opsPerSec > 0)) return undefined
  const speed = at1000.semver.opsPerSec / ISSUE_SEMVER_AT_1000
  const decision = report.micro?.results.find((r) => r.name === MICRO.decision)
  return { semverAt1000: at1000.semver.opsPerSec, speed, decisionScaled: decision && decision.opsPerSec / speed }
}

const verdict = (t: TargetResult) => (t.noisy ? 'not judged: noisy' : t.met === undefined ? '—' : t.met ? 'met' : '**missed**')

/** Whether a target could not be judged because the machine was too noisy (such a run does not replace `latest.md`). */
export function isNoisy(report: BenchReport): boolean {
  return judgeTargets(report).some((t) => t.noisy === true)
}

/**
 * The targets a run could not judge for another reason than noise (not measured: a
 * `--frameworks` subset, a skipped server; failed requests; fewer than
 * {@link MIN_JUDGED_ROUNDS} rounds): such a run does not replace
 * `latest.md` either, which shows a run judged on every target.
 */
export function unjudgedTargets(report: BenchReport): string[] {
  return judgeTargets(report)
    .filter((t) => t.met === undefined && t.noisy !== true)
    .map((t) => t.name)
}

function pairedCell(row: HttpRow): string {
  if (row.entry.stack === 'bare') return ''
  const paired = pairedSummary(row)
  return paired ? `${formatRatio(paired.median)} (${formatRatio(paired.min)}–${formatRatio(paired.max)})` : 'n/a'
}

function busyCell(row: HttpRow): string {
  const shares = busyShares(row).filter(Number.isFinite)
  return shares.length === 0 ? 'not recorded' : `${median(shares).toFixed(2)} (least ${Math.min(...shares).toFixed(2)})`
}

function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const line = (cells: readonly string[]) => `| ${cells.join(' | ')} |`
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n')
}

/** Whether idle cores of the run's machine halt without polling first (see {@link renderReport}). */
export function haltsAtOnce(m: MachineInfo): boolean {
  return m.idle?.driver === 'haltpoll' && m.idle.haltPollNs === 0
}

/** The Markdown of a run. */
export function renderReport(report: BenchReport): string {
  const m = report.machine
  const parts: string[] = []
  parts.push(`# mcp-dispatch benchmark, ${report.date}${report.quick ? ' (quick smoke run: not a measurement)' : ''}`)
  parts.push(
    [
      `- Machine: ${m.cpuModel}, ${m.cores} cores available (nproc), ${m.memoryGiB} GiB, ${m.os}`,
      `- Node ${m.node}; load average at start ${m.loadAverage.toFixed(2)}${m.idle ? `; idle cores: cpuidle \`${m.idle.driver}\`${m.idle.haltPollNs === undefined ? '' : `, guest_halt_poll_ns ${m.idle.haltPollNs}`}` : ''}`,
      `- Processes: ${m.pinned ? `HTTP servers and the micro suite pinned to core 0, autocannon to core${m.loadCores.includes('-') ? 's' : ''} ${m.loadCores} (taskset)` : 'not pinned (no taskset or a single core)'}`,
      `- Store set: \`${report.store}\``,
      `- Settings: ${report.settings}`,
    ].join('\n'),
  )

  parts.push('## Targets (issue 5)')
  const targets = judgeTargets(report)
  parts.push(
    table(
      ['target', 'goal', 'measured', ''],
      targets.map((t) => [t.name, t.goal, t.measured, verdict(t)]),
    ),
  )
  parts.push(
    'HTTP ratios: the median of the paired ratios (this server\'s requests per second ÷ the bare ' +
      'server\'s in the same round), with the range over the rounds.',
  )
  const speed = machineSpeed(report)
  if (speed) {
    parts.push(
      `Machine speed: \`semver.maxSatisfying\` over 1,000 live versions ran ${formatRate(speed.semverAt1000)}/s here; issue 5 measured about ` +
        `${formatRate(ISSUE_SEMVER_AT_1000)}/s on the machine its targets were set on, so this machine ran it at ${speed.speed.toFixed(2)}× that speed.` +
        (speed.decisionScaled === undefined
          ? ''
          : ` At that machine's speed the core decision would run about ${formatRate(speed.decisionScaled)}/s (a rough scale, not judged: one workload's speed stands for another's).`) +
        ' The HTTP ratios need no scale: both sides of each ran on this machine.',
    )
  }
  if (haltsAtOnce(m)) {
    parts.push(
      '**Idle cores halt at once here** (a virtual machine whose `haltpoll` cpuidle driver does not poll: `guest_halt_poll_ns` 0). ' +
        'Waking the other core, as every response over loopback does when the load generator waits for it, then costs the sender a VM exit, ' +
        'and the slower of two servers pays it more often (the load generator idles more while it waits on that one), so every HTTP ratio to a bare server, ' +
        'the anchors\' too, comes out lower than the CPU cost per request alone would make it (docs/performance.md, "Virtual machines that halt idle cores").',
    )
  }
  if (targets.some((t) => t.noisy)) {
    parts.push(
      `**Noisy run.** The rounds of a measurement disagree by more than ±${NOISE_LIMIT * 100} % (for an in-process target: and on both sides of its goal; ` +
        `for an HTTP ratio also: they lie on both sides of its goal more than ±${STRADDLE_LIMIT * 100} % apart), or too few rounds kept the bare server busy ${BUSY_LIMIT} of the time. ` +
        'Those targets are not judged, and this run does not replace `latest.md` or the figures in docs/performance.md. ' +
        'Run it again on a quieter machine (where the bare servers are short of CPU in every run, on more cores: the load generator needs its own), ' +
        'or judge a change by `npm run bench:instructions`, which does not move with the load.',
    )
  }

  if (report.http) {
    parts.push('## HTTP over loopback: `POST /v1` `tools/list`, fixed result')
    const failed = report.http.some((r) => !r.skipped && r.failures > 0)
    const checkedBodies = report.http.every((r) => r.runs.every((run) => run.mismatches !== undefined))
    parts.push(
      '"ratio to bare" is the ratio of the medians; "paired ratio" the median of the ratios round by round (each round runs every server of the framework, seconds apart), which the targets are judged on, with its range. "CPU ratio to bare" is the bare server\'s CPU time ' +
        'per request divided by this server\'s: the throughput ratio a CPU-bound server would show, and the steadier ' +
        `figure when the load generator is short of CPU. "busy" is the server's CPU time over the wall time of a round (median, and the least round): a round where the bare server was below ${BUSY_LIMIT} is left out of the targets (the target says how many), so a target's median can differ from this table's paired median. ` +
        'Latencies are autocannon\'s, in whole milliseconds. ' +
        (failed
          ? 'The last column counts the responses that were not 200 with the fixed result, and the connection errors: a row with any is not judged.'
          : `Every server answered every request with 200 and the fixed result (checked before the load${checkedBodies ? ', and every response during it' : ': status during it, bodies not counted in this run'}; the last column counts anything else).`),
    )
    parts.push(
      table(
        [
          'server',
          'req/s (median)',
          'spread (min–max)',
          'p50 ms',
          'p99 ms',
          'ratio to bare',
          'paired ratio (rounds)',
          'server CPU µs / request',
          'CPU ratio to bare',
          'busy',
          'store calls / request',
          'non-2xx, other bodies + errors',
        ],
        report.http.map((r) =>
          r.skipped
            ? [r.entry.label, `skipped: ${r.skipped}`, '', '', '', '', '', '', '', '', '', '']
            : [
                r.entry.label,
                formatRate(r.requestsPerSec),
                r.spread ? `±${(r.spread.percent / 2).toFixed(1)} % (${formatRate(r.spread.min)}–${formatRate(r.spread.max)})` : '',
                r.latencyP50.toFixed(0),
                r.latencyP99.toFixed(0),
                r.ratio === undefined ? 'n/a' : formatRatio(r.ratio),
                pairedCell(r),
                r.cpuMicrosPerRequest.toFixed(1),
                r.cpuRatio === undefined ? 'n/a' : formatRatio(r.cpuRatio),
                busyCell(r),
                r.storeCallsPerRequest === undefined ? '' : r.storeCallsPerRequest.toFixed(2),
                String(r.failures),
              ],
        ),
      ),
    )
  }

  if (report.micro) {
    const micro = report.micro
    parts.push('## Core decision and its pieces (in process, one core)')
    parts.push(
      table(
        ['benchmark', 'ops/s (median)', 'time / op', 'spread'],
        micro.results.map((r) => [r.name, formatRate(r.opsPerSec), formatNs(r.nsPerOp), `±${(r.spread.percent / 2).toFixed(1)} %`]),
      ),
    )
    parts.push('## Version resolution against `semver.maxSatisfying` (same versions, same queries, same run)')
    parts.push(
      table(
        ['live versions', 'resolveVersion(parseVersionPath) ops/s', 'semver.maxSatisfying ops/s', 'ratio', 'compileVersions (once per deploy)'],
        micro.versions.map((v) => [
          v.liveVersions.toLocaleString('en-US'),
          formatRate(v.resolve.opsPerSec),
          formatRate(v.semver.opsPerSec),
          `${formatRate(v.ratio)}×`,
          formatNs(v.compile.nsPerOp),
        ]),
      ),
    )
    parts.push(`## Store round trips per request (core decision, store set \`${micro.store}\`)`)
    parts.push(
      table(
        ['store call', 'per request'],
        [
          ...Object.entries(micro.decisionRoundTrips.byMethod).map(([k, v]) => [`\`${k}\``, v.toFixed(2)]),
          ['**total**', `**${micro.decisionRoundTrips.perRequest.toFixed(2)}**`],
        ],
      ),
    )
  }
  return `${parts.join('\n\n')}\n`
}

const DOCS_START = '<!-- bench:latest:start -->'
const DOCS_END = '<!-- bench:latest:end -->'

/**
 * `text` (docs/performance.md) with the report between its "latest" markers, the report's
 * headings demoted under the page's; `undefined` when the markers are missing.
 */
export function replaceLatestSection(text: string, markdown: string): string | undefined {
  const start = text.indexOf(DOCS_START)
  const end = text.indexOf(DOCS_END)
  if (start === -1 || end < start) return undefined
  const body = markdown.replace(/^# (.*)$/m, '### $1').replace(/^## /gm, '#### ')
  return `${text.slice(0, start + DOCS_START.length)}\n\n${body}\n${text.slice(end)}`
}
