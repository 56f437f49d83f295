import { describe, expect, it } from 'vitest'
import { createClientBudget } from './client-budget.js'
import { TooManyValidationsError } from '../errors.js'

describe('createClientBudget', () => {
  it('a charge gives its unit back once, however often it is refunded', () => {
    const budget = createClientBudget({ limit: 2 }, { now: () => 0, elapsed: () => 0 })
    const first = budget.charge('203.0.113.7')
    budget.charge('203.0.113.7')
    for (let i = 0; i < 3; i++) first.refund()
    // One unit back: one more charge, then the window is spent.
    budget.charge('203.0.113.7')
    expect(() => budget.charge('203.0.113.7')).toThrow(TooManyValidationsError)
  })

  /** A budget of 2 a minute on a wall clock and a life clock of the test's. */
  const clocks = () => {
    const clock = { wall: MINUTE + 200, life: 0 }
    const budget = createClientBudget({ limit: 2 }, { now: () => clock.wall, elapsed: () => clock.life })
    const spent = () => {
      try {
        budget.charge('203.0.113.7')
        return false
      } catch (error) {
        if (error instanceof TooManyValidationsError) return true
        throw error
      }
    }
    return { clock, spent, budget }
  }
  const MINUTE = 1_700_000_040_000

  it('a wall clock stepped back across the window\'s start keeps counting against it, and so does the clock catching up (regression: a fresh budget each time)', () => {
    const { clock, spent, budget } = clocks()
    expect([spent(), spent(), spent()]).toEqual([false, false, true])
    clock.wall = MINUTE - 300 // NTP steps the clock back half a second
    clock.life += 10
    expect(spent()).toBe(true)
    // Refused until the end of the window it kept.
    expect(() => budget.charge('203.0.113.7')).toThrow(expect.objectContaining({ resetAt: (MINUTE + 60_000) / 1000 }))
    clock.wall = MINUTE + 300
    clock.life += 600
    expect(spent()).toBe(true)
    // The next minute is a fresh budget.
    clock.wall = MINUTE + 60_000
    clock.life += 60_000
    expect([spent(), spent(), spent()]).toEqual([false, false, true])
  })

  it('a window that began a window ago or more is not kept for a clock stepped back before it: a new one starts, rather than refusing for the size of the step', () => {
    const { clock, spent } = clocks()
    expect([spent(), spent(), spent()]).toEqual([false, false, true])
    clock.wall = MINUTE - 600_000
    clock.life += 60_000
    expect([spent(), spent(), spent()]).toEqual([false, false, true])
  })
})
