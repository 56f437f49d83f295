/**
 * JSON-RPC answers to what Node's HTTP parser refuses before any handler runs (`clientError`).
 * No Node import: the socket is typed by what is used of it, so the Web adapter's subpath
 * (which also runs on Workers, Bun and Deno) can export it for `@hono/node-server`.
 * Not an entry point: the adapters' entries export what users need of it.
 * @module
 */
import { type JsonRpcErrorObject, RpcCode, jsonRpcErrorReply } from '../core/reply.js'

/** The part of a `net.Socket` that {@link answerClientError} uses. */
export interface ClientErrorSocket {
  readonly writable: boolean
  readonly destroyed?: boolean
  write(data: string): unknown
  destroy(): unknown
}

/** Node's `clientError` error: a parser error (`HPE_*`), a request timeout, or a socket error. */
export type ClientError = Error & { code?: string }

// By Node's own choice of status (lib/_http_server.js, `socketOnError`), with the body every
// other refusal of the dispatch layer has. Built once: the answers never change.
const BAD_REQUEST = rawReply(400, 'Bad Request', { code: RpcCode.InvalidRequest, message: 'Malformed HTTP request', data: { error: 'invalid_request' } })
const ANSWERS: ReadonlyMap<string, string> = new Map([
  [
    'HPE_HEADER_OVERFLOW',
    rawReply(431, 'Request Header Fields Too Large', {
      code: RpcCode.InvalidRequest,
      message: 'Request header fields too large',
      data: { error: 'invalid_request', field: 'headers' },
    }),
  ],
  [
    'HPE_CHUNK_EXTENSIONS_OVERFLOW',
    rawReply(413, 'Content Too Large', { code: RpcCode.InvalidRequest, message: 'Chunk extensions too large', data: { error: 'invalid_request', field: 'body' } }),
  ],
  ['ERR_HTTP_REQUEST_TIMEOUT', rawReply(408, 'Request Timeout', { code: RpcCode.ServerError, message: 'Request timeout', data: { error: 'request_timeout' } })],
])

/** A whole HTTP/1.1 message of the JSON-RPC error reply; the connection closes after it. */
function rawReply(status: number, reason: string, error: JsonRpcErrorObject): string {
  const reply = jsonRpcErrorReply(status, error)
  const body = reply.body ?? ''
  let head = `HTTP/1.1 ${reply.status} ${reason}\r\n`
  for (const [name, value] of Object.entries(reply.headers)) head += `${name}: ${value}\r\n`
  return `${head}content-length: ${new TextEncoder().encode(body).byteLength}\r\nconnection: close\r\n\r\n${body}`
}

/**
 * A listener for a Node HTTP server's `clientError` event: what Node's parser refuses before
 * any handler sees the request (a malformed request line or header, an unknown method, a head
 * past `maxHeaderSize`, a request that outlived `requestTimeout` or `headersTimeout`) gets the
 * status Node itself would send (400, 431, 413, 408), with a JSON-RPC error body (`id: null`,
 * `Content-Type: application/json`) as every other refusal of the dispatch layer, instead of
 * Node's bare status line with no body. The connection is then closed, as Node does.
 *
 * A malformed request pipelined behind requests whose answers are still under way is answered
 * after them, in order, as HTTP/1.1 requires: each of those answers goes out whole first (Node's
 * own listener destroys the connection at once, so the client lost them, or read the 400 as the
 * answer to a request that was served). What the client sends meanwhile is read and dropped.
 * A request timeout (408) is answered at once, as Node answers it. Where the malformed part is
 * the body of the request being answered, that answer is abandoned: nothing is written behind a
 * head already sent, and the socket is destroyed. Nothing is written to a socket reset or no
 * longer writable. Nothing of the request is echoed.
 *
 * @example
 * ```ts
 * // Node (Express, @hono/node-server, node:http)
 * const server = http.createServer(expressApp).listen(3000)
 * server.on('clientError', answerClientError)
 * // Fastify: its own option, which replaces Fastify's non-JSON-RPC answer
 * const fastify = Fastify({ clientErrorHandler: answerClientError })
 * ```
 */
