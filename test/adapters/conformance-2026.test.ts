/**
 * The official MCP conformance runner's scenarios of MCP 2026-07-28 (its pre-release line,
 * `@modelcontextprotocol/conformance` 0.2.0-alpha, installed as `conformance-next` by
 * `npm ci --prefix test/conformance`) against a strict 2026-07-28 App (SDK v2, see
 * `mcp-2026.ts`): directly, and through the dispatch layer, once as the Web adapter with the
 * proxy handler in front of the App on its own port, once as the Fastify adapter serving the App
 * in process. The request metadata scenarios (SEP-2243: `Mcp-Method`, `Mcp-Name`,
 * `Mcp-Param-*`) pass in full both ways, and no check of any scenario gets another verdict
 * through the dispatch layer than directly: it is transparent to that revision.
 *
 * The runner's client sends no `Authorization` header and Apps live at `{slug}.localhost`, so
 * it reaches the dispatch layer through the forwarder of the 2025 conformance test, which adds both.
 */
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { generateKeyPair } from 'jose'
import { createProxyHandler } from 'mcp-dispatch/proxy'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  type ConformanceCheck,
  type Forwarder,
  RUNNER_NEXT,
  conformanceAvailable,
  runConformance,
  startForwarder,
} from '../helpers/conformance.js'
import { type ServedFetch, serveFetch } from '../helpers/platform.js'
import { HOST, type Served, createFixture, serveWebHandler } from './helpers.js'
import { MODERN, createModernApp } from './mcp-2026.js'

const installed = conformanceAvailable('conformance 2026-07-28')

/** Scenarios of 2026-07-28 about the transport, which a dispatch layer could break. */
const SCENARIOS = ['http-header-validation', 'http-custom-header-server-validation', 'server-stateless', 'caching', 'sep-2164-resource-not-found']
/** The request metadata scenarios: every check passes with this App. */
const HEADER_SCENARIOS = ['http-header-validation', 'http-custom-header-server-validation']
const RUN_TIMEOUT_MS = 60_000

/** Each scenario's checks as `id: status` lines, sorted (a check id may repeat). */
type Verdicts = Map<string, string[]>

function verdicts(checks: ConformanceCheck[]): string[] {
  return checks.map((c) => `${c.id}: ${c.status}`).sort()
}

describe.skipIf(!installed)('the conformance runner’s MCP 2026-07-28 scenarios, directly and through the dispatch layer', () => {
  let app: ServedFetch
  const targets: Served[] = []
  const forwarders: Forwarder[] = []
  let outputRoot: string
  const results = new Map<string, Verdicts>()
  let fixtureErrors: unknown[] = []

  /** Runs every scenario against `url`, one at a time. */
  async function runAll(name: string, url: string): Promise<void> {
    const found: Verdicts = new Map()
    for (const scenario of SCENARIOS) {
      const run = await runConformance({
        url,
        runner: RUNNER_NEXT,
        scenario,
        specVersion: MODERN,
        outputDir: join(outputRoot, `${name}-${scenario}`),
        timeoutMs: RUN_TIMEOUT_MS,
      })
      found.set(scenario, verdicts(run.scenarios.get(scenario) ?? []))
    }
    results.set(name, found)
  }

  beforeAll(async () => {
    outputRoot = await mkdtemp(join(tmpdir(), 'mcp-conformance-2026-'))
    const upstream = createModernApp('1.0.0')
    app = await serveFetch((request) => upstream.fetch(request))
    const fixture = createFixture()
    fixtureErrors = fixture.errors
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    const upstreamUrl = `http://127.0.0.1:${app.port}/mcp`
    const proxy = createProxyHandler({
      upstream: { '1.0.0': upstreamUrl, '2.0.0': upstreamUrl },
      appId: 'app_weather',
      identity: { issuer: 'https://platform.test', privateKey },
    })
    const inProcess = createModernApp('1.0.0')
    const proxied = await serveWebHandler('web', fixture, proxy)
    const fastify = await serveWebHandler('fastify', fixture, (request) => inProcess.fetch(request))
    targets.push(proxied, fastify)
    for (const target of [proxied, fastify]) {
      forwarders.push(await startForwarder({ port: target.port, host: `${HOST}:${target.port}`, authorization: `Bearer ${fixture.tokens.alice}` }))
    }
    await runAll('direct', upstreamUrl)
    await runAll('web + proxy', `http://127.0.0.1:${forwarders[0]!.port}/v1`)
    await runAll('fastify, in process', `http://127.0.0.1:${forwarders[1]!.port}/v1`)
  }, 3 * SCENARIOS.length * RUN_TIMEOUT_MS)

  afterAll(async () => {
    for (const forwarder of forwarders) await forwarder.close()
    for (const target of targets) await target.close()
    await app?.close()
    if (outputRoot) await rm(outputRoot, { recursive: true, force: true })
  })

  it.each(SCENARIOS)('%s ran directly and wrote checks', (scenario) => {
    expect(results.get('direct')!.get(scenario)!.length, scenario).toBeGreaterThan(0)
  })

  it.each(HEADER_SCENARIOS)('%s: every check passes directly', (scenario) => {
    const direct = results.get('direct')!.get(scenario)!
    expect(direct.filter((line) => !line.endsWith(': SUCCESS'))).toEqual([])
  })

  describe.each(['web + proxy', 'fastify, in process'])('%s', (name) => {
    it.each(SCENARIOS)('%s: every check has the verdict it has directly', (scenario) => {
      expect(results.get(name)!.get(scenario)).toEqual(results.get('direct')!.get(scenario))
    })
  })

  it('the dispatch layer reported no errors', () => {
    expect(fixtureErrors).toEqual([])
  })
})
