import { spawn } from 'node:child_process'
import * as net from 'node:net'
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

describe('withTimeout, on real timers and a real socket', () => {
  /**
   * An answer from a loopback server in another process (one in this process would not read the
   * question while this process is held), read only when this process gets round to its sockets.
   */
  async function echo(): Promise<{ ask(): Promise<string>; close(): Promise<void> }> {
    const code = "const s=require('net').createServer(c=>c.on('data',d=>c.write(d))).listen(0,'127.0.0.1',()=>console.log(s.address().port))"
    const child = spawn(process.execPath, ['-e', code], { stdio: ['ignore', 'pipe', 'inherit'] })
    const port = await new Promise<number>((resolve) => child.stdout.once('data', (data) => resolve(Number(String(data).trim()))))
    const client = net.connect(port, '127.0.0.1')
    await new Promise((resolve) => client.once('connect', resolve))
    return {
      ask: () => new Promise<string>((resolve) => (client.once('data', (data) => resolve(String(data))), client.write('pong'))),
      close: async () => {
        client.destroy()
        child.kill()
        await new Promise((resolve) => child.once('exit', resolve))
      },
    }
  }
  const hold = (ms: number) => {
    const end = performance.now() + ms
    while (performance.now() < end) {
      // busy: a long garbage collection, a synchronous parse
    }
  }

  for (const heldPastMs of [5, 200]) {
    it(`an answer that came while the event loop was held ${heldPastMs} ms past the deadline is the call's (regression: judged before the socket was read, it failed)`, async () => {
      const peer = await echo()
      try {
        const timed = withTimeout(peer.ask(), 300, 'the store')
        // The server answers at once; this process reads nothing until the hold is over.
        hold(300 + heldPastMs)
        await expect(timed).resolves.toBe('pong')
      } finally {
        await peer.close()
      }
    })
  }
})
