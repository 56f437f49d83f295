/**
 * Rate limits and session pins under concurrent load, through real HTTP servers (the Web
 * adapter on @hono/node-server, 127.0.0.1) and real Redis, from an audit against spec section 7
 * (the 429 body), DESIGN.md step 5 (`Retry-After`, the IETF `RateLimit` / `RateLimit-Policy`
 * fields, fail open and log) and docs/pipeline.md and docs/stores.md:
 *
 * - two instances sharing one Redis (Web adapter; Express and Fastify), 500 requests at once
 *   against a limit of 100: exactly 100 served, each `RateLimit` remaining count told once, 400
 *   refused with the section 7 body; so too when this process's event loop is held past the
 *   store's deadline while the counts' answers wait on the socket (regression: those calls
 *   failed, and their requests were served past the limit, fail open);
 *   per (App, user): another App's or another user's traffic spends none of it, a user's two
 *   tokens (and an OAuth token of the same user) share it;
 * - across window boundaries (the dispatchers' clock moved while requests are in flight): each
 *   window serves its limit, no more, no fewer, and `Retry-After` is never below 1 nor past
 *   the window;
 * - a Redis of this file's own killed and started again mid-load, and one that hangs: served
 *   (fail open), never a 500, and counting again afterwards;
 * - session pins under concurrent `initialize` across instances (the Redis store: one pin per
 *   session, gone on `DELETE`; the memory store shared by two dispatchers: `maxPerSubject`);
 * - `X-Forwarded-For`: ignored without `trustProxy`, so the per-address budgets
 *   (`unknownTokenBudget`) count the socket's address; with it, the right hop's.
 *
 * The Redis it kills and starts again listens on a Unix socket of its own (no port to collide with).
 */
import { type ChildProcess, spawn } from 'node:child_process'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import {
  type AccessTokenValidator,
  type RateLimitPolicy,
  type RateLimitStore,
  type SessionStore,
  createDispatcher,
  generateApiToken,
  createMemoryAppStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
import { mcpDispatch } from 'mcp-dispatch/web'
import { mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import express from 'express'
import Fastify from 'fastify'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { midMinute } from '../helpers/clock.js'
import { serveFetch } from '../helpers/platform.js'
import { REDIS_URL, holdConnection, redisAvailable, redisServerMissing, scanKeys } from '../helpers/redis.js'

const WEATHER = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }
const NEWS = { id: 'app_news', slug: 'news', name: 'News', versions: ['1.0.0'] }

interface Answer {
  status: number
  headers: http.IncomingHttpHeaders
  body: string
}

/** One HTTP/1.1 request to 127.0.0.1:`port` with `Host: <slug>.localhost`, on its own connection. */
function send(
  port: number,
  options: { slug?: string; token?: string; method?: string; body?: unknown; headers?: Record<string, string>; path?: string } = {},
): Promise<Answer> {
  const body = options.method === 'DELETE' || options.method === 'GET' ? undefined : JSON.stringify(options.body ?? { jsonrpc: '2.0', id: 1, method: 'tools/list' })
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: '127.0.0.1',
        port,
        path: options.path ?? '/v1',
        method: options.method ?? 'POST',
        agent: false,
        headers: {
          host: `${options.slug ?? 'weather'}.localhost`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          ...(options.token && { authorization: `Bearer ${options.token}` }),
          ...(body !== undefined && { 'content-length': String(Buffer.byteLength(body)) }),
          ...options.headers,
        },
      },
      (response) => {
        let text = ''
        response.setEncoding('utf8')
        response.on('data', (chunk: string) => (text += chunk))
        response.on('end', () => resolve({ status: response.statusCode!, headers: response.headers, body: text }))
        response.on('error', reject)
      },
    )
    request.on('error', reject)
    request.end(body)
  })
}

