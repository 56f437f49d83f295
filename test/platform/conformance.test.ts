/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
 * test/conformance/package.json) against the reference platform: every server scenario, through
 * the dispatch layer (API token, subscription, version routing, sessions) to the App's MCP
 * server, at several versioned URLs. No check may fail.
 *
 * The runner's client cannot send an `Authorization` header, and Apps live at
 * `{slug}.localhost`, so it talks to a forwarder on 127.0.0.1 that adds both. That rewrites
 * `Host`, so `dns-rebinding-protection` also runs directly against the platform.
 *
 * Install the runner and the Node 22 it needs with `npm ci --prefix test/conformance` (or
 * `npm run conformance`). Without it the suite is skipped, except under `.ci/run`
 * (`MCP_DISPATCH_CI=1`), where it fails.
 */
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import {
  type ConformanceRun,
  type Forwarder,
  conformanceAvailable,
  failures,
  runConformance,
  startForwarder,
} from '../helpers/conformance.js'
import { type ServedPlatform, createTestPlatform, servePlatform } from '../helpers/platform.js'

const installed = conformanceAvailable('conformance')

/** Every server scenario of runner 0.1.16 (`--suite all`: the active ones and the pending ones). */
const SCENARIOS = [
  'completion-complete',
  'dns-rebinding-protection',
  'elicitation-sep1034-defaults',
  'elicitation-sep1330-enums',
  'json-schema-2020-12',
  'logging-set-level',
  'ping',
  'prompts-get-embedded-resource',
  'prompts-get-simple',
  'prompts-get-with-args',
  'prompts-get-with-image',
  'prompts-list',
  'resources-list',
  'resources-read-binary',
  'resources-read-text',
  'resources-subscribe',
  'resources-templates-read',
  'resources-unsubscribe',
  'server-initialize',
  'server-sse-multiple-streams',
  'server-sse-polling',
  'tools-call-audio',
  'tools-call-elicitation',
  'tools-call-embedded-resource',
  'tools-call-error',
  'tools-call-image',
  'tools-call-mixed-content',
  'tools-call-sampling',
  'tools-call-simple-text',
  'tools-call-with-logging',
  'tools-call-with-progress',
  'tools-list',
]
const DNS_REBINDING = 'dns-rebinding-protection'
/** The App's MCP endpoint at its latest version, a major line, and one exact version. */
const PATHS = ['/', '/v1', '/v1.0.0']
/** Bound of one run of the runner (a full suite takes a few seconds; far more on a loaded host). */
const RUN_TIMEOUT_MS = 90_000

describe.skipIf(!installed)('the official MCP conformance suite through the reference platform', () => {
  let platform: Platform
  let served: ServedPlatform
  let forwarder: Forwarder
  let errors: Array<{ error: unknown; context: string }>
  let outputRoot: string
  const forwarded = new Map<string, ConformanceRun>()
  let direct: ConformanceRun

  beforeAll(async () => {
    let token: (name: string) => string
    ;({ platform, errors, token } = createTestPlatform())
    served = await servePlatform(platform)
    forwarder = await startForwarder({
      port: served.port,
      host: `weather.localhost:${served.port}`,
      authorization: `Bearer ${token('alice')}`,
    })
    outputRoot = await mkdtemp(join(tmpdir(), 'mcp-conformance-'))
    // One run at a time: some checks wait on timers, which a loaded machine would stretch.
    for (const [i, path] of PATHS.entries()) {
      const url = `http://127.0.0.1:${forwarder.port}${path}`
      forwarded.set(path, await runConformance({ url, outputDir: join(outputRoot, `forwarded-${i}`), timeoutMs: RUN_TIMEOUT_MS }))
    }
    direct = await runConformance({
      url: `http://127.0.0.1:${served.port}/v1`,
      scenario: DNS_REBINDING,
      outputDir: join(outputRoot, 'direct'),
      timeoutMs: RUN_TIMEOUT_MS,
    })
  }, PATHS.length * RUN_TIMEOUT_MS + RUN_TIMEOUT_MS + 10_000)

  afterAll(async () => {
    await forwarder?.close()
    await served?.close()
    await platform?.close()
    if (outputRoot) await rm(outputRoot, { recursive: true, force: true })
  })

  it.each(PATHS)('at %s the runner ran every server scenario', (path) => {
    const run = forwarded.get(path)!
    expect([...run.scenarios.keys()].sort(), run.output.slice(-4_000)).toEqual(SCENARIOS)
  })

  describe.each(PATHS)('through the forwarder at %s', (path) => {
    // dns-rebinding-protection included: the forwarder rewrites `Host` but passes `Origin` on,
    // and the platform refuses an Origin that is neither loopback nor its own domain (403).
    it.each(SCENARIOS)('%s: no check fails', (scenario) => {
      const checks = forwarded.get(path)!.scenarios.get(scenario) ?? []
      expect(checks.length, `${scenario} wrote no checks`).toBeGreaterThan(0)
      expect(failures(checks), `${scenario} at ${path}, failing checks`).toEqual([])
    })
  })

  it(`${DNS_REBINDING}, directly: a request with a foreign Host and Origin is refused`, () => {
    const checks = direct.scenarios.get(DNS_REBINDING) ?? []
    expect(checks.find((c) => c.id === 'localhost-host-rebinding-rejected')).toMatchObject({ status: 'SUCCESS' })
    // Not applicable: the check expects an unauthenticated server to accept `Host: 127.0.0.1`,
    // but the platform serves Apps only at `{slug}.localhost`, and only with a token; it answers
    // 404 (no App there). See docs/platform.md.
    expect(checks.find((c) => c.id === 'localhost-host-valid-accepted')).toMatchObject({ status: 'FAILURE' })
    expect(checks).toHaveLength(2)
  })

  it('the platform reported no errors', () => {
    expect(errors).toEqual([])
  })
})
