/**
 * Child processes of the benchmark: each server, the load generator and the micro suite run
 * in their own process on plain `node` (bundled by `build.ts`), pinned to a core with
 * `taskset` where the machine has it and at least two cores.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { availableParallelism } from 'node:os'

let tasksetUsable: boolean | undefined

/** Whether processes can be pinned: `taskset` exists and there are two cores or more. */
export function canPin(): boolean {
  if (tasksetUsable === undefined) {
    tasksetUsable =
      availableParallelism() >= 2 && spawnSync('taskset', ['-c', '0', 'true'], { stdio: 'ignore' }).status === 0
  }
  return tasksetUsable
}

/**
 * The cores of the load generator: core 1 on a two-core machine, cores 1 to 4 on a larger one
 * (autocannon then runs one worker per core), so the load generator can saturate the server.
 */
export function loadCores(): { list: string; count: number } {
  const count = Math.max(1, Math.min(availableParallelism() - 1, 4))
  return { list: count === 1 ? '1' : `1-${count}`, count }
}

/** Starts `node <file> ...args` with an IPC channel, on `cores` (`'0'`, `'1-3'`) when pinning is possible. */
export function startNode(file: string, args: readonly string[], cores: string | undefined): ChildProcess {
  const node = [process.execPath, '--enable-source-maps', file, ...args]
  const [command, ...rest] = cores !== undefined && canPin() ? ['taskset', '-c', cores, ...node] : node
  return spawn(command!, rest, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
}

/** The next IPC message of `child` that satisfies `accept`; rejects if the child exits first. */
export function nextMessage<T>(child: ChildProcess, accept: (message: unknown) => message is T, timeoutMs = 120_000): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => finish(new Error(`no answer from child process within ${timeoutMs} ms`)), timeoutMs)
    const onMessage = (message: unknown) => {
      if (accept(message)) finish(undefined, message)
    }
    const onExit = (code: number | null, signal: string | null) =>
      finish(new Error(`child process exited (${signal ?? code}) before answering`))
    function finish(error: Error | undefined, message?: T) {
      clearTimeout(timer)
      child.off('message', onMessage)
      child.off('exit', onExit)
      if (error) reject(error)
      else resolve(message as T)
    }
    child.on('message', onMessage)
    child.once('exit', onExit)
  })
}

/** Resolves when `child` has exited. */
export function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve()
  return new Promise((resolve) => child.once('exit', () => resolve()))
}

/** A type guard for IPC messages `{ type }`. */
export function isMessage<T extends { type: string }>(type: T['type']): (message: unknown) => message is T {
  return (message: unknown): message is T =>
    message !== null && typeof message === 'object' && (message as { type?: unknown }).type === type
}
