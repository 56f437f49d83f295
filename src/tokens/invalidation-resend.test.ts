import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { type InvalidationSenderOptions, MAX_UNSENT_INVALIDATIONS, createInvalidationSender } from './invalidation-resend.js'

/**
 * A sender over a bus the test steers: `fail` makes publishes reject, `hold` leaves them
 * unanswered until `release()`; `sent` lists every publish asked, `reports` what was reported.
 */
function harness(overrides: Partial<InvalidationSenderOptions> = {}) {
  const bus = { fail: false, hold: false }
  const sent: string[] = []
  const held: Array<() => void> = []
  const reports: string[] = []
  const sender = createInvalidationSender({
    send: (tokenHash) => {
      sent.push(tokenHash)
      if (bus.hold) return new Promise<void>((resolve) => held.push(resolve))
      return bus.fail ? Promise.reject(new Error('Connection is closed.')) : Promise.resolve()
    },
    report: (error, context) => void reports.push(`${context}: ${(error as Error).message}`),
    deadlineMs: 100,
    now: () => performance.now(),
    ...overrides,
  })
  const release = () => held.splice(0).forEach((resolve) => resolve())
  return { sender, bus, sent, reports, release }
}

const count = (list: readonly string[], value: string) => list.filter((item) => item === value).length

