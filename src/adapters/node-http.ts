/**
 * Translation between Node's `http` objects and the dispatch pipeline, shared by the Express
 * and Fastify adapters (both hand the MCP SDK's `StreamableHTTPServerTransport` the raw
 * `ServerResponse`, so everything here works on the raw objects, never on a framework's
 * wrapper). No rule lives here.
 * @internal
 * @module
 */
import { type IncomingMessage, type OutgoingHttpHeaders, ServerResponse } from 'node:http'
import { Readable } from 'node:stream'
import { type CompiledTrustProxy, resolveClientAddress } from '../core/client-address.js'
import type { Reply } from '../core/reply.js'
import type { Decision, DispatchContext, DispatchRequest } from '../pipeline/dispatcher.js'

type Dispatched = Extract<Decision, { type: 'dispatch' }>

/** Header lookup over Node's lower-cased `IncomingHttpHeaders`. */
function headerLookup(req: IncomingMessage): DispatchRequest['headers'] {
  const headers = req.headers
  return {
    get(name) {
      const value = headers[name]
      return Array.isArray(value) ? value.join(', ') : value
    },
  }
}

/** `http` or `https` as the socket saw it, unless the framework (configured to) knows better. */
export function socketProtocol(req: IncomingMessage): 'http' | 'https' {
  return (req.socket as { encrypted?: boolean } | null)?.encrypted ? 'https' : 'http'
}

/**
 * The neutral request of the pipeline. `url` is the full request target (Express:
 * `originalUrl`, so a mount path stays part of the path, as in the Web adapter); the client
 * address is the socket peer, through `trustProxy` only.
 */
export function toDispatchRequest(
  req: IncomingMessage,
  url: string,
  protocol: string,
  trust: CompiledTrustProxy,
): DispatchRequest {
  const host = req.headers.host
  let end = url.length
  const query = url.indexOf('?')
  if (query !== -1) end = query
  const hash = url.indexOf('#')
  if (hash !== -1 && hash < end) end = hash
  const path = url.slice(0, end) || '/'
  const forwardedFor = req.headers['x-forwarded-for']
  return {
    method: (req.method ?? 'GET').toUpperCase(),
    path,
    host,
    origin: `${protocol}://${host ?? ''}`,
    headers: headerLookup(req),
    clientAddress: resolveClientAddress(
      req.socket?.remoteAddress,
      Array.isArray(forwardedFor) ? forwardedFor.join(', ') : forwardedFor,
      trust,
    ),
  }
}

/** Writes a dispatch-layer {@link Reply} on a raw response, byte for byte. */
export function writeReply(res: ServerResponse, reply: Reply): void {
  const headers: OutgoingHttpHeaders = { ...reply.headers }
  // An explicit length, as a web `Response` with a string body gets, never chunked encoding.
  if (reply.body !== null) headers['content-length'] = Buffer.byteLength(reply.body)
  res.writeHead(reply.status, headers)
  res.end(reply.body ?? undefined)
}

/** Responses whose handler has begun to answer (their head may still be held). */
const started = new WeakSet<ServerResponse>()

/** Whether the handler has begun to answer: true as soon as it wrote a head, held or sent. */
export function responseStarted(res: ServerResponse): boolean {
  return res.headersSent || started.has(res)
}

type HeldMethod = 'writeHead' | 'write' | 'end' | 'flushHeaders'
const HELD: readonly HeldMethod[] = ['writeHead', 'write', 'end', 'flushHeaders']

/** `a` equals the lower-case name `lower`, ignoring case (the length is compared first: cheap). */
function sameName(a: string, lower: string): boolean {
  return a === lower || (a.length === lower.length && a.toLowerCase() === lower)
}

function headerFromArgs(headers: unknown, name: string): string | undefined {
  if (Array.isArray(headers)) {
    for (let i = 0; i + 1 < headers.length; i += 2) {
      if (sameName(String(headers[i]), name)) return String(headers[i + 1])
    }
    return undefined
  }
  if (headers && typeof headers === 'object') {
    for (const key in headers) {
      if (sameName(key, name)) {
        const value = (headers as Record<string, unknown>)[key]
        return Array.isArray(value) ? value.join(', ') : value == null ? undefined : String(value)
      }
    }
  }
  return undefined
}

