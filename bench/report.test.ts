import { describe, expect, it } from 'vitest'
import type { HttpRow } from './http.js'
import { type BenchReport, NOISE_LIMIT, isNoisy, judgeTargets, renderReport } from './report.js'
import { SERVERS } from './servers/catalog.js'
import { median, pairedRatios, spreadOf } from './stats.js'

/** A row as `runHttp` builds it, from the requests per second of each round. */
function row(id: string, rounds: readonly number[], bareRounds: readonly number[]): HttpRow {
  const entry = SERVERS.find((s) => s.id === id)!
  return {
    entry,
    runs: rounds.map((requestsPerSec) => ({
      requestsPerSec,
      total: requestsPerSec * 10,
      latencyP50: 2,
      latencyP99: 4,
      non2xx: 0,
      errors: 0,
      timeouts: 0,
      statusCodes: { 200: requestsPerSec * 10 },
      cpuMicrosPerRequest: 1e6 / requestsPerSec,
    })),
    requestsPerSec: median(rounds),
    spread: spreadOf(rounds),
    latencyP50: 2,
    latencyP99: 4,
    ratio: median(rounds) / median(bareRounds),
    pairedRatios: pairedRatios(rounds, bareRounds),
    cpuMicrosPerRequest: 1e6 / median(rounds),
    cpuRatio: median(rounds) / median(bareRounds),
    storeCallsPerRequest: entry.stack === 'dispatch' ? 5 : undefined,
    failures: 0,
  }
}

function fastifyReport(bare: readonly number[], dispatch: readonly number[]): BenchReport {
  return {
    date: '2026-11-22',
    quick: false,
    machine: { cpuModel: 'test', cores: 2, node: 'v20', os: 'Linux', memoryGiB: 24, pinned: true, loadCores: '1', loadAverage: 0 },
    settings: 'HTTP 5 rounds',
    store: 'memory',
    micro: undefined,
    http: [row('fastify-bare', bare, bare), row('fastify-dispatch', dispatch, bare)],
  }
}

const fastifyTarget = (report: BenchReport) => judgeTargets(report).find((t) => t.name.startsWith('Fastify'))!

describe('bench report: HTTP targets', () => {
  it('judges a ratio on the rounds paired with the bare server, so drift between rounds cancels out', () => {
    // The machine slows down over the run; each round's servers run seconds apart.
    const bare = [40_000, 36_000, 30_000, 26_000, 22_000]
    const dispatch = bare.map((rps) => rps * 0.8)
    const report = fastifyReport(bare, dispatch)
    const target = fastifyTarget(report)
    expect(target.measured).toBe('0.80 (rounds 0.80–0.80)')
    expect(target.met).toBe(false)
    expect(target.noisy).toBeUndefined()
    expect(isNoisy(report)).toBe(false)
  })

  it('meets a target when the paired median reaches the goal', () => {
    const bare = [30_000, 31_000, 29_500, 30_500, 30_200]
    const report = fastifyReport(bare, bare.map((rps, i) => rps * [0.91, 0.93, 0.92, 0.9, 0.92][i]!))
    expect(fastifyTarget(report)).toMatchObject({ met: true, measured: '0.92 (rounds 0.90–0.93)' })
  })

  it('does not judge a run whose rounds disagree, says why, and keeps it out of latest.md', () => {
    // Rounds measured on a busy shared host (2026-11-22): the bare server from 30,400 down to
    // 15,400 requests per second, the adapter "faster" than bare in two rounds.
    const report = fastifyReport([30_413, 28_896, 19_192, 16_106, 15_448], [25_014, 23_295, 23_286, 18_625, 12_076])
    const target = fastifyTarget(report)
    expect(target.met).toBeUndefined()
    expect(target.noisy).toBe(true)
    expect(target.measured).toMatch(/^0\.82 \(rounds 0\.78–1\.21\): rounds disagree by ±\d+ %$/)
    expect(isNoisy(report)).toBe(true)
    const markdown = renderReport(report)
    expect(markdown).toContain('not judged: noisy')
    expect(markdown).toContain('**Noisy run.**')
    expect(markdown).not.toContain('| met |')
  })

  it('draws the line at NOISE_LIMIT of the paired median', () => {
    const bare = [10_000, 10_000, 10_000]
    const within = fastifyReport(bare, [8_000 * (1 - NOISE_LIMIT) + 1, 8_000, 8_000 * (1 + NOISE_LIMIT) - 1])
    const past = fastifyReport(bare, [8_000 * (1 - NOISE_LIMIT) - 10, 8_000, 8_000 * (1 + NOISE_LIMIT) + 10])
    expect(fastifyTarget(within).noisy).toBeUndefined()
    expect(fastifyTarget(past).noisy).toBe(true)
  })

  it('says why a target has no figure: adapter missing, failed requests, no bare row', () => {
    const report = fastifyReport([10_000], [9_000])
    const failing: BenchReport = { ...report, http: [report.http![0]!, { ...report.http![1]!, failures: 3 }] }
    expect(fastifyTarget(failing)).toMatchObject({ measured: 'failed requests', met: undefined })
    const alone: BenchReport = { ...report, http: [{ ...report.http![1]!, pairedRatios: undefined }] }
    expect(fastifyTarget(alone)).toMatchObject({ measured: 'no bare server to compare', met: undefined })
    const none: BenchReport = { ...report, http: [] }
    expect(fastifyTarget(none)).toMatchObject({ measured: 'not measured', met: undefined })
  })
})
