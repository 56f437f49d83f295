/**
 * Plumbing of the official MCP conformance suite (`@modelcontextprotocol/conformance`) against
 * the reference platform: where the runner and the Node 22 it needs are installed
 * (`npm ci --prefix test/conformance`), a forwarder that adds what the runner's client cannot
 * send (an `Authorization` header, an App's `Host`), running the runner with a time limit, and
 * reading the `checks.json` of each scenario it ran.
 */
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { readFile, readdir } from 'node:fs/promises'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const PREFIX = fileURLToPath(new URL('../conformance/', import.meta.url))
/** The runner imports `fs.globSync`, which Node 20 lacks: it runs on the `node@22` package's binary. */
export const NODE_22 = join(PREFIX, 'node_modules/node/bin/node')
export const RUNNER = join(PREFIX, 'node_modules/@modelcontextprotocol/conformance/dist/index.js')
/**
 * The runner's pre-release line (0.2.0-alpha), which has the scenarios of MCP 2026-07-28;
 * installed beside the stable one as `conformance-next`.
 */
export const RUNNER_NEXT = join(PREFIX, 'node_modules/@modelcontextprotocol/conformance-next/dist/index.js')
export const INSTALL_COMMAND = 'npm ci --prefix test/conformance'

/** `true` when the nested package of test/conformance is installed (both runners and Node 22). */
export function conformanceInstalled(): boolean {
  return existsSync(NODE_22) && existsSync(RUNNER) && existsSync(RUNNER_NEXT)
}

/**
 * Whether a conformance suite can run: `true` when the runners are installed. Otherwise it
 * throws under `CI=true` (the suite must fail there, not skip), or warns, naming `suite`, and
 * returns `false` (the suite is skipped on a machine without them).
 */
export function conformanceAvailable(suite: string): boolean {
  if (conformanceInstalled()) return true
  const missing = `the MCP conformance runners are not installed: run \`${INSTALL_COMMAND}\``
  if (process.env.CI === 'true') throw new Error(`${missing} (CI=true, so this suite fails instead of skipping)`)
  console.warn(`[${suite}] ${missing}; suite skipped`)
  return false
}

/** One check of a scenario, as the runner writes it in `checks.json`. */
export interface ConformanceCheck {
  id: string
  name: string
  description: string
  status: 'SUCCESS' | 'FAILURE' | 'WARNING' | 'INFO' | 'SKIPPED'
  errorMessage?: string
}

/**
 * A finished run of the runner: scenario name → its checks, and what the runner printed. (Its
 * exit code says only whether some check failed, which the checks say in detail.)
 */
export interface ConformanceRun {
  scenarios: Map<string, ConformanceCheck[]>
  output: string
}

export interface RunConformanceOptions {
  url: string
  /** The runner to use: {@link RUNNER} (default) or {@link RUNNER_NEXT}. */
  runner?: string
  /** `--spec-version`: the scenarios of that MCP revision (and earlier ones still in force). */
  specVersion?: string
  /** `--scenario`; without it `--suite`. */
  scenario?: string
  /** `--suite` (`active`, `all`, `pending`). Default `all`. */
  suite?: string
  /** Where the runner writes its results (one folder per scenario). */
  outputDir: string
  /** The runner is killed past this. */
  timeoutMs: number
}

/** Runs the official runner's server scenarios against `url`; rejects when it overruns. */
export async function runConformance(options: RunConformanceOptions): Promise<ConformanceRun> {
  const selection = options.scenario ? ['--scenario', options.scenario] : ['--suite', options.suite ?? 'all']
  const version = options.specVersion ? ['--spec-version', options.specVersion] : []
  const args = [options.runner ?? RUNNER, 'server', '--url', options.url, ...selection, ...version, '-o', options.outputDir]
  // The runner starts no Node of its own, so nothing meant for the test's Node 20 reaches it.
  const { NODE_OPTIONS: _ignored, ...env } = process.env
  const child = spawn(NODE_22, args, { env, stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()))
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()))
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`the conformance runner overran ${options.timeoutMs} ms on ${options.url}:\n${output.slice(-4_000)}`))
    }, options.timeoutMs)
    child.on('error', (error) => {
      clearTimeout(timer)
      reject(error)
    })
    child.on('exit', () => {
      clearTimeout(timer)
      resolve()
    })
  })
  return { scenarios: await readChecks(options.outputDir), output }
}

/** Reads `<dir>/server-<scenario>-<ISO time with - for : and .>/checks.json` of every scenario. */
async function readChecks(dir: string): Promise<Map<string, ConformanceCheck[]>> {
  const scenarios = new Map<string, ConformanceCheck[]>()
  for (const entry of await readdir(dir)) {
    const match = /^server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$/.exec(entry)
    if (!match) continue
    scenarios.set(match[1]!, JSON.parse(await readFile(join(dir, entry, 'checks.json'), 'utf8')) as ConformanceCheck[])
  }
  return scenarios
}

/** The checks of a scenario that failed, one line each: `id: message`. */
export function failures(checks: readonly ConformanceCheck[]): string[] {
  return checks.filter((c) => c.status === 'FAILURE').map((c) => `${c.id}: ${c.errorMessage ?? c.description}`)
}

/** A running forwarder. */
export interface Forwarder {
  readonly port: number
  close(): Promise<void>
}

/**
 * Serves on 127.0.0.1 and forwards every request to `127.0.0.1:{port}` with `Host` and
 * `Authorization` replaced, streaming both ways (SSE included); when the client goes away the
 * request to the platform is ended too, so the platform sees the stream cancelled.
 */
export async function startForwarder(target: { port: number; host: string; authorization: string }): Promise<Forwarder> {
  const server = http.createServer((incoming, outgoing) => {
    const headers = { ...incoming.headers, host: target.host, authorization: target.authorization }
    const upstream = http.request(
      { host: '127.0.0.1', port: target.port, method: incoming.method, path: incoming.url, headers, agent: false },
      (response) => {
        outgoing.writeHead(response.statusCode ?? 502, response.headers)
        // An SSE stream may stay silent for a while: the client needs the head now.
        outgoing.flushHeaders()
        response.pipe(outgoing)
      },
    )
    upstream.on('error', () => outgoing.destroy())
    outgoing.on('close', () => upstream.destroy())
    incoming.pipe(upstream)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}
