/**
 * The Redis stores on a Redis Cluster whose masters each have a replica (the topology
 * production platforms run), when a master fails over: three masters and three replicas on
 * loopback, with a `cluster-node-timeout` of 1 s so that a failover takes seconds, started by
 * this file (test/helpers/redis-cluster.ts), one cluster per ioredis major.
 *
 * - A manual failover (`CLUSTER FAILOVER` on a replica): nothing is lost, no call fails, ioredis
 *   follows `MOVED`, and the new master has a stall breaker of its own.
 * - A master killed: its calls fail (503, the rate limit failing open) until its replica is
 *   promoted, then they are served again, the counters and pins carried over, without
 *   restarting anything.
 * - A master that hangs (its connections up, nothing answered): the same, which needs the
 *   stores to ask ioredis to read the slot map again (regression: refused for as long as it hung).
 * - The invalidation bus when the node its subscription is on dies or hangs: it drops its
 *   caches and hears the others again (regressions: the move went unnoticed; it stayed deaf).
 *
 * Each test puts the cluster back as it was started after it (`restore`), and each fails over
 * a different master, so that no election waits for the masters' votes of the one before.
 */
import type { SessionPin } from 'mcp-dispatch'
import {
  type RedisInvalidationBus,
  createRedisCacheStore,
  createRedisInvalidationBus,
  createRedisRateLimitStore,
  createRedisSessionStore,
} from 'mcp-dispatch/redis'
import { afterEach, expect, it, vi } from 'vitest'
import { type RedisClusterTestContext, type TestRedisCluster, describeRedisCluster, prefixOn, startRedisClusters } from '../helpers/redis-cluster.js'
import { nextInvalidation } from '../helpers/redis.js'
import { createRedisStorePipeline } from '../robustness/support.js'

/** The servers' `cluster-node-timeout`: a master unreachable this long is failed over. */
const NODE_TIMEOUT_MS = 1_000

const [on6, on5] = (await startRedisClusters([
  { ports: [17211, 17212, 17213], replicaPorts: [17214, 17215, 17216], nodeTimeoutMs: NODE_TIMEOUT_MS },
  { ports: [17221, 17222, 17223], replicaPorts: [17224, 17225, 17226], nodeTimeoutMs: NODE_TIMEOUT_MS },
])) ?? []

const PIN: SessionPin = { appId: 'app_1', version: '1.2.3', subject: 'user_1' }
const W = 60_000
const START = 1_700_000_040_000 - (1_700_000_040_000 % W)
/** The stores' deadline. */
const TIMEOUT_MS = 200
/** Longest a failing call may take: its deadline, and room for a loaded CI machine (a hang waits seconds). */
const AT_MOST_MS = TIMEOUT_MS + 400
/**
 * The deadline of the calls made through a failover by hand: the old master holds writes until
 * its replica has won the election. That takes under 100 ms on a quiet machine, but a clean-clone
 * CI run, its Redis processes short of CPU beside the test workers, once saw a call wait longer
 * than a second (it failed at its deadline, and the breaker then refused the next calls). Redis
 * itself bounds the hold (twice its 5 s manual-failover timeout); the test gives the calls the
 * 5 s it allows the whole failover, as a platform that wants no failures through one must.
 */
const FAILOVER_TIMEOUT_MS = 5_000
/** How long a new Cluster connection gets to subscribe (ready()'s default is the deadline, 200 ms). */
const SUBSCRIBED_WITHIN_MS = 5_000

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * A bus whose subscription is on the node on `port`: ioredis subscribes on a node of those it
 * knows when it connects, its startup nodes, so its client is given that one only.
 */
async function busOn(redis: RedisClusterTestContext, port: number, prefix: string, options: { heartbeatMs?: number; onError?: (error: unknown) => void }) {
  const client = redis.connectCluster({ connectionName: 'listener' }, [{ host: '127.0.0.1', port }])
  const bus = createRedisInvalidationBus({ client, prefix, timeoutMs: TIMEOUT_MS, onError: () => {}, ...options })
  await bus.ready(SUBSCRIBED_WITHIN_MS)
  expect(String(await redis.cluster.node(port).call('CLIENT', 'LIST'))).toMatch(/name=ioredis-cluster\(subscriber\):listener .* sub=[1-9]/)
  return bus
}

