/** The circuit breaker, the backoff and the single flight on their own, on a manual clock. */
import { type BreakerStateChange, ConfigurationError, createCircuitBreaker, createOAuthValidator } from 'mcp-dispatch'
import { computeBackoff } from '../../src/auth/backoff.js'
import { createSingleFlight } from '../../src/auth/single-flight.js'
import { describe, expect, it, vi } from 'vitest'
import { createManualClock } from './helpers/clock.js'

describe('createCircuitBreaker', () => {
  function setup(failureThreshold = 3, coolDownMs = 10_000) {
    const clock = createManualClock(0)
    const changes: BreakerStateChange[] = []
    const breaker = createCircuitBreaker({ failureThreshold, coolDownMs, now: clock, onStateChange: (c) => changes.push(c) })
    return { clock, changes, breaker }
  }

  it('opens after N consecutive failures and refuses calls for the cool-down', () => {
    const { breaker, clock, changes } = setup()
    for (let i = 0; i < 2; i++) {
      expect(breaker.acquire()).toEqual({ allowed: true, probe: false })
      breaker.failure()
    }
    expect(breaker.state).toBe('closed')
    breaker.acquire()
    breaker.failure()
    expect(breaker.state).toBe('open')
    clock.advance(4_000)
    expect(breaker.acquire()).toEqual({ allowed: false, retryAfterMs: 6_000 })
    expect(breaker.retryAfterMs()).toBe(6_000)
    expect(changes).toEqual([{ from: 'closed', to: 'open', at: 0 }])
  })

  it('a call let through before the breaker opened does not close it by its late success, nor reopen it by a late failure while the probe is out (regression: one slow call closed an open breaker)', () => {
    const { breaker, clock, changes } = setup(2, 10_000)
    const slow = breaker.acquire() // under way when the breaker opens
    const slowToo = breaker.acquire()
    for (let i = 0; i < 2; i++) breaker.failure(breaker.acquire())
    expect(breaker.state).toBe('open')
    breaker.success(slow)
    expect(breaker.state).toBe('open')
    expect(breaker.acquire()).toEqual({ allowed: false, retryAfterMs: 10_000 })
    // Half-open: the probe is out, and the other old call fails late.
    clock.advance(10_000)
    const probe = breaker.acquire()
    expect(probe).toEqual({ allowed: true, probe: true })
    breaker.failure(slowToo)
    expect(breaker.state).toBe('half-open')
    expect(breaker.acquire()).toMatchObject({ allowed: false })
    // The probe's own answer decides.
    breaker.success(probe)
    expect(breaker.state).toBe('closed')
    // A permit of a state gone by counts for nothing in the next one either.
    const beforeClose = slowToo
    for (let i = 0; i < 5; i++) breaker.failure(beforeClose)
    expect(breaker.state).toBe('closed')
    expect(changes.map((c) => c.to)).toEqual(['open', 'half-open', 'closed'])
    // A report without its permit, or with a copy of one, is taken as current (what callers
    // of the earlier API do), never silently dropped.
    breaker.failure({ ...breaker.acquire() })
    breaker.failure()
    expect(breaker.state).toBe('open')
    breaker.success()
    expect(breaker.state).toBe('closed')
  })

  it('takes a probe older than probeMaxAgeMs for lost (its request ended first, on Workers: it never reports) and lets another through', () => {
    const clock = createManualClock(0)
    const breaker = createCircuitBreaker({ failureThreshold: 1, coolDownMs: 1_000, probeMaxAgeMs: 500, now: clock })
    breaker.acquire()
    breaker.failure()
    clock.advance(1_000)
    expect(breaker.acquire()).toEqual({ allowed: true, probe: true })
    clock.advance(500)
    expect(breaker.acquire()).toMatchObject({ allowed: false })
    clock.advance(1)
    expect(breaker.acquire()).toEqual({ allowed: true, probe: true })
    expect(breaker.acquire()).toMatchObject({ allowed: false })
    breaker.success()
    expect(breaker.state).toBe('closed')
    for (const probeMaxAgeMs of [0, -1, Number.NaN, '5' as never]) {
      expect(() => createCircuitBreaker({ probeMaxAgeMs }), String(probeMaxAgeMs)).toThrow(/probeMaxAgeMs/)
    }
  })

  it('counts consecutive failures only: a success resets the count', () => {
    const { breaker } = setup()
    for (let i = 0; i < 10; i++) {
      breaker.acquire()
      if (i % 2 === 0) breaker.failure()
      else breaker.success()
    }
    expect(breaker.state).toBe('closed')
  })

  it('lets one probe through after the cool-down; its success closes the breaker', () => {
    const { breaker, clock, changes } = setup(1)
    breaker.acquire()
    breaker.failure()
    clock.advance(10_000)
    expect(breaker.state).toBe('half-open')
    expect(breaker.acquire()).toEqual({ allowed: true, probe: true })
    expect(breaker.acquire()).toMatchObject({ allowed: false })
    expect(breaker.acquire()).toMatchObject({ allowed: false })
    breaker.success()
    expect(breaker.state).toBe('closed')
    expect(breaker.acquire()).toEqual({ allowed: true, probe: false })
    expect(changes.map((c) => `${c.from}->${c.to}@${c.at}`)).toEqual([
      'closed->open@0',
      'open->half-open@10000',
      'half-open->closed@10000',
    ])
  })

  it('opens again for a full cool-down when the probe fails', () => {
    const { breaker, clock } = setup(1)
    breaker.acquire()
    breaker.failure()
    clock.advance(10_000)
    breaker.acquire()
    breaker.failure()
    expect(breaker.state).toBe('open')
    expect(breaker.acquire()).toEqual({ allowed: false, retryAfterMs: 10_000 })
  })

  it('after a failed probe and another cool-down, the next caller gets a new probe: the failed one is no longer out', () => {
    const { breaker, clock } = setup(1)
    breaker.acquire()
    breaker.failure()
    for (let round = 0; round < 3; round++) {
      clock.advance(10_000)
      expect(breaker.acquire(), `round ${round}`).toEqual({ allowed: true, probe: true })
      breaker.failure()
      expect(breaker.state).toBe('open')
    }
    clock.advance(10_000)
    breaker.success(breaker.acquire())
    expect(breaker.state).toBe('closed')
  })

  it('while the probe is out, the others are told to come back in a second', () => {
    const { breaker, clock } = setup(1)
    breaker.acquire()
    breaker.failure()
    clock.advance(10_000)
    breaker.acquire()
    expect(breaker.acquire()).toEqual({ allowed: false, retryAfterMs: 1_000 })
  })

  it('failures reported while it is open (without a permit) do not count: the cool-down is not pushed back, and no new count runs', () => {
    const { breaker, clock, changes } = setup(2, 10_000)
    for (let i = 0; i < 2; i++) breaker.failure(breaker.acquire())
    clock.advance(6_000)
    for (let i = 0; i < 4; i++) breaker.failure()
    expect(breaker.retryAfterMs()).toBe(4_000)
    clock.advance(4_000)
    expect(breaker.acquire()).toEqual({ allowed: true, probe: true })
    expect(changes.map((c) => c.to)).toEqual(['open', 'half-open'])
  })

  it('a success resets the count: threshold - 1 failures, a success, threshold - 1 failures again never open it', () => {
    const { breaker, changes } = setup(3)
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < 2; i++) breaker.failure(breaker.acquire())
      breaker.success(breaker.acquire())
    }
    expect(breaker.acquire()).toEqual({ allowed: true, probe: false })
    expect(changes).toEqual([])
  })

  it('retryAfterMs is 0 when not open: a breaker never opened, and one closed again', () => {
    const { breaker, clock } = setup(1)
    expect(breaker.retryAfterMs()).toBe(0)
    breaker.failure(breaker.acquire())
    expect(breaker.retryAfterMs()).toBe(10_000)
    clock.advance(10_000)
    breaker.success(breaker.acquire())
    expect(breaker.retryAfterMs()).toBe(0)
  })

  it('survives a throwing listener and refuses bad options', () => {
    const breaker = createCircuitBreaker({
      failureThreshold: 1,
      onStateChange: () => {
        throw new Error('metrics down')
      },
    })
    breaker.acquire()
    expect(() => breaker.failure()).not.toThrow()
    expect(breaker.state).toBe('open')
    expect(() => createCircuitBreaker({ failureThreshold: 1.5 })).toThrow(ConfigurationError)
    expect(() => createCircuitBreaker({ coolDownMs: -1 })).toThrow(ConfigurationError)
    for (const coolDownMs of [Number.POSITIVE_INFINITY, Number.NaN]) {
      expect(() => createCircuitBreaker({ coolDownMs }), String(coolDownMs)).toThrow(/breaker\.coolDownMs/)
    }
    // An OAuth validator's, past an hour (1e15: one outage, and every OAuth request 503 until a
    // restart), is refused; a breaker of the platform's own calls may cool down longer.
    const issuer = 'https://auth.example.com'
    expect(() => createOAuthValidator({ issuer, breaker: { coolDownMs: 1e15 } })).toThrow(new ConfigurationError('breaker.coolDownMs', 'must be at most 3600000 milliseconds (an hour)'))
    expect(() => createOAuthValidator({ issuer, breaker: { coolDownMs: 3_600_001 } })).toThrow(/breaker\.coolDownMs/)
    expect(() => createOAuthValidator({ issuer, breaker: { coolDownMs: 3_600_000 } })).not.toThrow()
    expect(() => createCircuitBreaker({ coolDownMs: 1e15 })).not.toThrow()
    expect(() => createCircuitBreaker({ coolDownMs: '10' as never })).toThrow(/breaker\.coolDownMs/)
  })

  it('refuses a clock or an observer that is not a function when it is made, not at the first failure', () => {
    // Else `now: 5` threw "now is not a function" from failure() on a request, naming no option,
    // and `onStateChange: 5` was silently never called.
    expect(() => createCircuitBreaker({ now: 5 as never, failureThreshold: 1 })).toThrow(new ConfigurationError('breaker.now', 'must be a function'))
    expect(() => createCircuitBreaker({ onStateChange: 5 as never })).toThrow(new ConfigurationError('breaker.onStateChange', 'must be a function'))
  })
})