/** `n` requests sent at once, alternately to the instances on ports `a` and `b` (the first to `b`). */
function alternately(n: number, a: number, b: number, options: Parameters<typeof send>[1]): Array<Promise<Answer>> {
  return Array.from({ length: n }, (_, i) => send(i % 2 ? a : b, options))
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** The `r` and `t` of a `RateLimit` field value (`"minute";r=12;t=31`). */
function rateLimitField(value: string | string[] | undefined): { name: string; r: number; t: number } {
  const match = /^"([a-z]+)";r=(\d+);t=(\d+)$/.exec(String(value))
  if (!match) throw new Error(`RateLimit field ${String(value)} is not as the draft writes it`)
  return { name: match[1]!, r: Number(match[2]), t: Number(match[3]) }
}

/** Checks that `remaining`, the `r` of each served answer's `RateLimit`, is 0 to `limit - 1`, each once. */
function expectEachRemainingOnce(remaining: number[], limit: number): void {
  expect(remaining.sort((x, y) => x - y)).toEqual(Array.from({ length: limit }, (_, i) => i))
}

/** Checks a 429 of the App's own limit as spec section 7 and DESIGN.md step 5 write it; its `retryAfter`. */
function expectRefusal(answer: Answer, policy: RateLimitPolicy, windowSeconds: number): number {
  expect(answer.status).toBe(429)
  expect(answer.headers['content-type']).toMatch(/^application\/json/)
  expect(answer.headers['x-mcp-version']).toBeUndefined()
  expect(answer.headers['x-mcp-latest-version']).toBeUndefined()
  const body = JSON.parse(answer.body) as { jsonrpc: string; id: null; error: { code: number; message: string; data: Record<string, unknown> } }
  expect(body).toEqual({
    jsonrpc: '2.0',
    id: null,
    error: {
      code: -32000,
      message: 'Rate limit exceeded',
      data: { limit: policy.limit, resetAt: expect.any(Number), retryAfter: expect.any(Number), windowType: policy.windowType },
    },
  })
  const retryAfter = body.error.data.retryAfter as number
  expect(Number.isInteger(retryAfter)).toBe(true)
  expect(retryAfter).toBeGreaterThanOrEqual(1)
  expect(retryAfter).toBeLessThanOrEqual(windowSeconds)
  expect(answer.headers['retry-after']).toBe(String(retryAfter))
  expect(answer.headers['ratelimit-policy']).toBe(`"${policy.windowType}";q=${policy.limit};w=${windowSeconds}`)
  expect(rateLimitField(answer.headers.ratelimit)).toEqual({ name: policy.windowType, r: 0, t: retryAfter })
  return retryAfter
}

/** A clock shared by the instances of a test, moved by hand while requests are in flight. */
function clock(start: number) {
  let at = start
  return { now: () => at, set: (to: number) => void (at = to) }
}

interface InstanceOptions {
  redis?: Redis
  prefix?: string
  policy: (app: { id: string }) => RateLimitPolicy | undefined
  now?: () => number
  sessions?: SessionStore
  trustProxy?: false | number | string[]
  rateLimitTimeoutMs?: number
  failOpen?: boolean
  /** Sees each count the Redis store answers: the window the request was stamped with, and the answer. */
  onCount?: (windowStart: number, answer: number | { count: number; windowStart: number }) => void
  /** Called once each count is on its way to Redis. */
  onSent?: () => void
  handler?: (request: Request) => Response
  /** The adapter serving it: the Web one (default, on @hono/node-server), Express 5 or Fastify. */
  adapter?: 'web' | 'express' | 'fastify'
}

/**
 * A platform: two Apps, users u1 (two tokens, both Apps) and u2 (one token, Weather), one
 * token service shared by its instances (the shared database) with `unknownTokenBudget` of 5
 * per address and minute, on a clock held mid-minute (the tests count the 401s and 429s of a
 * burst: on the wall clock a minute turning during one would give a fresh budget).
 * `instance()` serves one more dispatcher over HTTP on this file's ports.
 */
async function platform() {
  const errors: Array<{ context: string; error: unknown }> = []
  const apps = createMemoryAppStore([WEATHER, NEWS])
  const subscriptions = createMemorySubscriptionStore([
    { userId: 'u1', appId: WEATHER.id, active: true },
    { userId: 'u1', appId: NEWS.id, active: true },
    { userId: 'u2', appId: WEATHER.id, active: true },
  ])
  const store = createMemoryTokenStore()
  const now = midMinute()
  const tokenService = () => createTokenService({ store, apps, subscriptions, unknownTokenBudget: { limit: 5, windowType: 'minute' }, now })
  const shared = tokenService()
  const t1 = (await shared.create({ userId: 'u1', name: 'one', servers: [WEATHER.id, NEWS.id], expiresInDays: 30 })).token
  const t1b = (await shared.create({ userId: 'u1', name: 'two', servers: [WEATHER.id], expiresInDays: 30 })).token
  const t2 = (await shared.create({ userId: 'u2', name: 'three', servers: [WEATHER.id], expiresInDays: 30 })).token
  // OAuth access tokens `oauth-<subject>`, accepted as that subject.
  const oauth: AccessTokenValidator = {
    validate: async (token) => (token.startsWith('oauth-') ? { active: true, info: { subject: token.slice(6) } } : { active: false }),
  } as AccessTokenValidator
  const closers: Array<() => Promise<void>> = []
  async function instance(options: InstanceOptions) {
    const onError = (error: unknown, context: string) => void errors.push({ context, error })
    const dispatcher = createDispatcher({
      apps,
      subscriptions,
      // Each instance its own token service (its own cache and budgets), one database.
      tokens: tokenService(),
      oauth,
      authorizationServers: ['https://auth.example.com'],
      ...(options.now && { now: options.now }),
      ...(options.sessions && { sessions: options.sessions }),
      rateLimit: {
        ...(options.redis && {
          store: recording(
            createRedisRateLimitStore({ client: options.redis, prefix: options.prefix!, ...(options.rateLimitTimeoutMs && { timeoutMs: options.rateLimitTimeoutMs }) }),
            options.onCount,
            options.onSent,
          ),
        }),
        policy: (_identity, app) => options.policy(app),
        ...(options.failOpen !== undefined && { failOpen: options.failOpen }),
      },
      onError,
    })
    const trust = options.trustProxy !== undefined && { trustProxy: options.trustProxy }
    if (options.adapter === 'express') {
      const app = express()
      app.use(expressDispatch({ dispatcher, onError, ...trust }))
      app.all('/{*path}', (_req, res) => void res.json({ jsonrpc: '2.0', id: 1, result: {} }))
      const server = http.createServer(app)
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
      const listening = (server.address() as AddressInfo).port
      closers.push(() => new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }))
      return listening
    }
    if (options.adapter === 'fastify') {
      const app = Fastify()
      await app.register(fastifyDispatch({ dispatcher, onError, ...trust }))
      app.route({ method: ['GET', 'POST', 'DELETE'], url: '/*', handler: async () => ({ jsonrpc: '2.0', id: 1, result: {} }) })
      await app.listen({ port: 0, host: '127.0.0.1' })
      const listening = (app.server.address() as AddressInfo).port
      closers.push(() => app.close())
      return listening
    }
    const handle = mcpDispatch({
      dispatcher,
      onError,
      ...trust,
      handler: options.handler ?? (() => Response.json({ jsonrpc: '2.0', id: 1, result: {} })),
    })
    const server = await serveFetch(handle)
    closers.push(() => server.close())
    return server.port
  }
  return {
    instance,
    errors,
    tokens: { t1, t1b, t2 },
    close: () => Promise.all(closers.map((close) => close())),
  }
}

