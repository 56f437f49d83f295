/**
 * A GET event stream whose head the App holds back until its first event: Fastify's
 * `reply.send(stream)` writes no head before the stream's first chunk, nor does a stream piped
 * to an Express response. The dispatcher watches such a response from its dispatch, not from
 * its head: a subscription that ends (or a token revoked) while the stream idles ends the
 * response at the next check, so nothing the App sends afterwards reaches the client (spec 3:
 * revocation takes effect within 10 minutes), and an idle stream keeps its session's pin.
 * Found by an audit of Fastify-based Apps: the event sent after the subscription ended arrived,
 * and a pin of a stream idle past the TTL expired under it.
 */
import { randomUUID } from 'node:crypto'
import * as http from 'node:http'
import { PassThrough } from 'node:stream'
import { createDispatcher, createMemorySessionStore } from 'mcp-dispatch'
import { mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import express from 'express'
import Fastify from 'fastify'
import { describe, expect, it } from 'vitest'
import { manualTimers } from '../helpers/manual-timers.js'
import { close, createFixture, listen, mcpClientHeaders } from './helpers.js'

const CHECK_MS = 100
const EVENT = 'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"data":"after"}}\n\n'

/** An App of each framework that opens a session on POST and answers GET with a stream it writes nothing to yet. */
const apps = {
  async fastify(dispatcher: ReturnType<typeof createDispatcher>, streams: Set<PassThrough>) {
    const app = Fastify()
    await app.register(fastifyDispatch({ dispatcher }))
    app.route({
      method: ['GET', 'POST'],
      url: '/*',
      handler: async (request, reply) => {
        if (request.method === 'GET') {
          const stream = new PassThrough()
          streams.add(stream)
          request.raw.on('close', () => void (streams.delete(stream), stream.end()))
          return reply.header('content-type', 'text/event-stream').send(stream)
        }
        return reply.header('mcp-session-id', randomUUID()).send({ jsonrpc: '2.0', id: 1, result: {} })
      },
    })
    await app.ready()
    return app.server
  },
  async express(dispatcher: ReturnType<typeof createDispatcher>, streams: Set<PassThrough>) {
    const app = express()
    app.use(expressDispatch({ dispatcher }))
    app.all(/.*/, (req, res) => {
      if (req.method === 'GET') {
        const stream = new PassThrough()
        streams.add(stream)
        req.on('close', () => void (streams.delete(stream), stream.end()))
        res.setHeader('content-type', 'text/event-stream')
        stream.pipe(res)
        return
      }
      res.setHeader('mcp-session-id', randomUUID())
      res.json({ jsonrpc: '2.0', id: 1, result: {} })
    })
    return http.createServer(app)
  },
}

function request(port: number, token: string, method: 'GET' | 'POST', sessionId?: string) {
  return new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Promise<string> }>((resolve, reject) => {
    const outgoing = http.request(
      {
        host: '127.0.0.1',
        port,
        method,
        path: '/',
        headers: mcpClientHeaders(token, sessionId),
      },
      (response) => {
        let body = ''
        response.on('data', (chunk: Buffer) => (body += chunk.toString()))
        const ended = new Promise<string>((done) => {
          response.on('end', () => done(body))
          response.on('close', () => done(body))
        })
        resolve({ status: response.statusCode!, headers: response.headers, body: ended })
      },
    )
    outgoing.on('error', reject)
    outgoing.end(method === 'POST' ? '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}' : undefined)
  })
}

/** What the client of a GET in the session received: the status and body, or how it was cut. */
function received(port: number, token: string, sessionId: string): Promise<string> {
  return request(port, token, 'GET', sessionId).then(
    async (answered) => `${answered.status} ${await answered.body}`,
    (error: NodeJS.ErrnoException) => `cut: ${error.code}`,
  )
}

