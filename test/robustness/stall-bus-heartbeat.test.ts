/**
 * Event-loop stalls: the invalidation bus's heartbeat. A stall of 2.5 s
 * (longer than its silent limit, heartbeatMs + timeoutMs = 2 s) right after a heartbeat went out,
 * its echo waiting unread on the subscriber socket, does not make the bus deaf (the token
 * cache stays on): the silence is judged after this process read its sockets.
 */
import { randomBytes } from 'node:crypto'
import { Redis } from 'ioredis'
import { createRedisInvalidationBus } from 'mcp-dispatch/redis'
import { afterAll, expect, it } from 'vitest'
import { REDIS_URL, redisAvailable } from '../helpers/redis.js'
import { holdEventLoop } from '../helpers/hold.js'

const clients: Redis[] = []
afterAll(() => {
  for (const c of clients) c.disconnect()
})

it.runIf(redisAvailable)('a 2.5 s stall right after a heartbeat was sent leaves the bus listening', async () => {
  const client = new Redis(REDIS_URL)
  clients.push(client)
  await client.ping()
  let stallOnHeartbeat = false
  let stalled = false
  const adapter = {
    call: (command: string, ...args: unknown[]) => {
      const reply = client.call(command, ...(args as string[]))
      if (stallOnHeartbeat && command === 'PUBLISH' && String(args[0]).endsWith(':heartbeat')) {
        stallOnHeartbeat = false
        // The heartbeat is on the wire: held right after, within this turn.
        queueMicrotask(() => {
          holdEventLoop(2_500)
          stalled = true
        })
      }
      return reply
    },
    get status() {
      return client.status
    },
    duplicate: (o?: object) => {
      const d = client.duplicate(o)
      clients.push(d)
      return d
    },
  }
  const errors: string[] = []
  const prefix = `audit-stall-bus:${randomBytes(6).toString('hex')}:`
  const bus = createRedisInvalidationBus({ client: adapter as never, prefix, heartbeatMs: 1_000, timeoutMs: 1_000, onError: (e, c) => void errors.push(`${c}: ${(e as Error).message}`) })
  await bus.ready()
  const changes: string[] = []
  bus.subscribe((m) => void changes.push(m.kind))
  expect(bus.listening).toBe(true)
  stallOnHeartbeat = true
  // Heartbeats go out every second when the channel is silent (no other bus here).
  await new Promise((resolve) => setTimeout(resolve, 4_500))
  expect(stalled).toBe(true)
  expect({ listening: bus.listening, changes, errors }).toEqual({ listening: true, changes: [], errors: [] })
  await bus.close()
}, 15_000)
