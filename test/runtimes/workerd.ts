/**
 * workerd, Cloudflare Workers' runtime (the npm package `workerd`, installed in test/runtimes),
 * started from Node for the runtime suites: `worker.ts` bundled with esbuild as a Worker bundles
 * (`mcp-dispatch` resolved to dist/, the built package), a generated config, and the port read
 * back from workerd's control channel. It listens on 127.0.0.1 only, and reaches loopback only.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Readable } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { type Plugin, build } from 'esbuild'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))

/**
 * Compatibility date of the suites' Worker: recent, so `nodejs_compat` (which the root entry needs
 * for `node:crypto`) is on without the flag (workerd's default from 2026-08-04; naming it then
 * makes workerd warn).
 */
export const COMPATIBILITY_DATE = '2026-11-01'

/**
 * The workerd binary (the npm package `@cloudflare/workerd-linux-64`, installed in test/runtimes:
 * the registry this project installs from serves no other platform's build of this version), or
 * `undefined` where none is installed.
 */
export function workerdBinary(): string | undefined {
  const binary = fileURLToPath(new URL('./node_modules/@cloudflare/workerd-linux-64/bin/workerd', import.meta.url))
  return existsSync(binary) ? binary : undefined
}

/** `mcp-dispatch` and its subpaths, resolved to the built package, as a user's bundler does. */
const builtPackage: Plugin = {
  name: 'mcp-dispatch-dist',
  setup(build) {
    const entries: Record<string, string> = { 'mcp-dispatch': 'dist/index.js', 'mcp-dispatch/web': 'dist/adapters/web/index.js' }
    build.onResolve({ filter: /^mcp-dispatch(\/.*)?$/ }, (args) => {
      const path = entries[args.path]
      return path === undefined ? { errors: [{ text: `${args.path} is not bundled into the test Worker` }] } : { path: join(ROOT, path) }
    })
  },
}

/**
 * Bundles `entry` (a module of test/runtimes, or the source of one) as a Worker: ESM, the
 * `workerd` and `worker` export conditions, Node's built-ins and `cloudflare:` modules left to the
 * runtime. Returns the code.
 */
export async function bundleWorker(entry: string | { source: string }): Promise<string> {
  const here = fileURLToPath(new URL('.', import.meta.url))
  const result = await build({
    ...(typeof entry === 'string'
      ? { entryPoints: [fileURLToPath(new URL(entry, import.meta.url))] }
      : { stdin: { contents: entry.source, resolveDir: here, sourcefile: 'worker.js' } }),
    bundle: true,
    write: false,
    format: 'esm',
    platform: 'neutral',
    target: 'es2022',
    conditions: ['workerd', 'worker', 'browser'],
    mainFields: ['browser', 'module', 'main'],
    external: ['node:*', 'cloudflare:*'],
    plugins: [builtPackage],
    logLevel: 'silent',
  })
  return result.outputFiles[0]!.text
}

/** Options of {@link startWorkerd}. */
export interface WorkerdOptions {
  /** The bundled Worker (an ES module). */
  code: string
  /** Text bindings (`env`). */
  bindings?: Record<string, string>
  compatibilityDate?: string
  compatibilityFlags?: readonly string[]
  /** The port on 127.0.0.1; an ephemeral one by default. */
  port?: number
}

/** A running workerd. */
export interface Workerd {
  readonly port: number
  /** What workerd wrote on stderr and stdout so far. */
  output(): string
  /** Stops workerd (SIGKILL) and removes its config. */
  stop(): Promise<void>
}

/** A capnp text literal (JSON's escapes are capnp's for these). */
const text = (value: string) => JSON.stringify(value)

/**
 * Starts workerd serving `code` on 127.0.0.1 (at `port`, or an ephemeral port; read back from
 * its control channel); its outbound `fetch` reaches loopback addresses only. Rejects with
 * workerd's output when it exits or does not listen within 20 s.
 */
export async function startWorkerd(options: WorkerdOptions): Promise<Workerd> {
  const binary = workerdBinary()
  if (binary === undefined) throw new Error('workerd is not installed (npm ci --prefix test/runtimes)')
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-workerd-'))
  writeFileSync(join(dir, 'worker.js'), options.code)
  const bindings = Object.entries(options.bindings ?? {}).map(([name, value]) => `(name = ${text(name)}, text = ${text(value)})`)
  writeFileSync(
    join(dir, 'config.capnp'),
    `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    (name = "loopback", network = (allow = ["local"])),
  ],
  sockets = [(name = "http", address = "127.0.0.1:${options.port ?? 0}", http = (), service = "main")],
);
const worker :Workerd.Worker = (
  modules = [(name = "worker.js", esModule = embed "worker.js")],
  compatibilityDate = ${text(options.compatibilityDate ?? COMPATIBILITY_DATE)},
  compatibilityFlags = [${(options.compatibilityFlags ?? []).map(text).join(', ')}],
  bindings = [${bindings.join(', ')}],
  globalOutbound = "loopback",
);
`,
  )
  let output = ''
  const child: ChildProcess = spawn(binary, ['serve', join(dir, 'config.capnp'), '--control-fd=3'], {
    cwd: dir,
    stdio: ['ignore', 'pipe', 'pipe', 'pipe'],
  })
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()))
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()))
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve))
      child.kill('SIGKILL')
      await exited
    }
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    const port = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`workerd did not listen within 20 s: ${output}`)), 20_000)
      let control = ''
      // One JSON line per event: `{"event":"listen","socket":"http","port":…}` once it listens.
      ;(child.stdio[3] as Readable).on('data', (chunk: Buffer) => {
        const lines = (control + chunk.toString()).split('\n')
        control = lines.pop()!
        for (const line of lines) {
          if (!line.startsWith('{')) continue
          const event = JSON.parse(line) as { event?: string; socket?: string; port?: number }
          if (event.event === 'listen' && event.socket === 'http' && typeof event.port === 'number') {
            clearTimeout(timer)
            resolve(event.port)
          }
        }
      })
      child.on('exit', (code) => {
        clearTimeout(timer)
        reject(new Error(`workerd exited (${code}): ${output}`))
      })
    })
    return { port, output: () => output, stop }
  } catch (error) {
    await stop()
    throw error
  }
}