describe('computeBackoff', () => {
  const policy = { baseDelayMs: 100, maxDelayMs: 1_000 }

  it('doubles per retry, capped, with half of each delay random', () => {
    expect([1, 2, 3, 4, 5, 6].map((n) => computeBackoff(n, policy, () => 0))).toEqual([50, 100, 200, 400, 500, 500])
    expect([1, 2, 3, 4, 5, 6].map((n) => computeBackoff(n, policy, () => 0.999999))).toEqual([100, 200, 400, 800, 1000, 1000])
  })

  it('stays within [ceiling / 2, ceiling] for any randomness', () => {
    for (let i = 0; i < 200; i++) {
      const d = computeBackoff(3, policy)
      expect(d).toBeGreaterThanOrEqual(200)
      expect(d).toBeLessThanOrEqual(400)
    }
  })
})

describe('createSingleFlight', () => {
  it('shares the in-flight promise per key and forgets it once settled', async () => {
    const flights = createSingleFlight<number>()
    let runs = 0
    const work = async () => {
      runs++
      await Promise.resolve()
      return runs
    }
    const a = flights.run('k', work)
    const b = flights.run('k', work)
    const c = flights.run('other', work)
    expect([a.joined, b.joined, c.joined]).toEqual([false, true, false])
    expect(await a.promise).toBe(await b.promise)
    await c.promise
    expect(flights.size).toBe(0)
    await flights.run('k', work).promise
    expect(runs).toBe(3)
  })

  it('takes a call older than maxAgeMs for lost (its request ended first, on Workers): not joined, and pruned', async () => {
    let at = 0
    const flights = createSingleFlight<string>({ now: () => at, maxAgeMs: 1_000 })
    const lost = flights.run('k', () => new Promise<string>(() => {}))
    expect(flights.run('k', () => Promise.resolve('joined')).joined).toBe(true)
    at = 1_001
    expect(flights.has('k')).toBe(false)
    const next = flights.run('k', () => Promise.resolve('done again'))
    expect(next.joined).toBe(false)
    expect(await next.promise).toBe('done again')
    void lost.promise
    flights.run('other', () => new Promise<string>(() => {}))
    at = 2_002
    expect(flights.size).toBe(1)
    flights.prune()
    expect(flights.size).toBe(0)
  })

  it('a call exactly maxAgeMs old is not yet lost (only an older one is): has, prune and run agree, and agree again a millisecond later', async () => {
    let at = 0
    const flights = createSingleFlight<string>({ now: () => at, maxAgeMs: 1_000 })
    const lost = flights.run('k', () => new Promise<string>(() => {}))
    at = 1_000
    expect(flights.has('k')).toBe(true)
    flights.prune()
    expect(flights.size).toBe(1)
    const joined = flights.run('k', () => Promise.resolve('done by the joiner'))
    expect(joined.joined).toBe(true)
    at = 1_001
    expect(flights.has('k')).toBe(false)
    flights.prune()
    expect(flights.size).toBe(0)
    void lost.promise
    expect(await joined.promise).toBe('done by the joiner')
  })

  it('a call taken for lost that still ends leaves the call that replaced it in flight: later callers join that one', async () => {
    let at = 0
    const flights = createSingleFlight<string>({ now: () => at, maxAgeMs: 1_000 })
    let endLost!: (value: string) => void
    const lost = flights.run('k', () => new Promise<string>((resolve) => (endLost = resolve)))
    at = 1_001
    let runs = 0
    let endNext!: (value: string) => void
    const next = flights.run('k', () => {
      runs++
      return new Promise<string>((resolve) => (endNext = resolve))
    })
    expect(next.joined).toBe(false)
    endLost('late')
    expect(await lost.promise).toBe('late')
    expect(flights.has('k')).toBe(true)
    const later = flights.run('k', () => {
      runs++
      return Promise.resolve('never')
    })
    expect(later.joined).toBe(true)
    endNext('done')
    expect(await later.promise).toBe('done')
    expect(runs).toBe(1)
  })

  it('callers that joined a lost call take it over once it is older than maxAgeMs, not sooner, and one of them does the work: the others join it', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] })
    try {
      let at = 0
      const flights = createSingleFlight<string>({ now: () => at, maxAgeMs: 1_000 })
      void flights.run('k', () => new Promise<string>(() => {})).promise
      let runs = 0
      let end!: (value: string) => void
      const work = () => {
        runs++
        return new Promise<string>((resolve) => (end = resolve))
      }
      const callers = [flights.run('k', work), flights.run('k', work), flights.run('k', work)]
      expect(callers.map((c) => c.joined)).toEqual([true, true, true])
      at = 1_000
      await vi.advanceTimersByTimeAsync(1_000)
      expect(runs).toBe(0)
      at = 1_001
      await vi.advanceTimersByTimeAsync(1)
      expect(runs).toBe(1)
      end('done once')
      expect(await Promise.all(callers.map((c) => c.promise))).toEqual(['done once', 'done once', 'done once'])
      expect(flights.size).toBe(0)
    } finally {
      vi.useRealTimers()
    }
  })

  it('a caller that joined a call left pending for ever (its request ended, on a runtime that never settles it) does the work itself once maxAgeMs have passed, on its own timer', async () => {
    const flights = createSingleFlight<string>({ maxAgeMs: 50 })
    const lost = flights.run('k', () => new Promise<string>(() => {}))
    const joined = flights.run('k', () => Promise.resolve('done by the joiner'))
    expect(joined.joined).toBe(true)
    expect(await joined.promise).toBe('done by the joiner')
    expect(flights.size).toBe(0)
    void lost.promise
  })

  it('work that fails at once leaves no call in flight behind', async () => {
    const flights = createSingleFlight<string>()
    const failing = flights.run('k', () => {
      throw new Error('at once')
    })
    await expect(failing.promise).rejects.toThrow('at once')
    expect(flights.size).toBe(0)
    expect(flights.has('k')).toBe(false)
  })

  it('shares a rejection too, then lets the next call try again', async () => {
    const flights = createSingleFlight<string>()
    const failing = flights.run('k', () => Promise.reject(new Error('upstream down')))
    const joined = flights.run('k', () => Promise.resolve('never'))
    await expect(failing.promise).rejects.toThrow('upstream down')
    await expect(joined.promise).rejects.toThrow('upstream down')
    expect(await flights.run('k', () => Promise.resolve('ok')).promise).toBe('ok')
  })
})
