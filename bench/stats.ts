/**
 * Small statistics for benchmark rounds: medians and spreads, nothing fancier. A benchmark
 * reports the median of its rounds and the spread (min to max, and as a percentage of the
 * median) so a reader can tell a real difference from noise.
 */

/** Median of a non-empty list (mean of the two middle values for an even count). */
export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Spread of a set of rounds: min, max and (max - min) / median in percent. */
export interface Spread {
  readonly min: number
  readonly max: number
  /** (max - min) / median × 100. */
  readonly percent: number
}

/** Computes the {@link Spread} of a non-empty list. */
export function spreadOf(values: readonly number[]): Spread {
  const min = Math.min(...values)
  const max = Math.max(...values)
  const mid = median(values)
  return { min, max, percent: mid === 0 ? 0 : ((max - min) / mid) * 100 }
}

/**
 * Ratios of two series measured in the same rounds, round by round (`a[i] / b[i]`): a paired
 * comparison, so drift of a shared machine between rounds cancels out of each ratio.
 */
export function pairedRatios(a: readonly number[], b: readonly number[]): number[] {
  const n = Math.min(a.length, b.length)
  const out: number[] = []
  for (let i = 0; i < n; i++) out.push(a[i]! / b[i]!)
  return out
}

/** Formats an operations-per-second figure with thousands separators, 3 significant digits. */
export function formatRate(value: number): string {
  if (!Number.isFinite(value)) return 'n/a'
  const digits = value >= 100 ? 0 : value >= 10 ? 1 : 2
  const rounded = Number(value.toPrecision(3))
  return rounded.toLocaleString('en-US', { maximumFractionDigits: digits })
}

/** Formats a ratio to two decimals (`0.93`), or the ratio itself when large (`2,180×`). */
export function formatRatio(value: number): string {
  if (!Number.isFinite(value)) return 'n/a'
  return value >= 100 ? `${formatRate(value)}×` : value.toFixed(2)
}

/** Formats nanoseconds as ns or µs. */
export function formatNs(ns: number): string {
  if (!Number.isFinite(ns)) return 'n/a'
  return ns >= 10_000 ? `${(ns / 1000).toFixed(1)} µs` : `${ns.toFixed(ns >= 100 ? 0 : 1)} ns`
}