/**
 * Sets the dispatch headers on a response about to write its head, and returns the handler's
 * `writeHead` headers without any of the same name, so the dispatch headers win. The
 * handler's header object is copied only when it does hold one of them (rarely).
 */
function stampHeaders(res: ServerResponse, headers: unknown, stamped: Readonly<Record<string, string>>): unknown {
  for (const name in stamped) res.setHeader(name, stamped[name]!)
  return headers === undefined ? undefined : withoutHeaders(headers, stamped)
}

/** Called with the status and headers of a response head; returns the headers to send. */
type HeadHook = (status: number, headers: unknown) => unknown

const headHooks = new WeakMap<ServerResponse, HeadHook>()
let prototypeWrapped = false

/**
 * Runs `hook` when the head of `res` is written. Node sends every head through `writeHead`
 * (`write`, `end` and `flushHeaders` call it implicitly), so one interception point suffices.
 *
 * For node:http responses the interception is a wrapper installed once on
 * `ServerResponse.prototype.writeHead`, which looks the response up in a WeakMap: one lookup
 * for responses the adapters did not dispatch, and no change to any response object.
 * Patching `writeHead` on each response instead gave every response a hidden class of its own
 * and slowed all of Node's HTTP code that touches it (measured: about 15 µs per request on
 * Fastify). Other response classes (HTTP/2 compatibility) get a patch on the instance.
 */
function onHead(res: ServerResponse, hook: HeadHook): void {
  if (prototypeWrapped && res instanceof ServerResponse && Object.getPrototypeOf(res).writeHead === ServerResponse.prototype.writeHead) {
    headHooks.set(res, hook)
    return
  }
  const writeHead = res.writeHead
  res.writeHead = function hookedWriteHead(this: ServerResponse, statusCode: number, reason?: unknown, headers?: unknown) {
    res.writeHead = writeHead
    if (typeof reason !== 'string') return (writeHead as WriteHead).call(res, statusCode, hook(statusCode, reason ?? headers))
    return (writeHead as WriteHead).call(res, statusCode, reason, hook(statusCode, headers))
  } as ServerResponse['writeHead']
}

type WriteHead = (this: ServerResponse, statusCode: number, ...rest: unknown[]) => ServerResponse

/**
 * Installs the `writeHead` interception (see `onHead`). Adapters call it when they are created,
 * before any request, so a per-request wrapper installed later by other middleware (for
 * example `on-headers`) still ends in it.
 */
export function installHeadInterception(): void {
  if (prototypeWrapped) return
  prototypeWrapped = true
  const original = ServerResponse.prototype.writeHead as WriteHead
  ServerResponse.prototype.writeHead = function writeHead(
    this: ServerResponse,
    statusCode: number,
    reason?: unknown,
    headers?: unknown,
  ): ServerResponse {
    const hook = headHooks.get(this)
    if (hook === undefined) {
      return reason === undefined && headers === undefined
        ? original.call(this, statusCode)
        : original.call(this, statusCode, reason, headers)
    }
    headHooks.delete(this)
    if (typeof reason !== 'string') return original.call(this, statusCode, hook(statusCode, reason ?? headers))
    return original.call(this, statusCode, reason, hook(statusCode, headers))
  } as ServerResponse['writeHead']
}

function headerValue(value: number | string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value.join(', ') : value === undefined ? undefined : String(value)
}

/** Whether the header `key` is one of `names` (lower-case), ignoring case. */
function isOneOf(key: string, names: Readonly<Record<string, string>>): boolean {
  if (Object.hasOwn(names, key)) return true
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i)
    if (c >= 65 && c <= 90) return Object.hasOwn(names, key.toLowerCase())
  }
  return false
}

/** `headers` without the ones named in `names`; the same object when none is there (usual). */
function withoutHeaders(headers: unknown, names: Readonly<Record<string, string>>): unknown {
  if (Array.isArray(headers)) {
    let found = false
    for (let i = 0; i + 1 < headers.length && !found; i += 2) found = isOneOf(String(headers[i]), names)
    if (!found) return headers
    const out: unknown[] = []
    for (let i = 0; i + 1 < headers.length; i += 2) {
      if (!isOneOf(String(headers[i]), names)) out.push(headers[i], headers[i + 1])
    }
    return out
  }
  if (headers && typeof headers === 'object') {
    let found = false
    for (const key in headers) {
      if (isOneOf(key, names)) {
        found = true
        break
      }
    }
    if (!found) return headers
    const out: Record<string, unknown> = {}
    for (const key in headers) {
      if (!isOneOf(key, names)) out[key] = (headers as Record<string, unknown>)[key]
    }
    return out
  }
  return headers
}

