/**
 * A proxied App that answers before taking the whole request body (a 413 for a body past its
 * limit, read only in part): through every adapter on Node, a keep-alive client (undici, Node's
 * `fetch`, which the MCP SDK's client uses) that sends its next requests at once gets every one
 * answered. The proxy lets go of the rest of the body once the exchange is over, and the Express
 * and Fastify adapters drain it, so the connection goes on; `@hono/node-server` closes such a
 * connection itself, and the Web adapter given `outgoing` says so (`Connection: close`). Found
 * by an audit: the rest of the body stayed paused under the proxy, the connection was held until
 * a timeout, and the client's next request on it failed (`ECONNRESET`, 5 of 15 through Express;
 * `UND_ERR_SOCKET` on `@hono/node-server`).
 */
import { once } from 'node:events'
import { connect } from 'node:net'
import { generateKeyPair } from 'jose'
import { createDispatcher } from 'mcp-dispatch'
import { createIdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { describe, expect, it } from 'vitest'
import { serveFetch } from '../helpers/platform.js'
import { ADAPTER_KINDS, createFixture, serveWebHandler } from './helpers.js'

const LIMIT = 64 * 1024
const TOO_LARGE = '{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Payload Too Large"}}'

/** The App: reads at most `LIMIT` bytes of a body, then answers 413 (as an App with a body limit). */
async function limitedApp(request: Request): Promise<Response> {
  if (request.method === 'POST' && request.body) {
    const reader = request.body.getReader()
    let read = 0
    for (;;) {
      const chunk = await reader.read()
      if (chunk.done) break
      read += chunk.value.byteLength
      if (read > LIMIT) {
        await reader.cancel()
        return new Response(TOO_LARGE, { status: 413, headers: { 'content-type': 'application/json' } })
      }
    }
  }
  return new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json' } })
}

describe('a proxied App that answers before taking the whole body', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: the client's next requests on its keep-alive connections are all answered, and nothing is reported`, async () => {
      const upstream = await serveFetch(limitedApp)
      const base = createFixture()
      // Node's `fetch` to 127.0.0.1 (it sends no Host of the test's): the App whatever the host.
      const app = base.apps.getAppBySlug('weather')
      const fixture = { ...base, dispatcher: createDispatcher({ ...base.dispatcherOptions, resolveApp: () => app }) }
      const { privateKey } = await generateKeyPair('ES256', { extractable: true })
      const proxyErrors: unknown[] = []
      const proxy = createProxyHandler({
        upstream: () => `http://127.0.0.1:${upstream.port}/mcp`,
        identity: createIdentitySigner({ issuer: 'https://platform.test', privateKey }),
        onError: (error) => proxyErrors.push(error),
      })
      const served = await serveWebHandler(kind, fixture, proxy)
      const url = `http://127.0.0.1:${served.port}/v1`
      const headers = { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }
      try {
        const failures: string[] = []
        for (let round = 0; round < 4; round++) {
          const big = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: { x: 'a'.repeat(5_000_000) } }) })
          expect(big.status).toBe(413)
          // Express and Fastify drain the rest and keep the connection; @hono/node-server
          // closes it, and the Web adapter says so.
          expect(big.headers.get('connection')).toBe(kind === 'web' ? 'close' : 'keep-alive')
          expect(await big.text()).toBe(TOO_LARGE)
          for (let i = 0; i < 3; i++) {
            try {
              const next = await fetch(url, { method: 'POST', headers, body: '{"jsonrpc":"2.0","id":2,"method":"ping"}' })
              expect(next.status).toBe(200)
              await next.text()
            } catch (error) {
              failures.push(String((error as { cause?: { code?: string } }).cause?.code ?? error))
            }
          }
        }
        expect(failures).toEqual([])
        // The body let go of is no body cut short: no `Content-Length` mismatch is reported.
        expect(proxyErrors).toEqual([])
        expect(fixture.errors).toEqual([])
      } finally {
        await served.close()
        await upstream.close()
      }
    })
  }
})

/**
 * An answer given without reading a body that has all arrived (the SDK transport's 406 for an
 * `Accept` it does not serve, its 415 for a `Content-Type`), its bytes in the packet of the
 * request's head: `@hono/node-server` drains that body and keeps the connection, so the Web
 * adapter given `outgoing` says `keep-alive`, as every other adapter, and the next request
 * pipelined on the connection is answered. Found by an adapter parity audit: the body was taken
 * as still in flight (Node parses the bytes after a head once the head's callbacks have run),
 * and the answer said `Connection: close` and closed a connection that could go on.
 */
