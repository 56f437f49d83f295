/**
 * The token service's invalidations, published under a deadline and, when that fails, sent
 * again until they land: an instance whose own Redis connection is down while the others still
 * listen would otherwise leave them trusting the records they cached before a rotation or
 * revocation for the rest of their `cacheTtlMs` (docs/stores.md, "Invalidation across
 * instances").
 * @module
 */
import { computeBackoff } from '../auth/backoff.js'
import { MAX_TIMER_MS, withTimeout } from '../timeout.js'

/** What {@link createInvalidationSender} needs of its token service. */
export interface InvalidationSenderOptions {
  /** Publishes the invalidation of `tokenHash` on the bus (may throw instead of rejecting). */
  send(tokenHash: string): unknown
  /** Where failures and what is given up are reported (the service's `onError`). */
  report(error: unknown, context: string): void
  /**
   * Longest wait for one publish, and for one round of them (the service's `storeTimeoutMs`, or
   * its bus's `publishTimeoutMs` and a second when longer).
   */
  deadlineMs: number
  /** The clock the give-up window runs on (the service's monotonic clock, or its injected `now`). */
  now(): number
  /** Keeps the request that queued a round alive until the round's timer fires (Workers). */
  waitUntil?: ((promise: Promise<unknown>) => void) | undefined
}

/** Publishes invalidations, and sends again those that failed. */
export interface InvalidationSender {
  /**
   * Publishes the invalidation of `tokenHash`, within `deadlineMs`; never rejects. A failure
   * is reported (`invalidation publish`) and the invalidation queued to be sent again.
   */
  publish(tokenHash: string): Promise<void>
  /**
   * The bus can be reached again (its connection is back): what waits is sent now, in a round
   * of its own, and the backoff starts over; while a round runs, as soon as it ends, if it left
   * some unsent. Nothing to send, or closed: does nothing.
   */
  resend(): void
  /**
   * Stops the rounds; what is still queued gets one last try within `deadlineMs`, and what
   * that cannot send is reported. Idempotent: later calls return the first one's promise.
   */
  close(): Promise<void>
}

/** How long after the change an invalidation is still sent again: the longest `cacheTtlMs`. */
const RESEND_WINDOW_MS = 600_000
/** Most invalidations waiting to be sent again at once; past it, the oldest is given up. */
export const MAX_UNSENT_INVALIDATIONS = 10_000
/**
 * The wait before each round: the first 0.5 to 1 s after the failure, then a ceiling that
 * doubles up to 30 s (half of each wait jittered), counted from the end of the round before.
 */
const RESEND_BACKOFF = { baseDelayMs: 1_000, maxDelayMs: 30_000 }
/** How late a round's timer may fire before it is taken for one that never will. */
const TIMER_SLACK_MS = 1_000

/**
 * The invalidations of a token service: each published within `deadlineMs`; one that fails
 * (rejects, throws, or does not answer in time) is reported and sent again in rounds with
 * backoff (and at once when a later publish lands or {@link InvalidationSender.resend} says
 * the bus is back) until it lands, for {@link RESEND_WINDOW_MS} after the last change that
 * queued it (by then no instance, whatever its `cacheTtlMs`, still trusts a record it read
 * before that change), with at most {@link MAX_UNSENT_INVALIDATIONS} waiting. A hash whose publish is still
 * in flight is not sent again meanwhile; what is given up is counted to `report`, the rounds
 * themselves are not.
 */