/**
 * Puts the dispatch headers on a raw response and makes sure the dispatcher records the
 * outcome (`decision.complete`) before the client can see the answer: the status and the
 * `Mcp-Session-Id` the MCP handler assigns are read from the response head.
 *
 * - A request that already belongs to a session can only end its pin (DELETE, or a handler
 *   that forgot the session): that is done once the answer is sent, with no hold.
 * - With a synchronous session store (memory) the pin is stored in `writeHead`, which Node
 *   calls for every head (`write`, `end` and `flushHeaders` call it implicitly): no hold.
 * - With an asynchronous one (Redis), the first `writeHead`, `write`, `end` or `flushHeaders`
 *   and every call after it are queued, in order, until the pin is stored, then replayed on
 *   the real methods. So the next request of a new session finds its pin on every instance,
 *   as with the Web adapter, which awaits `complete` before returning the response. (Corking
 *   the socket cannot do this: Node fully uncorks it on `end()`.)
 *
 * The dispatch headers (version, rate limit, CORS) win over the handler's headers of the same
 * name, as in the Web adapter. Patched methods are assigned back, never deleted: a `delete`
 * would turn the response into a slow dictionary-mode object for the rest of its life.
 */
export function holdResponseHead(
  res: ServerResponse,
  decision: Dispatched,
  onError: (error: unknown, context: string) => void,
): void {
  const stamped = decision.headers
  if (decision.context.sessionId !== undefined) {
    // Nothing to hold: only the dispatch headers, and the pin ended once the answer is sent.
    onHead(res, (_status, headers) => stampHeaders(res, headers, stamped))
    res.once('finish', () => {
      const pending = decision.complete({ status: res.statusCode, sessionId: undefined })
      if (pending) pending.catch((error: unknown) => onError(error, 'session store'))
    })
    return
  }
  if (decision.synchronousPins) {
    onHead(res, (status, headers) => {
      started.add(res)
      let sessionId = headers === undefined ? undefined : headerFromArgs(headers, 'mcp-session-id')
      const stampedHeaders = stampHeaders(res, headers, stamped)
      if (sessionId === undefined) sessionId = headerValue(res.getHeader('mcp-session-id'))
      const pending = decision.complete({ status, sessionId })
      if (pending) pending.catch((error: unknown) => onError(error, 'session store'))
      return stampedHeaders
    })
    return
  }

  const target = res as unknown as Record<HeldMethod, (...args: unknown[]) => unknown>
  // The methods as the response has them now (usually its prototype's). Restoring assigns them
  // back rather than deleting the patches: a `delete` would turn the response object into a
  // slow dictionary-mode object for the rest of its life.
  const originals = HELD.map((name) => target[name])
  let queue: Array<[HeldMethod, unknown[]]> | undefined

  const restore = () => {
    for (let i = 0; i < HELD.length; i++) target[HELD[i]!] = originals[i]!
  }
  const replay = (name: HeldMethod, args: unknown[]) => originals[HELD.indexOf(name)]!.apply(res, args)

  function begin(first: HeldMethod, args: unknown[]): unknown {
    started.add(res)
    let status = res.statusCode
    let sessionId: string | undefined
    if (first === 'writeHead') {
      status = Number(args[0])
      const headerIndex = typeof args[1] === 'string' ? 2 : 1
      const headers = args[headerIndex]
      if (headers !== undefined) sessionId = headerFromArgs(headers, 'mcp-session-id')
      args = [...args]
      args[headerIndex] = stampHeaders(res, headers, stamped)
    } else {
      // The head is implicit (`write`, `end`, `flushHeaders`): set the headers it will carry.
      for (const name in stamped) res.setHeader(name, stamped[name]!)
    }
    if (sessionId === undefined) sessionId = headerValue(res.getHeader('mcp-session-id'))
    const pending = decision.complete({ status, sessionId })
    if (!pending) {
      restore()
      return replay(first, args)
    }
    queue = [[first, args]]
    pending.finally(() => {
      restore()
      try {
        for (const [name, callArgs] of queue!) replay(name, callArgs)
      } catch (error) {
        // A call the real response refuses (a second head): the answer is broken; end it.
        onError(error, 'handler')
        res.destroy()
      }
      queue = undefined
    })
    // What the real methods answer: `write` true (no back-pressure while held), others `res`.
    return first === 'write' ? true : first === 'flushHeaders' ? undefined : res
  }

  for (const name of HELD) {
    target[name] = function held_(this: unknown, ...args: unknown[]) {
      if (queue === undefined) return begin(name, args)
      queue.push([name, args])
      return name === 'write' ? true : name === 'flushHeaders' ? undefined : res
    }
  }
}

