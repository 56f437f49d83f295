import * as http from 'node:http'
import * as http2 from 'node:http2'
import * as net from 'node:net'
import type { AddressInfo } from 'node:net'
import { describe, expect, it } from 'vitest'
import type { DispatchOutcome } from '../pipeline/dispatcher.js'
import { type Dispatched, type NodeResponse, attachToHead, closeIfBodyInFlight, continueIfExpected, dispatchHeadersFor, headOutcome, headerValue, installHeadInterception, isHttp2Response, whenClosed } from './head.js'

/**
 * A response written as Node's HTTP/1 `ServerResponse` writes its head: `writeHead` hands the
 * status line and the headers to `_storeHeader(firstLine, headers)`, which starts the head with
 * the status line and refuses a value with a control character.
 */
function nodeLikeResponseClass() {
  return class NodeLikeResponse {
    head = ''
    readonly closed = false
    writeHead(statusCode: number, reason?: unknown, headers?: unknown): this {
      this._storeHeader(`HTTP/1.1 ${statusCode} ${typeof reason === 'string' ? reason : 'OK'}\r\n`, typeof reason === 'string' ? headers : reason)
      return this
    }
    _storeHeader(firstLine: string, headers: unknown): void {
      let head = firstLine
      for (const [name, value] of Object.entries((headers ?? {}) as Record<string, string>)) {
        if (/[\r\n]/.test(value)) throw Object.assign(new TypeError(`Invalid character in header content ["${name}"]`), { code: 'ERR_INVALID_CHAR' })
        head += `${name}: ${value}\r\n`
      }
      this.head = head + '\r\n'
    }
    getHeader(): undefined {
      return undefined
    }
    hasHeader(): boolean {
      return false
    }
    removeHeader(): void {}
    once(): this {
      return this
    }
  }
}

const NodeLikeResponse = nodeLikeResponseClass()
type NodeLikeResponse = InstanceType<typeof NodeLikeResponse>

/** A response whose `writeHead` stores its head without `_storeHeader` (a Node that changed). */
class OtherHeadResponse extends NodeLikeResponse {
  override writeHead(statusCode: number, reason?: unknown, headers?: unknown): this {
    const given = (typeof reason === 'string' ? headers : reason) ?? {}
    this.head = `HTTP/1.1 ${statusCode} OK\r\n${Object.entries(given as Record<string, string>).map(([n, v]) => `${n}: ${v}\r\n`).join('')}\r\n`
    return this
  }
}

function decisionWith(headers: Record<string, string>, outcomes: DispatchOutcome[]): Dispatched {
  return {
    type: 'dispatch',
    headers,
    context: { sessionId: undefined },
    synchronousPins: true,
    complete: (outcome: DispatchOutcome) => {
      outcomes.push(outcome)
    },
  } as unknown as Dispatched
}

/** Listens on 127.0.0.1, on a port of its own, and answers the port. */
async function listenLocal(server: net.Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return (server.address() as AddressInfo).port
}

/** Closes `server` and every connection it still holds. */
async function closeLocal(server: http.Server): Promise<void> {
  server.closeAllConnections()
  await new Promise((resolve) => server.close(resolve))
}

const STAMPED = { 'x-mcp-version': '1.2.3', 'x-mcp-latest-version': '2.0.0', 'ratelimit-policy': '"minute";q=60;w=60', ratelimit: '"minute";r=59;t=30' }

