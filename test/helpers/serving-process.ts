/**
 * A server in a process of its own (Bun, Deno: `test/runtimes/web-runtimes.test.ts`,
 * `test/adapters/targets-audit.test.ts`), which prints `{ "port": … }` on a line of its stdout
 * once it listens on 127.0.0.1.
 */
import { type ChildProcess, spawn } from 'node:child_process'

/** A process serving on 127.0.0.1. */
export interface ServingProcess {
  readonly port: number
  /** What the process wrote on stderr so far. */
  output(): string
  /** Kills it (SIGKILL) and waits for its exit; nothing when it has exited already. */
  stop(): Promise<void>
}

/**
 * Spawns `command args` in `cwd` and waits (20 s at most) for the line that names its port;
 * a process that exits first, or never names one, is killed and its stderr thrown.
 */
export async function spawnServing(command: string, args: readonly string[], cwd: string): Promise<ServingProcess> {
  const child: ChildProcess = spawn(command, args, { cwd, env: { ...process.env, NO_COLOR: '1' }, stdio: ['ignore', 'pipe', 'pipe'] })
  let errors = ''
  child.stderr!.on('data', (chunk: Buffer) => (errors += chunk.toString()))
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return
    const exited = new Promise((resolve) => child.once('exit', resolve))
    child.kill('SIGKILL')
    await exited
  }
  try {
    const port = await new Promise<number>((resolve, reject) => {
      let out = ''
      const timer = setTimeout(() => reject(new Error(`${command} did not start within 20 s: ${errors}`)), 20_000)
      child.stdout!.on('data', (chunk: Buffer) => {
        out += chunk.toString()
        const line = out.split('\n').find((l) => l.startsWith('{'))
        if (line === undefined) return
        clearTimeout(timer)
        resolve((JSON.parse(line) as { port: number }).port)
      })
      child.once('exit', (code) => {
        clearTimeout(timer)
        reject(new Error(`${command} exited (${code}): ${errors}`))
      })
    })
    return { port, output: () => errors, stop }
  } catch (error) {
    await stop()
    throw error
  }
}
