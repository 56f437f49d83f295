import { describe, expect, it } from 'vitest'
import { createClientBudget } from './client-budget.js'
import { TooManyValidationsError } from '../errors.js'

describe('createClientBudget', () => {
  it('a charge gives its unit back once, however often it is refunded', () => {
    const budget = createClientBudget({ limit: 2 }, () => 0)
    const first = budget.charge('203.0.113.7')
    budget.charge('203.0.113.7')
    for (let i = 0; i < 3; i++) first.refund()
    // One unit back: one more charge, then the window is spent.
    budget.charge('203.0.113.7')
    expect(() => budget.charge('203.0.113.7')).toThrow(TooManyValidationsError)
  })
})