function recording(store: RateLimitStore, onCount: InstanceOptions['onCount'], onSent: InstanceOptions['onSent']): RateLimitStore {
  if (!onCount && !onSent) return store
  return {
    async increment(key, windowStart, windowMs) {
      const counting = store.increment(key, windowStart, windowMs)
      onSent?.()
      const answer = await counting
      onCount?.(windowStart, answer)
      return answer
    },
  }
}

const perMinute = (limit: number): RateLimitPolicy => Object.freeze({ limit, windowType: 'minute' })

/** A key prefix on the shared Redis of the calling test's own: `mcp-dispatch-test:<name>:<random>:`. */
const randomPrefix = (name: string) => `mcp-dispatch-test:${name}:${Math.random().toString(36).slice(2)}:`

/** Deletes every key under `prefix`. */
async function deleteKeys(client: Redis, prefix: string): Promise<void> {
  const keys = await scanKeys(client, `${prefix}*`)
  if (keys.length > 0) await client.del(...keys)
}

/** Two clients of the shared Redis and a prefix of the calling test's own; `cleanUp` deletes its keys and disconnects them. */
function sharedRedis(name: string) {
  const prefix = randomPrefix(name)
  const clients = [new Redis(REDIS_URL, { maxRetriesPerRequest: 1 }), new Redis(REDIS_URL, { maxRetriesPerRequest: 1 })] as const
  const cleanUp = async () => {
    await deleteKeys(clients[0], prefix)
    for (const c of clients) c.disconnect()
  }
  return { prefix, clients, cleanUp }
}

/** 2030-01-01T00:00:00Z, a minute's start. */
const W = Date.UTC(2030, 0, 1)

