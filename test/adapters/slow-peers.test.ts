/**
 * Slow and stalled peers cost the platform a bounded amount, and hold nothing for ever. Found by
 * an audit, each failing on the old code:
 * - a GET stream whose credential no longer passes, of a client that stopped reading: its end
 *   could never go out, so the response never closed, and its proxied upstream (the App's
 *   stream) and the session's pin were held for as long as the client kept its connection;
 * - a new session's answer held for its pin (an asynchronous session store): every write was
 *   taken with no back-pressure, so the proxy read the App's stream into memory as fast as the
 *   App wrote, for as long as the store took, whether or not the client read;
 * - an App that sends the head of a JSON answer and then stalls mid-body: the proxy's deadline
 *   had ended with the head, and undici's own is off, so the client waited for ever.
 *
 * Real sockets on 127.0.0.1; a raw client that stops reading (`pause`).
 */
import * as http from 'node:http'
import * as net from 'node:net'
import { type Dispatcher, type SessionStore, UpstreamError, createMemorySessionStore } from 'mcp-dispatch'
import type { WebMcpHandler } from 'mcp-dispatch/web'
import { fromWebHandler as expressWebHandler, mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { fromWebHandler as fastifyWebHandler, mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import express from 'express'
import Fastify from 'fastify'
import { afterEach, describe, expect, it } from 'vitest'
import { HOST, aliceOnWeather, close, listen, signedProxy } from './helpers.js'
import { INITIALIZE as INITIALIZE_MESSAGE } from '../helpers/platform.js'

const cleanups: Array<() => Promise<void> | void> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

const SESSION_ID = 'f5c5bfa4-6f0e-4c36-9d0e-8e2f3a1b2c3d'
const INITIALIZE = JSON.stringify(INITIALIZE_MESSAGE)

async function serve(server: http.Server): Promise<number> {
  const port = await listen(server)
  cleanups.push(() => close(server))
  return port
}

/**
 * An App that answers with an event stream it writes as fast as its socket takes (back-pressure
 * respected), up to `cap` bytes; `open` counts its responses not yet closed.
 */
async function floodingApp(cap = Infinity, headers: http.OutgoingHttpHeaders = {}) {
  const state = { written: 0, open: 0 }
  const event = `data: ${'x'.repeat(64 * 1024 - 8)}\n\n`
  const server = http.createServer((req, res) => {
    req.resume()
    state.open++
    let gone = false
    res.on('close', () => {
      gone = true
      state.open--
    })
    res.writeHead(200, { 'content-type': 'text/event-stream', ...headers })
    const pump = () => {
      while (!gone && state.written < cap) {
        state.written += event.length
        if (!res.write(event)) return void res.once('drain', pump)
      }
    }
    pump()
  })
  return { origin: `http://127.0.0.1:${await serve(server)}`, state }
}

/** A raw client: what it sent goes out as given; `received` counts what it has read, `text` keeps its first 4 KiB. */
function rawClient(port: number, request: string) {
  const socket = net.connect(port, '127.0.0.1')
  const state = { received: 0, text: '' }
  socket.on('data', (data: Buffer) => {
    state.received += data.length
    if (state.text.length < 4096) state.text += data.toString('latin1')
  })
  socket.on('error', () => {})
  cleanups.push(() => void socket.destroy())
  socket.write(request)
  return { socket, state }
}

async function until(condition: () => boolean, what: string, ms = 10_000): Promise<void> {
  const since = performance.now()
  while (!condition()) {
    if (performance.now() - since > ms) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

/** Resolves once `value()` has stopped growing for `quietMs`. */
async function settled(value: () => number, quietMs = 300): Promise<number> {
  let last = -1
  while (last !== value()) {
    last = value()
    await new Promise((resolve) => setTimeout(resolve, quietMs))
  }
  return last
}

const servers = {
  async express(dispatcher: Dispatcher, handler: WebMcpHandler, closed: { count: number }) {
    const app = express()
    app.use((req, _res, next) => void (req.socket.once('close', () => closed.count++), next()))
    app.use(expressDispatch({ dispatcher }), expressWebHandler(handler))
    // Kept alive past the slow reader's last byte (Node's default closes 5 s after the end was written).
    return serve(http.createServer({ keepAliveTimeout: 60_000 }, app))
  },
  async fastify(dispatcher: Dispatcher, handler: WebMcpHandler, closed: { count: number }) {
    const app = Fastify()
    app.addHook('onRequest', async (request) => void request.raw.socket.once('close', () => closed.count++))
    await app.register(fastifyDispatch({ dispatcher }))
    app.all('/*', fastifyWebHandler(handler))
    await app.ready()
    cleanups.push(() => app.close())
    return serve(app.server)
  },
}

describe('a GET stream whose token is revoked, of a client that stopped reading', () => {
  for (const kind of ['express', 'fastify'] as const) {
    it(`${kind}: is cut, and its proxied upstream let go`, async () => {
      const fixture = await aliceOnWeather({ reauthorizeEveryMs: 100 })
      const app = await floodingApp()
      const closed = { count: 0 }
      const port = await servers[kind](fixture.dispatcher, await signedProxy(app.origin, () => {}), closed)
      const client = rawClient(port, `GET / HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.created.token}\r\nAccept: text/event-stream\r\n\r\n`)
      await until(() => client.state.received > 0, 'the first events')
      expect(client.state.text).toMatch(/^HTTP\/1\.1 200 /)
      // The client stops reading; the buffers between it and the App fill.
      client.socket.pause()
      await settled(() => app.state.written)
      expect(app.state.open).toBe(1)

      await fixture.tokens.revoke('alice', fixture.created.id)
      // Before: the end waited behind the unread bytes for ever, and the App's stream with it.
      await until(() => app.state.open === 0, 'the upstream let go', 5_000)
      await until(() => closed.count === 1, 'its connection closed', 5_000)
    })
  }

  it('a client that reads gets the end of its stream, on a connection it keeps', async () => {
    const fixture = await aliceOnWeather({ reauthorizeEveryMs: 100 })
    const app = await floodingApp(1024 * 1024)
    const closed = { count: 0 }
    const port = await servers.express(fixture.dispatcher, await signedProxy(app.origin, () => {}), closed)
    const client = rawClient(port, `GET / HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.created.token}\r\nAccept: text/event-stream\r\n\r\n`)
    await until(() => app.state.written >= 1024 * 1024 && client.state.received > 1024 * 1024, 'the App done writing, and read')
    let tail = ''
    client.socket.on('data', (data: Buffer) => void (tail = (tail + data.toString('latin1')).slice(-16)))
    await fixture.tokens.revoke('alice', fixture.created.id)
    await until(() => tail.endsWith('\r\n0\r\n\r\n') || tail === '0\r\n\r\n', 'the chunked body ended')
    await until(() => app.state.open === 0, 'the upstream let go')
    expect({ destroyed: client.socket.destroyed, closed: closed.count }).toEqual({ destroyed: false, closed: 0 })
  })
})

describe('a GET stream whose token is revoked, of a client that reads slowly', () => {
  it('gets the end of its stream behind the bytes still on their way, on a connection it keeps', async () => {
    const fixture = await aliceOnWeather({ reauthorizeEveryMs: 100 })
    const app = await floodingApp(4 * 1024 * 1024)
    const closed = { count: 0 }
    const port = await servers.express(fixture.dispatcher, await signedProxy(app.origin, () => {}), closed)
    const client = rawClient(port, `GET / HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.created.token}\r\nAccept: text/event-stream\r\n\r\n`)
    let tail = ''
    client.socket.on('data', (data: Buffer) => void (tail = (tail + data.toString('latin1')).slice(-16)))
    // Reads what it has buffered (a socket buffers 64 KiB at most) every 20 ms: slower than the
    // App writes, never stopped, and fast enough that what is on its way drains well within the
    // stream's 10 s grace on a loaded machine (at every 50 ms, a CI run with other work beside
    // it was cut at the grace).
    client.socket.pause()
    const pace = setInterval(() => void client.socket.read(), 20)
    cleanups.push(() => clearInterval(pace))
    await until(() => app.state.written >= 4 * 1024 * 1024, 'the App done writing')
    expect(client.state.received).toBeLessThan(app.state.written)
    await fixture.tokens.revoke('alice', fixture.created.id)
    await until(() => tail.endsWith('\r\n0\r\n\r\n') || tail === '0\r\n\r\n', 'the chunked body ended', 15_000)
    expect({ destroyed: client.socket.destroyed, closed: closed.count }).toEqual({ destroyed: false, closed: 0 })
  })
})

describe('a new session answer held for its pin, to a client that reads nothing', () => {
  /** Far below the App's cap; about what the buffers of two loopback connections hold. */
  const BOUNDED = 32 * 1024 * 1024
  const CAP = 160 * 1024 * 1024

  for (const pinMs of [0, 1_500]) {
    it(`reads the App no further than the client takes (pin stored after ${pinMs} ms)`, async () => {
      const memory = createMemorySessionStore()
      // An asynchronous store (Redis-like), slow to write within the dispatcher's storeTimeoutMs.
      const sessions: SessionStore = {
        get: async (id, ttlMs) => memory.get(id, ttlMs),
        set: async (id, pin, ttlMs) => {
          await new Promise((resolve) => setTimeout(resolve, pinMs))
          return memory.set(id, pin, ttlMs)
        },
        delete: async (id) => memory.delete(id),
      }
      const fixture = await aliceOnWeather({ sessions })
      const app = await floodingApp(CAP, { 'mcp-session-id': SESSION_ID })
      const port = await servers.express(fixture.dispatcher, await signedProxy(app.origin, () => {}), { count: 0 })
      const client = rawClient(
        port,
        `POST / HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.created.token}\r\nAccept: application/json, text/event-stream\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(INITIALIZE)}\r\n\r\n${INITIALIZE}`,
      )
      client.socket.pause()
      await until(() => app.state.written > 0, 'the App writing')
      await new Promise((resolve) => setTimeout(resolve, pinMs))
      // Before: with the pin stored after 1.5 s, the App wrote its whole 160 MiB into the platform's memory.
      expect(await settled(() => app.state.written)).toBeLessThan(BOUNDED)
      // The client that reads at last gets the answer, head first, with its session.
      client.socket.resume()
      await until(() => client.state.received > 1024 * 1024, 'the answer read')
      expect(client.state.text).toMatch(/^HTTP\/1\.1 200 [^]*\r\nmcp-session-id: f5c5bfa4-6f0e-4c36-9d0e-8e2f3a1b2c3d\r\n/i)
    })
  }
})

describe('an App that stalls mid-answer, after its head', () => {
  async function stallingApp(headers: http.OutgoingHttpHeaders, first: string) {
    const state = { open: 0 }
    const server = http.createServer((req, res) => {
      req.resume()
      state.open++
      res.on('close', () => state.open--)
      res.writeHead(200, headers)
      res.write(first) // and nothing more
    })
    return { origin: `http://127.0.0.1:${await serve(server)}`, state }
  }

  it('a JSON body: the client is cut after timeoutMs without a chunk, the upstream let go, and a 504 reported', async () => {
    const fixture = await aliceOnWeather()
    const app = await stallingApp({ 'content-type': 'application/json', 'content-length': '100' }, '{"jsonrpc":')
    const errors: unknown[] = []
    const port = await servers.express(fixture.dispatcher, await signedProxy(app.origin, (error) => void errors.push(error), 200), { count: 0 })
    const body = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    const client = rawClient(
      port,
      `POST / HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.created.token}\r\nAccept: application/json, text/event-stream\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    )
    let clientClosed = false
    client.socket.on('close', () => (clientClosed = true))
    await until(() => client.state.text.includes('{"jsonrpc":'), 'the head and the first bytes')
    // Before: ten times that later the client still waited, the upstream still held.
    await until(() => clientClosed && app.state.open === 0, 'the client cut and the upstream let go', 5_000)
    expect(client.state.text).toMatch(/^HTTP\/1\.1 200 /)
    expect(errors).toHaveLength(1)
    const cause = (errors[0] as Error).cause
    expect(cause).toBeInstanceOf(UpstreamError)
    expect(cause).toMatchObject({ status: 504, message: expect.stringMatching(/sent nothing of its answer's body for 200 ms/) })
  })

  it('an event stream may stay quiet past timeoutMs', async () => {
    const fixture = await aliceOnWeather()
    const app = await stallingApp({ 'content-type': 'text/event-stream' }, ': open\n\n')
    const errors: unknown[] = []
    const port = await servers.express(fixture.dispatcher, await signedProxy(app.origin, (error) => void errors.push(error), 200), { count: 0 })
    const client = rawClient(port, `GET / HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.created.token}\r\nAccept: text/event-stream\r\n\r\n`)
    await until(() => client.state.text.includes(': open'), 'the first event')
    await new Promise((resolve) => setTimeout(resolve, 1_000))
    expect({ open: app.state.open, destroyed: client.socket.destroyed, errors }).toEqual({ open: 1, destroyed: false, errors: [] })
  })
})