export function answerClientError(error: ClientError, socket: ClientErrorSocket): void {
  // Node calls again with each piece of the request that still arrives (its parser stays in
  // error): the first call answers.
  if (waiting.has(socket)) return
  const inFlight = (socket as { _httpMessage?: InFlightResponse | null })._httpMessage
  // Parser errors only: the parser stops for good at one. A request timeout is no parser error:
  // Node's parser reads on, and a request it had refused as timed out would be served while the
  // 408 waited, then refused after its own answer; it is answered at once, as Node answers it.
  if (inFlight && inFlight.req?.complete === true && !socket.destroyed && error?.code?.startsWith('HPE_') === true) {
    // An answer to a request that came whole, still under way (Node detaches an answer from its
    // socket as it finishes, before any other listener hears it): the refusal comes after it,
    // and after the answers Node has queued behind it, which it hands the socket in turn. (Not
    // `writableFinished`: a queued answer that had ended is flushed whole as it gets the socket,
    // and reads finished before its 'finish'.)
    waiting.add(socket)
    let answered = false
    const after = () => {
      if (answered) return
      answered = true
      waiting.delete(socket)
      answerClientError(error, socket)
    }
    inFlight.once('finish', after)
    inFlight.once('close', after)
    return
  }
  // A reset connection has no one left to answer; a response already started on it (to the
  // request whose body was malformed) would be corrupted by another head.
  if (error?.code !== 'ECONNRESET' && !socket.destroyed && socket.writable && !inFlight?.headersSent) {
    try {
      socket.write(ANSWERS.get(error?.code ?? '') ?? BAD_REQUEST)
    } catch {
      // A socket that refuses the write is destroyed below all the same.
    }
  }
  socket.destroy()
}

/** What {@link answerClientError} reads of the response a socket is answering (Node's `_httpMessage`). */
interface InFlightResponse {
  readonly headersSent?: boolean
  readonly req?: { readonly complete?: boolean }
  once(event: 'finish' | 'close', listener: () => void): unknown
}

/** Sockets whose refusal waits for the answers ahead of it. */
const waiting = new WeakSet<object>()

/** The part of a Node `ServerResponse` that {@link answerExpectationFailed} uses. */
export interface ExpectationResponse {
  writeHead(statusCode: number, headers: Record<string, string>): unknown
  end(body: string): unknown
}

// Built once: the answer never changes.
const EXPECTATION_FAILED = jsonRpcErrorReply(417, {
  code: RpcCode.InvalidRequest,
  message: 'Expectation failed',
  data: { error: 'invalid_request', field: 'expect' },
})
const EXPECTATION_FAILED_HEADERS: Record<string, string> = {
  ...EXPECTATION_FAILED.headers,
  'content-length': String(new TextEncoder().encode(EXPECTATION_FAILED.body ?? '').byteLength),
}

/**
 * A listener for a Node HTTP server's `checkExpectation` event: a request whose `Expect` names
 * anything but `100-continue` (which Node, or `checkContinue`, handles) gets 417, the status
 * Node sends itself (RFC 9110 section 10.1.1), with a JSON-RPC error body as every other refusal
 * of the dispatch layer (`{ code: -32600, message: "Expectation failed", data: { error:
 * "invalid_request", field: "expect" } }`), instead of Node's empty one. Nothing of the request
 * is echoed; the request reaches no handler, as without the listener.
 *
 * @example
 * ```ts
 * server.on('checkExpectation', answerExpectationFailed) // Express, @hono/node-server, node:http
 * fastify.server.on('checkExpectation', answerExpectationFailed) // Fastify
 * ```
 */
export function answerExpectationFailed(_request: unknown, response: ExpectationResponse): void {
  response.writeHead(417, EXPECTATION_FAILED_HEADERS)
  response.end(EXPECTATION_FAILED.body ?? '')
}

/** Error codes of a connection its peer left: a reset, a stream closed early, undici's abort. */
const DISCONNECT_CODES: ReadonlySet<string> = new Set(['ECONNRESET', 'ECONNABORTED', 'EPIPE', 'ERR_STREAM_PREMATURE_CLOSE', 'UND_ERR_ABORTED', 'UND_ERR_SOCKET'])

/**
 * Whether `error`, a handler's failure, is its client's leaving: a read of the request body cut
 * short (Node's `aborted`, undici's `terminated`, raw-body's `request.aborted`), a reset, an
 * abort (`AbortError`, or `reason`: the request signal's). Looked for in its `cause` too, a few
 * deep. Only such a failure of a request whose client has gone goes unreported (any client
 * causes one at will); any other, client gone or not, is the platform's to hear.
 * @internal
 */
export function isClientDisconnect(error: unknown, reason?: unknown): boolean {
  let current = error
  for (let depth = 0; depth < 4 && current !== null && typeof current === 'object'; depth++) {
    if (current === reason) return true
    const { code, name, message, type } = current as { code?: unknown; name?: unknown; message?: unknown; type?: unknown }
    if (name === 'AbortError' || message === 'aborted' || message === 'terminated' || type === 'request.aborted') return true
    if (typeof code === 'string' && DISCONNECT_CODES.has(code)) return true
    current = (current as { cause?: unknown }).cause
  }
  return current !== undefined && current === reason
}
