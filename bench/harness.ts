/**
 * A small, honest micro-benchmark harness (no dependency): warm-up, calibration of a batch
 * size, several timed rounds with `process.hrtime.bigint()`, and the median and spread of
 * the rounds. A function that returns a promise is awaited on every call, so an async path
 * is measured with its real microtask cost.
 *
 * Results are kept alive in a sink, so the JIT cannot drop the work being measured.
 */
import { runInNewContext } from 'node:vm'
import { setFlagsFromString } from 'node:v8'
import { type Spread, median, spreadOf } from './stats.js'

/** How long and how often to measure. */
export interface HarnessOptions {
  /** Warm-up time before the rounds (JIT, inline caches), ms. */
  readonly warmupMs: number
  /** Number of timed rounds. */
  readonly rounds: number
  /** Target duration of one round, ms. */
  readonly roundMs: number
}

/** The result of one micro benchmark. */
export interface MicroResult {
  readonly name: string
  /** Operations per second of each round. */
  readonly rounds: readonly number[]
  /** Median of the rounds, operations per second. */
  readonly opsPerSec: number
  /** Nanoseconds per operation at the median. */
  readonly nsPerOp: number
  readonly spread: Spread
  /** Iterations per round. */
  readonly batch: number
}

let sink: unknown
/** Keeps a value reachable so the optimizer cannot remove the computation that made it. */
export function consume(value: unknown): void {
  sink = value
}
/** @internal for the harness's own self-check */
export function lastSink(): unknown {
  return sink
}

// A full GC between rounds takes the previous round's garbage out of the next round. Node
// allows turning --expose-gc on at run time; the function is then reachable from a new context.
let collect: (() => void) | undefined
try {
  setFlagsFromString('--expose-gc')
  collect = runInNewContext('gc') as () => void
} catch {
  collect = undefined
}

/** Runs a full garbage collection when the runtime allows it. */
export function collectGarbage(): void {
  collect?.()
}

type Fn = () => unknown

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return value !== null && typeof value === 'object' && typeof (value as { then?: unknown }).then === 'function'
}

type Loop = (fn: Fn, n: number, clock: () => bigint) => Promise<[bigint, unknown]> | [bigint, unknown]

/**
 * A fresh timing loop for every benchmark, compiled from source, so each loop has its own
 * inline caches: one shared loop would turn megamorphic after a few benchmarks and make the
 * later ones look slower than they are (the technique benchmark.js uses).
 */
function compileLoop(async: boolean): Loop {
  const body = async
    ? 'return (async () => { let last; const s = clock(); for (let i = 0; i < n; i++) last = await fn(); return [clock() - s, last] })()'
    : 'let last; const s = clock(); for (let i = 0; i < n; i++) last = fn(); return [clock() - s, last]'
  return new Function('fn', 'n', 'clock', body) as Loop
}

const clock = () => process.hrtime.bigint()

/** Runs `fn` `n` times through `loop` and returns the elapsed nanoseconds. */
async function timeBatch(loop: Loop, fn: Fn, n: number): Promise<number> {
  const [elapsed, last] = await loop(fn, n, clock)
  consume(last)
  return Number(elapsed)
}

/**
 * Measures `fn`. The batch size is calibrated so that one round lasts about `roundMs`.
 *
 * @example
 * ```ts
 * const r = await measure('parseApiToken', () => parseApiToken(token), { warmupMs: 500, rounds: 5, roundMs: 200 })
 * console.log(r.opsPerSec)
 * ```
 */
export async function measure(name: string, fn: Fn, options: HarnessOptions): Promise<MicroResult> {
  const first = fn()
  const async = isThenable(first)
  if (async) await first
  const loop = compileLoop(async)

  // Warm-up and calibration together: grow the batch until one batch takes a tenth of a round.
  let n = 1
  let elapsed = 0
  const warmupEnd = process.hrtime.bigint() + BigInt(Math.round(options.warmupMs * 1e6))
  for (;;) {
    elapsed = await timeBatch(loop, fn, n)
    if (elapsed < (options.roundMs * 1e6) / 10) n *= 2
    else if (process.hrtime.bigint() >= warmupEnd) break
  }
  const batch = Math.max(1, Math.round((n * options.roundMs * 1e6) / elapsed))

  const rounds: number[] = []
  for (let r = 0; r < options.rounds; r++) {
    collectGarbage()
    const ns = await timeBatch(loop, fn, batch)
    rounds.push((batch * 1e9) / ns)
  }
  const opsPerSec = median(rounds)
  return { name, rounds, opsPerSec, nsPerOp: 1e9 / opsPerSec, spread: spreadOf(rounds), batch }
}
