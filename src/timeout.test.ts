import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { withTimeout } from './timeout.js'

describe('withTimeout', () => {
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] })
  })
  afterEach(() => {
    vi.useRealTimers()
  })

  it('settles as the promise does, and clears its timer then: none is left for the deadline (a store on Redis would keep a closure per call alive for the whole deadline)', async () => {
    await expect(withTimeout(Promise.resolve('answer'), 5_000, 'sessions')).resolves.toBe('answer')
    expect(vi.getTimerCount()).toBe(0)
    const failure = new Error('connection reset')
    await expect(withTimeout(Promise.reject(failure), 5_000, 'sessions')).rejects.toBe(failure)
    expect(vi.getTimerCount()).toBe(0)
  })

  it('rejects once the deadline passes, naming what did not answer; the late answer goes nowhere, a late rejection included', async () => {
    let fail!: (error: Error) => void
    const pending = new Promise<string>((_resolve, reject) => (fail = reject))
    const timed = withTimeout(pending, 200, 'token store')
    const settled = expect(timed).rejects.toThrow('token store did not answer within 200 ms')
    await vi.advanceTimersByTimeAsync(199)
    expect(vi.getTimerCount()).toBe(1)
    await vi.advanceTimersByTimeAsync(1)
    await settled
    const unhandled = vi.fn()
    process.on('unhandledRejection', unhandled)
    try {
      fail(new Error('late'))
      await vi.advanceTimersByTimeAsync(0)
      await new Promise((resolve) => setImmediate(resolve))
    } finally {
      process.off('unhandledRejection', unhandled)
    }
    expect(unhandled).not.toHaveBeenCalled()
  })
})
