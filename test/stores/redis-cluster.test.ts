/**
 * The Redis stores on a real Redis Cluster (three masters on loopback, started by this file:
 * test/helpers/redis-cluster.ts), through ioredis `Cluster` clients of ioredis 6 and 5: the
 * shared conformance suites, what a cluster changes (keys on every master, scripts by SHA on
 * nodes that never saw them, pub/sub across nodes, a slot that migrates under the counters, a
 * write refused READONLY sent once more),
 * the two-instances pipeline of test/stores/redis-instances.test.ts; and a master that goes
 * down (killed, on clusters of their own, one per ioredis major): the stores on the other
 * masters keep serving, the calls of the dead one fail within one deadline and then at once
 * (the stall breaker is per master), through the pipeline the rate limit fails open with a
 * report and the sessions of the dead master answer 503; and a bus whose subscription was on
 * the dead master drops its caches and hears the others again. Each of those tests starts the
 * killed master again (empty) after it. Masters with replicas, and their failovers:
 * test/stores/redis-cluster-failover.test.ts.
 */
import type { SessionPin } from 'mcp-dispatch'
import {
  type RedisInvalidationBus,
  createRedisCacheStore,
  createRedisInvalidationBus,
  createRedisRateLimitStore,
  createRedisSessionStore,
} from 'mcp-dispatch/redis'
import { ReplyError } from 'ioredis'
import { describe, expect, it, vi } from 'vitest'
import { type RedisClusterTestContext, type TestRedisCluster, describeRedisCluster, prefixOn, startRedisClusters } from '../helpers/redis-cluster.js'
import { nextInvalidation } from '../helpers/redis.js'
import { createRedisStorePipeline } from '../robustness/support.js'
import {
  describeCacheStoreConformance,
  describeInvalidationBusConformance,
  describeRateLimitStoreConformance,
  describeSessionStoreConformance,
} from './conformance.js'
import { hashSlot } from '../../src/stores/redis/client.js'
import { sharedValidationCacheSuite, twoInstancesSuite } from './redis-instances-suite.js'

// Every cluster of the file, started at once before any test opens a connection: a cluster
// shared by the suites that leave it whole, and one per ioredis major for the tests that end a
// master (each starts it again after).
const [shared, downOn6, downOn5] = (await startRedisClusters([
  [17201, 17202, 17203],
  [17204, 17205, 17206],
  [17207, 17208, 17209],
])) ?? []

const PIN: SessionPin = { appId: 'app_1', version: '1.2.3', subject: 'user_1' }
const W = 60_000
const START = 1_700_000_040_000 - (1_700_000_040_000 % W)

/** Every `cmdstat_<name>` call count of `INFO commandstats` of the node on `port`. */
async function commandCalls(redis: RedisClusterTestContext, port: number): Promise<Record<string, number>> {
  const info = String(await redis.cluster.node(port).call('INFO', 'commandstats'))
  return Object.fromEntries([...info.matchAll(/^cmdstat_(\w+):calls=(\d+)/gm)].map(([, name, calls]) => [name!, Number(calls)]))
}

