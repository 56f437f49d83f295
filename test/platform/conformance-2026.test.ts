/**
 * The official MCP conformance runner's server scenarios of MCP 2026-07-28 (its pre-release line,
 * `@modelcontextprotocol/conformance` 0.2.0-alpha, installed as `conformance-next` by
 * `npm ci --prefix test/conformance`) against the reference platform, through the dispatch
 * layer: the Apps answer 2026-07-28 requests with the SDK v2 server of examples/platform
 * (tools, resources, prompts, completion, `Mcp-Param-*` headers, multi-round-trip input),
 * beside their 2025-era SDK v1 server (test/platform/conformance.test.ts).
 *
 * As in that test, the runner reaches the platform through a forwarder that adds the API token
 * and the App's host. One scenario keeps failing checks, named below with the checks it
 * may fail; any other failing check fails this test.
 */
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import {
  type ConformanceRun,
  type Forwarder,
  RUNNER_NEXT,
  conformanceAvailable,
  failures,
  runConformance,
  startForwarder,
} from '../helpers/conformance.js'
import { type ServedPlatform, createTestPlatform, servePlatform } from '../helpers/platform.js'

const installed = conformanceAvailable('conformance 2026-07-28 (platform)')

const RUN_TIMEOUT_MS = 120_000

describe.skipIf(!installed)('the conformance runner’s MCP 2026-07-28 server scenarios through the reference platform', () => {
  let platform: Platform
  let served: ServedPlatform
  let forwarder: Forwarder
  let errors: Array<{ error: unknown; context: string }>
  let outputRoot: string
  let run: ConformanceRun

  beforeAll(async () => {
    let token: (name: string) => string
    ;({ platform, errors, token } = createTestPlatform())
    served = await servePlatform(platform)
    forwarder = await startForwarder({ port: served.port, host: `weather.localhost:${served.port}`, authorization: `Bearer ${token('alice')}` })
    outputRoot = await mkdtemp(join(tmpdir(), 'mcp-conformance-platform-2026-'))
    run = await runConformance({
      url: `http://127.0.0.1:${forwarder.port}/v1`,
      runner: RUNNER_NEXT,
      specVersion: '2026-07-28',
      outputDir: outputRoot,
      timeoutMs: RUN_TIMEOUT_MS,
    })
  }, RUN_TIMEOUT_MS + 10_000)

  afterAll(async () => {
    await forwarder?.close()
    await served?.close()
    await platform?.close()
    if (outputRoot) await rm(outputRoot, { recursive: true, force: true })
  })

  it('ran the 2026-07-28 server scenarios, multi-round-trip and request headers among them', () => {
    const names = [...run.scenarios.keys()]
    expect(names.length, run.output.slice(-4_000)).toBeGreaterThanOrEqual(35)
    for (const name of ['server-stateless', 'http-header-validation', 'http-custom-header-server-validation', 'input-required-result-multi-round', 'input-required-result-tampered-state', 'tools-call-with-progress']) {
      expect(names).toContain(name)
    }
  })

  // dns-rebinding-protection included: the forwarder rewrites `Host` but passes `Origin` on,
  // and the platform refuses an Origin that is neither loopback nor its own domain (403).
  it('no check fails: every scenario passes in full', () => {
    const failed: string[] = []
    for (const [scenario, checks] of run.scenarios) {
      expect(checks.length, `${scenario} wrote no checks`).toBeGreaterThan(0)
      for (const check of checks.filter((c) => c.status === 'FAILURE')) failed.push(`${scenario}: ${failures([check])[0]}`)
    }
    expect(failed).toEqual([])
  })

  // The SHOULDs the runner reports as warnings: the list-changed notifications on a
  // `subscriptions/listen` stream, through the suite's hooks (test_trigger_tool_change and
  // test_trigger_prompt_change).
  it('no check of server-stateless warns: list changes reach the listen streams that asked for them', () => {
    const checks = run.scenarios.get('server-stateless') ?? []
    for (const id of ['sep-2575-server-sends-tools-list-changed-on-subscription', 'sep-2575-server-sends-prompts-list-changed-on-subscription', 'sep-2575-server-honors-notification-filter']) {
      expect(checks.find((c) => c.id === id)?.status, id).toBe('SUCCESS')
    }
    expect(checks.filter((c) => c.status === 'WARNING').map((c) => `${c.id}: ${c.errorMessage ?? ''}`)).toEqual([])
  })

  it('the platform reported no errors', () => {
    expect(errors).toEqual([])
  })
})
