/**
 * The Redis stores under a Redis set up as a platform may have it, on a `redis-server` of this
 * file's own (no `CONFIG SET` or ACL on the shared one): a logical database other than 0, an
 * ACL user granted only the commands docs/stores.md ("ACLs") lists, one granted less (its
 * `NOPERM` must reach the caller, never be taken for an answer), and `maxmemory` under
 * `noeviction`.
 */
import { Redis, type RedisOptions } from 'ioredis'
import { createRedisCacheStore, createRedisInvalidationBus, createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { redisServerMissing, startPrivateRedis } from '../helpers/redis.js'

const missing = redisServerMissing()
const pin = { appId: 'app_1', version: '1.2.0', subject: 'u_1' }

describe.skipIf(missing !== undefined)('Redis stores on a Redis set up as a platform may have it', () => {
  let server: Awaited<ReturnType<typeof startPrivateRedis>>
  let admin: Redis
  const clients: Redis[] = []
  const connect = (options: RedisOptions = {}) => {
    const client = new Redis({ path: server.path, maxRetriesPerRequest: 1, enableReadyCheck: false, ...options })
    client.on('error', () => {})
    clients.push(client)
    return client
  }
  beforeAll(async () => {
    server = await startPrivateRedis()
    admin = new Redis({ path: server.path })
  })
  afterAll(async () => {
    for (const client of clients) client.disconnect()
    admin?.disconnect()
    await server?.stop()
  })

  /** Every store's calls once on `client`; each outcome, or the message of its error. */
  async function everyCall(client: Redis, prefix: string) {
    const settle = async (call: () => unknown) => Promise.resolve(call()).then((value) => value ?? 'ok', (error: Error) => `rejected: ${error.message}`)
    const counters = createRedisRateLimitStore({ client, prefix })
    const sessions = createRedisSessionStore({ client, prefix })
    const cache = createRedisCacheStore<{ v: number }>({ client, prefix, localTtlMs: 0 })
    const errors: string[] = []
    const bus = createRedisInvalidationBus({ client, prefix, heartbeatMs: false, onError: (error, context) => errors.push(`${context}: ${String(error)}`) })
    try {
      return {
        ready: await settle(() => bus.ready()),
        increment: await settle(() => counters.increment('k', 0, 60_000)),
        pin: await settle(() => sessions.set('s', pin, 60_000)),
        read: await settle(() => sessions.get('s', 60_000)),
        end: await settle(() => sessions.delete('s')),
        put: await settle(() => cache.set('c', { v: 1 }, 60_000)),
        get: await settle(() => cache.get('c')),
        forget: await settle(() => cache.delete('c')),
        publish: await settle(() => bus.publish({ kind: 'token', tokenHash: 'a'.repeat(64) })),
        errors,
      }
    } finally {
      await bus.close()
    }
  }
  const working = { ready: 'ok', increment: 1, pin: true, read: pin, end: 'ok', put: 'ok', get: { v: 1 }, forget: 'ok', publish: 'ok', errors: [] }

  it('a logical database other than 0 (ioredis db): every store works, its keys in that database', async () => {
    expect(await everyCall(connect({ db: 3 }), 'db3:')).toEqual(working)
    await admin.select(3)
    expect(await admin.keys('db3:*')).toEqual(['db3:rl:k'])
    await admin.select(0)
    expect(await admin.keys('db3:*')).toEqual([])
  })

  it('an ACL user granted only the commands docs/stores.md lists, on the prefix\'s keys and channels: every store works', async () => {
    await admin.call('ACL', 'SETUSER', 'mcp', 'on', '>pw', 'resetkeys', '~acl:*', 'resetchannels', '&acl:*', '-@all',
      '+evalsha', '+eval', '+getex', '+set', '+del', '+publish', '+subscribe', '+unsubscribe', '+ping', '+exists',
      '+get', '+pttl', '+hmget', '+hget', '+hset', '+hincrby', '+pexpire')
    expect(await everyCall(connect({ username: 'mcp', password: 'pw' }), 'acl:')).toEqual(working)
  })

  it('an ACL user without the scripting commands, or another prefix\'s keys: every call rejects naming NOPERM, none answers as if it had worked', async () => {
    await admin.call('ACL', 'SETUSER', 'noscripts', 'on', '>pw', '~acl2:*', '&acl2:*', '+@all', '-evalsha', '-eval')
    const noScripts = await everyCall(connect({ username: 'noscripts', password: 'pw' }), 'acl2:')
    for (const call of ['increment', 'pin', 'get'] as const) expect(noScripts[call]).toMatch(/^rejected: NOPERM .*evalsha/)
    await admin.call('ACL', 'SETUSER', 'otherkeys', 'on', '>pw', '~other:*', '&acl3:*', '+@all')
    const otherKeys = await everyCall(connect({ username: 'otherkeys', password: 'pw' }), 'acl3:')
    for (const call of ['increment', 'pin', 'read', 'end', 'put', 'get', 'forget'] as const) expect(otherKeys[call], call).toMatch(/^rejected: NOPERM/)
  })

  it('maxmemory under noeviction, full: new pins and cache writes are refused (OOM, rejected), a pin already there is still read and kept alive', async () => {
    const client = connect()
    const sessions = createRedisSessionStore({ client, prefix: 'oom:' })
    const cache = createRedisCacheStore<{ v: number }>({ client, prefix: 'oom:', localTtlMs: 0 })
    expect(await sessions.set('kept', pin, 60_000)).toBe(true)
    await admin.config('SET', 'maxmemory-policy', 'noeviction')
    await admin.config('SET', 'maxmemory', '1')
    try {
      await expect(sessions.set('new', pin, 60_000)).rejects.toThrow(/^OOM/)
      await expect(cache.set('c', { v: 1 }, 60_000)).rejects.toThrow(/OOM/)
      expect(await sessions.get('kept', 60_000)).toEqual(pin)
      expect(await cache.get('absent')).toBeUndefined()
    } finally {
      await admin.config('SET', 'maxmemory', '0')
    }
  })
})
