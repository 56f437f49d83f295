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
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { underProjectCI } from './ci.js'

const PREFIX = fileURLToPath(new URL('../conformance/', import.meta.url))
/** The runner imports `fs.globSync`, which Node 20 lacks: it runs on the `node@22` package's binary. */
export const NODE_22 = join(PREFIX, 'node_modules/node/bin/node')
export const RUNNER = join(PREFIX, 'node_modules/@modelcontextprotocol/conformance/dist/index.js')
/**
 * The runner's pre-release line (0.2.0-alpha), which has the scenarios of MCP 2026-07-28;
 * installed beside the stable one as `conformance-next`.
 */
export const RUNNER_NEXT = join(PREFIX, 'node_modules/@modelcontextprotocol/conformance-next/dist/index.js')
/**
 * The MCP Inspector 2.x's CLI (`mcp-inspector --cli`, run here as its own entry point), which
 * asks for Node 22.19 or later: installed beside the runners, run on {@link NODE_22}
 * (test/platform/third-party-clients.test.ts; the root package has the 1.x line, for Node 20).
 */
export const INSPECTOR_2_CLI = join(PREFIX, 'node_modules/@modelcontextprotocol/inspector/clients/cli/build/index.js')
export const INSTALL_COMMAND = 'npm ci --prefix test/conformance'

/** `true` when the nested package of test/conformance is installed (both runners and Node 22). */
export function conformanceInstalled(): boolean {
  return existsSync(NODE_22) && existsSync(RUNNER) && existsSync(RUNNER_NEXT)
}

/**
 * Whether a conformance suite can run: `true` when the runners are installed. Otherwise it
 * throws under `.ci/run` (`MCP_DISPATCH_CI=1`) (the suite must fail there, not skip), or warns, naming `suite`, and
 * returns `false` (the suite is skipped on a machine without them).
 */
export function conformanceAvailable(suite: string): boolean {
  return conformanceInstalled() || missing(suite, 'the MCP conformance runners are')
}

/**
 * Whether the MCP Inspector 2.x's CLI ({@link INSPECTOR_2_CLI}) can run on {@link NODE_22}:
 * otherwise as {@link conformanceAvailable} (an install of test/conformance made before the
 * Inspector was added to it has the runners, not the Inspector).
 */
export function inspector2Available(suite: string): boolean {
  return (existsSync(NODE_22) && existsSync(INSPECTOR_2_CLI)) || missing(suite, 'the MCP Inspector 2.x or Node 22 is')
}

/** Throws under `.ci/run`, else warns that `suite` is skipped and answers `false`. */
function missing(suite: string, what: string): false {
  const message = `${what} not installed: run \`${INSTALL_COMMAND}\``
  if (underProjectCI()) throw new Error(`${message} (under .ci/run, MCP_DISPATCH_CI, so this suite fails instead of skipping)`)
  console.warn(`[${suite}] ${message}; suite skipped`)
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
  const output = await runRunner(args, options.timeoutMs, options.url)
  return { scenarios: await readChecks(options.outputDir), output }
}

/**
 * Runs a runner (`args[0]`) on Node 22 until it exits, and answers what it printed; kills it
 * and rejects past `timeoutMs`. `watch` sees the output so far after each chunk of stdout.
 */
async function runRunner(args: string[], timeoutMs: number, target: string, watch?: (output: string) => void): Promise<string> {
  // The runner starts no Node of its own, so nothing meant for the test's Node 20 reaches it.
  const { NODE_OPTIONS: _ignored, ...env } = process.env
  const child = spawn(NODE_22, args, { env, stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout.on('data', (chunk: Buffer) => {
    output += chunk.toString()
    watch?.(output)
  })
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()))
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`the conformance runner overran ${timeoutMs} ms on ${target}:\n${output.slice(-4_000)}`))
    }, timeoutMs)
    child.on('error', (error) => {
      clearTimeout(timer)
      reject(error)
    })
    child.on('exit', () => {
      clearTimeout(timer)
      resolve()
    })
  })
  return output
}

/**
 * Reads `<dir>/<kind>-<scenario>-<ISO time with - for : and .>/checks.json` of every scenario
 * (`kind`: `server` for the server command, `authorization-server` for the authorization one).
 */
async function readChecks(dir: string, kind = 'server'): Promise<Map<string, ConformanceCheck[]>> {
  const scenarios = new Map<string, ConformanceCheck[]>()
  const pattern = new RegExp(`^${kind}-(.+)-\\d{4}-\\d{2}-\\d{2}T[\\d-]+Z$`)
  for (const entry of await readdir(dir)) {
    const match = pattern.exec(entry)
    if (!match) continue
    scenarios.set(match[1]!, JSON.parse(await readFile(join(dir, entry, 'checks.json'), 'utf8')) as ConformanceCheck[])
  }
  return scenarios
}

/** Options of {@link runAuthorizationConformance}. */
export interface RunAuthorizationConformanceOptions {
  /** The authorization server's issuer. */
  issuer: string
  /** A client registered with the redirect URI `http://127.0.0.1:{callbackPort}/callback`. */
  clientId: string
  /** A free loopback port for the runner's callback server. */
  callbackPort: number
  /** `--resource` (RFC 8707), when the tokens are for an MCP server. */
  resource?: string
  /**
   * Plays the browser: given the authorization URL the runner prints, signs in and answers
   * the URL the server redirects back to (the runner's callback), which is then fetched.
   */
  signIn(authorizationUrl: string): Promise<URL>
  outputDir: string
  timeoutMs: number
}

/**
 * Runs the pre-release runner's authorization-server scenarios (`conformance authorization`)
 * against an issuer: its metadata, and an authorization code grant the runner starts and waits
 * for (it prints the URL for a browser and listens for the callback on `callbackPort`).
 */
export async function runAuthorizationConformance(options: RunAuthorizationConformanceOptions): Promise<ConformanceRun> {
  const args = [
    RUNNER_NEXT,
    'authorization',
    '--url',
    options.issuer,
    '--client-id',
    options.clientId,
    '--port',
    String(options.callbackPort),
    ...(options.resource ? ['--resource', options.resource] : []),
    '-o',
    options.outputDir,
  ]
  let browser: Promise<void> | undefined
  let browserError = ''
  const authorizeAt = `${options.issuer}/auth?`
  const output = await runRunner(args, options.timeoutMs, options.issuer, (sofar) => {
    const line = sofar.split('\n').find((l) => l.startsWith(authorizeAt))
    // Once the runner listens for the callback (it prints that after the URL).
    if (browser === undefined && line !== undefined && sofar.includes('Callback server started')) {
      browser = options.signIn(line.trim()).then(
        async (callback) => void (await fetch(callback)).body?.cancel(),
        (error: unknown) => void (browserError = `\n[browser] ${String(error)}\n`),
      )
    }
  })
  await browser
  return { scenarios: await readChecks(options.outputDir, 'authorization-server'), output: output + browserError }
}

/** The checks of a scenario that failed, one line each: `id: message`. */
export function failures(checks: readonly ConformanceCheck[]): string[] {
  return checks.filter((c) => c.status === 'FAILURE').map((c) => `${c.id}: ${c.errorMessage ?? c.description}`)
}

// The forwarder is the reference platform's (`npm run forward`), so the tests run the code users run.
export { type Forwarder, startForwarder } from '../../examples/platform/forwarder.js'