/** Opens a session (the App's initialize) with `token`: its id. */
async function openSession(port: number, token: string): Promise<string> {
  const opened = await request(port, token, 'POST')
  await opened.body
  return opened.headers['mcp-session-id'] as string
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

describe('express: a GET watched from its dispatch', () => {
  it('whose handler writes its head after the cut fails quietly (no throw, no unhandled rejection), and reports nothing', async () => {
    const fixture = createFixture()
    const subscriptions = fixture.dispatcherOptions.subscriptions as unknown as { setActive(userId: string, appId: string, active: boolean): void }
    const m = manualTimers({ start: fixture.dispatcherOptions.now!(), tickMs: CHECK_MS })
    const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, reauthorizeEveryMs: CHECK_MS, timers: m.timers, now: m.now })
    const rejections: unknown[] = []
    const onRejection = (reason: unknown) => void rejections.push(reason)
    process.on('unhandledRejection', onRejection)
    let wrote: Promise<string> | undefined
    let answer!: () => void
    const answering = new Promise<void>((resolve) => (answer = resolve))
    const app = express()
    app.use(expressDispatch({ dispatcher }))
    app.all(/.*/, async (req, res) => {
      if (req.method === 'POST') return void res.setHeader('mcp-session-id', randomUUID()).json({ jsonrpc: '2.0', id: 1, result: {} })
      // An async handler that answers late: its head comes after the check ended the response.
      wrote = answering.then(() => {
        res.setHeader('content-type', 'text/event-stream')
        res.writeHead(200)
        res.write(EVENT)
        return 'wrote'
      })
      await wrote
    })
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const sessionId = await openSession(port, fixture.tokens.alice)
      const get = received(port, fixture.tokens.alice, sessionId)
      await expect.poll(() => wrote !== undefined).toBe(true)
      subscriptions.setActive('alice', 'app_weather', false)
      await m.tick(CHECK_MS)
      expect(await get).toBe('cut: ECONNRESET')
      answer()
      expect(await wrote).toBe('wrote')
      await sleep(50)
      expect(rejections).toEqual([])
      expect(fixture.errors).toEqual([])
    } finally {
      process.off('unhandledRejection', onRejection)
      await close(server)
    }
  })

  it('whose answer turns out to be no event stream (a body of a declared length) is not cut short', async () => {
    const fixture = createFixture()
    const subscriptions = fixture.dispatcherOptions.subscriptions as unknown as { setActive(userId: string, appId: string, active: boolean): void }
    const m = manualTimers({ start: fixture.dispatcherOptions.now!(), tickMs: CHECK_MS })
    const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, reauthorizeEveryMs: CHECK_MS, timers: m.timers, now: m.now })
    let end!: () => void
    const app = express()
    app.use(expressDispatch({ dispatcher }))
    app.all(/.*/, (req, res) => {
      if (req.method === 'POST') return void res.setHeader('mcp-session-id', randomUUID()).json({ jsonrpc: '2.0', id: 1, result: {} })
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': '20' })
      res.write('0123456789')
      end = () => res.end('abcdefghij')
    })
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const sessionId = await openSession(port, fixture.tokens.alice)
      const get = await request(port, fixture.tokens.alice, 'GET', sessionId)
      subscriptions.setActive('alice', 'app_weather', false)
      // A check comes while the body is under way; the rest of it comes after.
      await m.tick(CHECK_MS)
      end()
      expect(await get.body).toBe('0123456789abcdefghij')
      expect(fixture.errors).toEqual([])
    } finally {
      await close(server)
    }
  })
})

describe.each(Object.keys(apps) as Array<keyof typeof apps>)('%s: a GET stream whose head waits for its first event', (framework) => {
  it('is ended once its subscription ends, before the event the App sends afterwards reaches the client', async () => {
    const fixture = createFixture()
    const subscriptions = fixture.dispatcherOptions.subscriptions as unknown as { setActive(userId: string, appId: string, active: boolean): void }
    const m = manualTimers({ start: fixture.dispatcherOptions.now!(), tickMs: CHECK_MS })
    const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, reauthorizeEveryMs: CHECK_MS, timers: m.timers, now: m.now })
    const streams = new Set<PassThrough>()
    const server = await apps[framework](dispatcher, streams)
    const port = await listen(server)
    try {
      const sessionId = await openSession(port, fixture.tokens.alice)
      // What the client received: the connection is closed before any head (it reconnects, and
      // is refused then), never the event sent after the subscription ended.
      const get = received(port, fixture.tokens.alice, sessionId)
      await expect.poll(() => streams.size).toBe(1)
      subscriptions.setActive('alice', 'app_weather', false)
      // The next check, then the App's event.
      await m.tick(CHECK_MS)
      for (const stream of streams) stream.write(EVENT)
      expect(await get).toBe('cut: ECONNRESET')
      expect(fixture.errors).toEqual([])
      // The client's next attempt is refused with the reason.
      expect((await request(port, fixture.tokens.alice, 'GET', sessionId)).status).toBe(402)
    } finally {
      await close(server)
    }
  })

  it('keeps its session\'s pin while it idles past the pin\'s TTL: the next request of the session is served', async () => {
    const fixture = createFixture()
    const TTL_MS = 300
    const m = manualTimers({ start: fixture.dispatcherOptions.now!(), tickMs: CHECK_MS })
    const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, sessions: createMemorySessionStore({ now: m.now }), sessionTtlMs: TTL_MS, now: m.now, timers: m.timers })
    const streams = new Set<PassThrough>()
    const server = await apps[framework](dispatcher, streams)
    const port = await listen(server)
    try {
      const sessionId = await openSession(port, fixture.tokens.alice)
      void request(port, fixture.tokens.alice, 'GET', sessionId).catch(() => {})
      await expect.poll(() => streams.size).toBe(1)
      // Three TTLs with the stream idle: the pin lives only if the dispatcher's keep-alive comes
      // within each TTL (the timers fire each interval at the period it was set with).
      for (let i = 0; i < 9; i++) await m.tick(TTL_MS / 3)
      const next = await request(port, fixture.tokens.alice, 'POST', sessionId)
      await next.body
      expect(next.status).toBe(200)
      expect(next.headers['x-mcp-version']).toBe('2.0.0')
    } finally {
      await close(server)
    }
  })
})