describe.runIf(redisAvailable)('rate limit on Redis under concurrent load, two instances over HTTP', () => {
  const clients: Redis[] = []
  const prefixes: string[] = []
  const connect = () => {
    const client = new Redis(REDIS_URL, { maxRetriesPerRequest: 1, autoResendUnfulfilledCommands: false })
    clients.push(client)
    return client
  }
  afterAll(async () => {
    const cleaner = connect()
    for (const prefix of prefixes) await deleteKeys(cleaner, prefix)
    for (const client of clients) client.disconnect()
  })

  /**
   * A platform and two instances of it counting on the shared Redis under a new prefix, `limit`
   * a minute, the clock at `start`, with `options`; `adapters`: what serves each instance.
   */
  async function twoInstances(start: number, limit: number, options: Partial<InstanceOptions> = {}, adapters: ReadonlyArray<InstanceOptions['adapter']> = ['web', 'web']) {
    const p = await platform()
    const prefix = randomPrefix('rlload')
    prefixes.push(prefix)
    const time = clock(start)
    const policy = perMinute(limit)
    const ports: number[] = []
    for (const adapter of adapters) ports.push(await p.instance({ redis: connect(), prefix, policy: () => policy, now: time.now, adapter, ...options }))
    return { p, time, policy, a: ports[0]!, b: ports[1]! }
  }

  it('500 at once against 100 per minute across two instances: exactly 100 served, each remaining count once, 400 refused as section 7 writes it', async () => {
    const { p, policy, a, b } = await twoInstances(W + 20_250, 100)
    try {
      const answers = await Promise.all(alternately(500, a, b, { token: p.tokens.t1 }))
      const served = answers.filter((x) => x.status === 200)
      const refused = answers.filter((x) => x.status !== 200)
      expect(served).toHaveLength(100)
      expect(refused).toHaveLength(400)
      const remaining = served.map((x) => {
        expect(x.headers['ratelimit-policy']).toBe('"minute";q=100;w=60')
        expect(x.headers['x-mcp-version']).toBe('1.0.0')
        const field = rateLimitField(x.headers.ratelimit)
        expect(field.t).toBe(40)
        return field.r
      })
      expectEachRemainingOnce(remaining, 100)
      for (const x of refused) {
        expect(expectRefusal(x, policy, 60)).toBe(40)
        expect((JSON.parse(x.body) as { error: { data: { resetAt: number } } }).error.data.resetAt).toBe((W + 60_000) / 1000)
      }
      expect(p.errors).toEqual([])
    } finally {
      await p.close()
    }
  })

  it('the same burst on an Express instance and a Fastify instance: exactly 100 served, the 429s as section 7 writes them', async () => {
    const { p, policy, a, b } = await twoInstances(W + 20_250, 100, {}, ['express', 'fastify'])
    try {
      const answers = await Promise.all(alternately(500, a, b, { token: p.tokens.t1 }))
      const served = answers.filter((x) => x.status === 200)
      expect(served).toHaveLength(100)
      expectEachRemainingOnce(served.map((x) => rateLimitField(x.headers.ratelimit).r), 100)
      for (const x of served) expect(x.headers['ratelimit-policy']).toBe('"minute";q=100;w=60')
      for (const x of answers.filter((x) => x.status !== 200)) expect(expectRefusal(x, policy, 60)).toBe(40)
      expect(p.errors).toEqual([])
    } finally {
      await p.close()
    }
  })

  // The counts held up are on the wire before each hold: Redis has the whole 800 ms to answer,
  // and the answers are read before any deadline is judged (40 runs beside three busy loops on
  // two cores passed without a retry).
  it('an event loop held past the store\'s deadline while the counts are on the socket: each request judged by its count, none served uncounted (regression: a deadline this process noticed late failed the call, and the request was served past the limit)', async () => {
    const hold = (ms: number) => {
      const until = performance.now() + ms
      while (performance.now() < until);
    }
    // Each request's count is sent as it arrives; once the 60th and the 180th are on the wire,
    // this process is busy for 800 ms (a burst of work, a long GC): Redis answers meanwhile, and
    // the answers wait unread on the socket while their deadlines (500 ms: one a loaded host's
    // Redis answers within) pass.
    let sent = 0
    let held = 0
    const onSent = () => {
      sent++
      if (sent === 60 || sent === 180) {
        hold(800)
        held++
      }
    }
    const { p, a, b } = await twoInstances(W + 20_250, 100, { rateLimitTimeoutMs: 500, onSent })
    try {
      const answers = await Promise.all(alternately(300, a, b, { token: p.tokens.t1 }))
      expect(held).toBe(2)
      expect(answers.filter((x) => x.status === 200)).toHaveLength(100)
      expect(answers.filter((x) => x.status === 429)).toHaveLength(200)
      expect(p.errors.filter((e) => e.context.startsWith('rate-limit')).map((e) => String(e.error))).toEqual([])
    } finally {
      await p.close()
    }
  })

  it('per App and user: two users, two Apps, two tokens and an OAuth token of one user, all at once; each (App, user) serves its limit exactly', async () => {
    const { p, policy, a, b } = await twoInstances(W + 59_000, 30)
    try {
      const kinds = [
        { group: 'u1@weather', slug: 'weather', token: p.tokens.t1 },
        { group: 'u1@weather', slug: 'weather', token: p.tokens.t1b },
        { group: 'u1@weather', slug: 'weather', token: 'oauth-u1' },
        { group: 'u1@news', slug: 'news', token: p.tokens.t1 },
        { group: 'u2@weather', slug: 'weather', token: p.tokens.t2 },
        { group: 'u3@weather', slug: 'weather', token: 'oauth-u3' },
      ]
      const sent = Array.from({ length: 600 }, (_, i) => kinds[i % kinds.length]!)
      const answers = await Promise.all(sent.map((k, i) => send(i % 2 ? a : b, { slug: k.slug, token: k.token })))
      const byGroup = new Map<string, number[]>()
      answers.forEach((x, i) => {
        const group = sent[i]!.group
        // u3 has no subscription: 402 before the limit, never counted.
        if (group === 'u3@weather') return void expect(x.status).toBe(402)
        if (!byGroup.has(group)) byGroup.set(group, [])
        if (x.status === 200) byGroup.get(group)!.push(rateLimitField(x.headers.ratelimit).r)
        else expect(expectRefusal(x, policy, 60)).toBe(1)
      })
      expect([...byGroup.keys()].sort()).toEqual(['u1@news', 'u1@weather', 'u2@weather'])
      for (const remaining of byGroup.values()) expectEachRemainingOnce(remaining, 30)
      expect(p.errors).toEqual([])
    } finally {
      await p.close()
    }
  })

  it('across window boundaries, the clock moved while requests are in flight: each window serves its limit, no more, no fewer; Retry-After within 1 and the window', async () => {
    const { p, time, policy, a, b } = await twoInstances(W + 59_900, 50)
    try {
      // Three windows, 150 requests each started in the window; the clock moves on in the
      // middle of each burst, so requests of one window and the next are counted side by side.
      const served = new Map<number, number[]>()
      const refusedIn = new Map<number, number>()
      for (let k = 0; k < 3; k++) {
        const windowEnd = W + (k + 1) * 60_000
        time.set(windowEnd - 100)
        const burst = alternately(150, a, b, { token: p.tokens.t1 })
        // Let about half of them be counted, then move into the next window.
        await sleep(15)
        const late = alternately(75, a, b, { token: p.tokens.t1 })
        const answers = await Promise.all(burst)
        time.set(windowEnd + 100)
        const after = await Promise.all(late)
        for (const x of [...answers, ...after]) {
          // t: 1 in the last 100 ms of a window, 60 in the first 100 ms of the next.
          if (x.status === 200) {
            const field = rateLimitField(x.headers.ratelimit)
            const window = field.t === 1 ? windowEnd : windowEnd + 60_000
            if (!served.has(window)) served.set(window, [])
            served.get(window)!.push(field.r)
          } else {
            const retryAfter = expectRefusal(x, policy, 60)
            const window = retryAfter === 1 ? windowEnd : windowEnd + 60_000
            refusedIn.set(window, (refusedIn.get(window) ?? 0) + 1)
          }
        }
      }
      for (const [window, remaining] of served) {
        expect(remaining.length, `window ending ${new Date(window).toISOString()}`).toBeLessThanOrEqual(50)
        // A window that refused any request served its whole limit first.
        if ((refusedIn.get(window) ?? 0) > 0) expectEachRemainingOnce(remaining, 50)
      }
      expect(p.errors).toEqual([])
    } finally {
      await p.close()
    }
  })
})