describeRedisCluster('Redis stores on a Redis Cluster', shared, (redis) => {
  describe('conformance', () => {
    const closeBus = (bus: unknown) => (bus as RedisInvalidationBus).close()
    describeSessionStoreConformance('redis cluster', () => createRedisSessionStore({ client: redis.clusterClient, prefix: redis.prefix() }), {
      injectableClock: false,
    })
    describeRateLimitStoreConformance('redis cluster', () => createRedisRateLimitStore({ client: redis.clusterClient, prefix: redis.prefix() }), {
      injectableClock: false,
    })
    describeCacheStoreConformance('redis cluster', () => createRedisCacheStore({ client: redis.clusterClient, prefix: redis.prefix(), localTtlMs: 0 }), {
      injectableClock: false,
    })
    describeInvalidationBusConformance(
      'redis cluster',
      async () => {
        const bus = createRedisInvalidationBus({ client: redis.clusterClient, prefix: redis.prefix() })
        // A new Cluster connection subscribing: given more than the 1 s default deadline on a loaded machine.
        await bus.ready(5_000)
        return bus
      },
      { teardown: closeBus },
    )
  })

  describe('what a cluster changes', () => {
    it('keys spread over every master; each store call is on one key, so no CROSSSLOT', async () => {
      const prefix = redis.prefix()
      const counters = createRedisRateLimitStore({ client: redis.clusterClient, prefix })
      const sessions = createRedisSessionStore({ client: redis.clusterClient, prefix })
      const cache = createRedisCacheStore<{ n: number }>({ client: redis.clusterClient, prefix, localTtlMs: 0 })
      for (let i = 0; i < 30; i++) {
        expect(await counters.increment(`k${i}`, START, W)).toBe(1)
        expect(await sessions.set(`s${i}`, PIN, 60_000)).toBe(true)
        await cache.set(`c${i}`, { n: i }, 60_000)
      }
      for (let i = 0; i < 30; i++) {
        expect(await counters.increment(`k${i}`, START, W)).toBe(2)
        expect(await sessions.get(`s${i}`, 60_000)).toEqual(PIN)
        expect(await cache.get(`c${i}`)).toEqual({ n: i })
      }
      const perMaster = await Promise.all(
        redis.cluster.ports.map(async (port) => (await redis.cluster.node(port).keys(`${prefix}*`)).length),
      )
      expect(perMaster.every((count) => count > 0)).toBe(true)
      expect(perMaster.reduce((a, b) => a + b)).toBe(90)
    })

    it('the stores find the master of a key as Redis does (hash slots, hash tags, UTF-8)', async () => {
      const keys = ['', 'a', 'mcp-dispatch:rl:user_1:app_1', '{user1}:a', 'x{user1}y', '{}{a}', 'a{}b', 'a{b', 'a}b{c}', '{a}{b}', 'ü:键', '\u0000k']
      const node = redis.cluster.node(redis.cluster.ports[0]!)
      for (const key of keys) expect(hashSlot(key), JSON.stringify(key)).toBe(Number(await node.call('CLUSTER', 'KEYSLOT', key)))
    })

    it('scripts by SHA on a master that never saw them: NOSCRIPT there, one EVAL, then EVALSHA', async () => {
      const prefix = redis.prefix()
      for (const port of redis.cluster.ports) {
        await redis.cluster.node(port).call('SCRIPT', 'FLUSH')
        await redis.cluster.node(port).call('CONFIG', 'RESETSTAT')
      }
      const counters = createRedisRateLimitStore({ client: redis.clusterClient, prefix })
      const cache = createRedisCacheStore<{ n: number }>({ client: redis.clusterClient, prefix, localTtlMs: 0 })
      for (let round = 1; round <= 3; round++) {
        for (let i = 0; i < 20; i++) {
          expect(await counters.increment(`k${i}`, START, W)).toBe(round)
          expect(await cache.get(`c${i}`)).toBeUndefined()
        }
      }
      for (const port of redis.cluster.ports) {
        const calls = await commandCalls(redis, port)
        // Two scripts (the counter's and the cache read), each loaded once on each master.
        expect(calls.eval, `EVAL on ${port}`).toBe(2)
        expect(calls.evalsha, `EVALSHA on ${port}`).toBeGreaterThan(2)
      }
    })

    it('pub/sub crosses nodes: a PUBLISH on any master reaches a bus, whichever node it subscribed on', async () => {
      const prefix = redis.prefix()
      const bus = createRedisInvalidationBus({ client: redis.clusterClient, prefix })
      // A new Cluster connection subscribing: given more than the 1 s default deadline on a loaded machine.
      await bus.ready(5_000)
      expect(bus.listening).toBe(true)
      try {
        for (const [i, port] of redis.cluster.ports.entries()) {
          const arrived = nextInvalidation(bus)
          const wire = JSON.stringify({ origin: 'elsewhere', kind: 'token', tokenHash: `hash_${port}` })
          expect(await redis.cluster.node(port).publish(bus.channel, wire)).toBeGreaterThanOrEqual(i === 0 ? 0 : 0)
          expect(await arrived).toEqual({ kind: 'token', tokenHash: `hash_${port}` })
        }
      } finally {
        await bus.close()
      }
    })

    it('buses on two Cluster clients hear each other, and the heartbeat keeps them listening', async () => {
      const prefix = redis.prefix()
      const errors: unknown[] = []
      const onError = (error: unknown) => errors.push(error)
      const a = createRedisInvalidationBus({ client: redis.connectCluster(), prefix, heartbeatMs: 50, onError })
      const b = createRedisInvalidationBus({ client: redis.connectCluster(), prefix, heartbeatMs: 50, onError })
      try {
        // New connections subscribing: given more than the deadline on a loaded machine.
        await Promise.all([a.ready(5_000), b.ready(5_000)])
        const arrived = nextInvalidation(b)
        await a.publish({ kind: 'token', tokenHash: 'from-a' })
        expect(await arrived).toEqual({ kind: 'token', tokenHash: 'from-a' })
        // Ten heartbeat intervals: heartbeats (through any master) keep both listening.
        await new Promise((resolve) => setTimeout(resolve, 500))
        expect([a.listening, b.listening]).toEqual([true, true])
        expect(errors).toEqual([])
      } finally {
        await a.close()
        await b.close()
      }
    })

    it('a Cluster subscriber whose connection the bus cannot follow (no ioredis internals) is reported once, and the bus works as before', async () => {
      const prefix = redis.prefix()
      const cluster = redis.connectCluster()
      // The Cluster as a client that hides ioredis' `subscriber` would be (its own methods still see it).
      const hiding = new Proxy(cluster, {
        get(target, name) {
          if (name === 'subscriber') return undefined
          const value: unknown = Reflect.get(target, name, target)
          return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value
        },
      })
      const reported: Array<[string, string]> = []
      const bus = createRedisInvalidationBus({
        client: redis.clusterClient,
        subscriber: hiding,
        prefix,
        onError: (error, context) => reported.push([context, (error as Error).message]),
      })
      try {
        // A new Cluster connection subscribing: given more than the 1 s default deadline on a loaded machine.
        await bus.ready(5_000)
        expect(reported).toEqual([
          [
            'invalidation subscriber',
            'This Redis Cluster client does not show which connection it subscribes on: a subscription it moves to another node goes unnoticed, and messages published meanwhile are lost with the cache kept',
          ],
        ])
        const arrived = nextInvalidation(bus)
        await redis.clusterClient.publish(bus.channel, JSON.stringify({ origin: 'elsewhere', kind: 'token', tokenHash: 'h' }))
        expect(await arrived).toEqual({ kind: 'token', tokenHash: 'h' })
        expect(bus.listening).toBe(true)
      } finally {
        await bus.close()
      }
    })

    it('a Cluster client is `ready` as a whole: the counters count (not taken for an offline queue)', async () => {
      const client = redis.connectCluster()
      // A deadline that leaves room for a loaded machine's first connection: the test is about
      // whether the first call waits for the slots, not how fast.
      const counters = createRedisRateLimitStore({ client, prefix: redis.prefix(), timeoutMs: 5_000 })
      // Before the first `ready` calls wait for the slots, then count.
      expect(await counters.increment('k', START, W)).toBe(1)
      expect(client.status).toBe('ready')
      expect(await counters.increment('k', START, W)).toBe(2)
    })

    it('a write refused READONLY (sent to a master in the instant a failover demotes it, not applied) is sent once more, the slot map read again: counted once, the pin found; not sent again when the wait would end near its deadline', async () => {
      const prefix = redis.prefix()
      // The Cluster client, with the READONLY a demoted master answers given to the first
      // `refuse` calls of each command named (nothing of them sent); everything else is the
      // client's own.
      const sent: string[] = []
      let rereads = 0
      const refuse = new Map<string, number>()
      let refusal = "READONLY You can't write against a read only replica."
      const demoting = new Proxy(redis.clusterClient, {
        get(target, name) {
          if (name === 'refreshSlotsCache') {
            return () => {
              rereads++
              return target.refreshSlotsCache()
            }
          }
          if (name === 'call') {
            return (command: string, ...args: unknown[]) => {
              sent.push(command)
              const left = refuse.get(command) ?? 0
              if (left > 0) {
                refuse.set(command, left - 1)
                return Promise.reject(new ReplyError(refusal))
              }
              return target.call(command, ...(args as string[]))
            }
          }
          const value: unknown = Reflect.get(target, name, target)
          return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value
        },
      })
      const counters = createRedisRateLimitStore({ client: demoting, prefix })
      const sessions = createRedisSessionStore({ client: demoting, prefix })
      expect(await counters.increment('k', START, W)).toBe(1)
      expect(await sessions.set('s', PIN, 60_000)).toBe(true)
      sent.length = 0

      refuse.set('EVALSHA', 1).set('GETEX', 1)
      expect(await counters.increment('k', START, W)).toBe(2)
      expect(await sessions.get('s', 60_000)).toEqual(PIN)
      expect(sent).toEqual(['EVALSHA', 'EVALSHA', 'GETEX', 'GETEX'])
      expect(rereads).toBe(2)

      // A script refused as Redis 6.2 words it (the reply inside the script's error): the same.
      sent.length = 0
      refusal = "ERR Error running script (call to f_0123): @user_script:5: @user_script: 5: -READONLY You can't write against a read only replica."
      refuse.set('EVALSHA', 1)
      expect(await counters.increment('k', START, W)).toBe(3)
      expect(sent).toEqual(['EVALSHA', 'EVALSHA'])
      refusal = "READONLY You can't write against a read only replica."

      // Refused twice: the second refusal is the call's.
      sent.length = 0
      refuse.set('EVALSHA', 2)
      await expect(counters.increment('k', START, W)).rejects.toThrow(/^READONLY /)
      expect(sent).toEqual(['EVALSHA', 'EVALSHA'])

      // A deadline the wait (25 ms) would not end well within (25 ms before it): the refusal is
      // the call's at once, and nothing is sent after it.
      const hasty = createRedisRateLimitStore({ client: demoting, prefix, timeoutMs: 45 })
      sent.length = 0
      refuse.set('EVALSHA', 1)
      await expect(hasty.increment('k', START, W)).rejects.toThrow(/^READONLY /)
      await new Promise((resolve) => setTimeout(resolve, 100))
      expect(sent).toEqual(['EVALSHA'])
      expect(await counters.increment('k', START, W)).toBe(4)
    })

    it('a slot that migrates under a counter and a session (ASK, then MOVED): counts go on, the pin is found', async () => {
      const [fromPort, toPort] = redis.cluster.ports as [number, number, number]
      const from = redis.cluster.node(fromPort)
      const to = redis.cluster.node(toPort)
      const prefix = await prefixOn(redis, fromPort)
      const counterKey = `${prefix}rl:k`
      const slot = Number(await from.call('CLUSTER', 'KEYSLOT', counterKey))
      const [fromId, toId] = [String(await from.call('CLUSTER', 'MYID')), String(await to.call('CLUSTER', 'MYID'))]
      const counters = createRedisRateLimitStore({ client: redis.clusterClient, prefix })
      const sessions = createRedisSessionStore({ client: redis.clusterClient, prefix })
      // The target master never ran the counter's script: the ASK path meets NOSCRIPT there.
      await to.call('SCRIPT', 'FLUSH')
      expect(await counters.increment('k', START, W)).toBe(1)
      expect(await sessions.set('s1', PIN, 60_000)).toBe(true)

      await to.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', fromId)
      await from.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', toId)
      // Still on the source: served there; a new key of the slot is created on the target (ASK).
      expect(await counters.increment('k', START, W)).toBe(2)
      expect(await counters.increment('fresh', START, W)).toBe(1)
      // (Asked of the nodes themselves: a key command there would answer MOVED or ASK.)
      // Keys of earlier tests on the shared cluster may hash to the slot too (regression: one did,
      // and the source refused to hand the slot over): only this test's are compared, and all
      // move, since a master gives a slot away only once it holds none of its keys.
      const slotKeys = async (node: typeof from) => (await node.call('CLUSTER', 'GETKEYSINSLOT', slot, 10_000)) as string[]
      const keysIn = async (node: typeof from) => (await slotKeys(node)).filter((key) => key.startsWith(prefix)).sort()
      expect(await keysIn(to)).toEqual([`${prefix}rl:fresh`])

      const others = (await slotKeys(from)).filter((key) => !key.startsWith(prefix))
      await from.call('MIGRATE', '127.0.0.1', toPort, '', 0, 5_000, 'KEYS', counterKey, `${prefix}session:s1`, ...others)
      // Moved, the slot not yet handed over: the source answers ASK for both.
      expect(await counters.increment('k', START, W)).toBe(3)
      expect(await sessions.get('s1', 60_000)).toEqual(PIN)

      for (const node of [to, from, redis.cluster.node(redis.cluster.ports[2]!)]) await node.call('CLUSTER', 'SETSLOT', slot, 'NODE', toId)
      // Handed over: MOVED, and the client's slot map follows.
      expect(await counters.increment('k', START, W)).toBe(4)
      expect(await counters.increment('fresh', START, W)).toBe(2)
      expect(await sessions.get('s1', 60_000)).toEqual(PIN)
      expect(await redis.clusterClient.hgetall(counterKey)).toEqual({ w: String(START), c: '4' })
      expect(await keysIn(to)).toEqual([counterKey, `${prefix}rl:fresh`, `${prefix}session:s1`].sort())
      expect(await slotKeys(from)).toEqual([])
    })
  })

  describe('two instances sharing the cluster, through the real pipeline and the MCP SDK client', () => {
    twoInstancesSuite(redis, { keepAlive: false })
  })
  describe('the OAuth validation cache, shared by two instances through the cluster', () => {
    sharedValidationCacheSuite(redis)
  })
})