/** Options of {@link toWebRequest}. */
export interface WebRequestSource {
  req: IncomingMessage
  res: ServerResponse
  /** The request target including any mount path. */
  url: string
  protocol: string
  /** A body the framework already parsed (the raw stream is then spent). */
  parsedBody?: unknown
}

/**
 * A web `Request` for a raw Node request, for web-standard handlers (the proxy): the body
 * streams from the socket unless the framework already consumed it; the signal aborts when
 * the client goes away before the response is finished.
 */
export function toWebRequest(source: WebRequestSource): Request {
  const { req, res } = source
  const controller = new AbortController()
  const onClose = () => {
    if (!res.writableFinished) controller.abort()
  }
  res.once('close', onClose)
  const headers = new Headers()
  const raw = req.rawHeaders
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!
    if (name.charCodeAt(0) !== 58 /* ':' (HTTP/2 pseudo-header) */) headers.append(name, raw[i + 1]!)
  }
  const method = (req.method ?? 'GET').toUpperCase()
  let body: BodyInit | null = null
  if (method !== 'GET' && method !== 'HEAD') {
    const consumed = req.readableEnded || (req as { readableDidRead?: boolean }).readableDidRead === true
    if (!consumed) body = Readable.toWeb(req) as unknown as ReadableStream<Uint8Array>
    else if (source.parsedBody !== undefined) body = serializeParsedBody(source.parsedBody, headers)
  }
  const init: RequestInit & { duplex?: 'half' } = { method, headers, body, signal: controller.signal }
  if (body !== null) init.duplex = 'half'
  return new Request(`${source.protocol}://${req.headers.host ?? 'localhost'}${source.url}`, init)
}

function serializeParsedBody(parsed: unknown, headers: Headers): BodyInit {
  headers.delete('content-length')
  if (typeof parsed === 'string' || parsed instanceof Uint8Array) return parsed as BodyInit
  return JSON.stringify(parsed)
}

/**
 * Writes a web `Response` on a raw Node response, streaming its body with back-pressure
 * (SSE included, no buffering); a client that goes away cancels the body, which cancels the
 * upstream of a proxied response.
 */
export async function writeWebResponse(res: ServerResponse, response: Response): Promise<void> {
  const headers: OutgoingHttpHeaders = {}
  response.headers.forEach((value, name) => {
    if (name !== 'set-cookie') headers[name] = value
  })
  const cookies = response.headers.getSetCookie()
  if (cookies.length > 0) headers['set-cookie'] = cookies
  if (response.statusText) res.writeHead(response.status, response.statusText, headers)
  else res.writeHead(response.status, headers)
  if (!response.body) {
    res.end()
    return
  }
  const reader = response.body.getReader()
  let closed = false
  let wake: (() => void) | undefined
  const onClose = () => {
    closed = true
    wake?.()
    reader.cancel().catch(() => {})
  }
  res.once('close', onClose)
  res.flushHeaders()
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done || closed) break
      if (!res.write(value) && !closed) {
        await new Promise<void>((resolve) => {
          wake = resolve
          res.once('drain', resolve)
        })
        wake = undefined
      }
    }
  } catch {
    // The body failed mid-stream (upstream gone): end the response where it stands.
    if (!closed) res.destroy()
    return
  } finally {
    res.off('close', onClose)
  }
  if (!closed) res.end()
}

/** The context stored on a request by an adapter, or a clear error when the adapter did not run. */
export function requireContext(context: DispatchContext | undefined, adapter: string): DispatchContext {
  if (context === undefined) {
    throw new TypeError(
      `mcp-dispatch: no dispatch context on this request; register the ${adapter} mcpDispatch ${adapter === 'express' ? 'middleware' : 'plugin'} before this handler`,
    )
  }
  return context
}
