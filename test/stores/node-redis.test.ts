/**
 * The node-redis adapter of docs/stores.md, run as written against the real Redis (through a
 * loopback proxy that can cut the connection): the stores work through `call`, and with the
 * adapter's `status` the rate-limit counter fails at once while the connection is down, so no
 * count waits in node-redis's offline queue to land once Redis is back (without it, they do:
 * a busy caller would be locked out for the rest of its window).
 */
import * as net from 'node:net'
import { type RedisArgument, createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
import { createClient } from 'redis'
import { describe, expect, it } from 'vitest'
import { REDIS_URL, redisAvailable } from '../helpers/redis.js'

/**
 * A loopback proxy to Redis that can be cut (its connections destroyed, and nothing listening
 * on its port, so reconnects are refused, as when Redis is down) and restored on the same port.
 */
async function cuttableProxy(): Promise<{ port: number; cut(): Promise<void>; restore(): Promise<void>; close(): Promise<void> }> {
  const target = new URL(REDIS_URL)
  const sockets = new Set<net.Socket>()
  const track = (socket: net.Socket) => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => {})
  }
  const server = net.createServer((client) => {
    track(client)
    const upstream = net.connect(Number(target.port || 6379), target.hostname)
    track(upstream)
    client.pipe(upstream).pipe(client)
    client.on('close', () => upstream.destroy())
    upstream.on('close', () => client.destroy())
  })
  // Rejects when the port was taken meanwhile (the test fails, rather than the worker).
  const listen = (port: number) =>
    new Promise<void>((resolve, reject) => {
      server.once('error', reject)
      server.listen(port, '127.0.0.1', () => {
        server.off('error', reject)
        resolve()
      })
    })
  const stop = () =>
    new Promise<void>((resolve) => {
      for (const socket of sockets) socket.destroy()
      if (!server.listening) return resolve()
      server.close(() => resolve())
    })
  await listen(0)
  const port = (server.address() as net.AddressInfo).port
  return { port, cut: stop, restore: () => listen(port), close: stop }
}

async function until(condition: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 5_000
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}

describe.runIf(redisAvailable)('node-redis behind the adapter of docs/stores.md', () => {
  const WINDOW_MS = 60_000
  const prefix = `mcp-dispatch-test:node-redis:${process.pid}:${Date.now()}:`

  async function connected(port: number) {
    const client = createClient({ url: `redis://127.0.0.1:${port}`, socket: { reconnectStrategy: () => 20 } })
    client.on('error', () => {})
    await client.connect()
    return client
  }

  it.each([
    ['with its status, the counts sent while the connection is down are refused at once, and none lands once Redis is back', true, 1],
    ['without it, they wait in node-redis\'s offline queue and all land once Redis is back: why the adapter has it', false, 21],
  ] as const)('%s', async (_name, withStatus, countedAfter) => {
    const proxy = await cuttableProxy()
    const client = await connected(proxy.port)
    const call = (...args: RedisArgument[]) => client.sendCommand(args.map(String))
    const redis = withStatus ? { call, get status() { return client.isReady ? 'ready' : 'reconnecting' } } : { call }
    // A deadline a loaded host answers within: the calls before and after the cut must be counted.
    const rateLimit = createRedisRateLimitStore({ client: redis, prefix, timeoutMs: 1_000 })
    const key = `${withStatus}`
    const window = Math.floor(Date.now() / WINDOW_MS) * WINDOW_MS
    try {
      expect(await rateLimit.increment(key, window, WINDOW_MS)).toBe(1)
      await proxy.cut()
      await until(() => !client.isReady, 'the client to see the connection lost')
      const during = await Promise.allSettled(Array.from({ length: 20 }, () => rateLimit.increment(key, window, WINDOW_MS)))
      expect(during.every((outcome) => outcome.status === 'rejected')).toBe(true)
      await proxy.restore()
      await until(() => client.isReady, 'the client to reconnect')
      // Whatever waited in node-redis's queue has been sent with the reconnect, before this.
      expect(await rateLimit.increment(key, window, WINDOW_MS)).toBe(countedAfter + 1)
    } finally {
      // The client first: its commands would wait in its queue while the proxy is cut.
      client.destroy()
      await proxy.close()
      const direct = createClient({ url: REDIS_URL })
      direct.on('error', () => {})
      await direct.connect()
      await direct.sendCommand(['DEL', `${prefix}rl:${key}`])
      direct.destroy()
    }
  })

  it('pins through it: set, read, deleted', async () => {
    const proxy = await cuttableProxy()
    const client = await connected(proxy.port)
    const redis = { call: (...args: RedisArgument[]) => client.sendCommand(args.map(String)) }
    const sessions = createRedisSessionStore({ client: redis, prefix, timeoutMs: 1_000 })
    try {
      const pin = { appId: 'app_weather', version: '1.0.0', subject: 'alice' }
      expect(await sessions.set('s1', pin, 60_000)).toBe(true)
      expect(await sessions.get('s1', 60_000)).toEqual(pin)
      await sessions.delete('s1')
      expect(await sessions.get('s1', 60_000)).toBeUndefined()
    } finally {
      client.destroy()
      await proxy.close()
    }
  })

  it('an error reply through it (node-redis\'s ErrorReply) closes the stall breaker as a reply does: the next call is sent, with no probe', async () => {
    // Straight to REDIS_URL (its host, password, database), as the cleanup above connects.
    const direct = async () => {
      const client = createClient({ url: REDIS_URL })
      client.on('error', () => {})
      await client.connect()
      return client
    }
    let client: Awaited<ReturnType<typeof direct>> | undefined
    let other: Awaited<ReturnType<typeof direct>> | undefined
    try {
      client = await direct()
      other = await direct()
      const commands = client
      const sent: string[] = []
      const redis = { call: (...args: RedisArgument[]) => (sent.push(String(args[0])), commands.sendCommand(args.map(String))) }
      const T = 1_000
      const sessions = createRedisSessionStore({ client: redis, prefix, timeoutMs: T })
      await other.sendCommand(['RPUSH', `${prefix}session:list`, 'x']) // GETEX on a list: WRONGTYPE
      // The connection held by a BLPOP: what follows it waits, unanswered.
      const held = client.sendCommand(['BLPOP', `${prefix}hold`, '0'])
      // Awaited below; a failure before then leaves no unhandled rejection.
      held.catch(() => {})
      await expect(sessions.get('list', 60_000)).rejects.toThrow(/did not answer within/)
      await expect(sessions.get('s', 60_000)).rejects.toThrow(new RegExp(`not sent: Redis is stalled \\(a command got no answer within ${T} ms`))
      await other.sendCommand(['RPUSH', `${prefix}hold`, 'go'])
      await held
      await client.sendCommand(['PING']) // the late answer, WRONGTYPE, is in
      sent.length = 0
      expect(await sessions.get('s', 60_000)).toBeUndefined()
      expect(sent).toEqual(['GETEX'])
    } finally {
      try {
        await other?.sendCommand(['DEL', `${prefix}session:list`, `${prefix}hold`])
      } finally {
        client?.destroy()
        other?.destroy()
      }
    }
  })
})