/** What a bus delivered to its listener, in order, with when: numbered tokens and cache drops. */
function recordDeliveries(bus: RedisInvalidationBus) {
  const delivered: Array<{ at: number; token?: number; all?: boolean; listening: boolean }> = []
  bus.subscribe((message) => {
    const at = performance.now()
    if (message.kind === 'all') delivered.push({ at, all: true, listening: bus.listening === true })
    else delivered.push({ at, token: Number(message.tokenHash), listening: bus.listening === true })
  })
  return delivered
}

/**
 * Publishes numbered tokens through `sender`, one every 5 ms, until `stop()`, which answers
 * when each was published (`performance.now()` as its `PUBLISH` was sent).
 */
function publishNumbered(sender: RedisInvalidationBus) {
  const sentAt: number[] = []
  let stopped = false
  const done = (async () => {
    while (!stopped) {
      sentAt.push(performance.now())
      await Promise.resolve(sender.publish({ kind: 'token', tokenHash: String(sentAt.length - 1) })).catch(() => {})
      await sleep(5)
    }
  })()
  return {
    /** How many were sent after `at` (performance.now()) so far. */
    sentAfter: (at: number) => sentAt.filter((sent) => sent > at).length,
    async stop() {
      stopped = true
      await done
      return sentAt
    },
  }
}

/**
 * The tokens published (at `sentAt`) that the bus never delivered and that no cache drop
 * (`all`) followed within a second: invalidations lost with the caches kept. (Not the next
 * token delivered: pub/sub across nodes keeps no order, a `PUBLISH` on the subscriber's own
 * node arriving before one forwarded from another.)
 */
function lostUnnoticed(delivered: ReturnType<typeof recordDeliveries>, sentAt: number[]): number[] {
  const tokens = new Set(delivered.flatMap((d) => (d.token === undefined ? [] : [d.token])))
  return sentAt.flatMap((at, n) => (tokens.has(n) || delivered.some((d) => d.all && d.at >= at && d.at < at + 1_000) ? [] : [n]))
}

/**
 * Watches the cluster promote `replica` after its master failed at `since`, in ms after it:
 * `tookOver`, when the replica itself reports the master role (it takes its master's slots the
 * moment it wins the election, and a client that reads the slot map from it is served from
 * then on), and `agreed`, when every node names it and reports the cluster ok, which under
 * load comes hundreds of ms later. `agreedSoFar()` is infinite until then.
 */
function watchPromotion(redis: RedisClusterTestContext, replica: number, since: number) {
  let agreedAt = Number.POSITIVE_INFINITY
  const agreed = redis.cluster.awaitMaster(replica, 10_000).then(() => (agreedAt = performance.now()) - since)
  const tookOver = redis.cluster.awaitSelfPromoted(replica, 10_000).then(() => performance.now() - since)
  agreed.catch(() => {})
  tookOver.catch(() => {})
  return { agreedSoFar: () => agreedAt - since, done: async () => ({ tookOver: await tookOver, agreed: await agreed }) }
}

/**
 * When `port` first says the cluster is down (`cluster_state:fail`, after which it answers every
 * key CLUSTERDOWN), in ms from `since`; watched every 10 ms until `stop()`.
 */
function watchClusterDown(redis: RedisClusterTestContext, port: number, since: number) {
  let downAt = Number.POSITIVE_INFINITY
  let stopped = false
  const watching = (async () => {
    while (!stopped && downAt === Number.POSITIVE_INFINITY) {
      const info = String(await redis.cluster.node(port).call('CLUSTER', 'INFO').catch(() => ''))
      if (info.includes('cluster_state:fail')) downAt = performance.now() - since
      else await sleep(10)
    }
  })()
  return {
    stop: async () => {
      stopped = true
      await watching
      return downAt
    },
  }
}

