/**
 * `nodeServerFault` and `nodeServerErrorHandler` against the errors `@hono/node-server`'s own
 * listener raises: raw HTTP/1 requests it cannot make a `Request` of, on a loopback server.
 */
import { type Server, createServer } from 'node:http'
import { type AddressInfo, connect } from 'node:net'
import { RequestError, getRequestListener } from '@hono/node-server'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type NodeServerFault, nodeServerErrorHandler, nodeServerFault } from './node-server.js'

const NOT_FOUND = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Not found', data: { error: 'not_found' } } }
const INVALID_HOST = { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Invalid Host header', data: { error: 'invalid_request', field: 'host' } } }

let server: Server
let port: number
/** What `nodeServerFault` made of each error the listener handed over, in order. */
const faults: Array<NodeServerFault | undefined> = []

beforeAll(async () => {
  const listener = getRequestListener(
    (request) => (new URL(request.url).pathname === '/reject' ? Promise.reject(new Error('handler failed')) : new Response('served')),
    {
      errorHandler: (error) => {
        faults.push(nodeServerFault(error))
        return nodeServerErrorHandler(error)
      },
    },
  )
  server = createServer(listener)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  port = (server.address() as AddressInfo).port
})
afterAll(async () => {
  server.closeAllConnections()
  await new Promise((resolve) => server.close(resolve))
})

/** One raw request (`head`: its request line and fields); the status, fields and body of the answer. */
function send(head: string): Promise<{ status: number; headers: string; body: string }> {
  return new Promise((resolve, reject) => {
    let answer = ''
    const socket = connect(port, '127.0.0.1', () => socket.write(`${head}\r\nConnection: close\r\n\r\n`))
    socket.setEncoding('utf8')
    socket.on('data', (chunk: string) => (answer += chunk))
    socket.on('error', reject)
    socket.on('end', () => {
      const split = answer.indexOf('\r\n\r\n')
      resolve({ status: Number(answer.split(' ')[1]), headers: answer.slice(0, split).toLowerCase(), body: answer.slice(split + 4) })
    })
  })
}

describe('nodeServerErrorHandler on @hono/node-server', () => {
  it.each([
    ['a Host with credentials', 'host', 'GET /v1 HTTP/1.1\r\nHost: a@weather.localhost'],
    ['a port past 65535', 'host', 'GET /v1 HTTP/1.1\r\nHost: weather.localhost:99999'],
    ['an absolute-form target whose host no URL holds', 'host', 'POST http://weather.localhost:99999/v1 HTTP/1.1\r\nHost: weather.localhost'],
    ['OPTIONS * behind an upper-case Host (reported as an invalid host header)', 'host', 'OPTIONS * HTTP/1.1\r\nHost: WEATHER.localhost'],
    ['a backslash in the path', 'target', 'POST /v1\\x HTTP/1.1\r\nHost: weather.localhost'],
    ['a backslash in an absolute-form target', 'target', 'POST http://weather.localhost/v1\\x HTTP/1.1\r\nHost: weather.localhost'],
    ['OPTIONS * (no path)', 'target', 'OPTIONS * HTTP/1.1\r\nHost: weather.localhost'],
    ['OPTIONS * behind a Host the URL parser reads (a default port)', 'target', 'OPTIONS * HTTP/1.1\r\nHost: weather.localhost:80'],
    ['HTTP/1.0 without Host, and no hostname option', 'no-host', 'GET /v1 HTTP/1.0'],
  ] as const)('%s: fault %s (the Host: 400 Invalid Host header; the target or no Host: 404 not_found, as the Node adapters answer them)', async (_name, fault, head) => {
    const before = faults.length
    const answer = await send(head)
    expect(answer.headers).toContain('content-type: application/json')
    expect([answer.status, JSON.parse(answer.body)]).toEqual(fault === 'host' ? [400, INVALID_HOST] : [404, NOT_FOUND])
    expect(faults.slice(before)).toEqual([fault])
  })

  it('a fetch handler that rejects: 503 temporarily_unavailable with Retry-After, no fault', async () => {
    const before = faults.length
    const answer = await send('GET /reject HTTP/1.1\r\nHost: weather.localhost')
    expect(answer.status).toBe(503)
    expect(answer.headers).toContain('retry-after: 1')
    expect(JSON.parse(answer.body).error.data).toEqual({ error: 'temporarily_unavailable', retryAfter: 1 })
    expect(faults.slice(before)).toEqual([undefined])
  })

  it('a request it can build is served, the handler never called', async () => {
    const before = faults.length
    expect(await send('GET /v1 HTTP/1.1\r\nHost: weather.localhost')).toMatchObject({ status: 200, body: 'served' })
    expect(faults.length).toBe(before)
  })
})

describe('nodeServerFault', () => {
  it('is undefined for anything but a RequestError of @hono/node-server: another error, a string, null, a message it does not know (another library\'s RequestError)', () => {
    expect(nodeServerFault(new Error('Backslash in request path'))).toBeUndefined()
    expect(nodeServerFault(new TypeError('Invalid URL'))).toBeUndefined()
    expect(nodeServerFault('RequestError')).toBeUndefined()
    expect(nodeServerFault(null)).toBeUndefined()
    expect(nodeServerFault({ name: 'RequestError', message: 'Backslash in request path' })).toBeUndefined()
    expect(nodeServerFault(Object.assign(new Error('connect ECONNREFUSED'), { name: 'RequestError' }))).toBeUndefined()
    expect(nodeServerErrorHandler(new RequestError('Timeout awaiting response')).status).toBe(503)
  })

  it('over HTTP/2, an absolute-form :path and a :scheme other than http and https are the target\'s', () => {
    expect(nodeServerFault(new RequestError('Absolute URL for :path is not allowed in HTTP/2'))).toBe('target')
    expect(nodeServerFault(new RequestError('Unsupported scheme'))).toBe('target')
  })

  it('an "Invalid absolute URL" for another cause than a backslash, and an "Invalid URL" from the parser of an input with a path (or of none), are the Host\'s', () => {
    expect(nodeServerFault(new RequestError('Invalid absolute URL', { cause: new TypeError('Invalid URL') }))).toBe('host')
    expect(nodeServerFault(new RequestError('Invalid URL', { cause: null }))).toBe('host')
    expect(nodeServerFault(new RequestError('Invalid URL', { cause: Object.assign(new TypeError('Invalid URL'), { input: 'http://a@b:99999/v1' }) }))).toBe('host')
    expect(nodeServerFault(new RequestError('Invalid URL', { cause: Object.assign(new TypeError('Invalid URL'), { input: 'http://b:80*' }) }))).toBe('target')
  })
})