/**
 * A Redis of this file's own, without persistence, on a Unix socket in a temporary directory
 * (`path`, the same every time it starts again): killed and started again by the tests.
 */
function privateRedis() {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-rlload-'))
  const path = join(dir, 'redis.sock')
  let child: ChildProcess | undefined
  const kill = () => child?.kill('SIGKILL')
  process.once('exit', kill)
  return {
    path,
    async start() {
      child = spawn('redis-server', ['--port', '0', '--unixsocket', path, '--dir', dir, '--save', '', '--appendonly', 'no'], { stdio: 'ignore' })
      const probe = new Redis({ path, lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 })
      probe.on('error', () => {})
      for (let tries = 0; ; tries++) {
        try {
          await probe.connect()
          await probe.ping()
          probe.disconnect()
          return
        } catch (error) {
          if (tries > 100) throw error
          await sleep(50)
        }
      }
    },
    async kill() {
      const exited = new Promise((resolve) => child!.once('exit', resolve))
      child!.kill('SIGKILL')
      await exited
      child = undefined
    },
    async stop() {
      if (child) await this.kill()
      process.removeListener('exit', kill)
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/** A client of the private Redis at `path`: one retry, nothing resent after a reconnection, its errors (Redis killed) ignored. */
function privateClient(path: string): Redis {
  const client = new Redis({ path, maxRetriesPerRequest: 1, autoResendUnfulfilledCommands: false })
  client.on('error', () => {})
  return client
}

/** Waits until each of `clients` is connected (again). */
async function untilReady(clients: readonly Redis[]): Promise<void> {
  for (const c of clients) while (c.status !== 'ready') await sleep(20)
}

/** Sends requests from `concurrency` loops until `until()` is true; every answer with its time. */
async function load(port: number, token: string, concurrency: number, until: () => boolean) {
  const answers: Array<Answer & { at: number; ms: number }> = []
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (!until()) {
        const started = performance.now()
        const answer = await send(port, { token })
        answers.push({ ...answer, at: started, ms: performance.now() - started })
      }
    }),
  )
  return answers
}

const missing = redisServerMissing()

describe.runIf(redisAvailable)('rate limit on Redis, real time (Date.now), second windows', () => {
  it('two instances under load for 3 s: in each window the counts are 1..n, once each, and exactly min(n, limit) are served', { timeout: 30_000 }, async () => {
    const p = await platform()
    const { prefix, clients, cleanUp } = sharedRedis('rlload-rt')
    const policy: RateLimitPolicy = Object.freeze({ limit: 40, windowType: 'second' })
    const counts = new Map<number, number[]>()
    const onCount = (stamped: number, answer: number | { count: number; windowStart: number }) => {
      const [window, count] = typeof answer === 'number' ? [stamped, answer] : [answer.windowStart, answer.count]
      if (!counts.has(window)) counts.set(window, [])
      counts.get(window)!.push(count)
    }
    const [a, b] = await Promise.all(clients.map((redis) => p.instance({ redis, prefix, policy: () => policy, onCount })))
    try {
      const end = performance.now() + 3_000
      const answers = (await Promise.all([a!, b!].map((port) => load(port, p.tokens.t1, 12, () => performance.now() > end)))).flat()
      expect(new Set(answers.map((x) => x.status))).toEqual(new Set([200, 429]))
      let admitted = 0
      for (const [window, seen] of counts) {
        // The counts 1..n, once each: a request stamped at a window's tail that reaches Redis
        // after one window from the window's first request still counts against it (the
        // counter's TTL has a grace past its window; without it, such a request started a
        // second run 1..k and was served past the limit, as a clean-clone CI run once saw).
        expect([...seen].sort((x, y) => x - y), `window ${window}`).toEqual(Array.from({ length: seen.length }, (_, i) => i + 1))
        admitted += seen.filter((count) => count <= policy.limit).length
      }
      expect(counts.size).toBeGreaterThanOrEqual(3)
      expect(answers.filter((x) => x.status === 200)).toHaveLength(admitted)
      for (const x of answers.filter((x) => x.status === 429)) expect(expectRefusal(x, policy, 1)).toBe(1)
      expect(p.errors).toEqual([])
    } finally {
      await p.close()
      await cleanUp()
    }
  })
})