export function createInvalidationSender(options: InvalidationSenderOptions): InvalidationSender {
  const { deadlineMs, now, waitUntil } = options
  // Numbers the changes: a publish that lands clears the queued entry of its own change or an
  // earlier one, never that of a change made after it began.
  let changes = 0
  const unsent = new Map<string, { readonly since: number; readonly change: number }>()
  // The publish in flight per hash.
  const sending = new Map<string, Promise<void>>()
  let timer: ReturnType<typeof setTimeout> | undefined
  let dueAt = 0
  let releaseTimer: (() => void) | undefined
  let attempts = 0
  let round: { readonly at: number } | undefined
  // The bus said it answers again while a round was running: if that round leaves some unsent,
  // the next goes at once, not after the backoff grown before.
  let resendWanted = false
  let evicted = 0
  let closed = false
  let closing: Promise<void> | undefined

  function report(error: unknown, context: string): void {
    // A logger that throws must not break the rounds, nor fail a caller whose write is done.
    try {
      options.report(error, context)
    } catch {
      // nowhere left to report it
    }
  }

  function giveUp(count: number, why: string): void {
    report(
      new Error(`${count} invalidation${count === 1 ? '' : 's'} could not be published ${why}: other instances trust the records they cached before the change until their cacheTtlMs ends`),
      'invalidation publish',
    )
  }

  function send(tokenHash: string, change: number): Promise<void> {
    const done: Promise<void> = Promise.resolve()
      .then(() => options.send(tokenHash))
      .then(() => {
        const entry = unsent.get(tokenHash)
        if (entry !== undefined && entry.change <= change) unsent.delete(tokenHash)
      })
      .finally(() => {
        if (sending.get(tokenHash) === done) sending.delete(tokenHash)
      })
    sending.set(tokenHash, done)
    return done
  }

  function queue(tokenHash: string, change: number): void {
    if (closed) return giveUp(1, 'after close()')
    const entry = unsent.get(tokenHash)
    if (entry !== undefined) {
      // A publish of an earlier change that failed late: the later change's entry stays.
      if (entry.change > change) return
      // Moved to the back, its window counted from this change.
      unsent.delete(tokenHash)
    } else if (unsent.size >= MAX_UNSENT_INVALIDATIONS) {
      const [oldest] = unsent.keys()
      unsent.delete(oldest!)
      evicted++
    }
    unsent.set(tokenHash, { since: now(), change })
    schedule()
  }

  function schedule(): void {
    const at = performance.now()
    // A round running schedules the next when it ends; a timer set is kept, unless it never
    // fired (its timer cut with the request that set it).
    if (roundRunning(at)) return
    if (timer !== undefined && at <= dueAt + TIMER_SLACK_MS) return
    clearTimer()
    attempts++
    const delay = computeBackoff(attempts, RESEND_BACKOFF)
    dueAt = at + delay
    timer = setTimeout(runRound, delay)
    ;(timer as { unref?: () => void }).unref?.()
    if (waitUntil) waitUntil(new Promise<void>((resolve) => (releaseTimer = resolve)))
  }

  /**
   * Whether a round is running at `at`: one that has not ended within its deadline never will
   * (its I/O cut with the request that began it), and is taken for none.
   */
  function roundRunning(at: number): boolean {
    return round !== undefined && at <= round.at + deadlineMs + TIMER_SLACK_MS
  }

  function clearTimer(): void {
    if (timer !== undefined) clearTimeout(timer)
    timer = undefined
    releaseTimer?.()
    releaseTimer = undefined
  }

  function runRound(): void {
    clearTimer()
    const at = now()
    let expired = 0
    for (const [tokenHash, entry] of unsent) {
      if (at - entry.since < RESEND_WINDOW_MS) continue
      unsent.delete(tokenHash)
      expired++
    }
    if (expired > 0) giveUp(expired, `for ${RESEND_WINDOW_MS / 60_000} minutes`)
    reportEvicted()
    const current = { at: performance.now() }
    round = current
    void sendQueued().then(() => {
      if (round !== current) return
      round = undefined
      const wanted = resendWanted
      resendWanted = false
      if (unsent.size === 0) attempts = 0
      else if (wanted) resendNow()
      else if (!closed) schedule()
    })
  }

  /**
   * The bus answers again (a publish landed, or its connection is back): what waits is sent
   * now, in a round of its own, rather than when a backoff grown during a long cut (up to
   * 30 s) ends. The backoff starts over.
   */
  function resendNow(): void {
    if (unsent.size === 0 || closed) return
    if (roundRunning(performance.now())) {
      resendWanted = true
      return
    }
    attempts = 0
    runRound()
  }

  function reportEvicted(): void {
    if (evicted === 0) return
    giveUp(evicted, `while more than ${MAX_UNSENT_INVALIDATIONS} were waiting`)
    evicted = 0
  }

  /**
   * One try of every queued invalidation, waited for within `deadlineMs`; never rejects. One
   * whose publish is still in flight (its bus has not answered) is waited for, not sent again:
   * one publish per hash at a time, so a bus that holds them does not pile up one per round.
   */
  function sendQueued(): Promise<unknown> {
    const tries: Promise<void>[] = []
    for (const [tokenHash, entry] of unsent) tries.push(sending.get(tokenHash) ?? send(tokenHash, entry.change))
    if (tries.length === 0) return Promise.resolve()
    return withTimeout(Promise.allSettled(tries), deadlineMs, 'invalidation publish').catch(() => {})
  }

  return {
    publish(tokenHash) {
      const change = ++changes
      return withTimeout(send(tokenHash, change), deadlineMs, 'invalidation publish').then(
        () => resendNow(),
        (error: unknown) => {
          report(error, 'invalidation publish')
          queue(tokenHash, change)
        },
      )
    },
    resend: resendNow,
    close() {
      closing ??= (async () => {
        closed = true
        clearTimer()
        round = undefined
        reportEvicted()
        if (unsent.size === 0) return
        // The last try keeps a process that is ending alive until it is done (bounded).
        const keepAlive = setTimeout(() => {}, Math.min(deadlineMs + TIMER_SLACK_MS, MAX_TIMER_MS))
        try {
          await sendQueued()
        } finally {
          clearTimeout(keepAlive)
        }
        if (unsent.size > 0) giveUp(unsent.size, 'before close()')
        unsent.clear()
      })()
      return closing
    },
  }
}