/** The master (its port) of each hash slot, as the cluster has them now. */
async function slotMasters(redis: RedisClusterTestContext): Promise<(slot: number) => number> {
  const ranges = (await redis.clusterClient.call('CLUSTER', 'SLOTS')) as Array<[number, number, [string, number, ...unknown[]]]>
  return (slot) => {
    const range = ranges.find(([from, to]) => slot >= from && slot <= to)
    if (!range) throw new Error(`slot ${slot} has no master`)
    return Number(range[2][1])
  }
}

/** The deadline of the stores in the tests of a master going down. */
const TIMEOUT_MS = 200

/**
 * One master killed, on a cluster of its own per ioredis major (the killed master does not
 * come back): no replica takes its slots, and the others mark it failed only after
 * `cluster-node-timeout` (15 s, the default), so for the length of the test the other two
 * serve their slots.
 */
function describeMasterDown(kind: 'ioredis' | 'ioredis5', cluster: TestRedisCluster | undefined) {
  describeRedisCluster(
    'a master of the Redis Cluster goes down',
    cluster,
    (redis) => {
      it('the stores on the other masters keep serving; the dead master\'s calls fail, the first at its deadline, the next at once (regression: one dead shard refused them all)', async () => {
        const [healthy, other, dead] = redis.cluster.ports as [number, number, number]
        const client = redis.connectCluster({ maxRetriesPerRequest: 1 })
        const on = async (port: number) => {
          const prefix = await prefixOn(redis, port)
          return {
            counters: createRedisRateLimitStore({ client, prefix, timeoutMs: TIMEOUT_MS }),
            sessions: createRedisSessionStore({ client, prefix, timeoutMs: TIMEOUT_MS }),
          }
        }
        const stores = { [healthy]: await on(healthy), [other]: await on(other), [dead]: await on(dead) }
        // Connected to every master first, with no deadline: on a loaded CI machine the first
        // call (slot map, socket) can take longer than the stores' 200 ms.
        await Promise.all(redis.cluster.ports.map(async (port) => client.get(`${await prefixOn(redis, port)}warm`)))
        for (const port of redis.cluster.ports) {
          expect(await stores[port]!.counters.increment('k', START, W)).toBe(1)
          expect(await stores[port]!.sessions.set('s', PIN, 60_000)).toBe(true)
        }
        // Sessions of a client with a keyPrefix: one on the dead master, and five on live ones
        // whose keys without the client's prefix would be on the master the first one's is.
        const tenant = redis.connectCluster({ maxRetriesPerRequest: 1, keyPrefix: 'tenant1:' })
        const tenantPrefix = redis.prefix()
        const tenantSessions = createRedisSessionStore({ client: tenant, prefix: tenantPrefix, timeoutMs: TIMEOUT_MS })
        const masterOfSlot = await slotMasters(redis)
        const sent = (id: string) => masterOfSlot(hashSlot(`tenant1:${tenantPrefix}session:${id}`))
        const unprefixed = (id: string) => masterOfSlot(hashSlot(`${tenantPrefix}session:${id}`))
        const ids = Array.from({ length: 2_000 }, (_, i) => `t${i}`)
        const onDead = ids.find((id) => sent(id) === dead)!
        const live = ids.filter((id) => sent(id) !== dead && unprefixed(id) === unprefixed(onDead)).slice(0, 5)
        expect(live).toHaveLength(5)
        const tenantIds = { onDead, live }
        for (const id of [onDead, ...live]) expect(await tenantSessions.set(id, PIN, 60_000)).toBe(true)

        await redis.cluster.kill(dead)
        try {
          const outcomes: Array<{ port: number; outcome: string; ms: number }> = []
          for (let round = 2; round <= 6; round++) {
            for (const port of redis.cluster.ports) {
              const started = performance.now()
              const outcome = await Promise.all([stores[port]!.counters.increment('k', START, W), stores[port]!.sessions.get('s', 60_000)]).then(
                ([count, pin]) => `${String(count)} ${pin?.version ?? 'no pin'}`,
                (error: Error) => error.message,
              )
              outcomes.push({ port, outcome, ms: performance.now() - started })
            }
          }
          for (const port of [healthy, other]) {
            expect(outcomes.filter((o) => o.port === port).map((o) => o.outcome)).toEqual(['2 1.2.3', '3 1.2.3', '4 1.2.3', '5 1.2.3', '6 1.2.3'])
          }
          const deadOutcomes = outcomes.filter((o) => o.port === dead)
          expect(deadOutcomes.every((o) => /did not answer|not sent/.test(o.outcome))).toBe(true)
          // Never a hang: one deadline at most, and at once once the node's stall showed (but
          // for a probe, one deadline after it).
          expect(Math.max(...deadOutcomes.map((o) => o.ms))).toBeLessThan(TIMEOUT_MS + 400)
          // The calls refused at once are told by the breaker's message, not by their time (a
          // loaded machine can delay any call): at least three, sent nowhere.
          const refused = deadOutcomes.filter((o) => /not sent: Redis .* is stalled/.test(o.outcome))
          expect(refused.length).toBeGreaterThanOrEqual(3)
          expect(deadOutcomes.slice(1).some((o) => o.outcome.includes(`127.0.0.1:${dead} is stalled`))).toBe(true)

          // A client with ioredis' own keyPrefix: the master of a call is the one of the key the
          // client sends, prefix and all (regression: found from the key without it, a call to
          // the dead master opened the breaker of another, whose calls were then refused).
          const tenantCall = async (id: string) => Promise.resolve(tenantSessions.get(id, 60_000)).then((pin) => pin?.version ?? 'no pin', (error: Error) => error.message)
          expect(await tenantCall(tenantIds.onDead)).toMatch(/did not answer|not sent/)
          for (const id of tenantIds.live) expect(await tenantCall(id), id).toBe('1.2.3')
        } finally {
          await redis.cluster.restart(dead)
        }
      })

      it('through the pipeline: counters on the dead master fail open, reported; sessions on a live one are served; sessions on the dead one 503', async () => {
        const [healthy, , dead] = redis.cluster.ports as [number, number, number]
        const client = redis.connectCluster({ maxRetriesPerRequest: 1 })
        const onDead = await prefixOn(redis, dead)
        const onHealthy = await prefixOn(redis, healthy)
        // Connected to both masters first, with no deadline (as above).
        await Promise.all([client.get(`${onDead}warm`), client.get(`${onHealthy}warm`)])
        // A session on the live master, counters on the dead one.
        const live = { client, prefix: onHealthy, timeoutMs: TIMEOUT_MS }
        const deadMaster = { client, prefix: onDead, timeoutMs: TIMEOUT_MS }
        const a = await createRedisStorePipeline(live, deadMaster)
        // The other way round.
        const b = await createRedisStorePipeline(deadMaster, live)
        try {
          expect(await a.send({ 'x-open-session': 'on-live' })).toMatchObject({ status: 200, ratelimit: '"minute";r=999;t=30' })
          expect(await b.send({ 'x-open-session': 'on-dead' })).toMatchObject({ status: 200, ratelimit: '"minute";r=999;t=30' })
          expect([...a.reported(), ...b.reported()]).toEqual([])

          await redis.cluster.kill(dead)
          for (let i = 0; i < 4; i++) {
            const served = await a.send({ 'mcp-session-id': 'on-live' })
            expect(served).toMatchObject({ status: 200, ratelimit: null })
            expect(served.ms).toBeLessThan(TIMEOUT_MS + 400)
            const refused = await b.send({ 'mcp-session-id': 'on-dead' })
            expect(refused.status).toBe(503)
            expect(refused.ms).toBeLessThan(TIMEOUT_MS + 400)
          }
          const counted = await b.send()
          expect(counted).toMatchObject({ status: 200, ratelimit: '"minute";r=994;t=30' })
          const failedOpen = a.reported()
          expect(failedOpen.map(([context]) => context)).toEqual(Array(4).fill('rate-limit store failed; serving (failOpen)'))
          expect(failedOpen.every(([, message]) => /^Redis script rate-limit increment (did not answer|not sent)/.test(message!))).toBe(true)
          // Its sessions, on the dead master, failed each time. Its counters are on a live one: a
          // call there may be held past its deadline while ioredis learns the other node is gone
          // (seen once in CI, with ioredis 5, on a busy machine): served all the same (failOpen),
          // never refused, and at most once.
          const bReported = b.reported().map(([context]) => context)
          expect(bReported.filter((context) => context === 'sessions failed')).toHaveLength(4)
          const others = bReported.filter((context) => context !== 'sessions failed')
          expect(others.length <= 1 && others.every((context) => context === 'rate-limit store failed; serving (failOpen)'), others.join('; ')).toBe(true)
        } finally {
          await a.fixture.close()
          await b.fixture.close()
          await redis.cluster.restart(dead)
        }
      })

      it('the bus whose subscriber\'s master dies drops its caches and hears the others again (ioredis moves the subscription; regression: unnoticed)', async () => {
        const prefix = redis.prefix()
        const [first, second] = [redis.connectCluster({ connectionName: 'listener' }), redis.connectCluster()]
        const listener = createRedisInvalidationBus({ client: first, prefix, timeoutMs: TIMEOUT_MS, onError: () => {} })
        const sender = createRedisInvalidationBus({ client: second, prefix, timeoutMs: TIMEOUT_MS, onError: () => {} })
        const drops: boolean[] = []
        try {
          // New Cluster connections subscribing: more than the 200 ms deadline on a loaded machine.
          await Promise.all([listener.ready(5_000), sender.ready(5_000)])
          listener.subscribe((message) => void (message.kind === 'all' && drops.push(listener.listening === true)))
          // The master the listener's subscription is on (its connection is named for it).
          let subscribedOn: number | undefined
          for (const port of redis.cluster.ports) {
            const clients = String(await redis.cluster.node(port).call('CLIENT', 'LIST'))
            if (/name=ioredis-cluster\(subscriber\):listener .* sub=[1-9]/.test(clients)) subscribedOn = port
          }
          expect(subscribedOn).toBeDefined()
          await redis.cluster.kill(subscribedOn!)
          await vi.waitFor(
            async () => {
              const arrived = nextInvalidation(listener)
              await Promise.resolve(sender.publish({ kind: 'token', tokenHash: 'after' })).catch(() => {})
              await expect(Promise.race([arrived, new Promise((resolve) => setTimeout(resolve, 100, 'nothing'))])).resolves.toEqual({
                kind: 'token',
                tokenHash: 'after',
              })
            },
            { timeout: 5_000, interval: 50 },
          )
          // Told of the move as of a reconnect: the cache dropped as it stopped listening, and
          // again as it listened once more (what was published in between was lost), once its
          // own SUBSCRIBE is confirmed (moments after ioredis's).
          await vi.waitFor(() => expect(listener.listening).toBe(true), { timeout: 1_000, interval: 10 })
          expect(drops).toEqual([false, true])
        } finally {
          await listener.close()
          await sender.close()
          for (const port of redis.cluster.ports) await redis.cluster.restart(port)
        }
      })
    },
    { kinds: [kind] },
  )
}

// Each on a cluster of its own: every test ends a master.
describeMasterDown('ioredis', downOn6)
describeMasterDown('ioredis5', downOn5)