describe('the dispatch headers as head lines', () => {
  installHeadInterception(NodeLikeResponse.prototype as unknown as NodeResponse)

  it('follow the status line, before the handler’s own headers, which pass as given', () => {
    const res = new NodeLikeResponse()
    const outcomes: DispatchOutcome[] = []
    expect(attachToHead(res as unknown as NodeResponse, NodeLikeResponse.prototype as unknown as NodeResponse, decisionWith(STAMPED, outcomes))).toBe(true)
    res.writeHead(201, { 'content-type': 'application/json', 'mcp-session-id': 'abc' })
    expect(res.head).toBe(
      'HTTP/1.1 201 OK\r\n' +
        'x-mcp-version: 1.2.3\r\nx-mcp-latest-version: 2.0.0\r\nratelimit-policy: "minute";q=60;w=60\r\nratelimit: "minute";r=59;t=30\r\n' +
        'content-type: application/json\r\nmcp-session-id: abc\r\n\r\n',
    )
    expect(outcomes).toEqual([{ status: 201, sessionId: 'abc', whenClosed: expect.any(Function) }])
    // A response the adapters did not dispatch is written as it comes.
    const plain = new NodeLikeResponse()
    plain.writeHead(200, { a: 'b' })
    expect(plain.head).toBe('HTTP/1.1 200 OK\r\na: b\r\n\r\n')
  })

  it('are refused for a value Node would refuse: the head takes Node’s own check, which throws, and nothing is injected', () => {
    const res = new NodeLikeResponse()
    const outcomes: DispatchOutcome[] = []
    attachToHead(res as unknown as NodeResponse, NodeLikeResponse.prototype as unknown as NodeResponse, decisionWith({ ...STAMPED, 'x-mcp-version': '1.2.3\r\nInjected: yes' }, outcomes))
    expect(() => res.writeHead(200)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_CHAR' }))
    expect(res.head).toBe('')
    expect(outcomes).toEqual([])
  })

  it('give way to the merge for good once a writeHead stored its head without _storeHeader', () => {
    installHeadInterception(OtherHeadResponse.prototype as unknown as NodeResponse)
    const proto = OtherHeadResponse.prototype as unknown as NodeResponse
    const first = new OtherHeadResponse()
    attachToHead(first as unknown as NodeResponse, proto, decisionWith(STAMPED, []))
    first.writeHead(200)
    const second = new OtherHeadResponse()
    attachToHead(second as unknown as NodeResponse, proto, decisionWith(STAMPED, []))
    second.writeHead(200, { 'content-type': 'text/plain' })
    expect(second.head).toContain('x-mcp-version: 1.2.3\r\n')
    expect(second.head).toContain('ratelimit: "minute";r=59;t=30\r\n')
    expect(second.head).toContain('content-type: text/plain\r\n')
  })

  it('are built anew where a value or a name changed since the last head, and reused where none did', () => {
    const proto = NodeLikeResponse.prototype as unknown as NodeResponse
    const heads = [
      STAMPED,
      { ...STAMPED, ratelimit: '"minute";r=58;t=29' },
      { 'x-mcp-version': '1.2.3', 'x-mcp-latest-version': '2.0.0' },
      { 'x-mcp-version': '1.2.4', 'x-mcp-latest-version': '2.0.0', ratelimit: '"minute";r=57;t=28', 'ratelimit-policy': '"minute";q=60;w=60' },
      { 'x-mcp-latest-version': '2.0.0', 'x-mcp-version': '1.2.3' },
      // The same value at the same position under another name.
      { 'x-mcp-version': '2.0.0', 'x-mcp-latest-version': '2.0.0' },
    ]
    for (const stamped of heads) {
      const res = new NodeLikeResponse()
      attachToHead(res as unknown as NodeResponse, proto, decisionWith(stamped, []))
      res.writeHead(200)
      const lines = Object.entries(stamped).map(([name, value]) => `${name}: ${value}\r\n`).join('')
      expect(res.head).toBe(`HTTP/1.1 200 OK\r\n${lines}\r\n`)
    }
  })
})

describe('a head written inside the writeHead of another (a wrapper of the platform’s)', () => {
  // A class of its own, whose writeHead writes the head of another response first.
  const NestingResponse = nodeLikeResponseClass()
  type Nesting = InstanceType<typeof NestingResponse> & { inner?: InstanceType<typeof NestingResponse> }
  const writeHead = NestingResponse.prototype.writeHead
  NestingResponse.prototype.writeHead = function (this: Nesting, statusCode: number, reason?: unknown, headers?: unknown) {
    this.inner?.writeHead(200, { a: 'b' })
    return writeHead.call(this, statusCode, reason, headers)
  }
  const proto = NestingResponse.prototype as unknown as NodeResponse
  installHeadInterception(proto)

  it('of a response no adapter dispatched: that head takes none of the dispatch headers, and the dispatched one keeps them', () => {
    const outer: Nesting = new NestingResponse()
    outer.inner = new NestingResponse()
    attachToHead(outer as unknown as NodeResponse, proto, decisionWith(STAMPED, []))
    outer.writeHead(200, { 'content-type': 'text/plain' })
    expect(outer.inner.head).toBe('HTTP/1.1 200 OK\r\na: b\r\n\r\n')
    expect(outer.head).toContain('x-mcp-version: 1.2.3\r\n')
    expect(outer.head).toContain('content-type: text/plain\r\n')
  })
})

describe('the decision of a response whose prototype changes', () => {
  // A class of its own: beneath another wrapped prototype, that one's `writeHead` would find the
  // decision where this one's did not.
  const WrappedResponse = nodeLikeResponseClass()
  const proto = WrappedResponse.prototype as unknown as NodeResponse
  installHeadInterception(proto)
  /** A prototype as Express makes one for each app: the wrapped prototype beneath it. */
  const appResponse = Object.create(WrappedResponse.prototype) as object

  it('is found when it was set aside under a swapped prototype and the prototype was put back', () => {
    const res = new WrappedResponse()
    Object.setPrototypeOf(res, appResponse)
    const outcomes: DispatchOutcome[] = []
    expect(attachToHead(res as unknown as NodeResponse, proto, decisionWith(STAMPED, outcomes))).toBe(true)
    Object.setPrototypeOf(res, WrappedResponse.prototype)
    res.writeHead(200)
    expect(res.head).toContain('x-mcp-version: 1.2.3\r\n')
    expect(outcomes).toHaveLength(1)
  })

  it('is used once: a second head of the same response (after a refused one) is not stamped twice', () => {
    const res = new WrappedResponse()
    Object.setPrototypeOf(res, appResponse)
    const outcomes: DispatchOutcome[] = []
    attachToHead(res as unknown as NodeResponse, proto, decisionWith(STAMPED, outcomes))
    res.writeHead(200)
    res.writeHead(200, { a: 'b' })
    expect(res.head).toBe('HTTP/1.1 200 OK\r\na: b\r\n\r\n')
    expect(outcomes).toHaveLength(1)
  })

  it('is found when the prototype was swapped after the decision was attached (a framework mounted under another), also once responses were set aside', () => {
    const res = new WrappedResponse()
    const outcomes: DispatchOutcome[] = []
    expect(attachToHead(res as unknown as NodeResponse, proto, decisionWith(STAMPED, outcomes))).toBe(true)
    Object.setPrototypeOf(res, appResponse)
    res.writeHead(200)
    expect(res.head).toContain('x-mcp-version: 1.2.3\r\n')
    expect(outcomes).toHaveLength(1)
  })
})

/** A response as `headOutcome` reads it: headers set with `setHeader`, and the head Node stored, if any. */
function responseWith(set: Record<string, string> = {}, storedHead?: string): NodeResponse {
  return {
    writeHead: () => undefined,
    getHeader: (name: string) => set[name],
    once: () => undefined,
    ...(storedHead !== undefined && { _header: storedHead }),
  } as unknown as NodeResponse
}

/** A decision for `headOutcome`: of a request in session `sessionId`, or in none. */
const decisionIn = (sessionId?: string) => ({ type: 'dispatch', headers: {}, context: { sessionId } }) as unknown as Dispatched

describe('headOutcome', () => {
  it('takes only a 2xx event stream for an open stream: an error answered as text/event-stream outside a session is neither checked again nor ended', () => {
    const stream = { 'content-type': 'text/event-stream' }
    expect(headOutcome(responseWith(stream), decisionIn(), 200, undefined)).toEqual({
      status: 200,
      sessionId: undefined,
      whenClosed: expect.any(Function),
      close: expect.any(Function),
    })
    for (const status of [300, 401, 500]) expect(headOutcome(responseWith(stream), decisionIn(), status, undefined)).toEqual({ status, sessionId: undefined })
  })

  it('finds the type of the head in the writeHead headers, before Node has the head (a head held until the pin is stored)', () => {
    const outcome = headOutcome(responseWith(), decisionIn(), 200, undefined, { 'Content-Type': 'text/event-stream' })
    expect(outcome.close).toEqual(expect.any(Function))
    expect(headOutcome(responseWith(), decisionIn(), 200, undefined, [['Content-Type', 'text/event-stream']]).close).toEqual(expect.any(Function))
    expect(headOutcome(responseWith(), decisionIn('s-1'), 404, undefined, { 'Content-Type': 'application/json' }).contentType).toBe('application/json')
  })

  it('finds the type set with setHeader when the head has none, where no head is stored (HTTP/2 keeps no _header)', () => {
    expect(headOutcome(responseWith({ 'content-type': 'text/event-stream' }), decisionIn(), 200, undefined).close).toEqual(expect.any(Function))
    expect(headOutcome(responseWith({ 'content-type': 'application/json' }), decisionIn('s-1'), 404, undefined).contentType).toBe('application/json')
  })

  it('finds the type in the head Node stored, in any case, for a 404 of a session (the JSON 404 that ends its pin) and for a stream', () => {
    const stored = 'HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n'
    expect(headOutcome(responseWith({}, stored), decisionIn('s-1'), 404, undefined)).toEqual({
      status: 404,
      sessionId: undefined,
      whenClosed: expect.any(Function),
      contentType: 'application/json',
    })
    const streamHead = 'HTTP/1.1 200 OK\r\nCONTENT-TYPE:\ttext/event-stream\r\n\r\n'
    expect(headOutcome(responseWith({}, streamHead), decisionIn(), 200, undefined).close).toEqual(expect.any(Function))
    // No type anywhere: null, a 404 that is not the MCP transport's.
    expect(headOutcome(responseWith({}, 'HTTP/1.1 404 Not Found\r\n\r\n'), decisionIn('s-1'), 404, undefined).contentType).toBeNull()
  })
})

describe('ending an open stream whose credential no longer passes (headOutcome close)', () => {
  it('ends it as a whole answer on a kept-alive connection, and a write of the handler after it fails on its own call, not the process', async () => {
    let written!: Promise<unknown>
    const server = http.createServer((req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write('event: message\ndata: {}\n\n', () => {
        headOutcome(res as unknown as NodeResponse, decisionIn(), 200, undefined).close!()
        // The handler goes on writing to the stream it holds.
        written = new Promise((resolve) => res.write('data: late\n\n', resolve))
      })
    })
    const port = await listenLocal(server)
    const agent = new http.Agent({ keepAlive: true })
    try {
      const get = () =>
        new Promise<{ complete: boolean; body: string; reusedSocket: boolean }>((resolve, reject) => {
          const request = http.get({ host: '127.0.0.1', port, path: '/', agent }, (response) => {
            let body = ''
            response.setEncoding('utf8')
            response.on('data', (chunk: string) => (body += chunk))
            response.on('end', () => resolve({ complete: response.complete, body, reusedSocket: request.reusedSocket }))
            response.on('error', reject)
          })
          request.on('error', reject)
        })
      // The client read the end of the stream (its last chunk), not a connection cut.
      expect(await get()).toEqual({ complete: true, body: 'event: message\ndata: {}\n\n', reusedSocket: false })
      expect(await written).toEqual(expect.objectContaining({ code: 'ERR_STREAM_WRITE_AFTER_END' }))
      // The connection is still usable: the next request goes on it.
      expect(await get()).toEqual({ complete: true, body: 'event: message\ndata: {}\n\n', reusedSocket: true })
    } finally {
      agent.destroy()
      await closeLocal(server)
    }
  })
})

describe('closeIfBodyInFlight', () => {
  const response = (req: object) => ({ req, headersSent: false, shouldKeepAlive: true })

  it('waits for nothing where no body can be in flight: a request framed with no body, a complete one, an HTTP/2 one', () => {
    expect(closeIfBodyInFlight(response({ complete: false, httpVersionMajor: 1, headers: {} }))).toBeUndefined()
    expect(closeIfBodyInFlight(response({ complete: false, httpVersionMajor: 1, headers: { 'content-length': '0' } }))).toBeUndefined()
    // Zeros alike: Node reads `00` as 0.
    expect(closeIfBodyInFlight(response({ complete: false, httpVersionMajor: 1, headers: { 'content-length': '00' } }))).toBeUndefined()
    expect(closeIfBodyInFlight(response({ complete: true, httpVersionMajor: 1, headers: { 'content-length': '10' } }))).toBeUndefined()
    expect(closeIfBodyInFlight(response({ complete: false, httpVersionMajor: 2, headers: { 'content-length': '10' } }))).toBeUndefined()
    // A GET's or HEAD's body is Node's to drop (@hono/node-server leaves it): the connection goes on.
    for (const method of ['GET', 'HEAD']) expect(closeIfBodyInFlight(response({ complete: false, httpVersionMajor: 1, method, headers: { 'content-length': '10' } }))).toBeUndefined()
  })

  it('closes the connection after the answer when a body, of a length or chunked, is still on its way a turn later, and not when it arrived meanwhile', async () => {
    for (const headers of [{ 'content-length': '10' }, { 'transfer-encoding': 'chunked' }]) {
      const late = response({ complete: false, httpVersionMajor: 1, headers })
      await closeIfBodyInFlight(late)
      expect(late.shouldKeepAlive).toBe(false)
      const req = { complete: false, httpVersionMajor: 1, headers }
      const arrived = response(req)
      const judged = closeIfBodyInFlight(arrived)
      req.complete = true
      await judged
      expect(arrived.shouldKeepAlive).toBe(true)
    }
  })
})

describe('whenClosed', () => {
  it('calls the listener at once for a response already closed, by any of its marks, and on its close otherwise, once', () => {
    for (const marks of [{ closed: true }, { destroyed: true }, { stream: { destroyed: true } }]) {
      let calls = 0
      whenClosed({ ...responseWith(), once: () => expect.unreachable('waits for a close already emitted'), ...marks } as NodeResponse, () => calls++)
      expect(calls).toBe(1)
    }
    let close!: () => void
    let calls = 0
    whenClosed({ ...responseWith(), closed: false, destroyed: false, stream: { destroyed: false }, once: (_event: 'close', listener: () => void) => (close = listener) } as NodeResponse, () => calls++)
    expect(calls).toBe(0)
    close()
    expect(calls).toBe(1)
  })

  it('over HTTP/2, tells a response whose stream has closed (the compatibility response has no closed nor destroyed): the listener runs at once', async () => {
    const server = http2.createServer()
    const closed = new Promise<NodeResponse>((resolve) => {
      server.on('request', (_req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
        res.on('close', () => setImmediate(() => resolve(res as unknown as NodeResponse)))
        res.end('done')
      })
    })
    const client = http2.connect(`http://127.0.0.1:${await listenLocal(server)}`)
    try {
      const request = client.request({ ':path': '/' })
      request.resume()
      const res = await closed
      let calls = 0
      whenClosed(res, () => calls++)
      expect(calls).toBe(1)
    } finally {
      client.close()
      await new Promise((resolve) => server.close(resolve))
    }
  })
})

describe('continueIfExpected', () => {
  /** The raw answer to a POST that expects 100-continue, its body sent once invited. */
  async function exchangeExpecting(server: http.Server): Promise<string> {
    const port = await listenLocal(server)
    try {
      return await new Promise<string>((resolve, reject) => {
        const socket = net.connect(port, '127.0.0.1')
        let raw = ''
        socket.setEncoding('latin1')
        socket.on('data', (chunk: string) => {
          if (!raw.includes('100 Continue') && chunk.includes('100 Continue')) socket.write('{}')
          raw += chunk
          if (raw.endsWith('done')) socket.end()
        })
        socket.on('end', () => resolve(raw))
        socket.on('error', reject)
        socket.write('POST / HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n')
      })
    } finally {
      await closeLocal(server)
    }
  }

  const answering = (req: http.IncomingMessage, res: http.ServerResponse) => {
    continueIfExpected(res)
    req.resume()
    req.on('end', () => res.end('done'))
  }

  it('invites the body once where the server handed checkContinue on, and never a second time where Node already sent 100 Continue (its default)', async () => {
    const handedOn = http.createServer(answering)
    handedOn.on('checkContinue', (req, res) => handedOn.emit('request', req, res))
    expect((await exchangeExpecting(handedOn)).match(/HTTP\/1\.1 100 Continue/g)).toHaveLength(1)
    expect((await exchangeExpecting(http.createServer(answering))).match(/HTTP\/1\.1 100 Continue/g)).toHaveLength(1)
  })
})

it('headerValue joins the values of a field given as an array as a client reads them (a session id, a content type)', () => {
  const client = new Headers([
    ['mcp-session-id', 'a'],
    ['mcp-session-id', 'b'],
  ])
  expect(headerValue(['a', 'b'])).toBe(client.get('mcp-session-id'))
  expect(headerValue(7)).toBe('7')
  expect(headerValue(null)).toBeUndefined()
})

describe('dispatchHeadersFor', () => {
  const CORS = { 'access-control-allow-origin': 'https://app.example', vary: 'Origin', 'access-control-expose-headers': 'Mcp-Session-Id, X-MCP-Version' }
  const none = { getHeader: () => undefined }

  it('joins the Vary and Access-Control-Expose-Headers of the handler’s writeHead headers, whatever their case and form (object, flat array, array of pairs)', () => {
    const joined = { ...CORS, vary: 'Accept-Encoding, Origin', 'access-control-expose-headers': 'X-Request-Id, Mcp-Session-Id, X-MCP-Version' }
    const forms: unknown[] = [
      { 'Content-Type': 'application/json', VARY: 'Accept-Encoding', 'Access-Control-Expose-Headers': 'X-Request-Id' },
      ['Content-Type', 'application/json', 'Vary', 'Accept-Encoding', 'access-control-EXPOSE-headers', 'X-Request-Id'],
      [
        ['Content-Type', 'application/json'],
        ['Vary', 'Accept-Encoding'],
        ['cache-control', 'no-store'],
        ['Access-Control-Expose-Headers', 'X-Request-Id'],
      ],
    ]
    for (const headers of forms) expect(dispatchHeadersFor(none, CORS, headers)).toEqual(joined)
  })

  it('joins those set with setHeader before the writeHead headers, and leaves the dispatch headers as decided when the handler has neither', () => {
    const set: Record<string, string> = { vary: 'Accept-Language', 'access-control-expose-headers': 'X-Trace' }
    expect(dispatchHeadersFor({ getHeader: (name) => set[name] }, CORS, { vary: 'Accept-Encoding' })).toEqual({
      ...CORS,
      vary: 'Accept-Language, Accept-Encoding, Origin',
      'access-control-expose-headers': 'X-Trace, Mcp-Session-Id, X-MCP-Version',
    })
    expect(dispatchHeadersFor(none, CORS, { 'content-type': 'application/json' })).toEqual(CORS)
  })
})

it('isHttp2Response tells the HTTP/2 compatibility response by its stream, and takes nothing else for one (not null, nor a response without a stream object)', () => {
  expect(isHttp2Response({ stream: {} })).toBe(true)
  for (const other of [null, undefined, 'stream', { stream: 'h2' }, { socket: {} }]) expect(isHttp2Response(other), JSON.stringify(other)).toBe(false)
})

describe('the head of a Node response a decision is attached to', () => {
  // Node's own ServerResponse, through a subclass whose prototype takes the interception: this
  // file shares its worker with others (isolate: false), and http.ServerResponse.prototype
  // itself would stay patched for them.
  class DispatchedResponse extends http.ServerResponse {}
  const proto = DispatchedResponse.prototype as unknown as NodeResponse
  installHeadInterception(proto)

  /** What a client reads of one answer of `answer`, the decision attached to its response; and the outcomes told. */
  async function answered(answer: (res: http.ServerResponse) => void, stamped: Record<string, string> = STAMPED) {
    const outcomes: DispatchOutcome[] = []
    // Asserted once the answer is read: a throw in the listener would leave the client waiting.
    const attached: boolean[] = []
    const server = http.createServer({ ServerResponse: DispatchedResponse }, (_req, res) => {
      attached.push(attachToHead(res as unknown as NodeResponse, proto, decisionWith(stamped, outcomes)))
      answer(res)
    })
    const port = await listenLocal(server)
    try {
      const response = await new Promise<{ status: number; headers: string[] }>((resolve, reject) => {
        http
          .get({ host: '127.0.0.1', port, path: '/', agent: false }, (incoming) => {
            incoming.resume()
            incoming.on('end', () => resolve({ status: incoming.statusCode!, headers: incoming.rawHeaders }))
          })
          .on('error', reject)
      })
      expect(attached, 'the decision attached to the response').toEqual([true])
      return { ...response, outcomes }
    } finally {
      await closeLocal(server)
    }
  }

  /** The values of field `name` in raw headers, each line. */
  const field = (raw: string[], name: string) => raw.flatMap((value, i) => (i % 2 === 1 && raw[i - 1]!.toLowerCase() === name ? [value] : []))

  it('takes the headers of writeHead(status, undefined, headers), as Node does: the session id they assign is told, a dispatch header among them is written once, the dispatcher’s', async () => {
    const { status, headers, outcomes } = await answered((res) =>
      res.writeHead(201, undefined as unknown as string, { 'content-type': 'application/json', 'Mcp-Session-Id': 'abc', 'X-MCP-Version': '0.0.1' }).end('{}'),
    )
    expect(status).toBe(201)
    expect(field(headers, 'x-mcp-version')).toEqual(['1.2.3'])
    expect(field(headers, 'mcp-session-id')).toEqual(['abc'])
    expect(outcomes).toEqual([{ status: 201, sessionId: 'abc', whenClosed: expect.any(Function) }])
  })
  it('joins a Vary set with setHeader when the dispatcher adds Vary alone (an origin not allowed), rather than replacing it', async () => {
    const { headers } = await answered(
      (res) => {
        res.setHeader('Vary', 'Accept-Encoding')
        res.end('{}')
      },
      { ...STAMPED, vary: 'Origin' },
    )
    expect(field(headers, 'vary')).toEqual(['Accept-Encoding, Origin'])
    expect(field(headers, 'x-mcp-version')).toEqual(['1.2.3'])
  })

  it('joins an Access-Control-Expose-Headers set with setHeader when the dispatcher exposes its own without Vary (any origin allowed), rather than replacing it', async () => {
    const { headers } = await answered(
      (res) => {
        res.setHeader('Access-Control-Expose-Headers', 'X-Request-Id')
        res.end('{}')
      },
      { ...STAMPED, 'access-control-allow-origin': '*', 'access-control-expose-headers': 'Mcp-Session-Id, X-MCP-Version' },
    )
    expect(field(headers, 'access-control-expose-headers')).toEqual(['X-Request-Id, Mcp-Session-Id, X-MCP-Version'])
    expect(field(headers, 'access-control-allow-origin')).toEqual(['*'])
  })
})