describe('createInvalidationSender', () => {
  beforeEach(() => void vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] }))
  afterEach(() => void vi.useRealTimers())

  it('a publish of an earlier change that lands late does not clear a later change of the same hash', async () => {
    const { sender, bus, sent, release } = harness()
    bus.hold = true
    const first = sender.publish('h') // held past its deadline: queued as change 1
    await vi.advanceTimersByTimeAsync(100)
    await first
    bus.hold = false
    bus.fail = true
    await sender.publish('h') // change 2 fails at once: its entry replaces change 1's
    bus.fail = false
    release() // change 1's publish lands now
    await vi.advanceTimersByTimeAsync(0)
    expect(sent).toEqual(['h', 'h'])
    // The next round still sends it, for change 2.
    await vi.advanceTimersByTimeAsync(1_000)
    expect(sent).toEqual(['h', 'h', 'h'])
    await vi.advanceTimersByTimeAsync(60_000)
    expect(sent).toHaveLength(3)
    await sender.close()
  })

  it('a publish that lands sends what waits at once, not at the end of a backoff grown to 30 s (regression: a long cut left revocations waiting up to 30 s after the bus was back)', async () => {
    const { sender, bus, sent } = harness()
    bus.fail = true
    await sender.publish('old')
    // Rounds fail for minutes: the backoff grows to its 30 s ceiling.
    await vi.advanceTimersByTimeAsync(180_000)
    const tried = count(sent, 'old')
    expect(tried).toBeGreaterThan(5)
    expect(tried).toBeLessThan(20)
    // The bus is back: the next change lands, and the waiting one goes with it.
    bus.fail = false
    await sender.publish('new')
    await vi.advanceTimersByTimeAsync(0)
    expect(count(sent, 'old')).toBe(tried + 1)
    // Sent: nothing is sent again.
    await vi.advanceTimersByTimeAsync(120_000)
    expect(count(sent, 'old')).toBe(tried + 1)
    expect(count(sent, 'new')).toBe(1)
    await sender.close()
  })

  it('resend() (the bus hears again) sends what waits at once and starts the backoff over; with nothing waiting, a round running, or closed, it sends nothing', async () => {
    const { sender, bus, sent } = harness()
    sender.resend() // nothing waits
    await vi.advanceTimersByTimeAsync(0)
    expect(sent).toEqual([])
    bus.fail = true
    await sender.publish('a')
    await vi.advanceTimersByTimeAsync(120_000) // the backoff grows to 30 s
    const tried = count(sent, 'a')
    // Still cut: this round fails, and the next comes 0.5 to 1 s later, not 30 s.
    sender.resend()
    await vi.advanceTimersByTimeAsync(0)
    expect(count(sent, 'a')).toBe(tried + 1)
    await vi.advanceTimersByTimeAsync(1_000)
    expect(count(sent, 'a')).toBe(tried + 2)
    // A round in flight is not doubled.
    bus.fail = false
    bus.hold = true
    sender.resend()
    sender.resend()
    await vi.advanceTimersByTimeAsync(0)
    expect(count(sent, 'a')).toBe(tried + 3)
    bus.hold = false
    await Promise.all([sender.close(), vi.advanceTimersByTimeAsync(100)])
    sender.resend() // closed
    await vi.advanceTimersByTimeAsync(60_000)
    expect(count(sent, 'a')).toBe(tried + 3)
  })

  it('resend() while a round runs is kept: when that round ends leaving some unsent, the next goes at once, not after the grown backoff', async () => {
    const attempts: string[] = []
    let answer: (() => Promise<void>) | undefined
    const sender = createInvalidationSender({
      send: (tokenHash) => {
        attempts.push(tokenHash)
        return answer ? answer() : Promise.reject(new Error('Connection is closed.'))
      },
      report: () => {},
      deadlineMs: 100,
      now: () => performance.now(),
    })
    await sender.publish('a')
    await vi.advanceTimersByTimeAsync(120_000) // the backoff grows to 30 s
    const tried = attempts.length
    // The next round's publish takes 50 ms to fail (a connection on its way back).
    answer = () => new Promise<void>((_resolve, reject) => setTimeout(() => reject(new Error('Connection is closed.')), 50))
    while (attempts.length === tried) await vi.advanceTimersByTimeAsync(10)
    // 10 ms into that round, the bus says it is back; then the round fails.
    sender.resend()
    expect(attempts.length).toBe(tried + 1) // not doubled
    answer = undefined
    await vi.advanceTimersByTimeAsync(50)
    // 'a' still unsent: the next round at once, not 15 to 30 s later.
    expect(attempts.length).toBe(tried + 2)
    await sender.close()
  })

  it('one publish per hash at a time: a bus that holds its publishes is waited for, not asked again each round, and rounds do not overlap', async () => {
    const { sender, bus, sent, reports } = harness()
    bus.hold = true
    await Promise.all([sender.publish('held'), vi.advanceTimersByTimeAsync(100)])
    bus.hold = false
    bus.fail = true
    // Failures keep coming (another hash, each second) while the held one waits.
    for (let i = 0; i < 60; i++) {
      void sender.publish(`other-${i}`)
      await vi.advanceTimersByTimeAsync(1_000)
    }
    expect(count(sent, 'held')).toBe(1)
    expect(sent.filter((hash) => hash === 'other-0').length).toBeGreaterThan(1) // the others are sent again
    expect(sent.filter((hash) => hash === 'other-0').length).toBeLessThan(10)
    expect(reports.filter((line) => line.includes('could not be published'))).toEqual([])
    await Promise.all([sender.close(), vi.advanceTimersByTimeAsync(100)])
    expect(count(sent, 'held')).toBe(1) // waited for at close() too
  })

  it('a round whose timer never fired (a runtime that ends a request timers with it) is set again by the next failure', async () => {
    const { sender, bus, sent } = harness()
    bus.fail = true
    await sender.publish('a')
    vi.clearAllTimers() // the request that set the round's timer ended, and its timer with it
    await vi.advanceTimersByTimeAsync(5_000)
    expect(sent).toEqual(['a'])
    await sender.publish('b') // overdue: armed again (the second wait: 1 to 2 s)
    bus.fail = false
    await vi.advanceTimersByTimeAsync(2_000)
    expect(sent).toEqual(['a', 'b', 'a', 'b'])
    await sender.close()
  })

  it('hands each round to waitUntil, released when it fires or at close()', async () => {
    const kept: Promise<unknown>[] = []
    const { sender, bus } = harness({ waitUntil: (promise) => void kept.push(promise) })
    bus.fail = true
    await sender.publish('a')
    expect(kept).toHaveLength(1)
    let released = false
    void kept[0]!.then(() => (released = true))
    await vi.advanceTimersByTimeAsync(1_000)
    expect(released).toBe(true)
    expect(kept).toHaveLength(2) // the next round, still failing
    await sender.close()
    await expect(Promise.all(kept)).resolves.toBeDefined()
  })

  it(`past ${MAX_UNSENT_INVALIDATIONS} waiting, the oldest are given up, counted in one report per round`, async () => {
    const { sender, bus, reports } = harness()
    bus.fail = true
    for (let i = 0; i < MAX_UNSENT_INVALIDATIONS + 5; i++) await sender.publish(`h${i}`)
    expect(reports.filter((line) => line.includes('could not be published'))).toEqual([])
    await vi.advanceTimersByTimeAsync(1_000)
    expect(reports.filter((line) => line.includes('could not be published'))).toEqual([
      `invalidation publish: 5 invalidations could not be published while more than ${MAX_UNSENT_INVALIDATIONS} were waiting: other instances trust the records they cached before the change until their cacheTtlMs ends`,
    ])
    expect(reports).toHaveLength(MAX_UNSENT_INVALIDATIONS + 5 + 1)
    await sender.close()
  })

  it('a publish that fails after close() is reported as given up; close() twice sends the last try once', async () => {
    const { sender, bus, sent, reports } = harness()
    bus.fail = true
    await sender.publish('a')
    const closing = [sender.close(), sender.close()]
    await Promise.all(closing)
    expect(count(sent, 'a')).toBe(2) // the first try, and one last
    await sender.publish('b')
    expect(reports.slice(-2)).toEqual([
      'invalidation publish: Connection is closed.',
      'invalidation publish: 1 invalidation could not be published after close(): other instances trust the records they cached before the change until their cacheTtlMs ends',
    ])
    await vi.advanceTimersByTimeAsync(60_000)
    expect(count(sent, 'b')).toBe(1)
  })

  it('a report that throws breaks neither the caller nor the rounds', async () => {
    const unhandled: unknown[] = []
    const onUnhandled = (reason: unknown) => void unhandled.push(reason)
    process.on('unhandledRejection', onUnhandled)
    try {
      let clock = 0
      const { sender, bus, sent } = harness({
        now: () => clock,
        report: () => {
          throw new Error('logger down')
        },
      })
      bus.fail = true
      await expect(sender.publish('a')).resolves.toBeUndefined()
      clock = 600_000 // its window is over: given up (the report throws) at the next round
      await sender.publish('b')
      await vi.advanceTimersByTimeAsync(1_000)
      bus.fail = false
      await vi.advanceTimersByTimeAsync(60_000)
      expect(sent.filter((hash) => hash === 'b').length).toBeGreaterThan(1)
      await sender.close()
      await new Promise((resolve) => setImmediate(resolve))
      expect(unhandled).toEqual([])
    } finally {
      process.off('unhandledRejection', onUnhandled)
    }
  })
})
