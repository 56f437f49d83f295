/**
 * Event-loop stalls (found by an audit): the dispatcher's store deadline (`storeTimeoutMs`) around the token
 * service's lookup on a PostgreSQL token store, the process held right after the SELECT was
 * written. With the default 5 s, a 1.5 s stall is harmless (control). With a `storeTimeoutMs`
 * below the stall, the lookup PostgreSQL answered in ~1 ms was failed (503): `withTimeout`
 * (src/timeout.ts) had none of the Redis client's allowance for a process that was held (the
 * answer is on the socket, unread, when the timer runs); it now judges once the sockets are read.
 */
import { createDispatcher, createMemoryAppStore, createMemorySubscriptionStore, createTokenService } from 'mcp-dispatch'
import { dispatchRequest } from '../helpers/dispatch-request.js'
import { describe, expect, it } from 'vitest'
import { postgresUnavailable, usePostgres } from '../helpers/postgres.js'
import { holdEventLoop } from '../helpers/hold.js'

const unavailable = await postgresUnavailable()
const pg = usePostgres()

async function world(storeTimeoutMs?: number) {
  const store = await pg.tokenStore()
  const apps = createMemoryAppStore([{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'u1', appId: 'app_w', active: true }])
  const creator = createTokenService({ store, apps, subscriptions })
  const { token } = await creator.create({ userId: 'u1', name: 't', servers: ['app_w'], expiresInDays: 7 })
  // Another instance, its cache empty: its first authenticate reads PostgreSQL.
  const errors: string[] = []
  const tokens = createTokenService({ store, apps, subscriptions, onError: (e, c) => void errors.push(`${c}: ${(e as Error).message}`) })
  // The dispatcher bounds the token service's lookup with its storeTimeoutMs.
  const dispatcher = createDispatcher({ apps, subscriptions, tokens, onError: (e, c) => void errors.push(`${c}: ${(e as Error).message}`), ...(storeTimeoutMs && { storeTimeoutMs }) })
  // Warm the pool: an idle connection, so the query goes out within the call's first ticks.
  await pg.pool.query('SELECT 1')
  return { dispatcher, token, errors }
}

async function authenticateWithStall(storeTimeoutMs: number | undefined, stallMs: number) {
  const { dispatcher, token } = await world(storeTimeoutMs)
  // Where the SELECT is written to the socket: the stall starts right after it.
  const pgClient = await pg.pool.connect()
  const proto = Object.getPrototypeOf(pgClient.connection) as { sendQuery?: unknown; query: (...a: unknown[]) => unknown; parse: (...a: unknown[]) => unknown; sync: (...a: unknown[]) => unknown }
  pgClient.release()
  const sync = proto.sync
  let held = false
  proto.sync = function (this: unknown, ...a: unknown[]) {
    const r = sync.apply(this, a)
    if (!held) {
      held = true
      // Sent (the extended protocol ends with Sync): held within the same turn, so nothing is read meanwhile.
      queueMicrotask(() => holdEventLoop(stallMs))
    }
    return r
  }
  const pending = Promise.resolve(dispatcher.decide(dispatchRequest('/v1', { authorization: `Bearer ${token}` }))).finally(() => (proto.sync = sync))
  const decision = await pending
  // The hold happened, right after the lookup went out: otherwise the test proves nothing.
  expect(held).toBe(true)
  return decision.type === 'reply' ? `reply ${decision.reply.status}` : 'dispatch'
}

describe.skipIf(unavailable !== undefined)('token service on PostgreSQL, a stall right after the lookup went out', () => {
  it('default storeTimeoutMs 5 s, a 1.5 s stall: the token is accepted', async () => {
    const outcome = await authenticateWithStall(undefined, 1_500)
    expect(outcome).toBe('dispatch')
  })

  it('storeTimeoutMs 1 s, a 1.5 s stall, PostgreSQL answered in ~1 ms: the token is accepted (regression: 503)', async () => {
    const outcome = await authenticateWithStall(1_000, 1_500)
    expect(outcome).toBe('dispatch')
  })
})