function describeFailover(kind: 'ioredis' | 'ioredis5', cluster: TestRedisCluster | undefined) {
  describeRedisCluster(
    'a Redis Cluster with a replica per master, when a node fails',
    cluster,
    (redis) => {
      afterEach(() => redis.cluster.restore())

      it('a master failed over by hand (CLUSTER FAILOVER on its replica): no call fails, the counts go on one by one, pins and cached values are found, and the new master has a stall breaker of its own', async () => {
        const [master, other] = redis.cluster.ports as [number, number, number]
        const replica = redis.cluster.replicaPorts[0]!
        const client = redis.connectCluster({ maxRetriesPerRequest: 1 })
        const prefix = await prefixOn(redis, master)
        const counters = createRedisRateLimitStore({ client, prefix, timeoutMs: FAILOVER_TIMEOUT_MS })
        const sessions = createRedisSessionStore({ client, prefix, timeoutMs: FAILOVER_TIMEOUT_MS })
        const cache = createRedisCacheStore<{ n: number }>({ client, prefix, localTtlMs: 0, timeoutMs: FAILOVER_TIMEOUT_MS })
        // Connected to the master first, with no deadline: on a loaded machine the first call
        // (slot map, socket) can take longer than the stores' deadline.
        await client.get(`${prefix}warm`)
        expect(await counters.increment('k', START, W)).toBe(1)
        expect(await sessions.set('s', PIN, 60_000)).toBe(true)
        await cache.set('c', { n: 1 }, 60_000)

        // Calls go on, one round after the other, all through the failover.
        const rounds: Array<{ outcome: unknown; ms: number }> = []
        let stopped = false
        const traffic = (async () => {
          while (!stopped) {
            const started = performance.now()
            const outcome = await Promise.all([counters.increment('k', START, W), sessions.get('s', 60_000), cache.get('c')]).catch(
              (error: Error) => error.message,
            )
            rounds.push({ outcome, ms: performance.now() - started })
            await sleep(2)
          }
        })()
        await sleep(50)
        const tookMs = await redis.cluster.failover(replica)
        const after = rounds.length
        await vi.waitFor(() => expect(rounds.length).toBeGreaterThan(after + 10), { timeout: 5_000, interval: 10 })
        stopped = true
        await traffic

        expect(await redis.cluster.masters()).toEqual([replica, ...redis.cluster.ports.slice(1)])
        expect(tookMs).toBeLessThan(5_000)
        console.info(
          `[${kind}] manual failover to ${replica}: ${tookMs.toFixed(0)} ms; ${rounds.length} rounds of calls, the longest ${Math.max(...rounds.map((round) => round.ms)).toFixed(0)} ms`,
        )
        // Every call answered (MOVED followed), in time; each count once, none lost. A call that
        // reaches the old master in the instant it steps down is refused READONLY (seen once in
        // CI, ioredis 6, before the stores sent such a call again): a write refused is not
        // applied, so the counts of the others go on. The stores now send it once more 25 ms
        // later (test/stores/redis-cluster.test.ts); a second refusal within the hold is still
        // allowed here.
        const served = rounds.filter((round) => typeof round.outcome !== 'string')
        const refused = rounds.filter((round) => typeof round.outcome === 'string')
        expect(refused.filter((round) => !String(round.outcome).startsWith('READONLY '))).toEqual([])
        expect(refused.length).toBeLessThanOrEqual(2)
        expect(Math.max(...rounds.map((round) => round.ms))).toBeLessThan(FAILOVER_TIMEOUT_MS)
        const counts = served.map((round) => (round.outcome as [number, unknown, unknown])[0])
        if (refused.length === 0) expect(counts).toEqual(counts.map((_, i) => i + 2))
        else {
          // A refused round's increment may have landed before its pin read was refused: the
          // counts still rise one by one, with at most one gap per refused round.
          expect(counts.every((count, i) => i === 0 || count > counts[i - 1]!)).toBe(true)
          expect(counts.at(-1)! - 1).toBeGreaterThanOrEqual(served.length)
          expect(counts.at(-1)! - 1).toBeLessThanOrEqual(rounds.length)
        }
        expect(served.every((round) => JSON.stringify((round.outcome as unknown[]).slice(1)) === JSON.stringify([PIN, { n: 1 }]))).toBe(true)
        // Kept by the new master.
        expect(await redis.cluster.node(replica).hget(`${prefix}rl:k`, 'c')).toBe(String(counts.at(-1)))

        // The new master hangs for a moment (no failover: failovers held off around it, as a
        // loaded machine can stretch the moment past the 1 s node timeout): its breaker opens
        // (the first call fails at its deadline, the next at once, named for it), the other
        // masters serve, and its first answers close it.
        const onOther = await prefixOn(redis, other)
        const elsewhere = createRedisSessionStore({ client, prefix: onOther, timeoutMs: TIMEOUT_MS })
        // The client has not used that master yet: connected first, with no deadline (its first
        // call, a new socket, can take longer than 200 ms on a loaded machine).
        await client.get(`${onOther}warm`)
        // The pins again, on the stores' usual deadline.
        const pins = createRedisSessionStore({ client, prefix, timeoutMs: TIMEOUT_MS })
        expect(await elsewhere.set('s', PIN, 60_000)).toBe(true)
        await redis.cluster.holdFailovers()
        redis.cluster.hang(replica)
        try {
          const started = performance.now()
          await expect(pins.get('s', 60_000)).rejects.toThrow(/did not answer within 200 ms/)
          expect(performance.now() - started).toBeLessThan(AT_MOST_MS)
          // The next call in a later turn of the event loop, as a server's next request is: a
          // deadline noticed late (a loaded machine) opens the breaker only once the socket has
          // been read, after this turn (CI's run sent the next call within it, and it waited).
          await new Promise((resolve) => setImmediate(resolve))
          await expect(pins.get('s', 60_000)).rejects.toThrow(`Redis GETEX not sent: Redis 127.0.0.1:${replica} is stalled`)
          expect(await elsewhere.get('s', 60_000)).toEqual(PIN)
        } finally {
          redis.cluster.resume(replica)
        }
        await vi.waitFor(async () => expect(await pins.get('s', 60_000)).toEqual(PIN), { timeout: 5_000, interval: 50 })
        await redis.cluster.releaseFailovers()
      })

      it('a master killed: its sessions answer 503 and its counters fail open until its replica is promoted, then both are served again, the count and the pin carried over (the first served in bounded time after the promotion)', async () => {
        const [live, dead] = redis.cluster.ports as [number, number, number]
        const replica = redis.cluster.replicaPorts[1]!
        const client = redis.connectCluster({ maxRetriesPerRequest: 1 })
        const onDead = await prefixOn(redis, dead)
        const onLive = await prefixOn(redis, live)
        const dying = await createRedisStorePipeline({ client, prefix: onDead, timeoutMs: TIMEOUT_MS })
        const living = await createRedisStorePipeline({ client, prefix: onLive, timeoutMs: TIMEOUT_MS })
        // Connected to both masters first, with no deadline: on a loaded machine the first
        // connection (slot map, socket) took longer than the stores' 200 ms, and the first count
        // failed open.
        await Promise.all([client.get(`${onDead}warm`), client.get(`${onLive}warm`)])
        try {
          expect(await dying.send({ 'x-open-session': 'pinned' })).toMatchObject({ status: 200, ratelimit: '"minute";r=999;t=30' })
          expect(await living.send({ 'x-open-session': 'pinned' })).toMatchObject({ status: 200, ratelimit: '"minute";r=999;t=30' })
          await redis.cluster.replicated(dead)

          await redis.cluster.kill(dead)
          const killedAt = performance.now()
          const promotion = watchPromotion(redis, replica, killedAt)
          const clusterDown = watchClusterDown(redis, live, killedAt)
          const log: Array<{ at: number; pinned: number; sessionless: string | null; sessionlessStatus: number; live: number; liveDone: number; ms: number }> = []
          // Until the dead master's pin and counters have been served ten times in a row.
          while (log.length < 10 || !log.slice(-10).every((round) => round.pinned === 200 && round.sessionless !== null)) {
            const at = performance.now()
            // The sessionless request first, alone: the first count it gets after the promotion
            // tells whether the counter carried over (the other two count too, in whatever order).
            const sessionless = await dying.send()
            const [pinned, alive] = await Promise.all([dying.send({ 'mcp-session-id': 'pinned' }), living.send({ 'mcp-session-id': 'pinned' })])
            log.push({
              at: at - killedAt,
              pinned: pinned.status,
              sessionless: sessionless.ratelimit,
              sessionlessStatus: sessionless.status,
              live: alive.status,
              // When the live master's answer was in: the round began up to a deadline (the
              // sessionless request's) and a stall earlier.
              liveDone: performance.now() - killedAt,
              ms: Math.max(pinned.ms, sessionless.ms, alive.ms),
            })
            if (performance.now() - killedAt > 10_000) break
            await sleep(25)
          }
          const { tookOver: selfPromoted, agreed: promoted } = await promotion.done()
          const liveSaidDown = await clusterDown.stop()
          const recovered = log.find((round) => round.pinned === 200)!
          console.info(
            `[${kind}] killed master ${dead}: replica ${replica} took over after ${selfPromoted.toFixed(0)} ms, promoted (every node agreeing) after ${promoted.toFixed(0)} ms; its slots served again ${(recovered.at - selfPromoted).toFixed(0)} ms after it took over; ` +
              `the live master said the cluster was down after ${liveSaidDown.toFixed(0)} ms; its sessions failed from ${log.find((round) => round.live !== 200)?.at.toFixed(0) ?? '-'} to ${log.findLast((round) => round.live !== 200)?.at.toFixed(0) ?? '-'} ms (CLUSTERDOWN)`,
          )

          // Never a hang.
          expect(Math.max(...log.map((round) => round.ms))).toBeLessThan(AT_MOST_MS)
          // Before the promotion: the pinned session 503, the counter failing open (served, no header).
          const gap = log.filter((round) => round.at + AT_MOST_MS < selfPromoted)
          // Some rounds fell in it (over ten on a quiet machine; five with the CPU oversubscribed
          // fivefold, each round then slower: at least three are asked).
          expect(gap.length).toBeGreaterThanOrEqual(3)
          expect(gap.filter((round) => !(round.pinned === 503 && round.sessionless === null && round.sessionlessStatus === 200))).toEqual([])
          // The other masters serve until the cluster marks the dead one failed (about the node
          // timeout after the kill: sooner where a ping was already unanswered when it died, as
          // on a loaded machine; CI's run once saw it before 1 s), when every master answers
          // CLUSTERDOWN until the promotion: a live master's call fails only once it has said
          // so (a round in flight then may fail, its call retried by ioredis past the deadline;
          // this watch reads the state every 10 ms, hence the 50 ms of slack).
          expect(log.filter((round) => round.live !== 200 && round.liveDone + 50 < liveSaidDown)).toEqual([])
          // After it: served again, in bounded time, without restarting anything (the other
          // masters too, whose breakers CLUSTERDOWN opened); from then on, always.
          expect(recovered.at - promoted).toBeLessThan(2_000)
          const since = log.findLast((round) => round.pinned !== 200 || round.live !== 200 || round.sessionless === null)!
          expect(since.at - promoted).toBeLessThan(2_000)
          // The pin was found (a lost one answers 404), and the count carried on: the first
          // request counted after the promotion is the second of the window (r=998) or later; a
          // counter lost with the dead master would start again (r=999).
          const counted = log.find((round) => round.sessionless !== null && round.at > 0)!
          const remaining = Number(/r=(\d+)/.exec(counted.sessionless!)?.[1])
          expect(remaining).toBeLessThanOrEqual(998)
          expect(remaining).toBeGreaterThan(980)
          expect(dying.reported().map(([context]) => context)).toContain('sessions failed')
        } finally {
          await dying.fixture.close()
          await living.fixture.close()
        }
      })

      it('a master that hangs (SIGSTOP: its connections up, nothing answered): its calls are served again once its replica is promoted, while it still hangs (regression: refused for as long as it hung, ioredis never learning of the new master)', async () => {
        const hung = redis.cluster.ports[2]!
        const replica = redis.cluster.replicaPorts[2]!
        const client = redis.connectCluster({ maxRetriesPerRequest: 1 })
        const prefix = await prefixOn(redis, hung)
        const counters = createRedisRateLimitStore({ client, prefix, timeoutMs: TIMEOUT_MS })
        const sessions = createRedisSessionStore({ client, prefix, timeoutMs: TIMEOUT_MS })
        // Connected to the master first, with no deadline, as above: on a loaded CI machine the
        // first count (slot map, socket) took longer than the stores' 200 ms.
        await client.get(`${prefix}warm`)
        expect(await counters.increment('k', START, W)).toBe(1)
        expect(await sessions.set('s', PIN, 60_000)).toBe(true)
        await redis.cluster.replicated(hung)

        redis.cluster.hang(hung)
        const hungAt = performance.now()
        const promotion = watchPromotion(redis, replica, hungAt)
        const log: Array<{ at: number; outcome: string; ms: number }> = []
        while (performance.now() - hungAt - Math.min(promotion.agreedSoFar(), 10_000) < 4_000) {
          const started = performance.now()
          const outcome = await Promise.all([counters.increment('k', START, W), sessions.get('s', 60_000)]).then(
            ([count, pin]) => `${String(count)} ${pin?.version}`,
            (error: Error) => error.message,
          )
          log.push({ at: started - hungAt, outcome, ms: performance.now() - started })
          if (log.length >= 5 && log.slice(-5).every((round) => !/not|did/.test(round.outcome))) break
          await sleep(25)
        }
        const { tookOver: selfPromoted, agreed: promoted } = await promotion.done()
        const recovered = log.find((round) => !/not|did/.test(round.outcome))
        console.info(`[${kind}] hung master ${hung}: replica ${replica} took over after ${selfPromoted.toFixed(0)} ms, promoted (every node agreeing) after ${promoted.toFixed(0)} ms; its slots served again ${recovered ? `${(recovered.at - selfPromoted).toFixed(0)} ms after it took over` : 'never'}`)

        expect(Math.max(...log.map((round) => round.ms))).toBeLessThan(AT_MOST_MS)
        expect(log.filter((round) => round.at + AT_MOST_MS < selfPromoted && !/did not answer|not sent/.test(round.outcome))).toEqual([])
        expect(recovered, 'served again while the old master still hangs').toBeDefined()
        // Recovery: the next probe after the promotion (one per 2 deadlines) has the slot map read
        // again, which may first ask the hung node (ioredis gives it 1 s); measured up to 1.4 s (bounds here leave room for a loaded machine).
        expect(recovered!.at - promoted).toBeLessThan(3_500)
        // The count carried on (a lost counter would start again at 1), the pin found.
        expect(recovered!.outcome).toMatch(/^[2-9] 1\.2\.3$/)
      })

      it('the bus subscribed on a node that is killed drops its caches at once and hears the others again, an invalidation lost meanwhile always followed by a cache drop (regression: the subscription moved unnoticed)', async () => {
        const node = redis.cluster.replicaPorts[0]!
        const prefix = redis.prefix()
        const errors: unknown[] = []
        const listener = await busOn(redis, node, prefix, { onError: (error) => errors.push(error) })
        const sender = createRedisInvalidationBus({ client: redis.connectCluster(), prefix, timeoutMs: TIMEOUT_MS, onError: () => {} })
        const delivered = recordDeliveries(listener)
        try {
          await sender.ready(SUBSCRIBED_WITHIN_MS)
          const publishing = publishNumbered(sender)
          await sleep(100)
          const killedAt = performance.now()
          await redis.cluster.kill(node)
          await vi.waitFor(() => expect(delivered.some((d) => d.all && d.listening && d.at > killedAt)).toBe(true), { timeout: 2_000, interval: 10 })
          const listeningAgain = delivered.find((d) => d.all && d.listening && d.at > killedAt)!.at
          // More than ten published once it listened again (200 ms on an idle machine; a loaded
          // one published exactly ten in 200 ms, so the count is waited for, not the time).
          await vi.waitFor(() => expect(publishing.sentAfter(listeningAgain)).toBeGreaterThan(10), { timeout: 5_000, interval: 10 })
          const sentAt = await publishing.stop()
          // Every token published once it listened again is heard; the last ones, forwarded
          // between nodes, arrive after their PUBLISH is answered: waited for (a fixed 50 ms could
          // end first on a loaded machine), up to 2 s.
          const late = sentAt.flatMap((at, n) => (at > listeningAgain ? [n] : []))
          const unheard = () => late.filter((n) => !delivered.some((d) => d.token === n))
          await vi.waitFor(() => expect(unheard()).toEqual([]), { timeout: 2_000, interval: 10 }).catch(() => {})

          // Dropped at once, listening off (well before the heartbeat could tell: 1.2 s); listening
          // again moments later. The bound leaves room for a loaded machine between the SIGKILL
          // and the end of the connection reaching this process.
          const dropped = delivered.find((d) => d.at >= killedAt && d.all && !d.listening)
          expect(dropped).toBeDefined()
          expect(dropped!.at - killedAt).toBeLessThan(500)
          expect(listeningAgain - killedAt).toBeLessThan(1_000)
          const lost = sentAt.length - new Set(delivered.map((d) => d.token).filter((n) => n !== undefined)).size
          console.info(
            `[${kind}] the bus's node ${node} killed: cache dropped after ${(dropped!.at - killedAt).toFixed(0)} ms, listening again after ${(listeningAgain - killedAt).toFixed(0)} ms; ${lost} of ${sentAt.length} tokens lost`,
          )
          expect(lostUnnoticed(delivered, sentAt)).toEqual([])
          // Heard again: every token published once it listened again.
          expect(late.length).toBeGreaterThan(10)
          expect(unheard()).toEqual([])
          expect(listener.listening).toBe(true)
          expect(errors).toEqual([])
        } finally {
          await listener.close()
          await sender.close()
        }
      })

      it('the bus subscribed on a node that hangs goes deaf (cache off), then hears the others again once the cluster marked the node failed, while it still hangs (regression: deaf until the node answered)', async () => {
        const node = redis.cluster.replicaPorts[1]!
        const prefix = redis.prefix()
        const listener = await busOn(redis, node, prefix, { heartbeatMs: 100 })
        const sender = createRedisInvalidationBus({ client: redis.connectCluster(), prefix, timeoutMs: TIMEOUT_MS, onError: () => {} })
        try {
          await sender.ready(SUBSCRIBED_WITHIN_MS)
          redis.cluster.hang(node)
          const hungAt = performance.now()
          // Silent for a heartbeat interval and a deadline after its heartbeat: deaf.
          await vi.waitFor(() => expect(listener.listening).toBe(false), { timeout: 2_000, interval: 10 })
          const deafAfter = performance.now() - hungAt
          let heardAfter = Number.POSITIVE_INFINITY
          await vi.waitFor(
            async () => {
              const arrived = nextInvalidation(listener)
              await Promise.resolve(sender.publish({ kind: 'token', tokenHash: 'after' })).catch(() => {})
              await expect(Promise.race([arrived, sleep(100).then(() => 'nothing')])).resolves.toEqual({ kind: 'token', tokenHash: 'after' })
              heardAfter = performance.now() - hungAt
            },
            { timeout: 8_000, interval: 50 },
          )
          console.info(`[${kind}] the bus's node ${node} hung: deaf after ${deafAfter.toFixed(0)} ms, hearing again after ${heardAfter.toFixed(0)} ms`)
          expect(deafAfter).toBeLessThan(1_000)
          expect(listener.listening).toBe(true)
        } finally {
          await listener.close()
          await sender.close()
        }
      })
    },
    { kinds: [kind] },
  )
}

describeFailover('ioredis', on6)
describeFailover('ioredis5', on5)
