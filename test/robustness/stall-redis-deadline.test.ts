/**
 * Event-loop stalls (found by an audit): a stall of this process that ends less than
 * NOTICED_LATE_MS (20 ms) after a Redis call's deadline. Its timer then ran "on time" by the
 * client's judgement, before this process had read the answer Redis gave 1 ms after the command
 * was sent (after a stall, Node runs expired timers before polling I/O): the call failed, and
 * the stall breaker opened though Redis answered in time. A stall a little shorter (deadline not
 * reached) or a little longer (noticed late: the call waited 20 ms and read its answer) was
 * harmless. A deadline is now judged once the sockets are read, on time or late.
 */
import { randomBytes } from 'node:crypto'
import { Redis } from 'ioredis'
import {
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { dispatchRequest } from '../helpers/dispatch-request.js'
import { REDIS_URL, redisAvailable } from '../helpers/redis.js'

const T = 1_000 // the Redis stores' default timeoutMs
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve))
function holdUntil(at: number): void {
  while (performance.now() < at) {
    // busy: a GC pause, a big JSON.parse
  }
}

let client: Redis
const prefix = `audit-stall:${randomBytes(6).toString('hex')}:`
// When the last command went out through the client (the stores call `client.call`).
let sentAt = 0
const adapter = {
  call: (command: string, ...args: unknown[]) => {
    sentAt = performance.now()
    return client.call(command, ...(args as string[]))
  },
  get status() {
    return client.status
  },
}

beforeAll(async () => {
  if (!redisAvailable) return
  client = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 })
  await client.ping()
})
afterAll(async () => {
  if (!redisAvailable) return
  const keys = await client.keys(`${prefix}*`)
  if (keys.length) await client.del(...keys)
  client.disconnect()
})

describe.runIf(redisAvailable)('a stall ending just past a Redis deadline', () => {
  // Each test starts once the previous one's late answers were read (they close the breaker).
  beforeEach(() => new Promise((resolve) => setTimeout(resolve, 50)))
  for (const [label, overshoot, fails] of [
    ['control: ends 30 ms before the deadline', -30, false],
    ['ends 8 ms after the deadline', 8, true],
    ['control: ends 60 ms after the deadline', 60, false],
  ] as const) {
    it(`session lookup answered by Redis in ~1 ms, stall ${label}: answered${fails ? ' (regression: failed, and the stall breaker opened)' : ''}`, async () => {
      const sessions = createRedisSessionStore({ client: adapter, prefix, timeoutMs: T })
      await sessions.set('s1', { appId: 'a', version: '1.0.0', subject: 'u' }, 60_000)
      await nextTurn()
      const pending = Promise.resolve(sessions.get('s1', 60_000))
      holdUntil(sentAt + T + overshoot)
      const outcome = await pending.then(
        (pin) => `pin ${pin?.version}`,
        (error: Error) => error.message,
      )
      // Right after: is the breaker open (a call refused unsent)?
      const next = await Promise.resolve(sessions.get('s1', 60_000)).then(
        () => 'sent',
        (error: Error) => error.message,
      )
      // Expected for a call Redis answered in ~1 ms: the pin, and no breaker.
      expect({ outcome, next }).toEqual({ outcome: 'pin 1.0.0', next: 'sent' })
    })
  }

  it('through the dispatcher: a request of a pinned session is served, Redis having answered at once (stall ending 8 ms past the 1 s deadline; regression: 503)', async () => {
    const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'u1', appId: 'app_weather', active: true }])
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
    const { token } = await tokens.create({ userId: 'u1', name: 't', servers: ['app_weather'], expiresInDays: 7 })
    const sessions = createRedisSessionStore({ client: adapter, prefix, timeoutMs: T })
    const errors: string[] = []
    const dispatcher = createDispatcher({ apps, subscriptions, tokens, sessions, onError: (e, c) => void errors.push(`${c}: ${(e as Error).message}`) })
    await sessions.set('sess-2', { appId: 'app_weather', version: '1.0.0', subject: 'u1' }, 60_000)
    await nextTurn()
    const before = sentAt
    const decided = dispatcher.decide(dispatchRequest('/v1', { authorization: `Bearer ${token}`, 'mcp-session-id': 'sess-2' }))
    // The GETEX goes out within the decision's first microtasks.
    await Promise.resolve()
    await Promise.resolve()
    await Promise.resolve()
    expect(sentAt).toBeGreaterThan(before)
    holdUntil(sentAt + T + 8)
    const decision = await decided
    const status = decision.type === 'reply' ? decision.reply.status : 'dispatch'
    expect({ status, errors }).toEqual({ status: 'dispatch', errors: [] })
  })

  it('rate limit: the count Redis made is the caller\'s, and no breaker opens (regression: served fail open without it)', async () => {
    const counters = createRedisRateLimitStore({ client: adapter, prefix, timeoutMs: T })
    const W = 60_000
    const start = Math.floor(Date.now() / W) * W
    expect((await counters.increment('k', start, W)) as unknown).toMatchObject({})
    await nextTurn()
    const pending = counters.increment('k', start, W)
    holdUntil(sentAt + T + 8)
    const outcome = await Promise.resolve(pending).then(
      (count) => `count ${JSON.stringify(count)}`,
      (error: Error) => error.message,
    )
    const stored = await client.hget(`${prefix}rl:k`, 'c')
    expect({ outcome, stored }).toEqual({ outcome: expect.stringMatching(/^count/), stored: '2' })
  })
})
