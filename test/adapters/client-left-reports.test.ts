/**
 * What any client can make the platform report: nothing (found by an audit, each failing on the
 * old code). A client that reset its connection mid-upload was reported as a `handler` failure
 * (`aborted`, the body read cut short), once per request, on every adapter; a client that stalled
 * its upload through the proxy was reported (`Request body stalled`) besides its 408. `onError`
 * pages the platform's on-call: only the platform's own failures go there, never what a scanner
 * sends as often as it likes. Real sockets on 127.0.0.1.
 */
import * as http from 'node:http'
import * as http2 from 'node:http2'
import * as net from 'node:net'
import { fromWebHandler as expressWebHandler, jsonRpcErrors as expressErrors, mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { fromWebHandler as fastifyWebHandler, jsonRpcErrors as fastifyErrors, mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { serve as honoServe } from '@hono/node-server'
import express from 'express'
import Fastify from 'fastify'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { aliceOnWeather, close, listen, signedProxy } from './helpers.js'

const HOST = 'weather.localhost'
const cleanups: Array<() => Promise<void> | void> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

async function serveNode(server: http.Server): Promise<number> {
  const port = await listen(server)
  cleanups.push(() => close(server))
  return port
}

/** An upstream App that reads the whole body and answers JSON. */
async function echoApp(): Promise<string> {
  const server = http.createServer((req, res) => {
    req.on('error', () => {})
    req.resume()
    req.on('end', () => {
      res.setHeader('content-type', 'application/json')
      res.end('{"jsonrpc":"2.0","id":1,"result":{}}')
    })
  })
  return `http://127.0.0.1:${await serveNode(server)}`
}

/** Raw HTTP/1.1: head and part of a declared body, then silence until the server answers. */
function stallingUpload(port: number, token: string): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1')
    let got = ''
    socket.on('data', (d) => (got += d.toString('latin1')))
    socket.on('error', () => {})
    socket.on('close', () => resolve(got.split('\r\n')[0] ?? ''))
    socket.write(`POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"jsonrpc":`)
  })
}

function abortMidBody(port: number, token: string): Promise<void> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1')
    socket.on('error', () => {})
    socket.write(`POST /v1 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"jsonrpc":`)
    setTimeout(() => {
      socket.resetAndDestroy()
      setTimeout(resolve, 10)
    }, 10)
  })
}

async function inParallel(n: number, width: number, one: () => Promise<unknown>) {
  let i = 0
  await Promise.all(Array.from({ length: width }, async () => {
    while (i++ < n) await one()
  }))
}

describe('proxy: a client that stalls its upload', () => {
  it('is answered 408 without paging the platform (onError stays silent): 200 stalled uploads, 0 reports', async () => {
    const { dispatcher, token, errors, onError } = await aliceOnWeather()
    const proxy = await signedProxy(await echoApp(), onError, 100)
    const app = express()
    app.use(expressDispatch({ dispatcher, onError }))
    app.use(expressWebHandler(proxy))
    const port = await serveNode(http.createServer(app))
    const statuses = new Set<string>()
    await inParallel(200, 50, async () => statuses.add(await stallingUpload(port, token)))
    expect([...statuses]).toEqual(['HTTP/1.1 408 Request Timeout'])
    // Each one a line on the platform's error channel, no bound:
    expect({ reports: errors.length, contexts: [...new Set(errors.map((e) => e.context))] }).toEqual({ reports: 0, contexts: [] })
  })
})