describe.runIf(missing === undefined)('rate limit while Redis fails under load (a Redis of this file\'s own)', () => {
  const redis = privateRedis()
  beforeAll(() => redis.start())
  afterAll(() => redis.stop())

  /**
   * A platform and an instance on each of two clients of this file's Redis, counting under
   * `prefix` against a limit no test reaches, the clock at W + 20 s, the store's deadline 200 ms;
   * `extra`: more options of the instance on `client`. `close` closes them all.
   */
  async function onPrivateRedis(prefix: string, extra: (client: Redis) => Partial<InstanceOptions> = () => ({})) {
    const p = await platform()
    const time = clock(W + 20_000)
    const policy = perMinute(1_000_000)
    const clients = [privateClient(redis.path), privateClient(redis.path)] as const
    const [a, b] = await Promise.all(clients.map((client) => p.instance({ redis: client, prefix, policy: () => policy, now: time.now, rateLimitTimeoutMs: 200, ...extra(client) })))
    const close = async () => {
      await p.close()
      for (const c of clients) c.disconnect()
    }
    return { p, policy, clients, a: a!, b: b!, close }
  }

  it('killed and started again mid-load: never a 500, served at once while down (fail open, reported), counting again once back, no queued count replayed', { timeout: 30_000 }, async () => {
    const prefix = 'rlload:'
    const { p, policy, clients, a, b, close } = await onPrivateRedis(prefix)
    try {
      let phase: 'before' | 'down' | 'back' | 'done' = 'before'
      const running = Promise.all([a, b].map((port) => load(port, p.tokens.t1, 8, () => phase === 'done')))
      await sleep(700)
      await redis.kill()
      phase = 'down'
      const downAt = performance.now()
      await sleep(1_500)
      await redis.start()
      const backAt = performance.now()
      // Both clients reconnect on their own.
      await untilReady(clients)
      const readyAt = performance.now()
      phase = 'back'
      await sleep(1_000)
      phase = 'done'
      const answers = (await running).flat()
      const statuses = new Set(answers.map((x) => x.status))
      expect([...statuses]).toEqual([200])
      const duringOutage = answers.filter((x) => x.at > downAt + 300 && x.at + x.ms < backAt)
      expect(duringOutage.length).toBeGreaterThan(20)
      for (const x of duringOutage) {
        expect(x.headers.ratelimit).toBeUndefined()
        expect(x.ms).toBeLessThan(1_000)
      }
      // Counted again once both clients are ready: the counter in the new Redis holds exactly
      // the answers counted since the kill (nothing of the outage replayed into it). Counted in
      // the new Redis is any answer with the header begun after the kill, one begun before it
      // was back too (its count made once the probe had closed the breaker).
      const countedAfter = answers.filter((x) => x.at > downAt && x.headers.ratelimit !== undefined)
      const afterReady = answers.filter((x) => x.at > readyAt + 100)
      expect(afterReady.length).toBeGreaterThan(20)
      for (const x of afterReady) expect(x.headers.ratelimit).toBeDefined()
      const checker = privateClient(redis.path)
      const stored = await checker.hgetall(`${prefix}rl:${WEATHER.id}\u0000u1\u0000minute`)
      checker.disconnect()
      expect(Number(stored.c)).toBe(countedAfter.length)
      const remaining = countedAfter.map((x) => rateLimitField(x.headers.ratelimit).r).sort((x, y) => y - x)
      expect(remaining).toEqual(Array.from({ length: countedAfter.length }, (_, i) => policy.limit - 1 - i))
      // Reported, and by the rate-limit store only.
      expect(p.errors.length).toBeGreaterThan(0)
      expect(new Set(p.errors.map((e) => e.context))).toEqual(new Set(['rate-limit store failed; serving (failOpen)']))
      // No offline queue left behind.
      for (const c of clients) expect((c as unknown as { offlineQueue: { length: number } }).offlineQueue.length).toBe(0)
    } finally {
      await close()
    }
  })

  it('failOpen: false, sessions on the same clients, killed and started again mid-load: 503 with Retry-After while down (never a 500), sessions and counts served again once back', { timeout: 30_000 }, async () => {
    const prefix = 'rlload-closed:'
    const app = sessionHandler()
    const { clients, a, b, close } = await onPrivateRedis(prefix, (client) => ({
      failOpen: false,
      sessions: createRedisSessionStore({ client, prefix, timeoutMs: 200 }),
      handler: app.handler,
    }))
    try {
      let phase: 'before' | 'down' | 'back' | 'done' = 'before'
      const answers: Array<{ phase: string; status: number; headers: http.IncomingHttpHeaders; ms: number }> = []
      // Each loop: a session opened on one instance, used on the other, until the end.
      const loops = Array.from({ length: 12 }, async (_, n) => {
        let session: string | undefined
        while (phase !== 'done') {
          const at = phase
          const started = performance.now()
          const port = n % 2 ? a : b
          const answer = await send(port, { token: 'oauth-u1', ...(session && { headers: { 'mcp-session-id': session } }) })
          answers.push({ phase: at, status: answer.status, headers: answer.headers, ms: performance.now() - started })
          if (answer.status === 200 && session === undefined) session = answer.headers['mcp-session-id'] as string
          else if (answer.status === 404) session = undefined
        }
      })
      const running = Promise.all(loops)
      await sleep(600)
      await redis.kill()
      phase = 'down'
      await sleep(1_200)
      await redis.start()
      await untilReady(clients)
      // Whatever was sent before every client was ready again is still of the outage.
      await sleep(400)
      phase = 'back'
      await sleep(1_000)
      phase = 'done'
      await running
      for (const x of answers) {
        expect([200, 404, 503]).toContain(x.status)
        expect(x.ms).toBeLessThan(1_500)
        if (x.status === 503) {
          expect(x.headers['retry-after']).toMatch(/^[1-9]\d*$/)
          expect(x.headers['x-mcp-version']).toBeUndefined()
        }
      }
      expect(answers.filter((x) => x.phase === 'down' && x.status === 503).length).toBeGreaterThan(10)
      const back = answers.filter((x) => x.phase === 'back')
      // Once back: only 200s, but for the one 404 of each session pinned before the restart.
      expect(back.filter((x) => x.status === 200).length).toBeGreaterThan(20)
      expect(back.filter((x) => x.status === 503)).toEqual([])
      for (const x of back.filter((x) => x.status === 200)) expect(x.headers.ratelimit).toBeDefined()
    } finally {
      await close()
    }
  })

  it('hung on one instance\'s connection mid-load: that instance serves (fail open) after one deadline, the other counts on; once it answers, counting goes on from the shared counter', { timeout: 30_000 }, async () => {
    const prefix = 'rlload-hang:'
    const { p, clients, a, b, close } = await onPrivateRedis(prefix)
    const other = privateClient(redis.path)
    try {
      let done = false
      const running = Promise.all([a, b].map((port) => load(port, p.tokens.t1, 8, () => done)))
      await sleep(500)
      const held = holdConnection(clients[0], other, `${prefix}hold`)
      const heldAt = performance.now()
      await sleep(1_500)
      await held.release()
      const releasedAt = performance.now()
      await sleep(800)
      done = true
      const [onA, onB] = await running
      expect(new Set([...onA!, ...onB!].map((x) => x.status))).toEqual(new Set([200]))
      // While held: A answers within a deadline and some, B counts every request.
      const heldA = onA!.filter((x) => x.at > heldAt && x.at + x.ms < releasedAt)
      expect(heldA.length).toBeGreaterThan(10)
      for (const x of heldA) expect(x.ms).toBeLessThan(600)
      for (const x of onB!.filter((x) => x.at > heldAt && x.at + x.ms < releasedAt)) expect(x.headers.ratelimit).toBeDefined()
      // After: A counts again.
      const afterA = onA!.filter((x) => x.at > releasedAt + 300)
      expect(afterA.length).toBeGreaterThan(10)
      for (const x of afterA) expect(x.headers.ratelimit).toBeDefined()
      expect(new Set(p.errors.map((e) => e.context))).toEqual(new Set(['rate-limit store failed; serving (failOpen)']))
    } finally {
      await close()
      other.disconnect()
    }
  })
})