describe('an early answer to a request whose small body has all arrived', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: the connection is kept, and the pipelined next request answered`, async () => {
      const base = createFixture()
      const app = base.apps.getAppBySlug('weather')
      const fixture = { ...base, dispatcher: createDispatcher({ ...base.dispatcherOptions, resolveApp: () => app }) }
      // Answers 406 without reading the body, as the SDK transport does for `Accept: text/html`.
      const served = await serveWebHandler(kind, fixture, () => new Response('{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Not Acceptable"}}', { status: 406, headers: { 'content-type': 'application/json' } }))
      const body = '{"jsonrpc":"2.0","id":1,"method":"ping"}'
      const request = `POST /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nContent-Type: application/json\r\nAccept: text/html\r\nContent-Length: ${body.length}\r\n\r\n${body}`
      try {
        // Both requests in one write: the second is read only if the connection goes on.
        const received = await new Promise<string>((resolve, reject) => {
          let text = ''
          const socket = connect(served.port, '127.0.0.1', () => socket.write(request + request))
          socket.setEncoding('latin1')
          socket.on('data', (chunk: string) => {
            text += chunk
            if ((text.match(/HTTP\/1\.1 406/g) ?? []).length === 2) socket.end()
          })
          socket.on('error', reject)
          socket.on('close', () => resolve(text))
          socket.setTimeout(5_000, () => socket.destroy())
        })
        const heads = [...received.matchAll(/HTTP\/1\.1 [^\r]*\r\n[\s\S]*?\r\n\r\n/g)].map((match) => match[0])
        expect(heads.map((head) => head.split('\r\n')[0])).toEqual(['HTTP/1.1 406 Not Acceptable', 'HTTP/1.1 406 Not Acceptable'])
        for (const head of heads) expect(head.toLowerCase()).toContain('connection: keep-alive')
        expect(fixture.errors).toEqual([])
      } finally {
        await served.close()
      }
    })
  }
})

/**
 * A refusal of the dispatch layer (a 401) to an upload: one whose body came whole with its head
 * keeps its connection on every adapter, and the request pipelined behind it is answered; one
 * given while the body is still on its way keeps it on Express and Fastify (Node drains the
 * rest), and the next request is answered. (On `@hono/node-server` an upload slower than 500 ms
 * has its connection closed, its refusal having said keep-alive: docs/adapters.md says why the
 * Web adapter leaves it so.)
 */
describe('a refusal of an upload', () => {
  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: the connection is kept, and the request sent next on it is answered`, async () => {
      const base = createFixture()
      const app = base.apps.getAppBySlug('weather')
      const fixture = { ...base, dispatcher: createDispatcher({ ...base.dispatcherOptions, resolveApp: () => app }) }
      const served = await serveWebHandler(kind, fixture, () => Response.json({ jsonrpc: '2.0', id: 1, result: {} }))
      const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping', params: { pad: 'x'.repeat(2_000) } })
      const head = (token: string, length: number) =>
        `POST /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: ${length}\r\n\r\n`
      try {
        // Its body whole with its head, the next request behind it.
        const pipelined = await new Promise<string>((resolve) => {
          let seen = ''
          const other = connect(served.port, '127.0.0.1', () => other.write(head('svc_made_up', body.length) + body + head(fixture.tokens.alice, body.length) + body))
          other.setEncoding('latin1')
          other.on('error', () => {})
          other.on('data', (chunk: string) => {
            seen += chunk
            if ((seen.match(/HTTP\/1\.1 /g) ?? []).length === 2 && /HTTP\/1\.1 200 [^]*\r\n\r\n[^]*"result"/.test(seen)) other.end()
          })
          other.on('close', () => resolve(seen))
          other.setTimeout(5_000, () => other.destroy())
        })
        expect(pipelined).toMatch(/^HTTP\/1\.1 401 [^]*connection: keep-alive[^]*HTTP\/1\.1 200 /i)
        if (kind !== 'web') {
          // Refused with its body still on its way; the rest comes late (700 ms), then the next request.
          let text = ''
          const socket = connect(served.port, '127.0.0.1')
          socket.setEncoding('latin1')
          socket.on('error', () => {})
          const closed = once(socket, 'close')
          socket.on('data', (chunk: string) => (text += chunk))
          socket.write(head('svc_made_up', body.length) + body.slice(0, 10))
          await expect.poll(() => text, { timeout: 5_000 }).toMatch(/^HTTP\/1\.1 401 [^]*\r\n\r\n/)
          expect(text.slice(0, text.indexOf('\r\n\r\n')).toLowerCase()).toContain('connection: keep-alive')
          await new Promise((resolve) => setTimeout(resolve, 700))
          socket.write(body.slice(10) + head(fixture.tokens.alice, body.length) + body)
          await expect.poll(() => text.match(/HTTP\/1\.1 /g)?.length, { timeout: 5_000 }).toBe(2)
          expect(text.slice(text.lastIndexOf('HTTP/1.1 '))).toMatch(/^HTTP\/1\.1 200 /)
          socket.end()
          await closed
        }
        expect(fixture.errors).toEqual([])
      } finally {
        await served.close()
      }
    })
  }
})
