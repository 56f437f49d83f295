import { describe, expect, it } from 'vitest'
import type { DispatchOutcome } from '../pipeline/dispatcher.js'
import { type Dispatched, type NodeResponse, attachToHead, installHeadInterception } from './head.js'

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