/**
 * An App's MCP handler as the MCP SDK's transport answers: a request without `Mcp-Session-Id`
 * opens a session (a new id in its answer), `DELETE` ends it, an unknown id is 404.
 */
function sessionHandler() {
  const known = new Set<string>()
  const handler = (request: Request) => {
    const id = request.headers.get('mcp-session-id')
    if (id === null) {
      const assigned = crypto.randomUUID()
      known.add(assigned)
      return Response.json({ jsonrpc: '2.0', id: 0, result: {} }, { headers: { 'mcp-session-id': assigned } })
    }
    if (!known.has(id)) return Response.json({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } }, { status: 404 })
    if (request.method === 'DELETE') {
      known.delete(id)
      return new Response(null, { status: 200 })
    }
    return Response.json({ jsonrpc: '2.0', id: 1, result: {} })
  }
  return { handler, known }
}

describe.runIf(redisAvailable)('session pins under concurrent initialize across instances', () => {
  it('Redis: 200 sessions opened at once on two instances, each pinned once, usable on the other instance, gone on DELETE, with an idle TTL', { timeout: 30_000 }, async () => {
    const p = await platform()
    const { prefix, clients, cleanUp } = sharedRedis('rlload-s')
    const app = sessionHandler()
    // One session in three is u2's.
    const user = (i: number) => (i % 3 ? 'oauth-u1' : 'oauth-u2')
    const [a, b] = await Promise.all(
      clients.map((client) => p.instance({ redis: client, prefix, policy: () => perMinute(100_000), sessions: createRedisSessionStore({ client, prefix }), handler: app.handler })),
    )
    try {
      const opened = await Promise.all(Array.from({ length: 200 }, (_, i) => send(i % 2 ? a! : b!, { token: user(i) })))
      const ids = opened.map((x) => {
        expect(x.status).toBe(200)
        return String(x.headers['mcp-session-id'])
      })
      expect(new Set(ids).size).toBe(200)
      const keys = await scanKeys(clients[0], `${prefix}session:*`)
      expect(keys).toHaveLength(200)
      for (const key of keys.slice(0, 10)) {
        const ttl = await clients[0].pttl(key)
        expect(ttl).toBeGreaterThan(3_500_000)
        expect(ttl).toBeLessThanOrEqual(3_600_000)
      }
      // Each session continues on the other instance; another user's token is 404.
      const next = await Promise.all(ids.map((id, i) => send(i % 2 ? b! : a!, { token: user(i), headers: { 'mcp-session-id': id } })))
      for (const x of next) expect(x.status).toBe(200)
      const stolen = await send(a!, { token: 'oauth-u2', headers: { 'mcp-session-id': ids[1]! } })
      expect(stolen.status).toBe(404)
      // Counted answers all carry the RateLimit fields: the 404 of step 6 too.
      for (const x of [...opened, ...next, stolen]) expect(x.headers['ratelimit-policy']).toBe('"minute";q=100000;w=60')
      // DELETE at once on both instances: every pin gone.
      const deleted = await Promise.all(ids.map((id, i) => send(i % 2 ? a! : b!, { method: 'DELETE', token: user(i), headers: { 'mcp-session-id': id } })))
      for (const x of deleted) {
        expect(x.status).toBe(200)
        expect(x.headers.ratelimit).toMatch(/^"minute";r=\d+;t=\d+$/)
      }
      // The errors first: a pin whose delete failed (a store timeout on a loaded host) is named there.
      expect(p.errors).toEqual([])
      expect(await scanKeys(clients[0], `${prefix}session:*`)).toEqual([])
    } finally {
      await p.close()
      await cleanUp()
    }
  })
})