describe('a client that resets its connection mid-upload is not the platform\'s failure', () => {
  // The common Web handler shape: read the JSON-RPC message, answer it. Its failures counted:
  // the resets reached it (a reset before the dispatch would prove nothing).
  let failures = 0
  const webHandler = async (request: Request) => {
    try {
      return Response.json({ jsonrpc: '2.0', id: ((await request.json()) as { id: number }).id, result: {} })
    } catch (error) {
      failures++
      throw error
    }
  }
  beforeEach(() => void (failures = 0))
  const noReports = (errors: ReadonlyArray<{ error: unknown; context: string }>) => {
    expect({ reports: errors.length, contexts: [...new Set(errors.map((e) => `${e.context}: ${String(e.error)}`))] }).toEqual({ reports: 0, contexts: [] })
  }
  /** 200 clients reset mid-upload: the handler failed for some (they reached it), and nothing was reported. */
  async function resetsReportNothing(port: number, token: string, errors: ReadonlyArray<{ error: unknown; context: string }>) {
    await inParallel(200, 20, () => abortMidBody(port, token))
    await new Promise((r) => setTimeout(r, 100))
    noReports(errors)
    expect(failures).toBeGreaterThan(0)
  }

  it('Web adapter (@hono/node-server): 200 resets, 0 reports', async () => {
    const { dispatcher, token, errors, onError } = await aliceOnWeather()
    const handle = webDispatch({ dispatcher, onError, handler: webHandler })
    const server = honoServe({ fetch: (request, env) => handle(request, { clientAddress: env.incoming.socket.remoteAddress ?? null, outgoing: env.outgoing as http.ServerResponse }), port: 0, hostname: '127.0.0.1' }) as http.Server
    await new Promise<void>((r) => server.once('listening', r))
    cleanups.push(() => close(server))
    const port = (server.address() as net.AddressInfo).port
    await resetsReportNothing(port, token, errors)
  })

  it('Express fromWebHandler: 200 resets, 0 reports', async () => {
    const { dispatcher, token, errors, onError } = await aliceOnWeather()
    const app = express()
    app.use(expressDispatch({ dispatcher, onError }))
    app.use(expressWebHandler(webHandler))
    const port = await serveNode(http.createServer(app))
    await resetsReportNothing(port, token, errors)
  })

  it('Fastify fromWebHandler: 200 resets, 0 reports', async () => {
    const { dispatcher, token, errors, onError } = await aliceOnWeather()
    const app = Fastify()
    await app.register(fastifyDispatch({ dispatcher, onError }))
    app.removeAllContentTypeParsers()
    app.addContentTypeParser('*', (_req, _payload, done) => done(null))
    app.all('/*', fastifyWebHandler(webHandler))
    await app.listen({ port: 0, host: '127.0.0.1' })
    cleanups.push(() => app.close())
    const port = (app.server.address() as net.AddressInfo).port
    await resetsReportNothing(port, token, errors)
  })

  it('a failure of the handler\'s own, after its client left, is still reported (a store that timed out is the platform\'s to hear)', async () => {
    const { dispatcher, token, errors, onError } = await aliceOnWeather()
    const app = express()
    app.use(expressDispatch({ dispatcher, onError }))
    app.use(
      expressWebHandler(async (request) => {
        await new Promise((resolve) => request.signal.addEventListener('abort', resolve, { once: true }))
        throw new Error('the database did not answer')
      }),
    )
    const port = await serveNode(http.createServer(app))
    await abortMidBody(port, token)
    await expect.poll(() => errors.map((e) => `${e.context}: ${(e.error as Error).message}`)).toEqual(['handler: the database did not answer'])
  })

  it('Express with express.json() and jsonRpcErrors: 200 resets, and corrupt gzip bodies, 0 reports', async () => {
    const { dispatcher, token, errors, onError } = await aliceOnWeather()
    const app = express()
    app.use(expressDispatch({ dispatcher, onError }))
    app.use(express.json())
    app.use((_req, res) => void res.json({ ok: true }))
    app.use(expressErrors({ onError }))
    const port = await serveNode(http.createServer(app))
    await inParallel(200, 20, () => abortMidBody(port, token))
    const gz = await new Promise<number>((resolve) => {
      const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1', headers: { host: HOST, authorization: `Bearer ${token}`, 'content-type': 'application/json', 'content-encoding': 'gzip' } }, (res) => {
        res.resume()
        res.on('end', () => resolve(res.statusCode!))
      })
      req.end(Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3, 4]))
    })
    await new Promise((r) => setTimeout(r, 100))
    expect(gz).toBeLessThan(500)
    noReports(errors)
  })

  it('Fastify with its JSON parser and jsonRpcErrors: 200 resets, 0 reports', async () => {
    const { dispatcher, token, errors, onError } = await aliceOnWeather()
    const app = Fastify()
    await app.register(fastifyDispatch({ dispatcher, onError }))
    app.setErrorHandler(fastifyErrors({ onError }))
    app.all('/*', async () => ({ ok: true }))
    await app.listen({ port: 0, host: '127.0.0.1' })
    cleanups.push(() => app.close())
    const port = (app.server.address() as net.AddressInfo).port
    await inParallel(200, 20, () => abortMidBody(port, token))
    await new Promise((r) => setTimeout(r, 100))
    noReports(errors)
  })

  it('proxy over HTTP/2 (Web adapter): a client that resets its stream mid-upload, 0 reports', async () => {
    const { dispatcher, token, errors, onError } = await aliceOnWeather()
    const proxy = await signedProxy(await echoApp(), onError, 5000)
    const handle = webDispatch({ dispatcher, onError, handler: proxy })
    const server = honoServe({ fetch: (request, env) => handle(request, { clientAddress: env.incoming.socket.remoteAddress ?? null, outgoing: env.outgoing as never }), port: 0, hostname: '127.0.0.1', createServer: http2.createServer }) as unknown as http2.Http2Server
    await new Promise<void>((r) => server.once('listening', r))
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())))
    const port = (server.address() as net.AddressInfo).port
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on('error', () => {})
    cleanups.push(() => void session.destroy())
    for (let i = 0; i < 100; i++) {
      const stream = session.request({ ':method': 'POST', ':path': '/v1', ':authority': HOST, authorization: `Bearer ${token}`, 'content-type': 'application/json', 'content-length': '100' }, { endStream: false })
      stream.on('error', () => {})
      stream.write('{"jsonrpc":')
      await new Promise((r) => setTimeout(r, 5))
      stream.close(http2.constants.NGHTTP2_CANCEL)
      await new Promise((r) => setTimeout(r, 5))
    }
    await new Promise((r) => setTimeout(r, 200))
    noReports(errors)
  })
})