describe('session cap of the memory store under concurrent initialize (one store shared by two dispatchers of a process)', () => {
  it('maxPerSubject is never exceeded: the oldest sessions of that user end, the other user\'s stay; DELETE frees a place', async () => {
    const p = await platform()
    const sessions = createMemorySessionStore({ maxPerSubject: 10 })
    const app = sessionHandler()
    const a = await p.instance({ policy: () => undefined, sessions, handler: app.handler })
    const b = await p.instance({ policy: () => undefined, sessions, handler: app.handler })
    try {
      const other = await send(a, { token: 'oauth-u2' })
      const otherId = String(other.headers['mcp-session-id'])
      const opened = await Promise.all(Array.from({ length: 60 }, (_, i) => send(i % 2 ? a : b, { token: 'oauth-u1' })))
      const ids = opened.map((x) => String(x.headers['mcp-session-id']))
      const live = await Promise.all(ids.map((id) => send(a, { token: 'oauth-u1', headers: { 'mcp-session-id': id } })))
      expect(live.filter((x) => x.status === 200)).toHaveLength(10)
      expect(live.filter((x) => x.status === 404)).toHaveLength(50)
      expect((await send(b, { token: 'oauth-u2', headers: { 'mcp-session-id': otherId } })).status).toBe(200)
      // DELETE of one of the ten frees its place: a new session ends none of the nine others.
      const alive = ids.filter((_, i) => live[i]!.status === 200)
      expect((await send(b, { method: 'DELETE', token: 'oauth-u1', headers: { 'mcp-session-id': alive[0]! } })).status).toBe(200)
      expect((await send(a, { token: 'oauth-u1', headers: { 'mcp-session-id': alive[0]! } })).status).toBe(404)
      const fresh = String((await send(b, { token: 'oauth-u1' })).headers['mcp-session-id'])
      const after = await Promise.all([...alive.slice(1), fresh].map((id, i) => send(i % 2 ? a : b, { token: 'oauth-u1', headers: { 'mcp-session-id': id } })))
      expect(after.map((x) => x.status)).toEqual(Array.from({ length: 10 }, () => 200))
      expect(p.errors).toEqual([])
    } finally {
      await p.close()
    }
  })
})

describe('X-Forwarded-For and the per-address budget (unknownTokenBudget, 5 a minute)', () => {
  const madeUp = (n: number) => Array.from({ length: n }, () => generateApiToken())
  /** `n` requests at once to `port` with made-up tokens, each naming a made-up address of its own in `X-Forwarded-For`. */
  const spoofing = (port: number, n: number) =>
    Promise.all(madeUp(n).map((token, i) => send(port, { token, headers: { 'x-forwarded-for': `198.51.100.${i}` } })))

  /**
   * Two clients behind a proxy at `port`, 8 requests each with made-up tokens, the second writing a
   * made-up hop of its own before its address: each client its own budget (5 refused 401, then 429).
   */
  async function expectABudgetPerClient(port: number): Promise<void> {
    const answers = await Promise.all(
      madeUp(16).map((token, i) => send(port, { token, headers: { 'x-forwarded-for': i % 2 ? `203.0.113.${i}, 192.0.2.2` : '192.0.2.1' } })),
    )
    for (const parity of [0, 1]) {
      const of = answers.filter((_, i) => i % 2 === parity)
      expect(of.filter((x) => x.status === 401)).toHaveLength(5)
      expect(of.filter((x) => x.status === 429)).toHaveLength(3)
    }
  }

  for (const adapter of ['express', 'fastify'] as const) {
    it(`${adapter}: not trusted without trustProxy; with trustProxy: 1, keyed on the hop the proxy appended`, async () => {
      const p = await platform()
      const open = await p.instance({ policy: () => undefined, adapter })
      const trusted = await p.instance({ policy: () => undefined, adapter, trustProxy: 1 })
      try {
        const spoofed = await spoofing(open, 12)
        expect(spoofed.filter((x) => x.status === 401)).toHaveLength(5)
        expect(spoofed.filter((x) => x.status === 429)).toHaveLength(7)
        await expectABudgetPerClient(trusted)
      } finally {
        await p.close()
      }
    })
  }

  it('not trusted without trustProxy: made-up hops do not buy a budget each; all count under the socket\'s address', async () => {
    const p = await platform()
    const a = await p.instance({ policy: () => undefined })
    try {
      const answers = await spoofing(a, 20)
      expect(answers.filter((x) => x.status === 401)).toHaveLength(5)
      const refused = answers.filter((x) => x.status === 429)
      expect(refused).toHaveLength(15)
      for (const x of refused) {
        expect(x.headers['ratelimit-policy']).toBe('"unverified";q=5;w=60')
        expect(Number(x.headers['retry-after'])).toBeGreaterThanOrEqual(1)
        expect(Number(x.headers['retry-after'])).toBeLessThanOrEqual(60)
      }
    } finally {
      await p.close()
    }
  })

  it('trusted (trustProxy: the loopback proxy): each client address its own budget, keyed on the hop the proxy appended, not on what the client wrote before it', async () => {
    const p = await platform()
    const a = await p.instance({ policy: () => undefined, trustProxy: ['127.0.0.1'] })
    try {
      await expectABudgetPerClient(a)
    } finally {
      await p.close()
    }
  })
})
